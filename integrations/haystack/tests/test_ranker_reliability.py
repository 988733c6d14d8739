"""``NormRankRanker`` under adversarial use (issue 10 items 3, 7, 8, 16, 17; issue 14 item 6).

Real Haystack classes (Document, Pipeline and its run_async) and the real bundled model; model
calls are counted with a spy on the real model's ``encode`` (the real encoding still runs).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings

import numpy as np
import pytest

pytest.importorskip("haystack", reason="needs haystack-ai: pip install normrank-haystack")

from haystack import Document, Pipeline  # noqa: E402

from haystack_integrations.components.rankers.normrank import NormRankRanker  # noqa: E402
from normrank import InvalidArgumentError, Weights  # noqa: E402
from normrank.pooling import PooledEncoder  # noqa: E402

USER_META = {"weight": "12 kg", "norm": "ISO 9001", "cosine": "trig", "relevance_score": "high",
             "retrieval_score": "n/a"}










def _docs(ids, texts, meta=None, score=None, embeddings=None) -> list[Document]:
    return [Document(id=i, content=t, meta=dict(meta or {}), score=score,
                     embedding=None if embeddings is None else [float(x) for x in embeddings[j]])
            for j, (i, t) in enumerate(zip(ids, texts))]


def _ranked(docs: list[Document]) -> list[tuple[str, float | None]]:
    return [(d.id, d.score) for d in docs]


def _same(got: list[tuple[str, float | None]], want: list[tuple[str, float | None]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


# ---------------------------------------------------------------- issue 10 item 7
def test_user_meta_keys_kept(encoder, ids, demo_texts):
    ranker = NormRankRanker(top_k=4, weights={"a": 0.03}, encoder=encoder)
    out = ranker.run(query="stars", documents=_docs(ids[:8], demo_texts[:8], USER_META, score=2.5))["documents"]
    assert len(out) == 4
    for d in out:
        assert {k: d.meta[k] for k in USER_META} == USER_META
        m = d.meta["normrank"]
        assert m["score"] == pytest.approx(d.score) and m["retrieval_score"] == 2.5
        assert d.score == pytest.approx(m["cosine"] + 0.03 * m["norm_feature"], abs=1e-6)


def test_a_users_own_normrank_key_is_kept(encoder, ids, demo_texts, caplog):
    ranker = NormRankRanker(top_k=2, encoder=encoder)
    with caplog.at_level(logging.WARNING):
        out = ranker.run(query="stars", documents=_docs(ids[:3], demo_texts[:3], {"normrank": 7}))["documents"]
    assert [d.meta["normrank"] for d in out] == [7, 7] and all(d.score is not None for d in out)
    assert "own metadata key 'normrank'" in caplog.text


# ---------------------------------------------------------------- issue 10 item 8
def test_a_crafted_embedding_does_not_outlive_its_call(encoder, ids, demo_texts, demo_encoded):
    q = "How do vaccines work?"
    docs = _docs(ids[:6], demo_texts[:6])
    honest = _ranked(NormRankRanker(top_k=6, cache_size=0, encoder=encoder).run(query=q, documents=docs)["documents"])
    ranker = NormRankRanker(top_k=6, encoder=encoder)
    crafted = demo_encoded[0][:6].copy()
    crafted[1] *= 1.009  # the model's own vector, its norm 0.9% off: used, for that call only
    first = ranker.run(query=q, documents=_docs(ids[:6], demo_texts[:6], embeddings=crafted))["documents"]
    by_id = {d.id: d.meta["normrank"]["norm"] for d in first}
    assert by_id[ids[1]] == pytest.approx(1.009 * float(np.linalg.norm(demo_encoded[0][1])), rel=1e-5)
    _same(_ranked(ranker.run(query=q, documents=docs)["documents"]), honest)
    crafted[0] = encoder.encode([q])[0] * 3.0  # raw (not unit), aligned with the query: cosine 1; not the model's
    fresh = NormRankRanker(top_k=6, encoder=encoder)
    _same(_ranked(fresh.run(query=q, documents=_docs(ids[:6], demo_texts[:6], embeddings=crafted))["documents"]),
          honest)


# ---------------------------------------------------------------- issue 10 item 16
def test_every_encoder_setting_round_trips_through_pipeline_dumps(encoder, ids, demo_texts):
    pooled = PooledEncoder(pooling="norm", batch_size=16, max_seq_length=128, sif_a=2e-3, show_progress=False)
    ranker = NormRankRanker(top_k=5, weights={"a": 0.02}, encoder=pooled)
    pipe = Pipeline()
    pipe.add_component("rerank", ranker)
    loaded = Pipeline.loads(pipe.dumps()).get_component("rerank")
    assert loaded.to_dict() == ranker.to_dict()
    params = loaded.to_dict()["init_parameters"]
    assert (params["pooling"], params["sif_a"], params["batch_size"], params["max_seq_length"]) == (
        "norm", 2e-3, 16, 128)
    loaded.warm_up()
    assert loaded.encoder.describe() == {**pooled.describe(), "model": loaded.encoder.model_name}
    q = "What does mitochondrial DNA encode?"
    want = _ranked(ranker.run(query=q, documents=_docs(ids[:10], demo_texts[:10]))["documents"])
    _same(_ranked(loaded.run(query=q, documents=_docs(ids[:10], demo_texts[:10]))["documents"]), want)
    mean = _ranked(NormRankRanker(top_k=5, weights={"a": 0.02}, encoder=encoder).run(
        query=q, documents=_docs(ids[:10], demo_texts[:10]))["documents"])
    assert [s for _, s in mean] != pytest.approx([s for _, s in want], abs=1e-4)  # pooling matters



def test_settings_are_checked_and_kept_as_plain_values():
    """NumPy numbers were taken as given and then failed ``Pipeline.dumps`` (``SerializationError``); ``None``,
    a number for the model and a negative or NaN ``sif_a`` failed only in ``run()``. NumPy numbers are read
    as the Python values they hold; the rest is refused when the ranker is made."""
    ranker = NormRankRanker(batch_size=np.int64(32), cache_size=np.int64(100), max_seq_length=np.int64(128),
                            sif_a=np.float32(0.5), keep_retrieval_score=np.bool_(False), pooling="sif")
    pipe = Pipeline()
    pipe.add_component("rerank", ranker)
    params = Pipeline.loads(pipe.dumps()).get_component("rerank").to_dict()["init_parameters"]
    assert (params["batch_size"], params["cache_size"], params["max_seq_length"], params["sif_a"],
            params["keep_retrieval_score"]) == (32, 100, 128, 0.5, False)
    assert type(params["batch_size"]) is int and type(params["keep_retrieval_score"]) is bool
    for bad, words in (({"batch_size": None}, "batch_size must be an integer"),
                       ({"device": 7}, "device must be a string"),  # None: the device Haystack picks
                       ({"model": 1}, "model must be a model folder"),
                       ({"sif_a": -1.0, "pooling": "sif"}, "sif_a must be a positive finite number"),
                       ({"sif_a": float("nan"), "pooling": "sif"}, "sif_a must be a positive finite number"),
                       ({"keep_retrieval_score": "yes"}, "keep_retrieval_score must be True or False"),
                       ({"cache_size": -1}, "cache_size must be")):
        with pytest.raises(InvalidArgumentError, match=words):
            NormRankRanker(**bad)
    with pytest.raises(InvalidArgumentError, match="sif_a must be a positive finite number"):
        PooledEncoder(pooling="sif", sif_a=float("inf"))


def test_yaml_encoder_settings_reach_to_dict():
    ranker = NormRankRanker.from_config({"encoder": {"pooling": "norm2", "batch_size": 8, "max_seq_length": 64},
                                         "haystack": {"calibration": "candidates"}})
    params = ranker.to_dict()["init_parameters"]
    assert (params["pooling"], params["batch_size"], params["max_seq_length"]) == ("norm2", 8, 64)
    again = NormRankRanker.from_dict(ranker.to_dict())
    assert isinstance(again.encoder, PooledEncoder) and again.encoder.pooling == "norm2"


def test_old_type_name_and_import_path_still_load(encoder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import importlib

        import haystack_normrank

        importlib.reload(haystack_normrank)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert haystack_normrank.NormRankRanker is NormRankRanker
    pipe = Pipeline()
    pipe.add_component("rerank", NormRankRanker(top_k=2, weights={"a": 0.01}, pooling="norm", encoder=None))
    old = pipe.dumps().replace("haystack_integrations.components.rankers.normrank.ranker.NormRankRanker",
                               "haystack_normrank.ranker.NormRankRanker")
    assert "type: haystack_normrank.ranker.NormRankRanker" in old
    ranker = Pipeline.loads(old).get_component("rerank")
    assert isinstance(ranker, NormRankRanker)
    assert (ranker.top_k, ranker.weights, ranker.pooling) == (2, Weights(a=0.01), "norm")
    assert ranker.to_dict()["type"] == "haystack_integrations.components.rankers.normrank.ranker.NormRankRanker"
    # a fresh process, as the README says: the old module is allowlisted by importing the new package, or
    # named in allowed_modules (Haystack checks its allowlist before it imports anything)
    import subprocess
    import sys

    for prelude, extra in (("import haystack_integrations.components.rankers.normrank", ""),
                           ("", ", allowed_modules=['haystack_normrank.*']")):
        code = (f"import sys\n{prelude}\nfrom haystack import Pipeline\n"
                f"r = Pipeline.loads(sys.stdin.read(){extra}).get_component('rerank')\nprint(type(r).__name__, r.top_k)")
        run = subprocess.run([sys.executable, "-c", code], input=old, capture_output=True, text=True, timeout=300,
                             check=False)
        assert run.returncode == 0 and run.stdout.split() == ["NormRankRanker", "2"], run.stderr[-2000:]


# ---------------------------------------------------------------- issue 10 item 17
def test_bad_weights_are_named_errors():
    with pytest.raises(InvalidArgumentError, match=r"unknown weights keys \['alpha'\].*allowed keys"):
        NormRankRanker(weights={"alpha": 0.02})
    with pytest.raises(InvalidArgumentError, match=r"weight.*\ba\b.*'lots'"):
        NormRankRanker(weights={"a": "lots"})
    with pytest.raises(InvalidArgumentError, match="unknown pooling"):
        NormRankRanker(pooling="max")


def test_documents_without_text_pass_through_last(encoder, ids, demo_texts, caplog):
    ranker = NormRankRanker(top_k=10, weights={"a": 0.03}, encoder=encoder)
    q = "What does mitochondrial DNA encode?"
    full = _docs(ids[:5], demo_texts[:5], score=1.0)
    empty, nothing = Document(id="empty", content="", score=3.0), Document(id="none", content=None, meta={"k": 1})
    with caplog.at_level(logging.WARNING):
        out = ranker.run(query=q, documents=[empty, *full[:2], nothing, *full[2:]])["documents"]
    _same(_ranked(out)[:5], _ranked(ranker.run(query=q, documents=full)["documents"]))
    assert _ranked(out)[5:] == [("empty", None), ("none", None)]
    assert out[5].meta["normrank"]["retrieval_score"] == 3.0 and out[6].meta["k"] == 1
    assert "2 of 7 documents have no text" in caplog.text
    assert _ranked(ranker.run(query=q, documents=[empty])["documents"]) == [("empty", None)]
    # text that cannot be encoded (a lone surrogate) failed the whole ranking, named "text 1"; it now
    # passes through last like a blank document, with its reason
    broken = Document(id="x1", content="bad \udcff text")
    out = ranker.run(query=q, documents=[*full[:2], broken, *full[2:]])["documents"]
    _same(_ranked(out)[:5], _ranked(ranker.run(query=q, documents=full)["documents"]))
    assert _ranked(out)[5:] == [("x1", None)] and out[5].meta["normrank"]["skipped"] == "text is not valid Unicode"


# ---------------------------------------------------------------- issue 10 item 3
def test_concurrent_runs_equal_single_threaded(encoder, ids, demo_texts, queries):
    """8 threads plus run_async tasks share one ranker and one encoder (tiny cache: constant eviction).

    Half the calls pass a raw ``query_embedding`` (tokenizer only), half encode the query.
    """
    qvecs = encoder.encode(queries)
    jobs = [(i % len(queries), [(i * 5 + j) % len(ids) for j in range(3)], i % 2 == 0) for i in range(40)]

    def call(ranker: NormRankRanker, job) -> dict:
        qi, rows, raw = job
        return {"query": queries[qi], "documents": _docs([ids[r] for r in rows], [demo_texts[r] for r in rows]),
                "query_embedding": qvecs[qi].tolist() if raw else None}

    alone = NormRankRanker(top_k=3, weights={"a": 0.03}, encoder=encoder)
    alone.run(query=queries[0], documents=_docs(ids, demo_texts))  # encodes every document once
    expected = [_ranked(alone.run(**call(alone, job))["documents"]) for job in jobs]
    ranker = NormRankRanker(top_k=3, weights={"a": 0.03}, cache_size=6, encoder=encoder)
    got: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for j in range(worker, len(jobs), 8):
                got[j] = _ranked(ranker.run(**call(ranker, jobs[j]))["documents"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()

    async def tasks() -> list:
        return await asyncio.gather(*(ranker.run_async(**call(ranker, job)) for job in jobs[:8]))

    from_async = [_ranked(r["documents"]) for r in asyncio.run(tasks())]
    for t in threads:
        t.join()
    assert errors == []
    for j, want in enumerate(expected):
        _same(got[j], want)
    for j, out in enumerate(from_async):
        _same(out, expected[j])


async def test_pipeline_run_async_matches_run(encoder, ids, demo_texts):
    """Pipeline.run_async drives the component's run_async (AsyncPipeline on older Haystack)."""
    q = "How long do massive stars live?"
    pipe = Pipeline()
    pipe.add_component("rerank", NormRankRanker(top_k=3, weights={"a": 0.03}, encoder=encoder))
    data = {"rerank": {"query": q, "documents": _docs(ids, demo_texts)}}
    want = _ranked(pipe.run(data)["rerank"]["documents"])
    runner = pipe.run_async if hasattr(pipe, "run_async") else None
    if runner is None:  # pragma: no cover - Haystack 2.x
        from haystack import AsyncPipeline

        apipe = AsyncPipeline()
        apipe.add_component("rerank", NormRankRanker(top_k=3, weights={"a": 0.03}, encoder=encoder))
        runner = apipe.run_async
    _same(_ranked((await runner(data))["rerank"]["documents"]), want)


