"""What every normrank store shares, whichever engine holds the vectors.

:class:`BlendIndexBase` carries the encoder, the weights, door validation of ids, texts and metadata,
query encoding and the query-conditioned weight; :class:`~normrank.store.NormIndex` (FAISS) and
:class:`~normrank.pgvector_store.PgVectorNormIndex` (PostgreSQL) add storage and search. Kept apart
from the FAISS store so the pgvector backend does not import FAISS code it never runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from normrank._validation import (
    MAX_TOKEN_COUNT,
    UNIT_NORM_TOLERANCE,
    as_matrix,
    check_metadata,
    check_norm_signal,
    check_not_unit_length,
    check_option,
    check_text,
    real_numbers,
)
from normrank._validation import as_token_counts as _as_counts
from normrank._validation import query_token_count as _given_count
from normrank.calibration import NormCalibrator
from normrank.encoders import MissingModelEncoder, RawEncoder, check_texts
from normrank.errors import (
    ConcurrentUpdateError,
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    InvalidArgumentError,
    InvalidIdError,
    MissingTokenCountError,
    UnitNormError,
)
from normrank.filters import MetadataFilter, match  # noqa: F401  (MetadataFilter re-exported: where it always was)
from normrank.scoring import Hit, Weights

logger = logging.getLogger(__name__)

_match = match  # the name the backends imported before normrank.filters


@dataclass(frozen=True)
class Record:
    """What the store keeps per document besides its vector."""

    id: str
    text: str | None
    metadata: dict[str, Any]
    norm: float
    token_count: int


def _check_ids(ids: Any, *, allow_nul: bool = True) -> list[str]:
    """Non-empty strings that can be stored as UTF-8 (and, for pgvector, hold no NUL), given as a list.

    A single string is refused, not iterated: ``delete("12")`` deleted the documents "1" and "2".
    """
    if isinstance(ids, (str, bytes)):
        raise InvalidArgumentError(f"expected a list of ids, got the single string {ids[:40]!r}; wrap it: [id]")
    if isinstance(ids, Mapping) or not isinstance(ids, Iterable):
        raise InvalidArgumentError(f"expected a list of ids, got {type(ids).__name__}")
    out = list(ids)
    for i, x in enumerate(out):
        if not isinstance(x, str) or not x:
            raise InvalidIdError(f"id {i} is {x!r} ({type(x).__name__}); ids must be non-empty strings")
        out[i] = check_text(x, f"id {i}", allow_nul=allow_nul)  # np.str_ stored as str
    return out


def _check_k(k: Any) -> int:
    """``k`` as a Python int (NumPy integers welcome), or a named error for 0, bools, floats and strings."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise InvalidArgumentError(f"k must be a positive integer, got {k!r}")
    return check_option("k", k)


#: Below this many documents behind the document calibration, every delete, and every add past the number
#: it was fitted on, refits it: a fit on a handful of norms is noise (a store filled one node at a time
#: kept a one-document fit, and its blend went flat), and refitting that few costs nothing. From there on
#: it is refitted when the corpus doubles or half of it has been deleted (:func:`needs_recalibration`).
SMALL_CALIBRATION = 40


#: Below this many queries a query calibration is noise (3 queries put the features near -33): warned.
FEW_QUERIES = 10


def query_calibration(index: Any, queries: Sequence[str] | None, norms: np.ndarray | None,
                      token_counts: np.ndarray | None) -> NormCalibrator:
    """The query calibration ``calibrate_queries`` publishes: from query texts, or from their norms and
    token counts given together. A single string is refused (it was fitted as one query per character)."""
    if isinstance(queries, str):
        raise InvalidArgumentError("calibrate_queries takes a list of query texts, got a single string")
    if (norms is None) != (token_counts is None):
        raise InvalidArgumentError("give norms and token_counts together (or neither, and query texts)")
    if norms is not None and queries:
        raise InvalidArgumentError("give query texts or their norms and token counts, not both")
    if norms is None:
        if not queries:
            raise EmptyCorpusError("no queries to calibrate on")
        vecs, token_counts = index.encoder.encode_with_counts(list(queries))
        norms = np.linalg.norm(as_matrix(vecs, index._dim).astype(np.float64), axis=1)
    else:  # read as the stores read a query's count: whole numbers from 1 to MAX_TOKEN_COUNT
        token_counts = _as_counts(token_counts)
    return fit_query_calibration(norms, token_counts)


