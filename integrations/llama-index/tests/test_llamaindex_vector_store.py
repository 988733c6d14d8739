"""``NormRankVectorStore`` on the real llama-index-core classes and the real bundled model.

The reference is always :meth:`normrank.NormIndex.search` on the same texts with the same
non-trivial blend (``Weights(a=0.05)``): the store, a ``VectorStoreIndex`` retriever, a query
engine and a chat engine (LlamaIndex's ``MockLLM``, no network) must return its order and scores.
llama-index-core ships no vector-store conformance suite, so the conformance tests here mirror
what LlamaIndex's SimpleVectorStore / FaissVectorStore tests check (filters, delete by document,
delete_nodes, clear, persist and reload, node ids), on real embeddings.
"""

from __future__ import annotations

import asyncio
import json
import threading
import warnings

import numpy as np
import pytest

pytest.importorskip("llama_index.core", reason="needs llama-index-core: pip install llama-index-normrank")

from llama_index.core import Document, StorageContext, VectorStoreIndex, load_index_from_storage  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from llama_index.embeddings.normrank import NormRankEmbedding  # noqa: E402
from llama_index.vector_stores.normrank import NormRankVectorStore, metadata_filter  # noqa: E402
from normrank import NormIndex, Weights  # noqa: E402
from normrank.datasets import demo_rows  # noqa: E402
from normrank.testing import index_deleting_its_top_hit  # noqa: E402
from normrank.errors import (  # noqa: E402
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    EmptyTextError,
    InvalidArgumentError,
    NormRankError,
    UnitNormError,
)

BLEND = Weights(a=0.05)
QUERIES = [
    "When was the Peace of Westphalia signed?",
    "How does insulin control blood sugar?",
    "Which river flows through Egypt?",
    "What is the speed of light?",
    "Who invented the printing press?",
]
TOPICS = ["hist", "med", "sport", "food", "cs", "geo"]


@pytest.fixture(scope="module")
def embed(encoder) -> NormRankEmbedding:
    return NormRankEmbedding(encoder=encoder)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return list(demo_rows())


@pytest.fixture(scope="module")
def docs(rows) -> list[Document]:
    """One short document per demo passage, no metadata: each becomes one node whose EMBED view is its text."""
    return [Document(text=f"{r['title']}\n{r['text']}", id_=r["_id"]) for r in rows]


@pytest.fixture(scope="module")
def vectors(docs, demo_encoded, demo_texts) -> np.ndarray:
    """The raw vectors of the documents' texts (the session's encoding of the same demo texts)."""
    assert [d.text for d in docs] == demo_texts
    return demo_encoded[0]


def _index(encoder, docs, demo_encoded, weights=BLEND) -> NormIndex:
    idx = NormIndex(encoder, weights=weights)
    idx.add_vectors(*demo_encoded, ids=[d.doc_id for d in docs], texts=[d.text for d in docs])
    return idx


@pytest.fixture(scope="module")
def reference(encoder, docs, demo_encoded) -> NormIndex:
    """What the store must reproduce: a NormIndex over the same texts with the same blend."""
    return _index(encoder, docs, demo_encoded)


@pytest.fixture(scope="module")
def built(encoder, embed, docs):
    """A VectorStoreIndex over a NormRankVectorStore, built the way the LlamaIndex docs build one."""
    store = NormRankVectorStore(encoder=encoder, weights=BLEND)
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=embed)
    return store, index


def _doc_order(nodes) -> list[str]:
    return [n.node.ref_doc_id for n in nodes]


def _same_as_reference(nodes, hits) -> None:
    assert _doc_order(nodes) == [h.id for h in hits]
    assert [n.score for n in nodes] == pytest.approx([h.score for h in hits], abs=2e-5)
    for n, h in zip(nodes, hits):
        exp = n.node.metadata["normrank"]
        assert exp["score"] == pytest.approx(n.score)
        assert exp["cosine"] == pytest.approx(h.cosine, abs=2e-5)
        assert exp["norm_feature"] == pytest.approx(h.norm_feature, abs=1e-5)
        assert exp["weight"] == pytest.approx(0.05) and exp["norm"] == pytest.approx(h.norm, rel=1e-5)


def test_the_blend_is_not_plain_cosine_on_these_queries(reference, encoder, docs, demo_encoded):
    """Guards the tests below: with Weights(a=0.05) the top-5 differs from plain cosine on each query they
    use, so a store that ranked by cosine (or by the raw dot product) would fail them."""
    plain = _index(encoder, docs, demo_encoded, Weights())
    for q in QUERIES[:3]:
        assert [h.id for h in plain.search(q, 5)] != [h.id for h in reference.search(q, 5)], q


def test_first_stage_of_a_vector_store_index_is_the_exact_blend(built, reference, docs):
    store, index = built
    assert len(store.index) == len(docs)
    retriever = index.as_retriever(similarity_top_k=5)
    for q in QUERIES[:3]:
        _same_as_reference(retriever.retrieve(q), reference.search(q, 5))


def test_query_engine_and_chat_engine_sync(built, reference):
    _, index = built
    q = QUERIES[0]
    hits = reference.search(q, 4)
    response = index.as_query_engine(llm=MockLLM(), similarity_top_k=4).query(q)
    _same_as_reference(response.source_nodes, hits)
    chat = index.as_chat_engine(chat_mode="context", llm=MockLLM(), similarity_top_k=4)
    _same_as_reference(chat.chat(q).source_nodes, hits)
    # the explanation never reaches the prompt
    assert all("normrank" not in n.node.get_content(metadata_mode=MetadataMode.LLM) for n in response.source_nodes)


@pytest.mark.asyncio
async def test_query_engine_and_chat_engine_async(built, reference):
    _, index = built
    q = QUERIES[1]
    hits = reference.search(q, 4)
    _same_as_reference(await index.as_retriever(similarity_top_k=4).aretrieve(q), hits)
    response = await index.as_query_engine(llm=MockLLM(), similarity_top_k=4).aquery(q)
    _same_as_reference(response.source_nodes, hits)
    chat = index.as_chat_engine(chat_mode="context", llm=MockLLM(), similarity_top_k=4)
    _same_as_reference((await chat.achat(q)).source_nodes, hits)


@pytest.mark.asyncio
async def test_concurrent_async_queries_give_the_sequential_answers(built, embed):
    store, _ = built
    queries = [VectorStoreQuery(query_embedding=embed.get_query_embedding(q), query_str=q, similarity_top_k=5)
               for q in QUERIES[:3] * 2]
    alone = [store.query(q).ids for q in queries]
    together = await asyncio.gather(*(store.aquery(q) for q in queries))
    assert [r.ids for r in together] == alone


