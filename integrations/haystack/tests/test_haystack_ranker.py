"""Haystack adapter: ``NormRankRanker`` alone and in a real Pipeline with InMemoryDocumentStore + BM25."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("haystack", reason='needs haystack-ai: pip install normrank-haystack')

from haystack import Document, Pipeline  # noqa: E402
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever  # noqa: E402
from haystack.document_stores.in_memory import InMemoryDocumentStore  # noqa: E402

from haystack_integrations.components.rankers.normrank import NormRankRanker  # noqa: E402
from normrank.datasets import demo_rows  # noqa: E402
from normrank import ConfigError, EmptyTextError, InvalidArgumentError, NormIndex, Weights  # noqa: E402

EXPLAINED = {"score", "cosine", "norm_feature", "weight", "norm"}  # meta["normrank"] holds these




@pytest.fixture(scope="module")
def ids() -> list[str]:
    return [d["_id"] for d in demo_rows("demo_corpus.jsonl")]


@pytest.fixture(scope="module")
def index(encoder, ids, demo_texts, demo_encoded) -> NormIndex:
    idx = NormIndex(encoder, weights=Weights(a=0.03, b=0.02))
    idx.add_vectors(*demo_encoded, ids=ids, texts=demo_texts)
    idx.calibrate_queries([q["text"] for q in demo_rows("demo_queries.jsonl")])
    return idx


def _docs(ids, texts, embeddings=None, score=None) -> list[Document]:
    return [Document(id=i, content=t, meta={"src": i}, score=score,
                     embedding=None if embeddings is None else [float(x) for x in embeddings[j]])
            for j, (i, t) in enumerate(zip(ids, texts))]


def test_pipeline_bm25_then_ranker(encoder, ids, demo_texts):
    store = InMemoryDocumentStore()
    store.write_documents(_docs(ids, demo_texts))
    pipe = Pipeline()
    pipe.add_component("bm25", InMemoryBM25Retriever(store, top_k=10))
    pipe.add_component("rerank", NormRankRanker(top_k=3, weights={"a": 0.03}, encoder=encoder))
    pipe.connect("bm25.documents", "rerank.documents")
    q = "How long do massive stars live?"
    res = pipe.run({"bm25": {"query": q}, "rerank": {"query": q}}, include_outputs_from={"bm25"})
    bm25 = {d.id: d.score for d in res["bm25"]["documents"]}
    out = res["rerank"]["documents"]
    assert len(out) == 3 and out[0].id.startswith("astro")
    assert [d.score for d in out] == sorted((d.score for d in out), reverse=True)
    for d in out:
        m = d.meta["normrank"]
        assert EXPLAINED <= set(m) and d.meta["src"] == d.id
        assert d.score == pytest.approx(m["score"])
        assert m["retrieval_score"] == pytest.approx(bm25[d.id])
        assert d.score == pytest.approx(m["cosine"] + 0.03 * m["norm_feature"], abs=1e-9)


def test_matches_the_index_arithmetic(index, ids, demo_texts):
    ranker = NormRankRanker.from_index(index, top_k=len(ids))
    q = "What does mitochondrial DNA encode?"
    got = {d.id: d.score for d in ranker.run(query=q, documents=_docs(ids, demo_texts))["documents"]}
    for h in index.search(q, len(index)):
        assert got[h.id] == pytest.approx(h.score, abs=2e-5)


def test_document_embeddings_used_only_when_raw(encoder, ids, demo_texts, demo_encoded):
    ids, texts, vecs = ids[:12], demo_texts[:12], demo_encoded[0][:12]
    q = "How do vaccines work?"
    qv = encoder.encode([q])[0]
    base = {d.id: d.score for d in NormRankRanker(top_k=12, cache_size=0, encoder=encoder)
            .run(query=q, documents=_docs(ids, texts))["documents"]}
    unit = np.roll(vecs / np.linalg.norm(vecs, axis=1, keepdims=True), 1, axis=0)
    ignored = NormRankRanker(top_k=12, cache_size=0, encoder=encoder).run(query=q, documents=_docs(ids, texts, unit))
    assert {d.id: d.score for d in ignored["documents"]} == pytest.approx(base, abs=1e-5)
    used = NormRankRanker(top_k=12, cache_size=0, encoder=encoder).run(
        query=q, documents=_docs(ids, texts, vecs * 1.005))
    for d in used["documents"]:  # the model's own raw vectors (norms 0.5% off, as half precision may be): used
        j = ids.index(d.id)
        assert d.meta["normrank"]["norm"] == pytest.approx(1.005 * float(np.linalg.norm(vecs[j])), rel=1e-5)
        cos = float(vecs[j] @ qv / np.linalg.norm(vecs[j]) / np.linalg.norm(qv))
        assert d.meta["normrank"]["cosine"] == pytest.approx(cos, abs=1e-5)


def test_raw_embeddings_of_another_model_or_half_precision_unit_ones_are_not_used(encoder, ids, demo_texts,
                                                                                  demo_encoded, caplog):
    """Found by a Haystack user's hunt: each document carrying another text's raw vector (another model's
    geometry), int8 vectors (norms ~2000) and bfloat16 unit vectors (norms 1 +- 3e-3) were all trusted."""
    ids, texts, vecs = ids[:12], demo_texts[:12], demo_encoded[0][:12]
    q = "How do vaccines work?"
    base = {d.id: d.score for d in NormRankRanker(top_k=12, cache_size=0, weights={"a": 0.03}, encoder=encoder)
            .run(query=q, documents=_docs(ids, texts))["documents"]}
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    rng = np.random.default_rng(0)
    half = unit * (1 + rng.uniform(-3e-3, 3e-3, size=(len(ids), 1)))  # what a bfloat16 stock embedder gives
    for given, warned in ((np.roll(vecs, 1, axis=0), True), (np.round(unit * 2000), True), (half, False)):
        caplog.clear()
        ranker = NormRankRanker(top_k=12, cache_size=0, weights={"a": 0.03}, encoder=encoder)
        with caplog.at_level("WARNING", logger="normrank.candidate_vectors"):
            for _ in range(2):  # and still on the next call
                got = {d.id: d.score for d in ranker.run(query=q, documents=_docs(ids, texts, given))["documents"]}
                assert got == pytest.approx(base, abs=1e-5)
        assert ("does not match its own encoding" in caplog.text) is warned


def test_inputs_untouched_top_k_and_copies(encoder, ids, demo_texts):
    docs = _docs(ids[:8], demo_texts[:8], score=1.5)
    before = [d.to_dict() for d in docs]
    ranker = NormRankRanker(top_k=2, encoder=encoder)
    assert len(ranker.run(query="stars", documents=docs)["documents"]) == 2
    out = ranker.run(query="stars", documents=docs, top_k=5)["documents"]
    assert len(out) == 5 and all(d.meta["normrank"]["retrieval_score"] == 1.5 for d in out)
    assert len(ranker.run(query="stars", documents=docs, top_k=50)["documents"]) == 8
    assert [d.to_dict() for d in docs] == before
    no_keep = NormRankRanker(top_k=2, keep_retrieval_score=False, encoder=encoder)
    assert all("retrieval_score" not in d.meta["normrank"]
               for d in no_keep.run(query="stars", documents=docs)["documents"])


def test_bad_input(encoder, ids, demo_texts):
    ranker = NormRankRanker(encoder=encoder)
    assert ranker.run(query="x", documents=[]) == {"documents": []}
    with pytest.raises(EmptyTextError, match="query is empty"):
        ranker.run(query="  ", documents=_docs(ids[:2], demo_texts[:2]))
    with pytest.raises(InvalidArgumentError, match="top_k"):
        ranker.run(query="stars", documents=_docs(ids[:2], demo_texts[:2]), top_k=0)
    with pytest.raises(InvalidArgumentError, match="top_k"):
        NormRankRanker(top_k=-1)
    with pytest.raises(InvalidArgumentError, match="scoring mode"):
        NormRankRanker(weights={"mode": "sideways"})


def test_warm_up_and_serialisation(index, ids, demo_texts):
    ranker = NormRankRanker.from_index(index, top_k=4)
    data = ranker.to_dict()
    assert data["type"] == "haystack_integrations.components.rankers.normrank.ranker.NormRankRanker"
    params = data["init_parameters"]
    assert params["model"] is None and params["weights"]["b"] == 0.02
    assert json.loads(json.dumps(data)) == data
    again = NormRankRanker.from_dict(data)
    assert again.calibrator == index.calibrator and again.query_calibrator == index.query_calibrator
    again.warm_up()
    assert again.encoder.model is not None
    q = "What is the exact speed of light?"
    a = ranker.run(query=q, documents=_docs(ids, demo_texts))["documents"]
    b = again.run(query=q, documents=_docs(ids, demo_texts))["documents"]
    assert [(d.id, round(d.score, 6)) for d in a] == [(d.id, round(d.score, 6)) for d in b]


def test_pipeline_dumps_and_loads(encoder):
    pipe = Pipeline()
    pipe.add_component("rerank", NormRankRanker(top_k=2, weights={"a": 0.01}, encoder=encoder))
    loaded = Pipeline.loads(pipe.dumps(), allowed_modules=["haystack_integrations.components.rankers.normrank.ranker"])
    ranker = loaded.get_component("rerank")
    assert isinstance(ranker, NormRankRanker) and ranker.weights == Weights(a=0.01) and ranker.top_k == 2


async def test_run_async_matches_run(encoder, ids, demo_texts):
    ranker = NormRankRanker(top_k=3, encoder=encoder)
    sync = ranker.run(query="vaccines", documents=_docs(ids, demo_texts))["documents"]
    got = (await ranker.run_async(query="vaccines", documents=_docs(ids, demo_texts)))["documents"]
    assert [(d.id, d.score) for d in got] == [(d.id, d.score) for d in sync]


def test_from_config(tmp_path, index):
    with pytest.raises(ConfigError, match="haystack.calibration"):
        NormRankRanker.from_config({"haystack": {"calibration": "index"}})
    r = NormRankRanker.from_config({"haystack": {"top_k": 3, "keep_retrieval_score": False}, "scoring": {"a": 0.02}})
    assert r.top_k == 3 and not r.keep_retrieval_score and r.weights == Weights(a=0.02) and r.calibrator is None
    index.save(tmp_path / "idx")
    r2 = NormRankRanker.from_config({"store": {"path": str(tmp_path / "idx")}})
    assert r2.calibrator == index.calibrator and r2.weights == index.weights
    r3 = NormRankRanker.from_config({"store": {"path": str(tmp_path / "idx")}, "haystack": {"calibration": "candidates"}})
    assert r3.calibrator is None
    # 'auto' with a store.path that holds nothing (a typo) says so instead of calibrating per call in silence
    with pytest.warns(UserWarning, match="holds no saved index"):
        r4 = NormRankRanker.from_config({"store": {"path": str(tmp_path / "idz")}})
    assert r4.calibrator is None


def test_backend_is_serialised_taken_from_a_shared_encoder_and_validated():
    from normrank import RawEncoder

    ranker = NormRankRanker(backend="onnx")
    data = ranker.to_dict()
    assert data["init_parameters"]["backend"] == "onnx"
    assert NormRankRanker.from_dict(data).backend == "onnx"
    shared = NormRankRanker(encoder=RawEncoder(backend="onnx-int8"))
    assert shared.to_dict()["init_parameters"]["backend"] == "onnx-int8"
    old = dict(data, init_parameters={k: v for k, v in data["init_parameters"].items() if k != "backend"})
    assert NormRankRanker.from_dict(old).backend == "torch"  # pipelines saved before the setting existed
    with pytest.raises(InvalidArgumentError, match="backend"):
        NormRankRanker(backend="tensorrt")
    with pytest.raises(InvalidArgumentError, match="CPU"):
        NormRankRanker(backend="onnx-int8", device="cuda")


def test_from_config_on_a_pgvector_table_ranks_as_the_table(encoder, ids, demo_texts, pg_dsn, pg_table_factory):
    """``from_config`` looked only at ``store.path``: with ``store.backend: pgvector`` it ignored the table's
    weights and calibration (``auto``) or refused (``index``), though every process should rank alike from it."""
    from normrank.pgvector_store import PgVectorNormIndex

    table = pg_table_factory("hs")
    pg = PgVectorNormIndex(pg_dsn, table, encoder, weights=Weights(a=0.05))
    try:
        pg.add_texts(demo_texts, ids=ids)
        cfg = {"store": {"backend": "pgvector", "dsn": pg_dsn, "table": table}}
        for calibration in ("auto", "index"):
            ranker = NormRankRanker.from_config({**cfg, "haystack": {"calibration": calibration, "top_k": 4}})
            assert ranker.weights == Weights(a=0.05) and ranker.calibrator == pg.calibrator
            want = NormRankRanker.from_index(pg, top_k=4).run(query="vaccines", documents=_docs(ids, demo_texts))
            got = ranker.run(query="vaccines", documents=_docs(ids, demo_texts))
            assert [d.id for d in got["documents"]] == [d.id for d in want["documents"]]
    finally:
        pg.close()


def test_a_ranker_on_a_shared_table_follows_its_weights(encoder, ids, demo_texts, pg_dsn, pg_table_factory):
    """A ranker built from a pgvector table copied its weights and calibrations once: after another handle
    (or process) changed the table's weights it kept ranking with the old blend while the table ranked with
    the new one. It now reads them on every run, and so does one built on a FAISS index; weights given to
    ``from_index`` stay the ranker's own."""
    from normrank import NormIndex
    from normrank.pgvector_store import PgVectorNormIndex

    table = pg_table_factory("hs_live")
    pg = PgVectorNormIndex(pg_dsn, table, encoder, weights=Weights(a=0.05))
    other = None
    try:
        pg.add_texts(demo_texts, ids=ids)
        ranker = NormRankRanker.from_config({"store": {"backend": "pgvector", "dsn": pg_dsn, "table": table},
                                             "haystack": {"top_k": len(ids)}})
        other = PgVectorNormIndex(pg_dsn, table, encoder)  # another handle, as another process would have
        other.set_weights(Weights(a=-0.3))
        got = ranker.run(query="vaccines", documents=_docs(ids, demo_texts))["documents"]
        want = pg.search("vaccines", len(ids))
        assert [d.id for d in got] == [h.id for h in want]
        assert [d.score for d in got] == pytest.approx([h.score for h in want], abs=1e-5)
        assert NormRankRanker.from_dict(ranker.to_dict()).weights == Weights(a=-0.3)
    finally:
        if other is not None:
            other.close()
        pg.close()
    faiss_index = NormIndex(encoder, weights=Weights(a=0.05))
    faiss_index.add_texts(demo_texts, ids=ids)
    follows = NormRankRanker.from_index(faiss_index, top_k=len(ids))
    keeps = NormRankRanker.from_index(faiss_index, top_k=len(ids), weights=Weights(a=0.05))
    before = [d.id for d in keeps.run(query="vaccines", documents=_docs(ids, demo_texts))["documents"]]
    faiss_index.set_weights(Weights(a=-0.3))
    got = follows.run(query="vaccines", documents=_docs(ids, demo_texts))["documents"]
    assert [d.id for d in got] == [h.id for h in faiss_index.search("vaccines", len(ids))]
    assert [d.id for d in keeps.run(query="vaccines", documents=_docs(ids, demo_texts))["documents"]] == before
    assert before != [d.id for d in got]
