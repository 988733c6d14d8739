"""Fixtures of this integration's tests: the real bundled model and the demo corpus the core ships.

Self-contained so the integration's tests also run from its own folder.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from normrank.datasets import demo_rows  # noqa: E402


@pytest.fixture(scope="session")
def encoder():
    """The real bundled all-MiniLM-L6-v2 raw encoder, loaded once."""
    from normrank.encoders import RawEncoder

    enc = RawEncoder(show_progress=False)
    _ = enc.model
    return enc


@pytest.fixture(scope="session")
def demo_texts() -> list[str]:
    """The small corpus the core ships for its demo (48 passages)."""
    return [f"{r['title']}\n{r['text']}" for r in demo_rows()]


@pytest.fixture(scope="session")
def demo_encoded(encoder, demo_texts):
    return encoder.encode_with_counts(demo_texts)
