"""LlamaIndex adapter: postprocessor, retriever and raw embedding, on real llama-index-core classes.

The query engine runs with LlamaIndex's ``MockLLM`` (no network) and the real bundled model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llama_index.core", reason='needs llama-index-core: pip install llama-index-normrank')

from llama_index.core import VectorStoreIndex  # noqa: E402
from llama_index.core.instrumentation import get_dispatcher  # noqa: E402
from llama_index.core.instrumentation.event_handlers import BaseEventHandler  # noqa: E402
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode  # noqa: E402

from llama_index.embeddings.normrank import NormRankEmbedding
from llama_index.postprocessor.normrank import NormRankPostprocessor
from llama_index.retrievers.normrank import NormRankRetriever  # noqa: E402
from normrank import ConfigError, InvalidArgumentError, Weights  # noqa: E402

EXPLAINED = {"score", "cosine", "norm_feature", "weight", "norm"}  # metadata["normrank"] holds these












def _nodes(ids, texts, embeddings=None, score=0.5, meta=False) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=i, text=t, metadata={"src": i} if meta else {},
                                        embedding=None if embeddings is None else list(map(float, embeddings[j]))),
                          score=score)
            for j, (i, t) in enumerate(zip(ids, texts))]


def _scores(result: list[NodeWithScore]) -> dict[str, float]:
    return {n.node.node_id: n.score for n in result}


def test_postprocessor_matches_the_index_arithmetic(index, ids, demo_texts, queries):
    """Re-scoring every document gives the index's own blended scores: no second formula."""
    # the nodes carry metadata; the index holds the bare text, so encode the bare text too
    post = NormRankPostprocessor.from_index(index, top_n=len(ids), metadata_mode=MetadataMode.NONE)
    for q in queries[:2]:
        out = post.postprocess_nodes(_nodes(ids, demo_texts, meta=True), query_str=q)
        hits = index.search(q, len(index))
        got = _scores(out)
        assert set(got) == set(ids)
        for h in hits:
            assert got[h.id] == pytest.approx(h.score, abs=2e-5)
        assert [n.score for n in out] == sorted((n.score for n in out), reverse=True)
        assert [n.node.node_id for n in out[:3]] == [h.id for h in hits[:3]]


def test_query_engine_sync(encoder, ids, demo_texts, demo_encoded):
    embed = NormRankEmbedding(encoder=encoder)
    nodes = [TextNode(id_=i, text=t, embedding=v.tolist()) for i, t, v in zip(ids, demo_texts, demo_encoded[0])]
    vindex = VectorStoreIndex(nodes, embed_model=embed)
    # what the postprocessor is handed: nodes without embeddings (SimpleVectorStore keeps them apart)
    assert all(n.node.embedding is None for n in vindex.as_retriever(similarity_top_k=3).retrieve("stars"))
    post = NormRankPostprocessor(encoder=encoder, top_n=3, weights=Weights(a=0.03))
    engine = vindex.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[post])
    q = "How long do massive stars live?"
    sync = engine.query(q).source_nodes
    assert len(sync) == 3
    assert sync[0].node.node_id.startswith("astro")
    for n in sync:
        assert EXPLAINED <= set(n.node.metadata["normrank"])
        assert n.score == pytest.approx(n.node.metadata["normrank"]["score"])
        assert "retrieval_score" in n.node.metadata["normrank"]
        # the explanation never reaches the LLM prompt
        assert "cosine" not in n.node.get_content(metadata_mode=MetadataMode.LLM)


async def test_query_engine_async_path(encoder, ids, demo_texts, demo_encoded):
    embed = NormRankEmbedding(encoder=encoder)
    nodes = [TextNode(id_=i, text=t, embedding=v.tolist()) for i, t, v in zip(ids, demo_texts, demo_encoded[0])]
    vindex = VectorStoreIndex(nodes, embed_model=embed)
    post = NormRankPostprocessor(encoder=encoder, top_n=3, weights=Weights(a=0.03))
    engine = vindex.as_query_engine(llm=MockLLM(), similarity_top_k=8, node_postprocessors=[post])
    q = "How long do massive stars live?"
    sync = engine.query(q).source_nodes
    got = (await engine.aquery(q)).source_nodes  # the async path gives the postprocessor no query embedding
    assert [n.node.node_id for n in got] == [n.node.node_id for n in sync]
    assert [n.score for n in got] == pytest.approx([n.score for n in sync], abs=1e-5)


