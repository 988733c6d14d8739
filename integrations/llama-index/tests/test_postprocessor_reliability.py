"""``NormRankPostprocessor`` under adversarial use (issue 10 items 3, 7, 17; issue 14 item 6).

Real llama-index-core classes and the real bundled model throughout; model calls are counted
with a spy on the real model's ``encode`` (the real encoding still runs).
"""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest

pytest.importorskip("llama_index.core", reason="needs llama-index-core: pip install llama-index-normrank")

from llama_index.core import VectorStoreIndex  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode  # noqa: E402

from llama_index.embeddings.normrank import NormRankEmbedding  # noqa: E402
from llama_index.postprocessor.normrank import NormRankPostprocessor  # noqa: E402
from llama_index.retrievers.normrank import NormRankRetriever  # noqa: E402
from normrank import InvalidArgumentError, NormIndex, Weights  # noqa: E402

USER_META = {"weight": "12 kg", "norm": "ISO 9001", "cosine": "trig", "relevance_score": "high",
             "retrieval_score": "n/a", "src": "user"}










def _nodes(ids, texts, meta=None, score=0.5) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=i, text=t, metadata=dict(meta or {})), score=score)
            for i, t in zip(ids, texts)]


def _ranked(out: list[NodeWithScore]) -> list[tuple[str, float | None]]:
    return [(n.node.node_id, n.score) for n in out]


# ---------------------------------------------------------------- issue 10 item 7
def test_user_metadata_keys_kept_and_visible(encoder, ids, demo_texts):
    post = NormRankPostprocessor(encoder=encoder, top_n=4, weights={"a": 0.03}, metadata_mode=MetadataMode.NONE)
    out = post.postprocess_nodes(_nodes(ids[:8], demo_texts[:8], USER_META, score=0.7), query_str="stars")
    assert len(out) == 4
    for n in out:
        meta = n.node.metadata
        assert {k: meta[k] for k in USER_META} == USER_META  # nothing overwritten
        explained = meta["normrank"]
        assert explained["score"] == pytest.approx(n.score)
        assert explained["retrieval_score"] == 0.7
        assert n.score == pytest.approx(explained["cosine"] + 0.03 * explained["norm_feature"], abs=1e-6)
        # the user's keys still reach the LLM and the embedding; only normrank's own key is hidden
        llm = n.node.get_content(metadata_mode=MetadataMode.LLM)
        assert "weight: 12 kg" in llm and "relevance_score: high" in llm and "norm: ISO 9001" in llm
        assert "normrank" not in llm and "normrank" not in n.node.get_content(metadata_mode=MetadataMode.EMBED)
        assert n.node.excluded_llm_metadata_keys == ["normrank"]
    # the re-ranked node hashes as the node given (LlamaIndex merges and deduplicates by hash), and is a TextNode
    given = {n.node.node_id: n.node for n in _nodes(ids[:8], demo_texts[:8], USER_META, score=0.7)}
    assert all(n.node.hash == given[n.node.node_id].hash and isinstance(n.node, TextNode) for n in out)
    from llama_index.core.schema import Document

    documents = [NodeWithScore(node=Document(text=t, id_=i), score=0.5) for i, t in zip(ids[:4], demo_texts[:4])]
    for query in ("stars", "vaccines"):
        ranked = post.postprocess_nodes(documents, query_str=query)
        assert all(isinstance(n.node, Document) and n.node.class_name() == "Document" for n in ranked)
        assert sorted(n.node.hash for n in ranked) == sorted(d.node.hash for d in documents)


def test_a_users_own_normrank_key_is_kept(encoder, ids, demo_texts, caplog):
    post = NormRankPostprocessor(encoder=encoder, top_n=3)
    nodes = _nodes(ids[:3], demo_texts[:3], {"normrank": "v2 pipeline"})
    with caplog.at_level(logging.WARNING):
        out = post.postprocess_nodes(nodes, query_str="stars")
    assert all(n.node.metadata["normrank"] == "v2 pipeline" for n in out)
    assert all("normrank: v2 pipeline" in n.node.get_content(metadata_mode=MetadataMode.LLM) for n in out)
    assert "own metadata key 'normrank'" in caplog.text