def test_threads_querying_while_another_adds_see_a_whole_state(encoder, embed, docs, vectors):
    """Searches during concurrent adds return the scores of some whole state: every result is sorted and
    complete, and once the adds are done every query gives the single-threaded answer."""
    store = NormRankVectorStore(encoder=encoder, weights=BLEND)
    store.add(_nodes(docs[:24], vectors[:24]))
    extra = _nodes(docs[24:], vectors[24:])
    q = VectorStoreQuery(query_embedding=embed.get_query_embedding(QUERIES[2]), query_str=QUERIES[2],
                         similarity_top_k=5)
    errors: list[BaseException] = []

    def search() -> None:
        try:
            for _ in range(10):
                res = store.query(q)
                assert len(res.ids) == 5 and res.similarities == sorted(res.similarities, reverse=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(0, len(extra), 6):
        store.add(extra[i:i + 6])
    for t in threads:
        t.join()
    assert not errors
    single = NormRankVectorStore(encoder=encoder, weights=BLEND)
    single.add(_nodes(docs[:24], vectors[:24]))
    for i in range(0, len(extra), 6):
        single.add(extra[i:i + 6])
    assert store.query(q).ids == single.query(q).ids


def test_to_dict_and_from_dict_round_trip_the_settings(encoder):
    """LlamaIndex's own serialisation (``BaseComponent.to_dict`` / ``from_dict``, ``to_json`` /
    ``from_json``) builds a store with the same settings; ``from_dict`` passed the store's own fields
    (``stores_text``, ``is_embedding_query``) to NormIndex, which refused them as unknown."""
    for allow_empty in (True, False):
        store = NormRankVectorStore(encoder=encoder, allow_empty=allow_empty)
        for again in (NormRankVectorStore.from_dict(store.to_dict()), NormRankVectorStore.from_json(store.to_json())):
            assert type(again) is NormRankVectorStore and again.to_dict() == store.to_dict()
            assert again.allow_empty is allow_empty and len(again.client) == 0
    with pytest.raises(InvalidArgumentError, match="stores_text is always True"):
        NormRankVectorStore(encoder=encoder, stores_text=False)
    with pytest.raises(InvalidArgumentError, match="is_embedding_query is always True"):
        NormRankVectorStore(encoder=encoder, is_embedding_query=0)


def test_persist_and_reload_give_the_same_answers(built, encoder, embed, tmp_path, reference):
    store, index = built
    index.storage_context.persist(tmp_path)
    folder = tmp_path / "default__vector_store.normrank"
    assert folder.is_dir() and not (tmp_path / "default__vector_store.json").exists()
    assert not [p for p in folder.rglob("*") if p.suffix in (".pkl", ".pickle")]
    loaded = NormRankVectorStore.from_persist_dir(tmp_path, encoder=encoder)
    again = load_index_from_storage(StorageContext.from_defaults(vector_store=loaded, persist_dir=tmp_path),
                                    embed_model=embed)
    for q in QUERIES[:2]:
        before = index.as_retriever(similarity_top_k=5).retrieve(q)
        after = again.as_retriever(similarity_top_k=5).retrieve(q)
        assert [(n.node.node_id, n.score) for n in after] == [(n.node.node_id, pytest.approx(n.score)) for n in before]
        assert [n.node.get_content() for n in after] == [n.node.get_content() for n in before]
        _same_as_reference(after, reference.search(q, 5))
    # a store persisted to a path of its own
    store.persist(str(tmp_path / "mine"))
    assert NormRankVectorStore.from_persist_path(tmp_path / "mine").query(
        VectorStoreQuery(query_str=QUERIES[0], similarity_top_k=3)).ids == store.query(
        VectorStoreQuery(query_str=QUERIES[0], similarity_top_k=3)).ids


def test_query_by_text_alone_equals_query_by_embedding(built, embed):
    store, _ = built
    q = QUERIES[3]
    by_text = store.query(VectorStoreQuery(query_str=q, similarity_top_k=5))
    by_vec = store.query(VectorStoreQuery(query_embedding=embed.get_query_embedding(q), query_str=q,
                                          similarity_top_k=5))
    assert by_text.ids == by_vec.ids
    assert by_text.similarities == pytest.approx(by_vec.similarities, abs=1e-5)
    with pytest.raises(InvalidArgumentError, match="neither"):
        store.query(VectorStoreQuery(similarity_top_k=3))
    with pytest.raises(InvalidArgumentError, match="similarity_top_k"):
        store.query(VectorStoreQuery(query_str=q, similarity_top_k=0))
    with pytest.raises(InvalidArgumentError, match="default .* and mmr query modes"):
        store.query(VectorStoreQuery(query_str=q, mode=VectorStoreQueryMode.SPARSE))
    # more than stored: everything, still in blended order
    res = store.query(VectorStoreQuery(query_str=q, similarity_top_k=500))
    assert len(res.ids) == len(store.index) and res.similarities == sorted(res.similarities, reverse=True)


def test_mmr_reads_its_hits_and_their_vectors_from_one_state_of_a_shared_index(encoder, demo_texts):
    """The MMR branch searched, then fetched the hits' vectors, under the store's lock only: a delete through
    another handle on the same index in between raised ``UnknownIdError`` for an id the query never named (3
    of 150 MMR queries in a hunt). A delete that starts the moment the search returns must wait."""
    index = index_deleting_its_top_hit(encoder, weights=Weights(a=0.05))
    index.add_texts(list(demo_texts[:30]), ids=[f"n{i}" for i in range(30)])
    store = NormRankVectorStore(index)
    q = VectorStoreQuery(query_str=demo_texts[0][:60], similarity_top_k=4, mode=VectorStoreQueryMode.MMR)
    before = store.query(q, mmr_prefetch_k=10).ids
    index.armed = True
    during = store.query(q, mmr_prefetch_k=10).ids
    index.deleter.join(10)
    assert during == before and len(index) == 29


def test_mmr_mode_picks_what_the_langchain_store_picks(encoder, embed, demo_texts):
    """``vector_store_query_mode="mmr"`` was refused. It picks among the blended top ``similarity_top_k *
    mmr_prefetch_factor`` (or ``mmr_prefetch_k``) for ``mmr_threshold`` (LangChain's ``lambda_mult``): the same
    nodes as the LangChain store's MMR with the same settings; threshold 1 keeps the blended order; a
    duplicate passage is skipped for diversity; bad settings are named."""
    from langchain_normrank import NormRankVectorStore as LangChainStore

    from normrank.mmr import mmr_select  # noqa: F401  (the shared selection both stores call)

    texts = list(demo_texts[:20]) + [demo_texts[0]]  # a duplicate of the best match for the query below
    ids = [f"n{i}" for i in range(len(texts))]
    store = NormRankVectorStore(encoder=encoder, weights=Weights(a=0.05))
    vindex = VectorStoreIndex([TextNode(text=t, id_=i) for t, i in zip(texts, ids)], embed_model=embed,
                              storage_context=StorageContext.from_defaults(vector_store=store))
    lc = LangChainStore(index=store.index)
    q = demo_texts[0][:60]
    plain = [n.node.node_id for n in vindex.as_retriever(similarity_top_k=4).retrieve(q)]
    for threshold, factor in ((0.5, 4), (0.2, 2), (1.0, 4)):
        mmr = vindex.as_retriever(similarity_top_k=4, vector_store_query_mode="mmr",
                                  vector_store_kwargs={"mmr_threshold": threshold, "mmr_prefetch_factor": factor})
        got = [n.node.node_id for n in mmr.retrieve(q)]
        want = [d.id for d in lc.max_marginal_relevance_search(q, k=4, fetch_k=4 * factor, lambda_mult=threshold)]
        assert got == want
        if threshold == 1.0:
            assert got == plain
        else:
            assert not {"n0", "n20"} <= set(got)  # the duplicate is redundant
    prefetch = vindex.as_retriever(similarity_top_k=3, vector_store_query_mode="mmr",
                                   vector_store_kwargs={"mmr_prefetch_k": 5})
    assert [n.node.node_id for n in prefetch.retrieve(q)] == [
        d.id for d in lc.max_marginal_relevance_search(q, k=3, fetch_k=5, lambda_mult=0.5)]
    # a prefetch below similarity_top_k gives that many nodes, all from the blended top prefetch (as
    # LangChain's fetch_k and LlamaIndex's Qdrant store): it gave similarity_top_k, some from further down
    short = vindex.as_retriever(similarity_top_k=6, vector_store_query_mode="mmr",
                                vector_store_kwargs={"mmr_prefetch_k": 2, "mmr_threshold": 0.2})
    got = [n.node.node_id for n in short.retrieve(q)]
    assert len(got) == 2 and set(got) == set(plain[:2])
    assert got == [d.id for d in lc.max_marginal_relevance_search(q, k=6, fetch_k=2, lambda_mult=0.2)]
    for bad, words in (({"mmr_threshold": 1.5}, "mmr_threshold must be a number in"),
                       ({"mmr_prefetch_k": 0}, "mmr_prefetch_k must be a positive integer"),
                       ({"mmr_prefetch_factor": 0.5}, "mmr_prefetch_factor must be a number from 1"),
                       ({"mmr_typo": 1}, "mmr_typo")):
        with pytest.raises(InvalidArgumentError, match=words):
            store.query(VectorStoreQuery(query_str=q, similarity_top_k=3, mode=VectorStoreQueryMode.MMR), **bad)


def test_query_conditioned_weight_gets_the_query_token_count(encoder, embed, docs, vectors, demo_encoded):
    """With b != 0 the weight needs the query's token count: the store takes it from query_str."""
    store = NormRankVectorStore(encoder=encoder, weights=Weights(a=0.03, b=0.02))
    store.add(_nodes(docs, vectors))
    vecs, counts = encoder.encode_with_counts(QUERIES)
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    store.index.calibrate_queries(norms=norms, token_counts=counts)
    ref = _index(encoder, docs, demo_encoded, Weights(a=0.03, b=0.02))
    ref.calibrate_queries(norms=norms, token_counts=counts)
    q = QUERIES[4]
    res = store.query(VectorStoreQuery(query_embedding=embed.get_query_embedding(q), query_str=q, similarity_top_k=5))
    hits = ref.search(q, 5)
    assert res.ids == [h.id for h in hits] and res.similarities == pytest.approx([h.score for h in hits], abs=2e-5)


# ---------------------------------------------------------------- nodes in and out
def _nodes(docs, vecs, meta=None) -> list[TextNode]:
    """Nodes carrying the raw vectors of their texts (what NormRankEmbedding gives, encoded once per session)."""
    return [TextNode(id_=d.doc_id, text=d.text, embedding=v.tolist(), metadata=(meta(i) if meta else {}),
                     relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=d.doc_id)})
            for i, (d, v) in enumerate(zip(docs, vecs))]


