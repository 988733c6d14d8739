/* normrank._fastpath: the per-call work of a single search in C, with the arithmetic of the Python path.

   Why C: a 10k-document scan leaves the caches cold, and the Python work around it (the query's norm in
   NumPy, ten Hit objects built field by field) then cost ~60 us per query against a 570 us scan, 10% of
   the call (benchmarks/results/speed.md). Here that work is ~15 us. normrank/store.py falls back to its
   Python code, with the same results, when this module was not built (it is an optional extension).

   Bit for bit: the norm is NumPy's pairwise float64 sum of float32 squares (DOUBLE_pairwise_sum in
   numpy's loops_utils.h.src, as np.linalg.norm and np.add.reduce compute it), the unit vector a float32
   division, the cosine of an additive blend the float64 `score - w * g(d)`. Built with
   -ffp-contract=off, so that no product and sum are fused into one rounding. tests/test_fastpath.py
   compares every value with the Python path. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_scan_topk.h"

#define N_FIELDS 9
/* Hit's slots in this order; their offsets are read from its member descriptors by register_hit */
static const char *FIELD_NAMES[N_FIELDS] = {"id", "score", "cosine", "norm", "norm_feature", "weight",
                                            "token_count", "text", "metadata"};
static Py_ssize_t field_offset[N_FIELDS];
static PyTypeObject *hit_type = NULL;
static PyObject *copy_metadata = NULL;

static double pairwise_sq(const float *a, Py_ssize_t n) {
    if (n < 8) {
        double res = 0.;
        for (Py_ssize_t i = 0; i < n; i++) {
            double x = a[i];
            res += x * x;
        }
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int j = 0; j < 8; j++) {
            double x = a[j];
            r[j] = x * x;
        }
        for (i = 8; i < n - (n % 8); i += 8) {
            for (int j = 0; j < 8; j++) {
                double x = a[i + j];
                r[j] += x * x;
            }
        }
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) {
            double x = a[i];
            res += x * x;
        }
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sq(a, n2) + pairwise_sq(a + n2, n - n2);
}

static int is_format(const Py_buffer *b, char code) {
    const char *f = b->format;
    if (f == NULL) return code == 'B';
    if (*f == '<' || *f == '=' || *f == '@') f++;
    return f[0] == code && f[1] == '\0';
}

/* Start fetching what a hit reads of document i, and then the objects the lists point to. The hits'
   documents are scattered over the columns, and on caches a scan has emptied each read is a trip to
   memory; issued together, they overlap instead of following one another (640 hits of a 64-query batch
   over 10k documents took ~0.4 ms one miss after another). */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((const void *)(p), 1, 3)
#else
#define PREFETCH(p) ((void)0)
#endif

static void prefetch_columns(PyObject *ids, PyObject *texts, PyObject *metas, const float *nrm, const int32_t *cnt,
                             const double *g, int64_t i) {
    PREFETCH(((PyListObject *)ids)->ob_item + i);
    if (texts != NULL) PREFETCH(((PyListObject *)texts)->ob_item + i);
    if (metas != NULL) PREFETCH(((PyListObject *)metas)->ob_item + i);
    if (nrm != NULL) PREFETCH(nrm + i);
    if (cnt != NULL) PREFETCH(cnt + i);
    PREFETCH(g + i);
}

static void prefetch_objects(PyObject *ids, PyObject *texts, int64_t i) {
    PREFETCH(PyList_GET_ITEM(ids, i));
    if (texts != NULL) PREFETCH(PyList_GET_ITEM(texts, i));
}

/* out[:dim] = float32(src) / float32(norm), norm = NumPy's pairwise float64 sum of the float32 squares; 1
   when the norm is finite, above min_norm and within float32 (else 0, out holding the float32 values). */
static int unit_row(const void *src, int is_double, Py_ssize_t dim, float *out, double min_norm, double *norm) {
    if (is_double) {
        const double *s = (const double *)src;
        for (Py_ssize_t i = 0; i < dim; i++) out[i] = (float)s[i];
    } else {
        memcpy(out, src, (size_t)dim * 4);
    }
    *norm = sqrt(pairwise_sq(out, dim));
    if (!(isfinite(*norm) && *norm > min_norm && *norm <= FLT_MAX)) return 0;
    float f = (float)*norm;
    for (Py_ssize_t i = 0; i < dim; i++) out[i] = out[i] / f;
    return 1;
}