def test_query_embedding_used_only_when_raw(encoder, ids, demo_texts):
    post = NormRankPostprocessor(encoder=encoder, top_n=10)
    q, other = "What does mitochondrial DNA encode?", "Which sorting algorithm is fast on average?"
    qv, ov = encoder.encode([q, other])
    base = _scores(post.postprocess_nodes(_nodes(ids, demo_texts), QueryBundle(q)))
    raw_same = _scores(post.postprocess_nodes(_nodes(ids, demo_texts), QueryBundle(q, embedding=qv.tolist())))
    unit_other = (ov / np.linalg.norm(ov)).tolist()
    unit = _scores(post.postprocess_nodes(_nodes(ids, demo_texts), QueryBundle(q, embedding=unit_other)))
    # a raw vector of other strings on purpose (HyDE's custom_embedding_strs) is used: it ranks for them
    hyde = _scores(post.postprocess_nodes(_nodes(ids, demo_texts), QueryBundle(
        q, custom_embedding_strs=[other], embedding=ov.tolist())))
    assert raw_same.keys() == base.keys() and unit.keys() == base.keys()
    assert all(raw_same[k] == pytest.approx(base[k], abs=1e-5) for k in base)
    assert all(unit[k] == pytest.approx(base[k], abs=1e-5) for k in base)  # unit vector ignored, query re-embedded
    assert hyde.keys() != base.keys()
    # a raw vector said to be q's that is not what the encoder gives for q (encoded above): that call
    # encodes q instead, with a warning; q's own vector is used again in the next
    raw_other = _scores(post.postprocess_nodes(_nodes(ids, demo_texts), QueryBundle(q, embedding=ov.tolist())))
    assert raw_other == pytest.approx(base, abs=1e-5)
    again = _scores(post.postprocess_nodes(_nodes(ids, demo_texts), QueryBundle(q, embedding=qv.tolist())))
    assert again == pytest.approx(base, abs=1e-5)


def test_node_embeddings_reused_when_raw(encoder, ids, demo_texts, demo_encoded):
    post = NormRankPostprocessor(encoder=encoder, top_n=16, cache_size=0)
    ids, demo_texts = ids[:16], demo_texts[:16]
    q = "How do vaccines work?"
    vecs = demo_encoded[0][:16]
    base = _scores(post.postprocess_nodes(_nodes(ids, demo_texts), query_str=q))
    given = _scores(post.postprocess_nodes(_nodes(ids, demo_texts, vecs), query_str=q))
    assert all(given[k] == pytest.approx(base[k], abs=1e-5) for k in base)
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    rolled = _scores(post.postprocess_nodes(_nodes(ids, demo_texts, np.roll(unit, 1, axis=0)), query_str=q))
    assert all(rolled[k] == pytest.approx(base[k], abs=1e-5) for k in base)  # unit vectors: text re-embedded
    out = post.postprocess_nodes(_nodes(ids, demo_texts, np.roll(vecs, 1, axis=0)), query_str=q)
    qv = encoder.encode([q])[0]
    for n in out:  # raw vectors are used as given, here each node carries its neighbour's vector
        j = (ids.index(n.node.node_id) - 1) % len(ids)
        cos = float(vecs[j] @ qv / np.linalg.norm(vecs[j]) / np.linalg.norm(qv))
        assert n.node.metadata["normrank"]["cosine"] == pytest.approx(cos, abs=1e-5)


def test_node_vectors_cached_by_id_and_content(encoder, ids, demo_texts, model_calls):
    post = NormRankPostprocessor(encoder=encoder, top_n=5)
    nodes = _nodes(ids[:6], demo_texts[:6])
    post.postprocess_nodes(nodes, query_str="stars")
    assert model_calls.texts == 6 + 1
    post.postprocess_nodes(nodes, query_str="galaxies")
    assert model_calls.texts == 6 + 1 + 1  # only the new query
    changed = _nodes(ids[:6], ["An edited text about comets.", *demo_texts[1:6]])
    post.postprocess_nodes(changed, query_str="galaxies")
    assert model_calls.texts == 6 + 2 + 2  # the edited node and the query


