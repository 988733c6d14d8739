"""A shared encoder under threads and asyncio gives the single-threaded answer (issue 10 item 3).

Before the fix, ``encode`` in one thread and ``token_counts`` in another raised
``ValueError`` ("Unable to create tensor, you should probably activate truncation and/or
padding") or returned wrong counts silently: a Hugging Face fast tokenizer re-applies its
truncation/padding settings to one shared Rust object on every call.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from normrank import RawEncoder
from normrank.pooling import PooledEncoder

# Varied lengths (some longer than the 256-token window) so padding and truncation both matter.
TEXTS = [
    " ".join(f"w{(i * 7 + j) % 97} retrieval" for j in range(3 + (i * 29) % 60)) for i in range(11)
] + ["retrieval " * 400, "hello world", "The Peace of Westphalia ended the Thirty Years' War.", "x"]


#: The slices the concurrent calls take; each one's single-threaded answer is the reference.
SLICES = (slice(0, len(TEXTS)), slice(0, 5), slice(4, 13), slice(11, len(TEXTS)))


@pytest.fixture(scope="module")
def reference(encoder):
    """Single-threaded (vectors, counts) of every slice, computed one call at a time."""
    out = {}
    for sl in SLICES:
        out[sl.start, sl.stop] = encoder.encode_with_counts(TEXTS[sl])
        assert np.array_equal(out[sl.start, sl.stop][1], encoder.token_counts(TEXTS[sl]))
    counts = out[0, len(TEXTS)][1]
    assert counts.max() == encoder.max_tokens and counts.min() < 10  # both regimes are exercised
    return out


def _call(encoder: RawEncoder, kind: int, sl: slice):
    texts = TEXTS[sl]
    if kind == 0:
        return "encode", sl, encoder.encode(texts)
    if kind == 1:
        return "counts", sl, encoder.token_counts(texts)
    return "both", sl, encoder.encode_with_counts(texts)


def _check(results, reference):
    assert results
    for kind, sl, out in results:
        ref_v, ref_c = reference[sl.start, sl.stop]
        if kind == "encode":
            np.testing.assert_allclose(out, ref_v, atol=1e-6, rtol=0)
        elif kind == "counts":
            assert np.array_equal(out, ref_c)
        else:
            np.testing.assert_allclose(out[0], ref_v, atol=1e-6, rtol=0)
            assert np.array_equal(out[1], ref_c)


def _jobs(n: int, seed: int = 0) -> list[tuple[int, slice]]:
    rng = np.random.default_rng(seed)
    return [(i % 3, SLICES[int(rng.integers(len(SLICES)))]) for i in range(n)]


def test_threads_mixing_encode_and_token_counts_match_single_threaded(encoder, reference):
    # token_counts calls are cheap, so several run during every encode: the old race.
    jobs = _jobs(12) + [(1, SLICES[0])] * 60
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda job: _call(encoder, *job), jobs))
    _check(results, reference)


def test_asyncio_gather_over_run_in_executor_matches_single_threaded(encoder, reference):
    async def main():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=6) as pool:
            return await asyncio.gather(*(loop.run_in_executor(pool, _call, encoder, kind, sl)
                                          for kind, sl in _jobs(9, seed=1)))

    _check(asyncio.run(main()), reference)


def test_lazy_load_and_fingerprint_race_on_a_fresh_encoder(encoder, reference):
    """Threads that all hit a not-yet-loaded encoder at once load it once and agree."""
    fresh = RawEncoder(show_progress=False)
    barrier = threading.Barrier(6)
    out: list = [None] * 6
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            if i % 3 == 0:
                out[i] = ("fp", fresh.fingerprint)
            elif i % 3 == 1:
                out[i] = ("counts", fresh.token_counts(TEXTS))
            else:
                out[i] = ("model", fresh.model)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert {v for k, v in out if k == "fp"} == {encoder.fingerprint}
    assert len({id(v) for k, v in out if k == "model"}) == 1
    full_v, full_c = reference[0, len(TEXTS)]
    for k, v in out:
        if k == "counts":
            assert np.array_equal(v, full_c)
    np.testing.assert_allclose(fresh.encode(TEXTS), full_v, atol=1e-6, rtol=0)


def test_pooled_encoder_is_thread_safe_too(encoder, reference):
    pooled = PooledEncoder(pooling="norm", show_progress=False)
    single = {(sl.start, sl.stop): pooled.encode(TEXTS[sl]) for sl in SLICES}

    def call(job):
        kind, sl = job
        return kind, sl, (pooled.token_counts(TEXTS[sl]) if kind == 1 else pooled.encode(TEXTS[sl]))

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(call, _jobs(9, seed=2) + [(1, SLICES[0])] * 30))
    for kind, sl, out in results:
        if kind == 1:
            assert np.array_equal(out, reference[sl.start, sl.stop][1])
        else:
            np.testing.assert_allclose(out, single[sl.start, sl.stop], atol=1e-6, rtol=0)
