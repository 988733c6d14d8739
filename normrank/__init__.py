"""normrank: norm-aware retrieval. Rank by cosine plus a calibrated, query-conditioned norm term.

Heavy modules (torch via the encoder, FAISS via the store) load on first use, so
``import normrank`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from normrank.errors import (
    BackendError,
    ConcurrentUpdateError,
    ConfigError,
    DatasetError,
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    EmptyTextError,
    IndexFormatError,
    InvalidArgumentError,
    InvalidIdError,
    InvalidMetadataError,
    InvalidTextError,
    InvalidVectorError,
    MissingExtraError,
    MissingTokenCountError,
    ModelLoadError,
    NormRankError,
    NotCalibratedError,
    PersistenceError,
    UnitNormError,
    UnknownIdError,
)

try:
    __version__ = version("normrank")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+local"

_LAZY = {
    "RawEncoder": "normrank.encoders",
    "PooledEncoder": "normrank.pooling",
    "NormCalibrator": "normrank.calibration",
    "NormIndex": "normrank.store",
    "PgVectorNormIndex": "normrank.pgvector_store",
    "Record": "normrank.store",
    "Weights": "normrank.scoring",
    "Hit": "normrank.scoring",
    "HitArrays": "normrank.scoring",
    "FitReport": "normrank.fitting",
    "load_config": "normrank.config",
    "build_index": "normrank.config",
    "NormRankConfig": "normrank.config",
    "load_beir": "normrank.datasets",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'normrank' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "__version__",
    *_LAZY,
    "BackendError",
    "ConcurrentUpdateError",
    "ConfigError",
    "DatasetError",
    "DimensionMismatchError",
    "DuplicateIdError",
    "EmptyCorpusError",
    "EmptyTextError",
    "IndexFormatError",
    "InvalidArgumentError",
    "InvalidIdError",
    "InvalidMetadataError",
    "InvalidTextError",
    "InvalidVectorError",
    "MissingExtraError",
    "MissingTokenCountError",
    "ModelLoadError",
    "NormRankError",
    "NotCalibratedError",
    "PersistenceError",
    "UnitNormError",
    "UnknownIdError",
]
