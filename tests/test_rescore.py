"""``scoring.rescore``: what the re-rankers (LlamaIndex postprocessor, Haystack ranker) score candidates with,
checked against the index's own arithmetic on real FAISS."""

from __future__ import annotations

import numpy as np
import pytest

from normrank import NormCalibrator, NormIndex, UnitNormError, Weights
from normrank.errors import InvalidArgumentError
from normrank.fitting import check_qrels
from normrank.scoring import rescore

from .conftest import synthetic


@pytest.fixture(scope="module")
def index_and_vectors():
    vecs, counts = synthetic(400, dim=32, seed=21)
    vecs[1] = vecs[0]  # a text stored twice: the stores accept it
    counts[1] = counts[0]
    index = NormIndex(dim=32, weights=Weights(a=0.08))
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(len(vecs))])
    return index, vecs, counts


@pytest.mark.parametrize("weights", [Weights(a=0.08), Weights()])
def test_duplicate_candidates_score_as_the_index_scores_them(index_and_vectors, weights):
    """Candidates that all have one norm (duplicates, the same passage from two sources) were refused with
    a UnitNormError pointing at hosted APIs, even under plain cosine with the corpus calibration."""
    index, vecs, counts = index_and_vectors
    q = vecs[5] + 0.1
    hits = rescore(q, vecs[[0, 1]], counts[[0, 1]], weights=weights, calibrator=index.calibrator, ids=["d0", "d1"])
    want = {h.id: h for h in index.search(q, 400)} if weights == index.weights else None
    assert hits[0].score == hits[1].score and hits[0].norm_feature == hits[1].norm_feature
    if want is not None:
        for h in hits:
            assert h.score == pytest.approx(want[h.id].score, abs=1e-6)
            assert h.norm_feature == pytest.approx(want[h.id].norm_feature, abs=1e-5)
    # with no corpus calibration, candidates of one norm carry no norm signal among themselves: feature ~0
    alone = rescore(q, vecs[[0, 1]], counts[[0, 1]], weights=Weights(a=0.08))
    assert all(abs(h.norm_feature) < 1e-3 for h in alone)
    assert alone[0].score == pytest.approx(alone[0].cosine, abs=1e-4)


def test_unit_length_candidates_are_still_refused(index_and_vectors):
    index, vecs, counts = index_and_vectors
    unit = vecs[:3] / np.linalg.norm(vecs[:3], axis=1, keepdims=True)
    for docs in (unit, unit[:1]):
        with pytest.raises(UnitNormError, match="already unit length"):
            rescore(vecs[5], docs, counts[: len(docs)], weights=Weights(a=0.08), calibrator=index.calibrator)


@pytest.mark.parametrize("bad", [[7.9, 3, 4], [True, 3, 4], ["5", 3, 4], [0, 3, 4], [float("nan"), 3, 4]])
def test_candidate_token_counts_are_read_as_the_stores_read_them(index_and_vectors, bad):
    """``rescore`` cut 7.9 to 7 and read True as 1, where the stores refuse both."""
    index, vecs, _ = index_and_vectors
    with pytest.raises(InvalidArgumentError, match="token counts must be whole numbers"):
        rescore(vecs[5], vecs[:3], bad, weights=Weights(a=0.08), calibrator=index.calibrator)
    ok = rescore(vecs[5], vecs[:3], [7.0, 3, 4], weights=Weights(a=0.08), calibrator=index.calibrator)
    assert [h.token_count for h in ok] == [7, 3, 4]


@pytest.mark.parametrize("bad", ["12", 7.5, True, 0, -3, 2**31])
@pytest.mark.parametrize("weights", [Weights(a=0.08, b=0.05), Weights(a=0.08)])
def test_query_token_count_is_read_as_the_stores_read_it(index_and_vectors, bad, weights):
    """``rescore`` (the re-rankers' arithmetic) took "12" to a bare TypeError and 7.5 or True as counts,
    where ``NormIndex.search`` names all of them; now both refuse them alike, whatever the blend."""
    index, vecs, counts = index_and_vectors
    with pytest.raises(InvalidArgumentError, match="query token count"):
        index.search(vecs[5], 3, query_token_count=bad)
    with pytest.raises(InvalidArgumentError, match="query token count"):
        rescore(vecs[5], vecs[:3], counts[:3], weights=weights, calibrator=index.calibrator, query_token_count=bad)
    hits = rescore(vecs[5], vecs[:3], counts[:3], weights=weights, calibrator=index.calibrator,
                   query_calibrator=index.calibrator, query_token_count=np.int64(12))
    assert len(hits) == 3 and all(np.isfinite(h.score) for h in hits)


def test_norms_equal_up_to_rounding_give_no_feature():
    """Norms equal but for float32 rounding (relative spread ~1e-7) were standardised by that spread into
    features of +-2: a calibration must read them as no spread, and every feature as ~0."""
    rng = np.random.default_rng(3)
    dirs = rng.normal(size=(300, 32))
    vecs = (dirs / np.linalg.norm(dirs, axis=1, keepdims=True) * 5).astype(np.float32)
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    assert 0 < np.ptp(norms) / 5 < 1e-6
    cal = NormCalibrator().fit(norms, np.full(300, 20))
    for feature in ("calibrated", "raw"):
        assert np.abs(cal.transform(norms, np.full(300, 20), feature)).max() < 1e-3
    spread = NormCalibrator().fit(np.exp(rng.normal(1.5, 0.1, 300)), np.full(300, 20))
    assert 0.05 < spread.raw_scale < 0.2  # a real spread is standardised as before


@pytest.mark.parametrize("bad", [float("nan"), 0.5, 0, float("inf")])
def test_calibrator_refuses_token_counts_that_are_not_numbers_from_one(bad):
    cal = NormCalibrator().fit(np.exp(np.random.default_rng(0).normal(1.5, 0.1, 50)), np.arange(1, 51))
    with pytest.raises(InvalidArgumentError, match="token counts must be numbers >= 1"):
        cal.transform(np.array([3.0]), np.array([bad]))
    with pytest.raises(InvalidArgumentError, match="token counts must be numbers >= 1"):
        NormCalibrator().fit(np.array([3.0, 4.0]), np.array([5.0, bad]))


def test_qrels_grades_may_be_whole_floats():
    """pandas reads a grade column as floats: 2.0 is a whole number; 2.5, NaN and True are not."""
    queries = {"q1": "a question"}
    check_qrels({"q1": {"d1": 2.0, "d2": np.float64(1.0), "d3": 0}}, queries, {"d1", "d2", "d3"})
    for bad in (2.5, float("nan"), True, "1"):
        with pytest.raises(InvalidArgumentError, match="whole numbers"):
            check_qrels({"q1": {"d1": bad}}, queries, {"d1"})
