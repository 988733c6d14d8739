"""Thread safety: searches running while another thread adds and deletes.

The contract (``normrank.store`` module docstring): calls behave as if they ran one at
a time in some order. So every result a reader gets must be *exactly* the brute-force
blended top-k of one of the states the writer's sequence passes through (no torn mix of
two states), the states one reader sees never go backwards, and the final index equals
the same operations run sequentially.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from normrank import NormIndex, Weights
from normrank.testing import wait_until
from tests.conftest import synthetic

DIM, K = 16, 8
WEIGHTS = Weights(a=0.05, b=0.03)


def operations() -> list[tuple]:
    """50 initial docs, then adds of 10 and deletes of 3, crossing an automatic recalibration (at 100 docs)."""
    vecs, counts = synthetic(260, dim=DIM, seed=7)
    ops, nxt, live = [], 50, [f"d{i}" for i in range(50)]
    rng = np.random.default_rng(3)
    for step in range(24):
        if step % 3 == 2:
            gone = [live[i] for i in sorted(rng.choice(len(live), 3, replace=False))]
            live = [x for x in live if x not in gone]
            ops.append(("delete", gone))
        else:
            ids = [f"d{i}" for i in range(nxt, nxt + 10)]
            ops.append(("add", ids, vecs[nxt:nxt + 10], counts[nxt:nxt + 10]))
            live += ids
            nxt += 10
    return ops


def initial() -> NormIndex:
    vecs, counts = synthetic(260, dim=DIM, seed=7)
    index = NormIndex(dim=DIM, weights=WEIGHTS)
    index.add_vectors(vecs[:50], counts[:50], ids=[f"d{i}" for i in range(50)])
    qv, qc = synthetic(60, dim=DIM, seed=8)
    index.calibrate_queries(norms=np.linalg.norm(qv.astype(np.float64), axis=1), token_counts=qc)
    return index


def apply(index: NormIndex, op: tuple) -> None:
    if op[0] == "add":
        index.add_vectors(op[2], op[3], ids=op[1])
    else:
        index.delete(op[1])


def brute_force(index: NormIndex, raw: dict[str, np.ndarray], qvecs: np.ndarray, qcounts: np.ndarray
                ) -> list[list[tuple[str, float]]]:
    """The blended top-K of the index's current state, from its public data and numpy only."""
    ids = index.ids()
    recs = index.get(ids)
    d = np.stack([raw[i] for i in ids]).astype(np.float64)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    w = index.weights
    g = w.shape(index.calibrator.transform(np.array([r.norm for r in recs]),
                                           np.array([r.token_count for r in recs]), w.feature))
    qn = np.linalg.norm(qvecs.astype(np.float64), axis=1)
    wq = w.query_weight(index.query_calibrator.transform(qn, qcounts, w.feature))
    scores = (qvecs / qn[:, None]) @ d.T + wq[:, None] * g[None, :]
    out = []
    for row in scores:
        top = np.argsort(-row, kind="stable")[:K]
        out.append([(ids[j], float(row[j])) for j in top])
    return out


def matches(result: list, expected: list[tuple[str, float]]) -> bool:
    return [h.id for h in result] == [e[0] for e in expected] and all(
        abs(h.score - e[1]) <= 1e-5 for h, e in zip(result, expected))