def _warned_dimensions():
    from normrank.candidate_vectors import _WARNED_DIMENSIONS

    return _WARNED_DIMENSIONS


# ---------------------------------------------------------------- issue 14 item 6
def test_raw_query_embedding_reused_unit_one_not(encoder, ids, demo_texts, model_calls, caplog):
    q = "What does mitochondrial DNA encode?"
    qv = encoder.encode([q])[0]
    ranker = NormRankRanker(top_k=5, weights={"a": 0.03}, encoder=encoder)
    docs = _docs(ids[:8], demo_texts[:8])
    want = _ranked(ranker.run(query=q, documents=docs)["documents"])  # cold: 8 documents + the query
    before = model_calls.texts
    warm = _ranked(ranker.run(query=q, documents=docs, query_embedding=qv.tolist())["documents"])
    assert model_calls.texts == before  # a warm re-rank with the embedder's raw vector: no model call
    _same(warm, want)
    unit = (qv / np.linalg.norm(qv)).tolist()  # what a stock (normalising) embedder gives: re-encoded
    _same(_ranked(ranker.run(query=q, documents=docs, query_embedding=unit)["documents"]), want)
    assert model_calls.texts == before + 1
    short = qv[:100].tolist()  # another model's dimension: re-encoded, and said once (it was silent)
    _warned_dimensions().discard(("NormRankRanker", 100, 384))
    with caplog.at_level("WARNING", logger="normrank.candidate_vectors"):
        ranker.run(query=q, documents=docs, query_embedding=short)
        ranker.run(query=q, documents=docs, query_embedding=short)
    assert model_calls.texts == before + 3
    said = [r.getMessage() for r in caplog.records if "the query embedding has 100 dimensions" in r.getMessage()]
    assert len(said) == 1


