"""LlamaIndex retriever over a normrank index (exact blended top-k)."""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_extras.py
    raise ImportError(
        "llama_index.retrievers.normrank needs llama-index-core, which is not installed: pip install llama-index-normrank"
    ) from exc

from llama_index.retrievers.normrank.base import NormRankRetriever

__all__ = ["NormRankRetriever"]
