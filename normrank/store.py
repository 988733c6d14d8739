"""``NormIndex``: a FAISS store that keeps the norm and serves the exact blended top-k.

Each document is stored as the augmented vector ``[d_hat, c(d), 0...]`` where ``c`` is
the mode's norm column (``g(d)`` for the additive blend), zero-padded to a multiple
of ``pad_to`` (by default 1: 385 columns, the fewest bytes a scan or a walk reads; see
benchmarks/results/speed.md). A query
``[q_hat, w(q), 0...]`` then scores ``cos + w(q) * g(d)`` in a single inner-product
search: no over-fetching, no re-ranking, the same top-k a brute-force pass gives.

The raw norm and token count of every document are kept beside the index, so the
calibration and the feature can be changed later without re-encoding.

Thread safety (the contract ``tests/test_concurrency.py`` checks): one re-entrant lock
guards the index state, and every public method that reads or changes it holds the lock
for its whole run. So calls from many threads behave as if they ran one at a time in
some order: a search sees the state before or after a concurrent ``add_*``, ``delete``,
``set_weights`` or ``recalibrate``, never a mix, and its scores are exactly those of that
state. Query texts are encoded before the lock is taken, so a slow encoding does not hold
up writers. Searches on one index run one at a time (FAISS already parallelises a batch
internally): pass many queries to ``search_batch`` for throughput. ``get`` and hits return
copies of metadata, so callers cannot change stored documents by accident. Across
processes, ``save``/``load`` of one folder are ordered by a file lock
(:mod:`normrank.persistence`); each process still has its own in-memory index.
"""

from __future__ import annotations

import copy
import errno
import gc
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from normrank import huge_pages
from normrank._validation import (
    check_adapter_entry,
    check_adapter_state,
    check_option,
)
from normrank.batch_topk import (
    SGEMM_MIN_BATCH,
    at_most_threads,
    raw_batch_topk,
    sgemm_topk,
    stored_vectors,
)
from normrank.calibration import FEATURES, NormCalibrator
from normrank.candidate_set import CandidateSet
from normrank.doc_columns import COLUMN_FILES, DocColumns
from normrank.encoders import RawEncoder, encoder_from_settings, warn_if_other_encoder
from normrank.errors import (
    ConcurrentUpdateError,
    DuplicateIdError,
    EmptyCorpusError,
    IndexFormatError,
    InvalidArgumentError,
    PersistenceError,
)
from normrank.fastpath import array_rows, build_hits, hit_rows, unit_into
from normrank.filters import check_filter
from normrank.index_base import (  # noqa: F401  (re-exported: the names the store always had)
    MAX_TOKEN_COUNT,
    BlendIndexBase,
    MetadataFilter,
    Record,
    SearchableIndex,
    _as_counts,
    _as_metadatas,
    _check_ids,
    _check_k,
    _match,
    _plain_batch,
    check_index_parts,
    needs_recalibration,
    query_calibration,
)
from normrank.persistence import (
    ANY_VERSION,
    CURRENT,
    load_npy,
    open_nofollow,
    read_verified_file,
    reading_deferred,
    release_free_heap,
    write_versioned,
)
from normrank.scoring import (
    Hit,
    HitArrays,
    Weights,
    blend,
    doc_column,
    multiplicative_bound,
    query_column,
)

logger = logging.getLogger(__name__)

IndexType = Literal["flat", "hnsw", "ivf"]
INDEX_TYPES: tuple[str, ...] = ("flat", "hnsw", "ivf")
FORMAT_VERSION = 2  # 2: document columns (doc_columns); 1: records.jsonl, still read
#: The files a load checksums while it parses them, saved with piece checksums so its threads share them.
_BIG_FILES = ("index.faiss", "texts.utf8")
#: Scale of the stored norm column (a power of two, so exact in float32); see ``NormIndex._augment``.
COLUMN_SCALE = 2.0 ** -5
#: ``pad_to`` when none is given, by index type (see :class:`NormIndex`, benchmarks/results/speed.md).
PAD_TO_BY_INDEX_TYPE: dict[str, int] = {"flat": 1, "ivf": 1, "hnsw": 1}
#: Every file a save writes; a manifest that does not list one of them was altered.
#: Files every saved version has; format 2 adds ``doc_columns.COLUMN_FILES``, format 1 ``records.jsonl``.
SAVED_FILES = ("index.faiss", "norms.npy", "token_counts.npy", "tombstones.npy", "state.json")
class _Option:
    """A numeric setting checked against :data:`normrank._validation.OPTION_RANGES` whenever it is set,
    at construction and later (``index.ef_search = 2_000_000_000`` is refused, not a 15 GiB search)."""

    def __init__(self, apply: Callable[[Any, int], None] | None = None, *, fixed_once_built: bool = False) -> None:
        self._apply = apply
        self._fixed = fixed_once_built

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.attr = name, f"_opt_{name}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.attr)

    def __set__(self, obj: Any, value: Any) -> None:
        value = check_option(self.name, value)
        if self._fixed and getattr(obj, "_index", None) is not None and value != getattr(obj, self.attr):
            raise InvalidArgumentError(f"{self.name} is fixed once the index holds documents "
                                       f"(it is {getattr(obj, self.attr)}); build a new index to change it")
        lock = getattr(obj, "_lock", None)
        if lock is None or self._apply is None:
            setattr(obj, self.attr, value)
            return
        with lock:
            setattr(obj, self.attr, value)
            self._apply(obj, value)


def _apply_ef_search(index: Any, value: int) -> None:
    if index._index is not None and index.index_type == "hnsw":
        faiss.downcast_index(index._index.index).hnsw.efSearch = value


def _apply_nprobe(index: Any, value: int) -> None:
    if index._index is not None and index.index_type == "ivf":
        index._index.nprobe = min(value, index._index.nlist)


