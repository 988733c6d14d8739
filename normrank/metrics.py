"""Per-query retrieval metrics from pytrec_eval (trec_eval's own code), never hand-written."""

from __future__ import annotations

from collections.abc import Mapping

import pytrec_eval

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]

_MEASURES = {"ndcg@10": ("ndcg_cut", "ndcg_cut_10"), "recall@100": ("recall", "recall_100"),
             "ndcg@100": ("ndcg_cut", "ndcg_cut_100"), "recall@10": ("recall", "recall_10"),
             "map": ("map", "map"), "mrr": ("recip_rank", "recip_rank")}


def per_query(qrels: Qrels, run: Run, metric: str = "ndcg@10") -> dict[str, float]:
    """``{query_id: value}`` for the queries that have judgments; a query missing from the run scores 0."""
    try:
        family, key = _MEASURES[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; choose one of {sorted(_MEASURES)}") from None
    judged = {q: {d: int(s) for d, s in docs.items()} for q, docs in qrels.items() if docs}
    evaluator = pytrec_eval.RelevanceEvaluator(judged, {family})
    # trec_eval drops queries with empty runs; give them a zero explicitly.
    results = evaluator.evaluate({q: {d: float(s) for d, s in run.get(q, {}).items()} for q in judged})
    return {q: float(results.get(q, {}).get(key, 0.0)) for q in judged}


def has_relevant(qrels: Qrels) -> list[str]:
    """Query ids with at least one positively judged document (the ones metrics are defined on)."""
    return [q for q, docs in qrels.items() if any(int(s) > 0 for s in docs.values())]
