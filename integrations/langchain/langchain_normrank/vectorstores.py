"""``NormRankVectorStore``: a LangChain ``VectorStore`` serving normrank's exact blended top-k.

Where LangChain apps plug a store in (``as_retriever``, ``add_documents``, the indexing API with a
record manager, MMR), this one ranks by ``cos + w(q) * g(d)`` over a :class:`normrank.NormIndex`
(FAISS, in process) or a :class:`normrank.pgvector_store.PgVectorNormIndex` (PostgreSQL). The
store holds no scoring logic: it embeds, then asks the index.

What LangChain users should know:

* Embeddings must be **raw** (pre-normalisation): :class:`NormRankEmbeddings` by default, or any
  ``Embeddings`` whose vectors keep their length. Unit-norm embeddings (hosted APIs,
  ``HuggingFaceEmbeddings``) are refused with :class:`normrank.errors.UnitNormError`: their norm
  carries no signal. Token counts come from normrank's encoder, else a tokenizer the embeddings
  carry, else an approximation (:func:`approximate_token_counts`); pass ``token_counter`` to choose.
* ``similarity_search`` and ``get_by_ids`` return documents exactly as stored (LangChain's
  contract). The scored paths (``similarity_search_with_score``, ``..._with_relevance_scores``
  and every retriever from :meth:`NormRankVectorStore.as_retriever`) add
  ``metadata["normrank"] = {"score", "cosine", "norm", "norm_feature", "weight"}``; no user key is
  ever overwritten (a document whose metadata already uses that key is refused at the door).
* Scores are similarities on the cosine scale (higher is better); relevance scores are the
  blended score clipped to [0, 1], so ``score_threshold`` reads like a cosine threshold.
* Adding a document under an id that exists replaces it (LangChain's upsert contract); a failed
  replacement puts the old document back. Searches never see the moment in between.
* Persistence goes through normrank's checksummed folders (``save_local``/``load_local``):
  FAISS, JSON and NumPy files, never pickle, so no ``allow_dangerous_deserialization``.
"""

from __future__ import annotations

import logging
import os
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever

from langchain_normrank._shared import (
    EXPLANATION_KEY,
    ReadWriteLock,
    TokenCounter,
    approximate_token_counts,
    check_explanation_key,
    check_index_kwargs,
    check_k,
    empty_error,
    resolve_token_counter,
    to_document,
    warn_empty,
)
from langchain_normrank.embeddings import NormRankEmbeddings
from normrank._validation import (
    UNIT_NORM_TOLERANCE,
    check_metadata,
    check_norm_signal,
    check_option,
    check_text,
)
from normrank.config import NormRankConfig, build_index, load_config
from normrank.encoders import RawEncoder, check_texts
from normrank.errors import (
    DuplicateIdError,
    InvalidArgumentError,
    InvalidIdError,
    InvalidVectorError,
    UnknownIdError,
)
from normrank.filters import check_filter
from normrank.index_base import held_documents, locked, search_up_to, upsert_vectors
from normrank.mmr import check_lambda, mmr_select
from normrank.scoring import Hit
from normrank.store import NormIndex, SearchableIndex

logger = logging.getLogger(__name__)

__all__ = ["NormRankVectorStore", "NormRankVectorStoreRetriever", "approximate_token_counts"]


def blended_relevance(score: float) -> float:
    """The blended score clipped to [0, 1]: LangChain's relevance scale, read like a cosine.

    The blend is ``cos`` plus a small norm term, so it lives on the cosine scale that
    cosine stores report as relevance (``1 - cosine distance``); clipping keeps LangChain's
    [0, 1] contract without changing the order of any two relevant documents.
    """
    return min(1.0, max(0.0, float(score)))


def _as_embeddings(embedding: Any) -> Embeddings | None:
    if embedding is None or isinstance(embedding, Embeddings):
        return embedding
    if isinstance(embedding, RawEncoder) or (hasattr(embedding, "encode_with_counts") and hasattr(embedding, "dim")):
        return NormRankEmbeddings(encoder=embedding)
    raise InvalidArgumentError(
        f"embedding must be a LangChain Embeddings (raw, e.g. NormRankEmbeddings) or a normrank.RawEncoder, "
        f"got {type(embedding).__name__}"
    )


def _unknown(kwargs: Mapping[str, Any], what: str, takes: str) -> None:
    if kwargs:
        raise InvalidArgumentError(f"unknown argument(s) {sorted(kwargs)} for {what}; it takes {takes}")


