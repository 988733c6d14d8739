"""Issue 7 research harness: which norm-aware variants win on real collections?

Every number is measured on queries never used for fitting: scifact fits on its train
qrels and is scored on test; cranfield and cisi use 5-fold cross-validation with all
fitting (the grid choice, the query calibration) inside each fold. Candidates are the
cosine top-100 from ``NormIndex.cosine_candidates``; nDCG@10 for the grid comes from a
numpy ranking checked against ``normrank.metrics`` (trec_eval's definitions, tested equal
to pytrec_eval), which gives every reported number. The shipped default is confirmed with a
real exact ``NormIndex.search``.

Usage::

    python benchmarks/research.py                 # everything (cached encodings; pooling needs its cache)
    python benchmarks/research.py --tiny          # a fast smoke run on a slice of cranfield
    python benchmarks/research.py --stages rerank qpp --collections cranfield

Writes ``benchmarks/results/research.md``, ``research.json`` and plots.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from normrank.cache import cache_dir, encode_cached  # noqa: E402
from normrank.calibration import NormCalibrator  # noqa: E402
from normrank.datasets import default_data_dir, load_beir  # noqa: E402
from normrank.metrics import has_relevant, per_query  # noqa: E402

logger = logging.getLogger("research")
RESULTS = Path(__file__).resolve().parent / "results"
COLLECTIONS = ("scifact", "cranfield", "cisi")
DEPTH = 100
FOLDS = 5
SEED = 0
CLIP = 3.0


# ----------------------------------------------------------------------------- data
def load_collection(name: str, data_dir: Path | None = None) -> dict[str, Any]:
    """Docs, labelled queries, qrels and the evaluation splits (train idx, test idx) of one collection."""
    data_dir = data_dir or default_data_dir()
    if data_dir is None:
        raise SystemExit("no data: set NORMRANK_DATA or place the collections in ../shared/data")
    path = data_dir / name
    test = load_beir(path, "test")
    doc_ids, doc_texts, skipped = test.doc_items()
    qrels: dict[str, dict[str, int]] = {}
    if name == "scifact":
        train = load_beir(path, "train")
        tr = has_relevant(train.qrels)
        te = has_relevant(test.qrels)
        qids = tr + te
        qrels.update({q: train.qrels[q] for q in tr})
        qrels.update({q: test.qrels[q] for q in te})
        splits = [(np.arange(len(tr)), np.arange(len(tr), len(qids)))]
        queries = {**train.queries, **test.queries}
    else:
        qids = has_relevant(test.qrels)
        qrels.update({q: test.qrels[q] for q in qids})
        order = np.random.default_rng(SEED).permutation(len(qids))
        splits = []
        for f in range(FOLDS):
            held = np.sort(order[f::FOLDS])
            splits.append((np.setdiff1d(np.arange(len(qids)), held), held))
        queries = test.queries
    return {"name": name, "doc_ids": doc_ids, "doc_texts": doc_texts, "skipped": skipped, "qids": qids,
            "query_texts": [queries[q] for q in qids], "qrels": qrels, "splits": splits}


def pooled_vectors(enc: Any, name: str, texts: Sequence[str], part: str) -> dict[str, np.ndarray]:
    """Every pooling of ``texts`` from one forward pass, cached as .npz beside the normrank cache."""
    from normrank.pooling import POOLINGS

    h = hashlib.sha256(enc.model_fingerprint.encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    path = cache_dir() / "research" / f"pool_{name}_{part}_{h.hexdigest()[:16]}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    t0 = time.time()
    out = enc.encode_poolings(list(texts), POOLINGS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **out)
    os.replace(tmp, path)
    logger.info("pooled %s %s (%d texts) in %.0fs", name, part, len(texts), time.time() - t0)
    return out


# ----------------------------------------------------------------------------- candidates
@dataclass
class Prepared:
    """One collection encoded, indexed and reduced to its cosine top-``DEPTH`` candidates."""

    coll: dict[str, Any]
    index: Any
    cands: Any
    qnorm: np.ndarray
    qcount: np.ndarray
    rel: np.ndarray  # (nq, depth) graded relevance of each candidate (0 if unjudged)
    idcg: np.ndarray  # (nq,) ideal DCG@10 from all judgments
    cand_len: np.ndarray  # (nq, depth) token counts of the candidates
    cand_norm: np.ndarray  # (nq, depth) raw norms
    zlen: np.ndarray  # (nq, depth) robust z of log token count (corpus scale)
    doc_unit: np.ndarray
    qunit: np.ndarray
    doc_norms: np.ndarray
    doc_counts: np.ndarray
    gram: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (nq, 10, depth): top-10 . candidates


def prepare(name: str, enc: Any, tiny: bool = False) -> Prepared:
    from normrank.store import NormIndex

    coll = load_collection(name)
    all_vecs, all_counts = encode_cached(enc, coll["doc_texts"], show_progress=False)
    qv, qc = encode_cached(enc, coll["query_texts"], show_progress=False)
    if tiny:
        keep = 300
        coll["doc_ids"], coll["doc_texts"] = coll["doc_ids"][:keep], coll["doc_texts"][:keep]
        docs = set(coll["doc_ids"])
        sel = [i for i, q in enumerate(coll["qids"]) if any(d in docs and s > 0 for d, s in coll["qrels"][q].items())]
        coll["qids"] = [coll["qids"][i] for i in sel]
        coll["query_texts"] = [coll["query_texts"][i] for i in sel]
        qv, qc = qv[sel], qc[sel]
        coll["qrels"] = {q: {d: s for d, s in coll["qrels"][q].items() if d in docs} for q in coll["qids"]}
        order = np.random.default_rng(SEED).permutation(len(sel))
        coll["splits"] = [(np.setdiff1d(np.arange(len(sel)), np.sort(order[f::3])), np.sort(order[f::3]))
                          for f in range(3)]
    vecs, counts = all_vecs[: len(coll["doc_ids"])], all_counts[: len(coll["doc_ids"])]
    index = NormIndex(enc)
    index.add_vectors(vecs, counts, ids=coll["doc_ids"])
    depth = min(DEPTH, len(index))
    cands = index.cosine_candidates(list(qv), depth, query_token_counts=qc.tolist())
    nq = len(coll["qids"])
    pos = {d: i for i, d in enumerate(coll["doc_ids"])}
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    rel = np.zeros((nq, depth))
    cand_len = np.ones((nq, depth))
    cand_norm = np.ones((nq, depth))
    idcg = np.zeros(nq)
    disc = 1.0 / np.log2(np.arange(2, 12))
    for qi, q in enumerate(coll["qids"]):
        judged = coll["qrels"][q]
        for j, d in enumerate(cands.doc_ids[qi]):
            rel[qi, j] = max(judged.get(d, 0), 0)
            cand_len[qi, j] = counts[pos[d]]
            cand_norm[qi, j] = norms[pos[d]]
        gains = np.sort([max(s, 0) for s in judged.values()])[::-1][:10]
        idcg[qi] = float(np.sum(gains * disc[: len(gains)]))
    loglen = np.log(counts.astype(np.float64))
    med = np.median(loglen)
    mad = np.median(np.abs(loglen - med)) * 1.4826 or 1.0
    unit = vecs / norms[:, None].astype(np.float32)
    qunit = qv / np.linalg.norm(qv, axis=1, keepdims=True)
    cpos = np.array([[pos[d] for d in row] + [0] * (depth - len(row)) for row in cands.doc_ids])
    gram = np.stack([unit[row[:10]] @ unit[row].T for row in cpos]).astype(np.float64)
    return Prepared(coll, index, cands, np.linalg.norm(qv.astype(np.float64), axis=1), qc.astype(np.int64), rel,
                    idcg, cand_len, cand_norm, (np.log(cand_len) - med) / mad, unit, qunit, norms, counts, gram)


def fast_ndcg(p: Prepared, scores: np.ndarray, k: int = 10) -> np.ndarray:
    """Per-query nDCG@k of re-sorted candidates (ties keep cosine order), trec_eval's linear gains."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    gains = np.take_along_axis(p.rel, order, axis=1)
    dcg = (gains / np.log2(np.arange(2, k + 2))).sum(axis=1)
    return np.where(p.idcg > 0, dcg / np.where(p.idcg > 0, p.idcg, 1.0), 0.0)


