"""The research options (issue 7): norm-aware pooling, query performance prediction, adaptive k,
the fitted default's never-harm behaviour, and the research harness itself, on real components."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from normrank.errors import InvalidArgumentError
from normrank.pooling import POOLINGS, PooledEncoder, pool
from normrank.qpp import allocate_k, assess, nqc, wig

TEXTS = [
    "Boundary layer transition on a flat plate at hypersonic Mach numbers.",
    "the",
    "Heat transfer in laminar flow.",
    "A library catalogue indexes books by subject headings and author names for retrieval.",
]


# ----------------------------------------------------------------------------- pooling
def test_pool_weights_tokens_by_their_own_norms():
    tokens = np.array([[[3.0, 4.0], [1.0, 0.0], [9.0, 9.0]]], dtype=np.float32)  # norms 5, 1; third masked
    mask = np.array([[1, 1, 0]])
    np.testing.assert_allclose(pool(tokens, mask, "mean"), [[2.0, 2.0]])
    np.testing.assert_allclose(pool(tokens, mask, "norm"), [[(5 * 3 + 1 * 1) / 6, (5 * 4) / 6]], rtol=1e-6)
    np.testing.assert_allclose(pool(tokens, mask, "norm2"), [[(25 * 3 + 1) / 26, (25 * 4) / 26]], rtol=1e-6)
    np.testing.assert_allclose(pool(tokens, mask, "inv_norm"), [[(3 / 5 + 1) / 1.2, (4 / 5) / 1.2]], rtol=1e-6)
    sif = pool(tokens, mask, "sif", token_weights=np.array([[0.5, 1.5, 100.0]]))
    np.testing.assert_allclose(sif, [[(0.5 * 3 + 1.5) / 2, (0.5 * 4) / 2]], rtol=1e-6)


def test_pool_refuses_unknown_modes_and_sif_without_weights():
    t = np.ones((1, 2, 3), dtype=np.float32)
    with pytest.raises(InvalidArgumentError, match="unknown pooling 'max'"):
        pool(t, np.ones((1, 2)), "max")
    with pytest.raises(InvalidArgumentError, match="token_weights"):
        pool(t, np.ones((1, 2)), "sif")
    with pytest.raises(InvalidArgumentError, match="unknown pooling"):
        PooledEncoder(pooling="cls")
    with pytest.raises(InvalidArgumentError, match="sif_a"):
        PooledEncoder(pooling="sif", sif_a=0)


@pytest.fixture(scope="module")
def pooled(encoder):
    enc = PooledEncoder(encoder.model_name, pooling="norm", show_progress=False)
    return enc, enc.encode_poolings(TEXTS)


def test_mean_pooling_reproduces_the_stock_raw_vectors(encoder, pooled):
    _, vecs = pooled
    np.testing.assert_allclose(vecs["mean"], encoder.encode(TEXTS), atol=2e-5)


def test_every_pooling_gives_distinct_finite_vectors_and_a_separate_cache_key(encoder, pooled):
    enc, vecs = pooled
    assert set(vecs) == set(POOLINGS)
    for mode, v in vecs.items():
        assert v.shape == (len(TEXTS), 384) and np.all(np.isfinite(v)), mode
        if mode != "mean":
            assert np.abs(v - vecs["mean"]).max() > 1e-3, mode
    np.testing.assert_allclose(enc.encode(TEXTS), vecs["norm"], atol=1e-5)
    other = PooledEncoder(encoder.model_name, pooling="sif", show_progress=False)
    assert len({enc.fingerprint, other.fingerprint, encoder.fingerprint}) == 3
    assert enc.describe()["pooling"] == "norm"


def test_pooled_encoder_drives_a_real_index(encoder):
    from normrank import NormIndex

    enc = PooledEncoder(encoder.model_name, pooling="norm", show_progress=False)
    index = NormIndex.from_texts(TEXTS, ids=[f"d{i}" for i in range(len(TEXTS))], encoder=enc)
    hits = index.search("hypersonic boundary layer", k=2)
    assert hits[0].id == "d0"


# ----------------------------------------------------------------------------- qpp and adaptive k
def test_allocate_k_keeps_the_average_budget_and_reads_deeper_for_low_predictions():
    z = np.random.default_rng(1).standard_normal(200)
    flat = allocate_k(z, 10, 0.0, 100)
    assert np.all(flat == 10)
    ks = allocate_k(z, 10, 1.0, 100)
    assert abs(ks.mean() - 10) < 0.1
    assert ks.min() >= 1 and ks.max() <= 100
    assert stats.spearmanr(z, ks)[0] < -0.9  # gamma > 0: low predictor -> deeper
    assert stats.spearmanr(z, allocate_k(z, 10, -1.0, 100))[0] > 0.9


def test_allocate_k_refuses_bad_input():
    with pytest.raises(InvalidArgumentError, match="budget"):
        allocate_k(np.zeros(3), 0, 1.0, 100)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        allocate_k(np.array([0.0, np.nan]), 5, 1.0, 100)
    with pytest.raises(InvalidArgumentError, match="gamma"):
        allocate_k(np.zeros(3), 5, float("inf"), 100)


def test_score_predictors_on_hand_computed_lists():
    scores = np.array([[0.9, 0.5, 0.1], [0.5, 0.5, 0.5]])
    np.testing.assert_allclose(nqc(scores, np.array([0.2, 0.5])), [np.std([0.9, 0.5, 0.1]) / 0.2, 0.0])
    np.testing.assert_allclose(wig(scores, 0.1, np.array([4, 9]), k=2), [(0.7 - 0.1) / 2, (0.5 - 0.1) / 3])
    a = assess([0.9, 0.5, 0.1], 0.2, 4)
    assert a.max_score == 0.9 and a.nqc == pytest.approx(nqc(scores[:1], 0.2)[0])
    with pytest.raises(InvalidArgumentError, match="empty"):
        assess([], 0.2, 4)


# ----------------------------------------------------------------------------- the fitted default never harms
def test_default_fit_keeps_cosine_when_labels_carry_no_norm_signal(cranfield):
    """Shuffled qrels: nothing can be learned, so the default fit must return plain cosine."""
    from normrank import NormIndex
    from normrank.fitting import fit_candidates

    c = cranfield
    index = NormIndex(dim=c.vectors.shape[1])
    index.add_vectors(c.vectors, c.token_counts, ids=c.ids)
    qids = [q for q in c.data.qrels if any(s > 0 for s in c.data.qrels[q].values())][:120]
    rng = np.random.default_rng(3)
    shuffled = {q: {c.ids[j]: 1 for j in rng.choice(len(c.ids), 5, replace=False)} for q in qids}
    qv, qc = _encode_queries(c, qids)
    index.calibrate_queries(norms=np.linalg.norm(qv, axis=1), token_counts=qc)
    cands = index.cosine_candidates(list(qv), 100, query_token_counts=qc.tolist())
    rep = fit_candidates(cands, qids, shuffled)
    assert not rep.accepted and rep.weights.is_cosine


def _encode_queries(c, qids):
    from normrank.cache import encode_cached
    from normrank.encoders import RawEncoder

    return encode_cached(RawEncoder(show_progress=False), [c.data.queries[q] for q in qids], show_progress=False)


# ----------------------------------------------------------------------------- the harness runs
def test_research_harness_tiny_run(data_dir, tmp_path, cranfield):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import research
    finally:
        sys.path.pop(0)
    assert research.main(["--tiny", "--stages", "rerank", "qpp", "prune", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "research_tiny.json").read_text())["cranfield"]
    fams = res["rerank"]["families"]
    assert {"query-conditioned:calibrated", "gated:calibrated", "vmf:calibrated", "tiebreak:raw"} <= set(fams)
    for fam in fams.values():
        for r in fam["rules"].values():
            assert 0.0 <= r["ndcg"] <= 1.0 and r["up"] + r["down"] <= r["n"]
    assert res["qpp"]["adaptive_k"]["10"]["fixed"]["mean_k"] == 10
    assert set(res["prune"]["rules"])


def test_yaml_pooling_option_builds_the_pooled_encoder():
    from normrank import ConfigError, PooledEncoder, RawEncoder
    from normrank.config import build_encoder, load_config

    pooled = build_encoder(load_config({"encoder": {"pooling": "sif"}}))
    assert isinstance(pooled, PooledEncoder) and pooled.pooling == "sif"
    stock = build_encoder(load_config({}))
    assert type(stock) is RawEncoder
    with pytest.raises(ConfigError, match="encoder.pooling.*'mean', 'norm', 'norm2', 'inv_norm' or 'sif'"):
        load_config({"encoder": {"pooling": "max"}})
