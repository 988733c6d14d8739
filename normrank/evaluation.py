"""Does the norm help on *this* collection and model? Cosine, BM25, raw dot and fitted normrank, side by side.

Used by ``normrank eval`` and ``benchmarks/quality.py``. The protocol keeps the
evaluated queries out of every fitting step, query calibration included:

* **train -> test** when the collection has a train split: fit on the train queries'
  cosine candidates, evaluate the test queries with the index's exact blended search;
* **k-fold cross-validation** otherwise: the evaluated queries are split into folds; each
  fold is searched with the blend (and query calibration) fitted on the other folds only.

Metrics are per query, computed as trec_eval does (:mod:`normrank.metrics`, checked equal
to pytrec_eval in the tests); differences against cosine are tested with a two-sided paired
t-test over queries and counted as queries improved / worsened, because a mean alone hides
a blend that helps some queries and hurts as many others.

Several models (``normrank eval --model A --model B``) are evaluated on the same queries
under the same protocol, each with its own encodings (cached per model fingerprint), and
reported side by side (:func:`evaluate_models`, :func:`format_models`, :func:`plot_models`).
The BM25 baseline needs the ``eval`` extra (bm25s): ``pip install "normrank[eval]"``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from normrank._validation import is_blank_text
from normrank.cache import encode_cached
from normrank.datasets import available_splits, load_beir, load_qrels, read_qrels_file
from normrank.encoders import RawEncoder
from normrank.errors import DatasetError, EmptyCorpusError, InvalidArgumentError, MissingExtraError
from normrank.fitting import check_fit_kwargs, check_qrels, fit_candidates
from normrank.metrics import has_relevant, per_query
from normrank.scoring import Weights
from normrank.store import NormIndex

logger = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

#: Cut-off of every run: Recall@100 needs the top 100.
RUN_DEPTH = 100
#: Cosine candidates per training query that the fit re-ranks (as ``normrank.fitting.fit_index``).
FIT_DEPTH = 100
METRICS: tuple[str, ...] = ("ndcg@10", "recall@100")


# ---------------------------------------------------------------- protocol
@dataclass(frozen=True)
class Protocol:
    """How the evaluated queries are kept apart from the fitted ones."""

    split: str
    train_split: str | None = None
    folds: int | None = None
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.train_split}->{self.split}" if self.train_split else f"{self.folds}-fold cv on {self.split}"


def choose_protocol(path: str | os.PathLike[str], split: str | None = None, train_split: str | None = None,
                    folds: int | None = None, seed: int = 0) -> Protocol:
    """Train -> test when the folder has a train split, else 5-fold CV; explicit choices win.

    Raises
    ------
    DatasetError
        The folder has no qrels, or lacks a split that was asked for.
    InvalidArgumentError
        Both a train split and folds were given, or folds < 2.
    """
    if not Path(path).is_dir():
        raise DatasetError(f"no such folder: {path}")
    splits = available_splits(path)
    if not splits:
        raise DatasetError(f"{path} has no qrels/<split>.tsv files: nothing to evaluate against")
    if split is None:
        split = "test" if "test" in splits else (splits[0] if len(splits) == 1 else "")
        if not split:
            raise DatasetError(f"{path} has no test split; choose one with --split from {splits}")
    if split not in splits:
        raise DatasetError(f"{path} has no qrels/{split}.tsv; available splits: {splits}")
    from normrank._validation import check_option

    seed = check_option("seed", seed)  # -1 passed here and failed late inside NumPy, unnamed
    if train_split is not None and folds is not None:
        raise InvalidArgumentError("give either a train split or a number of folds, not both")
    if folds is not None:
        folds = check_option("folds", folds)  # 2.5 ran 2 folds under the label "2.5-fold"
        return Protocol(split, folds=folds, seed=seed)
    if train_split is not None:
        if train_split not in splits:
            raise DatasetError(f"{path} has no qrels/{train_split}.tsv; available splits: {splits}")
        if train_split == split:
            raise InvalidArgumentError(f"the train split and the evaluated split are both {split!r}: "
                                       "use --folds to cross-validate on one split")
        return Protocol(split, train_split=train_split, seed=seed)
    if "train" in splits and split != "train":
        return Protocol(split, train_split="train", seed=seed)
    return Protocol(split, folds=5, seed=seed)


# ---------------------------------------------------------------- collection
@dataclass
class Collection:
    """A BEIR folder with its documents and queries encoded (through the on-disk cache)."""

    name: str
    ids: list[str]
    texts: list[str]
    skipped: list[str]
    doc_vectors: np.ndarray
    doc_counts: np.ndarray
    queries: dict[str, str]
    qrels: dict[str, dict[str, dict[str, int]]]  # split -> qrels
    query_vectors: dict[str, np.ndarray] = field(default_factory=dict)
    query_counts: dict[str, int] = field(default_factory=dict)
    skipped_queries: list[str] = field(default_factory=list)


def load_collection(path: str | os.PathLike[str], splits: Sequence[str], encoder: RawEncoder | None = None,
                    *, show_progress: bool | None = None) -> Collection:
    """Load ``splits`` of a BEIR folder and encode its documents and judged queries.

    Empty documents are skipped (they stay in the qrels and count as missed); judged
    queries with empty text are dropped from the evaluation and listed.
    """
    encoder = encoder or RawEncoder()
    ds = load_beir(path, splits[0])
    qrels = {splits[0]: ds.qrels}
    for s in splits[1:]:
        qrels[s] = load_qrels(Path(path) / "qrels" / f"{s}.tsv", ds.corpus, ds.queries)
    ids, texts, skipped = ds.doc_items()
    if not ids:
        raise EmptyCorpusError(f"{path}: every document is empty")
    if skipped:
        logger.info("%s: skipped %d empty documents (they stay in the qrels as unretrievable)", ds.name, len(skipped))
    vecs, counts = encode_cached(encoder, texts, show_progress=show_progress)
    coll = Collection(ds.name, ids, texts, skipped, vecs, counts, ds.queries, qrels)
    judged = sorted({q for qr in qrels.values() for q in has_relevant(qr)})
    coll.skipped_queries = [q for q in judged if is_blank_text(ds.queries[q])]
    wanted = [q for q in judged if not is_blank_text(ds.queries[q])]
    if wanted:
        qv, qc = encode_cached(encoder, [ds.queries[q] for q in wanted], show_progress=False)
        coll.query_vectors = dict(zip(wanted, qv))
        coll.query_counts = {q: int(c) for q, c in zip(wanted, qc)}
    return coll


def read_qrels(path: str | os.PathLike[str]) -> dict[str, dict[str, int]]:
    """A qrels file (BEIR's ``query-id<TAB>corpus-id<TAB>score``, header optional; TREC's 4 columns also
    work), read as ``normrank eval`` reads it (:func:`normrank.datasets.read_qrels_file`).

    Raises
    ------
    DatasetError
        The file is missing or a line is malformed (the line is named).
    """
    return read_qrels_file(path)


# ---------------------------------------------------------------- optional packages
EVAL_EXTRA_HINT = 'pip install "normrank[eval]"'


def require_bm25s() -> Any:
    """The ``bm25s`` module, or a :class:`MissingExtraError` naming the extra that installs it."""
    try:
        import bm25s
    except ImportError as exc:
        raise MissingExtraError(f"the BM25 baseline of `normrank eval` needs bm25s, which the core install "
                                f"leaves out: {EVAL_EXTRA_HINT}") from exc
    return bm25s


# ---------------------------------------------------------------- runs
def _ranked(doc_ids: Sequence[str], k: int) -> dict[str, float]:
    """A run entry whose scores reproduce our order exactly (trec_eval re-sorts by score, ties by id)."""
    return {d: float(k - r) for r, d in enumerate(doc_ids)}


def exact_topk(queries: np.ndarray, docs: np.ndarray, k: int, keep: np.ndarray | None = None,
               chunk: int = 64) -> np.ndarray:
    """Indices of the top-``k`` rows of ``docs`` by inner product, ties to the lower index."""
    k = min(k, docs.shape[0] if keep is None else int(keep.sum()))
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    for s in range(0, queries.shape[0], chunk):
        sims = queries[s:s + chunk] @ docs.T
        if keep is not None:
            sims[:, ~keep] = -np.inf
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        for i, row in enumerate(part):
            vals = sims[i, row]
            out[s + i] = row[np.lexsort((row, -vals))]
    return out


class Evaluator:
    """Every run of one collection over one set of evaluated queries."""

    def __init__(self, coll: Collection, encoder: RawEncoder | None = None) -> None:
        self.coll = coll
        self.index = NormIndex(encoder)
        self.index.add_vectors(coll.doc_vectors, coll.doc_counts, ids=coll.ids)
        norms = np.linalg.norm(coll.doc_vectors.astype(np.float64), axis=1)
        self._unit = (coll.doc_vectors / norms[:, None]).astype(np.float32)
        self._bm25: Any = None

    # ---- query helpers
    def _qmat(self, qids: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        return (np.stack([self.coll.query_vectors[q] for q in qids]).astype(np.float32),
                [self.coll.query_counts[q] for q in qids])

    def _unit_queries(self, qids: Sequence[str]) -> np.ndarray:
        q, _ = self._qmat(qids)
        return q / np.linalg.norm(q, axis=1, keepdims=True)

    def _search(self, qids: Sequence[str], k: int = RUN_DEPTH) -> Run:
        if not qids:
            return {}
        vecs, counts = self._qmat(qids)
        k = min(k, len(self.index))
        ids = self.index.search_arrays(list(vecs), k, query_token_counts=counts).ids  # only ids: no Hit objects
        return {q: _ranked(row, k) for q, row in zip(qids, ids)}

    # ---- baselines
    def cosine(self, qids: Sequence[str]) -> Run:
        """Plain cosine: the index with ``Weights()``, i.e. what any vector store returns."""
        self.index.set_weights(Weights())
        return self._search(qids)

    def rawdot(self, qids: Sequence[str]) -> Run:
        """``q_hat . d_raw``: the naive way to let the norm in (long, generic texts win)."""
        top = exact_topk(self._unit_queries(qids), self.coll.doc_vectors, RUN_DEPTH)
        return {q: _ranked([self.coll.ids[j] for j in row], top.shape[1]) for q, row in zip(qids, top)}

    def bm25(self, qids: Sequence[str]) -> Run:
        """BM25 from bm25s with its defaults (English stopwords, no stemmer)."""
        bm25s = require_bm25s()
        if self._bm25 is None:
            tokens = bm25s.tokenize(self.coll.texts, show_progress=False)
            self._bm25 = bm25s.BM25()
            self._bm25.index(tokens, show_progress=False)
        qtok = bm25s.tokenize([self.coll.queries[q] for q in qids], show_progress=False, return_ids=False)
        k = min(RUN_DEPTH, len(self.coll.ids))
        docs, scores = self._bm25.retrieve(qtok, k=k, show_progress=False, n_threads=1)
        run: Run = {}
        for q, row, srow in zip(qids, docs, scores):
            run[q] = _ranked([self.coll.ids[int(j)] for j, s in zip(row, srow) if s > 0], k)
        return run

    # ---- fitted normrank
    def _fit(self, train: Sequence[str], qrels: Qrels, fit_kwargs: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        kwargs = dict(fit_kwargs)
        depth = int(kwargs.pop("depth", FIT_DEPTH))
        vecs, counts = self._qmat(train)
        norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
        # Query calibration sees the training queries only, like the weights.
        self.index.calibrate_queries(norms=norms, token_counts=np.asarray(counts))
        cands = self.index.cosine_candidates(list(vecs), depth, query_token_counts=counts)
        report = fit_candidates(cands, list(train), {q: qrels[q] for q in train}, **kwargs)
        info = report.to_dict()
        info["weights"] = report.weights.to_dict()
        return report, info

    def normrank(self, protocol: Protocol, eval_qids: Sequence[str], fit_kwargs: Mapping[str, Any] | None = None,
                 *, forced: bool = False) -> tuple[Run, dict[str, Any]]:
        """The fitted blend on the evaluated queries, searched exactly under the fitted weights.

        ``forced`` applies the best training blend even where the never-harm test rejected it,
        to show what the blend would have done.
        """
        runs, fit = self.normrank_variants(protocol, eval_qids, fit_kwargs, ("forced",) if forced else ("fitted",))
        return runs["forced" if forced else "fitted"], fit

    def normrank_variants(self, protocol: Protocol, eval_qids: Sequence[str],
                          fit_kwargs: Mapping[str, Any] | None = None,
                          variants: Sequence[str] = ("fitted", "forced")) -> tuple[dict[str, Run], dict[str, Any]]:
        """One fit per fold (or one on the train split), searched as ``"fitted"`` (what the fit chose,
        usually plain cosine) and/or ``"forced"`` (the best blend on the training queries)."""
        fit_kwargs = dict(fit_kwargs or {})
        runs: dict[str, Run] = {v: {} for v in variants}
        if protocol.train_split:
            tq = self.coll.qrels[protocol.train_split]
            held = set(eval_qids)
            train = [q for q in has_relevant(tq) if q in self.coll.query_vectors and q not in held]
            if len(train) < 2:
                raise EmptyCorpusError(f"split {protocol.train_split!r} has {len(train)} usable training queries")
            splits = [(list(eval_qids), train)]
            qrels = tq
        else:
            qrels = self.coll.qrels[protocol.split]
            folds = int(protocol.folds or 5)
            if len(eval_qids) < folds:
                raise InvalidArgumentError(f"{len(eval_qids)} judged queries cannot be split into {folds} folds")
            smallest_train = len(eval_qids) - -(-len(eval_qids) // folds)
            if smallest_train < 2:  # the fit needs 2; its own error did not say the folds were why
                raise InvalidArgumentError(
                    f"{len(eval_qids)} judged queries in {folds} folds leave {smallest_train} query to fit a fold on, "
                    "and a fit needs at least 2: use more folds or label more queries")
            order = np.random.default_rng(protocol.seed).permutation(len(eval_qids))
            splits = []
            for f in range(folds):
                held_idx = set(order[f::folds].tolist())
                splits.append(([q for i, q in enumerate(eval_qids) if i in held_idx],
                               [q for i, q in enumerate(eval_qids) if i not in held_idx]))
        infos = []
        for i, (held, train) in enumerate(splits, 1):
            # progress of the slow part (`normrank eval` prints these lines unless --no-progress)
            logger.info("fitting %d/%d on %d queries, searching %d held-out queries", i, len(splits), len(train),
                        len(held))
            report, info = self._fit(train, qrels, fit_kwargs)
            for v in variants:
                weights = Weights(**report.best_candidate) if v == "forced" else report.weights
                info[f"applied_{v}"] = weights.to_dict()
                self.index.set_weights(weights)
                runs[v].update(self._search(held))
            info["applied"] = info[f"applied_{variants[0]}"]
            infos.append({"n_train_queries": len(train), "n_eval_queries": len(held), **info})
        self.index.set_weights(Weights())
        if protocol.train_split:
            fit = {"protocol": protocol.name, "train_split": protocol.train_split, **infos[0]}
        else:
            fit = {"protocol": protocol.name, "per_fold": [{"fold": i, **x} for i, x in enumerate(infos)],
                   "accepted_folds": sum(1 for x in infos if x["accepted"])}
        return runs, fit

    # ---- pruning
    def pruned_cosine(self, qids: Sequence[str], fraction: float) -> tuple[Run, int]:
        """Cosine after dropping the ``fraction`` of documents with the lowest calibrated feature."""
        recs = self.index.get(self.coll.ids)
        g = self.index.calibrator.transform(np.array([r.norm for r in recs]),
                                            np.array([r.token_count for r in recs]), "calibrated")
        n_drop = int(round(fraction * len(g)))
        keep = np.ones(len(g), dtype=bool)
        if n_drop:
            keep[np.argsort(g, kind="stable")[:n_drop]] = False
        top = exact_topk(self._unit_queries(qids), self._unit, RUN_DEPTH, keep)
        return {q: _ranked([self.coll.ids[j] for j in row], top.shape[1]) for q, row in zip(qids, top)}, n_drop


# ---------------------------------------------------------------- metrics
def scores(qrels: Qrels, run: Run, qids: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{metric: {qid: value}}`` over the evaluated queries (missing from the run = 0)."""
    sub = {q: qrels[q] for q in qids}
    full = {q: run.get(q, {}) for q in qids}
    return {m: per_query(sub, full, m) for m in METRICS}


