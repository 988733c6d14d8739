"""NormIndex: the exact blended top-k, filters, deletes, persistence, on real FAISS."""

from __future__ import annotations

import numpy as np
import pytest

from normrank import NormIndex, UnitNormError, Weights
from normrank.errors import DimensionMismatchError, InvalidMetadataError, InvalidVectorError
from normrank.scoring import blend

from .conftest import synthetic


def brute_force(index: NormIndex, vecs: np.ndarray, counts: np.ndarray, ids: list[str], q_raw: np.ndarray,
                q_count: int, k: int) -> tuple[list[str], np.ndarray]:
    """The blend computed directly from raw vectors, no FAISS involved."""
    w = index.weights
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    unit = vecs / norms[:, None]
    qn = float(np.linalg.norm(q_raw))
    cos = unit @ (q_raw / qn)
    g = w.shape(index.calibrator.transform(norms, counts, w.feature))
    qcal = index.query_calibrator or index.calibrator
    wq = w.query_weight(qcal.transform(np.array([qn]), np.array([q_count]), w.feature))[0]
    scores = blend(cos, g, wq, w)
    order = np.argsort(-scores, kind="stable")[:k]
    return [ids[i] for i in order], scores[order]


def assert_same_ranking(hits, expected_ids, expected_scores, atol=1e-5):
    got = np.array([h.score for h in hits])
    np.testing.assert_allclose(got, expected_scores, atol=atol)
    # Ids must agree except where scores tie within tolerance.
    for h, eid, es in zip(hits, expected_ids, expected_scores):
        if h.id != eid:
            assert abs(h.score - es) < atol


@pytest.mark.parametrize("mode", ["additive", "tiebreak", "multiplicative"])
def test_blended_search_equals_brute_force_on_real_vectors(demo_encoded, encoder, mode):
    vecs, counts = demo_encoded
    ids = [f"d{i}" for i in range(len(vecs))]
    index = NormIndex(encoder, weights=Weights(a=0.05, b=-0.03, mode=mode, epsilon=0.05))
    index.add_vectors(vecs, counts, ids=ids)
    queries = ["How long do stars live?", "vaccines", "what is the exact value of the speed of light in vacuum"]
    index.calibrate_queries(queries)
    q_raw, q_counts = encoder.encode_with_counts(queries)
    for qi, q in enumerate(queries):
        for k in (1, 5, 20):
            hits = index.search(q, k)
            exp_ids, exp_scores = brute_force(index, vecs, counts, ids, q_raw[qi], q_counts[qi], k)
            assert len(hits) == k
            assert_same_ranking(hits, exp_ids, exp_scores)
            for h in hits:  # the explanation adds up
                assert h.score == pytest.approx(float(blend(h.cosine, h.norm_feature, h.weight, index.weights)),
                                                abs=1e-5)


def test_random_weights_match_brute_force_on_synthetic_vectors():
    rng = np.random.default_rng(3)
    vecs, counts = synthetic(3000, dim=48, seed=3)
    ids = [f"s{i}" for i in range(len(vecs))]
    index = NormIndex(dim=48)
    index.add_vectors(vecs, counts, ids=ids)
    qv, qc = synthetic(40, dim=48, seed=4)
    index.calibrate_queries(norms=np.linalg.norm(qv, axis=1), token_counts=qc)
    for trial in range(12):
        w = Weights(a=float(rng.normal(0, 0.1)), b=float(rng.normal(0, 0.1)),
                    feature=["calibrated", "raw"][trial % 2], clip=[3.0, None, 1.5][trial % 3])
        index.set_weights(w)
        k = int(rng.integers(1, 50))
        hits = index.search(qv[trial], k, query_token_count=int(qc[trial]))
        exp_ids, exp_scores = brute_force(index, vecs, counts, ids, qv[trial], int(qc[trial]), k)
        assert [h.id for h in hits][:3] == exp_ids[:3] or np.allclose([h.score for h in hits][:3], exp_scores[:3])
        assert_same_ranking(hits, exp_ids, exp_scores)