def fit_query_calibration(norms: np.ndarray, token_counts: np.ndarray) -> NormCalibrator:
    """A query calibration fitted on these queries, with a warning when they are too few to mean much."""
    cal = NormCalibrator().fit(norms, token_counts)
    if cal.n_fitted < FEW_QUERIES:
        logger.warning("the query calibration is fitted on %d queries: its features are noise below %d; calibrate on "
                       "more representative queries", cal.n_fitted, FEW_QUERIES)
    return cal


def check_index_parts(encoder: Any, calibrator: Any, query_calibrator: Any) -> None:
    """Refuse, when an index is made, an encoder or calibration of the wrong kind.

    Why: anything was taken and failed later with a bare ``AttributeError`` in a search or a save (the
    ``dim`` beside them had the same gap: ``np.int64(8)`` indexed and searched, then every save raised
    ``TypeError``)."""
    if encoder is not None and not isinstance(encoder, (RawEncoder, MissingModelEncoder)):
        raise InvalidArgumentError(f"encoder must be a normrank RawEncoder (or PooledEncoder), got "
                                   f"{type(encoder).__name__}")
    for name, cal in (("calibrator", calibrator), ("query_calibrator", query_calibrator)):
        if cal is not None and not isinstance(cal, NormCalibrator):
            raise InvalidArgumentError(f"{name} must be a normrank.NormCalibrator, got {type(cal).__name__}")


def check_fit_basis(started: tuple[Weights, dict[str, Any]] | None, now: tuple[Weights, dict[str, Any]]) -> None:
    """Refuse to publish a fit computed from weights or a document calibration that have changed since."""
    if started is None or started == now:
        return
    what = "weights" if started[0] != now[0] else "document calibration"
    raise ConcurrentUpdateError(f"the index's {what} changed while fit() ran (set_weights or recalibrate from another "
                                "thread or process); the fit was computed from the old ones, so nothing was published: "
                                "run fit() again")


def needs_recalibration(auto: bool, count: int, n_fitted: int, removed: int = 0) -> bool:
    """Whether an add or a delete should refit an automatic document calibration (``count`` documents held
    after it, ``n_fitted`` behind the calibration, ``removed`` deleted since the fit).

    - While fewer than :data:`SMALL_CALIBRATION` documents inform it: after any delete since the fit, and
      whenever the index holds more documents than it was fitted on. Why: a store filled, then pruned, then
      filled again kept a fit on 30 documents while it held 17 others.
    - From there on: when the corpus has doubled, or once documents deleted since the fit reach half the
      number it was fitted on. Why the last: a corpus whose deletes kept pace with its adds never doubled,
      so its calibration stayed the one fitted on documents long gone (every top-10 of 50 differed from a
      fresh index's after a full turnover), and a sync that only deletes (LangChain ``index(cleanup=
      "full")``, LlamaIndex ``delete_ref_doc``) never reached an add to refit it.

    Deletes, not adds, are counted: adding the very documents a calibration was fitted on
    (``EncodedCorpus.into``, batch by batch) must not refit it."""
    if not auto or count == 0:
        return False
    if n_fitted < SMALL_CALIBRATION:
        return count > n_fitted or removed > 0
    return count >= 2 * n_fitted or 2 * removed >= n_fitted


@runtime_checkable
class SearchableIndex(Protocol):
    """What the framework adapters need of an index: :class:`NormIndex`, or the pgvector backend's."""

    def __len__(self) -> int: ...

    def search(self, query: Any, k: int = 10, *, filter: Any = None) -> list[Hit]: ...

    def add_texts(self, texts: Sequence[str], ids: Sequence[str] | None = None,
                  metadatas: Sequence[Mapping[str, Any]] | None = None) -> list[str]: ...


