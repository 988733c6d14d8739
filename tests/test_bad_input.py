"""Every bad input gets a named error whose message says what is wrong, and the store is untouched.

Each test checks three things: the error class (from ``normrank.errors``), the message,
and that everything a user can observe of the store (size, ids, records, calibration,
weights, search results) is exactly as before. The store holds the shipped demo corpus
encoded by the real bundled model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from normrank import (
    ConfigError,
    DatasetError,
    DimensionMismatchError,
    DuplicateIdError,
    EmptyCorpusError,
    EmptyTextError,
    InvalidArgumentError,
    InvalidIdError,
    InvalidMetadataError,
    InvalidVectorError,
    ModelLoadError,
    NormCalibrator,
    NormIndex,
    NormRankError,
    RawEncoder,
    UnitNormError,
    UnknownIdError,
    Weights,
    build_index,
    load_beir,
    load_config,
)

QUERY = "How do vaccines train the immune system?"


@pytest.fixture(scope="module")
def query_sample(encoder) -> tuple[np.ndarray, np.ndarray]:
    vecs, counts = encoder.encode_with_counts([QUERY, "photosynthesis", "what causes the tides in the ocean"])
    return np.linalg.norm(vecs.astype(np.float64), axis=1), counts


@pytest.fixture
def store(encoder, demo_texts, demo_encoded, query_sample) -> NormIndex:
    """A fresh index of the demo corpus with a query-conditioned blend, for each test."""
    vecs, counts = demo_encoded
    index = NormIndex(encoder, weights=Weights(a=0.02, b=0.01))
    index.add_vectors(vecs, counts, ids=[f"doc{i}" for i in range(len(demo_texts))], texts=demo_texts,
                      metadatas=[{"n": i, "tags": ["a", "b"]} for i in range(len(demo_texts))])
    index.calibrate_queries(norms=query_sample[0], token_counts=query_sample[1])
    return index


@pytest.fixture(scope="module")
def probes(encoder) -> tuple[np.ndarray, np.ndarray]:
    """Raw query vectors and token counts used to compare search results before and after."""
    return encoder.encode_with_counts([QUERY, "ocean tides"])


@pytest.fixture(scope="module")
def two(encoder) -> tuple[np.ndarray, np.ndarray]:
    """Two valid new documents; tests copy them before damaging one."""
    return encoder.encode_with_counts(["A new passage about volcanoes.", "Another about glaciers."])


_PROBES: list = []


def state(index: NormIndex) -> tuple:
    """What a user can observe; equal before and after a refused call means nothing changed."""
    ids = index.ids()
    vecs, counts = _PROBES[0]
    hits = (index.search_batch(list(vecs), k=min(5, len(index)), query_token_counts=counts.tolist())
            if len(index) else None)
    return (len(index), ids, index.get(ids), index.dim, index.weights, index.calibrator.to_dict(),
            index.query_calibrator.to_dict() if index.query_calibrator else None, hits)


def refused(index: NormIndex, call, error: type[NormRankError], message: str) -> NormRankError:
    """Run ``call``; it must raise ``error`` matching ``message`` and leave ``index`` unchanged."""
    before = state(index)
    with pytest.raises(error, match=message) as info:
        call()
    assert isinstance(info.value, NormRankError)
    assert state(index) == before
    return info.value


@pytest.fixture(autouse=True)
def _set_probes(probes):
    _PROBES[:] = [probes]


# ------------------------------------------------------------------ vectors

@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_vectors(store, encoder, bad, two):
    vecs, counts = two[0].copy(), two[1]
    vecs[1, 7] = bad
    refused(store, lambda: store.add_vectors(vecs, counts, ids=["v0", "v1"]),
            InvalidVectorError, r"vectors contain NaN or infinity \(rows \[1\]\)")
    refused(store, lambda: store.search(vecs[1], 3), InvalidVectorError, "NaN or infinity")


def test_all_zero_vectors(store, encoder, two):
    vecs, counts = two[0].copy(), two[1]
    vecs[0] = 0.0
    refused(store, lambda: store.add_vectors(vecs, counts, ids=["v0", "v1"]),
            InvalidVectorError, r"all-zero vectors have no direction and no norm \(rows \[0\]\)")
    refused(store, lambda: store.search(np.zeros(384, dtype=np.float32), 3), InvalidVectorError, "all-zero")
    tiny = np.full(384, 1e-21, dtype=np.float32)  # not zero: named for what it is
    refused(store, lambda: store.search(tiny, 3), InvalidVectorError, r"norm of at most 1e-12 are too small")


@pytest.mark.parametrize("kind", ["complex", "bool", "str", "object"])
def test_vectors_that_are_not_real_numbers(store, two, kind):
    """A complex vector lost its imaginary part, and vectors of strings or booleans were converted, in
    silence (a query too): named now, and nothing stored changes."""
    vecs, counts = two[0].copy(), two[1]
    bad = {"complex": vecs.astype(complex) * (1 + 1j), "bool": vecs > 0, "str": vecs.astype(str),
           "object": np.array([[Decimal(str(x)) for x in row] for row in vecs], dtype=object)}[kind]
    refused(store, lambda: store.add_vectors(bad, counts, ids=["v0", "v1"]), InvalidVectorError,
            "vectors must hold real numbers")
    refused(store, lambda: store.search(bad[0], 3, query_token_count=5), InvalidVectorError,
            "vectors must hold real numbers")
    # an object array of plain numbers (pandas .values of mixed columns) is numbers, and is taken
    fresh = NormIndex(dim=384, weights=Weights(a=0.02))
    fresh.add_vectors(vecs.astype(object), counts, ids=["o0", "o1"])
    assert [h.id for h in fresh.search(vecs[0].astype(object), 1, query_token_count=5)] == ["o0"]


def test_numpy_strings_are_stored_as_str_and_a_matrix_is_not_one_query(store, two, tmp_path):
    """Ids and texts given as NumPy string arrays were kept as np.str_ until a save and load turned them
    into str (reprs and types changed across a reload); a (2, d) matrix given to search() was named with
    the dimension of its rows run together ("query has dimension 768")."""
    vecs, counts = two[0].copy(), two[1]
    fresh = NormIndex(dim=384, weights=Weights(a=0.02))
    fresh.add_vectors(vecs, counts, ids=np.array(["n0", "n1"]), texts=np.array(["first", "second"]))
    loaded = NormIndex.load(fresh.save(tmp_path / "np").parent)
    for index in (fresh, loaded):
        assert [type(x) for x in index.ids()] == [str, str]
        assert [type(r.text) for r in index.get(["n0", "n1"])] == [str, str]
        hit = index.search(vecs[0], 1, query_token_count=5)[0]
        assert type(hit.id) is str and type(hit.text) is str
    assert repr(fresh.get(["n0"])) == repr(loaded.get(["n0"]))
    refused(store, lambda: store.search(vecs, 3, query_token_count=5), DimensionMismatchError,
            r"a query vector is 1-D, got an array of shape \(2, 384\); search several queries with search_batch")


def test_wrong_dimension_add_and_search(store):
    rng = np.random.default_rng(0)
    refused(store, lambda: store.add_vectors(rng.normal(size=(2, 100)), [5, 6], ids=["v0", "v1"]),
            DimensionMismatchError, "got vectors of dimension 100, expected 384")
    refused(store, lambda: store.search(rng.normal(size=100), 3),
            DimensionMismatchError, "query has dimension 100, the index 384")
    refused(store, lambda: store.add_vectors(rng.normal(size=(2, 3, 384)), [5, 6]),
            DimensionMismatchError, r"expected a 2-D array of vectors, got shape \(2, 3, 384\)")


def test_unit_norm_vectors_from_the_stock_sentence_transformer(store, encoder, demo_texts):
    """The stock model (its Normalize module in place) gives unit vectors: refused, with the way out."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize

    stock = SentenceTransformer(modules=[*encoder.model, Normalize()], device="cpu")
    unit = stock.encode(demo_texts[:6], convert_to_numpy=True)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    counts = encoder.token_counts(demo_texts[:6])
    hint = r"already unit length .* normrank needs raw, pre-normalisation embeddings: encode with normrank.RawEncoder"
    refused(store, lambda: store.add_vectors(unit, counts, ids=[f"u{i}" for i in range(6)]), UnitNormError, hint)
    refused(store, lambda: store.add_vectors(unit[:1], counts[:1], ids=["u0"]), UnitNormError, hint)
    # a fresh index refuses them too, and stays empty and dimensionless
    fresh = NormIndex(encoder)
    with pytest.raises(UnitNormError, match=hint):
        fresh.add_vectors(unit, counts)
    assert len(fresh) == 0 and fresh.dim is None
    # a unit query cannot set the query-conditioned weight (b != 0)
    refused(store, lambda: store.search(unit[0], 3, query_token_count=int(counts[0])),
            UnitNormError, "a query vector is unit length")
    # normalised raw vectors (what a hosted embedding API returns) are refused the same way
    raw, raw_counts = encoder.encode_with_counts(demo_texts[:6])
    normalised = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    refused(store, lambda: store.add_vectors(normalised, raw_counts), UnitNormError, hint)