class NormIndex(BlendIndexBase):
    """A FAISS-backed store of raw-norm-aware documents.

    Parameters
    ----------
    encoder:
        Encodes texts; ``None`` makes the bundled MiniLM encoder the first time text is given.
    dim:
        Vector dimension; taken from the encoder or the first vectors when ``None``.
    weights:
        The blend (``Weights()`` = plain cosine until set by hand or by :meth:`fit`).
    index_type:
        ``"flat"`` (exact, default), ``"hnsw"`` or ``"ivf"`` (approximate, faster at scale).
    pad_to:
        Round the augmented width up to a multiple of this; ``None`` (the default) picks it by index
        type (:data:`PAD_TO_BY_INDEX_TYPE`, benchmarks/results/speed.md): 1 for every type. A flat or
        IVF scan's time follows the bytes it reads, and 385 columns are 0.3% more than FAISS's 384
        where 392 are 2% more: on the Intel Xeon benchmark machine single 10k-document queries ran at
        0.96-0.98 of FAISS's with 385 columns and 0.93-0.98 with 392 in seven runs (an AMD EPYC scanned
        both alike);
        a batch's sgemm ran 1-2% faster over 392 columns. An HNSW walk fetches each vector on its own,
        and FAISS's buffer starts 16 bytes past a cache line, so a 385-wide vector spans the 25 cache
        lines a 384-wide one does where a 392-wide one spans 25 or 26 (at 100k documents the walk ran
        at 1.03 of FAISS's cosine HNSW with 385 columns and 0.96 with 392).
    calibrator, query_calibrator:
        Pre-fitted calibrations; by default the document one is fitted on the first documents,
        refitted as they change: by every add or delete while fewer than 40 documents inform it, then
        when the corpus doubles or half of it has been deleted (:func:`~normrank.index_base.needs_recalibration`);
        the query one by :meth:`fit` or
        :meth:`calibrate_queries`.
    """

    # Numeric options: range-checked at construction and whenever set; ef_search and nprobe apply at once.
    pad_to = _Option(fixed_once_built=True)
    hnsw_m = _Option()
    ef_construction = _Option()
    ef_search = _Option(_apply_ef_search)
    nlist = _Option()
    nprobe = _Option(_apply_nprobe)

    def __init__(
        self,
        encoder: RawEncoder | None = None,
        *,
        dim: int | None = None,
        weights: Weights | None = None,
        index_type: IndexType = "flat",
        pad_to: int | None = None,
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 128,
        nlist: int = 256,
        nprobe: int = 16,
        calibrator: NormCalibrator | None = None,
        query_calibrator: NormCalibrator | None = None,
    ) -> None:
        if index_type not in INDEX_TYPES:
            raise InvalidArgumentError(f"unknown index_type {index_type!r}; choose one of {list(INDEX_TYPES)}")
        if weights is not None and not isinstance(weights, Weights):
            raise InvalidArgumentError(f"weights must be a normrank.Weights, got {type(weights).__name__}")
        check_index_parts(encoder, calibrator, query_calibrator)
        if dim is not None:  # a plain int, so that it saves (np.int64 indexed, then no save could write it)
            dim = check_option("dim", dim)
        # each numeric option is range-checked as it is set (see _Option)
        self.pad_to = PAD_TO_BY_INDEX_TYPE[index_type] if pad_to is None else pad_to
        self.hnsw_m, self.ef_construction, self.ef_search = hnsw_m, ef_construction, ef_search
        self.nlist, self.nprobe = nlist, nprobe
        self._encoder = encoder
        self._dim = dim
        self._weights = weights or Weights()
        self.index_type = index_type
        self._column_scale = COLUMN_SCALE
        self.calibrator = calibrator or NormCalibrator()
        self._auto_calibrated = calibrator is None or not calibrator.is_fitted
        # documents deleted since the document calibration was fitted: an automatic one is refitted at the
        # next add once half the documents it was fitted on could have been replaced (needs_recalibration)
        self._removed_since_calibration = 0
        self.query_calibrator = query_calibrator
        self._docs = DocColumns()  # ids, texts, metadata, norms, counts and g(d) by internal id
        self._tombstones: set[int] = set()  # deleted but still in FAISS until the next compaction
        self._tombstone_array: np.ndarray | None = None
        self._index: Any = None
        self._column_key: tuple[Any, ...] | None = None
        self._labels: np.ndarray | None = None  # position -> internal id of an IndexIDMap2, cached
        self._inner: Any = None  # the flat index inside the IDMap2, cached with _labels
        self._query_buf: tuple[Any, ...] | None = None  # see _single_query_buffers
        self._positions_are_ids = False  # FAISS positions equal internal ids: no mapping (see _flat_parts)
        self._labels_view: memoryview | None = None  # _labels read without NumPy (see _additive_hits)
        self._flat_calls: tuple[int, int, Any] = (0, 0, None)  # set with _labels (see _flat_parts)
        self._flat_vectors: np.ndarray | None = None  # a flat index's stored vectors, set with _labels
        self._origin: tuple[str, str] | None = None  # (folder, version) loaded from or last saved: save(if_unchanged)
        #: Small JSON state a framework adapter keeps with the index, saved and loaded with it (the LlamaIndex
        #: store's deleted reference-node ids, which LlamaIndex keeps naming after the delete).
        self.adapter_state: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._warn_if_approximate_cannot_follow()

    @property
    def augmented_dim(self) -> int:
        if self._dim is None:
            raise EmptyCorpusError("the index is empty: its dimension is not known yet")
        return int(math.ceil((self._dim + 1) / self.pad_to) * self.pad_to)

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, doc_id: object) -> bool:
        with self._lock:  # the id table may be built by this call
            return doc_id in self._docs.by_id

    def ids(self) -> list[str]:
        """Live ids, in insertion order."""
        with self._lock:
            ids = self._docs.ids
            return [ids[i] for i in self._docs.live().tolist()]  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"NormIndex(n={len(self)}, dim={self._dim}, index_type={self.index_type!r}, weights={self._weights})"

    # ------------------------------------------------------------ building
    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        *,
        encoder: RawEncoder | None = None,
        show_progress: bool | None = None,
        **kwargs: Any,
    ) -> NormIndex:
        """Encode ``texts`` with the raw encoder and index them."""
        if len(texts) == 0:
            raise EmptyCorpusError("cannot build an index from an empty corpus")
        index = cls(encoder, **kwargs)
        index.add_texts(texts, ids=ids, metadatas=metadatas, show_progress=show_progress)
        return index

    def _precheck_ids(self, ids: Sequence[str] | None, n: int) -> list[str]:
        out = self._batch_ids(ids, n)
        if ids is not None:
            with self._lock:  # add_texts calls this before taking the lock; the id table may be built here
                by_id = self._docs.by_id
            for x in out:
                if x in by_id:
                    raise DuplicateIdError(f"id {x!r} is already in the index; delete it first to replace it")
        return out

    def add_vectors(
        self,
        vectors: np.ndarray,
        token_counts: Sequence[int] | np.ndarray,
        ids: Sequence[str] | None = None,
        texts: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[str]:
        """Add raw (un-normalised) vectors with their token counts. All-or-nothing."""
        with self._lock:
            mat, norms, counts, text_list, metas = self._check_batch(
                vectors, token_counts, texts, metadatas, empty=not self._docs)
            n = mat.shape[0]
            new_ids = self._precheck_ids(ids, n)

            first, fresh = self._dim is None, self._index is None
            if first:
                self._dim = mat.shape[1]
            try:
                calibrator = self.calibrator
                if not calibrator.is_fitted:
                    calibrator = NormCalibrator(calibrator.max_bins, calibrator.min_per_bin).fit(norms, counts)
                internal = np.arange(self._docs.next, self._docs.next + n, dtype=np.int64)
                self._ensure_index(mat, norms, counts, calibrator)
                unit = mat / norms[:, None].astype(np.float32)
                g = self._shaped_feature(calibrator, norms, counts)
                self._index.add_with_ids(self._augment(unit, doc_column(g, self._weights.mode)), internal)
                self._labels = None
            except Exception:
                if first:
                    self._dim = None
                if fresh:
                    self._index = None
                raise
            fitted_now = calibrator is not self.calibrator
            self.calibrator = calibrator
            self._column_key = self._current_column_key()
            self._docs.append(new_ids, text_list, metas, norms, counts, g)
            if fitted_now:
                self._removed_since_calibration = 0
            if not self._refit_if_due():  # a refit rebuilds the index, and asks for huge pages for the new one
                _huge_pages_for(self._index)
            return new_ids

    def _ensure_index(self, mat: np.ndarray, norms: np.ndarray, counts: np.ndarray, cal: NormCalibrator) -> None:
        if self._index is not None:
            return
        d = self.augmented_dim
        if self.index_type == "flat":
            self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(d))
        elif self.index_type == "hnsw":
            base = faiss.IndexHNSWFlat(d, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            base.hnsw.efConstruction = self.ef_construction
            base.hnsw.efSearch = self.ef_search
            self._index = faiss.IndexIDMap2(base)
        else:
            nlist = max(1, min(self.nlist, mat.shape[0] // 39))
            quantizer = faiss.IndexFlatIP(d)
            ivf = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            unit = mat / norms[:, None].astype(np.float32)
            ivf.train(self._augment(unit, doc_column(self._shaped_feature(cal, norms, counts), self._weights.mode)))
            ivf.nprobe = min(self.nprobe, nlist)
            ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
            self._index = ivf

    def _start_empty(self) -> None:
        """Give a never-filled index its (empty) FAISS index, so that it saves and reloads empty.

        Why: LlamaIndex persists a store before anything is added (``VectorStoreIndex([])`` then
        ``persist``), and failing there left a half-written storage folder that no longer loaded. The
        dimension comes from the encoder; the calibration is fitted on the first documents added
        after a reload, as it would have been.

        Raises
        ------
        EmptyCorpusError
            No encoder (so no dimension yet), or an IVF index, which is trained on its first documents.
        """
        if self._dim is None:
            if self._encoder is None:
                raise EmptyCorpusError("cannot save an index that never held a document and has no encoder: its "
                                       "dimension is not known yet")
            self._dim = int(self._encoder.dim)
        if self.index_type == "ivf":
            raise EmptyCorpusError("cannot save an IVF index that never held a document: it is trained on its first "
                                   "documents; add some first, or use a flat or HNSW index")
        self._ensure_index(np.zeros((0, self._dim), dtype=np.float32), np.zeros(0), np.zeros(0, dtype=np.int64),
                           self.calibrator)
        self._labels = None
        self._column_key = self._current_column_key()

    def _augment(self, unit: np.ndarray, column: np.ndarray, query: bool = False) -> np.ndarray:
        # Documents store column * s and queries column / s: the product (the score) is unchanged, but
        # the document-document inner product that HNSW links and IVF clusters by stays ~cosine
        # (unscaled, g(d1) * g(d2) up to 9 swamped it: HNSW recall@10 fell to ~0.65).
        s = self._column_scale
        out = np.zeros((unit.shape[0], self.augmented_dim), dtype=np.float32)
        out[:, : self._dim] = unit
        out[:, self._dim] = np.asarray(column, dtype=np.float64) / s if query else np.asarray(column) * s
        return out

    # ------------------------------------------------------------ changing
    def delete(self, ids: Iterable[str]) -> int:
        """Delete documents by id; all ids must exist (nothing is deleted otherwise).

        Cheap one id at a time: a delete marks the documents (searches skip them at once) and
        FAISS drops them in batches (flat/IVF past ``max(256, n/64)`` marks, HNSW by a rebuild
        past ``max(1000, n)``) and always before a save, so a deleted vector never reaches disk.
        An automatic calibration is refitted once enough has been deleted (:func:`needs_recalibration`).
        """
        with self._lock:
            removed = self._mark_deleted(ids)
            if removed and not self._refit_if_due():  # a refit rebuilds the index: no compaction needed
                self._compact_if_due()
            return removed

    def _take_corpus_calibration(self, calibrator: NormCalibrator) -> None:
        """An empty index takes a corpus's calibration (``EncodedCorpus.into``), fitted on exactly the
        documents that come next: nothing deleted before counts towards a refit."""
        with self._lock:
            if not self._docs:
                self.calibrator, self._removed_since_calibration = calibrator, 0

    def _delete_for_upsert(self, ids: Iterable[str]) -> int:
        """:meth:`delete` without the refit: an upsert's add right after decides it (on the documents it
        ends with), and one it refuses puts the deleted documents back under the same calibration."""
        with self._lock:
            removed = self._mark_deleted(ids)
            self._compact_if_due()
            return removed

    def _mark_deleted(self, ids: Iterable[str]) -> int:
        internal = np.unique(self._docs.internal_ids(_check_ids(ids), "unknown ids, nothing deleted"))
        if internal.size == 0:
            return 0
        # Tombstones, compacted in batches: removing from FAISS rewrites the whole index (and the
        # IDMap2 reverse map), which made one-at-a-time deletes quadratic (67 ms per id at 80k docs).
        self._tombstones.update(internal.tolist())
        self._tombstone_array = None
        self._docs.remove(internal.tolist())
        self._removed_since_calibration += int(internal.size)
        return int(internal.size)

    def _compact_if_due(self) -> None:
        limit = max(1000, len(self)) if self.index_type == "hnsw" else max(256, len(self) // 64)
        if len(self._tombstones) > limit:
            self._compact()

    def _refit_if_due(self) -> bool:
        """Refit an automatic calibration where :func:`needs_recalibration` says so; whether it was.

        A refit that fails (the rebuild holds the old and the new index at once, so memory can run out)
        is logged, not raised: :meth:`recalibrate` has put the old calibration and index back, the add or
        delete that asked for it has happened and stays (a delete that raised with its documents gone
        told the caller nothing was deleted), and the next add or delete tries again."""
        if not needs_recalibration(self._auto_calibrated, len(self), self.calibrator.n_fitted,
                                   self._removed_since_calibration):
            return False
        try:
            self.recalibrate()
        except Exception as exc:  # noqa: BLE001 - named in the log; the index is whole and the change stays
            logger.warning("the automatic calibration could not be refitted (%s: %s); the documents are "
                           "searched under the previous one until the next add or delete refits it",
                           type(exc).__name__, exc)
            return False
        return True

    def _compact(self) -> None:
        """Drop deleted documents from FAISS itself (HNSW by rebuilding its graph); searches look the same."""
        if not self._tombstones:
            return
        if self.index_type == "hnsw":
            if self._docs:
                self._rebuild()
                return
            self._index = None  # everything was deleted: an empty graph, numbered from 0 again
            self._ensure_index(np.zeros((0, self._dim or 0), dtype=np.float32), np.zeros(0), np.zeros(0, np.int64),
                               self.calibrator)
            self._docs.renumber()
            self._tombstones.clear()
            self._tombstone_array = None
            self._labels = None
            return
        self._index.remove_ids(np.array(sorted(self._tombstones), dtype=np.int64))
        self._tombstones.clear()
        self._tombstone_array = None
        self._labels = None
        if self.index_type == "flat":
            self._renumber_flat()
        _huge_pages_for(self._index)

    def _renumber_flat(self) -> None:
        """After a compaction: FAISS keeps the live vectors in id order, so the live documents and FAISS's
        ids become ``0..n-1`` together (see :meth:`DocColumns.renumber`). An index saved by a normrank
        before this loads with its gaps, and searches map positions to ids (:meth:`_flat_parts`)."""
        n = len(self._docs)
        self._docs.renumber()
        faiss.copy_array_to_vector(np.arange(n, dtype=np.int64), self._index.id_map)
        self._index.construct_rev_map()
        self._labels = None

    def _dead(self) -> np.ndarray:
        """The tombstoned internal ids as a sorted array, cached until the next delete or compaction."""
        if self._tombstone_array is None:
            self._tombstone_array = np.array(sorted(self._tombstones), dtype=np.int64)
        return self._tombstone_array

    def get(self, ids: Iterable[str]) -> list[Record]:
        """Records for ``ids`` in the given order."""
        with self._lock:
            return [self._docs.record(i) for i in self._docs.internal_ids(_check_ids(ids)).tolist()]

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The raw vectors of stored documents, in the given order: float32, shape ``(len(ids), dim)``.

        Rebuilt from what the index holds (the unit direction, read back from FAISS, times the
        stored norm), so vector stores (MMR, embedding reuse) and re-rankers need not keep a copy.
        Equal to what was added up to float32 rounding. Raises ``UnknownIdError`` for a missing id.
        """
        with self._lock:
            internal = self._docs.internal_ids(_check_ids(ids))
            if not internal.size:
                return np.zeros((0, self._dim or 0), dtype=np.float32)
            unit = np.asarray(self._index.reconstruct_batch(internal), dtype=np.float32)[:, : self._dim]
            norms, _ = self._docs.norms_counts(internal)
            return np.ascontiguousarray(unit * norms[:, None].astype(np.float32))

    def blend_settings(self) -> tuple[Weights, NormCalibrator, NormCalibrator | None]:
        with self._lock:  # one consistent triple, not a set_weights or fit half applied
            return self._weights, self.calibrator, self.query_calibrator

    def update_adapter_state(self, key: str, value: Any) -> None:
        """Set ``adapter_state[key]`` to a JSON ``value`` (checked now), saved with the index: the call a
        framework adapter makes on either backend (``PgVectorNormIndex`` writes it to the table at once)."""
        checked = check_adapter_entry(key, value)
        with self._lock:
            self.adapter_state[key] = checked

    def set_weights(self, weights: Weights) -> None:
        """Change the blend; the stored norm column is rebuilt only if the feature or mode needs it."""
        if not isinstance(weights, Weights):
            raise InvalidArgumentError(f"set_weights takes a normrank.Weights, got {type(weights).__name__}")
        with self._lock:
            old = self._weights
            self._weights = weights
            if self._index is not None and self._current_column_key() != self._column_key:
                try:
                    self._rebuild()
                except BaseException:
                    self._weights = old  # _rebuild has put the old index back
                    raise
        self._warn_if_approximate_cannot_follow()

    def _warn_if_approximate_cannot_follow(self) -> None:
        """Log that an HNSW or IVF index loses recall under a weight this large.

        Why: their graph and lists follow cosine (the norm column is scaled down for them); once the norm
        term decides the ranking they no longer find its top-k. Measured on 5,000 clustered vectors:
        recall@10 of the exact blend 1.00 up to |a| = 0.1 (the fit's grid stops at 0.04), 0.95-0.99 at 0.3,
        0.67-0.86 at 0.5 and 0.1-0.7 at 10, without a word."""
        w = self._weights
        if self.index_type == "flat" or w.is_cosine or w.mode == "multiplicative":
            return
        reach = abs(w.a) + abs(w.b) * (w.clip or 3.0) if w.mode == "additive" else w.epsilon
        if reach > APPROXIMATE_WEIGHT_LIMIT:
            logger.warning("a norm weight this large (|w(q)| up to %.3g) lets the norm term decide the ranking, "
                           "which this %s index does not follow: its recall of the exact blended top-k falls "
                           "(0.67-0.86 at a = 0.5 in a test); use index_type='flat', or measure recall",
                           reach, self.index_type)

    def recalibrate(self) -> None:
        """Refit the document calibration on every stored document and refresh the index."""
        with self._lock:
            if not self._docs:
                raise EmptyCorpusError("cannot calibrate an empty index")
            norms, counts = self._docs.norms_counts(self._docs.live())
            old = self.calibrator
            self.calibrator = NormCalibrator(old.max_bins, old.min_per_bin).fit(norms, counts)
            try:
                self._rebuild()
            except BaseException:
                self.calibrator = old  # _rebuild has put the old index back
                raise
            self._removed_since_calibration = 0

    def calibrate_queries(self, queries: Sequence[str] | None = None, *, norms: np.ndarray | None = None,
                          token_counts: np.ndarray | None = None) -> NormCalibrator:
        """Fit the query calibration on representative query texts (or their norms and counts)."""
        cal = query_calibration(self, queries, norms, token_counts)
        with self._lock:
            self.query_calibrator = cal
            return cal

    def _rebuild(self) -> None:
        live = self._docs.live()
        unit = self._index.reconstruct_batch(live)[:, : self._dim] if live.size else None
        norms, counts = self._docs.norms_counts(live)
        old_index, old_tombstones = self._index, set(self._tombstones)
        renumbered = live.size < self._docs.next  # deleted slots: the rebuilt index numbers its documents 0..n-1
        try:  # on any failure the old index stays, so no document is lost
            self._index = None
            self._tombstones.clear()
            if live.size:
                self._ensure_index(unit * norms[:, None].astype(np.float32), norms, counts, self.calibrator)
                g = self._shaped_feature(self.calibrator, norms, counts)
                self._index.add_with_ids(self._augment(unit, doc_column(g, self._weights.mode)),
                                         np.arange(live.size, dtype=np.int64) if renumbered else live)
            elif self.index_type == "ivf":
                # emptied: keep the trained quantizer, empty. Without it the index could not save ("an IVF
                # index that never held a document") and the folder kept the deleted documents.
                old_index.reset()
                self._index = old_index
        except BaseException:
            self._index, self._tombstones = old_index, old_tombstones
            raise
        self._labels = None
        _huge_pages_for(self._index)
        if renumbered:
            self._docs.renumber()
            live = self._docs.live()
        self._docs.g[:] = 0.0
        if live.size:
            self._docs.set_g(live, g)
        self._tombstone_array = None
        self._column_key = self._current_column_key()

    # ------------------------------------------------------------ searching
    def search(
        self,
        query: str | np.ndarray,
        k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        query_token_count: int | None = None,
    ) -> list[Hit]:
        """The exact blended top-``k`` for one query (text, or a raw vector)."""
        if filter is None and isinstance(query, np.ndarray) and _plain_count(query_token_count):
            hits = self._search_vector(query, k)
            if hits is not None:
                return hits
        return self.search_batch([query], k, filter=filter,
                                 query_token_counts=None if query_token_count is None else [query_token_count])[0]

    def search_batch(
        self,
        queries: Sequence[str | np.ndarray],
        k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        query_token_counts: Sequence[int | None] | None = None,
    ) -> list[list[Hit]]:
        """Blended top-``k`` for many queries in one FAISS call."""
        tried = _lean_first(queries, k, filter)
        if tried:
            with self._lock:
                wide = self._lean_wide(queries, k, query_token_counts)  # None for anything unusual
                if wide is not None:
                    return self._hits_from_wide(wide, k)
        filter = check_filter(filter)
        front = self._batch_front(queries, k, "search_batch")
        if front is None:
            return []
        queries, k, encoded = front
        with self._lock:
            lean = filter is None and encoded[0] is None and not tried
            wide = self._lean_wide(queries, k, query_token_counts) if lean else None
            if wide is not None:
                return self._hits_from_wide(wide, k)
            rows = self._blended_rows(queries, k, filter, query_token_counts, encoded)  # the lean path was tried above
            return rows if isinstance(rows, list) else self._hits_batch(*rows)

    def _hits_from_wide(self, wide: tuple[np.ndarray, ...], k: int) -> list[list[Hit]]:
        """Under the lock: the hits of :meth:`_lean_wide`'s answer; without equal scores to order, straight
        from the kernel's rows."""
        hits = hit_rows(wide[2], wide[1], k, self._weights.a, None, self._docs.hit_columns(), 2)
        return hits if hits is not None else self._hits_batch(*self._lean_finish(wide, k))

    def _arrays_from_wide(self, wide: tuple[np.ndarray, ...], k: int) -> HitArrays:
        """Under the lock: :meth:`_hits_from_wide` as arrays; every row ``k`` wide, no padding, so the
        additive cosine is the score minus ``w * g(d)``."""
        n = wide[0].shape[0]
        out_s, out_c = np.empty((n, k), dtype=np.float32), np.empty((n, k))
        ids = array_rows(wide[2], wide[1], k, self._weights.a, None, self._docs.hit_columns(), out_s, out_c, 2)
        if ids is not None:
            return HitArrays(ids, out_s, out_c)
        labels, scores, w = self._lean_finish(wide, k)  # equal scores somewhere: ordered first
        cosines = np.subtract(scores, w[0] * self._docs.g[labels], dtype=np.float64)
        return HitArrays(self._docs.id_array()[labels].tolist(), scores, cosines)

    def search_arrays(
        self,
        queries: Sequence[str | np.ndarray],
        k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        query_token_counts: Sequence[int | None] | None = None,
    ) -> HitArrays:
        """:meth:`search_batch` as arrays (ids, scores, cosines), without a ``Hit`` object per result.

        The same hits in the same order with the same values; takes the same arguments and raises the
        same errors. For batch scoring and evaluation, where building 640 ``Hit`` objects was ~10% of a
        64-query batch over 10k documents (benchmarks/results/speed.md).
        """
        one = _one_plain_query(queries, query_token_counts) if filter is None else None
        if one is not None:
            found = self._search_vector(one, k, arrays=True)
            if found is not None:
                return found
        tried = one is None and _lean_first(queries, k, filter)
        if tried:
            with self._lock:
                wide = self._lean_wide(queries, k, query_token_counts)
                if wide is not None:
                    return self._arrays_from_wide(wide, k)
        filter = check_filter(filter)
        front = self._batch_front(queries, k, "search_arrays")
        if front is None:
            return HitArrays([], np.zeros((0, 0), dtype=np.float32), np.zeros((0, 0)))
        queries, k, encoded = front
        with self._lock:
            lean = filter is None and encoded[0] is None and not tried
            wide = self._lean_wide(queries, k, query_token_counts) if lean else None
            if wide is not None:
                return self._arrays_from_wide(wide, k)
            rows = self._blended_rows(queries, k, filter, query_token_counts, encoded)  # the lean path was tried above
            if isinstance(rows, list):  # multiplicative blends and empty filters: from their hits
                return _arrays_from_hits(rows, k)
            labels, scores, w = rows
            if labels.shape[1] < k:  # a filter left fewer than k documents: every row is k wide all the same
                labels = np.pad(labels, ((0, 0), (0, k - labels.shape[1])), constant_values=-1)
                scores = np.pad(scores, ((0, 0), (0, k - scores.shape[1])), constant_values=-np.inf)
            cosines = self._batch_cosines(scores, self._docs.g[np.maximum(labels, 0)], w)
            pad = labels < 0
            if pad.any():
                doc_ids = self._docs.ids
                scores = np.where(pad, np.float32(-np.inf), scores)
                cosines[pad] = np.nan
                ids = [[doc_ids[i] for i in row if i >= 0] for row in labels.tolist()]
            else:
                ids = self._docs.id_array()[labels].tolist()
            return HitArrays(ids, scores, cosines)  # type: ignore[arg-type]

    def _batch_front(self, queries: Sequence[str | np.ndarray], k: Any,
                     method: str) -> tuple[list[Any], int, Any] | None:
        """What a batch search checks and encodes before taking the lock; ``None`` for no queries."""
        if isinstance(queries, (str, np.ndarray)) and not (isinstance(queries, np.ndarray) and queries.ndim == 2):
            raise InvalidArgumentError(f"{method} takes a list of queries; use search() for one")
        k = _check_k(k)
        if not (isinstance(queries, np.ndarray) and queries.dtype.kind == "f"):
            queries = list(queries)  # a float matrix stays one: its rows are read in one NumPy call
        if len(queries) == 0:
            return None
        if not self._docs:
            raise EmptyCorpusError("the index is empty: add documents before searching")
        return queries, k, self._encode_texts(queries)  # outside the lock: encoding is the slow part

    def _blended_rows(self, queries: list[Any], k: int, filter: MetadataFilter | None,
                      query_token_counts: Sequence[int | None] | None,
                      encoded: Any) -> list[list[Hit]] | tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Under the lock: (internal ids, blended scores, query weights), or the hits themselves where the
        search is not one augmented FAISS search (bounded multiplicative blends, a filter matching nothing)."""
        if not self._docs:
            raise EmptyCorpusError("the index is empty: add documents before searching")
        if k > len(self):
            raise InvalidArgumentError(
                f"k of {k} is larger than the number of documents ({len(self)}); ask for k <= {len(self)}"
            )
        unit, norms, counts = self._encode_queries(queries, query_token_counts, encoded)
        w = self._query_weights(norms, counts)
        allowed = self._allowed(filter)
        if allowed is not None and allowed.size == 0:
            return [[] for _ in queries]
        kk = k if allowed is None else min(k, int(allowed.size))
        if self._weights.mode == "multiplicative" and not self._weights.is_cosine:
            return [self._search_multiplicative(unit[i], w[i], kk, allowed) for i in range(len(queries))]
        qaug = self._augment(unit, query_column(w, self._weights), query=True)
        scores, ids = self._raw_search(qaug, kk, allowed)
        ids, scores = _ties_by_id(ids, scores)
        return ids, scores, w

    def _lean_wide(self, queries: Sequence[Any], k: int,
                   query_token_counts: Sequence[int | None] | None) -> tuple[np.ndarray, ...] | None:
        """:meth:`_blended_rows` for the common batch (raw vectors, no filter, no deletes pending, a flat
        index, a fixed additive weight) up to the kernel's answer, one score wider than ``k`` (while ``k``
        is below the index's size) to see equal scores across the cut: (augmented queries, scores, internal
        ids); ``None`` for anything else. A batch whose rows have no equal scores is then read as it is
        (:func:`normrank.fastpath.hit_rows` and ``array_rows`` check that) and any other goes through
        :meth:`_lean_finish`.

        Why: each NumPy call after a scan has left the caches cold costs several microseconds, and at
        10k documents the generic path's calls were most of what kept ``search_arrays`` below FAISS's BLAS
        path (benchmarks/results/speed.md). The same arithmetic: the unit rows, the weight column and the
        kernel of the generic path."""
        wts = self._weights
        if (self.index_type != "flat" or wts.b != 0.0 or wts.mode != "additive" or self._tombstones
                or self._index is None or not 0 < k <= len(self._docs)):
            return None  # including an empty index and a k above its size, which the generic path names
        inner, labels = self._flat_parts()
        column, wide = wts.a / self._column_scale, k + 1 if k < self._flat_calls[0] else k
        scanned = raw_batch_topk(queries, query_token_counts, self._dim, column, self._flat_vectors, wide)
        if scanned is not None:  # the steps below in one C call
            return scanned[0], scanned[1], self._ids_at(scanned[2], labels)
        plain = _plain_batch(queries, query_token_counts, self._dim, inner.d)
        if plain is None:
            return None
        qaug = plain[0]
        qaug[:, self._dim] = column  # float64 division, then float32: as _augment does
        scores, ids = self._search_kernel(qaug, wide)
        return qaug, scores, ids

    def _lean_finish(self, wide: tuple[np.ndarray, ...], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_blended_rows`' answer from :meth:`_lean_wide`'s: ties across the cut and within rows
        ordered as on every exact path."""
        qaug, scores, ids = wide
        scores, ids = _cut_between_ties(self._search_kernel, qaug, k, self._flat_calls[0], SGEMM_MIN_BATCH,
                                        first=(scores, ids))
        ids, scores = _ties_by_id(ids, scores)
        return ids, scores, np.full(qaug.shape[0], self._weights.a, dtype=np.float64)

    def _search_vector(self, query: np.ndarray, k: Any, *, arrays: bool = False) -> Any:
        """The common case on a lean path: one raw vector, no filter, flat or HNSW index, a fixed weight;
        its hits, or with ``arrays`` (additive blends only) its :class:`HitArrays` of one row.

        Does exactly the arithmetic of :meth:`search_batch` (same float32 query, same FAISS kernel,
        same feature values), minus its per-call generality; returns ``None`` for anything else
        (including every input the general path refuses with a named error), which then answers.
        """
        if type(k) is not int or query.ndim != 1 or query.dtype.kind != "f" or not 0 < k <= _K_MAX:
            return None
        with self._lock:
            wts = self._weights
            if (self.index_type == "ivf" or wts.b != 0.0 or self._tombstones or self._index is None
                    or query.shape[0] != self._dim or k > len(self._docs)
                    or (wts.mode == "multiplicative" and not wts.is_cosine)
                    or (arrays and wts.mode != "additive")):
                return None
            labels = self._flat_parts()[1]
            ntotal, width, search_c = self._flat_calls
            # a flat search asks for one more, to see equal scores across the cut (_cut_between_ties)
            kk = k + 1 if self.index_type == "flat" and k < ntotal else k
            # ours alone while we hold the lock
            q_row, q_view, q_ptr, scores, pos, s_ptr, p_ptr, s_view, p_view = self._single_query_buffers(width, kk)
            # the batch path's unit vector, to the last bit (normrank.fastpath)
            if unit_into(query, q_row) is None:  # NaN or inf anywhere, or a zero vector
                return None  # the general path names it
            w = wts.a
            qcol = w if wts.mode == "additive" else (wts.epsilon * float(np.sign(w)) if wts.mode == "tiebreak" else 0.0)
            q_view[self._dim] = qcol / self._column_scale  # float64 division, stored as float32
            # search_c: FAISS's own call minus its Python wrapper's argument checks (done above); a flat
            # index on one thread: FAISS's per-query kernel, not its database-parallel path (at_most_threads)
            if self.index_type == "flat":
                at_most_threads(1, search_c, 1, q_ptr, kk, s_ptr, p_ptr)
                if kk > k and s_view[k - 1] == s_view[k]:  # equal scores across the cut: the general path
                    return None
            else:
                search_c(1, q_ptr, k, s_ptr, p_ptr)
                if p_view[k - 1] < 0:  # an HNSW walk came back short of k: the general path scores it exactly
                    return None
            if wts.mode == "additive":
                mapping = None if self._positions_are_ids else labels
                if arrays:
                    out_s, out_c = np.empty((1, k), dtype=np.float32), np.empty((1, k))
                    ids = array_rows(p_view, s_view, k, float(w), mapping, self._docs.hit_columns(), out_s, out_c, 1)
                    if ids is not None:
                        return HitArrays(ids, out_s, out_c)
                else:
                    found = hit_rows(p_view, s_view, k, float(w), mapping, self._docs.hit_columns(), 1)
                    if found is not None:
                        return found[0]
                positions = p_view[:k].tolist()
                if not self._positions_are_ids:
                    lab = self._labels_view
                    positions = [lab[p] if p >= 0 else -1 for p in positions]
                positions, values = _untied(positions, s_view[:k].tolist())
                if arrays:
                    return self._additive_arrays(positions, values, float(w))
                return self._additive_hits(positions, values, float(w))
            row = pos[0, :k]  # k hits: flat always, HNSW past the check above
            rows, row_scores = _ties_by_id((row if self._positions_are_ids else labels[row])[None],
                                           scores[0, :k][None])
            return self._hits(rows[0], row_scores[0], w, all_valid=True)

    def _single_query_buffers(self, width: int, k: int) -> tuple[Any, ...]:
        """One augmented query row (with a view of its vector part and a memoryview of it), the result
        rows, their FAISS pointers and memoryviews of the results, kept between single searches (they run
        under the lock, one at a time, and every result is copied out before it is released): allocations,
        a zero fill and pointer lookups fewer per call, which after a scan or a walk has left the caches
        cold cost a visible share of a 10k-document search.
        The padding columns stay zero; the vector and the weight column are written on every call.
        Result rows for a ``k`` above :data:`_KEPT_K_MAX` are made for the call and not kept."""
        buf = self._query_buf
        if buf is not None and buf[0] == width and buf[1] == k:
            return buf[3]
        q = buf[2] if buf is not None and buf[0] == width else np.zeros((1, width), dtype=np.float32)
        scores, pos = np.empty((1, k), dtype=np.float32), np.empty((1, k), dtype=np.int64)
        parts = (q[0, : self._dim], memoryview(q).cast("B").cast("f"), faiss.swig_ptr(q), scores, pos,
                 faiss.swig_ptr(scores), faiss.swig_ptr(pos),
                 memoryview(scores).cast("B").cast("f"), memoryview(pos).cast("B").cast("q"))
        if k <= _KEPT_K_MAX:
            self._query_buf = (width, k, q, parts)
        return parts

    def _allowed(self, flt: MetadataFilter | None) -> np.ndarray | None:
        """Internal ids passing a filter already checked by :func:`~normrank.filters.check_filter`."""
        if flt is None:
            return None
        meta = self._docs.metadata
        return np.array([i for i in self._docs.live().tolist() if _match(meta(i), flt)], dtype=np.int64)

    def _raw_search(self, qaug: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if allowed is None and self._tombstones and self.index_type == "flat":
            return self._search_past_tombstones(qaug, k)
        params, live = None, np.zeros(0, dtype=np.int64)
        if allowed is not None or self._tombstones:
            if allowed is not None:
                live = np.setdiff1d(allowed, self._dead()) if self._tombstones else allowed
                sel = faiss.IDSelectorBatch(live)
            else:  # HNSW or IVF with deletes pending (a flat index takes _search_past_tombstones)
                sel = faiss.IDSelectorNot(faiss.IDSelectorBatch(self._dead()))
            params = self._search_params(sel)
        if params is not None and self.index_type == "flat":  # a filter: exact, ties at the cut as elsewhere
            scores, ids = _cut_between_ties(lambda q, m: self._index.search(q, m, params=params), qaug, k,
                                            int(live.size), qaug.shape[0])  # FAISS picks its kernel by batch size
        elif params is not None:
            scores, ids = self._index.search(qaug, k, params=params)
        elif self.index_type == "ivf":
            scores, ids = self._index.search(qaug, k)
        else:
            scores, ids = self._search_unmapped(qaug, k)
        if self.index_type != "flat" and np.any(ids < 0):
            if allowed is not None:
                return self._exact_subset(qaug, k, allowed)
            return self._exact_short_rows(qaug, k, scores, ids)
        return scores, ids

    def _exact_short_rows(self, qaug: np.ndarray, k: int, scores: np.ndarray,
                          ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows an approximate index answered with fewer than ``k`` hits although ``k`` or more documents
        are live, scored exactly over the live documents; full rows stay as the index gave them.

        Why: an HNSW walk past many deleted documents (1000 stored, 990 deleted: 7-10 of 10 hits), or an IVF
        index whose probed lists a compaction emptied (100 live of 2000: 29-38 of 50), came back short where
        the same search with an always-true filter, and the pgvector backend, gave ``k``."""
        short = np.flatnonzero((ids < 0).any(axis=1))
        live = self._docs.live()
        ex_s, ex_i = self._exact_subset(qaug[short], k, live)
        scores, ids = scores.copy(), ids.copy()
        width = ex_i.shape[1]  # k, or every live document when fewer are live
        scores[short, :width], ids[short, :width] = ex_s, ex_i
        return scores, ids

    def _search_unmapped(self, qaug: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_search_kernel`; on a flat index with equal scores across the cut broken by the lowest
        internal id (:func:`_cut_between_ties`), as every other exact path breaks them."""
        if self.index_type != "flat":
            return self._search_kernel(qaug, k)
        return _cut_between_ties(self._search_kernel, qaug, k, int(self._index.ntotal), SGEMM_MIN_BATCH)

    def _search_kernel(self, qaug: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Search the inner index and map positions to ids in numpy.

        ``IndexIDMap2.search`` translates labels in an OpenMP parallel region on every call;
        on busy cores waking the second thread cost milliseconds per single query (see
        benchmarks/results/speed.md). The position -> id array is cached until the index changes.
        """
        inner, labels = self._flat_parts()
        if self.index_type == "flat" and qaug.shape[0] >= SGEMM_MIN_BATCH:
            # the padding is zero in every query
            scores, pos = sgemm_topk(inner, qaug, k, self._dim + 1, vectors=self._flat_vectors)
        elif self.index_type == "flat":  # one thread per query at most (at_most_threads)
            scores, pos = at_most_threads(qaug.shape[0], inner.search, qaug, k)
        else:
            scores, pos = inner.search(qaug, k)
        return scores, self._ids_at(pos, labels)

    def _ids_at(self, pos: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The internal ids at FAISS positions (from :meth:`_flat_parts`); no hit (-1) stays -1."""
        if self._positions_are_ids:
            return pos
        return np.where(pos >= 0, labels[np.maximum(pos, 0)], -1)

    def _flat_parts(self) -> tuple[Any, np.ndarray]:
        """The index inside the IDMap2 and its position -> id array, cached until the index changes."""
        if self._labels is None or self._inner is None:
            self._labels = faiss.vector_to_array(self._index.id_map).astype(np.int64)
            self._inner = faiss.downcast_index(self._index.index)
            self._labels_view = memoryview(self._labels)
            # what a single search reads of the inner index: SWIG attribute reads cost microseconds each
            # on the caches a scan has just emptied
            self._flat_calls = (int(self._inner.ntotal), int(self._inner.d), self._inner.search_c)
            self._flat_vectors = stored_vectors(self._inner) if self.index_type == "flat" else None
            # true until a compaction or a rebuild after deletes: then searches skip the mapping
            self._positions_are_ids = bool(np.array_equal(self._labels, np.arange(self._labels.size)))
        return self._inner, self._labels

    def _search_past_tombstones(self, qaug: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact flat search with deleted documents still in FAISS: fetch ``k + #deleted`` on the fast
        path and drop the deleted ones, so every row keeps its exact top ``k``. Ties are looked for at the
        cut among the live documents (at the cut of ``k + #deleted`` a duplicate group the top-k never
        reaches made a batch search 100 times wider)."""
        dead = self._dead()
        total = int(self._index.ntotal)

        def live_rows(q: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
            scores, ids = self._search_kernel(q, min(m + dead.size, total))
            ids, scores = _ties_by_id(ids, scores)  # before the cut: which equal scores come first decides it
            keep = ~np.isin(ids, dead) & (ids >= 0)
            out_s = np.full((ids.shape[0], m), -np.inf, dtype=np.float32)
            out_i = np.full((ids.shape[0], m), -1, dtype=np.int64)
            for r in range(ids.shape[0]):
                row = np.flatnonzero(keep[r])[:m]
                out_s[r, : row.size], out_i[r, : row.size] = scores[r, row], ids[r, row]
            return out_s, out_i

        return _cut_between_ties(live_rows, qaug, k, total - int(dead.size), SGEMM_MIN_BATCH)

    def _search_params(self, sel: Any) -> Any:
        if self.index_type == "hnsw":
            return faiss.SearchParametersHNSW(sel=sel, efSearch=self.ef_search)
        if self.index_type == "ivf":
            return faiss.SearchParametersIVF(sel=sel, nprobe=self._index.nprobe)
        return faiss.SearchParameters(sel=sel)

    def _exact_subset(self, qaug: np.ndarray, k: int, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Approximate indexes can miss filtered matches: score the allowed set exactly instead."""
        live = np.array([i for i in allowed.tolist() if i not in self._tombstones], dtype=np.int64)
        vecs = self._index.reconstruct_batch(live)
        sims = qaug @ vecs.T
        order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(sims, order, axis=1).astype(np.float32), live[order]

    def _search_multiplicative(self, unit: np.ndarray, w: float, k: int, allowed: np.ndarray | None) -> list[Hit]:
        """Exact bounded-multiplicative top-k: widen the cosine candidate set until no unseen doc can win."""
        n_live = len(self) if allowed is None else int(allowed.size)
        m = min(n_live, max(4 * k, 64))
        qaug = self._augment(unit[None, :], np.zeros(1), query=True)
        while True:
            cos, ids = self._raw_search(qaug, m, allowed)
            cos, ids = cos[0].astype(np.float64), ids[0]
            keep = ids >= 0
            cos, ids = cos[keep], ids[keep]
            g = self._docs.g[ids]
            scores = blend(cos, g, w, self._weights)
            order = np.lexsort((ids, -scores))[:k]
            last = cos[-1] if cos.size else -1.0
            bound = multiplicative_bound(last, w)
            if m >= n_live or (order.size == k and scores[order[-1]] >= bound):
                return self._hits(ids[order], scores[order].astype(np.float32), w, cosines=cos[order])
            m = min(n_live, m * 4)

    def _hits(self, ids: np.ndarray, scores: np.ndarray, w: float, cosines: np.ndarray | None = None,
              *, all_valid: bool = False) -> list[Hit]:
        """Hits for one result row. Hot on every search: few NumPy calls (each costs about a microsecond,
        ten hits' arithmetic in Python floats costs less) and the same float64 arithmetic as the blend."""
        if not all_valid:
            keep = ids >= 0
            if not keep.all():
                ids, scores = ids[keep], scores[keep]
            if ids.size == 0:
                return []
        d = self._docs
        g = d.g[ids]  # the feature stored with the column, not recomputed per query
        glist, slist = g.tolist(), scores.tolist()
        w = float(w)
        if cosines is not None:
            clist = cosines.tolist()
        elif self._weights.mode == "additive":  # query column = w, document column = g: cos = s - w * g
            clist = [sc - w * gg for sc, gg in zip(slist, glist)]
        else:
            qcol = float(query_column(np.array(w), self._weights))
            clist = (scores.astype(np.float64) - qcol * doc_column(g, self._weights.mode)).tolist()
        return self._hit_row(ids.tolist(), slist, clist, glist, d.norms[ids].tolist(), d.counts[ids].tolist(), w)

    def _additive_hits(self, rows: list[int], scores: list[float], w: float) -> list[Hit]:
        """:meth:`_hits` for one row of an additive blend given as lists (internal ids, from FAISS's result
        buffers): the same hits with the same values, without a NumPy call (see :meth:`DocColumns.views`).
        Internal ids of -1 (an HNSW walk that found fewer than ``k``) are skipped by :meth:`_hit_row`."""
        norms, counts, g = self._docs.views()
        glist = [g[i] for i in rows]
        cosines = [sc - w * gg for sc, gg in zip(scores, glist)]  # query column = w, document column = g
        return self._hit_row(rows, scores, cosines, glist, [norms[i] for i in rows], [counts[i] for i in rows], w)

    def _additive_arrays(self, rows: list[int], scores: list[float], w: float) -> HitArrays:
        """:meth:`search_arrays`' answer for one row of an additive blend given as lists, with the values
        its batch path gives (the cosine is the float32 score minus ``w * g(d)`` in float64); a row with
        fewer than ``k`` hits is padded as there."""
        d = self._docs
        g, doc_ids = d.views()[2], d.ids
        cos = [sc - w * g[i] if i >= 0 else math.nan for i, sc in zip(rows, scores)]
        scores = [sc if i >= 0 else -math.inf for i, sc in zip(rows, scores)]
        return HitArrays([[doc_ids[i] for i in rows if i >= 0]], np.array([scores], dtype=np.float32), np.array([cos]))

    def _hits_batch(self, ids: np.ndarray, scores: np.ndarray, w: np.ndarray) -> list[list[Hit]]:
        """``[self._hits(ids[i], scores[i], w[i]) for i in rows]`` with the array work done once for the
        whole batch (per-row NumPy calls were ~40% of a 64-query batch at 10k documents); equal results."""
        d = self._docs
        w = np.asarray(w, dtype=np.float64)
        if self._weights.mode == "additive":
            return hit_rows(np.ascontiguousarray(ids), np.ascontiguousarray(scores), ids.shape[1], w, None,
                            d.hit_columns(), 0)  # type: ignore[return-value]  (never None without untied)
        safe = np.maximum(ids, 0)
        g = d.g[safe]
        cosines = self._batch_cosines(scores, g, w)
        return [self._hit_row(*row) for row in zip(ids.tolist(), scores.tolist(), cosines.tolist(), g.tolist(),
                                                   d.norms[safe].tolist(), d.counts[safe].tolist(), w.tolist())]

    def _batch_cosines(self, scores: np.ndarray, g: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Each hit's cosine from its blended score: the score minus the query column times the document's."""
        qcol = query_column(np.asarray(w, dtype=np.float64), self._weights)
        return scores.astype(np.float64) - qcol[:, None] * doc_column(g, self._weights.mode)

    def _hit_row(self, rows: list[int], scores: list[float], cosines: list[float], g: list[float],
                 norms: list[float], counts: list[int], w: float) -> list[Hit]:
        """``Hit`` objects for one result row given as Python lists; padding (id -1) is skipped."""
        return build_hits(rows, scores, cosines, g, norms, counts, w, self._docs.hit_columns())

    def cosine_candidates(self, queries: Sequence[str | np.ndarray], depth: int,
                          query_token_counts: Sequence[int | None] | None = None) -> CandidateSet:
        """Cosine top-``depth`` per query with both norm features of documents and queries."""
        if isinstance(queries, str) or (isinstance(queries, np.ndarray) and queries.ndim != 2):
            raise InvalidArgumentError("cosine_candidates takes a list of queries, got a single one")
        depth = check_option("depth", depth)
        with self._lock:
            depth = min(depth, len(self))
            unit, qn, qc = self._encode_queries(list(queries), query_token_counts)
            cos, ids = self._raw_search(self._augment(unit, np.zeros(len(unit)), query=True), depth, None)
            qcal = self.query_calibrator or self.calibrator
            out = CandidateSet(doc_ids=[], cosine=np.where(ids >= 0, cos, -np.inf).astype(np.float64))
            flat = ids.ravel()
            valid = flat >= 0
            norms = np.ones(flat.size)
            counts = np.ones(flat.size, dtype=np.int64)
            n_, c_ = self._docs.norms_counts(flat[valid])
            norms[valid], counts[valid] = n_, c_
            for feat in FEATURES:
                gd = self.calibrator.transform(norms, counts, feat).reshape(ids.shape)
                out.doc_features[feat] = np.where(ids >= 0, gd, 0.0)
                if np.all(qc >= 1):
                    out.query_features[feat] = qcal.transform(qn, qc, feat)
            doc_ids = self._docs.ids
            out.doc_ids = [[doc_ids[i] for i in row if i >= 0] for row in ids.tolist()]  # type: ignore[misc]
            return out

    # ------------------------------------------------------------ fitting
    def fit(self, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], **kwargs: Any) -> Any:
        """Fit the blend from labelled queries; keeps plain cosine unless a gain survives validation.

        Fits the query calibration on these queries too. Returns a :class:`normrank.fitting.FitReport`.
        """
        from normrank.fitting import fit_index

        return fit_index(self, queries, qrels, **kwargs)

    # ------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str], *, if_unchanged: bool = False) -> Path:
        """Save atomically (FAISS file + JSON + NumPy, never pickle); returns the version folder.

        ``if_unchanged``: save only if ``path`` still holds the version this index was loaded from or last
        saved to (an index never saved there: only if nothing is published there); otherwise raise
        :class:`~normrank.errors.ConcurrentUpdateError` and write nothing. For "load, change, save" while
        other processes may save into the same folder: `normrank fit` run beside a `normrank index` into
        the folder saved the old documents back over the new ones, and both reported success.
        """
        if not isinstance(if_unchanged, bool):
            raise InvalidArgumentError(f"if_unchanged must be True or False, got {if_unchanged!r}")
        path = _user_path(path)
        with self._lock:
            adapter_state = check_adapter_state(self.adapter_state)  # refused before anything is written
            if self._index is None:
                self._start_empty()
            # Deleted documents must not reach the file (HNSW kept their vectors): compact first. The
            # searches' answers do not change; for HNSW this rebuilds the graph, once per save after deletes.
            self._compact()
            live = self._docs.live()

            def write(folder: Path) -> None:
                # Through Python's file object, so a full disk is an OSError with its errno (FAISS's own
                # writer raises a RuntimeError), which write_versioned names as a PersistenceError.
                with open(folder / "index.faiss", "wb") as fh:
                    writer = faiss.PyCallbackIOWriter(fh.write)
                    try:
                        faiss.write_index(self._index, writer)
                    except RuntimeError as exc:
                        raise PersistenceError(errno.EIO, f"writing index.faiss failed: {exc}") from exc
                    finally:
                        del writer
                # Per document beside the FAISS file: a float32 norm (norms are float32-exact, see
                # _check_batch), a uint16 token count and the string and metadata columns (DocColumns);
                # the internal ids are read back from FAISS itself.
                norms, counts = self._docs.norms_counts(live)
                np.save(folder / "norms.npy", norms.astype(np.float32), allow_pickle=False)
                count_type = np.uint16 if counts.size == 0 or counts.max() <= np.iinfo(np.uint16).max else np.int32
                np.save(folder / "token_counts.npy", counts.astype(count_type), allow_pickle=False)
                np.save(folder / "tombstones.npy", np.array(sorted(self._tombstones), dtype=np.int64),
                        allow_pickle=False)
                self._docs.write(folder, live)
                (folder / "state.json").write_text(json.dumps({
                    "dim": self._dim, "index_type": self.index_type, "pad_to": self.pad_to,
                    "column_scale": self._column_scale,
                    "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction, "ef_search": self.ef_search,
                    "nlist": self.nlist, "nprobe": self.nprobe, "next": self._docs.next,
                    "weights": self._weights.to_dict(), "auto_calibrated": self._auto_calibrated,
                    "removed_since_calibration": self._removed_since_calibration,
                    "calibrator": self.calibrator.to_dict(),
                    "query_calibrator": self.query_calibrator.to_dict() if self.query_calibrator else None,
                    "encoder": self._encoder.describe() if self._encoder is not None else None,
                    "adapter_state": adapter_state,
                }, indent=2))

            root = str(Path(path).resolve())
            expected: Any = ANY_VERSION
            if if_unchanged:
                expected = self._origin[1] if self._origin is not None and self._origin[0] == root else None
            version = write_versioned(path, write, {"format_version": FORMAT_VERSION, "dim": self._dim,
                                                    "count": int(live.size), "kind": "normrank.NormIndex"},
                                      pieces=_BIG_FILES, if_current=expected)
            self._origin = (root, version.name)
            return version

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, encoder: RawEncoder | None = None) -> NormIndex:
        """Load a saved index, verifying every file's checksum and the counts first.

        Raises
        ------
        FileNotFoundError
            Nothing is saved at ``path``.
        IndexFormatError
            A file is missing, truncated or altered (the message names it), the parts
            disagree with each other, or the format version is newer than this normrank.
        """
        path = _user_path(path)
        # index.faiss and texts.utf8, the big files, are checksummed while they are parsed (reading_deferred's
        # ``deferred``): a load costs about one read_index instead of a hash pass plus a read. Two threads of
        # ours are busy (this one parsing, one for FAISS's read); each takes checksums when it is done.
        with reading_deferred(path, FORMAT_VERSION, SAVED_FILES, deferred=_BIG_FILES,
                              busy_threads=2) as (folder, manifest, digests):
            def opener(name: str) -> Any:
                return open_nofollow(folder / name)

            try:  # every file opened without following symlinks (persistence.open_nofollow)
                version = manifest["format_version"]
                missing = [f for f in (COLUMN_FILES if version >= 2 else ("records.jsonl",))
                           if f not in manifest["files"]]
                if missing:
                    raise IndexFormatError(f"manifest.json of the index at {path} does not list {missing[0]}: "
                                           "the file was altered")
                # FAISS reads index.faiss in a thread (it lets go of the GIL), started first, while this one
                # parses everything else, which needs nothing from it: at 1M documents the two took about as
                # long, and at 10k starting FAISS after the small files left it 2-4 ms behind (of ~20).
                # 100k+ new objects, none of them cyclic: the cyclic collector would walk them all repeatedly.
                was_enabled = gc.isenabled()
                gc.disable()
                try:
                    with opener("index.faiss") as fh, ThreadPoolExecutor(1, "normrank-load") as pool:
                        pending = pool.submit(_read_faiss_then, fh, digests.work)
                        try:
                            with open_nofollow(folder / "state.json", "r") as sfh:
                                state = json.loads(sfh.read())
                            _check_state(state, path)
                            with opener("norms.npy") as nfh:
                                norms = load_npy(nfh, folder / "norms.npy").astype(np.float32)
                            with opener("token_counts.npy") as cfh:
                                counts = load_npy(cfh, folder / "token_counts.npy").astype(np.int64)
                            with opener("tombstones.npy") as tfh:
                                tombstones = load_npy(tfh, folder / "tombstones.npy").astype(np.int64)
                            if version >= 2:
                                rows = DocColumns.read_rows(opener, path)
                            else:  # format 1 (normrank <= 0.2.0-dev): one JSON object per document
                                with open_nofollow(folder / "records.jsonl", "r") as rfh:
                                    rows = DocColumns.records_rows(_read_jsonl(rfh.read()), path)
                            digests.work()  # whatever checksum no thread has started yet
                        finally:
                            faiss_index = pending.result()  # FAISS's own error wins: it is about the bigger file
                    _check_faiss_type(faiss_index, state["index_type"], path)
                    internal = _faiss_ids(faiss_index, state["index_type"])
                    if tombstones.size:
                        internal = np.setdiff1d(internal, tombstones)
                    docs = DocColumns.from_rows(rows, internal, state["next"], norms, counts, path)
                finally:
                    if was_enabled:
                        gc.enable()
            except IndexFormatError:
                raise
            except (KeyError, TypeError, ValueError, RuntimeError, OSError) as exc:
                raise IndexFormatError(f"the index at {path} could not be read: {exc}") from exc
        try:
            if encoder is None and state.get("encoder"):
                # the encoder it was saved with: the same backend and pooling, or queries would not match
                encoder = encoder_from_settings(state["encoder"])
            elif encoder is not None:
                warn_if_other_encoder(state.get("encoder"), encoder, f"the index at {path}")
            index = cls(
                encoder, dim=state["dim"], weights=Weights.from_saved(state["weights"], f"the index at {path}"),
                index_type=state["index_type"], pad_to=state["pad_to"], hnsw_m=state["hnsw_m"],
                ef_construction=state["ef_construction"], ef_search=state["ef_search"], nlist=state["nlist"],
                nprobe=state["nprobe"],
                calibrator=NormCalibrator.from_dict(state["calibrator"]),
                query_calibrator=(NormCalibrator.from_dict(state["query_calibrator"])
                                  if state["query_calibrator"] else None),
            )
            index._auto_calibrated = state["auto_calibrated"]
            index._removed_since_calibration = state.get("removed_since_calibration", 0)  # older saves: none
            index.adapter_state = copy.deepcopy(state.get("adapter_state") or {})  # older saves have none
            root = Path(path).resolve()
            if folder.parent.resolve() == root and folder.name != CURRENT:  # a copy without links: no version
                index._origin = (str(root), folder.name)
            index._column_scale = float(state.get("column_scale", 1.0))  # indexes saved before the scale: 1
            index._tombstones = set(tombstones.tolist())
            index._index = faiss_index
            count = manifest.get("count")
            expected_ntotal = len(docs) + len(index._tombstones)
            problems = [
                msg for bad, msg in (
                    (not (len(docs) == internal.size == norms.size == counts.size == count),
                     (f"{len(docs)} records, {internal.size} ids, {norms.size} norms, {counts.size} token counts, "
                      f"manifest count {count!r}")),
                    (manifest.get("dim") != index._dim, f"manifest dim {manifest.get('dim')!r}, state dim {index._dim}"),
                    (faiss_index.d != index.augmented_dim,
                     f"FAISS width {faiss_index.d}, expected {index.augmented_dim}"),
                    (faiss_index.ntotal != expected_ntotal,
                     f"FAISS holds {faiss_index.ntotal} vectors, expected {expected_ntotal}"),
                ) if bad
            ]
            if problems:
                raise IndexFormatError(f"the index at {path} is inconsistent: {'; '.join(problems)}")
            index._docs = docs
        except IndexFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IndexFormatError(f"the index at {path} could not be read: {exc!r} in state.json or records") from exc
        index._column_key = index._current_column_key()
        if internal.size:
            docs.set_g(internal, index._shaped_feature(index.calibrator, norms.astype(np.float64), counts))
        release_free_heap()
        _huge_pages_for(index._index)
        if index.index_type == "ivf":
            index._index.nprobe = min(index.nprobe, index._index.nlist)
        elif index.index_type == "hnsw":  # the validated settings, not whatever the FAISS file carries
            hnsw = faiss.downcast_index(index._index.index).hnsw
            hnsw.efSearch, hnsw.efConstruction = index.ef_search, index.ef_construction
        return index


_K_MAX = 10_000_000
#: Single searches keep their result rows between calls up to this ``k`` (a few KiB), not beyond.
_KEPT_K_MAX = 1024


def _read_jsonl(text: str) -> list[Any]:
    """Every line of a JSON-lines file, parsed by one ``json.loads`` call (per-line calls were ~40% of
    loading a 100k-document index). Splits on ``\\n`` only: JSON escapes it inside strings, while
    ``str.splitlines`` would also split a text at a raw U+2028."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return json.loads("[" + ",".join(lines) + "]") if lines else []


def _lean_first(queries: Any, k: Any, filter: Any) -> bool:
    """Whether a batch search tries :meth:`NormIndex._lean_wide` before its front checks: the commonest
    call, a NumPy matrix of raw vectors and a plain ``k`` without a filter, for which those checks cost
    ~0.1 ms on cold caches. The lean path steps aside for anything else in it, and is then not tried again
    after the checks (they leave such a matrix and ``k`` as they are)."""
    return filter is None and type(queries) is np.ndarray and type(k) is int and 0 < k <= _K_MAX


def _one_plain_query(queries: Any, counts: Any) -> np.ndarray | None:
    """The vector of a batch of one raw float vector (a one-row matrix, or a list or tuple of one 1-D
    array) whose token count is absent or plausible, for the single-vector path; ``None`` otherwise."""
    if type(queries) is np.ndarray:
        if queries.ndim != 2 or queries.shape[0] != 1:
            return None
        one = queries[0]
    elif type(queries) in (list, tuple) and len(queries) == 1 and type(queries[0]) is np.ndarray:
        one = queries[0]
    else:
        return None
    if counts is not None and not (type(counts) in (list, tuple) and len(counts) == 1 and _plain_count(counts[0])):
        return None
    return one


def _plain_count(count: Any) -> bool:
    """A query token count the single-vector path takes as it is: none, or a plausible int (anything else
    goes to the checked path, which reads or names it)."""
    return count is None or (type(count) is int and 0 < count <= MAX_TOKEN_COUNT)


def _arrays_from_hits(rows: list[list[Hit]], k: int) -> HitArrays:
    scores = np.full((len(rows), k), -np.inf, dtype=np.float32)
    cosines = np.full((len(rows), k), np.nan)
    for i, row in enumerate(rows):
        scores[i, : len(row)] = [h.score for h in row]
        cosines[i, : len(row)] = [h.cosine for h in row]
    return HitArrays([[h.id for h in row] for row in rows], scores, cosines)


def _read_faiss(fh: Any) -> Any:
    """FAISS reads the file already opened (without following symlinks) through ``/proc/self/fd``
    where there is one: its own reader, with no Python bytes object per chunk (those left heap resident
    after a load, and were slower); elsewhere through a Python callback."""
    fd_path = f"/proc/self/fd/{fh.fileno()}"
    if os.path.exists(fd_path):
        return faiss.read_index(fd_path)
    reader = faiss.PyCallbackIOReader(fh.read)
    try:
        return faiss.read_index(reader)
    finally:
        del reader


def _read_faiss_then(fh: Any, then: Callable[[], None]) -> Any:
    """:func:`_read_faiss`, then ``then()`` in the same thread (a load's checksums), also after a failed read."""
    try:
        return _read_faiss(fh)
    finally:
        then()


#: The FAISS classes each index_type saves: (outer, inner) for IDMap2-wrapped ones.
_FAISS_TYPES: dict[str, tuple[type, type | None]] = {
    "flat": (faiss.IndexIDMap2, faiss.IndexFlat),
    "hnsw": (faiss.IndexIDMap2, faiss.IndexHNSWFlat),
    "ivf": (faiss.IndexIVFFlat, None),
}


def flat_vectors_span(flat: Any) -> tuple[int, int]:
    """Address and size in bytes of a FAISS flat index's stored float32 vectors (address 0 when empty)."""
    count = flat.ntotal * flat.d
    return (faiss.rev_swig_ptr(flat.get_xb(), count).ctypes.data if count else 0), count * 4


def _huge_pages_for(index: Any) -> None:
    """Ask for huge pages for the stored vectors of a flat ``IndexIDMap2``, in the background
    (:mod:`normrank.huge_pages`: the exact scan reads all of them). HNSW and IVF are left alone:
    measured, a graph walk gained about 2%."""
    if index is None or not huge_pages.enabled() or not isinstance(index, faiss.IndexIDMap2):
        return
    flat = faiss.downcast_index(index.index)
    if isinstance(flat, faiss.IndexFlat):
        huge_pages.advise_soon(*flat_vectors_span(flat))


def _check_faiss_type(index: Any, index_type: str, path: Any) -> None:
    """A valid FAISS file of another kind (a bare IndexFlatIP, an HNSW where state.json says flat) is named."""
    outer, inner_type = _FAISS_TYPES[index_type]
    index = faiss.downcast_index(index)
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap2) else None
    ok = isinstance(index, outer) and (inner_type is None or isinstance(inner, inner_type))
    if not ok or index.metric_type != faiss.METRIC_INNER_PRODUCT:
        got = type(index).__name__ + (f"({type(inner).__name__})" if inner is not None else "")
        want = outer.__name__ + (f"({inner_type.__name__})" if inner_type is not None else "")
        raise IndexFormatError(f"the index at {path} is inconsistent: index.faiss holds a {got}, but state.json "
                               f"says index_type {index_type!r}, saved as an inner-product {want}")


#: Largest |w(q)| (or tiebreak epsilon) an HNSW or IVF index takes without a warning (see
#: ``NormIndex._warn_if_approximate_cannot_follow``).
APPROXIMATE_WEIGHT_LIMIT = 0.25


def _untied(ids: list[int], scores: list[float]) -> tuple[list[int], list[float]]:
    """One result row with equal scores in ascending internal id (insertion order).

    Why: FAISS's heaps return equal scores in descending id, so among duplicates the top-3 was
    ``dup02, dup01, dup00`` and the top-4 began with ``dup03``: a top-k that is not the start of the
    top-(k+1) changes the first hit with k, and pages of results overlap. Which equal scores make the cut
    is :func:`_cut_between_ties`'s part. pgvector's ``ORDER BY dist, seq`` and the multiplicative blend
    already break ties this way."""
    if len(set(scores)) == len(scores):  # no two equal (a set costs less than a pairwise scan)
        return ids, scores
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i] < 0, ids[i]))
    return [ids[i] for i in order], [scores[i] for i in order]


def _cut_between_ties(search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]], q: np.ndarray, k: int,
                      n: int, kernel_rows: int = 1,
                      first: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``search(q, k)`` (exact: scores and internal ids, best first, of ``n`` searchable documents), with
    equal scores across the cut kept by lowest internal id (insertion order).

    Why: FAISS's heaps keep the first-seen of equal scores only until a better score arrives; then they
    drop the earlier one. Duplicates ``dup0..dup2`` inserted before a better document gave
    ``best, dup1`` at k=2 and ``best, dup1, dup2`` at k=3, where the order promised (and given by pgvector,
    and by this index's other paths) is ``best, dup0, dup1``: the top-k was not the start of the
    top-(k+1), and pages overlapped. One more score per row shows a tie across the cut; only the rows that
    have one are searched again, four times wider each round, until the k-th score is above the last (then
    every document scoring as much is inside), and cut in (score, id) order. A whole batch searched again
    for one tied row took 3 s instead of 22 ms (64 queries, 50k duplicates among 200k documents). The rows
    searched again are repeated up to ``kernel_rows`` (the batch size from which ``search`` scores with
    another kernel), so that their scores are the ones the batch's own kernel gives, to the last bit.
    ``first`` is the answer of that first search, ``k + 1`` wide (``k`` when ``k >= n``), if the caller
    already has it."""
    if k >= n:
        return search(q, k) if first is None else first
    scores, ids = search(q, k + 1) if first is None else first
    tied = np.flatnonzero(scores[:, k - 1] == scores[:, k])
    out_s, out_i = np.ascontiguousarray(scores[:, :k]), np.ascontiguousarray(ids[:, :k])  # as search gave them
    if tied.size == 0:
        return out_s, out_i
    rows, m = q[tied], k + 1
    if rows.shape[0] < kernel_rows <= q.shape[0]:
        rows = np.resize(rows, (kernel_rows, q.shape[1]))  # the tied rows first, repeated
    while True:  # the k-th score from the same search as the rest of the row: one kernel's rounding
        m = min(n, 4 * m)
        wide_s, wide_i = search(rows, m)
        if m >= n or bool(np.all(wide_s[: tied.size, m - 1] < wide_s[: tied.size, k - 1])):
            break
    for j, r in enumerate(tied.tolist()):
        s, i = wide_s[j], wide_i[j]
        s, i = s[i >= 0], i[i >= 0]
        order = np.lexsort((i, -s.astype(np.float64)))[:k]
        out_s[r, : order.size], out_i[r, : order.size] = s[order], i[order]
    return out_s, out_i


def _ties_by_id(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_untied` for rows of (internal ids, scores) as arrays; padding (id -1) stays last."""
    if ids.shape[1] < 2 or not np.any(scores[:, 1:] == scores[:, :-1]):
        return ids, scores
    order = np.lexsort((np.where(ids < 0, np.iinfo(np.int64).max, ids), -scores.astype(np.float64)))
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(scores, order, axis=1)


def save_unless_changed(index: NormIndex, path: str | os.PathLike[str], version: str | None, during: str,
                        retry: str) -> Path:
    """Save a newly built ``index`` at ``path`` only if the folder still holds ``version`` (``None``: nothing
    saved yet), the version read when the build started; else :class:`ConcurrentUpdateError` naming ``during``
    and ``retry``, with nothing written.

    Why: ``normrank index`` (and ``--ray``) read a fitted blend to carry over, encoded for minutes, then saved
    over a ``normrank fit`` that had landed meanwhile, without a word."""
    path = _user_path(path)
    index._origin = (str(path.resolve()), version) if version is not None else None
    try:
        return index.save(path, if_unchanged=True)
    except ConcurrentUpdateError:
        raise ConcurrentUpdateError(
            f"{path} changed while {during} (another `normrank fit` or `normrank index` saved there): nothing was "
            f"saved, so that change stands; {retry}") from None


def saved_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings of the index saved at ``path`` (its checksummed ``state.json``), without loading it.

    Raises ``FileNotFoundError`` when nothing is saved there and :class:`IndexFormatError` when it is broken."""
    try:
        state = json.loads(read_verified_file(path, FORMAT_VERSION, "state.json"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"the index at {path} has a state.json that is not valid JSON") from exc
    _check_state(state, path)
    return state


def _user_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with a leading ``~`` read as the home folder, as a shell and the YAML config read it:
    ``save("~/idx")`` made a folder named ``~`` in the working folder (which ``rm -rf ~`` then ...)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"path must be a string or a path, got {type(path).__name__}")
    try:
        return Path(path).expanduser()
    except RuntimeError as exc:  # "~nosuchuser", or no home folder at all
        raise InvalidArgumentError(f"cannot read the home folder in {os.fspath(path)!r}: {exc}") from None


def _check_state(state: Any, path: Any) -> None:
    """Refuse a tampered or broken state.json before any setting in it is used (ef_search=2e9 took 15 GiB)."""
    if not isinstance(state, dict):
        raise IndexFormatError(f"the index at {path} has a state.json that is not a JSON object")
    if state.get("index_type") not in INDEX_TYPES:
        raise IndexFormatError(f"the index at {path} has an unknown index_type {state.get('index_type')!r} in "
                               f"state.json; expected one of {list(INDEX_TYPES)}")
    try:
        for name in ("pad_to", "hnsw_m", "ef_construction", "ef_search", "nlist", "nprobe"):
            check_option(name, state[name])
    except InvalidArgumentError as exc:
        raise IndexFormatError(f"the index at {path} has an invalid setting in state.json: {exc}") from None
    except KeyError as exc:
        raise IndexFormatError(f"the index at {path} has no {exc} in state.json") from None
    for name in ("dim", "next", "removed_since_calibration"):
        v = state.get(name, 0 if name == "removed_since_calibration" else None)
        if isinstance(v, bool) or not isinstance(v, int) or not (1 if name == "dim" else 0) <= v <= 2**62:
            raise IndexFormatError(f"the index at {path} has an invalid {name} {v!r} in state.json")
    scale = state.get("column_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise IndexFormatError(f"the index at {path} has an invalid column_scale {scale!r} in state.json")
    if not isinstance(state.get("adapter_state", {}), dict):
        raise IndexFormatError(f"the index at {path} has an adapter_state in state.json that is not a JSON object")


def _faiss_ids(index: Any, index_type: str) -> np.ndarray:
    """The ids a FAISS index holds, sorted: records are saved in this order, so no id file is needed."""
    if index_type == "ivf":
        ivf = faiss.extract_index_ivf(index)
        lists = ivf.invlists
        parts = [faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy()
                 for i in range(ivf.nlist) if lists.list_size(i)]
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    else:
        ids = faiss.vector_to_array(index.id_map)
    return np.sort(ids.astype(np.int64))



