"""``NormRankEmbedding`` and ``NormRankRetriever`` on the real llama-index-core classes and the real model:
async embedding off the event loop, unknown arguments refused, the warning for stores that rank raw
vectors by their own metric, and adapters built on an empty index."""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings

import faiss
import numpy as np
import pytest

pytest.importorskip("llama_index.core", reason="needs llama-index-core: pip install llama-index-normrank")

from llama_index.core import Document, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.schema import MetadataMode  # noqa: E402

from llama_index.embeddings.normrank import NormRankEmbedding  # noqa: E402
from llama_index.embeddings.normrank.base import RawVectorStoreWarning, raw_metric_warning  # noqa: E402
from llama_index.retrievers.normrank import NormRankRetriever  # noqa: E402
from llama_index.vector_stores.normrank import NormRankVectorStore  # noqa: E402
from normrank import NormIndex, Weights  # noqa: E402
from normrank.errors import EmptyCorpusError, InvalidArgumentError  # noqa: E402

LONG = " ".join(["The Peace of Westphalia ended the Thirty Years' War in 1648."] * 20)


@pytest.fixture()
def embed(encoder) -> NormRankEmbedding:
    return NormRankEmbedding(encoder=encoder)


# ---------------------------------------------------------------- async off the loop
@pytest.mark.asyncio
async def test_async_embedding_keeps_the_event_loop_running(embed, encoder, monkeypatch):
    """A ticking coroutine advances while the encoder is busy: the encoding runs in a worker thread.
    (Run on the loop, the encoder would hold it for the whole call and the ticker could not tick.)"""
    busy = threading.Event()
    real = encoder.encode

    def spied(texts, **kw):  # the real encoder, with a flag saying it is running
        busy.set()
        try:
            return real(texts, **kw)
        finally:
            busy.clear()

    monkeypatch.setattr(encoder, "encode", spied)
    ticks_while_busy = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks_while_busy
        while not stop:
            if busy.is_set():
                ticks_while_busy += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        for call in (embed.aget_text_embedding(LONG), embed.aget_query_embedding(LONG),
                     embed.aget_text_embedding_batch([LONG, LONG[:200]])):
            before = ticks_while_busy
            out = await call
            assert ticks_while_busy > before
            assert np.asarray(out).size > 0
    finally:
        stop = True
        await task
    # and the answers are the sync ones
    assert await embed.aget_text_embedding(LONG) == pytest.approx(embed.get_text_embedding(LONG), abs=1e-6)
    assert await embed.aget_query_embedding("speed of light") == pytest.approx(
        embed.get_query_embedding("speed of light"), abs=1e-6)


def test_embeddings_are_raw(embed):
    v = np.asarray(embed.get_text_embedding(LONG))
    assert abs(np.linalg.norm(v) - 1.0) > 0.05  # not normalised: the norm is kept


# ---------------------------------------------------------------- arguments
def test_unknown_keyword_arguments_are_refused(encoder):
    with pytest.raises(InvalidArgumentError, match="unknown keyword arguments"):
        NormRankEmbedding(encoder=encoder, normalize=True)
    with pytest.raises(InvalidArgumentError, match="either an encoder"):
        NormRankEmbedding(encoder=encoder, device="cpu")
    with pytest.raises(InvalidArgumentError, match="RawEncoder"):
        NormRankEmbedding(encoder="all-MiniLM-L6-v2")  # type: ignore[arg-type]
    e = NormRankEmbedding(encoder=encoder, num_workers=2)
    assert e.num_workers == 2
    again = NormRankEmbedding.from_dict(e.to_dict())  # LlamaIndex's own round trip passes model_name back
    assert again.model_name == e.model_name and again.get_text_embedding("x y") == pytest.approx(
        e.get_text_embedding("x y"), abs=1e-6)


def test_to_dict_and_from_dict_keep_the_encoders_own_settings():
    """``to_dict`` held only model, device and backend: an encoder with ``max_seq_length=64`` or norm pooling
    came back as the default one (other vectors, silently), and one on a model folder did not come back."""
    from normrank import RawEncoder
    from normrank.pooling import PooledEncoder

    text = "a long sentence about mountains and rivers " * 20
    for enc in (RawEncoder(max_seq_length=64), PooledEncoder(pooling="norm")):
        e = NormRankEmbedding(encoder=enc)
        for again in (NormRankEmbedding.from_dict(e.to_dict()), NormRankEmbedding.from_json(e.to_json())):
            assert again.encoder.describe() == enc.describe()
            np.testing.assert_allclose(again.get_text_embedding(text), e.get_text_embedding(text), atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="encoder_settings with device"):
        NormRankEmbedding(device="cuda", encoder_settings=RawEncoder(max_seq_length=64).describe())


