"""LangChain ``NormRankVectorStore``: langchain-tests' standard suites (FAISS and pgvector), then
normrank's own contract on the real bundled model: the blended order served through every
LangChain entry point (scored search, retrievers, MMR, a RAG chain, the indexing API) equals
``NormIndex.search``, metadata is never overwritten, and nothing stored is lost on bad input.
"""

from __future__ import annotations

import asyncio
import re
import threading
import warnings
from typing import Any

import numpy as np
import pytest

pytest.importorskip("langchain_core", reason="needs langchain-core: pip install langchain-normrank")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings  # noqa: E402
from langchain_core.indexing import InMemoryRecordManager, aindex, index  # noqa: E402
from langchain_core.language_models.fake_chat_models import ParrotFakeChatModel  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.runnables import RunnablePassthrough  # noqa: E402
from langchain_tests.integration_tests import VectorStoreIntegrationTests  # noqa: E402

from langchain_normrank import NormRankEmbeddings, NormRankVectorStore, NormRankVectorStoreRetriever  # noqa: E402
from langchain_normrank.vectorstores import approximate_token_counts, blended_relevance  # noqa: E402
from normrank import NormIndex, Weights  # noqa: E402
from normrank.datasets import demo_rows  # noqa: E402
from normrank.testing import index_deleting_its_top_hit  # noqa: E402
from normrank.errors import (  # noqa: E402
    EmptyCorpusError,
    IndexFormatError,
    InvalidArgumentError,
    InvalidIdError,
    InvalidVectorError,
    UnitNormError,
)

WEIGHTS = Weights(a=0.05)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return demo_rows("demo_corpus.jsonl")


@pytest.fixture(scope="module")
def queries() -> list[str]:
    return [q["text"] for q in demo_rows("demo_queries.jsonl")]


def _metas(corpus: list[dict]) -> list[dict]:
    # User keys that collide with the explanation's names, to show none is overwritten.
    return [{"topic": d["_id"].split("-")[0], "title": d["title"], "weight": "user", "score": -1} for d in corpus]


@pytest.fixture(scope="module")
def blended_index(encoder, corpus, demo_texts, demo_encoded) -> NormIndex:
    vecs, counts = demo_encoded
    idx = NormIndex(encoder, weights=WEIGHTS)
    idx.add_vectors(vecs, counts, ids=[d["_id"] for d in corpus], texts=demo_texts, metadatas=_metas(corpus))
    return idx


@pytest.fixture
def store(encoder, corpus, demo_texts, demo_encoded) -> NormRankVectorStore:
    """A fresh store over a copy of the demo corpus with a non-trivial blend."""
    vecs, counts = demo_encoded
    idx = NormIndex(encoder, weights=WEIGHTS)
    idx.add_vectors(vecs, counts, ids=[d["_id"] for d in corpus], texts=demo_texts, metadatas=_metas(corpus))
    return NormRankVectorStore(NormRankEmbeddings(encoder=encoder), index=idx)


@pytest.fixture
def pg_table(pg_table_factory):
    """A fresh table name; its tables are dropped after the test."""
    return pg_table_factory("lc")


# ---------------------------------------------------------------- the standard suites, unchanged
class TestNormRankVectorStoreStandard(VectorStoreIntegrationTests):
    """langchain-tests' VectorStoreIntegrationTests (sync and async) over an in-memory NormIndex."""

    @pytest.fixture()
    def vectorstore(self) -> NormRankVectorStore:
        return NormRankVectorStore(self.get_embeddings())


class TestNormRankVectorStorePgvectorStandard(VectorStoreIntegrationTests):
    """The same suite over the pgvector backend on a real PostgreSQL, one fresh table per test."""

    @pytest.fixture()
    def vectorstore(self, pg_dsn, pg_table):
        from normrank.pgvector_store import PgVectorNormIndex

        idx = PgVectorNormIndex(pg_dsn, pg_table)
        try:
            yield NormRankVectorStore(self.get_embeddings(), index=idx, allow_empty=True)
        finally:
            idx.close()


# ---------------------------------------------------------------- the blend, through every entry point
def _ids(docs) -> list[str]:
    return [d.id for d in docs]


def test_scored_search_is_the_index_blend_with_its_explanation(store, blended_index, queries):
    cosine_order_differs = 0
    for q in queries[:4]:
        hits = blended_index.search(q, 5)
        assert _ids(store.similarity_search(q, k=5)) == [h.id for h in hits]
        pairs = store.similarity_search_with_score(q, k=5)
        assert [d.id for d, _ in pairs] == [h.id for h in hits]
        for (doc, score), h in zip(pairs, hits):
            assert score == pytest.approx(h.score)
            assert doc.metadata["normrank"] == pytest.approx(h.explain())
            assert doc.metadata["normrank"]["score"] == pytest.approx(
                h.cosine + WEIGHTS.a * h.norm_feature, abs=1e-5)
            assert doc.metadata["weight"] == "user" and doc.metadata["score"] == -1  # user keys kept
            assert doc.page_content == h.text
        every = blended_index.search(q, len(blended_index))
        by_cosine = [h.id for h in sorted(every, key=lambda h: -h.cosine)[:5]]
        cosine_order_differs += by_cosine != [h.id for h in hits]
    assert cosine_order_differs > 0  # the weight is non-trivial: the store serves the blend, not cosine


def test_plain_search_and_get_return_documents_exactly_as_stored(store, corpus):
    doc = store.similarity_search("How long do massive stars live?", k=1)[0]
    assert "normrank" not in doc.metadata and doc.metadata["weight"] == "user"
    [got] = store.get_by_ids([doc.id])
    assert got == doc
    assert store.get_by_ids([corpus[2]["_id"], "missing", corpus[0]["_id"], corpus[2]["_id"]]) == \
        store.get_by_ids([corpus[2]["_id"], corpus[0]["_id"]])
    assert _ids(store.get_by_ids([corpus[2]["_id"], corpus[0]["_id"]])) == [corpus[2]["_id"], corpus[0]["_id"]]
    got.metadata["weight"] = "changed"
    assert store.get_by_ids([doc.id])[0].metadata["weight"] == "user"  # copies, not the store's


