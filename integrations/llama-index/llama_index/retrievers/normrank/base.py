"""``NormRankRetriever``: normrank as LlamaIndex's first stage, over a ``NormIndex``.

Each hit becomes a ``NodeWithScore`` whose score is the blended score; the node's
metadata carries the explanation (``relevance_score``, ``cosine``, ``norm_feature``,
``weight``, ``norm``), hidden from the LLM and embed views so it never leaks into prompts.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle, TextNode

from normrank.config import NormRankConfig, build_index, load_config
from normrank.encoders import RawEncoder
from normrank.errors import InvalidArgumentError
from normrank.scoring import SCORE_KEYS, Hit
from normrank.store import MetadataFilter, NormIndex, SearchableIndex



def explanation(hit: Hit) -> dict[str, float]:
    """The score and its parts, as metadata."""
    return hit.as_metadata()


def hidden_keys(node: BaseNode, keys: Sequence[str]) -> dict[str, list[str]]:
    """``excluded_*_metadata_keys`` extended with ``keys``, for ``model_copy(update=...)``."""
    return {
        "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys,
                                       *(k for k in keys if k not in node.excluded_llm_metadata_keys)],
        "excluded_embed_metadata_keys": [*node.excluded_embed_metadata_keys,
                                         *(k for k in keys if k not in node.excluded_embed_metadata_keys)],
    }


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise InvalidArgumentError(f"similarity_top_k must be a positive integer, got {k!r}")
    return k


class NormRankRetriever(BaseRetriever):
    """Retrieve the ``similarity_top_k`` nodes with the highest blended score from a ``NormIndex``.

    Asking for more nodes than the index holds returns all of them; an empty index returns none.
    """

    def __init__(
        self,
        index: SearchableIndex,
        similarity_top_k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(index, SearchableIndex):
            raise InvalidArgumentError(f"index must be a normrank.NormIndex, got {type(index).__name__}")
        self.index = index
        self.similarity_top_k = _check_k(similarity_top_k)
        self.filter = filter
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    # ------------------------------------------------------------ builders
    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        *,
        similarity_top_k: int = 10,
        encoder: RawEncoder | None = None,
        **index_kwargs: Any,
    ) -> NormRankRetriever:
        """Encode ``texts`` with the raw encoder into a new ``NormIndex`` and retrieve from it."""
        index = NormIndex.from_texts(texts, ids=ids, metadatas=metadatas, encoder=encoder, **index_kwargs)
        return cls(index, similarity_top_k)

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[BaseNode],
        *,
        similarity_top_k: int = 10,
        encoder: RawEncoder | None = None,
        **index_kwargs: Any,
    ) -> NormRankRetriever:
        """Index LlamaIndex documents or nodes by their text, keeping their ids and metadata."""
        index = NormIndex(encoder, **index_kwargs)
        add_nodes(index, documents)
        return cls(index, similarity_top_k)

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig,
        *,
        documents: Sequence[BaseNode] | None = None,
    ) -> NormRankRetriever:
        """Build from a ``normrank.yaml`` (path or dict): the index at ``store.path`` or a new one.

        ``documents``, if given, are added; ``similarity_top_k`` is ``llamaindex.similarity_top_k``.
        """
        config = load_config(source)
        index = build_index(config)
        if documents:
            add_nodes(index, documents)
        return cls(index, config.llamaindex.similarity_top_k)

    # ------------------------------------------------------------ retrieval
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        k = min(self.similarity_top_k, len(self.index))
        if k == 0:
            return []
        hits = self.index.search(query_bundle.query_str, k, filter=self.filter)
        out = []
        for hit in hits:
            node = TextNode(id_=hit.id, text=hit.text or "", metadata={**hit.metadata, **explanation(hit)},
                            excluded_llm_metadata_keys=list(SCORE_KEYS),
                            excluded_embed_metadata_keys=list(SCORE_KEYS))
            out.append(NodeWithScore(node=node, score=hit.score))
        return out

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)


def add_nodes(index: SearchableIndex, nodes: Sequence[BaseNode]) -> list[str]:
    """Add LlamaIndex documents or nodes to a ``NormIndex`` by their text; the nodes are not changed."""
    items = list(nodes)
    if not items:
        return []
    return index.add_texts([n.get_content(metadata_mode=MetadataMode.NONE) for n in items],
                           ids=[n.node_id for n in items], metadatas=[dict(n.metadata) for n in items])