def trec_ndcg(p: Prepared, scores: np.ndarray, idx: np.ndarray | None = None, metric: str = "ndcg@10") -> np.ndarray:
    """The same through normrank.metrics (trec_eval's definitions): what every reported number uses."""
    idx = np.arange(len(p.coll["qids"])) if idx is None else idx
    run = {}
    for qi in idx.tolist():
        q = p.coll["qids"][qi]
        ids = p.cands.doc_ids[qi]
        s = scores[qi, : len(ids)]
        order = np.lexsort((np.arange(len(ids)), -s))
        run[q] = {ids[j]: float(len(ids) - r) for r, j in enumerate(order)}
    qrels = {p.coll["qids"][qi]: p.coll["qrels"][p.coll["qids"][qi]] for qi in idx.tolist()}
    res = per_query(qrels, run, metric)
    return np.array([res[p.coll["qids"][qi]] for qi in idx.tolist()])


# ----------------------------------------------------------------------------- scoring forms
@dataclass
class Ctx:
    """Per split: candidate features, with the query calibration fitted on the split's training queries."""

    cos: np.ndarray
    g: dict[str, np.ndarray]  # doc features (nq, depth), clipped: calibrated, raw, length
    gq: dict[str, np.ndarray]  # query features (nq,), clipped: calibrated, raw
    norm: np.ndarray
    gram: np.ndarray


def make_ctx(p: Prepared, train: np.ndarray) -> Ctx:
    qcal = NormCalibrator().fit(p.qnorm[train], p.qcount[train])
    clip = lambda x: np.clip(x, -CLIP, CLIP)  # noqa: E731
    g = {f: clip(p.cands.doc_features[f]) for f in ("calibrated", "raw")}
    g["length"] = clip(p.zlen)
    gq = {f: clip(qcal.transform(p.qnorm, p.qcount, f)) for f in ("calibrated", "raw")}
    cos = np.where(np.isfinite(p.cands.cosine), p.cands.cosine, -10.0)
    return Ctx(cos, g, gq, p.cand_norm, p.gram)


def _log_bessel_iv(v: float, x: np.ndarray) -> np.ndarray:
    """log I_v(x) by the uniform (Debye) expansion: accurate to ~1e-3 for v ~ 191, any x > 0."""
    z = x / v
    s = np.sqrt(1.0 + z * z)
    return v * (s + np.log(z / (1.0 + s))) - 0.5 * np.log(2 * np.pi * v) - 0.5 * np.log(s)


def vmf_score(cos: np.ndarray, kappa: np.ndarray, dim: int = 384) -> np.ndarray:
    """log-likelihood of q_hat under a von Mises-Fisher centred on d_hat with concentration kappa_d."""
    v = dim / 2.0 - 1.0
    return kappa * cos + v * np.log(kappa) - _log_bessel_iv(v, kappa)


Scorer = Callable[[dict[str, Any], Ctx], np.ndarray]
A_GRID = (0.0025, -0.0025, 0.005, -0.005, 0.01, -0.01, 0.02, -0.02, 0.04, -0.04)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def families(dim: int = 384) -> dict[str, tuple[list[dict[str, Any]], Scorer, str]]:
    """name -> (params with the cosine null first, scorer, description); ``dim`` is the model's (for vMF)."""
    null: dict[str, Any] = {"null": True}
    fam: dict[str, tuple[list[dict[str, Any]], Scorer, str]] = {}

    def additive(feat: str) -> Scorer:
        return lambda pr, c: c.cos if pr.get("null") else c.cos + pr["a"] * c.g[feat]

    for feat in ("calibrated", "raw", "length"):
        fam[f"additive:{feat}"] = ([null] + [{"a": a} for a in A_GRID], additive(feat),
                                   f"cos + a * g_{feat}(d)")

    def qcond(feat: str) -> Scorer:
        return lambda pr, c: (c.cos if pr.get("null") else
                              c.cos + (pr["a"] + pr["b"] * c.gq["calibrated"])[:, None] * c.g[feat])

    grid = (0.0,) + A_GRID
    for feat in ("calibrated", "raw"):
        fam[f"query-conditioned:{feat}"] = (
            [null] + [{"a": a, "b": b} for a in grid for b in grid if (a, b) != (0.0, 0.0)], qcond(feat),
            f"cos + (a + b g_q) * g_{feat}(d)")

    def gated(qfeat: str) -> Scorer:
        return lambda pr, c: (c.cos if pr.get("null") else
                              c.cos + (pr["a"] * sigmoid(pr["beta"] * (c.gq[qfeat] - pr["tau"])))[:, None]
                              * c.g["calibrated"])

    for qfeat in ("calibrated", "raw"):
        fam[f"gated:{qfeat}"] = (
            [null] + [{"a": a, "beta": be, "tau": t} for a in (0.005, -0.005, 0.01, -0.01, 0.02, -0.02, 0.04, -0.04)
                      for be in (-4.0, -1.5, 1.5, 4.0) for t in (-1.0, 0.0, 1.0)], gated(qfeat),
            f"cos + a * sigmoid(beta (g_q,{qfeat} - tau)) * g_cal(d)")

    fam["separate-terms"] = (
        [null] + [{"cal": x, "raw": y, "len": z} for x in (0, .005, -.005, .01, -.01, .02, -.02)
                  for y in (0, .005, -.005, .01, -.01, .02, -.02) for z in (0, .005, -.005, .01, -.01, .02, -.02,
                                                                             .04, -.04) if (x, y, z) != (0, 0, 0)],
        lambda pr, c: c.cos if pr.get("null") else (c.cos + pr["cal"] * c.g["calibrated"] + pr["raw"] * c.g["raw"]
                                                     + pr["len"] * c.g["length"]),
        "cos + a1 g_cal + a2 g_raw + a3 z(log length)")

    def vmf(feat: str) -> Scorer:
        return lambda pr, c: (c.cos if pr.get("null") else
                              vmf_score(c.cos, pr["k0"] * np.exp(pr["lam"] * c.g[feat]), dim))

    for feat in ("calibrated", "raw"):
        fam[f"vmf:{feat}"] = ([null] + [{"k0": k0, "lam": lam} for k0 in (50.0, 200.0, 500.0, 2000.0)
                                        for lam in (0.01, -0.01, 0.03, -0.03, 0.1, -0.1, 0.3, -0.3)], vmf(feat),
                              f"vMF log-likelihood, kappa_d = k0 exp(lam g_{feat}(d))")

    def tiebreak(feat: str) -> Scorer:
        from scipy.special import ndtr

        return lambda pr, c: (c.cos if pr.get("null") else
                              c.cos + pr["sign"] * pr["eps"] * (ndtr(c.g[feat]) - 0.5))

    for feat in ("calibrated", "raw"):
        fam[f"tiebreak:{feat}"] = ([null] + [{"eps": e, "sign": s} for e in (0.002, 0.005, 0.01, 0.02, 0.05)
                                             for s in (1.0, -1.0)], tiebreak(feat),
                                   f"cos + eps sign (Phi(g_{feat}) - 1/2)")

    def mult(feat: str) -> Scorer:
        from scipy.special import ndtr

        return lambda pr, c: c.cos if pr.get("null") else c.cos * (1 + pr["a"] * (ndtr(c.g[feat]) - 0.5))

    for feat in ("calibrated", "raw"):
        fam[f"multiplicative:{feat}"] = ([null] + [{"a": a} for a in (0.02, -0.02, 0.05, -0.05, 0.1, -0.1, 0.2,
                                                                       -0.2, 0.4, -0.4)], mult(feat),
                                         f"cos (1 + a (Phi(g_{feat}) - 1/2))")
    def prf(pr: dict[str, Any], c: Ctx) -> np.ndarray:
        if pr.get("null"):
            return c.cos
        m = pr["m"]
        w = np.exp(pr["eta"] * c.g["calibrated"][:, :m])
        w = w / w.sum(axis=1, keepdims=True)
        return c.cos + pr["beta"] * np.einsum("qm,qmd->qd", w, c.gram[:, :m, :])

    prf_grid = [{"m": m, "beta": b} for m in (3, 5, 10) for b in (0.1, 0.25, 0.5, 1.0)]
    fam["prf (Rocchio, no norm)"] = ([null] + [{**x, "eta": 0.0} for x in prf_grid], prf,
                                     "cos + beta * cos(d, mean of top-m d_hat): pseudo-relevance feedback")
    fam["prf norm-weighted"] = ([null] + [{**x, "eta": e} for x in prf_grid for e in (0.0, 0.5, -0.5, 1.0, -1.0)],
                                prf, "as prf, top-m feedback docs weighted exp(eta g_cal(d))")
    fam["raw-dot"] = ([null, {"dot": True}], lambda pr, c: c.cos if pr.get("null") else c.cos * c.norm,
                      "q_hat . d_raw = cos ||d|| (no parameter)")
    return fam