def test_filter_k_and_score_threshold(store, blended_index):
    q = "How do vaccines work?"
    astro = store.similarity_search(q, k=3, filter={"topic": "astro"})
    assert len(astro) == 3 and {d.metadata["topic"] for d in astro} == {"astro"}
    assert _ids(astro) == [h.id for h in blended_index.search(q, 3, filter={"topic": "astro"})]
    assert len(store.similarity_search(q, k=10_000)) == len(blended_index)  # k clamped to the store
    with pytest.raises(InvalidArgumentError, match="k must be"):
        store.similarity_search(q, k=0)
    assert len(store.similarity_search(q, k=np.int64(2))) == 2
    with pytest.raises(InvalidArgumentError, match="top_k"):
        store.similarity_search(q, top_k=3)
    scored = store.similarity_search_with_relevance_scores(q, k=10)
    assert all(0.0 <= r <= 1.0 for _, r in scored)
    assert [r for _, r in scored] == [blended_relevance(h.score) for h in blended_index.search(q, 10)]
    cut = sorted(r for _, r in scored)[5]
    kept = store.similarity_search_with_relevance_scores(q, k=10, score_threshold=cut)
    assert [d.id for d, _ in kept] == [d.id for d, r in scored if r >= cut]


def test_search_by_vector_equals_search_by_text(store, encoder):
    q = "Why is the sky blue?"
    vec = encoder.encode([q])[0].tolist()
    assert _ids(store.similarity_search_by_vector(vec, k=4)) == _ids(store.similarity_search(q, k=4))
    by_vec = store.similarity_search_with_score_by_vector(vec, k=4)
    by_text = store.similarity_search_with_score(q, k=4)
    assert [s for _, s in by_vec] == pytest.approx([s for _, s in by_text], abs=1e-5)


def test_as_retriever_search_types_carry_explanations(store, blended_index):
    q = "What causes earthquakes?"
    expected = [h.id for h in blended_index.search(q, 3)]
    retriever = store.as_retriever(search_kwargs={"k": 3})
    assert isinstance(retriever, NormRankVectorStoreRetriever)
    docs = retriever.invoke(q)
    assert _ids(docs) == expected and all("score" in d.metadata["normrank"] for d in docs)
    assert _ids(retriever.invoke(q, k=2)) == expected[:2]
    assert _ids(retriever.invoke(q, search_kwargs={"k": 1})) == expected[:1]
    flt = store.as_retriever(search_kwargs={"k": 2, "filter": {"topic": ["bio", "med"]}}).invoke(q)
    assert {d.metadata["topic"] for d in flt} <= {"bio", "med"} and len(flt) == 2
    threshold = blended_relevance(blended_index.search(q, 3)[-1].score)
    above = store.as_retriever(search_type="similarity_score_threshold",
                               search_kwargs={"k": 10, "score_threshold": threshold}).invoke(q)
    assert _ids(above) == expected
    mmr = store.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 10, "lambda_mult": 1.0})
    assert _ids(mmr.invoke(q)) == expected  # relevance only: the blended order itself
    with pytest.raises(ValueError, match="search_type"):
        store.as_retriever(search_type="nearest")


def test_mmr_diversifies_within_the_blended_candidates(store, blended_index, queries):
    changed = 0
    for q in queries[:4]:
        top = [h.id for h in blended_index.search(q, 12)]
        relevance_only = store.max_marginal_relevance_search(q, k=4, fetch_k=12, lambda_mult=1.0)
        assert _ids(relevance_only) == top[:4]
        diverse = store.max_marginal_relevance_search(q, k=4, fetch_k=12, lambda_mult=0.2)
        assert len(set(_ids(diverse))) == 4 and set(_ids(diverse)) <= set(top)
        assert _ids(diverse)[0] == top[0]  # the most relevant document always comes first
        changed += _ids(diverse) != top[:4]
        # a NumPy number (what a config or an array gives) is taken, as InMemoryVectorStore takes it
        assert _ids(store.max_marginal_relevance_search(q, k=4, fetch_k=12, lambda_mult=np.float32(0.2))) == \
            _ids(diverse)
    assert changed > 0
    for bad in (2, np.float64(1.5), True, np.bool_(True), "0.5"):
        with pytest.raises(InvalidArgumentError, match="lambda_mult"):
            store.max_marginal_relevance_search("x y", lambda_mult=bad)



def test_mmr_picks_among_fetch_k_only(store, blended_index, queries):
    """As in LangChain's own stores, MMR picks among the ``fetch_k`` fetched: ``fetch_k`` below ``k`` gives
    ``fetch_k`` documents, all from the blended top ``fetch_k`` (it gave ``k``, some from further down)."""
    q = queries[0]
    top = [h.id for h in blended_index.search(q, 12)]
    for fetch_k in (1, 2, 3):
        got = _ids(store.max_marginal_relevance_search(q, k=6, fetch_k=fetch_k, lambda_mult=0.3))
        assert len(got) == fetch_k and set(got) == set(top[:fetch_k]) and got[0] == top[0]
        retriever = store.as_retriever(search_type="mmr", search_kwargs={"k": 6, "fetch_k": fetch_k})
        assert set(_ids(retriever.invoke(q))) == set(top[:fetch_k])
    vector = store.embeddings.embed_query(q)
    assert set(_ids(store.max_marginal_relevance_search_by_vector(vector, k=6, fetch_k=2))) == set(top[:2])


# ---------------------------------------------------------------- writing
def test_add_documents_upserts_and_keeps_the_caller_documents(encoder):
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder))
    docs = [Document(page_content="Insulin lowers blood sugar.", metadata={"src": "a"}, id="ins"),
            Document(page_content="The Nile flows north into the Mediterranean.", metadata={"src": "b"})]
    before = [d.model_dump() for d in docs]
    ids = store.add_documents(docs)
    assert ids[0] == "ins" and ids[1] and [d.model_dump() for d in docs] == before
    store.add_documents([Document(page_content="Glucagon raises blood sugar.", metadata={"src": "c"})], ids=["ins"])
    assert len(store) == 2
    [doc] = store.get_by_ids(["ins"])
    assert doc.page_content == "Glucagon raises blood sugar." and doc.metadata == {"src": "c"}
    assert store.delete(["ins", "never-there"]) is True and len(store) == 1
    with pytest.raises(InvalidArgumentError, match="needs the ids"):
        store.delete()
    with pytest.raises(InvalidIdError):
        store.add_texts(["text"], ids=[7])
    with pytest.raises(InvalidArgumentError, match="unknown setting.*'wieghts'.*weights"):
        NormRankVectorStore(NormRankEmbeddings(encoder=encoder), wieghts=Weights(a=0.1))
    with pytest.raises(InvalidArgumentError, match="existing index"):
        NormRankVectorStore(index=store.index, weights=Weights(a=0.1))
    assert store.add_texts([]) == []