PyDoc_STRVAR(unit_into_doc,
"unit_into(vector, out) -> float | None\n\n"
"Write float32(vector) / float32(norm) into out[:len(vector)] and return the norm (float64, NumPy's\n"
"pairwise sum of the float32 squares). None, with out's contents undefined, when the norm is not\n"
"finite, at most 1e-12 or above the float32 range, or vector is not a C-contiguous native float32 or\n"
"float64 buffer: the caller's general path then reads or refuses it. out is a writable float32 buffer\n"
"at least as long.");

static PyObject *unit_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unit_into(vector, out) takes 2 arguments");
        return NULL;
    }
    Py_buffer src, dst;
    if (PyObject_GetBuffer(args[0], &src, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
    if (!PyBuffer_IsContiguous(&src, 'C') || !(is_format(&src, 'f') || is_format(&src, 'd'))) {
        PyBuffer_Release(&src);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[1], &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    int is_double = is_format(&src, 'd');
    Py_ssize_t dim = src.len / (is_double ? 8 : 4);
    double norm;
    if (!is_format(&dst, 'f')) {
        PyErr_SetString(PyExc_TypeError, "unit_into: out must be float32");
        goto done;
    }
    if (dst.len < dim * 4) goto short_out;
    result = unit_row(src.buf, is_double, dim, (float *)dst.buf, 1e-12, &norm) ? PyFloat_FromDouble(norm)
                                                                               : Py_NewRef(Py_None);
    goto done;
short_out:
    PyErr_SetString(PyExc_ValueError, "unit_into: out is shorter than vector");
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

PyDoc_STRVAR(register_hit_doc,
"register_hit(Hit, copy_metadata)\n\nThe slots class hit_rows fills (its fields must be slots named as\n"
"normrank.scoring.Hit's) and the function that copies a document's metadata into a hit.");

static PyObject *register_hit(PyObject *self, PyObject *args) {
    PyObject *type, *copier;
    if (!PyArg_ParseTuple(args, "OO:register_hit", &type, &copier)) return NULL;
    if (!PyType_Check(type) || !PyCallable_Check(copier)) {
        PyErr_SetString(PyExc_TypeError, "register_hit takes a class and a function");
        return NULL;
    }
    Py_ssize_t offsets[N_FIELDS];
    for (int j = 0; j < N_FIELDS; j++) {
        PyObject *descr = PyObject_GetAttrString(type, FIELD_NAMES[j]);
        if (descr == NULL) return NULL;
        int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (ok) offsets[j] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "register_hit: %s is not a slot", FIELD_NAMES[j]);
            return NULL;
        }
    }
    memcpy(field_offset, offsets, sizeof offsets);
    Py_INCREF(type);
    Py_XSETREF(hit_type, (PyTypeObject *)type);
    Py_INCREF(copier);
    Py_XSETREF(copy_metadata, copier);
    Py_RETURN_NONE;
}

int typed_buffer(PyObject *obj, Py_buffer *b, int writable, char code, Py_ssize_t itemsize, const char *fn,
                 const char *what) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (b->itemsize != itemsize || !(is_format(b, code) || (code == 'q' && is_format(b, 'l') && itemsize == sizeof(long)))) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_TypeError, "%s: %s has the wrong type", fn, what);
        return -1;
    }
    return 0;
}

/* What hit_rows and array_rows read: FAISS's result rows and the documents' columns. */
typedef struct {
    const char *fn;
    Py_buffer rows, scores, w, labels, norms, counts, g;
    unsigned held;  /* which of the buffers above are held (bit i: the i-th) */
    PyObject *ids, *texts, *metas;
    Py_ssize_t n_rows, width, n_docs, n_labels;
    double w_scalar;
    const int64_t *pos, *lab;
    const float *sc, *nrm;
    const int32_t *cnt;
    const double *wv, *gv;
} Rows;

static void rows_close(Rows *R) {
    Py_buffer *all[] = {&R->rows, &R->scores, &R->w, &R->labels, &R->norms, &R->counts, &R->g};
    for (int b = 0; b < 7; b++)
        if (R->held & (1u << b)) PyBuffer_Release(all[b]);
    R->held = 0;
}

static int rows_get(Rows *R, int b, PyObject *obj, char code, Py_ssize_t itemsize, const char *what) {
    Py_buffer *all[] = {&R->rows, &R->scores, &R->w, &R->labels, &R->norms, &R->counts, &R->g};
    if (typed_buffer(obj, all[b], 0, code, itemsize, R->fn, what) < 0) return -1;
    R->held |= 1u << b;
    return 0;
}

