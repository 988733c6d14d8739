"""LangChain adapter: the standard retriever conformance suite, then normrank's own contract.

Everything runs on the real bundled model, a real FAISS index and real langchain-core classes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("langchain_core", reason='needs langchain-core: pip install langchain-normrank')

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402
from langchain_tests.integration_tests import RetrieversIntegrationTests  # noqa: E402

from langchain_normrank import NormRankEmbeddings, NormRankRetriever  # noqa: E402
from normrank.datasets import demo_rows  # noqa: E402
from normrank import EmptyCorpusError, InvalidArgumentError, NormIndex, Weights  # noqa: E402




@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return demo_rows("demo_corpus.jsonl")


@pytest.fixture(scope="module")
def queries() -> list[str]:
    return [q["text"] for q in demo_rows("demo_queries.jsonl")]


def _build(encoder, corpus, demo_texts, demo_encoded, weights: Weights) -> NormIndex:
    vecs, counts = demo_encoded
    idx = NormIndex(encoder, weights=weights)
    idx.add_vectors(vecs, counts, ids=[d["_id"] for d in corpus], texts=demo_texts,
                    metadatas=[{"topic": d["_id"].split("-")[0], "title": d["title"]} for d in corpus])
    return idx


@pytest.fixture(scope="module")
def index(encoder, corpus, demo_texts, demo_encoded) -> NormIndex:
    """The demo corpus with a non-trivial blend, so scores differ from plain cosine."""
    return _build(encoder, corpus, demo_texts, demo_encoded, Weights(a=0.03))


class TestNormRankRetrieverStandard(RetrieversIntegrationTests):
    """langchain-tests' RetrieversIntegrationTests, unchanged."""

    _index: NormIndex | None = None

    @pytest.fixture(autouse=True)
    def _use_index(self, index: NormIndex) -> None:
        type(self)._index = index

    @property
    def retriever_constructor(self) -> type[NormRankRetriever]:
        return NormRankRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"index": self._index, "k": 4}

    @property
    def retriever_query_example(self) -> str:
        return "How long do massive stars live?"


def test_documents_carry_ids_scores_and_explanation(index, queries):
    retriever = NormRankRetriever(index=index, k=5)
    for q in queries[:3]:
        docs = retriever.invoke(q)
        hits = index.search(q, 5)
        assert [d.id for d in docs] == [h.id for h in hits]
        for d, h in zip(docs, hits):
            m = d.metadata["normrank"]
            assert d.page_content == h.text
            assert m["score"] == pytest.approx(h.score)
            assert m["cosine"] == pytest.approx(h.cosine)
            assert m["norm_feature"] == pytest.approx(h.norm_feature)
            assert m["weight"] == pytest.approx(0.03)
            assert m["norm"] == pytest.approx(h.norm)
            assert m["score"] == pytest.approx(m["cosine"] + m["weight"] * m["norm_feature"], abs=1e-5)
            assert d.metadata["topic"] == d.id.split("-")[0]  # stored metadata kept
            assert set(d.metadata) == {"topic", "title", "normrank"}  # one key added, nothing overwritten
        scores = [d.metadata["normrank"]["score"] for d in docs]
        assert scores == sorted(scores, reverse=True)


def test_blend_reorders_relative_to_cosine(encoder, corpus, demo_texts, demo_encoded, queries):
    """The retriever serves the index's blend, not cosine: with a large weight some list changes."""
    cosine = NormRankRetriever(index=_build(encoder, corpus, demo_texts, demo_encoded, Weights()), k=10)
    blended = NormRankRetriever(index=_build(encoder, corpus, demo_texts, demo_encoded, Weights(a=0.3)), k=10)
    changed = sum([d.id for d in cosine.invoke(q)] != [d.id for d in blended.invoke(q)] for q in queries[:6])
    assert changed > 0


