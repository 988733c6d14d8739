"""RawEncoder on ONNX Runtime (``backend="onnx"`` / ``"onnx-int8"``), with the real bundled model.

The fp32 export must give torch's vectors; int8 must stay close and rank alike; the exported files
are cached, checked, and re-made when broken; a saved index reopens with the backend (and pooling)
it was built with; one encoder shared by threads gives each thread its single-threaded answer.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the ONNX backends need normrank[onnx]")

from normrank import NormIndex, RawEncoder
from normrank.config import EncoderConfig, build_encoder, load_config
from normrank.errors import ConfigError, InvalidArgumentError, ModelLoadError
from normrank.pooling import PooledEncoder

TEXTS = [
    "a",
    "the cat sat on the mat",
    "Norms of raw sentence embeddings shrink as texts grow longer. " * 40,  # past the 256-token window
    "What is the boundary layer thickness on a flat plate at zero incidence?",
    "Ünïcödé text, numbers 3.14 and punctuation!?",
]


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("normrank-cache")


@pytest.fixture
def cached(monkeypatch: pytest.MonkeyPatch, onnx_cache: Path) -> Path:
    monkeypatch.setenv("NORMRANK_CACHE", str(onnx_cache))
    return onnx_cache


def _cos_and_norm_change(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    rn, gn = np.linalg.norm(ref, axis=1), np.linalg.norm(got, axis=1)
    return float(np.min((ref * got).sum(1) / (rn * gn))), float(np.max(np.abs(gn - rn) / rn))


def test_fp32_gives_torchs_vectors_and_counts(encoder, cached, demo_texts):
    onnx = RawEncoder(backend="onnx", batch_size=7, show_progress=False)  # several padded batches
    texts = TEXTS + demo_texts
    ref, ref_counts = encoder.encode_with_counts(texts)
    got, counts = onnx.encode_with_counts(texts)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_array_equal(counts, ref_counts)
    cos, rel = _cos_and_norm_change(ref, got)
    assert cos > 0.99999 and rel < 1e-4
    assert onnx.truncated_texts == 1  # the long text, counted as on torch
    assert onnx.dim == encoder.dim and onnx.max_tokens == encoder.max_tokens


def test_int8_stays_close_and_ranks_alike(encoder, cached, demo_texts, demo_encoded):
    from normrank.testing import demo_rows

    int8 = RawEncoder(backend="onnx-int8", show_progress=False)
    docs, counts = int8.encode_with_counts(demo_texts)
    np.testing.assert_array_equal(counts, demo_encoded[1])
    cos, rel = _cos_and_norm_change(demo_encoded[0], docs)
    assert cos > 0.97 and rel < 0.15
    assert not np.allclose(docs, demo_encoded[0], rtol=1e-4)  # really the quantised model
    # plain-cosine rankings of the demo queries: torch's best document stays in int8's top 3
    queries = [q["text"] for q in demo_rows("demo_queries.jsonl")]
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)
    ref = unit(encoder.encode(queries)) @ unit(demo_encoded[0]).T
    got = unit(int8.encode(queries)) @ unit(docs).T
    kept = [int(np.argmax(ref[i])) in np.argsort(-got[i])[:3] for i in range(len(queries))]
    assert np.mean(kept) >= 0.9
    # norms keep their order (normrank's feature is built from them)
    rn, gn = np.linalg.norm(demo_encoded[0], axis=1), np.linalg.norm(docs, axis=1)
    assert np.corrcoef(np.argsort(np.argsort(rn)), np.argsort(np.argsort(gn)))[0, 1] > 0.9


def test_exports_are_cached_and_reused(cached):
    first = RawEncoder(backend="onnx-int8", show_progress=False)
    v1 = first.encode(TEXTS)
    files = sorted(cached.glob("onnx/*/model*.onnx"))
    assert [f.name[:10] for f in files] == ["model-int8", "model.onnx"]
    stamps = [f.stat().st_mtime_ns for f in files]
    second = RawEncoder(backend="onnx-int8", show_progress=False)
    np.testing.assert_array_equal(second.encode(TEXTS), v1)
    assert [f.stat().st_mtime_ns for f in files] == stamps  # loaded, not exported again
    assert not list(cached.glob("onnx/*/.*.tmp"))  # no half-written files left behind


def test_a_broken_cached_file_is_exported_again(encoder, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path))
    RawEncoder(backend="onnx", show_progress=False).encode(["warm the cache"])
    (path,) = tmp_path.glob("onnx/*/model.onnx")
    path.write_bytes(b"not an onnx model")
    caplog.set_level(logging.WARNING)
    again = RawEncoder(backend="onnx", show_progress=False)
    cos, rel = _cos_and_norm_change(encoder.encode(TEXTS), again.encode(TEXTS))
    assert cos > 0.99999 and rel < 1e-4
    assert path.stat().st_size > 1_000_000  # a real model again


def test_unwritable_cache_falls_back_to_a_temporary_export(encoder, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("NORMRANK_CACHE", str(blocker))
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    caplog.set_level(logging.WARNING)
    enc = RawEncoder(backend="onnx", show_progress=False)
    cos, _ = _cos_and_norm_change(encoder.encode(TEXTS[:2]), enc.encode(TEXTS[:2]))
    assert cos > 0.99999
    assert "cannot write the ONNX cache" in caplog.text
    # the temporary export is removed once the session holds it (87 MB per process were left behind)
    assert list(own_tmp.iterdir()) == []
    cos, _ = _cos_and_norm_change(encoder.encode(TEXTS[2:4]), enc.encode(TEXTS[2:4]))
    assert cos > 0.99999


def test_bad_backends_are_refused_at_the_door(tmp_path):
    for bad in ("tensorrt", "ONNX", 1, None):
        with pytest.raises(InvalidArgumentError, match="backend"):
            RawEncoder(backend=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="CPU"):
        RawEncoder(backend="onnx-int8", device="cuda")
    with pytest.raises(InvalidArgumentError, match="CPU"):
        PooledEncoder(pooling="norm", backend="onnx", device="cuda:0")
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text("encoder:\n  backend: onnx\n  device: cuda\n")
    with pytest.raises(ConfigError, match="CPU"):
        load_config(cfg)
    cfg.write_text("encoder:\n  backend: openvino\n")
    with pytest.raises(ConfigError, match="backend"):
        load_config(cfg)


def test_config_round_trips_the_backend(tmp_path):
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text("encoder:\n  backend: onnx-int8\n  batch_size: 16\n")
    enc = build_encoder(load_config(cfg))
    assert isinstance(enc, RawEncoder) and enc.backend == "onnx-int8" and enc.batch_size == 16
    assert EncoderConfig.from_encoder(enc).backend == "onnx-int8"
    assert EncoderConfig.from_encoder(RawEncoder()).backend == "torch"


def test_fingerprints_keep_backends_apart(encoder, cached, tmp_path, monkeypatch):
    from normrank.cache import encode_cached

    int8 = RawEncoder(backend="onnx-int8", show_progress=False)
    assert len({encoder.fingerprint, RawEncoder(backend="onnx").fingerprint, int8.fingerprint}) == 3
    assert encoder.fingerprint == RawEncoder().fingerprint  # torch's cache keys are unchanged
    folder = tmp_path / "enc-cache"
    torch_vecs, _ = encode_cached(encoder, TEXTS, folder=folder)
    int8_vecs, _ = encode_cached(int8, TEXTS, folder=folder)  # not torch's cached vectors
    np.testing.assert_array_equal(int8_vecs, int8.encode(TEXTS))
    assert not np.array_equal(int8_vecs, torch_vecs)


def test_saved_index_reopens_with_its_backend_and_pooling(cached, tmp_path, demo_texts):
    for enc in (RawEncoder(backend="onnx-int8", show_progress=False),
                PooledEncoder(pooling="norm", show_progress=False),
                PooledEncoder(pooling="norm", backend="onnx", show_progress=False)):
        index = NormIndex(enc)
        index.add_texts(demo_texts[:20], ids=[f"d{i}" for i in range(20)])
        before = [(h.id, h.score) for h in index.search("boundary layer on a flat plate", 5)]
        folder = tmp_path / f"{type(enc).__name__}-{enc.backend}"
        index.save(folder)
        loaded = NormIndex.load(folder)
        assert type(loaded.encoder) is type(enc) and loaded.encoder.backend == enc.backend
        assert getattr(loaded.encoder, "pooling", "mean") == getattr(enc, "pooling", "mean")
        after = [(h.id, h.score) for h in loaded.search("boundary layer on a flat plate", 5)]
        assert [i for i, _ in after] == [i for i, _ in before]
        np.testing.assert_allclose([s for _, s in after], [s for _, s in before], rtol=1e-5)


def test_pooled_encoder_on_onnx_equals_torch(cached, demo_texts):
    texts = TEXTS + demo_texts[:10]
    ref = PooledEncoder(pooling="norm", show_progress=False).encode(texts)
    got = PooledEncoder(pooling="norm", backend="onnx", show_progress=False).encode(texts)
    cos, rel = _cos_and_norm_change(ref, got)
    assert cos > 0.99999 and rel < 1e-4


def test_one_encoder_shared_by_threads_gives_single_threaded_answers(cached, demo_texts):
    enc = RawEncoder(backend="onnx-int8", batch_size=4, show_progress=False)
    parts = [demo_texts[i::4] for i in range(4)] + [TEXTS]
    alone = [enc.encode_with_counts(p) for p in parts]
    with ThreadPoolExecutor(5) as pool:
        together = list(pool.map(enc.encode_with_counts, parts * 3))
    for i, (vecs, counts) in enumerate(together):
        np.testing.assert_array_equal(vecs, alone[i % len(parts)][0])
        np.testing.assert_array_equal(counts, alone[i % len(parts)][1])


def test_missing_runtime_is_named(monkeypatch, cached):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    enc = RawEncoder(backend="onnx")  # construction stays free: the model loads on first use
    with pytest.raises(ModelLoadError, match=r"normrank\[onnx\]"):
        enc.encode(["x"])


def test_cpus_without_vnni_get_reduced_range_weights(encoder, tmp_path, monkeypatch):
    """Without VNNI the int8 weights use 7 bits (no 16-bit saturation); that model loads past its check,
    stays close to torch, and is cached under another name than the 8-bit one."""
    from normrank import onnx_backend

    assert onnx_backend.reduce_range("flags : fpu sse2 avx2 fma") is True
    assert onnx_backend.reduce_range("flags : fpu avx2 avx512f avx512_vnni") is False
    assert onnx_backend.reduce_range("flags : fpu avx2 avx_vnni") is False
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path))
    eight = RawEncoder(backend="onnx-int8", show_progress=False).encode(TEXTS)
    monkeypatch.setattr(onnx_backend, "reduce_range", lambda cpuinfo=None: True)
    seven = RawEncoder(backend="onnx-int8", show_progress=False).encode(TEXTS)
    assert len(list(tmp_path.glob("onnx/*/model-int8-*.onnx"))) == 2
    cos, rel = _cos_and_norm_change(encoder.encode(TEXTS), seven)
    assert cos > 0.95 and rel < 0.25
    assert not np.array_equal(seven, eight)


def test_an_index_encoded_with_torch_takes_queries_from_the_fp32_backend(encoder, cached, tmp_path, demo_texts):
    """fp32 ONNX gives torch's vectors, so a torch-built index can serve queries encoded on ONNX Runtime
    (one query per call ran 2.3x as fast in benchmarks/results/onnx.md) with the same hits."""
    index = NormIndex(encoder)
    index.add_texts(demo_texts, ids=[f"d{i}" for i in range(len(demo_texts))])
    index.save(tmp_path / "idx")
    served = NormIndex.load(tmp_path / "idx", encoder=RawEncoder(backend="onnx", show_progress=False))
    for q in ("what is photosynthesis", "how do vaccines work", "history of the roman empire"):
        want, got = index.search(q, 5), served.search(q, 5)
        assert [h.id for h in got] == [h.id for h in want]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
