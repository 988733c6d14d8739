"""The calibrated feature removes length, keeps the rest, and survives JSON."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from normrank import NormCalibrator, NotCalibratedError
from normrank.errors import InvalidArgumentError

from .conftest import synthetic


@pytest.mark.data
def test_calibrated_feature_is_independent_of_length_on_cranfield(cranfield):
    norms = np.linalg.norm(cranfield.vectors, axis=1)
    counts = cranfield.token_counts
    cal = NormCalibrator().fit(norms, counts)
    raw_rho = spearmanr(norms, counts)[0]
    cal_rho = spearmanr(cal.transform(norms, counts), counts)[0]
    assert raw_rho < -0.5, f"raw norm should track length strongly, got {raw_rho:.3f}"
    assert abs(cal_rho) < 0.1, f"calibrated feature still tracks length: {cal_rho:.3f}"
    # The raw feature keeps length in, and is robustly standardised.
    raw = cal.transform(norms, counts, "raw")
    assert abs(np.median(raw)) < 1e-9 and abs(spearmanr(raw, counts)[0]) > 0.5


def test_feature_is_robustly_standardised():
    vecs, counts = synthetic(2000)
    norms = np.linalg.norm(vecs, axis=1)
    g = NormCalibrator().fit(norms, counts).transform(norms, counts)
    assert abs(np.median(g)) < 0.05
    assert 0.8 < np.median(np.abs(g)) * 1.4826 < 1.2


def test_json_round_trip_gives_identical_features(tmp_path):
    vecs, counts = synthetic(500)
    norms = np.linalg.norm(vecs, axis=1)
    cal = NormCalibrator().fit(norms, counts)
    cal.save(tmp_path / "cal.json")
    back = NormCalibrator.load(tmp_path / "cal.json")
    assert back == cal
    for feature in ("calibrated", "raw"):
        np.testing.assert_array_equal(back.transform(norms, counts, feature), cal.transform(norms, counts, feature))


def test_short_queries_extrapolate_flat_instead_of_exploding():
    vecs, counts = synthetic(500)
    norms = np.linalg.norm(vecs, axis=1)
    cal = NormCalibrator().fit(norms, np.maximum(counts, 50))
    g_short = cal.transform(norms[:10], np.full(10, 3))
    assert np.all(np.isfinite(g_short)) and np.all(np.abs(g_short) < 20)


def test_errors_are_named():
    with pytest.raises(NotCalibratedError, match="not fitted"):
        NormCalibrator().transform(np.ones(2), np.ones(2))
    cal = NormCalibrator().fit(np.array([1.0, 2.0, 3.0]), np.array([3, 4, 5]))
    with pytest.raises(InvalidArgumentError, match="unknown norm feature 'length'"):
        cal.transform(np.ones(1), np.ones(1), "length")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="3 norms but 2 token counts"):
        cal.fit(np.ones(3), np.ones(2))