def paired(a: Mapping[str, float], b: Mapping[str, float], tol: float = 1e-9) -> dict[str, Any]:
    """Two-sided paired t-test of ``a`` against ``b`` over queries: mean difference, p, the half-width
    of its 95% interval, and how many queries went up / down / stayed."""
    qids = sorted(b)
    x = np.array([a[q] for q in qids])
    y = np.array([b[q] for q in qids])
    d = x - y
    if len(qids) < 2 or np.allclose(d, 0.0, atol=tol):
        p, ci = 1.0, 0.0
    else:
        p = float(stats.ttest_rel(x, y).pvalue)
        p = 1.0 if not np.isfinite(p) else p
        ci = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return {"delta": float(d.mean()) if len(d) else 0.0, "p": p, "ci95": ci, "improved": int((d > tol).sum()),
            "worsened": int((d < -tol).sum()), "unchanged": int((np.abs(d) <= tol).sum())}


def eval_qids(coll: Collection, split: str) -> list[str]:
    """Judged queries of ``split`` that have text, in file order."""
    return [q for q in has_relevant(coll.qrels[split]) if q in coll.query_vectors]


# ---------------------------------------------------------------- the `normrank eval` result
def evaluate(path: str | os.PathLike[str], *, split: str | None = None, train_split: str | None = None,
             folds: int | None = None, seed: int = 0, encoder: RawEncoder | None = None,
             fit_kwargs: Mapping[str, Any] | None = None, show_progress: bool | None = None) -> dict[str, Any]:
    """Evaluate cosine, BM25, raw dot and fitted normrank on a BEIR folder; returns the ``--json`` object.

    Raises
    ------
    DatasetError
        The folder is not a BEIR folder or lacks the asked split.
    EmptyCorpusError
        Every document is empty, or there are too few judged queries to fit.
    """
    require_bm25s()  # before minutes of encoding, not after
    fit_kwargs = check_fit_kwargs(fit_kwargs or {}, depth=True)  # a misspelt option is named before any encoding
    protocol = choose_protocol(path, split, train_split, folds, seed)
    splits = [protocol.split] + ([protocol.train_split] if protocol.train_split else [])
    coll = load_collection(path, splits, encoder, show_progress=show_progress)
    qrels = coll.qrels[protocol.split]
    for s in splits:
        check_qrels(coll.qrels[s], coll.queries, set(coll.ids), missing_ok=coll.skipped)
    qids = eval_qids(coll, protocol.split)
    if not qids:
        raise EmptyCorpusError(f"split {protocol.split!r} has no judged query with a relevant document")
    logger.info("searching %d queries with cosine, BM25 and raw dot", len(qids))
    ev = Evaluator(coll, encoder)
    runs = {"cosine": ev.cosine(qids), "bm25": ev.bm25(qids), "rawdot": ev.rawdot(qids)}
    runs["normrank"], fit = ev.normrank(protocol, qids, fit_kwargs)
    per = {name: scores(qrels, run, qids) for name, run in runs.items()}
    out: dict[str, Any] = {
        "dataset": coll.name,
        "path": str(Path(path).resolve()),  # which folder of that name was read
        "n_queries": len(qids),
        "split": protocol.split,
        "protocol": protocol.name,
        "n_docs": len(coll.ids),
        "skipped_empty_docs": len(coll.skipped),
        "skipped_empty_queries": len(coll.skipped_queries),
        # judged, but no document graded above 0: nDCG and recall are not defined for them
        "queries_without_relevant": len(set(qrels) - set(has_relevant(qrels))),
        "model": ev.index.encoder.model_name,
        "runs": {name: {m: float(np.mean(list(v[m].values()))) for m in METRICS} for name, v in per.items()},
        "fit": fit,
        "significance": {},
    }
    for name in ("normrank", "bm25", "rawdot"):
        sig: dict[str, Any] = {}
        for m in METRICS:
            t = paired(per[name][m], per["cosine"][m])
            sig[f"p_{m}"] = t["p"]
            sig[f"delta_{m}"] = t["delta"]
            if m == "ndcg@10":
                sig.update(improved=t["improved"], worsened=t["worsened"], unchanged=t["unchanged"])
        out["significance"][f"{name}_vs_cosine"] = sig
    return _json_safe(out)


