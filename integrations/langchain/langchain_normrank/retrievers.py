"""``NormRankRetriever``: a LangChain retriever that serves a ``NormIndex``'s blended top-k.

The retriever holds no scoring logic: it asks the index for hits and turns each into
a ``Document`` whose ``metadata`` says why it ranked where it did (``relevance_score``
is the blended score; ``cosine``, ``norm_feature``, ``weight`` and ``norm`` explain it),
so nothing is lost the way ``VectorStoreRetriever`` loses its scores.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever, LangSmithRetrieverParams
from pydantic import ConfigDict, Field

from normrank.config import NormRankConfig, build_index, load_config
from normrank.encoders import RawEncoder
from normrank.errors import InvalidArgumentError
from normrank.scoring import Hit
from normrank.store import NormIndex, SearchableIndex



def hit_to_document(hit: Hit) -> Document:
    """A new ``Document`` for a hit: its stored metadata plus the score and its explanation."""
    metadata = dict(hit.metadata)
    metadata.update(hit.as_metadata())
    return Document(page_content=hit.text or "", metadata=metadata, id=hit.id)


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise InvalidArgumentError(f"k must be a positive integer, got {k!r}")
    return k


class NormRankRetriever(BaseRetriever):
    """Retrieve the ``k`` documents with the highest blended score ``cos + w(q) * g(d)``.

    ``k`` and ``filter`` are set at construction and can be overridden per call:
    ``retriever.invoke("query", k=2, filter={"source": "faq"})``. Asking for more
    documents than the index holds returns all of them.

    Example
    -------
    >>> retriever = NormRankRetriever.from_texts(["a first text", "a second one"], k=1)
    >>> retriever.invoke("second")[0].metadata["relevance_score"]  # doctest: +SKIP
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    index: SearchableIndex = Field(description="The normrank index to search (NormIndex or pgvector).")
    k: int = Field(4, gt=0, description="Documents returned per query.")
    filter: dict[str, Any] | None = Field(None, description="Metadata filter: key -> value or list of values.")

    # ------------------------------------------------------------ builders
    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        ids: Sequence[str] | None = None,
        *,
        k: int = 4,
        filter: dict[str, Any] | None = None,
        encoder: RawEncoder | None = None,
        **index_kwargs: Any,
    ) -> NormRankRetriever:
        """Encode ``texts`` with the raw encoder into a new ``NormIndex`` and retrieve from it."""
        index = NormIndex.from_texts(texts, ids=ids, metadatas=metadatas, encoder=encoder, **index_kwargs)
        return cls(index=index, k=k, filter=filter)

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Document],
        *,
        k: int = 4,
        filter: dict[str, Any] | None = None,
        encoder: RawEncoder | None = None,
        **index_kwargs: Any,
    ) -> NormRankRetriever:
        """Index LangChain documents, keeping their ids (new ones where ``Document.id`` is unset)."""
        index = NormIndex(encoder, **index_kwargs)
        add_documents(index, documents)
        return cls(index=index, k=k, filter=filter)

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig,
        *,
        documents: Sequence[Document] | None = None,
    ) -> NormRankRetriever:
        """Build from a ``normrank.yaml`` (path or dict): the index at ``store.path`` or a new one.

        ``documents``, if given, are added to that index. ``k`` and ``filter`` come from the
        file's ``langchain`` section.
        """
        config = load_config(source)
        index = build_index(config)
        if documents:
            add_documents(index, documents)
        return cls(index=index, k=config.langchain.k, filter=config.langchain.filter)

    # ------------------------------------------------------------ retrieval
    def _search_args(self, k: int | None, filter: dict[str, Any] | None) -> tuple[int, dict[str, Any] | None]:
        k = _check_k(self.k if k is None else k)
        return min(k, len(self.index)), self.filter if filter is None else filter

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        filter: dict[str, Any] | None = None,
    ) -> list[Document]:
        """The blended top-``k`` for ``query`` (``k`` clamped to the index size; empty index: no documents)."""
        k, flt = self._search_args(k, filter)
        if k == 0:
            return []
        return [hit_to_document(h) for h in self.index.search(query, k, filter=flt)]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        filter: dict[str, Any] | None = None,
    ) -> list[Document]:
        """Async retrieval: the search (encoder + FAISS) runs in a worker thread, off the event loop."""
        k, flt = self._search_args(k, filter)
        if k == 0:
            return []
        hits = await asyncio.to_thread(self.index.search, query, k, filter=flt)
        return [hit_to_document(h) for h in hits]

    def _get_ls_params(self, **kwargs: Any) -> LangSmithRetrieverParams:
        """Tracing parameters, like ``VectorStoreRetriever``'s."""
        params = super()._get_ls_params(**kwargs)
        params["ls_vector_store_provider"] = type(self.index).__name__
        params["ls_embedding_provider"] = RawEncoder.__name__
        encoder = getattr(self.index, "encoder", None)
        if encoder is not None:
            params["ls_embedding_model"] = encoder.model_name
        return params


def add_documents(index: SearchableIndex, documents: Sequence[Document]) -> list[str]:
    """Add LangChain documents to a ``NormIndex``; returns their ids (new ones where ``Document.id`` is unset)."""
    docs = list(documents)
    if not docs:
        return []
    ids = [d.id or uuid.uuid4().hex for d in docs]
    return index.add_texts([d.page_content for d in docs], ids=ids, metadatas=[dict(d.metadata) for d in docs])
