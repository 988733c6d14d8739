"""``NormRankVectorStore``: a LlamaIndex vector store over a normrank index.

Why a store of its own: any other store ranks the raw vectors of
:class:`~llama_index.embeddings.normrank.NormRankEmbedding` by its own metric (FAISS by the raw
dot product or raw L2, ``SimpleVectorStore`` by plain cosine), never by normrank's blend
``cos + w(q) * g(d)``. This store hands every node to a :class:`normrank.NormIndex` (or a
:class:`normrank.pgvector_store.PgVectorNormIndex`), so ``VectorStoreIndex`` retrieval returns
the exact blended top-k in the first stage, with the blended score as ``NodeWithScore.score``.

What is stored per node
    The raw embedding (from ``NormRankEmbedding``; a node without one is encoded with the index's
    encoder), the token count of the text the embedding was computed from (the node's EMBED view,
    counted by the encoder's own tokenizer, so norm and length are calibrated on the same text), the
    node text, and LlamaIndex's usual metadata dict (``node_to_metadata_dict``: the user's keys at
    the top level for filtering, the node itself as JSON in ``_node_content``) plus ``_node_id``,
    so ``node_ids`` restrictions run inside the index's own filtered search. ``stores_text=True``:
    ``VectorStoreIndex`` needs no docstore copy of text nodes.

The explanation
    Each returned node carries ``metadata["normrank"] = {"score", "cosine", "norm_feature",
    "weight", "norm"}``, excluded from the LLM and embed views. It never overwrites a user's key;
    a node whose own metadata uses ``"normrank"`` is refused at :meth:`NormRankVectorStore.add`.

Filters
    ``MetadataFilters`` with every standard operator and nested AND / OR / NOT conditions
    (:func:`metadata_filter`), plus ``node_ids`` and ``doc_ids``. They run inside the index's
    filtered search, so the top-k is exact among the matching nodes.

Persistence
    :meth:`NormRankVectorStore.persist` saves through normrank's checksummed, versioned format
    (FAISS + JSON + NumPy, never pickle). ``StorageContext.persist(dir)`` asks for
    ``dir/default__vector_store.json``; the store writes the folder ``dir/default__vector_store.normrank``
    instead (a folder named ``*.json`` would mislead), and :meth:`from_persist_dir` reads it back.

Concurrency
    The index serialises its own reads and writes; this store adds one lock so compound
    operations (delete by document, delete by filter, clear) act on one consistent state. The
    async methods run the same code in a worker thread, so the event loop keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import (
    DEFAULT_PERSIST_DIR,
    DEFAULT_PERSIST_FNAME,
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from normrank._validation import MAX_METADATA_BYTES, check_metadata, check_text, is_blank_text
from normrank.encoders import RawEncoder
from normrank.errors import (
    DuplicateIdError,
    EmptyCorpusError,
    EmptyTextError,
    InvalidArgumentError,
    UnitNormError,
    UnknownIdError,
)
from normrank.filters import MAX_FILTER_DEPTH
from normrank.index_base import held_documents, locked, search_up_to, upsert_vectors
from normrank.mmr import check_lambda, mmr_select
from normrank.scoring import Hit
from normrank.store import NormIndex, Record, SearchableIndex

from llama_index.retrievers.normrank.base import (
    EXPLANATION_KEY,
    check_reserved,
    empty_message,
    explain,
    is_explanation,
    with_explanation,
)

#: This store's key in ``NormIndex.adapter_state`` (saved with the index).
_ADAPTER_KEY = "llama_index"
def _saved_references(state: Any) -> set[str]:
    """The deleted reference-node ids an index's ``adapter_state`` holds for this store (none if unreadable)."""
    mine = state.get(_ADAPTER_KEY) if isinstance(state, dict) else None
    saved = mine.get("deleted_reference_nodes") if isinstance(mine, dict) else None
    return {x for x in saved if isinstance(x, str)} if isinstance(saved, list) else set()


#: Metadata key holding the node id beside LlamaIndex's ``_node_content`` (``node_ids`` filters read it).
NODE_ID_KEY = "_node_id"
#: Node classes LlamaIndex's ``VectorStoreIndex`` lists in its ``nodes_dict`` when the store keeps the text.
_REFERENCE_NODE_TYPES = frozenset({"IndexNode", "ImageNode"})
#: Suffix of the folder :meth:`NormRankVectorStore.persist` writes for a ``*.json`` persist path.
PERSIST_SUFFIX = ".normrank"
_DEFAULT_NAMESPACE = "default"
_NAMESPACE_SEP = "__"

