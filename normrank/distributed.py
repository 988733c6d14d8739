"""Encode a corpus on Ray Data, for corpora that outgrow one process.

Ray Data streams the texts through ``map_batches`` with a pool of actors, each holding
one :class:`normrank.RawEncoder` (the model loads once per actor, not per batch). Each
actor returns the raw vectors, their norms and the token counts; the workers write
Parquet in parallel. The result is a folder any backend loads::

    parts/*.parquet  one row per document: row, id, text, metadata (JSON text),
                     vector (fixed_size_list<float32>[dim], raw), norm (float64), token_count (int32)
    normrank.json    count, dim, encoder settings and the fitted document calibration

The calibration is a function of the (raw norm, token count) pairs alone, so it is fitted
from :class:`NormStats`: the per-batch pairs, merged (12 bytes a document, read back from
the Parquet columns, never the vectors) and fitted exactly as the single-process path
fits them. The ranking is therefore the one ``NormIndex.from_texts`` gives on the same
corpus.

On a cluster nothing in this module changes: pass ``ray_address`` (or set ``RAY_ADDRESS``)
and an ``out`` folder every worker can write (a shared filesystem; cloud URIs are not
handled here).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from normrank.calibration import NormCalibrator
from normrank.encoders import (
    MODEL_ON_EVERY_NODE,
    RawEncoder,
    check_texts,
    encoder_from_settings,
)
from normrank.errors import (
    DuplicateIdError,
    EmptyCorpusError,
    IndexFormatError,
    InvalidArgumentError,
    ModelLoadError,
)
from normrank.index_base import _as_metadatas, _check_ids
from normrank.persistence import current_version

logger = logging.getLogger(__name__)

META_FILE = "normrank.json"
PARTS = "parts"
FORMAT_VERSION = 1
_INSTALL_HINT = "pip install 'normrank[ray]'"


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise ImportError(f"distributed encoding needs Ray Data: {_INSTALL_HINT}") from exc
    return ray


def init_local_ray(num_cpus: int = 2, **kwargs: Any) -> None:
    """Start a private single-machine Ray whose listeners all stay on 127.0.0.1 (tests, laptops).

    No dashboard, no usage statistics. A no-op when Ray is already initialised.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = _ray()
    if ray.is_initialized():
        return
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             **kwargs)


# ---------------------------------------------------------------- mergeable statistics
@dataclass
class NormStats:
    """What the document calibration needs: (raw norm, token count) pairs, merged across batches.

    Merging is concatenation, so the fit on merged statistics is exactly the fit on the
    whole corpus (the calibrator uses quantiles and medians, which do not merge in less).
    """

    norms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    token_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def merge(self, *others: NormStats) -> NormStats:
        parts = (self, *others)
        return NormStats(np.concatenate([p.norms for p in parts]).astype(np.float64),
                         np.concatenate([p.token_counts for p in parts]).astype(np.int64))

    def __len__(self) -> int:
        return int(self.norms.size)

    def fit(self, max_bins: int = 12, min_per_bin: int = 20) -> NormCalibrator:
        if not len(self):
            raise EmptyCorpusError("no documents to calibrate on")
        return NormCalibrator(max_bins, min_per_bin).fit(self.norms, self.token_counts)


# ---------------------------------------------------------------- the actor
class _EncodeBatch:
    """A Ray Data actor: one RawEncoder per actor, a batch of texts in, an Arrow table out."""

    def __init__(self, settings: Mapping[str, Any], threads: int | None) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.encoder = encoder_from_settings(settings, show_progress=False, what="the corpus", fallback=False)

    def __call__(self, batch: Mapping[str, np.ndarray]) -> Any:
        import pyarrow as pa

        texts = [str(t) for t in batch["text"]]
        vecs, counts = self.encoder.encode_with_counts(texts)
        vecs = np.ascontiguousarray(vecs, dtype=np.float32)
        return pa.table({
            "row": pa.array(np.asarray(batch["row"], dtype=np.int64)),
            "id": pa.array([str(x) for x in batch["id"]], pa.string()),
            "text": pa.array(texts, pa.string()),
            "metadata": pa.array([str(x) for x in batch["metadata"]], pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), vecs.shape[1]),
            "norm": pa.array(np.linalg.norm(vecs.astype(np.float64), axis=1)),
            "token_count": pa.array(np.asarray(counts, dtype=np.int32)),
        })


