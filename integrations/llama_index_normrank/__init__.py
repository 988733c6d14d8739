"""LlamaIndex integration of normrank: a node postprocessor, a retriever and raw embeddings.

Install with ``pip install "normrank[llamaindex]"``.
"""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_extras.py
    raise ImportError(
        'llama_index_normrank needs llama-index-core, which is not installed: pip install "normrank[llamaindex]"'
    ) from exc

from llama_index_normrank.embeddings import NormRankEmbedding
from llama_index_normrank.postprocessor import NormRankPostprocessor
from llama_index_normrank.retrievers import NormRankRetriever

__all__ = ["NormRankEmbedding", "NormRankPostprocessor", "NormRankRetriever"]
