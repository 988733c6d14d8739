"""``NormIndex.search_arrays``: the hits of ``search_batch`` as arrays, on the real FAISS indexes.

Every case compares against ``search_batch`` on the same index, so the arrays can only pass by
holding the same ids, in the same order, with the same score and cosine values.
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from normrank import (
    EmptyCorpusError,
    HitArrays,
    InvalidArgumentError,
    NormIndex,
    Weights,
)
from normrank.testing import demo_ids, demo_index, demo_queries  # noqa: F401  (module fixtures)
from tests.conftest import synthetic

DIM = 32


def same(arrays: HitArrays, rows: list) -> None:
    assert isinstance(arrays, HitArrays)
    assert arrays.ids == [[h.id for h in row] for row in rows]
    k = arrays.scores.shape[1]
    assert arrays.scores.dtype == np.float32 and arrays.cosines.dtype == np.float64
    assert arrays.scores.shape == arrays.cosines.shape == (len(rows), k)
    for i, row in enumerate(rows):
        n = len(row)
        assert arrays.scores[i, :n].tolist() == [h.score for h in row]
        assert arrays.cosines[i, :n].tolist() == [h.cosine for h in row]
        assert np.all(np.isneginf(arrays.scores[i, n:])) and np.all(np.isnan(arrays.cosines[i, n:]))


def build(index_type: str = "flat", weights: Weights | None = None, n: int = 400) -> tuple[NormIndex, list, list]:
    vecs, counts = synthetic(n, dim=DIM, seed=3)
    index = NormIndex(dim=DIM, weights=weights or Weights(a=0.05), index_type=index_type, nlist=4)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(n)],
                      metadatas=[{"half": i % 2} for i in range(n)])
    qv, qc = synthetic(12, dim=DIM, seed=11)
    index.calibrate_queries(norms=np.linalg.norm(qv, axis=1), token_counts=qc)
    return index, list(qv), qc.tolist()


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
@pytest.mark.parametrize("weights", [Weights(a=0.05), Weights(a=0.03, b=0.02), Weights(a=0.1, mode="tiebreak"),
                                     Weights(a=0.2, mode="multiplicative"), Weights()])
def test_arrays_hold_the_hits_of_search_batch(index_type, weights):
    index, qv, qc = build(index_type, weights)
    for k in (1, 10):
        same(index.search_arrays(qv, k, query_token_counts=qc), index.search_batch(qv, k, query_token_counts=qc))


def test_batches_big_enough_for_the_sgemm_path_and_single_queries_agree():
    index, _, _ = build()
    qv, qc = synthetic(40, dim=DIM, seed=5)  # >= SGEMM_MIN_BATCH: scored by the sgemm kernel
    same(index.search_arrays(list(qv), 7, query_token_counts=qc.tolist()),
         index.search_batch(list(qv), 7, query_token_counts=qc.tolist()))
    one = index.search_arrays([qv[0]], 7, query_token_counts=[int(qc[0])])
    assert one.ids[0] == [h.id for h in index.search(qv[0], 7, query_token_count=int(qc[0]))]


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_filters_deletes_and_short_rows(index_type):
    index, qv, qc = build(index_type)
    index.delete([f"d{i}" for i in range(0, 400, 3)])  # tombstones, still inside FAISS
    for flt in ({"half": 1}, lambda m: m.get("half") == 0):
        same(index.search_arrays(qv, 10, filter=flt, query_token_counts=qc),
             index.search_batch(qv, 10, filter=flt, query_token_counts=qc))
    nothing = index.search_arrays(qv, 10, filter=lambda m: False, query_token_counts=qc)
    assert nothing.ids == [[] for _ in qv] and np.all(np.isneginf(nothing.scores)) and nothing.scores.shape == (len(qv), 10)
    # a filter matching fewer than k documents: rows of the documents there are
    keep = {"d1", "d5", "d7"}
    index.delete([f"d{i}" for i in range(1, 400, 2) if i % 3 and f"d{i}" not in keep])
    short = index.search_arrays(qv, 10, filter={"half": 1}, query_token_counts=qc)
    same(short, index.search_batch(qv, 10, filter={"half": 1}, query_token_counts=qc))
    assert all(set(r) == keep for r in short.ids) and short.scores.shape == short.cosines.shape == (len(qv), 10)


def test_text_queries_with_the_real_model(index, queries):
    """The demo index (real all-MiniLM-L6-v2, query-conditioned weight): texts in, the same hits out."""
    same(index.search_arrays(queries, 5), index.search_batch(queries, 5))
    mixed = [queries[0], index.encoder.encode([queries[1]])[0]]
    same(index.search_arrays(mixed, 5, query_token_counts=[None, 6]),
         index.search_batch(mixed, 5, query_token_counts=[None, 6]))


def test_same_errors_as_search_batch():
    index, qv, qc = build(n=50)
    with pytest.raises(InvalidArgumentError, match="search_arrays takes a list of queries"):
        index.search_arrays("one query")
    with pytest.raises(InvalidArgumentError, match="k of 51 is larger than the number of documents"):
        index.search_arrays(qv, 51, query_token_counts=qc)
    with pytest.raises(EmptyCorpusError):
        NormIndex(dim=DIM).search_arrays([qv[0]], 1)
    empty = index.search_arrays([], 3)
    assert empty.ids == [] and empty.scores.shape == (0, 0)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
@pytest.mark.parametrize("weights", [Weights(a=0.05), Weights(a=0.03, b=0.02), Weights(a=0.1, mode="tiebreak"),
                                     Weights(a=0.2, mode="multiplicative"), Weights()])
def test_one_query_in_any_form_gives_the_row_a_batch_gives(index_type, weights):
    """A batch of one raw vector takes the single-vector path (flat and HNSW, additive blends); in every
    form (one-row matrix of either float width, list, tuple, with or without its token count) it holds
    the ids and the exact score and cosine values of the same query's row in a batch."""
    index, qv, qc = build(index_type, weights)
    for i in range(4):
        q = qv[i]
        want = index.search_batch([q, qv[i + 1]], 10, query_token_counts=[qc[i], qc[i + 1]])[:1]
        for form in (q[None, :], q[None, :].astype(np.float64), [q], (q,), [q.astype(np.float64)]):
            same(index.search_arrays(form, 10, query_token_counts=[qc[i]]), want)
        if weights.b == 0:  # without a count only where the weight does not need one
            same(index.search_arrays([q], 10), want)