def test_a_replacement_is_never_seen_half_done_by_other_readers_of_the_index(encoder, demo_texts, demo_encoded):
    """Re-adding existing ids is a delete then an add. The store's own lock kept its readers out, but another
    store, retriever or thread on the same ``NormIndex`` saw the replaced documents missing in between (3 of
    263 top-10s) or got "k of 50 is larger than the number of documents (45)". Here a reader searches the
    index at the very moment the old documents are deleted: it must wait and see the whole corpus."""
    seen: list[Any] = []
    readers: list[threading.Thread] = []

    def read() -> None:
        try:
            seen.append([h.id for h in index.search(q, len(ids_all))])
        except Exception as exc:  # noqa: BLE001 - what the reader got is the point
            seen.append(exc)

    class Watched(NormIndex):
        def _delete_for_upsert(self, ids):  # the delete an upsert runs (delete() runs it too)
            removed = super()._delete_for_upsert(ids)
            if not readers:
                readers.append(threading.Thread(target=read))
                readers[0].start()
                readers[0].join(0.5)  # blocked until the add is done, or (before the fix) an answer with a gap
            return removed

    vecs, counts = demo_encoded
    ids_all = [f"d{i}" for i in range(12)]
    index = Watched(encoder, weights=WEIGHTS)
    index.add_vectors(vecs[:12], counts[:12], ids=ids_all, texts=demo_texts[:12])
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), index=index)
    other = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), index=index)
    q = vecs[20]
    store.add_texts(demo_texts[:5], ids=ids_all[:5])  # the same documents again: the corpus never changes
    readers[0].join(10)
    assert len(seen) == 1 and not isinstance(seen[0], Exception), seen
    assert sorted(seen[0]) == sorted(ids_all)
    assert len(other.similarity_search("blood sugar", k=12)) == 12


def test_mmr_reads_its_hits_and_their_vectors_from_one_state_of_a_shared_index(encoder, demo_texts, demo_encoded):
    """MMR searched, then fetched the hits' vectors: another store or thread on the same ``NormIndex`` deleting
    a hit in between made the retrieval raise ``UnknownIdError`` for an id the caller never named (105 of 400
    retrievals in a hunt), or mix the hits of one state with the vectors of another. Here a delete starts the
    moment the search returns: it must wait, and the answer be the one before it."""
    vecs, counts = demo_encoded
    index = index_deleting_its_top_hit(encoder, weights=WEIGHTS)
    index.add_vectors(vecs[:30], counts[:30], ids=[f"d{i}" for i in range(30)], texts=demo_texts[:30])
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), index=index)
    before = [d.id for d in store.max_marginal_relevance_search("blood sugar", k=4, fetch_k=10)]
    index.armed = True
    during = [d.id for d in store.max_marginal_relevance_search("blood sugar", k=4, fetch_k=10)]
    index.deleter.join(10)
    assert during == before
    assert len(store) == 29 and len(store.max_marginal_relevance_search("blood sugar", k=4, fetch_k=10)) == 4


def test_mmr_over_pgvector_reads_one_snapshot_while_another_process_deletes(encoder, demo_texts, demo_encoded,
                                                                           pg_dsn, pg_table):
    """On pgvector MMR's two reads (the hits, then their vectors) were two transactions: another process
    deleting a hit in between made the retrieval raise ``UnknownIdError`` for an id the caller never named.
    Here a second handle (its own connection, as another process has) deletes the top hit the moment the
    search returns: the answer is the one of the state the retrieval began with, and the next one sees the
    delete."""
    from normrank.pgvector_store import PgVectorNormIndex

    vecs, counts = demo_encoded
    mine, other = PgVectorNormIndex(pg_dsn, pg_table, encoder, weights=WEIGHTS), PgVectorNormIndex(pg_dsn, pg_table)
    try:
        mine.add_vectors(vecs[:30], counts[:30], ids=[f"d{i}" for i in range(30)], texts=demo_texts[:30])
        store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), index=mine)
        before = [d.id for d in store.max_marginal_relevance_search("blood sugar", k=4, fetch_k=10)]
        real_search, deleted = mine.search, []

        def search_then_another_process_deletes(*args, **kwargs):
            hits = real_search(*args, **kwargs)
            if not deleted:
                deleted.append(hits[0].id)
                other.delete(deleted)  # committed on its own connection, between the two reads
            return hits

        mine.search = search_then_another_process_deletes
        during = [d.id for d in store.max_marginal_relevance_search("blood sugar", k=4, fetch_k=10)]
        assert during == before and deleted and deleted[0] in before
        after = [d.id for d in store.max_marginal_relevance_search("blood sugar", k=4, fetch_k=10)]
        assert deleted[0] not in after and len(after) == 4 and len(other) == 29
    finally:
        mine.close()
        other.close()


def test_metadata_using_the_explanation_key_is_refused_and_nothing_changes(store):
    n = len(store)
    with pytest.raises(InvalidArgumentError, match="'normrank'"):
        store.add_texts(["A text about tides."], [{"normrank": {"score": 1}}])
    assert len(store) == n
    doc, _ = store.similarity_search_with_score("tides", k=1)[0]
    with pytest.raises(InvalidArgumentError, match="explanation_key"):
        store.add_documents([doc])  # a scored result fed back in
    other = NormRankVectorStore(store.embedding, index=store.index, explanation_key="why")
    assert "why" in other.similarity_search_with_score("tides", k=1)[0][0].metadata


