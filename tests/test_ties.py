"""Exact ties (duplicate documents) come back in insertion order on every exact path.

FAISS's heaps keep the first-seen of equal scores but returned them in descending id: the top-3 of six
duplicates was ``dup02, dup01, dup00`` and the top-4 began with ``dup03``, so the first hit changed with k,
pages of results overlapped, and an unrelated delete changed the hits (the delete path fetches more). And
they keep the first-seen only until a better score arrives: duplicates inserted before a better document
lost the earliest of them at the cut.
"""

from __future__ import annotations

import numpy as np
import pytest

from normrank import NormIndex, Weights

DIM = 16


def _corpus() -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    rng = np.random.default_rng(0)
    base = rng.normal(size=DIM).astype(np.float32)
    others = rng.normal(size=(20, DIM)).astype(np.float32) * rng.uniform(0.5, 2, (20, 1)).astype(np.float32)
    vecs = np.vstack([np.tile(base * 1.3, (6, 1)), others]).astype(np.float32)
    ids = [f"dup{i}" for i in range(6)] + [f"o{i}" for i in range(20)]
    return vecs, np.full(26, 20), ids, base * 2


@pytest.mark.parametrize("weights", [Weights(a=0.05), Weights(a=0.05, mode="tiebreak"), Weights()])
def test_duplicates_come_back_in_insertion_order_on_every_path(weights):
    vecs, counts, ids, q = _corpus()
    index = NormIndex(dim=DIM, weights=weights)
    index.add_vectors(vecs, counts, ids=ids)
    for k in range(1, 7):
        want = [f"dup{i}" for i in range(k)]
        assert [h.id for h in index.search(q, k)] == want
        assert [h.id for h in index.search_batch([q], k)[0]] == want
        assert all([h.id for h in row] == want for row in index.search_batch([q] * 9, k))  # the sgemm path
        assert index.search_arrays(q[None], k).ids[0] == want
        assert index.search_arrays(np.tile(q, (9, 1)), k).ids[0] == want
        assert [h.id for h in index.search(q, k, filter=lambda m: True)] == want
    index.delete(["o3"])  # unrelated: the path past deleted documents fetches more, and kept other ties
    assert [h.id for h in index.search(q, 3)] == ["dup0", "dup1", "dup2"]
    index.delete(["dup1"])
    assert [h.id for h in index.search(q, 3)] == ["dup0", "dup2", "dup3"]
    assert [h.id for h in index.search_batch([q] * 9, 3)[4]] == ["dup0", "dup2", "dup3"]


def test_pgvector_breaks_ties_as_faiss_does(pg_dsn, pg_table_factory):
    from normrank.pgvector_store import PgVectorNormIndex

    vecs, counts, ids, q = _corpus()
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(vecs, counts, ids=ids)
    pg = PgVectorNormIndex(pg_dsn, pg_table_factory("ties"), weights=Weights(a=0.05))
    try:
        pg.add_vectors(vecs, counts, ids=ids)
        for k in (2, 4, 6):
            assert [h.id for h in pg.search(q, k)] == [h.id for h in index.search(q, k)]
    finally:
        pg.close()
    vecs, counts, ids, q = _better_after_duplicates()  # the duplicates before a better document
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(vecs, counts, ids=ids)
    pg = PgVectorNormIndex(pg_dsn, pg_table_factory("ties_later"), weights=Weights(a=0.05))
    try:
        pg.add_vectors(vecs, counts, ids=ids)
        for k in (1, 2, 3, 4):
            assert [h.id for h in pg.search(q, k)] == [h.id for h in index.search(q, k)] == \
                   ["best", "dup0", "dup1", "dup2"][:k]
    finally:
        pg.close()


def _better_after_duplicates() -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Duplicates first, then a document that beats them: FAISS's heap dropped the earliest duplicate when
    the better one arrived (``best, dup1`` at k=2, ``best, dup1, dup2`` at k=3)."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=DIM).astype(np.float32)
    vecs = np.vstack([np.tile(base * 1.3, (3, 1)), base * 1.5 + 0.01 * rng.normal(size=DIM),
                      rng.normal(size=(40, DIM))]).astype(np.float32)
    return vecs, np.full(44, 20), ["dup0", "dup1", "dup2", "best"] + [f"o{i}" for i in range(40)], vecs[3] * 2