def test_constant_norm_first_batch_is_refused(encoder):
    vecs = np.random.default_rng(1).normal(size=(5, 384)).astype(np.float32)
    vecs *= (3.0 / np.linalg.norm(vecs, axis=1))[:, None]
    index = NormIndex(encoder)
    with pytest.raises(UnitNormError, match="all have the same norm .* so their norm carries no signal"):
        index.add_vectors(vecs, [10] * 5)
    assert len(index) == 0 and index.dim is None


def test_equal_norms_in_a_later_batch_are_accepted(store, encoder):
    """Regression: the same text added twice (equal norms) used to be refused as 'no signal'."""
    vecs, counts = encoder.encode_with_counts(["Volcanoes erupt.", "Volcanoes erupt."])
    store.add_vectors(vecs, counts, ids=["twin1", "twin2"])
    assert "twin1" in store and "twin2" in store


# ------------------------------------------------------------------ corpus and texts

def test_empty_corpus(encoder, store, tmp_path):
    with pytest.raises(EmptyCorpusError, match="cannot build an index from an empty corpus"):
        NormIndex.from_texts([], encoder=encoder)
    refused(store, lambda: store.add_texts([]), EmptyCorpusError, "no texts given")
    refused(store, lambda: store.add_vectors(np.zeros((0, 384), dtype=np.float32), []),
            EmptyCorpusError, "the batch is empty")
    empty = NormIndex(encoder)
    with pytest.raises(EmptyCorpusError, match="the index is empty: add documents before searching"):
        empty.search(QUERY, 1)
    # never filled: it saves (its dimension from the encoder) and reloads empty, and fills like a new one
    empty.save(tmp_path / "never-filled")
    again = NormIndex.load(tmp_path / "never-filled")
    assert len(again) == 0 and again.dim == 384 and not again.calibrator.is_fitted
    with pytest.raises(EmptyCorpusError, match="the index is empty"):
        again.search(QUERY, 1)
    again.add_texts(["Stars fuse hydrogen.", "Bread rises with yeast."], ids=["s", "b"])
    assert again.search("what do stars burn", 1)[0].id == "s" and again.calibrator.n_fitted == 2
    # without an encoder there is no dimension yet; an IVF index trains on its first documents
    with pytest.raises(EmptyCorpusError, match="no encoder: its dimension is not known yet"):
        NormIndex().save(tmp_path / "never-written")
    with pytest.raises(EmptyCorpusError, match="IVF index that never held a document"):
        NormIndex(encoder, index_type="ivf").save(tmp_path / "never-written")
    assert not (tmp_path / "never-written").exists()