# ---------------------------------------------------------------- the encoded folder
@dataclass(frozen=True)
class EncodedBatch:
    ids: list[str]
    texts: list[str]
    metadatas: list[dict[str, Any]]
    vectors: np.ndarray
    token_counts: np.ndarray


@dataclass(frozen=True)
class EncodedCorpus:
    """A folder written by :func:`encode_corpus`: Parquet parts plus ``normrank.json``."""

    path: Path
    count: int
    dim: int
    calibrator: NormCalibrator
    encoder: dict[str, Any]

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> EncodedCorpus:
        """Open an encoded folder, checking that its parts hold the rows its metadata counts."""
        import pyarrow.parquet as pq

        path = Path(path)
        meta_path = path / META_FILE
        if not meta_path.is_file():
            raise IndexFormatError(f"{path} has no {META_FILE}: it is not a folder written by encode_corpus")
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("format_version", 0) > FORMAT_VERSION:
                raise IndexFormatError(f"{meta_path} has format {meta['format_version']}, newer than this "
                                       f"normrank reads ({FORMAT_VERSION}); upgrade normrank")
            corpus = cls(path, int(meta["count"]), int(meta["dim"]), NormCalibrator.from_dict(meta["calibrator"]),
                         dict(meta["encoder"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{meta_path} could not be read: {exc!r}") from exc
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in corpus._files())
        if rows != corpus.count:
            raise IndexFormatError(f"{path} is incomplete: its parts hold {rows} rows, {META_FILE} says {corpus.count}")
        return corpus

    def _files(self) -> list[Path]:
        return sorted((self.path / PARTS).glob("*.parquet"))

    def _ordered_tables(self) -> Iterator[Any]:
        """Arrow tables in original row order: file by file when their row ranges do not overlap."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        spans = []
        for f in self._files():
            rows = pq.read_table(f, columns=["row"])["row"]
            if len(rows):
                spans.append((pc.min(rows).as_py(), pc.max(rows).as_py(), f))
        spans.sort()
        disjoint = all(a[1] < b[0] for a, b in itertools.pairwise(spans))
        if disjoint:
            for _, _, f in spans:
                yield pq.read_table(f).sort_by("row")
        else:
            import pyarrow as pa

            yield pa.concat_tables([pq.read_table(f) for _, _, f in spans]).sort_by("row")

    def stats(self) -> NormStats:
        """The (norm, token count) pairs of every document, in row order (two Parquet columns only)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.concat_tables([pq.read_table(f, columns=["row", "norm", "token_count"])
                                  for f in self._files()]).sort_by("row")
        return NormStats(table["norm"].to_numpy(), table["token_count"].to_numpy().astype(np.int64))

    def iter_batches(self, rows: int = 16384) -> Iterator[EncodedBatch]:
        """The documents in their original order, ``rows`` at a time."""
        if rows <= 0:
            raise InvalidArgumentError(f"rows must be positive, got {rows}")
        for table in self._ordered_tables():
            for start in range(0, table.num_rows, rows):
                t = table.slice(start, rows)
                flat = t["vector"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
                yield EncodedBatch(
                    ids=t["id"].to_pylist(), texts=t["text"].to_pylist(),
                    metadatas=[json.loads(m) for m in t["metadata"].to_pylist()],
                    vectors=np.ascontiguousarray(flat.reshape(t.num_rows, self.dim), dtype=np.float32),
                    token_counts=t["token_count"].to_numpy().astype(np.int64),
                )

    def into(self, index: Any, *, rows: int = 16384) -> Any:
        """Add every document to ``index`` (a ``NormIndex`` or ``PgVectorNormIndex``); returns it.

        An empty index takes this corpus's calibration, so it ranks exactly as an index built
        from the same texts in one process. A pgvector HNSW index is built once, after the load.
        """
        from normrank.pgvector_store import PgVectorNormIndex

        if len(index) == 0:
            # fitted on exactly what comes next: what was deleted before (an index emptied by deletes, a
            # LlamaIndex clear()) is no reason to refit it (needs_recalibration); it refitted four times
            index._take_corpus_calibration(NormCalibrator.from_dict(self.calibrator.to_dict()))
        deferred = isinstance(index, PgVectorNormIndex) and len(index) == 0 and index.index_type == "hnsw"
        if deferred:
            index.set_index_type("flat")
        for b in self.iter_batches(rows):
            index.add_vectors(b.vectors, b.token_counts, ids=b.ids, texts=b.texts, metadatas=b.metadatas)
        if deferred:
            index.set_index_type("hnsw")
        return index

    def to_index(self, backend: str = "faiss", *, encoder: RawEncoder | None = None, **kwargs: Any) -> Any:
        """A new index of ``backend`` (``"faiss"`` or ``"pgvector"``) holding this corpus.

        ``kwargs`` go to the index (``weights``, ``index_type``; ``dsn`` and ``table`` for pgvector).
        """
        enc = encoder or _encoder_from(self.encoder)
        if backend == "faiss":
            from normrank.store import NormIndex

            index: Any = NormIndex(enc, dim=self.dim, **kwargs)
        elif backend == "pgvector":
            from normrank.pgvector_store import PgVectorNormIndex

            index = PgVectorNormIndex(kwargs.pop("dsn", None), kwargs.pop("table", "normrank_docs"), enc,
                                      dim=self.dim, **kwargs)
        else:
            raise InvalidArgumentError(f"unknown backend {backend!r}; choose 'faiss' or 'pgvector'")
        return self.into(index)


def _looks_like_folder(model: str) -> bool:
    """A model named by a filesystem path (absolute or relative), not a hub name."""
    return Path(model).is_absolute() or model.startswith((".", "~"))


def _encoder_from(settings: Mapping[str, Any]) -> RawEncoder:
    return encoder_from_settings(settings, what="the corpus")


# ---------------------------------------------------------------- encoding
def encode_corpus(
    texts: Sequence[str],
    ids: Sequence[str] | None = None,
    metadatas: Sequence[Mapping[str, Any]] | None = None,
    *,
    out: str | os.PathLike[str],
    encoder: RawEncoder | None = None,
    num_actors: int = 2,
    cpus_per_actor: float = 1.0,
    threads_per_actor: int | None = 1,
    block_rows: int | None = None,
    ray_address: str | None = None,
    max_bins: int = 12,
    min_per_bin: int = 20,
    show_progress: bool = False,
) -> EncodedCorpus:
    """Encode ``texts`` on Ray Data and write an :class:`EncodedCorpus` folder at ``out``.

    Parameters
    ----------
    encoder:
        Its settings (model folder, batch size, device, max_seq_length) are what each actor
        loads; ``None`` = the bundled MiniLM. The model folder must exist on every node.
    num_actors, cpus_per_actor, threads_per_actor:
        The actor pool: ``num_actors`` encoders, each reserving ``cpus_per_actor`` Ray CPUs
        and running torch on ``threads_per_actor`` threads (``None`` leaves torch's default).
    block_rows:
        Rows per input block (default: enough blocks to keep every actor busy, at most 4,096).
    ray_address:
        An existing cluster (``"auto"``, ``"ray://head:10001"``); ``None`` reads ``$RAY_ADDRESS``,
        else joins the Ray already initialised in this process, else starts a private
        loopback-only one and stops it after.
    max_bins, min_per_bin:
        The document calibration's settings (as in ``calibration:`` of the YAML).
    show_progress:
        Ray Data's progress bars (or progress log lines where stdout is not a terminal).

    Raises
    ------
    EmptyTextError, InvalidArgumentError, DuplicateIdError
        Before any work starts: a blank text, a non-JSON metadata, a repeated id, a non-empty ``out``.
    """
    import pyarrow as pa

    items = check_texts(texts)
    if not items:
        raise EmptyCorpusError("no texts given")
    n = len(items)
    id_list = _check_ids(ids) if ids is not None else [str(i) for i in range(n)]
    if len(id_list) != n:
        raise InvalidArgumentError(f"{len(id_list)} ids for {n} texts")
    if len(set(id_list)) != n:
        dup = next(x for i, x in enumerate(id_list) if x in id_list[:i])
        raise DuplicateIdError(f"id {dup!r} is given twice")
    metas = _as_metadatas(metadatas, n)
    if num_actors < 1:
        raise InvalidArgumentError(f"num_actors must be >= 1, got {num_actors}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgumentError(f"{out} exists and is not an empty folder; choose a new output folder")
    enc = encoder or RawEncoder()
    settings = {**enc.describe(), "model": enc.model_name}
    if _looks_like_folder(enc.model_name) and not Path(enc.model_name).exists():  # this node first: no Ray needed
        raise ModelLoadError(f"the model folder {enc.model_name!r} is not on this machine; it {MODEL_ON_EVERY_NODE}")

    ray = _ray()
    started = False
    ray_address = ray_address or os.environ.get("RAY_ADDRESS") or None
    if not ray.is_initialized():
        if ray_address is None:
            init_local_ray()
        else:
            ray.init(address=ray_address, log_to_driver=False)
        started = True
    try:
        ray.data.DataContext.get_current().enable_progress_bars = show_progress
        block = block_rows or max(1, min(4096, -(-n // (4 * num_actors))))
        table = pa.table({"row": pa.array(np.arange(n, dtype=np.int64)), "id": pa.array(id_list, pa.string()),
                          "text": pa.array(items, pa.string()),
                          "metadata": pa.array([json.dumps(m, ensure_ascii=False) for m in metas], pa.string())})
        ds = ray.data.from_arrow([table.slice(s, block) for s in range(0, n, block)])
        ds = ds.map_batches(
            _EncodeBatch, fn_constructor_kwargs={"settings": settings, "threads": threads_per_actor},
            compute=ray.data.ActorPoolStrategy(size=num_actors), num_cpus=cpus_per_actor,
            batch_size=block, batch_format="numpy", udf_modifying_row_count=False,
        )
        out.mkdir(parents=True, exist_ok=True)
        try:
            ds.write_parquet(str(out / PARTS))
        except ray.exceptions.RayError as exc:  # an actor that could not load the model: say so by name
            if MODEL_ON_EVERY_NODE in str(exc):
                raise ModelLoadError(f"an encoder actor could not load the model folder {enc.model_name!r}: it "
                                     f"{MODEL_ON_EVERY_NODE}") from exc
            raise
    finally:
        if started:
            ray.shutdown()
    return _finish(out, n, settings, max_bins, min_per_bin)


def _finish(out: Path, n: int, settings: Mapping[str, Any], max_bins: int, min_per_bin: int) -> EncodedCorpus:
    """Fit the calibration from the merged statistics and write ``normrank.json`` last (it marks completion)."""
    import pyarrow.parquet as pq

    files = sorted((out / PARTS).glob("*.parquet"))
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    if rows != n:
        raise IndexFormatError(f"Ray wrote {rows} rows to {out / PARTS}, expected {n}")
    dim = pq.ParquetFile(files[0]).schema_arrow.field("vector").type.list_size
    partial = EncodedCorpus(out, n, dim, NormCalibrator(), dict(settings))
    calibrator = partial.stats().fit(max_bins, min_per_bin)
    meta = {"format_version": FORMAT_VERSION, "kind": "normrank.EncodedCorpus", "count": n, "dim": dim,
            "encoder": dict(settings), "calibrator": calibrator.to_dict()}
    tmp = out / f".{META_FILE}.tmp"
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, out / META_FILE)
    logger.info("encoded %d documents (dim %d) into %s", n, dim, out)
    return EncodedCorpus(out, n, dim, calibrator, dict(settings))


def encoded_folder(out: str | os.PathLike[str]) -> Path:
    """Where ``normrank index --ray --out OUT`` writes its Parquet: ``OUT-encoded`` beside the index."""
    return Path(out).with_name(Path(out).name + "-encoded")


def check_encoded_folder(encoded: str | os.PathLike[str]) -> None:
    """Refuse a Parquet destination that is not new or empty, before reading, encoding or starting Ray
    (a re-run into the same ``--out`` failed only after Ray had started), saying what to do."""
    encoded = Path(encoded)
    if encoded.exists() and (not encoded.is_dir() or any(encoded.iterdir())):
        earlier = (encoded / META_FILE).is_file()
        raise InvalidArgumentError(
            f"{encoded} exists and is not an empty folder"
            + ("; it holds the Parquet of an earlier --ray run: delete it to encode again" if earlier else
               "; choose another --out (the Parquet goes to <out>-encoded)"))


def index_with_ray(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    encoded: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    config: Any = None,
    num_actors: int = 2,
    ray_address: str | None = None,
    show_progress: bool = False,
) -> Any:
    """Read ``source`` like ``normrank index`` does, encode it on Ray, load it into the configured backend.

    Parameters
    ----------
    source:
        A BEIR folder, a ``.jsonl[.gz]`` file of ``{_id, title, text}`` rows, or a folder of .txt/.md files.
    out:
        FAISS backend: the folder the index is saved to (as ``normrank index --out``).
    encoded:
        The Parquet folder (default ``<out>-encoded``); required when ``out`` is not given.
    backend, config:
        ``"faiss"`` or ``"pgvector"`` (default: ``store.backend`` of ``config``); with pgvector the
        documents go to ``store.table`` at ``store.dsn`` (or ``$NORMRANK_PG_DSN``).

    Returns the index.
    """
    from normrank.chunking import chunk_documents
    from normrank.config import build_encoder, build_index, load_config
    from normrank.sources import read_source, source_kind

    cfg = load_config(config).model_copy(deep=True)
    if backend is not None:
        cfg.store.backend = backend
    cfg.store.path = None  # a new index: never load another one into it
    if out is not None:  # "~" as save() reads it, so the version check below looks where the save writes
        out = os.path.expanduser(os.fspath(out))
    if encoded is not None:
        encoded = os.path.expanduser(os.fspath(encoded))
    if cfg.store.backend == "faiss" and out is None:
        raise InvalidArgumentError("the FAISS backend saves the index to a folder: give out=...")
    if encoded is None:
        if out is None:
            raise InvalidArgumentError("give encoded=... (the Parquet folder) or out=...")
        encoded = encoded_folder(out)
    check_encoded_folder(encoded)
    ids, texts, metas, skipped = read_source(source)
    if skipped:
        logger.warning("skipped %d empty document(s), e.g. %s", len(skipped), skipped[:3])
    if not ids:
        raise EmptyCorpusError(f"{source} holds no document with text")
    encoder = build_encoder(cfg)
    # The destination is opened before minutes of encoding: an unreachable pgvector DSN was found only after.
    target = build_index(cfg) if cfg.store.backend == "pgvector" else None
    # the folder's version now: the save below writes only over it, so a `normrank fit` (or another index run)
    # that saves there while Ray encodes stands (it was written over without a word)
    seen = current_version(out) if cfg.store.backend == "faiss" and Path(out).is_dir() else None
    c = cfg.chunking  # long files become passages (ids path#n), as `normrank index` does
    ids, texts, metas, truncated = chunk_documents(ids, texts, metas, encoder=encoder, kind=source_kind(source),
                                                   enabled=c.enabled, size=c.size, overlap=c.overlap, rows=c.rows)
    if truncated:
        logger.warning("%d documents are longer than the model's window of %d tokens and were truncated",
                       truncated, encoder.max_tokens)
    corpus = encode_corpus(texts, ids, metas, out=encoded, encoder=encoder, num_actors=num_actors,
                           ray_address=ray_address, max_bins=cfg.calibration.max_bins,
                           min_per_bin=cfg.calibration.min_per_bin, show_progress=show_progress)
    index = corpus.into(target if target is not None else build_index(cfg))
    if cfg.store.backend == "faiss":
        from normrank.store import save_unless_changed

        save_unless_changed(index, out, seen, "Ray encoded", "run it again")
    return index


__all__ = ["EncodedBatch", "EncodedCorpus", "NormStats", "check_encoded_folder", "encode_corpus", "encoded_folder",
           "index_with_ray", "init_local_ray"]
