"""Named errors, so callers can catch the exact failure and users read what went wrong.

Every error subclasses :class:`NormRankError` and also the builtin a caller would
reach for first (``ValueError``, ``KeyError``, ``FileNotFoundError``), so existing
``except ValueError`` blocks keep working.
"""

from __future__ import annotations


class NormRankError(Exception):
    """Base class of every error normrank raises on purpose."""


class UnitNormError(NormRankError, ValueError):
    """The vectors have (near) constant norm, so the norm carries no signal."""


class InvalidVectorError(NormRankError, ValueError):
    """A vector holds NaN or infinity, or is all zeros."""


class DimensionMismatchError(NormRankError, ValueError):
    """Vectors do not have the dimension the index or encoder expects."""


class EmptyCorpusError(NormRankError, ValueError):
    """There is nothing to index or calibrate on."""


class EmptyTextError(NormRankError, ValueError):
    """A text is empty or whitespace only: it has no meaning to embed."""


class DuplicateIdError(NormRankError, ValueError):
    """An id is given twice, or is already in the index."""


class UnknownIdError(NormRankError, KeyError):
    """An id is not in the index (or the qrels name ids the collection lacks)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class InvalidIdError(NormRankError, TypeError):
    """Ids must be non-empty strings."""


class InvalidArgumentError(NormRankError, ValueError):
    """An argument is out of range (k <= 0, an unknown mode, ...)."""


class NotCalibratedError(NormRankError, RuntimeError):
    """A calibrator was used before it was fitted."""


class IndexFormatError(NormRankError, ValueError):
    """A saved index is missing files, truncated, altered, or of a newer format."""


class ConfigError(NormRankError, ValueError):
    """The YAML configuration has an unknown key, a wrong type or a bad value."""


class ModelLoadError(NormRankError, OSError):
    """The embedding model could not be loaded (missing path, no tokenizer, ...)."""


class DatasetError(NormRankError, ValueError):
    """A BEIR folder is incomplete or its qrels name unknown ids."""


class BackendError(NormRankError, RuntimeError):
    """A storage backend cannot be used: server unreachable, extension missing, or a foreign table."""


class InvalidTextError(InvalidArgumentError):
    """A text, id or metadata string cannot be stored: a lone surrogate (not UTF-8), or NUL where refused."""


class MissingTokenCountError(InvalidArgumentError):
    """A query vector came without its token count, which the query-conditioned weight (``b != 0``) needs."""


class InvalidMetadataError(InvalidArgumentError):
    """Metadata is not a JSON object of finite values, or is nested too deep or too large."""


class PersistenceError(NormRankError, OSError):
    """Writing a saved index failed (disk full, no permission, I/O error); the previous save is intact."""


class MissingExtraError(NormRankError, ImportError):
    """An optional feature needs a package of an extra that is not installed (the message names the extra)."""


class ConcurrentUpdateError(NormRankError, RuntimeError):
    """Another thread or process changed what an operation was computed from (a fit's weights or document
    calibration) before it could publish; nothing was published, and running it again is safe."""