def _json_safe(x: Any) -> Any:
    """Plain Python types, with NaN/inf (e.g. a t-test on constant differences) as ``None``: strict JSON."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    return x


def _left_out(result: Mapping[str, Any]) -> str:
    """What the evaluation left out of the collection, for the report's first line."""
    return ((f", {result['skipped_empty_docs']} empty documents skipped" if result.get("skipped_empty_docs") else "")
            + (f", {result['skipped_empty_queries']} judged queries without text left out"
               if result.get("skipped_empty_queries") else "")
            + (f", {result['queries_without_relevant']} judged queries with no relevant document (all grades "
               "<= 0) left out" if result.get("queries_without_relevant") else ""))


def _read_from(result: Mapping[str, Any]) -> str:
    return f" (read from {result['path']})" if result.get("path") else ""


def format_report(result: Mapping[str, Any]) -> str:
    """The human-readable table ``normrank eval`` prints without ``--json``."""
    lines = [f"{result['dataset']}: {result['n_queries']} evaluated queries ({result['protocol']}), "
             f"{result['n_docs']} documents" + _left_out(result) + _read_from(result),
             "",
             f"  {'run':<10} {'nDCG@10':>8} {'R@100':>8} {'p(nDCG) vs cos':>15} {'up/down':>9}"]
    for name, m in result["runs"].items():
        sig = result["significance"].get(f"{name}_vs_cosine")
        extra = f"{sig['p_ndcg@10']:>15.3g} {sig['improved']:>4}/{sig['worsened']:<4}" if sig else f"{'':>15} {'':>9}"
        lines.append(f"  {name:<10} {m['ndcg@10']:>8.4f} {m['recall@100']:>8.4f} {extra}")
    fit = result["fit"]
    lines.append("")
    if "per_fold" in fit:
        lines.append(f"fit: {fit['accepted_folds']}/{len(fit['per_fold'])} folds accepted a norm blend")
        for f in fit["per_fold"]:
            lines.append(f"  fold {f['fold']}: {_weights_str(f['applied'])}: {f['reason']}")
    else:
        lines.append(f"fit on {fit['n_train_queries']} {fit['train_split']} queries: "
                     f"{_weights_str(fit['applied'])}: {fit['reason']}")
    nr = result["significance"]["normrank_vs_cosine"]
    verdict = ("normrank is significantly better than cosine" if nr["p_ndcg@10"] < 0.05 and nr["delta_ndcg@10"] > 0
               else "normrank is significantly WORSE than cosine" if nr["p_ndcg@10"] < 0.05
               else "no significant difference between normrank and cosine")
    lines.append(f"verdict: {verdict} (nDCG@10 {nr['delta_ndcg@10']:+.4f}, p={nr['p_ndcg@10']:.3g})")
    return "\n".join(lines)


