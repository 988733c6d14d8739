"""Speed and memory benchmark: what does the norm term cost over a plain FAISS index?

All comparisons are ratios measured in the same process, interleaved repetition by
repetition (the machine is shared, so absolute numbers drift; ratios much less):

1. normrank exact blended top-10 (``NormIndex`` flat, additive blend ``a=0.02``, raw query
   vectors in, ``Hit`` objects out) vs FAISS ``IndexFlatIP`` top-10 over the same unit
   vectors (pre-normalised queries in, arrays out), at several sizes of synthetic 384-d
   vectors, single queries and batches of 64; with ``pad_to`` 8 (the default, chosen by this measurement) and 1;
   beside them a second, identical FAISS index (the "twin"), whose ratio to the first is what the
   measurement itself cannot resolve;
2. ``index_type="hnsw"``: recall@10 against the exact blended top-10, and throughput;
3. ``RawEncoder`` throughput vs stock ``SentenceTransformer.encode`` (same texts, same
   batch size);
4. bytes per document of a saved ``NormIndex`` vs ``faiss.write_index`` of the plain index.

Targets (issue 4): blended flat >= 0.95x FAISS flat; encoder >= 0.95x stock; <= 8 extra
bytes per document. Writes ``results/speed.md`` (and ``speed.png``).

    python benchmarks/speed.py                      # 10k, 100k, 1M (about 20-30 minutes, ~10 GB RAM)
    python benchmarks/speed.py --tiny --out /tmp/s  # seconds
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import faiss  # noqa: E402

from normrank import fastpath, huge_pages  # noqa: E402
from normrank.scoring import Weights  # noqa: E402
from normrank.store import PAD_TO_BY_INDEX_TYPE, NormIndex, flat_vectors_span  # noqa: E402

HERE = Path(__file__).resolve().parent
DIM = 384
WEIGHTS = Weights(a=0.02)  # any non-zero blend: the cost does not depend on the value


# ------------------------------------------------------------------ data
def synthetic(n: int, seed: int = 0, n_clusters: int = 256, rank: int = 48,
              chunk: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
    """Raw vectors shaped like sentence embeddings: topic centres plus low-rank variation plus a little
    noise (neighbours at cosine ~0.4-0.5, as with MiniLM), log-normal norms shrinking with length."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_clusters, DIM)).astype(np.float32)
    basis = (rng.standard_normal((rank, DIM)) / np.sqrt(rank)).astype(np.float32)
    out = np.empty((n, DIM), dtype=np.float32)
    counts = rng.integers(8, 257, size=n).astype(np.int64)
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        x = centers[rng.integers(0, n_clusters, size=m)]
        x += 3.0 * (rng.standard_normal((m, rank)).astype(np.float32) @ basis)
        x += 0.2 * rng.standard_normal((m, DIM)).astype(np.float32)
        norm = np.exp(rng.normal(0.0, 0.12, size=m) - 0.25 * np.log(counts[s:s + m])) * 6.0
        x *= (norm / np.linalg.norm(x, axis=1)).astype(np.float32)[:, None]
        out[s:s + m] = x
    return out, counts


def real_vectors(encoder: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]] | None:
    """Documents and queries of the BEIR collections whose encodings are already cached (never encodes)."""
    from normrank.cache import cache_dir, cache_key
    from normrank.datasets import available_splits, default_data_dir, load_beir

    d = default_data_dir()
    if d is None or not d.is_dir():
        return None
    dv, dc, qv, qc, names = [], [], [], [], []
    for p in sorted(d.iterdir()):
        splits = available_splits(p) if p.is_dir() else []
        if not splits:
            continue
        ds = load_beir(p, "test" if "test" in splits else splits[0])
        _, texts, _ = ds.doc_items()
        qtexts = [t for t in ds.queries.values() if t.strip()]
        paths = [cache_dir() / f"{cache_key(encoder, t)}.npz" for t in (texts, qtexts)]
        if not all(x.is_file() for x in paths):
            continue
        with np.load(paths[0]) as a, np.load(paths[1]) as b:
            dv.append(a["vectors"])
            dc.append(a["token_counts"])
            qv.append(b["vectors"][:200])
            qc.append(b["token_counts"][:200])
        names.append(p.name)
    if not dv:
        return None
    return np.concatenate(dv), np.concatenate(dc), np.concatenate(qv), np.concatenate(qc), names


def bench_hnsw_real(reps: int) -> dict[str, Any] | None:
    from normrank.encoders import RawEncoder

    got = real_vectors(RawEncoder(show_progress=False))
    if got is None:
        return None
    dv, dc, qv, qc, names = got
    exact = NormIndex(dim=DIM, weights=WEIGHTS)
    ids = [str(i) for i in range(len(dv))]
    exact.add_vectors(dv, dc, ids=ids)
    exact.calibrate_queries(norms=np.linalg.norm(qv.astype(np.float64), axis=1), token_counts=qc)
    out = bench_hnsw(dv, dc, ids, qv[:64], [int(c) for c in qc[:64]], exact, reps, 32)
    out["collections"] = names
    out["n"] = len(dv)
    return out


def rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _load_average(when: str) -> list[Any]:
    """The 1-minute load average at a point of the run: how much else shared the 2 cores (this
    benchmark itself keeps one or two of them busy)."""
    try:
        return [when, round(os.getloadavg()[0], 2)]
    except OSError:
        return [when, None]


def ratio_spread(num: Any, den: Any) -> list[float]:
    """Median, 25th and 75th percentile of the per-repetition ratios ``num[i] / den[i]``."""
    r = np.asarray(num, dtype=np.float64) / np.asarray(den, dtype=np.float64)
    return [float(np.median(r)), float(np.percentile(r, 25)), float(np.percentile(r, 75))]


def augmented_queries(index: NormIndex, unit: np.ndarray) -> np.ndarray:
    """The rows ``NormIndex`` searches for these unit queries under ``WEIGHTS`` (a fixed additive weight)."""
    return index._augment(unit, np.full(len(unit), WEIGHTS.a), query=True)


