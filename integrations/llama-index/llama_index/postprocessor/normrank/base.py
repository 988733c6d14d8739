"""``NormRankPostprocessor``: re-rank retrieved nodes by the norm-aware blend.

Where the vectors come from (no model call for what is already known)
    1. A node's ``embedding`` when raw (not unit length) and of the encoder's dimension,
       i.e. from :class:`~llama_index.embeddings.normrank.NormRankEmbedding` or another raw
       encoding of the same model; used for that call only, never cached.
    2. Built with :meth:`NormRankPostprocessor.from_index`, the vector the index holds for a
       node with the same id and the same text (``NormIndex.vectors``).
    3. Otherwise (the usual case: SimpleVectorStore and FaissVectorStore return nodes without
       embeddings, and stock embedding models return unit vectors) the node content is
       encoded with :class:`normrank.RawEncoder` and kept in an in-memory LRU cache keyed by
       node id and content hash, so a node is encoded once.
    The query likewise: ``query_bundle.embedding`` when raw (a ``VectorStoreIndex`` retriever
    with ``NormRankEmbedding`` leaves it there), else ``query_str`` is encoded.

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
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import (
    ReRankEndEvent,
    ReRankStartEvent,
)
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle
from llama_index.retrievers.normrank.base import as_explained

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
from normrank.pooling import POOLINGS
from normrank.scoring import Weights, rescore
from normrank.store import NormIndex

dispatcher = get_dispatcher(__name__)

#: Constructor arguments that are not fields.
_EXTRA_ARGS = ("encoder",)


def _hide(node: BaseNode, key: str) -> dict[str, list[str]]:
    """``excluded_*_metadata_keys`` with ``key`` added (only normrank's own key is ever hidden)."""
    return {
        "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys,
                                       *([key] if key not in node.excluded_llm_metadata_keys else [])],
        "excluded_embed_metadata_keys": [*node.excluded_embed_metadata_keys,
                                         *([key] if key not in node.excluded_embed_metadata_keys else [])],
    }