class UnitNormEmbeddings(Embeddings):
    """The real model's vectors divided by their length: what stock sentence-transformers and hosted APIs give."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        v = self.encoder.encode(texts)
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def test_unit_norm_embeddings_are_refused_and_nothing_stored_is_lost(encoder, store):
    unit = UnitNormEmbeddings(encoder)
    with pytest.raises(UnitNormError, match="already unit length"):
        NormRankVectorStore.from_texts(["One text.", "Another, longer text about rivers."], unit)
    ids_before = store.index.ids()
    on_store = NormRankVectorStore(unit, index=store.index)
    with pytest.raises(UnitNormError, match="already unit length"):
        on_store.add_texts(["A replacement for the first document."], ids=[ids_before[0]])
    with pytest.raises(UnitNormError, match="raw"):
        on_store.similarity_search("stars")
    assert store.index.ids() == ids_before  # refused before the replaced document was taken out: same order
    assert store.get_by_ids([ids_before[0]])[0].page_content.startswith(
        demo_rows("demo_corpus.jsonl")[0]["title"])


class NaNOn(Embeddings):
    """Fake embeddings that break (NaN) on one text, as a faulty model would."""

    def __init__(self) -> None:
        self.fake = DeterministicFakeEmbedding(size=6)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[float("nan")] * 6 if t == "poison" else self.fake.embed_query(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def test_a_failed_replacement_puts_the_old_document_back():
    store = NormRankVectorStore(NaNOn())
    store.add_texts(["foo", "bar", "baz"], [{"n": 1}, {"n": 2}, {"n": 3}], ids=["1", "2", "3"])
    before = {d.id: d for d in store.get_by_ids(["1", "2", "3"])}
    with pytest.raises(InvalidVectorError):
        store.add_texts(["new two", "poison"], [{"n": 20}, {"n": 40}], ids=["2", "4"])
    assert {d.id: d for d in store.get_by_ids(["1", "2", "3", "4"])} == before
    assert _ids(store.similarity_search("bar", k=1)) == ["2"]


def _deep(depth: int) -> dict:
    out: dict = {}
    for _ in range(depth):
        out = {"k": out}
    return out


class CountingEmbeddings(DeterministicFakeEmbedding):
    """DeterministicFakeEmbedding that counts its calls (a paid API would bill each)."""

    calls: int = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        return super().embed_documents(texts)


@pytest.mark.parametrize("bad", [
    {"texts": ["ok", "bad \udcff"]},
    {"texts": ["ok"], "metadatas": [{"k": "\udcff"}]},
    {"texts": ["ok"], "ids": ["\udcff"]},
    {"texts": ["ok"], "metadatas": [_deep(700)]},
    {"texts": ["ok", "two"], "ids": ["same", "same"]},
    {"texts": ["   "]},
    {"texts": ["ok"], "metadatas": [{"x": float("nan")}]},
], ids=["surrogate-text", "surrogate-metadata", "surrogate-id", "deep-metadata", "duplicate-ids", "blank", "nan"])
def test_bad_input_is_refused_before_embedding_and_changes_nothing(bad):
    emb = CountingEmbeddings(size=6)
    store = NormRankVectorStore(emb)
    store.add_texts(["foo", "bar"], ids=["1", "2"])
    calls = emb.calls
    with pytest.raises(ValueError) as info:
        store.add_texts(**bad)
    assert type(info.value).__module__.startswith("normrank")  # a named normrank error
    assert emb.calls == calls and store.index.ids() == ["1", "2"]


class RawEmbeddings(Embeddings):
    """The real model's raw vectors through a plain LangChain ``Embeddings`` (not normrank's class)."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.encoder.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.encoder.encode([text])[0].tolist()


def test_external_embeddings_with_query_conditioned_weights_match_the_index(encoder, corpus, demo_texts,
                                                                            demo_encoded, queries):
    """b != 0 needs the query's norm and token count: the embeddings + token_counter path gives the index's
    own text-query answer."""
    vecs, counts = demo_encoded
    idx = NormIndex(encoder, weights=Weights(a=0.02, b=0.03))
    idx.add_vectors(vecs, counts, ids=[d["_id"] for d in corpus], texts=demo_texts)
    idx.calibrate_queries(queries)
    store = NormRankVectorStore(RawEmbeddings(encoder), index=idx,
                                token_counter=lambda ts: encoder.token_counts(ts).tolist())
    assert not store._shared and store.token_counter_kind == "given"
    for q in queries[:2]:
        hits = idx.search(q, 5)
        pairs = store.similarity_search_with_score(q, k=5)
        assert [d.id for d, _ in pairs] == [h.id for h in hits]
        assert [s for _, s in pairs] == pytest.approx([h.score for h in hits], abs=1e-5)
        assert len({d.metadata["normrank"]["weight"] for d, _ in pairs}) == 1  # one w(q) per query


def test_external_embeddings_use_a_documented_token_count():
    assert approximate_token_counts(["Hello, world!", "one"]) == [6, 3]
    store = NormRankVectorStore(DeterministicFakeEmbedding(size=8))
    assert store.token_counter_kind.startswith("approximate")
    store.add_texts(["short", "a somewhat longer text with more words in it"], ids=["s", "l"])
    assert [r.token_count for r in store.index.get(["s", "l"])] == approximate_token_counts(
        ["short", "a somewhat longer text with more words in it"])
    counted = NormRankVectorStore(DeterministicFakeEmbedding(size=8), token_counter=lambda ts: [len(t) for t in ts])
    counted.add_texts(["abc"], ids=["x"])
    assert counted.index.get(["x"])[0].token_count == 3


def test_concurrent_replacements_never_hide_a_document():
    """Searches running while the same documents are replaced see all of them, every time."""
    store = NormRankVectorStore(DeterministicFakeEmbedding(size=6))
    texts = [f"document number {i}" for i in range(8)]
    ids = [str(i) for i in range(8)]
    store.add_texts(texts, ids=ids)
    expected = _ids(store.similarity_search("document", k=8))
    errors: list[BaseException] = []
    seen: list[list[str]] = []
    stop = threading.Event()

    def writer() -> None:
        try:
            while not stop.is_set():
                store.add_texts(texts[:4], ids=ids[:4])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(150):
                seen.append(_ids(store.similarity_search("document", k=8)))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    assert not errors
    assert all(sorted(s) == sorted(expected) for s in seen)