def cpu_model() -> str:
    """The CPU's model name as Linux reports it (``platform.processor()`` where there is no /proc/cpuinfo)."""
    import platform

    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _last_level_cache_bytes() -> int:
    """The CPU's largest cache as Linux reports it (32 MiB L3 on the benchmark machine); 32 MiB if unknown."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip()
            sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError, KeyError):
            continue
    return max(sizes, default=32 << 20)


_EVICT: np.ndarray | None = None


def evict_caches() -> None:
    """Write a buffer of twice the last-level cache, so that what the previous contender left in the
    caches is gone before the next one starts."""
    global _EVICT
    if _EVICT is None:
        _EVICT = np.zeros(2 * _last_level_cache_bytes() // 8, dtype=np.float64)
    _EVICT += 1.0


def interleaved(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[float]]:
    """Run each function once per repetition, in turn, so load changes hit all of them alike; every
    other repetition in reverse order; and empty the caches before each turn (:func:`evict_caches`).

    Why both: a contender that runs right after another one inherits cold caches (the same 20k HNSW
    index measured 0.75 of FAISS's when it always ran right after FAISS's, 0.90 in another process
    where it ran last). Alternating the order alone was not enough: of three contenders, the first and
    the last followed themselves on every other repetition and the middle one never did, and at 10k
    documents (15 MB of vectors, inside the 32 MiB L3) a contender that follows itself starts with its
    vectors still cached."""
    for fn in fns.values():  # warm-up
        fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns.items())
    for r in range(reps):
        for k, fn in (order if r % 2 == 0 else order[::-1]):
            evict_caches()
            out[k].append(timed(fn))
    return out


# ------------------------------------------------------------------ 1 + 2: search
def bench_size(n: int, reps: int, n_single: int, pads: tuple[int, ...], hnsw: bool, omp_threads: tuple[int, ...],
               seed: int = 0) -> dict[str, Any]:
    raw, counts = synthetic(n + 64, seed)
    qraw, raw, counts = raw[n:].copy(), raw[:n], counts[:n]  # queries: same distribution, not indexed
    qunit = qraw / np.linalg.norm(qraw, axis=1, keepdims=True)
    qcounts = [12] * 64
    r0 = rss_mb()
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(DIM)
    flat.add(unit)
    # normrank asks for huge pages for its stored vectors (normrank.huge_pages); whether FAISS's own
    # vector gets them depends on the process's allocation history (here it usually does: NumPy's
    # freed arrays leave their huge-page advice behind). Give it the same pages, so that this section
    # compares kernels and normrank's work, not page sizes; section 5 compares what a loaded index gets.
    huge_pages.advise(*flat_vectors_span(flat))
    mem = {"faiss_flat_mb": rss_mb() - r0}
    # The same FAISS index again, at another address: two identical indexes differed by up to 10-25% at
    # 10k documents in side measurements (where their pages fall in the caches), so the twin's ratio to
    # the first shows how far any ratio of a cell can be trusted.
    twin = faiss.IndexFlatIP(DIM)
    twin.add(unit)
    huge_pages.advise(*flat_vectors_span(twin))
    del unit
    gc.collect()
    ids = [str(i) for i in range(n)]
    indexes: dict[int, NormIndex] = {}
    build: dict[str, float] = {}
    for pad in pads:
        r0 = rss_mb()
        t = time.perf_counter()
        idx = NormIndex(dim=DIM, weights=WEIGHTS, pad_to=pad)
        idx.add_vectors(raw, counts, ids=ids)
        build[f"normrank_pad{pad}_s"] = time.perf_counter() - t
        gc.collect()
        mem[f"normrank_pad{pad}_mb"] = rss_mb() - r0
        indexes[pad] = idx
    huge_pages.wait()  # normrank's stores on huge pages too before anything is timed
    singles = qraw[:n_single]
    res: dict[str, Any] = {"n": n, "memory_rss_mb": mem, "build_s": build, "modes": {}}
    res["steps"] = single_steps(flat, indexes[pads[0]], qunit, singles, reps)
    res["huge_page_share"] = {"faiss": huge_pages.huge_share(*flat_vectors_span(flat)), **{
        f"normrank_pad{pad}": huge_pages.huge_share(*flat_vectors_span(faiss.downcast_index(idx._index.index)))
        for pad, idx in indexes.items()}}
    default_threads = faiss.omp_get_max_threads()
    cells = [(lab, thr, omp) for omp in omp_threads for lab, thr in
             (("batch64", None), ("batch64 blas", 32), ("single", None))]
    for label, threshold, omp in cells:
        old = faiss.cvar.distance_compute_blas_threshold
        if threshold is not None:
            faiss.cvar.distance_compute_blas_threshold = threshold
        faiss.omp_set_num_threads(omp)
        limits = _blas_limits(omp)
        try:
            if label == "single":
                fns = {"faiss": lambda: [flat.search(qunit[i:i + 1], 10) for i in range(n_single)],
                       "faiss_twin": lambda: [twin.search(qunit[i:i + 1], 10) for i in range(n_single)]}
                for pad, idx in indexes.items():
                    fns[f"normrank_pad{pad}"] = (lambda idx=idx: [idx.search(singles[i], 10, query_token_count=12)
                                                                  for i in range(n_single)])
                # one query as FAISS takes it (a one-row matrix) and gives it back (arrays)
                fns["normrank_arrays"] = (lambda idx=indexes[pads[0]]: [idx.search_arrays(
                    singles[i:i + 1], 10, query_token_counts=[12]) for i in range(n_single)])
                nq = n_single
            else:
                fns = {"faiss": lambda: flat.search(qunit, 10), "faiss_twin": lambda: twin.search(qunit, 10)}
                for pad, idx in indexes.items():
                    fns[f"normrank_pad{pad}"] = (lambda idx=idx: idx.search_batch(qraw, 10,
                                                                                  query_token_counts=qcounts))
                fns["normrank_arrays"] = (lambda idx=indexes[pads[0]]: idx.search_arrays(
                    qraw, 10, query_token_counts=qcounts))
                nq = 64
            times = interleaved(fns, reps)
        finally:
            faiss.cvar.distance_compute_blas_threshold = old
            if limits is not None:  # first: it puts back the OpenMP count it found, which was ours
                limits.unregister()
            faiss.omp_set_num_threads(default_threads)
        med = {k: float(np.median(v)) for k, v in times.items()}
        res["modes"][f"{label}, {omp} thr"] = {
            "queries_per_call": nq,
            "omp_threads": omp,
            "qps": {k: nq / v for k, v in med.items()},
            # the median of the per-repetition ratios (each pair ran side by side), so the p25-p75 range
            # beside it is its own spread (a ratio of medians could fall outside it: 0.95 (1.02-1.15))
            "ratio_vs_faiss": {k: ratio_spread(times["faiss"], v)[0] for k, v in times.items() if k != "faiss"},
            "ratio_range": {k: ratio_spread(times["faiss"], v)[1:] for k, v in times.items() if k != "faiss"},
            "blas_threshold": threshold if threshold is not None else old,
        }
    # correctness while we are here: the blended top-10 equals brute force
    idx = indexes[pads[0]]
    norms = np.sqrt(np.einsum("ij,ij->i", raw, raw, dtype=np.float64))
    g = WEIGHTS.shape(idx.calibrator.transform(norms, counts))
    brute_hits = 0
    for i in range(8):
        s = (raw @ qunit[i]) / norms + WEIGHTS.a * g
        want = set(np.argsort(-s, kind="stable")[:10].tolist())
        got = {int(h.id) for h in idx.search(qraw[i], 10, query_token_count=12)}
        brute_hits += len(want & got)
    res["exact_overlap_at_10"] = brute_hits / 80
    if hnsw:
        res["hnsw"] = bench_hnsw(raw, counts, ids, qraw, qcounts, indexes[pads[0]], reps, n_single)
    del flat, twin, indexes
    gc.collect()
    return res


def _blas_limits(threads: int) -> Any:
    """Limit every BLAS and OpenMP pool (FAISS's and NumPy's OpenBLAS) to ``threads`` for a cell."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn / scipy stacks
        return None
    return threadpool_limits(limits=threads)


def single_steps(flat: Any, idx: NormIndex, qunit: np.ndarray, qraw: np.ndarray, reps: int) -> dict[str, Any]:
    """Where one query's time goes (1 thread): the bare FAISS scan at 384 columns, the same scan at
    normrank's width, building the hits, and the whole ``NormIndex.search`` call; interleaved."""
    default_threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    limits = _blas_limits(1)
    try:
        inner, _ = idx._flat_parts()
        qa = augmented_queries(idx, qunit[: len(qraw)])
        found = [inner.search(qa[i:i + 1], 10) for i in range(len(qraw))]
        m = len(qraw)
        fns = {
            "faiss_384_scan": lambda: [flat.search(qunit[i:i + 1], 10) for i in range(m)],
            "normrank_scan": lambda: [inner.search(qa[i:i + 1], 10) for i in range(m)],
            # what the single path does after the scan: hits from FAISS's result rows and the columns
            # (in C where normrank._fastpath was built)
            "normrank_hits": lambda: [fastpath.hit_rows(found[i][1], found[i][0], 10, WEIGHTS.a, None,
                                                        idx._docs.hit_columns(), 1) for i in range(m)],
            "normrank_search": lambda: [idx.search(qraw[i], 10) for i in range(m)],
        }
        times = interleaved(fns, max(reps, 5))
    finally:
        if limits is not None:  # first: it puts back the OpenMP count it found, which was ours
            limits.unregister()
        faiss.omp_set_num_threads(default_threads)
    us = {k: float(np.median(v)) / m * 1e6 for k, v in times.items()}
    us["normrank_query_prep_and_rest"] = us["normrank_search"] - us["normrank_scan"] - us["normrank_hits"]
    return {"width": int(inner.d), "us_per_query": us,
            "ratio_search_vs_faiss": ratio_spread(times["faiss_384_scan"], times["normrank_search"])}


