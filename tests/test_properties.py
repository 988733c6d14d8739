"""Property tests (hypothesis): the store is exactly a brute-force blend, for any input it accepts.

Vectors come straight from hypothesis arrays (with repeated values, so exact ties occur),
dimensions stay small and example counts modest so the file runs in well under a minute.
"""

from __future__ import annotations

import tempfile

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from normrank import NormCalibrator, NormIndex, Weights
from normrank.calibration import FEATURES
from normrank.scoring import MODES, percentile

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

values = st.one_of(st.floats(-4, 4, width=32, allow_subnormal=False), st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]))


@st.composite
def corpora(draw, min_n: int = 2, max_n: int = 30):
    """(doc vectors, token counts, query vectors, query token counts) that pass the store's checks."""
    dim = draw(st.integers(2, 10))
    n = draw(st.integers(min_n, max_n))
    vecs = draw(arrays(np.float32, (n, dim), elements=values))
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    assume(norms.min() > 1e-3)
    assume(not np.all(np.abs(norms - 1.0) < 1e-3))
    assume((norms.max() - norms.min()) / norms.mean() >= 1e-3)
    counts = draw(arrays(np.int64, n, elements=st.integers(1, 300)))
    nq = draw(st.integers(1, 3))
    qvecs = draw(arrays(np.float32, (nq, dim), elements=values))
    qnorms = np.linalg.norm(qvecs.astype(np.float64), axis=1)
    assume(qnorms.min() > 1e-3 and np.all(np.abs(qnorms - 1.0) >= 1e-3))
    qcounts = draw(arrays(np.int64, nq, elements=st.integers(1, 60)))
    return vecs, counts, qvecs, qcounts


weights_st = st.builds(
    Weights,
    a=st.floats(-0.5, 0.5),
    b=st.floats(-0.5, 0.5),
    feature=st.sampled_from(FEATURES),
    mode=st.sampled_from(MODES),
    epsilon=st.floats(0.0, 0.1),
    clip=st.one_of(st.none(), st.floats(0.5, 5.0)),
    squash=st.booleans(),
)


def build(vecs, counts, weights: Weights, index_type: str = "flat") -> NormIndex:
    index = NormIndex(dim=vecs.shape[1], weights=weights, index_type=index_type)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(len(vecs))])
    return index