def locked(index: Any) -> Any:
    """The index's own (re-entrant) lock as a context manager, or a no-op for an index without one; for an
    index whose reads are transactions (pgvector), one snapshot for every read in the block
    (``consistent_reads``), which other processes' writes do not change either.

    For adapters that read the index twice for one answer (MMR: the hits, then their vectors; LlamaIndex:
    which ids restrict, then the search): the store's own lock keeps out only that store's writers, and
    another store, retriever, thread or process on the same index changed it in between (an
    ``UnknownIdError`` for an id the caller never named, or hits from one state with vectors from another).
    Take it inside the store's lock, never around it, as ``upsert_vectors`` does; only reads go inside."""
    together = getattr(index, "consistent_reads", None)
    if together is not None:
        return together()
    return getattr(index, "_lock", None) or contextlib.nullcontext()


def upsert_vectors(index: Any, vectors: np.ndarray, counts: Sequence[int], ids: list[str],
                   texts: Sequence[str | None], metadatas: Sequence[Mapping[str, Any]]) -> list[str]:
    """Add a batch, replacing the documents whose ids the index holds (the frameworks' upsert); if the
    add fails, the replaced documents are put back, so a refused batch loses nothing. The caller holds
    its store's write lock; the ids are distinct (the index names a repeat). An index with its own
    ``upsert_vectors`` (pgvector: one transaction, which other processes see whole) does it itself.

    The delete and the add run under the index's own lock (a ``NormIndex``'s is re-entrant): the store's
    lock kept its own readers out, but another store, retriever or thread searching the same index saw the
    replaced documents missing between the two (3 of 263 top-10s), or a ``k`` above what it held."""
    native = getattr(index, "upsert_vectors", None)
    if native is not None:
        return native(vectors, counts, ids=ids, texts=texts, metadatas=metadatas)
    with locked(index):
        return _delete_then_add(index, vectors, counts, ids, texts, metadatas)


def _delete_then_add(index: Any, vectors: np.ndarray, counts: Sequence[int], ids: list[str],
                     texts: Sequence[str | None], metadatas: Sequence[Mapping[str, Any]]) -> list[str]:
    existing = [x for x in ids if x in index]
    old_records, old_vectors = [], None
    removed_before = getattr(index, "_removed_since_calibration", None)
    if existing:
        if isinstance(index, BlendIndexBase):  # what the add would refuse, refused before anything is deleted
            index._check_batch(vectors, counts, texts, metadatas, empty=False)
        old_records = index.get(existing)
        old_vectors = np.asarray(index.vectors(existing), dtype=np.float32)
        getattr(index, "_delete_for_upsert", index.delete)(existing)
    try:
        return index.add_vectors(vectors, counts, ids=ids, texts=texts, metadatas=metadatas)
    except BaseException:
        if removed_before is not None:  # nothing is replaced after all: the put-back adds must not refit
            index._removed_since_calibration = removed_before
        index._putting_back = True  # they were accepted once: a norm within 1e-3 of 1 alone is no reason now
        try:
            for rec, vec in zip(old_records, old_vectors if old_vectors is not None else []):
                # One at a time: a batch of restored documents must not trip a batch-level check.
                index.add_vectors(vec[None, :], [rec.token_count], ids=[rec.id], texts=[rec.text],
                                  metadatas=[rec.metadata])
        finally:
            index._putting_back = False
        raise


def held_documents(index: Any) -> bool:
    """Whether an index has held documents, now or before: its calibration was fitted on them.

    Why: the adapters refuse to search an empty index (``EmptyCorpusError``) because one that never held
    a document usually sits at a misplaced ``store.path`` or table. An index emptied by deletes is not
    that: the frameworks' own stores answer it with no results, and so do normrank's. Fitted once, a
    calibration stays with the index through deletes, saves and loads (a new index at a wrong path has
    none), so it tells the two apart across processes too.
    """
    return len(index) > 0 or bool(getattr(getattr(index, "calibrator", None), "is_fitted", False))