# ---------------------------------------------------------------- the indexing API
def _source_docs(version: int = 0) -> list[Document]:
    return [
        Document(page_content="Honey never spoils when kept sealed.", metadata={"source": "food"}),
        Document(page_content="Octopuses have three hearts.", metadata={"source": "animals"}),
        Document(page_content="Venus rotates backwards compared to most planets."
                 + (" It is the hottest planet." if version else ""), metadata={"source": "space"}),
    ]


def test_indexing_api_adds_nothing_twice_and_replaces_changed_documents(encoder):
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder))
    rm = InMemoryRecordManager(namespace="normrank/test")
    rm.create_schema()
    first = index(_source_docs(), rm, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
    assert (first["num_added"], first["num_deleted"]) == (3, 0) and len(store) == 3
    again = index(_source_docs(), rm, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
    assert (again["num_added"], again["num_skipped"], again["num_deleted"]) == (0, 3, 0) and len(store) == 3
    changed = index(_source_docs(1), rm, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
    assert (changed["num_added"], changed["num_deleted"], changed["num_skipped"]) == (1, 1, 2) and len(store) == 3
    [top] = store.similarity_search("Which planet is the hottest?", k=1)
    assert top.page_content.endswith("hottest planet.") and top.metadata == {"source": "space"}
    full = index(_source_docs(1)[:1], rm, store, cleanup="full", source_id_key="source", key_encoder="sha256")
    assert (full["num_deleted"], len(store)) == (2, 1)
    assert store.similarity_search("anything at all", k=5)[0].page_content.startswith("Honey")


def test_a_full_cleanup_that_only_deletes_ranks_as_a_store_built_afresh(encoder):
    """index(cleanup="full") after sources were removed only deletes; the calibration of all 120 documents
    stayed, and 24 of 24 top-10s differed from a store built from the 40 that were left."""
    words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
             "tau upsilon phi chi psi omega").split()
    docs = [Document(page_content=f"Document {i} about " + " ".join(words[(i * j) % len(words)]
                                                                   for j in range(3 + (i * 7) % 40)) + ".",
                     metadata={"source": "keep" if i < 40 else f"drop{i % 4}"}) for i in range(120)]
    weights = Weights(a=0.2)
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), weights=weights)
    rm = InMemoryRecordManager(namespace="normrank/full")
    rm.create_schema()
    index(docs, rm, store, cleanup="full", source_id_key="source")
    synced = index(docs[:40], rm, store, cleanup="full", source_id_key="source")
    assert (synced["num_added"], synced["num_deleted"], len(store)) == (0, 80, 40)
    kept = store.get_by_ids(store.index.ids())
    fresh = NormRankVectorStore.from_texts([d.page_content for d in kept], NormRankEmbeddings(encoder=encoder),
                                           [d.metadata for d in kept], ids=[d.id for d in kept], weights=weights)
    assert store.index.calibrator.n_fitted == 40
    for q in words:  # the same texts encoded in other batches: scores agree to float32 noise
        got, want = store.similarity_search_with_score(q, k=10), fresh.similarity_search_with_score(q, k=10)
        assert [d.id for d, _ in got] == [d.id for d, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)


def test_indexing_api_over_pgvector(pg_dsn, pg_table):
    from normrank.pgvector_store import PgVectorNormIndex

    idx = PgVectorNormIndex(pg_dsn, pg_table)
    store = NormRankVectorStore(DeterministicFakeEmbedding(size=6), index=idx, allow_empty=True)
    try:
        rm = InMemoryRecordManager(namespace="normrank/pg")
        rm.create_schema()
        kw = {"cleanup": "incremental", "source_id_key": "source", "key_encoder": "sha256"}
        assert index(_source_docs(), rm, store, **kw)["num_added"] == 3
        again = index(_source_docs(), rm, store, **kw)
        assert (again["num_added"], again["num_skipped"]) == (0, 3)
        changed = index(_source_docs(1), rm, store, **kw)
        assert (changed["num_added"], changed["num_deleted"], len(store)) == (1, 1, 3)
        assert sorted(d.page_content for d in store.get_by_ids(idx.ids()))[-1].endswith("hottest planet.")
        full = index(_source_docs(1)[:1], rm, store, cleanup="full", source_id_key="source", key_encoder="sha256")
        assert (full["num_deleted"], len(store)) == (2, 1)
    finally:
        idx.close()


async def test_async_indexing_api(encoder):
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder))
    rm = InMemoryRecordManager(namespace="normrank/atest")
    await rm.acreate_schema()
    first = await aindex(_source_docs(), rm, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
    again = await aindex(_source_docs(), rm, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
    assert first["num_added"] == 3 and again["num_added"] == 0 and len(store) == 3


# ---------------------------------------------------------------- async
async def test_async_variants_match_sync_and_keep_the_loop_free(encoder, corpus, demo_texts):
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), weights=WEIGHTS)
    docs = [Document(page_content=t, metadata={"i": i}, id=d["_id"])
            for i, (t, d) in enumerate(zip(demo_texts, corpus))]
    beats = 0
    done = asyncio.Event()

    async def heartbeat() -> None:
        nonlocal beats
        while not done.is_set():
            beats += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(heartbeat())
    ids = await store.aadd_documents(docs)
    done.set()
    await task
    assert beats > 1  # the loop ran while the documents were encoded
    assert ids == [d["_id"] for d in corpus]
    q = "How do vaccines work?"
    assert _ids(await store.asimilarity_search(q, k=4)) == _ids(store.similarity_search(q, k=4))
    pairs = await store.asimilarity_search_with_score(q, k=4)
    assert [s for _, s in pairs] == [s for _, s in store.similarity_search_with_score(q, k=4)]
    assert _ids(await store.amax_marginal_relevance_search(q, k=3, fetch_k=8)) == \
        _ids(store.max_marginal_relevance_search(q, k=3, fetch_k=8))
    assert _ids(await store.as_retriever(search_kwargs={"k": 2}).ainvoke(q)) == _ids(store.similarity_search(q, k=2))
    assert _ids(await store.aget_by_ids(ids[:2])) == ids[:2]
    await store.adelete(ids[:2])
    assert len(store) == len(corpus) - 2