@pytest.mark.parametrize("blank", ["", "   ", "\n\t ", "\u200b", "\ufeff\u00ad \u200d", "\x01\x7f", "\u0301",
                                   "\u034f\ufe0f\u180b", "\ufffd", "\ue000"])
def test_empty_or_whitespace_texts(store, blank):
    # zero-width, format and control characters: the tokenizer drops them, so the text was stored as
    # the bare [CLS] [SEP] vector
    refused(store, lambda: store.add_texts(["A fine passage.", blank], ids=["t0", "t1"]),
            EmptyTextError, "text 1 is empty or whitespace only")
    refused(store, lambda: store.search(blank, 3), EmptyTextError, "text 0 is empty or whitespace only")


def test_text_with_invisible_characters_and_words_is_kept(store):
    text = "\u200bA zebra\u00adcrossing painted on the stre\u0301et.\ufeff\ufe0f"
    store.add_texts([text], ids=["zw"])
    assert store.get(["zw"])[0].text == text
    assert store.search("\u200bzebra crossing on a street", 1)[0].id == "zw"


def test_non_string_texts(store, encoder, two):
    refused(store, lambda: store.add_texts(["ok", 42]), InvalidArgumentError, "text 1 is a int, expected str")
    refused(store, lambda: store.add_texts("one long string"), InvalidArgumentError,
            "expected a list of texts, got a single string")
    vecs, counts = two[0].copy(), two[1]
    refused(store, lambda: store.add_vectors(vecs, counts, texts=["ok", 3.5]),
            InvalidArgumentError, "text 1 is a float, expected str or None")