def test_a_second_stage_replaces_the_first_stages_explanation(index, ids):
    first = NormRankRetriever(index, similarity_top_k=6).retrieve("How long do massive stars live?")
    post = NormRankPostprocessor.from_index(index, top_n=6, weights=Weights(a=0.1))
    out = post.postprocess_nodes(first, query_str="How long do massive stars live?")
    for n in out:
        assert n.node.metadata["normrank"]["score"] == pytest.approx(n.score)
        assert n.node.metadata["normrank"]["weight"] == pytest.approx(0.1)
        assert n.node.excluded_llm_metadata_keys.count("normrank") == 1


# ---------------------------------------------------------------- issue 10 item 17
def test_unknown_arguments_and_weights_keys_are_refused(encoder):
    with pytest.raises(InvalidArgumentError, match=r"unknown weights keys \['alpha'\].*allowed keys: \['a', 'b'"):
        NormRankPostprocessor(weights={"alpha": 0.02})
    with pytest.raises(InvalidArgumentError, match=r"unknown arguments \['top_k'\].*'top_n'"):
        NormRankPostprocessor(top_k=3)
    with pytest.raises(InvalidArgumentError, match="unknown pooling"):
        NormRankPostprocessor(pooling="max")
    with pytest.raises(InvalidArgumentError, match="weight a must be finite"):
        NormRankPostprocessor(weights={"a": float("nan")})
    # what is accepted is used: the dict sets the blend, and it survives to_dict/from_dict
    post = NormRankPostprocessor(encoder=encoder, weights={"a": 0.02, "mode": "tiebreak"})
    assert post.weights == Weights(a=0.02, mode="tiebreak")
    assert NormRankPostprocessor.from_dict(post.to_dict()).weights == post.weights


def test_encoder_settings_round_trip(encoder):
    """Every encoder setting (pooling and sif_a too) survives to_dict/from_dict (issue 10 item 16)."""
    from normrank.pooling import PooledEncoder

    pooled = PooledEncoder(pooling="sif", sif_a=2e-3, batch_size=16, max_seq_length=128)
    post = NormRankPostprocessor(encoder=pooled, top_n=3)
    again = NormRankPostprocessor.from_dict(post.to_dict())
    assert (again.pooling, again.sif_a, again.batch_size, again.max_seq_length) == ("sif", 2e-3, 16, 128)
    assert isinstance(again.encoder, PooledEncoder)
    assert again.encoder.describe() == pooled.describe()


def test_an_empty_node_is_passed_through_last(encoder, ids, demo_texts, caplog):
    post = NormRankPostprocessor(encoder=encoder, top_n=10, weights={"a": 0.03})
    q = "What does mitochondrial DNA encode?"
    full = _nodes(ids[:6], demo_texts[:6])
    blank = NodeWithScore(node=TextNode(id_="blank", text="  ", metadata={"src": "x"}), score=0.9)
    with caplog.at_level(logging.WARNING):
        out = post.postprocess_nodes([full[0], blank, *full[1:]], query_str=q)
    alone = _ranked(post.postprocess_nodes(full, query_str=q))
    assert [i for i, _ in _ranked(out)[:6]] == [i for i, _ in alone]
    assert [n.score for n in out[:6]] == pytest.approx([s for _, s in alone], abs=1e-6)
    last = out[-1]
    assert last.node.node_id == "blank" and last.score is None and last.node.metadata["src"] == "x"
    assert last.node.metadata["normrank"]["skipped"] == "no text"
    assert last.node.metadata["normrank"]["retrieval_score"] == 0.9
    assert "1 of 7 nodes have no text" in caplog.text and "'blank'" in caplog.text
    # text that cannot be encoded (a lone surrogate) failed the whole re-rank, named "text 1": now passed last
    broken = NodeWithScore(node=TextNode(id_="broken", text="bad \udcff text"), score=0.8)
    out2 = post.postprocess_nodes([full[0], broken, *full[1:]], query_str=q)
    assert [i for i, _ in _ranked(out2)[:6]] == [i for i, _ in alone]
    assert out2[-1].node.node_id == "broken" and out2[-1].node.metadata["normrank"]["skipped"] == (
        "text is not valid Unicode")
    # top_n counts it only when there is room; only empty nodes: all passed through
    assert [n.node.node_id for n in NormRankPostprocessor(encoder=encoder, top_n=2).postprocess_nodes(
        [blank, *full], query_str=q)] == [n.node.node_id for n in out[:2]]
    assert _ranked(post.postprocess_nodes([blank], query_str=q)) == [("blank", None)]