def test_searches_during_adds_and_deletes_see_whole_states():
    ops = operations()
    vecs, _ = synthetic(260, dim=DIM, seed=7)
    raw = {f"d{i}": vecs[i] for i in range(260)}
    qvecs, qcounts = synthetic(4, dim=DIM, seed=21)

    # the states the writer passes through, and their brute-force answers
    replica = initial()
    expected = [brute_force(replica, raw, qvecs, qcounts)]
    for op in ops:
        apply(replica, op)
        expected.append(brute_force(replica, raw, qvecs, qcounts))
    assert len({tuple(tuple(x[0] for x in row) for row in e) for e in expected}) > 5, "states too alike to test"

    index = initial()
    results: dict[int, list] = {r: [] for r in range(3)}
    errors: list[BaseException] = []
    writing = threading.Event()
    writing.set()
    start = threading.Barrier(4)

    def reader(r: int) -> None:
        try:
            start.wait()
            while writing.is_set() or len(results[r]) < 20:
                results[r].append(index.search_batch(list(qvecs), K, query_token_counts=qcounts.tolist()))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    def writer() -> None:
        try:
            start.wait()
            for op in ops:
                apply(index, op)
                # a reader finishes a search before the next operation (a plain sleep can be too short)
                done = sum(len(b) for b in results.values())
                wait_until(lambda: sum(len(b) for b in results.values()) > done, 10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            writing.clear()

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(3)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert errors == []

    seen_states: set[int] = set()
    for r, batches in results.items():
        state = 0  # states a single reader sees can only move forward
        for n, batch in enumerate(batches):
            fits = [s for s in range(state, len(expected))
                    if all(matches(res, exp) for res, exp in zip(batch, expected[s]))]
            assert fits, f"reader {r}, search {n}: result matches no state at or after state {state} (torn read)"
            state = fits[0]
            seen_states.add(state)
    assert len(seen_states) >= 3, f"readers saw only states {sorted(seen_states)}: no real interleaving"

    # final state equals the sequential run
    assert index.ids() == replica.ids()
    assert index.get(index.ids()) == replica.get(replica.ids())
    assert index.calibrator == replica.calibrator
    assert all(matches(res, exp) for res, exp in
               zip(index.search_batch(list(qvecs), K, query_token_counts=qcounts.tolist()), expected[-1]))


def test_concurrent_writers_end_in_a_state_a_sequential_order_gives():
    """Two writers on disjoint ids plus readers: no crash, no lost or duplicated document."""
    vecs, counts = synthetic(260, dim=DIM, seed=9)
    index = NormIndex(dim=DIM, weights=WEIGHTS)
    index.add_vectors(vecs[:60], counts[:60], ids=[f"d{i}" for i in range(60)])
    errors: list[BaseException] = []

    def adder(lo: int, hi: int) -> None:
        try:
            for s in range(lo, hi, 10):
                index.add_vectors(vecs[s:s + 10], counts[s:s + 10], ids=[f"d{i}" for i in range(s, s + 10)])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def deleter() -> None:
        try:
            for i in range(0, 60, 4):
                index.delete([f"d{i}"])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(30):
                hits = index.search(vecs[0], 5, query_token_count=10)
                assert len(hits) == 5 and len({h.id for h in hits}) == 5
                assert all(hits[j].score >= hits[j + 1].score - 1e-6 for j in range(4))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    index.calibrate_queries(norms=np.linalg.norm(vecs[:60].astype(np.float64), axis=1), token_counts=counts[:60])
    threads = [threading.Thread(target=adder, args=(60, 160)), threading.Thread(target=adder, args=(160, 260)),
               threading.Thread(target=deleter), threading.Thread(target=reader), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    want = sorted(f"d{i}" for i in range(260) if not (i < 60 and i % 4 == 0))
    assert sorted(index.ids()) == want and len(index) == len(want)
    # the stored vectors are intact: the index answers like one built sequentially with the same documents
    seq = NormIndex(dim=DIM, weights=WEIGHTS, calibrator=index.calibrator, query_calibrator=index.query_calibrator)
    order = index.ids()
    pos = {f"d{i}": i for i in range(260)}
    seq.add_vectors(vecs[[pos[x] for x in order]], counts[[pos[x] for x in order]], ids=order)
    q, qc = synthetic(3, dim=DIM, seed=5)
    got = index.search_batch(list(q), K, query_token_counts=qc.tolist())
    ref = seq.search_batch(list(q), K, query_token_counts=qc.tolist())
    assert [[h.id for h in r] for r in got] == [[h.id for h in r] for r in ref]
    assert np.allclose([[h.score for h in r] for r in got], [[h.score for h in r] for r in ref], atol=1e-5)


def test_text_searches_while_adding_texts(encoder, demo_texts, demo_encoded):
    """The real encoder and FAISS: text queries (encoded outside the lock) during text adds."""
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs[:30], counts[:30], ids=[f"doc{i}" for i in range(30)], texts=demo_texts[:30])
    replica = NormIndex(encoder)
    replica.add_vectors(vecs[:30], counts[:30], ids=[f"doc{i}" for i in range(30)], texts=demo_texts[:30])
    query = "How do vaccines train the immune system?"
    batches = [(demo_texts[i:i + 6], [f"doc{j}" for j in range(i, i + 6)]) for i in range(30, 48, 6)]
    states = [replica.search(query, 5)]
    for texts, ids in batches:
        replica.add_vectors(*encoder.encode_with_counts(texts), ids=ids, texts=texts)
        states.append(replica.search(query, 5))
    got: list = []
    errors: list[BaseException] = []

    def searcher() -> None:
        try:
            for _ in range(4):
                got.append(index.search(query, 5))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def adder() -> None:
        try:
            for texts, ids in batches:
                index.add_texts(texts, ids=ids)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(2)] + [threading.Thread(target=adder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert len(got) == 8

    def same(a, b) -> bool:
        return [h.id for h in a] == [h.id for h in b] and np.allclose([h.score for h in a], [h.score for h in b],
                                                                       atol=1e-5)

    assert all(any(same(r, s) for s in states) for r in got), "a text search matched no state"
    assert index.ids() == replica.ids()
    assert same(index.search(query, 10), replica.search(query, 10))


@pytest.mark.parametrize("index_type", ["hnsw", "ivf"])
def test_approximate_indexes_survive_concurrent_use(index_type):
    vecs, counts = synthetic(600, dim=DIM, seed=4)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type)
    index.add_vectors(vecs[:400], counts[:400], ids=[f"d{i}" for i in range(400)])
    deleted = {f"d{i}" for i in range(0, 400, 5)}
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for s in range(400, 600, 20):
                index.add_vectors(vecs[s:s + 20], counts[s:s + 20], ids=[f"d{i}" for i in range(s, s + 20)])
            index.delete(sorted(deleted))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def reader() -> None:
        try:
            for j in range(40):
                hits = index.search(vecs[j], 10)
                assert len({h.id for h in hits}) == len(hits) == 10
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert len(index) == 600 - len(deleted)
    for j in range(0, 600, 37):
        assert not deleted & {h.id for h in index.search(vecs[j], 10)}


def test_a_loaded_index_builds_its_id_table_once_under_threads(tmp_path):
    """A load leaves the id -> internal id table to the first id lookup. Threads that race to make that
    first lookup (``in``, ``get``, ``vectors``, an add, a delete) while others search, with hits and
    with arrays, all get the answers a single thread gets, and the table ends up complete and exact."""
    vecs, counts = synthetic(300, dim=DIM, seed=21)
    index = NormIndex(dim=DIM, weights=WEIGHTS)
    index.add_vectors(vecs[:250], counts[:250], ids=[f"d{i}" for i in range(250)])
    qv, qc = synthetic(40, dim=DIM, seed=22)
    index.calibrate_queries(norms=np.linalg.norm(qv.astype(np.float64), axis=1), token_counts=qc)
    index.save(tmp_path / "idx")
    reference = NormIndex.load(tmp_path / "idx")
    want_hits = reference.search_batch(list(qv), K, query_token_counts=qc.tolist())
    want_get = reference.get([f"d{i}" for i in range(0, 250, 7)])
    want_vecs = reference.vectors([f"d{i}" for i in range(0, 250, 11)])

    for _ in range(5):
        loaded = NormIndex.load(tmp_path / "idx")
        errors: list[BaseException] = []
        barrier = threading.Barrier(6)

        def run(role: int) -> None:
            try:
                barrier.wait()
                if role == 0:
                    assert all(f"d{i}" in loaded for i in range(250)) and "d250" not in loaded
                elif role == 1:
                    assert loaded.get([f"d{i}" for i in range(0, 250, 7)]) == want_get
                elif role == 2:
                    np.testing.assert_array_equal(loaded.vectors([f"d{i}" for i in range(0, 250, 11)]), want_vecs)
                elif role == 3:
                    got = loaded.search_arrays(list(qv), K, query_token_counts=qc.tolist())
                    assert got.ids == [[h.id for h in row] for row in want_hits]
                    assert got.scores.tolist() == [[h.score for h in row] for row in want_hits]
                elif role == 4:
                    assert loaded.search_batch(list(qv), K, query_token_counts=qc.tolist()) == want_hits
                else:
                    with pytest.raises(Exception, match="already in the index"):
                        loaded.add_vectors(vecs[:1], counts[:1], ids=["d3"])
            except BaseException as exc:  # noqa: BLE001  (reported below, in the test's thread)
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(r,)) for r in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(loaded) == 250 and loaded.ids() == [f"d{i}" for i in range(250)]
        loaded.add_vectors(vecs[250:], counts[250:], ids=[f"d{i}" for i in range(250, 300)])
        assert loaded.delete(["d0", "d299"]) == 2 and "d0" not in loaded and "d298" in loaded and len(loaded) == 298


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_single_vector_searches_from_many_threads_get_their_own_answers(index_type: str) -> None:
    """The lean single-vector path reuses one query buffer per index between calls. Threads searching
    different queries at once must each get the hits a single thread gets for their own query."""
    vecs, counts = synthetic(600, dim=DIM, seed=31)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(600)])
    queries, _ = synthetic(120, dim=DIM, seed=32)
    want = [index.search(q, K) for q in queries]
    errors: list[BaseException] = []

    def reader(offset: int) -> None:
        try:
            for _ in range(3):
                for j in range(offset, len(queries), 4):
                    assert index.search(queries[j], K) == want[j]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