/* Read rows (n, width >= k) of positions and float32 scores, w (a number or float64 per row), labels (or
   None) and columns (ids, texts, metas, norms, counts, g); with_stats: also norms and counts. 0, or -1 with
   an error set (and nothing held). */
static int rows_open(Rows *R, const char *fn, PyObject *const *args, Py_ssize_t k, int with_stats) {
    memset(R, 0, sizeof *R);
    R->fn = fn;
    PyObject *columns = args[5];
    if (!PyTuple_CheckExact(columns) || PyTuple_GET_SIZE(columns) != 6 || !PyList_CheckExact(PyTuple_GET_ITEM(columns, 0))
        || !PyList_CheckExact(PyTuple_GET_ITEM(columns, 1)) || !PyList_CheckExact(PyTuple_GET_ITEM(columns, 2))) {
        PyErr_Format(PyExc_TypeError, "%s: columns is a tuple of 6, three lists first", fn);
        return -1;
    }
    R->ids = PyTuple_GET_ITEM(columns, 0);
    R->texts = PyTuple_GET_ITEM(columns, 1);
    R->metas = PyTuple_GET_ITEM(columns, 2);
    int w_is_scalar = PyFloat_Check(args[3]) || PyLong_Check(args[3]);
    if (w_is_scalar) {
        R->w_scalar = PyFloat_AsDouble(args[3]);
        if (R->w_scalar == -1.0 && PyErr_Occurred()) return -1;
    }
    if (rows_get(R, 0, args[0], 'q', 8, "rows") < 0 || rows_get(R, 1, args[1], 'f', 4, "scores") < 0
        || (!w_is_scalar && rows_get(R, 2, args[3], 'd', 8, "w") < 0)
        || (args[4] != Py_None && rows_get(R, 3, args[4], 'q', 8, "labels") < 0)
        || (with_stats && rows_get(R, 4, PyTuple_GET_ITEM(columns, 3), 'f', 4, "norms") < 0)
        || (with_stats && rows_get(R, 5, PyTuple_GET_ITEM(columns, 4), 'i', 4, "counts") < 0)
        || rows_get(R, 6, PyTuple_GET_ITEM(columns, 5), 'd', 8, "g") < 0)
        goto error;
    R->n_rows = R->rows.ndim == 2 ? R->rows.shape[0] : 1;
    R->width = R->n_rows ? R->rows.len / 8 / R->n_rows : 0;
    /* the lists hold one entry per internal id; the arrays may have room for more */
    R->n_docs = PyList_GET_SIZE(R->ids);
    if (PyList_GET_SIZE(R->texts) != R->n_docs || PyList_GET_SIZE(R->metas) != R->n_docs || R->g.len / 8 < R->n_docs
        || (with_stats && (R->norms.len / 4 < R->n_docs || R->counts.len / 4 < R->n_docs))) {
        PyErr_Format(PyExc_ValueError, "%s: the columns differ in length", fn);
        goto error;
    }
    if (k > R->width || R->scores.len / 4 != R->n_rows * R->width || (!w_is_scalar && R->w.len / 8 < R->n_rows)) {
        PyErr_Format(PyExc_ValueError, "%s: rows, scores and w do not match", fn);
        goto error;
    }
    R->pos = (const int64_t *)R->rows.buf;
    R->lab = args[4] != Py_None ? (const int64_t *)R->labels.buf : NULL;
    R->n_labels = R->lab != NULL ? R->labels.len / 8 : 0;
    R->sc = (const float *)R->scores.buf;
    R->wv = w_is_scalar ? NULL : (const double *)R->w.buf;
    R->nrm = with_stats ? (const float *)R->norms.buf : NULL;
    R->cnt = with_stats ? (const int32_t *)R->counts.buf : NULL;
    R->gv = (const double *)R->g.buf;
    return 0;
error:
    rows_close(R);
    return -1;
}

/* Check the first k of every row before anything is built, and start fetching what will be read: 1 to
   build; 0 when a row needs the caller's ordering (untied 1: equal scores among its hits, or a missing
   hit; 2: also its k-th and next scores equal); -1 with an error set. A missing hit without untied is
   skipped when skip_missing, else an error. */
