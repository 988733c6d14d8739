"""Metadata filters on a real FAISS ``NormIndex``: JSON equality, operators, and named errors at the door.

The reference for every filtered search is the unfiltered exact ranking with the filter applied by
hand in Python, so the operators are checked against what they mean, not against their own code.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from normrank.errors import InvalidArgumentError, InvalidMetadataError
from normrank.filters import check_filter, is_plain, same
from normrank.scoring import Weights
from normrank.store import NormIndex
from tests.conftest import synthetic

DIM = 32


def _metas(n: int) -> list[dict]:
    out = []
    for i in range(n):
        m: dict = {"n": i % 10, "flag": [True, False, 1, 0][i % 4], "topic": ["cs", "bio", "phys"][i % 3]}
        if i % 5 == 0:
            m["score"] = i / 7
        if i % 6 == 0:
            m["tags"] = ["a", "b"]
        if i % 7 == 0:
            m["label"] = "Zeta" if i % 2 else "alpha"
        out.append(m)
    return out


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(3)
    n = 240
    raw = (rng.standard_normal((n, DIM)) * rng.uniform(0.5, 2.0, (n, 1))).astype(np.float32)
    counts = rng.integers(5, 200, n)
    ids = [f"d{i}" for i in range(n)]
    metas = _metas(n)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(raw, counts, ids=ids, metadatas=metas)
    queries = rng.standard_normal((4, DIM)).astype(np.float32)
    return index, ids, metas, queries


def _want(index, metas, ids, q, k, keep):
    """The exact ranking of every document, kept by ``keep`` (a plain Python predicate)."""
    everything = index.search(q, len(ids))
    by_id = dict(zip(ids, metas))
    return [h.id for h in everything if keep(by_id[h.id])][:k]


CASES = [
    ({"topic": "cs"}, lambda m: m["topic"] == "cs"),
    ({"flag": True}, lambda m: m["flag"] is True),  # JSON: true is not 1
    ({"flag": 1}, lambda m: m["flag"] == 1 and m["flag"] is not True),
    ({"flag": [False, 1]}, lambda m: m["flag"] is False or (m["flag"] == 1 and m["flag"] is not True)),
    ({"n": 3.0}, lambda m: m["n"] == 3),  # 3 is 3.0
    ({"score": None}, lambda m: "score" not in m),  # a missing key reads as None
    ({"n": {"$eq": 4}}, lambda m: m["n"] == 4),
    ({"n": {"$ne": 4}}, lambda m: m["n"] != 4),
    ({"n": {"$gt": 6}}, lambda m: m["n"] > 6),
    ({"n": {"$gte": 6, "$lt": 8}}, lambda m: 6 <= m["n"] < 8),
    ({"score": {"$lte": 10}}, lambda m: "score" in m and m["score"] <= 10),
    ({"label": {"$gt": "Z"}}, lambda m: "label" in m and m["label"] > "Z"),  # code points: "alpha" > "Z"
    ({"topic": {"$gt": 3}}, lambda m: False),  # no order between a string and a number
    ({"topic": {"$in": ["bio", "phys"]}}, lambda m: m["topic"] in ("bio", "phys")),
    ({"topic": {"$nin": ["bio", "phys"]}}, lambda m: m["topic"] == "cs"),
    ({"score": {"$exists": True}}, lambda m: "score" in m),
    ({"score": {"$exists": False}, "topic": "bio"}, lambda m: "score" not in m and m["topic"] == "bio"),
    ({"score": {"$ne": 0.0}}, lambda m: m.get("score") != 0.0),  # $ne matches a missing key
    ({"tags": ["a", "b"]}, lambda m: False),  # a list is a list of accepted values, not a value
    ({"tags": {"$eq": ["a", "b"]}}, lambda m: m.get("tags") == ["a", "b"]),
    ({"$or": [{"n": 1}, {"topic": "phys", "n": {"$lt": 3}}]},
     lambda m: m["n"] == 1 or (m["topic"] == "phys" and m["n"] < 3)),
    ({"$and": [{"n": {"$gte": 2}}, {"$not": {"topic": "cs"}}]}, lambda m: m["n"] >= 2 and m["topic"] != "cs"),
    ({"$not": {"flag": {"$in": [True, False]}}}, lambda m: not isinstance(m["flag"], bool)),
]


@pytest.mark.parametrize(("flt", "keep"), CASES, ids=[str(c[0]) for c in CASES])
def test_filters_mean_what_they_say(corpus, flt, keep):
    index, ids, metas, queries = corpus
    matching = sum(keep(m) for m in metas)
    for q in queries[:2]:
        k = min(7, max(matching, 1))
        if matching == 0:
            assert index.search(q, 5, filter=flt) == []
            continue
        assert [h.id for h in index.search(q, k, filter=flt)] == _want(index, metas, ids, q, k, keep)
    got = index.search_batch(list(queries), 5, filter=flt)
    arrays = index.search_arrays(list(queries), 5, filter=flt)
    for q, hits, row in zip(queries, got, arrays.ids):
        assert [h.id for h in hits] == _want(index, metas, ids, q, 5, keep) == list(row)


@pytest.mark.parametrize("flt", [
    {"n": math.nan}, {"n": [1, math.inf]}, {"n": {"$gt": math.nan}}, {"$or": [{"n": {"$in": [-math.inf]}}]},
])
def test_nan_and_infinity_in_a_filter_are_named(corpus, flt):
    index, _, _, queries = corpus
    with pytest.raises(InvalidMetadataError, match="finite"):
        index.search(queries[0], 5, filter=flt)
    with pytest.raises(InvalidMetadataError):
        index.search_batch(list(queries), 5, filter=flt)


@pytest.mark.parametrize(("flt", "words"), [
    ({"n": {"$regex": "x"}}, "unknown operator '\\$regex'"),
    ({"$nor": [{"n": 1}]}, "unknown operator '\\$nor' at the top level"),
    ({"n": {"$in": 3}}, "\\$in takes a list"),
    ({"n": {"$exists": 1}}, "\\$exists takes true or false"),
    ({"n": {"$gt": [1]}}, "compares numbers or strings"),
    ({"n": {"$gt": 1, "x": 2}}, "mixes operators with the plain key 'x'"),
    ({"$and": []}, "\\$and takes a non-empty list"),
    ({"$or": [{"n": 1}, "n"]}, "\\$or takes a non-empty list"),
    ({"$not": [{"n": 1}]}, "\\$not takes a non-empty filter dict"),
    ({1: "x"}, "keys must be strings"),
    ("topic=cs", "filter must be a dict or a callable"),
    # from a web request: nested operators raised a bare RecursionError (a security review)
    (json.loads('{"$not": ' * 400 + '{"n": 1}' + '}' * 400), "nested more than 32 deep"),
    (json.loads('{"$and": [' * 200 + '{"n": 1}' + ']}' * 200), "nested more than 32 deep"),
])
def test_bad_filters_are_named_before_any_work(corpus, flt, words):
    index, ids, _, queries = corpus
    before = index.search(queries[0], 5)
    with pytest.raises(InvalidArgumentError, match=words):
        index.search(queries[0], 5, filter=flt)
    with pytest.raises(InvalidArgumentError, match=words):
        index.search_arrays(list(queries), 5, filter=flt)
    assert index.search(queries[0], 5) == before and len(index) == len(ids)


def test_check_filter_keeps_plain_dicts_and_compiles_operators():
    plain = {"topic": "cs", "n": [1, 2]}
    assert check_filter(plain) == plain and is_plain(plain)
    # plain values as metadata is stored: keys as strings, tuples as lists (JSON's reading)
    assert check_filter({"k": {1: "a"}, "t": (1, 2)}) == {"k": {"1": "a"}, "t": [1, 2]}
    assert check_filter(None) is None and check_filter({}) is None
    pred = check_filter({"n": {"$gt": 1}})
    assert callable(pred) and pred({"n": 2}) and not pred({"n": 1}) and not pred({})
    fn = lambda m: m["n"] > 1
    guarded = check_filter(fn)
    assert guarded({"n": 2}) is True and guarded({"n": 0}) is False and check_filter(guarded) is guarded
    # a filter written for LangChain's InMemoryVectorStore (it gets a Document): a named error that says why
    with pytest.raises(InvalidArgumentError, match="metadata dict") as info:
        check_filter(lambda doc: doc.metadata["n"] > 1)({"n": 2})
    assert isinstance(info.value.__cause__, AttributeError)
    assert same(True, True) and not same(True, 1) and not same(0, False) and same(1, 1.0)
    assert same([1, {"a": True}], (1, {"a": True})) and not same([1, {"a": True}], [1, {"a": 1}])


def test_pgvector_gives_the_same_filtered_results(corpus, pg_dsn, pg_table_factory):
    """Plain dicts run in SQL (jsonb equality), operator filters in Python: both equal FAISS's answers,
    including ``true`` against ``1``, where Python's ``==`` and JSON disagree."""
    from normrank.pgvector_store import PgVectorNormIndex

    index, ids, metas, queries = corpus
    raw = index.vectors(ids)
    counts = index.get(ids)
    pg = PgVectorNormIndex(pg_dsn, pg_table_factory("filters"), weights=index.weights)
    try:
        pg.add_vectors(raw, [r.token_count for r in counts], ids=ids, metadatas=metas)
        for flt, _ in CASES:
            want = [[h.id for h in row] for row in index.search_batch(list(queries), 5, filter=flt)]
            got = [[h.id for h in row] for row in pg.search_batch(list(queries), 5, filter=flt, exact=True)]
            assert got == want, flt
        with pytest.raises(InvalidMetadataError):
            pg.search(queries[0], 5, filter={"n": {"$gt": math.nan}})
        with pytest.raises(InvalidArgumentError, match="unknown operator"):
            pg.search(queries[0], 5, filter={"n": {"$regex": "x"}})
    finally:
        pg.close()


def test_a_plain_filter_matches_what_the_same_value_became_when_stored():
    """Metadata {"k": {1: "a"}} is stored as {"k": {"1": "a"}}; the same value as a plain filter matched
    nothing on FAISS (pgvector and the $eq form matched)."""
    vecs, counts = synthetic(4, dim=8, seed=1)
    index = NormIndex(dim=8)
    index.add_vectors(vecs, counts, ids=["x", "y", "z", "w"],
                      metadatas=[{"k": {1: "a"}}, {"k": {"1": "b"}}, {"t": (1, 2)}, {}])
    for flt, want in (({"k": {1: "a"}}, ["x"]), ({"k": {"$eq": {1: "a"}}}, ["x"]), ({"t": [(1, 2)]}, ["z"])):
        assert [h.id for h in index.search(vecs[0], 4, filter=flt, query_token_count=5)] == want
