"""Exact inner-product top-k of a batch of queries over a FAISS flat index's stored vectors.

Why here and not in FAISS: FAISS scores a batch with BLAS only from
``faiss.cvar.distance_compute_blas_threshold`` (128000) queries, a process-wide switch normrank will
not flip under other threads' feet. Below it, FAISS's per-query kernel scored 64 queries over 10k-1M
vectors 2-5x slower than one sgemm per block of stored vectors plus FAISS's own top-k heaps
(benchmarks/results/speed.md). This module does what FAISS's BLAS path does, with the sgemm FAISS
bundles (:mod:`normrank.faiss_blas`), and ``NormIndex`` calls it for flat batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import faiss
import numpy as np

from normrank import faiss_blas

T = TypeVar("T")

#: Flat batches of at least this many queries are scored here instead of by FAISS's per-query kernel.
#: Exact either way: the same inner products, each row's top-k.
SGEMM_MIN_BATCH = 8
#: Score about this many query x document products per sgemm (4 MiB of float32 scores), and at
#: most this many queries against one pass over the stored vectors.
SGEMM_BLOCK = 1 << 20
SGEMM_QUERY_BLOCK = 4096
#: Stored vectors per sgemm block on one thread: FAISS's own BLAS block (1024), measured fastest at
#: 1 thread on the benchmark machine (4096 ran 5-10% slower at 100k documents).
SGEMM_ROWS = 1024
#: FAISS's heaps go parallel only past this many scores per call (``HeapArray::addn``).
_HEAPS_PARALLEL_FROM = 100_000


def sgemm_topk(flat: Any, q: np.ndarray, k: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-``k`` of a batch over a FAISS flat index's stored vectors, by positions.

    ``width`` leaves out trailing columns that are zero in the queries (the padding): they add
    nothing to any score, and the product's work grows with the columns it multiplies (385 against
    392 is 2% less, which is what separated it from FAISS's 384-wide BLAS kernel at 10k documents).

    What FAISS's BLAS path does, without its process-wide switch: the stored vectors are streamed
    once in blocks of rows, one sgemm per block scores the whole batch (the sgemm FAISS bundles, see
    :mod:`normrank.faiss_blas`), and FAISS's own top-k heaps keep the best (``argpartition`` was 40x
    slower than the heaps at 64 x 10k scores; looping over query blocks re-read 1M vectors per block).
    """
    n, d = flat.ntotal, flat.d
    xb = faiss.rev_swig_ptr(flat.get_xb(), n * d).reshape(n, d)  # a view: no copy of the vectors
    bundled = faiss_blas.sgemm()
    product = bundled or faiss_blas.numpy_sgemm
    threads = faiss.omp_get_max_threads()
    nq = q.shape[0]
    out_s = np.empty((nq, k), dtype=np.float32)
    out_p = np.empty((nq, k), dtype=np.int64)
    for a in range(0, nq, SGEMM_QUERY_BLOCK):
        qb = np.ascontiguousarray(q[a:a + SGEMM_QUERY_BLOCK], dtype=np.float32)
        rows = qb.shape[0]
        dist, pos = out_s[a:a + rows], out_p[a:a + rows]  # contiguous row blocks, filled in place
        heaps = faiss.float_minheap_array_t()
        heaps.k, heaps.nh = k, rows
        heaps.val, heaps.ids = faiss.swig_ptr(dist), faiss.swig_ptr(pos)
        heaps.heapify()
        step = block_rows(rows, threads)
        block = np.empty((rows, step), dtype=np.float32)  # one query row per line, as the heaps read it
        if bundled is not None:  # its OpenMP pool is FAISS's: the heaps share the threads
            by_address, addr = bundled.by_address, faiss_blas.address  # type: ignore[attr-defined]
            q_at, xb_at, row_bytes, w = addr(qb), addr(xb), 4 * d, d if width is None else width
            block_at, block_ptr = addr(block), faiss.swig_ptr(block)
            for j0 in range(0, n, step):
                m = min(step, n - j0)  # a shorter last block fills the front of the buffer, rows m wide
                by_address(rows, m, w, q_at, d, xb_at + j0 * row_bytes, d, block_at)
                heaps.addn(m, block_ptr, j0)
            heaps.reorder()
            continue
        for j0 in range(0, n, step):
            m = min(step, n - j0)
            sims = block if m == step else np.empty((rows, m), dtype=np.float32)
            product(qb, xb[j0:j0 + m], sims, width)
            # NumPy's OpenBLAS has its own thread pool, whose spinning threads fought the heaps' OpenMP
            # loop for the cores (2 threads at 300k: 289 ms against 143 ms): the heaps on one thread.
            at_most_threads(1, heaps.addn, m, faiss.swig_ptr(sims), j0)
        heaps.reorder()
    return out_s, out_p


def block_rows(queries: int, threads: int) -> int:
    """Stored vectors per sgemm block, chosen by batch size and thread count: FAISS's 1024 on one
    thread; with more, enough that FAISS's heaps spread over the threads (at 100k documents and 2
    threads, 64 queries: 0.97 of FAISS's BLAS path against 0.88 with 1024); at most ``SGEMM_BLOCK``
    scores per block."""
    step = SGEMM_ROWS
    if threads > 1:
        step = max(step, min(4 * SGEMM_ROWS, -(-(_HEAPS_PARALLEL_FROM + 1) // queries // 256) * 256 + 256))
    return max(256, min(step, SGEMM_BLOCK // queries))


def at_most_threads(limit: int, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` with at most ``limit`` OpenMP threads (FAISS's and its bundled OpenBLAS's pool).

    Why: flat searches of fewer queries than threads run with one thread per query. With fewer queries
    than threads, FAISS 1.15 splits the stored vectors between its threads and scores each part with an
    sgemm of the bundled OpenBLAS, which inside that parallel region starts threads of its own. On the
    benchmark machine (2 cores) a single query over 10k-1M vectors took 2.5-2.7x as long that way as on
    FAISS's per-query kernel with one thread; with OpenBLAS held to one thread the split was no faster
    than the per-query kernel. The per-query kernel also gives the scores, and the order of tied
    documents, that every other path of ``NormIndex`` gives. OpenMP's thread count is a setting of the
    calling thread, so no other thread is affected.
    """
    threads = faiss.omp_get_max_threads()
    if threads <= limit:
        return call(*args)
    faiss.omp_set_num_threads(max(1, limit))
    try:
        return call(*args)
    finally:
        faiss.omp_set_num_threads(threads)
