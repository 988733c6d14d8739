"""Checks every vector batch passes before it touches a calibrator or an index."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from normrank.errors import (
    DimensionMismatchError,
    EmptyCorpusError,
    InvalidVectorError,
    UnitNormError,
)

#: Norms closer to 1 than this (all of them) mean the vectors were normalised.
UNIT_NORM_TOLERANCE = 1e-3
#: A relative spread of norms below this means the norm cannot rank anything.
MIN_RELATIVE_SPREAD = 1e-4

RAW_VECTORS_HINT = (
    "normrank needs raw, pre-normalisation embeddings: encode with normrank.RawEncoder, "
    "or build the sentence-transformers model without its Normalize module "
    "(SentenceTransformer(modules=[m for m in model if type(m).__name__ != 'Normalize'])). "
    "Hosted embedding APIs (OpenAI, TEI, ...) return unit vectors and carry no norm signal."
)


def as_matrix(vectors: np.ndarray | Sequence[Sequence[float]], dim: int | None = None) -> np.ndarray:
    """Return a C-contiguous float32 (n, dim) copy, refusing anything that would corrupt an index."""
    arr = np.array(vectors, dtype=np.float32, copy=True)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise DimensionMismatchError(f"expected a 2-D array of vectors, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise EmptyCorpusError("no vectors given: the batch is empty")
    if dim is not None and arr.shape[1] != dim:
        raise DimensionMismatchError(
            f"dimension mismatch: got vectors of dimension {arr.shape[1]}, expected {dim}"
        )
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise InvalidVectorError(f"vectors contain NaN or infinity (rows {rows})")
    norms = np.linalg.norm(arr, axis=1)
    zero = norms <= 1e-12
    if zero.any():
        rows = np.flatnonzero(zero)[:5].tolist()
        raise InvalidVectorError(f"all-zero vectors have no direction and no norm (rows {rows})")
    return np.ascontiguousarray(arr)


def check_norm_signal(norms: np.ndarray) -> None:
    """Refuse unit-length or constant-norm vectors, which make every norm feature zero."""
    norms = np.asarray(norms, dtype=np.float64)
    if norms.size == 0:
        raise EmptyCorpusError("no vectors given: the batch is empty")
    if np.all(np.abs(norms - 1.0) < UNIT_NORM_TOLERANCE):
        raise UnitNormError(
            f"the embeddings are already unit length (norms {norms.min():.6f}..{norms.max():.6f}), "
            f"so their norm carries no signal. {RAW_VECTORS_HINT}"
        )
    if norms.size >= 2:
        spread = (norms.max() - norms.min()) / max(float(np.mean(norms)), 1e-12)
        if spread < MIN_RELATIVE_SPREAD:
            raise UnitNormError(
                f"the embeddings all have the same norm ({np.mean(norms):.6f}, relative spread "
                f"{spread:.2e}), so their norm carries no signal. {RAW_VECTORS_HINT}"
            )