# ------------------------------------------------------------------ ids

def test_duplicate_ids_within_a_batch(store, encoder, two):
    refused(store, lambda: store.add_texts(["First.", "Second."], ids=["same", "same"]),
            DuplicateIdError, "id 'same' is given twice in this batch")
    vecs, counts = two[0].copy(), two[1]
    refused(store, lambda: store.add_vectors(vecs, counts, ids=["x", "x"]),
            DuplicateIdError, "id 'x' is given twice in this batch")


def test_duplicate_ids_against_the_index(store, encoder, two):
    refused(store, lambda: store.add_texts(["New.", "Newer."], ids=["fresh", "doc3"]),
            DuplicateIdError, "id 'doc3' is already in the index; delete it first to replace it")
    vecs, counts = two[0].copy(), two[1]
    refused(store, lambda: store.add_vectors(vecs, counts, ids=["doc0", "fresh"]),
            DuplicateIdError, "id 'doc0' is already in the index")


def test_unknown_ids_on_delete_delete_nothing(store):
    refused(store, lambda: store.delete(["doc1", "nope", "doc2"]),
            UnknownIdError, r"unknown ids, nothing deleted: \['nope'\]")
    refused(store, lambda: store.get(["doc1", "ghost"]), UnknownIdError, r"unknown ids: \['ghost'\]")
    assert str(UnknownIdError("plain message")) == "plain message"  # not KeyError's repr


@pytest.mark.parametrize(("bad", "shown"), [(1, "1 (int)"), (None, "None (NoneType)"), ("", "'' (str)"),
                                            (b"doc", "b'doc' (bytes)")])
def test_non_string_ids(store, encoder, bad, shown, two):
    vecs, counts = two[0].copy(), two[1]
    msg = re.escape(f"id 1 is {shown}; ids must be non-empty strings")
    refused(store, lambda: store.add_vectors(vecs, counts, ids=["ok", bad]), InvalidIdError, msg)
    refused(store, lambda: store.add_texts(["a b", "c d"], ids=["ok", bad]), InvalidIdError, msg)
    refused(store, lambda: store.delete(["doc1", bad]), InvalidIdError, msg)


def test_id_count_must_match(store, encoder, two):
    vecs, counts = two[0].copy(), two[1]
    refused(store, lambda: store.add_vectors(vecs, counts, ids=["only-one"]),
            InvalidArgumentError, "1 ids for 2 documents")


# ------------------------------------------------------------------ k and other arguments

@pytest.mark.parametrize("k", [0, -3, True, 2.5, "5"])
def test_k_not_a_positive_integer(store, k):
    refused(store, lambda: store.search(QUERY, k), InvalidArgumentError, "k must be a positive integer, got")


def test_k_larger_than_the_index(store):
    n = len(store)
    refused(store, lambda: store.search(QUERY, n + 1), InvalidArgumentError,
            rf"k of {n + 1} is larger than the number of documents \({n}\); ask for k <= {n}")
    assert len(store.search(QUERY, n)) == n  # k == size is fine


@pytest.mark.parametrize(("counts", "message"), [
    ([0, 5], "token counts must be whole numbers >= 1"),
    ([2.5, 5], "token counts must be whole numbers >= 1"),
    ([np.nan, 5], "token counts must be whole numbers >= 1"),
    (["x", 5], "token counts must be whole numbers >= 1"),
    ([2**31, 5], "token counts must be whole numbers >= 1 and <= 2147483647"),
    ([5], "1 token counts for 2 vectors"),
    ([True, 5], r"not True/False"),  # were read as 1, "5" as 5 and [[5], [6]] as 5, 6, in silence
    (["5", 6], r"whole numbers >= 1 in a flat list, got <U"),
    ([[5], [6]], r"whole numbers >= 1 in a flat list, got int64 values of shape \(2, 1\)"),
])
def test_bad_token_counts(store, encoder, counts, message, two):
    vecs = two[0].copy()
    refused(store, lambda: store.add_vectors(vecs, counts, ids=["v0", "v1"]), InvalidArgumentError, message)



