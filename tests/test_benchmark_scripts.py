"""Each benchmark script runs end to end on a tiny input and writes its report (no timing asserts)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_quality_tiny_on_a_collection_slice(data_dir, tmp_path, encoder):
    quality = _load("quality")
    assert quality.main(["--tiny", "--data", str(data_dir), "--collections", "cranfield", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "quality.md").read_text()
    assert "| cranfield-tiny | cosine |" in md and "| cranfield-tiny | prune 10% |" in md
    for run in ("bm25", "rawdot", "normrank", "calibrated multiplicative forced", "raw tiebreak"):
        assert f"| cranfield-tiny | {run} |" in md
    assert (tmp_path / "quality_cranfield-tiny.png").read_bytes()[:4] == b"\x89PNG"
    res = json.loads((tmp_path / "quality.json").read_text())["results"][0]
    rows = {r["run"]: r for r in res["rows"]}
    # the shipped blend is never significantly worse than cosine; pruning can only lose recall
    nr = rows["normrank"]["t_ndcg"]
    assert nr["p"] >= 0.05 or nr["delta"] > 0
    assert rows["prune 10%"]["recall@100"] <= rows["prune 5%"]["recall@100"] + 1e-12


def test_quality_slice_keeps_judged_documents(data_dir, tmp_path):
    quality = _load("quality")
    out = quality.write_slice(data_dir / "cranfield", tmp_path / "slice", n_docs=120, n_queries=10)
    from normrank.datasets import load_beir

    ds = load_beir(out, "test")
    assert len(ds.corpus) == 120 and 1 <= len(ds.queries) <= 10
    assert all(d in ds.corpus for docs in ds.qrels.values() for d in docs)


def test_quality_demo_collection_without_data(tmp_path):
    quality = _load("quality")
    out = quality.write_demo_collection(tmp_path / "demo")
    from normrank.datasets import load_beir

    ds = load_beir(out, "test")
    assert len(ds.corpus) == len(ds.queries) == sum(len(v) for v in ds.qrels.values())


def test_speed_tiny(tmp_path, encoder):
    speed = _load("speed")
    assert speed.main(["--tiny", "--out", str(tmp_path), "--omp-threads", "1"]) == 0
    md = (tmp_path / "speed.md").read_text()
    for heading in ("## 1. Exact blended top-10", "## 2. HNSW", "## 3. Raw encoder", "## 4. Bytes per document"):
        assert heading in md
    res = json.loads((tmp_path / "speed.json").read_text())
    cell = res["search"][0]
    assert cell["exact_overlap_at_10"] == 1.0  # the blended top-10 is the brute-force one
    assert cell["hnsw"]["recall_at_10"] > 0.9
    assert res["encoder"]["min_cosine_raw_vs_stock_direction"] > 0.9999
    b = res["bytes"]
    assert b["pad8"]["augmented_dim"] == 392 and b["pad1"]["augmented_dim"] == 385
    # padding costs exactly 7 more float32 columns per document in the FAISS file
    assert b["pad8"]["faiss_file_extra_per_doc"] - b["pad1"]["faiss_file_extra_per_doc"] == pytest.approx(28.0)
    for mode in cell["modes"].values():  # the FAISS twin is timed beside FAISS in every cell
        assert "faiss_twin" in mode["ratio_vs_faiss"] and mode["ratio_vs_faiss"]["faiss_twin"] > 0


def test_scan_bound_tiny(tmp_path):
    scan_bound = _load("scan_bound")
    if not scan_bound.build_kernels(tmp_path):
        pytest.skip("no C compiler or no AVX2/FMA CPU: scan_bound.py measures nothing here")
    assert scan_bound.main(["--tiny", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "scan_bound.md").read_text()
    from normrank.store import PAD_TO_BY_INDEX_TYPE

    pad = PAD_TO_BY_INDEX_TYPE["flat"]
    assert f"## 2,000 documents (stored width {-(-385 // pad) * pad})" in md  # the default flat layout
    # every hand kernel finds FAISS's own top-10 over the same stored vectors
    rows = [ln for ln in md.splitlines() if "+ FAISS heap (top-10)" in ln]
    assert rows and all(ln.rstrip().endswith("| 8/8 |") for ln in rows)
    assert "`NormIndex.search`" in md and "All in cache" in md


def test_onnx_encoder_tiny(data_dir, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime", reason="the ONNX backends need normrank[onnx]")
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))  # the script points it at its own empty cache
    onnx = _load("onnx_encoder")
    assert onnx.main(["--texts", "16", "--reps", "1", "--queries", "4", "--collections", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "onnx.md").read_text()
    assert "## One query per call (4 Cranfield queries" in md
    for backend in ("torch", "onnx", "onnx-int8"):
        assert f"| {backend} | " in md
    res = json.loads((tmp_path / "onnx.json").read_text())
    assert set(res["verdicts"]) == {"onnx", "onnx-int8"}
    assert all(v["first_s"] > 0 and v["cached_s"] > 0 for v in res["setup_s"].values())


def test_anchors_tiny(tmp_path, encoder, monkeypatch):
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))  # an ONNX export of its own, if any
    anchors = _load("anchors")
    assert anchors.main(["--sizes", "300", "--reps", "1", "--encode-reps", "2", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "anchors.md").read_text()
    assert "## Store only" in md and "## End to end (query encode + store)" in md
    assert "| 300 | " in md
    res = json.loads((tmp_path / "anchors.json").read_text())
    enc = res["encode"]["median_ms"]
    assert enc["normrank RawEncoder.encode_with_counts"] > 0
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        assert anchors.ONNX_ENCODE not in enc and "ONNX query" not in md
    else:  # the query encoded on ONNX Runtime, end to end beside torch's
        assert enc[anchors.ONNX_ENCODE] > 0 and "| docs | langchain_normrank, ONNX query |" in md
