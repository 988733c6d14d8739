"""LangChain integration of normrank: a ``VectorStore``, a retriever and raw embeddings.

Install with ``pip install langchain-normrank``. Imports only ``langchain_core``.
"""

from __future__ import annotations

try:
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_extras.py
    raise ImportError(
        'langchain_normrank needs langchain-core, which is not installed: pip install langchain-normrank'
    ) from exc

from langchain_normrank.embeddings import NormRankEmbeddings
from langchain_normrank.retrievers import NormRankRetriever
from langchain_normrank.vectorstores import NormRankVectorStore, NormRankVectorStoreRetriever

__all__ = ["NormRankEmbeddings", "NormRankRetriever", "NormRankVectorStore", "NormRankVectorStoreRetriever"]