def search_up_to(index: SearchableIndex, query: Any, k: int, on_empty: Callable[[], list[Hit]], *,
                 filter: Any = None, query_token_count: int | None = None,
                 count_text: str | None = None) -> list[Hit]:
    """The blended top-``k`` of ``index``, ``k`` clamped to the documents it holds when it searches.

    Why: the framework adapters promise "asking for more than the index holds returns all of them",
    but counting and searching are two calls, and a delete from another thread or process between them
    made the search refuse a ``k`` larger than the index (53 of 66 retrievals while a thread deleted).
    Counted again and searched again while the index keeps shrinking; ``on_empty()`` answers for an
    empty index (``[]``, or the adapter's error).

    ``count_text``: the text of a raw query vector whose token count was left out because the blend did
    not need it (``b == 0``). If the blend changes to ``b != 0`` before the search (a ``fit`` or
    ``set_weights`` in another thread), the count is taken from it then, instead of failing a query that
    either blend answers.
    """
    if count_text is not None and query_token_count is None:
        try:
            return search_up_to(index, query, k, on_empty, filter=filter)
        except MissingTokenCountError:
            query_token_count = int(index.encoder.token_counts([count_text])[0])  # type: ignore[attr-defined]
    kwargs: dict[str, Any] = {"filter": filter}
    if isinstance(query, str) and isinstance(index, BlendIndexBase):
        # Encoded once, not on every try: a retry that encodes again (~15 ms) lost every race against a
        # thread deleting every 10 ms. The same vector and count the index's search(text) computes.
        # Only a text query reads index.encoder: the property makes the default model when the index has
        # none, which a save then records, so a store searched with vectors of other embeddings once
        # reopened on the bundled model.
        check_text(query, "the query")
        vecs, counts = index.encoder.encode_with_counts([query])
        query, query_token_count = np.asarray(vecs[0], dtype=np.float32), int(counts[0])
    if query_token_count is not None:  # the protocol's search need not take it
        kwargs["query_token_count"] = query_token_count
    for _ in range(_SHRINK_RETRIES):
        n = len(index)
        if n == 0:
            return on_empty()
        kk = min(k, n)
        try:
            return index.search(query, kk, **kwargs)
        except EmptyCorpusError:
            continue  # emptied meanwhile
        except InvalidArgumentError:
            if len(index) < kk:
                continue  # shrunk meanwhile
            raise
    n = len(index)
    return on_empty() if n == 0 else index.search(query, min(k, n), **kwargs)


#: How many times :func:`search_up_to` counts again after the index shrank under it.
_SHRINK_RETRIES = 8


