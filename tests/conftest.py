"""Shared fixtures: the real model once per session, real collections when present.

Tests on real collections read ``$NORMRANK_DATA`` or ``../shared/data`` and skip, saying
why, where neither exists. Encoded corpora are cached on disk (``normrank.cache``), so
only the first run on a machine pays for encoding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from normrank.datasets import BeirDataset, default_data_dir, load_beir  # noqa: E402
from normrank.testing import demo_encoded, demo_texts, encoder, pg_dsn, pg_table_factory  # noqa: E402,F401,F811


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = default_data_dir()
    if d is None or not d.is_dir():
        pytest.skip("no BEIR collections: set NORMRANK_DATA or place them in ../shared/data")
    return d


@dataclass
class EncodedCollection:
    data: BeirDataset
    ids: list[str]
    texts: list[str]
    skipped: list[str]
    vectors: np.ndarray
    token_counts: np.ndarray


def encode_collection(encoder, data_dir: Path, name: str, split: str = "test") -> EncodedCollection:
    from normrank.cache import encode_cached

    path = data_dir / name
    if not path.is_dir():
        pytest.skip(f"collection {name} not found in {data_dir}")
    ds = load_beir(path, split)
    ids, texts, skipped = ds.doc_items()
    vecs, counts = encode_cached(encoder, texts, show_progress=False)
    return EncodedCollection(ds, ids, texts, skipped, vecs, counts)


@pytest.fixture(scope="session")
def cranfield(encoder, data_dir) -> EncodedCollection:
    """Cranfield (1,398 non-empty docs, 225 queries), encoded with the real model."""
    return encode_collection(encoder, data_dir, "cranfield")


@pytest.fixture(scope="session")
def cisi(encoder, data_dir) -> EncodedCollection:
    return encode_collection(encoder, data_dir, "cisi")


def synthetic(n: int, dim: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random raw vectors with varied norms and token counts, for pure-logic tests."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(5, 300, size=n)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    scale = np.exp(rng.normal(0, 0.15, size=n) - 0.3 * np.log(counts))
    vecs *= (scale / np.linalg.norm(vecs, axis=1))[:, None].astype(np.float32) * 5
    return vecs, counts