def test_k_at_construction_and_call_and_clamped(index):
    retriever = NormRankRetriever(index=index, k=2)
    assert len(retriever.invoke("stars")) == 2
    assert len(retriever.invoke("stars", k=7)) == 7
    assert len(retriever.invoke("stars")) == 2  # the override does not stick
    assert len(retriever.invoke("stars", k=10_000)) == len(index)
    with pytest.raises(InvalidArgumentError, match="k must be"):
        retriever.invoke("stars", k=0)
    with pytest.raises(ValueError):
        NormRankRetriever(index=index, k=0)


def test_filter_at_construction_and_call(index):
    astro = NormRankRetriever(index=index, k=3, filter={"topic": "astro"})
    assert {d.metadata["topic"] for d in astro.invoke("vaccines")} == {"astro"}
    other = astro.invoke("vaccines", filter={"topic": ["bio", "med"]})
    assert other and {d.metadata["topic"] for d in other} <= {"bio", "med"}


async def test_async_and_batch_match_invoke(index, queries):
    retriever = NormRankRetriever(index=index, k=3)
    expected = [[(d.id, d.metadata["normrank"]["score"]) for d in retriever.invoke(q)] for q in queries[:3]]
    single = await retriever.ainvoke(queries[0])
    assert [(d.id, d.metadata["normrank"]["score"]) for d in single] == expected[0]
    for got in (retriever.batch(queries[:3]), await retriever.abatch(queries[:3])):
        assert [[(d.id, d.metadata["normrank"]["score"]) for d in docs] for docs in got] == expected
    assert len((await retriever.ainvoke(queries[0], k=1))) == 1


def test_from_documents_keeps_ids_and_does_not_touch_the_documents(encoder):
    docs = [Document(page_content="Insulin lowers blood sugar.", metadata={"src": "a"}, id="ins"),
            Document(page_content="The Nile flows north into the Mediterranean.", metadata={"src": "b"})]
    before = [d.model_dump() for d in docs]
    retriever = NormRankRetriever.from_documents(docs, k=2, encoder=encoder)
    assert [d.model_dump() for d in docs] == before
    out = retriever.invoke("What lowers blood glucose?")
    assert out[0].id == "ins" and out[0].metadata["src"] == "a"
    assert out[1].id and out[1].id != "ins"  # a generated id, returned as Document.id
    out[0].metadata["src"] = "changed"
    assert retriever.invoke("What lowers blood glucose?")[0].metadata["src"] == "a"  # copies, not the store's


def test_from_texts(encoder):
    retriever = NormRankRetriever.from_texts(["alpha particles", "beta decay", "gamma rays"], ids=["a", "b", "g"],
                                             metadatas=[{"n": 1}, {"n": 2}, {"n": 3}], k=1, encoder=encoder)
    [doc] = retriever.invoke("beta decay")
    assert doc.id == "b" and doc.metadata["n"] == 2


def test_empty_index_warns_and_raises_unless_allowed(encoder, tmp_path):
    with pytest.warns(UserWarning, match="empty index"):
        retriever = NormRankRetriever(index=NormIndex(encoder), k=3)
    with pytest.raises(EmptyCorpusError, match="allow_empty=True"):
        retriever.invoke("anything")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert NormRankRetriever(index=NormIndex(encoder), k=3, allow_empty=True).invoke("anything") == []
    with pytest.warns(UserWarning, match="empty index"):
        misplaced = NormRankRetriever.from_config({"store": {"path": str(tmp_path / "typo")}})
    with pytest.raises(EmptyCorpusError, match="typo"):
        misplaced.invoke("anything")


async def test_empty_index_raises_in_async_too(encoder):
    with pytest.warns(UserWarning):
        retriever = NormRankRetriever(index=NormIndex(encoder))
    with pytest.raises(EmptyCorpusError):
        await retriever.ainvoke("anything")