class BlendIndexBase:
    """What every normrank store shares, whatever holds the vectors (FAISS here, PostgreSQL in
    :mod:`normrank.pgvector_store`): the encoder, the weights, query encoding and weighting, and the
    norm column's shaping. One implementation, so the backends cannot drift apart.

    Subclasses set ``_encoder``, ``_dim``, ``_weights``, ``calibrator`` and ``query_calibrator`` and
    implement ``add_vectors`` and ``_precheck_ids`` (which calls :meth:`_batch_ids`).
    """

    _encoder: RawEncoder | None
    _dim: int | None
    #: Whether texts, ids and metadata may hold NUL characters (PostgreSQL cannot store them).
    _allow_nul: bool = True
    #: Metadata floats must come back from the backend as stored (pgvector's jsonb: see check_metadata).
    _jsonb: bool = False
    #: True while an upsert the add refused puts the documents it deleted back (:func:`upsert_vectors`).
    _putting_back: bool = False
    _weights: Weights
    calibrator: NormCalibrator
    query_calibrator: NormCalibrator | None

    # ------------------------------------------------------------ properties
    @property
    def encoder(self) -> RawEncoder:
        if self._encoder is None:
            self._encoder = RawEncoder()
        return self._encoder

    @property
    def dim(self) -> int | None:
        return self._dim

    @property
    def weights(self) -> Weights:
        return self._weights

    def blend_settings(self) -> tuple[Weights, NormCalibrator, NormCalibrator | None]:
        """The weights, document calibration and query calibration the index ranks with now.

        Why: a re-ranker built on an index copied them once, so after ``set_weights``, ``fit`` or
        ``recalibrate`` (here, or by another process on a shared pgvector table) it kept ranking with
        the old blend while the index ranked with the new one. The re-rankers read them on every call.
        """
        return self._weights, self.calibrator, self.query_calibrator

    def _batch_ids(self, ids: Sequence[str] | None, n: int) -> list[str]:
        """New uuids, or the given ids checked for type, count and duplicates within the batch."""
        if ids is None:
            return [uuid.uuid4().hex for _ in range(n)]
        out = _check_ids(ids, allow_nul=self._allow_nul)
        if len(out) != n:
            raise InvalidArgumentError(f"{len(out)} ids for {n} documents")
        seen: set[str] = set()
        for x in out:
            if x in seen:
                raise DuplicateIdError(f"id {x!r} is given twice in this batch")
            seen.add(x)
        return out

    def _check_batch(
        self, vectors: np.ndarray, token_counts: Sequence[int] | np.ndarray,
        texts: Sequence[str | None] | None, metadatas: Sequence[Mapping[str, Any]] | None, *, empty: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None], list[dict[str, Any]]]:
        """Validate a batch for ``add_vectors`` before anything is stored: matrix, norms, counts, texts, metadata."""
        mat = as_matrix(vectors, self._dim)
        n = mat.shape[0]
        # Rounded to float32, the precision a saved index keeps, so save/load changes no score.
        norms = np.linalg.norm(mat.astype(np.float64), axis=1).astype(np.float32).astype(np.float64)
        try:
            if not self._putting_back:  # see upsert_vectors: documents it deleted, put back
                check_norm_signal(norms) if empty else check_not_unit_length(norms)
        except UnitNormError:
            # One text added several times has one norm without being normalised: like a single text,
            # only unit length is refused (the calibration is refitted as documents come, SMALL_CALIBRATION).
            if not (empty and n >= 2 and np.all(np.abs(norms - 1.0) >= UNIT_NORM_TOLERANCE)
                    and np.array_equal(mat, np.broadcast_to(mat[0], mat.shape))):
                raise
        counts = _as_counts(token_counts)
        if counts.size != n:
            raise InvalidArgumentError(f"{counts.size} token counts for {n} vectors")
        text_list = list(texts) if texts is not None else [None] * n
        if len(text_list) != n:
            raise InvalidArgumentError(f"{len(text_list)} texts for {n} vectors")
        for i, t in enumerate(text_list):
            if t is not None and not isinstance(t, str):
                raise InvalidArgumentError(f"text {i} is a {type(t).__name__}, expected str or None")
            if t is not None:
                text_list[i] = check_text(t, f"text {i}", allow_nul=self._allow_nul)  # np.str_ stored as str
        return mat, norms, counts, text_list, _as_metadatas(metadatas, n, allow_nul=self._allow_nul,
                                                             jsonb=self._jsonb)

    def add_texts(
        self,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        *,
        show_progress: bool | None = None,
    ) -> list[str]:
        """Encode and add texts; returns their ids (new uuids where none are given)."""
        items = check_texts(texts)
        if not items:
            raise EmptyCorpusError("no texts given")
        for i, t in enumerate(items):  # before the (slow) encoding, which would choke on them anyway
            check_text(t, f"text {i}", allow_nul=self._allow_nul)
        if metadatas is not None:
            _as_metadatas(metadatas, len(items), allow_nul=self._allow_nul, jsonb=self._jsonb)
        new_ids = self._precheck_ids(ids, len(items))  # fail before the (slow) encoding
        vectors, counts = self.encoder.encode_with_counts(items, show_progress=show_progress)
        return self.add_vectors(vectors, counts, ids=new_ids, texts=items, metadatas=metadatas)

    def _publish_fit(self, weights: Weights, query_calibrator: NormCalibrator | None,
                     started: tuple[Weights, dict[str, Any]] | None = None) -> None:
        """Make a fit's weights and query calibration live together, or neither (called by ``fit``).

        Both change under the store's lock, which every search holds for its whole run, so a
        search sees the state before the fit or after it, never the new query calibration with
        the old weights. On failure the previous weights and calibration stay. ``started`` is what
        the fit was computed from (``fitting.fit_basis``): if it changed meanwhile, nothing is published.
        """
        with self._lock:  # type: ignore[attr-defined]
            check_fit_basis(started, (self._weights, self.calibrator.to_dict()))
            old = self.query_calibrator
            if query_calibrator is not None:
                self.query_calibrator = query_calibrator
            try:
                self.set_weights(weights)  # type: ignore[attr-defined]
            except BaseException:
                self.query_calibrator = old
                raise

    def _shaped_feature(self, cal: NormCalibrator, norms: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return self._weights.shape(cal.transform(norms, counts, self._weights.feature))

    def _current_column_key(self) -> tuple[Any, ...]:
        w = self._weights
        return (w.feature, w.clip, w.squash, w.mode == "tiebreak", json.dumps(self.calibrator.to_dict()))

    def _encode_texts(self, queries: Sequence[str | np.ndarray]) -> tuple[Any, Any]:
        """Encode the text queries; needs no index state, so searches call it before taking the lock."""
        if isinstance(queries, np.ndarray):  # a matrix of vectors holds no text
            return None, None
        texts = [q for q in queries if isinstance(q, str)]
        for i, q in enumerate(texts):
            check_text(q, f"query {i}")
        return self.encoder.encode_with_counts(texts) if texts else (None, None)

    def _encode_queries(
        self, queries: Sequence[str | np.ndarray], token_counts: Sequence[int | None] | None,
        encoded: tuple[Any, Any] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unit query vectors, raw norms and token counts (counts -1 where unknown)."""
        if token_counts is not None and len(token_counts) != len(queries):
            raise InvalidArgumentError(f"{len(token_counts)} query token counts for {len(queries)} queries")
        enc_vecs, enc_counts = encoded if encoded is not None else self._encode_texts(queries)
        fast = None if enc_vecs is not None or self._dim is None else _plain_batch(queries, token_counts, self._dim)
        if fast is not None:
            return fast
        if isinstance(queries, np.ndarray):
            queries = list(queries)  # rows, read one by one below with their checks
        if enc_vecs is None and self._dim is not None and _plain_vectors(queries, self._dim):
            # the usual batch of raw vectors: one stack instead of a loop over rows (~75% of the
            # per-batch Python cost at 10k documents), the same matrix and the same checks after it
            mat = as_matrix(np.concatenate(queries).reshape(len(queries), self._dim), self._dim)
            counts = [_given_count(c) for c in token_counts] if token_counts is not None else [-1] * len(queries)
        else:
            mat, counts = self._rows_one_by_one(queries, token_counts, enc_vecs, enc_counts)
        norms = np.linalg.norm(mat.astype(np.float64), axis=1)
        return mat / norms[:, None].astype(np.float32), norms, np.array(counts, dtype=np.int64)

    def _rows_one_by_one(self, queries: Sequence[str | np.ndarray], token_counts: Sequence[int | None] | None,
                         enc_vecs: Any, enc_counts: Any) -> tuple[np.ndarray, list[int]]:
        """The query matrix and token counts for any mix of texts (already encoded) and vectors."""
        rows, counts = [], []
        t = 0
        for i, q in enumerate(queries):
            if isinstance(q, str):
                rows.append(enc_vecs[t])
                counts.append(int(enc_counts[t]))
                t += 1
            else:
                given = real_numbers(q if isinstance(q, np.ndarray) else np.asarray(q))  # as for stored vectors
                if given.ndim > 1 and given.size != given.shape[-1]:  # (1, d) is one query; (2, d) is not
                    raise DimensionMismatchError(f"a query vector is 1-D, got an array of shape {given.shape}; "
                                                 "search several queries with search_batch")
                rows.append(np.asarray(given, dtype=np.float32).ravel())
                counts.append(_given_count(None if token_counts is None else token_counts[i]))
        if self._dim is not None and any(r.shape[0] != self._dim for r in rows):
            bad = next(r.shape[0] for r in rows if r.shape[0] != self._dim)
            raise DimensionMismatchError(f"dimension mismatch: query has dimension {bad}, the index {self._dim}")
        return as_matrix(np.stack(rows), self._dim), counts

    def _query_weights(self, norms: np.ndarray, counts: np.ndarray) -> np.ndarray:
        w = self._weights
        if w.b == 0.0:
            return np.full(norms.shape, w.a, dtype=np.float64)
        if np.any(counts < 1):
            raise MissingTokenCountError(
                "a query vector was given without its token count, which the query-conditioned weight "
                "(b != 0) needs: pass query_token_count, or search with the query text"
            )
        if np.any(np.abs(norms - 1.0) < 1e-3):
            raise UnitNormError(
                "a query vector is unit length, so its norm cannot set the query-conditioned weight (b != 0): "
                "search with the query text, or pass a raw vector from normrank.RawEncoder"
            )
        cal = self.query_calibrator
        if cal is None:
            if not getattr(self, "_warned_no_query_calibration", False):  # once per index, not per search
                self._warned_no_query_calibration = True
                logger.warning("no query calibration: using the document calibration for query features "
                               "(fit() or calibrate_queries() sets one); logged once per index")
            cal = self.calibrator
        return w.query_weight(cal.transform(norms, counts, w.feature))


#: Below this norm a raw query vector does not take the lean batch path (its checked path refuses from
#: 1e-12, and names the problem); the C path of normrank.batch_topk.raw_batch_topk uses the same bound.
PLAIN_MIN_NORM = 1e-6


def _plain_batch(queries: Sequence[Any], token_counts: Sequence[int | None] | None,
                 dim: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """The unit matrix, float64 norms and counts of a batch of well-formed raw vectors (a float matrix of
    the index's width, or a list of such rows) with whole-number token counts or none, in a few NumPy
    calls; ``None`` for anything else, which the checked path then reads or refuses by name.

    Why: the checked path (a copy, a finite check, a float32 norm, then the float64 norm) and a check
    per count were ~90 us of a 64-query batch, and several times that right after a scan has left the
    caches cold: most of what separated ``search_arrays`` from FAISS's BLAS path at 10k documents
    (benchmarks/results/speed.md). Same numbers: the float64 norm is the one the checked path computes
    (the same products, the same pairwise sum), and a vector it would refuse (NaN, infinity, near zero)
    makes this path step aside. With ``width`` the unit rows are written into the first ``dim`` columns
    of a zero ``(n, width)`` matrix, the augmented rows a FAISS store searches, and the counts (checked,
    but not needed there) come back as ``None``.
    """
    if isinstance(queries, np.ndarray):
        if queries.ndim != 2 or queries.shape[1] != dim or queries.dtype.kind != "f" or queries.shape[0] == 0:
            return None
        mat = queries  # read as float32 by units_into
    elif _plain_vectors(queries, dim):
        mat = np.concatenate(queries).reshape(len(queries), dim).astype(np.float32, copy=False)
    else:
        return None
    n = mat.shape[0]
    if token_counts is not None and not (len(token_counts) == n and all(type(c) is int for c in token_counts)
                                         and 1 <= min(token_counts) and max(token_counts) <= MAX_TOKEN_COUNT):
        return None  # named by _given_count on the checked path
    # imported here: fastpath imports doc_columns, which imports this module
    from normrank.fastpath import units_into

    out, norms = np.empty((n, dim if width is None else width), dtype=np.float32), np.empty(n)
    if not units_into(mat, out, norms, PLAIN_MIN_NORM):  # NaN, infinity or a near-zero row: refused
        return None
    if width is not None:
        return out, norms, None
    counts = np.full(n, -1, dtype=np.int64) if token_counts is None else np.array(token_counts, dtype=np.int64)
    return out, norms, counts


def _plain_vectors(queries: Sequence[Any], dim: int) -> bool:
    """Every query a 1-D float ndarray of the index's dimension: stacking them gives exactly the matrix
    the per-row conversion builds."""
    shape = (dim,)
    return all(type(q) is np.ndarray and q.shape == shape and q.dtype.kind == "f" for q in queries)


def _as_metadatas(metadatas: Sequence[Mapping[str, Any]] | None, n: int, *,
                  allow_nul: bool = True, jsonb: bool = False) -> list[dict[str, Any]]:
    """Deep copies through JSON: the store never shares a dict with the caller, and holds exactly
    what a save writes (so keys become strings and tuples lists now, not after a reload). Bounded
    in depth and size, finite, UTF-8 clean (:func:`normrank._validation.check_metadata`)."""
    if metadatas is None:
        return [{} for _ in range(n)]
    if isinstance(metadatas, Mapping):
        raise InvalidArgumentError("metadatas must be a list of dicts, one per document, not a single dict")
    metas = list(metadatas)
    if len(metas) != n:
        raise InvalidArgumentError(f"{len(metas)} metadata dicts for {n} vectors")
    return [check_metadata(m, f"metadata {i}", allow_nul=allow_nul, jsonb=jsonb) for i, m in enumerate(metas)]
