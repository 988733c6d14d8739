"""Is FAISS's single-query scan the limit? A hand-written kernel against it, and the per-call cost around it.

Why this exists (issue 14, item 1): at 10k documents a single `NormIndex.search` on one thread measures
0.79-0.86 of a bare `IndexFlatIP(384)` search (benchmarks/results/speed.md). This script asks where
the missing share could come from:

1. **The scan.** A kernel written for the job (AVX2 + FMA, four stored rows at a time, four independent
   accumulators, so it is not bound by the latency of one long chain of multiply-adds) is compiled with
   the system's C compiler and timed against FAISS's per-query kernel over the same stored vectors, one
   thread. If it is not faster, the scan runs at the speed the memory hierarchy allows (the bytes per
   second are printed), and no kernel of normrank's own would gain there.
2. **The per-call work.** `NormIndex.search` against FAISS's own `search` on a 200-document index
   (everything in cache) and at the sizes above (each scan leaves the caches cold for what follows).

Needs gcc (or ``$CC``) and an x86-64 CPU with AVX2 and FMA (AVX-512 for one kernel); otherwise it says
so and stops. Not shipped
in normrank: nothing here is imported by the library. Writes ``results/scan_bound.md``.

    python benchmarks/scan_bound.py                 # 10k and 100k documents, about a minute
    python benchmarks/scan_bound.py --tiny --out /tmp/sb
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import faiss
from speed import DIM, WEIGHTS, cpu_model, interleaved, ratio_spread, synthetic

from normrank import huge_pages
from normrank.store import NormIndex, flat_vectors_span

KERNEL_C = r"""
#include <stddef.h>
#include <immintrin.h>
/* Three ways to score n stored rows (lda floats apart) against one query over their first d columns. */

/* One row at a time, four accumulators over 32 columns per step: four independent chains of
   multiply-adds, one stream of rows for the hardware prefetcher. */
__attribute__((target("avx2,fma")))
void row_avx2(const float* x, size_t n, size_t d, size_t lda, const float* q, float* out) {
    for (size_t j = 0; j < n; j++) {
        const float* r = x + j * lda;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        size_t t = 0;
        for (; t + 32 <= d; t += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + t), _mm256_loadu_ps(q + t), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(r + t + 8), _mm256_loadu_ps(q + t + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(r + t + 16), _mm256_loadu_ps(q + t + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(r + t + 24), _mm256_loadu_ps(q + t + 24), a3);
        }
        for (; t + 8 <= d; t += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + t), _mm256_loadu_ps(q + t), a0);
        float s[8];
        _mm256_storeu_ps(s, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        float v = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
        for (; t < d; t++) v += r[t] * q[t];
        out[j] = v;
    }
}

/* The same with 512-bit registers, 64 columns per step. */
__attribute__((target("avx512f")))
void row_avx512(const float* x, size_t n, size_t d, size_t lda, const float* q, float* out) {
    for (size_t j = 0; j < n; j++) {
        const float* r = x + j * lda;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        size_t t = 0;
        for (; t + 64 <= d; t += 64) {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + t), _mm512_loadu_ps(q + t), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(r + t + 16), _mm512_loadu_ps(q + t + 16), a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(r + t + 32), _mm512_loadu_ps(q + t + 32), a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(r + t + 48), _mm512_loadu_ps(q + t + 48), a3);
        }
        for (; t + 16 <= d; t += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + t), _mm512_loadu_ps(q + t), a0);
        float v = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
        for (; t < d; t++) v += r[t] * q[t];
        out[j] = v;
    }
}

/* Four rows at a time sharing each load of the query, one accumulator per row: fewer query loads,
   but four streams of rows at once. */