# ---------------------------------------------------------------- persistence, config, empty stores
def test_save_local_load_local_round_trip(store, tmp_path, queries):
    store.save_local(tmp_path / "lc")
    loaded = NormRankVectorStore.load_local(tmp_path / "lc", NormRankEmbeddings(encoder=store.embedding.encoder))
    for q in queries[:3]:
        assert [(d.id, s) for d, s in loaded.similarity_search_with_score(q, k=5)] == \
            [(d.id, s) for d, s in store.similarity_search_with_score(q, k=5)]
    with pytest.warns(UserWarning, match="never unpickles"):
        NormRankVectorStore.load_local(tmp_path / "lc", allow_dangerous_deserialization=False)
    with pytest.raises(FileNotFoundError):
        NormRankVectorStore.load_local(tmp_path / "nothing-here")
    # index_name, as LangChain's FAISS store takes it (it was a TypeError): a sub-folder per store
    store.save_local(tmp_path / "shared", index_name="docs")
    named = NormRankVectorStore.load_local(tmp_path / "shared", NormRankEmbeddings(encoder=store.embedding.encoder),
                                           index_name="docs")
    assert [d.id for d in named.similarity_search(queries[0], k=5)] == [d.id for d in store.similarity_search(queries[0], k=5)]
    for bad in ("../elsewhere", "", ".."):
        with pytest.raises(InvalidArgumentError, match="index_name must be a plain folder name"):
            store.save_local(tmp_path / "shared", index_name=bad)
    metadata = next((tmp_path / "lc").glob("v-*")) / "metadata.json"
    metadata.write_text(metadata.read_text().replace("astro", "astrx"))
    with pytest.raises(IndexFormatError):
        NormRankVectorStore.load_local(tmp_path / "lc")


def test_load_local_of_a_store_built_with_other_embeddings_needs_them(tmp_path):
    fake = DeterministicFakeEmbedding(size=6)
    store = NormRankVectorStore.from_texts(["foo", "bar", "baz"], fake, ids=["1", "2", "3"])
    store.save_local(tmp_path / "fake")
    with pytest.raises(InvalidArgumentError, match="load_local\\(path, embeddings\\)"):
        NormRankVectorStore.load_local(tmp_path / "fake")
    loaded = NormRankVectorStore.load_local(tmp_path / "fake", fake)
    assert _ids(loaded.similarity_search("bar", k=3)) == _ids(store.similarity_search("bar", k=3))


def test_searching_with_other_embeddings_never_adopts_the_bundled_model(tmp_path):
    """A search with vectors of the store's own embeddings must not make the index load (and a save
    then record) normrank's default encoder: reopened without embeddings it would answer with another
    model's query vectors. The documented error stays."""
    fake = DeterministicFakeEmbedding(size=6)
    store = NormRankVectorStore.from_texts(["foo", "bar", "baz"], fake, ids=["1", "2", "3"])
    before = _ids(store.similarity_search("bar", k=3))
    store.similarity_search_with_relevance_scores("foo", k=2)
    store.as_retriever().invoke("baz")
    assert store.index._encoder is None
    store.save_local(tmp_path / "fake")
    with pytest.raises(InvalidArgumentError, match="load_local\\(path, embeddings\\)"):
        NormRankVectorStore.load_local(tmp_path / "fake")
    assert _ids(NormRankVectorStore.load_local(tmp_path / "fake", fake).similarity_search("bar", k=3)) == before


def test_from_config_serves_the_saved_index(blended_index, tmp_path, encoder):
    blended_index.save(tmp_path / "idx")
    path = tmp_path / "normrank.yaml"
    path.write_text(f"store:\n  path: {tmp_path / 'idx'}\nlangchain:\n  k: 3\n  filter:\n    topic: astro\n",
                    encoding="utf-8")
    store = NormRankVectorStore.from_config(path)
    q = "How do vaccines work?"
    assert _ids(store.as_retriever().invoke(q)) == [h.id for h in blended_index.search(q, 3, filter={"topic": "astro"})]
    assert _ids(store.as_retriever(search_kwargs={"filter": None, "k": 2}).invoke(q)) == \
        [h.id for h in blended_index.search(q, 2)]


def test_an_empty_store_from_a_wrong_path_warns_and_raises(tmp_path, encoder):
    config = {"store": {"path": str(tmp_path / "typo")}}
    with pytest.warns(UserWarning, match="empty index"):
        store = NormRankVectorStore.from_config(config)
    with pytest.raises(EmptyCorpusError, match="typo"):
        store.similarity_search("anything")
    with pytest.raises(EmptyCorpusError, match="allow_empty=True"):
        store.as_retriever().invoke("anything")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert NormRankVectorStore.from_config(config, allow_empty=True).similarity_search("anything") == []
        fresh = NormRankVectorStore(NormRankEmbeddings(encoder=encoder))  # a new store is meant to be filled
        assert fresh.similarity_search("anything") == []
    with pytest.warns(UserWarning, match="empty index"):
        NormRankVectorStore(index=NormIndex(encoder))
    filled = NormRankVectorStore.from_config(config, documents=[Document(page_content="Tides follow the Moon.")])
    assert filled.similarity_search("What causes tides?", k=1)[0].page_content == "Tides follow the Moon."


