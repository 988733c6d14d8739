"""``NormRankRetriever``: normrank as LlamaIndex's first stage, over a ``NormIndex``.

Each hit becomes a ``NodeWithScore`` whose score is the blended score. The explanation
(``score``, ``cosine``, ``norm_feature``, ``weight``, ``norm``) goes under the one metadata
key :data:`EXPLANATION_KEY` (``"normrank"``), hidden from the LLM and embed views, so it
never leaks into prompts and never overwrites a user's own ``weight``, ``norm``, ``cosine``
or ``relevance_score`` keys (LlamaIndex defines no ``relevance_score``: the score is
``NodeWithScore.score``).

Also home of the helpers the other LlamaIndex modules share (the vector store, the
postprocessor): :func:`explain`, :func:`with_explanation`, :func:`hidden_keys`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import (
    BaseNode,
    Document,
    ImageNode,
    IndexNode,
    MetadataMode,
    NodeWithScore,
    QueryBundle,
    TextNode,
)

from normrank.config import NormRankConfig, build_index, load_config
from normrank.encoders import RawEncoder
from normrank.candidate_vectors import EXPLANATION_KEY, explain, is_blank, is_explanation, is_raw
from normrank.errors import EmptyCorpusError, InvalidArgumentError
from normrank.index_base import held_documents, search_up_to
from normrank.scoring import SCORE_KEYS, Hit
from normrank.store import MetadataFilter, NormIndex, SearchableIndex

logger = logging.getLogger(__name__)

__all__ = [
    "EXPLANATION_KEY",
    "SCORE_KEYS",
    "ExplainedDocument",
    "ExplainedImageNode",
    "ExplainedIndexNode",
    "ExplainedTextNode",
    "NormRankRetriever",
    "add_nodes",
    "as_explained",
    "check_reserved",
    "explain",
    "explanation",
    "hidden_keys",
    "is_explanation",
    "with_explanation",
]


def explanation(hit: Hit) -> dict[str, float]:
    """The score and its parts as flat keys (``relevance_score``, ``cosine``, ...).

    Kept for code written against 0.2; the adapters no longer write these keys into node
    metadata (they collide with user keys): use :func:`explain` under :data:`EXPLANATION_KEY`.
    """
    return hit.as_metadata()


def hidden_keys(node: BaseNode, keys: Sequence[str]) -> dict[str, list[str]]:
    """``excluded_*_metadata_keys`` extended with ``keys``, for ``model_copy(update=...)``."""
    return {
        "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys,
                                       *(k for k in keys if k not in node.excluded_llm_metadata_keys)],
        "excluded_embed_metadata_keys": [*node.excluded_embed_metadata_keys,
                                         *(k for k in keys if k not in node.excluded_embed_metadata_keys)],
    }


def _hash_without_explanation(cls: type[TextNode]) -> property:
    """``cls.hash`` computed as if normrank's explanation were not in the metadata."""
    parent = cls.hash

    def node_hash(self: TextNode) -> str:
        meta = self.metadata
        if EXPLANATION_KEY in meta and is_explanation(meta[EXPLANATION_KEY]):
            return parent.fget(self.model_copy(update={"metadata": {k: v for k, v in meta.items()
                                                                       if k != EXPLANATION_KEY}}))
        return parent.fget(self)

    return property(node_hash)


class ExplainedTextNode(TextNode):
    """A ``TextNode`` carrying normrank's score explanation, whose ``hash`` is the node's own.

    Why: LlamaIndex hashes a node's text and metadata, and ``QueryFusionRetriever`` merges results by that
    hash. The explanation differs per query, so the same node from two queries (or from a normrank and a
    stock retriever) was never merged: ``reciprocal_rerank`` returned 4 of 5 nodes with unfused scores.
    It is a ``TextNode`` in every other way, and serialises as one (``class_name`` is inherited)."""

    __slots__ = ()
    hash = _hash_without_explanation(TextNode)  # type: ignore[assignment]


class ExplainedIndexNode(IndexNode):
    """:class:`ExplainedTextNode` for an ``IndexNode``."""

    __slots__ = ()
    hash = _hash_without_explanation(IndexNode)  # type: ignore[assignment]


class ExplainedImageNode(ImageNode):
    """:class:`ExplainedTextNode` for an ``ImageNode``."""

    __slots__ = ()
    hash = _hash_without_explanation(ImageNode)  # type: ignore[assignment]


class ExplainedDocument(Document):
    """:class:`ExplainedTextNode` for a ``Document`` (re-ranked documents, a retriever over documents)."""

    __slots__ = ()
    hash = _hash_without_explanation(Document)  # type: ignore[assignment]


#: The node classes made explained (exact types: another subclass keeps its own class and its hash, which
#: then holds the explanation).
_EXPLAINED = {TextNode: ExplainedTextNode, IndexNode: ExplainedIndexNode, ImageNode: ExplainedImageNode,
              Document: ExplainedDocument}


def with_explanation(node: BaseNode, payload: Mapping[str, float]) -> BaseNode:
    """A copy of ``node`` whose metadata holds ``payload`` under :data:`EXPLANATION_KEY`, hidden from the LLM
    and embed views. The caller's node is not changed; an earlier normrank explanation is replaced.

    If the node's own metadata already uses the key for something else (normrank refuses that at its own
    doors, but an index filled elsewhere may hold it), the user's value is kept, the explanation is left out
    of that node and a warning is logged.
    """
    if EXPLANATION_KEY in node.metadata and not is_explanation(node.metadata[EXPLANATION_KEY]):
        logger.warning("node %r has its own metadata key %r: it is kept and normrank's score explanation is "
                       "left out of this node", node.node_id, EXPLANATION_KEY)
        return node.model_copy()
    metadata = {**node.metadata, EXPLANATION_KEY: dict(payload)}
    return as_explained(node.model_copy(update={"metadata": metadata, **hidden_keys(node, [EXPLANATION_KEY])}))


