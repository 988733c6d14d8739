"""``NormRankRanker``: a Haystack component that re-ranks documents by the norm-aware blend.

Where the vectors come from (no model call for what is already known)
    1. A document's ``embedding`` when raw (the encoder's dimension, not unit length); used
       for that call only, never cached. Haystack's own embedders return unit vectors for
       normalised models, so those documents are re-encoded.
    2. Built with :meth:`NormRankRanker.from_index`, the vector the index holds for a
       document with the same id and the same content (``NormIndex.vectors``).
    3. Otherwise the content is encoded with :class:`normrank.RawEncoder` and kept in an
       in-memory LRU cache keyed by document id and content hash.
    The query likewise: the ``query_embedding`` input when raw, else ``query`` is encoded.

The document calibration comes from a fitted index (:meth:`NormRankRanker.from_index`),
from :meth:`NormRankRanker.calibrate`, or, with none, from each call's candidates (see
:func:`normrank.scoring.rescore`). The arithmetic is ``rescore``, the same the index uses.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import ComponentDevice

from normrank._validation import check_option, check_text
from normrank.calibration import NormCalibrator
from normrank.candidate_vectors import (
    EXPLANATION_KEY,
    CandidateVectorCache,
    as_index,
    build_encoder,
    calibrator_from_texts,
    check_encoder_options,
    current_blend,
    encoder_settings,
    explanation,
    is_blank,
    note_other_dimension,
    split_scorable,
    stored_vectors,
    unscored_explanation,
    weights_from,
    with_explanation,
)
from normrank.config import NormRankConfig, build_weights, load_config, saved_index
from normrank.config import build_encoder as encoder_from_config
from normrank.encoders import RawEncoder, check_raw_encoder
from normrank.errors import EmptyTextError, InvalidArgumentError
from normrank.pooling import POOLINGS, check_sif_a
from normrank.scoring import Weights, rescore
from normrank.store import NormIndex

#: The type name pipelines serialised before the package moved; still loads.
OLD_TYPE_NAME = "haystack_normrank.ranker.NormRankRanker"


def _check_top_k(top_k: Any) -> int:
    return check_option("top_k", top_k)


def _plain_bool(name: str, value: Any) -> bool:
    """``True``/``False`` (NumPy's too, as Python's): what ``Pipeline.dumps`` can write."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _device(value: Any) -> str:
    """The torch device string of ``device``: a string, a Haystack ``ComponentDevice`` (or the dict stock
    components serialise it as, ``{"type": "single", "device": "cpu"}``) or ``None`` (Haystack picks one,
    as its own components do). Only a string was taken: a pipeline YAML written for a stock ranker failed."""
    if isinstance(value, str):
        return value
    try:
        if isinstance(value, Mapping):
            value = ComponentDevice.from_dict(dict(value))
        if value is None or isinstance(value, ComponentDevice):
            return ComponentDevice.resolve_device(value).to_torch_str()
    except (ValueError, TypeError, KeyError) as exc:  # a multi-device map has no one torch device
        raise InvalidArgumentError(f"device must name one device, got {value!r}: {exc}") from None
    raise InvalidArgumentError(f"device must be a string, a haystack ComponentDevice or None, got {value!r}")


def _score_threshold(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)):
        raise InvalidArgumentError(f"score_threshold must be a finite number or None, got {value!r}")
    return float(value)


def _calibrator(value: NormCalibrator | Mapping[str, Any] | None) -> NormCalibrator | None:
    return NormCalibrator.from_dict(dict(value)) if isinstance(value, Mapping) else value


def _unique_by_id(documents: list[Document]) -> list[Document]:
    """One document per id, the copy with the highest incoming score (``None`` lowest), where it first came.

    Why: a hybrid pipeline (BM25 and embedding retrievers joined) passes a document once per retriever;
    Haystack's own rankers drop the copies, and this one ranked them all (``top_k=6`` gave 3 documents twice)."""
    best: dict[str, Document] = {}
    for doc in documents:
        kept = best.get(doc.id)
        if kept is None or (doc.score is not None and (kept.score is None or doc.score > kept.score)):
            best[doc.id] = doc
    return documents if len(best) == len(documents) else list(best.values())