@pytest.mark.parametrize("count", [np.inf, 2.5, 0, np.nan, 2**31])
def test_bad_query_calibration_counts(store, query_sample, count, tmp_path):
    """``calibrate_queries(norms=..., token_counts=...)`` reads counts as the stores do. An infinite count was
    accepted: it made a knot at infinity, searches went on, and the next save wrote a folder no load read."""
    norms = query_sample[0]
    counts = [count] + [int(c) for c in query_sample[1][1:]]
    before = store.query_calibrator.to_dict()
    refused(store, lambda: store.calibrate_queries(norms=norms, token_counts=counts), InvalidArgumentError,
            "token counts must be whole numbers >= 1")
    assert store.query_calibrator.to_dict() == before
    store.save(tmp_path / "ix")
    assert NormIndex.load(tmp_path / "ix").query_calibrator.to_dict() == before
    with pytest.raises(InvalidArgumentError, match="finite"):  # the calibrator itself, fitted directly
        NormCalibrator().fit(np.array([3.0, 4.0]), np.array([np.inf, 5.0]))


def test_bad_metadata(store, encoder, two):
    vecs, counts = two[0].copy(), two[1]
    refused(store, lambda: store.add_vectors(vecs, counts, metadatas=[{"ok": 1}, {"when": object()}]),
            InvalidArgumentError, "metadata 1 is not JSON-serialisable")
    refused(store, lambda: store.add_vectors(vecs, counts, metadatas=[{"ok": 1}, "tag"]),
            InvalidArgumentError, "metadata 1 is a str, expected a dict")


def test_bad_filter_weights_and_query_counts(store):
    refused(store, lambda: store.search(QUERY, 3, filter=["n", 1]), InvalidArgumentError,
            "filter must be a dict or a callable, got list")
    refused(store, lambda: store.set_weights({"a": 1.0}), InvalidArgumentError,
            "set_weights takes a normrank.Weights, got dict")
    with pytest.raises(InvalidArgumentError, match=r"unknown scoring mode 'bogus'; choose one of"):
        Weights(mode="bogus")
    with pytest.raises(InvalidArgumentError, match="weight a must be finite"):
        Weights(a=float("nan"))
    raw = _PROBES[0][0]
    refused(store, lambda: store.search_batch([raw[0], raw[0]], 3, query_token_counts=[5]),
            InvalidArgumentError, "1 query token counts for 2 queries")
    refused(store, lambda: store.search(raw[0], 3), InvalidArgumentError,
            "a query vector was given without its token count")


def test_callers_cannot_change_stored_documents(store):
    """Metadata handed in, returned by get() or in hits is a copy."""
    before = state(store)
    store.get(["doc0"])[0].metadata["tags"].append("mutated")
    store.search(QUERY, 3)[0].metadata["tags"].append("mutated")
    assert state(store) == before
    meta = {"nested": {"x": [1]}}
    vecs, counts = store.encoder.encode_with_counts(["A passage on rivers."])
    store.add_vectors(vecs, counts, ids=["river"], metadatas=[meta])
    meta["nested"]["x"].append(2)
    assert store.get(["river"])[0].metadata == {"nested": {"x": [1]}}
    # a filter function gets a copy of each document's metadata: what it changes is not stored (or saved)
    before = state(store)

    def meddling(m: dict) -> bool:
        m.setdefault("lang", "en")
        m.pop("tags", None)
        m["when"] = object()  # not JSON: a later save failed with a bare TypeError
        return True

    assert store.search(QUERY, 3, filter=meddling)
    assert state(store) == before


# ------------------------------------------------------------------ configuration and models

def _saved(store: NormIndex, tmp_path: Path) -> Path:
    path = tmp_path / "saved"
    store.save(path)
    return path


def test_yaml_unknown_key(store, tmp_path):
    path = _saved(store, tmp_path)
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text(f"store:\n  path: {path}\nscoring:\n  wieght: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'scoring.wieght'; allowed keys here: a, b, clip, epsilon"):
        load_config(cfg)
    with pytest.raises(ConfigError, match="unknown key 'scoring.wieght'"):
        build_index(cfg)
    cfg.write_text("retriever:\n  k: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'retriever'; allowed keys here: calibration, (chunking, )?encoder"):
        load_config(cfg)
    assert state(NormIndex.load(path, encoder=store.encoder)) == state(store)


