"""LlamaIndex vector store over a normrank index: the exact blended top-k as the first stage."""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_extras.py
    raise ImportError(
        "llama_index.vector_stores.normrank needs llama-index-core, which is not installed: pip install llama-index-normrank"
    ) from exc

from llama_index.vector_stores.normrank.base import NormRankVectorStore, metadata_filter

__all__ = ["NormRankVectorStore", "metadata_filter"]
