"""The ``normrank`` command: one parser, ``main(argv) -> int``, errors as one line on stderr."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from normrank._validation import is_blank_text
from normrank.errors import NormRankError

logger = logging.getLogger(__name__)


def cmd_demo(args: argparse.Namespace) -> int:
    """Fit the blend on the bundled judged queries (cross-validated), print the verdict, and show side by
    side where a blend moves a result and why; never a weight that ranks the demo queries worse."""
    from normrank.cache import cache_dir
    from normrank.datasets import demo_qrels, demo_rows
    from normrank.errors import InvalidArgumentError
    from normrank.scoring import Weights
    from normrank.store import NormIndex

    if args.k <= 0:
        raise InvalidArgumentError(f"k must be a positive integer, got {args.k}")
    docs = demo_rows("demo_corpus.jsonl")
    queries = {q["_id"]: q["text"] for q in demo_rows("demo_queries.jsonl")}
    qrels = demo_qrels()
    texts = [f"{d['title']}\n{d['text']}" for d in docs]
    index = NormIndex.from_texts(texts, ids=[d["_id"] for d in docs], metadatas=[{"title": d["title"]} for d in docs])
    out = Path(args.out) if args.out else cache_dir() / "demo-index"
    print(f"normrank demo: {len(index)} passages, {len(qrels)} judged queries, model {index.encoder.model_name}")

    report = index.fit(queries, qrels, folds=5)  # fits the query calibration too; applies what it chose
    index.save(out)
    index = NormIndex.load(out, encoder=index.encoder)
    print(f"fit: 5-fold cross-validation over the {report.n_queries} queries, one-sided paired t-test "
          f"against cosine (the saved index at {out} uses what it chose)")
    print(f"  nDCG@10 cosine {report.cosine_ndcg:.4f}; blend fitted without each query, on that query: "
          f"{report.cv_blend_ndcg:.4f} (gain {report.cv_gain:+.4f}, p={report.p_value:.3g})")
    if report.accepted:
        print(f"verdict: the norm blend helps here: {_blend_str(report.weights)}; {report.reason}")
    else:
        why = report.reason.removeprefix("kept plain cosine: ")
        print(f"verdict: plain cosine kept ({why}). normrank never adopts a blend that held-out "
              "queries do not confirm; on your data, measure with `normrank eval` or `normrank fit`.")

    qids = list(qrels)
    if args.a is not None or args.b is not None:
        shown = Weights(a=args.a or 0.0, b=args.b or 0.0)
        label = "your blend"
    elif report.accepted:
        shown, label = report.weights, "the fitted blend"
    else:
        shown, label = Weights(**report.best_candidate), "the best blend on all judged queries (not adopted)"
    vectors, counts = index.encoder.encode_with_counts([queries[q] for q in qids])
    cos_nd, blend_nd = _demo_ndcg(index, vectors, counts, qrels, qids, shown)
    print()
    if shown.is_cosine:
        print("no blend to show: " + ("the blend you gave is plain cosine (a = 0, b = 0)" if label == "your blend"
                                      else "plain cosine was also the best ranking on the judged queries"))
        return 0
    print(f"{label}: {_blend_str(shown)}: s = cos + w(q) * g(d), w(q) = a + b * g_q(q)")
    print(f"  nDCG@10 on the {len(qids)} judged queries: cosine {cos_nd.mean():.4f}, blend {blend_nd.mean():.4f} "
          f"({int((blend_nd > cos_nd + 1e-9).sum())} better, {int((blend_nd < cos_nd - 1e-9).sum())} worse"
          + (", measured on the queries it was chosen on" if label.startswith("the best") else "") + ")")
    if blend_nd.mean() < cos_nd.mean() - 1e-9:
        print("  warning: this blend ranks the judged demo queries WORSE than plain cosine")
    print("  g(d): the document's norm with its length effect removed (robust z-score, clipped at +-3); "
          "w(q) * g(d) is the norm term added to the cosine")
    print()
    if args.query:
        qv, qc = index.encoder.encode_with_counts(list(args.query))
        for q, v, c in zip(args.query, qv, qc):
            _demo_query(index, q, v, int(c), args.k, shown, None)
        return 0
    cos_top = _top_ids(index, vectors, counts, args.k, Weights())
    blend_top = _top_ids(index, vectors, counts, args.k, shown)
    changed = [i for i in range(len(qids)) if cos_top[i] != blend_top[i]]
    gain = blend_nd - cos_nd
    moved = sorted((i for i in changed if abs(gain[i]) > 1e-9), key=lambda i: -gain[i])
    print(f"the blend changes the top {args.k} of {len(changed)} of the {len(qids)} judged queries; "
          f"{len(moved)} of them change nDCG@10" + (":" if moved else ""))
    for i in moved[:MAX_DEMO_QUERIES]:
        _demo_query(index, queries[qids[i]], vectors[i], int(counts[i]), args.k, shown, (cos_nd[i], blend_nd[i]))
    if len(changed) > len(moved):
        print(f"in the other {len(changed) - len(moved)} queries the blend only reorders passages judged "
              "equally relevant (or not relevant); see them with --query \"...\"")
    return 0


#: Judged queries the demo prints side by side at most.
MAX_DEMO_QUERIES = 5


def _blend_str(w: Any) -> str:
    if w.is_cosine:
        return "plain cosine"
    if w.mode == "tiebreak":
        return f"tiebreak eps={w.epsilon:g} sign={'+' if w.a > 0 else '-'} ({w.feature} feature)"
    return f"{w.mode} a={w.a:+g} b={w.b:+g} ({w.feature} feature)"


def _demo_ndcg(index: Any, vectors: np.ndarray, counts: np.ndarray, qrels: dict[str, dict[str, int]],
               qids: list[str], shown: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-query nDCG@10 of plain cosine and of ``shown`` (exact, over every passage)."""
    from normrank.fitting import score_grid
    from normrank.scoring import Weights

    cands = index.cosine_candidates(list(vectors), len(index), query_token_counts=[int(c) for c in counts])
    m = score_grid(cands, qids, qrels, [Weights(), shown])
    return m[0], m[1]