Predicate = Callable[[Mapping[str, Any]], bool]

_LIST_OPERATORS = {FilterOperator.IN, FilterOperator.NIN, FilterOperator.ANY, FilterOperator.ALL}
_ORDER_OPERATORS = {FilterOperator.GT, FilterOperator.GTE, FilterOperator.LT, FilterOperator.LTE}


# ---------------------------------------------------------------- filters
def _check_filter(f: MetadataFilter) -> None:
    """Refuse a filter whose value cannot mean anything for its operator, before any search."""
    op = f.operator
    if op in _LIST_OPERATORS and not isinstance(f.value, list):
        raise InvalidArgumentError(f"filter on {f.key!r}: operator {op.value!r} needs a list value, got {f.value!r}")
    if op in (FilterOperator.TEXT_MATCH, FilterOperator.TEXT_MATCH_INSENSITIVE) and not isinstance(f.value, str):
        raise InvalidArgumentError(f"filter on {f.key!r}: operator {op.value!r} needs a string value, got {f.value!r}")
    if op in _ORDER_OPERATORS and not isinstance(f.value, (int, float, str)):
        raise InvalidArgumentError(f"filter on {f.key!r}: operator {op.value!r} needs a number or a string, "
                                   f"got {f.value!r}")
    if op in (FilterOperator.CONTAINS,) and isinstance(f.value, list):
        raise InvalidArgumentError(f"filter on {f.key!r}: 'contains' takes one value (use 'any' or 'all' for a list)")


def _ordered(have: Any, want: Any, op: FilterOperator) -> bool:
    numeric = (int, float)
    comparable = (isinstance(have, numeric) and not isinstance(have, bool) and isinstance(want, numeric)) or (
        isinstance(have, str) and isinstance(want, str))
    if not comparable:
        return False  # "10" > 3 or None < 2: no match rather than a TypeError in the middle of a search
    if op is FilterOperator.GT:
        return have > want
    if op is FilterOperator.GTE:
        return have >= want
    if op is FilterOperator.LT:
        return have < want
    return have <= want


def _one(f: MetadataFilter, metadata: Mapping[str, Any]) -> bool:
    op, want = f.operator, f.value
    have = metadata.get(f.key)
    if op is FilterOperator.IS_EMPTY:
        return have is None or have == "" or have == []
    if have is None:  # a missing key (or null) matches only the negative operators, as in SimpleVectorStore
        return op in (FilterOperator.NE, FilterOperator.NIN)
    if op is FilterOperator.EQ:
        return have == want
    if op is FilterOperator.NE:
        return have != want
    if op in _ORDER_OPERATORS:
        return _ordered(have, want, op)
    if op is FilterOperator.IN:
        return _hashable_in(have, want)
    if op is FilterOperator.NIN:
        return not _hashable_in(have, want)
    if op is FilterOperator.TEXT_MATCH:
        return isinstance(have, str) and want in have
    if op is FilterOperator.TEXT_MATCH_INSENSITIVE:
        return isinstance(have, str) and want.lower() in have.lower()
    if op is FilterOperator.CONTAINS:  # a list holding ``want``, or a string holding it, as SimpleVectorStore
        if isinstance(have, str):
            return isinstance(want, str) and want in have
        return isinstance(have, list) and want in have
    if op is FilterOperator.ANY:
        return isinstance(have, list) and any(v in have for v in want)
    if op is FilterOperator.ALL:
        return isinstance(have, list) and all(v in have for v in want)
    raise InvalidArgumentError(f"unsupported filter operator {op!r}")  # pragma: no cover - enum is exhaustive


def _hashable_in(have: Any, want: list[Any]) -> bool:
    if isinstance(have, list):  # a list-valued key is "in" when one of its items is
        return any(h in want for h in have)
    return have in want


