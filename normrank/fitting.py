"""Choosing the blend from labelled queries without ever making ranking worse.

The grid is cheap because every candidate blend is scored on the same cosine
top-``depth`` lists: for each (feature, a, b) we re-sort those lists and take the
per-query nDCG@10 (normrank.metrics, trec_eval's definitions) once, which gives a matrix [blend x query].
Cross-validation is then just averaging rows of that matrix.

"Never harm": the best blend on all training queries is kept only if the
out-of-fold choice (choose on k-1 folds, score on the held-out fold) beats cosine
on the held-out queries by a one-sided paired t-test at ``alpha`` and by at least
``min_gain``. Otherwise the fit returns plain cosine (``a = b = 0``) and says why.
The prototype measured gains of at most about +0.01 nDCG@10 for the simple blends
on MiniLM, so this test usually (and rightly) says no on small query sets.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from normrank._validation import check_option, is_blank_text
from normrank.calibration import FEATURES
from normrank.candidate_set import CandidateSet
from normrank.datasets import MAX_GRADE
from normrank.errors import (
    EmptyCorpusError,
    EmptyTextError,
    InvalidArgumentError,
    UnknownIdError,
)
from normrank.index_base import fit_query_calibration
from normrank.metrics import has_relevant, per_query
from normrank.scoring import MODES, Weights, blend

logger = logging.getLogger(__name__)

#: Weights are on the scale of cosine gaps between neighbouring hits (~0.005-0.05).
DEFAULT_GRID: tuple[float, ...] = (0.0, 0.0025, -0.0025, 0.005, -0.005, 0.01, -0.01, 0.02, -0.02, 0.04, -0.04)


@dataclass(frozen=True)
class FitReport:
    """What the fit chose, and the evidence for it."""

    weights: Weights
    accepted: bool
    reason: str
    n_queries: int
    cosine_ndcg: float
    best_train_ndcg: float
    best_candidate: dict[str, Any]
    cv_blend_ndcg: float
    cv_gain: float
    p_value: float
    folds: int
    grid_size: int
    per_query_gain: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("per_query_gain")
        return d


def _grid(features: Sequence[str], modes: Sequence[str], grid_a: Sequence[float], grid_b: Sequence[float],
          epsilons: Sequence[float], base: Weights) -> list[Weights]:
    out = [base.replace(a=0.0, b=0.0)]
    for mode in modes:
        for feat in features:
            if mode == "tiebreak":
                for eps in epsilons:
                    for a in (1.0, -1.0):
                        out.append(base.replace(feature=feat, mode=mode, a=a, b=0.0, epsilon=eps))
                continue
            for a in grid_a:
                for b in grid_b:
                    if a == 0.0 and b == 0.0:
                        continue
                    out.append(base.replace(feature=feat, mode=mode, a=float(a), b=float(b)))
    return out


def score_grid(cands: CandidateSet, qids: Sequence[str], qrels: Mapping[str, Mapping[str, int]],
               grid: Sequence[Weights], k: int = 10) -> np.ndarray:
    """nDCG@k of every blend in ``grid`` for every query: shape (len(grid), len(qids))."""
    out = np.zeros((len(grid), len(qids)))
    doc_ids = [np.array(row, dtype=object) for row in cands.doc_ids]
    for gi, w in enumerate(grid):
        g = w.shape(cands.doc_features[w.feature])
        wq = (w.query_weight(cands.query_features[w.feature]) if w.b != 0.0 else np.full(len(qids), w.a))
        scores = blend(cands.cosine, g, wq[:, None], w)
        run: dict[str, dict[str, float]] = {}
        for qi, q in enumerate(qids):
            n = len(doc_ids[qi])
            s = scores[qi, :n]
            top = np.lexsort((np.arange(n), -s))[:k]
            # trec_eval sorts by score: give strictly decreasing scores in our order.
            run[q] = {str(doc_ids[qi][j]): float(k - r) for r, j in enumerate(top)}
        res = per_query(qrels, run, f"ndcg@{k}" if k in (10, 100) else "ndcg@10")
        out[gi] = [res[q] for q in qids]
    return out


def select(matrix: np.ndarray, train: np.ndarray, grid: Sequence[Weights]) -> int:
    """Best blend on the ``train`` queries; ties go to the earlier (simpler, cosine first) entry."""
    means = matrix[:, train].mean(axis=1)
    return int(np.flatnonzero(means >= means.max() - 1e-12)[0])


def folds_used(folds: int, n_queries: int) -> int:
    """The folds a cross-validation over ``n_queries`` runs: at most one per query, at least 2."""
    return max(2, min(folds, n_queries))


def cross_validated_choice(matrix: np.ndarray, grid: Sequence[Weights], folds: int, seed: int) -> np.ndarray:
    """Out-of-fold nDCG per query: each fold scored with the blend chosen on the other folds."""
    nq = matrix.shape[1]
    folds = folds_used(folds, nq)
    order = np.random.default_rng(seed).permutation(nq)
    oof = np.zeros(nq)
    for f in range(folds):
        held = order[f::folds]
        train = np.setdiff1d(order, held)
        oof[held] = matrix[select(matrix, train, grid), held]
    return oof


def fit_candidates(
    cands: CandidateSet,
    qids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    features: Sequence[str] = FEATURES,
    modes: Sequence[str] = ("additive",),
    grid_a: Sequence[float] = DEFAULT_GRID,
    grid_b: Sequence[float] = DEFAULT_GRID,
    epsilons: Sequence[float] = (0.005, 0.01, 0.02),
    folds: int = 5,
    alpha: float = 0.05,
    min_gain: float = 0.0,
    seed: int = 0,
    base: Weights | None = None,
) -> FitReport:
    """Fit on precomputed candidates (``qids`` in the order of ``cands``)."""
    opts = check_fit_options(features=features, modes=modes, grid_a=grid_a, grid_b=grid_b, epsilons=epsilons,
                             folds=folds, alpha=alpha, min_gain=min_gain, seed=seed)
    features, modes, grid_a, grid_b, epsilons = (opts["features"], opts["modes"], opts["grid_a"], opts["grid_b"],
                                                 opts["epsilons"])
    folds, alpha, min_gain, seed = opts["folds"], opts["alpha"], opts["min_gain"], opts["seed"]
    if not qids:
        raise EmptyCorpusError("no labelled queries to fit on")
    if len(qids) < 2:  # cross-validation holds queries out: one query leaves nothing to choose a blend on
        raise InvalidArgumentError(f"a fit needs at least 2 labelled queries with a relevant document, got "
                                   f"{len(qids)}; label more queries (normrank keeps plain cosine until then)")
    if not cands.query_features:  # no query token counts: the query-conditioned part cannot be fitted
        grid_b = (0.0,)
    grid = _grid(features, modes, grid_a, grid_b, epsilons, base or Weights())
    matrix = score_grid(cands, qids, qrels, grid)
    all_q = np.arange(len(qids))
    best = select(matrix, all_q, grid)
    oof = cross_validated_choice(matrix, grid, folds, seed)
    base_scores = matrix[0]
    delta = oof - base_scores
    if np.allclose(delta, 0.0):
        p = 1.0
    else:
        p = float(stats.ttest_rel(oof, base_scores, alternative="greater").pvalue)
    gain = float(delta.mean())
    accepted = best != 0 and gain > min_gain and p < alpha
    if best == 0:
        reason = "plain cosine was the best blend on the training queries"
    elif accepted:
        reason = f"cross-validated gain {gain:+.4f} nDCG@10 (one-sided paired t-test p={p:.3g} < {alpha})"
    else:
        reason = (f"kept plain cosine: the cross-validated gain {gain:+.4f} nDCG@10 (p={p:.3g}) did not pass "
                  f"p < {alpha} and gain > {min_gain}")
    chosen = grid[best] if accepted else grid[0]
    return FitReport(
        weights=chosen, accepted=accepted, reason=reason, n_queries=len(qids),
        cosine_ndcg=float(base_scores.mean()), best_train_ndcg=float(matrix[best].mean()),
        best_candidate=grid[best].to_dict(),
        cv_blend_ndcg=float(oof.mean()), cv_gain=gain, p_value=p, folds=folds_used(folds, len(qids)),
        grid_size=len(grid),
        per_query_gain=dict(zip(qids, delta.tolist())),
    )


def _choices(name: str, value: Any, allowed: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgumentError(f"{name} must be a list drawn from {list(allowed)}, got {value!r}")
    out = tuple(value)
    for v in out:
        if v not in allowed:
            kind = "scoring mode" if name == "modes" else "norm feature"
            raise InvalidArgumentError(f"unknown {kind} {v!r}; choose one of {list(allowed)}")
    if not out:
        raise InvalidArgumentError(f"{name} is empty; give at least one of {list(allowed)}")
    return out


def _numbers(name: str, value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgumentError(f"{name} must be a list of finite numbers, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) \
                or not math.isfinite(float(v)):
            raise InvalidArgumentError(f"{name} must be a list of finite numbers, got {v!r} in it")
        out.append(float(v))
    if not out:
        raise InvalidArgumentError(f"{name} is empty; give at least one number")
    return tuple(out)


def check_fit_options(**options: Any) -> dict[str, Any]:
    """Check the fit options that are given (types and ranges) before any work or change is made.

    Returns them normalised (NumPy integers as ints, lists as tuples); ``fit(folds="five")`` is an
    :class:`~normrank.errors.InvalidArgumentError` naming the option, not a TypeError deep in the fit.
    """
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name in ("features", "modes"):
            out[name] = _choices(name, value, FEATURES if name == "features" else MODES)
        elif name in ("grid_a", "grid_b", "epsilons"):
            out[name] = _numbers(name, value)
        elif name in ("folds", "alpha", "min_gain", "seed", "depth"):
            out[name] = check_option(name, value)
            if name == "alpha" and out[name] <= 0.0:  # 0 would make every fit keep cosine, in silence (1: no gate)
                raise InvalidArgumentError(f"alpha must be a significance level in (0, 1] (1 = no significance gate), "
                                           f"got {value!r}")
            if name == "depth" and out[name] < FIT_MIN_DEPTH:
                raise InvalidArgumentError(f"depth must be at least {FIT_MIN_DEPTH} for a fit (nDCG@10 over fewer "
                                           f"candidates misreports every blend), got {value!r}")
        else:
            out[name] = value
    return out


def check_fit_kwargs(kwargs: Mapping[str, Any], *, depth: bool = False) -> dict[str, Any]:
    """Options for :func:`fit_candidates` (and ``depth`` where the caller takes it), checked and normalised;
    an unknown name is an ``InvalidArgumentError`` listing the allowed ones, not a ``TypeError``."""
    allowed = set(inspect.signature(fit_candidates).parameters) - {"cands", "qids", "qrels", "base"}
    allowed |= {"depth"} if depth else set()
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise InvalidArgumentError(f"unknown fit options {unknown}; allowed: {sorted(allowed)}")
    return check_fit_options(**kwargs)


#: Fewest cosine candidates per query a fit scores: nDCG@10 is computed over them.
FIT_MIN_DEPTH = 10


def _whole_grade(g: Any) -> bool:
    """An int, or a float that is whole (pandas reads a score column as 2.0), of magnitude at most
    :data:`MAX_GRADE`; never a bool."""
    if isinstance(g, (bool, np.bool_)):
        return False
    if isinstance(g, (int, np.integer)):
        return abs(int(g)) <= MAX_GRADE
    return isinstance(g, (float, np.floating)) and math.isfinite(g) and float(g).is_integer() and abs(g) <= MAX_GRADE


def check_qrels(qrels: Mapping[str, Mapping[str, int]], queries: Mapping[str, str], doc_ids: set[str] | None,
                missing_ok: Iterable[str] = ()) -> None:
    """Name qrels entries that point at unknown queries or documents, or whose grade is not a whole number
    (``int()`` turned 0.5 into 0, so a query judged that way silently had no relevant document).

    ``missing_ok`` lists documents known to be absent on purpose (e.g. empty texts that were
    skipped): they stay in the qrels, so metrics still count them as missed.
    """
    bad = [(q, d, g) for q, docs in qrels.items() for d, g in docs.items() if not _whole_grade(g)]
    if bad:
        raise InvalidArgumentError(f"qrels grades must be whole numbers of magnitude at most 2**53 (0 = not "
                                   f"relevant); query {bad[0][0]!r}, document {bad[0][1]!r} has {str(bad[0][2])[:40]}")
    unknown_q = [q for q in qrels if q not in queries]
    if unknown_q:
        raise UnknownIdError(f"qrels name {len(unknown_q)} unknown query ids, e.g. {unknown_q[:3]}")
    if doc_ids is not None:
        allowed = set(missing_ok)
        unknown_d = sorted({d for docs in qrels.values() for d in docs if d not in doc_ids and d not in allowed})
        if unknown_d:
            raise UnknownIdError(f"qrels name {len(unknown_d)} document ids not in the index, e.g. {unknown_d[:3]}")


def fit_basis(index: Any) -> tuple[Weights, dict[str, Any]]:
    """What a fit is computed from: the weights (their feature, mode, clip) and the document calibration.

    ``_publish_fit`` compares them again under the lock: a ``set_weights`` or ``recalibrate`` from another
    thread or process while the fit ran was silently undone by the fit's weights (2 of 10 trials on FAISS,
    8 of 10 on pgvector); now the fit refuses to publish (:class:`~normrank.errors.ConcurrentUpdateError`).
    """
    return index.weights, index.calibrator.to_dict()


def fit_index(index: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *,
              depth: int = 100, calibrate_queries: bool = True, apply: bool = True,
              missing_ok: Iterable[str] = (), **kwargs: Any) -> FitReport:
    """Fit ``index``'s blend on labelled queries, and (by default) apply it.

    ``index`` is a :class:`~normrank.store.NormIndex` or the pgvector backend's index (anything
    with ``encoder``, ``ids``, ``weights``, ``cosine_candidates`` and ``_publish_fit``). Nothing
    changes until the fit is done: the new query calibration (``calibrate_queries``) and the
    chosen weights are then published together (``_publish_fit``), so a concurrent search sees
    the state before or after the fit, never a mix; a failed fit changes nothing. With
    ``apply=False`` the index is left as it was and only the report is returned.
    """
    kwargs = check_fit_kwargs(kwargs)
    depth = check_fit_options(depth=depth)["depth"]
    check_qrels(qrels, queries, set(index.ids()), missing_ok)
    qids = [q for q in has_relevant(qrels)]
    if not qids:
        raise EmptyCorpusError("no query in the qrels has a relevant document")
    blank = [q for q in qids if not isinstance(queries[q], str) or is_blank_text(queries[q])]
    if blank:  # named by query id, not by position in the batch
        raise EmptyTextError(f"{len(blank)} labelled queries have no text to encode, e.g. {blank[:3]}")
    vectors, counts = index.encoder.encode_with_counts([queries[q] for q in qids])
    qnorms = np.linalg.norm(np.asarray(vectors, dtype=np.float64), axis=1)
    query_calibrator = fit_query_calibration(qnorms, counts) if calibrate_queries else None
    started = fit_basis(index)  # what the candidates are computed from; checked again when publishing
    base = started[0].replace(a=0.0, b=0.0)
    # The qrels checked again against the documents the candidates are computed from (one state, under the
    # index's lock where it has one): a delete while the queries were encoded gave a report on a state that
    # never was, neither "fit, then delete" nor the UnknownIdError of "delete, then fit".
    with getattr(index, "_lock", None) or contextlib.nullcontext():
        cands = index.cosine_candidates(list(vectors), depth, query_token_counts=counts.tolist())
        present = set(index.ids())
    check_qrels(qrels, queries, present, missing_ok)
    if query_calibrator is not None:  # the features under the calibration this fit will publish
        cands.query_features = {f: query_calibrator.transform(qnorms, counts, f) for f in FEATURES}
    report = fit_candidates(cands, qids, qrels, base=base, **kwargs)
    if apply:
        index._publish_fit(report.weights, query_calibrator, started)
    logger.info("fit: %s", report.reason)
    return report