def _top_ids(index: Any, vectors: np.ndarray, counts: np.ndarray, k: int, weights: Any) -> list[list[str]]:
    old = index.weights
    index.set_weights(weights)
    try:
        return index.search_arrays(list(vectors), k, query_token_counts=[int(c) for c in counts]).ids
    finally:
        index.set_weights(old)


def _demo_query(index: Any, query: str, vector: np.ndarray, count: int, k: int, shown: Any,
                nd: tuple[float, float] | None) -> None:
    """Cosine and blend rankings of one query side by side, and why each moved hit moved."""
    from normrank.scoring import Weights

    old = index.weights
    try:
        index.set_weights(Weights())
        everything = index.search(vector, len(index), query_token_count=count)
        index.set_weights(shown)
        hits = index.search(vector, k, query_token_count=count)
    finally:
        index.set_weights(old)
    cos_hits = everything[:k]
    cos_rank = {h.id: r for r, h in enumerate(everything, 1)}
    tail = f"   nDCG@10 cosine {nd[0]:.3f} -> blend {nd[1]:.3f}" if nd else ""
    print(f"query: {query}{tail}")
    print(f"  {'cosine ranking':<33} | {'blend ranking':<31} {'cosine':>6} {'g(d)':>6} {'w(q)':>7} "
          f"{'norm term':>9} {'score':>6}")
    for r, (c, h) in enumerate(zip(cos_hits, hits), 1):
        print(f"  {r} {c.id:<8} {c.cosine:6.3f} {c.metadata.get('title', '')[:15]:<15} | "
              f"{r} {h.id:<8} {h.metadata.get('title', '')[:20]:<20} {h.cosine:6.3f} {h.norm_feature:+6.2f} "
              f"{h.weight:+7.4f} {h.score - h.cosine:+9.4f} {h.score:6.3f}")
    for r, h in enumerate(hits, 1):
        was = cos_rank.get(h.id, 0)
        if was != r:
            print(f"  why: {h.id} {'rose' if was > r else 'fell'} from {was} to {r}: w(q) {h.weight:+.4f} x "
                  f"g(d) {h.norm_feature:+.2f} adds {h.score - h.cosine:+.4f} to its cosine {h.cosine:.3f}")
    print()


# ------------------------------------------------------------------ index
# Reading a source lives in normrank.sources (shared with normrank.distributed); re-exported here.
from normrank.sources import read_source  # noqa: E402,F401


def _start_ray(quiet: bool) -> Any:
    """Start (or join, with RAY_ADDRESS) Ray for ``index --ray``; returns the function that undoes it.

    ``quiet`` (no -v) keeps Ray's start-up, scheduler and per-dataset log lines off the terminal (Ray
    still writes them to its session logs); Ray's progress bars follow --no-progress.
    """
    from normrank.distributed import _ray, init_local_ray

    ray = _ray()  # imports ray.data, which configures the "ray.data" logger
    level = logging.ERROR if quiet else logging.INFO
    started = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or None
        if address is None:
            init_local_ray(logging_level=level)
        else:
            ray.init(address=address, log_to_driver=False, logging_level=level)
        started = True
    restore: list[tuple[logging.Handler, int]] = []
    if quiet:
        for name in ("ray", "ray.data"):
            for handler in logging.getLogger(name).handlers:
                if type(handler).__name__ != "SessionFileHandler":  # keep Ray's own log files complete
                    restore.append((handler, handler.level))
                    handler.setLevel(logging.ERROR)

    def stop() -> None:
        for handler, old in restore:
            handler.setLevel(old)
        if started:
            ray.shutdown()

    return stop


def _check_out_folder(out: str | Path) -> None:
    """Refuse an ``--out`` that ``save`` would refuse, before any minute of encoding is spent on it.

    Raises
    ------
    IndexFormatError
        ``out`` is a file, or a non-empty folder that normrank did not write.
    """
    from normrank import persistence
    from normrank.errors import IndexFormatError

    path = Path(out)
    if path.is_symlink() and not path.exists():
        raise IndexFormatError(f"--out {path} is a symbolic link to {os.readlink(path)!r}, which does not exist")
    if path.exists() and not path.is_dir():
        raise IndexFormatError(f"--out {path} exists and is not a folder")
    writable = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    if writable is not None and not os.access(writable, os.W_OK | os.X_OK):
        from normrank.errors import PersistenceError

        raise PersistenceError(errno.EACCES, f"--out {path}: {writable} is not writable, so the index could not "
                               "be saved there (checked before reading or encoding anything)")
    foreign = persistence.foreign_entries(path)  # the same rule as save(): normrank's marker, or only its files
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise IndexFormatError(f"--out {path} is a non-empty folder that is not a normrank index (it holds {shown}); "
                               "refusing to write into it: choose a new or empty folder")


def _chunk(args: argparse.Namespace, config: Any, encoder: Any, ids: list[str], texts: list[str],
           metas: list[dict]) -> tuple[list[str], list[str], list[dict]]:
    """Chunk the documents as --chunk-size/--chunk-overlap/--no-chunking/--chunk-rows and YAML `chunking:` say."""
    from normrank.chunking import chunk_documents
    from normrank.sources import source_kind

    c = config.chunking
    size = args.chunk_size if args.chunk_size is not None else c.size
    overlap = args.chunk_overlap if args.chunk_overlap is not None else c.overlap
    kind = source_kind(args.source)
    n_docs = len(ids)
    ids, texts, metas, truncated = chunk_documents(
        ids, texts, metas, encoder=encoder, kind=kind, enabled=c.enabled and not args.no_chunking, size=size,
        overlap=overlap, rows=c.rows or args.chunk_rows)
    if len(ids) != n_docs:
        print(f"chunked {n_docs} documents into {len(ids)} passages (ids path#n; metadata source, chunk, start, "
              "end); --no-chunking keeps one document per file", file=sys.stderr)
    if truncated:
        hint = ("--chunk-rows splits them (ids become id#n)" if kind == "rows"
                else "drop --no-chunking to split them" if args.no_chunking
                else "set chunking.enabled: true in the config to split them")
        print(f"note: {truncated} of {n_docs} documents are longer than the model's window of {encoder.max_tokens} "
              f"tokens and were truncated (only their beginning is embedded); {hint}", file=sys.stderr)
    return ids, texts, metas