def bench_hnsw(raw: np.ndarray, counts: np.ndarray, ids: list[str], qraw: np.ndarray, qcounts: list[int],
               exact: NormIndex, reps: int, n_single: int) -> dict[str, Any]:
    default_threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # stable on a shared machine; flat and HNSW alike
    try:
        return _bench_hnsw(raw, counts, ids, qraw, qcounts, exact, reps, n_single)
    finally:
        faiss.omp_set_num_threads(default_threads)


def _bench_hnsw(raw: np.ndarray, counts: np.ndarray, ids: list[str], qraw: np.ndarray, qcounts: list[int],
                exact: NormIndex, reps: int, n_single: int) -> dict[str, Any]:
    """normrank HNSW against the exact blend (recall) and against FAISS's own HNSW over the unit vectors
    with the same M / efConstruction / efSearch, plain cosine (throughput, interleaved)."""
    t = time.perf_counter()
    h = NormIndex(dim=DIM, weights=WEIGHTS, index_type="hnsw")
    h.add_vectors(raw, counts, ids=ids)
    build = time.perf_counter() - t
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    qunit = qraw / np.linalg.norm(qraw, axis=1, keepdims=True)
    t = time.perf_counter()
    fh = faiss.IndexHNSWFlat(DIM, h.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    fh.hnsw.efConstruction = h.ef_construction
    fh.add(unit)
    fh.hnsw.efSearch = h.ef_search
    faiss_build = time.perf_counter() - t
    del unit
    truth = exact.search_batch(list(qraw), 10, query_token_counts=qcounts)
    got = h.search_batch(list(qraw), 10, query_token_counts=qcounts)
    recall = float(np.mean([len({x.id for x in a} & {x.id for x in b}) / 10 for a, b in zip(truth, got)]))
    # FAISS HNSW's own recall against exact cosine, for scale
    cos_truth = exact.cosine_candidates(list(qraw), 10).doc_ids
    stats = faiss.cvar.hnsw_stats  # distance computations per query: how long each walk is
    stats.reset()
    _, fi = fh.search(qunit, 10)
    faiss_ndis = stats.ndis / len(qunit)
    stats.reset()
    h.search_batch(list(qraw), 10, query_token_counts=qcounts)
    normrank_ndis = stats.ndis / len(qraw)
    faiss_recall = float(np.mean([len({ids[j] for j in row} & set(t)) / 10 for row, t in zip(fi.tolist(), cos_truth)]))
    # the graph search alone, as FAISS's wrapper runs it on normrank's own graph with queries augmented
    # beforehand: separates the walk from normrank's per-call work (raw query in, Hit objects out)
    inner = faiss.downcast_index(h._index.index)
    qaug = augmented_queries(h, qunit)
    out: dict[str, Any] = {"build_s": build, "faiss_build_s": faiss_build, "recall_at_10": recall,
                           "width": int(inner.d),
                           "faiss_recall_at_10_cosine": faiss_recall, "M": h.hnsw_m,
                           "distances_per_query": {"normrank": normrank_ndis, "faiss": faiss_ndis},
                           "ef_construction": h.ef_construction, "ef_search": h.ef_search}
    for label in ("batch64", "single"):
        if label == "single":
            fns = {"flat": lambda: [exact.search(qraw[i], 10, query_token_count=12) for i in range(n_single)],
                   "faiss_hnsw": lambda: [fh.search(qunit[i:i + 1], 10) for i in range(n_single)],
                   "hnsw": lambda: [h.search(qraw[i], 10, query_token_count=12) for i in range(n_single)],
                   "hnsw_walk": lambda: [inner.search(qaug[i:i + 1], 10) for i in range(n_single)]}
            nq = n_single
        else:
            fns = {"flat": lambda: exact.search_batch(list(qraw), 10, query_token_counts=qcounts),
                   "faiss_hnsw": lambda: fh.search(qunit, 10),
                   "hnsw": lambda: h.search_batch(list(qraw), 10, query_token_counts=qcounts)}
            nq = 64
        times = interleaved(fns, max(reps, 5))
        med = {k: float(np.median(v)) for k, v in times.items()}
        if "hnsw_walk" in times:
            out["walk_ratio_vs_faiss_hnsw"] = ratio_spread(times["faiss_hnsw"], times["hnsw_walk"])
        out[label] = {"qps": {k: nq / v for k, v in med.items()}, "speedup_vs_flat": med["flat"] / med["hnsw"],
                      "ratio_vs_faiss_hnsw": ratio_spread(times["faiss_hnsw"], times["hnsw"])}
    del fh
    return out


# ------------------------------------------------------------------ 3: encoder
def bench_encoder(texts: list[str], reps: int, batch_size: int = 64) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from normrank.encoders import RawEncoder, default_model_path

    stock = SentenceTransformer(str(default_model_path()), device="cpu", local_files_only=True)
    raw = RawEncoder(batch_size=batch_size, show_progress=False)
    _ = raw.model
    fns = {
        "stock": lambda: stock.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True),
        "raw_encode": lambda: raw.encode(texts),
        "raw_encode_with_counts": lambda: raw.encode_with_counts(texts),
    }
    times = interleaved(fns, reps)
    med = {k: float(np.median(v)) for k, v in times.items()}
    a = stock.encode(texts[:8], batch_size=batch_size, show_progress_bar=False)
    b = raw.encode(texts[:8])
    cos = float(np.min(np.sum(a * (b / np.linalg.norm(b, axis=1, keepdims=True)), axis=1)))
    import torch

    return {"n_texts": len(texts), "batch_size": batch_size, "torch_threads": torch.get_num_threads(),
            "texts_per_s": {k: len(texts) / v for k, v in med.items()},
            "ratio_vs_stock": {k: med["stock"] / v for k, v in med.items() if k != "stock"},
            "ratio_range": {k: [float(min(np.array(times["stock"]) / np.array(v))),
                                float(max(np.array(times["stock"]) / np.array(v)))]
                            for k, v in times.items() if k != "stock"},
            "min_cosine_raw_vs_stock_direction": cos}


