"""Quality benchmark: does norm weighting help retrieval on real collections?

For every BEIR collection in the data folder (default ``$NORMRANK_DATA`` or ``../shared/data``):
cosine, BM25 (bm25s defaults), raw dot product ``q_hat . d_raw``, normrank as
``normrank.fitting`` fits it by default, normrank fitted with each feature (calibrated,
raw) and each mode (additive, multiplicative, tiebreak), and cosine after pruning the
lowest 5% / 10% of documents by calibrated norm. Protocol as ``normrank eval``: train ->
test where a train split exists (scifact), otherwise 5-fold cross-validation; the
evaluated queries never take part in any fit.

Each fitted configuration is reported twice:

* ``fitted``: what the never-harm fit ships (plain cosine unless a cross-validated gain on
  the training queries passes a paired test);
* ``forced``: the best blend on the training queries applied regardless, to show what the
  blend itself does to unseen queries.

Writes ``results/quality.md`` (one table) and ``results/quality_<collection>.png``.

    python benchmarks/quality.py                   # all collections, a few minutes once cached
    python benchmarks/quality.py --tiny --out /tmp/q  # 200-document smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from normrank.calibration import FEATURES  # noqa: E402
from normrank.datasets import available_splits, default_data_dir, load_beir  # noqa: E402
from normrank.encoders import RawEncoder  # noqa: E402
from normrank.evaluation import (  # noqa: E402
    Evaluator,
    choose_protocol,
    eval_qids,
    load_collection,
    paired,
    scores,
)
from normrank.fitting import check_qrels  # noqa: E402
from normrank.metrics import has_relevant  # noqa: E402
from normrank.scoring import MODES  # noqa: E402

logger = logging.getLogger("benchmarks.quality")
HERE = Path(__file__).resolve().parent
PRUNE = (0.05, 0.10)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import faiss
    import torch

    return (f"{cpu}, {os.cpu_count()} cores (shared), Python {platform.python_version()}, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), faiss {faiss.__version__}")


# ------------------------------------------------------------------ tiny inputs
def write_slice(src: Path, out: Path, n_docs: int = 200, n_queries: int = 30, seed: int = 0) -> Path:
    """A small BEIR folder: ``n_queries`` judged queries, their relevant documents, filled up to
    ``n_docs`` with other documents of the corpus (one split, ``test``)."""
    split = "test" if "test" in available_splits(src) else available_splits(src)[0]
    ds = load_beir(src, split)
    rng = np.random.default_rng(seed)
    judged = has_relevant(ds.qrels)
    qids: list[str] = []
    docs: list[str] = []
    for i in rng.permutation(len(judged)):  # queries whose relevant documents fit in half the budget
        rel = [d for d, s in ds.qrels[judged[i]].items() if s > 0 and d not in docs]
        if len(docs) + len(rel) <= n_docs // 2:
            qids.append(judged[i])
            docs += rel
        if len(qids) >= n_queries:
            break
    qids.sort(key=judged.index)
    others = [d for d in ds.corpus if d not in set(docs)]
    docs += [others[i] for i in sorted(rng.choice(len(others), size=max(0, n_docs - len(docs)), replace=False))]
    keep = set(docs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for d in ds.corpus.values():
            if d.id in keep:
                fh.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for q in qids:
            fh.write(json.dumps({"_id": q, "text": ds.queries[q]}) + "\n")
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q in qids:
            for d, s in ds.qrels[q].items():
                if d in keep:
                    fh.write(f"{q}\t{d}\t{s}\n")
    return out


def write_demo_collection(out: Path) -> Path:
    """Known-item search over the bundled demo corpus (each title finds its passage): for machines
    without any BEIR collection."""
    from normrank.datasets import demo_rows

    rows = demo_rows()
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({"_id": r["_id"], "title": "", "text": r["text"]}) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({"_id": f"q-{r['_id']}", "text": r["title"]}) + "\n")
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for r in rows:
            fh.write(f"q-{r['_id']}\t{r['_id']}\t1\n")
    return out


# ------------------------------------------------------------------ one collection
def run_collection(path: Path, encoder: RawEncoder, folds: int | None = None, seed: int = 0) -> dict[str, Any]:
    t0 = time.perf_counter()
    protocol = choose_protocol(path, folds=folds, seed=seed)
    splits = [protocol.split] + ([protocol.train_split] if protocol.train_split else [])
    coll = load_collection(path, splits, encoder, show_progress=True)
    for s in splits:
        check_qrels(coll.qrels[s], coll.queries, set(coll.ids), missing_ok=coll.skipped)
    qids = eval_qids(coll, protocol.split)
    qrels = coll.qrels[protocol.split]
    ev = Evaluator(coll, encoder)
    rows: list[dict[str, Any]] = []
    per: dict[str, dict[str, dict[str, float]]] = {}

    def add(name: str, run: dict, note: str = "") -> None:
        per[name] = scores(qrels, run, qids)
        rows.append({"run": name, "note": note})

    add("cosine", ev.cosine(qids))
    add("bm25", ev.bm25(qids), "bm25s defaults")
    add("rawdot", ev.rawdot(qids), "q_hat . d_raw")
    fits: dict[str, Any] = {}
    runs, fit = ev.normrank_variants(protocol, qids, None, ("fitted", "forced"))
    fits["normrank"] = fit
    add("normrank", runs["fitted"], _fit_note(fit, "fitted"))
    add("normrank forced", runs["forced"], _fit_note(fit, "forced"))
    for feat in FEATURES:
        for mode in MODES:
            runs, fit = ev.normrank_variants(protocol, qids, {"features": [feat], "modes": [mode]},
                                             ("fitted", "forced"))
            fits[f"{feat}/{mode}"] = fit
            add(f"{feat} {mode}", runs["fitted"], _fit_note(fit, "fitted"))
            add(f"{feat} {mode} forced", runs["forced"], _fit_note(fit, "forced"))
    base_prune, _ = ev.pruned_cosine(qids, 0.0)
    per_prune_base = scores(qrels, base_prune, qids)
    prune = {}
    for frac in PRUNE:
        run, n_drop = ev.pruned_cosine(qids, frac)
        s = scores(qrels, run, qids)
        prune[frac] = {"n_dropped": n_drop, **{m: _mean(s[m]) for m in s},
                       "before": {m: _mean(per_prune_base[m]) for m in per_prune_base},
                       "test_recall": paired(s["recall@100"], per_prune_base["recall@100"]),
                       "test_ndcg": paired(s["ndcg@10"], per_prune_base["ndcg@10"])}
        per[f"prune {int(frac * 100)}%"] = s
        rows.append({"run": f"prune {int(frac * 100)}%", "note": f"cosine without the {n_drop} docs of "
                     "lowest calibrated norm"})
    for r in rows:
        s = per[r["run"]]
        r["ndcg@10"], r["recall@100"] = _mean(s["ndcg@10"]), _mean(s["recall@100"])
        base = per_prune_base if r["run"].startswith("prune") else per["cosine"]
        r["t_ndcg"] = paired(s["ndcg@10"], base["ndcg@10"])
        r["t_recall"] = paired(s["recall@100"], base["recall@100"])
    return {"name": coll.name, "protocol": protocol.name, "n_queries": len(qids), "n_docs": len(coll.ids),
            "skipped_docs": len(coll.skipped), "rows": rows, "fits": fits, "prune": prune,
            "seconds": time.perf_counter() - t0}


def _mean(d: dict[str, float]) -> float:
    return float(np.mean(list(d.values()))) if d else 0.0


def _fit_note(fit: dict[str, Any], variant: str) -> str:
    def desc(w: dict[str, Any]) -> str:
        if w["a"] == 0 and w["b"] == 0:
            return "cosine"
        if w["mode"] == "tiebreak":
            return f"{w['feature'][:3]} tb eps={w['epsilon']:g}{'+' if w['a'] > 0 else '-'}"
        return f"{w['feature'][:3]} {w['mode'][:4]} a={w['a']:+g} b={w['b']:+g}"

    if "per_fold" in fit:
        ws = [desc(f[f"applied_{variant}"]) for f in fit["per_fold"]]
        acc = fit["accepted_folds"]
        distinct = sorted(set(ws))
        shown = "; ".join(distinct[:2]) + (f"; +{len(distinct) - 2} more" if len(distinct) > 2 else "")
        return f"accepted {acc}/{len(ws)} folds; {shown}"
    return f"{'accepted' if fit['accepted'] else 'rejected'} on train; {desc(fit[f'applied_{variant}'])}"


# ------------------------------------------------------------------ output
def markdown(results: list[dict[str, Any]], meta: dict[str, str]) -> str:
    lines = [
        "# Quality benchmark",
        "",
        f"Measured {meta['date']} on {meta['machine']}; model {meta['model']}.",
        "Command: `python benchmarks/quality.py" + (" --tiny" if meta.get("tiny") else "")
        + (f" --model {meta['model_option']}" if meta.get("model_option") else "") + "`.",
        "",
        "Protocol: train -> test where the collection has a train split, else 5-fold cross-validation over the",
        "judged queries (seed 0); every fit (weights and query calibration) sees only training queries.",
        "Metrics from normrank.metrics (trec_eval's definitions, tested equal to pytrec_eval); Delta and p:",
        "two-sided paired t-test over queries against cosine",
        "(pruning rows: against unpruned cosine computed the same way); up/down: queries whose nDCG@10 rose/fell.",
        "`fitted` = what the never-harm fit ships; `forced` = the best blend on the training queries applied anyway.",
        "",
        "| collection | run | nDCG@10 | Delta | p | up/down | R@100 | Delta R | p (R) | fit / note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for r in res["rows"]:
            tn, tr = r["t_ndcg"], r["t_recall"]
            if r["run"] == "cosine":
                dn = pn = ud = dr = pr = ""
            else:
                dn, pn, ud = f"{tn['delta']:+.4f}", _p(tn["p"]), f"{tn['improved']}/{tn['worsened']}"
                dr, pr = f"{tr['delta']:+.4f}", _p(tr["p"])
            lines.append(f"| {res['name']} | {r['run']} | {r['ndcg@10']:.4f} | {dn} | {pn} | {ud} | "
                         f"{r['recall@100']:.4f} | {dr} | {pr} | {r['note']} |")
    lines += ["", "Collections:", ""]
    for res in results:
        lines.append(f"- {res['name']}: {res['n_docs']} documents ({res['skipped_docs']} empty ones skipped, kept "
                     f"in the qrels as unretrievable), {res['n_queries']} evaluated queries, {res['protocol']}; "
                     f"{res['seconds']:.0f} s.")
    lines += ["", "Reading the table:", ""]
    for res in results:
        lines.append(f"- {summary(res)}")
    return "\n".join(lines) + "\n"


def _p(p: float) -> str:
    return "1" if p >= 0.9995 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def summary(res: dict[str, Any]) -> str:
    """One honest sentence per collection, computed from the numbers."""
    rows = {r["run"]: r for r in res["rows"]}
    nr = rows["normrank"]["t_ndcg"]
    forced = [(n, r) for n, r in rows.items() if n.endswith("forced")]
    best = max(forced, key=lambda x: x[1]["ndcg@10"])
    worse_sig = [n for n, r in forced if r["t_ndcg"]["p"] < 0.05 and r["t_ndcg"]["delta"] < 0]
    better_sig = [n for n, r in forced if r["t_ndcg"]["p"] < 0.05 and r["t_ndcg"]["delta"] > 0]
    pr = res["prune"]
    prune_txt = ", ".join(f"{int(f * 100)}%: R@100 {v['before']['recall@100']:.4f} -> {v['recall@100']:.4f}"
                          for f, v in pr.items())
    return (f"{res['name']}: fitted normrank {nr['delta']:+.4f} nDCG@10 vs cosine (p={_p(nr['p'])}); best forced "
            f"blend {best[0]!r} {best[1]['t_ndcg']['delta']:+.4f} (p={_p(best[1]['t_ndcg']['p'])}); forced blends "
            f"significantly better: {better_sig or 'none'}, significantly worse: {worse_sig or 'none'}; "
            f"pruning {prune_txt}.")


def _color(t: dict[str, Any]) -> str:
    if t["p"] < 0.05:
        return "#228833" if t["delta"] > 0 else "#cc3311"
    return "#4477aa"


def plot(res: dict[str, Any], path: Path) -> None:
    """nDCG@10 per run, and the paired differences to cosine (nDCG@10, Recall@100) with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    names = [r["run"] for r in rows]
    y = np.arange(len(rows))[::-1]
    fig, ax = plt.subplots(1, 3, figsize=(14, 0.3 * len(rows) + 1.8), sharey=True)
    ax[0].barh(y, [r["ndcg@10"] for r in rows], color=["#888888" if n == "cosine" else "#4477aa" for n in names])
    cos = next(r for r in rows if r["run"] == "cosine")
    ax[0].axvline(cos["ndcg@10"], color="k", lw=0.8, ls="--")
    ax[0].set(yticks=y, yticklabels=names, xlabel="nDCG@10")
    ax[0].set_xlim(max(0.0, min(r["ndcg@10"] for r in rows) - 0.03), None)
    for i, (key, label) in enumerate((("t_ndcg", "nDCG@10"), ("t_recall", "Recall@100")), 1):
        ts = [r[key] for r in rows]
        ax[i].barh(y, [t["delta"] for t in ts], xerr=[t["ci95"] for t in ts], color=[_color(t) for t in ts],
                   capsize=2)
        ax[i].axvline(0.0, color="k", lw=0.8)
        ax[i].set(xlabel=f"difference in {label} vs cosine (95% CI)")
    fig.suptitle(f"{res['name']}: {res['n_queries']} queries, {res['protocol']}; green/red = significantly "
                 "better/worse than cosine (paired t-test, p<0.05); pruning rows vs unpruned cosine", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge_earlier(json_path: Path, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` plus the collections of an earlier ``quality*.json`` that this run did not redo, by name."""
    try:
        before = json.loads(json_path.read_text())["results"] if json_path.is_file() else []
    except (ValueError, KeyError):
        before = []
    for r in before:  # JSON made the pruning fractions strings
        r["prune"] = {float(k): v for k, v in r.get("prune", {}).items()}
    done = {r["name"] for r in results}
    return sorted([r for r in before if r["name"] not in done] + results, key=lambda r: r["name"])


def load_models_script() -> Any:
    """benchmarks/models.py (a script beside this one, not a package module)."""
    import importlib.util

    name = "normrank_bench_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "models.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="folder of BEIR collections")
    ap.add_argument("--collections", nargs="*", help="names inside --data (default: every BEIR folder)")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="where quality.md and the PNGs go")
    ap.add_argument("--tiny", action="store_true", help="a 200-document slice of one collection (smoke test)")
    ap.add_argument("--folds", type=int, default=None, help="force k-fold CV everywhere")
    ap.add_argument("--model", default=None, help="minilm (default, the bundled all-MiniLM-L6-v2), mpnet "
                    "(all-mpnet-base-v2, fetched by benchmarks/models.py) or a model folder; a model other than "
                    "the default writes quality_<label>.md/.json/_<collection>_<label>.png")
    args = ap.parse_args(argv)
    model_path, label, model_name = load_models_script().resolve(args.model)
    suffixed = load_models_script().suffixed
    encoder = RawEncoder(model_path, show_progress=False)
    tmp = None
    if args.data is None or not Path(args.data).is_dir():
        if not args.tiny:
            print("quality.py: no data folder: set NORMRANK_DATA or pass --data", file=sys.stderr)
            return 1
        names: list[str] = []
    else:
        names = args.collections or sorted(p.name for p in Path(args.data).iterdir()
                                           if p.is_dir() and available_splits(p))
    paths = [Path(args.data) / n for n in names]
    if args.tiny:
        tmp = tempfile.TemporaryDirectory(prefix="normrank-quality-")
        if "cranfield" in names:  # short documents: the cheapest slice to encode
            paths = [Path(args.data) / "cranfield"] + paths
        paths = ([write_slice(paths[0], Path(tmp.name) / f"{paths[0].name}-tiny")] if paths
                 else [write_demo_collection(Path(tmp.name) / "demo-known-item")])
    results = []
    for p in paths:
        print(f"[quality] {p.name} ...", file=sys.stderr, flush=True)
        results.append(run_collection(p, encoder, folds=args.folds))
        print(f"[quality] {p.name}: {summary(results[-1])}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": dt.date.today().isoformat(), "machine": machine(),
            "model": f"{model_name} (raw{', bundled' if not label else ''}, {encoder.dim}-d)",
            "tiny": "1" if args.tiny else "", "model_option": label}
    json_path = args.out / suffixed("quality.json", label)
    if not args.tiny:  # keep the collections of earlier runs of this model
        results = merge_earlier(json_path, results)
    (args.out / suffixed("quality.md", label)).write_text(markdown(results, meta), encoding="utf-8")
    for res in results:
        plot(res, args.out / suffixed(f"quality_{res['name']}.png", label))
    json_path.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    print(f"[quality] wrote {args.out / suffixed('quality.md', label)}", file=sys.stderr)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
