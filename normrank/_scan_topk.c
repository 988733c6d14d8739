/* normrank._fastpath's batched flat scan: each query's exact top-k over the stored vectors, one sgemm per
   block of them (the bundled OpenBLAS's cblas_sgemm, as FAISS's BLAS path calls it) and a top-k heap per
   query that keeps FAISS's order to the last bit.

   Why not FAISS's heaps (HeapArray::addn, what normrank/batch_topk.py called before): they compare every
   score with the heap's top one at a time, 0.56-0.67 ms of a 64-query batch over 10k documents (3.8-6.5
   ms, benchmarks/results/speed.md), while almost every score loses. Here four SSE compares test 16 scores
   at once, and only a run of 16 with a score above the top is read one by one, with the same comparison;
   the heap itself is FAISS's CMin heap (ties broken by the lower position), so the result is the one
   addn and reorder give. The whole block loop runs without the GIL, as the sgemm and heaps did. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "_scan_topk.h"

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);

/* FAISS's CMin::cmp2: a below b, equal scores ordered by position (the lower position nearer the bottom) */
static inline int below(float a, int64_t ia, float b, int64_t ib) { return a < b || (a == b && ia < ib); }

/* Sift (v, id) down from the top of the k-heap val/ids: FAISS's heap_replace_top; with the heap's last
   element as (v, id), its heap_pop. */
static void sift_down(Py_ssize_t k, float *val, int64_t *ids, float v, int64_t id) {
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= k) break;
        if (c + 1 < k && !below(val[c], ids[c], val[c + 1], ids[c + 1])) c++;
        if (below(v, id, val[c], ids[c])) break;
        val[i] = val[c];
        ids[i] = ids[c];
        i = c;
    }
    val[i] = v;
    ids[i] = id;
}

/* Offer the m scores x (positions j0, j0 + 1, ...) to one query's heap: FAISS's addn for one row. */
static void add_row(Py_ssize_t k, float *val, int64_t *ids, const float *x, Py_ssize_t m, int64_t j0) {
    Py_ssize_t j = 0;
#if defined(__SSE2__)
    for (; j + 16 <= m; j += 16) {
        __m128 top = _mm_set1_ps(val[0]);  /* x > top is false for NaN, as top < x is below */
        __m128 any = _mm_or_ps(_mm_or_ps(_mm_cmpgt_ps(_mm_loadu_ps(x + j), top), _mm_cmpgt_ps(_mm_loadu_ps(x + j + 4), top)),
                               _mm_or_ps(_mm_cmpgt_ps(_mm_loadu_ps(x + j + 8), top), _mm_cmpgt_ps(_mm_loadu_ps(x + j + 12), top)));
        if (!_mm_movemask_ps(any)) continue;
        for (Py_ssize_t u = j; u < j + 16; u++)
            if (val[0] < x[u]) sift_down(k, val, ids, x[u], j0 + u);
    }
#endif
    for (; j < m; j++)
        if (val[0] < x[j]) sift_down(k, val, ids, x[j], j0 + j);
}

/* FAISS's heap_reorder: best first; slots never filled (-1) after the hits, as -FLT_MAX / -1. */
static void reorder(Py_ssize_t k, float *val, int64_t *ids) {
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        float v = val[0];
        int64_t id = ids[0];
        sift_down(k - i, val, ids, val[k - i - 1], ids[k - i - 1]);
        val[k - kept - 1] = v;
        ids[k - kept - 1] = id;
        if (id != -1) kept++;
    }
    memmove(val, val + k - kept, (size_t)kept * sizeof *val);
    memmove(ids, ids + k - kept, (size_t)kept * sizeof *ids);
    for (; kept < k; kept++) {
        val[kept] = -FLT_MAX;
        ids[kept] = -1;
    }
}

int scan_blocks(void *fn, const float *q, Py_ssize_t rows, Py_ssize_t d, const float *xb, Py_ssize_t n,
                Py_ssize_t width, Py_ssize_t step, Py_ssize_t k, float *val, int64_t *ids) {
    float *block = NULL;
    if (rows > 0 && n > 0) {
        block = malloc((size_t)rows * (size_t)(step < n ? step : n) * sizeof(float));
        if (block == NULL) return 0;
    }
    for (Py_ssize_t i = 0; i < rows * k; i++) {
        val[i] = -FLT_MAX;
        ids[i] = -1;
    }
    for (Py_ssize_t j0 = 0; j0 < n && rows > 0; j0 += step) {
        Py_ssize_t m = n - j0 < step ? n - j0 : step;  /* the last block: rows m wide at the buffer's front */
        ((sgemm_fn)fn)(101, 111, 112, (int)rows, (int)m, (int)width, 1.0f, q, (int)d, xb + j0 * d, (int)d, 0.0f,
                       block, (int)m);
        for (Py_ssize_t r = 0; r < rows; r++) add_row(k, val + r * k, ids + r * k, block + r * m, m, j0);
    }
    for (Py_ssize_t r = 0; r < rows; r++) reorder(k, val + r * k, ids + r * k);
    free(block);
    return 1;
}

int scan_buffers(const char *fn, int n, Py_buffer *out, PyObject *const *objs, const char *codes,
                 const char *const *names, unsigned writable) {
    for (int i = 0; i < n; i++) {
        if (typed_buffer(objs[i], &out[i], (writable >> i) & 1u, codes[i], codes[i] == 'q' ? 8 : 4, fn, names[i]) < 0) {
            release_buffers(out, i);
            return -1;
        }
    }
    return 0;
}

void release_buffers(Py_buffer *b, int n) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&b[i]);
}

PyObject *scan_topk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "scan_topk(sgemm, queries, vectors, width, step, out_scores, out_positions) "
                                         "takes 7 arguments");
        return NULL;
    }
    void *fn = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t width = PyLong_AsSsize_t(args[3]), step = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    static const char *const names[] = {"queries", "vectors", "out_scores", "out_positions"};
    PyObject *const objs[] = {args[1], args[2], args[5], args[6]};
    Py_buffer b[4];
    if (scan_buffers("scan_topk", 4, b, objs, "fffq", names, 0xC) < 0) return NULL;
    const Py_buffer *q = &b[0], *xb = &b[1], *vs = &b[2], *ps = &b[3];
    PyObject *result = NULL;
    Py_ssize_t rows = vs->ndim == 2 ? vs->shape[0] : -1, k = vs->ndim == 2 ? vs->shape[1] : -1;
    Py_ssize_t d = q->ndim == 2 ? q->shape[1] : -1, n = xb->ndim == 2 && xb->shape[1] == d ? xb->shape[0] : -1;
    if (fn == NULL || q->ndim != 2 || q->shape[0] != rows || n < 0 || ps->ndim != 2 || ps->shape[0] != rows
        || ps->shape[1] != k || k < 1 || width < 1 || width > d || step < 1 || rows > INT32_MAX || step > INT32_MAX
        || n > INT32_MAX || d > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "scan_topk: queries (r, d), vectors (n, d), out_scores and out_positions "
                                          "(r, k >= 1), 1 <= width <= d, step >= 1");
        goto done;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = scan_blocks(fn, q->buf, rows, d, xb->buf, n, width, step, k, vs->buf, ps->buf);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    release_buffers(b, 4);
    return result;
}
