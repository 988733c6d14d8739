"""The fast search paths give the brute-force blend exactly (issue 14): the lean single-vector path,
the batched sgemm kernel and FAISS's own kernel, with deletes and filters. Equality, not speed
(speed lives in benchmarks/speed.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from normrank import (
    DimensionMismatchError,
    InvalidArgumentError,
    InvalidVectorError,
    batch_topk,
)
from normrank import store as store_mod
from normrank.scoring import Hit, Weights
from normrank.store import NormIndex

DIM = 48


def _corpus(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((16, DIM))
    x = centers[rng.integers(0, 16, n)] + 0.8 * rng.standard_normal((n, DIM))
    counts = rng.integers(5, 200, n)
    norms = np.exp(rng.normal(0, 0.15, n) - 0.2 * np.log(counts)) * 5
    return (x / np.linalg.norm(x, axis=1, keepdims=True) * norms[:, None]).astype(np.float32), counts


def _brute(index: NormIndex, raw: np.ndarray, counts: np.ndarray, ids: list[str], q: np.ndarray, k: int,
           keep: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
    """The blend computed from scratch in float64 over every (kept) document."""
    w = index.weights
    norms = np.linalg.norm(raw.astype(np.float64), axis=1)
    g = w.shape(index.calibrator.transform(norms, counts, w.feature))
    cos = (raw.astype(np.float64) / norms[:, None]) @ (q.astype(np.float64) / np.linalg.norm(q.astype(np.float64)))
    if w.mode == "tiebreak":
        from normrank.scoring import percentile

        s = cos + w.epsilon * np.sign(w.a) * (percentile(g) - 0.5)
    else:
        s = cos + w.a * g
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    order = np.argsort(-s, kind="stable")[:k]
    return [ids[i] for i in order], s[order]


def _check(hits: list[Hit], want_ids: list[str], want_scores: np.ndarray) -> None:
    assert [h.id for h in hits] == want_ids
    np.testing.assert_allclose([h.score for h in hits], want_scores, atol=1e-5)
    for h in hits:  # the explanation adds up to the score it explains
        assert h.score == pytest.approx(h.cosine + h.weight * h.norm_feature, abs=1e-5)


@pytest.fixture(scope="module")
def built() -> tuple[NormIndex, np.ndarray, np.ndarray, list[str], np.ndarray]:
    raw, counts = _corpus(3000)
    ids = [f"d{i}" for i in range(len(raw))]
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts, ids=ids, metadatas=[{"part": i % 3} for i in range(len(raw))])
    queries, _ = _corpus(70, seed=1)
    return index, raw, counts, ids, queries


def test_padding_default_is_measured_width(built) -> None:
    index = built[0]
    assert index.pad_to == 1 and index.augmented_dim == 49  # 48 + the norm column: the fewest bytes to scan


@pytest.mark.parametrize(("index_type", "pad", "width"), [("flat", 1, 49), ("ivf", 1, 49), ("hnsw", 1, 49)])
def test_padding_default_depends_on_the_index_type_and_survives_a_save(tmp_path, index_type, pad, width) -> None:
    """A scan's time follows the bytes it reads and an HNSW walk the cache lines each vector spans: no
    padding by default for any type; a given one is kept, and saved."""
    raw, counts = _corpus(600)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type)
    index.add_vectors(raw, counts, ids=[str(i) for i in range(600)])
    assert index.pad_to == pad and index.augmented_dim == width
    assert faiss_width(index) == width
    index.save(tmp_path / index_type)
    loaded = NormIndex.load(tmp_path / index_type)
    assert loaded.pad_to == pad and faiss_width(loaded) == width
    assert loaded.search(raw[0], 5) == index.search(raw[0], 5)
    chosen = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type, pad_to=16)
    assert chosen.pad_to == 16 and chosen.augmented_dim == 64


def test_padding_from_yaml_null_is_the_index_types_default(tmp_path) -> None:
    from normrank.config import build_index

    for index_type, pad_line, width in (("flat", "pad_to: null", 49), ("flat", "pad_to: 8", 56), ("hnsw", "pad_to: null", 49),
                                        ("hnsw", "ef_search: 64", 49), ("hnsw", "pad_to: 8", 56)):
        cfg = tmp_path / "normrank.yaml"
        cfg.write_text(f"store:\n  index_type: {index_type}\n  {pad_line}\n")
        index = build_index(cfg)
        index.add_vectors(*_corpus(300), ids=[str(i) for i in range(300)])
        assert index.augmented_dim == width


def faiss_width(index: NormIndex) -> int:
    import faiss

    return faiss.downcast_index(index._index).d


@pytest.mark.parametrize("mode", ["additive", "tiebreak"])
def test_single_vector_path_equals_brute_force(built, mode: str) -> None:
    index, raw, counts, ids, queries = built
    old = index.weights
    index.set_weights(Weights(a=0.05, mode=mode, epsilon=0.02))
    try:
        for q in queries[:20]:
            want_ids, want_s = _brute(index, raw, counts, ids, q, 10)
            hits = index.search(q, 10)
            assert [h.id for h in hits] == want_ids
            np.testing.assert_allclose([h.score for h in hits], want_s, atol=1e-5)
            # the lean path and the general one (a list of one query) give equal hits
            assert index.search_batch([q], 10) == [hits]
    finally:
        index.set_weights(old)


@pytest.mark.parametrize("batch", [1, 7, 8, 64])
def test_batches_equal_brute_force_on_either_kernel(built, batch: int) -> None:
    index, raw, counts, ids, queries = built
    results = index.search_batch(list(queries[:batch]), 10)
    for q, hits in zip(queries[:batch], results):
        _check(hits, *_brute(index, raw, counts, ids, q, 10))
    # the sgemm kernel (batch >= SGEMM_MIN_BATCH) and FAISS's give the same lists
    singles = [index.search(q, 10) for q in queries[:batch]]
    for a, b in zip(results, singles):
        assert [h.id for h in a] == [h.id for h in b]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)


def test_k_as_large_as_the_corpus_on_the_sgemm_kernel() -> None:
    raw, counts = _corpus(40)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    ids = [str(i) for i in range(40)]
    index.add_vectors(raw, counts, ids=ids)
    queries, _ = _corpus(9, seed=3)
    for q, hits in zip(queries, index.search_batch(list(queries), 40)):
        _check(hits, *_brute(index, raw, counts, ids, q, 40))


def test_deleted_ids_never_returned_on_any_path(built) -> None:
    _, raw, counts, ids, queries = built
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts, ids=ids)
    # delete exactly the current top hits of some queries (tombstoned, below the compaction limit)
    gone = sorted({h.id for q in queries[:5] for h in index.search(q, 10)})
    assert index.delete(gone) == len(gone) and index._tombstones
    keep = np.array([i not in set(gone) for i in ids])
    for q in queries[:5]:
        hits = index.search(q, 10)
        assert not {h.id for h in hits} & set(gone)
        _check(hits, *_brute(index, raw, counts, ids, q, 10, keep))
    for q, hits in zip(queries[:16], index.search_batch(list(queries[:16]), 10)):
        assert not {h.id for h in hits} & set(gone)
        _check(hits, *_brute(index, raw, counts, ids, q, 10, keep))


def test_filters_equal_brute_force_over_the_allowed_documents(built) -> None:
    index, raw, counts, ids, queries = built
    keep = np.array([i % 3 == 1 for i in range(len(ids))])
    for q in queries[:6]:
        _check(index.search(q, 10, filter={"part": 1}), *_brute(index, raw, counts, ids, q, 10, keep))
    for q, hits in zip(queries[:12], index.search_batch(list(queries[:12]), 10, filter=lambda m: m["part"] == 1)):
        _check(hits, *_brute(index, raw, counts, ids, q, 10, keep))


def test_hits_are_frozen_value_objects_with_private_metadata() -> None:
    raw, counts = _corpus(50)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    metas = [{"tags": ["a", "b"], "n": i} if i % 2 else {"n": i} for i in range(50)]
    index.add_vectors(raw, counts, ids=[str(i) for i in range(50)], texts=[f"t{i}" for i in range(50)],
                      metadatas=metas)
    hits = index.search(raw[3], 5)
    h = hits[0]
    same = Hit(h.id, h.score, h.cosine, h.norm, h.norm_feature, h.weight, h.token_count, h.text, dict(h.metadata))
    assert h == same and dataclasses.asdict(h) == dataclasses.asdict(same) and type(h.score) is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.score = 1.0  # type: ignore[misc]
    for hit in hits:  # changing what a search returned changes nothing stored, flat or nested
        hit.metadata["n"] = -1
        hit.metadata.setdefault("tags", []).append("x")
    again = index.search(raw[3], 5)
    assert [x.metadata for x in again] == [metas[int(x.id)] for x in again]


def test_stored_feature_survives_recalibration_save_and_load(tmp_path, built) -> None:
    _, raw, counts, ids, queries = built
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw[:100], counts[:100], ids=ids[:100])
    index.add_vectors(raw[100:500], counts[100:500], ids=ids[100:500])  # crosses a refit of the calibration
    index.set_weights(Weights(a=0.05, clip=1.0))  # rebuilds the column
    for q in queries[:5]:
        _check(index.search(q, 10), *_brute(index, raw[:500], counts[:500], ids[:500], q, 10))
    index.save(tmp_path / "ix")
    loaded = NormIndex.load(tmp_path / "ix")
    for q in queries[:5]:
        assert loaded.search(q, 10) == index.search(q, 10)  # the feature is rebuilt on load, equal
        assert [h.id for h in loaded.search_batch([q] * 9, 10)[0]] == [h.id for h in index.search(q, 10)]


def test_unpadded_index_still_answers_the_same(built) -> None:
    index, raw, counts, ids, queries = built
    plain = NormIndex(dim=DIM, weights=Weights(a=0.05), pad_to=1)
    plain.add_vectors(raw, counts, ids=ids)
    assert plain.augmented_dim == DIM + 1
    for q in queries[:5]:
        assert [h.id for h in plain.search(q, 10)] == [h.id for h in index.search(q, 10)]


def test_single_searches_reuse_small_result_rows_and_never_keep_large_ones(built) -> None:
    """Result rows are reused between single searches for the usual k; a huge k gets rows of its own
    (not kept: 12 bytes per result), and every k answers the brute-force blend. A flat index's rows hold
    one more than ``k``: the next score shows equal scores across the cut (``_cut_between_ties``)."""
    index, raw, counts, ids, queries = built
    assert index.index_type == "flat"
    for k, kept in ((10, 11), (3, 4), (store_mod._KEPT_K_MAX + 1, 4), (10, 11)):
        for q in queries[:3]:
            _check(index.search(q, k), *_brute(index, raw, counts, ids, q, k))
        assert index._query_buf[1] == index._query_buf[3][4].shape[1] == kept


@pytest.mark.parametrize("saved_with_gaps", [False, True])
def test_batches_after_a_compaction_map_positions_to_ids(saved_with_gaps, tmp_path, monkeypatch) -> None:
    """FAISS's positions are the internal ids, so searches skip the mapping; a compaction renumbers the live
    documents 0..n-1 (it used to leave gaps: a slot per document ever added). An index saved with gaps (by a
    normrank before that) maps positions to ids. Every path (single, small batch, sgemm batch, arrays)
    returns the right ids either way."""
    raw, counts = _corpus(1200, seed=8)
    ids = [f"c{i}" for i in range(1200)]
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts, ids=ids)
    queries, _ = _corpus(12, seed=9)
    index.search(queries[0], 5)
    assert index._positions_are_ids
    gone = [f"c{i}" for i in range(0, 1200, 3)]
    if saved_with_gaps:
        with monkeypatch.context() as m:
            m.setattr(NormIndex, "_renumber_flat", lambda self: None)  # what compactions did before
            index.delete(gone)  # past the threshold: compacts
            index.save(tmp_path / "gaps")
        index = NormIndex.load(tmp_path / "gaps")
    else:
        index.delete(gone)
        index._compact()  # deletes past the threshold compact on their own; here at once
    keep = np.array([i % 3 != 0 for i in range(1200)])
    singles = [index.search(q, 10) for q in queries]
    assert index._positions_are_ids is not saved_with_gaps and index._docs.next == (1200 if saved_with_gaps else 800)
    small = index.search_batch(list(queries[:4]), 10)
    big = index.search_batch(list(queries), 10)
    arrays = index.search_arrays(list(queries), 10)
    for i, q in enumerate(queries):
        want_ids, want_s = _brute(index, raw, counts, ids, q, 10, keep)
        _check(singles[i], want_ids, want_s)
        _check(big[i], want_ids, want_s)
        assert arrays.ids[i] == want_ids
        if i < 4:
            _check(small[i], want_ids, want_s)


def test_the_sgemm_kernel_leaves_out_only_zero_padding(built) -> None:
    """The batch product multiplies dim + 1 columns, not the zero padding: the same top-k and scores
    (within float32 rounding) as the product over every stored column."""
    _, raw, counts, ids, queries = built
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), pad_to=8)
    index.add_vectors(raw, counts, ids=ids)
    inner, _ = index._flat_parts()
    unit = queries[:16] / np.linalg.norm(queries[:16], axis=1, keepdims=True)
    qaug = index._augment(unit, np.full(16, 0.05), query=True)  # the rows a search with a = 0.05 scans
    assert inner.d > DIM + 1  # padded: there is something to leave out
    narrow_s, narrow_p = batch_topk.sgemm_topk(inner, qaug, 10, DIM + 1)
    wide_s, wide_p = batch_topk.sgemm_topk(inner, qaug, 10)
    np.testing.assert_array_equal(narrow_p, wide_p)
    np.testing.assert_allclose(narrow_s, wide_s, atol=1e-6)


def test_sgemm_threshold_is_a_batch_size() -> None:
    assert isinstance(batch_topk.SGEMM_MIN_BATCH, int) and batch_topk.SGEMM_MIN_BATCH >= 2


def test_an_index_saved_unpadded_loads_and_round_trips_awkward_texts(tmp_path) -> None:
    """Indexes saved unpadded (pad_to=1, the default before and again after pad_to=8) load as they were; records with line
    and paragraph separators inside texts and metadata survive the one-call JSON-lines reader."""
    raw, counts = _corpus(30)
    texts = [f"line one\nline two\u2028para\u2029end {i}" if i % 2 else None for i in range(30)]
    metas = [{"note": "a\u2028b\nc", "i": i, "deep": {"x": [1, 2]}} for i in range(30)]
    old = NormIndex(dim=DIM, weights=Weights(a=0.05), pad_to=1)
    old.add_vectors(raw, counts, ids=[f"id\u2028{i}" for i in range(30)], texts=texts, metadatas=metas)
    old.delete(["id\u20283"])
    old.save(tmp_path / "old")
    loaded = NormIndex.load(tmp_path / "old")
    assert loaded.pad_to == 1 and loaded.augmented_dim == DIM + 1 and len(loaded) == 29
    assert loaded.get(["id\u20281", "id\u20282"]) == old.get(["id\u20281", "id\u20282"])
    for q in raw[:4]:
        assert loaded.search(q, 5) == old.search(q, 5)


def test_hnsw_single_vector_path_equals_the_general_path() -> None:
    """A single raw vector on HNSW takes the lean path (inner graph, no IDMap2 wrapper): the same hits as
    the general batch path, which searches through FAISS's own id map; k beyond what the graph finds
    is padded the same way (fewer hits, never a wrong id)."""
    raw, counts = _corpus(1500, seed=5)
    ids = [f"h{i}" for i in range(len(raw))]
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type="hnsw", ef_search=16)
    index.add_vectors(raw, counts, ids=ids)
    queries, _ = _corpus(20, seed=6)
    for q in queries:
        lean = index.search(q, 10)
        assert lean == index.search_batch([q], 10)[0]
        assert len(lean) == 10 and len({h.id for h in lean}) == 10
    # after a delete the general path (which skips tombstones) answers, and never returns the deleted id
    top = index.search(queries[0], 1)[0].id
    index.delete([top])
    assert top not in {h.id for h in index.search(queries[0], 10)}


def test_the_bundled_sgemm_and_numpys_give_the_same_batches(built, monkeypatch) -> None:
    """Batches are scored with the sgemm the faiss-cpu wheel bundles where it is found (normrank.faiss_blas)
    and with NumPy's otherwise: both give the brute-force blend."""
    from normrank import faiss_blas

    index, raw, counts, ids, queries = built
    with_default = index.search_batch(list(queries[:16]), 10)
    monkeypatch.setattr(faiss_blas, "sgemm", lambda: None)
    with_numpy = index.search_batch(list(queries[:16]), 10)
    for q, a, b in zip(queries[:16], with_default, with_numpy):
        want_ids, want_s = _brute(index, raw, counts, ids, q, 10)
        _check(a, want_ids, want_s)
        _check(b, want_ids, want_s)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_a_batch_of_vector_arrays_equals_the_same_batch_given_as_lists(built, dtype) -> None:
    """A batch of 1-D float arrays is stacked at once; as lists (or mixed with a 2-D row) each row is
    converted on its own. The hits, values and query weights must not depend on which path ran."""
    index, _, _, _, queries = built
    rows = [q.astype(dtype) for q in queries[:12]]
    fast = index.search_batch(rows, 10)
    as_lists = index.search_batch([r.tolist() for r in rows], 10)
    mixed = index.search_batch([rows[0][None, :]] + rows[1:], 10)  # a (1, dim) row: the general path
    assert fast == as_lists == mixed
    arrays = index.search_arrays(rows, 10)
    assert arrays.ids == [[h.id for h in row] for row in fast]
    np.testing.assert_array_equal(arrays.scores, np.array([[h.score for h in row] for row in fast], np.float32))
    # query-conditioned weights use each query's own norm and token count on either path
    old = index.weights
    index.set_weights(Weights(a=0.05, b=0.03))
    index.calibrate_queries(norms=np.linalg.norm(queries.astype(np.float64), axis=1),
                            token_counts=np.arange(5, 5 + len(queries)))
    try:
        tc = list(range(5, 17))
        assert index.search_batch(rows, 10, query_token_counts=tc) == index.search_batch(
            [r.tolist() for r in rows], 10, query_token_counts=tc)
    finally:
        index.set_weights(old)
        index.query_calibrator = None


