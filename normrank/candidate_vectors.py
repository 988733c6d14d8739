"""Raw vectors for candidates another retriever found: reuse, cache, or encode.

The re-ranking adapters (LlamaIndex postprocessor, Haystack ranker) receive documents
whose embeddings are usually missing or unit length (framework embedders normalise).
A stored embedding is reused only when it is raw (the encoder's dimension, not unit
length); otherwise the text is encoded once and kept in an LRU cache keyed by the
document id and a hash of its text, so re-ranking the same passages again is free.
Framework-agnostic, so each adapter maps its own objects to ``(id, text, embedding)``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from normrank._validation import UNIT_NORM_TOLERANCE
from normrank.calibration import NormCalibrator
from normrank.encoders import RawEncoder, default_model_path
from normrank.errors import EmptyTextError, InvalidArgumentError

Candidate = tuple[str, str, Sequence[float] | None]  # (id, text, stored embedding or None)


def model_setting(encoder: RawEncoder) -> str | None:
    """The ``model`` setting that rebuilds ``encoder``: ``None`` for the bundled model (portable)."""
    if encoder.model_name in ("in-memory", str(default_model_path())):
        return None
    return encoder.model_name


def is_raw(vector: Sequence[float] | None, dim: int) -> bool:
    """True when ``vector`` can stand in for a fresh raw encoding: right dimension, not unit length."""
    if vector is None or len(vector) != dim:
        return False
    norm = float(np.linalg.norm(np.asarray(vector, dtype=np.float64)))
    return bool(np.isfinite(norm)) and abs(norm - 1.0) >= UNIT_NORM_TOLERANCE


def calibrator_from_texts(encoder: RawEncoder, texts: Sequence[str]) -> NormCalibrator:
    """A document calibration fitted on representative corpus texts (encodes them)."""
    vectors, counts = encoder.encode_with_counts(list(texts))
    return NormCalibrator().fit(np.linalg.norm(vectors.astype(np.float64), axis=1), counts)


class CandidateVectorCache:
    """Thread-safe LRU of ``(id, text hash) -> (raw vector, token count)``."""

    def __init__(self, size: int = 10_000) -> None:
        if size < 0:
            raise InvalidArgumentError(f"cache_size must be >= 0, got {size}")
        self.size = size
        self._items: OrderedDict[tuple[str, str], tuple[np.ndarray, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def vectors(self, encoder: RawEncoder, candidates: Sequence[Candidate], *,
                kind: str = "document") -> tuple[np.ndarray, np.ndarray]:
        """Raw vectors (n, dim) and token counts (n,) for ``candidates``, encoding only what is new."""
        for cid, text, _ in candidates:
            if not text or not text.strip():
                raise EmptyTextError(f"{kind} {cid!r} has no text to embed; drop it before re-ranking")
        keys = [(cid, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
                for cid, text, _ in candidates]
        found: dict[int, tuple[np.ndarray, int]] = {}
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._items:
                    self._items.move_to_end(key)
                    found[i] = self._items[key]
        dim = encoder.dim
        reuse = [i for i in range(len(candidates)) if i not in found and is_raw(candidates[i][2], dim)]
        if reuse:
            counts = encoder.token_counts([candidates[i][1] for i in reuse])
            for i, c in zip(reuse, counts.tolist()):
                found[i] = (np.asarray(candidates[i][2], dtype=np.float32), int(c))
        todo = [i for i in range(len(candidates)) if i not in found]
        if todo:
            vectors, counts = encoder.encode_with_counts([candidates[i][1] for i in todo])
            for j, i in enumerate(todo):
                found[i] = (vectors[j], int(counts[j]))
        with self._lock:
            for i, key in enumerate(keys):
                self._items[key] = found[i]
                self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        n = len(candidates)
        return (np.stack([found[i][0] for i in range(n)]),
                np.array([found[i][1] for i in range(n)], dtype=np.int64))