def test_from_index_reuses_stored_vectors(index, ids, demo_texts, encoder, model_calls):
    q = "When was the Peace of Westphalia signed?"
    qv = encoder.encode([q])[0]
    want = {h.id: h.score for h in index.search(q, 10)}
    ranker = NormRankRanker.from_index(index, top_k=10, cache_size=0)
    docs = [Document(id=h.id, content=h.text, meta=h.metadata) for h in index.search(q, 10)]
    before = model_calls.texts
    out = ranker.run(query=q, documents=docs, query_embedding=qv.tolist())["documents"]
    assert model_calls.texts == before  # cold, yet nothing encoded: the index's vectors were used
    assert {d.id: d.score for d in out} == pytest.approx(want, abs=2e-5)
    edited = [Document(id=ids[0], content="An edited text about comets."), *docs[:3]]
    ranker.run(query=q, documents=edited, query_embedding=qv.tolist())
    assert model_calls.texts == before + 1  # same id, other text: encoded, not the stored vector


def test_a_document_given_twice_is_ranked_once(encoder, ids, demo_texts):
    """Hybrid pipelines join BM25 and embedding results, so a document arrives once per retriever. Haystack's
    rankers keep one copy (the highest incoming score); this one returned ['d3', 'd3', 'd2', 'd2', ...]."""
    ranker = NormRankRanker(top_k=6, weights={"a": 0.03}, encoder=encoder)
    docs = _docs(ids[:4], demo_texts[:4])
    low = [Document(id=d.id, content=d.content, meta=d.meta, score=0.1) for d in docs]
    high = [Document(id=d.id, content=d.content, meta={**d.meta, "from": "dense"}, score=0.9) for d in docs]
    out = ranker.run(query="What does mitochondrial DNA encode?", documents=[*low, *high])["documents"]
    assert sorted(d.id for d in out) == sorted(d.id for d in docs)
    assert all(d.meta.get("from") == "dense" for d in out)  # the copy with the higher incoming score
    once = ranker.run(query="What does mitochondrial DNA encode?", documents=high)["documents"]
    assert [(d.id, d.score) for d in out] == [(d.id, d.score) for d in once]