class NormRankPostprocessor(BaseNodePostprocessor):
    """Re-score nodes by ``cos + w(q) * g(d)`` and keep the best ``top_n``.

    The new score is ``NodeWithScore.score``. A copy of each node gets the explanation under
    one metadata key, ``metadata["normrank"] = {"score", "cosine", "norm_feature", "weight",
    "norm"}`` (and the incoming score as ``"retrieval_score"`` when ``keep_retrieval_score``),
    hidden from the LLM and embed views; the node's own metadata keys are left as they are.
    The caller's nodes are never changed. A node without text cannot be scored: it is passed
    through after the scored ones, with ``score=None`` and a logged warning.

    ``Weights()`` (the default) ranks by plain cosine of the raw encoder; set ``weights``
    by hand (a ``Weights`` or its dict; unknown keys are refused), from a fitted index
    (:meth:`from_index`) or from ``normrank.yaml``. Unknown constructor arguments are refused.
    Thread-safe: one instance may serve concurrent queries.
    """

    top_n: int = Field(5, gt=0, description="Nodes kept after re-ranking.")
    keep_retrieval_score: bool = Field(
        True, description="Keep the incoming score in metadata['normrank']['retrieval_score'].")
    weights: Weights = Field(default_factory=Weights, description="The blend (a, b, feature, mode, ...).")
    calibrator: NormCalibrator | None = Field(
        None, description="Document calibration fitted on the corpus; None = calibrate on each call's candidates.")
    query_calibrator: NormCalibrator | None = Field(None, description="Query calibration (needed when b != 0).")
    model: str | None = Field(None, description="Local sentence-transformers folder; None = bundled MiniLM.")
    batch_size: int = Field(64, gt=0, description="Encoder batch size.")
    device: str = Field("cpu", description="Encoder torch device.")
    max_seq_length: int | None = Field(None, gt=0, description="Encoder max tokens (None = model default).")
    pooling: str = Field("mean", description="Encoder pooling: mean (the stock model) or a research pooling.")
    sif_a: float = Field(1e-3, gt=0, description="SIF constant of the sif pooling.")
    backend: str = Field("torch", description="Encoder backend: torch, onnx or onnx-int8 (CPU; normrank[onnx]).")
    metadata_mode: MetadataMode = Field(MetadataMode.EMBED, description="Node content view that is encoded.")
    cache_size: int = Field(10_000, ge=0, description="Node vectors kept in memory (by node id + content hash).")

    _encoder: RawEncoder | None = PrivateAttr(None)
    _cache: CandidateVectorCache = PrivateAttr(default_factory=CandidateVectorCache)  # sized in __init__
    _source: Any = PrivateAttr(None)  # the index given to from_index: its stored vectors, weights and calibrations
    _own_weights: bool = PrivateAttr(False)  # weights given to from_index, kept over the index's
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, *, encoder: RawEncoder | None = None, **data: Any) -> None:
        allowed = sorted({*type(self).model_fields, *_EXTRA_ARGS})
        unknown = sorted(k for k in data if k not in allowed)
        if unknown:
            raise InvalidArgumentError(
                f"NormRankPostprocessor got unknown arguments {unknown}; allowed: {allowed}")
        if "weights" in data:
            data["weights"] = weights_from(data["weights"])
        if data.get("pooling", "mean") not in POOLINGS:
            raise InvalidArgumentError(f"unknown pooling {data['pooling']!r}; choose one of {list(POOLINGS)}")
        for name in ("top_n", "cache_size"):
            if name in data:
                data[name] = check_option(name, data[name])
        check_encoder_options(data)
        if encoder is not None:
            check_raw_encoder(encoder)
            for key, value in encoder_settings(encoder).items():
                if key in type(self).model_fields:
                    data.setdefault(key, value)
        super().__init__(**data)
        self._cache = CandidateVectorCache(self.cache_size, owner=type(self).__name__)
        self._encoder = encoder
        self._lock = threading.Lock()

    @classmethod
    def class_name(cls) -> str:
        return "NormRankPostprocessor"

    # ------------------------------------------------------------ builders
    @classmethod
    def from_index(cls, index: NormIndex, **kwargs: Any) -> NormRankPostprocessor:
        """Use a ``NormIndex``'s (or a normrank vector store's) encoder, calibrations, weights and stored vectors.

        Nodes the index holds (same id, same text) are scored with the vectors it stores, so
        re-ranking its own documents encodes nothing but (at most) the query. ``kwargs`` set the rest.
        """
        index = as_index(index)
        own_weights = kwargs.get("weights") is not None
        weights, calibrator, query_calibrator = index.blend_settings()
        kwargs.setdefault("weights", weights)
        post = cls(encoder=index.encoder, calibrator=calibrator, query_calibrator=query_calibrator, **kwargs)
        post._source = index
        post._own_weights = own_weights
        return post

    @classmethod
    def from_config(cls, source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig) -> NormRankPostprocessor:
        """Build from a ``normrank.yaml`` (path or dict): encoder, scoring and the ``llamaindex`` section.

        With ``llamaindex.calibration`` ``index`` (or ``auto`` and a saved index at ``store.path``)
        the calibrations, weights and stored vectors come from that index; otherwise each call
        calibrates on its candidates.
        """
        config = load_config(source)
        section = config.llamaindex
        options = {"top_n": section.top_n, "keep_retrieval_score": section.keep_retrieval_score,
                   "cache_size": section.cache_size}
        index = saved_index(config, section.calibration, "llamaindex")
        if index is not None:
            return cls.from_index(index, **options)
        return cls(encoder=encoder_from_config(config), weights=build_weights(config), **options)

    def calibrate(self, texts: Sequence[str]) -> NormRankPostprocessor:
        """Fit the document calibration on representative corpus texts (encodes them); returns self."""
        self.calibrator = calibrator_from_texts(self.encoder, texts)
        return self

    @property
    def encoder(self) -> RawEncoder:
        """The raw encoder, built from the encoder fields on first use (once, also under threads)."""
        if self._encoder is None:
            with self._lock:
                if self._encoder is None:
                    self._encoder = build_encoder(
                        self.model, pooling=self.pooling, sif_a=self.sif_a, batch_size=self.batch_size,
                        device=self.device, max_seq_length=self.max_seq_length, backend=self.backend)
        return self._encoder

    # ------------------------------------------------------------ vectors
    def _blend(self) -> tuple[Weights, NormCalibrator | None, NormCalibrator | None]:
        """The weights and calibrations to rank with (:func:`~normrank.candidate_vectors.current_blend`)."""
        return current_blend(self._source, self.weights, self.calibrator, self.query_calibrator,
                             own_weights=self._own_weights)

    def _query_vector(self, query_bundle: QueryBundle) -> tuple[np.ndarray, int | None]:
        text = query_bundle.query_str
        given = self._cache.query_vector(self.encoder, text, query_bundle.embedding,
                                         of_text=query_bundle.embedding_strs == [text])
        if given is not None:
            return given
        note_other_dimension(query_bundle.embedding, self.encoder.dim, type(self).__name__)
        if is_blank(text):
            raise EmptyTextError("the query is empty and has no raw embedding: nothing to re-rank by")
        vectors, counts = self.encoder.encode_with_counts([check_text(text, "the query")])
        self._cache.note_query(text, vectors[0])
        return vectors[0], int(counts[0])

    def _node_vectors(self, nodes: Sequence[NodeWithScore]) -> tuple[np.ndarray, np.ndarray]:
        encoder = self.encoder
        items = [(n.node.node_id, n.node.get_content(metadata_mode=self.metadata_mode), n.node.embedding)
                 for n in nodes]
        known = stored_vectors(self._source, [(n.node.node_id, n.node.get_content(metadata_mode=MetadataMode.NONE))
                                              for n in nodes], encoder.dim)
        return self._cache.vectors(encoder, items, known=known)

    # ------------------------------------------------------------ re-ranking
    def _explained(self, old: NodeWithScore, score: float | None, parts: dict[str, dict[str, Any]]) -> NodeWithScore:
        if self.keep_retrieval_score:
            parts[EXPLANATION_KEY]["retrieval_score"] = old.score
        metadata = with_explanation(old.node.metadata, parts, f"node {old.node.node_id!r}")
        hidden = _hide(old.node, EXPLANATION_KEY) if metadata.get(EXPLANATION_KEY) is parts[EXPLANATION_KEY] else {}
        node = as_explained(old.node.model_copy(update={"metadata": metadata, **hidden}))
        return NodeWithScore(node=node, score=score)

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
            scored, why = split_scorable([n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes],
                                         [n.node.node_id for n in nodes], "nodes")
            out = []
            if scored:
                query, query_count = self._query_vector(query_bundle)
                vectors, counts = self._node_vectors([nodes[i] for i in scored])
                weights, calibrator, query_calibrator = self._blend()
                hits = rescore(query, vectors, counts, weights=weights, calibrator=calibrator,
                               query_calibrator=query_calibrator, query_token_count=query_count)
                if len(hits) != len(scored):  # pragma: no cover - rescore returns one hit per vector
                    raise InvalidArgumentError(f"{len(hits)} scores for {len(scored)} nodes")
                order = sorted(range(len(scored)), key=lambda j: -hits[j].score)
                out = [self._explained(nodes[scored[j]], hits[j].score, explanation(hits[j])) for j in order]
            out.extend(self._explained(nodes[i], None, unscored_explanation(why[i])) for i in why)
            out = out[: self.top_n]
            event.on_end(payload={EventPayload.NODES: out})
        dispatcher.event(ReRankEndEvent(nodes=out))
        return out