@pytest.fixture()
def store(encoder, docs, vectors) -> NormRankVectorStore:
    """A filled store whose nodes carry varied metadata and a document each (two nodes per document)."""
    s = NormRankVectorStore(encoder=encoder, weights=BLEND)
    nodes = _nodes(docs, vectors, meta=lambda i: {
        "topic": TOPICS[i % 6], "year": 1900 + i, "tags": [TOPICS[i % 6], "even" if i % 2 == 0 else "odd"],
        "title": docs[i].text.split("\n")[0], **({"note": ""} if i % 5 == 0 else {})})
    for i, n in enumerate(nodes):
        n.relationships = {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"doc-{i // 2}")}
    s.add(nodes)
    return s


def test_get_nodes_returns_what_was_added(store, docs):
    nodes = store.get_nodes()
    assert [n.node_id for n in nodes] == [d.doc_id for d in docs]
    first = store.get_nodes(node_ids=[docs[3].doc_id, docs[1].doc_id, "nope"])
    assert [n.node_id for n in first] == [docs[3].doc_id, docs[1].doc_id]
    assert first[0].get_content() == docs[3].text and first[0].metadata["year"] == 1903
    assert first[0].ref_doc_id == "doc-1" and first[0].embedding is None
    assert "normrank" not in first[0].metadata and "_node_id" not in first[0].metadata
    assert [n.node_id for n in store.get_nodes(filters=MetadataFilters(filters=[
        MetadataFilter(key="year", value=1902, operator=FilterOperator.LTE)]))] == [d.doc_id for d in docs[:3]]


def _ids(store, filters, k=48, **kw) -> list[str]:
    return store.query(VectorStoreQuery(query_str=QUERIES[0], similarity_top_k=k, filters=filters, **kw)).ids


def _f(key, value, op=FilterOperator.EQ) -> MetadataFilter:
    return MetadataFilter(key=key, value=value, operator=op)


@pytest.mark.parametrize("flt, want", [
    (_f("topic", "med"), lambda i, m: m["topic"] == "med"),
    (_f("topic", "med", FilterOperator.NE), lambda i, m: m["topic"] != "med"),
    (_f("year", 1940, FilterOperator.GT), lambda i, m: m["year"] > 1940),
    (_f("year", 1940, FilterOperator.GTE), lambda i, m: m["year"] >= 1940),
    (_f("year", 1905, FilterOperator.LT), lambda i, m: m["year"] < 1905),
    (_f("year", 1905, FilterOperator.LTE), lambda i, m: m["year"] <= 1905),
    (_f("topic", ["geo", "cs"], FilterOperator.IN), lambda i, m: m["topic"] in ("geo", "cs")),
    (_f("topic", ["geo", "cs"], FilterOperator.NIN), lambda i, m: m["topic"] not in ("geo", "cs")),
    (_f("title", "the", FilterOperator.TEXT_MATCH), lambda i, m: "the" in m["title"]),
    (_f("title", "THE", FilterOperator.TEXT_MATCH_INSENSITIVE), lambda i, m: "the" in m["title"].lower()),
    (_f("tags", "even", FilterOperator.CONTAINS), lambda i, m: "even" in m["tags"]),
    # a string value holds a substring, as SimpleVectorStore reads ``contains``
    (_f("title", "the", FilterOperator.CONTAINS), lambda i, m: "the" in m["title"]),
    (_f("tags", ["food", "geo"], FilterOperator.ANY), lambda i, m: bool({"food", "geo"} & set(m["tags"]))),
    (_f("tags", ["food", "even"], FilterOperator.ALL), lambda i, m: {"food", "even"} <= set(m["tags"])),
    (_f("note", None, FilterOperator.IS_EMPTY), lambda i, m: m.get("note") in (None, "", [])),
    (_f("missing", "x", FilterOperator.NE), lambda i, m: True),
    (_f("missing", "x"), lambda i, m: False),
])
def test_every_standard_filter_operator(store, flt, want):
    metas = {n.node_id: n.metadata for n in store.get_nodes()}
    expected = {i for i, m in metas.items() if want(i, m)}
    got = _ids(store, MetadataFilters(filters=[flt]))
    assert set(got) == expected
    _exact_among_matches(store, got)


def _exact_among_matches(store, got) -> None:
    """Filtered results are the unfiltered blended ranking restricted to the matches, in that order."""
    everything = _ids(store, None)
    assert got == [i for i in everything if i in set(got)]


def test_and_or_not_and_nested_conditions(store):
    metas = {n.node_id: n.metadata for n in store.get_nodes()}
    nested = MetadataFilters(condition=FilterCondition.OR, filters=[
        MetadataFilters(filters=[_f("topic", "hist"), _f("year", 1920, FilterOperator.LT)]),  # AND inside
        MetadataFilters(condition=FilterCondition.NOT, filters=[_f("tags", ["odd", "hist", "med", "sport"],
                                                                   FilterOperator.ANY)]),
    ])
    want = {i for i, m in metas.items()
            if (m["topic"] == "hist" and m["year"] < 1920) or not ({"odd", "hist", "med", "sport"} & set(m["tags"]))}
    got = _ids(store, nested)
    assert set(got) == want and want
    _exact_among_matches(store, got)
    both = _ids(store, MetadataFilters(filters=[_f("topic", "geo"), _f("tags", "even", FilterOperator.CONTAINS)]))
    assert set(both) == {i for i, m in metas.items() if m["topic"] == "geo" and "even" in m["tags"]}
    either = _ids(store, MetadataFilters(condition=FilterCondition.OR, filters=[_f("topic", "geo"), _f("topic", "cs")]))
    assert set(either) == {i for i, m in metas.items() if m["topic"] in ("geo", "cs")}


def test_top_k_is_exact_among_filter_matches(store):
    got = _ids(store, MetadataFilters(filters=[_f("topic", ["hist", "food"], FilterOperator.IN)]), k=3)
    everything = _ids(store, None)
    matches = [i for i in everything if i in {n.node_id for n in store.get_nodes(filters=MetadataFilters(
        filters=[_f("topic", ["hist", "food"], FilterOperator.IN)]))}]
    assert got == matches[:3]


def test_filters_nested_too_deep_are_named(store):
    """300 levels of nested MetadataFilters raised a bare RecursionError."""
    flt = MetadataFilters(filters=[MetadataFilter(key="topic", value="x")])
    for _ in range(300):
        flt = MetadataFilters(filters=[flt])
    with pytest.raises(InvalidArgumentError, match="nested more than 32 deep"):
        store.query(VectorStoreQuery(query_str="anything", similarity_top_k=2, filters=flt))


def test_filter_values_that_mean_nothing_are_refused(store):
    for bad in (_f("topic", "med", FilterOperator.IN), _f("tags", ["a"], FilterOperator.CONTAINS),
                _f("title", 3, FilterOperator.TEXT_MATCH), _f("year", ["x"], FilterOperator.GT)):
        with pytest.raises(InvalidArgumentError):
            _ids(store, MetadataFilters(filters=[bad]))
    with pytest.raises(InvalidArgumentError, match="MetadataFilters"):
        metadata_filter({"topic": "med"})  # type: ignore[arg-type]
    # a string compared with a number is no match, not a crash
    assert _ids(store, MetadataFilters(filters=[_f("topic", 3, FilterOperator.GT)])) == []


def test_node_ids_and_doc_ids_restrict_the_search(store, docs):
    some = [docs[i].doc_id for i in (2, 7, 11, 30)]
    got = _ids(store, None, node_ids=some)
    assert set(got) == set(some)
    _exact_among_matches(store, got)
    by_doc = store.query(VectorStoreQuery(query_str=QUERIES[0], similarity_top_k=10, doc_ids=["doc-0", "doc-5"]))
    assert set(by_doc.ids) == {docs[i].doc_id for i in (0, 1, 10, 11)}
    # an empty list restricts nothing (VectorStoreIndex.as_retriever passes node_ids=[])
    assert _ids(store, None, node_ids=[]) == _ids(store, None)
    both = _ids(store, MetadataFilters(filters=[_f("topic", "hist")]), node_ids=some)
    assert set(both) == {i for i in some if store.get_nodes(node_ids=[i])[0].metadata["topic"] == "hist"}