def metadata_filter(filters: MetadataFilters | None, _depth: int = 0) -> Predicate | None:
    """A predicate over stored metadata that applies LlamaIndex ``MetadataFilters``.

    Every ``FilterOperator`` is supported; ``condition`` may be ``and``, ``or`` or ``not`` (none of
    the filters holds), and a filter may itself be a ``MetadataFilters`` (nested). A missing key
    matches only ``!=``, ``nin`` and ``is_empty``; order operators compare numbers with numbers and
    strings with strings (anything else does not match); ``contains`` matches a list holding the value
    or, as in ``SimpleVectorStore``, a string holding it; ``any``/``all`` need a list-valued key; ``in``/``nin``
    on a list-valued key test its items (any item in the values; ``SimpleVectorStore`` tests the whole list
    as one value, which never matches a list of scalars). Values that make no sense for their operator are refused
    here, before any search, with :class:`normrank.errors.InvalidArgumentError`.
    """
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise InvalidArgumentError(
            f"filters must be llama_index MetadataFilters, got {type(filters).__name__}")
    if _depth > MAX_FILTER_DEPTH:  # a RecursionError, which an app serves as a 500, not as a bad request
        raise InvalidArgumentError(f"filters: MetadataFilters are nested more than {MAX_FILTER_DEPTH} deep")
    parts: list[Predicate] = []
    for f in filters.filters:
        if isinstance(f, MetadataFilters):
            sub = metadata_filter(f, _depth + 1)
            parts.append(sub if sub is not None else (lambda m: True))
        elif isinstance(f, MetadataFilter):
            _check_filter(f)
            parts.append(lambda m, f=f: _one(f, m))
        else:
            raise InvalidArgumentError(f"a filter must be a MetadataFilter or MetadataFilters, got {type(f).__name__}")
    if not parts:
        return None
    condition = filters.condition or FilterCondition.AND
    if condition is FilterCondition.AND:
        return lambda m: all(p(m) for p in parts)
    if condition is FilterCondition.OR:
        return lambda m: any(p(m) for p in parts)
    if condition is FilterCondition.NOT:
        return lambda m: not any(p(m) for p in parts)
    raise InvalidArgumentError(f"unsupported filter condition {condition!r}")  # pragma: no cover


def _combine(filters: MetadataFilters | None, node_ids: Sequence[str] | None,
             doc_ids: Sequence[str] | None) -> Predicate | None:
    # An empty list restricts nothing, as in LlamaIndex's own stores: VectorStoreIndex.as_retriever passes
    # node_ids=[] (its empty nodes_dict) for every store that keeps the text.
    parts: list[Predicate] = []
    meta = metadata_filter(filters)
    if node_ids:
        wanted = set(_strings(node_ids, "node_ids"))
        parts.append(lambda m: m.get(NODE_ID_KEY) in wanted)
    if doc_ids:
        docs = set(_strings(doc_ids, "doc_ids"))
        parts.append(lambda m: m.get("ref_doc_id") in docs)
    if meta is not None:
        parts.append(meta)
    if not parts:
        return None
    return lambda m: all(p(m) for p in parts)


def _strings(values: Iterable[Any], name: str) -> list[str]:
    if isinstance(values, str):
        raise InvalidArgumentError(f"{name} must be a list of ids, got a single string")
    out = list(values)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise InvalidArgumentError(f"{name} must hold strings, got {bad[:3]!r}")
    return out


def _no_kwargs(method: str, kwargs: Mapping[str, Any]) -> None:
    if kwargs:
        raise InvalidArgumentError(f"NormRankVectorStore.{method} got unknown keyword arguments {sorted(kwargs)}")


def _folder(persist_path: str | os.PathLike[str]) -> Path:
    """Where a persist path is saved: ``*.json`` (what ``StorageContext`` asks for) becomes ``*.normrank``."""
    p = Path(persist_path)
    return p.with_suffix(PERSIST_SUFFIX) if p.suffix == ".json" else p


def _check_fs(fs: Any) -> None:
    if fs is None:
        return
    protocol = getattr(fs, "protocol", None)
    protocols = protocol if isinstance(protocol, (tuple, list)) else (protocol,)
    if not {"file", "local"} & set(protocols):
        raise InvalidArgumentError(
            f"NormRankVectorStore persists to the local file system only (got an fsspec {type(fs).__name__}); "
            "save locally and copy the folder")