# ---------------------------------------------------------------- a Haystack user's hunt
def test_device_as_haystack_components_take_it(encoder, ids, demo_texts):
    """Only a string was taken: ``ComponentDevice``, ``None`` and the YAML block a stock ranker writes failed."""
    from haystack.utils import ComponentDevice

    for device in (ComponentDevice.from_str("cpu"), None, {"type": "single", "device": "cpu"}, "cpu"):
        ranker = NormRankRanker(top_k=3, device=device)
        assert ranker.device == "cpu" and ranker.to_dict()["init_parameters"]["device"] == "cpu"
    yaml_text = Pipeline().dumps().replace("components: {}", (
        "components:\n  rerank:\n    type: haystack_integrations.components.rankers.normrank.ranker.NormRankRanker\n"
        "    init_parameters:\n      top_k: 3\n      device:\n        type: single\n        device: cpu\n"))
    loaded = Pipeline.loads(yaml_text).get_component("rerank")
    assert loaded.device == "cpu"
    q = "How do vaccines work?"
    _same(_ranked(loaded.run(query=q, documents=_docs(ids[:6], demo_texts[:6]))["documents"]),
          _ranked(NormRankRanker(top_k=3, encoder=encoder).run(query=q, documents=_docs(ids[:6], demo_texts[:6]))
                  ["documents"]))
    with pytest.raises(InvalidArgumentError, match="device must be a string, a haystack ComponentDevice or None"):
        NormRankRanker(device=3)