def test_delete_by_document_delete_nodes_and_clear(store, docs):
    n = len(docs)
    store.delete("doc-3")
    assert {docs[6].doc_id, docs[7].doc_id}.isdisjoint(store.index.ids()) and len(store.index) == n - 2
    store.delete("no-such-doc")  # as in LlamaIndex's stores: nothing to delete is not an error
    assert len(store.index) == n - 2
    store.delete_nodes([docs[0].doc_id, "nope"])
    assert docs[0].doc_id not in store.index.ids()
    store.delete_nodes(filters=MetadataFilters(filters=[_f("topic", "sport")]))
    assert all(m.metadata["topic"] != "sport" for m in store.get_nodes())
    left = store.get_nodes()
    store.delete_nodes(node_ids=[x.node_id for x in left[:4]], filters=MetadataFilters(filters=[_f("topic", "med")]))
    assert {x.node_id for x in store.get_nodes()} == {x.node_id for x in left} - {
        x.node_id for x in left[:4] if x.metadata["topic"] == "med"}
    with pytest.raises(InvalidArgumentError, match="clear"):
        store.delete_nodes()
    before = store.index.ids()
    with pytest.raises(InvalidArgumentError, match="unknown keyword"):
        store.delete("doc-4", cascade=True)
    assert store.index.ids() == before
    store.clear()
    assert store.index.ids() == [] and store.get_nodes() == []
    # emptied by the user, not a misplaced store: no nodes, as SimpleVectorStore answers
    emptied = store.query(VectorStoreQuery(query_str=QUERIES[0], similarity_top_k=3))
    assert emptied.nodes == [] and emptied.ids == [] and emptied.similarities == []


@pytest.mark.asyncio
async def test_async_variants(store, docs, embed):
    q = VectorStoreQuery(query_str=QUERIES[0], similarity_top_k=4)
    assert (await store.aquery(q)).ids == store.query(q).ids
    assert [n.node_id for n in await store.aget_nodes(node_ids=[docs[5].doc_id])] == [docs[5].doc_id]
    await store.adelete("doc-0")
    await store.adelete_nodes([docs[2].doc_id])
    assert not {docs[0].doc_id, docs[1].doc_id, docs[2].doc_id} & set(store.index.ids())
    node = TextNode(id_="new", text="A brand new passage about volcanoes.",
                    embedding=await embed.aget_text_embedding("A brand new passage about volcanoes."))
    assert await store.async_add([node]) == ["new"]
    await store.aclear()
    assert store.index.ids() == []


# ---------------------------------------------------------------- what is refused, and what is kept
def test_unit_norm_embeddings_are_refused_and_nothing_is_stored(store, encoder, docs):
    before = store.index.ids()
    vecs = encoder.encode(["A passage about volcanoes.", "A passage about glaciers."])
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    nodes = [TextNode(id_=f"u{i}", text=t, embedding=v.tolist())
             for i, (t, v) in enumerate(zip(["A passage about volcanoes.", "A passage about glaciers."], unit))]
    with pytest.raises(UnitNormError, match="NormRankEmbedding") as info:
        store.add(nodes)
    assert "unit length" in str(info.value)
    assert store.index.ids() == before
    fresh = NormRankVectorStore(encoder=encoder)
    with pytest.raises(UnitNormError, match="NormRankEmbedding"):
        VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=fresh),
                         embed_model=NormRankEmbedding(encoder=encoder))
    assert fresh.index.ids() == []


def test_bad_nodes_are_refused_with_named_errors_and_the_store_unchanged(store, encoder, embed):
    before = store.index.ids()
    good = TextNode(id_="fine", text="Glaciers carve valleys.", embedding=embed.get_text_embedding("Glaciers carve valleys."))
    cases = [
        ([good, TextNode(id_="fine", text="again", embedding=good.embedding)], DuplicateIdError),
        ([TextNode(id_=before[0], text="a replacement", embedding=good.embedding[:10])],  # replaced, then refused
         (DimensionMismatchError, InvalidArgumentError)),
        ([good, TextNode(id_="blank", text="   ", embedding=good.embedding)], EmptyTextError),
        ([good, TextNode(id_="short", text="x y", embedding=good.embedding[:10])], (DimensionMismatchError,
                                                                                  InvalidArgumentError)),
        ([TextNode(id_="r", text="reserved", metadata={"normrank": 1}, embedding=good.embedding)],
         InvalidArgumentError),
        (["not a node"], InvalidArgumentError),
    ]
    for nodes, err in cases:
        with pytest.raises(err) as info:
            store.add(nodes)
        assert isinstance(info.value, NormRankError)
        assert store.index.ids() == before
    with pytest.raises(InvalidArgumentError, match="unknown keyword"):
        store.add([good], upsert=True)
    assert store.index.ids() == before


def test_a_node_id_added_again_replaces_the_node_as_in_simple_vector_store(store, embed):
    """SimpleVectorStore keeps the last node added under an id (LlamaIndex re-ingesting a document with
    deterministic node ids does that); so does normrank's LangChain store. A refused replacement keeps
    the old node."""
    from llama_index.core.vector_stores.simple import SimpleVectorStore

    n = len(store.index)
    first = TextNode(id_="n1", text="alpha beta gamma", embedding=embed.get_text_embedding("alpha beta gamma"))
    again = TextNode(id_="n1", text="gamma delta epsilon", embedding=embed.get_text_embedding("gamma delta epsilon"))
    stock = SimpleVectorStore()
    for s in (store, stock):
        s.add([first])
        assert s.add([again]) == ["n1"]
    assert len(store.index) == n + 1
    assert [x.get_content() for x in store.get_nodes(["n1"])] == ["gamma delta epsilon"]
    q = VectorStoreQuery(query_embedding=embed.get_query_embedding("gamma delta"), query_str="gamma delta",
                         similarity_top_k=1, node_ids=["n1"])
    assert store.query(q).nodes[0].get_content() == "gamma delta epsilon" and stock.query(q).ids == ["n1"]
    np.testing.assert_allclose(store.index.vectors(["n1"])[0], again.embedding, rtol=1e-6)


def test_nodes_without_embedding_are_encoded_by_the_index_encoder(encoder, docs, vectors):
    a = NormRankVectorStore(encoder=encoder, weights=BLEND)
    a.add([TextNode(id_=d.doc_id, text=d.text) for d in docs[:8]])
    b = NormRankVectorStore(encoder=encoder, weights=BLEND)
    b.add(_nodes(docs[:8], vectors[:8]))
    q = VectorStoreQuery(query_str=QUERIES[1], similarity_top_k=5)
    res_a, res_b = a.query(q), b.query(q)
    assert res_a.ids == res_b.ids and res_a.similarities == pytest.approx(res_b.similarities, abs=1e-5)


def test_explanation_never_overwrites_user_metadata(encoder, embed):
    user = {"weight": "heavy", "norm": "ISO 9001", "cosine": "law", "relevance_score": 7, "src": "a"}
    docs = [Document(text="Steel beams carry heavy loads in bridges.", id_="steel", metadata=dict(user)),
            Document(text="The Nile flows north into the Mediterranean.", id_="nile", metadata={"src": "b"}),
            Document(text="Insulin lowers the level of sugar in the blood.", id_="ins", metadata={"src": "c"})]
    store = NormRankVectorStore(encoder=encoder, weights=BLEND)
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=embed)
    [hit] = index.as_retriever(similarity_top_k=1).retrieve("bridge load weight")
    meta = hit.node.metadata
    assert {k: meta[k] for k in user} == user
    assert set(meta["normrank"]) == {"score", "cosine", "norm_feature", "weight", "norm"}
    assert meta["normrank"]["score"] == pytest.approx(hit.score)
    llm_text = hit.node.get_content(metadata_mode=MetadataMode.LLM)
    assert "heavy" in llm_text and "normrank" not in llm_text
    assert "normrank" not in hit.node.get_content(metadata_mode=MetadataMode.EMBED)
    # a node that came out of a query can be stored again (its old explanation is dropped, not refused)
    other = NormRankVectorStore(encoder=encoder)
    node = hit.node.model_copy(update={"embedding": embed.get_text_embedding(hit.node.get_content())})
    other.add([node, *(n.model_copy(update={"embedding": embed.get_text_embedding(n.get_content())})
                       for n in store.get_nodes(node_ids=[i for i in store.index.ids() if i != hit.node.node_id]))])
    assert "normrank" not in other.get_nodes(node_ids=[hit.node.node_id])[0].metadata