def _blend_text(w: Any) -> str:
    return f"a={w.a:g}, b={w.b:g}" + ("" if w.mode == "additive" else f", mode {w.mode}") + (
        "" if w.feature == "calibrated" else f", feature {w.feature}")


def _show_progress(args: argparse.Namespace, config: Any) -> bool | None:
    """--no-progress, else the config's ``encoder.show_progress`` when it names one, else a bar."""
    if args.no_progress:
        return False
    return config.encoder.show_progress if "show_progress" in config.encoder.model_fields_set else True


def _note_other_store_path(args: argparse.Namespace, config: Any) -> None:
    if config.store.backend == "faiss" and config.store.path and \
            Path(str(config.store.path)).resolve() != Path(args.out).resolve():
        print(f"note: the index goes to --out {args.out}; the config's store.path ({config.store.path}) is neither "
              f"read nor written, and it is what `normrank search {args.config}` opens", file=sys.stderr)


def _saved_state_or_none(out: str) -> dict[str, Any] | None:
    """The settings saved at ``out`` (:func:`normrank.store.saved_state`), or ``None`` if none can be read."""
    from normrank.errors import NormRankError
    from normrank.store import saved_state

    try:
        return saved_state(out)
    except (FileNotFoundError, NormRankError):
        return None


def _carry_over_fit(out: str, config: Any, index: Any, state: dict[str, Any] | None = None) -> bool:
    """Keep the blend (and query calibration) ``normrank fit`` saved at ``out`` when ``index`` rebuilds it.

    Why: re-indexing a folder after adding a file replaced a fitted ``a=0.05`` with the defaults' plain
    cosine, without a word. As with a YAML's ``store.path`` (:func:`normrank.config._override_weights`),
    the ``scoring`` keys a config names win; an index encoded with another model keeps nothing, since
    its blend was fitted to other vectors.
    """
    from normrank.calibration import NormCalibrator
    from normrank.encoders import encoder_differences
    from normrank.errors import NormRankError
    from normrank.scoring import Weights

    state = _saved_state_or_none(out) if state is None else state
    if state is None:
        return False  # nothing saved there, or nothing readable: the new index replaces it as built
    try:
        weights = Weights.from_saved(state["weights"], f"the index at {out}")
        query_calibration = state.get("query_calibrator")
        qcal = NormCalibrator.from_dict(query_calibration) if query_calibration else None
    except (NormRankError, KeyError):
        return False
    if weights.is_cosine and qcal is None:
        return False
    if encoder_differences(state.get("encoder"), index.encoder):
        print(f"note: {out} held a blend fitted for another encoder ({_blend_text(weights)}); this index starts "
              "from the config's scoring: run `normrank fit` on it again", file=sys.stderr)
        return False
    given = {key: getattr(config.scoring, key) for key in config.scoring.model_fields_set}
    kept = weights.replace(**given)
    index.set_weights(kept)
    if qcal is not None and index.query_calibrator is None:
        index.query_calibrator = qcal
    named = f", with the config's {', '.join(sorted(given))}" if given else ""
    print(f"note: kept the blend fitted earlier in {out} ({_blend_text(kept)}{named}"
          f"{'; and its query calibration' if qcal is not None else ''}); run `normrank fit` again to refit it on "
          "these documents, or name scoring: keys in a config to replace it", file=sys.stderr)
    return True


def cmd_index(args: argparse.Namespace) -> int:
    """Encode a corpus with the raw encoder (cached) and save a NormIndex."""
    from normrank.cache import encode_cached
    from normrank.config import build_index, load_config

    if args.no_chunking and (args.chunk_size is not None or args.chunk_overlap is not None or args.chunk_rows):
        from normrank.errors import InvalidArgumentError

        raise InvalidArgumentError("--no-chunking cannot go with --chunk-size, --chunk-overlap or --chunk-rows "
                                   "(they were ignored); drop one or the other")
    _check_out_folder(args.out)  # before reading or encoding anything (also before starting Ray)
    if args.ray:  # encode on Ray Data (RAY_ADDRESS joins a cluster), Parquet beside the index
        from normrank.distributed import (
            check_encoded_folder,
            encoded_folder,
            index_with_ray,
        )

        check_encoded_folder(encoded_folder(args.out))  # before Ray starts
        ray_config = load_config(args.config)  # a bad setting is named before Ray starts
        chunk_flags = (args.chunk_size, args.chunk_overlap, args.no_chunking or None, args.chunk_rows or None)
        if args.model or args.backend or any(v is not None for v in chunk_flags):
            ray_config = ray_config.model_copy(deep=True)
            if args.model:
                ray_config.encoder.model = _model_arg(args.model)
            _set_backend(ray_config, args.backend)
            c = ray_config.chunking
            c.size = args.chunk_size if args.chunk_size is not None else c.size
            c.overlap = args.chunk_overlap if args.chunk_overlap is not None else c.overlap
            c.enabled = c.enabled and not args.no_chunking
            c.rows = c.rows or args.chunk_rows
        _note_other_store_path(args, ray_config)
        # read before Ray writes the folder anew: a fitted blend there is kept, as without --ray
        fitted = _saved_state_or_none(args.out) if ray_config.store.backend == "faiss" else None
        stop = _start_ray(quiet=not args.verbose)
        try:
            index = index_with_ray(args.source, args.out, config=ray_config, num_actors=args.ray_actors,
                                   show_progress=_show_progress(args, ray_config) is not False)
        finally:
            stop()
        if fitted is not None and _carry_over_fit(args.out, ray_config, index, fitted):
            index.save(args.out, if_unchanged=True)  # over the version Ray just saved, and nothing newer
        print(f"indexed {len(index)} documents with Ray into {args.out} (Parquet in {args.out}-encoded)")
        return 0
    config = load_config(args.config)  # a bad setting is named before the corpus is read
    _note_other_store_path(args, config)
    config.store.path = None  # --out is where this index goes; never load another one into it
    if args.model:
        config.encoder.model = _model_arg(args.model)
    _set_backend(config, args.backend)
    ids, texts, metas, skipped = read_source(args.source)
    if skipped:
        print(f"note: skipped {len(skipped)} empty document(s), e.g. {skipped[:3]}", file=sys.stderr)
    if not ids:
        from normrank.errors import EmptyCorpusError

        raise EmptyCorpusError(f"{args.source} holds no document with text")
    index = build_index(config)
    if config.store.backend == "faiss":
        # the version read first, then what it holds: a `normrank fit` (or another index run) that saves there
        # while this one encodes is not written over (it was, without a word: the fit was lost)
        from normrank.persistence import current_version

        seen = current_version(args.out) if Path(args.out).is_dir() else None
        _carry_over_fit(args.out, config, index)
    ids, texts, metas = _chunk(args, config, index.encoder, ids, texts, metas)
    vecs, counts = encode_cached(index.encoder, texts, show_progress=_show_progress(args, config))
    if config.store.backend == "pgvector" and len(index):
        # re-running the command (a nightly re-index) replaced nothing: DuplicateIdError, after encoding
        # everything. The source's documents are replaced in one transaction; the table's other rows (another
        # source's, an app's) are kept, since a table is shared where a folder is not
        index.upsert_vectors(vecs, counts, ids=ids, texts=texts, metadatas=metas)
        others = len(index) - len(ids)  # the ids are distinct: the rest is what the source does not name
        kept = (f"; kept {others} other(s) it holds (delete those with PgVectorNormIndex.delete)" if others > 0
                else "")
        print(f"note: table {config.store.table!r} held documents: replaced those of this source{kept}", file=sys.stderr)
    else:
        index.add_vectors(vecs, counts, ids=ids, texts=texts, metadatas=metas)
    if config.store.backend == "faiss":  # a pgvector index lives in its table
        from normrank.store import save_unless_changed

        save_unless_changed(index, args.out, seen, "this run encoded",
                            "run `normrank index` again to index into it (the encodings are cached)")
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    backend = getattr(index.encoder, "backend", "torch")
    # a pgvector index is its table: --out names nothing there (it said "into <out>", a folder never made)
    where = (f"the PostgreSQL table {config.store.table!r}" if config.store.backend == "pgvector" else args.out)
    print(f"indexed {len(index)} documents into {where} (model {index.encoder.model_name}"
          f"{'' if backend == 'torch' else f', backend {backend}'}, raw norms {norms.min():.3f}..{norms.max():.3f})")
    if config.store.backend == "pgvector":
        print(f"note: --out is not used with store.backend: pgvector; search the table with "
              f"`normrank search {args.config} QUERY`", file=sys.stderr)
    return 0


