"""A disk cache of encoded texts, so repeated evaluation does not re-encode a corpus.

Keyed by the encoder's fingerprint (model files and settings) and a hash of every
text, stored as plain ``.npz`` (never pickle) in ``$NORMRANK_CACHE`` or the user's
cache folder (``$XDG_CACHE_HOME/normrank``, default ``~/.cache/normrank``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from normrank.encoders import RawEncoder, check_texts

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
    # named before the key hashes them: a lone surrogate or a non-string was a bare UnicodeEncodeError
    # or AttributeError here, where encode() names it
    texts = check_texts(texts)
    folder = folder or cache_dir()
    path = folder / f"{cache_key(encoder, texts)}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as data:
                vecs, counts = data["vectors"], data["token_counts"]
            if vecs.shape[0] == len(texts):
                return vecs, counts
        except Exception as exc:  # noqa: BLE001 - a cache entry is never worth failing over
            # a truncated or emptied file raises BadZipFile or EOFError, which every later run hit: encode
            # again and write the entry anew
            logger.warning("ignoring unreadable cache file %s (%s: %s); encoding again", path,
                           type(exc).__name__, exc)
    vecs, counts = encoder.encode_with_counts(texts, show_progress=show_progress)
    tmp_name: str | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".npz", delete=False) as tmp:
            tmp_name = tmp.name
            np.savez(tmp, vectors=vecs, token_counts=counts)
            tmp.flush()
            os.fsync(tmp.fileno())  # renamed only once on disk: a power loss leaves no empty entry
        os.replace(tmp_name, path)
    except OSError as exc:
        logger.warning("could not write the encoding cache at %s: %s", folder, exc)
        if tmp_name is not None:  # a full disk left the part written: do not keep it filling the disk
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
    return vecs, counts
