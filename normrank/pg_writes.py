"""Changing a pgvector table: adding rows, deleting, new weights or calibrations, dropping.

:class:`PgWriteMixin` is the write side of :class:`normrank.pgvector_store.PgVectorNormIndex`.
Every method runs its change as one ``body(cursor)`` through ``PgVectorNormIndex._run(...,
write=True)``: under the table's advisory lock, starting from the stored state, which is written
back (version bumped) in the same transaction. So each change is all-or-nothing, concurrent
writers from other processes are serialised, and readers see a change entirely or not at all
(a new blend's rewritten norm column and its weights commit together).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from normrank.calibration import NormCalibrator
from normrank.errors import (
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    InvalidArgumentError,
    UnknownIdError,
)
from normrank.index_base import (
    _check_ids,
    check_fit_basis,
    needs_recalibration,
    query_calibration,
)
from normrank.pg_sql import TableNames, create_tables_sql, hnsw_index_sql
from normrank.pg_state import (
    COLUMN_SCALE,
    MAX_DIM,
    MAX_HNSW_DIM,
    PgIndexType,
    check_index_type,
)
from normrank.scoring import Weights, doc_column

#: Longest id accepted (UTF-8 bytes): the primary-key btree refuses entries much beyond 2.7 kB.
MAX_ID_BYTES = 2048


class PgWriteMixin:
    """Writes of a pgvector table (mixed into ``PgVectorNormIndex``, which supplies ``_run`` and the state)."""

    _names: TableNames
    _count: int
    _removed_since_calibration: int
    _dim: int | None
    _exists: bool
    _weights: Weights
    _auto_calibrated: bool
    _column_key: tuple[Any, ...] | None
    calibrator: NormCalibrator
    query_calibrator: NormCalibrator | None
    index_type: str
    hnsw_m: int
    ef_construction: int
    table: str
    augmented_dim: int
    encoder: Any
    _run: Callable[..., Any]
    _batch_ids: Callable[..., list[str]]
    _check_batch: Callable[..., Any]
    _shaped_feature: Callable[..., Any]
    _current_column_key: Callable[[], tuple[Any, ...]]
    _check_names_free: Callable[[Any], None]
    _forget_table: Callable[[], None]
    _lock: Any

    # ------------------------------------------------------------ adding
    def _precheck_ids(self, ids: Sequence[str] | None, n: int, cur: Any = None) -> list[str]:
        out = self._batch_ids(ids, n)
        if ids is None:
            return out
        for i, x in enumerate(out):
            if len(x) * 4 > MAX_ID_BYTES and len(x.encode("utf-8")) > MAX_ID_BYTES:
                raise InvalidArgumentError(f"id {i} is {len(x.encode('utf-8')):,} bytes long; the pgvector backend "
                                           f"takes ids of at most {MAX_ID_BYTES:,} bytes (its primary-key index)")

        def body(c: Any) -> None:
            if not self._exists:
                return
            taken = [r[0] for r in c.execute(self._names.sql("SELECT id FROM {t} WHERE id = ANY(%s)"), (out,))]
            if taken:
                raise DuplicateIdError(f"ids already in the index; delete them first to replace them: {taken[:5]}")

        if cur is None:
            self._run(body)
        else:
            body(cur)
        return out

    def add_vectors(
        self,
        vectors: np.ndarray,
        token_counts: Sequence[int] | np.ndarray,
        ids: Sequence[str] | None = None,
        texts: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[str]:
        """Add raw (un-normalised) vectors with their token counts, by binary COPY. All-or-nothing.

        Ids, texts and metadata are checked before anything is written (no lone surrogate, no NUL,
        finite numbers, bounded nesting): a refused batch leaves the table as it was.
        """
        return self._run(lambda cur: self._add_rows(cur, vectors, token_counts, ids, texts, metadatas), write=True)

    def upsert_vectors(
        self,
        vectors: np.ndarray,
        token_counts: Sequence[int] | np.ndarray,
        ids: Sequence[str],
        texts: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[str]:
        """Add a batch, replacing the rows whose ids the table holds, in one transaction under the table's
        advisory lock: every other connection sees the old rows or the new ones, never the moment between.

        Why: the frameworks' upsert was a delete and an add, two transactions; another process searching
        between them got 4 of 8 documents (70 of 175 searches) or a "k is larger than the documents" error,
        and two processes replacing the same ids failed each other with DuplicateIdError/UnknownIdError.
        A refused batch rolls back, deleted rows included."""
        if ids is None:
            raise InvalidArgumentError("upsert_vectors needs the ids to replace")
        wanted = self._batch_ids(list(ids), len(ids))  # strings, distinct: named before the transaction

        def body(cur: Any) -> list[str]:
            if self._exists:  # a batch the add refuses rolls this delete back with it: one transaction
                gone = cur.execute(self._names.sql("DELETE FROM {t} WHERE id = ANY(%s) RETURNING id"),
                                   (list(wanted),)).fetchall()
                self._count -= len(gone)
                self._removed_since_calibration += len(gone)
            return self._add_rows(cur, vectors, token_counts, wanted, texts, metadatas)

        return self._run(body, write=True)

    def _add_rows(self, cur: Any, vectors: np.ndarray, token_counts: Sequence[int] | np.ndarray,
                  ids: Sequence[str] | None, texts: Sequence[str | None] | None,
                  metadatas: Sequence[Mapping[str, Any]] | None) -> list[str]:
        """:meth:`add_vectors`' body, in the caller's write transaction (see :meth:`upsert_vectors`)."""
        from psycopg.types.json import Jsonb

        mat, norms, counts, text_list, metas = self._check_batch(
            vectors, token_counts, texts, metadatas, empty=not self._count)
        n = mat.shape[0]
        new_ids = self._precheck_ids(ids, n, cur)
        first = not self._exists
        if first:
            self._create_tables(cur, mat.shape[1])
        elif mat.shape[1] != self._dim:
            raise DimensionMismatchError(
                f"dimension mismatch: got vectors of dimension {mat.shape[1]}, expected {self._dim}")
        fitted_now = not self.calibrator.is_fitted
        if fitted_now:
            self.calibrator = NormCalibrator(self.calibrator.max_bins,
                                             self.calibrator.min_per_bin).fit(norms, counts)
        unit = mat / norms[:, None].astype(np.float32)
        column = doc_column(self._shaped_feature(self.calibrator, norms, counts), self._weights.mode)
        aug = np.empty((n, self._dim + 1), dtype=np.float32)
        aug[:, : self._dim] = unit
        aug[:, self._dim] = column * COLUMN_SCALE
        with cur.copy(self._names.sql("COPY {t} (id, emb, norm, token_count, text, metadata) "
                                      "FROM STDIN WITH (FORMAT BINARY)")) as cp:
            cp.set_types(["text", "vector", "float8", "int4", "text", "jsonb"])
            for j in range(n):
                cp.write_row((new_ids[j], aug[j], float(norms[j]), int(counts[j]), text_list[j],
                              Jsonb(metas[j])))
        self._count += n
        if fitted_now:
            self._removed_since_calibration = 0
        self._column_key = self._current_column_key()
        if self._calibration_due():
            self._recalibrate(cur)
        elif first:
            self._create_vector_index(cur)
        return new_ids

    def _create_tables(self, cur: Any, dim: int) -> None:
        if self.index_type == "hnsw" and dim + 1 > MAX_HNSW_DIM:
            raise InvalidArgumentError(f"pgvector's HNSW index takes at most {MAX_HNSW_DIM} dimensions; "
                                       f"{dim}-d vectors need {dim + 1}: use index_type='flat'")
        if dim + 1 > MAX_DIM:
            raise InvalidArgumentError(f"pgvector stores at most {MAX_DIM} dimensions; {dim}-d vectors need {dim + 1}")
        self._check_names_free(cur)
        for statement in create_tables_sql(self._names, dim):
            cur.execute(statement)
        self._dim, self._exists, self._version = dim, True, 0
        self._table_oid = None  # a new table: read again (with its oid) on the next sync

    def _create_vector_index(self, cur: Any) -> None:
        if self.index_type == "hnsw":
            cur.execute(hnsw_index_sql(self._names, self.hnsw_m, self.ef_construction))

    def _rewrite_column(self, cur: Any) -> None:
        """Recompute the norm column of every row (new calibration, feature or mode), then re-index."""
        rows = cur.execute(self._names.sql("SELECT id, norm, token_count FROM {t}")).fetchall()
        cur.execute(self._names.sql("DROP INDEX IF EXISTS {ix}"))
        if rows:
            ids = [r[0] for r in rows]
            norms = np.array([r[1] for r in rows], dtype=np.float64)
            counts = np.array([r[2] for r in rows], dtype=np.int64)
            col = doc_column(self._shaped_feature(self.calibrator, norms, counts), self._weights.mode)
            col = (col * COLUMN_SCALE).astype(np.float32)
            cur.execute("CREATE TEMP TABLE normrank_column (id text PRIMARY KEY, c real) ON COMMIT DROP")
            with cur.copy("COPY normrank_column (id, c) FROM STDIN WITH (FORMAT BINARY)") as cp:
                cp.set_types(["text", "float4"])
                for i, c in zip(ids, col.tolist()):
                    cp.write_row((i, c))
            cur.execute(self._names.sql(
                f"UPDATE {{t}} AS d SET emb = subvector(d.emb, 1, {int(self._dim)}) || ARRAY[c.c]::vector "
                "FROM normrank_column AS c WHERE d.id = c.id"))
            cur.execute("DROP TABLE normrank_column")
        self._create_vector_index(cur)
        self._column_key = self._current_column_key()

    def _calibration_due(self) -> bool:
        """Whether the add or delete just made should refit the automatic calibration (:func:`needs_recalibration`)."""
        return needs_recalibration(self._auto_calibrated, self._count, self.calibrator.n_fitted,
                                   self._removed_since_calibration)

    def _take_corpus_calibration(self, calibrator: NormCalibrator) -> None:
        """An empty table takes a corpus's calibration (``EncodedCorpus.into``), in the state row.

        Why the state row: set on this handle only, the next write re-read the table's own (fitted on
        documents deleted since), and a table emptied by deletes ended up fitted on 200 of 300 documents."""
        def body(cur: Any) -> None:
            if not self._count:  # another writer may have filled it meanwhile: then its adds decide
                self.calibrator, self._removed_since_calibration = calibrator, 0

        self._run(body, write=True)

    # ------------------------------------------------------------ changing
    def delete(self, ids: Iterable[str]) -> int:
        """Delete documents by id; all ids must exist (nothing is deleted otherwise)."""
        wanted = sorted(set(_check_ids(ids, allow_nul=False)))
        if not wanted:
            return 0

        def body(cur: Any) -> int:
            if not self._exists:
                raise UnknownIdError(f"unknown ids, nothing deleted: {wanted[:5]}")
            gone = [r[0] for r in cur.execute(self._names.sql("DELETE FROM {t} WHERE id = ANY(%s) RETURNING id"),
                                              (wanted,))]
            if len(gone) != len(wanted):
                missing = sorted(set(wanted) - set(gone))
                raise UnknownIdError(f"unknown ids, nothing deleted: {missing[:5]}")
            self._count -= len(gone)
            self._removed_since_calibration += len(gone)
            if self._calibration_due():
                self._recalibrate(cur)  # a sync that only deletes never reached an add to refit it
            return len(gone)

        return self._run(body, write=True)

    def set_weights(self, weights: Weights) -> None:
        """Change the blend for every process using the table; the norm column is rewritten only if needed."""
        self._publish(weights=weights)

    def _publish(self, *, weights: Weights | None = None, query_calibrator: NormCalibrator | None = None,
                 started: tuple[Weights, dict[str, Any]] | None = None) -> None:
        """New weights and/or query calibration in one transaction: readers see all of it or none."""
        if weights is not None and not isinstance(weights, Weights):
            raise InvalidArgumentError(f"set_weights takes a normrank.Weights, got {type(weights).__name__}")

        def body(cur: Any) -> None:
            check_fit_basis(started, (self._weights, self.calibrator.to_dict()))  # the state as just re-read
            if query_calibrator is not None:
                self.query_calibrator = query_calibrator
            if weights is not None:
                self._weights = weights
                if self._exists and self._current_column_key() != self._column_key:
                    self._rewrite_column(cur)

        self._run(body, write=True)  # with no table yet: settings for the first add

    def set_index_type(self, index_type: PgIndexType) -> None:
        """Switch between exact scans (``"flat"``) and the HNSW index (``"hnsw"``), building or dropping it.

        Bulk loads run fastest as ``"flat"`` with the index built once at the end.
        """
        check_index_type(index_type)

        def body(cur: Any) -> None:
            if not self._exists:
                self.index_type = index_type
                return
            if index_type == "hnsw" and self.augmented_dim > MAX_HNSW_DIM:
                raise InvalidArgumentError(f"pgvector's HNSW index takes at most {MAX_HNSW_DIM} dimensions; "
                                           f"this table has {self.augmented_dim}")
            if index_type != self.index_type:
                self.index_type = index_type
                cur.execute(self._names.sql("DROP INDEX IF EXISTS {ix}"))
                self._create_vector_index(cur)

        self._run(body, write=True)

    def recalibrate(self) -> None:
        """Refit the document calibration on every stored document and rewrite the norm column."""
        def body(cur: Any) -> None:
            if not self._exists or not self._count:
                raise EmptyCorpusError("cannot calibrate an empty index")
            self._recalibrate(cur)

        self._run(body, write=True)

    def _recalibrate(self, cur: Any) -> None:
        rows = cur.execute(self._names.sql("SELECT norm, token_count FROM {t}")).fetchall()
        norms = np.array([r[0] for r in rows], dtype=np.float64)
        counts = np.array([r[1] for r in rows], dtype=np.int64)
        self.calibrator = NormCalibrator(self.calibrator.max_bins, self.calibrator.min_per_bin).fit(norms, counts)
        self._removed_since_calibration = 0
        self._rewrite_column(cur)

    def calibrate_queries(self, queries: Sequence[str] | None = None, *, norms: np.ndarray | None = None,
                          token_counts: np.ndarray | None = None) -> NormCalibrator:
        """Fit the query calibration on representative queries (or their norms and counts); stored in the table."""
        cal = query_calibration(self, queries, norms, token_counts)
        self._publish(query_calibrator=cal)
        return cal

    def drop(self) -> None:
        """Drop the document and state tables (irreversible); the object becomes an empty index."""
        def body(cur: Any) -> None:
            cur.execute(self._names.sql("DROP TABLE IF EXISTS {t}"))
            cur.execute(self._names.sql("DROP TABLE IF EXISTS {s}"))
            self._exists = False  # nothing to write back

        with self._lock:
            self._run(body, write=True)
            self._forget_table()

    # ------------------------------------------------------------ fitting
    def fit(self, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], **kwargs: Any) -> Any:
        """Fit the blend from labelled queries (``normrank.fitting``); the result is stored in the table."""
        from normrank.fitting import fit_index

        return fit_index(self, queries, qrels, **kwargs)

    def _publish_fit(self, weights: Weights, query_calibrator: NormCalibrator | None,
                     started: tuple[Weights, dict[str, Any]] | None = None) -> None:
        """A fit's weights and query calibration go live in one transaction (called by ``fit_index``):
        other connections see the state before the fit or after it, never one without the other. If the
        weights or the calibration the fit started from changed meanwhile (another connection's
        ``set_weights``), nothing is published (``ConcurrentUpdateError``)."""
        self._publish(weights=weights, query_calibrator=query_calibrator, started=started)


__all__ = ["PgWriteMixin"]
