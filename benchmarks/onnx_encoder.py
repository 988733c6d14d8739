"""Does ``RawEncoder(backend="onnx" | "onnx-int8")`` make indexing faster with the same ranking? (issue 14, item 7)

Runs in normrank's own environment (``pip install 'normrank[onnx]'``: onnxruntime and onnx; no
optimum, whose ONNX package pins transformers below what normrank runs with)::

    python benchmarks/onnx_encoder.py

Measures, on the bundled all-MiniLM-L6-v2 (raw vectors, Normalize dropped):

1. set-up: the first load (export, and quantisation for int8, into an empty cache) and a cached load;
2. encode throughput of ``RawEncoder.encode`` per backend, interleaved repetitions on the same
   Cranfield documents in one process (every backend also counts tokens, as indexing does);
3. the ranking each gives on Cranfield and CISI (all judged queries): nDCG@10 of plain cosine (the
   ship rule: within 0.002 of torch) and of normrank's blend (``NormIndex``, fixed a = 0.02, each
   backend calibrated on its own norms), and how far the raw norms move.

Writes ``results/onnx.md`` and ``results/onnx.json``. The ship rule (issue 14): >= 1.5x faster and
plain-cosine nDCG@10 within 0.002 on both collections.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from speed import cpu_model, ratio_spread

BACKENDS = ("torch", "onnx", "onnx-int8")
BLEND_A = 0.02
#: The collections issue 14's ship rule names; others are reported beside them.
RULE_COLLECTIONS = ("cranfield", "cisi")


def load_encoders(batch_size: int) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """One encoder per backend, loaded twice: into an empty cache (what a first user pays), then from it."""
    from normrank import RawEncoder

    encoders: dict[str, Any] = {}
    setup: dict[str, dict[str, float]] = {}
    for backend in BACKENDS:
        times = []
        for _ in range(2):
            t = time.perf_counter()
            enc = RawEncoder(backend=backend, batch_size=batch_size, show_progress=False)
            _ = enc.model  # loads (and exports / quantises on first use)
            times.append(time.perf_counter() - t)
        setup[backend] = {"first_s": times[0], "cached_s": times[1]}
        encoders[backend] = enc
    return encoders, setup


def in_turns(encoders: dict[str, Any], reps: int) -> Iterator[tuple[str, Any]]:
    """Every backend once per repetition, every other repetition in reverse order, so load changes hit
    all of them alike (as ``speed.interleaved``, without its cache eviction: encoders are compute-bound)."""
    order = list(encoders.items())
    for r in range(reps):
        yield from (order if r % 2 == 0 else order[::-1])


def speedups(per_rep: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per backend, torch's time over its time: median, p25, p75 over the repetitions."""
    return {k: dict(zip(("median", "p25", "p75"), ratio_spread(per_rep["torch"], v), strict=True))
            for k, v in per_rep.items()}


def throughput(encoders: dict[str, Any], texts: list[str], reps: int) -> dict[str, Any]:
    for enc in encoders.values():  # warm-up
        enc.encode(texts[:64])
    times: dict[str, list[float]] = {k: [] for k in encoders}
    for k, enc in in_turns(encoders, reps):
        t = time.perf_counter()
        enc.encode(texts)
        times[k].append(time.perf_counter() - t)
    return {"n_texts": len(texts), "reps": reps, "times_s": times,
            "texts_per_s": {k: len(texts) / float(np.median(v)) for k, v in times.items()},
            "speedup_vs_torch": speedups(times)}


def query_latency(encoders: dict[str, Any], queries: list[str], reps: int) -> dict[str, Any]:
    """One query per call (``encode_with_counts([q])``, what a retriever does per request), interleaved:
    each repetition runs every backend over the same queries, in alternating order."""
    for enc in encoders.values():  # warm-up
        enc.encode_with_counts(queries[:4])
    per_rep: dict[str, list[float]] = {k: [] for k in encoders}
    for k, enc in in_turns(encoders, reps):
        times = []
        for q in queries:
            t = time.perf_counter()
            enc.encode_with_counts([q])
            times.append(time.perf_counter() - t)
        per_rep[k].append(float(np.median(times)))
    return {"n_queries": len(queries), "reps": reps,
            "ms": {k: 1e3 * float(np.median(v)) for k, v in per_rep.items()},
            "speedup_vs_torch": speedups(per_rep)}


