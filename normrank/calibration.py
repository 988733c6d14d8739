"""The length-controlled norm feature.

A raw embedding norm mostly says how long a text is (all-MiniLM-L6-v2: Spearman about
-0.9 against token count), and how norm moves with length and frequency differs
between models. So the usable signal is what is left after length: the residual of
log-norm against a smooth curve of log token count, fitted on this corpus with this
model, then standardised robustly (median / MAD) so one weight scale fits all.

The curve is piecewise linear through per-bin medians of log-norm over quantile bins
of log token count: robust to outliers, flat outside the fitted range (queries are
shorter than documents), order-invariant, and a handful of numbers in JSON.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from normrank.errors import EmptyCorpusError, IndexFormatError, InvalidArgumentError, NotCalibratedError

Feature = Literal["calibrated", "raw"]
FEATURES: tuple[str, ...] = ("calibrated", "raw")
FORMAT_VERSION = 1
_MAD_TO_SD = 1.4826


#: A spread of log-norms (or residuals) below this is rounding, not signal: equal norms computed from
#: float32 vectors differ by ~1e-7, and standardised by that spread they became features of +-2.
_NO_SPREAD = 1e-6


def _robust_scale(x: np.ndarray) -> tuple[float, float]:
    """Median and MAD (as a standard deviation; the standard deviation where most values are equal).
    Without spread the scale is 1, so every feature is ~0: the norm then ranks nothing."""
    x = np.sort(x)  # the std fallback sums: sorted, the fit is bit-identical for any corpus order
    center = float(np.median(x))
    mad = float(np.median(np.abs(x - center))) * _MAD_TO_SD
    if mad <= _NO_SPREAD:
        mad = float(np.std(x))
    return center, mad if mad > _NO_SPREAD else 1.0


@dataclass
class NormCalibrator:
    """Turns (raw norm, token count) into standardised norm features.

    ``transform`` returns the feature named ``"calibrated"`` (length-controlled residual,
    the default) or ``"raw"`` (robust z-score of log-norm, length left in).
    Fit one calibrator on documents and another on queries: their lengths differ.
    """

    max_bins: int = 12
    min_per_bin: int = 20
    knots_x: list[float] = field(default_factory=list)
    knots_y: list[float] = field(default_factory=list)
    raw_center: float = 0.0
    raw_scale: float = 1.0
    resid_center: float = 0.0
    resid_scale: float = 1.0
    n_fitted: int = 0

    def __post_init__(self) -> None:
        """Refuse settings out of range and broken fitted numbers (a tampered state.json) when made."""
        from normrank._validation import check_option

        self.max_bins = check_option("max_bins", self.max_bins)
        self.min_per_bin = check_option("min_per_bin", self.min_per_bin)
        if isinstance(self.n_fitted, bool) or not isinstance(self.n_fitted, (int, np.integer)) or self.n_fitted < 0:
            raise InvalidArgumentError(f"n_fitted must be a whole number >= 0, got {self.n_fitted!r}")
        self.n_fitted = int(self.n_fitted)
        try:
            xs = np.asarray(self.knots_x, dtype=np.float64)
            ys = np.asarray(self.knots_y, dtype=np.float64)
            scalars = np.asarray([self.raw_center, self.raw_scale, self.resid_center, self.resid_scale],
                                 dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"calibration numbers must be finite floats: {exc}") from None
        if xs.ndim != 1 or xs.shape != ys.shape or not (np.isfinite(xs).all() and np.isfinite(ys).all()
                                                        and np.isfinite(scalars).all()):
            raise InvalidArgumentError("calibration knots must be two equally long lists of finite numbers, "
                                       "and its centres and scales finite")
        if self.raw_scale <= 0 or self.resid_scale <= 0:
            raise InvalidArgumentError("calibration scales must be positive")

    @property
    def is_fitted(self) -> bool:
        return self.n_fitted > 0

    def fit(self, norms: np.ndarray, token_counts: np.ndarray) -> NormCalibrator:
        """Fit on a corpus's raw norms and token counts; returns self."""
        log_norm, log_len = self._prepare(norms, token_counts)
        n = log_norm.size
        if n == 0:
            raise EmptyCorpusError("cannot calibrate on an empty corpus")
        n_bins = int(max(1, min(self.max_bins, n // max(self.min_per_bin, 1))))
        edges = np.unique(np.quantile(log_len, np.linspace(0.0, 1.0, n_bins + 1)))
        xs, ys = [], []
        if edges.size < 2:
            xs, ys = [float(log_len[0])], [float(np.median(log_norm))]
        else:
            which = np.clip(np.searchsorted(edges, log_len, side="right") - 1, 0, edges.size - 2)
            for b in range(edges.size - 1):
                sel = which == b
                if sel.any():
                    xs.append(float(np.median(log_len[sel])))
                    ys.append(float(np.median(log_norm[sel])))
        order = np.argsort(xs, kind="stable")
        self.knots_x = [xs[i] for i in order]
        self.knots_y = [ys[i] for i in order]
        self.raw_center, self.raw_scale = _robust_scale(log_norm)
        resid = log_norm - np.interp(log_len, self.knots_x, self.knots_y)
        self.resid_center, self.resid_scale = _robust_scale(resid)
        self.n_fitted = int(n)
        return self

    def transform(self, norms: np.ndarray, token_counts: np.ndarray, feature: Feature = "calibrated") -> np.ndarray:
        """The standardised feature per text (float64), unclipped."""
        if not self.is_fitted:
            raise NotCalibratedError("the calibrator is not fitted: call fit(norms, token_counts) first")
        log_norm, log_len = self._prepare(norms, token_counts)
        if feature == "raw":
            return (log_norm - self.raw_center) / self.raw_scale
        if feature == "calibrated":
            resid = log_norm - np.interp(log_len, self.knots_x, self.knots_y)
            return (resid - self.resid_center) / self.resid_scale
        raise InvalidArgumentError(f"unknown norm feature {feature!r}; choose one of {list(FEATURES)}")

    @staticmethod
    def _prepare(norms: np.ndarray, token_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        norms = np.asarray(norms, dtype=np.float64).ravel()
        counts = np.asarray(token_counts, dtype=np.float64).ravel()
        if norms.shape != counts.shape:
            raise InvalidArgumentError(f"{norms.size} norms but {counts.size} token counts")
        if norms.size and (not np.all(np.isfinite(norms)) or np.any(norms <= 0)):
            raise InvalidArgumentError("norms must be finite and positive")
        if counts.size and not (np.all(counts >= 1) and np.all(np.isfinite(counts))):
            # NaN compares False: refused, not turned into NaN features; an infinite count made a knot at
            # infinity, which searched but saved a calibration no load accepts
            raise InvalidArgumentError("token counts must be numbers >= 1, and finite")
        return np.log(norms), np.log(counts)

    # ----------------------------------------------------------- persistence
    def to_dict(self) -> dict:
        return {"format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> NormCalibrator:
        data = dict(data)
        version = data.pop("format_version", FORMAT_VERSION)
        if version > FORMAT_VERSION:
            raise IndexFormatError(
                f"calibration format version {version} is newer than this normrank understands "
                f"({FORMAT_VERSION}); upgrade normrank"
            )
        try:
            return cls(**data)
        except TypeError as exc:
            raise IndexFormatError(f"calibration data has unexpected fields: {exc}") from exc
        except InvalidArgumentError as exc:
            raise IndexFormatError(f"calibration data is invalid: {exc}") from exc

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NormCalibrator:
        return cls.from_dict(json.loads(Path(path).read_text()))
