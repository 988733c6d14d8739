"""LlamaIndex node postprocessor that re-ranks by cosine plus a calibrated norm term."""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_extras.py
    raise ImportError(
        "llama_index.postprocessor.normrank needs llama-index-core, which is not installed: pip install llama-index-normrank"
    ) from exc

from llama_index.postprocessor.normrank.base import NormRankPostprocessor

__all__ = ["NormRankPostprocessor"]