def test_cosine_weights_rank_exactly_like_a_plain_cosine_index(demo_encoded, encoder):
    import faiss

    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts, ids=[str(i) for i in range(len(vecs))])
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    plain = faiss.IndexFlatIP(unit.shape[1])
    plain.add(unit)
    q = encoder.encode(["rivers and mountains"])
    d, i = plain.search(q / np.linalg.norm(q), 10)
    hits = index.search("rivers and mountains", 10)
    assert [h.id for h in hits] == [str(x) for x in i[0]]
    np.testing.assert_allclose([h.cosine for h in hits], d[0], atol=1e-5)


def test_the_norm_term_reorders_documents(demo_encoded, encoder):
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts, ids=[str(i) for i in range(len(vecs))])
    before = [h.id for h in index.search("How high is the tallest mountain?", 5)]
    index.set_weights(Weights(a=-0.2))
    after = index.search("How high is the tallest mountain?", 5)
    assert [h.id for h in after] != before
    assert all(h.weight == pytest.approx(-0.2) for h in after)


def test_filter_returns_k_results_when_k_match(demo_encoded, encoder):
    vecs, counts = demo_encoded
    metas = [{"topic": "even" if i % 2 == 0 else "odd", "i": i} for i in range(len(vecs))]
    for index_type in ("flat", "hnsw"):
        index = NormIndex(encoder, weights=Weights(a=0.02), index_type=index_type)
        index.add_vectors(vecs, counts, ids=[str(i) for i in range(len(vecs))], metadatas=metas)
        hits = index.search("stars and planets", 10, filter={"topic": "odd"})
        assert len(hits) == 10 and all(h.metadata["topic"] == "odd" for h in hits)
        few = index.search("stars", 10, filter=lambda m: m["i"] < 3)
        assert sorted(h.id for h in few) == ["0", "1", "2"]
        assert index.search("stars", 5, filter={"topic": "none"}) == []


def test_delete_get_and_ids(demo_encoded, encoder):
    vecs, counts = demo_encoded
    for index_type in ("flat", "hnsw", "ivf"):
        index = NormIndex(encoder, index_type=index_type, nlist=4)
        ids = index.add_vectors(vecs, counts, ids=[f"x{i}" for i in range(len(vecs))], texts=["t"] * len(vecs))
        top = index.search("vaccines", 1)[0].id
        assert index.delete([top]) == 1
        assert top not in index and len(index) == len(vecs) - 1
        assert all(h.id != top for h in index.search("vaccines", len(index)))
        rec = index.get([ids[1]])[0]
        assert rec.id == ids[1] and rec.token_count == counts[1]
        assert rec.norm == pytest.approx(float(np.linalg.norm(vecs[1])), rel=1e-6)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_save_load_round_trip_gives_identical_results(tmp_path, demo_encoded, encoder, index_type):
    vecs, counts = demo_encoded
    index = NormIndex(encoder, weights=Weights(a=0.03, b=0.01), index_type=index_type, nlist=4)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(len(vecs))],
                      texts=[f"text {i}" for i in range(len(vecs))], metadatas=[{"i": i} for i in range(len(vecs))])
    index.calibrate_queries(["stars", "vaccines", "coffee brewing temperature"])
    index.delete(["d3"])
    index.save(tmp_path / "idx")
    back = NormIndex.load(tmp_path / "idx", encoder=encoder)
    assert back.ids() == index.ids() and back.weights == index.weights
    for q in ("stars", "how is espresso brewed", "battle in 1066"):
        assert back.search(q, 10) == index.search(q, 10)
    assert not list((tmp_path / "idx").glob("**/*.pkl"))


def test_unit_norm_vectors_are_refused_with_the_way_out(demo_encoded, encoder):
    vecs, counts = demo_encoded
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    index = NormIndex(encoder)
    with pytest.raises(UnitNormError, match="already unit length.*RawEncoder"):
        index.add_vectors(unit, counts)
    assert len(index) == 0
    index.add_vectors(vecs, counts)
    with pytest.raises(UnitNormError):
        index.add_vectors(unit[:5], counts[:5])
    assert len(index) == len(vecs)


