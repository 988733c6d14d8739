"""The sgemm FAISS itself uses, for normrank's batched flat search.

Why: a batch of queries is scored block by block with one matrix product and FAISS's top-k
heaps. NumPy's OpenBLAS ran that product 10-35% slower on the benchmark machine than the
OpenBLAS the faiss-cpu wheel bundles (benchmarks/results/speed.md), and FAISS's own BLAS
kernel can only be switched on through a process-wide threshold that normrank will not
change under other threads' feet. So normrank calls the bundled library's ``cblas_sgemm``
directly (ctypes releases the GIL for the call); where there is no such library (a conda
build against MKL, another platform), it uses NumPy. Both compute the same inner products.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from collections.abc import Callable

import numpy as np

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _bundled_openblas() -> str | None:
    import faiss

    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(faiss.__file__))), "faiss_cpu.libs")
    found = sorted(glob.glob(os.path.join(libs, "libopenblas*.so*")))
    return found[0] if len(found) == 1 else None


def _load() -> Callable[..., None] | None:
    path = _bundled_openblas()
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).cblas_sgemm
    except (OSError, AttributeError):
        return None
    c_int, c_float, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    fn.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, c_float, ptr, c_int, ptr, c_int, c_float, ptr, c_int]
    fn.restype = None

    def sgemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, width: int | None = None) -> None:
        """``out[:] = a[:, :width] @ b[:, :width].T`` for C-contiguous float32 rows ``a`` (r x d) and
        ``b`` (m x d) and ``out`` (r x m); ``width`` (default d) leaves out trailing columns."""
        r, d = a.shape
        m = b.shape[0]
        fn(_ROW_MAJOR, _NO_TRANS, _TRANS, r, m, d if width is None else width, 1.0, address(a), d,
           address(b), d, 0.0, address(out), m)

    def by_address(r: int, m: int, width: int, a: int, lda: int, b: int, ldb: int, out: int) -> None:
        """:func:`sgemm` on addresses (``out`` r x m, rows of ``lda``/``ldb`` floats): a block loop takes
        each array's address once, where ``ndarray.ctypes.data`` cost ~5 us a call (3 per block)."""
        fn(_ROW_MAJOR, _NO_TRANS, _TRANS, r, m, width, 1.0, a, lda, b, ldb, 0.0, out, m)

    sgemm.by_address = by_address  # type: ignore[attr-defined]
    # for C code that calls it itself (normrank._fastpath.scan_topk)
    sgemm.address = ctypes.cast(fn, ctypes.c_void_p).value  # type: ignore[attr-defined]

    # Check once against NumPy on a small product before trusting it.
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    out = np.empty((3, 4), dtype=np.float32)
    sgemm(a, b, out)
    narrow = np.empty((3, 4), dtype=np.float32)
    sgemm(a, b, narrow, 3)
    ok = np.allclose(out, a @ b.T, atol=1e-5) and np.allclose(narrow, a[:, :3] @ b[:, :3].T, atol=1e-5)
    return sgemm if ok else None


@functools.cache
def omp_threads_address() -> int | None:
    """The address of ``omp_get_max_threads`` in the OpenMP runtime the faiss-cpu wheel bundles (the one
    FAISS and its OpenBLAS read), for C code that picks a block size by thread count without a SWIG call
    (~15 us on cold caches); ``None`` where there is no such library or it disagrees with FAISS."""
    import faiss

    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(faiss.__file__))), "faiss_cpu.libs")
    found = sorted(glob.glob(os.path.join(libs, "libgomp*.so*")))
    if len(found) != 1:
        return None
    try:
        fn = ctypes.CDLL(found[0]).omp_get_max_threads
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    if fn() != faiss.omp_get_max_threads():  # another runtime than FAISS's: do not trust it
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def address(a: np.ndarray) -> int:
    """The address of an array's first element (``ndarray.ctypes.data`` builds a ctypes helper first)."""
    return a.__array_interface__["data"][0]


@functools.cache
def sgemm() -> Callable[..., None] | None:
    """The bundled ``cblas_sgemm`` as ``sgemm(a, b, out, width=None)``, or ``None`` (then use NumPy)."""
    return _load()


def numpy_sgemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, width: int | None = None) -> None:
    """The fallback: ``out[:] = a[:, :width] @ b[:, :width].T`` by NumPy."""
    np.matmul(a[:, :width], b[:, :width].T, out=out)