# ---------------------------------------------------------------- construction
def test_unknown_keyword_arguments_are_refused(encoder, embed, docs):
    with pytest.raises(InvalidArgumentError, match="similarity_top_k"):
        NormRankVectorStore(encoder=encoder, similarity_top_k=3)
    with pytest.raises(InvalidArgumentError, match="weights"):
        NormRankVectorStore(NormIndex(encoder), weights=BLEND)
    with pytest.raises(InvalidArgumentError, match="index must be"):
        NormRankVectorStore(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="unknown keyword"):
        VectorStoreIndex.from_documents(docs[:3], storage_context=StorageContext.from_defaults(
            vector_store=NormRankVectorStore(encoder=encoder)), embed_model=embed, similarity_top_k=2)
    with pytest.raises(InvalidArgumentError, match="unknown keyword"):
        NormRankVectorStore(encoder=encoder).query(VectorStoreQuery(query_str="x"), alpha=0.5)


def test_an_empty_index_warns_and_refuses_queries_unless_allowed(encoder, tmp_path):
    with pytest.warns(UserWarning, match="empty normrank index"):
        store = NormRankVectorStore(NormIndex(encoder))
    with pytest.raises(EmptyCorpusError, match="allow_empty=True"):
        store.query(VectorStoreQuery(query_str="anything", similarity_top_k=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = NormRankVectorStore(NormIndex(encoder), allow_empty=True)
        fresh = NormRankVectorStore(encoder=encoder)  # a new store is meant to be filled: no warning
    res = quiet.query(VectorStoreQuery(query_str="anything", similarity_top_k=2))
    assert res.ids == [] and res.nodes == [] and res.similarities == []
    # a new store answers no nodes, as SimpleVectorStore does (VectorStoreIndex.from_documents([]) then a query)
    assert fresh.allow_empty is True
    res = fresh.query(VectorStoreQuery(query_str="anything", similarity_top_k=2))
    assert res.ids == [] and res.nodes == [] and res.similarities == []
    assert NormRankVectorStore(encoder=encoder, allow_empty=False).allow_empty is False
    with pytest.raises(InvalidArgumentError, match="allow_empty"):
        NormRankVectorStore(encoder=encoder, allow_empty="yes")
    fresh.persist(str(tmp_path / "store.json"))  # a never-filled store persists, and reloads empty
    with pytest.warns(UserWarning, match="empty normrank index"):  # reloaded, it may be a misplaced path
        reloaded = NormRankVectorStore.from_persist_path(tmp_path / "store.json")
    with pytest.raises(EmptyCorpusError, match="allow_empty=True"):
        reloaded.query(VectorStoreQuery(query_str="anything", similarity_top_k=2))


def test_a_store_emptied_by_deletes_answers_no_nodes_and_a_misplaced_one_still_refuses(encoder, embed, tmp_path):
    """Deleting every node is what a user did, not a wrong path: no nodes, as SimpleVectorStore, also
    after a save and a reload; a never-filled index at a path still warns and refuses."""
    from llama_index.retrievers.normrank import NormRankRetriever

    index = NormIndex(encoder)
    index.add_texts(["the first note", "the second note"], ids=["a", "b"])
    store = NormRankVectorStore(index)
    vindex = VectorStoreIndex.from_vector_store(store, embed_model=embed)
    doc = Document(text="a third note about rivers", doc_id="doc-r")
    vindex.insert(doc)
    store.delete_nodes(node_ids=["a", "b"])
    vindex.delete_ref_doc("doc-r")
    assert len(index) == 0
    assert vindex.as_retriever(similarity_top_k=3).retrieve("rivers") == []
    store.persist(str(tmp_path / "emptied.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # emptied, not misplaced: no warning either
        again = NormRankVectorStore.from_persist_path(tmp_path / "emptied.json")
    assert again.query(VectorStoreQuery(query_str="rivers", similarity_top_k=2)).ids == []
    retriever = NormRankRetriever(again.index, 3)
    assert retriever.retrieve("rivers") == []


def test_it_is_a_llamaindex_vector_store(encoder):
    store = NormRankVectorStore(encoder=encoder)
    assert isinstance(store, BasePydanticVectorStore) and store.stores_text and store.is_embedding_query
    assert bool(store)  # StorageContext.from_defaults tests the store for truth
    assert store.client is store.index and isinstance(store.index, NormIndex)
    assert NormRankVectorStore.class_name() == "NormRankVectorStore"
    assert json.loads(store.to_json())["allow_empty"] is True  # a new store: answers no nodes while empty


# ---------------------------------------------------------------- pgvector backend
def test_the_same_store_over_pgvector(encoder, embed, docs, vectors, reference, pg_dsn, pg_table_factory):
    from normrank.pgvector_store import PgVectorNormIndex

    pg = PgVectorNormIndex(pg_dsn, pg_table_factory("li"), encoder, weights=BLEND)
    with pytest.warns(UserWarning, match="empty"):
        store = NormRankVectorStore(pg)
    store.add(_nodes(docs, vectors))
    index = VectorStoreIndex.from_vector_store(store, embed_model=embed)
    for q in QUERIES[:2]:
        _same_as_reference(index.as_retriever(similarity_top_k=5).retrieve(q), reference.search(q, 5))
    first = index.as_retriever(similarity_top_k=1).retrieve(QUERIES[0])[0].node.ref_doc_id
    store.delete(first)
    assert first not in {n.ref_doc_id for n in store.get_nodes()}
    store.persist("ignored")  # PostgreSQL already holds everything: a no-op, not an error
    store.clear()
    assert pg.ids() == []
    pg.drop()


# ---------------------------------------------------------------- LlamaIndex's document life cycle
@pytest.mark.asyncio
async def test_insert_delete_update_and_refresh_documents_through_the_index(encoder, embed):
    texts = ["Insulin lowers blood sugar.", "The Nile flows north.", "Rome fell in 476.",
             "Bees make honey from nectar.", "Light travels fast in a vacuum."]
    docs = [Document(text=t, id_=f"d{i}") for i, t in enumerate(texts)]
    store = NormRankVectorStore(encoder=encoder)
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=embed)

    def top(q: str) -> str:
        return index.as_retriever(similarity_top_k=1).retrieve(q)[0].node.ref_doc_id

    index.insert(Document(text="Volcanoes erupt molten lava.", id_="lava"))
    assert top("eruption of a volcano") == "lava"
    index.delete_ref_doc("lava")
    assert "lava" not in {n.ref_doc_id for n in store.get_nodes()}
    index.update_ref_doc(Document(text="Glaciers carve deep valleys.", id_="d0"))
    assert top("ice sheets shaping valleys") == "d0" and len(store.index) == len(texts)
    changed = index.refresh_ref_docs([Document(text="Bees make honey from nectar.", id_="d3"),
                                      Document(text="Owls hunt at night.", id_="d2")])
    assert changed == [False, True] and top("nocturnal birds") == "d2" and len(store.index) == len(texts)
    await index.ainsert(Document(text="Sourdough bread rises slowly.", id_="bread"))
    assert (await index.as_retriever(similarity_top_k=1).aretrieve("baking bread"))[0].node.ref_doc_id == "bread"
    await index.adelete_ref_doc("bread")
    assert "bread" not in {n.ref_doc_id for n in store.get_nodes()}


def test_normrank_retriever_over_a_stores_index_returns_the_stores_nodes(built, embed, model_calls):
    """``NormRankRetriever(store.index)`` gave TextNodes whose metadata held LlamaIndex's internals
    (``_node_content``, ``_node_type``, ...) and lost the node's relationships; it now rebuilds the node the
    store wrote, uses a raw ``QueryBundle.embedding`` instead of encoding the query again, and takes a
    NumPy integer for ``similarity_top_k``."""
    from llama_index.core.schema import QueryBundle
    from llama_index.retrievers.normrank import NormRankRetriever

    store, index = built
    via_store = index.as_retriever(similarity_top_k=4).retrieve(QUERIES[1])
    retriever = NormRankRetriever(store.index, similarity_top_k=np.int64(4))
    mine = retriever.retrieve(QUERIES[1])
    assert [(n.node.node_id, n.score) for n in mine] == [(n.node.node_id, pytest.approx(n.score)) for n in via_store]
    for a, b in zip(mine, via_store):
        assert a.node.metadata == b.node.metadata and not any(k.startswith("_node") for k in a.node.metadata)
        assert a.node.ref_doc_id == b.node.ref_doc_id and a.node.relationships == b.node.relationships
        assert a.node.get_content(metadata_mode=MetadataMode.LLM) == b.node.get_content(metadata_mode=MetadataMode.LLM)
    vector = embed.get_query_embedding(QUERIES[1])
    calls = model_calls.calls
    by_vector = retriever.retrieve(QueryBundle(query_str=QUERIES[1], embedding=vector))
    assert model_calls.calls == calls  # the raw embedding is the query: no second model call
    assert [(n.node.node_id, n.score) for n in by_vector] == [(n.node.node_id, pytest.approx(n.score)) for n in mine]
    unit = list(np.asarray(vector) / np.linalg.norm(vector))  # not raw: the text is encoded instead
    assert [n.node.node_id for n in retriever.retrieve(QueryBundle(query_str=QUERIES[1], embedding=unit))] == [
        n.node.node_id for n in mine]


def test_nan_metadata_on_a_node_is_named_and_nothing_is_stored(encoder, embed, docs, vectors):
    """LlamaIndex's JSON of a node turns NaN into null before the index sees it: it was stored as None."""
    from normrank.errors import InvalidMetadataError

    store = NormRankVectorStore(encoder=encoder, weights=BLEND)
    store.add(_nodes(docs[:3], vectors[:3]))
    bad = _nodes(docs[3:5], vectors[3:5])
    bad[1].metadata["x"] = float("nan")
    with pytest.raises(InvalidMetadataError, match=rf"node {bad[1].node_id!r} metadata\['x'\] is nan"):
        store.add(bad)
    # a lone surrogate in a node's text or a metadata key is named by node id too, not as "text 0"
    from normrank.errors import InvalidTextError

    for node in (TextNode(id_="n1", text="bad \udcff text"), TextNode(id_="n2", text="fine", metadata={"k\udcff": 1})):
        with pytest.raises(InvalidTextError, match=f"node '{node.node_id}' (text|metadata key)"):
            store.add([node])
    assert len(store.index) == 3


def test_a_never_filled_store_persists_reloads_and_fills(encoder, embed, docs, tmp_path):
    """``VectorStoreIndex([])`` then ``persist`` raised EmptyCorpusError after LlamaIndex had written its
    own files, leaving a folder that no longer loaded; it now persists empty and fills after a reload."""
    store = NormRankVectorStore(encoder=encoder, weights=BLEND)
    index = VectorStoreIndex([], storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed)
    index.storage_context.persist(tmp_path)
    loaded = NormRankVectorStore.from_persist_dir(tmp_path, allow_empty=True)
    assert len(loaded.index) == 0 and loaded.index.weights == BLEND
    again = load_index_from_storage(StorageContext.from_defaults(vector_store=loaded, persist_dir=tmp_path),
                                    embed_model=embed)
    assert again.as_retriever(similarity_top_k=2).retrieve(QUERIES[0]) == []
    for d in docs[:6]:
        again.insert(d)
    top = again.as_retriever(similarity_top_k=1).retrieve(docs[2].text)[0]
    assert top.node.ref_doc_id == docs[2].doc_id and len(loaded.index) == 6


def test_two_handles_on_one_pgvector_table_query_and_delete_without_spurious_errors(encoder, docs, vectors, pg_dsn,
                                                                                    pg_table_factory):
    """On pgvector another handle (another process) can delete between this store's count and search, or
    between listing a document's nodes and deleting them: the query failed with "k of 34 is larger than the
    number of documents (33)" and a second delete of one document raised UnknownIdError. A query now reads
    one snapshot of the table (``PgVectorNormIndex.consistent_reads``): a delete committed while it runs is
    not seen, and the answer is the one of the state it began with."""
    from normrank.pgvector_store import PgVectorNormIndex

    table = pg_table_factory("li")
    a = NormRankVectorStore(PgVectorNormIndex(pg_dsn, table, encoder))
    b = NormRankVectorStore(PgVectorNormIndex(pg_dsn, table, encoder))
    try:
        a.add(_nodes(docs[:8], vectors[:8]))
        real_search, real_delete = a.index.search, a.index.delete
        removed: list[str] = []

        def search_after_another_delete(*args, **kwargs):
            if not removed:
                removed.append(b.index.ids()[0])
                b.index.delete(removed[-1:])  # between a's count and a's search
            return real_search(*args, **kwargs)

        a.index.search = search_after_another_delete
        res = a.query(VectorStoreQuery(query_embedding=list(map(float, vectors[0])), similarity_top_k=100))
        assert len(res.ids) == 8 and removed[0] in res.ids  # every node of the state the query began with
        res = a.query(VectorStoreQuery(query_embedding=list(map(float, vectors[0])), similarity_top_k=100))
        assert len(res.ids) == 7 and removed[0] not in res.ids  # the next query sees the delete

        doc = docs[1].doc_id

        def delete_after_another(ids):
            if real_delete.__self__ is a.index and not getattr(delete_after_another, "done", False):
                delete_after_another.done = True
                b.delete(doc)  # the other handle deletes the same document first
            return real_delete(ids)

        a.index.delete = delete_after_another
        a.delete(doc)  # nothing left to delete: nothing happens, as documented
        assert not [r for r in b.index.get(b.index.ids()) if r.metadata.get("ref_doc_id") == doc]
    finally:
        a.index.close()
        b.index.close()


def test_index_nodes_do_not_hide_the_text_nodes(encoder, embed):
    """``VectorStoreIndex.as_retriever`` passes its ``nodes_dict`` as ``node_ids``; for a store that keeps the
    text that lists only ``IndexNode``/``ImageNode`` nodes. Read as a restriction, one ``IndexNode``
    (recursive retrieval) hid every text node. The ranking must be ``SimpleVectorStore``'s, and an explicit
    restriction to text nodes still restricts."""
    from llama_index.core.schema import IndexNode
    from llama_index.core.vector_stores.simple import SimpleVectorStore

    texts = ["Photosynthesis turns light into sugar in plants.", "The Great Wall of China is long.",
             "Mitochondria produce energy for the cell."]
    ranked = {}
    for kind in ("simple", "normrank"):
        store = SimpleVectorStore() if kind == "simple" else NormRankVectorStore(encoder=encoder)
        nodes = [TextNode(text=t, id_=f"t{i}") for i, t in enumerate(texts)]
        nodes.append(IndexNode(text="Summary: a table about walls and fortifications.", index_id="walls", id_="idx0"))
        vindex = VectorStoreIndex(nodes, embed_model=embed, storage_context=StorageContext.from_defaults(vector_store=store))
        assert list(vindex.index_struct.nodes_dict.values()) == (["idx0"] if kind == "normrank" else [
            "t0", "t1", "t2", "idx0"])
        ranked[kind] = [h.node.node_id for h in vindex.as_retriever(similarity_top_k=3).retrieve(
            "how do plants make sugar")]
    assert ranked["normrank"] == ranked["simple"] and len(ranked["normrank"]) == 3 and "t0" in ranked["normrank"]
    q = VectorStoreQuery(query_embedding=embed.get_query_embedding("walls"), query_str="walls", similarity_top_k=3,
                         node_ids=["t0", "t2"])
    assert sorted(store.query(q).ids) == ["t0", "t2"]
    # a reference node deleted around this store (through another store on the same index) stays in the
    # nodes_dict beside the held ones: still not a restriction (read as one, it hid every text node)
    store.add([IndexNode(text="Summary: a table about cells.", index_id="cells", id_="idx1",
                         embedding=embed.get_text_embedding("Summary: a table about cells."))])
    store.index.delete(["idx1"])
    assert len(store.query(VectorStoreQuery(query_embedding=q.query_embedding, similarity_top_k=4,
                                            node_ids=["idx0", "idx1"])).ids) == 4


@pytest.mark.parametrize("how", ["delete_nodes", "delete_ref_doc", "clear"])
def test_deleting_the_index_nodes_leaves_the_text_nodes_retrievable(encoder, embed, how):
    """LlamaIndex keeps a deleted node in the ``nodes_dict`` of a store that keeps the text, and passes it
    as ``node_ids`` on every retrieval. Once the only ``IndexNode`` was deleted, that named nothing the
    store held and every retrieval came back empty; ``SimpleVectorStore`` returns the text nodes. An
    explicit restriction to ids that were never reference nodes still restricts."""
    from llama_index.core import Document
    from llama_index.core.schema import IndexNode, NodeRelationship, RelatedNodeInfo
    from llama_index.core.vector_stores.simple import SimpleVectorStore

    got = {}
    for kind in ("simple", "normrank"):
        store = SimpleVectorStore() if kind == "simple" else NormRankVectorStore(encoder=encoder)
        inode = IndexNode(text="A summary table about French cities.", index_id="t0", id_="in1")
        inode.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id="report")
        nodes = [TextNode(text="Paris is the capital of France.", id_="t0"),
                 TextNode(text="Berlin is the capital of Germany.", id_="t1"), inode]
        vindex = VectorStoreIndex(nodes, embed_model=embed, storage_context=StorageContext.from_defaults(vector_store=store))
        if how == "delete_nodes":
            vindex.delete_nodes(["in1"])
        elif how == "delete_ref_doc":
            vindex.delete_ref_doc("report")
        else:
            store.clear()
            vindex.insert(Document(text="Madrid is the capital of Spain.", id_="madrid"))
        got[kind] = sorted(n.node.get_content() for n in vindex.as_retriever(similarity_top_k=5).retrieve("capital"))
    assert got["normrank"] == got["simple"] and got["normrank"]
    q = VectorStoreQuery(query_embedding=embed.get_query_embedding("capital"), similarity_top_k=3, node_ids=["gone"])
    assert store.query(q).ids == []


def test_deleted_index_nodes_are_known_after_persist_and_reload(encoder, embed, tmp_path):
    """The deleted reference-node ids are saved with the index (``NormIndex.adapter_state``): a store persisted
    after deleting its only ``IndexNode`` and loaded again read the ``nodes_dict`` LlamaIndex still passes
    (``['in1']``) as a restriction to a node it does not hold, and every retrieval came back empty."""
    from llama_index.core.schema import IndexNode

    store = NormRankVectorStore(encoder=encoder)
    nodes = [TextNode(text="Paris is the capital of France.", id_="t0"),
             TextNode(text="Berlin is the capital of Germany.", id_="t1"),
             IndexNode(text="A summary table about French cities.", index_id="t0", id_="in1")]
    vindex = VectorStoreIndex(nodes, embed_model=embed, storage_context=StorageContext.from_defaults(vector_store=store))
    vindex.delete_nodes(["in1"])
    before = [(n.node.node_id, n.score) for n in vindex.as_retriever(similarity_top_k=5).retrieve("capital")]
    assert sorted(i for i, _ in before) == ["t0", "t1"]
    vindex.storage_context.persist(tmp_path)
    loaded = NormRankVectorStore.from_persist_dir(tmp_path, encoder=encoder)
    again = load_index_from_storage(StorageContext.from_defaults(vector_store=loaded, persist_dir=tmp_path),
                                    embed_model=embed)
    assert list(again.index_struct.nodes_dict.values()) == ["in1"]  # what LlamaIndex passes as node_ids
    after = [(n.node.node_id, n.score) for n in again.as_retriever(similarity_top_k=5).retrieve("capital")]
    assert after == [(i, pytest.approx(s)) for i, s in before]
    # an explicit restriction to a node the store never held still restricts
    q = VectorStoreQuery(query_embedding=embed.get_query_embedding("capital"), similarity_top_k=3, node_ids=["gone"])
    assert loaded.query(q).ids == []


def test_store_nodes_override_ranks_as_the_default_index(encoder, embed, demo_texts):
    """``store_nodes_override=True`` lists every node in ``nodes_dict``, which LlamaIndex passes as
    ``node_ids``: naming every node the store holds restricts nothing and is read so (as a Python filter it
    cost 0.75 s a query at 20k nodes); naming all but one still excludes that one."""
    texts = list(demo_texts)
    nodes = lambda: [TextNode(text=t, id_=f"o{i}") for i, t in enumerate(texts)]  # noqa: E731
    plain = NormRankVectorStore(encoder=encoder, weights=Weights(a=0.05))
    over = NormRankVectorStore(encoder=encoder, weights=Weights(a=0.05))
    a = VectorStoreIndex(nodes(), embed_model=embed, storage_context=StorageContext.from_defaults(vector_store=plain))
    b = VectorStoreIndex(nodes(), embed_model=embed, storage_context=StorageContext.from_defaults(vector_store=over),
                         store_nodes_override=True)
    assert len(b.index_struct.nodes_dict) == len(texts)
    for q in ("how do vaccines work", "stars and their lifetimes"):
        want = [(n.node.node_id, n.score) for n in a.as_retriever(similarity_top_k=5).retrieve(q)]
        assert [(n.node.node_id, n.score) for n in b.as_retriever(similarity_top_k=5).retrieve(q)] == want
        some = [i for i in dict(b.index_struct.nodes_dict).values() if i != want[0][0]]
        got = over.query(VectorStoreQuery(query_embedding=embed.get_query_embedding(q), query_str=q,
                                          similarity_top_k=5, node_ids=some))
        assert want[0][0] not in got.ids and len(got.ids) == 5


def test_metadata_too_big_as_stored_is_refused_by_node_id(encoder, embed):
    """LlamaIndex stores a node's metadata again inside _node_content, and once more per related node: 300 KB
    of metadata on a split document was refused as "metadata 1 is larger than 1,000,000 bytes" (a batch
    position). The error names the node and why; nothing of the batch is stored; the same metadata on
    nodes without relationships is stored."""
    from llama_index.core import Document
    from llama_index.core.node_parser import SentenceSplitter

    from normrank.errors import InvalidMetadataError

    doc = Document(text="Stars fuse hydrogen into helium in their cores. " * 40, id_="doc",
                   metadata={"raw_html": "x" * 300_000},
                   excluded_embed_metadata_keys=["raw_html"], excluded_llm_metadata_keys=["raw_html"])
    nodes = SentenceSplitter(chunk_size=128, chunk_overlap=0).get_nodes_from_documents([doc])
    for n in nodes:
        n.embedding = embed.get_text_embedding(n.get_content(metadata_mode=MetadataMode.EMBED))
    store = NormRankVectorStore(encoder=encoder)
    with pytest.raises(InvalidMetadataError, match=r"node '.+' as LlamaIndex stores it .*source, previous, next"):
        store.add(nodes)
    assert len(store.index) == 0
    plain = [TextNode(text=n.get_content(), id_=f"p{i}", metadata={"raw_html": "x" * 300_000},
                      embedding=n.embedding) for i, n in enumerate(nodes[:2])]
    assert store.add(plain) == ["p0", "p1"]


def test_an_index_whose_model_folder_moved_still_answers_vector_queries(tmp_path, demo_texts):
    """With its model folder gone, an index opens with a MissingModelEncoder. LlamaIndex sends a query's
    embedding with its text, and the store counted the text's tokens with the index's encoder even for a
    fixed blend, which needs no count: every retrieval failed. A re-ranker built on such an index names the
    missing folder instead of 'encoder must be a RawEncoder'."""
    import shutil

    from llama_index.postprocessor.normrank import NormRankPostprocessor

    from normrank import ModelLoadError, RawEncoder
    from normrank.encoders import default_model_path

    folder = tmp_path / "model"
    shutil.copytree(default_model_path(), folder)
    index = NormIndex(RawEncoder(str(folder)), weights=Weights(a=0.05))
    index.add_texts(demo_texts, ids=[f"d{i}" for i in range(len(demo_texts))])
    want = [h.id for h in index.search("how do vaccines work", 3)]
    index.save(tmp_path / "idx")
    moved = tmp_path / "moved"
    folder.rename(moved)
    loaded = NormIndex.load(tmp_path / "idx")
    vindex = VectorStoreIndex.from_vector_store(NormRankVectorStore(loaded),
                                                embed_model=NormRankEmbedding(model=str(moved)))
    assert [n.node.node_id for n in vindex.as_retriever(similarity_top_k=3).retrieve("how do vaccines work")] == want
    from llama_index.core.schema import QueryBundle
    from llama_index.retrievers.normrank import NormRankRetriever

    bundle = QueryBundle(query_str="how do vaccines work",
                         embedding=NormRankEmbedding(model=str(moved)).get_query_embedding("how do vaccines work"))
    assert [n.node.node_id for n in NormRankRetriever(loaded, 3).retrieve(bundle)] == want
    with pytest.raises(ModelLoadError, match="is not on this machine"):
        NormRankPostprocessor.from_index(loaded)
    with pytest.raises(ModelLoadError, match="is not on this machine"):
        NormRankEmbedding(encoder=loaded.encoder)


def test_queries_with_an_embedding_and_text_survive_a_blend_switching_b_in_another_thread(encoder):
    """The store and the retriever left the token count out under a fixed blend (b = 0), read outside the
    search; a set_weights to b != 0 in between failed the query with "a query vector was given without its
    token count" (9 of 400 queries), which neither blend gives alone. Every answer is now one of the two."""
    from llama_index.core import QueryBundle
    from llama_index.retrievers.normrank import NormRankRetriever

    rng = np.random.default_rng(0)
    store = NormRankVectorStore(encoder=encoder, weights=Weights(a=0.02))
    store.add([TextNode(id_=f"n{i}", text=f"node number {i} " + "word " * (i % 30),
                        embedding=(rng.standard_normal(384) * rng.uniform(0.5, 2)).tolist()) for i in range(300)])
    qv = (rng.standard_normal(384) * 1.7).tolist()
    text = "how long do massive stars live"
    query = VectorStoreQuery(query_embedding=qv, query_str=text, similarity_top_k=5)
    retriever = NormRankRetriever(index=store.index, similarity_top_k=5)
    bundle = QueryBundle(query_str=text, embedding=qv)
    blends = (Weights(a=0.02), Weights(a=0.0, b=0.02))
    serial = set()
    for w in blends:
        store.index.set_weights(w)
        serial.add(tuple(store.query(query).ids))
        assert tuple(n.node.node_id for n in retriever.retrieve(bundle)) in serial
    stop = threading.Event()
    answers: list[tuple] = []
    errors: list[str] = []

    def toggle() -> None:
        for i in range(1500):
            store.index.set_weights(blends[i % 2])
        stop.set()

    def ask() -> None:
        while not stop.is_set():
            try:
                answers.append(tuple(store.query(query).ids))
                answers.append(tuple(n.node.node_id for n in retriever.retrieve(bundle)))
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=toggle), threading.Thread(target=ask)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert answers and set(answers) <= serial


def test_the_documented_splitter_leaves_no_node_cut(encoder, embed):
    """The README's splitter counts with the model's own tokenizer. The one it gave before (chunk_size=256 by
    LlamaIndex's token counts) left 16-20% of scientific nodes cut at MiniLM's 256-token window."""
    import gzip
    from pathlib import Path

    from llama_index.core.node_parser import SentenceSplitter

    data = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "scifact" / "corpus.jsonl.gz"
    if not data.is_file():
        pytest.skip("needs ../shared/data/scifact")
    with gzip.open(data, "rt", encoding="utf-8") as fh:
        rows = [json.loads(next(fh)) for _ in range(12)]
    texts = [" ".join(r["title"] + ". " + r["text"] for r in rows[i:i + 4]) for i in range(0, 12, 4)]
    store = NormRankVectorStore(encoder=encoder)
    before = encoder.truncated_texts
    splitter = SentenceSplitter(chunk_size=250, chunk_overlap=25, tokenizer=embed.encoder.tokenize)
    VectorStoreIndex.from_documents([Document(text=t, metadata={"source": "scifact"}) for t in texts],
                                    embed_model=embed, transformations=[splitter],
                                    storage_context=StorageContext.from_defaults(vector_store=store))
    assert len(store.client) > 3 * 4 and encoder.truncated_texts == before
    assert all(encoder.tokenize(t) == encoder.model.tokenizer.tokenize(t) for t in texts)  # the model's tokens

    # Splitting in threads beside encoding: the recipe shared the encoder's own tokenizer, whose every call
    # resets its truncation, and an encode in another thread got bare torch size errors or a 300-480-token
    # text embedded uncut. encoder.tokenize counts on a private copy.
    long_texts = [" ".join(r["title"] + ". " + r["text"] for r in rows[i:i + 2]) for i in range(0, 12, 2)]
    want = {t: embed.get_query_embedding(t) for t in long_texts}
    errors: list[BaseException] = []
    stop = threading.Event()

    def split() -> None:
        while not stop.is_set():
            splitter.get_nodes_from_documents([Document(text=t) for t in texts])

    def encode() -> None:
        try:
            for _ in range(6):
                for t in long_texts:
                    if embed.get_query_embedding(t) != want[t]:
                        errors.append(AssertionError(f"another vector for a text of {len(t)} characters"))
        except Exception as exc:  # noqa: BLE001 - any error is the failure
            errors.append(exc)

    splitters = [threading.Thread(target=split) for _ in range(2)]
    encoder_thread = threading.Thread(target=encode)
    for t in (*splitters, encoder_thread):
        t.start()
    encoder_thread.join()
    stop.set()
    for t in splitters:
        t.join()
    assert not errors, errors[:3]


def test_deleted_index_nodes_are_known_to_another_pgvector_handle(encoder, embed, pg_dsn, pg_table_factory):
    """On pgvector the deleted reference-node ids go to the table's state row, so a store opened by another
    process reads LlamaIndex's ``nodes_dict`` (``['in1']``) as it should; only the deleting handle knew them."""
    from llama_index.core.schema import IndexNode

    from normrank.pgvector_store import PgVectorNormIndex

    table = pg_table_factory("li")
    a = NormRankVectorStore(PgVectorNormIndex(pg_dsn, table, encoder))
    try:
        nodes = [TextNode(text="Paris is the capital of France.", id_="t0"),
                 TextNode(text="Berlin is the capital of Germany.", id_="t1"),
                 IndexNode(text="A summary table about French cities.", index_id="t0", id_="in1")]
        VectorStoreIndex(nodes, embed_model=embed, storage_context=StorageContext.from_defaults(vector_store=a))
        a.delete_nodes(["in1"])
        b = NormRankVectorStore(PgVectorNormIndex(pg_dsn, table, encoder))
        try:
            q = VectorStoreQuery(query_embedding=embed.get_query_embedding("capital"), query_str="capital",
                                 similarity_top_k=5, node_ids=["in1"])
            assert sorted(b.query(q).ids) == ["t0", "t1"]
            assert b.client.adapter_state == {"llama_index": {"deleted_reference_nodes": ["in1"]}}
            gone = VectorStoreQuery(query_embedding=embed.get_query_embedding("capital"), similarity_top_k=3,
                                    node_ids=["never"])
            assert b.query(gone).ids == []
        finally:
            b.client.close()
    finally:
        a.client.close()


@pytest.mark.parametrize("mode", ["reciprocal_rerank", "relative_score", "dist_based_score", "simple"])
def test_query_fusion_merges_normrank_results_as_it_merges_stock_ones(encoder, embed, docs, mode):
    """``QueryFusionRetriever`` merges results by ``node.hash`` (text + metadata). The per-query explanation
    in the metadata gave the same node another hash for every query: never merged, 4 of 5 nodes came back
    with unfused scores. The explained node hashes as the node itself, and still carries the explanation."""
    import copy

    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.core.vector_stores.simple import SimpleVectorStore

    got = {}
    for kind in ("simple", "normrank"):
        store = SimpleVectorStore() if kind == "simple" else NormRankVectorStore(encoder=encoder)
        index = VectorStoreIndex([TextNode(text=d.text, id_=d.doc_id) for d in docs[:40]], embed_model=embed,
                                 storage_context=StorageContext.from_defaults(vector_store=store))
        fusion = QueryFusionRetriever([index.as_retriever(similarity_top_k=5)], llm=MockLLM(), similarity_top_k=5,
                                      num_queries=4, use_async=False, mode=mode)
        got[kind] = [(n.node.node_id, round(n.score, 6)) for n in fusion.retrieve("how do vaccines work")]
    assert got["normrank"] == got["simple"] and len(got["normrank"]) == 5
    node = index.as_retriever(similarity_top_k=1).retrieve("how do vaccines work")[0].node
    assert "normrank" in node.metadata and isinstance(node, TextNode) and node.class_name() == "TextNode"
    bare = TextNode(text=node.text, id_=node.node_id, metadata={k: v for k, v in node.metadata.items()
                                                               if k != "normrank"})
    assert node.hash == bare.hash and copy.deepcopy(node).hash == bare.hash
    assert type(TextNode.from_dict(node.to_dict())) is TextNode