# ----------------------------------------------------------------------------- selection rules
def rule_choice(rule: str, m_train: np.ndarray, rng: np.random.Generator) -> tuple[list[int], list[float]]:
    """Which grid rows (and mixing weights) a rule picks from the train matrix (rows: params, cols: queries)."""
    from normrank.fitting import cross_validated_choice

    means = m_train.mean(axis=1)
    best = int(np.flatnonzero(means >= means.max() - 1e-12)[0])
    if rule == "argmax":
        return [best], [1.0]
    if rule == "half":  # shrink half-way toward cosine (exact shrinkage for forms linear in their weights)
        return [best, 0], [0.5, 0.5]
    if rule == "1se":  # the smallest change whose train mean is within one standard error of the best
        d = m_train[best] - m_train[0]
        se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
        ok = np.flatnonzero(means >= means[best] - se)
        return [int(ok[0])], [1.0]
    if rule == "bagged":  # average of the rankers chosen on 30 bootstrap resamples of the train queries
        picks = []
        n = m_train.shape[1]
        for _ in range(30):
            s = rng.integers(0, n, n)
            mm = m_train[:, s].mean(axis=1)
            picks.append(int(np.flatnonzero(mm >= mm.max() - 1e-12)[0]))
        uniq, cnt = np.unique(picks, return_counts=True)
        return uniq.tolist(), (cnt / cnt.sum()).tolist()
    if rule == "gated":  # nested CV never-harm: accept only if the inner out-of-fold gain is significant
        if best == 0:
            return [0], [1.0]
        oof = cross_validated_choice(m_train, [None] * len(m_train), FOLDS, SEED)
        delta = oof - m_train[0]
        if np.allclose(delta, 0):
            return [0], [1.0]
        pv = float(stats.ttest_rel(oof, m_train[0], alternative="greater").pvalue)
        return ([best], [1.0]) if (delta.mean() > 0 and pv < 0.05) else ([0], [1.0])
    raise ValueError(rule)


RULES = ("argmax", "1se", "half", "bagged", "gated")


def paired(test: np.ndarray, base: np.ndarray) -> dict[str, Any]:
    d = test - base
    p = 1.0 if np.allclose(d, 0) else float(stats.ttest_rel(test, base).pvalue)
    return {"ndcg": float(test.mean()), "cosine": float(base.mean()), "gain": float(d.mean()), "p": p,
            "up": int((d > 1e-9).sum()), "down": int((d < -1e-9).sum()), "n": int(d.size)}


# ----------------------------------------------------------------------------- stage: re-ranking forms
def subset_cands(p: Prepared, idx: np.ndarray, qcal: NormCalibrator) -> Any:
    from normrank.store import CandidateSet

    return CandidateSet(
        doc_ids=[p.cands.doc_ids[i] for i in idx.tolist()], cosine=p.cands.cosine[idx],
        doc_features={f: v[idx] for f, v in p.cands.doc_features.items()},
        query_features={f: qcal.transform(p.qnorm[idx], p.qcount[idx], f) for f in ("calibrated", "raw")})


