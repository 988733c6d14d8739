"""``NormRankRetriever``: a LangChain retriever that serves a ``NormIndex``'s blended top-k.

The retriever holds no scoring logic: it asks the index for hits and turns each into a
``Document`` whose ``metadata["normrank"]`` says why it ranked where it did (``score`` is the
blended score; ``cosine``, ``norm_feature``, ``weight`` and ``norm`` explain it), so nothing is
lost the way ``VectorStoreRetriever`` loses its scores, and no metadata key of the user's is
overwritten. For LangChain's ``VectorStore`` interface (``as_retriever``, ``add_documents``, the
indexing API) use :class:`langchain_normrank.NormRankVectorStore`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever, LangSmithRetrieverParams
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from langchain_normrank._shared import (
    EXPLANATION_KEY,
    check_explanation_key,
    check_index_kwargs,
    check_k,
    empty_error,
    to_document,
    warn_empty,
)
from normrank.config import NormRankConfig, build_index, load_config
from normrank.encoders import RawEncoder
from normrank.errors import InvalidArgumentError
from normrank.index_base import held_documents, search_up_to
from normrank.scoring import Hit
from normrank.store import NormIndex, SearchableIndex


def hit_to_document(hit: Hit, explanation_key: str = EXPLANATION_KEY) -> Document:
    """A new ``Document`` for a hit: its stored metadata plus ``metadata[explanation_key]``."""
    return to_document(hit, explanation_key)


def _encoder_from(embedding: Any, encoder: RawEncoder | None, method: str) -> RawEncoder | None:
    """The encoder a ``VectorStore``-style ``from_texts(texts, embeddings)`` call means, or a named error."""
    from langchain_normrank.embeddings import NormRankEmbeddings

    if embedding is None:
        return encoder
    if encoder is not None:
        raise InvalidArgumentError(f"{method}: give either embeddings or encoder=, not both")
    if isinstance(embedding, NormRankEmbeddings):
        return embedding.encoder
    if isinstance(embedding, RawEncoder):
        return embedding
    raise InvalidArgumentError(
        f"NormRankRetriever.{method} encodes with normrank's raw encoder and cannot use "
        f"{type(embedding).__name__}: pass NormRankEmbeddings or encoder=RawEncoder(...). For LangChain's "
        f"VectorStore signature with any raw Embeddings use "
        f"NormRankVectorStore.{method}(..., embedding).as_retriever()"
    )


class NormRankRetriever(BaseRetriever):
    """Retrieve the ``k`` documents with the highest blended score ``cos + w(q) * g(d)``.

    ``k`` and ``filter`` are set at construction and can be overridden per call:
    ``retriever.invoke("query", k=2, filter={"source": "faq"})``, or the ``VectorStoreRetriever``
    way, ``invoke("query", search_kwargs={"k": 2})``. Asking for more documents than the index
    holds returns all of them. Built on an empty index (a wrong ``store.path``?), the retriever
    warns, and ``invoke`` raises ``EmptyCorpusError`` unless ``allow_empty=True``.

    Example
    -------
    >>> retriever = NormRankRetriever.from_texts(["a first text", "a second one"], k=1)
    >>> retriever.invoke("second")[0].metadata["normrank"]["score"]  # doctest: +SKIP
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    index: SearchableIndex = Field(description="The normrank index to search (NormIndex or pgvector).")
    k: int = Field(4, gt=0, description="Documents returned per query.")
    filter: dict[str, Any] | None = Field(None, description="Metadata filter: key -> value or list of values.")
    allow_empty: bool = Field(False, description="Return [] for an empty index instead of raising EmptyCorpusError.")
    explanation_key: str = Field(EXPLANATION_KEY, min_length=1,
                                 description="Metadata key of each document's score explanation.")
    _empty_hint: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _warn_if_empty(self) -> NormRankRetriever:
        if not self.allow_empty and not held_documents(self.index):
            warn_empty("retriever")
        return self

    # ------------------------------------------------------------ builders
    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        metadatas: Sequence[Mapping[str, Any]] | Embeddings | None = None,
        ids: Sequence[str] | None = None,
        *,
        k: int = 4,
        filter: dict[str, Any] | None = None,
        encoder: RawEncoder | None = None,
        embedding: Embeddings | None = None,
        **index_kwargs: Any,
    ) -> NormRankRetriever:
        """Encode ``texts`` with the raw encoder into a new ``NormIndex`` and retrieve from it.

        ``from_texts(texts, embeddings)`` (LangChain's ``VectorStore`` order) works with
        :class:`NormRankEmbeddings`; other embeddings raise an error that names
        :class:`NormRankVectorStore`, which takes any raw ``Embeddings``.
        """
        if isinstance(metadatas, (Embeddings, RawEncoder)):
            if embedding is not None:
                raise InvalidArgumentError("from_texts: embeddings given twice")
            metadatas, embedding = None, metadatas
            if ids is not None and not isinstance(ids, str) and all(isinstance(m, Mapping) for m in ids):
                metadatas, ids = ids, None  # from_texts(texts, embeddings, metadatas), the VectorStore order
        if metadatas is not None and (isinstance(metadatas, (str, Mapping)) or not isinstance(metadatas, Iterable)):
            raise InvalidArgumentError(f"from_texts: metadatas must be a list of dicts (one per text) or the "
                                       f"embeddings, got {type(metadatas).__name__}")
        encoder = _encoder_from(embedding, encoder, "from_texts")
        metas = list(metadatas) if metadatas is not None else None
        if metas is not None:
            check_explanation_key(metas, EXPLANATION_KEY)
        check_index_kwargs(NormIndex, index_kwargs)
        index = NormIndex.from_texts(texts, ids=ids, metadatas=metas, encoder=encoder, **index_kwargs)
        return cls(index=index, k=k, filter=filter)

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Document],
        embedding: Embeddings | None = None,
        *,
        k: int = 4,
        filter: dict[str, Any] | None = None,
        encoder: RawEncoder | None = None,
        **index_kwargs: Any,
    ) -> NormRankRetriever:
        """Index LangChain documents, keeping their ids (new ones where ``Document.id`` is unset)."""
        check_index_kwargs(NormIndex, index_kwargs)
        index = NormIndex(_encoder_from(embedding, encoder, "from_documents"), **index_kwargs)
        add_documents(index, documents)
        return cls(index=index, k=k, filter=filter)

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig,
        *,
        documents: Sequence[Document] | None = None,
        allow_empty: bool = False,
    ) -> NormRankRetriever:
        """Build from a ``normrank.yaml`` (path or dict): the index at ``store.path`` or a new one.

        ``documents``, if given, are added to that index. ``k`` and ``filter`` come from the
        file's ``langchain`` section. An index that is still empty warns here, and ``invoke``
        raises unless ``allow_empty=True``.
        """
        config = load_config(source)
        index = build_index(config)
        if documents:
            add_documents(index, documents)
        retriever = cls(index=index, k=config.langchain.k, filter=config.langchain.filter, allow_empty=True)
        s = config.store
        retriever._empty_hint = (f" (pgvector table {s.table!r})" if s.backend == "pgvector"
                                 else f" (store.path {s.path!r} holds no saved index)" if s.path else "")
        retriever.allow_empty = allow_empty
        if not allow_empty and not held_documents(index):
            warn_empty("retriever" + retriever._empty_hint)
        return retriever

    # ------------------------------------------------------------ retrieval
    def _search_args(self, k: int | None, filter: dict[str, Any] | None,
                     search_kwargs: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> tuple[int, Any]:
        if kwargs:
            raise InvalidArgumentError(
                f"unknown argument(s) {sorted(kwargs)} for NormRankRetriever.invoke; it takes k and filter "
                "(or search_kwargs={'k': ..., 'filter': ...}). For search_type, fetch_k, lambda_mult or "
                "score_threshold use NormRankVectorStore(...).as_retriever(search_type=..., search_kwargs=...)")
        if search_kwargs is not None:
            if not isinstance(search_kwargs, Mapping):
                raise InvalidArgumentError(f"search_kwargs must be a dict, got {type(search_kwargs).__name__}")
            extra = set(search_kwargs) - {"k", "filter"}
            if extra:
                raise InvalidArgumentError(
                    f"NormRankRetriever takes only k and filter in search_kwargs, not {sorted(extra)}; for "
                    "MMR or a score threshold use NormRankVectorStore(...).as_retriever(search_type=...)")
            k = search_kwargs.get("k", k)
            filter = search_kwargs.get("filter", filter)
        k = check_k(self.k if k is None else k)
        return k, self.filter if filter is None else filter

    def _empty(self) -> list[Hit]:
        if not (self.allow_empty or held_documents(self.index)):  # emptied by deletes answers []
            raise empty_error("retriever" + self._empty_hint)
        return []

    def _hits(self, query: Any, k: int, flt: Any) -> list[Hit]:
        """The blended top-``k``, ``k`` clamped to the index's size at the moment it searches (a delete
        from another thread in between no longer makes the search refuse ``k``)."""
        if not isinstance(query, str):
            raise InvalidArgumentError(f"the query must be a string, got {type(query).__name__}")
        return search_up_to(self.index, query, k, self._empty, filter=flt)

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        filter: dict[str, Any] | None = None,
        search_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """The blended top-``k`` for ``query`` (``k`` clamped to the index size)."""
        k, flt = self._search_args(k, filter, search_kwargs, kwargs)
        return [hit_to_document(h, self.explanation_key) for h in self._hits(query, k, flt)]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        filter: dict[str, Any] | None = None,
        search_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """Async retrieval: the search (encoder + FAISS) runs in a worker thread, off the event loop."""
        k, flt = self._search_args(k, filter, search_kwargs, kwargs)
        hits = await asyncio.to_thread(self._hits, query, k, flt)
        return [hit_to_document(h, self.explanation_key) for h in hits]

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
    check_explanation_key([d.metadata for d in docs], EXPLANATION_KEY)
    return index.add_texts([d.page_content for d in docs], ids=ids, metadatas=[dict(d.metadata) for d in docs])
