"""Huge pages for the stored vectors of a flat index.

Why: an exact flat search streams every stored vector. With 4 KiB pages a 10k-document index (15 MB)
spans about 3,800 pages, more than the CPU's TLB holds, so the scan waits on page-table walks. Moved
to 2 MiB pages, the same FAISS kernel over the same bytes ran 1.10-1.33x faster from 10k to 1M
documents on the benchmark machine (benchmarks/results/speed.md, section 5). NumPy already asks
for huge pages for its own large arrays; FAISS keeps its vectors in a C++ vector, which nobody asks
for. So normrank asks Linux itself, after each change to the storage: ``madvise(MADV_HUGEPAGE)`` marks
the range, and ``MADV_COLLAPSE`` (Linux 6.1+) moves it into huge pages now instead of waiting for the
``khugepaged`` daemon (which takes minutes for a large index).

The collapse copies the vectors (0.03-0.1 s for 150 MB, 0.3-3 s for 1.5 GB, depending on how fragmented
the machine's memory is), which would have pushed a load past twice FAISS's ``read_index`` time. So it
runs on one background thread (:func:`advise_soon`; ctypes lets go of the GIL during the call) and
the load or add returns at once. Both calls keep the memory's contents, so searches running meanwhile
read the same numbers, only on smaller pages; a stale range (the storage moved when it grew) is
harmless for the same reason. Where the kernel says no (another OS, an older kernel, transparent huge
pages set to ``never``, no free huge page) nothing changes and nothing fails.
Like NumPy's advice for its own arrays, the mark stays on the address range after FAISS frees the
buffer (when the index grows into a new one); buffers above glibc's mmap threshold (at most 32 MiB) are
unmapped when freed, so what can linger on the heap is bounded by that.
``NORMRANK_HUGE_PAGES=off`` (or :func:`set_enabled`) turns it off, for instance to measure FAISS's
plain storage; :func:`wait` waits for the pending advice (tests, benchmarks).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections import deque

from normrank.errors import ConfigError

logger = logging.getLogger(__name__)

ENV_VAR = "NORMRANK_HUGE_PAGES"
HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_ON, _OFF = {"", "1", "on", "true", "yes"}, {"0", "off", "false", "no"}


def _from_environment() -> bool:
    raw = os.environ.get(ENV_VAR, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigError(f"{ENV_VAR}={raw!r} is not understood: use 'on' or 'off' (or leave it unset for on)")


_enabled = _from_environment()  # a typo fails at import, not silently later


def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_call = _madvise()


def set_enabled(enabled: bool) -> None:
    """Turn the advice on or off for storage changed from now on (what is already advised stays)."""
    global _enabled
    if not isinstance(enabled, bool):
        raise ConfigError(f"set_enabled takes True or False, got {enabled!r}")
    _enabled = enabled


def enabled() -> bool:
    """Whether normrank asks for huge pages (on Linux, unless turned off)."""
    return _enabled and _call is not None


def advise(address: int, nbytes: int) -> bool:
    """Ask for huge pages over the whole 2 MiB pages inside ``[address, address + nbytes)``.

    Only whole huge pages inside the range are touched, never a neighbour's memory. Returns whether
    the kernel collapsed the range into huge pages now (``False`` when off, too small or refused).
    """
    if not enabled():
        return False
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    if end <= start:
        return False
    assert _call is not None
    if _call(start, end - start, _MADV_HUGEPAGE) != 0:
        logger.debug("madvise(MADV_HUGEPAGE) refused: errno %d", ctypes.get_errno())
        return False
    if _call(start, end - start, _MADV_COLLAPSE) != 0:  # e.g. EINVAL before Linux 6.1: khugepaged will do it
        logger.debug("madvise(MADV_COLLAPSE) refused: errno %d", ctypes.get_errno())
        return False
    return True


def huge_share(address: int, nbytes: int) -> float:
    """The share of ``[address, address + nbytes)`` on huge pages now (:func:`huge_bytes` / ``nbytes``)."""
    return huge_bytes(address, nbytes) / nbytes if nbytes else 0.0


def huge_bytes(address: int, nbytes: int) -> int:
    """Bytes of ``[address, address + nbytes)`` that Linux backs with huge pages now, from
    ``/proc/self/smaps`` (0 elsewhere). For tests and the benchmark's report, not for a hot path."""
    try:
        with open("/proc/self/smaps", encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return 0
    total, lo, hi = 0, 0, 0
    end = address + nbytes
    for line in lines:
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):  # a mapping's header: start-end perms ...
            lo, hi = (int(x, 16) for x in head.split("-"))
        elif head == "AnonHugePages:" and lo < end and hi > address:
            vma_huge = int(line.split()[1]) * 1024
            total += min(vma_huge, min(hi, end) - max(lo, address))
    return total


_pending: deque[tuple[int, int]] = deque()
_changed = threading.Condition()
_busy = False  # the worker is inside a madvise call
_worker: threading.Thread | None = None


def advise_soon(address: int, nbytes: int) -> None:
    """:func:`advise` on the background thread; returns at once. Requests run in order."""
    global _worker
    if not enabled() or nbytes < HUGE_PAGE:
        return
    with _changed:
        if _worker is None or not _worker.is_alive():
            worker = threading.Thread(target=_work, name="normrank-huge-pages", daemon=True)
            try:
                worker.start()
            except RuntimeError:  # no thread to be had (interpreter shutting down, a thread limit): skip
                logger.debug("no thread for huge-page advice", exc_info=True)
                return
            _worker = worker
        _pending.append((address, nbytes))
        _changed.notify_all()


def _work() -> None:
    global _busy
    while True:
        with _changed:
            while not _pending:
                _busy = False
                _changed.notify_all()
                _changed.wait()
            address, nbytes = _pending.popleft()
            _busy = True
        try:
            advise(address, nbytes)
        except Exception:  # never let the worker die: the advice is only an optimisation
            logger.debug("huge-page advice failed", exc_info=True)


def _after_fork_in_child() -> None:
    """A forked child has no worker thread, and the lock may have been held by it at the fork."""
    global _pending, _changed, _busy, _worker
    _pending, _changed, _busy, _worker = deque(), threading.Condition(), False, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def wait(timeout: float | None = None) -> bool:
    """Wait until every requested advice has run; ``False`` if ``timeout`` seconds passed first."""
    with _changed:
        return _changed.wait_for(lambda: not _pending and not _busy, timeout)