@pytest.mark.parametrize(("yaml_text", "message"), [
    ("store:\n  index_type: annoy\n", r"'store.index_type': Input should be 'flat', 'hnsw' or 'ivf' \(got 'annoy'\)"),
    ("encoder:\n  batch_size: many\n", r"'encoder.batch_size': Input should be a valid integer"),
    ("scoring:\n  a: [1, 2]\n", r"'scoring.a': Input should be a valid number"),
    ("fit:\n  folds: 1\n", r"'fit.folds': Input should be greater than or equal to 2"),
    ("- just\n- a list\n", "the top level must be a mapping of sections"),
    ("scoring: {a: 1\n", "is not valid YAML"),
])
def test_yaml_wrong_type(tmp_path, yaml_text, message):
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_config(cfg)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="configuration file .*nope.yaml does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_missing_model_path(store, tmp_path):
    missing = tmp_path / "no" / "such-model"
    with pytest.raises(ModelLoadError, match=f"model path '{missing}' does not exist"):
        RawEncoder(missing)
    path = _saved(store, tmp_path)
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text(f"encoder:\n  model: {missing}\nstore:\n  path: {path}\n")
    with pytest.raises(ModelLoadError, match="does not exist"):
        build_index(cfg)
    assert isinstance(ModelLoadError("x"), OSError)
    assert state(NormIndex.load(path, encoder=store.encoder)) == state(store)


def test_model_without_tokenizer(store, tmp_path, demo_encoded):
    """A real model folder with its tokenizer files removed: named, not silently [UNK] for every word."""
    from normrank.encoders import default_model_path

    src = default_model_path()
    dst = tmp_path / "model-no-tokenizer"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "pytorch_model.bin"))
    for big in ("model.safetensors", "pytorch_model.bin"):
        if (src / big).exists():
            os.symlink(src / big, dst / big)  # same weights, without copying 90 MB
    removed = [p.name for p in dst.iterdir()
               if p.name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")]
    assert "vocab.txt" in removed and "tokenizer.json" in removed
    for name in removed:
        (dst / name).unlink()
    encoder = RawEncoder(dst)
    with pytest.raises(ModelLoadError, match=r"has no usable tokenizer: it knows \d+ tokens but the model has 30522"):
        encoder.encode(["hello"])
    # an index that uses such an encoder refuses the texts and keeps what it has
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs[:20], counts[:20], ids=[f"d{i}" for i in range(20)])
    before = (index.ids(), index.get(index.ids()))
    with pytest.raises(ModelLoadError, match="no usable tokenizer"):
        index.add_texts(["A new passage."], ids=["new"])
    assert (index.ids(), index.get(index.ids())) == before


# ------------------------------------------------------------------ qrels

def test_fit_with_qrels_naming_unknown_ids(store):
    queries = {"q1": QUERY, "q2": "ocean tides"}
    refused(store, lambda: store.fit(queries, {"q1": {"doc1": 1, "zzz": 1}}),
            UnknownIdError, r"qrels name 1 document ids not in the index, e.g. \['zzz'\]")
    refused(store, lambda: store.fit(queries, {"q9": {"doc1": 1}}),
            UnknownIdError, r"qrels name 1 unknown query ids, e.g. \['q9'\]")


def _beir(folder: Path, qrels_rows: list[str]) -> Path:
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"doc {i}"})
                                                   for i in range(3)))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a question"}))
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels_rows) + "\n")
    return folder


def test_load_beir_with_qrels_naming_unknown_ids(tmp_path):
    good = load_beir(_beir(tmp_path / "good", ["q1\td1\t1"]))
    assert good.qrels == {"q1": {"d1": 1}}
    with pytest.raises(DatasetError, match=r"names ids the collection lacks: 1 documents \(e.g. \['d9'\]\)$"):
        load_beir(_beir(tmp_path / "bad_doc", ["q1\td1\t1", "q1\td9\t1"]))
    with pytest.raises(DatasetError, match=r"names ids the collection lacks: 1 queries \(e.g. \['q7'\]\)"):
        load_beir(_beir(tmp_path / "bad_query", ["q7\td1\t1"]))
    with pytest.raises(DatasetError, match="has no qrels/train.tsv; available splits: \\['test'\\]"):
        load_beir(tmp_path / "good", split="train")