def encoder_texts(n: int) -> list[str]:
    from normrank.datasets import default_data_dir, load_beir

    d = default_data_dir()
    if d is not None and (d / "cranfield").is_dir():
        ds = load_beir(d / "cranfield")
        ids, texts, _ = ds.doc_items()
        return texts[:n]
    from normrank.datasets import demo_rows

    rows = demo_rows()
    texts = [f"{r['title']}\n{r['text']}" for r in rows]
    return (texts * (n // len(texts) + 1))[:n]


# ------------------------------------------------------------------ 4: bytes
def bench_bytes(n: int, pads: tuple[int, ...], seed: int = 0) -> dict[str, Any]:
    raw, counts = synthetic(n, seed)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    out: dict[str, Any] = {"n": n}
    with tempfile.TemporaryDirectory(prefix="normrank-bytes-") as tmp:
        flat = faiss.IndexFlatIP(DIM)
        flat.add(unit)
        faiss.write_index(flat, str(Path(tmp) / "plain.faiss"))
        plain = (Path(tmp) / "plain.faiss").stat().st_size
        out["faiss_plain_bytes_per_doc"] = plain / n
        for pad in pads:
            idx = NormIndex(dim=DIM, weights=WEIGHTS, pad_to=pad)
            idx.add_vectors(raw, counts, ids=[str(i) for i in range(n)])
            folder = idx.save(Path(tmp) / f"nr{pad}")
            files = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
            total = sum(files.values())
            numeric = sum(v for k, v in files.items() if k.endswith(".npy"))
            out[f"pad{pad}"] = {
                "files_bytes_per_doc": {k: v / n for k, v in sorted(files.items())},
                "folder_bytes_per_doc": total / n,
                "faiss_file_extra_per_doc": (files["index.faiss"] - plain) / n,
                "numeric_sidecar_per_doc": numeric / n,  # norms, token counts, string lengths
                "numeric_extra_per_doc": (files["index.faiss"] - plain + numeric) / n,
                "string_columns_per_doc": sum(v for k, v in files.items()
                                              if k in ("ids.utf8", "texts.utf8", "metadata.json")) / n,
                "augmented_dim": idx.augmented_dim,
            }
            del idx
            gc.collect()
    return out


#: Run in a fresh interpreter per measurement, so one load's freed memory cannot hide the next one's.
_LOAD_PROBE = r"""
import gc, json, sys, time
import faiss
from normrank.store import NormIndex

def rss():
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) / 1024 for ln in fh if ln.startswith("VmRSS:"))

kind, path, docstore = sys.argv[1:4]
gc.collect()
r0 = rss()
t = time.perf_counter()
if kind == "faiss":
    x = faiss.read_index(path)
    t_index = time.perf_counter() - t
    if docstore != "-":
        with open(docstore, encoding="utf-8") as fh:
            d = json.load(fh)
else:
    x = NormIndex.load(path)
    t_index = time.perf_counter() - t
total = time.perf_counter() - t
gc.collect()
out = {"s": total, "index_s": t_index, "rss_mb": rss() - r0}
# single queries right after the load, as a service would answer them (1 thread): FAISS's bare flat
# kernel inside the IDMap2 against NormIndex.search; and how much of each store sits on 2 MiB pages
import numpy as np
from normrank import huge_pages
from normrank.store import flat_vectors_span
t = time.perf_counter()
huge_pages.wait()  # normrank's background advice (nothing pending for FAISS): its time, measured apart
out["huge_wait_s"] = time.perf_counter() - t
faiss.omp_set_num_threads(1)
flat = faiss.downcast_index(x.index if kind == "faiss" else x._index.index)
span = flat_vectors_span(flat)
out["huge_share"] = huge_pages.huge_share(*span)
q = np.random.default_rng(99).standard_normal((16, flat.d if kind == "faiss" else x._dim)).astype(np.float32)
unit = q / np.linalg.norm(q, axis=1, keepdims=True)
one = (lambda i: flat.search(unit[i:i + 1], 10)) if kind == "faiss" else (lambda i: x.search(q[i], 10, query_token_count=12))
one(0)

def per_query():
    times = []
    for _ in range(3):
        t = time.process_time()
        for i in range(16):
            one(i)
        times.append((time.process_time() - t) / 16)
    return sorted(times)[1]

out["search_s"] = per_query()
if kind == "faiss":  # the same kernel on the same bytes, now moved to 2 MiB pages: what the pages alone buy
    huge_pages.advise(*span)
    out["huge_share_after_advice"] = huge_pages.huge_share(*span)
    out["search_s_huge"] = per_query()
if kind != "faiss":  # the id -> internal id table is built on the first id lookup: its cost, measured apart
    t = time.perf_counter()
    "doc-0000000" in x
    out["id_table_s"] = time.perf_counter() - t
    gc.collect()
    out["rss_with_id_table_mb"] = rss() - r0
print(json.dumps(out))
"""


def rag_texts(n: int, chars: int = 600, seed: int = 0) -> list[str]:
    """Chunk-sized English-like texts (a few hundred characters, as RAG chunks are)."""
    words = ("retrieval norm vector cosine document query model index score length token embedding corpus "
             "search rank blend weight feature calibration specific frequent rare answer passage chunk").split()
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(words), size=(n, chars // 7))
    return [" ".join(words[j] for j in row)[:chars] for row in picks.tolist()]


def bench_load(n: int, reps: int, with_texts: bool, seed: int = 0) -> dict[str, Any]:
    """Loaded RSS and load time of a saved ``NormIndex`` vs what a user would otherwise load: FAISS's
    ``IndexIDMap2(IndexFlatIP(384))`` (``read_index``), plus, when the index holds texts and metadata,
    the same texts and metadata as a JSON docstore. Each load in a fresh interpreter, interleaved."""
    import subprocess

    raw, counts = synthetic(n, seed)
    ids = [f"doc-{i:07d}" for i in range(n)]
    texts = rag_texts(n) if with_texts else None
    metas = ([{"source": f"docs/file-{i // 20:05d}.md", "chunk": i % 20, "start": 550 * (i % 20),
               "end": 550 * (i % 20) + 600} for i in range(n)] if with_texts else None)
    out: dict[str, Any] = {"n": n, "texts": with_texts}
    with tempfile.TemporaryDirectory(prefix="normrank-load-") as tmp:
        idx = NormIndex(dim=DIM, weights=WEIGHTS)
        idx.add_vectors(raw, counts, ids=ids, texts=texts, metadatas=metas)
        idx.save(Path(tmp) / "nr")
        del idx
        unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        del raw
        plain = faiss.IndexIDMap2(faiss.IndexFlatIP(DIM))
        plain.add_with_ids(unit, np.arange(n, dtype=np.int64))
        faiss.write_index(plain, str(Path(tmp) / "plain.faiss"))
        del plain, unit
        docstore = "-"
        if with_texts:
            docstore = str(Path(tmp) / "docstore.json")
            with open(docstore, "w", encoding="utf-8") as fh:
                json.dump({"ids": ids, "texts": texts, "metadatas": metas}, fh)
        del texts, metas
        gc.collect()
        runs: dict[str, list[dict[str, float]]] = {"faiss": [], "normrank": []}
        for _ in range(reps + 1):  # the first round warms the page cache and is dropped
            for kind, path in (("faiss", Path(tmp) / "plain.faiss"), ("normrank", Path(tmp) / "nr")):
                proc = subprocess.run([sys.executable, "-c", _LOAD_PROBE, kind, str(path), docstore],
                                      capture_output=True, text=True, check=True)
                runs[kind].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        for kind in runs:
            runs[kind] = runs[kind][1:]

    def per_run(kind: str, key: str) -> list[float]:
        return [r[key] for r in runs[kind]]

    def med(kind: str, key: str) -> float:
        return float(np.median(per_run(kind, key)))

    out.update({
        "median_s": {"faiss_read_index": med("faiss", "index_s"), "faiss_plus_docstore": med("faiss", "s"),
                     "normrank_load": med("normrank", "s")},
        "load_ratio_vs_read_index": ratio_spread(per_run("normrank", "s"), per_run("faiss", "index_s")),
        "load_ratio_vs_read_index_plus_docstore": ratio_spread(per_run("normrank", "s"), per_run("faiss", "s")),
        "rss_mb": {"faiss_idmap2_plus_docstore": med("faiss", "rss_mb"), "normrank": med("normrank", "rss_mb"),
                   "normrank_with_id_table": med("normrank", "rss_with_id_table_mb")},
        "id_table_s": med("normrank", "id_table_s"),
        "huge_share": {"faiss": med("faiss", "huge_share"), "normrank": med("normrank", "huge_share")},
        "huge_wait_s": med("normrank", "huge_wait_s"),
        "search_s": {"faiss": med("faiss", "search_s"), "normrank": med("normrank", "search_s")},
    })
    out["faiss_pages_speedup"] = ratio_spread(per_run("faiss", "search_s"), per_run("faiss", "search_s_huge"))
    out["faiss_huge_share_after_advice"] = med("faiss", "huge_share_after_advice")
    out["search_ratio"] = ratio_spread(per_run("faiss", "search_s"), per_run("normrank", "search_s"))
    out["rss_ratio"] = out["rss_mb"]["normrank"] / out["rss_mb"]["faiss_idmap2_plus_docstore"]
    return out


# ------------------------------------------------------------------ report
def _row_target(label: str) -> tuple[str, float]:
    """Issue 14's target for a row of section 1: >= 2x FAISS's default kernel for batches, >= 0.95x its
    BLAS kernel, >= 0.95x for single queries on 1 thread and never slower (>= 1.0) on more."""
    if label.startswith("batch64 blas"):
        return ">= 0.95", 0.95
    if label.startswith("batch64"):
        return ">= 2", 2.0
    if label.endswith(", 1 thr"):
        return ">= 0.95", 0.95
    return ">= 1 (never slower)", 1.0


def _page_words(search: list[dict[str, Any]]) -> str:
    shares = [(r["n"], r["huge_page_share"]) for r in search if "huge_page_share" in r]
    if not shares:
        return ""
    return ("Page size, held equal: normrank asks Linux for 2 MiB pages for its stored vectors "
            "(`normrank.huge_pages`), and this section gives FAISS's vectors the same, so that it compares "
            "kernels and normrank's own work; share of the stored vectors on 2 MiB pages, FAISS / normrank: "
            + ", ".join(f"{sh['faiss']:.0%} / {min(v for k, v in sh.items() if k != 'faiss'):.0%} at {n:,}"
                        for n, sh in shares)
            + ". Section 5 measures what each gets as loaded by a fresh process.")


def _after_load(ld: dict[str, Any]) -> str:
    if "search_s" not in ld:  # results from before these columns
        return " |  | "
    s, h = ld["search_s"], ld["huge_share"]
    med, lo, hi = ld["search_ratio"]
    cells = (f"{s['faiss'] * 1e3:.2f} / {s['normrank'] * 1e3:.2f} ({med:.2f}, {lo:.2f}-{hi:.2f}) | "
             f"{h['faiss']:.0%} / {h['normrank']:.0%}")
    if "faiss_pages_speedup" in ld:
        p, plo, phi = ld["faiss_pages_speedup"]
        cells += f" | {p:.2f} ({plo:.2f}-{phi:.2f}) at {ld['faiss_huge_share_after_advice']:.0%} on 2 MiB pages"
    else:
        cells += " | "
    return cells


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _hnsw_row(label: str, h: dict[str, Any]) -> str:
    cells = [label, f"{h['build_s']:.0f} / {h['faiss_build_s']:.0f}",
             f"{h['recall_at_10']:.3f} ({h['faiss_recall_at_10_cosine']:.3f})"
             + (f"; distances per query {h['distances_per_query']['normrank']:.0f} / "
                f"{h['distances_per_query']['faiss']:.0f}" if "distances_per_query" in h else "")]
    for mode in ("batch64", "single"):
        q = h[mode]["qps"]
        med, lo, hi = h[mode]["ratio_vs_faiss_hnsw"]
        cells += [f"{q['flat']:.0f} / {q['hnsw']:.0f} / {q['faiss_hnsw']:.0f}",
                  f"{med:.2f} ({lo:.2f}-{hi:.2f}) {_verdict(med >= 0.9)}"]
    walk = h.get("walk_ratio_vs_faiss_hnsw")
    cells.append(f"{walk[0]:.2f} ({walk[1]:.2f}-{walk[2]:.2f}), {h['width']} columns" if walk else "")
    return "| " + " | ".join(cells) + " |"


def _load_words(meta: dict[str, Any]) -> str:
    loads = [x for x in meta.get("load_averages", []) if x[1] is not None]
    if not loads:
        return "The machine's 2 cores were shared with other jobs."
    top = max(x[1] for x in loads)
    where = ", ".join(f"{w} {v:.1f}" for w, v in loads)
    verdict = ("nothing else ran beside the benchmark, which itself keeps one or two cores busy" if top < 2.5
               else "other jobs shared the cores for part of the run")
    return f"1-minute load averages: {where} ({verdict})."


def _command(meta: dict[str, Any]) -> str:
    """The command that measured ``meta``'s run, its options included (``--out`` aside)."""
    argv = meta.get("argv")
    if argv is None:  # runs recorded before the options were
        argv = (["--tiny"] if meta.get("tiny") else []) + ([] if meta["reps"] == 3 else ["--reps", str(meta["reps"])])
    shown, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--out", "--render"):
            skip = True
            continue
        shown.append(a)
    return " ".join(["python benchmarks/speed.py", *shown])


def markdown(res: dict[str, Any]) -> str:
    meta = res["meta"]
    L = ["# Speed and memory benchmark", "",
         f"Measured {meta['date']} on {meta['machine']}.",
         f"FAISS {meta['faiss']} with {meta['faiss_threads']} OpenMP threads; "
         f"`faiss.cvar.distance_compute_blas_threshold` = {meta['blas_threshold']} (default) unless a row says "
         "otherwise; batches of 64 are below it, so FAISS uses its non-BLAS kernel there.",
         *(["normrank's C hot path (`normrank._fastpath`: the query's unit vector, the `Hit` objects, and a flat "
            "batch's augmented queries, scan and top-k heaps) "
            + ("was built and used." if meta["fastpath"] else "was not built here: its Python fallback ran.")]
           if "fastpath" in meta else []),
         f"Command: `{_command(meta)}`; {meta['reps']} interleaved "
         f"repetitions per search cell (at least 5 for HNSW cells and the per-step table; {meta['encoder_reps']} "
         "for the encoder) after one warm-up, medians"
         + ("; every other repetition runs the contenders in reverse order" if meta.get("load_averages") else "")
         + (f", and a {meta['evict_bytes'] >> 20} MiB buffer (twice the last-level cache) is written before each "
            "contender's turn" if meta.get("evict_bytes") else "")
         + ". " + _load_words(meta) + " Absolute throughput is noisy; the ratios are measured in the same "
         "process, side by side.",
         "",
         "Data: synthetic clustered 384-d raw vectors (256 topics, log-normal norms shrinking with length, token "
         "counts 8..256); queries from the same distribution. normrank: `NormIndex` flat, additive blend "
         "`a=0.02`, raw query vectors in (a batch as one float32 matrix, as FAISS gets it), `Hit` objects out; "
         "FAISS: `IndexFlatIP(384)` over the unit vectors, normalised queries in, arrays out.", "",
         "## 1. Exact blended top-10 vs FAISS IndexFlatIP top-10", "",
         "| docs | queries | FAISS flat q/s | FAISS twin: ratio (what the measurement cannot resolve) | "
         + " | ".join(f"normrank (pad_to={p}) q/s | ratio" for p in meta["pads"])
         + f" | `search_arrays` (pad_to={meta['pads'][0]}) q/s | ratio | target (pad_to={meta['pads'][0]}) |",
         "|---|---|---|---|" + "---|---|" * len(meta["pads"]) + "---|---|---|"]
    for r in res["search"]:
        for label, m in r["modes"].items():
            row = f"| {r['n']:,} | {label} | {m['qps']['faiss']:.1f} |"
            if "faiss_twin" in m["ratio_vs_faiss"]:
                lo, hi = m["ratio_range"]["faiss_twin"]
                row += f" {m['ratio_vs_faiss']['faiss_twin']:.2f} ({lo:.2f}-{hi:.2f}) |"
            else:  # runs from before the twin
                row += " not measured |"
            for pad in meta["pads"]:
                k = f"normrank_pad{pad}"
                lo, hi = m["ratio_range"][k]
                row += f" {m['qps'][k]:.1f} | {m['ratio_vs_faiss'][k]:.2f} ({lo:.2f}-{hi:.2f}) |"
            first = f"normrank_pad{meta['pads'][0]}"
            target, bar = _row_target(label)
            verdict = f"{target}: " + _verdict(m['ratio_vs_faiss'][first] >= bar)
            if "normrank_arrays" in m["qps"]:
                lo, hi = m["ratio_range"]["normrank_arrays"]
                ra = m["ratio_vs_faiss"]["normrank_arrays"]
                row += f" {m['qps']['normrank_arrays']:.1f} | {ra:.2f} ({lo:.2f}-{hi:.2f}) |"
                verdict = f"{target}: hits {_verdict(m['ratio_vs_faiss'][first] >= bar)}; arrays {_verdict(ra >= bar)}"
            else:
                row += " | |"
            row += f" {verdict} |"
            L.append(row)
    L += ["", "Per-step time of one query (1 thread, CPU-bound, interleaved; microseconds per query, median):", "",
          "| docs | FAISS scan, 384 columns | normrank scan (width) | building hits | query prep, lock, rest | "
          "`NormIndex.search` total | ratio FAISS / normrank: median (p25-p75) |", "|---|---|---|---|---|---|---|"]
    for r in res["search"]:
        st = r.get("steps")
        if st:
            u = st["us_per_query"]
            med, lo, hi = st["ratio_search_vs_faiss"]
            L.append(f"| {r['n']:,} | {u['faiss_384_scan']:.0f} | {u['normrank_scan']:.0f} ({st['width']}) | "
                     f"{u['normrank_hits']:.0f} | {u['normrank_query_prep_and_rest']:.0f} | {u['normrank_search']:.0f} "
                     f"| {med:.2f} ({lo:.2f}-{hi:.2f}) |")
    L += ["", ("Ratio = FAISS time / normrank time, per repetition (the two ran side by side), median; p25-p75 "
               "of the same per-repetition ratios in brackets. " if meta.get("ratio") == "paired" else
               "Ratio = FAISS time / normrank time (median; p25-p75 over repetitions in brackets). ") + "`N thr` = FAISS "
          "OpenMP threads for both sides. A single `NormIndex.search` of a raw vector searches the flat index "
          "inside its `IndexIDMap2` directly and maps positions to ids in NumPy (`IndexIDMap2.search` opens an "
          "OpenMP parallel region on every call). With more threads than queries and 10k+ vectors, bare FAISS "
          "1.15 takes its database-parallel path (each thread scores a part of the vectors with an sgemm of the "
          "bundled OpenBLAS, which starts threads of its own there); normrank keeps FAISS's per-query kernel on "
          "one thread per query (`normrank.batch_topk.at_most_threads`). That, not a faster kernel, is why "
          "the `single, 2 thr` rows favour normrank: a FAISS user gets the same by setting one OpenMP thread for "
          "single queries, as the `single, 1 thr` rows show (FAISS's own 1-thread rate against its 2-thread one). "
          "Kernels: `batch64` rows run FAISS with its default `distance_compute_blas_threshold` (128000: no BLAS "
          "for 64 queries), `batch64 blas` rows lower it to 32 so FAISS's bundled OpenBLAS sgemm scores the "
          "batch; normrank scores flat batches of >= `SGEMM_MIN_BATCH` (8) queries with the same bundled "
          "OpenBLAS `cblas_sgemm` (`normrank.faiss_blas`) over blocks of the stored augmented vectors, in blocks "
          "of 1024 stored vectors on 1 thread (FAISS's own block) and 4096 with more threads; "
          + ("the top 10 are kept by normrank's C heaps (`normrank._fastpath.scan_topk`: FAISS's heap order, "
             "losing scores skipped 16 at a time), and a batch of raw vectors is made into augmented queries "
             "and scanned in one C call (`lean_batch`); " if fastpath.lean_batch is not None
             else "the top 10 are kept by FAISS's own heaps (normrank's C module was not built here); ")
          + "single queries use FAISS's per-query kernel. `search_arrays` is the same search returning ids, scores and cosines as arrays "
          "(like FAISS) instead of `Hit` objects; in `single` rows it gets each query as FAISS does, a one-row "
          "matrix, and takes the same single-vector path as `NormIndex.search`. In the per-step table the rest is found by subtraction, so a "
          "negative value means the separately timed scan was slower than the scan inside the search: noise. `N thr` limits FAISS's OpenMP and both OpenBLAS pools (threadpoolctl). "
          "The blended top-10 matched brute force on "
          + ", ".join(f"{r['exact_overlap_at_10']:.0%} at {r['n']:,}" for r in res["search"]) + " of 80 results. "
          + _page_words(res["search"]),
          "", "Resident memory added while building (MB, RSS deltas, rough):", "",
          "| docs | FAISS flat (vectors: n x 1536 B) | " + " | ".join(f"NormIndex pad_to={p}" for p in meta["pads"])
          + " |", "|---|---|" + "---|" * len(meta["pads"])]
    for r in res["search"]:
        m = r["memory_rss_mb"]
        L.append(f"| {r['n']:,} | {r['n'] * DIM * 4 / 2**20:.0f} | " +
                 " | ".join(f"{m[f'normrank_pad{p}_mb']:.0f}" for p in meta["pads"]) + " |")
    small = min(res["search"], key=lambda r: r["n"])
    scan_us = (small.get("steps") or {}).get("us_per_query", {}).get("faiss_384_scan")
    llc_mib = meta.get("evict_bytes", 64 << 20) // 2 >> 20
    scan_words = (f"At {small['n']:,} the vectors ({small['n'] * DIM * 4 / 1e6:.0f} MB) fit in the "
                  f"{llc_mib} MiB last-level cache and a scan took about {scan_us / 1000:.2f} ms here. "
                  if scan_us else f"At {small['n']:,} the vectors fit in the {llc_mib} MiB last-level cache. ")
    L += ["", "How far to trust section 1: on this shared machine one cell's ratio moves by 5-40% between runs "
          "(see the ranges), and the FAISS twin column gives, cell by cell, the ratio between two identical FAISS "
          "indexes at different addresses, timed the same way: a normrank ratio that far from 1 is within what "
          "the measurement resolves. For single queries on 1 thread both sides run the same FAISS kernel (normrank over "
          f"{-(-385 // meta['pads'][0]) * meta['pads'][0]} columns instead of 384, plus Python work per call), so a ratio above 1 there means the difference "
          "is within the noise; batches run different kernels. Read the 1-thread rows: at 100k and 1M documents the scan "
          "is bound by memory, dominates, and the blend costs little. " + scan_words + "The extra columns cost "
          "little there (the per-step table's two scans; on the AMD EPYC machine of runs A-F a side measurement "
          "with equal pages put 384 and 392 columns at 286 µs), but normrank's fixed per-call "
          "Python work (validation, id mapping, building `Hit` objects; the per-step table gives it for one "
          "query) is 10-20% of a query. It is not the benchmark emptying the caches between turns (with 8 calls "
          "per turn instead of one the ratios were the same), but each call's own scan, which leaves the caches "
          "cold for the work after it: `scan_bound.md` measures that work at about three times its cost in warm "
          "caches, and finds no hand-written kernel faster than FAISS's scan. "
          "Before each contender's turn the benchmark writes a buffer twice the size of the last-level cache, "
          "so no contender starts with its own vectors still cached from its previous turn."]
    L += ["", "## 2. HNSW (`index_type=\"hnsw\"`, M=32, efConstruction=200, efSearch=128; 1 FAISS thread)", "",
          "| docs | build s (normrank / FAISS) | recall@10 vs exact blend (FAISS HNSW vs exact cosine) | "
          "batch64 q/s: flat / normrank HNSW / FAISS HNSW | ratio vs FAISS HNSW (target >= 0.9) | "
          "single q/s: flat / normrank HNSW / FAISS HNSW | ratio vs FAISS HNSW (target >= 0.9) | "
          "the walk alone: FAISS HNSW / normrank's graph searched by FAISS's wrapper (single) |",
          "|---|---|---|---|---|---|---|---|"]
    for r in res["search"]:
        h = r.get("hnsw")
        if h:
            L.append(_hnsw_row(f"{r['n']:,}", h))
        else:
            L.append(f"| {r['n']:,} | not run (build time on 2 shared cores) | | | | | | |")
    h = res.get("hnsw_real")
    if h:
        L.append(_hnsw_row(f"{h['n']:,} real MiniLM vectors ({', '.join(h['collections'])})", h))
    L += ["", "Recall is measured against the exact blend (normrank) and against exact cosine (FAISS). On the "
          "small real collection FAISS's HNSW answers in well under 0.1 ms, so normrank's fixed per-call "
          "Python cost (raw query in, `Hit` objects out, about 30 µs) is a large share; from 10k documents on "
          "the graph search dominates. The last column times normrank's graph with pre-augmented queries "
          "through FAISS's own `search`, which separates the walk from normrank's per-call work. normrank's "
          "HNSW stores 385 columns (`pad_to` 1, its default for HNSW): a walk fetches vectors one by one, and "
          "FAISS's buffer starts 16 bytes past a cache line, so a 385-float row spans the 25 lines a "
          "384-float row does, where a 392-float row spans 25 or 26."]
    e = res.get("encoder")
    if e:
        L += ["", "## 3. Raw encoder vs stock `SentenceTransformer.encode`", "",
              f"{e['n_texts']} Cranfield abstracts (or the bundled demo passages), batch size {e['batch_size']}, "
              f"torch {e['torch_threads']} threads; the raw vectors' directions equal the stock output "
              f"(min cosine {e['min_cosine_raw_vs_stock_direction']:.6f}).", "",
              "| encoder | texts/s | ratio vs stock | target >= 0.95 |", "|---|---|---|---|",
              f"| stock encode (normalised) | {e['texts_per_s']['stock']:.1f} | 1.00 | |"]
        for k in ("raw_encode", "raw_encode_with_counts"):
            lo, hi = e["ratio_range"][k]
            L.append(f"| `RawEncoder.{k[4:]}` | {e['texts_per_s'][k]:.1f} | {e['ratio_vs_stock'][k]:.2f} "
                     f"({lo:.2f}-{hi:.2f}) | {_verdict(e['ratio_vs_stock'][k] >= 0.95)} |")
    b = res.get("bytes")
    if b:
        L += ["", f"## 4. Bytes per document of a saved index ({b['n']:,} documents, no texts, no metadata)", "",
              f"Plain `faiss.write_index(IndexFlatIP(384))`: {b['faiss_plain_bytes_per_doc']:.1f} bytes/doc.", "",
              "| pad_to | augmented dim | whole folder | index.faiss beyond plain FAISS | numeric side files (.npy) | "
              "numeric extra total | ids, texts, metadata columns | target <= 8 |",
              "|---|---|---|---|---|---|---|---|"]
        for pad in meta["pads"]:
            p = b[f"pad{pad}"]
            L.append(f"| {pad} | {p['augmented_dim']} | {p['folder_bytes_per_doc']:.1f} | "
                     f"{p['faiss_file_extra_per_doc']:.1f} | {p['numeric_sidecar_per_doc']:.1f} | "
                     f"{p['numeric_extra_per_doc']:.1f} | {p['string_columns_per_doc']:.1f} | "
                     f"{_verdict(p['numeric_extra_per_doc'] <= 8)} |")
        one = b.get("pad1")
        if one:
            L += ["", f"Where the bytes go with `pad_to=1` (the narrowest padding): {one['faiss_file_extra_per_doc'] - 8:.0f} for the "
                  "norm column and 8 for FAISS's int64 id map inside `index.faiss`, plus "
                  f"{one['numeric_sidecar_per_doc']:.0f} in side files (float32 norm, uint16 token count). Against a "
                  "plain FAISS store that supports deletes (`IndexIDMap2(IndexFlatIP(384))`, which has the same id "
                  f"map) normrank adds {one['numeric_extra_per_doc'] - 8:.0f} bytes per document; against a bare "
                  f"`IndexFlatIP(384)` it adds {one['numeric_extra_per_doc']:.0f}. Only the side files alone "
                  f"({one['numeric_sidecar_per_doc']:.0f}) are within 8."]
        p = b[f"pad{meta['pads'][0]}"]
        L += ["", "Per file (bytes/doc, pad_to=" + str(meta["pads"][0]) + "): " +
              ", ".join(f"`{k}` {v:.1f}" for k, v in p["files_bytes_per_doc"].items()) + "."]
    loads = res.get("load") or []
    if loads:
        L += ["", "## 5. Loaded memory and load time (column storage)", "",
              f"A saved `NormIndex` (pad_to {meta.get('default_pad_to', 8)}, the default, additive blend) against what a user would otherwise load: FAISS's "
              "`IndexIDMap2(IndexFlatIP(384))` via `faiss.read_index` and, when the index holds texts and "
              "metadata, the same texts and metadata from a JSON docstore. Each load runs in a fresh Python "
              "process (both import normrank, so library memory cancels), interleaved, "
              f"{loads[0].get('reps', '')} repetitions after a page-cache warm-up, medians. `NormIndex.load` "
              "verifies every file's SHA-256 (`index.faiss` and `texts.utf8` while they are parsed, 2 MiB "
              "piece by piece, each piece on whichever of the load's threads is free). With texts, the load ratio against `read_index` alone counts decoding the texts, "
              "which a FAISS user loads from their own docstore: the last column compares like with like.", "",
              "| docs | texts + metadata | RSS: FAISS IDMap2 (+ docstore) MB | RSS: NormIndex MB | RSS ratio "
              "(target <= 1.2) | load s: read_index / + docstore / NormIndex.load | load ratio vs read_index "
              "(target <= 2) | vs read_index + docstore | single query after the load, ms: FAISS flat / "
              "`NormIndex.search` (ratio) | stored vectors on 2 MiB pages: FAISS / normrank | FAISS's own "
              "kernel, same process and bytes: 4 KiB ÷ 2 MiB pages time |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for ld in sorted(loads, key=lambda x: (x["texts"], x["n"])):
            r, t = ld["rss_mb"], ld["median_s"]
            a, alo, ahi = ld["load_ratio_vs_read_index"]
            c, clo, chi = ld["load_ratio_vs_read_index_plus_docstore"]
            L.append(f"| {ld['n']:,} | {'600-char texts, 4 keys' if ld['texts'] else 'none (ids only)'} | "
                     f"{r['faiss_idmap2_plus_docstore']:.0f} | {r['normrank']:.0f} | {ld['rss_ratio']:.2f} "
                     f"({_verdict(ld['rss_ratio'] <= 1.2)}) | {t['faiss_read_index']:.2f} / "
                     f"{t['faiss_plus_docstore']:.2f} / {t['normrank_load']:.2f} | {a:.2f} ({alo:.2f}-{ahi:.2f}) "
                     f"({_verdict(a <= 2)}) | {c:.2f} ({clo:.2f}-{chi:.2f}) | {_after_load(ld)} |")
        L += ["", "The last three columns: 16 single queries right after the load (1 thread, after a warm-up; "
              "normrank's background huge-page advice waited for first, "
              + ", ".join(f"{ld['huge_wait_s']:.2f} s at {ld['n']:,}" for ld in loads
                          if "huge_wait_s" in ld and not ld["texts"])
              + "), FAISS's bare flat kernel inside the loaded `IndexIDMap2` against `NormIndex.search`; the "
              "share of each store's vectors on 2 MiB pages; and, in the FAISS process, the same kernel "
              "timed again after the same advice on its own vectors, which isolates what the pages buy.",
              "", "How a document is held: norms, token counts and g(d) as NumPy arrays; ids, texts and metadata "
              "as plain lists by internal id (an empty metadata dict as `None`). On "
              "disk (format 2): `ids.utf8` and `texts.utf8` (the strings concatenated) with their lengths in "
              "`lengths.npy`, and `metadata.json` (one array). Format 1 folders (`records.jsonl`) still load. "
              "A load parses the document columns while FAISS reads `index.faiss` in another thread. The id -> "
              "internal id dict is built on the first call that looks an id up (add, delete, get, `in`), not by "
              "the load (searches do not need it); measured apart, right after the load, it took "
              + "; ".join(f"{ld['id_table_s']:.2f} s and {ld['rss_mb']['normrank_with_id_table'] - ld['rss_mb']['normrank']:.0f} MB "
                          f"at {ld['n']:,}{' with texts' if ld['texts'] else ''}" for ld in loads if "id_table_s" in ld)
              + "."]
    return "\n".join(L) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    labels = [m for m in res["search"][0]["modes"] if m.endswith(", 1 thr")] or list(res["search"][0]["modes"])
    ns = [r["n"] for r in res["search"]]
    for label in labels:
        for pad in res["meta"]["pads"]:
            ax.plot(ns, [r["modes"][label]["ratio_vs_faiss"][f"normrank_pad{pad}"] for r in res["search"]],
                    marker="o", label=f"{label}, pad_to={pad}")
    ax.axhline(0.95, color="k", ls="--", lw=0.8, label="target 0.95 (single; batch vs BLAS)")
    ax.axhline(2.0, color="k", ls=":", lw=0.8, label="target 2 (batch vs FAISS default)")
    ax.set(xscale="log", xlabel="documents", ylabel="normrank / FAISS flat throughput",
           title="exact blended top-10 vs IndexFlatIP top-10 (1 FAISS thread)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--hnsw-max", type=int, default=100_000,
                    help="build HNSW only up to this size (0: no HNSW section, real vectors included)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pads", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--omp-threads", type=int, nargs="*", default=None,
                    help="FAISS OpenMP thread counts to measure (default: FAISS's default, then 1)")
    ap.add_argument("--encoder-texts", type=int, default=256, help="0 skips the encoder section")
    ap.add_argument("--encoder-reps", type=int, default=2)
    ap.add_argument("--bytes-n", type=int, default=100_000, help="0 skips the bytes-per-document section")
    ap.add_argument("--load-sizes", type=int, nargs="*", default=[100_000, 10_000, 1_000_000],
                    help="index sizes for the loaded-memory / load-time comparison (the first also with texts); "
                    "none skips it")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--render", type=Path, help="only re-write speed.md (and the plot) from a speed.json")
    ap.add_argument("--tiny", action="store_true", help="1,000 vectors, 8 texts, one repetition (smoke test)")
    args = ap.parse_args(argv)
    if args.render:
        res = json.loads(args.render.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "speed.md").write_text(markdown(res), encoding="utf-8")
        if len(res["search"]) > 1:
            plot(res, args.out / "speed.png")
        return 0
    if args.tiny:
        args.sizes, args.hnsw_max, args.reps, args.encoder_texts, args.bytes_n = [1000], 1000, 1, 8, 1000
        args.load_sizes = [1000]
        args.encoder_reps = 1
    pads = tuple(args.pads)
    omp = tuple(args.omp_threads or sorted({faiss.omp_get_max_threads(), 1}, reverse=True))
    import platform

    meta = {"date": dt.date.today().isoformat(), "machine": f"{cpu_model()}, {os.cpu_count()} cores (shared), "
            f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GB RAM, "
            f"Python {platform.python_version()}, numpy {np.__version__}",
            "faiss": faiss.__version__, "faiss_threads": faiss.omp_get_max_threads(),
            "blas_threshold": faiss.cvar.distance_compute_blas_threshold, "reps": args.reps, "encoder_reps": args.encoder_reps, "pads": list(pads),
            "tiny": args.tiny, "omp_threads": list(omp), "ratio": "paired", "load_averages": [_load_average("start")],
            "evict_bytes": 2 * _last_level_cache_bytes(), "argv": list(sys.argv[1:] if argv is None else argv),
            "fastpath": fastpath.accelerated(),
            "default_pad_to": PAD_TO_BY_INDEX_TYPE["flat"]}
    res: dict[str, Any] = {"meta": meta, "search": []}
    for n in args.sizes:
        print(f"[speed] search at {n:,} ...", file=sys.stderr, flush=True)
        n_single = 64 if n <= 100_000 else 16
        res["search"].append(bench_size(n, args.reps, min(n_single, 8 if args.tiny else n_single), pads,
                                        hnsw=n <= args.hnsw_max, omp_threads=omp))
        meta["load_averages"].append(_load_average(f"after {n:,}"))
        gc.collect()
    print("[speed] hnsw on real vectors ...", file=sys.stderr, flush=True)
    res["hnsw_real"] = None if args.tiny or args.hnsw_max <= 0 else bench_hnsw_real(args.reps)
    print("[speed] encoder ...", file=sys.stderr, flush=True)
    res["encoder"] = bench_encoder(encoder_texts(args.encoder_texts), args.encoder_reps) if args.encoder_texts else None
    print("[speed] bytes ...", file=sys.stderr, flush=True)
    res["bytes"] = bench_bytes(args.bytes_n, pads) if args.bytes_n else None
    print("[speed] load and memory ...", file=sys.stderr, flush=True)
    res["load"] = []
    for n, with_texts in [(m, False) for m in args.load_sizes] + [(m, True) for m in args.load_sizes[:1]]:
        res["load"].append({**bench_load(n, args.reps, with_texts), "reps": args.reps})
    meta["load_averages"].append(_load_average("end"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed.md").write_text(markdown(res), encoding="utf-8")
    (args.out / "speed.json").write_text(json.dumps(res, indent=1))
    if len(args.sizes) > 1:
        plot(res, args.out / "speed.png")
    print(f"[speed] wrote {args.out / 'speed.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
