"""Exact inner-product top-k of a batch of queries over a FAISS flat index's stored vectors.

Why here and not in FAISS: FAISS scores a batch with BLAS only from
``faiss.cvar.distance_compute_blas_threshold`` (128000) queries, a process-wide switch normrank will
not flip under other threads' feet. Below it, FAISS's per-query kernel scored 64 queries over 10k-1M
vectors 2-5x slower than one sgemm per block of stored vectors plus FAISS's own top-k heaps
(benchmarks/results/speed.md). This module does what FAISS's BLAS path does, with the sgemm FAISS
bundles (:mod:`normrank.faiss_blas`) and, where normrank's C module was built, top-k heaps of its own
that keep FAISS's order but skip losing scores 16 at a time (normrank/_scan_topk.c); ``NormIndex`` calls
it for flat batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import faiss
import numpy as np

from normrank import faiss_blas, fastpath
from normrank._validation import MAX_TOKEN_COUNT
from normrank.index_base import PLAIN_MIN_NORM

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


def sgemm_topk(flat: Any, q: np.ndarray, k: int, width: int | None = None,
               vectors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-``k`` of a batch over a FAISS flat index's stored vectors, by positions.

    ``width`` leaves out trailing columns that are zero in the queries (the padding): they add
    nothing to any score, and the product's work grows with the columns it multiplies (385 against
    392 is 2% less, which is what separated it from FAISS's 384-wide BLAS kernel at 10k documents).
    ``vectors`` is :func:`stored_vectors` of ``flat``, if the caller keeps it (reading it costs several
    SWIG calls per search).

    What FAISS's BLAS path does, without its process-wide switch: the stored vectors are streamed
    once in blocks of rows and one sgemm per block scores the whole batch (the sgemm FAISS bundles, see
    :mod:`normrank.faiss_blas`). The top ``k`` are kept by the C heaps of
    :func:`normrank.fastpath.scan_topk` where it was built (FAISS's heap order with a cheaper test per
    score: the whole C scan measured 1.12-1.23x FAISS's BLAS path at 10k-100k documents), else by FAISS's own heaps
    (``argpartition`` was 40x slower than them at 64 x 10k scores; looping over query blocks re-read 1M
    vectors per block). Both give FAISS's scores and order.
    """
    xb = stored_vectors(flat) if vectors is None else vectors
    n, d = xb.shape
    bundled = faiss_blas.sgemm()
    threads = faiss.omp_get_max_threads()
    nq = q.shape[0]
    out_s = np.empty((nq, k), dtype=np.float32)
    out_p = np.empty((nq, k), dtype=np.int64)
    if bundled is not None and fastpath.scan_topk is not None:  # the block loop in C, without the GIL
        w = d if width is None else width
        for a in range(0, nq, SGEMM_QUERY_BLOCK):
            qb = np.ascontiguousarray(q if nq <= SGEMM_QUERY_BLOCK else q[a:a + SGEMM_QUERY_BLOCK], dtype=np.float32)
            fastpath.scan_topk(bundled.address, qb, xb, w, block_rows(qb.shape[0], threads, fast_heaps=True),  # type: ignore[attr-defined]
                               out_s[a:a + SGEMM_QUERY_BLOCK], out_p[a:a + SGEMM_QUERY_BLOCK])
        return out_s, out_p
    product = bundled or faiss_blas.numpy_sgemm
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


def raw_batch_topk(queries: Any, counts: Any, dim: int, column: float, vectors: np.ndarray | None,
                   k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The augmented queries of a batch of raw query vectors (unit rows, then ``column``, then zeros) and
    their exact top-``k`` over ``vectors`` (:func:`stored_vectors` of a flat index): ``(qaug, scores,
    positions)``, the values :func:`sgemm_topk` gives for that ``qaug``, in one C call
    (:func:`normrank.fastpath.lean_batch`). ``None`` without the C module or the bundled sgemm, and for any
    other batch than a float matrix of ``SGEMM_MIN_BATCH`` to ``SGEMM_QUERY_BLOCK`` rows of width ``dim``
    with norms a search accepts and ``counts`` ``None`` or whole numbers (a list or tuple): the caller's
    general path then reads it, or names what is wrong.

    Why one call: the caches are cold when a batch arrives (a service's other work, or the benchmark's
    buffer written between turns), and there each Python and NumPy step of the general path (checking the
    counts, the unit rows, the weight column, then the scan's own setup) cost 10-40 us: ~0.2 ms of a
    64-query batch over 10k documents on 2 threads (benchmarks/results/speed.md)."""
    bundled = faiss_blas.sgemm()
    if (fastpath.lean_batch is None or bundled is None or vectors is None or not isinstance(queries, np.ndarray)
            or queries.ndim != 2 or not SGEMM_MIN_BATCH <= queries.shape[0] <= SGEMM_QUERY_BLOCK):
        return None
    n = queries.shape[0]
    qaug = np.empty((n, vectors.shape[1]), dtype=np.float32)
    scores, positions = np.empty((n, k), dtype=np.float32), np.empty((n, k), dtype=np.int64)
    if not fastpath.lean_batch(queries, counts, MAX_TOKEN_COUNT, dim, PLAIN_MIN_NORM, column, bundled.address,  # type: ignore[attr-defined]
                               vectors, _steps(n) or _steps_now(n), qaug, scores, positions):
        return None
    return qaug, scores, positions


@functools.lru_cache(maxsize=64)
def _steps(queries: int) -> tuple[int, int, int] | None:
    """:func:`block_rows` of a batch on one thread and on more, and the address of the bundled OpenMP's
    ``omp_get_max_threads``, which tells the C code which to take; ``None`` without that address (then
    :func:`_steps_now`). Cached: on cold caches the SWIG call and ``block_rows`` cost ~35 us of a batch."""
    omp = faiss_blas.omp_threads_address()
    return None if omp is None else (block_rows(queries, 1, fast_heaps=True), block_rows(queries, 2, fast_heaps=True), omp)


def _steps_now(queries: int) -> tuple[int, int, int]:
    """The step for this thread's OpenMP count now, for the C code to take as it is."""
    step = block_rows(queries, faiss.omp_get_max_threads(), fast_heaps=True)
    return step, step, 0


def stored_vectors(flat: Any) -> np.ndarray:
    """A FAISS flat index's stored vectors as an ``(n, d)`` float32 view (no copy); valid until the
    index changes."""
    n, d = flat.ntotal, flat.d
    return faiss.rev_swig_ptr(flat.get_xb(), n * d).reshape(n, d)


def block_rows(queries: int, threads: int, fast_heaps: bool = False) -> int:
    """Stored vectors per sgemm block, chosen by batch size and thread count: FAISS's 1024 on one
    thread; with more, enough that FAISS's heaps spread over the threads (at 100k documents and 2
    threads, 64 queries: 0.97 of FAISS's BLAS path against 0.88 with 1024); at most ``SGEMM_BLOCK``
    scores per block. ``fast_heaps``: normrank's C heaps (:func:`normrank.fastpath.scan_topk`), which
    run on the calling thread; with more threads than one they keep 4096 (64 queries, 2 threads: 1.15x and
    1.21x FAISS's BLAS path at 10k and 100k documents against 1.12x and 1.15x with 1024)."""
    step = SGEMM_ROWS
    if threads > 1 and fast_heaps:
        step = 4 * SGEMM_ROWS
    elif threads > 1:
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