def test_fit_with_bad_options_changes_nothing(store):
    """Options are checked before the fit touches the query calibration (it used to be refitted first)."""
    queries = {"q1": QUERY, "q2": "ocean tides"}
    qrels = {"q1": {"doc1": 1}, "q2": {"doc2": 1}}
    refused(store, lambda: store.fit(queries, qrels, modes=["bogus"]), InvalidArgumentError,
            r"unknown scoring mode 'bogus'; choose one of \['additive', 'multiplicative', 'tiebreak'\]")
    refused(store, lambda: store.fit(queries, qrels, fold=3), InvalidArgumentError,
            r"unknown fit options \['fold'\]; allowed: \[.*'folds'")
    refused(store, lambda: store.fit(queries, {"q1": {"doc1": 0}}), EmptyCorpusError,
            "no query in the qrels has a relevant document")


# ------------------------------------------------------------------ issue 10: text, metadata, options

@pytest.mark.parametrize(("ids", "texts", "metas", "where"), [
    (["ok", "bad\udcff"], None, None, "id 1"),
    (None, ["ok", "bad\udcff"], None, "text 1"),
    (None, None, [{}, {"k": "bad\udcff"}], r"metadata 1\['k'\]"),
    (None, None, [{}, {"bad\udcff": 1}], "metadata 1 key .*"),
])
def test_lone_surrogates(store, two, ids, texts, metas, where):
    from normrank import InvalidTextError

    vecs, counts = two[0].copy(), two[1]
    refused(store, lambda: store.add_vectors(vecs, counts, ids=ids, texts=texts, metadatas=metas),
            InvalidTextError, f"{where} is not valid Unicode text: it holds the lone surrogate")
    refused(store, lambda: store.search("what \udcff", 3), InvalidTextError, "query 0 is not valid Unicode text")


def test_metadata_too_deep_too_big_or_not_finite(store, two):
    from normrank import InvalidMetadataError

    deep: dict = {}
    cur = deep
    for _ in range(700):
        cur["x"] = {}
        cur = cur["x"]
    vecs, counts = two[0].copy(), two[1]
    for meta, message in ((deep, "nested more than 32 levels deep"), ({"b": "x" * 2_000_000}, "larger than 1,000,000"),
                          ({"f": float("inf")}, "is inf; metadata numbers must be finite")):
        refused(store, lambda: store.add_vectors(vecs, counts, metadatas=[{}, meta]), InvalidMetadataError, message)


@pytest.mark.parametrize(("option", "value"), [("ef_search", 2_000_000_000), ("nprobe", 0), ("ef_search", 2e9),
                                                ("hnsw_m", "32"), ("pad_to", True)])
def test_numeric_option_out_of_range(store, option, value):
    with pytest.raises(InvalidArgumentError, match=rf"{option} must be .*in \["):
        NormIndex(index_type="hnsw", **{option: value})
    refused(store, lambda: setattr(store, option, value), InvalidArgumentError, rf"{option} must be .*in \[")



@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dim": 0}, r"dim must be .*in \["), ({"dim": -1}, r"dim must be .*in \["), ({"dim": 8.0}, "dim must be"),
    ({"dim": "8"}, "dim must be"), ({"encoder": "all-MiniLM-L6-v2"}, "encoder must be a normrank RawEncoder"),
    ({"calibrator": {"knots_x": []}}, "calibrator must be a normrank.NormCalibrator"),
    ({"query_calibrator": 1.0}, "query_calibrator must be a normrank.NormCalibrator"),
])
def test_index_parts_of_the_wrong_kind_are_refused_when_made(kwargs, message, tmp_path):
    """``dim``, the encoder and the calibrations were taken as given: ``dim=np.int64(8)`` indexed and searched,
    then every save raised a bare ``TypeError``; ``dim=8.0``, an encoder name or a dict failed later with a
    bare error. A NumPy integer is read as the int it holds."""
    with pytest.raises(InvalidArgumentError, match=message):
        NormIndex(**kwargs)
    index = NormIndex(dim=np.int64(8))
    vecs = np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32) * np.arange(1, 21, dtype=np.float32)[:, None]
    index.add_vectors(vecs, list(range(5, 25)), ids=[f"d{i}" for i in range(20)])
    index.save(tmp_path / "ix")
    assert NormIndex.load(tmp_path / "ix").dim == 8 and type(index.dim) is int


def test_k_as_a_numpy_integer_and_fit_folds_as_a_word(store):
    assert store.search(QUERY, np.int64(3)) == store.search(QUERY, 3)
    queries, qrels = {"q1": QUERY, "q2": "ocean tides"}, {"q1": {"doc1": 1}, "q2": {"doc2": 1}}
    refused(store, lambda: store.fit(queries, qrels, folds="five"), InvalidArgumentError,
            r"folds must be an integer in \[2, 1000\], got 'five' \(str\)")