def library_fit_scores(p: Prepared, fit_kwargs: dict[str, Any]) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Out-of-split scores of ``normrank.fitting.fit_candidates`` (the library's own fit) with ``fit_kwargs``."""
    from normrank.fitting import fit_candidates
    from normrank.scoring import blend

    scores = np.array(np.where(np.isfinite(p.cands.cosine), p.cands.cosine, -10.0))
    chosen = []
    for train, test in p.coll["splits"]:
        qcal = NormCalibrator().fit(p.qnorm[train], p.qcount[train])
        cs = subset_cands(p, train, qcal)
        qids = [p.coll["qids"][i] for i in train.tolist()]
        rep = fit_candidates(cs, qids, p.coll["qrels"], **fit_kwargs)
        w = rep.weights
        ct = subset_cands(p, test, qcal)
        g = w.shape(ct.doc_features[w.feature])
        wq = w.query_weight(ct.query_features[w.feature]) if w.b != 0.0 else np.full(len(test), w.a)
        scores[test] = blend(np.where(np.isfinite(ct.cosine), ct.cosine, -10.0), g, wq[:, None], w)
        chosen.append({"weights": {k: v for k, v in w.to_dict().items() if k in ("a", "b", "feature", "mode",
                                                                                "epsilon")},
                       "accepted": rep.accepted, "cv_gain": round(rep.cv_gain, 4), "p": round(rep.p_value, 4)})
    return scores, chosen


def run_rerank(p: Prepared, fams: dict[str, Any], rules: Sequence[str] = RULES,
               lib_configs: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    test_idx = np.sort(np.concatenate([t for _, t in p.coll["splits"]]))
    cos0 = np.where(np.isfinite(p.cands.cosine), p.cands.cosine, -10.0)
    check = np.abs(fast_ndcg(p, cos0) - trec_ndcg(p, cos0)).max()
    if check > 1e-6:
        raise RuntimeError(f"fast nDCG disagrees with normrank.metrics by {check}")
    base = trec_ndcg(p, cos0, test_idx)
    rng = np.random.default_rng(SEED)
    out: dict[str, Any] = {"cosine": float(base.mean()), "n_test": int(test_idx.size), "families": {}}
    for name, (params, scorer, desc) in fams.items():
        final = {r: cos0.copy() for r in rules}
        oracle = cos0.copy()
        picks: dict[str, list[Any]] = {r: [] for r in rules}
        for train, test in p.coll["splits"]:
            ctx = make_ctx(p, train)
            m = np.stack([fast_ndcg(p, scorer(pr, ctx)) for pr in params])
            for r in rules:
                rows, wts = rule_choice(r, m[:, train], rng)
                s = sum(w * scorer(params[i], ctx) for i, w in zip(rows, wts))
                final[r][test] = s[test]
                picks[r].append([params[i] for i in rows] if len(rows) > 1 else params[rows[0]])
            ob = int(np.argmax(m[:, test].mean(axis=1)))
            oracle[test] = scorer(params[ob], ctx)[test]
        fam_out = {"description": desc, "grid_size": len(params), "rules": {}}
        for r in rules:
            res = paired(trec_ndcg(p, final[r], test_idx), base)
            n_rankers = sum(len(x) if isinstance(x, list) else 1 for x in picks[r])
            res["chosen"] = picks[r] if r != "bagged" else f"{n_rankers} rankers"
            fam_out["rules"][r] = res
        fam_out["oracle"] = paired(trec_ndcg(p, oracle, test_idx), base)
        if len(params) == 2:  # a fixed form with no parameter: report it as is
            fixed = scorer(params[1], make_ctx(p, p.coll["splits"][0][0]))
            fam_out["fixed"] = paired(trec_ndcg(p, fixed, test_idx), base)
        out["families"][name] = fam_out
        logger.info("%s %-28s argmax %+.4f  gated %+.4f  oracle %+.4f", p.coll["name"], name,
                    fam_out["rules"]["argmax"]["gain"], fam_out["rules"].get("gated", {}).get("gain", float("nan")),
                    fam_out["oracle"]["gain"])
    out["library"] = {}
    for label, kwargs in (lib_configs or {}).items():
        s, chosen = library_fit_scores(p, kwargs)
        res = paired(trec_ndcg(p, s, test_idx), base)
        res["chosen"] = chosen
        out["library"][label] = res
        logger.info("%s library %-20s %+.4f p=%.3g", p.coll["name"], label, res["gain"], res["p"])
    return out


# ----------------------------------------------------------------------------- stage: query performance prediction
def oof_query_features(p: Prepared) -> dict[str, np.ndarray]:
    """Each evaluated query's calibrated and raw feature, from a calibrator fitted on its training split."""
    nq = len(p.coll["qids"])
    out = {f: np.full(nq, np.nan) for f in ("calibrated", "raw")}
    for train, test in p.coll["splits"]:
        qcal = NormCalibrator().fit(p.qnorm[train], p.qcount[train])
        for f in out:
            out[f][test] = qcal.transform(p.qnorm[test], p.qcount[test], f)
            # training-only queries (scifact train) get the calibrator fitted on themselves (label-free)
            rest = train[np.isnan(out[f][train])]
            out[f][rest] = qcal.transform(p.qnorm[rest], p.qcount[rest], f)
    return out


def predictors(p: Prepared) -> dict[str, np.ndarray]:
    """Pre-retrieval (query norm features, length) and classic post-retrieval predictors per query."""
    from normrank.qpp import nqc, wig

    feats = oof_query_features(p)
    cos = np.where(np.isfinite(p.cands.cosine), p.cands.cosine, np.nan)
    corpus = p.qunit @ (p.doc_unit.mean(axis=0) / np.linalg.norm(p.doc_unit.mean(axis=0)))
    return {
        "g_q calibrated (pre-retrieval)": feats["calibrated"],
        "g_q raw (pre-retrieval)": feats["raw"],
        "query length (pre-retrieval)": p.qcount.astype(np.float64),
        "max score": cos[:, 0],
        "NQC (std top-100 / corpus score)": nqc(cos, corpus),
        "WIG (top-5 vs corpus, / sqrt len)": wig(cos, corpus, p.qcount),
    }


def recall_at(p: Prepared, ks: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Per-query recall of the cosine list cut at each query's own k (normrank.metrics, recall over all judged)."""
    run = {}
    for qi, k in zip(idx.tolist(), ks.tolist()):
        ids = p.cands.doc_ids[qi][: int(k)]
        run[p.coll["qids"][qi]] = {d: float(len(ids) - r) for r, d in enumerate(ids)}
    qrels = {p.coll["qids"][qi]: p.coll["qrels"][p.coll["qids"][qi]] for qi in idx.tolist()}
    res = per_query(qrels, run, "recall@100")
    return np.array([res[p.coll["qids"][qi]] for qi in idx.tolist()])


def fast_recall_table(p: Prepared) -> np.ndarray:
    """recall[q, k] for k = 0..depth from the candidate lists (checked against normrank.metrics in the stage)."""
    hits = (p.rel > 0).astype(np.float64)
    total = np.array([max(sum(1 for s in p.coll["qrels"][q].values() if s > 0), 1) for q in p.coll["qids"]])
    return np.concatenate([np.zeros((hits.shape[0], 1)), np.cumsum(hits, axis=1)], axis=1) / total[:, None]


def stage_qpp(p: Prepared, enc: Any, args: Any) -> dict[str, Any]:
    from normrank.qpp import allocate_k

    cos0 = np.where(np.isfinite(p.cands.cosine), p.cands.cosine, -10.0)
    test_idx = np.sort(np.concatenate([t for _, t in p.coll["splits"]]))
    nd = trec_ndcg(p, cos0, test_idx)
    preds = predictors(p)
    out: dict[str, Any] = {"spearman": {}, "adaptive_k": {}}
    for name, v in preds.items():
        rho, pv = stats.spearmanr(v[test_idx], nd)
        out["spearman"][name] = {"rho": float(rho), "p": float(pv), "n": int(test_idx.size)}
    table = fast_recall_table(p)
    depth = table.shape[1] - 1
    gammas = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0)
    for budget in (10, 20):
        fixed = recall_at(p, np.full(test_idx.size, budget), test_idx)
        if np.abs(fixed - table[test_idx, budget]).max() > 1e-9:
            raise RuntimeError("fast recall disagrees with normrank.metrics")
        res: dict[str, Any] = {"fixed": {"recall": float(fixed.mean()), "mean_k": float(budget)}}
        for name, v in preds.items():
            ks = np.zeros(len(p.coll["qids"]), dtype=np.int64)
            chosen = []
            for train, test in p.coll["splits"]:
                mu, sd = float(np.mean(v[train])), float(np.std(v[train]) or 1.0)
                best_g, best_r = 0.0, -1.0
                for gma in gammas:
                    kt = allocate_k((v[train] - mu) / sd, budget, gma, depth)
                    r = float(table[train, kt].mean())
                    if r > best_r + 1e-12:
                        best_g, best_r = gma, r
                ks[test] = allocate_k((v[test] - mu) / sd, budget, best_g, depth)
                chosen.append(best_g)
            rec = recall_at(p, ks[test_idx], test_idx)
            pr = paired(rec, fixed)
            res[name] = {"recall": float(rec.mean()), "gain": pr["gain"], "p": pr["p"], "up": pr["up"],
                         "down": pr["down"], "mean_k": float(ks[test_idx].mean()), "gamma": chosen}
        out["adaptive_k"][str(budget)] = res
    return out


# ----------------------------------------------------------------------------- stage: pruning
def stage_prune(p: Prepared, enc: Any, args: Any) -> dict[str, Any]:
    test_idx = np.sort(np.concatenate([t for _, t in p.coll["splits"]]))
    sims = p.qunit[test_idx] @ p.doc_unit.T
    qids = [p.coll["qids"][i] for i in test_idx.tolist()]
    qrels = {q: p.coll["qrels"][q] for q in qids}
    cal = p.index.calibrator
    feats = {f: cal.transform(p.doc_norms, p.doc_counts, f) for f in ("calibrated", "raw")}

    def evaluate(keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = np.where(keep[None, :], sims, -np.inf)
        top = np.argsort(-s, axis=1, kind="stable")[:, :DEPTH]
        run = {q: {p.coll["doc_ids"][j]: float(DEPTH - r) for r, j in enumerate(top[i]) if keep[j]}
               for i, q in enumerate(qids)}
        r = per_query(qrels, run, "recall@100")
        n = per_query(qrels, run, "ndcg@10")
        return np.array([r[q] for q in qids]), np.array([n[q] for q in qids])

    base_r, base_n = evaluate(np.ones(p.doc_unit.shape[0], dtype=bool))
    out: dict[str, Any] = {"recall@100": float(base_r.mean()), "ndcg@10": float(base_n.mean()), "rules": {}}
    n_docs = p.doc_unit.shape[0]
    for rule in ("lowest calibrated", "highest calibrated", "lowest raw", "highest raw", "both tails calibrated"):
        f = feats["raw" if "raw" in rule else "calibrated"]
        key = -f if rule.startswith("highest") else (-np.abs(f) if rule.startswith("both") else f)
        for frac in (0.005, 0.01, 0.02, 0.05, 0.10):
            m = int(round(frac * n_docs))
            keep = np.ones(n_docs, dtype=bool)
            keep[np.argsort(key, kind="stable")[:m]] = False
            r, n = evaluate(keep)
            out["rules"][f"{rule} {frac:.1%}"] = {
                "pruned": m, "recall@100": float(r.mean()), "d_recall": float((r - base_r).mean()),
                "d_ndcg": float((n - base_n).mean()),
                "p_recall": 1.0 if np.allclose(r, base_r) else float(stats.ttest_rel(r, base_r).pvalue)}
    rng = np.random.default_rng(SEED)
    for frac in (0.005, 0.01, 0.02, 0.05, 0.10):  # the yardstick: the same number of random documents
        m = int(round(frac * n_docs))
        dr, dn = [], []
        for _ in range(5):
            keep = np.ones(n_docs, dtype=bool)
            keep[rng.choice(n_docs, m, replace=False)] = False
            r, n = evaluate(keep)
            dr.append(float((r - base_r).mean()))
            dn.append(float((n - base_n).mean()))
        out["rules"][f"random {frac:.1%} (mean of 5)"] = {"pruned": m, "recall@100": float(base_r.mean() + np.mean(dr)),
                                                         "d_recall": float(np.mean(dr)), "d_ndcg": float(np.mean(dn)),
                                                         "p_recall": float("nan")}
    return out


# ----------------------------------------------------------------------------- stage: pooling
def stage_pooling(p: Prepared, enc: Any, args: Any) -> dict[str, Any]:
    from normrank.pooling import POOLINGS, PooledEncoder

    name = p.coll["name"]
    penc = PooledEncoder(show_progress=False, batch_size=32)
    docs = pooled_vectors(penc, name, p.coll["doc_texts"], "docs")
    queries = pooled_vectors(penc, name, p.coll["query_texts"], "queries")
    stock = p.doc_unit * p.doc_norms[:, None].astype(np.float32)
    out: dict[str, Any] = {"mean_matches_stock": float(np.abs(docs["mean"] - stock).max())}
    test_idx = np.sort(np.concatenate([t for _, t in p.coll["splits"]]))
    qids = [p.coll["qids"][i] for i in test_idx.tolist()]
    qrels = {q: p.coll["qrels"][q] for q in qids}
    per: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for mode in POOLINGS:
        d = docs[mode] / np.linalg.norm(docs[mode], axis=1, keepdims=True)
        q = queries[mode][test_idx] / np.linalg.norm(queries[mode][test_idx], axis=1, keepdims=True)
        top = np.argsort(-(q @ d.T), axis=1, kind="stable")[:, :DEPTH]
        run = {qq: {p.coll["doc_ids"][j]: float(DEPTH - r) for r, j in enumerate(top[i])} for i, qq in enumerate(qids)}
        nd, rc = per_query(qrels, run, "ndcg@10"), per_query(qrels, run, "recall@100")
        per[mode] = (np.array([nd[x] for x in qids]), np.array([rc[x] for x in qids]))
    for mode in POOLINGS:
        n, r = per[mode]
        res = paired(n, per["mean"][0])
        res["recall@100"] = float(r.mean())
        res["d_recall"] = float((r - per["mean"][1]).mean())
        out[mode] = res
    return out


# ----------------------------------------------------------------------------- stage: confirm with NormIndex
def stage_confirm(p: Prepared, enc: Any, args: Any) -> dict[str, Any]:
    """The shipped default, run as a user would: ``NormIndex.fit`` on the training queries, exact search on test."""
    from normrank.scoring import Weights

    index = p.index
    runs_cos: dict[str, dict[str, float]] = {}
    runs_fit: dict[str, dict[str, float]] = {}
    reports = []
    for train, test in p.coll["splits"]:
        tq = {p.coll["qids"][i]: p.coll["query_texts"][i] for i in train.tolist()}
        index.set_weights(Weights())
        rep = index.fit(tq, {q: p.coll["qrels"][q] for q in tq}, missing_ok=p.coll["skipped"])
        reports.append({"accepted": rep.accepted, "weights": rep.weights.to_dict(), "reason": rep.reason})
        texts = [p.coll["query_texts"][i] for i in test.tolist()]
        fitted = index.search_batch(texts, 10)
        index.set_weights(Weights())
        plain = index.search_batch(texts, 10)
        for i, hf, hc in zip(test.tolist(), fitted, plain):
            q = p.coll["qids"][i]
            runs_fit[q] = {h.id: 10.0 - r for r, h in enumerate(hf)}
            runs_cos[q] = {h.id: 10.0 - r for r, h in enumerate(hc)}
    qrels = {q: p.coll["qrels"][q] for q in runs_fit}
    a, b = per_query(qrels, runs_fit), per_query(qrels, runs_cos)
    qs = sorted(runs_fit)
    res = paired(np.array([a[q] for q in qs]), np.array([b[q] for q in qs]))
    res["fits"] = reports
    return res


# ----------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", nargs="+", default=list(COLLECTIONS))
    ap.add_argument("--stages", nargs="+", default=list(STAGES))
    ap.add_argument("--tiny", action="store_true", help="a fast smoke run on 300 cranfield documents")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--report", action="store_true", help="only rewrite research.md and plots from research.json")
    ap.add_argument("--model", default=None, help="minilm (default, bundled), mpnet (all-mpnet-base-v2 via "
                    "benchmarks/models.py) or a model folder; other than the default writes research_<label>.*")
    args = ap.parse_args(argv)
    models = _models_script()
    model_path, label, model_name = (None, "", "all-MiniLM-L6-v2") if args.report and not args.model \
        else models.resolve(args.model)
    sfx = f"_{label}" if label else ""
    if args.report:
        write_markdown(json.loads((args.out / f"research{sfx}.json").read_text()), args.out, label)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from normrank.encoders import RawEncoder

    enc = RawEncoder(model_path, show_progress=False)
    if args.tiny:
        args.collections = ["cranfield"]
        args.stages = [s for s in args.stages if s != "pooling"]
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / (f"research_tiny{sfx}.json" if args.tiny else f"research{sfx}.json")
    results: dict[str, Any] = json.loads(json_path.read_text()) if json_path.is_file() else {}
    results.setdefault("conditions", {})
    results["conditions"].update({"model": f"{model_name} ({'bundled, ' if not label else ''}{enc.dim}-d), "
                                           "raw vectors", "depth": DEPTH,
                                  "folds": FOLDS, "seed": SEED, "clip": CLIP,
                                  "protocol": "scifact: fit on train qrels, score test; cranfield/cisi: 5-fold CV"})
    for name in args.collections:
        t0 = time.time()
        p = prepare(name, enc, tiny=args.tiny)
        for stage in args.stages:
            res = results.setdefault(name, {})
            fn = STAGES[stage]
            res[stage] = fn(p, enc, args)
            # merge into what is on disk now, so runs of other collections or stages are kept
            disk = json.loads(json_path.read_text()) if json_path.is_file() else {}
            disk.setdefault(name, {})[stage] = res[stage]
            disk["conditions"] = results["conditions"]
            tmp = json_path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(disk, indent=1, default=_jsonable))
            os.replace(tmp, json_path)
            results = disk
        logger.info("%s done in %.0fs", name, time.time() - t0)
    if not args.tiny:
        write_markdown(results, args.out, label)
    return 0


def _models_script() -> Any:
    """benchmarks/models.py (a script beside this one, not a package module)."""
    import importlib.util

    name = "normrank_bench_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "models.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(type(x))


#: Conclusions, written from the numbers in the tables below (all-MiniLM-L6-v2, this run's seeds).
NOTES = """## Conclusions (read first)

**The target is not met.** The target was a gain of at least +0.02 nDCG@10 over cosine, averaged over the
collections, from the default fitted configuration. That configuration (`NormIndex.fit` /
`fitting.fit_candidates` with its never-harm gate) gives **+0.0000 on scifact, -0.0002 on cranfield
(p = 0.81; 1 fold of 5 accepted a blend) and +0.0000 on cisi**: -0.0001 on average, and no collection is
significantly worse. The real `NormIndex.fit` followed by exact `NormIndex.search` gives the same numbers (section 6).
The default is unchanged. Of the library configurations tried (section 2), only it and the "all three
modes" variant lose nothing anywhere, and none of the alternatives below shows a gain that holds up out
of sample.

* **Ceiling.** Even when it is tuned on the evaluation queries themselves (the `oracle` column), the best
  norm form gains only +0.014 on scifact, +0.011 on cranfield and +0.026 on cisi. These come from the
  441-point "separate terms" grid, so on cisi's 76 queries that figure is mostly selection noise. Fitted
  honestly (argmax on training queries), the best form averages +0.0039 (separate terms). The best
  average under any rule is +0.0045 (a length prior, bagged). No form gains significantly on more
  than one collection.
* **Held-out winners** (p < 0.05; there are 17 forms x 5 rules x 3 collections, so a few such results
  are expected by chance):
  - separate terms `cos + 0.02 g_cal - 0.01 g_raw + 0.04 z(len)` on scifact: +0.0140 (p = 0.0097,
    33 up / 19 down). But the same form gives +0.0021 on cranfield and -0.0044 on cisi, and the nested-CV
    gate, run on scifact's own 809 training queries, did not accept it.
  - on cranfield: query-conditioned weight on the raw feature, +0.0048 (p = 0.029); vMF with kappa from
    the raw norm, +0.0043 (p = 0.034); the 1se length prior, +0.0037 (p = 0.003); tie-break on the raw
    feature (1se), +0.0038 (p = 0.029).
* **Losers.**
  - The raw dot product `cos * ||d||`: -0.038 / -0.130 / -0.127 (all p < 0.002).
  - On cisi: vMF with the calibrated feature, -0.0087 (1se, p = 0.010) and -0.0101 (bagged, p = 0.033);
    norm-weighted pseudo-relevance feedback, -0.0145 (p = 0.020).
  - Gated weights `a sigmoid(beta (g_q - tau))`, argmax fit: -0.0036 / -0.0027 on cisi and
    -0.0010 / -0.0014 on cranfield, against +0.0035 / +0.0045 on scifact (all n.s.). The gate adds
    nothing over the plain query-conditioned weight.
* **A pattern, too weak to ship.**
  - Forms on the raw (length-carrying) feature lean positive on all three collections, e.g.
    query-conditioned raw (bagged) +0.0032 / +0.0029 / +0.0049, and the length prior (bagged)
    +0.0027 / +0.0045 / +0.0063.
  - Forms on the length-calibrated feature lean negative on cranfield and cisi.
  - So on MiniLM, what can be used from the norm looks like a weak length prior, not the
    length-controlled residual.
* **Robust fitting.**
  - Shrinkage (`half`), the one-standard-error rule (`1se`) and bagging shrink argmax's losses,
    but they create no reliable gain.
  - The nested-CV gate returns cosine almost everywhere. That is right: nothing here reliably helps.
* **Query performance prediction.** The query's own norm does not predict how well retrieval goes.
  - Spearman with per-query nDCG@10 is +0.099 (p = 0.087) on scifact, +0.015 on cranfield and +0.017
    on cisi.
  - The classic score-based predictors do: max score +0.345 / +0.215 / +0.396, NQC
    +0.111 / +0.399 / +0.314, WIG +0.092 / +0.372 / +0.180.
  - Adaptive k at an equal average budget gains no significant recall with any predictor. The best
    results are g_q on scifact, Recall@10 +0.0117 (p = 0.15), and WIG on cisi, +0.0091 (p = 0.15).
    There are significant losses: the raw g_q on cisi, -0.0090 (p = 0.012).
  - So no `query_specificity`, `confidence` or adaptive-k option was added to search results.
    `normrank.qpp` keeps the predictors and the allocator, so the experiment can be re-run.
* **Pruning stays off.** Dropping the lowest-feature 0.5% of documents stays within 0.5 points of
  Recall@100 on cranfield (-0.0011) and cisi (-0.0003), but costs -0.010 on scifact (26 documents
  pruned, over its 300 test queries). That is worse than dropping 26 documents at random (-0.006). At 1-10%,
  the lowest-feature documents are about as likely to be relevant as random ones on scifact and
  cranfield, and a little less likely on cisi (at 10%: -0.015 vs -0.025 at random). No calibrated
  pruning rule kept Recall@100 within 0.5 points on every collection.
* **Norm-aware pooling does not beat mean pooling** as a first-stage retriever (scifact / cranfield / cisi):
  - token-norm weights -0.0099 (p = 0.087) / +0.0004 / -0.0126;
  - norm squared -0.0267 (p = 0.0016) / -0.0075 / -0.0335 (p = 0.017);
  - inverse norm -0.0028 / -0.0069 / +0.0050;
  - frequency-based SIF weights +0.0041 / +0.0059 / +0.0007. SIF is the only pooling that is positive
    on all three, but it is not significant on any (p = 0.34 / 0.12 / 0.92), and it is not norm-based.

  MiniLM was trained with mean pooling, and mean pooling stays the default. `normrank.pooling.PooledEncoder`
  ships as an opt-in encoder mode, so other models can be tried.
* **Not a norm method, for context.** Pseudo-relevance feedback (Rocchio over the top-m candidates)
  gains +0.0163 on cranfield (p = 0.0014), but 0.0000 on scifact (not selected) and -0.0037 on cisi.
  Weighting the feedback documents by their norm made it worse. Not shipped.
"""

#: The library's own fit under its defaults (what a user gets) and a few alternatives, reported for the
#: record. The default was not chosen by looking at these evaluation numbers (see NOTES).
LIB_CONFIGS: dict[str, dict[str, Any]] = {
    "fit_candidates (current defaults)": {},
    "all three modes": {"modes": ("additive", "tiebreak", "multiplicative")},
    "raw feature only": {"features": ("raw",)},
    "looser gate alpha=0.2": {"alpha": 0.2},
    "no significance gate (alpha=1)": {"alpha": 1.0},
}


def stage_rerank(p: Prepared, enc: Any, args: Any) -> dict[str, Any]:
    return run_rerank(p, families(int(p.doc_unit.shape[1])), RULES, LIB_CONFIGS)


STAGES: dict[str, Callable[[Prepared, Any, Any], dict[str, Any]]] = {
    "rerank": stage_rerank, "qpp": stage_qpp, "prune": stage_prune, "pooling": stage_pooling,
    "confirm": stage_confirm,
}


def _fmt(r: dict[str, Any]) -> str:
    star = "**" if r["p"] < 0.05 else ""
    return f"{star}{r['gain']:+.4f}{star} (p={r['p']:.2g}, {r['up']}↑/{r['down']}↓)"


def write_markdown(results: dict[str, Any], out: Path, label: str = "") -> None:
    """Tables of every variant, then plots; the narrative lives in NOTES (written from these numbers).

    ``label`` names a model other than the bundled MiniLM: its files get the suffix
    (``research_mpnet.md``) and NOTES, which were written from MiniLM's numbers, are left out."""
    colls = [c for c in COLLECTIONS if c in results and "rerank" in results[c]]
    model = results.get("conditions", {}).get("model", "")
    L: list[str] = [f"# Research: where the norm signal pays (issue 7){' — ' + model if label else ''}", "",
                    "Generated by `python benchmarks/research.py"
                    + (f" --model {label}" if label else "") + "` (re-runnable; encodings from the normrank cache).",
                    "", "Conditions: " + "; ".join(f"{k}: {v}" for k, v in results.get("conditions", {}).items()),
                    "", "Every number is nDCG@10 (trec_eval's definitions, normrank.metrics) on queries never "
                    "used for fitting: "
                    "scifact fits on its 809 train queries and is scored on the 300 test queries; cranfield (225) "
                    "and cisi (76) use 5-fold cross-validation with the grid choice and the query calibration "
                    "fitted inside each fold. Gains are against cosine on the same queries; p is a two-sided "
                    "paired t-test; ↑/↓ count queries that went up/down. **Bold** = p < 0.05 (either sign).", ""]
    sfx = f"_{label}" if label else ""
    L += (NOTES.splitlines() if not label else
          ["The conclusions of `research.md` were written from all-MiniLM-L6-v2's numbers; this file holds the "
           "same tables for another model (see `models.md` for the side-by-side summary)."])
    has_qpp = any("qpp" in results.get(c, {}) and "prune" in results.get(c, {}) for c in colls)
    L += ["", f"Plots: `research_forms{sfx}.png` (every form, fitted and oracle)"
              + (f", `research_qpp_pruning{sfx}.png` (predictors; pruning vs random)." if has_qpp else
                 "; the qpp and prune stages were not run for this model."), ""]
    if colls:
        L += ["## 1. Summary", "", "| | " + " | ".join(colls) + " | mean gain |", "|---" * (len(colls) + 2) + "|"]
        L.append("| cosine nDCG@10 | " + " | ".join(f"{results[c]['rerank']['cosine']:.4f}" for c in colls) + " | |")
        lib = results[colls[0]]["rerank"].get("library", {})
        for label in lib:
            rows = [results[c]["rerank"]["library"].get(label) for c in colls]
            if all(rows):
                L.append(f"| library: {label} | " + " | ".join(_fmt(r) for r in rows)
                         + f" | {np.mean([r['gain'] for r in rows]):+.4f} |")
        fams = list(results[colls[0]]["rerank"]["families"])
        for f in fams:
            fixed = "fixed" in results[colls[0]]["rerank"]["families"][f]
            rows = [results[c]["rerank"]["families"][f]["fixed" if fixed else "rules"] for c in colls]
            rows = rows if fixed else [r["argmax"] for r in rows]
            L.append(f"| {f} ({'no parameter' if fixed else 'argmax'}) | " + " | ".join(_fmt(r) for r in rows)
                     + f" | {np.mean([r['gain'] for r in rows]):+.4f} |")
        L += ["", "## 2. Every form under every fitting rule", "",
              "Rules, all fitted on training queries only: `argmax` = best train mean; `1se` = the smallest "
              "change within one standard error of the best; `half` = the argmax weights shrunk half-way to "
              "cosine; `bagged` = the average of the rankers chosen on 30 bootstrap resamples; `gated` = nested "
              "CV never-harm (argmax kept only if an inner 5-fold out-of-fold gain passes a one-sided paired "
              "t-test at 0.05, as `fit_candidates` does). `oracle` = tuned on the evaluation queries themselves: "
              "a ceiling, not a result.", ""]
        for c in colls:
            fam = results[c]["rerank"]["families"]
            L += [f"### {c} (cosine {results[c]['rerank']['cosine']:.4f}, n={results[c]['rerank']['n_test']})", "",
                  "| form | grid | " + " | ".join(RULES) + " | oracle |", "|---" * (len(RULES) + 3) + "|"]
            for f, v in fam.items():
                cells = [_fmt(v["rules"][r]) for r in RULES]
                if "fixed" in v:
                    cells = [f"fixed: {_fmt(v['fixed'])}"] + [""] * (len(RULES) - 1)
                L.append(f"| {f}: `{v['description']}` | {v['grid_size']} | " + " | ".join(cells)
                         + f" | {v['oracle']['gain']:+.4f} |")
            L.append("")
            for label, r in results[c]["rerank"].get("library", {}).items():
                L.append(f"- library `{label}`: {_fmt(r)}; per split: "
                         + "; ".join(f"{'accepted' if x['accepted'] else 'cosine'} "
                                     f"(cv gain {x['cv_gain']:+.4f}, p={x['p']:.2g})" for x in r["chosen"]))
            L.append("")
    qcolls = [c for c in COLLECTIONS if c in results and "qpp" in results[c]]
    if qcolls:
        L += ["## 3. Query performance prediction", "",
              "Spearman correlation between each predictor and per-query cosine nDCG@10 (evaluation queries; "
              "the query calibration is fitted on the training split).", "",
              "| predictor | " + " | ".join(qcolls) + " |", "|---" * (len(qcolls) + 1) + "|"]
        for pred in results[qcolls[0]]["qpp"]["spearman"]:
            L.append(f"| {pred} | " + " | ".join(
                f"{results[c]['qpp']['spearman'][pred]['rho']:+.3f} (p={results[c]['qpp']['spearman'][pred]['p']:.2g})"
                for c in qcolls) + " |")
        for budget in ("10", "20"):
            L += ["", f"Adaptive k at an average budget of {budget} (Recall@k_q vs Recall@{budget}; the shape "
                  "gamma is chosen on training queries, the depths are rescaled to the same mean on the "
                  "evaluation queries):", "", "| allocation by | " + " | ".join(qcolls) + " |",
                  "|---" * (len(qcolls) + 1) + "|"]
            L.append("| fixed k | " + " | ".join(
                f"{results[c]['qpp']['adaptive_k'][budget]['fixed']['recall']:.4f}" for c in qcolls) + " |")
            for pred in results[qcolls[0]]["qpp"]["adaptive_k"][budget]:
                if pred == "fixed":
                    continue
                L.append(f"| {pred} | " + " | ".join(
                    "{recall:.4f} ({gain:+.4f}, p={p:.2g}, mean k {mean_k:.2f})".format(
                        **results[c]["qpp"]["adaptive_k"][budget][pred]) for c in qcolls) + " |")
        L.append("")
    pcolls = [c for c in COLLECTIONS if c in results and "prune" in results[c]]
    if pcolls:
        L += ["## 4. Pruning at index time", "",
              "Exact cosine over the corpus after dropping a fraction of documents by their norm feature; "
              "change in Recall@100 and nDCG@10 (scifact: its 300 test queries; cranfield, cisi: all labelled "
              "queries; nothing is fitted). The bar is "
              "a Recall@100 loss of at most 0.005.", "",
              "| rule | " + " | ".join(f"{c} ΔR@100 / ΔnDCG@10" for c in pcolls) + " |",
              "|---" * (len(pcolls) + 1) + "|"]
        L.append("| none (Recall@100, nDCG@10) | " + " | ".join(
            f"{results[c]['prune']['recall@100']:.4f}, {results[c]['prune']['ndcg@10']:.4f}" for c in pcolls) + " |")
        for rule in results[pcolls[0]]["prune"]["rules"]:
            L.append(f"| {rule} | " + " | ".join(
                "{d_recall:+.4f} / {d_ndcg:+.4f}".format(**results[c]["prune"]["rules"][rule]) for c in pcolls) + " |")
        L.append("")
    ocolls = [c for c in COLLECTIONS if c in results and "pooling" in results[c] and "mean" in results[c]["pooling"]]
    if ocolls:
        L += ["## 5. Norm-aware pooling as the first-stage retriever", "",
              "Exact cosine top-100 over the whole corpus with each pooling of the same MiniLM token "
              "embeddings (scifact: its 300 test queries; cranfield, cisi: all labelled queries; nothing is "
              "fitted). Gain vs stock mean pooling.", "",
              "| pooling | " + " | ".join(f"{c} nDCG@10 (gain, p, ↑/↓) | {c} ΔR@100" for c in ocolls) + " |",
              "|---" * (2 * len(ocolls) + 1) + "|"]
        from normrank.pooling import POOLINGS

        for mode in POOLINGS:
            cells = []
            for c in ocolls:
                r = results[c]["pooling"][mode]
                cells += [f"{r['ndcg']:.4f} {_fmt(r)}", f"{r['d_recall']:+.4f}"]
            L.append(f"| {mode} | " + " | ".join(cells) + " |")
        L.append("")
        if "scifact" not in ocolls:
            L += ["", "scifact: not run (one token-level pass over its 5,183 abstracts costs about 10 CPU-minutes "
                  "on this 2-core machine).", ""]
    ccolls = [c for c in COLLECTIONS if c in results and "confirm" in results[c]]
    if ccolls:
        L += ["## 6. The shipped default, run through `NormIndex.fit` and exact `NormIndex.search`", "",
              "| collection | cosine | fitted default | gain | fits accepted |", "|---|---|---|---|---|"]
        for c in ccolls:
            r = results[c]["confirm"]
            acc = sum(1 for f in r["fits"] if f["accepted"])
            L.append(f"| {c} | {r['cosine']:.4f} | {r['ndcg']:.4f} | {_fmt(r)} | {acc}/{len(r['fits'])} |")
        L.append("")
    (out / f"research{sfx}.md").write_text("\n".join(L) + "\n")
    _plots(results, out, sfx)


def _plots(results: dict[str, Any], out: Path, sfx: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib missing: no plots")
        return
    colls = [c for c in COLLECTIONS if c in results and "rerank" in results[c]]
    if not colls:
        return
    fams = [f for f in results[colls[0]]["rerank"]["families"] if f != "raw-dot"]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(colls)
    for i, c in enumerate(colls):
        g = [results[c]["rerank"]["families"][f]["rules"]["argmax"]["gain"] for f in fams]
        o = [results[c]["rerank"]["families"][f]["oracle"]["gain"] for f in fams]
        x = np.arange(len(fams)) + i * width
        ax.bar(x, g, width, label=f"{c} (fitted on train)")
        ax.scatter(x, o, marker="_", color="k", s=80, zorder=3)
    ax.axhline(0.02, color="r", ls="--", lw=1, label="target +0.02")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(np.arange(len(fams)) + 0.4 - width / 2, fams, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("nDCG@10 gain over cosine (held-out queries)")
    ax.set_title("Norm-aware forms, argmax fit (bars) and oracle ceiling (black ticks); raw dot: -0.04 to -0.13")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"research_forms{sfx}.png", dpi=110)
    plt.close(fig)
    qc = [c for c in COLLECTIONS if "qpp" in results.get(c, {}) and "prune" in results.get(c, {})]
    if not qc:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    preds = list(results[qc[0]]["qpp"]["spearman"])
    width = 0.8 / len(qc)
    for i, c in enumerate(qc):
        a1.bar(np.arange(len(preds)) + i * width, [results[c]["qpp"]["spearman"][x]["rho"] for x in preds], width,
               label=c)
        fracs = [0.005, 0.01, 0.02, 0.05, 0.10]
        a2.plot(fracs, [results[c]["prune"]["rules"][f"lowest calibrated {f:.1%}"]["d_recall"] for f in fracs],
                "o-", label=f"{c}: lowest calibrated", color=f"C{i}")
        a2.plot(fracs, [results[c]["prune"]["rules"][f"random {f:.1%} (mean of 5)"]["d_recall"] for f in fracs],
                "x--", label=f"{c}: random", color=f"C{i}")
    a1.set_xticks(np.arange(len(preds)) + 0.4 - width / 2, [x.split(" (")[0] for x in preds], rotation=30,
                  ha="right", fontsize=8)
    a1.axhline(0, color="k", lw=0.5)
    a1.set_ylabel("Spearman with per-query nDCG@10")
    a1.set_title("Query performance prediction")
    a1.legend(fontsize=8)
    a2.axhline(-0.005, color="r", ls="--", lw=1, label="-0.5 point bar")
    a2.set_xscale("log")
    a2.set_xlabel("fraction of documents pruned")
    a2.set_ylabel("change in Recall@100")
    a2.set_title("Pruning by the calibrated feature vs at random")
    a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"research_qpp_pruning{sfx}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