# ---------------------------------------------------------------- the store
class NormRankVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store that ranks by normrank's blend, exactly, in the first stage.

    Parameters
    ----------
    index:
        A :class:`normrank.NormIndex` (or ``PgVectorNormIndex``) to serve; by default a new empty
        ``NormIndex`` built from ``encoder`` and ``index_kwargs`` (``weights``, ``index_type``, ...).
    encoder:
        The raw encoder of a new index; share the ``NormRankEmbedding``'s (``embed.encoder``) so
        queries and nodes are encoded by one model.
    allow_empty:
        Whether querying an index that never held a node returns no nodes (``True``) or raises
        :class:`normrank.errors.EmptyCorpusError` (such an index usually sits at a misplaced path).
        ``None``: ``True`` for a new store (no ``index``: LlamaIndex's usual start, create then
        insert), ``False`` for one built on an index the caller passes or loads, which then also warns
        at construction. A store emptied by deletes returns no nodes either way, as ``SimpleVectorStore``
        does (:func:`normrank.index_base.held_documents`).

    ``stores_text`` and ``is_embedding_query`` are accepted as ``True`` only, what the store is, so
    LlamaIndex's ``from_dict(store.to_dict())`` (and ``from_json``) builds a store with the same settings.
    The dict holds settings, not documents: those are saved by :meth:`persist` and read back by
    :meth:`from_persist_dir`.

    Raises
    ------
    InvalidArgumentError
        An ``index`` together with ``encoder`` or index settings, an unknown setting, or a bad value.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    stores_text: bool = True
    is_embedding_query: bool = True
    allow_empty: bool = Field(False, description="Return no nodes (instead of raising) when the index never held a node.")

    _index: Any = PrivateAttr()
    _lock: Any = PrivateAttr()
    _former_references: Any = PrivateAttr()  # ids of IndexNode / ImageNode nodes deleted through this store

    def __init__(
        self,
        index: SearchableIndex | None = None,
        *,
        encoder: RawEncoder | None = None,
        allow_empty: bool | None = None,
        stores_text: bool = True,
        is_embedding_query: bool = True,
        **index_kwargs: Any,
    ) -> None:
        if allow_empty is not None and not isinstance(allow_empty, bool):
            raise InvalidArgumentError(f"allow_empty must be True, False or None, got {allow_empty!r}")
        # the store's own fields, as to_dict() writes them: what it is, not settings (from_dict passed them to
        # NormIndex, which named them as unknown NormIndex arguments)
        for name, value in (("stores_text", stores_text), ("is_embedding_query", is_embedding_query)):
            if value is not True:
                raise InvalidArgumentError(f"NormRankVectorStore: {name} is always True (the store keeps the "
                                           f"text and is queried by embeddings), got {value!r}")
        if allow_empty is None:
            allow_empty = index is None
        if index is None:
            try:
                index = NormIndex(encoder, **index_kwargs)
            except TypeError as exc:  # an unknown setting: never silently ignored
                raise InvalidArgumentError(f"NormRankVectorStore: {exc}") from exc
            given = False
        else:
            if encoder is not None or index_kwargs:
                extra = (["encoder"] if encoder is not None else []) + sorted(index_kwargs)
                raise InvalidArgumentError(
                    f"NormRankVectorStore got an index and also {extra}: set those on the index itself "
                    "(or leave index out to build a new one)")
            if not isinstance(index, SearchableIndex) or not all(
                    hasattr(index, m) for m in ("add_vectors", "delete", "get", "ids", "encoder")):
                raise InvalidArgumentError(
                    f"index must be a normrank.NormIndex or PgVectorNormIndex, got {type(index).__name__}")
            given = True
        super().__init__(allow_empty=allow_empty)
        self._index = index
        self._lock = threading.RLock()
        self._former_references: set[str] = set()
        if given and not allow_empty and not held_documents(index):
            warnings.warn(empty_message("NormRankVectorStore"), stacklevel=2)

    @classmethod
    def class_name(cls) -> str:
        return "NormRankVectorStore"

    @property
    def client(self) -> SearchableIndex:
        """The normrank index behind the store."""
        return self._index

    @property
    def index(self) -> SearchableIndex:
        """The normrank index behind the store (``fit``, ``set_weights``, ``search`` are there)."""
        return self._index

    # No __len__: LlamaIndex tests stores for truth (``if vector_store:`` in StorageContext.from_defaults),
    # and an empty store that is falsy would be silently replaced by a SimpleVectorStore.

    # ------------------------------------------------------------ adding
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Add nodes with their raw embeddings (all or nothing); returns their ids.

        A node whose id is already stored replaces the stored node, as in ``SimpleVectorStore``; a
        refused batch leaves the stored nodes as they were.

        Raises
        ------
        UnitNormError
            The embeddings are unit length (a stock embedding model): use ``NormRankEmbedding``.
        DuplicateIdError
            A node id repeats in the batch.
        InvalidArgumentError, EmptyTextError, DimensionMismatchError
            Metadata that uses the reserved ``"normrank"`` key or is not JSON, a node with no text to
            count, or an embedding of another dimension. Nothing is stored in any of these cases.
        """
        _no_kwargs("add", add_kwargs)
        items = list(nodes)
        if not items:
            return []
        ids, texts, metas, embed_texts = [], [], [], []
        for n in items:
            if not isinstance(n, BaseNode):
                raise InvalidArgumentError(f"add takes LlamaIndex nodes, got a {type(n).__name__}")
            metadata = dict(n.metadata)
            if EXPLANATION_KEY in metadata and is_explanation(metadata[EXPLANATION_KEY]):
                metadata.pop(EXPLANATION_KEY)  # a node that came out of a normrank query: drop the old score
                n = n.model_copy(update={"metadata": metadata})
            check_reserved(n.metadata, f"node {n.node_id!r}")
            # Checked here, by node id: LlamaIndex's JSON of the node turns NaN into null before the index
            # sees it (stored as None, in silence)
            check_metadata(n.metadata, f"node {n.node_id!r} metadata")
            embed_text = n.get_content(metadata_mode=MetadataMode.EMBED)
            if is_blank_text(embed_text):
                raise EmptyTextError(f"node {n.node_id!r} has no text: it has no meaning to embed or rank")
            meta = node_to_metadata_dict(n, remove_text=True, flat_metadata=False)
            # ... and what is stored, also by node id: LlamaIndex repeats the metadata inside _node_content,
            # and there once more per relationship (a split document's source, previous and next node), so
            # 300 KB of metadata was refused as "metadata 1 is larger than 1,000,000 bytes"
            check_metadata(meta, f"node {n.node_id!r} as LlamaIndex stores it (its metadata, again inside "
                           "_node_content, and there once more for each related node: source, previous, next)",
                           max_bytes=MAX_METADATA_BYTES)
            meta[NODE_ID_KEY] = n.node_id
            ids.append(n.node_id)
            texts.append(check_text(n.get_content(metadata_mode=MetadataMode.NONE), f"node {n.node_id!r} text"))
            metas.append(meta)
            embed_texts.append(embed_text)
        encoder = self._index.encoder
        missing = [i for i, n in enumerate(items) if n.embedding is None]
        vectors: list[Any] = [n.embedding for n in items]
        if missing:  # nodes given straight to the store: encode them with the index's own encoder
            encoded = encoder.encode([embed_texts[i] for i in missing])
            for j, i in enumerate(missing):
                vectors[i] = encoded[j]
        try:
            matrix = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"node embeddings must be equal-length lists of numbers: {exc}") from exc
        counts = encoder.token_counts(embed_texts)
        if len(set(ids)) != len(ids):
            dup = next(x for x in ids if ids.count(x) > 1)
            raise DuplicateIdError(f"node id {dup!r} is given twice in this call")
        with self._lock:
            try:  # a node id the store holds is replaced, as in SimpleVectorStore; a refused batch loses nothing
                return upsert_vectors(self._index, matrix, counts, ids, texts, metas)
            except UnitNormError as exc:
                raise UnitNormError(
                    f"{exc} In LlamaIndex, embed with llama_index.embeddings.normrank.NormRankEmbedding "
                    "(VectorStoreIndex(..., embed_model=NormRankEmbedding()) or Settings.embed_model)."
                ) from exc

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """:meth:`add` in a worker thread, so the event loop keeps running."""
        return await asyncio.to_thread(self.add, nodes, **kwargs)

    # ------------------------------------------------------------ reading
    def _records(self, predicate: Predicate | None = None) -> list[Record]:
        records = self._index.get(self._index.ids())
        return records if predicate is None else [r for r in records if predicate(r.metadata)]

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """Stored nodes (with text, without embedding): those of ``node_ids`` (in that order; unknown ids are
        skipped) that match ``filters``; all stored nodes when both are ``None``."""
        predicate = metadata_filter(filters)
        with self._lock:
            if node_ids is not None:
                wanted = _strings(node_ids, "node_ids")
                present = set(self._index.ids())
                records = self._index.get([i for i in dict.fromkeys(wanted) if i in present])
                if predicate is not None:
                    records = [r for r in records if predicate(r.metadata)]
            else:
                records = self._records(predicate)
        return [_to_node(r.id, r.text, r.metadata) for r in records]

    async def aget_nodes(self, node_ids: list[str] | None = None,
                         filters: MetadataFilters | None = None) -> list[BaseNode]:
        return await asyncio.to_thread(self.get_nodes, node_ids, filters)

    # ------------------------------------------------------------ deleting
    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the document ``ref_doc_id`` (none stored: nothing happens)."""
        _no_kwargs("delete", delete_kwargs)
        if not isinstance(ref_doc_id, str):
            raise InvalidArgumentError(f"ref_doc_id must be a string, got {type(ref_doc_id).__name__}")
        with self._lock:
            self._delete_where(lambda: [r.id for r in self._records(lambda m: m.get("ref_doc_id") == ref_doc_id)])

    def _delete_where(self, chosen: Callable[[], list[str]]) -> None:
        """Delete the nodes ``chosen()`` lists now. Listing and deleting are two calls: on pgvector another
        handle (another process) can delete some in between, and the index refuses unknown ids, so the
        list is made again (every one of 30 simultaneous deletes of one document by two handles failed)."""
        for _ in range(5):
            ids = chosen()
            if not ids:
                return
            try:
                references = self._reference_ids(ids)
                self._index.delete(ids)
                self._remember_references(references)
                return
            except UnknownIdError:
                continue
        raise UnknownIdError("the nodes to delete kept changing under other writers; try again")

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete, ref_doc_id, **delete_kwargs)

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete the nodes of ``node_ids`` (unknown ids are skipped) that match ``filters``.

        At least one of the two is required: deleting everything is :meth:`clear`, never an accident.
        """
        _no_kwargs("delete_nodes", delete_kwargs)
        if node_ids is None and filters is None:
            raise InvalidArgumentError("delete_nodes needs node_ids or filters; use clear() to delete every node")
        predicate = metadata_filter(filters)
        wanted = list(dict.fromkeys(_strings(node_ids, "node_ids"))) if node_ids is not None else None

        def chosen() -> list[str]:
            if wanted is None:
                return [r.id for r in self._records(predicate)]
            present = set(self._index.ids())
            candidates = [i for i in wanted if i in present]
            return candidates if predicate is None else [r.id for r in self._index.get(candidates)
                                                          if predicate(r.metadata)]

        with self._lock:
            self._delete_where(chosen)

    async def adelete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                            **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete_nodes, node_ids, filters, **delete_kwargs)

    def clear(self) -> None:
        """Delete every node. The index keeps its settings and weights; an automatic document calibration
        (the default) is refitted on the nodes added next, one you set is kept."""
        with self._lock:
            self._delete_where(self._index.ids)

    def _former_reference_ids(self) -> set[str]:
        """Ids of IndexNode / ImageNode nodes deleted through this store (see :meth:`_is_nodes_dict`)."""
        return self._former_references | _saved_references(getattr(self._index, "adapter_state", None))

    def _remember_references(self, ids: list[str]) -> None:
        """Keep deleted reference-node ids in the index's adapter state (saved with a ``NormIndex``, in the
        table's state row on pgvector): LlamaIndex names them in every retrieval after the delete, and a store
        loaded from disk (or opened by another process) without them emptied every retrieval."""
        self._former_references.update(ids)
        if ids and hasattr(self._index, "update_adapter_state"):
            state = self._index.adapter_state  # one read (a round trip on pgvector)
            mine = state.get(_ADAPTER_KEY)
            mine = dict(mine) if isinstance(mine, dict) else {}
            mine["deleted_reference_nodes"] = sorted(_saved_references(state) | self._former_references)
            with contextlib.suppress(EmptyCorpusError):  # a pgvector table dropped meanwhile: kept in memory
                self._index.update_adapter_state(_ADAPTER_KEY, mine)

    def _reference_ids(self, ids: list[str]) -> list[str]:
        """Those of ``ids`` that are IndexNode or ImageNode nodes (see :meth:`_is_nodes_dict`)."""
        return [r.id for r in self._index.get(ids) if (r.metadata or {}).get("_node_type") in _REFERENCE_NODE_TYPES]

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

    # ------------------------------------------------------------ querying
    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The exact blended top ``similarity_top_k`` among the nodes matching the query's restrictions.

        Ranks by ``query_embedding`` (a raw vector from ``NormRankEmbedding``; ``query_str`` then only
        gives the token count the query-conditioned weight needs), or by ``query_str`` encoded with the
        index's encoder when no embedding is given. ``similarities`` are the blended scores.
        ``VectorStoreQueryMode.MMR`` picks among the blended top few for diversity as well (``mmr_threshold``,
        ``mmr_prefetch_k``, ``mmr_prefetch_factor`` in ``kwargs``; see :func:`_mmr_settings`).
        """
        if not isinstance(query, VectorStoreQuery):
            raise InvalidArgumentError(f"query must be a VectorStoreQuery, got {type(query).__name__}")
        mmr = _mmr_settings(query, kwargs)
        _no_kwargs("query", kwargs)
        k = query.similarity_top_k
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
            raise InvalidArgumentError(f"similarity_top_k must be a positive integer, got {k!r}")
        _combine(query.filters, query.node_ids, query.doc_ids)  # named before any encoding; built under the lock
        text = query.query_str
        if query.query_embedding is None and (not isinstance(text, str) or is_blank_text(text)):
            raise InvalidArgumentError("the query has neither a query_embedding nor a query_str to search by")
        if len(self._index) == 0:  # before any encoding; checked again under the lock below
            return self._empty()
        # Encode before taking the lock (the slow part); then count and search one state, so a concurrent
        # delete through this store cannot leave k larger than what is stored.
        encoder = self._index.encoder
        has_text = isinstance(text, str) and not is_blank_text(text)
        if query.query_embedding is not None:
            vector = np.asarray(query.query_embedding, dtype=np.float32)
            # only the query-conditioned weight (b != 0) needs the count: a fixed blend searches by the vector
            # alone, also when the index's model folder is not on this machine (MissingModelEncoder)
            # (the blend may change before the search: then search_up_to counts the text)
            count = int(encoder.token_counts([text])[0]) if has_text and self._index.weights.b != 0 else None
        else:
            vecs, counts = encoder.encode_with_counts([text])
            vector, count = vecs[0], int(counts[0])
        # k clamped to what the index holds when it searches; the index's own lock too: another handle on it
        # changed it between the restriction read below and the search, or between MMR's hits and vectors
        with self._lock, locked(self._index):
            # read against the nodes held now: an add through this store cannot slip past a restriction
            node_ids = None if self._is_nodes_dict(query.node_ids) else query.node_ids
            predicate = _combine(query.filters, node_ids, query.doc_ids)
            fetch = int(k) if mmr is None else (mmr[1] or int(np.ceil(int(k) * mmr[2])))
            hits = search_up_to(self._index, vector, fetch, self._empty_hits, filter=predicate,
                                query_token_count=count, count_text=text if has_text and count is None else None)
            if mmr is not None and len(hits) > 1:
                hits = mmr_select(hits, self._index.vectors([h.id for h in hits]), int(k), mmr[0])
        return _result(hits)

    def _is_nodes_dict(self, node_ids: Sequence[str] | None) -> bool:
        """Whether ``node_ids`` is what ``VectorStoreIndex.as_retriever`` passes for a store that keeps the
        text (its ``nodes_dict``, which then lists only the ``IndexNode`` and ``ImageNode`` nodes), not a
        restriction: every id it names that the store holds is such a node, and it names at least one.

        Why: read as a restriction it hid every text node. One ``IndexNode`` (recursive retrieval) made
        each retriever and query engine on the index return only the ``IndexNode``, where
        ``SimpleVectorStore`` (whose ``nodes_dict`` lists every node) ranks them all. The price: an explicit
        ``node_ids`` of reference nodes only is read the same way and restricts nothing.

        LlamaIndex never takes a deleted node out of the ``nodes_dict`` of a store that keeps the text, so
        once its reference nodes are deleted it names only ids the store no longer holds. Read as a
        restriction, that emptied every retrieval; ids that were all reference nodes deleted through this
        store are read as the ``nodes_dict`` too. Ids the store does not hold beside held reference nodes do not
        make it a restriction: a reference node deleted around this store (another store or handle on the same
        index) stays in the ``nodes_dict``, and read as a restriction that hid every text node. The index keeps them (``adapter_state``: saved with a
        ``NormIndex``, in the table's state row on pgvector), so a store loaded again or opened by another
        process knows them.
        """
        if not node_ids:
            return False
        named = list(dict.fromkeys(_strings(node_ids, "node_ids")))
        held = [x for x in named if x in self._index]
        if not held:
            former = self._former_reference_ids()
            return bool(named) and all(x in former for x in named)
        if len(held) == len(self._index):
            # every node the store holds is named (store_nodes_override=True lists them all): a restriction to
            # all of them restricts nothing, and as a filter over 20k nodes it cost 0.75 s a query
            return True
        try:
            records = self._index.get(held)
        except UnknownIdError:  # deleted meanwhile by another handle: read it as the restriction it names
            return False
        return all((r.metadata or {}).get("_node_type") in _REFERENCE_NODE_TYPES for r in records)

    def _empty_hits(self) -> list[Hit]:
        self._empty()  # raises unless empty results are allowed
        return []

    def _empty(self) -> VectorStoreQueryResult:
        if self.allow_empty or held_documents(self._index):  # emptied by deletes: no nodes, as SimpleVectorStore
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        raise EmptyCorpusError(empty_message("this NormRankVectorStore"))

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """:meth:`query` in a worker thread, so the event loop keeps running."""
        return await asyncio.to_thread(self.query, query, **kwargs)

    # ------------------------------------------------------------ persistence
    def persist(self, persist_path: str = os.path.join(DEFAULT_PERSIST_DIR, DEFAULT_PERSIST_FNAME),
                fs: Any = None) -> None:
        """Save through normrank's safe format (no pickle); a pgvector-backed store is already durable.

        A ``*.json`` path (what ``StorageContext.persist`` passes) is saved as the folder ``*.normrank``.

        Raises
        ------
        EmptyCorpusError
            The store never held a node and has no dimension yet (no encoder), or is an IVF index
            that never held one (it trains on its first nodes). An empty store with an encoder
            saves, and reloads empty.
        """
        _check_fs(fs)
        save = getattr(self._index, "save", None)
        if save is None:  # PostgreSQL holds the rows and the state already
            return
        with self._lock:
            save(_folder(persist_path))

    @classmethod
    def from_persist_path(cls, persist_path: str | os.PathLike[str], fs: Any = None, *,
                          encoder: RawEncoder | None = None, allow_empty: bool = False) -> NormRankVectorStore:
        """Load a store saved by :meth:`persist` (checksums and counts are verified first)."""
        _check_fs(fs)
        return cls(NormIndex.load(_folder(persist_path), encoder=encoder), allow_empty=allow_empty)

    @classmethod
    def from_persist_dir(cls, persist_dir: str | os.PathLike[str] = DEFAULT_PERSIST_DIR,
                         namespace: str = _DEFAULT_NAMESPACE, fs: Any = None, *,
                         encoder: RawEncoder | None = None, allow_empty: bool = False) -> NormRankVectorStore:
        """Load the store ``StorageContext.persist(persist_dir)`` saved (namespace ``default``)."""
        path = Path(persist_dir) / f"{namespace}{_NAMESPACE_SEP}{DEFAULT_PERSIST_FNAME}"
        return cls.from_persist_path(path, fs, encoder=encoder, allow_empty=allow_empty)