def test_a_store_emptied_by_deletes_returns_nothing_like_inmemory(tmp_path, encoder):
    """A loaded store whose documents the user deletes is emptied, not misplaced: [] as
    InMemoryVectorStore returns, for searches and retrievers, also after a save and a load; the
    index's fitted calibration is what tells it from a never-filled index at a wrong path."""
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_normrank import NormRankRetriever

    emb = NormRankEmbeddings(encoder=encoder)
    NormRankVectorStore.from_texts(["Tides follow the Moon.", "Volcanoes erupt."], emb, ids=["1", "2"]).save_local(
        str(tmp_path / "two"))
    store = NormRankVectorStore.load_local(str(tmp_path / "two"), emb)
    stock = InMemoryVectorStore(emb)
    stock.add_texts(["Tides follow the Moon.", "Volcanoes erupt."], ids=["1", "2"])
    for s in (store, stock):
        s.delete(["1", "2"])
    assert store.similarity_search("tides") == stock.similarity_search("tides") == []
    assert store.as_retriever().invoke("tides") == [] and store.max_marginal_relevance_search("tides") == []
    assert NormRankRetriever(index=store.index).invoke("tides") == []
    store.save_local(str(tmp_path / "emptied"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # emptied, not misplaced: no warning either
        again = NormRankVectorStore.load_local(str(tmp_path / "emptied"), emb)
    assert again.similarity_search("tides") == []


def test_a_filter_function_written_for_inmemory_gets_a_named_error(encoder):
    """InMemoryVectorStore calls a filter function with a Document; normrank calls it with the metadata
    dict. Code moved over unchanged failed with a bare AttributeError; it is now named and says why."""
    from normrank.errors import InvalidArgumentError

    store = NormRankVectorStore.from_texts(["Tides follow the Moon.", "Volcanoes erupt."],
                                           NormRankEmbeddings(encoder=encoder),
                                           metadatas=[{"kind": "sea"}, {"kind": "land"}])
    with pytest.raises(InvalidArgumentError, match="metadata dict"):
        store.similarity_search("tides", filter=lambda doc: doc.metadata["kind"] == "sea")
    assert _ids(store.similarity_search("tides", k=2, filter=lambda m: m["kind"] == "land")) == \
        _ids(store.similarity_search("tides", k=2, filter={"kind": "land"}))


def test_from_config_on_pgvector(pg_dsn, pg_table, encoder):
    config = {"store": {"backend": "pgvector", "dsn": pg_dsn, "table": pg_table}, "langchain": {"k": 1}}
    with pytest.warns(UserWarning, match=pg_table):
        empty = NormRankVectorStore.from_config(config)
    with pytest.raises(EmptyCorpusError, match=pg_table):
        empty.similarity_search("tides")
    empty.index.close()
    docs = [Document(page_content="Tides follow the Moon.", id="tide"),
            Document(page_content="Volcanoes erupt molten rock.", id="lava")]
    store = NormRankVectorStore.from_config(config, documents=docs)
    try:
        assert _ids(store.as_retriever().invoke("What causes tides?")) == ["tide"]
        again = NormRankVectorStore.from_config(config)  # another process would see the same table
        assert _ids(again.similarity_search("molten rock", k=2)) == ["lava", "tide"]
        again.index.close()
    finally:
        store.index.close()


async def test_concurrent_async_calls_give_the_sequential_answers():
    store = NormRankVectorStore(DeterministicFakeEmbedding(size=6))
    texts = [f"text number {i}" for i in range(12)]
    await store.aadd_texts(texts, ids=[str(i) for i in range(12)])
    qs = [f"query {i}" for i in range(10)]
    expected = [_ids(store.similarity_search(q, k=5)) for q in qs]
    results = await asyncio.gather(
        *(store.asimilarity_search(q, k=5) for q in qs),
        *(store.aadd_texts(texts[:6], ids=[str(i) for i in range(6)]) for _ in range(3)),
        *(store.amax_marginal_relevance_search(q, k=3, lambda_mult=1.0) for q in qs),
    )
    assert [_ids(r) for r in results[:10]] == expected
    assert [_ids(r) for r in results[13:]] == [e[:3] for e in expected]
    assert len(store) == 12


def test_pgvector_store_has_nothing_to_save_locally(pg_dsn, pg_table, tmp_path):
    store = NormRankVectorStore.from_texts(["foo", "bar"], DeterministicFakeEmbedding(size=6), backend="pgvector",
                                           dsn=pg_dsn, table=pg_table)
    try:
        with pytest.raises(InvalidArgumentError, match="database"):
            store.save_local(tmp_path / "x")
    finally:
        store.index.close()


# ---------------------------------------------------------------- a RAG chain
def _rag_chain(retriever):
    prompt = ChatPromptTemplate.from_messages([("human", "Context:\n{context}\n\nQuestion: {question}")])

    def format_docs(docs: list[Document]) -> str:
        return "\n".join(f"[{d.id}] score={d.metadata['normrank']['score']:.4f} {d.page_content[:40]}" for d in docs)

    # ParrotFakeChatModel answers with the prompt it was given: the answer shows the context, in order.
    return ({"context": retriever | format_docs, "question": RunnablePassthrough()}
            | prompt | ParrotFakeChatModel() | StrOutputParser())


def _context_ids(answer: str) -> list[str]:
    return re.findall(r"^\[([^\]]+)\] score=", answer, re.M)


async def test_rag_chain_serves_the_blended_order(store, blended_index, queries):
    chain = _rag_chain(store.as_retriever(search_kwargs={"k": 4}))
    for q in queries[:3]:
        expected = [h.id for h in blended_index.search(q, 4)]
        answer = chain.invoke(q)
        assert _context_ids(answer) == expected and answer.rstrip().endswith(q)
        assert _context_ids(await chain.ainvoke(q)) == expected
    assert [_context_ids(a) for a in chain.batch(queries[:3])] == \
        [[h.id for h in blended_index.search(q, 4)] for q in queries[:3]]


def test_rag_chain_over_pgvector_serves_the_blended_order(pg_dsn, pg_table, encoder, corpus, demo_texts,
                                                          blended_index, queries):
    store = NormRankVectorStore.from_texts(
        demo_texts, NormRankEmbeddings(encoder=encoder), _metas(corpus), ids=[d["_id"] for d in corpus],
        backend="pgvector", dsn=pg_dsn, table=pg_table, weights=WEIGHTS)
    try:
        chain = _rag_chain(store.as_retriever(search_kwargs={"k": 4}))
        for q in queries[:4]:
            hits = blended_index.search(q, 6)
            got = _context_ids(chain.invoke(q))
            scores = {h.id: h.score for h in hits}
            if got != [h.id for h in hits[:4]]:  # only exact float ties may swap between backends
                assert all(abs(scores[g] - h.score) < 1e-5 for g, h in zip(got, hits))
            pairs = store.similarity_search_with_score(q, k=4)
            assert [s for _, s in pairs] == pytest.approx([h.score for h in hits[:4]], abs=1e-5)
        # the constructor reopens the table with its documents and blend (it refused backend= as an
        # "unknown setting for a new NormIndex")
        again = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), backend="pgvector", dsn=pg_dsn, table=pg_table)
        try:
            assert len(again.index) == len(demo_texts) and again.index.weights == WEIGHTS
            q = queries[0]
            assert [d.id for d in again.similarity_search(q, k=4)] == [d.id for d in store.similarity_search(q, k=4)]
        finally:
            again.index.close()
        with pytest.raises(InvalidArgumentError, match="dsn is for backend='pgvector'"):
            NormRankVectorStore(NormRankEmbeddings(encoder=encoder), dsn=pg_dsn)
    finally:
        store.index.close()