static int rows_check(Rows *R, Py_ssize_t k, long untied, int skip_missing) {
    for (Py_ssize_t r = 0; r < R->n_rows; r++) {
        const float *srow = R->sc + r * R->width;
        if (untied >= 2 && R->width > k && k > 0 && srow[k - 1] == srow[k]) return 0;
        for (Py_ssize_t j = 0; j < k; j++) {
            int64_t p = R->pos[r * R->width + j];
            if (p < 0) {
                if (untied) return 0;
                if (skip_missing) continue;
                PyErr_Format(PyExc_ValueError, "%s: a missing hit (-1) needs untied", R->fn);
                return -1;
            }
            if (untied && j > 0 && srow[j] == srow[j - 1]) return 0;
            if (R->lab != NULL) {
                if (p >= R->n_labels) goto out_of_range;
                p = R->lab[p];
            }
            if (p < 0 || p >= R->n_docs) goto out_of_range;
            prefetch_columns(R->ids, R->nrm ? R->texts : NULL, R->nrm ? R->metas : NULL, R->nrm, R->cnt, R->gv, p);
        }
    }
    for (Py_ssize_t r = 0; r < R->n_rows; r++) {
        for (Py_ssize_t j = 0; j < k; j++) {
            int64_t p = R->pos[r * R->width + j];
            if (p >= 0) prefetch_objects(R->ids, R->nrm ? R->texts : NULL, R->lab != NULL ? R->lab[p] : p);
        }
    }
    return 1;
out_of_range:
    PyErr_Format(PyExc_IndexError, "%s: a position outside the index", R->fn);
    return -1;
}

/* The internal id of row r's j-th hit (checked by rows_check), or -1. */
static inline int64_t rows_doc(const Rows *R, Py_ssize_t r, Py_ssize_t j) {
    int64_t p = R->pos[r * R->width + j];
    return p < 0 || R->lab == NULL ? p : R->lab[p];
}

/* Read k and untied, the arguments at positions 2 and last. */
static int read_k_untied(const char *fn, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                         Py_ssize_t *k, long *untied) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", fn, want);
        return -1;
    }
    *k = PyLong_AsSsize_t(args[2]);
    if (*k == -1 && PyErr_Occurred()) return -1;
    if (*k < 0) {
        PyErr_Format(PyExc_ValueError, "%s: k < 0", fn);
        return -1;
    }
    *untied = PyLong_AsLong(args[nargs - 1]);
    return *untied == -1 && PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(hit_rows_doc,
"hit_rows(rows, scores, k, w, labels, columns, untied) -> list | None\n\n"
"Hit objects of an additive blend: for each result row r, the first k entries of rows[r] (FAISS positions;\n"
"mapped through labels unless it is None; -1 is no hit and is skipped) with their float32 scores[r], the\n"
"cosine score - w * g(d) (w a float, or float64 per row), and each document's id, text, metadata (None\n"
"gives a new empty dict, else copy_metadata(metadata)), norm, token count and g(d) from columns:\n"
"(ids, texts, metas, norms, counts, g), three lists and float32, int32 and float64 buffers.\n"
"untied 1: None when a row has two equal scores among its hits, or a hit is missing (-1); 2: also when\n"
"its k-th and next scores are equal (rows wider than k); the caller then orders the row by its own\n"
"rules. 0: no check. rows and scores are C-contiguous (n, width >= k) buffers.");