@pytest.mark.parametrize("bad, error", [
    ("nan", "InvalidVectorError"), ("inf", "InvalidVectorError"), ("zero", "InvalidVectorError"),
    ("underflow", "InvalidVectorError"), ("too big for float32", "InvalidVectorError"),
    ("norm beyond float32", "InvalidVectorError"), ("short", "DimensionMismatchError"),
])
def test_a_bad_row_in_a_batch_of_arrays_gets_the_named_error(built, bad: str, error: str) -> None:
    index, _, _, _, queries = built
    rows = [q.copy() for q in queries[:10]]
    rows[4] = {"nan": np.where(np.arange(DIM) == 3, np.nan, rows[4]).astype(np.float32),
               "inf": np.where(np.arange(DIM) == 3, -np.inf, rows[4]).astype(np.float32),
               "zero": np.zeros(DIM, np.float32),
               "underflow": np.full(DIM, 1e-30, np.float32),  # float32 squares are 0: all zero, as one by one
               "too big for float32": np.where(np.arange(DIM) == 3, 1e39, rows[4].astype(np.float64)),
               # finite float32 entries whose norm is not: the unit vector came out all zeros, in silence
               "norm beyond float32": np.full(DIM, 3e38, np.float32),
               "short": rows[4][:-1]}[bad]
    before = len(index)
    for call in (index.search_batch, index.search_arrays):
        with pytest.raises(Exception) as info:
            call(rows, 10)
        assert type(info.value).__name__ == error
    if rows[4].ndim == 1 and rows[4].shape[0] == DIM:  # the single-query path names it too
        with pytest.raises(Exception) as info:
            index.search(np.asarray(rows[4]), 10)
        assert type(info.value).__name__ == error
    assert len(index) == before


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_query_matrix_equals_the_same_queries_as_a_list_of_rows(built, dtype) -> None:
    """A 2-D float matrix of queries is read in a few NumPy calls (``index_base._plain_batch``) and, for a
    fixed additive weight on a flat index, searched without the generic path's steps (``_lean_wide``).
    Hits, values, token counts and errors must be those of the same queries given row by row, which
    the generic path reads; a filter that keeps everything forces the generic path."""
    index, _, _, _, queries = built
    mat = queries[:40].astype(dtype)
    rows = [r.tolist() for r in mat]
    for k in (1, 10):
        want = index.search_batch(rows, k)
        assert index.search_batch(mat, k) == want == index.search_batch(mat, k, filter={})
        arrays = index.search_arrays(mat, k)
        assert arrays.ids == [[h.id for h in row] for row in want]
        np.testing.assert_array_equal(arrays.scores, np.array([[h.score for h in row] for row in want], np.float32))
        np.testing.assert_array_equal(arrays.cosines, np.array([[h.cosine for h in row] for row in want]))
    assert index.search_batch(mat[:3], 5) == index.search_batch(rows[:3], 5)  # below the sgemm batch size
    tc = list(range(5, 45))
    assert index.search_batch(mat, 5, query_token_counts=tc) == index.search_batch(rows, 5, query_token_counts=tc)
    for bad in ([0] * 40, [True] * 40, [5] * 39, [5.0] * 40, [2**31] * 40):
        with pytest.raises(InvalidArgumentError):
            index.search_arrays(mat, 5, query_token_counts=bad)
    for value, error in ((np.nan, InvalidVectorError), (np.inf, InvalidVectorError), (0.0, InvalidVectorError)):
        broken = mat.copy()
        broken[7] = value
        for call in (index.search_batch, index.search_arrays):
            with pytest.raises(error):
                call(broken, 5)
    with pytest.raises(DimensionMismatchError):
        index.search_arrays(mat[:, :-1], 5)
    assert index.search_arrays(mat[:0], 5).ids == []
    tiny = mat.copy()
    tiny[2] *= 1e-10  # nonzero: accepted, with the checked path's answer
    assert index.search_batch(tiny, 5) == index.search_batch([r.tolist() for r in tiny], 5)