# ---------------------------------------------------------------- several models side by side
def model_label(name: str) -> str:
    """A short name for a model path: the bundled model is ``all-MiniLM-L6-v2``, a folder its own name."""
    from normrank.encoders import default_model_path

    try:
        if Path(name).resolve() == default_model_path().resolve():
            return "all-MiniLM-L6-v2"
    except Exception:  # the bundled package missing is no reason to fail a label
        pass
    path = Path(name)
    return path.name if path.name not in ("", "model") else (path.parent.name or name)


def summary_row(result: Mapping[str, Any]) -> dict[str, Any]:
    """One model's line of the side-by-side table: nDCG@10 of each run, normrank's gain over cosine and p."""
    runs, sig = result["runs"], result["significance"]["normrank_vs_cosine"]
    fit = result["fit"]
    if "per_fold" in fit:
        accepted = f"{fit['accepted_folds']}/{len(fit['per_fold'])} folds"
    else:
        accepted = "accepted" if fit.get("accepted") else "kept cosine"
    return {"model": result.get("model_label") or model_label(str(result["model"])), "model_path": result["model"],
            "dim": result.get("dim"), "cosine": runs["cosine"]["ndcg@10"], "bm25": runs["bm25"]["ndcg@10"],
            "rawdot": runs["rawdot"]["ndcg@10"], "normrank": runs["normrank"]["ndcg@10"],
            "gain": sig["delta_ndcg@10"], "p": sig["p_ndcg@10"], "up": sig["improved"], "down": sig["worsened"],
            "fit": accepted, "p_rawdot": result["significance"]["rawdot_vs_cosine"]["p_ndcg@10"]}


