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


def _demo_fit_data():
    from normrank.datasets import demo_qrels, demo_rows

    rows = demo_rows()
    return ([r["_id"] for r in rows], [r["text"] for r in rows],
            {r["_id"]: r["text"] for r in demo_rows("demo_queries.jsonl")}, demo_qrels())


CHANGED = Weights(a=0.07, feature="raw", mode="tiebreak", clip=2.0)


def _change_midway(fitter, change) -> None:
    """Run ``change()`` right after the fit has computed its candidates, as another thread would."""
    real = fitter.cosine_candidates

    def candidates_then_change(*args, **kwargs):
        out = real(*args, **kwargs)
        change()
        return out

    fitter.cosine_candidates = candidates_then_change


def test_judged_documents_deleted_while_the_queries_encode_are_named(demo_encoded, encoder):
    """The qrels were checked before the queries were encoded, the candidates computed after: a delete of
    judged documents in between gave no error and a report on a state that never was (neither "fit,
    then delete" nor the UnknownIdError of "delete, then fit"). Now the serial answer: UnknownIdError."""
    ids, texts, queries, qrels = _demo_fit_data()
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts, ids=ids, texts=texts)
    victims = list(qrels["q1"]) + list(qrels["q2"])
    real = index.cosine_candidates

    def delete_then_candidates(*args, **kwargs):  # the delete lands after the check, before the candidates
        if victims[0] in index:
            index.delete(victims)
        return real(*args, **kwargs)

    index.cosine_candidates = delete_then_candidates
    with pytest.raises(UnknownIdError, match="qrels name 3 document ids not in the index"):
        index.fit(queries, qrels)
    assert index.weights == Weights()


@pytest.mark.parametrize("change", ["set_weights", "recalibrate"])
def test_a_fit_does_not_undo_a_change_made_while_it_ran(demo_encoded, encoder, change):
    """``fit`` read the weights, fitted, and published weights built on the old ones: a ``set_weights``
    from another thread meanwhile was silently undone. It now refuses to publish, by name."""
    from normrank.errors import ConcurrentUpdateError

    ids, texts, queries, qrels = _demo_fit_data()
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts, ids=ids, texts=texts)
    before_q = index.query_calibrator
    if change == "set_weights":
        _change_midway(index, lambda: index.set_weights(CHANGED))
    else:
        index.add_vectors(vecs[:3] * 1.3, counts[:3], ids=["x1", "x2", "x3"])  # the calibration predates these
        _change_midway(index, index.recalibrate)
    want_weights = CHANGED if change == "set_weights" else Weights()
    with pytest.raises(ConcurrentUpdateError, match="changed while fit"):
        index.fit(queries, qrels)
    assert index.weights == want_weights and index.query_calibrator is before_q  # the change stands, no mix
    del index.cosine_candidates  # no change now: the same fit publishes
    index.fit(queries, qrels)
    assert index.query_calibrator is not before_q


def test_a_fit_does_not_undo_another_connections_set_weights(demo_encoded, encoder, pg_dsn, pg_table_factory):
    from normrank.errors import ConcurrentUpdateError
    from normrank.pgvector_store import PgVectorNormIndex

    ids, texts, queries, qrels = _demo_fit_data()
    vecs, counts = demo_encoded
    table = pg_table_factory("fit")
    fitter = PgVectorNormIndex(pg_dsn, table, encoder)
    other = PgVectorNormIndex(pg_dsn, table, encoder)  # another process, as far as the table knows
    try:
        fitter.add_vectors(vecs, counts, ids=ids, texts=texts)
        _change_midway(fitter, lambda: other.set_weights(CHANGED))
        with pytest.raises(ConcurrentUpdateError, match="weights changed while fit"):
            fitter.fit(queries, qrels)
        assert other.weights == CHANGED and len(other) == len(ids)
        fitter.search(vecs[0], 1, query_token_count=int(counts[0]))  # a handle reads the table's state per call
        assert fitter.weights == CHANGED
    finally:
        fitter.close()
        other.close()


def _small_index(demo_encoded, encoder):
    ids, texts, queries, qrels = _demo_fit_data()
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts, ids=ids, texts=texts)
    return index, queries, qrels


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda ix, q, r: ix.fit(q, {k: r[k] for k in list(r)[:1]}), "InvalidArgumentError", "at least 2 labelled queries"),
    (lambda ix, q, r: ix.fit(q, {k: {d: 0.5 for d in v} for k, v in r.items()}), "InvalidArgumentError",
     "whole numbers"),
    # a grade of 10**308 made nDCG NaN (the report said cosine_ndcg 0.0); 10**400 a bare OverflowError
    (lambda ix, q, r: ix.fit(q, {k: {d: 10**308 for d in v} for k, v in r.items()}), "InvalidArgumentError",
     r"magnitude at most 2\*\*53"),
    (lambda ix, q, r: ix.fit(q, {k: {d: 10**400 for d in v} for k, v in r.items()}), "InvalidArgumentError",
     r"magnitude at most 2\*\*53"),
    (lambda ix, q, r: ix.fit(q, r, depth=3), "InvalidArgumentError", "depth must be at least 10"),
    (lambda ix, q, r: ix.fit(q, r, alpha=0), "InvalidArgumentError", r"alpha must be a significance level in \(0, 1\]"),
    (lambda ix, q, r: ix.fit({**q, next(iter(r)): "   "}, r), "EmptyTextError", "no text to encode, e.g. \\['"),
    (lambda ix, q, r: ix.calibrate_queries("heat"), "InvalidArgumentError", "single string"),
    (lambda ix, q, r: ix.calibrate_queries(norms=np.ones(3) * 2), "InvalidArgumentError", "together"),
])
def test_meaningless_fit_input_is_named_and_changes_nothing(demo_encoded, encoder, call, error, words):
    """One labelled query crashed with IndexError; 0.5 grades became 0; depth 3 misreported nDCG@10;
    alpha 0 made acceptance impossible in silence; a single string calibrated one query per character."""
    from normrank import errors

    index, queries, qrels = _small_index(demo_encoded, encoder)
    with pytest.raises(getattr(errors, error), match=words):
        call(index, queries, qrels)
    assert index.weights == Weights() and index.query_calibrator is None


def test_the_report_gives_the_folds_it_used(demo_encoded, encoder, caplog):
    index, queries, qrels = _small_index(demo_encoded, encoder)
    two = dict(list(qrels.items())[:3])
    report = index.fit(queries, two, folds=1000)
    assert report.folds == 3  # one per query at most, not the 1000 asked for
    assert "fitted on 3 queries" in caplog.text  # and the tiny query calibration is warned about