# ------------------------------------------------------------------ search
def _searched_index(args: argparse.Namespace) -> Any:
    """The index ``search`` reads: a saved folder, or the store a YAML file configures (the index saved
    at ``store.path``, or a pgvector table, which ``normrank index --config`` fills and has no folder)."""
    from normrank.config import build_index, load_config
    from normrank.errors import InvalidArgumentError
    from normrank.store import NormIndex

    path = Path(args.index)
    if not (path.is_file() and path.suffix.lower() in (".yaml", ".yml")):
        return NormIndex.load(path)
    config = load_config(path)
    if config.store.backend == "pgvector":
        if args.cosine or any(v is not None for v in (args.a, args.b, args.mode, args.feature)):
            raise InvalidArgumentError("--cosine/--a/--b/--mode/--feature would change the pgvector table's weights "
                                       "for every process that uses it; try blends on a saved folder")
        index = build_index(config)
        if len(index) == 0:
            from normrank.errors import EmptyCorpusError

            raise EmptyCorpusError(f"the pgvector table {config.store.table!r} ({path}) holds no document")
        return index
    if not config.store.path:
        raise InvalidArgumentError(f"{path} sets no store.path (a saved index) and no pgvector store to search")
    if not Path(str(config.store.path)).exists():
        return NormIndex.load(config.store.path)  # its named "no saved index" error
    return build_index(config)  # as every from_config opens it: the file's scoring and encoder: sections apply


def cmd_search(args: argparse.Namespace) -> int:
    """Search a saved index and explain every hit; ``--a/--b/--mode/--feature`` try a blend."""
    from normrank.encoders import check_texts
    from normrank.errors import InvalidArgumentError
    from normrank.scoring import Weights

    index = _searched_index(args)
    if args.cosine and any(v is not None for v in (args.a, args.b, args.mode, args.feature)):
        raise InvalidArgumentError("--cosine ranks by plain cosine; leave out --a/--b/--mode/--feature with it")
    if args.cosine:
        index.set_weights(Weights())
    elif any(v is not None for v in (args.a, args.b, args.mode, args.feature)):
        w = index.weights
        index.set_weights(w.replace(a=w.a if args.a is None else args.a, b=w.b if args.b is None else args.b,
                                    mode=args.mode or w.mode, feature=args.feature or w.feature))
        if index.weights.b != 0 and index.query_calibrator is None:
            raise InvalidArgumentError("--b needs a query calibration, which this index has not got yet: run "
                                       "`normrank fit` on labelled queries first, or use --a alone")
    k = min(args.k, len(index))
    if k == 0:  # a saved index whose documents were all deleted answers [], as the framework stores do
        print(f"note: the index at {args.index} holds no document (every one was deleted)", file=sys.stderr)
        check_texts([args.query])  # a query the search would refuse (blank, a lone surrogate) is still named
        hits = []
    elif args.group_by:
        hits = _hits_for_groups(index, args.query, args.group_by, k)
    else:
        hits = index.search(args.query, k)
    groups = _group(hits, args.group_by, k) if args.group_by else None
    if groups is not None:
        if hits and not any(args.group_by in h.metadata for h in hits):  # most likely a typo in the key
            keys = sorted({key for h in hits for key in h.metadata})
            print(f"note: no hit has the metadata key {args.group_by!r}, so each hit is its own group; keys the "
                  f"hits have: {', '.join(keys[:10]) or 'none'}", file=sys.stderr)
        hits = [h for _, members in groups for h in members]
    if args.json:
        out = {"query": args.query, "weights": index.weights.to_dict(), "hits": [h.to_dict() for h in hits]}
        if groups is not None:
            out["group_by"] = args.group_by
            out["groups"] = [{"key": key, "ids": [h.id for h in members]} for key, members in groups]
        print(json.dumps(out, ensure_ascii=False))
        return 0
    w = index.weights
    blend = "plain cosine" if w.is_cosine else f"{w.mode} blend, a={w.a:+g} b={w.b:+g}, feature {w.feature}"
    shown = f"{len(groups)} {args.group_by} groups" if groups is not None else f"{len(hits)} hits"
    query = args.query if len(args.query) <= 100 else args.query[:60] + "\u2026" + args.query[-30:]
    print(f"{shown} for {query!r} ({blend})")  # a pasted page of query is not repeated whole
    width = min(ID_WIDTH, max([2, *(len(_printable(h.id)) for h in hits)]))
    header = f"  {'#':>2} {'id':<{width}} {'score':>7} {'cosine':>7} {'g(d)':>6} {'w(q)':>7}  text"
    if groups is None:
        print(header)
        for r, h in enumerate(hits, 1):
            print(_hit_line(r, h, width))
        return 0
    rank = 0
    for key, members in groups:
        print(f"{args.group_by} {_printable(str(key))}  (best score {members[0].score:.4f}, {len(members)} "
              f"hit{'s' if len(members) > 1 else ''})")
        for h in members:
            rank += 1
            print(_hit_line(rank, h, width))
    return 0