def test_one_query_after_a_compaction_and_on_a_thin_hnsw_graph(tmp_path, monkeypatch):
    """Positions that are not internal ids (an index saved with gaps, as normrank did before compactions
    renumbered), and an HNSW walk that finds fewer than k: that row is scored exactly over the live
    documents, so every path gives k hits alike."""
    index, qv, _ = build()
    index.delete([f"d{i}" for i in range(0, 400, 3)])
    with monkeypatch.context() as m:
        m.setattr(NormIndex, "_renumber_flat", lambda self: None)  # the old compaction
        index.save(tmp_path / "gaps")
    index = NormIndex.load(tmp_path / "gaps")
    index.search(qv[0], 1)
    assert not index._positions_are_ids
    for q in qv[:4]:
        same(index.search_arrays([q], 10), index.search_batch([q], 10))
    index.delete(["d1"])
    index._compact()  # and a compaction renumbers it
    assert index._docs.next == len(index) and index.search(qv[0], 1) and index._positions_are_ids
    vecs, counts = synthetic(30, dim=DIM, seed=3)
    thin = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type="hnsw", hnsw_m=4, ef_search=1)
    thin.add_vectors(vecs, counts, ids=[f"t{i}" for i in range(30)])
    inner = faiss.downcast_index(thin._index.index)
    short = 0
    for q in qv:
        qaug = thin._augment((q / np.linalg.norm(q))[None, :], np.full(1, 0.05), query=True)
        short += int((inner.search(qaug, 30)[1] < 0).any())  # the walk alone comes back short
        rows = thin.search_batch([q], 30)
        assert len(rows[0]) == 30 and len(thin.search(q, 30)) == 30
        same(thin.search_arrays(q[None, :], 30), rows)
    assert short  # the case is reached
