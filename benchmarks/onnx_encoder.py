"""Would sentence-transformers' ONNX backend make indexing faster with the same ranking? (issue 14, item 7)

Runs in a SEPARATE environment, because the ONNX extra (``sentence-transformers[onnx]``:
optimum + onnxruntime) downgrades transformers and sentence-transformers, so it must not
be installed into normrank's main environment::

    python -m venv /work/venv-onnx
    /work/venv-onnx/bin/pip install "sentence-transformers[onnx]" -e .
    /work/venv-onnx/bin/python benchmarks/onnx_encoder.py

Measures, on the bundled all-MiniLM-L6-v2 with the Normalize module dropped (raw vectors,
as :class:`normrank.RawEncoder` encodes):

1. encode throughput of torch vs ONNX (fp32) vs ONNX dynamic int8, interleaved repetitions
   on the same Cranfield documents, same batch size, in one process;
2. the ranking each gives: nDCG@10 of plain cosine on Cranfield and CISI (all judged
   queries), and how far the raw norms move (normrank's feature is built from them).

Writes ``results/onnx.md`` and ``results/onnx.json``. The ship rule (issue 14): >= 1.5x
faster and nDCG@10 within 0.002 on both collections.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

HERE = Path(__file__).resolve().parent


def _raw(model: Any) -> Any:
    """The model without its Normalize module, like RawEncoder (raw norms kept)."""
    from sentence_transformers import SentenceTransformer

    modules = [m for m in model if type(m).__name__ != "Normalize"]
    raw = SentenceTransformer(modules=modules, device="cpu")
    raw.max_seq_length = model.max_seq_length
    return raw


def load_models(tmp: Path) -> tuple[dict[str, Any], dict[str, float], dict[str, str]]:
    from sentence_transformers import SentenceTransformer

    from normrank.encoders import default_model_path

    src = default_model_path()
    work = tmp / "model"
    shutil.copytree(src, work)
    models: dict[str, Any] = {}
    setup: dict[str, float] = {}
    notes: dict[str, str] = {}
    t = time.perf_counter()
    models["torch"] = _raw(SentenceTransformer(str(work), device="cpu", local_files_only=True))
    setup["torch"] = time.perf_counter() - t
    t = time.perf_counter()
    onnx = SentenceTransformer(str(work), device="cpu", backend="onnx", local_files_only=True)
    setup["onnx"] = time.perf_counter() - t
    models["onnx"] = _raw(onnx)
    try:
        from sentence_transformers.backend import export_dynamic_quantized_onnx_model

        t = time.perf_counter()
        onnx.save_pretrained(str(work))  # writes onnx/model.onnx beside the weights
        export_dynamic_quantized_onnx_model(onnx, "avx2", str(work))
        qfile = next(p for p in sorted((work / "onnx").glob("*int8*.onnx")))  # model_quint8_avx2.onnx
        q = SentenceTransformer(str(work), device="cpu", backend="onnx", local_files_only=True,
                                model_kwargs={"file_name": f"onnx/{qfile.name}"})
        notes["onnx_int8"] = f"dynamic quantization config 'avx2' -> {qfile.name}"
        setup["onnx_int8"] = time.perf_counter() - t
        models["onnx_int8"] = _raw(q)
    except Exception as exc:  # report, do not hide: int8 is optional
        notes["onnx_int8"] = f"int8 export failed: {type(exc).__name__}: {exc}"
    return models, setup, notes


def encode(model: Any, texts: list[str], batch_size: int) -> np.ndarray:
    return np.asarray(model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True),
                      dtype=np.float32)


def throughput(models: dict[str, Any], texts: list[str], reps: int, batch_size: int) -> dict[str, Any]:
    for m in models.values():  # warm-up
        encode(m, texts[:batch_size], batch_size)
    times: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(reps):
        for k, m in models.items():
            t = time.perf_counter()
            encode(m, texts, batch_size)
            times[k].append(time.perf_counter() - t)
    base = np.array(times["torch"])
    out: dict[str, Any] = {"n_texts": len(texts), "batch_size": batch_size, "reps": reps,
                           "texts_per_s": {k: len(texts) / float(np.median(v)) for k, v in times.items()},
                           "speedup_vs_torch": {}, "times_s": times}
    for k, v in times.items():
        r = base / np.array(v)
        out["speedup_vs_torch"][k] = {"median": float(np.median(r)), "p25": float(np.percentile(r, 25)),
                                      "p75": float(np.percentile(r, 75))}
    return out


def ranking(models: dict[str, Any], name: str, batch_size: int) -> dict[str, Any]:
    from normrank.datasets import default_data_dir, load_beir
    from normrank.metrics import per_query

    ds = load_beir(default_data_dir() / name)
    ids, texts, _ = ds.doc_items()
    qids = [q for q in ds.qrels if ds.qrels[q] and q in ds.queries and ds.queries[q].strip()]
    qtexts = [ds.queries[q] for q in qids]
    out: dict[str, Any] = {"docs": len(ids), "queries": len(qids), "ndcg@10": {}, "norms": {}}
    ref_norms = None
    for k, m in models.items():
        d = encode(m, texts, batch_size)
        q = encode(m, qtexts, batch_size)
        dn = np.linalg.norm(d.astype(np.float64), axis=1)
        s = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / dn[:, None].astype(np.float32)).T
        run = {}
        for i, qid in enumerate(qids):
            top = np.argsort(-s[i], kind="stable")[:100]
            run[qid] = {ids[j]: float(s[i, j]) for j in top}
        out["ndcg@10"][k] = float(np.mean(list(per_query(ds.qrels, run, "ndcg@10").values())))
        if ref_norms is None:
            ref_norms = dn
        rel = np.abs(dn - ref_norms) / ref_norms
        out["norms"][k] = {"max_rel_diff_vs_torch": float(rel.max()),
                           "median_rel_diff_vs_torch": float(np.median(rel))}
        print(f"[onnx] {name} {k}: nDCG@10 {out['ndcg@10'][k]:.4f}", file=sys.stderr, flush=True)
    return out


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    tp = res["throughput"]
    L = ["# ONNX encoder backend vs torch (issue 14, item 7)", "",
         f"Measured {m['date']} on {m['machine']}; the 2 cores were heavily shared with other jobs "
         f"(load average {m['load']:.1f}), so read the ratios (interleaved in one process), not the absolute rates.",
         f"Environment: a separate venv (`/work/venv-onnx`): sentence-transformers {m['st']}, transformers "
         f"{m['transformers']}, onnxruntime {m['ort']}, torch {m['torch']} ({m['torch_threads']} threads). "
         "Installing `sentence-transformers[onnx]` downgraded transformers (to 4.57) and sentence-transformers "
         "(to 5.7) there, which is why it is not in normrank's main environment.",
         "Command: `/work/venv-onnx/bin/python benchmarks/onnx_encoder.py`. Model: bundled all-MiniLM-L6-v2, "
         "Normalize dropped (raw vectors, as `RawEncoder`).", "",
         f"## Throughput ({tp['n_texts']} Cranfield documents, batch {tp['batch_size']}, {tp['reps']} "
         "interleaved repetitions)", "",
         "| backend | set-up s (load/export) | texts/s (median) | speed-up vs torch: median (p25-p75) |",
         "|---|---|---|---|"]
    for k, v in tp["texts_per_s"].items():
        s = tp["speedup_vs_torch"][k]
        L.append(f"| {k} | {res['setup_s'].get(k, float('nan')):.1f} | {v:.1f} | "
                 f"{s['median']:.2f} ({s['p25']:.2f}-{s['p75']:.2f}) |")
    L += ["", "## Ranking (plain cosine, all judged queries)", "",
          "| collection | backend | nDCG@10 | diff vs torch | max rel. norm diff vs torch |", "|---|---|---|---|---|"]
    for name, r in res["ranking"].items():
        for k, v in r["ndcg@10"].items():
            L.append(f"| {name} ({r['docs']} docs, {r['queries']} queries) | {k} | {v:.4f} | "
                     f"{v - r['ndcg@10']['torch']:+.4f} | {r['norms'][k]['max_rel_diff_vs_torch']:.2e} |")
    L += ["", "## Verdict", ""]
    for k in tp["texts_per_s"]:
        if k == "torch":
            continue
        fast = tp["speedup_vs_torch"][k]["median"] >= 1.5
        same = all(abs(r["ndcg@10"][k] - r["ndcg@10"]["torch"]) <= 0.002 for r in res["ranking"].values()
                   if k in r["ndcg@10"])
        L.append(f"- {k}: {'>= 1.5x' if fast else '< 1.5x'} faster, nDCG@10 "
                 f"{'within' if same else 'NOT within'} 0.002 on every collection -> "
                 f"{'ship as an option' if fast and same else 'not shipped'}.")
    for k, v in res.get("notes", {}).items():
        L.append(f"- {k}: {v}")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--collections", nargs="*", default=["cranfield", "cisi"])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    import platform

    import onnxruntime
    import sentence_transformers
    import torch
    import transformers

    from normrank.datasets import default_data_dir, load_beir

    with tempfile.TemporaryDirectory(prefix="normrank-onnx-") as tmp:
        models, setup, notes = load_models(Path(tmp))
        _, texts, _ = load_beir(default_data_dir() / "cranfield").doc_items()
        print("[onnx] throughput ...", file=sys.stderr, flush=True)
        tp = throughput(models, texts[: args.texts], args.reps, args.batch_size)
        print(f"[onnx] {tp['texts_per_s']}", file=sys.stderr, flush=True)
        rk = {name: ranking(models, name, args.batch_size) for name in args.collections}
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    res = {"meta": {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "machine": f"{cpu}, {os.cpu_count()} cores", "load": os.getloadavg()[0],
                    "st": sentence_transformers.__version__, "transformers": transformers.__version__,
                    "ort": onnxruntime.__version__, "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
           "setup_s": setup, "notes": notes, "throughput": tp, "ranking": rk}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "onnx.json").write_text(json.dumps(res, indent=1))
    (args.out / "onnx.md").write_text(markdown(res), encoding="utf-8")
    print(f"[onnx] wrote {args.out / 'onnx.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
