"""A disk cache of encoded texts, so repeated evaluation does not re-encode a corpus.

Keyed by the encoder's fingerprint (model files and settings) and a hash of every
text, stored as plain ``.npz`` (never pickle) in ``$NORMRANK_CACHE`` or the user's
cache folder (``$XDG_CACHE_HOME/normrank``, default ``~/.cache/normrank``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from normrank.encoders import RawEncoder

logger = logging.getLogger(__name__)
CACHE_ENV = "NORMRANK_CACHE"


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "normrank"


def cache_key(encoder: RawEncoder, texts: Sequence[str]) -> str:
    h = hashlib.sha256(encoder.fingerprint.encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()[:32]


def encode_cached(encoder: RawEncoder, texts: Sequence[str], *, show_progress: bool | None = None,
                  folder: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``encoder.encode_with_counts(texts)``, read from or written to the cache."""
    folder = folder or cache_dir()
    path = folder / f"{cache_key(encoder, texts)}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as data:
                vecs, counts = data["vectors"], data["token_counts"]
            if vecs.shape[0] == len(texts):
                return vecs, counts
        except (OSError, ValueError, KeyError):
            logger.warning("ignoring unreadable cache file %s", path)
    vecs, counts = encoder.encode_with_counts(texts, show_progress=show_progress)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".npz", delete=False) as tmp:
            np.savez(tmp, vectors=vecs, token_counts=counts)
        os.replace(tmp.name, path)
    except OSError as exc:
        logger.warning("could not write the encoding cache at %s: %s", folder, exc)
    return vecs, counts