def _mmr_settings(query: VectorStoreQuery, kwargs: dict[str, Any]) -> tuple[float, int | None, float] | None:
    """``None`` for the default mode; for ``mmr``, (``mmr_threshold``, ``mmr_prefetch_k``,
    ``mmr_prefetch_factor``) taken out of ``kwargs`` (``vector_store_kwargs`` of a retriever).

    MMR picks ``similarity_top_k`` nodes among the blended top ``mmr_prefetch_k`` (else ``similarity_top_k``
    times ``mmr_prefetch_factor``, 4 by default, as LlamaIndex's Qdrant store does; an ``mmr_prefetch_k``
    below ``similarity_top_k`` gives that many nodes, as there) for
    ``threshold * blended score - (1 - threshold) * the largest cosine to a node already picked``;
    ``mmr_threshold`` defaults to 0.5 as in ``SimpleVectorStore``, and 1 keeps the blended order.
    """
    if query.mode == VectorStoreQueryMode.DEFAULT:
        return None
    if query.mode != VectorStoreQueryMode.MMR:
        raise InvalidArgumentError(f"NormRankVectorStore serves the default (dense, blended) and mmr query "
                                   f"modes, not {query.mode!r}")
    threshold = kwargs.pop("mmr_threshold", None)
    prefetch_k = kwargs.pop("mmr_prefetch_k", None)
    factor = kwargs.pop("mmr_prefetch_factor", None)
    if prefetch_k is not None and (isinstance(prefetch_k, bool) or not isinstance(prefetch_k, (int, np.integer))
                                   or prefetch_k <= 0):
        raise InvalidArgumentError(f"mmr_prefetch_k must be a positive integer, got {prefetch_k!r}")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float, np.integer, np.floating))
                               or not 1 <= factor <= 1000):
        raise InvalidArgumentError(f"mmr_prefetch_factor must be a number from 1 to 1000, got {factor!r}")
    return (0.5 if threshold is None else check_lambda(threshold, "mmr_threshold"),
            None if prefetch_k is None else int(prefetch_k), 4.0 if factor is None else float(factor))


def _to_node(node_id: str, text: str | None, metadata: Mapping[str, Any]) -> BaseNode:
    """Rebuild the node: from LlamaIndex's ``_node_content`` when the store wrote it, else a TextNode."""
    if "_node_content" in metadata:
        try:
            return metadata_dict_to_node(dict(metadata), text=text)
        except (ValueError, TypeError):  # content written by something else: fall back to the plain record
            pass
    clean = {k: v for k, v in metadata.items() if k != NODE_ID_KEY}
    return TextNode(id_=node_id, text=text or "", metadata=clean)


def _result(hits: Sequence[Hit]) -> VectorStoreQueryResult:
    nodes = [with_explanation(_to_node(h.id, h.text, h.metadata), explain(h)) for h in hits]
    return VectorStoreQueryResult(nodes=nodes, similarities=[float(h.score) for h in hits], ids=[h.id for h in hits])
