"""Per-query retrieval metrics computed exactly as trec_eval computes them, without trec_eval.

``fit`` is core functionality, so its metric must not need the ``eval`` extra
(pytrec-eval). The definitions below follow trec_eval 9 (the code inside pytrec_eval),
and ``tests/test_metrics.py`` checks them equal to pytrec_eval on real runs:

* **ordering**: a run is re-sorted by score, descending; equal scores are ordered by
  document id *descending* (trec_eval's ``strcmp(docno2, docno1)``), never by the order
  the run was given in. Python compares ``str`` by code point, which orders UTF-8 bytes
  the same way ``strcmp`` does.
* **relevant**: judged with a grade >= 1; an unjudged document is non-relevant.
* **nDCG@k** (``ndcg_cut_k``): gain = the judged grade (grades <= 0 give nothing),
  discount ``log2(rank + 1)``; the ideal ranking sorts every judged grade of the query.
* **recall@k**: relevant in the top k / all relevant of the query.
* **MAP**: mean over the query's relevant documents of the precision at each one's rank
  (0 for those not retrieved). **MRR** (``recip_rank``): 1 / rank of the first relevant.

A query with no relevant judgment, or missing from the run, scores 0 (trec_eval drops it;
every caller here wants it counted).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Mapping

from normrank.errors import InvalidArgumentError

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]

_CUT = re.compile(r"^(ndcg|recall|p)@([1-9][0-9]*)$")
#: The named metrics; ``ndcg@K``, ``recall@K`` and ``p@K`` take any positive K.
METRICS = ("ndcg@10", "ndcg@100", "recall@10", "recall@100", "map", "mrr")


def _parse(metric: str) -> tuple[str, int | None]:
    m = _CUT.match(metric.lower())
    if m:
        return m.group(1), int(m.group(2))
    if metric.lower() in ("map", "mrr"):
        return metric.lower(), None
    raise InvalidArgumentError(f"unknown metric {metric!r}; choose one of {list(METRICS)} "
                               "(ndcg@K, recall@K and p@K take any positive K)")


def ranked(scores: Mapping[str, float], k: int | None = None) -> list[str]:
    """Document ids in trec_eval's order: score descending, then id descending; the first ``k``."""
    items = [(float(s), str(d)) for d, s in scores.items() if not math.isnan(float(s))]
    if k is not None and k < len(items):
        return [d for _, d in heapq.nlargest(k, items)]
    items.sort(reverse=True)
    return [d for _, d in items]


def _one(family: str, k: int | None, judged: Mapping[str, int], scores: Mapping[str, float]) -> float:
    n_rel = sum(1 for g in judged.values() if g >= 1)
    if n_rel == 0 or not scores:
        return 0.0
    if family == "ndcg":
        assert k is not None
        top = ranked(scores, k)
        dcg = sum(g / math.log2(r + 2) for r, d in enumerate(top) if (g := judged.get(d, 0)) > 0)
        ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
        idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
        return dcg / idcg if idcg > 0 else 0.0
    if family in ("recall", "p"):
        hits = sum(1 for d in ranked(scores, k) if judged.get(d, 0) >= 1)
        return hits / n_rel if family == "recall" else hits / float(k or 1)
    order = ranked(scores)
    if family == "mrr":
        return next((1.0 / (r + 1) for r, d in enumerate(order) if judged.get(d, 0) >= 1), 0.0)
    found, total = 0, 0.0  # map
    for r, d in enumerate(order):
        if judged.get(d, 0) >= 1:
            found += 1
            total += found / (r + 1)
    return total / n_rel


def per_query(qrels: Qrels, run: Run, metric: str = "ndcg@10") -> dict[str, float]:
    """``{query_id: value}`` for the queries that have judgments; a query missing from the run scores 0.

    Raises
    ------
    InvalidArgumentError
        ``metric`` is not one of :data:`METRICS` (or ``ndcg@K`` / ``recall@K`` / ``p@K``).
    """
    family, k = _parse(metric)
    out: dict[str, float] = {}
    for q, docs in qrels.items():
        if not docs:
            continue
        judged = {str(d): int(g) for d, g in docs.items()}
        out[q] = _one(family, k, judged, run.get(q, {}))
    return out


def has_relevant(qrels: Qrels) -> list[str]:
    """Query ids with at least one positively judged document (the ones metrics are defined on)."""
    return [q for q, docs in qrels.items() if any(int(s) > 0 for s in docs.values())]