def ranking(encoders: dict[str, Any], name: str) -> dict[str, Any]:
    from normrank import NormIndex, Weights
    from normrank.datasets import default_data_dir, load_beir
    from normrank.metrics import per_query

    ds = load_beir(default_data_dir() / name)
    ids, texts, _ = ds.doc_items()
    qids = [q for q in ds.qrels if ds.qrels[q] and q in ds.queries and ds.queries[q].strip()]
    qtexts = [ds.queries[q] for q in qids]
    out: dict[str, Any] = {"docs": len(ids), "queries": len(qids), "ndcg@10": {}, "blend_ndcg@10": {}, "norms": {},
                           "p_vs_torch": {}, "blend_p_vs_torch": {}}
    ref_norms = None
    per: dict[str, dict[str, list[float]]] = {"cos": {}, "blend": {}}
    for k, enc in encoders.items():
        d, dc = enc.encode_with_counts(texts)
        q, qc = enc.encode_with_counts(qtexts)
        dn = np.linalg.norm(d.astype(np.float64), axis=1)
        s = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / dn[:, None].astype(np.float32)).T
        run = {}
        for i, qid in enumerate(qids):
            top = np.argsort(-s[i], kind="stable")[:100]
            run[qid] = {ids[j]: float(s[i, j]) for j in top}
        values = per_query(ds.qrels, run, "ndcg@10")
        per["cos"][k] = [values.get(qid, 0.0) for qid in qids]
        out["ndcg@10"][k] = float(np.mean(per["cos"][k]))
        index = NormIndex(dim=d.shape[1], weights=Weights(a=BLEND_A))
        index.add_vectors(d, dc, ids=ids)
        hits = index.search_batch(list(q), 100, query_token_counts=[int(c) for c in qc])
        blend = {qid: {h.id: h.score for h in row} for qid, row in zip(qids, hits, strict=True)}
        values = per_query(ds.qrels, blend, "ndcg@10")
        per["blend"][k] = [values.get(qid, 0.0) for qid in qids]
        out["blend_ndcg@10"][k] = float(np.mean(per["blend"][k]))
        out["p_vs_torch"][k] = _paired_p(per["cos"][k], per["cos"]["torch"])
        out["blend_p_vs_torch"][k] = _paired_p(per["blend"][k], per["blend"]["torch"])
        if ref_norms is None:
            ref_norms = dn
        rel = np.abs(dn - ref_norms) / ref_norms
        rank_corr = float(np.corrcoef(np.argsort(np.argsort(dn)), np.argsort(np.argsort(ref_norms)))[0, 1])
        out["norms"][k] = {"max_rel_diff_vs_torch": float(rel.max()), "median_rel_diff_vs_torch": float(np.median(rel)),
                           "spearman_vs_torch": rank_corr}
        print(f"[onnx] {name} {k}: nDCG@10 {out['ndcg@10'][k]:.4f}, blend {out['blend_ndcg@10'][k]:.4f}",
              file=sys.stderr, flush=True)
    return out


