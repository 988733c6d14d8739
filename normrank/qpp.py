"""Query performance prediction and adaptive k: how sure is a result list, and how deep to read it?

Classic score-based predictors, computed from the cosine scores a search returns:

* ``max score``: the top cosine;
* NQC (Shtok et al. 2012): the spread of the top scores over the query's score against the
  whole corpus (here the cosine with the corpus centroid);
* WIG (Zhou & Croft 2007): how far the top-5 scores sit above the corpus score, per
  square root of query length.

``benchmarks/research.py`` measured whether the query's own calibrated norm (its
"specificity") predicts per-query nDCG@10 as well as these do, using all-MiniLM-L6-v2
(Spearman on scifact / cranfield / cisi):

* the query norm feature does not predict: +0.10 (p = 0.09) / +0.02 / +0.02;
* max score does: +0.35 / +0.22 / +0.40;
* NQC does too: +0.11 / +0.40 / +0.31.

So search results carry no "query specificity" and no confidence derived from it. Read
``hits[0].cosine`` (max score), or use :func:`assess` on the cosine list.

``allocate_k`` spreads an average budget of ``k`` over queries by a predictor, so that
queries predicted to go badly read deeper (``gamma > 0``) at the same average cost. At
an equal average budget it gave no significant Recall gain with any predictor, so it is
not wired into search. It is kept so the experiment can be re-run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from normrank.errors import InvalidArgumentError


def nqc(top_scores: np.ndarray, corpus_score: np.ndarray | float, k: int = 100) -> np.ndarray:
    """Normalised Query Commitment: ``std(top-k scores) / |corpus score|`` per row (NaN scores ignored)."""
    s = np.atleast_2d(np.asarray(top_scores, dtype=np.float64))[:, :k]
    c = np.abs(np.asarray(corpus_score, dtype=np.float64))
    return np.nanstd(s, axis=1) / np.maximum(c, 1e-6)


def wig(top_scores: np.ndarray, corpus_score: np.ndarray | float, query_lengths: np.ndarray | float,
        k: int = 5) -> np.ndarray:
    """Weighted Information Gain: ``(mean top-k score - corpus score) / sqrt(query length)`` per row."""
    s = np.atleast_2d(np.asarray(top_scores, dtype=np.float64))[:, :k]
    ln = np.maximum(np.asarray(query_lengths, dtype=np.float64), 1.0)
    return (np.nanmean(s, axis=1) - np.asarray(corpus_score, dtype=np.float64)) / np.sqrt(ln)


def allocate_k(z: np.ndarray, budget: float, gamma: float, max_k: int, min_k: int = 1) -> np.ndarray:
    """Per-query depths ``~ exp(-gamma z)`` whose mean is as close to ``budget`` as integers allow.

    ``z`` is a standardised predictor (clipped to +-3). ``gamma = 0`` gives every query ``budget``;
    ``gamma > 0`` reads deeper for queries with a low predictor value.
    """
    z = np.clip(np.asarray(z, dtype=np.float64).ravel(), -3.0, 3.0)
    if not (min_k <= budget <= max_k):
        raise InvalidArgumentError(f"budget {budget} must lie in [{min_k}, {max_k}]")
    if not math.isfinite(gamma):
        raise InvalidArgumentError(f"gamma must be finite, got {gamma}")
    if z.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.all(np.isfinite(z)):
        raise InvalidArgumentError("the predictor has NaN or infinite values")
    rel = np.exp(-gamma * z)
    rel = rel / rel.mean()

    def ks(c: float) -> np.ndarray:
        return np.clip(np.rint(c * rel), min_k, max_k).astype(np.int64)

    lo, hi = 0.0, float(max_k) * 4 / max(rel.min(), 1e-9)
    for _ in range(60):
        mid = (lo + hi) / 2
        if ks(mid).mean() < budget:
            lo = mid
        else:
            hi = mid
    best = min((ks(lo), ks(hi)), key=lambda k: abs(k.mean() - budget))
    return best


@dataclass(frozen=True)
class QueryAssessment:
    """What the scores of one result list say about the query (see :func:`assess`)."""

    max_score: float
    nqc: float
    wig: float


def assess(cosines: Sequence[float] | np.ndarray, corpus_score: float, query_length: int) -> QueryAssessment:
    """Score-based predictors for one query from its cosine top list (best first)."""
    s = np.asarray(cosines, dtype=np.float64)[None, :]
    if s.size == 0:
        raise InvalidArgumentError("no scores to assess: the result list is empty")
    return QueryAssessment(float(s[0, 0]), float(nqc(s, corpus_score)[0]),
                           float(wig(s, corpus_score, query_length)[0]))
