"""Exact ties (duplicate documents) come back in insertion order on every exact path.

FAISS's heaps keep the first-seen of equal scores but returned them in descending id: the top-3 of six
duplicates was ``dup02, dup01, dup00`` and the top-4 began with ``dup03``, so the first hit changed with k,
pages of results overlapped, and an unrelated delete changed the hits (the delete path fetches more).
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