#: Ids longer than this are shortened in the middle with an ellipsis (``--json`` has them whole).
ID_WIDTH = 48


def _printable(text: str) -> str:
    """``text`` with what a terminal would act on escaped (newline, tab, ESC sequences, bidi overrides):
    printed raw, an id or a metadata value with a newline broke the table, and ESC[2J cleared the screen."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _short_id(doc_id: str, width: int) -> str:
    """The id whole, or its start and its (more telling: file name, chunk number) end around an ellipsis.
    Control characters (a file name with a newline or tab) are shown escaped (:func:`_printable`)."""
    doc_id = _printable(doc_id)
    if len(doc_id) <= width:
        return doc_id
    head = (width - 1) // 3
    return doc_id[:head] + "\u2026" + doc_id[len(doc_id) - (width - 1 - head):]


def _hit_line(rank: int, h: Any, width: int) -> str:
    snippet = " ".join((h.text or h.metadata.get("title", "") or "").split())[:60]
    if not snippet.isprintable():  # ESC sequences, bidi overrides: dropped from a preview (the id is escaped)
        snippet = "".join(c for c in snippet if c.isprintable())
    return (f"  {rank:>2} {_short_id(h.id, width):<{width}} {h.score:7.4f} {h.cosine:7.4f} {h.norm_feature:+6.2f} "
            f"{h.weight:+7.4f}  {snippet}")


def _hits_for_groups(index: Any, query: str, key: str, k: int) -> list[Any]:
    """Hits deep enough that the best ``k`` groups are all in them: ``10 k`` first, four times deeper while
    fewer than ``k`` groups turned up, up to the whole index. Why: one source with more than ``10 k``
    chunks above the others filled a fixed depth, and ``-k 3 --group-by source`` showed one group where
    four files matched. The query is encoded once (its text checked as a search checks it), and every pass
    searches by its vector."""
    n = len(index)
    vectors, counts = index.encoder.encode_with_counts([query])
    depth = min(n, k * 10)
    while True:
        hits = index.search(vectors[0], depth, query_token_count=int(counts[0]))
        if depth >= n or len(_group(hits, key, k)) >= k:
            return hits
        depth = min(n, depth * 4)


def _group(hits: list[Any], key: str, k: int) -> list[tuple[str, list[Any]]]:
    """The hits grouped by ``metadata[key]`` (a hit without it is its own group), best group first:
    at most ``k`` groups of at most ``k`` hits each, so ``-k 3`` never prints a page per file."""
    groups: dict[str, list[Any]] = {}
    for h in hits:
        value = h.metadata.get(key)
        label = h.id if value is None else str(value)
        if label not in groups and len(groups) >= k:
            continue
        members = groups.setdefault(label, [])
        if len(members) < k:
            members.append(h)
    return list(groups.items())


# ------------------------------------------------------------------ fit
def cmd_fit(args: argparse.Namespace) -> int:
    """Fit the blend on labelled queries and save it into the index folder."""
    from normrank.config import load_config
    from normrank.datasets import read_queries
    from normrank.errors import DatasetError
    from normrank.evaluation import read_qrels
    from normrank.store import NormIndex

    index = NormIndex.load(args.index)
    qpath = Path(args.queries)
    if not qpath.is_file():
        raise DatasetError(f"no queries file {qpath}")
    queries = read_queries(qpath)
    qrels = read_qrels(args.qrels)
    known = set(index.ids())
    missing = sorted({d for docs in qrels.values() for d in docs if d not in known})
    if missing and not args.allow_missing_docs:
        from normrank.errors import UnknownIdError

        # a file chunked into passages is stored as path#0, path#1, ...: it is there, under other ids
        chunked = {i.rsplit("#", 1)[0] for i in known if "#" in i}
        split = [d for d in missing if d in chunked]
        if split:
            raise UnknownIdError(
                f"the qrels name {len(split)} document(s) that `normrank index` split into passages (ids "
                f"path#0, path#1, ...): {_few(split)}. The fit judges what the index returns, passages: judge "
                "passages in the qrels, or index without chunking (--no-chunking for files; rows are split only "
                "with --chunk-rows) so each document keeps its id; --allow-missing-docs would count them as relevant but unretrievable")
        raise UnknownIdError(
            f"the qrels name {len(missing)} document(s) that are not in the index: {_few(missing)}. `normrank "
            "index` skips documents with no text (it printed a note naming them), so a qrels entry for an empty "
            "document has nothing to retrieve; other ids may come from a different corpus. Pass "
            "--allow-missing-docs to count them as relevant but unretrievable (the fit then sees them as misses)")
    kwargs = {}
    if args.config:
        f = load_config(args.config).fit
        kwargs = dict(folds=f.folds, alpha=f.alpha, min_gain=f.min_gain, depth=f.depth, features=f.features,
                      modes=f.modes, seed=f.seed)
    empty = [q for q in qrels if q in queries and is_blank_text(queries[q])]
    if empty:
        raise DatasetError(f"{len(empty)} judged queries have empty text, e.g. {empty[:3]}")
    report = index.fit(queries, qrels, missing_ok=missing, **kwargs)
    index.save(args.index, if_unchanged=True)  # a re-index saved meanwhile stands: the fit is refused
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    w = report.weights
    chosen = "plain cosine" if w.is_cosine else f"{w.mode} a={w.a:+g} b={w.b:+g} feature {w.feature}"
    print(f"fitted on {report.n_queries} queries: {chosen}")
    print(f"  {report.reason}")
    print(f"  cross-validated nDCG@10: cosine {report.cosine_ndcg:.4f}, blend {report.cv_blend_ndcg:.4f}")
    print(f"saved the weights into {args.index}")
    return 0


def _few(ids: Sequence[str], n: int = 5) -> str:
    shown = ", ".join(repr(i[:60]) for i in ids[:n])
    return shown + (f" and {len(ids) - n} more" if len(ids) > n else "")


# ------------------------------------------------------------------ recalibrate
def cmd_recalibrate(args: argparse.Namespace) -> int:
    """Refit the length calibration on every document of a saved index and save it (what `analyze`
    advises when the calibrated feature still tracks length)."""
    from normrank.analysis import analyze_index
    from normrank.store import NormIndex

    index = NormIndex.load(args.index)
    before = analyze_index(index, top=1).spearman_feature_length
    index.recalibrate()
    index.save(args.index, if_unchanged=True)
    after = analyze_index(index, top=1).spearman_feature_length
    print(f"recalibrated {len(index)} documents in {args.index}: Spearman(calibrated feature, token count) "
          f"{before:+.3f} -> {after:+.3f}")
    return 0


# ------------------------------------------------------------------ eval
def _resolve_collection(name: str, data: str | None) -> str:
    """A BEIR folder as given, else the collection of that name under ``--data`` / ``$NORMRANK_DATA`` /
    ``../shared/data``; a folder that exists nowhere is passed on for the loader to name.

    A bare name (no ``/``) under a data folder the user named (``--data``, ``$NORMRANK_DATA``) is read from
    there even when the working folder has a folder of that name: ``--data`` was ignored then, and nothing
    said which of the two was read."""
    from normrank.datasets import DATA_ENV, default_data_dir

    root = Path(data) if data else default_data_dir()
    named = bool(data) or bool(os.environ.get(DATA_ENV))
    bare = "/" not in name and os.sep not in name and name not in (".", "..") and not name.startswith("~")
    if named and bare and root is not None and (root / name).is_dir():
        return str(root / name)
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if root is not None and (root / name).is_dir():
        return str(root / name)
    from normrank.errors import DatasetError

    where = ("--data" if data else f"${DATA_ENV}" if os.environ.get(DATA_ENV) else "../shared/data")
    looked = f"; not under {where} ({root}) either" if root is not None else (
        f"; no data folder to look in (--data, ${DATA_ENV} or ../shared/data)")
    raise DatasetError(f"no such folder: {name}{looked}")


def _set_backend(config: Any, backend: str | None) -> None:
    """``--backend`` over the config's ``encoder.backend``, refused by name where the config's device is a GPU."""
    if backend is None:
        return
    from pydantic import ValidationError

    from normrank.errors import ConfigError

    try:
        config.encoder.backend = backend
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(f"--backend {backend}: {msg}") from None


def _model_arg(model: str) -> str:
    """An existing --model folder as an absolute path (saved indexes record it); anything else as given."""
    return str(Path(model).expanduser().resolve()) if Path(model).expanduser().exists() else model


def cmd_eval(args: argparse.Namespace) -> int:
    """Cosine vs BM25 vs raw dot vs fitted normrank on a BEIR folder, evaluated queries never fitted."""
    from normrank.config import build_encoder, load_config
    from normrank.encoders import RawEncoder
    from normrank.evaluation import (
        combine,
        evaluate,
        evaluate_models,
        format_models,
        format_report,
        plot_models,
        require_bm25s,
    )

    require_bm25s()  # name the missing extra before loading any model
    kwargs = None
    config = load_config(args.config) if args.config else None
    if config is not None:
        f = config.fit
        kwargs = dict(folds=f.folds, alpha=f.alpha, min_gain=f.min_gain, depth=f.depth, features=f.features,
                      modes=f.modes, seed=f.seed)
    models = [_model_arg(m) for m in args.model] if args.model else [config.encoder.model if config else None]
    if config is not None:
        _set_backend(config, args.backend)
    encoders = []
    for m in models:  # --model replaces the config's model; the config's other encoder settings stay
        if config is not None:
            config.encoder.model = m
            encoders.append(build_encoder(config))
        else:
            encoders.append(RawEncoder(m, backend=args.backend or "torch"))
    opts = dict(split=args.split, train_split=args.train_split, folds=args.folds, seed=args.seed,
                fit_kwargs=kwargs, show_progress=not args.no_progress)
    path = _resolve_collection(args.beir_dir, args.data)
    if len(encoders) == 1:  # one model: the single-model report and JSON object, as before
        result = evaluate(path, encoder=encoders[0], **opts)
        print(json.dumps(result) if args.json else format_report(result))
        if args.plot:
            from normrank.evaluation import model_label

            result["model_label"], result["dim"] = model_label(encoders[0].model_name), encoders[0].dim
            plot_models(combine([result]), args.plot)
    else:
        result = evaluate_models(path, encoders, **opts)
        print(json.dumps(result) if args.json else format_models(result))
        if args.plot:
            plot_models(result, args.plot)
    if args.plot and not args.json:
        print(f"plot written to {args.plot}")
    return 0


# ------------------------------------------------------------------ analyze
def cmd_analyze(args: argparse.Namespace) -> int:
    """Norm diagnostics of a saved index."""
    from normrank.analysis import analyze_index, format_analysis, plot_analysis
    from normrank.store import NormIndex

    index = NormIndex.load(args.index)
    result = analyze_index(index, top=args.top)
    if args.plot:
        plot_analysis(index, args.plot)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(format_analysis(result))
        if args.plot:
            print(f"plot written to {args.plot}")
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="normrank", description="Norm-aware retrieval: cosine plus a "
                                     "calibrated, query-conditioned embedding-norm term.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log progress to stderr and show a traceback with an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="fit normrank on a bundled judged corpus and show what the blend changes",
                       description="Indexes 48 bundled passages, fits the blend on 40 judged queries with "
                       "cross-validation, prints the verdict (plain cosine kept, or the gain and its p-value) and "
                       "shows side by side where a blend moves a result and why. No data needed.")
    p.add_argument("--query", action="append", help="a query to show (repeatable); default: the judged queries "
                   "whose top k the blend changes")
    p.add_argument("-k", type=_positive_int, default=3, help="hits per query (default 3)")
    p.add_argument("--a", type=float, help="show this constant norm weight instead of the fitted blend")
    p.add_argument("--b", type=float, help="show this query-conditioned norm weight instead of the fitted blend")
    p.add_argument("--out", help="where to save the demo index (default: the user cache folder)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("index", help="encode a corpus and save a normrank index",
                       description="SOURCE is a BEIR folder (corpus.jsonl[.gz]), a .jsonl[.gz] file of "
                       "{_id, title, text} rows (other fields become metadata; in a .jsonl file a row without "
                       "_id or id is named by its line number), or a folder of .txt/.md files (linked folders "
                       "are followed). Empty documents are skipped with a note. Encodings are cached, so "
                       "re-indexing the same texts is fast; re-indexing into a fitted folder keeps its blend.")
    p.add_argument("source", help="BEIR folder, .jsonl[.gz] file, or folder of .txt/.md files")
    p.add_argument("--out", required=True, help="folder to save the index into")
    p.add_argument("--config", help="normrank.yaml (encoder, store and scoring settings)")
    p.add_argument("--model", metavar="PATH", help="local sentence-transformers folder to encode with "
                   "(overrides the config's encoder.model; default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--backend", choices=("torch", "onnx", "onnx-int8"),
                   help="encoder backend (overrides the config's encoder.backend): onnx = torch's vectors on ONNX "
                   "Runtime, onnx-int8 = about 2.3x faster, norms move up to ~8%%; needs normrank[onnx]")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--ray", action="store_true", help="encode on Ray Data with a pool of encoder actors "
                   "(pip install 'normrank[ray]'; RAY_ADDRESS joins a cluster)")
    p.add_argument("--ray-actors", type=_positive_int, default=2, help="encoder actors with --ray (default 2)")
    g = p.add_argument_group("chunking", "Files longer than the model's window are split into passages (ids "
                             "path#n; metadata source, chunk, start, end), at paragraph and sentence boundaries "
                             "where possible. YAML: the `chunking:` section.")
    g.add_argument("--chunk-size", type=_positive_int, metavar="TOKENS", help="tokens per chunk in the model's own "
                   "tokenizer (default: the window minus special tokens, 254 for MiniLM)")
    g.add_argument("--chunk-overlap", type=_non_negative_int, metavar="TOKENS",
                   help="tokens shared by neighbouring chunks (default: 15%% of the chunk size)")
    g.add_argument("--no-chunking", action="store_true", help="one document per file (longer ones are truncated)")
    g.add_argument("--chunk-rows", action="store_true", help="also chunk the rows of a BEIR folder or .jsonl file "
                   "(their ids become id#n, which qrels do not name; start/end index the row's title and text "
                   "joined by a newline, as embedded)")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("search", help="search a saved index; every hit with its explanation")
    p.add_argument("index", metavar="DIR", help="a folder written by `normrank index`, or a normrank.yaml whose "
                   "store it opens (the index at store.path, or a pgvector table)")
    p.add_argument("query", help="the query text")
    p.add_argument("-k", type=_positive_int, default=10, help="number of hits (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--cosine", action="store_true", help="rank by plain cosine (ignore the saved blend)")
    p.add_argument("--a", type=float, help="try this constant norm weight instead of the saved one")
    p.add_argument("--b", type=float, help="try this query-conditioned norm weight (needs a fitted index)")
    p.add_argument("--mode", choices=("additive", "multiplicative", "tiebreak"), help="try this scoring mode")
    p.add_argument("--feature", choices=("calibrated", "raw"), help="try this norm feature")
    p.add_argument("--group-by", metavar="KEY", help="group hits by a metadata key and show the best k groups, "
                   "e.g. --group-by source for chunked files (the file each chunk came from)")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("fit", help="fit the norm blend on labelled queries and save it into the index",
                       description="Fits (a, b), the feature and the mode on labelled queries with "
                       "cross-validation; plain cosine is kept unless a gain survives a paired test.")
    p.add_argument("index", metavar="DIR", help="a folder written by `normrank index`")
    p.add_argument("--queries", required=True, help="queries.jsonl[.gz] with _id and text")
    p.add_argument("--qrels", required=True, help="qrels TSV: query-id, corpus-id, score (BEIR layout)")
    p.add_argument("--config", help="normrank.yaml whose `fit` section sets folds, alpha, min_gain, depth, features, modes and seed")
    p.add_argument("--allow-missing-docs", action="store_true",
                   help="keep qrels documents absent from the index (e.g. skipped empty ones) as unretrievable")
    p.add_argument("--json", action="store_true", help="print the fit report as JSON")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("eval", help="do norms help on this collection? cosine, BM25, raw dot, fitted normrank",
                       description="Encodes a BEIR folder (cached), fits normrank on the train split or by "
                       "k-fold cross-validation (default: train->test when qrels/train.tsv exists, else "
                       "5-fold CV), and reports nDCG@10 and Recall@100 on the evaluated queries, which "
                       "are never used for fitting, with a paired t-test against cosine.")
    p.add_argument("beir_dir", metavar="BEIR_DIR", help="folder with corpus.jsonl[.gz], queries.jsonl, qrels/")
    p.add_argument("--split", help="qrels split to evaluate (default: test, or the only split the folder has)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--train-split", help="fit on this qrels split")
    g.add_argument("--folds", type=_positive_int, help="fit by k-fold cross-validation on the evaluated split")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment (default 0)")
    p.add_argument("--data", help="folder of BEIR collections in which to look up BEIR_DIR by name "
                   "(default: $NORMRANK_DATA, else ../shared/data when present)")
    p.add_argument("--config", help="normrank.yaml (encoder model and `fit` settings)")
    p.add_argument("--model", action="append", metavar="PATH",
                   help="a local sentence-transformers folder to evaluate (repeatable: several models give one "
                   "side-by-side report; default: the config's model, else the bundled all-MiniLM-L6-v2)")
    p.add_argument("--backend", choices=("torch", "onnx", "onnx-int8"),
                   help="encoder backend (overrides the config's encoder.backend): onnx = torch's vectors on ONNX "
                   "Runtime, onnx-int8 = about 2.3x faster, norms move up to ~8%%; needs normrank[onnx]")
    p.add_argument("--plot", metavar="IMAGE", type=_plot_path,
                   help="also write a bar chart of nDCG@10 per model and run here (.png, .svg, .pdf, ...; replaced if "
                   "it exists)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("analyze", help="norm diagnostics of a saved index",
                       description="Norm distribution, Spearman correlation with length before and after "
                       "calibration, the most and least specific documents, and a warning when the norm "
                       "carries no usable signal.")
    p.add_argument("index", metavar="DIR", help="a folder written by `normrank index`")
    p.add_argument("--plot", metavar="IMAGE", type=_plot_path,
                   help="write a chart of the distributions here (.png, .svg, .pdf, ...; replaced if it exists)")
    p.add_argument("--top", type=_positive_int, default=5, help="documents to list at each end (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("recalibrate", help="refit the length calibration on every document and save",
                       description="Refits the norm-vs-length curve on all documents of a saved index (for "
                       "example after documents were added through the Python API) and saves the index.")
    p.add_argument("index", metavar="DIR", help="a folder written by `normrank index`")
    p.set_defaults(func=cmd_recalibrate)
    # -v after the command too (`normrank search idx q -v` was "unrecognized arguments"); SUPPRESS keeps a
    # -v given before the command when none follows it
    for command in sub.choices.values():
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="log progress and show a traceback with an error (also before the command)")
    return parser


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


#: The file types ``--plot`` writes (matplotlib's, chosen by the suffix).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def _plot_suffixes() -> tuple[str, ...]:
    """What the installed matplotlib writes (its list), else :data:`PLOT_SUFFIXES`."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase

        return tuple(f".{k}" for k in FigureCanvasBase.get_supported_filetypes())
    except ImportError:
        return PLOT_SUFFIXES