def test_callers_nodes_untouched_and_retrieval_score(encoder, ids, demo_texts):
    nodes = _nodes(ids[:8], demo_texts[:8], score=0.25, meta=True)
    before = [(n.score, n.node.model_dump()) for n in nodes]
    kept = NormRankPostprocessor(encoder=encoder, top_n=4).postprocess_nodes(nodes, query_str="stars")
    assert [(n.score, n.node.model_dump()) for n in nodes] == before
    assert len(kept) == 4 and all(n.node.metadata["normrank"]["retrieval_score"] == 0.25 for n in kept)
    assert all(n.node.metadata["src"] == n.node.node_id for n in kept)
    dropped = NormRankPostprocessor(encoder=encoder, top_n=4, keep_retrieval_score=False)
    assert all("retrieval_score" not in n.node.metadata["normrank"]
               for n in dropped.postprocess_nodes(nodes, query_str="stars"))


def test_candidate_calibration_vs_corpus_calibration(encoder, index, ids, demo_texts):
    """Without a calibration the candidates calibrate themselves; with one, features match the index's."""
    q = "How high is the tallest mountain?"
    sub = _nodes(ids[:12], demo_texts[:12])
    by_index = NormRankPostprocessor.from_index(index, top_n=12).postprocess_nodes(sub, query_str=q)
    feats = {h.id: h.norm_feature for h in index.search(q, len(index))}
    assert all(n.node.metadata["normrank"]["norm_feature"] == pytest.approx(feats[n.node.node_id], abs=1e-6)
               for n in by_index)
    own = NormRankPostprocessor(encoder=encoder, top_n=12, weights=Weights(a=0.03)).postprocess_nodes(sub, query_str=q)
    own_feats = np.array([n.node.metadata["normrank"]["norm_feature"] for n in own])
    assert abs(float(np.median(own_feats))) < 0.5  # standardised among the candidates
    fitted = NormRankPostprocessor(encoder=encoder, top_n=12).calibrate(demo_texts[:20])
    assert fitted.calibrator is not None and fitted.calibrator.n_fitted == 20


def test_empty_missing_and_bad_input(encoder, ids, demo_texts):
    post = NormRankPostprocessor(encoder=encoder, top_n=3)
    assert post.postprocess_nodes([], query_str="x") == []
    with pytest.raises(InvalidArgumentError, match="needs the query"):
        post.postprocess_nodes(_nodes(ids[:2], demo_texts[:2]))
    with pytest.raises(ValueError):
        NormRankPostprocessor(top_n=0)


async def test_async_matches_sync_and_emits_events(encoder, ids, demo_texts):
    class Collect(BaseEventHandler):
        events: list = []

        @classmethod
        def class_name(cls) -> str:
            return "Collect"

        def handle(self, event, **kwargs):
            self.events.append(event)

    handler = Collect()
    root = get_dispatcher()
    root.add_event_handler(handler)
    try:
        post = NormRankPostprocessor(encoder=encoder, top_n=3)
        sync = post.postprocess_nodes(_nodes(ids, demo_texts), query_str="vaccines")
        got = await post.apostprocess_nodes(_nodes(ids, demo_texts), query_str="vaccines")
    finally:
        root.event_handlers.remove(handler)
    assert [(n.node.node_id, n.score) for n in got] == [(n.node.node_id, n.score) for n in sync]
    starts = [e for e in handler.events if isinstance(e, ReRankStartEvent)]
    ends = [e for e in handler.events if isinstance(e, ReRankEndEvent)]
    assert len(starts) == len(ends) == 2
    assert starts[0].top_n == 3 and len(starts[0].nodes) == len(ids)
    assert [n.node.node_id for n in ends[0].nodes] == [n.node.node_id for n in sync]


def test_serialisation_round_trip(index, ids, demo_texts):
    post = NormRankPostprocessor.from_index(index, top_n=4)
    assert NormRankPostprocessor.class_name() == "NormRankPostprocessor"
    data = json.loads(json.dumps(post.to_dict()))
    assert data["class_name"] == "NormRankPostprocessor" and data["model"] is None
    again = NormRankPostprocessor.from_dict(data)
    assert again.weights == post.weights and again.calibrator == post.calibrator
    assert again.query_calibrator == post.query_calibrator
    q = "What is the exact speed of light?"
    a = post.postprocess_nodes(_nodes(ids, demo_texts), query_str=q)
    b = again.postprocess_nodes(_nodes(ids, demo_texts), query_str=q)
    assert [(n.node.node_id, round(n.score, 6)) for n in a] == [(n.node.node_id, round(n.score, 6)) for n in b]