# ---------------------------------------------------------------- issue 10 item 3
def test_concurrent_reranks_equal_single_threaded(encoder, ids, demo_texts, queries):
    """8 threads and 8 asyncio tasks share one postprocessor and one encoder (tiny cache: constant eviction).

    Half the calls bring a raw query embedding (tokenizer only), half encode the query: the
    mix that made 2-3% of calls raise and one score change before the encoder was locked.
    """
    qvecs = encoder.encode(queries)
    jobs = [(i % len(queries), [(i * 5 + j) % len(ids) for j in range(3)], i % 2 == 0) for i in range(40)]

    def bundle(qi: int, raw: bool) -> QueryBundle:
        return QueryBundle(queries[qi], embedding=qvecs[qi].tolist() if raw else None)

    def one(post: NormRankPostprocessor, job) -> list:
        qi, rows, raw = job
        return _ranked(post.postprocess_nodes(_nodes([ids[r] for r in rows], [demo_texts[r] for r in rows]),
                                              bundle(qi, raw)))

    alone = NormRankPostprocessor(encoder=encoder, top_n=3, weights={"a": 0.03})
    alone.postprocess_nodes(_nodes(ids, demo_texts), query_str=queries[0])  # encodes every node once
    expected = [one(alone, job) for job in jobs]
    post = NormRankPostprocessor(encoder=encoder, top_n=3, cache_size=6, weights={"a": 0.03})
    got: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for j in range(worker, len(jobs), 8):
                got[j] = one(post, jobs[j])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()

    async def tasks() -> list:
        return await asyncio.gather(*(post.apostprocess_nodes(
            _nodes([ids[r] for r in rows], [demo_texts[r] for r in rows]), bundle(qi, raw))
            for qi, rows, raw in jobs[:8]))

    from_async = [_ranked(out) for out in asyncio.run(tasks())]
    for t in threads:
        t.join()
    assert errors == []
    for j, want in enumerate(expected):
        assert [i for i, _ in got[j]] == [i for i, _ in want]
        assert [s for _, s in got[j]] == pytest.approx([s for _, s in want], abs=1e-5)
    for j, out in enumerate(from_async):
        assert [i for i, _ in out] == [i for i, _ in expected[j]]
        assert [s for _, s in out] == pytest.approx([s for _, s in expected[j]], abs=1e-5)


# ---------------------------------------------------------------- issue 14 item 6
def test_warm_query_engine_rerank_costs_no_model_call(encoder, ids, demo_texts, demo_encoded, model_calls):
    """The query embedding the framework computed (raw, by NormRankEmbedding) is reused."""
    nodes = [TextNode(id_=i, text=t, embedding=v.tolist()) for i, t, v in zip(ids, demo_texts, demo_encoded[0])]
    vindex = VectorStoreIndex(nodes, embed_model=NormRankEmbedding(encoder=encoder))
    post = NormRankPostprocessor(encoder=encoder, top_n=3, weights=Weights(a=0.03))
    engine = vindex.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[post])
    q = "How long do massive stars live?"
    engine.query(q)  # cold: the 8 candidates are encoded once (SimpleVectorStore returns no embeddings)
    before = model_calls.texts
    again = engine.query(q).source_nodes
    assert model_calls.texts - before == 1  # the framework's own query embedding, nothing more
    assert again[0].node.node_id.startswith("astro")