def _paired_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided paired t-test over queries; ``None`` where the two runs are identical."""
    from scipy.stats import ttest_rel

    d = np.asarray(a) - np.asarray(b)
    return None if not np.any(d) else float(ttest_rel(a, b).pvalue)


def _fmt_p(p: float | None) -> str:
    return "same" if p is None else f"p = {p:.2f}"


def verdicts(res: dict[str, Any]) -> dict[str, bool]:
    tp = res["throughput"]
    out = {}
    for k in tp["texts_per_s"]:
        if k == "torch":
            continue
        fast = tp["speedup_vs_torch"][k]["median"] >= 1.5
        rule = [res["ranking"][name] for name in RULE_COLLECTIONS if name in res["ranking"]]
        same = len(rule) == len(RULE_COLLECTIONS) and all(
            abs(r["ndcg@10"][k] - r["ndcg@10"]["torch"]) <= 0.002 for r in rule)
        out[k] = fast and same
    return out


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    tp = res["throughput"]
    L = ["# ONNX encoder backends vs torch (issue 14, item 7)", "",
         (f"Measured {m['date']} on {m['machine']} (1-minute load average {m['load']:.1f} at the end); read the "
          "ratios (interleaved in one process, alternating order) rather than the absolute rates."),
         (f"normrank's own `RawEncoder(backend=...)`: torch {m['torch']} ({m['torch_threads']} threads; ONNX Runtime "
          f"{m['ort']} with the same thread count), sentence-transformers {m['st']}, transformers {m['transformers']}. "
          f"CPU flags: AVX-512 VNNI {'yes' if m['vnni'] else 'no'}."),
         "Command: `python benchmarks/onnx_encoder.py`. Model: bundled all-MiniLM-L6-v2, raw vectors.", "",
         f"## Throughput ({tp['n_texts']} Cranfield documents, batch 64, {tp['reps']} interleaved repetitions)", "",
         ("| backend | first load s (export, quantise) | cached load s | texts/s (median) | speed-up vs torch: median "
          "(p25-p75) |"), "|---|---|---|---|---|"]
    for k, v in tp["texts_per_s"].items():
        s, st = tp["speedup_vs_torch"][k], res["setup_s"][k]
        L.append(f"| {k} | {st['first_s']:.1f} | {st['cached_s']:.1f} | {v:.1f} | "
                 f"{s['median']:.2f} ({s['p25']:.2f}-{s['p75']:.2f}) |")
    lat = res.get("latency")
    if lat:
        L += ["", (f"## One query per call ({lat['n_queries']} Cranfield queries, `encode_with_counts([q])`, "
                   f"{lat['reps']} interleaved repetitions)"), "",
              ("What a retriever pays per request before it searches. The torch backend is sentence-transformers' "
               "`encode`, whose per-call work weighs on one short text."), "",
              "| backend | ms per query (median) | speed-up vs torch: median (p25-p75) |", "|---|---|---|"]
        for k, v in lat["ms"].items():
            sp = lat["speedup_vs_torch"][k]
            L.append(f"| {k} | {v:.2f} | {sp['median']:.2f} ({sp['p25']:.2f}-{sp['p75']:.2f}) |")
    L += ["", "## Ranking (all judged queries)", "",
          (f"Plain cosine, and normrank's blend (`NormIndex`, additive a = {BLEND_A}, each backend calibrated on its "
           "own norms). Norms: how far each document's raw norm moved from torch's, and the rank correlation "
           "of the norms with torch's."), "",
          ("| collection | backend | nDCG@10 cosine | diff vs torch (paired t-test) | nDCG@10 blend | diff vs torch "
           "(paired t-test) | norm change: median / max | norm rank corr. |"), "|---|---|---|---|---|---|---|---|"]
    for name, r in res["ranking"].items():
        for k, v in r["ndcg@10"].items():
            b, nm = r["blend_ndcg@10"][k], r["norms"][k]
            L.append(f"| {name} ({r['docs']} docs, {r['queries']} queries) | {k} | {v:.4f} | "
                     f"{v - r['ndcg@10']['torch']:+.4f} ({_fmt_p(r['p_vs_torch'][k])}) | {b:.4f} | "
                     f"{b - r['blend_ndcg@10']['torch']:+.4f} ({_fmt_p(r['blend_p_vs_torch'][k])}) | "
                     f"{nm['median_rel_diff_vs_torch']:.1e} / {nm['max_rel_diff_vs_torch']:.1e} | "
                     f"{nm['spearman_vs_torch']:.4f} |")
    L += ["", "## Verdict", ""]
    for k, ok in verdicts(res).items():
        s = tp["speedup_vs_torch"][k]["median"]
        diffs = ", ".join(f"{name} {r['ndcg@10'][k] - r['ndcg@10']['torch']:+.4f}" for name, r in res["ranking"].items())
        L.append(f"- `{k}`: {s:.2f}x torch; plain-cosine nDCG@10 {diffs or 'not measured'} -> "
                 f"{'meets' if ok else 'does not meet'} issue 14's rule (>= 1.5x and within 0.002 on "
                 f"{' and '.join(RULE_COLLECTIONS)}).")
    moved = max((r["norms"].get("onnx-int8", {}).get("max_rel_diff_vs_torch", 0.0) for r in res["ranking"].values()),
                default=float("nan"))
    fast = (f" and answered one query per call {lat['speedup_vs_torch']['onnx']['median']:.1f}x as fast, so an index "
            "encoded with torch can take its queries from `onnx`" if lat else "")
    L += ["", ("What ships: both backends as opt-in `RawEncoder(backend=...)` (`encoder.backend` in YAML); torch "
               f"stays the default. `onnx` computes torch's vectors{fast}. `onnx-int8` rounds weights and activations to "
               f"8 bits: raw norms moved by up to {moved:.0%} here, and rankings by small amounts either way (see "
               "the paired t-tests), so encode a corpus and its queries with one backend (a saved index reopens "
               "with its own). int8 speed and rounding depend on the CPU's integer instructions: re-run this "
               "script on yours.")]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--queries", type=int, default=64, help="Cranfield queries for the one-query latency")
    ap.add_argument("--collections", nargs="*", default=["cranfield", "cisi", "scifact"])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    import onnxruntime
    import sentence_transformers
    import torch
    import transformers

    from normrank.datasets import default_data_dir, load_beir
    from normrank.onnx_backend import reduce_range

    with tempfile.TemporaryDirectory(prefix="normrank-onnx-cache-") as cache:
        os.environ["NORMRANK_CACHE"] = cache  # an empty cache: the first load pays the export
        encoders, setup = load_encoders(64)
        ds = load_beir(default_data_dir() / "cranfield")
        _, texts, _ = ds.doc_items()
        print("[onnx] throughput ...", file=sys.stderr, flush=True)
        tp = throughput(encoders, texts[: args.texts], args.reps)
        print(f"[onnx] {tp['texts_per_s']}", file=sys.stderr, flush=True)
        queries = [ds.queries[q] for q in sorted(ds.queries)][: args.queries]
        lat = query_latency(encoders, queries, args.reps)
        print(f"[onnx] one query: {lat['ms']}", file=sys.stderr, flush=True)
        rk = {name: ranking(encoders, name) for name in args.collections}
    res = {"meta": {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "machine": f"{cpu_model()}, {os.cpu_count()} cores", "load": os.getloadavg()[0],
                    "vnni": not reduce_range(),  # the CPU flags that decide the int8 weights' range
                    "st": sentence_transformers.__version__, "transformers": transformers.__version__,
                    "ort": onnxruntime.__version__, "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
           "setup_s": setup, "throughput": tp, "latency": lat, "ranking": rk}
    res["verdicts"] = verdicts(res)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "onnx.json").write_text(json.dumps(res, indent=1))
    (args.out / "onnx.md").write_text(markdown(res), encoding="utf-8")
    print(f"[onnx] wrote {args.out / 'onnx.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