def brute_force(index: NormIndex, raw: dict[str, np.ndarray], q: np.ndarray, qcount: int) -> dict[str, float]:
    """Blended score of every live document, from the index's public state and numpy only."""
    ids = index.ids()
    recs = index.get(ids)
    w = index.weights
    d = np.stack([raw[i] for i in ids]).astype(np.float64)
    cos = (d / np.linalg.norm(d, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    g = w.shape(index.calibrator.transform(np.array([r.norm for r in recs]),
                                           np.array([r.token_count for r in recs]), w.feature))
    if w.b == 0.0:
        wq = w.a
    else:
        qcal = index.query_calibrator or index.calibrator
        wq = float(w.query_weight(qcal.transform(np.linalg.norm(q.astype(np.float64)), qcount, w.feature))[0])
    if w.mode == "additive":
        s = cos + wq * g
    elif w.mode == "tiebreak":
        s = cos + w.epsilon * np.sign(wq) * (percentile(g) - 0.5)
    else:
        s = cos * (1.0 + wq * (percentile(g) - 0.5))
    return dict(zip(ids, s.tolist()))


def assert_top_k(hits, bf: dict[str, float], k: int) -> None:
    """``hits`` is a correct top-k of ``bf``; with ties, any of the tied documents may fill a place."""
    tol = 1e-5 * max(1.0, max(abs(v) for v in bf.values()))
    assert len(hits) == min(k, len(bf))
    ids = [h.id for h in hits]
    assert len(set(ids)) == len(ids)
    for h in hits:
        assert abs(h.score - bf[h.id]) <= tol, (h.id, h.score, bf[h.id])
    assert all(hits[j].score >= hits[j + 1].score - tol for j in range(len(hits) - 1))
    kth = sorted(bf.values(), reverse=True)[len(hits) - 1]
    assert abs(hits[-1].score - kth) <= tol
    left_out = [v for i, v in bf.items() if i not in set(ids)]
    assert all(v <= hits[-1].score + tol for v in left_out)


@SETTINGS
@given(data=corpora(), weights=weights_st, k_frac=st.floats(0, 1))
def test_blended_top_k_equals_brute_force(data, weights, k_frac):
    vecs, counts, qvecs, qcounts = data
    index = build(vecs, counts, weights)
    index.calibrate_queries(norms=np.linalg.norm(qvecs.astype(np.float64), axis=1), token_counts=qcounts)
    raw = {f"d{i}": vecs[i] for i in range(len(vecs))}
    k = max(1, round(k_frac * len(vecs)))
    results = index.search_batch(list(qvecs), k, query_token_counts=qcounts.tolist())
    for q, qc, hits in zip(qvecs, qcounts, results):
        assert_top_k(hits, brute_force(index, raw, q, int(qc)), k)
        for h in hits:  # the explanation adds up
            cos = float(raw[h.id].astype(np.float64) @ q / np.linalg.norm(raw[h.id]) / np.linalg.norm(q))
            assert abs(h.cosine - cos) <= 1e-5 * max(1.0, abs(h.score))


@SETTINGS
@given(data=corpora(min_n=3), weights=weights_st, index_type=st.sampled_from(["flat", "hnsw", "ivf"]),
       drop=st.data())
def test_deleted_ids_never_come_back(data, weights, index_type, drop):
    vecs, counts, qvecs, qcounts = data
    n = len(vecs)
    index = build(vecs, counts, weights.replace(b=0.0), index_type)
    gone = drop.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    index.delete([f"d{i}" for i in sorted(gone)])
    deleted = {f"d{i}" for i in gone}
    assert len(index) == n - len(gone) and not deleted & set(index.ids())
    raw = {f"d{i}": vecs[i] for i in range(n) if i not in gone}
    k = len(index)  # the widest search there is
    for q, qc in zip(qvecs, qcounts):
        hits = index.search(q, k)
        assert not deleted & {h.id for h in hits}
        if index_type == "flat":
            assert_top_k(hits, brute_force(index, raw, q, int(qc)), k)
        with_filter = index.search(q, k, filter=lambda m: True)
        assert not deleted & {h.id for h in with_filter}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=corpora(), weights=weights_st, index_type=st.sampled_from(["flat", "hnsw", "ivf"]),
       n_deleted=st.integers(0, 2))
def test_save_load_is_the_identity(data, weights, index_type, n_deleted):
    vecs, counts, qvecs, qcounts = data
    index = build(vecs, counts, weights, index_type)
    index.calibrate_queries(norms=np.linalg.norm(qvecs.astype(np.float64), axis=1), token_counts=qcounts)
    if n_deleted and len(index) > n_deleted:
        index.delete(index.ids()[:n_deleted])
    k = len(index)
    with tempfile.TemporaryDirectory() as tmp:
        index.save(tmp + "/idx")
        loaded = NormIndex.load(tmp + "/idx")
    assert loaded.ids() == index.ids()
    assert loaded.get(loaded.ids()) == index.get(index.ids())
    assert loaded.weights == index.weights
    assert loaded.calibrator == index.calibrator and loaded.query_calibrator == index.query_calibrator
    opts = dict(query_token_counts=qcounts.tolist())
    assert loaded.search_batch(list(qvecs), k, **opts) == index.search_batch(list(qvecs), k, **opts)


@SETTINGS
@given(norms=arrays(np.float64, st.integers(1, 200), elements=st.floats(0.05, 50)),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_calibration_is_invariant_to_corpus_order(norms, seed, data):
    counts = data.draw(arrays(np.int64, norms.size, elements=st.integers(1, 512)))
    perm = np.random.default_rng(seed).permutation(norms.size)
    a = NormCalibrator().fit(norms, counts)
    b = NormCalibrator().fit(norms[perm], counts[perm])
    assert a.to_dict() == b.to_dict()
    for feat in FEATURES:
        assert np.array_equal(a.transform(norms, counts, feat)[perm], b.transform(norms[perm], counts[perm], feat))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=corpora(min_n=4), weights=weights_st, seed=st.integers(0, 2**32 - 1))
def test_index_is_invariant_to_corpus_order(data, weights, seed):
    """Adding the same documents in another order gives the same calibration and the same scores."""
    vecs, counts, qvecs, qcounts = data
    perm = np.random.default_rng(seed).permutation(len(vecs))
    a = build(vecs, counts, weights.replace(b=0.0))
    b = NormIndex(dim=vecs.shape[1], weights=weights.replace(b=0.0))
    b.add_vectors(vecs[perm], counts[perm], ids=[f"d{i}" for i in perm])
    assert a.calibrator == b.calibrator
    k = len(vecs)
    for q in qvecs:
        sa = {h.id: h.score for h in a.search(q, k)}
        sb = {h.id: h.score for h in b.search(q, k)}
        assert sa.keys() == sb.keys()
        assert all(abs(sa[i] - sb[i]) <= 1e-5 * max(1.0, abs(sa[i])) for i in sa)