@pytest.mark.parametrize("weights", [Weights(a=0.05), Weights(a=0.0), Weights(a=0.05, mode="tiebreak"),
                                     Weights(a=0.3, mode="multiplicative")])
def test_equal_scores_across_the_cut_keep_the_earliest_when_a_better_document_came_later(weights, tmp_path):
    vecs, counts, ids, q = _better_after_duplicates()
    index = NormIndex(dim=DIM, weights=weights)
    index.add_vectors(vecs, counts, ids=ids)
    full = [h.id for h in index.search(q, len(ids))]
    assert full[:4] == ["best", "dup0", "dup1", "dup2"]

    def every_path(ix: NormIndex) -> None:
        for k in range(1, 6):
            want = full[:k]  # the top-k is the start of the top-(k+1)
            assert [h.id for h in ix.search(q, k)] == want, k
            assert [h.id for h in ix.search_batch([q], k)[0]] == want
            assert all([h.id for h in row] == want for row in ix.search_batch([q] * 9, k))  # the sgemm path
            assert ix.search_arrays(q[None], k).ids[0] == want
            assert all(row == want for row in ix.search_arrays(np.tile(q, (9, 1)), k).ids)
            assert [h.id for h in ix.search(q, k, filter=lambda m: True)] == want

    every_path(index)
    every_path(NormIndex.load(index.save(tmp_path / "idx").parent))
    index.delete(["o7"])  # unrelated, pending in FAISS: the path past deleted documents
    every_path(index)
    mixed = np.vstack([q, vecs[10:18] * 2])  # rows without a tie beside the one with a tie
    for row, want in zip(index.search_batch(list(mixed), 2), [full[:2]] + [
            [h.id for h in index.search(v, 2)] for v in mixed[1:]]):
        assert [h.id for h in row] == want


def test_a_tie_group_wider_than_the_first_widening_is_still_cut_by_insertion_order():
    rng = np.random.default_rng(1)
    base = rng.normal(size=DIM).astype(np.float32)
    vecs = np.vstack([np.tile(base, (30, 1)), base * 1.2 + 0.01 * rng.normal(size=DIM),
                      rng.normal(size=(10, DIM))]).astype(np.float32)
    ids = [f"dup{i:02d}" for i in range(30)] + ["best"] + [f"o{i}" for i in range(10)]
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(vecs, np.full(len(ids), 20), ids=ids)
    for k in (2, 5, 17, 30, 31):
        want = ["best"] + [f"dup{i:02d}" for i in range(k - 1)]
        assert [h.id for h in index.search(base * 3, k)] == want
        assert [h.id for h in index.search_batch([base * 3] * 9, k)[8]] == want


def test_only_the_rows_with_a_tie_at_the_cut_are_searched_again_with_the_batch_kernel(monkeypatch):
    """A whole batch was searched again, ever wider, for one row with a tie at the cut (3 s instead of 22 ms for
    64 queries over 200k documents, 50k of them duplicates). Only the tied rows are, repeated to the batch
    size the batch's kernel needs, so their scores are still the batch kernel's to the last bit."""
    from normrank.batch_topk import SGEMM_MIN_BATCH

    vecs, counts, ids, q = _better_after_duplicates()
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(vecs, counts, ids=ids)
    rng = np.random.default_rng(5)
    batch = np.vstack([q, rng.normal(size=(63, DIM)).astype(np.float32)])  # row 0 ties at k=2 and 3
    full = index.search_arrays(batch, len(ids))
    rows_searched: list[int] = []
    real = NormIndex._search_kernel

    def spy(self, qaug, k):
        rows_searched.append(qaug.shape[0])
        return real(self, qaug, k)

    import normrank.store as store_module

    real_raw = store_module.raw_batch_topk

    def spy_raw(queries, *args):  # the first scan of a raw batch: one C call, where it was built
        found = real_raw(queries, *args)
        if found is not None:
            rows_searched.append(found[0].shape[0])
        return found

    monkeypatch.setattr(NormIndex, "_search_kernel", spy)
    monkeypatch.setattr(store_module, "raw_batch_topk", spy_raw)
    for k in (2, 3):
        rows_searched.clear()
        got = index.search_arrays(batch, k)
        assert rows_searched[0] == 64 and all(r == SGEMM_MIN_BATCH for r in rows_searched[1:]), rows_searched
        assert got.ids == [row[:k] for row in full.ids]
        assert np.array_equal(got.scores, full.scores[:, :k])  # the same kernel's scores, bit for bit
