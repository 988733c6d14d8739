"""What users would otherwise run: one query against the frameworks' own in-memory stores vs normrank's
(issue 14, item 5).

Store-only timing on synthetic raw 384-d vectors (benchmarks/speed.py's generator), one query at a
time, contenders interleaved in one process (every other repetition in reverse order, caches
emptied before each turn), top-10:

* LangChain ``InMemoryVectorStore.similarity_search_by_vector`` (vectors held as Python lists, as
  ``add_documents`` stores what ``Embeddings.embed_documents`` returns);
* LlamaIndex ``SimpleVectorStore.query`` (its ``embedding_dict`` of lists);
* ``langchain_normrank.NormRankVectorStore.similarity_search_by_vector`` and
  ``llama_index.vector_stores.normrank.NormRankVectorStore.query`` over a ``NormIndex`` (exact blend,
  ``a=0.02``).

End to end adds the real query encode of the bundled MiniLM (``RawEncoder.encode_with_counts`` of
one query, measured interleaved with a stock ``SentenceTransformer.encode``), so a user sees the
whole cost. Where ONNX Runtime is installed (``normrank[onnx]``) it also times
``RawEncoder(backend="onnx")``: torch's vectors (norms within 1e-6, the same rankings in
benchmarks/results/onnx.md), so a store built with torch takes its queries encoded that way.
Writes ``results/anchors.md`` and ``results/anchors.json``.

    python benchmarks/anchors.py                 # 2k, 10k, 100k
    python benchmarks/anchors.py --sizes 2000 --reps 3 --out /tmp/a
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from speed import DIM, WEIGHTS, cpu_model, interleaved, synthetic

QUERIES = ["how does the boundary layer behave at high mach numbers",
           "information retrieval evaluation with relevance judgments",
           "heat transfer in laminar flow over a flat plate",
           "indexing vocabulary for a library catalogue"]


#: The key of the ONNX query encode in ``anchors.json`` (absent where onnxruntime is not installed).
ONNX_ENCODE = "normrank RawEncoder(backend='onnx').encode_with_counts"


def _stats(base: list[float], other: list[float]) -> dict[str, float]:
    r = np.array(base) / np.array(other)
    return {"median": float(np.median(r)), "p25": float(np.percentile(r, 25)), "p75": float(np.percentile(r, 75))}


def build(n: int) -> tuple[dict[str, Any], np.ndarray]:
    from langchain_core.embeddings import FakeEmbeddings
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_normrank import NormRankVectorStore as LCNormRank
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores import SimpleVectorStore, VectorStoreQuery
    from llama_index.vector_stores.normrank import NormRankVectorStore as LINormRank

    from normrank.store import NormIndex

    raw, counts = synthetic(n + 16, seed=1)
    q, raw, counts = raw[n:], raw[:n], counts[:n]
    ids = [f"d{i}" for i in range(n)]
    texts = [f"document {i}" for i in range(n)]
    lc = InMemoryVectorStore(FakeEmbeddings(size=DIM))
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    for i in range(n):  # what add_documents stores: the embedding as a list
        lc.store[ids[i]] = {"id": ids[i], "vector": unit[i].tolist(), "text": texts[i], "metadata": {}}
    li = SimpleVectorStore()
    li.add([TextNode(id_=ids[i], text=texts[i], embedding=unit[i].tolist()) for i in range(n)])
    index = NormIndex(dim=DIM, weights=WEIGHTS)
    index.add_vectors(raw, counts, ids=ids, texts=texts)
    lcn = LCNormRank(index=index)
    lin = LINormRank(index=index)
    qu = q / np.linalg.norm(q, axis=1, keepdims=True)
    ql = [x.tolist() for x in q]
    qul = [x.tolist() for x in qu]
    fns = {
        "langchain InMemoryVectorStore": lambda i: lc.similarity_search_by_vector(qul[i], k=10),
        "llamaindex SimpleVectorStore": lambda i: li.query(VectorStoreQuery(query_embedding=qul[i], similarity_top_k=10)),
        "langchain_normrank NormRankVectorStore": lambda i: lcn.similarity_search_by_vector(ql[i], k=10),
        "llama_index normrank NormRankVectorStore": lambda i: lin.query(VectorStoreQuery(query_embedding=ql[i],
                                                                                         similarity_top_k=10)),
    }
    return fns, q


def bench(n: int, reps: int, nq: int) -> dict[str, Any]:
    fns, _ = build(n)
    # speed.py's interleaved(): every other repetition in reverse order, and the caches emptied before
    # each turn. In a fixed order each normrank store always ran right after a stock store's NumPy scan
    # of the whole corpus (at 100k the LangChain one measured 3x slower than the LlamaIndex one over
    # the same index).
    turns = {k: (lambda f=f: [f(i) for i in range(nq)]) for k, f in fns.items()}
    times = {k: [t / nq for t in v] for k, v in interleaved(turns, reps).items()}  # seconds per query
    return {"n": n, "queries_per_rep": nq, "reps": reps, "times_s": times,
            "median_ms": {k: float(np.median(v)) * 1e3 for k, v in times.items()}}


def bench_encode(reps: int) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from normrank.encoders import RawEncoder, default_model_path

    stock = SentenceTransformer(str(default_model_path()), device="cpu", local_files_only=True)
    raw = RawEncoder(show_progress=False)
    fns = {"stock SentenceTransformer.encode": lambda q: stock.encode([q], show_progress_bar=False),
           "normrank RawEncoder.encode_with_counts": lambda q: raw.encode_with_counts([q])}
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("[anchors] onnxruntime not installed: no ONNX query encode", file=sys.stderr)
    else:
        onnx = RawEncoder(backend="onnx", show_progress=False)
        fns[ONNX_ENCODE] = lambda q: onnx.encode_with_counts([q])
    for f in fns.values():
        f(QUERIES[0])
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f(QUERIES[r % len(QUERIES)])
            times[k].append(time.perf_counter() - t)
    return {"times_s": times, "median_ms": {k: float(np.median(v)) * 1e3 for k, v in times.items()}}


def _load_words(load: float) -> str:
    """The benchmark itself keeps about one core busy, so a load average near 1 means nothing else ran."""
    return "nothing else running beside it" if load < 1.5 else "shared with other jobs"


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    enc = res["encode"]["median_ms"]
    stock_enc, nr_enc = enc["stock SentenceTransformer.encode"], enc["normrank RawEncoder.encode_with_counts"]
    L = ["# Framework anchors: one query against the stores users would otherwise run", "",
         f"Measured {m['date']} on {m['machine']} (2 shared cores; load average {m['load']:.1f} at the end of the run, "
         f"{_load_words(m['load'])}; read the ratios, measured interleaved in one process). "
         "Command: `python benchmarks/anchors.py`.",
         f"langchain-core {m['langchain_core']}, llama-index-core {m['llama_index_core']}, FAISS {m['faiss']}. "
         "Synthetic 384-d raw vectors; stock stores hold the unit vectors as lists (what their add paths store), "
         "normrank stores a `NormIndex` (flat, exact blend a=0.02); top-10, one query per call.", "",
         "## Store only (ms per query, median; ratio = their time / normrank's, median (p25-p75))", "",
         "| docs | LangChain InMemoryVectorStore | LlamaIndex SimpleVectorStore | langchain_normrank store | "
         "llama_index normrank store | LangChain stock / normrank | LlamaIndex stock / normrank |",
         "|---|---|---|---|---|---|---|"]
    for r in res["sizes"]:
        t, md = r["times_s"], r["median_ms"]
        a = _stats(t["langchain InMemoryVectorStore"], t["langchain_normrank NormRankVectorStore"])
        b = _stats(t["llamaindex SimpleVectorStore"], t["llama_index normrank NormRankVectorStore"])
        L.append(f"| {r['n']:,} | {md['langchain InMemoryVectorStore']:.2f} | {md['llamaindex SimpleVectorStore']:.2f} | "
                 f"{md['langchain_normrank NormRankVectorStore']:.3f} | {md['llama_index normrank NormRankVectorStore']:.3f} | "
                 f"{a['median']:.1f}x ({a['p25']:.1f}-{a['p75']:.1f}) | {b['median']:.1f}x ({b['p25']:.1f}-{b['p75']:.1f}) |")
    L += ["", "## End to end (query encode + store), ms per query", "",
          f"One query encode (CPU, median of {len(res['encode']['times_s']['stock SentenceTransformer.encode'])} "
          f"interleaved): stock `SentenceTransformer.encode` {stock_enc:.1f} ms, normrank "
          f"`RawEncoder.encode_with_counts` {nr_enc:.1f} ms. End to end = encode + store (medians added).", "",
          "| docs | LangChain stock | langchain_normrank | ratio | LlamaIndex stock | llama_index normrank | ratio |",
          "|---|---|---|---|---|---|---|"]
    for r in res["sizes"]:
        a, b, c, d = _end_to_end(r["median_ms"], stock_enc, nr_enc)
        L.append(f"| {r['n']:,} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {c:.1f} | {d:.1f} | {c / d:.2f}x |")
    big = res["sizes"][-1]
    store = big["median_ms"]["langchain_normrank NormRankVectorStore"]
    if ONNX_ENCODE in enc:
        L += _onnx_rows(res, enc[ONNX_ENCODE], stock_enc)
    L += ["", "The stock stores score every vector in Python/NumPy per query (LangChain rebuilds the matrix from "
          "its lists on every call); normrank's stores run one FAISS scan over the augmented vectors. The query "
          f"encode is {nr_enc / (nr_enc + store):.0%} of the LangChain normrank store's end-to-end time at "
          f"{big['n']:,} documents."]
    return "\n".join(L) + "\n"


def _onnx_rows(res: dict[str, Any], onnx_enc: float, stock_enc: float) -> list[str]:
    """End to end with the query encoded on ONNX Runtime: torch's vectors (same hits), less time per call."""
    L = ["", (f"With `RawEncoder(backend=\"onnx\")` for the query ({onnx_enc:.1f} ms per encode, measured in the "
              "same interleaved loop; torch's vectors, norms within 1e-6 and the same rankings in `onnx.md`, so a "
              "store built with torch takes these queries):"), "",
         ("| docs | langchain_normrank, ONNX query | ratio vs LangChain stock | llama_index normrank, ONNX query "
          "| ratio vs LlamaIndex stock |"), "|---|---|---|---|---|"]
    for r in res["sizes"]:
        a, b, c, d = _end_to_end(r["median_ms"], stock_enc, onnx_enc)
        L.append(f"| {r['n']:,} | {b:.1f} | {a / b:.2f}x | {d:.1f} | {c / d:.2f}x |")
    return L


