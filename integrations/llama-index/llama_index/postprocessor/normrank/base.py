"""``NormRankPostprocessor``: re-rank retrieved nodes by the norm-aware blend.

Where the vectors come from
    A node's ``embedding`` is reused when it is raw (not unit length) and has the
    encoder's dimension, i.e. it came from :class:`~llama_index.embeddings.normrank.NormRankEmbedding`
    or another raw encoding of the same model. Otherwise (the usual case: SimpleVectorStore
    and FaissVectorStore return nodes without embeddings, and stock embedding models return
    unit vectors) the node text is encoded with :class:`normrank.RawEncoder` and kept in an
    in-memory LRU cache keyed by node id and content hash, so a node is encoded once.
    The query likewise: ``query_bundle.embedding`` when raw, else ``query_str`` is encoded
    (the async path and ``postprocess_nodes(query_str=...)`` give no embedding at all).

Where the calibration comes from
    The document feature ``g(d)`` needs a calibration of norm against length. Give one
    fitted on the corpus (:meth:`NormRankPostprocessor.from_index` takes the index's
    calibrations and weights; :meth:`NormRankPostprocessor.calibrate` fits on texts). With
    none, each call calibrates on its own candidates (see :func:`normrank.scoring.rescore`):
    it needs no corpus but is coarse on a handful of nodes, and a node's feature then
    depends on which other nodes were retrieved with it.

The arithmetic is :func:`normrank.scoring.rescore`, the same the index uses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from normrank.candidate_vectors import CandidateVectorCache, calibrator_from_texts, is_raw, model_setting
from normrank.calibration import NormCalibrator
from normrank.config import NormRankConfig, build_encoder, build_weights, load_config, saved_index
from normrank.encoders import RawEncoder
from normrank.errors import EmptyTextError, InvalidArgumentError
from normrank.scoring import Weights, rescore
from normrank.store import NormIndex

from llama_index.retrievers.normrank.base import SCORE_KEYS, explanation, hidden_keys

dispatcher = get_dispatcher(__name__)


class NormRankPostprocessor(BaseNodePostprocessor):
    """Re-score nodes by ``cos + w(q) * g(d)`` and keep the best ``top_n``.

    The new score is ``NodeWithScore.score``; a copy of each node gets the explanation in its
    metadata (``relevance_score``, ``cosine``, ``norm_feature``, ``weight``, ``norm``, and the
    incoming score as ``retrieval_score`` when ``keep_retrieval_score``), hidden from the LLM
    and embed views. The caller's nodes are never changed.

    ``Weights()`` (the default) ranks by plain cosine of the raw encoder; set ``weights``
    by hand, from a fitted index (:meth:`from_index`) or from ``normrank.yaml``.
    """

    top_n: int = Field(5, gt=0, description="Nodes kept after re-ranking.")
    keep_retrieval_score: bool = Field(True, description="Keep the incoming score in metadata['retrieval_score'].")
    weights: Weights = Field(default_factory=Weights, description="The blend (a, b, feature, mode, ...).")
    calibrator: NormCalibrator | None = Field(
        None, description="Document calibration fitted on the corpus; None = calibrate on each call's candidates.")
    query_calibrator: NormCalibrator | None = Field(None, description="Query calibration (needed when b != 0).")
    model: str | None = Field(None, description="Local sentence-transformers folder; None = bundled MiniLM.")
    batch_size: int = Field(64, gt=0, description="Encoder batch size.")
    device: str = Field("cpu", description="Encoder torch device.")
    max_seq_length: int | None = Field(None, gt=0, description="Encoder max tokens (None = model default).")
    metadata_mode: MetadataMode = Field(MetadataMode.EMBED, description="Node content view that is encoded.")
    cache_size: int = Field(10_000, ge=0, description="Node vectors kept in memory (by node id + content hash).")

    _encoder: RawEncoder | None = PrivateAttr(None)
    _cache: CandidateVectorCache = PrivateAttr(default_factory=CandidateVectorCache)  # sized in __init__

    def __init__(self, *, encoder: RawEncoder | None = None, **data: Any) -> None:
        if encoder is not None:
            data.setdefault("model", model_setting(encoder))
            data.setdefault("batch_size", encoder.batch_size)
            data.setdefault("device", encoder.device)
            data.setdefault("max_seq_length", encoder.max_seq_length)
        super().__init__(**data)
        self._cache = CandidateVectorCache(self.cache_size)
        self._encoder = encoder

    @classmethod
    def class_name(cls) -> str:
        return "NormRankPostprocessor"

    # ------------------------------------------------------------ builders
    @classmethod
    def from_index(cls, index: NormIndex, **kwargs: Any) -> NormRankPostprocessor:
        """Use a ``NormIndex``'s encoder, calibrations and (fitted) weights; ``kwargs`` set the rest."""
        kwargs.setdefault("weights", index.weights)
        return cls(encoder=index.encoder, calibrator=index.calibrator, query_calibrator=index.query_calibrator,
                   **kwargs)

    @classmethod
    def from_config(cls, source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig) -> NormRankPostprocessor:
        """Build from a ``normrank.yaml`` (path or dict): encoder, scoring and the ``llamaindex`` section.

        With ``llamaindex.calibration`` ``index`` (or ``auto`` and a saved index at ``store.path``)
        the calibrations and weights come from that index; otherwise each call calibrates on
        its candidates.
        """
        config = load_config(source)
        section = config.llamaindex
        options = {"top_n": section.top_n, "keep_retrieval_score": section.keep_retrieval_score,
                   "cache_size": section.cache_size}
        index = saved_index(config, section.calibration, "llamaindex")
        if index is not None:
            return cls.from_index(index, **options)
        return cls(encoder=build_encoder(config), weights=build_weights(config), **options)

    def calibrate(self, texts: Sequence[str]) -> NormRankPostprocessor:
        """Fit the document calibration on representative corpus texts (encodes them); returns self."""
        self.calibrator = calibrator_from_texts(self.encoder, texts)
        return self

    @property
    def encoder(self) -> RawEncoder:
        """The raw encoder, built from ``model``/``batch_size``/``device`` on first use."""
        if self._encoder is None:
            self._encoder = RawEncoder(self.model, batch_size=self.batch_size, device=self.device,
                                       max_seq_length=self.max_seq_length, show_progress=False)
        return self._encoder

    # ------------------------------------------------------------ vectors
    def _query_vector(self, query_bundle: QueryBundle) -> tuple[np.ndarray, int | None]:
        text = query_bundle.query_str
        if is_raw(query_bundle.embedding, self.encoder.dim):
            count = int(self.encoder.token_counts([text])[0]) if text and text.strip() else None
            return np.asarray(query_bundle.embedding, dtype=np.float32), count
        if not text or not text.strip():
            raise EmptyTextError("the query is empty and has no raw embedding: nothing to re-rank by")
        vectors, counts = self.encoder.encode_with_counts([text])
        return vectors[0], int(counts[0])

    def _node_vectors(self, nodes: Sequence[NodeWithScore]) -> tuple[np.ndarray, np.ndarray]:
        items = [(n.node.node_id, n.node.get_content(metadata_mode=self.metadata_mode), n.node.embedding)
                 for n in nodes]
        return self._cache.vectors(self.encoder, items, kind="node")

    # ------------------------------------------------------------ re-ranking
    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise InvalidArgumentError("NormRankPostprocessor needs the query: pass query_bundle or query_str")
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=self.top_n,
                                          model_name=self.encoder.model_name))
        if not nodes:
            dispatcher.event(ReRankEndEvent(nodes=[]))
            return []
        with self.callback_manager.event(
            CBEventType.RERANKING,
            payload={EventPayload.NODES: nodes, EventPayload.MODEL_NAME: self.encoder.model_name,
                     EventPayload.QUERY_STR: query_bundle.query_str, EventPayload.TOP_K: self.top_n},
        ) as event:
            query, query_count = self._query_vector(query_bundle)
            vectors, counts = self._node_vectors(nodes)
            hits = rescore(query, vectors, counts, weights=self.weights, calibrator=self.calibrator,
                           query_calibrator=self.query_calibrator, query_token_count=query_count)
            if len(hits) != len(nodes):  # pragma: no cover - rescore returns one hit per vector
                raise InvalidArgumentError(f"{len(hits)} scores for {len(nodes)} nodes")
            order = sorted(range(len(nodes)), key=lambda i: -hits[i].score)[: self.top_n]
            out = []
            for i in order:
                old = nodes[i]
                metadata = {**old.node.metadata, **explanation(hits[i])}
                keys = list(SCORE_KEYS)
                if self.keep_retrieval_score:
                    metadata["retrieval_score"] = old.score
                    keys.append("retrieval_score")
                node = old.node.model_copy(update={"metadata": metadata, **hidden_keys(old.node, keys)})
                out.append(NodeWithScore(node=node, score=hits[i].score))
            event.on_end(payload={EventPayload.NODES: out})
        dispatcher.event(ReRankEndEvent(nodes=out))
        return out