def test_score_threshold_at_init_run_config_and_in_the_pipeline_yaml(encoder, ids, demo_texts, tmp_path):
    q = "How do vaccines work?"
    docs = [*_docs(ids[:10], demo_texts[:10]), Document(id="empty", content=None)]
    everything = NormRankRanker(top_k=20, encoder=encoder).run(query=q, documents=docs)["documents"]
    scores = sorted((d.score for d in everything if d.score is not None), reverse=True)
    cut = (scores[2] + scores[3]) / 2  # three above it
    ranker = NormRankRanker(top_k=20, encoder=encoder, score_threshold=cut)
    kept = ranker.run(query=q, documents=docs)["documents"]
    assert [d.id for d in kept] == [d.id for d in everything[:3]] and all(d.score >= cut for d in kept)
    assert len(ranker.run(query=q, documents=docs, score_threshold=-10.0)["documents"]) == 10  # not the empty one
    assert len(NormRankRanker(top_k=2, encoder=encoder, score_threshold=cut).run(
        query=q, documents=docs)["documents"]) == 2
    loaded = Pipeline.loads(_pipeline_with(ranker).dumps()).get_component("rerank")
    assert loaded.score_threshold == cut
    assert [d.id for d in loaded.run(query=q, documents=docs)["documents"]] == [d.id for d in kept]
    for bad in (float("nan"), float("inf"), "0.5", True):
        with pytest.raises(InvalidArgumentError, match="score_threshold must be a finite number or None"):
            NormRankRanker(score_threshold=bad)
        with pytest.raises(InvalidArgumentError, match="score_threshold must be a finite number or None"):
            ranker.run(query=q, documents=[], score_threshold=bad)
    config = tmp_path / "normrank.yaml"
    config.write_text(f"haystack:\n  score_threshold: {cut!r}\n  top_k: 20\n")
    from_config = NormRankRanker.from_config(config)
    assert from_config.score_threshold == cut