def _end_to_end(md: dict[str, float], stock_enc: float, nr_enc: float) -> tuple[float, float, float, float]:
    """ms per query, encode + store: LangChain stock, langchain_normrank, LlamaIndex stock, llama_index normrank."""
    return (stock_enc + md["langchain InMemoryVectorStore"], nr_enc + md["langchain_normrank NormRankVectorStore"],
            stock_enc + md["llamaindex SimpleVectorStore"], nr_enc + md["llama_index normrank NormRankVectorStore"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[2_000, 10_000, 100_000])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--encode-reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    import faiss
    import langchain_core
    import llama_index.core

    faiss.omp_set_num_threads(1)
    res: dict[str, Any] = {"sizes": []}
    for n in args.sizes:
        print(f"[anchors] {n:,} ...", file=sys.stderr, flush=True)
        res["sizes"].append(bench(n, args.reps if n <= 10_000 else max(3, args.reps // 2), 8 if n <= 10_000 else 4))
    print("[anchors] encode ...", file=sys.stderr, flush=True)
    res["encode"] = bench_encode(args.encode_reps)
    res["meta"] = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": cpu_model(),
                   "load": os.getloadavg()[0], "langchain_core": langchain_core.__version__,
                   "llama_index_core": llama_index.core.__version__, "faiss": faiss.__version__,
                   "faiss_threads": 1}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "anchors.json").write_text(json.dumps(res, indent=1))
    (args.out / "anchors.md").write_text(markdown(res), encoding="utf-8")
    print(f"[anchors] wrote {args.out / 'anchors.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