def test_bad_vectors_are_named(demo_encoded, encoder):
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts)
    bad = vecs[:3].copy()
    bad[1, 0] = np.nan
    with pytest.raises(InvalidVectorError, match="NaN or infinity"):
        index.add_vectors(bad, counts[:3])
    with pytest.raises(DimensionMismatchError, match="got vectors of dimension 10, expected 384"):
        index.add_vectors(np.ones((2, 10)), [3, 4])
    assert len(index) == len(vecs)


def test_from_texts_end_to_end_with_the_real_model(encoder):
    texts = ["Mount Everest is 8,849 metres high.", "Mountains are high.", "Coffee is brewed with hot water."]
    index = NormIndex.from_texts(texts, ids=["everest", "mountains", "coffee"], encoder=encoder)
    hits = index.search("how tall is Everest", 2)
    assert hits[0].id == "everest" and hits[0].text == texts[0]
    assert hits[0].norm > 1.5 and set(hits[0].explain()) == {"cosine", "norm", "norm_feature", "weight", "score"}


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_a_store_filled_one_document_at_a_time_ranks_like_one_filled_at_once(index_type):
    """Below 40 documents every add refits the automatic calibration (a fit on the first document alone
    flattened the blend); from 40 on it is refitted each time the corpus doubles."""
    vecs, counts = synthetic(100, seed=4)
    ids = [f"d{i}" for i in range(100)]
    at_once = NormIndex(dim=32, weights=Weights(a=0.05), index_type=index_type)
    at_once.add_vectors(vecs[:30], counts[:30], ids=ids[:30])
    one_by_one = NormIndex(dim=32, weights=Weights(a=0.05), index_type=index_type)
    fitted = []
    for i in range(100):
        one_by_one.add_vectors(vecs[i:i + 1], counts[i:i + 1], ids=ids[i:i + 1])
        fitted.append(one_by_one.calibrator.n_fitted)
        if i == 29:
            assert one_by_one.calibrator.to_dict() == at_once.calibrator.to_dict()
            for q in vecs[:5]:
                a, b = at_once.search(q, 5), one_by_one.search(q, 5)
                assert [h.id for h in a] == [h.id for h in b]
                np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-6)
    assert fitted[:40] == list(range(1, 41))  # every add while fewer than 40 inform the fit
    assert fitted[40:] == [40] * 39 + [80] * 21  # then each time the corpus doubles
    given = NormIndex(dim=32, weights=Weights(a=0.05), calibrator=at_once.calibrator)
    for i in range(35):  # a calibration the caller gave is never refitted
        given.add_vectors(vecs[i:i + 1], counts[i:i + 1], ids=ids[i:i + 1])
    assert given.calibrator.n_fitted == 30


