"""Deprecated import path: use the ``llama_index.*.normrank`` modules.

``llama_index_normrank`` predates the ``llama-index-normrank`` distribution; it re-exports the
same classes so existing code keeps working, and warns once on import.
"""

from __future__ import annotations

import warnings

from llama_index.embeddings.normrank import NormRankEmbedding
from llama_index.postprocessor.normrank import NormRankPostprocessor
from llama_index.retrievers.normrank import NormRankRetriever

warnings.warn(
    "llama_index_normrank is deprecated; import from llama_index.postprocessor.normrank, "
    "llama_index.retrievers.normrank, llama_index.embeddings.normrank or llama_index.vector_stores.normrank",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["NormRankEmbedding", "NormRankPostprocessor", "NormRankRetriever"]
