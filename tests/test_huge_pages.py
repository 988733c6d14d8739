"""Huge pages for a flat index's stored vectors (normrank.huge_pages, issue 14).

What a user gets: after an add and after a load, the vectors sit on 2 MiB pages once the background
advice has run; searches while it runs give the same answers; ``NORMRANK_HUGE_PAGES=off`` leaves the
pages alone; a setting it does not understand is refused by name. Page state is read from the real
kernel (/proc/self/smaps). The speed it buys lives in benchmarks/speed.py (sections 1 and 5).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import faiss
import numpy as np
import pytest

from normrank import huge_pages
from normrank.errors import ConfigError
from normrank.scoring import Weights
from normrank.store import NormIndex, flat_vectors_span

ROOT = Path(__file__).resolve().parents[1]
DIM = 384
N = 30_000  # 47 MB of stored vectors: above glibc's largest mmap threshold, so a load maps fresh pages


def _collapses_here() -> bool:
    """Does this kernel move a written private anonymous mapping (what malloc maps) into huge pages
    when asked? Asked directly, not through normrank, so that the answer does not depend on it."""
    if not sys.platform.startswith("linux"):
        return False
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    size = 8 << 20
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.write(b"\x01" * size)
    view = ctypes.c_char.from_buffer(buf)
    start = -(-ctypes.addressof(view) // (2 << 20)) * (2 << 20)
    ok = madvise(start, 4 << 20, 14) == 0 and madvise(start, 4 << 20, 25) == 0  # HUGEPAGE, COLLAPSE
    ok = ok and huge_pages.huge_bytes(start, 4 << 20) > 0
    del view
    buf.close()
    return ok


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "unknown"


needs_collapse = pytest.mark.skipif(not _collapses_here(),
                                    reason="this kernel does not collapse memory into huge pages on request")


@pytest.fixture(autouse=True)
def advice_on():
    """On for each test, whatever NORMRANK_HUGE_PAGES says in the environment running the suite."""
    was = huge_pages._enabled
    huge_pages.set_enabled(True)
    yield
    huge_pages.set_enabled(was)


def _share(index: NormIndex) -> float:
    return huge_pages.huge_share(*flat_vectors_span(faiss.downcast_index(index._index.index)))


def _corpus(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM)).astype(np.float32) * rng.lognormal(0, 0.2, (n, 1)).astype(np.float32)
    return x, rng.integers(5, 250, n)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw, counts = _corpus()
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts, ids=[f"d{i}" for i in range(N)])
    path = tmp_path_factory.mktemp("huge") / "idx"
    index.save(path)
    return path


@needs_collapse
def test_vectors_move_to_huge_pages_after_an_add():
    """47 MB of vectors: FAISS's buffer is a fresh mapping (above glibc's largest mmap threshold), on
    4 KiB pages unless someone asks."""
    raw, counts = _corpus(seed=1)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts)
    assert huge_pages.wait(60)
    assert _share(index) >= 0.88  # only whole 2 MiB pages inside the 45 MiB buffer: at least 41 MiB


_PROBE = r"""
import json, sys
from normrank import huge_pages
from normrank.store import NormIndex, flat_vectors_span
import faiss
index = NormIndex.load(sys.argv[1])
huge_pages.wait(60)
share = huge_pages.huge_share(*flat_vectors_span(faiss.downcast_index(index._index.index)))
print(json.dumps({"share": share, "n": len(index)}))
"""


def _load_in_fresh_process(path: Path, setting: str) -> dict:
    env = {**os.environ, huge_pages.ENV_VAR: setting, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_collapse
def test_a_service_that_loads_the_index_gets_huge_pages_and_off_means_off(saved):
    """A fresh process, as a service starts: read_index maps fresh 4 KiB pages; normrank then asks for
    huge ones. With the setting off the same load stays on 4 KiB pages."""
    on = _load_in_fresh_process(saved, "on")
    assert on["n"] == N and on["share"] >= 0.88  # whole 2 MiB pages inside 45 MiB: at least 41 MiB
    if _thp_mode() == "madvise":  # with 'always' the kernel gives huge pages to everyone
        off = _load_in_fresh_process(saved, "off")
        assert off["n"] == N and off["share"] < 0.05


def test_searches_while_the_advice_runs_give_the_answers_of_plain_pages(saved):
    """The advice copies the vectors into other pages in the background; searches that run meanwhile
    (from several threads) get exactly the answers of the same index loaded with the advice off.

    Each thread compares against the plain index searched in that same thread: FAISS's single-query
    kernel rounds the last bit differently with 1 and with 2 OpenMP threads, and the OpenMP thread
    count is a per-thread setting (another test may have set it to 1 on the main thread)."""
    huge_pages.set_enabled(False)
    try:
        plain = NormIndex.load(saved)
    finally:
        huge_pages.set_enabled(True)
    rng = np.random.default_rng(5)
    queries = rng.standard_normal((24, DIM)).astype(np.float32)

    def answers(index: NormIndex) -> list[list[tuple[str, float]]]:
        return [[(h.id, h.score) for h in index.search(q, 10)] for q in queries]

    def batch_answers(index: NormIndex) -> list[list[tuple[str, float]]]:
        return [[(h.id, h.score) for h in row] for row in index.search_batch(list(queries), 10)]

    index = NormIndex.load(saved)  # the advice is queued now and runs while the threads search
    got: dict[int, tuple[list, list]] = {}
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            during = answers(index)
            got[t] = (during, answers(plain))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    batch = batch_answers(index)
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(got) == 3
    for t, (during, expected) in got.items():
        bad = [(i, r, e) for i, (r, e) in enumerate(zip(during, expected)) if r != e]
        assert not bad, f"thread {t}: {len(bad)} of {len(during)} searches differ, first {bad[0]}"
    assert batch == batch_answers(plain)
    assert huge_pages.wait(60)
    assert answers(index) == answers(plain)


def test_a_setting_it_does_not_understand_is_refused_by_name():
    env = {**os.environ, huge_pages.ENV_VAR: "sometimes", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", "from normrank import NormIndex"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode != 0
    assert "ConfigError" in proc.stderr and "NORMRANK_HUGE_PAGES='sometimes'" in proc.stderr
    with pytest.raises(ConfigError):
        huge_pages.set_enabled("yes")  # type: ignore[arg-type]
    assert huge_pages.enabled() is sys.platform.startswith("linux")


def _child_adds_and_waits(queue: multiprocessing.Queue) -> None:
    raw, counts = _corpus(4_000, seed=3)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts)
    queue.put((huge_pages.wait(60), len(index)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_gets_its_own_worker():
    """The advice thread does not survive a fork, and its lock may have been held at the fork: the
    child starts its own and does not hang."""
    raw, counts = _corpus(4_000, seed=2)
    NormIndex(dim=DIM, weights=Weights(a=0.05)).add_vectors(raw, counts)  # the parent's worker exists now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_adds_and_waits, args=(queue,))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == (True, 4_000)