static PyObject *hit_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t k;
    long untied;
    Rows R;
    if (read_k_untied("hit_rows", args, nargs, 7, &k, &untied) < 0) return NULL;
    if (hit_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "hit_rows: register_hit was not called");
        return NULL;
    }
    if (rows_open(&R, "hit_rows", args, k, 1) < 0) return NULL;
    PyObject *out = NULL;
    int ok = rows_check(&R, k, untied, 1);
    if (ok <= 0) {
        rows_close(&R);
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    }
    out = PyList_New(R.n_rows);
    if (out == NULL) goto fail;
    for (Py_ssize_t r = 0; r < R.n_rows; r++) {
        double w = R.wv ? R.wv[r] : R.w_scalar;
        PyObject *wobj = PyFloat_FromDouble(w);
        PyObject *row = wobj ? PyList_New(0) : NULL;
        if (row == NULL) {
            Py_XDECREF(wobj);
            goto fail;
        }
        PyList_SET_ITEM(out, r, row);
        for (Py_ssize_t j = 0; j < k; j++) {
            int64_t i = rows_doc(&R, r, j);
            if (i < 0) continue;
            double s = R.sc[r * R.width + j], gg = R.gv[i];
            PyObject *hit = hit_type->tp_alloc(hit_type, 0);
            if (hit == NULL) {
                Py_DECREF(wobj);
                goto fail;
            }
            PyObject *m = PyList_GET_ITEM(R.metas, i);
            PyObject *v[N_FIELDS] = {
                Py_NewRef(PyList_GET_ITEM(R.ids, i)), PyFloat_FromDouble(s), PyFloat_FromDouble(s - w * gg),
                PyFloat_FromDouble((double)R.nrm[i]), PyFloat_FromDouble(gg), Py_NewRef(wobj),
                PyLong_FromLong((long)R.cnt[i]), Py_NewRef(PyList_GET_ITEM(R.texts, i)),
                m == Py_None ? PyDict_New() : PyObject_CallOneArg(copy_metadata, m)};
            int bad = 0;
            for (int f = 0; f < N_FIELDS; f++) {  /* a NULL slot reads as unset; dealloc skips it */
                *(PyObject **)((char *)hit + field_offset[f]) = v[f];
                bad |= v[f] == NULL;
            }
            if (bad || PyList_Append(row, hit) < 0) {
                Py_DECREF(hit);
                Py_DECREF(wobj);
                goto fail;
            }
            Py_DECREF(hit);
        }
        Py_DECREF(wobj);
    }
    rows_close(&R);
    return out;
fail:
    Py_XDECREF(out);
    rows_close(&R);
    return NULL;
}

PyDoc_STRVAR(array_rows_doc,
"array_rows(rows, scores, k, w, labels, columns, out_scores, out_cosines, untied) -> list | None\n\n"
"Result rows of an additive blend as search_arrays gives them: for each row, the ids of its first k hits\n"
"(positions mapped through labels unless it is None), with out_scores[r, j] = scores[r, j] and\n"
"out_cosines[r, j] = scores[r, j] - w * g(d) written into a float32 and a float64 (n, k) buffer. untied\n"
"as for hit_rows; then every hit must be present (no -1). rows, scores, w and columns as for hit_rows.");