__attribute__((target("avx2,fma")))
void rows4_avx2(const float* x, size_t n, size_t d, size_t lda, const float* q, float* out) {
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float* r0 = x + j * lda;
        const float* r1 = r0 + lda;
        const float* r2 = r1 + lda;
        const float* r3 = r2 + lda;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        size_t t = 0;
        for (; t + 8 <= d; t += 8) {
            __m256 qv = _mm256_loadu_ps(q + t);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r0 + t), qv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(r1 + t), qv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(r2 + t), qv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(r3 + t), qv, a3);
        }
        float s[4][8];
        _mm256_storeu_ps(s[0], a0); _mm256_storeu_ps(s[1], a1);
        _mm256_storeu_ps(s[2], a2); _mm256_storeu_ps(s[3], a3);
        for (int k = 0; k < 4; k++) {
            float v = ((s[k][0] + s[k][4]) + (s[k][1] + s[k][5])) + ((s[k][2] + s[k][6]) + (s[k][3] + s[k][7]));
            const float* row = x + (j + k) * lda;
            for (size_t u = t; u < d; u++) v += row[u] * q[u];
            out[j + k] = v;
        }
    }
    for (; j < n; j++) {
        const float* row = x + j * lda;
        float v = 0.0f;
        for (size_t t = 0; t < d; t++) v += row[t] * q[t];
        out[j] = v;
    }
}
"""
#: The kernels in :data:`KERNEL_C`, with the CPU flags each needs.
KERNELS = {"row_avx2": {"avx2", "fma"}, "row_avx512": {"avx512f"}, "rows4_avx2": {"avx2", "fma"}}


def cpu_flags() -> set[str]:
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return set()
    return set(line.split(":", 1)[1].split())


def build_kernels(workdir: Path) -> dict[str, Any]:
    """Compile :data:`KERNEL_C` and return the kernels this CPU can run, by name; empty if impossible."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    flags = cpu_flags()
    runnable = [name for name, need in KERNELS.items() if need <= flags]
    if cc is None or not runnable:
        return {}
    src, lib = workdir / "rows_dot.c", workdir / "rows_dot.so"
    src.write_text(KERNEL_C)
    done = subprocess.run([cc, "-O3", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        print(f"[scan_bound] {cc} failed:\n{done.stderr}", file=sys.stderr)
        return {}
    so = ctypes.CDLL(str(lib))
    out = {}
    for name in runnable:
        fn = getattr(so, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                       ctypes.c_void_p]
        fn.restype = None
        out[name] = fn
    return out


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """FAISS's own heap over a row of scores (the selection every normrank flat path uses)."""
    dist, pos = np.empty((1, k), dtype=np.float32), np.empty((1, k), dtype=np.int64)
    heaps = faiss.float_minheap_array_t()
    heaps.k, heaps.nh, heaps.val, heaps.ids = k, 1, faiss.swig_ptr(dist), faiss.swig_ptr(pos)
    heaps.heapify()
    heaps.addn(scores.size, faiss.swig_ptr(scores), 0)
    heaps.reorder()
    return dist, pos


def bench(n: int, kernels: dict[str, Any], reps: int, calls: int) -> dict[str, Any]:
    raw, counts = synthetic(n + calls, seed=0)
    qraw, raw, counts = raw[n:].copy(), raw[:n], counts[:n]
    qunit = (qraw / np.linalg.norm(qraw, axis=1, keepdims=True)).astype(np.float32)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(DIM)
    flat.add(unit)
    huge_pages.advise(*flat_vectors_span(flat))
    idx = NormIndex(dim=DIM, weights=WEIGHTS)
    idx.add_vectors(raw, counts, ids=[str(i) for i in range(n)])
    huge_pages.wait()
    inner, _ = idx._flat_parts()
    width, used = inner.d, DIM + 1  # stored row width (padded) and the columns a query uses
    xb = faiss.rev_swig_ptr(inner.get_xb(), n * width).reshape(n, width)
    xp = xb.ctypes.data
    qa = np.zeros((calls, width), dtype=np.float32)
    qa[:, :used] = idx._augment(qunit, np.full(calls, WEIGHTS.a), query=True)[:, :used]
    qp = [qa[i].ctypes.data for i in range(calls)]
    scores = np.empty(n, dtype=np.float32)
    sp = scores.ctypes.data
    d_out, p_out = np.empty((1, 10), dtype=np.float32), np.empty((1, 10), dtype=np.int64)
    dp, pp = faiss.swig_ptr(d_out), faiss.swig_ptr(p_out)
    qptrs = [faiss.swig_ptr(qa[i:i + 1]) for i in range(calls)]

    # each hand kernel finds FAISS's top-10 over the same stored vectors
    agree = {}
    for name, kern in kernels.items():
        same = 0
        for i in range(min(calls, 8)):
            kern(xp, n, used, width, qp[i], sp)
            inner.search_c(1, qptrs[i], 10, dp, pp)
            same += int(set(top_k(scores, 10)[1][0].tolist()) == set(p_out[0].tolist()))
        agree[name] = f"{same}/{min(calls, 8)}"

    fns: dict[str, Any] = {
        "FAISS `search`, IndexFlatIP(384)": lambda: [flat.search(qunit[i][None, :], 10) for i in range(calls)],
        "FAISS per-query kernel, normrank's stored vectors": lambda: [
            inner.search_c(1, qptrs[i], 10, dp, pp) for i in range(calls)],
    }
    for name, kern in kernels.items():
        fns[f"{name}, scores only"] = lambda kern=kern: [kern(xp, n, used, width, qp[i], sp) for i in range(calls)]
        fns[f"{name} + FAISS heap (top-10)"] = lambda kern=kern: [
            (kern(xp, n, used, width, qp[i], sp), top_k(scores, 10)) for i in range(calls)]
    fns["`NormIndex.search`"] = lambda: [idx.search(qraw[i], 10) for i in range(calls)]
    old = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        times = {k: [t / calls for t in v] for k, v in interleaved(fns, reps).items()}  # seconds per query
    finally:
        faiss.omp_set_num_threads(old)
    base = "FAISS per-query kernel, normrank's stored vectors"
    rows = []
    for name, t in times.items():
        us = float(np.median(t)) * 1e6
        scan = name != "`NormIndex.search`" and not name.startswith("FAISS `search`")
        rows.append({"contender": name, "us": us,
                     "gb_per_s": n * (width if scan else DIM) * 4 / (us * 1e-6) / 1e9,
                     "vs_kernel": ratio_spread(times[base], t),
                     "same_top10": next((v for k, v in agree.items() if name.startswith(k + " +")), "")})
    return {"n": n, "width": width, "columns_used": used, "rows": rows}


def warm_call_cost(reps: int) -> dict[str, float]:
    """Per-call time of FAISS's ``search`` and ``NormIndex.search`` on 200 documents: all in cache."""
    raw, counts = synthetic(264, seed=1)
    q, raw, counts = raw[200:], raw[:200], counts[:200]
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(DIM)
    flat.add(unit)
    idx = NormIndex(dim=DIM, weights=WEIGHTS)
    idx.add_vectors(raw, counts, ids=[str(i) for i in range(200)])
    qu = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    old = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        best: dict[str, float] = {}
        for name, fn in (("faiss_search", lambda i: flat.search(qu[i][None, :], 10)),
                         ("normrank_search", lambda i: idx.search(q[i], 10))):
            runs = []
            for _ in range(max(reps, 5)):
                t = time.perf_counter()
                for i in range(64):
                    fn(i)
                runs.append((time.perf_counter() - t) / 64)
            best[name] = float(np.median(runs)) * 1e6
    finally:
        faiss.omp_set_num_threads(old)
    return best


def markdown(res: dict[str, Any]) -> str:
    m = res["meta"]
    lines = [
        "# Is FAISS's single-query scan the limit?", "",
        (f"Measured {m['date']} on {m['machine']}; FAISS {m['faiss']}, 1 OpenMP thread. Command: "
        f"`python benchmarks/scan_bound.py`; {m['reps']} interleaved repetitions of {m['calls']} single queries "
        "each (every other one in reverse order), caches emptied before every turn (as in `speed.py`), medians."), "",
        ("Data: `speed.py`'s synthetic 384-d vectors, stored by `NormIndex` in its default flat layout (augmented "
        "and padded to the width below; a query uses the first 385 columns). The hand kernels, compiled here "
        "with `-O3`, score the same stored vectors as FAISS's per-query kernel; `row_*` take one stored row at "
        "a time with four accumulators, `rows4_avx2` four rows at a time sharing each load of the query. Their "
        "top-10 comes from FAISS's own heap. GB/s is the bytes of stored vectors read per second (384-wide "
        "rows for the `search` rows)."), "",
    ]
    for r in res["sizes"]:
        lines += [f"## {r['n']:,} documents (stored width {r['width']})", "",
                  "| contender | µs per query | GB/s | FAISS kernel ÷ this: median (p25-p75) | same top-10 as FAISS |",
                  "|---|---|---|---|---|"]
        for row in r["rows"]:
            v = row["vs_kernel"]
            lines.append(f"| {row['contender']} | {row['us']:.0f} | {row['gb_per_s']:.0f} | "
                         f"{v[0]:.2f} ({v[1]:.2f}-{v[2]:.2f}) | {row['same_top10']} |")
        lines.append("")
    w = res.get("warm")
    if w:
        lines += [(f"All in cache (200 documents, 64 calls, median of runs): FAISS `search` "
                  f"{w['faiss_search']:.1f} µs, `NormIndex.search` {w['normrank_search']:.1f} µs per call."), ""]
    lines += [("How to read it: where no hand kernel beats FAISS's per-query kernel (ratios at or below 1), the "
              "scan already runs at the speed the caches and memory deliver it, and a kernel of normrank's own "
              "would not gain. What `NormIndex.search` adds beyond the scan is then its own per-call work (raw "
              "query in, `Hit` objects out), paid on caches the scan has just emptied: compare its time to the "
              "kernel row, and the all-in-cache line."), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--calls", type=int, default=64, help="single queries per turn")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--tiny", action="store_true", help="2,000 vectors, 3 repetitions (smoke test)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.sizes, args.reps, args.calls = [2000], 3, 8
    with tempfile.TemporaryDirectory() as tmp:
        kernels = build_kernels(Path(tmp))
        if not kernels:
            print("[scan_bound] needs a C compiler (gcc, cc or $CC) and an x86-64 CPU with AVX2 and FMA; "
                  "nothing measured", file=sys.stderr)
            return 0
        import platform

        meta = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                "faiss": faiss.__version__, "reps": args.reps, "calls": args.calls}
        res: dict[str, Any] = {"meta": meta, "sizes": []}
        for n in args.sizes:
            print(f"[scan_bound] {n:,} documents ...", file=sys.stderr, flush=True)
            res["sizes"].append(bench(n, kernels, args.reps, args.calls))
        res["warm"] = warm_call_cost(args.reps)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scan_bound.md").write_text(markdown(res), encoding="utf-8")
    print(f"[scan_bound] wrote {args.out / 'scan_bound.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
