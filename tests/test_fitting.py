"""Fitting finds a real signal when there is one, and never makes ranking worse when there is not."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from normrank import NormIndex, Weights
from normrank.errors import UnknownIdError
from normrank.fitting import fit_candidates
from normrank.metrics import has_relevant, per_query


def _index(coll, encoder) -> NormIndex:
    index = NormIndex(encoder)
    index.add_vectors(coll.vectors, coll.token_counts, ids=coll.ids)
    return index


@pytest.mark.data
def test_fit_accepts_a_real_norm_signal(cranfield, encoder):
    """Judgments that favour high-g documents must be found, with the right sign."""
    index = _index(cranfield, encoder)
    queries = [cranfield.data.queries[q] for q in sorted(cranfield.data.queries, key=int)][:120]
    qids = [f"q{i}" for i in range(len(queries))]
    cands = index.cosine_candidates(queries, 30)
    g = cands.doc_features["calibrated"]
    qrels = {}
    for i, q in enumerate(qids):
        n = len(cands.doc_ids[i])
        top = np.argsort(-g[i, :n])[:3]
        qrels[q] = {cands.doc_ids[i][j]: 1 for j in top}
    report = fit_candidates(cands, qids, qrels, features=("calibrated",))
    assert report.accepted, report.reason
    assert report.weights.a > 0 and report.cv_gain > 0.05 and report.p_value < 0.05


@pytest.mark.data
def test_fit_keeps_cosine_when_judgments_ignore_the_norm(cranfield, encoder):
    index = _index(cranfield, encoder)
    queries = [cranfield.data.queries[q] for q in sorted(cranfield.data.queries, key=int)][:120]
    qids = [f"q{i}" for i in range(len(queries))]
    cands = index.cosine_candidates(queries, 30)
    # Relevant = the cosine top 3: any norm weight can only hurt.
    qrels = {q: {d: 1 for d in cands.doc_ids[i][:3]} for i, q in enumerate(qids)}
    report = fit_candidates(cands, qids, qrels)
    assert not report.accepted and report.weights == Weights()
    assert "cosine" in report.reason


@pytest.mark.data
@pytest.mark.parametrize("collection", ["cranfield", "cisi"])
def test_outer_folds_are_never_significantly_worse_than_cosine(collection, request, encoder):
    coll = request.getfixturevalue(collection)
    index = _index(coll, encoder)
    qrels = coll.data.qrels
    qids = sorted(has_relevant(qrels))
    texts = [coll.data.queries[q] for q in qids]
    vecs, counts = encoder.encode_with_counts(texts)
    index.calibrate_queries(norms=np.linalg.norm(vecs, axis=1), token_counts=counts)
    cands = index.cosine_candidates(list(vecs), 100, query_token_counts=counts.tolist())
    order = np.random.default_rng(0).permutation(len(qids))
    blend_scores, cos_scores = {}, {}
    for f in range(5):
        held = order[f::5]
        train = np.setdiff1d(order, held)
        rep = fit_candidates(cands.subset(train), [qids[i] for i in train], qrels)
        for weights, sink in ((rep.weights, blend_scores), (Weights(), cos_scores)):
            index.set_weights(weights)
            hits = index.search_batch([vecs[i] for i in held], 10, query_token_counts=[int(counts[i]) for i in held])
            run = {qids[i]: {h.id: h.score for h in hs} for i, hs in zip(held, hits)}
            sink.update(per_query({qids[i]: qrels[qids[i]] for i in held}, run, "ndcg@10"))
    a = np.array([blend_scores[q] for q in qids])
    b = np.array([cos_scores[q] for q in qids])
    p_worse = stats.ttest_rel(a, b, alternative="less").pvalue if not np.allclose(a, b) else 1.0
    assert p_worse >= 0.05, f"{collection}: fitted blend {a.mean():.4f} vs cosine {b.mean():.4f}, p={p_worse:.3g}"


def test_qrels_with_unknown_ids_are_named(demo_encoded, encoder):
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(len(vecs))])
    with pytest.raises(UnknownIdError, match="qrels name 1 document ids not in the index"):
        index.fit({"q1": "stars"}, {"q1": {"d1": 1, "nope": 1}})
    with pytest.raises(UnknownIdError, match="unknown query ids"):
        index.fit({"q1": "stars"}, {"q2": {"d1": 1}})
    assert index.weights == Weights()
