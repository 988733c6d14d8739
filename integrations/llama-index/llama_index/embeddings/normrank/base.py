"""``NormRankEmbedding``: a LlamaIndex embedding model that keeps the raw norm.

LlamaIndex's HuggingFace embedding keeps the model's ``Normalize`` module, so its
vectors are unit length. These come from :class:`normrank.RawEncoder`: the same
direction, the norm left in, so normrank can use it.

Which vector store to put them in
    Only :class:`~llama_index.vector_stores.normrank.NormRankVectorStore` ranks these vectors by
    normrank's blend. Any other store ranks the raw vectors by its own metric:
    ``FaissVectorStore`` (``IndexFlatIP``) by the raw dot product, which favours long vectors,
    and ``IndexFlatL2`` by raw L2 distance, which penalises them: neither is cosine (top-5 overlap
    with cosine was 0.63 / 0.80 on 50 documents). ``SimpleVectorStore`` computes cosine, so it
    ranks by plain cosine, without the norm term. The first time this model embeds for a
    ``VectorStoreIndex`` or its retriever over another store it warns once, naming the store
    (detected from the caller, best effort: an embedding call that no index makes is not checked).
    With such a store, add :class:`~llama_index.postprocessor.normrank.NormRankPostprocessor`, which
    re-ranks by the blend and reuses these raw vectors instead of re-encoding.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr

from normrank.encoders import RawEncoder, check_raw_encoder
from normrank.errors import InvalidArgumentError


class NormRankEmbedding(BaseEmbedding):
    """Raw (pre-normalisation) embeddings from the bundled all-MiniLM-L6-v2 or a local model.

    Parameters
    ----------
    model:
        A local sentence-transformers folder, or ``None`` for the bundled model.
    encoder:
        An existing :class:`normrank.RawEncoder` to share (then leave ``model`` and ``device`` unset).
    embed_batch_size, device:
        Batch size and torch device of the encoder.

    Keep the vectors in :class:`~llama_index.vector_stores.normrank.NormRankVectorStore`: other
    stores rank raw vectors by their own metric (FAISS inner product: the raw dot product; L2:
    raw distance; ``SimpleVectorStore``: plain cosine), and this model warns once when it sees one.
    The async methods encode in a worker thread, so the event loop keeps running.

    Raises
    ------
    InvalidArgumentError
        Both an encoder and a model or device are given, or an unknown keyword argument.
    """

    model_config = ConfigDict(protected_namespaces=("pydantic_model_",), arbitrary_types_allowed=True, extra="forbid")

    model: str | None = Field(None, description="Local sentence-transformers folder; None = bundled model.")
    device: str = Field("cpu", description="Torch device.")
    backend: str = Field("torch", description="Encoder backend: torch, onnx or onnx-int8 (CPU; normrank[onnx]).")
    encoder_settings: dict[str, Any] | None = Field(
        None, description="The encoder's own settings (RawEncoder.describe(): model folder, window, backend, "
        "pooling), so that from_dict(to_dict()) rebuilds the same encoder.")
    _encoder: RawEncoder = PrivateAttr()
    _warned_stores: set[str] = PrivateAttr(default_factory=set)

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        encoder: RawEncoder | None = None,
        embed_batch_size: int = 64,
        device: str | None = None,
        backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        model_name = kwargs.pop("model_name", None)  # from_dict / to_dict round trips pass it back
        settings = kwargs.pop("encoder_settings", None)  # and the encoder as it was described
        unknown = sorted(set(kwargs) - _PASSED_ON)
        if unknown:
            raise InvalidArgumentError(
                f"NormRankEmbedding got unknown keyword arguments {unknown}; it takes model, encoder, "
                f"embed_batch_size, device and {sorted(_PASSED_ON)}")
        if encoder is not None and (model is not None or device is not None or backend is not None):
            raise InvalidArgumentError("give either an encoder or model/device/backend, not both")
        if encoder is not None:
            check_raw_encoder(encoder)
        elif settings is not None:
            encoder = _from_settings(settings, model, device, backend)
        enc = encoder or RawEncoder(model, batch_size=embed_batch_size, device=device or "cpu",
                                    backend=backend or "torch")
        if model_name is not None and model is None and encoder is None and model_name != enc.model_name:
            raise InvalidArgumentError(f"model_name {model_name!r} is not this embedding's model; pass model=...")
        super().__init__(model_name=enc.model_name, embed_batch_size=embed_batch_size,
                         model=None if model is None else str(model), device=enc.device, backend=enc.backend,
                         encoder_settings=enc.describe(), **kwargs)
        self._encoder = enc

    @classmethod
    def class_name(cls) -> str:
        return "NormRankEmbedding"

    @property
    def encoder(self) -> RawEncoder:
        """The raw encoder, shareable with a ``NormIndex`` or the postprocessor."""
        return self._encoder

    # The sync methods check the caller's store; the async ones check it before going to a worker
    # thread (the index is on the awaiting coroutines' frames) and then call the plain encoder.
    def _get_query_embedding(self, query: str) -> Embedding:
        self._check_store()
        return self._encode_one(query)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        self._check_store()
        return await asyncio.to_thread(self._encode_one, query)

    def _get_text_embedding(self, text: str) -> Embedding:
        self._check_store()
        return self._encode_one(text)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        self._check_store()
        return await asyncio.to_thread(self._encode_one, text)

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        self._check_store()
        return self._encode_many(texts)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        self._check_store()
        return await asyncio.to_thread(self._encode_many, texts)

    def _encode_one(self, text: str) -> Embedding:
        return self._encoder.encode([text])[0].tolist()

    def _encode_many(self, texts: list[str]) -> list[Embedding]:
        return self._encoder.encode(texts).tolist() if texts else []

    def _check_store(self) -> None:
        """Warn once per store type when a LlamaIndex index or retriever embeds with this model for a store
        that does not rank raw vectors by normrank's blend."""
        store = _calling_store()
        if store is None:
            return
        name = type(store).__name__
        if name == "NormRankVectorStore" or name in self._warned_stores:
            return
        self._warned_stores.add(name)
        warnings.warn(raw_metric_warning(name), RawVectorStoreWarning, stacklevel=4)