static PyObject *array_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t k;
    long untied;
    Rows R;
    Py_buffer osb, ocb;
    if (read_k_untied("array_rows", args, nargs, 9, &k, &untied) < 0) return NULL;
    if (rows_open(&R, "array_rows", args, k, 0) < 0) return NULL;
    if (PyObject_GetBuffer(args[6], &osb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        rows_close(&R);
        return NULL;
    }
    if (PyObject_GetBuffer(args[7], &ocb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&osb);
        rows_close(&R);
        return NULL;
    }
    PyObject *result = NULL, *out = NULL;
    if (!is_format(&osb, 'f') || osb.len / 4 != R.n_rows * k || !is_format(&ocb, 'd') || ocb.len / 8 != R.n_rows * k) {
        PyErr_SetString(PyExc_ValueError, "array_rows: out_scores and out_cosines must be float32 and float64 (n, k)");
        goto done;
    }
    int ok = rows_check(&R, k, untied, 0);
    if (ok <= 0) {
        result = ok < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    float *o_sc = (float *)osb.buf;
    double *o_cos = (double *)ocb.buf;
    out = PyList_New(R.n_rows);
    if (out == NULL) goto done;
    for (Py_ssize_t r = 0; r < R.n_rows; r++) {
        double w = R.wv ? R.wv[r] : R.w_scalar;
        PyObject *row = PyList_New(k);
        if (row == NULL) goto done;
        PyList_SET_ITEM(out, r, row);
        for (Py_ssize_t j = 0; j < k; j++) {
            int64_t i = rows_doc(&R, r, j);
            double s = R.sc[r * R.width + j];
            o_sc[r * k + j] = R.sc[r * R.width + j];
            o_cos[r * k + j] = s - w * R.gv[i];
            PyList_SET_ITEM(row, j, Py_NewRef(PyList_GET_ITEM(R.ids, i)));
        }
    }
    result = out;
    out = NULL;
done:
    Py_XDECREF(out);
    PyBuffer_Release(&ocb);
    PyBuffer_Release(&osb);
    rows_close(&R);
    return result;
}

PyDoc_STRVAR(units_into_doc,
"units_into(matrix, out, norms, min_norm) -> bool\n\n"
"unit_into for each row of a C-contiguous (n, dim) float32 or float64 matrix: out (a writable float32\n"
"(n, width >= dim) buffer) gets the unit rows in its first dim columns and zeros after them, norms (a\n"
"float64 (n,) buffer) the norms. False, with out and norms undefined, when a norm is not finite, at most\n"
"min_norm or above the float32 range, or the matrix is not one this reads: the caller's general path\n"
"then reads or refuses it.");

static PyObject *units_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "units_into(matrix, out, norms, min_norm) takes 4 arguments");
        return NULL;
    }
    double min_norm = PyFloat_AsDouble(args[3]);
    if (min_norm == -1.0 && PyErr_Occurred()) return NULL;
    Py_buffer src, dst, nb;
    if (PyObject_GetBuffer(args[0], &src, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
    if (src.ndim != 2 || !PyBuffer_IsContiguous(&src, 'C') || !(is_format(&src, 'f') || is_format(&src, 'd'))) {
        PyBuffer_Release(&src);
        Py_RETURN_FALSE;
    }
    if (PyObject_GetBuffer(args[1], &dst, PyBUF_STRIDES | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &nb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = src.shape[0], dim = src.shape[1];
    if (dst.ndim != 2 || !PyBuffer_IsContiguous(&dst, 'C') || !is_format(&dst, 'f') || dst.shape[0] != n
        || dst.shape[1] < dim || !is_format(&nb, 'd') || nb.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "units_into: out must be float32 (n, width >= dim), norms float64 (n,)");
        goto done;
    }
    Py_ssize_t width = dst.shape[1];
    double *norms = (double *)nb.buf;
    int ok = 1;
    int is_double = is_format(&src, 'd');
    for (Py_ssize_t r = 0; r < n && ok; r++) {
        float *out = (float *)dst.buf + r * width;
        ok = unit_row((const char *)src.buf + r * dim * (is_double ? 8 : 4), is_double, dim, out, min_norm, &norms[r]);
        if (ok) memset(out + dim, 0, (size_t)(width - dim) * 4);
    }
    result = Py_NewRef(ok ? Py_True : Py_False);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&nb);
    return result;
}

PyDoc_STRVAR(lean_batch_doc,
"lean_batch(queries, counts, max_count, dim, min_norm, column, sgemm, vectors, steps, qaug, out_scores,\n"
"out_positions) -> bool\n\n"
"The batch search of raw query vectors in one call: qaug (float32 (n, width)) gets each query's unit row\n"
"(as units_into), then the float32 of column after it and zeros, and out_scores / out_positions (float32 /\n"
"int64 (n, k)) its exact top-k over vectors (as scan_topk, the first dim + 1 columns). steps is (vectors\n"
"per sgemm on one thread, the same with more, the address of omp_get_max_threads or 0 for one thread).\n"
"False, with nothing scanned, when queries is not a C-contiguous float32 or float64 (n >= 1, dim)\n"
"matrix, counts is neither None nor a list or tuple of n ints in [1, max_count], or a row's norm is not\n"
"finite, at most min_norm or beyond float32: the caller's general path then reads or refuses them.");

static int plain_counts(PyObject *counts, Py_ssize_t n, long max_count) {
    if (counts == Py_None) return 1;
    if (!PyList_CheckExact(counts) && !PyTuple_CheckExact(counts)) return 0;
    if (PySequence_Fast_GET_SIZE(counts) != n) return 0;
    PyObject **items = PySequence_Fast_ITEMS(counts);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_CheckExact(items[i])) return 0;  /* type(c) is int: not a bool, not a NumPy integer */
        int overflow;
        long c = PyLong_AsLongAndOverflow(items[i], &overflow);
        if (overflow || c < 1 || c > max_count) return 0;
    }
    return 1;
}

