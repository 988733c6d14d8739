/* The batched flat scan of normrank/_scan_topk.c, a function of the normrank._fastpath module. */
#ifndef NORMRANK_SCAN_TOPK_H
#define NORMRANK_SCAN_TOPK_H
#include <Python.h>

#define SCAN_TOPK_DOC \
"scan_topk(sgemm, queries, vectors, width, step, out_scores, out_positions)\n\n" \
"Each query's exact inner-product top-k over the stored vectors, as FAISS's BLAS path and heaps give it\n" \
"(the same scores and order, ties by the lower position; -FLT_MAX and -1 where fewer than k vectors):\n" \
"sgemm is the address of a cblas_sgemm (int arguments), queries a C-contiguous float32 (r, d) matrix,\n" \
"vectors one of (n, d), width the leading columns multiplied (the rest are zero in the queries), step\n" \
"the stored vectors per sgemm; out_scores float32 and out_positions int64 (r, k) are written."

PyObject *scan_topk(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* The scan itself, to be called without the GIL: q (rows, d) and xb (n, d) float32 rows, the first width
   columns multiplied, step stored vectors per sgemm; val and ids (rows, k) are written. 0 when out of
   memory (nothing written), else 1. */
int scan_blocks(void *sgemm, const float *q, Py_ssize_t rows, Py_ssize_t d, const float *xb, Py_ssize_t n,
                Py_ssize_t width, Py_ssize_t step, Py_ssize_t k, float *val, int64_t *ids);

/* obj's buffer, C-contiguous, of item type code ('f' float32, 'd' float64, 'q' int64, 'i' int32) and size
   itemsize, writable if asked: 0, or -1 with a TypeError naming fn and what (nothing held). In _fastpath.c. */
int typed_buffer(PyObject *obj, Py_buffer *b, int writable, char code, Py_ssize_t itemsize, const char *fn,
                 const char *what);

/* typed_buffer for each of the n objs into out, item types codes[i] ('f' float32, 'q' int64), writable where
   bit i of writable is set: 0, or -1 with the error of the first refused (nothing held). */
int scan_buffers(const char *fn, int n, Py_buffer *out, PyObject *const *objs, const char *codes,
                 const char *const *names, unsigned writable);
void release_buffers(Py_buffer *b, int n);
#endif
