"""Norm diagnostics of an index: is there anything in the norm beyond length?

``normrank analyze`` answers this before anyone fits a blend. A raw norm that only
tracks length (or does not vary at all, as with hosted embedders that return unit
vectors) gives the norm term nothing to rank by; the calibrated feature should be
uncorrelated with length and still spread out. The most and least "specific"
documents (highest and lowest calibrated feature) let a user judge by eye what the
feature means on their corpus.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from normrank._validation import is_blank_text

if TYPE_CHECKING:
    from normrank.store import NormIndex

logger = logging.getLogger(__name__)

#: Norms whose relative spread (sd / mean) is below this carry no usable signal.
MIN_NORM_CV = 1e-3
#: |Spearman(norm, length)| above this leaves (almost) nothing beyond length.
MAX_LENGTH_RHO = 0.98
#: Below this many documents the length curve rests on too few points per bin.
MIN_DOCS = 100


@dataclass(frozen=True)
class DocSummary:
    id: str
    norm_feature: float
    norm: float
    token_count: int
    snippet: str


@dataclass
class Analysis:
    """What ``normrank analyze`` reports; ``warnings`` is empty when the norm looks usable."""

    n_docs: int
    norm: dict[str, float]
    token_count: dict[str, float]
    feature: dict[str, float]
    spearman_norm_length: float
    spearman_feature_length: float
    spearman_raw_feature_length: float
    most_specific: list[DocSummary]
    least_specific: list[DocSummary]
    weights: dict[str, Any]
    query_calibrated: bool
    warnings: list[str] = field(default_factory=list)
    #: Documents at the model's window (truncated when encoded): max_tokens, truncated, share.
    truncation: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _summary(x: np.ndarray) -> dict[str, float]:
    q = np.quantile(x, [0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0])
    return {"min": float(q[0]), "p05": float(q[1]), "p25": float(q[2]), "median": float(q[3]),
            "p75": float(q[4]), "p95": float(q[5]), "max": float(q[6]), "mean": float(x.mean()),
            "sd": float(x.std())}


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    rho = stats.spearmanr(x, y).statistic
    return float(rho) if np.isfinite(rho) else 0.0


def index_arrays(index: NormIndex) -> tuple[list[str], np.ndarray, np.ndarray, list[Any]]:
    """(ids, raw norms, token counts, records) of every live document."""
    ids = index.ids()
    recs = index.get(ids)
    return (ids, np.array([r.norm for r in recs], dtype=np.float64),
            np.array([r.token_count for r in recs], dtype=np.int64), recs)


def analyze_index(index: NormIndex, top: int = 5) -> Analysis:
    """Diagnose the norm signal of ``index``'s documents (no encoding, no search).

    Raises
    ------
    EmptyCorpusError
        The index holds no document.
    """
    from normrank.errors import EmptyCorpusError

    if len(index) == 0:
        raise EmptyCorpusError("the index is empty: nothing to analyze")
    ids, norms, counts, recs = index_arrays(index)
    g = index.calibrator.transform(norms, counts, "calibrated")
    graw = index.calibrator.transform(norms, counts, "raw")
    order = np.argsort(-g, kind="stable")
    top = min(top, len(ids))

    def summ(i: int) -> DocSummary:
        r = recs[i]
        text = r.text or str(r.metadata.get("title", "")) or ""
        return DocSummary(ids[i], float(g[i]), float(norms[i]), int(counts[i]), " ".join(text.split())[:100])

    result = Analysis(
        n_docs=len(ids), norm=_summary(norms), token_count=_summary(counts.astype(np.float64)),
        feature=_summary(g), spearman_norm_length=_spearman(norms, counts),
        spearman_feature_length=_spearman(g, counts), spearman_raw_feature_length=_spearman(graw, counts),
        most_specific=[summ(i) for i in order[:top]], least_specific=[summ(i) for i in order[::-1][:top]],
        weights=index.weights.to_dict(), query_calibrated=index.query_calibrator is not None,
    )
    result.truncation = _truncation(index, counts, recs)
    result.warnings.extend(_warnings(result, norms, g))
    return result


def _truncation(index: NormIndex, counts: np.ndarray, recs: list[Any]) -> dict[str, Any]:
    """How many documents were cut at the encoder's window.

    The stored token counts are capped at the window, so a document of exactly the window's length
    looks like a cut one (``analyze`` said 109 where ``index`` had cut 107). The stored texts of those
    at the window, and only those, are tokenised again to tell them apart; without texts the count
    from the stored counts stands (``exact: False``).
    """
    from normrank.encoders import truncation_summary

    encoder = getattr(index, "_encoder", None)
    if encoder is None:  # vectors added without an encoder: their model and its window are unknown
        return {}
    try:
        limit = int(encoder.max_seq_length or encoder.max_tokens)
    except Exception as exc:  # an index of bare vectors whose model cannot be loaded here
        logger.info("truncation not reported: %s", exc)
        return {}
    summary = truncation_summary(counts, limit)
    at_window = np.flatnonzero(counts >= limit).tolist()
    texts = [recs[i].text for i in at_window]
    summary["exact"] = all(isinstance(t, str) and not is_blank_text(t) for t in texts)
    if at_window and summary["exact"]:
        n = encoder.count_truncated(texts)
        summary.update(truncated=n, share=n / counts.size)
    return summary


def _warnings(a: Analysis, norms: np.ndarray, g: np.ndarray) -> list[str]:
    out = []
    cv = float(norms.std() / norms.mean())
    if cv < MIN_NORM_CV:
        out.append(f"the raw norms barely vary (sd/mean = {cv:.2e}): the norm carries no signal here; "
                   "are these unit-normalised embeddings (hosted APIs return those)?")
    elif abs(a.spearman_norm_length) > MAX_LENGTH_RHO:
        out.append(f"the raw norm is almost entirely text length (Spearman {a.spearman_norm_length:+.3f}): "
                   "after calibration little but noise is left for the norm term")
    if np.ptp(g) < 1e-6:
        out.append("the calibrated norm feature is constant: the norm term cannot reorder anything")
    elif abs(a.spearman_feature_length) > 0.3 and a.n_docs < MIN_DOCS:
        # too few documents for the length bins: recalibrating gives the same fit (it was advised, and
        # `normrank recalibrate` then printed the same Spearman and the advice came back)
        out.append(f"the calibrated feature still tracks length (Spearman {a.spearman_feature_length:+.3f}): "
                   f"with only {a.n_docs} documents the calibration has too few length bins to remove it; "
                   "add documents (recalibrating the same ones gives the same fit)")
    elif abs(a.spearman_feature_length) > 0.3:
        out.append(f"the calibrated feature still tracks length (Spearman {a.spearman_feature_length:+.3f}): "
                   "the calibration did not remove length; refit it on all documents: `normrank recalibrate DIR` "
                   "(Python: index.recalibrate())")
    if a.n_docs < MIN_DOCS:
        out.append(f"only {a.n_docs} documents: the length calibration rests on few points; treat it as rough")
    return out


def format_analysis(a: Analysis) -> str:
    """The plain-text report of ``normrank analyze``."""
    n, c, f = a.norm, a.token_count, a.feature
    w = a.weights
    blend = "plain cosine" if w["a"] == 0 and w["b"] == 0 else \
        f"{w['mode']} a={w['a']:+g} b={w['b']:+g} feature {w['feature']}"
    lines = [
        f"{a.n_docs} documents; current blend: {blend}; query calibration: "
        f"{'fitted' if a.query_calibrated else 'not fitted (run normrank fit)'}",
        f"raw norm:      median {n['median']:.4f}  5-95% {n['p05']:.4f}..{n['p95']:.4f}  "
        f"range {n['min']:.4f}..{n['max']:.4f}  sd/mean {n['sd'] / n['mean']:.4f}",
        f"token count:   median {c['median']:.0f}  5-95% {c['p05']:.0f}..{c['p95']:.0f}"
        + (f"  truncated at {a.truncation['max_tokens']}: {a.truncation['truncated']} documents"
           f" ({a.truncation['share']:.1%}"
           f"{'' if a.truncation.get('exact', True) else '; no texts stored: those of exactly that length count too'})"
           if a.truncation else ""),
        *([f"  {a.truncation['truncated']} documents were cut at the model's window: only their beginning is "
           "embedded; index them in chunks (`normrank index` chunks files by default, BEIR and JSONL rows with "
           "--chunk-rows; Python: normrank.chunking.chunk_texts)"] if a.truncation.get("truncated") else []),
        f"calibrated g:  median {f['median']:+.3f}  5-95% {f['p05']:+.3f}..{f['p95']:+.3f}",
        f"Spearman with token count: raw norm {a.spearman_norm_length:+.3f}, "
        f"raw feature {a.spearman_raw_feature_length:+.3f}, calibrated feature {a.spearman_feature_length:+.3f}",
        "",
        "most specific (highest calibrated norm):",
        *[f"  {d.norm_feature:+6.2f} {d.id[:20]:<20} {d.snippet[:70]}" for d in a.most_specific],
        "least specific (lowest calibrated norm):",
        *[f"  {d.norm_feature:+6.2f} {d.id[:20]:<20} {d.snippet[:70]}" for d in a.least_specific],
    ]
    if not a.warnings:
        lines += ["", "the norm varies beyond length: a blend may help; measure with `normrank eval`"]
    return "\n".join(lines)


def plot_analysis(index: NormIndex, path: str | os.PathLike[str]) -> None:
    """Three panels: raw norm histogram, log norm against log length with the calibration curve,
    and the calibrated feature's histogram."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'normrank[bench]'") from exc
    _, norms, counts, _ = index_arrays(index)
    g = index.calibrator.transform(norms, counts, "calibrated")
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    ax[0].hist(norms, bins=50, color="#4477aa")
    ax[0].set(title="raw embedding norm", xlabel="norm", ylabel="documents")
    ax[1].scatter(np.log(counts), np.log(norms), s=3, alpha=0.3, color="#4477aa")
    cal = index.calibrator
    if cal.knots_x:
        ax[1].plot(cal.knots_x, cal.knots_y, color="#cc3311", lw=2, label="length curve")
        ax[1].legend(loc="best")
    rho = _spearman(norms, counts)
    ax[1].set(title=f"norm vs length (Spearman {rho:+.2f})", xlabel="log token count", ylabel="log norm")
    ax[2].hist(g, bins=50, color="#228833")
    ax[2].set(title=f"calibrated g(d) (Spearman w. length {_spearman(g, counts):+.2f})",
              xlabel="g(d)", ylabel="documents")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