def evaluate_models(path: str | os.PathLike[str], models: Sequence[str | os.PathLike[str] | RawEncoder | None],
                    **kwargs: Any) -> dict[str, Any]:
    """:func:`evaluate` once per model on the same queries and protocol; the ``--json`` object of
    ``normrank eval --model A --model B``: ``{"dataset", ..., "models": [per-model result], "summary": [rows]}``.

    ``None`` is the bundled all-MiniLM-L6-v2. Each model's encodings are cached under its own
    fingerprint, so a second run of the same comparison only fits and searches.

    Raises
    ------
    InvalidArgumentError
        No model, or the same model twice.
    """
    if not models:
        raise InvalidArgumentError("give at least one model")
    encoders = [m if isinstance(m, RawEncoder) else RawEncoder(m) for m in models]
    names = [str(Path(e.model_name).resolve()) if Path(e.model_name).exists() else e.model_name for e in encoders]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidArgumentError(f"the same model is given twice: {dupes[0]}")
    results = []
    for enc in encoders:
        res = evaluate(path, encoder=enc, **kwargs)
        res["model_label"] = model_label(enc.model_name)
        res["dim"] = int(enc.dim)
        results.append(res)
    return combine(results)


def combine(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-model results of one collection as the side-by-side object (see :func:`evaluate_models`)."""
    first = results[0]
    left_out = ("skipped_empty_docs", "skipped_empty_queries", "queries_without_relevant")
    return _json_safe({"dataset": first["dataset"], "path": first.get("path"), "n_queries": first["n_queries"],
                       "split": first["split"], "protocol": first["protocol"], "n_docs": first["n_docs"],
                       **{k: first.get(k, 0) for k in left_out}, "models": list(results),
                       "summary": [summary_row(r) for r in results]})


def format_models(result: Mapping[str, Any]) -> str:
    """The side-by-side table of :func:`evaluate_models`, then each model's fit and verdict."""
    lines = [f"{result['dataset']}: {result['n_queries']} evaluated queries ({result['protocol']}), "
             f"{result['n_docs']} documents{_left_out(result)}{_read_from(result)}; nDCG@10 per model",
             "",
             f"  {'model':<24} {'dim':>4} {'cosine':>7} {'BM25':>7} {'raw dot':>7} {'normrank':>8} {'gain':>8} "
             f"{'p':>7} {'up/down':>9}  fit"]
    for row in result["summary"]:
        lines.append(f"  {row['model'][:24]:<24} {row['dim'] or '':>4} {row['cosine']:>7.4f} {row['bm25']:>7.4f} "
                     f"{row['rawdot']:>7.4f} {row['normrank']:>8.4f} {row['gain']:>+8.4f} {row['p']:>7.3g} "
                     f"{row['up']:>4}/{row['down']:<4}  {row['fit']}")
    lines += ["", "gain and p: fitted normrank minus cosine, two-sided paired t-test over the evaluated queries "
              "(never used for fitting)."]
    for res in result["models"]:
        lines += ["", f"[{res.get('model_label') or model_label(str(res['model']))}] {res['model']}",
                  *format_report(res).splitlines()[2:]]
    return "\n".join(lines)


def plot_models(result: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """A PNG of :func:`evaluate_models`: nDCG@10 of cosine, BM25, raw dot and normrank per model.

    Raises
    ------
    MissingExtraError
        matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError("the --plot PNG needs matplotlib: pip install \"normrank[bench]\"") from exc
    rows = result["summary"]
    runs = (("cosine", "cosine", "#4c72b0"), ("bm25", "BM25", "#8c8c8c"), ("rawdot", "raw dot", "#dd8452"),
            ("normrank", "normrank (fitted)", "#55a868"))
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.9 * len(rows) + 2.0), 4.6))
    x = np.arange(len(rows))
    for i, (key, label, color) in enumerate(runs):
        vals = [r[key] for r in rows]
        ax.bar(x + (i - (len(runs) - 1) / 2) * width, vals, width, label=label, color=color)
    for xi, r in zip(x, rows):
        ax.annotate(f"gain {r['gain']:+.3f}\np={r['p']:.2g}", (xi + 1.5 * width, r["normrank"]),
                    xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks(x, [f"{r['model']}\n({r['dim']}-d)" if r.get("dim") else r["model"] for r in rows])
    ax.set_ylabel("nDCG@10")
    top = max(max(r[k] for k, _, _ in runs) for r in rows)
    ax.set_ylim(0, top * 1.18 + 0.02)  # room for the gain/p labels above the bars
    ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= 1.0])
    ax.set_title(f"{result['dataset']}: {result['n_queries']} queries, {result['protocol']}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(runs), frameon=False)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _weights_str(w: Mapping[str, Any]) -> str:
    if w["a"] == 0.0 and w["b"] == 0.0:
        return "plain cosine"
    if w["mode"] == "tiebreak":
        return f"tiebreak eps={w['epsilon']:g} sign={'+' if w['a'] > 0 else '-'} ({w['feature']})"
    return f"{w['mode']} a={w['a']:+g} b={w['b']:+g} ({w['feature']})"