def test_vectorstore_example_runs():
    """examples/langchain_vectorstore.py: indexing twice adds nothing, the chain shows the context in the
    blended order, and the reloaded store answers as before."""
    import ast
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "langchain_vectorstore.py"
    if not path.exists():
        pytest.skip("the example is not in this checkout")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    first, second = ast.literal_eval(lines[0]), ast.literal_eval(lines[1])
    assert first["num_added"] == 4 and second["num_added"] == 0 and second["num_skipped"] == 4
    scored = [ln.split("  ", 1)[1] for ln in lines[2:4]]
    context = [ln[2:] for ln in lines if ln.startswith("- ")]
    assert context == scored and scored[0].startswith("Photosynthesis")
    reloaded = ast.literal_eval(lines[-1].split(": ", 1)[1])
    assert [c[:30] for c in context] == reloaded


@pytest.mark.parametrize("call", [
    lambda s: s.similarity_search("stars", k=2, score_threshold="0.5"),
    lambda s: s.similarity_search("stars", k=2, score_threshold=float("nan")),
    lambda s: s.similarity_search("stars", k=2, score_threshold=2),
    lambda s: s.similarity_search_with_relevance_scores("stars", k=2, score_threshold="0.5"),
    lambda s: asyncio.run(s.asimilarity_search_with_relevance_scores("stars", k=2, score_threshold=-0.1)),
    lambda s: s.as_retriever(search_type="mmr", search_kwargs={"score_threshold": "x"}).invoke("stars"),
    lambda s: s.similarity_search_by_vector("abc", k=2),
    lambda s: s.similarity_search_by_vector(["1"] * 384, k=2),
    lambda s: s.similarity_search_by_vector([float("nan")] * 384, k=2),
    lambda s: s.similarity_search(5, k=2),
    lambda s: s.similarity_search("stars", k=2, filter={"n": {"$regex": "s"}}),
    lambda s: s.similarity_search("stars", k=2, filter={"n": float("nan")}),
    lambda s: s.add_documents(["a plain string"]),
    lambda s: s.get_by_ids(None),
], ids=["threshold-str", "threshold-nan", "threshold-2", "relevance-str", "arelevance-neg", "mmr-threshold",
        "vector-str", "vector-of-str", "vector-nan", "query-int", "unknown-operator", "nan-filter", "add-str",
        "get-none"])
@pytest.mark.parametrize("empty", [False, True])
def test_bad_arguments_are_named_on_full_and_empty_stores(encoder, demo_texts, call, empty):
    """Checked before the store is looked at: an empty store refuses what a full one does (it answered
    ``[]`` to a NaN vector), and nothing stored changes."""
    store = NormRankVectorStore(NormRankEmbeddings(encoder=encoder), allow_empty=True)
    if not empty:
        store.add_texts(demo_texts[:6], ids=[f"d{i}" for i in range(6)])
    before = store.index.ids()
    with pytest.raises(ValueError) as info:
        call(store)
    assert type(info.value).__module__.startswith("normrank")  # a named normrank error, not a bare one
    assert store.index.ids() == before


def test_operator_filters_match_what_they_say(store, corpus):
    """Chroma/PGVector-style operators, as LangChain users write them (normrank.filters)."""
    metas = {d["_id"]: m for d, m in zip(corpus, _metas(corpus))}
    key, value = "topic", _metas(corpus)[0]["topic"]
    everything = _ids(store.similarity_search("stars", k=len(metas)))
    for flt, keep in (({key: {"$eq": value}}, lambda m: m.get(key) == value),
                      ({key: {"$ne": value}}, lambda m: m.get(key) != value),
                      ({"$or": [{key: value}, {key: {"$exists": False}}]}, lambda m: m.get(key, value) == value),
                      ({"$not": {key: {"$in": [value]}}}, lambda m: m.get(key) != value)):
        want = [i for i in everything if keep(metas[i])][:3]
        assert _ids(store.similarity_search("stars", k=3, filter=flt)) == want, flt


def test_retrievers_clamp_k_while_another_thread_deletes(encoder, demo_texts):
    """Counting and searching are two calls; a delete in between made the search refuse k (53 of 66
    retrievals failed). Every retrieval now answers with what the index holds when it searches."""
    from langchain_normrank import NormRankRetriever

    texts = [f"{t} ({i})" for i, t in enumerate(demo_texts * 4)][:60]
    index = NormIndex.from_texts(texts, ids=[f"d{i}" for i in range(len(texts))], encoder=encoder)
    retriever = NormRankRetriever(index=index, k=100)
    store = NormRankVectorStore(index=index)
    stop = threading.Event()
    errors: list[BaseException] = []
    sizes: list[int] = []

    def deleter() -> None:
        for i in range(len(texts) - 5):
            index.delete([f"d{i}"])
            if stop.wait(0.003):
                return

    def reader(fn) -> None:
        try:
            while not stop.is_set():
                sizes.append(len(fn()))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=deleter)] + [
        threading.Thread(target=reader, args=(f,)) for f in (lambda: retriever.invoke("stars"),
                                                              lambda: store.similarity_search("stars", k=100))]
    for t in threads:
        t.start()
    threads[0].join()
    stop.set()
    for t in threads[1:]:
        t.join()
    assert not errors, errors[:3]
    assert sizes and min(sizes) >= 5 and len(retriever.invoke("stars")) == len(index) == 5