def _check_threshold(value: Any) -> float | None:
    """A relevance threshold: ``None`` or a number in [0, 1], the scale relevance scores are clipped to
    (a string raised a bare ``TypeError``; NaN or 2 answered ``[]`` in silence)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
            0.0 <= float(value) <= 1.0):
        raise InvalidArgumentError(f"score_threshold must be a number in [0, 1] (relevance is the blended score "
                                   f"clipped to [0, 1]), got {value!r}")
    return float(value)


def _query_vector(vector: Any) -> np.ndarray:
    """A query embedding as float32: a list (or array) of real numbers, finite and not empty. NumPy alone
    read ``"abc"`` as an error of its own and ``["1", ...]`` as numbers."""
    if isinstance(vector, np.ndarray):
        ok = vector.dtype.kind in "fiu"
    else:
        ok = isinstance(vector, Sequence) and not isinstance(vector, (str, bytes)) and all(
            isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
            for x in vector)
    if not ok:
        raise InvalidVectorError(f"the query embedding must be a list of numbers, got {type(vector).__name__}"
                                 + (" with non-numbers in it" if isinstance(vector, Sequence)
                                    and not isinstance(vector, (str, bytes)) else ""))
    vec = np.asarray(vector, dtype=np.float32).ravel()
    if vec.size == 0 or not np.all(np.isfinite(vec)):
        raise InvalidVectorError("the query embedding is empty or holds NaN or infinity")
    return vec


def _check_ids_given(ids: Sequence[Any]) -> list[str]:
    out = list(ids)
    for i, x in enumerate(out):
        if not isinstance(x, str) or not x:
            raise InvalidIdError(f"id {i} is {x!r} ({type(x).__name__}); ids must be non-empty strings")
    return out


def _named_folder(folder_path: str | os.PathLike[str], index_name: str | None) -> Path:
    """``folder_path``, or its sub-folder ``index_name`` (a plain name: no separators, not ``.`` or ``..``)."""
    if index_name is None:
        return Path(folder_path)
    if not isinstance(index_name, str) or not index_name or index_name in (".", "..") or "/" in index_name \
            or "\\" in index_name:
        raise InvalidArgumentError(f"index_name must be a plain folder name, got {index_name!r}")
    return Path(folder_path) / index_name


class NormRankVectorStore(VectorStore):
    """A LangChain vector store ranking by cosine plus a calibrated norm term (normrank's blend).

    Parameters
    ----------
    embedding:
        Raw embeddings: ``None`` for :class:`NormRankEmbeddings` on the index's encoder (the bundled
        all-MiniLM-L6-v2 for a new index), any LangChain ``Embeddings`` that keeps vector length, or
        a ``normrank.RawEncoder``.
    index:
        An existing ``NormIndex`` or ``PgVectorNormIndex`` to serve; ``None`` makes a new in-memory
        ``NormIndex`` (``index_kwargs`` such as ``weights=Weights(a=0.02)`` or ``index_type="hnsw"``
        go to it).
    allow_empty:
        Whether searching an empty store returns ``[]`` (``True``) or raises ``EmptyCorpusError``.
        ``None``: ``True`` for a new store (LangChain's usual start: create, then add), ``False``
        for one built on an existing index, a config file or a saved folder, where an empty index
        usually means a wrong path; such a store also warns when it is built.
    token_counter:
        ``texts -> token counts`` for embeddings other than normrank's (see the module notes).
    explanation_key:
        The metadata key of each scored result's explanation (default ``"normrank"``).
    backend, dsn, table:
        ``backend="pgvector"`` serves PostgreSQL table ``table`` at ``dsn`` (``None``: ``$NORMRANK_PG_DSN``),
        creating it or reopening it with its documents and state, instead of an in-memory ``NormIndex``.

    Raises
    ------
    InvalidArgumentError
        ``index`` and ``index_kwargs`` (or ``backend="pgvector"``) are both given, or an argument has the
        wrong type.
    """

    def __init__(
        self,
        embedding: Embeddings | RawEncoder | None = None,
        *,
        index: SearchableIndex | None = None,
        allow_empty: bool | None = None,
        token_counter: TokenCounter | None = None,
        explanation_key: str = EXPLANATION_KEY,
        backend: Literal["faiss", "pgvector"] = "faiss",
        dsn: str | None = None,
        table: str = "normrank_docs",
        **index_kwargs: Any,
    ) -> None:
        emb = _as_embeddings(embedding)
        if not isinstance(explanation_key, str) or not explanation_key:
            raise InvalidArgumentError(f"explanation_key must be a non-empty string, got {explanation_key!r}")
        fresh = index is None
        if backend not in ("faiss", "pgvector"):
            raise InvalidArgumentError(f"unknown backend {backend!r}; choose 'faiss' or 'pgvector'")
        if backend == "pgvector":  # a new table, or reopening one (its documents and state are kept)
            if index is not None:
                raise InvalidArgumentError("give either index= or backend='pgvector', not both")
            from normrank.pgvector_store import PgVectorNormIndex

            if emb is None:
                emb = NormRankEmbeddings()
            check_index_kwargs(PgVectorNormIndex, index_kwargs)
            index = PgVectorNormIndex(dsn, table, emb.encoder if isinstance(emb, NormRankEmbeddings) else None,
                                      **index_kwargs)
            index_kwargs = {}
        elif dsn is not None:
            raise InvalidArgumentError("dsn is for backend='pgvector'")
        if index is None:
            encoder = emb.encoder if isinstance(emb, NormRankEmbeddings) else None
            if emb is None:
                emb = NormRankEmbeddings()
                encoder = emb.encoder
            check_index_kwargs(NormIndex, index_kwargs)
            index = NormIndex(encoder, **index_kwargs)
        else:
            if index_kwargs:
                raise InvalidArgumentError(
                    f"settings {sorted(index_kwargs)} are for a new index; an existing index was given")
            if not isinstance(index, SearchableIndex) or not hasattr(index, "add_vectors"):
                raise InvalidArgumentError(
                    f"index must be a normrank NormIndex or PgVectorNormIndex, got {type(index).__name__}")
            if emb is None:
                emb = NormRankEmbeddings(encoder=index.encoder)
        self.index: Any = index
        self.embedding: Embeddings = emb
        self.explanation_key = explanation_key
        self._count_tokens, self.token_counter_kind = resolve_token_counter(emb, token_counter)
        logger.debug("token counts for %s: %s", type(emb).__name__, self.token_counter_kind)
        # Same encoder as the index: pass query texts straight to the index (one encoding, with counts).
        self._shared = isinstance(emb, NormRankEmbeddings) and emb.encoder is getattr(index, "_encoder", None)
        self._rw = ReadWriteLock()
        self._default_search_kwargs: dict[str, Any] = {}
        self._empty_hint = ""
        self.allow_empty = fresh if allow_empty is None else bool(allow_empty)
        if not self.allow_empty and not held_documents(index):
            warn_empty("vector store")

    # ------------------------------------------------------------ properties
    @property
    def embeddings(self) -> Embeddings:
        """The (raw) embeddings documents and queries are embedded with."""
        return self.embedding

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return (f"NormRankVectorStore(index={self.index!r}, embedding={type(self.embedding).__name__}, "
                f"token_counter={self.token_counter_kind!r})")

    def similarity_search_with_relevance_scores(self, query: str, k: int = 4,
                                                **kwargs: Any) -> list[tuple[Document, float]]:
        """LangChain's relevance-scored search, with ``score_threshold`` checked first (see
        :func:`_check_threshold`)."""
        _check_threshold(kwargs.get("score_threshold"))
        return super().similarity_search_with_relevance_scores(query, k, **kwargs)

    async def asimilarity_search_with_relevance_scores(self, query: str, k: int = 4,
                                                       **kwargs: Any) -> list[tuple[Document, float]]:
        """Async :meth:`similarity_search_with_relevance_scores`."""
        _check_threshold(kwargs.get("score_threshold"))
        return await super().asimilarity_search_with_relevance_scores(query, k, **kwargs)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Blended score -> [0, 1] by clipping (see :func:`blended_relevance`)."""
        return blended_relevance

    # ------------------------------------------------------------ writing
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and add texts; an id already in the store replaces that document. Returns the ids.

        ``batch_size`` (passed by LangChain's indexing API) bounds how many texts go to the
        embeddings per call; the store is still changed in one all-or-nothing step.

        Raises
        ------
        EmptyTextError, InvalidArgumentError, InvalidIdError, DuplicateIdError
            A blank text, mismatched lengths, a bad id, or an id twice in this call.
        UnitNormError
            The embeddings are unit length.
        """
        _unknown(kwargs, "add_texts", "texts, metadatas, ids and batch_size")
        if isinstance(texts, str):
            raise InvalidArgumentError("add_texts takes a list of texts, got a single string")
        items = check_texts(list(texts))
        n = len(items)
        metas = [{} for _ in range(n)] if metadatas is None else list(metadatas)
        if len(metas) != n:
            raise InvalidArgumentError(f"{len(metas)} metadatas for {n} texts")
        # Everything the index would refuse is refused here, before the (slow, maybe paid) embedding.
        allow_nul = bool(getattr(self.index, "_allow_nul", True))
        for i, t in enumerate(items):
            check_text(t, f"text {i}", allow_nul=allow_nul)
        for i, m in enumerate(metas):
            check_metadata(m, f"metadata {i}", allow_nul=allow_nul, jsonb=bool(getattr(self.index, "_jsonb", False)))
        check_explanation_key(metas, self.explanation_key)
        given = [None] * n if ids is None else list(ids)
        if len(given) != n:
            raise InvalidArgumentError(f"{len(given)} ids for {n} texts")
        new_ids = _check_ids_given([x if x is not None and x != "" else uuid.uuid4().hex for x in given])
        for i, x in enumerate(new_ids):
            check_text(x, f"id {i}", allow_nul=allow_nul)
        if len(set(new_ids)) != n:
            dup = next(x for x in new_ids if new_ids.count(x) > 1)
            raise DuplicateIdError(f"id {dup!r} is given twice in this call")
        if n == 0:
            return []
        if batch_size is not None:
            batch_size = check_option("batch_size", batch_size)
        vectors, counts = self._embed_documents(items, batch_size)
        with self._rw.write():
            return self._upsert(vectors, counts, new_ids, items, metas)

    def _embed_documents(self, texts: list[str], batch_size: int | None) -> tuple[np.ndarray, list[int]]:
        """Vectors and token counts, outside any lock (embedding is the slow part)."""
        if self._shared:
            vecs, counts = self.embedding.encoder.encode_with_counts(texts)  # type: ignore[attr-defined]
            return vecs, [int(c) for c in counts]
        step = batch_size or len(texts)
        rows: list[list[float]] = []
        for start in range(0, len(texts), step):
            rows.extend(self.embedding.embed_documents(texts[start : start + step]))
        if len(rows) != len(texts):
            raise InvalidArgumentError(f"the embeddings returned {len(rows)} vectors for {len(texts)} texts")
        counts = [int(c) for c in self._count_tokens(texts)]
        if len(counts) != len(texts):
            raise InvalidArgumentError(f"the token counter returned {len(counts)} counts for {len(texts)} texts")
        return np.asarray(rows, dtype=np.float32), counts

    def _upsert(self, vectors: np.ndarray, counts: Sequence[int], ids: list[str], texts: list[str],
                metadatas: list[Mapping[str, Any]]) -> list[str]:
        """Delete the ids that exist, add the batch; if the add fails, put the old documents back."""
        return upsert_vectors(self.index, vectors, counts, ids, texts, metadatas)

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """Add documents under ``ids`` (else each ``Document.id``, else new ids); returns the ids.

        The documents are not changed; an id already in the store replaces that document.
        """
        if isinstance(documents, (str, Document)):
            raise InvalidArgumentError("add_documents takes a list of Document objects")
        docs = list(documents)
        for i, d in enumerate(docs):
            if not isinstance(d, Document):
                raise InvalidArgumentError(f"add_documents takes Document objects; item {i} is a {type(d).__name__}"
                                           " (for plain strings use add_texts)")
        ids = kwargs.pop("ids", None)
        if ids is None:
            ids = [d.id for d in docs]
        return self.add_texts([d.page_content for d in docs], [d.metadata for d in docs], ids=ids, **kwargs)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete the documents with these ids; ids not in the store are skipped. Returns ``True``.

        ``ids=None`` raises instead of deleting everything: pass ``store.index.ids()`` for that.
        """
        _unknown(kwargs, "delete", "ids")
        if ids is None:
            raise InvalidArgumentError(
                "delete() needs the ids to delete; to empty the store pass them all: store.delete(store.index.ids())")
        if isinstance(ids, str):
            raise InvalidArgumentError("delete takes a list of ids, got a single string")
        wanted = list(dict.fromkeys(_check_ids_given(list(ids))))
        with self._rw.write():
            self._on_present(wanted, self.index.delete, "deleting")
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Stored documents for these ids, in the order given; missing ids are skipped, repeats given once."""
        if isinstance(ids, str) or not isinstance(ids, Iterable):
            raise InvalidArgumentError(f"get_by_ids takes a list of ids, got {type(ids).__name__}")
        wanted = list(dict.fromkeys(_check_ids_given(list(ids))))
        with self._rw.read():
            records = self._on_present(wanted, self.index.get, "reading") or []
        return [Document(page_content=r.text or "", metadata=r.metadata, id=r.id) for r in records]

    def _on_present(self, wanted: list[str], action: Callable[[list[str]], Any], doing: str) -> Any:
        """``action`` on those of ``wanted`` the index holds now (``None`` when it holds none). An id that
        another process deletes in between makes the index raise: look again, a few times."""
        for _ in range(3):
            present = [x for x in wanted if x in self.index]
            if not present:
                return None
            try:
                return action(present)
            except UnknownIdError:
                continue
        raise UnknownIdError(f"ids kept changing while {doing}: {wanted[:5]}")

    # ------------------------------------------------------------ searching
    def _query(self, query: str) -> tuple[np.ndarray, int]:
        """The raw query vector and its token count, computed before any lock is taken (the slow part).
        The query was checked by :meth:`_door`."""
        if self._shared:  # exactly what index.search(text) would compute, without holding the store
            vecs, counts = self.embedding.encoder.encode_with_counts([query])  # type: ignore[attr-defined]
            return np.asarray(vecs[0], dtype=np.float32), int(counts[0])
        vec = np.asarray(self.embedding.embed_query(query), dtype=np.float32).ravel()
        norm = float(np.linalg.norm(vec.astype(np.float64)))
        if abs(norm - 1.0) < UNIT_NORM_TOLERANCE:
            check_norm_signal(np.array([norm]))  # raises UnitNormError with the raw-embeddings hint
        return vec, int(self._count_tokens([query])[0])

    def _empty_result(self) -> list[Hit]:
        """``[]`` for an empty store when that is allowed, else the error that says why it is empty."""
        if self.allow_empty or held_documents(self.index):  # emptied by deletes: as InMemoryVectorStore
            return []
        raise empty_error("vector store" + self._empty_hint)

    def _hits(self, query: str | np.ndarray, k: Any, flt: Any, query_token_count: int | None) -> list[Hit]:
        """The index's blended top-``k`` (``k`` clamped to the store's size); call under the read lock."""
        return search_up_to(self.index, query, check_k(k), self._empty_result, filter=flt,
                            query_token_count=query_token_count)

    def _door(self, query: Any, vector: Any, k: Any, flt: Any, score_threshold: Any = None) -> tuple[Any, Any]:
        """Every argument checked before the store is looked at, so an empty store refuses what a full
        one would (it answered ``[]`` to a NaN vector); returns the checked vector and filter."""
        check_k(k)
        _check_threshold(score_threshold)
        flt = check_filter(flt)
        if vector is None:
            if not isinstance(query, str):
                raise InvalidArgumentError(f"the query must be a string, got {type(query).__name__}")
            check_texts([query])
            return None, flt
        return _query_vector(vector), flt

    def _scored(self, query: str | None, vector: Sequence[float] | None, k: Any, flt: Any,
                query_token_count: int | None, score_threshold: float | None) -> list[Hit]:
        vec, flt = self._door(query, vector, k, flt, score_threshold)
        if len(self.index) == 0:  # no embedding call (maybe paid) for an empty store
            return self._empty_result()
        if vec is None:
            q, count = self._query(query)  # type: ignore[arg-type]
        else:
            q, count = vec, query_token_count
        with self._rw.read():
            hits = self._hits(q, k, flt, count)
        if score_threshold is not None:
            hits = [h for h in hits if blended_relevance(h.score) >= score_threshold]
        return hits

    def similarity_search(self, query: str, k: int = 4, *, filter: Any = None,
                          score_threshold: float | None = None, **kwargs: Any) -> list[Document]:
        """The ``k`` documents with the highest blended score, exactly as stored.

        ``filter`` is a dict (key -> value, or a list of accepted values) or a callable on the
        metadata dict; ``score_threshold`` keeps results whose relevance (see
        :func:`blended_relevance`) reaches it.
        """
        _unknown(kwargs, "similarity_search", "query, k, filter and score_threshold (fetch_k and lambda_mult "
                 "are for max_marginal_relevance_search / search_type='mmr')")
        return [to_document(h, None) for h in self._scored(query, None, k, filter, None, score_threshold)]

    def similarity_search_with_score(self, query: str, k: int = 4, *, filter: Any = None,
                                     score_threshold: float | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """``(document, blended score)`` pairs, best first; each document carries the explanation
        under ``metadata[explanation_key]``. Higher is more similar."""
        _unknown(kwargs, "similarity_search_with_score", "query, k, filter and score_threshold")
        hits = self._scored(query, None, k, filter, None, score_threshold)
        return [(to_document(h, self.explanation_key), h.score) for h in hits]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, *, filter: Any = None,
                                    query_token_count: int | None = None, **kwargs: Any) -> list[Document]:
        """As :meth:`similarity_search` for a raw query vector (its token count is needed only when
        the weights are query-conditioned, ``b != 0``)."""
        _unknown(kwargs, "similarity_search_by_vector", "embedding, k, filter and query_token_count")
        return [to_document(h, None) for h in self._scored(None, embedding, k, filter, query_token_count, None)]

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4, *, filter: Any = None,
                                               query_token_count: int | None = None,
                                               **kwargs: Any) -> list[tuple[Document, float]]:
        """As :meth:`similarity_search_with_score` for a raw query vector."""
        _unknown(kwargs, "similarity_search_with_score_by_vector", "embedding, k, filter and query_token_count")
        hits = self._scored(None, embedding, k, filter, query_token_count, None)
        return [(to_document(h, self.explanation_key), h.score) for h in hits]

    # ------------------------------------------------------------ MMR
    def _mmr(self, query: str | None, vector: Sequence[float] | None, k: Any, fetch_k: Any, lambda_mult: Any,
             flt: Any, query_token_count: int | None) -> list[Hit]:
        """Maximal marginal relevance over the blended top-``fetch_k``.

        Relevance is the blended score (so ``lambda_mult=1`` gives exactly the similarity order);
        redundancy is the cosine between documents, from their stored vectors. As in LangChain's own
        stores, MMR picks among the ``fetch_k`` fetched, so a ``fetch_k`` below ``k`` gives ``fetch_k``
        documents (it gave ``k``, some from outside the top ``fetch_k``).
        """
        k = check_k(k)
        fetch_k = check_k(fetch_k, "fetch_k")
        lambda_mult = check_lambda(lambda_mult)
        vec, flt = self._door(query, vector, k, flt)
        if len(self.index) == 0:
            return self._empty_result()
        if vec is None:
            q, count = self._query(query)  # type: ignore[arg-type]
        else:
            q, count = vec, query_token_count
        with self._rw.read(), locked(self.index):  # the hits and their vectors from one state of the index
            hits = self._hits(q, fetch_k, flt, count)
            if len(hits) <= 1:
                return hits[:k]
            raw = self.index.vectors([h.id for h in hits])
        return mmr_select(hits, raw, k, lambda_mult)

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      *, filter: Any = None, **kwargs: Any) -> list[Document]:
        """``k`` documents chosen among the blended top-``fetch_k`` for relevance and diversity
        (``lambda_mult``: 1 = relevance only, 0 = diversity only)."""
        _unknown(kwargs, "max_marginal_relevance_search", "query, k, fetch_k, lambda_mult and filter")
        return [to_document(h, None) for h in self._mmr(query, None, k, fetch_k, lambda_mult, filter, None)]

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, *, filter: Any = None,
                                                query_token_count: int | None = None,
                                                **kwargs: Any) -> list[Document]:
        """As :meth:`max_marginal_relevance_search` for a raw query vector."""
        _unknown(kwargs, "max_marginal_relevance_search_by_vector",
                 "embedding, k, fetch_k, lambda_mult, filter and query_token_count")
        return [to_document(h, None)
                for h in self._mmr(None, embedding, k, fetch_k, lambda_mult, filter, query_token_count)]

    # ------------------------------------------------------------ retriever
    def as_retriever(self, **kwargs: Any) -> NormRankVectorStoreRetriever:
        """A ``VectorStoreRetriever`` whose documents carry their score explanation.

        ``search_type``: ``"similarity"`` (default), ``"mmr"`` or ``"similarity_score_threshold"``;
        ``search_kwargs``: ``k``, ``filter``, ``score_threshold``, ``fetch_k``, ``lambda_mult``
        (defaults from the ``langchain`` section when the store came from a config file).
        """
        tags = kwargs.pop("tags", None) or [*self._get_retriever_tags()]
        search_kwargs = {**self._default_search_kwargs, **(kwargs.pop("search_kwargs", None) or {})}
        return NormRankVectorStoreRetriever(vectorstore=self, tags=tags, search_kwargs=search_kwargs, **kwargs)

    # ------------------------------------------------------------ builders
    def _settle_empty(self, allow_empty: bool | None, default: bool) -> None:
        self.allow_empty = default if allow_empty is None else bool(allow_empty)
        if not self.allow_empty and not held_documents(self.index):
            warn_empty("vector store" + self._empty_hint)

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | RawEncoder | None = None,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        index: SearchableIndex | None = None,
        backend: Literal["faiss", "pgvector"] = "faiss",
        dsn: str | None = None,
        table: str = "normrank_docs",
        allow_empty: bool | None = None,
        token_counter: TokenCounter | None = None,
        explanation_key: str = EXPLANATION_KEY,
        **index_kwargs: Any,
    ) -> NormRankVectorStore:
        """Embed ``texts`` into a new store (LangChain's signature; ``embedding`` defaults to
        :class:`NormRankEmbeddings`).

        ``backend="pgvector"`` keeps the documents in PostgreSQL table ``table`` at ``dsn``
        (``None``: ``$NORMRANK_PG_DSN``) instead of an in-memory FAISS index; ``index_kwargs``
        (``weights``, ``index_type``, ...) configure the new index.
        """
        store = cls(embedding, index=index, allow_empty=True, token_counter=token_counter,
                    explanation_key=explanation_key, backend=backend, dsn=dsn, table=table, **index_kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        store._settle_empty(allow_empty, default=True)
        return store

    @classmethod
    def from_documents(cls, documents: list[Document], embedding: Embeddings | RawEncoder | None = None,
                       **kwargs: Any) -> NormRankVectorStore:
        """As :meth:`from_texts`, keeping each ``Document.id`` (new ids where unset)."""
        docs = list(documents)
        if "ids" not in kwargs:
            kwargs["ids"] = [d.id for d in docs]
        return cls.from_texts([d.page_content for d in docs], embedding, [d.metadata for d in docs], **kwargs)

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings | RawEncoder | None = None,
                          metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                          **kwargs: Any) -> NormRankVectorStore:
        """Async :meth:`from_texts`, run in a worker thread."""
        return await run_in_executor(None, lambda: cls.from_texts(texts, embedding, metadatas, ids=ids, **kwargs))

    @classmethod
    async def afrom_documents(cls, documents: list[Document], embedding: Embeddings | RawEncoder | None = None,
                              **kwargs: Any) -> NormRankVectorStore:
        """Async :meth:`from_documents`, run in a worker thread."""
        return await run_in_executor(None, lambda: cls.from_documents(documents, embedding, **kwargs))

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig,
        *,
        embedding: Embeddings | RawEncoder | None = None,
        documents: Sequence[Document] | None = None,
        allow_empty: bool | None = None,
        token_counter: TokenCounter | None = None,
        explanation_key: str = EXPLANATION_KEY,
    ) -> NormRankVectorStore:
        """Build from a ``normrank.yaml`` (path or dict): the index at ``store.path`` (or the pgvector
        table), or a new one as the file describes.

        ``documents``, if given, are added. ``as_retriever()`` then defaults to the file's
        ``langchain`` section (``k``, ``filter``). An index that is still empty warns here and makes
        searches raise unless ``allow_empty=True`` (a wrong ``store.path`` should not look like
        "no relevant documents").
        """
        config = load_config(source)
        index = build_index(config)
        store = cls(embedding, index=index, allow_empty=True, token_counter=token_counter,
                    explanation_key=explanation_key)
        store._default_search_kwargs = {"k": config.langchain.k}
        if config.langchain.filter is not None:
            store._default_search_kwargs["filter"] = config.langchain.filter
        s = config.store
        store._empty_hint = (f" (pgvector table {s.table!r})" if s.backend == "pgvector"
                             else f" (store.path {s.path!r} holds no saved index)" if s.path else "")
        if documents:
            store.add_documents(list(documents))
        store._settle_empty(allow_empty, default=False)
        return store

    # ------------------------------------------------------------ persistence
    def save_local(self, folder_path: str | os.PathLike[str], index_name: str | None = None) -> Path:
        """Save to ``folder_path`` through normrank's atomic, checksummed format (no pickle).

        ``index_name`` (LangChain's FAISS store takes it) saves into the sub-folder of that name, so several
        stores can share ``folder_path``; :meth:`load_local` takes the same name.

        Returns the version folder written. A pgvector store lives in PostgreSQL and has nothing to
        save locally (``InvalidArgumentError``); an empty store saves and reloads empty, except one that never
        held a document and embeds with other ``Embeddings`` than normrank's (``EmptyCorpusError``: its
        dimension is not known yet).
        """
        if not isinstance(self.index, NormIndex):
            raise InvalidArgumentError(
                f"save_local saves an in-memory NormIndex; this store's {type(self.index).__name__} already "
                "persists in its database")
        with self._rw.read():
            return self.index.save(_named_folder(folder_path, index_name))

    @classmethod
    def load_local(
        cls,
        folder_path: str | os.PathLike[str],
        embeddings: Embeddings | RawEncoder | None = None,
        *,
        allow_empty: bool | None = None,
        token_counter: TokenCounter | None = None,
        explanation_key: str = EXPLANATION_KEY,
        allow_dangerous_deserialization: bool | None = None,
        index_name: str | None = None,
    ) -> NormRankVectorStore:
        """Load a store saved by :meth:`save_local` (or any ``NormIndex.save`` folder).

        Every file's checksum is verified; nothing is unpickled, so
        ``allow_dangerous_deserialization`` is never needed (accepted, with a warning, for code
        written for LangChain's FAISS store). ``embeddings`` must be the ones the store was built
        with; ``None`` uses the saved normrank encoder.

        Raises
        ------
        FileNotFoundError, IndexFormatError
            Nothing is saved there, or the files are altered or inconsistent.
        InvalidArgumentError
            The store was built with other embeddings and none are given.
        """
        if allow_dangerous_deserialization is not None:
            warnings.warn("allow_dangerous_deserialization is not needed: normrank saves FAISS, JSON and NumPy "
                          "files and never unpickles; the argument is ignored", UserWarning, stacklevel=2)
        emb = _as_embeddings(embeddings)
        encoder = emb.encoder if isinstance(emb, NormRankEmbeddings) else None
        folder_path = _named_folder(folder_path, index_name)
        index = NormIndex.load(folder_path, encoder=encoder)
        if emb is None and getattr(index, "_encoder", None) is None:
            raise InvalidArgumentError(
                f"the store at {folder_path} was built with embeddings other than normrank's: pass them, "
                "load_local(path, embeddings)")
        store = cls(emb, index=index, allow_empty=True, token_counter=token_counter,
                    explanation_key=explanation_key)
        store._settle_empty(allow_empty, default=False)
        return store


class NormRankVectorStoreRetriever(VectorStoreRetriever):
    """``VectorStoreRetriever`` for :class:`NormRankVectorStore`: same search types and
    ``search_kwargs``, and every document carries ``metadata["normrank"]`` (score, cosine, norm,
    norm feature, weight), where LangChain's own retriever drops the scores.

    ``invoke(q, k=2)`` and ``invoke(q, search_kwargs={"k": 2})`` both override the stored
    ``search_kwargs`` for one call.
    """

    vectorstore: NormRankVectorStore
    allowed_search_types: ClassVar[tuple[str, ...]] = ("similarity", "similarity_score_threshold", "mmr")

    def _search(self, query: str, kwargs: dict[str, Any]) -> list[Document]:
        extra = kwargs.pop("search_kwargs", None)
        kw = {**self.search_kwargs, **kwargs, **(extra or {})}
        store = self.vectorstore
        key = store.explanation_key
        if self.search_type in ("similarity", "similarity_score_threshold"):
            for mmr_only in ("fetch_k", "lambda_mult"):  # kept in search_kwargs when switching search_type
                kw.pop(mmr_only, None)
        if self.search_type == "similarity":
            return [doc for doc, _ in store.similarity_search_with_score(query, **kw)]
        if self.search_type == "similarity_score_threshold":
            return [doc for doc, _ in store.similarity_search_with_relevance_scores(query, **kw)]
        if self.search_type == "mmr":
            threshold = _check_threshold(kw.pop("score_threshold", None))
            filter_ = kw.pop("filter", None)
            hits = store._mmr(query, None, kw.pop("k", 4), kw.pop("fetch_k", 20), kw.pop("lambda_mult", 0.5),
                              filter_, None)
            _unknown(kw, "an mmr search", "k, fetch_k, lambda_mult, filter and score_threshold")
            if threshold is not None:
                hits = [h for h in hits if blended_relevance(h.score) >= threshold]
            return [to_document(h, key) for h in hits]
        raise InvalidArgumentError(f"search_type {self.search_type!r} not allowed; choose one of "
                                   f"{list(self.allowed_search_types)}")

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        return self._search(query, kwargs)

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        """The search (embedding + index) runs in a worker thread, off the event loop."""
        return await run_in_executor(None, self._search, query, kwargs)