def test_vectorstore_style_calls_work_or_name_the_way(index, encoder):
    retriever = NormRankRetriever(index=index, k=4)
    q = "How long do massive stars live?"
    expected = [h.id for h in index.search(q, 4)]
    assert [d.id for d in retriever.invoke(q, search_kwargs={"k": 2})] == expected[:2]
    astro = retriever.invoke(q, search_kwargs={"filter": {"topic": "astro"}})
    assert {d.metadata["topic"] for d in astro} == {"astro"}
    with pytest.raises(InvalidArgumentError, match="NormRankVectorStore"):
        retriever.invoke(q, search_kwargs={"k": 2, "fetch_k": 10})
    with pytest.raises(InvalidArgumentError, match="unknown argument"):
        retriever.invoke(q, top_k=2)
    texts = ["alpha particles", "beta decay", "gamma rays"]
    built = NormRankRetriever.from_texts(texts, NormRankEmbeddings(encoder=encoder), [{"n": i} for i in range(3)],
                                         k=1)
    [doc] = built.invoke("beta decay")
    assert doc.page_content == "beta decay" and doc.metadata["n"] == 1
    docs = [Document(page_content=t) for t in texts]
    assert NormRankRetriever.from_documents(docs, NormRankEmbeddings(encoder=encoder), k=1).invoke(
        "gamma rays")[0].page_content == "gamma rays"
    with pytest.raises(InvalidArgumentError, match="NormRankVectorStore.from_texts"):
        NormRankRetriever.from_texts(texts, DeterministicFakeEmbedding(size=6))


def test_tracing_params(index):
    params = NormRankRetriever(index=index)._get_ls_params()
    assert params["ls_retriever_name"] == "normrank"
    assert params["ls_vector_store_provider"] == "NormIndex"
    assert params["ls_embedding_provider"] == "RawEncoder"
    assert params["ls_embedding_model"] == index.encoder.model_name


def test_from_config_loads_a_saved_index(index, tmp_path):
    index.save(tmp_path / "idx")
    retriever = NormRankRetriever.from_config({"store": {"path": str(tmp_path / "idx")}, "langchain": {"k": 3}})
    assert retriever.k == 3
    q = "How do vaccines work?"
    assert [d.id for d in retriever.invoke(q)] == [h.id for h in index.search(q, 3)]


def test_unknown_constructor_argument_is_refused(index):
    with pytest.raises(ValueError, match="kk"):
        NormRankRetriever(index=index, kk=3)


async def test_raw_embeddings(encoder):
    emb = NormRankEmbeddings(encoder=encoder)
    texts = ["A short text.", "A much longer text about the history of the Roman Empire and its roads."]
    vecs = np.array(emb.embed_documents(texts))
    assert vecs.shape == (2, encoder.dim)
    norms = np.linalg.norm(vecs, axis=1)
    assert np.all(np.abs(norms - 1.0) > 0.1)  # raw, not unit length
    np.testing.assert_allclose(vecs, encoder.encode(texts), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(emb.embed_query(texts[0]), vecs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(await emb.aembed_query(texts[0]), vecs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(await emb.aembed_documents(texts), vecs, rtol=1e-5, atol=1e-6)
    assert emb.embed_documents([]) == []
    with pytest.raises(InvalidArgumentError, match="either an encoder"):
        NormRankEmbeddings(model="x", encoder=encoder)


def test_index_must_be_searchable():
    with pytest.raises(ValueError, match="index"):
        NormRankRetriever(index=object(), k=2)


def test_embeddings_take_a_backend(encoder):
    pytest.importorskip("onnxruntime", reason="the ONNX backends need normrank[onnx]")
    emb = NormRankEmbeddings(backend="onnx")
    assert emb.encoder.backend == "onnx"
    text = "raw norms carry specificity"
    np.testing.assert_allclose(emb.embed_query(text), encoder.encode([text])[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(InvalidArgumentError):
        NormRankEmbeddings(encoder=encoder, backend="onnx")
    with pytest.raises(InvalidArgumentError, match="backend"):
        NormRankEmbeddings(backend="openvino")