def test_search_arrays_ids_follow_adds_deletes_and_compaction() -> None:
    """``search_arrays`` maps internal ids to ids through an object array kept once built
    (``DocColumns.id_array``): after adds, deletes and a compaction it must give the ids ``search_batch`` gives."""
    raw, counts = _corpus(900, seed=7)
    # a calibration set by hand: an automatic one is refitted by the first delete (half of what it was
    # fitted on), and the rebuild would clear the tombstones this test wants the generic path to meet
    given = NormIndex(dim=DIM)
    given.add_vectors(raw, counts)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), calibrator=given.calibrator)
    index.add_vectors(raw[:500], counts[:500], ids=[f"a{i}" for i in range(500)])
    queries = _corpus(20, seed=8)[0]

    def agree() -> None:
        arrays = index.search_arrays(queries, 10)
        assert arrays.ids == [[h.id for h in row] for row in index.search_batch(queries, 10)]

    agree()  # builds the id array
    index.add_vectors(raw[500:], counts[500:], ids=[f"b{i}" for i in range(400)])  # grows it
    agree()
    index.delete([f"a{i}" for i in range(0, 500, 2)])  # tombstones: the generic path answers
    assert index._tombstones
    agree()
    index.delete([f"b{i}" for i in range(0, 400, 2)])  # past the compaction threshold: FAISS drops them
    assert not index._tombstones
    agree()
    index.add_vectors(raw[:3], counts[:3], ids=["new0", "new1", "new2"])
    agree()
    assert index.search_arrays(raw[:1], 1).ids == [["new0"]]