@component
class NormRankRanker:
    """Re-rank documents by ``cos + w(q) * g(d)`` and return the best ``top_k``.

    Each returned document is a copy with ``score`` set to the blended score and one meta
    key added, ``meta["normrank"] = {"score", "cosine", "norm_feature", "weight", "norm"}``
    (and ``"retrieval_score"``, the incoming score, when ``keep_retrieval_score``); the
    document's own meta keys are left as they are. The input documents are not changed.
    A document without text cannot be scored: it is passed through after the scored ones,
    with ``score=None`` and a logged warning.

    Usage
    -----
    >>> ranker = NormRankRanker(top_k=3, weights={"a": 0.02})
    >>> ranker.warm_up()
    >>> ranker.run(query="capital of France", documents=docs)["documents"]  # doctest: +SKIP

    ``Weights()`` (the default) ranks by plain cosine of the raw encoder. Thread-safe: one
    instance may serve concurrent ``run`` / ``run_async`` calls.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        top_k: int = 10,
        weights: Weights | Mapping[str, Any] | None = None,
        calibrator: NormCalibrator | Mapping[str, Any] | None = None,
        query_calibrator: NormCalibrator | Mapping[str, Any] | None = None,
        keep_retrieval_score: bool = True,
        batch_size: int = 64,
        device: str | ComponentDevice | None = "cpu",
        max_seq_length: int | None = None,
        pooling: str = "mean",
        sif_a: float = 1e-3,
        cache_size: int = 10_000,
        encoder: RawEncoder | None = None,
        backend: str = "torch",
        score_threshold: float | None = None,
    ) -> None:
        """
        :param model: Local sentence-transformers folder; ``None`` = the bundled all-MiniLM-L6-v2.
        :param top_k: Documents returned by default (``run(top_k=...)`` overrides it).
        :param weights: The blend, as ``Weights`` or its dict (``a``, ``b``, ``feature``, ``mode``, ...);
            unknown keys are refused.
        :param calibrator: Document calibration fitted on the corpus (or its dict); ``None`` calibrates
            on each call's documents.
        :param query_calibrator: Query calibration (needed when ``b != 0``).
        :param keep_retrieval_score: Keep the incoming score in ``meta["normrank"]["retrieval_score"]``.
        :param batch_size: Encoder batch size.
        :param device: Encoder torch device: a string (``"cpu"``, ``"cuda:0"``), a Haystack ``ComponentDevice``,
            or ``None`` for the device Haystack picks (``ComponentDevice.resolve_device``); serialised as its
            torch string.
        :param max_seq_length: Encoder token limit (``None`` = model default).
        :param pooling: Encoder pooling: ``mean`` (the stock model) or a research pooling
            (``norm``, ``norm2``, ``inv_norm``, ``sif``; see :mod:`normrank.pooling`).
        :param sif_a: The SIF constant of the ``sif`` pooling.
        :param backend: Encoder backend: ``torch``, or ``onnx`` / ``onnx-int8`` on ONNX Runtime (CPU;
            ``pip install 'normrank[onnx]'``; see :class:`normrank.RawEncoder`).
        :param cache_size: Document vectors kept in memory.
        :param score_threshold: Return only documents whose blended score is at least this (as Haystack's
            similarity rankers do); ``run(score_threshold=...)`` overrides it. Documents without text have no
            score and are left out when a threshold is set.
        :param encoder: An existing ``RawEncoder`` to share (then ``model`` and every encoder setting
            are taken from it, and serialised, so ``Pipeline.dumps`` rebuilds the same encoder).
        :raises InvalidArgumentError: ``top_k``, ``cache_size``, ``batch_size``, ``max_seq_length``, ``pooling``
            or a weight is invalid (ranges: ``normrank._validation.OPTION_RANGES``).
        """
        self.top_k = _check_top_k(top_k)
        self.weights = weights_from(weights)
        self.calibrator = _calibrator(calibrator)
        self.query_calibrator = _calibrator(query_calibrator)
        if encoder is not None:
            check_raw_encoder(encoder)
            settings = encoder_settings(encoder)
            model, batch_size, device = settings["model"], settings["batch_size"], settings["device"]
            max_seq_length, pooling, sif_a = settings["max_seq_length"], settings["pooling"], settings["sif_a"]
            backend = settings.get("backend", "torch")
        if pooling not in POOLINGS:
            raise InvalidArgumentError(f"unknown pooling {pooling!r}; choose one of {list(POOLINGS)}")
        # each setting as the plain value it holds, checked here: a NumPy number was taken and then failed
        # Pipeline.dumps, and None, a number for the model or a negative sif_a failed only in run()
        keep_retrieval_score = _plain_bool("keep_retrieval_score", keep_retrieval_score)
        batch_size = check_option("batch_size", batch_size)
        max_seq_length = None if max_seq_length is None else check_option("max_seq_length", max_seq_length)
        cache_size = check_option("cache_size", cache_size)
        device = _device(device)
        if not isinstance(backend, str):
            raise InvalidArgumentError(f"backend must be a string, got {backend!r}")
        self.score_threshold = _score_threshold(score_threshold)
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise InvalidArgumentError(f"model must be a model folder (a string or a path) or None, got {model!r}")
        sif_a = check_sif_a(sif_a)
        check_encoder_options({"batch_size": batch_size, "max_seq_length": max_seq_length, "backend": backend,
                               "device": device})
        self.keep_retrieval_score = keep_retrieval_score
        self.backend = str(backend)
        self.model = None if model is None else os.fspath(model)
        self.batch_size = batch_size
        self.device = str(device)
        self.max_seq_length = max_seq_length
        self.pooling = pooling
        self.sif_a = sif_a
        self.cache_size = cache_size
        self._encoder = encoder
        self._cache = CandidateVectorCache(cache_size, owner=type(self).__name__)
        self._source: Any = None  # the index given to from_index: its stored vectors, weights and calibrations
        self._own_weights = False  # weights given to from_index, kept over the index's
        self._lock = threading.Lock()

    # ------------------------------------------------------------ builders
    @classmethod
    def from_index(cls, index: NormIndex, **kwargs: Any) -> NormRankRanker:
        """Use a ``NormIndex``'s (or a normrank vector store's) encoder, calibrations, weights and stored vectors.

        Documents the index holds (same id, same content) are scored with the vectors it
        stores, so re-ranking its own documents encodes nothing but (at most) the query.
        ``kwargs`` set the rest.
        """
        index = as_index(index)
        own_weights = kwargs.get("weights") is not None
        weights, calibrator, query_calibrator = index.blend_settings()
        kwargs.setdefault("weights", weights)
        ranker = cls(encoder=index.encoder, calibrator=calibrator, query_calibrator=query_calibrator, **kwargs)
        ranker._source = index
        ranker._own_weights = own_weights
        return ranker

    @classmethod
    def from_config(cls, source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig) -> NormRankRanker:
        """Build from a ``normrank.yaml`` (path or dict): encoder, scoring and the ``haystack`` section.

        With ``haystack.calibration`` ``index`` (or ``auto`` and a saved index at ``store.path``)
        the calibrations, weights and stored vectors come from that index; otherwise each call
        calibrates on its documents.
        """
        config = load_config(source)
        section = config.haystack
        options = {"top_k": section.top_k, "keep_retrieval_score": section.keep_retrieval_score,
                   "cache_size": section.cache_size, "score_threshold": section.score_threshold}
        index = saved_index(config, section.calibration, "haystack")
        if index is not None:
            return cls.from_index(index, **options)
        return cls(encoder=encoder_from_config(config), weights=build_weights(config), **options)

    def to_dict(self) -> dict[str, Any]:
        """Serialise for ``Pipeline.dumps``: every setting, calibrations as their JSON dicts.

        An index given to :meth:`from_index` is not serialised (only its calibrations and
        weights as they are now): the rebuilt ranker encodes what it is given.
        """
        weights, calibrator, query_calibrator = self._blend()
        return default_to_dict(
            self, model=self.model, top_k=self.top_k, weights=weights.to_dict(),
            calibrator=calibrator.to_dict() if calibrator else None,
            query_calibrator=query_calibrator.to_dict() if query_calibrator else None,
            keep_retrieval_score=self.keep_retrieval_score, batch_size=self.batch_size, device=self.device,
            max_seq_length=self.max_seq_length, pooling=self.pooling, sif_a=self.sif_a,
            cache_size=self.cache_size, backend=self.backend, score_threshold=self.score_threshold,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NormRankRanker:
        """Rebuild from :meth:`to_dict` output, also one saved under the old ``haystack_normrank`` type name."""
        if data.get("type") == OLD_TYPE_NAME:
            data = {**data, "type": f"{cls.__module__}.{cls.__qualname__}"}
        return default_from_dict(cls, data)

    # ------------------------------------------------------------ model
    def warm_up(self) -> None:
        """Load the embedding model (pipelines call this before the first run); once, also under threads."""
        with self._lock:
            if self._encoder is None:
                self._encoder = build_encoder(
                    self.model, pooling=self.pooling, sif_a=self.sif_a, batch_size=self.batch_size,
                    device=self.device, max_seq_length=self.max_seq_length, backend=self.backend)
            encoder = self._encoder
        _ = encoder.model

    @property
    def encoder(self) -> RawEncoder:
        """The raw encoder (loaded by :meth:`warm_up`, or on first use)."""
        if self._encoder is None:
            self.warm_up()
        return self._encoder  # type: ignore[return-value]  # set by warm_up

    def calibrate(self, texts: Sequence[str]) -> NormRankRanker:
        """Fit the document calibration on representative corpus texts (encodes them); returns self."""
        self.calibrator = calibrator_from_texts(self.encoder, texts)
        return self

    def _vectors(self, documents: Sequence[Document]) -> tuple[np.ndarray, np.ndarray]:
        encoder = self.encoder
        items = [(d.id, d.content or "", d.embedding) for d in documents]
        known = stored_vectors(self._source, [(d.id, d.content or "") for d in documents], encoder.dim)
        return self._cache.vectors(encoder, items, known=known)

    def _blend(self) -> tuple[Weights, NormCalibrator | None, NormCalibrator | None]:
        """The weights and calibrations to rank with (:func:`~normrank.candidate_vectors.current_blend`)."""
        return current_blend(self._source, self.weights, self.calibrator, self.query_calibrator,
                             own_weights=self._own_weights)

    def _query_vector(self, query: str, query_embedding: Sequence[float] | None) -> tuple[np.ndarray, int | None]:
        given = self._cache.query_vector(self.encoder, query, query_embedding)
        if given is not None:
            return given
        note_other_dimension(query_embedding, self.encoder.dim, type(self).__name__)
        if is_blank(query):
            raise EmptyTextError("the query is empty: nothing to rank by")
        vectors, counts = self.encoder.encode_with_counts([check_text(query, "the query")])
        self._cache.note_query(query, vectors[0])
        return vectors[0], int(counts[0])

    def _explained(self, doc: Document, score: float | None, parts: dict[str, dict[str, Any]]) -> Document:
        if self.keep_retrieval_score:
            parts[EXPLANATION_KEY]["retrieval_score"] = doc.score
        return replace(doc, score=score, meta=with_explanation(doc.meta, parts, f"document {doc.id!r}"))

    # ------------------------------------------------------------ running
    @component.output_types(documents=list[Document])
    def run(
        self,
        query: str,
        documents: list[Document],
        top_k: int | None = None,
        query_embedding: list[float] | None = None,
        score_threshold: float | None = None,
    ) -> dict[str, list[Document]]:
        """
        Re-rank ``documents`` for ``query``.

        :param query: The query text (encoded with the raw encoder unless ``query_embedding`` is raw).
        :param documents: Candidates, e.g. from a retriever.
        :param top_k: Documents to return; ``None`` uses the component's ``top_k``.
        :param query_embedding: The query's embedding, if a text embedder already computed it; used
            only when raw (the encoder's dimension, not unit length) and from this ranker's model, else
            ``query`` is encoded.
        :param score_threshold: Keep only documents scoring at least this; ``None`` uses the component's.
        :returns: ``{"documents": [...]}``, best first, at most ``top_k``; documents without text last. A document
            given more than once (by id, as a hybrid pipeline's joiner passes it) is ranked once, as Haystack's
            own rankers do: the copy with the highest incoming score.
        :raises EmptyTextError: The query is empty (and no raw ``query_embedding`` is given).
        """
        k = self.top_k if top_k is None else _check_top_k(top_k)
        threshold = self.score_threshold if score_threshold is None else _score_threshold(score_threshold)
        if not documents:
            return {"documents": []}
        documents = _unique_by_id(documents)
        scored, why = split_scorable([d.content for d in documents], [d.id for d in documents], "documents")
        out = []
        if scored:
            qvec, qcount = self._query_vector(query, query_embedding)
            vectors, counts = self._vectors([documents[i] for i in scored])
            weights, calibrator, query_calibrator = self._blend()
            hits = rescore(qvec, vectors, counts, weights=weights, calibrator=calibrator,
                           query_calibrator=query_calibrator, query_token_count=qcount)
            order = sorted(range(len(scored)), key=lambda j: -hits[j].score)
            out = [self._explained(documents[scored[j]], hits[j].score, explanation(hits[j])) for j in order]
        if threshold is not None:
            return {"documents": [d for d in out if d.score >= threshold][:k]}
        out.extend(self._explained(documents[i], None, unscored_explanation(why[i])) for i in why)
        return {"documents": out[:k]}

    @component.output_types(documents=list[Document])
    async def run_async(
        self,
        query: str,
        documents: list[Document],
        top_k: int | None = None,
        query_embedding: list[float] | None = None,
        score_threshold: float | None = None,
    ) -> dict[str, list[Document]]:
        """:meth:`run` in a worker thread, for ``Pipeline.run_async``."""
        return await asyncio.to_thread(self.run, query, documents, top_k, query_embedding, score_threshold)