class RawVectorStoreWarning(UserWarning):
    """NormRankEmbedding's raw vectors went to a store that ranks them by its own metric, not by normrank's blend."""


#: BaseEmbedding settings NormRankEmbedding passes on unchanged.
_PASSED_ON = frozenset({"callback_manager", "num_workers", "embeddings_cache", "rate_limiter"})
#: How far up the call stack to look for the index or retriever that asked for an embedding.
_STACK_DEPTH = 40


def raw_metric_warning(store: str) -> str:
    """What a store does with raw vectors, and what to use instead."""
    if store == "SimpleVectorStore":
        return (f"{store} ranks NormRankEmbedding's raw vectors by plain cosine: its first stage applies no norm "
                "term (fine as candidates for llama_index.postprocessor.normrank.NormRankPostprocessor). For the "
                "exact blended first stage use llama_index.vector_stores.normrank.NormRankVectorStore.")
    return (f"{store} ranks NormRankEmbedding's raw (un-normalised) vectors by its own metric; with an "
            "inner-product or L2 index (FaissVectorStore's IndexFlatIP / IndexFlatL2, ...) that is the raw dot "
            "product or raw L2 distance, which is neither cosine nor normrank's blend, so even a re-ranker after "
            "it sees candidates chosen by vector length. Use llama_index.vector_stores.normrank.NormRankVectorStore, "
            "or a normalised embedding model with this store and NormRankPostprocessor after it.")


def _calling_store() -> Any:
    """The vector store of the nearest ``VectorStoreIndex`` / ``VectorIndexRetriever`` on the call stack, if any."""
    from llama_index.core.vector_stores.types import BasePydanticVectorStore

    try:
        frame = sys._getframe(2)
    except ValueError:  # pragma: no cover - no such frame
        return None
    for _ in range(_STACK_DEPTH):
        if frame is None:
            return None
        try:
            owner = frame.f_locals.get("self")
            store = getattr(owner, "_vector_store", None) if owner is not None else None
        except Exception:  # an object with an unusual __getattr__: not an index
            store = None
        if isinstance(store, BasePydanticVectorStore):
            return store
        frame = frame.f_back
    return None


def _from_settings(settings: Any, model: Any, device: str | None, backend: str | None) -> RawEncoder:
    """The encoder ``to_dict()`` described (window, pooling, model folder), for ``from_dict``: it held only
    model, device and backend, so an encoder with ``max_seq_length=64`` or norm pooling came back as the
    default one and gave other vectors, and one on a model folder did not come back at all."""
    from normrank.encoders import encoder_from_settings

    if not isinstance(settings, dict):
        raise InvalidArgumentError(f"encoder_settings must be a dict (RawEncoder.describe()), got {settings!r}")
    for name, given in (("model", model), ("device", device), ("backend", backend)):
        if given is not None and name in settings and str(given) != str(settings[name]):
            raise InvalidArgumentError(f"NormRankEmbedding got {name}={given!r} and encoder_settings with "
                                       f"{name}={settings[name]!r}; give one of them")
    return encoder_from_settings(settings, what="this NormRankEmbedding", fallback=False)