# ---------------------------------------------------------------- other stores
def test_a_store_ranking_raw_vectors_by_its_own_metric_is_warned_about_once(encoder, embed):
    docs = [Document(text=t) for t in ("Insulin lowers blood sugar.", "The Nile flows north.", "Rome fell in 476.")]
    with pytest.warns(RawVectorStoreWarning, match="SimpleVectorStore ranks .* plain cosine"):
        index = VectorStoreIndex.from_documents(docs, embed_model=embed)  # the default store
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index.as_retriever(similarity_top_k=1).retrieve("blood glucose")  # once per store type: no repeat
        store = NormRankVectorStore(encoder=encoder)
        fresh = NormRankEmbedding(encoder=encoder)
        VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                        embed_model=fresh).as_retriever(similarity_top_k=1).retrieve("Nile")
        fresh.get_text_embedding("not called by an index")


def test_the_faiss_warning_is_true_raw_inner_product_is_not_cosine(encoder, demo_encoded):
    """What the warning says of FAISS: IndexFlatIP on these raw vectors ranks by the raw dot product, which
    differs from cosine on the real model (so a FaissVectorStore with NormRankEmbedding is not cosine)."""
    assert "raw dot product" in raw_metric_warning("FaissVectorStore")
    vecs = demo_encoded[0]
    queries = encoder.encode(["When was the Peace of Westphalia signed?", "How does insulin work?",
                              "What do volcanoes do?"])
    raw = faiss.IndexFlatIP(vecs.shape[1])
    raw.add(vecs)
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    cos = faiss.IndexFlatIP(vecs.shape[1])
    cos.add(unit)
    _, by_raw = raw.search(queries, 10)
    _, by_cos = cos.search(queries / np.linalg.norm(queries, axis=1, keepdims=True), 10)
    assert any(list(a) != list(b) for a, b in zip(by_raw, by_cos))


# ---------------------------------------------------------------- the retriever
def test_retriever_on_an_empty_index_warns_and_refuses_unless_allowed(encoder):
    with pytest.warns(UserWarning, match="empty normrank index"):
        retriever = NormRankRetriever(NormIndex(encoder), similarity_top_k=3)
    with pytest.raises(EmptyCorpusError, match="allow_empty=True"):
        retriever.retrieve("anything")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        allowed = NormRankRetriever(NormIndex(encoder), similarity_top_k=3, allow_empty=True)
    assert allowed.retrieve("anything") == []


@pytest.mark.asyncio
async def test_retriever_on_an_empty_config_index_fails_loudly(tmp_path):
    with pytest.warns(UserWarning, match="store.path"):
        retriever = NormRankRetriever.from_config({"store": {"path": str(tmp_path / "nothing-here")}})
    with pytest.raises(EmptyCorpusError):
        await retriever.aretrieve("anything")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        allowed = NormRankRetriever.from_config({"store": {"path": str(tmp_path / "nothing-here")}}, allow_empty=True)
    assert await allowed.aretrieve("anything") == []


def test_retriever_explanation_never_overwrites_user_keys(encoder, caplog):
    user = {"weight": "heavy", "norm": "ISO", "cosine": "law", "relevance_score": 7}
    index = NormIndex(encoder, weights=Weights(a=0.05))
    index.add_texts(["Steel beams carry heavy loads.", "The Nile flows north.", "Insulin lowers blood sugar."],
                    ids=["steel", "nile", "ins"], metadatas=[user, {"normrank": "my own"}, {}])
    out = NormRankRetriever(index, similarity_top_k=3).retrieve("bridge loads")
    by_id = {n.node.node_id: n for n in out}
    steel = by_id["steel"]
    assert {k: steel.node.metadata[k] for k in user} == user
    assert steel.node.metadata["normrank"]["score"] == pytest.approx(steel.score)
    assert "normrank" not in steel.node.get_content(metadata_mode=MetadataMode.LLM)
    assert "heavy" in steel.node.get_content(metadata_mode=MetadataMode.LLM)
    # a user's own "normrank" key is kept (and not hidden); the explanation is left out, with a logged note
    assert by_id["nile"].node.metadata["normrank"] == "my own"
    assert "my own" in by_id["nile"].node.get_content(metadata_mode=MetadataMode.LLM)
    with caplog.at_level(logging.WARNING):
        NormRankRetriever(index, similarity_top_k=3).retrieve("river")
    assert "own metadata key 'normrank'" in caplog.text
    with pytest.raises(InvalidArgumentError, match="reserves"):
        NormRankRetriever.from_texts(["a text"], metadatas=[{"normrank": 1}], encoder=encoder)


def test_backend_is_a_setting_of_the_embedding(encoder):
    """``backend`` builds the encoder and survives to_dict/from_dict; with an encoder it is refused."""
    pytest.importorskip("onnxruntime", reason="the ONNX backends need normrank[onnx]")
    emb = NormRankEmbedding(backend="onnx")
    again = NormRankEmbedding.from_dict(emb.to_dict())
    assert emb.encoder.backend == again.encoder.backend == again.backend == "onnx"
    text = "raw norms carry specificity"
    np.testing.assert_allclose(again.get_text_embedding(text), encoder.encode([text])[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(InvalidArgumentError):
        NormRankEmbedding(encoder=encoder, backend="onnx")
    with pytest.raises(InvalidArgumentError, match="backend"):
        NormRankEmbedding(backend="openvino")