def as_explained(node: BaseNode) -> BaseNode:
    """``node``, a copy the caller owns, made its explained type (:class:`ExplainedTextNode`), whose hash
    leaves the explanation out; other node types are returned as they are."""
    explained = _EXPLAINED.get(type(node))
    if explained is not None:  # same fields and slots: only the hash differs
        object.__setattr__(node, "__class__", explained)
    return node


def check_reserved(metadata: Mapping[str, Any], where: str) -> None:
    """Refuse user metadata that uses :data:`EXPLANATION_KEY` at the door, before anything is stored."""
    if EXPLANATION_KEY in metadata:
        raise InvalidArgumentError(
            f"{where} has a metadata key {EXPLANATION_KEY!r}, which normrank reserves for its score explanation; "
            "rename that key")


def _check_k(k: Any) -> int:
    """A positive whole number; NumPy integers too, as the vector store and ``NormIndex.search`` take them."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise InvalidArgumentError(f"similarity_top_k must be a positive integer, got {k!r}")
    return int(k)


def empty_message(what: str) -> str:
    """Why an adapter over an empty index is suspicious (a misplaced ``store.path`` gives one)."""
    return (f"{what} is on an empty normrank index, so a query can find nothing; check the index path "
            "(a misplaced store.path opens an empty index), add documents first, or pass allow_empty=True "
            "to get empty results instead")


class NormRankRetriever(BaseRetriever):
    """Retrieve the ``similarity_top_k`` nodes with the highest blended score from a ``NormIndex``.

    Asking for more nodes than the index holds returns all of them. Built on an empty index it
    warns, and retrieving raises :class:`normrank.errors.EmptyCorpusError` (an empty index is
    usually a misplaced one), unless ``allow_empty=True``, which returns no nodes instead.
    """

    def __init__(
        self,
        index: SearchableIndex,
        similarity_top_k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        allow_empty: bool = False,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(index, SearchableIndex):
            raise InvalidArgumentError(f"index must be a normrank.NormIndex, got {type(index).__name__}")
        self.index = index
        self.similarity_top_k = _check_k(similarity_top_k)
        self.filter = filter
        self.allow_empty = bool(allow_empty)
        if not self.allow_empty and not held_documents(index):
            warnings.warn(empty_message("NormRankRetriever"), stacklevel=2)
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
        for i, m in enumerate(metadatas or []):
            if isinstance(m, Mapping):
                check_reserved(m, f"metadata {i}")
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
        allow_empty: bool = False,
    ) -> NormRankRetriever:
        """Build from a ``normrank.yaml`` (path or dict): the index at ``store.path`` or a new one.

        ``documents``, if given, are added; ``similarity_top_k`` is ``llamaindex.similarity_top_k``. With no
        documents and nothing at ``store.path`` the index is empty: a warning says so at once, and retrieving
        raises, unless ``allow_empty=True``.
        """
        config = load_config(source)
        index = build_index(config)
        if documents:
            add_nodes(index, documents)
        return cls(index, config.llamaindex.similarity_top_k, allow_empty=allow_empty)

    # ------------------------------------------------------------ retrieval
    def _empty(self) -> list[Hit]:
        if self.allow_empty or held_documents(self.index):  # emptied by deletes: no nodes, as LlamaIndex's stores
            return []
        raise EmptyCorpusError(empty_message("this NormRankRetriever"))

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """The blended top ``similarity_top_k``, clamped to what the index holds when it searches.

        The query is ``query_bundle.embedding`` when it is a raw vector of the index's dimension (a
        ``NormRankEmbedding`` computed it: no second model call), else ``query_str`` encoded by the
        index's encoder. Nodes come back as the index stored them: a node a ``NormRankVectorStore``
        wrote is rebuilt whole (its id, relationships and metadata), without LlamaIndex's internal keys.
        """
        from llama_index.vector_stores.normrank.base import _to_node

        query: Any = query_bundle.query_str
        count = None
        count_text = None
        dim = getattr(self.index, "dim", None)
        if dim and is_raw(query_bundle.embedding, dim):
            query = np.asarray(query_bundle.embedding, dtype=np.float32)
            if not is_blank(query_bundle.query_str):
                if self.index.weights.b != 0:  # only w(q) needs it
                    count = int(self.index.encoder.token_counts([query_bundle.query_str])[0])
                else:  # counted by search_up_to should the blend change to b != 0 before the search
                    count_text = query_bundle.query_str
        hits = search_up_to(self.index, query, self.similarity_top_k, self._empty, filter=self.filter,
                            query_token_count=count, count_text=count_text)
        return [NodeWithScore(node=with_explanation(_to_node(hit.id, hit.text, hit.metadata), explain(hit)),
                              score=hit.score)
                for hit in hits]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)


def add_nodes(index: SearchableIndex, nodes: Sequence[BaseNode]) -> list[str]:
    """Add LlamaIndex documents or nodes to a ``NormIndex`` by their text; the nodes are not changed."""
    items = list(nodes)
    if not items:
        return []
    for n in items:
        check_reserved(n.metadata, f"node {n.node_id!r}")
    return index.add_texts([n.get_content(metadata_mode=MetadataMode.NONE) for n in items],
                           ids=[n.node_id for n in items], metadatas=[dict(n.metadata) for n in items])