async def test_first_stage_retriever(index, ids):
    retriever = NormRankRetriever(index, similarity_top_k=4)
    q = "When was the Peace of Westphalia signed?"
    out = retriever.retrieve(q)
    hits = index.search(q, 4)
    assert [n.node.node_id for n in out] == [h.id for h in hits]
    assert [n.score for n in out] == pytest.approx([h.score for h in hits])
    assert EXPLAINED <= set(out[0].node.metadata["normrank"])
    assert [n.node.node_id for n in await retriever.aretrieve(q)] == [h.id for h in hits]
    assert len(NormRankRetriever(index, similarity_top_k=500).retrieve(q)) == len(index)
    with pytest.raises(InvalidArgumentError):
        NormRankRetriever(index, similarity_top_k=0)
    with pytest.raises(InvalidArgumentError, match="index must be"):
        NormRankRetriever(object())


def test_retriever_builders(encoder, tmp_path, index):
    from llama_index.core import Document

    docs = [Document(text="Insulin lowers blood sugar.", id_="ins", metadata={"k": 1}),
            Document(text="The Nile flows north.", id_="nile")]
    r = NormRankRetriever.from_documents(docs, similarity_top_k=1, encoder=encoder)
    [hit] = r.retrieve("blood glucose")
    assert hit.node.node_id == "ins" and hit.node.metadata["k"] == 1
    index.save(tmp_path / "idx")
    r2 = NormRankRetriever.from_config({"store": {"path": str(tmp_path / "idx")}, "llamaindex": {"similarity_top_k": 2}})
    assert r2.similarity_top_k == 2 and len(r2.index) == len(index)


def test_postprocessor_from_config(tmp_path, index):
    with pytest.raises(ConfigError, match="llamaindex.calibration"):
        NormRankPostprocessor.from_config({"llamaindex": {"calibration": "index"}})
    p = NormRankPostprocessor.from_config({"llamaindex": {"top_n": 7}, "scoring": {"a": 0.05}})
    assert p.top_n == 7 and p.weights == Weights(a=0.05) and p.calibrator is None
    index.save(tmp_path / "idx")
    p2 = NormRankPostprocessor.from_config({"store": {"path": str(tmp_path / "idx")}})
    assert p2.calibrator == index.calibrator and p2.weights == index.weights


def test_raw_embedding_model(encoder):
    embed = NormRankEmbedding(encoder=encoder)
    texts = ["A short text.", "A longer text about glaciers carving valleys over millennia."]
    vecs = np.array(embed.get_text_embedding_batch(texts))
    np.testing.assert_allclose(vecs, encoder.encode(texts), rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(np.linalg.norm(vecs, axis=1) - 1.0) > 0.1)
    np.testing.assert_allclose(embed.get_query_embedding(texts[0]), vecs[0], rtol=1e-5, atol=1e-6)
    assert NormRankEmbedding.class_name() == "NormRankEmbedding"


def test_a_postprocessor_built_on_an_index_follows_its_weights(encoder, ids, demo_texts):
    """Built with ``from_index`` it copied the index's weights and calibrations once; after ``set_weights``
    (or ``fit``, here or by another process on a pgvector table) the index ranked with the new blend and the
    postprocessor with the old one. It reads them on every call now; weights given to it stay its own."""
    from normrank import NormIndex

    index = NormIndex(encoder, weights=Weights(a=0.05))
    index.add_texts(demo_texts, ids=ids)
    follows = NormRankPostprocessor.from_index(index, top_n=len(ids))
    keeps = NormRankPostprocessor.from_index(index, top_n=len(ids), weights=Weights(a=0.05))
    query = "vaccines"
    before = [n.node.node_id for n in keeps.postprocess_nodes(_nodes(ids, demo_texts), query_str=query)]
    index.set_weights(Weights(a=-0.3))
    got = [n.node.node_id for n in follows.postprocess_nodes(_nodes(ids, demo_texts), query_str=query)]
    assert got == [h.id for h in index.search(query, len(ids))] != before
    assert [n.node.node_id for n in keeps.postprocess_nodes(_nodes(ids, demo_texts), query_str=query)] == before