def _plot_path(text: str) -> str:
    """A ``--plot`` file: an image file name matplotlib writes, in a folder that exists, checked before any
    work (``--plot report.txt`` failed with matplotlib's "Format 'txt' is not supported" after the whole
    evaluation ran)."""
    path = Path(text).expanduser()
    suffixes = _plot_suffixes()
    if path.suffix.lower() not in suffixes:
        raise argparse.ArgumentTypeError(f"{text!r} is not an image file name; end it with one of "
                                         f"{', '.join(suffixes)}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder for {text!r}: {path.parent}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder")
    return str(path)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the command and the way to its help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


#: Arguments that name files or folders: a leading ``~`` is the home folder, once, here. Why: ``save`` reads
#: ``~`` so, and ``--out '~/idx'`` (quoted, from a Makefile or a subprocess) then saved into ``$HOME/idx`` while
#: the run's own checks looked at ``./~/idx``: every re-index failed with ConcurrentUpdateError.
PATH_ARGS = ("out", "source", "index", "queries", "qrels", "beir_dir", "data", "config")


def _expand_home(args: argparse.Namespace) -> None:
    for name in PATH_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.startswith("~"):
            with contextlib.suppress(RuntimeError):  # "~nosuchuser": left as given, and named where it is used
                setattr(args, name, os.path.expanduser(value))
    models = getattr(args, "model", None)
    if isinstance(models, list):
        args.model = [os.path.expanduser(m) if isinstance(m, str) else m for m in models]
    elif isinstance(models, str):
        args.model = os.path.expanduser(models)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``normrank`` command; returns the exit code (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return it, so callers get an int
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    _expand_home(args)
    # The model-loading bar of transformers is noise on a command line; encoding bars stay.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    progress = _progress_lines(args)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `normrank search ... | head -1`: the reader has what it wanted; stop quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0
    except KeyboardInterrupt:
        print(f"normrank {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure is one line; -v adds the traceback
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"normrank {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        if progress is not None:
            log = logging.getLogger("normrank.evaluation")
            log.removeHandler(progress[0])
            log.setLevel(progress[1])


def _progress_lines(args: argparse.Namespace) -> tuple[logging.Handler, int] | None:
    """``eval`` reports its stages (searching, each fold's fit) on stderr after the encoding bar, unless
    ``--no-progress``; with -v every log line shows anyway."""
    if args.command != "eval" or getattr(args, "no_progress", True) or args.verbose:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("normrank eval: %(message)s"))
    handler.setLevel(logging.INFO)
    log = logging.getLogger("normrank.evaluation")
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler, old_level


#: Longest error message printed (an error must never echo an unbounded input).
MAX_ERROR_CHARS = 600


def _one_line(exc: BaseException) -> str:
    """The error as one bounded line; raw (unexpected) errors also name their type and the -v flag."""
    if isinstance(exc, ImportError) and getattr(exc, "name", None) in _EXTRAS:
        text = f"{exc.name} is not installed: pip install \"normrank[{_EXTRAS[exc.name]}]\""
    elif isinstance(exc, UnicodeDecodeError):
        text = f"input is not UTF-8 text ({exc.reason} at byte {exc.start})"
    elif isinstance(exc, OSError) and not isinstance(exc, NormRankError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
        if not isinstance(exc, (NormRankError, ImportError, FileNotFoundError)):  # a mistyped path is expected
            text = f"{type(exc).__name__}: {text} (unexpected; rerun with -v for the traceback)"
    text = " ".join(text.split())
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS - 30] + f"... [{len(text) - MAX_ERROR_CHARS + 30} more characters]"
    return text


#: Optional dependencies the CLI may miss, and the extra that installs each.
_EXTRAS = {"pytrec_eval": "eval", "bm25s": "eval", "ray": "ray", "matplotlib": "bench", "psycopg": "pgvector",
           "pgvector": "pgvector"}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