def _away_pointing_corpus(dim: int = 64, n: int = 300) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Documents around a query plus one pointing straight away from it with a very low norm: under a
    multiplicative weight past 2 its factor 1 + w * p is negative, so cosine -1 scores well."""
    rng = np.random.default_rng(0)
    dirs = rng.normal(size=(n, dim))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    q = rng.normal(size=dim).astype(np.float32)
    dirs[0] = -q / np.linalg.norm(q)
    norms = 5 * np.exp(rng.normal(0, 0.1, size=n))
    norms[0] = 2.0
    return (dirs * norms[:, None]).astype(np.float32), np.full(n, 20), [f"d{i}" for i in range(n)], q


@pytest.mark.parametrize("a", [3.0, -3.0, 40.0, 0.4])
def test_multiplicative_weights_past_two_find_the_document_pointing_away(a):
    """The factor of a multiplicative blend lies in [1 - |w|/2, 1 + |w|/2]; past |w| = 2 it can be
    negative, and the search must keep widening until no unseen document (cosine down to -1) can win."""
    vecs, counts, ids, q = _away_pointing_corpus()
    index = NormIndex(dim=vecs.shape[1], weights=Weights(a=a, mode="multiplicative"))
    index.add_vectors(vecs, counts, ids=ids)
    for k in (1, 3, 10):
        exp_ids, exp_scores = brute_force(index, vecs, counts, ids, q, 20, k)
        hits = index.search(q, k)
        assert_same_ranking(hits, exp_ids, exp_scores)
        assert hits == index.search_batch([q], k)[0]
    if a == 3.0:  # the case the old bound missed: d0 (cosine -1) is among the best three
        assert "d0" in [h.id for h in index.search(q, 3)]


def test_numpy_scalars_in_metadata_are_stored_as_the_python_values_they_hold(tmp_path):
    """pandas rows and array elements give NumPy scalars: np.int64 and np.True_ were refused ("is a bool"),
    np.float32 too. They are stored as the ints, bools and floats they hold: what get, filters and a
    reload give back are plain Python values."""
    vecs, counts = synthetic(40, dim=16, seed=2)
    index = NormIndex(dim=16)
    metas = [{"year": np.int64(2000 + i), "ok": np.bool_(i % 2 == 0), "w": np.float32(0.5),
              "tags": [np.uint8(i), {"deep": np.False_}]} for i in range(40)]
    index.add_vectors(vecs, counts, ids=[f"m{i}" for i in range(40)], metadatas=metas)
    got = index.get(["m3"])[0].metadata
    assert got == {"year": 2003, "ok": False, "w": 0.5, "tags": [3, {"deep": False}]}
    assert type(got["year"]) is int and type(got["ok"]) is bool and type(got["w"]) is float
    assert {h.id for h in index.search(vecs[0], 40, filter={"ok": True})} == {f"m{i}" for i in range(0, 40, 2)}
    index.save(tmp_path / "np")
    assert NormIndex.load(tmp_path / "np").get(["m3"])[0].metadata == got
    with pytest.raises(InvalidMetadataError, match="must be finite"):
        index.add_vectors(vecs[:1], counts[:1], ids=["bad"], metadatas=[{"w": np.float32("nan")}])
    assert "bad" not in index
    # np.longdouble (whose item() is itself) raised a bare RecursionError; it is the float it holds
    index.add_vectors(vecs[:1] * 2, counts[:1], ids=["ld"], metadatas=[{"w": np.longdouble(1.5)}])
    assert index.get(["ld"])[0].metadata == {"w": 1.5} and type(index.get(["ld"])[0].metadata["w"]) is float
    for bad in (np.longdouble("1e4000"), np.longdouble("nan")):  # beyond a float64, or NaN: named
        with pytest.raises(InvalidMetadataError, match="must be finite"):
            index.add_vectors(vecs[:1] * 3, counts[:1], ids=["bad"], metadatas=[{"w": bad}])
    assert "bad" not in index


def test_an_approximate_index_warns_of_a_weight_it_cannot_follow(caplog):
    """HNSW and IVF follow cosine: at a = 0.5 their recall of the exact blend fell to 0.67-0.86 without a word."""
    from tests.conftest import synthetic

    vecs, counts = synthetic(300, dim=16, seed=2)
    for index_type in ("hnsw", "ivf"):
        index = NormIndex(dim=16, index_type=index_type, nlist=4, weights=Weights(a=0.04))
        index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(300)])
        with caplog.at_level("WARNING", logger="normrank.store"):
            caplog.clear()
            index.set_weights(Weights(a=0.1, b=0.02))
            assert "does not follow" not in caplog.text
            index.set_weights(Weights(a=0.5))
            assert f"which this {index_type} index does not follow" in caplog.text
    flat = NormIndex(dim=16, weights=Weights(a=0.04))
    with caplog.at_level("WARNING", logger="normrank.store"):
        caplog.clear()
        flat.set_weights(Weights(a=5.0))
        assert "does not follow" not in caplog.text  # the flat index is exact at any weight


def test_vector_errors_name_the_real_cause():
    """A finite float64 of 1e300 was refused as "NaN or infinity" and a tiny non-zero vector as "all-zero";
    values above ~1.8e19 leaked numpy's overflow RuntimeWarning."""
    import warnings

    index = NormIndex(dim=4)
    cases = [([1e300, 0, 0, 0], "beyond float32's range"), ([1e-50, 1e-50, 0, 0], "norm of at most 1e-12"),
             ([0, 0, 0, 0], "all-zero vectors"), ([np.nan, 1, 1, 1], "NaN or infinity")]
    for vector, words in cases:
        with pytest.raises(InvalidVectorError, match=words):
            index.add_vectors(np.array([vector]), [5], ids=["x"])
    assert len(index) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index.add_vectors(np.array([[3e19, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]]), [5, 6], ids=["big", "small"])
    assert len(index) == 2
