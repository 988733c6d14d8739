"""``PgVectorNormIndex``: the normrank store served from PostgreSQL + pgvector.

Same interface and the same ranking as the FAISS :class:`normrank.store.NormIndex`, for
corpora that live in the database RAG stacks already run (managed on every cloud,
replicated, partitioned). Each document row holds the augmented vector
``[d_hat, c(d)]`` (``c`` = the mode's norm column, ``g(d)`` for the additive blend) in a
``vector(dim + 1)`` column, so ``ORDER BY emb <#> [q_hat, w(q)]`` makes PostgreSQL return
the blended top-k itself: one inner-product scan (``index_type="flat"``, exact) or one
HNSW ``vector_ip_ops`` index walk (``index_type="hnsw"``, approximate; ``exact=True``
turns the index off for a query). No padding is needed: pgvector has no fast-kernel widths.

The backend is split by job: :mod:`normrank.pg_connection` (DSN, redaction, connecting),
:mod:`normrank.pg_sql` (table names, DDL, filters), :mod:`normrank.pg_state` (the state row
and the settings' ranges), :mod:`normrank.pg_search` (the read side), :mod:`normrank.pg_writes`
(the write side), :mod:`normrank.pg_local` (a throwaway local server). This module holds the
index itself: its construction, its transactions, the state it keeps in step with the table,
and reading documents back (``get``, ``ids``, ``vectors``).

Keeping the calibration beside the rows (``{table}_normrank``) means any process that opens
the table ranks exactly as the one that wrote it. Writes take a transaction-scoped advisory
lock, start from the stored state and bump its version in the same transaction. Reads run in
one ``REPEATABLE READ`` transaction whose first statement reads the state (the whole row only
when its version moved), so the weights a query is weighted with and the rows it ranks come
from one snapshot: a fleet of serving processes follows a ``set_weights`` or ``fit`` elsewhere,
and a search overlapping one gives exactly the before or the after answer. A connection the
server dropped is reopened once per call; if that fails too the call raises ``BackendError``.
No message or repr shows the DSN's password.

All scoring arithmetic comes from :mod:`normrank.scoring`, the calibration from
:mod:`normrank.calibration`, the query handling from :class:`normrank.index_base.BlendIndexBase`:
the two backends cannot drift apart.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Self, TypeVar

import numpy as np

from normrank._validation import (
    check_adapter_entry,
    check_metadata,
    check_option,
    check_text,
)
from normrank.calibration import NormCalibrator
from normrank.encoders import RawEncoder, encoder_from_settings, warn_if_other_encoder
from normrank.errors import (
    BackendError,
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    InvalidArgumentError,
    InvalidTextError,
    UnknownIdError,
)
from normrank.index_base import BlendIndexBase, Record, _check_ids, check_index_parts
from normrank.pg_connection import (
    DSN_ENV,
    connection_lost,
    error_text,
    let_go_in_child,
    open_connection,
    psycopg_module,
    redact,
    resolve_dsn,
)
from normrank.pg_local import local_server
from normrank.pg_search import PgSearchMixin
from normrank.pg_sql import TableNames, check_table_name
from normrank.pg_state import (  # COLUMN_SCALE, MAX_HNSW_DIM, PgIndexType: also this module's names before the split
    COLUMN_SCALE,
    MAX_DIM,
    MAX_HNSW_DIM,
    PG_INDEX_TYPES,
    PgIndexType,
    TableState,
    check_hnsw_build,
    check_index_type,
    check_pg_option,
)
from normrank.pg_writes import PgWriteMixin
from normrank.scoring import Weights

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: The attributes that mirror the table's state row (restored when a write fails).
_STATE_ATTRS = ("_dim", "_weights", "index_type", "_hnsw_m", "_ef_construction", "_ef_search", "calibrator",
                "_auto_calibrated", "query_calibrator", "_count", "_version", "_column_key", "_exists", "_table_oid",
                "_adapter_state", "_removed_since_calibration")


#: Every open handle of this process, so that a forked child lets go of the connections it inherited at once
#: (not only at its first call): a child that never searched and exited through Python's finalizers closed
#: them, which sent the server libpq's terminate message on the parent's sockets.
_HANDLES: weakref.WeakSet[PgVectorNormIndex] = weakref.WeakSet()


def _let_go_after_fork() -> None:
    for handle in list(_HANDLES):
        # a new lock too: a parent thread inside a call held the old one, which no thread of the child releases
        # (the child's first call hung)
        handle._lock = threading.RLock()
        conn, handle._conn = handle._conn, None
        if conn is not None:
            let_go_in_child(conn)


os.register_at_fork(after_in_child=_let_go_after_fork)


class PgVectorNormIndex(PgSearchMixin, PgWriteMixin, BlendIndexBase):
    """A PostgreSQL + pgvector store of raw-norm-aware documents (same API as ``NormIndex``).

    Parameters
    ----------
    dsn:
        libpq connection string or URI; ``None`` reads ``$NORMRANK_PG_DSN``.
    table:
        Name of the document table (a plain identifier); ``{table}_normrank`` holds the state
        and ``{table}_emb_hnsw`` is the HNSW index: none of the three names may be taken by
        anything else.
    encoder, dim, weights, calibrator, query_calibrator:
        As for :class:`normrank.store.NormIndex`. When the table already exists its stored
        state is used; arguments given explicitly override it and the table is updated.
    index_type:
        ``"flat"`` (exact scan, no vector index) or ``"hnsw"`` (HNSW ``vector_ip_ops``).
        ``None`` keeps what the table has (``"flat"`` for a new one).
    hnsw_m, ef_construction, ef_search:
        HNSW build and search settings, range-checked like the FAISS backend's and within
        pgvector's limits (m <= 100, ef_construction <= 1000 and >= 2 m, ef_search <= 1000;
        ``hnsw.ef_search`` is raised to ``k`` when needed).
    connect_timeout:
        Seconds to wait for the server.

    Raises
    ------
    BackendError
        The server is unreachable, the ``vector`` extension is missing or cannot be
        created, ``table`` exists but is not a normrank table, or one of its names is taken.
    """

    _allow_nul = False  # PostgreSQL text and jsonb cannot hold NUL
    _jsonb = True  # nor give back every float as stored (check_metadata)

    def __init__(
        self,
        dsn: str | None = None,
        table: str = "normrank_docs",
        encoder: RawEncoder | None = None,
        *,
        dim: int | None = None,
        weights: Weights | None = None,
        index_type: PgIndexType | None = None,
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int | None = None,
        calibrator: NormCalibrator | None = None,
        query_calibrator: NormCalibrator | None = None,
        connect_timeout: int = 10,
    ) -> None:
        self._names = TableNames(check_table_name(table))
        if index_type is not None:
            check_index_type(index_type)
        if weights is not None and not isinstance(weights, Weights):
            raise InvalidArgumentError(f"weights must be a normrank.Weights, got {type(weights).__name__}")
        check_index_parts(encoder, calibrator, query_calibrator)
        if dim is not None:
            dim = check_option("dim", dim, high=MAX_DIM)
        self.hnsw_m, self.ef_construction = hnsw_m, ef_construction
        check_hnsw_build(self.hnsw_m, self.ef_construction)
        # the table's setting (saved in its state); ``index.ef_search = n`` sets this handle's own, which
        # the table's later writes do not reset (they did: any write, from any handle, put back the stored one)
        self._ef_search = check_pg_option("ef_search", 128 if ef_search is None else ef_search)
        self._own_ef_search: int | None = None
        self._connect_timeout = check_option("connect_timeout", connect_timeout)
        self.dsn = resolve_dsn(dsn)
        self.table = table
        self._encoder = encoder
        self._dim: int | None = None
        self._weights = weights or Weights()
        self.index_type: str = index_type or "flat"
        self.calibrator = calibrator or NormCalibrator()
        self._auto_calibrated = calibrator is None or not calibrator.is_fitted
        self._removed_since_calibration = 0  # see NormIndex: an automatic calibration follows a churning corpus
        self.query_calibrator = query_calibrator
        self._count = 0
        self._version = 0
        # the table's oid when its state was read: a drop and re-create restarts the version, so the version
        # alone let a handle keep a dropped table's dimension, weights and count over the new table's rows
        self._table_oid: int | None = None
        self._column_key: tuple[Any, ...] | None = None
        self._adapter_state: dict[str, Any] = {}
        self._exists = False
        self._closed = False
        self._lock = threading.RLock()
        self._reading: Any = None  # the cursor of an open consistent_reads() block (see there)
        self._conn: Any = None
        self._pid = os.getpid()  # the process that opened self._conn
        _HANDLES.add(self)
        self.pgvector_version: tuple[int, ...] = ()
        self._reconnect()
        try:
            self._run(self._check_names_free)
            if self._exists:
                if dim is not None and dim != self._dim:
                    raise DimensionMismatchError(f"table {table} holds vectors of dimension {self._dim}, not {dim}")
                self._apply_overrides(weights, index_type, calibrator, query_calibrator, ef_search)
            else:
                self._dim = dim
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ settings (range-checked when set)
    @property
    def hnsw_m(self) -> int:
        return self._hnsw_m

    @hnsw_m.setter
    def hnsw_m(self, value: int) -> None:
        self._hnsw_m = check_pg_option("hnsw_m", value)

    @property
    def ef_construction(self) -> int:
        return self._ef_construction

    @ef_construction.setter
    def ef_construction(self, value: int) -> None:
        self._ef_construction = check_pg_option("ef_construction", value)

    @property
    def ef_search(self) -> int:
        """HNSW search beam of this handle (``index.ef_search = 40`` applies to its next searches, whatever
        the table's writes; the constructor's ``ef_search=`` sets the table's, which handles start from)."""
        return self._ef_search if self._own_ef_search is None else self._own_ef_search

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        self._own_ef_search = check_pg_option("ef_search", value)

    # ------------------------------------------------------------ connection and transactions
    def _reconnect(self) -> None:
        """(Re)open the connection; ``BackendError`` (password masked) if the server cannot be reached."""
        old, self._conn = self._conn, None
        if old is not None:
            self._drop(old)
        self._conn, self.pgvector_version = open_connection(self.dsn, self._connect_timeout)
        self._pid = os.getpid()

    def _drop(self, conn: Any) -> None:
        """Close a connection of this process; let go of one inherited through ``fork`` (see
        :func:`~normrank.pg_connection.let_go_in_child`) without touching the parent's session."""
        if self._pid != os.getpid():
            let_go_in_child(conn)
        else:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close the database connection (the data stays in the database); later calls raise ``BackendError``."""
        self._closed = True
        if self._conn is not None:
            self._drop(self._conn)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(f"this PgVectorNormIndex on table {self.table} was closed; open a new one")

    def _connection(self, level: Any) -> Any:
        """This process's connection, at isolation ``level``; the caller holds the lock."""
        # a handle made before fork: each process gets its own connection (they shared one)
        if self._conn is None or self._conn.closed or self._pid != os.getpid():
            self._reconnect()
        if self._conn.isolation_level != level:
            self._conn.isolation_level = level
        return self._conn

    @contextlib.contextmanager
    def consistent_reads(self) -> Iterator[None]:
        """Every read of this handle inside the block (searches, ``vectors``, ``get``) sees one snapshot of
        the table: one ``REPEATABLE READ`` transaction, which other processes' writes do not change.

        Why: MMR searches, then reads its hits' vectors; another process deleting a hit in between made the
        second read raise ``UnknownIdError`` for an id the caller never named, or pair the hits of one state
        with the vectors of another (each read was its own transaction). Other threads on this handle wait
        for the block; writes inside it are refused. Nested blocks share the outer one."""
        psycopg = psycopg_module()
        with self._lock:
            if self._reading is not None:
                yield
                return
            self._check_open()
            try:
                conn = self._connection(psycopg.IsolationLevel.REPEATABLE_READ)
                with conn.transaction():
                    cur = conn.cursor()
                    self._sync(cur, force=False)
                    self._reading = cur
                    try:
                        yield
                    finally:
                        self._reading = None
            except psycopg.Error as exc:
                raise self._named_error(exc, False) from None

    def _run(self, body: Callable[[Any], T], *, write: bool = False) -> T:
        """``body(cursor)`` in one transaction that starts from the table's current state.

        Reads: ``REPEATABLE READ``, the state read by the first statement, so state and rows are one
        snapshot. Writes: an advisory lock serialises writers; the full state is re-read under it and
        written back, version bumped, in the same transaction; if anything fails, this handle's state
        is put back as it was. A dropped connection is reopened and the call retried once (a write
        only if it had not reached COMMIT), then ``BackendError``. Database errors become named ones.
        """
        psycopg = psycopg_module()
        level = None if write else psycopg.IsolationLevel.REPEATABLE_READ
        with self._lock:
            if self._reading is not None:  # inside consistent_reads(), on the thread that holds the lock
                if write:
                    raise InvalidArgumentError("a write inside consistent_reads(): only reads share its snapshot")
                try:
                    return body(self._reading)
                except psycopg.Error as exc:
                    raise self._named_error(exc, False) from None
            self._check_open()
            for attempt in (0, 1):
                before = self._snapshot()
                committing = False
                try:
                    conn = self._connection(level)
                    with conn.transaction():
                        cur = conn.cursor()
                        if write:
                            cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._names.lock_key(),))
                        self._sync(cur, force=write)
                        result = body(cur)
                        if write and self._exists:
                            self._version += 1
                            cur.execute(self._names.sql(
                                "INSERT INTO {s} (key, value) VALUES ('state', %s) ON CONFLICT (key) "
                                "DO UPDATE SET value = excluded.value"), (self._state_json(),))
                        committing = True
                    return result
                except BaseException as exc:
                    if write:
                        self._restore(before)
                    if not isinstance(exc, psycopg.Error):
                        raise
                    if attempt == 0 and self._retryable(exc, write and committing):
                        continue
                    raise self._named_error(exc, committing and write) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _retryable(self, exc: BaseException, in_commit: bool) -> bool:
        """Whether a failed call may run again: the connection dropped (reopened here), or another
        handle dropped the table (this one forgets it)."""
        psycopg = psycopg_module()
        if connection_lost(exc, self._conn):
            if in_commit:
                return False
            logger.warning("the connection to PostgreSQL at %s was lost (%s); reconnecting once",
                           redact(self.dsn, self.dsn), error_text(exc, self.dsn))
            try:
                self._reconnect()
            except BackendError as err:
                raise err from None  # the lost connection's error is not the news, nor shown
            return True
        if isinstance(exc, psycopg.errors.UndefinedTable) and self._exists:
            self._forget_table()
            return True
        return False

    def _named_error(self, exc: BaseException, in_commit: bool) -> Exception:
        psycopg = psycopg_module()
        text, where = error_text(exc, self.dsn), redact(self.dsn, self.dsn)
        if isinstance(exc, psycopg.errors.UniqueViolation):
            return DuplicateIdError(f"an id is already in table {self.table}: {text}")
        if isinstance(exc, psycopg.errors.DuplicateTable):
            return BackendError(f"a name table {self.table} needs is taken: {text}; choose another table name")
        if connection_lost(exc, self._conn):
            if in_commit:
                return BackendError(f"the connection to PostgreSQL at {where} was lost while committing, so this "
                                    f"change may or may not have been applied; check before retrying ({text})")
            return BackendError(f"the connection to PostgreSQL at {where} was lost again after reconnecting: {text}")
        return BackendError(f"PostgreSQL at {where} failed on table {self.table}: {text}")

    # ------------------------------------------------------------ state
    def _state(self) -> TableState:
        return TableState(
            self._dim or 0, self.index_type, self.hnsw_m, self.ef_construction, self._ef_search, self._weights,
            self.calibrator, self.query_calibrator, self._auto_calibrated, self._count, self._version,
            self._column_key, self._encoder.describe() if self._encoder is not None else None, self._adapter_state,
            self._removed_since_calibration)

    def _state_json(self) -> Any:
        from psycopg.types.json import Jsonb

        return Jsonb(self._state().to_json())

    def _snapshot(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _STATE_ATTRS}

    def _restore(self, snap: Mapping[str, Any]) -> None:
        for k, v in snap.items():
            setattr(self, k, v)

    def _forget_table(self) -> None:
        """The table is gone (dropped here or by another handle): become an empty index."""
        self._exists, self._count, self._dim, self._version, self._column_key = False, 0, None, 0, None
        self._table_oid, self._adapter_state, self._removed_since_calibration = None, {}, 0
        if self._auto_calibrated:
            self.calibrator = NormCalibrator(self.calibrator.max_bins, self.calibrator.min_per_bin)

    def _sync(self, cur: Any, *, force: bool = False) -> None:
        """Adopt the state stored in the database if another writer changed it (or ``force``)."""
        psycopg = psycopg_module()
        if not self._exists:
            reg = cur.execute("SELECT to_regclass(%s), to_regclass(%s)", self._names.regclass_args()[:2]).fetchone()
            if reg[0] is None:
                return
            if reg[1] is None:
                raise BackendError(f"table {self.table} exists but is not a normrank table "
                                   f"(no {self._names.state} state table); choose another table name")
            force = True
        try:
            row = cur.execute(self._names.sql(
                "SELECT CASE WHEN %s AND value ->> 'version' = %s AND t.oid = %s::oid THEN NULL ELSE value END, "
                "t.oid FROM {s}, (SELECT to_regclass(%s)::oid AS oid) AS t WHERE key = 'state'"),
                (not force, str(self._version), self._table_oid, self._names.regclass_args()[0])).fetchone()
        except (psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedFunction, psycopg.errors.DataError):
            raise BackendError(f"table {self._names.state} is not a normrank state table, so {self.table} is not "
                               "a normrank table; choose another table name") from None
        if row is None:
            raise BackendError(f"table {self._names.state} has no state row: the table was not written "
                               "by normrank, or its creation was interrupted")
        if row[0] is not None:
            self._adopt(TableState.from_json(self.table, row[0]))
            self._table_oid = None if row[1] is None else int(row[1])

    def _adopt(self, state: TableState) -> None:
        self._dim, self.index_type, self._weights = state.dim, state.index_type, state.weights
        self._hnsw_m, self._ef_construction, self._ef_search = state.hnsw_m, state.ef_construction, state.ef_search
        self.calibrator, self.query_calibrator = state.calibrator, state.query_calibrator
        self._auto_calibrated, self._count, self._version = state.auto_calibrated, state.count, state.version
        self._removed_since_calibration = state.removed_since_calibration
        self._column_key = state.column_key
        self._adapter_state = state.adapter_state
        if self._encoder is None and state.encoder:
            self._encoder = encoder_from_settings(state.encoder, what="the table")
        elif self._encoder is not None:
            warn_if_other_encoder(state.encoder, self._encoder, f"the table {self._names.table!r}")
        self._exists = True

    def _check_names_free(self, cur: Any) -> None:
        """A new table needs ``{table}_normrank`` and ``{table}_emb_hnsw`` too: refuse if either is taken."""
        if self._exists:
            return
        t, s, ix = self._names.regclass_args()
        taken = cur.execute("SELECT to_regclass(%s)::text, to_regclass(%s)::text, to_regclass(%s)::text",
                            (t, s, ix)).fetchone()
        if taken[0] is not None:
            raise BackendError(f"table {self.table} was created by someone else meanwhile and is not a normrank "
                               "table; choose another table name")
        clash = [name for name in taken[1:] if name is not None]
        if clash:
            raise BackendError(
                f"table {self.table} needs the names {self._names.state} and {self._names.index}, but "
                f"{', '.join(clash)} already exists in this database (another table or index): choose another "
                "table name")

    def _apply_overrides(self, weights: Weights | None, index_type: str | None, calibrator: NormCalibrator | None,
                         query_calibrator: NormCalibrator | None, ef_search: int | None) -> None:
        """Constructor arguments given explicitly win over the stored state."""
        changes = (weights is not None and weights != self._weights
                   or index_type is not None and index_type != self.index_type
                   or calibrator is not None and calibrator.is_fitted
                   and calibrator.to_dict() != self.calibrator.to_dict()
                   or query_calibrator is not None or ef_search is not None and ef_search != self._ef_search)
        if not changes:
            return

        def body(cur: Any) -> None:
            if query_calibrator is not None:
                self.query_calibrator = query_calibrator
            if ef_search is not None:
                self._ef_search = check_pg_option("ef_search", ef_search)
            rewrite = False
            if calibrator is not None and calibrator.is_fitted and calibrator.to_dict() != self.calibrator.to_dict():
                self.calibrator, self._auto_calibrated, rewrite = calibrator, False, True
            if weights is not None:
                self._weights = weights
            if index_type is not None and index_type != self.index_type:
                self.index_type = index_type
                if not rewrite:
                    cur.execute(self._names.sql("DROP INDEX IF EXISTS {ix}"))
                    self._create_vector_index(cur)
            if rewrite or self._current_column_key() != self._column_key:
                self._rewrite_column(cur)

        self._run(body, write=True)

    # ------------------------------------------------------------ properties
    @property
    def augmented_dim(self) -> int:
        if self._dim is None:
            raise EmptyCorpusError("the index is empty: its dimension is not known yet")
        return self._dim + 1

    def __len__(self) -> int:
        return self._run(lambda cur: self._count)

    @property
    def adapter_state(self) -> dict[str, Any]:
        """A copy of the table's adapter state as stored now (see :meth:`update_adapter_state`)."""
        return self._run(lambda cur: copy.deepcopy(self._adapter_state))

    def update_adapter_state(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON) under ``key`` in the table's state row, which every handle reads: what a
        framework adapter keeps with the table (see ``NormIndex.adapter_state``).

        Refused here as in metadata: what jsonb cannot hold (NUL, a lone surrogate: PostgreSQL's own error)
        or gives back changed (a float of 2**53 or more came back as an int, -0.0 as 0.0)."""
        checked = check_adapter_entry(key, value)
        check_metadata({key: checked}, "adapter_state", allow_nul=False, jsonb=True)

        def body(cur: Any) -> None:
            if not self._exists:
                raise EmptyCorpusError(f"table {self.table} does not exist yet: add documents first")
            self._adapter_state = {**self._adapter_state, key: checked}

        self._run(body, write=True)

    def blend_settings(self) -> tuple[Weights, NormCalibrator, NormCalibrator | None]:
        """The table's weights and calibrations as stored now (another handle or process may have changed them)."""
        return self._run(lambda cur: (self._weights, self.calibrator, self.query_calibrator))

    def __contains__(self, doc_id: object) -> bool:
        if not isinstance(doc_id, str) or not doc_id:
            return False
        try:
            check_text(doc_id, "id", allow_nul=False)
        except InvalidTextError:
            return False  # such an id can never be stored

        def body(cur: Any) -> bool:
            if not self._exists:
                return False
            return cur.execute(self._names.sql("SELECT 1 FROM {t} WHERE id = %s"), (doc_id,)).fetchone() is not None

        return self._run(body)

    def ids(self) -> list[str]:
        """Live ids, in insertion order."""
        def body(cur: Any) -> list[str]:
            if not self._exists:
                return []
            return [r[0] for r in cur.execute(self._names.sql("SELECT id FROM {t} ORDER BY seq"))]

        return self._run(body)

    def __repr__(self) -> str:
        return (f"PgVectorNormIndex(table={self.table!r}, n={self._count}, dim={self._dim}, "
                f"index_type={self.index_type!r}, weights={self._weights})")

    # ------------------------------------------------------------ building
    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
        *,
        dsn: str | None = None,
        table: str = "normrank_docs",
        encoder: RawEncoder | None = None,
        show_progress: bool | None = None,
        **kwargs: Any,
    ) -> PgVectorNormIndex:
        """Encode ``texts`` with the raw encoder and index them in ``table``."""
        if len(texts) == 0:
            raise EmptyCorpusError("cannot build an index from an empty corpus")
        index = cls(dsn, table, encoder, **kwargs)
        index.add_texts(texts, ids=ids, metadatas=metadatas, show_progress=show_progress)
        return index

    # ------------------------------------------------------------ reading documents
    def get(self, ids: Iterable[str]) -> list[Record]:
        """Records for ``ids`` in the given order."""
        wanted = _check_ids(ids, allow_nul=False)

        def body(cur: Any) -> list[Record]:
            found: dict[str, Record] = {}
            if self._exists and wanted:
                for i, text, meta, nrm, cnt in cur.execute(self._names.sql(
                        "SELECT id, text, metadata, norm, token_count FROM {t} WHERE id = ANY(%s)"), (wanted,)):
                    found[i] = Record(i, text, meta, float(nrm), int(cnt))
            missing = [x for x in wanted if x not in found]
            if missing:
                raise UnknownIdError(f"unknown ids: {missing[:5]}")
            return [found[x] for x in wanted]

        return self._run(body)

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The raw vectors of stored documents, in the given order: float32, shape ``(len(ids), dim)``.

        Rebuilt from the row (its unit direction times its stored norm), as ``NormIndex.vectors``:
        what vector stores need for MMR. Equal to what was added up to float32 rounding. Raises
        ``UnknownIdError`` for a missing id.
        """
        wanted = _check_ids(ids, allow_nul=False)

        def body(cur: Any) -> np.ndarray:
            found: dict[str, np.ndarray] = {}
            if self._exists and wanted:
                for i, emb, nrm in cur.execute(self._names.sql(
                        "SELECT id, emb, norm FROM {t} WHERE id = ANY(%s)"), (wanted,)):
                    emb = emb.to_numpy() if hasattr(emb, "to_numpy") else emb  # pgvector's Vector, or an array
                    found[i] = np.asarray(emb, dtype=np.float32)[: self._dim] * np.float32(nrm)
            missing = [x for x in wanted if x not in found]
            if missing:
                raise UnknownIdError(f"unknown ids: {missing[:5]}")
            if not wanted:
                return np.zeros((0, self._dim or 0), dtype=np.float32)
            return np.ascontiguousarray(np.stack([found[x] for x in wanted]), dtype=np.float32)

        return self._run(body)


__all__ = ["DSN_ENV", "PG_INDEX_TYPES", "PgVectorNormIndex", "local_server", "redact", "resolve_dsn"]