@pytest.mark.parametrize("count", ["5", 7.9, 0, -3, True, 2**40])
@pytest.mark.parametrize("b", [0.0, 0.01])
def test_a_query_token_count_must_be_a_positive_integer(store, probes, count, b):
    """``int()`` used to turn "5" and 7.9 into counts, and 0 read as "no count given"; the lean
    single-vector path (b = 0) checks it like the general one."""
    store.set_weights(Weights(a=0.02, b=b))
    before = store.search(probes[0][0], 3, query_token_count=int(probes[1][0]))
    with pytest.raises(InvalidArgumentError, match="query token count"):
        store.search(probes[0][0], 3, query_token_count=count)
    with pytest.raises(InvalidArgumentError, match="query token count"):
        store.search_batch([probes[0][0]], 3, query_token_counts=[count])
    assert store.search(probes[0][0], 3, query_token_count=np.int64(probes[1][0])) == before


@pytest.mark.parametrize("meta", [{1: "int", "1": "str"}, {None: 1, "null": 2}, {True: 1, "true": 2},
                                  {"outer": {2.5: "a", "2.5": "b"}}])
def test_metadata_keys_that_are_one_key_in_json_are_refused(store, demo_encoded, meta):
    vecs, counts = demo_encoded
    n = len(store)
    with pytest.raises(InvalidMetadataError, match="same key"):
        store.add_vectors(vecs[:1], counts[:1], ids=["clash"], metadatas=[meta])
    assert len(store) == n and "clash" not in store
    store.add_vectors(vecs[:1], counts[:1], ids=["fine"], metadatas=[{1: "a", 2: "b"}])  # distinct as JSON
    assert store.get(["fine"])[0].metadata == {"1": "a", "2": "b"}


def test_a_first_batch_of_one_text_repeated_is_accepted_but_unit_vectors_are_not(encoder, tmp_path):
    """Equal norms because the text is the same are not normalised embeddings: accepted, like one text."""
    index = NormIndex.from_texts(["hello world", "hello world"], ids=["a", "b"], encoder=encoder)
    assert {h.id for h in index.search("hello", 2)} == {"a", "b"}
    index.add_texts(["the sun is a star", "photosynthesis in plants"], ids=["c", "d"])
    assert index.calibrator.n_fitted == 4  # refitted as documents come (fewer than 40)
    index.save(tmp_path / "ix")
    assert NormIndex.load(tmp_path / "ix").search("hello", 1)[0].id in {"a", "b"}
    vec = encoder.encode(["hello world"])[0]
    unit = vec / np.linalg.norm(vec)
    with pytest.raises(UnitNormError):
        NormIndex(dim=unit.size).add_vectors(np.stack([unit, unit]), [3, 3])


def _single_string_ids_refused(index, vecs, counts) -> None:
    before = sorted(index.ids())
    for call in (lambda: index.delete("12"), lambda: index.get("12"), lambda: index.vectors("12"),
                 lambda: index.add_vectors(vecs[:2], counts[:2], ids="bc"), lambda: index.delete(12)):
        with pytest.raises(InvalidArgumentError, match="expected a list of ids"):
            call()
    assert sorted(index.ids()) == before  # "1" and "2" are still there (delete("12") used to remove them)
    assert index.delete(["12"]) == 1 and "1" in index and "2" in index and "12" not in index


def test_a_single_string_is_never_read_as_a_list_of_ids(demo_encoded):
    vecs, counts = demo_encoded
    index = NormIndex(dim=vecs.shape[1])
    index.add_vectors(vecs[:3], counts[:3], ids=["1", "2", "12"])
    _single_string_ids_refused(index, vecs, counts)


def test_a_single_string_is_never_read_as_a_list_of_ids_on_pgvector(demo_encoded, pg_dsn, pg_table_factory):
    from normrank.pgvector_store import PgVectorNormIndex

    vecs, counts = demo_encoded
    index = PgVectorNormIndex(pg_dsn, pg_table_factory("ids"))
    try:
        index.add_vectors(vecs[:3], counts[:3], ids=["1", "2", "12"])
        _single_string_ids_refused(index, vecs, counts)
    finally:
        index.close()