def test_from_index_reuses_stored_vectors(index, ids, demo_texts, encoder, model_calls):
    q = "When was the Peace of Westphalia signed?"
    qv = encoder.encode([q])[0]
    want = {h.id: h.score for h in index.search(q, 10)}
    post = NormRankPostprocessor.from_index(index, top_n=len(ids), cache_size=0, metadata_mode=MetadataMode.NONE)
    candidates = NormRankRetriever(index, similarity_top_k=10).retrieve(q)
    calls = model_calls.texts
    out = post.postprocess_nodes(candidates, QueryBundle(q, embedding=qv.tolist()))
    assert model_calls.texts == calls  # neither the candidates nor the (raw) query were encoded
    assert {n.node.node_id: n.score for n in out} == pytest.approx(want, abs=2e-5)
    # a unit query embedding (a stock embedder's) is not raw: the query text is encoded instead
    unit = (qv / np.linalg.norm(qv)).tolist()
    post.postprocess_nodes(candidates, QueryBundle(q, embedding=unit))
    assert model_calls.texts == calls + 1
    # an id the index holds but with other text is encoded, not scored with the stored vector
    edited = _nodes([ids[0], ids[1]], ["An edited text about comets.", demo_texts[1]])
    post.postprocess_nodes(edited, QueryBundle(q, embedding=qv.tolist()))
    assert model_calls.texts == calls + 2


def test_query_engine_over_the_normrank_store_encodes_only_the_query(encoder, ids, demo_texts, model_calls):
    """NormRankVectorStore + NormRankEmbedding + NormRankPostprocessor.from_index(store): even the first
    re-rank runs the model once per query (the framework's own query embedding), nothing for candidates."""
    from llama_index.vector_stores.normrank import NormRankVectorStore

    index = NormIndex(encoder, weights=Weights(a=0.03))
    index.add_texts(demo_texts, ids=ids)
    store = NormRankVectorStore(index)
    vindex = VectorStoreIndex.from_vector_store(store, embed_model=NormRankEmbedding(encoder=encoder))
    post = NormRankPostprocessor.from_index(store, top_n=3, cache_size=0, weights=Weights(a=0.05))
    engine = vindex.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[post])
    q = "How long do massive stars live?"
    before = model_calls.texts
    out = engine.query(q).source_nodes
    assert model_calls.texts - before == 1
    assert len(out) == 3 and out[0].node.node_id.startswith("astro")
    vectors = store.index.vectors([n.node.node_id for n in out])
    qv = encoder.encode([q])[0]
    for n, v in zip(out, vectors):  # scored with the stored vectors
        cos = float(v @ qv / np.linalg.norm(v) / np.linalg.norm(qv))
        assert n.node.metadata["normrank"]["cosine"] == pytest.approx(cos, abs=1e-5)


def test_the_encoder_backend_round_trips_is_validated_and_reranks_alike(encoder, ids, demo_texts):
    """``backend`` is an encoder setting like the others: taken from a shared encoder, serialised,
    refused when unknown or on a GPU; the fp32 ONNX backend re-ranks as torch does."""
    pytest.importorskip("onnxruntime", reason="the ONNX backends need normrank[onnx]")
    from normrank import RawEncoder

    post = NormRankPostprocessor(encoder=RawEncoder(backend="onnx"), top_n=5, weights={"a": 0.03})
    again = NormRankPostprocessor.from_dict(post.to_dict())
    assert post.backend == again.backend == again.encoder.backend == "onnx"
    q = "What does mitochondrial DNA encode?"
    torch_post = NormRankPostprocessor(encoder=encoder, top_n=5, weights={"a": 0.03})
    got = _ranked(again.postprocess_nodes(_nodes(ids[:12], demo_texts[:12]), query_str=q))
    want = _ranked(torch_post.postprocess_nodes(_nodes(ids[:12], demo_texts[:12]), query_str=q))
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)
    with pytest.raises(InvalidArgumentError, match="backend"):
        NormRankPostprocessor(backend="tensorrt")
    with pytest.raises(InvalidArgumentError, match="CPU"):
        NormRankPostprocessor(backend="onnx", device="cuda")
