"""``NormRankRanker``: a Haystack component that re-ranks documents by the norm-aware blend.

A document's ``embedding`` is reused when it is raw (the encoder's dimension, not unit
length); otherwise its content is encoded with :class:`normrank.RawEncoder` (kept in an
in-memory LRU cache keyed by document id and content hash). Haystack's own embedders
return unit vectors for normalised models, so those documents are re-encoded.

The document calibration comes from a fitted index (:meth:`NormRankRanker.from_index`),
from :meth:`NormRankRanker.calibrate`, or, with none, from each call's candidates (see
:func:`normrank.scoring.rescore`). The arithmetic is ``rescore``, the same the index uses.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from haystack import Document, component, default_from_dict, default_to_dict

from normrank.candidate_vectors import CandidateVectorCache, calibrator_from_texts, model_setting
from normrank.calibration import NormCalibrator
from normrank.config import NormRankConfig, build_encoder, build_weights, load_config, saved_index
from normrank.encoders import RawEncoder
from normrank.errors import EmptyTextError, InvalidArgumentError
from normrank.scoring import Weights, rescore
from normrank.store import NormIndex


def _check_top_k(top_k: Any) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
        raise InvalidArgumentError(f"top_k must be a positive integer, got {top_k!r}")
    return top_k


@component
class NormRankRanker:
    """Re-rank documents by ``cos + w(q) * g(d)`` and return the best ``top_k``.

    Each returned document is a copy with ``score`` set to the blended score and
    ``meta`` extended by ``relevance_score``, ``cosine``, ``norm_feature``, ``weight``,
    ``norm`` (and ``retrieval_score``, the incoming score, when ``keep_retrieval_score``).
    The input documents are not changed.

    Usage
    -----
    >>> ranker = NormRankRanker(top_k=3, weights={"a": 0.02})
    >>> ranker.warm_up()
    >>> ranker.run(query="capital of France", documents=docs)["documents"]  # doctest: +SKIP

    ``Weights()`` (the default) ranks by plain cosine of the raw encoder.
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
        device: str = "cpu",
        max_seq_length: int | None = None,
        cache_size: int = 10_000,
        encoder: RawEncoder | None = None,
    ) -> None:
        """
        :param model: Local sentence-transformers folder; ``None`` = the bundled all-MiniLM-L6-v2.
        :param top_k: Documents returned by default (``run(top_k=...)`` overrides it).
        :param weights: The blend, as ``Weights`` or its dict (``a``, ``b``, ``feature``, ``mode``, ...).
        :param calibrator: Document calibration fitted on the corpus (or its dict); ``None`` calibrates
            on each call's documents.
        :param query_calibrator: Query calibration (needed when ``b != 0``).
        :param keep_retrieval_score: Keep the incoming score in ``meta["retrieval_score"]``.
        :param batch_size: Encoder batch size.
        :param device: Encoder torch device.
        :param max_seq_length: Encoder token limit (``None`` = model default).
        :param cache_size: Document vectors kept in memory.
        :param encoder: An existing ``RawEncoder`` to share (then ``model`` and the encoder settings
            are taken from it and not serialised separately).
        :raises InvalidArgumentError: ``top_k`` or ``cache_size`` is out of range, or a weight is invalid.
        """
        self.top_k = _check_top_k(top_k)
        self.weights = weights if isinstance(weights, Weights) else Weights(**dict(weights or {}))
        self.calibrator = (NormCalibrator.from_dict(dict(calibrator)) if isinstance(calibrator, Mapping)
                           else calibrator)
        self.query_calibrator = (NormCalibrator.from_dict(dict(query_calibrator))
                                 if isinstance(query_calibrator, Mapping) else query_calibrator)
        self.keep_retrieval_score = keep_retrieval_score
        if encoder is not None:
            model = model_setting(encoder)
            batch_size, device, max_seq_length = encoder.batch_size, encoder.device, encoder.max_seq_length
        self.model = model
        self.batch_size = batch_size
        self.device = device
        self.max_seq_length = max_seq_length
        self.cache_size = cache_size
        self._encoder = encoder
        self._cache = CandidateVectorCache(cache_size)

    # ------------------------------------------------------------ builders
    @classmethod
    def from_index(cls, index: NormIndex, **kwargs: Any) -> NormRankRanker:
        """Use a ``NormIndex``'s encoder, calibrations and (fitted) weights; ``kwargs`` set the rest."""
        kwargs.setdefault("weights", index.weights)
        return cls(encoder=index.encoder, calibrator=index.calibrator, query_calibrator=index.query_calibrator,
                   **kwargs)

    @classmethod
    def from_config(cls, source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig) -> NormRankRanker:
        """Build from a ``normrank.yaml`` (path or dict): encoder, scoring and the ``haystack`` section.

        With ``haystack.calibration`` ``index`` (or ``auto`` and a saved index at ``store.path``)
        the calibrations and weights come from that index; otherwise each call calibrates on its
        documents.
        """
        config = load_config(source)
        section = config.haystack
        options = {"top_k": section.top_k, "keep_retrieval_score": section.keep_retrieval_score,
                   "cache_size": section.cache_size}
        index = saved_index(config, section.calibration, "haystack")
        if index is not None:
            return cls.from_index(index, **options)
        return cls(encoder=build_encoder(config), weights=build_weights(config), **options)

    def to_dict(self) -> dict[str, Any]:
        """Serialise for ``Pipeline.dumps``; calibrations are stored as their JSON dicts."""
        return default_to_dict(
            self, model=self.model, top_k=self.top_k, weights=self.weights.to_dict(),
            calibrator=self.calibrator.to_dict() if self.calibrator else None,
            query_calibrator=self.query_calibrator.to_dict() if self.query_calibrator else None,
            keep_retrieval_score=self.keep_retrieval_score, batch_size=self.batch_size, device=self.device,
            max_seq_length=self.max_seq_length, cache_size=self.cache_size,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NormRankRanker:
        """Rebuild from :meth:`to_dict` output."""
        return default_from_dict(cls, data)

    # ------------------------------------------------------------ model
    def warm_up(self) -> None:
        """Load the embedding model (pipelines call this before the first run)."""
        if self._encoder is None:
            self._encoder = RawEncoder(self.model, batch_size=self.batch_size, device=self.device,
                                       max_seq_length=self.max_seq_length, show_progress=False)
        _ = self._encoder.model

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
        return self._cache.vectors(self.encoder, [(d.id, d.content or "", d.embedding) for d in documents])

    # ------------------------------------------------------------ running
    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        """
        Re-rank ``documents`` for ``query``.

        :param query: The query text (encoded with the raw encoder).
        :param documents: Candidates, e.g. from a retriever.
        :param top_k: Documents to return; ``None`` uses the component's ``top_k``.
        :returns: ``{"documents": [...]}``, best first, at most ``top_k``.
        :raises EmptyTextError: The query or a document has no text.
        """
        k = self.top_k if top_k is None else _check_top_k(top_k)
        if not documents:
            return {"documents": []}
        if not query or not query.strip():
            raise EmptyTextError("the query is empty: nothing to rank by")
        qvec, qcount = self.encoder.encode_with_counts([query])
        vectors, counts = self._vectors(documents)
        hits = rescore(qvec[0], vectors, counts, weights=self.weights, calibrator=self.calibrator,
                       query_calibrator=self.query_calibrator, query_token_count=int(qcount[0]))
        order = sorted(range(len(documents)), key=lambda i: -hits[i].score)[:k]
        out = []
        for i in order:
            doc, hit = documents[i], hits[i]
            meta = {**doc.meta, **hit.as_metadata()}
            if self.keep_retrieval_score:
                meta["retrieval_score"] = doc.score
            out.append(replace(doc, score=hit.score, meta=meta))
        return {"documents": out}

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """:meth:`run` in a worker thread, for ``AsyncPipeline``."""
        return await asyncio.to_thread(self.run, query, documents, top_k)