def _pipeline_with(ranker: NormRankRanker) -> Pipeline:
    pipe = Pipeline()
    pipe.add_component("rerank", ranker)
    return pipe


def test_a_query_that_is_not_valid_unicode_is_named_as_the_query(encoder, ids, demo_texts):
    from normrank import InvalidTextError

    with pytest.raises(InvalidTextError, match="the query is not valid Unicode text"):
        NormRankRanker(top_k=3, encoder=encoder).run(query="plants \ud800", documents=_docs(ids[:3], demo_texts[:3]))


def test_a_raw_query_embedding_of_another_model_is_caught_when_the_text_was_seen(encoder, ids, demo_texts, caplog,
                                                                                 model_calls):
    q = "What does mitochondrial DNA encode?"
    docs = _docs(ids[:8], demo_texts[:8])
    ranker = NormRankRanker(top_k=8, weights={"a": 0.03}, encoder=encoder)
    want = _ranked(ranker.run(query=q, documents=docs)["documents"])
    own = encoder.encode([q])[0]
    before = model_calls.texts
    _same(_ranked(ranker.run(query=q, documents=docs, query_embedding=own.tolist())["documents"]), want)
    assert model_calls.texts == before  # its own raw vector: no model call
    other = np.random.default_rng(0).permutation(own)  # a same-size raw vector of other geometry
    with caplog.at_level("WARNING", logger="normrank.candidate_vectors"):
        _same(_ranked(ranker.run(query=q, documents=docs, query_embedding=other.tolist())["documents"]), want)
    assert "a raw query embedding given to it does not match" in caplog.text


def test_a_query_weight_without_query_calibration_warns_once(encoder, ids, demo_texts, caplog):
    import normrank.scoring

    normrank.scoring._warned_no_query_calibration = False
    ranker = NormRankRanker(top_k=3, weights={"b": 0.02}, encoder=encoder)
    with caplog.at_level("WARNING", logger="normrank.scoring"):
        for _ in range(3):
            ranker.run(query="stars", documents=_docs(ids[:6], demo_texts[:6]))
    assert caplog.text.count("no query calibration") == 1


def test_onnx_int8_vectors_are_the_ranker_own_and_one_odd_document_costs_only_its_call(ids, demo_texts, caplog):
    """A regression hunt: onnx-int8 quantises per batch, so a text's vector in a batch of 48 and alone differed
    by up to 6.4% in norm; the check (then 1%) rejected the ranker's own vectors for good. And one document whose
    text changed after it was embedded disabled every later call's embeddings."""
    pytest.importorskip("onnxruntime", reason="needs normrank[onnx]")
    from normrank import RawEncoder

    enc = RawEncoder(backend="onnx-int8", show_progress=False)
    texts, doc_ids = demo_texts[:24], ids[:24]
    vecs = enc.encode(texts)  # one batch, as an embedder upstream makes them
    q = "How do vaccines work?"
    qv = enc.encode([q])[0]
    calls: list[int] = []
    real = enc.encode_with_counts

    def counting(batch, *a, **kw):
        calls.append(len(batch))
        return real(batch, *a, **kw)

    enc.encode_with_counts = counting  # type: ignore[method-assign]
    ranker = NormRankRanker(top_k=24, weights={"a": 0.03}, encoder=enc)
    with caplog.at_level("WARNING", logger="normrank.candidate_vectors"):
        ranker.run(query=q, documents=_docs(doc_ids, texts, embeddings=vecs), query_embedding=qv.tolist())
        assert sum(calls) == 1  # one document encoded to check, nothing else
        ranker.run(query=q, documents=_docs(doc_ids, texts, embeddings=vecs), query_embedding=qv.tolist())
        assert sum(calls) == 1 and "does not match" not in caplog.text
        odd = [*texts]
        odd[0] = "A text edited after it was embedded, about volcanoes."
        fresh = NormRankRanker(top_k=24, weights={"a": 0.03}, encoder=enc, cache_size=0)
        fresh.run(query=q, documents=_docs(doc_ids, odd, embeddings=vecs))
        assert "does not match" in caplog.text  # that call encoded its texts instead
        calls.clear()
        fresh.run(query=q, documents=_docs(doc_ids[1:], texts[1:], embeddings=vecs[1:]))
        assert sum(calls) <= 2  # the next call uses them again (one check, the query)