static PyObject *lean_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "lean_batch takes 12 arguments");
        return NULL;
    }
    long max_count = PyLong_AsLong(args[2]);
    PyObject *steps = args[8];
    if (!PyTuple_CheckExact(steps) || PyTuple_GET_SIZE(steps) != 3) {
        PyErr_SetString(PyExc_TypeError, "lean_batch: steps is (one thread, more threads, omp_get_max_threads)");
        return NULL;
    }
    int (*threads)(void) = (int (*)(void))PyLong_AsVoidPtr(PyTuple_GET_ITEM(steps, 2));  /* 0: NULL */
    Py_ssize_t dim = PyLong_AsSsize_t(args[3]), step = PyLong_AsSsize_t(PyTuple_GET_ITEM(steps, 0));
    if (threads != NULL && threads() > 1) step = PyLong_AsSsize_t(PyTuple_GET_ITEM(steps, 1));
    double min_norm = PyFloat_AsDouble(args[4]), column = PyFloat_AsDouble(args[5]);
    void *fn = PyLong_AsVoidPtr(args[6]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer src;
    if (PyObject_GetBuffer(args[0], &src, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {  /* a list of rows, say */
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    int is_double = is_format(&src, 'd');
    if (src.ndim != 2 || !PyBuffer_IsContiguous(&src, 'C') || !(is_double || is_format(&src, 'f'))
        || src.shape[1] != dim || src.shape[0] < 1 || !plain_counts(args[1], src.shape[0], max_count)) {
        PyBuffer_Release(&src);
        Py_RETURN_FALSE;
    }
    static const char *const names[] = {"vectors", "qaug", "out_scores", "out_positions"};
    PyObject *const objs[] = {args[7], args[9], args[10], args[11]};
    Py_buffer b[4];
    if (scan_buffers("lean_batch", 4, b, objs, "fffq", names, 0xE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    const Py_buffer *xb = &b[0], *qa = &b[1], *vs = &b[2], *ps = &b[3];
    PyObject *result = NULL;
    Py_ssize_t n = src.shape[0], width = qa->ndim == 2 ? qa->shape[1] : -1, k = vs->ndim == 2 ? vs->shape[1] : -1;
    if (fn == NULL || qa->ndim != 2 || qa->shape[0] != n || width < dim + 1 || xb->ndim != 2 || xb->shape[1] != width
        || vs->ndim != 2 || vs->shape[0] != n || k < 1 || ps->ndim != 2 || ps->shape[0] != n || ps->shape[1] != k
        || step < 1 || n > INT32_MAX || step > INT32_MAX || xb->shape[0] > INT32_MAX || width > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "lean_batch: qaug (n, width > dim), vectors (m, width), out_scores and "
                                          "out_positions (n, k >= 1), step >= 1");
        goto done;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        float *out = (float *)qa->buf + r * width;
        double norm;
        if (!unit_row((const char *)src.buf + r * dim * (is_double ? 8 : 4), is_double, dim, out, min_norm, &norm)) {
            result = Py_NewRef(Py_False);
            goto done;
        }
        out[dim] = (float)column;  /* float64 to float32, rounded to nearest as NumPy's assignment does */
        memset(out + dim + 1, 0, (size_t)(width - dim - 1) * 4);
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = scan_blocks(fn, qa->buf, n, width, xb->buf, xb->shape[0], dim + 1, step, k, vs->buf, ps->buf);
    Py_END_ALLOW_THREADS
    result = ok ? Py_NewRef(Py_True) : PyErr_NoMemory();
done:
    PyBuffer_Release(&src);
    release_buffers(b, 4);
    return result;
}

static PyMethodDef methods[] = {
    {"unit_into", (PyCFunction)(void (*)(void))unit_into, METH_FASTCALL, unit_into_doc},
    {"units_into", (PyCFunction)(void (*)(void))units_into, METH_FASTCALL, units_into_doc},
    {"register_hit", register_hit, METH_VARARGS, register_hit_doc},
    {"hit_rows", (PyCFunction)(void (*)(void))hit_rows, METH_FASTCALL, hit_rows_doc},
    {"array_rows", (PyCFunction)(void (*)(void))array_rows, METH_FASTCALL, array_rows_doc},
    {"scan_topk", (PyCFunction)(void (*)(void))scan_topk, METH_FASTCALL, SCAN_TOPK_DOC},
    {"lean_batch", (PyCFunction)(void (*)(void))lean_batch, METH_FASTCALL, lean_batch_doc},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "normrank._fastpath",
                                    "The single-search hot path in C (optional; see normrank/store.py).", -1,
                                    methods};

/* What normrank/fastpath.py expects; raise it with any change of a function's arguments or results, so
   that a module built from older sources (an editable install not rebuilt) is left unused. */
#define API_VERSION 3

PyMODINIT_FUNC PyInit__fastpath(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "API_VERSION", API_VERSION) < 0) Py_CLEAR(m);
    return m;
}