def test_stacked_query_norms_are_numpys_float64_norms(built) -> None:
    """A stacked batch's norms (which set query-conditioned weights) are exactly ``np.linalg.norm`` of the
    float64 rows, and a tiny but nonzero row is accepted, with the answer the one-by-one path gives."""
    index, _, _, _, queries = built
    rows = [q.copy() for q in queries[:10]]
    rows[2] = (rows[2] * 1e-10).astype(np.float32)
    unit, norms, _ = index._encode_queries(rows, None)
    want = np.linalg.norm(np.stack(rows).astype(np.float64), axis=1)
    np.testing.assert_array_equal(norms, want)
    np.testing.assert_array_equal(unit, np.stack(rows) / want[:, None].astype(np.float32))
    assert index.search_batch(rows, 5) == index.search_batch([r.tolist() for r in rows], 5)


def test_single_queries_do_not_depend_on_faiss_threads() -> None:
    """With more OpenMP threads than queries and 10k+ vectors, FAISS 1.15 splits the stored vectors
    between threads and scores them by sgemm (its database-parallel path: other rounding, and 2.5x
    slower on the benchmark machine). normrank keeps one thread per query there, so a single query,
    a small batch and a one-thread run give the same hits with bit-equal scores, and the caller's
    thread count is left as it was."""
    import faiss

    raw, counts = _corpus(12_000, seed=3)
    ids = [f"d{i}" for i in range(len(raw))]
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts, ids=ids)
    queries = _corpus(6, seed=4)[0]
    before = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(1)
        one = [index.search(q, 10) for q in queries]
        one_batch = index.search_batch(list(queries[:3]), 10)
        faiss.omp_set_num_threads(4)  # more threads than queries: FAISS would split the vectors
        many = [index.search(q, 10) for q in queries]
        many_batch = index.search_batch(list(queries[:3]), 10)
        assert faiss.omp_get_max_threads() == 4  # put back after each call
    finally:
        faiss.omp_set_num_threads(before)
    assert many == one and many_batch == one_batch == one[:3]
    for q, hits in zip(queries, many):
        _check(hits, *_brute(index, raw, counts, ids, q, 10))


def test_single_search_reads_columns_that_grew_after_an_earlier_search() -> None:
    """The single path reads norms, token counts and g(d) through views of the columns; an add that
    grows the columns past their capacity (and a recalibration that rewrites g) must be seen by the
    next search, field by field, as the general path sees it."""
    raw, counts = _corpus(700, seed=11)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw[:40], counts[:40], ids=[f"g{i}" for i in range(40)])
    index.search(raw[0], 5)  # the views of the 64-slot columns are made here
    index.add_vectors(raw[40:], counts[40:], ids=[f"g{i}" for i in range(40, 700)])
    ids = [f"g{i}" for i in range(700)]
    for q in raw[600:610]:
        hits = index.search(q, 10)
        _check(hits, *_brute(index, raw, counts, ids, q, 10))
        assert hits == index.search_batch([q], 10)[0]
        for h in hits:
            i = int(h.id[1:])
            assert h.token_count == int(counts[i])
            assert h.norm == pytest.approx(float(np.linalg.norm(raw[i].astype(np.float64))), rel=1e-6)
    index.recalibrate()
    assert index.search(raw[650], 10) == index.search_batch([raw[650]], 10)[0]
