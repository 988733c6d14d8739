"""``NormRankEmbedding``: a LlamaIndex embedding model that keeps the raw norm.

LlamaIndex's HuggingFace embedding keeps the model's ``Normalize`` module, so its
vectors are unit length. These come from :class:`normrank.RawEncoder`: the same
direction (so a ``VectorStoreIndex`` ranks by the same cosine), the norm left in,
so :class:`~llama_index.postprocessor.normrank.NormRankPostprocessor` can reuse them instead of
re-encoding.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

from normrank.encoders import RawEncoder
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

    Raises
    ------
    InvalidArgumentError
        Both an encoder and a model or device are given.
    """

    model: str | None = Field(None, description="Local sentence-transformers folder; None = bundled model.")
    device: str = Field("cpu", description="Torch device.")
    _encoder: RawEncoder = PrivateAttr()

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        encoder: RawEncoder | None = None,
        embed_batch_size: int = 64,
        device: str | None = None,
        **kwargs: Any,
    ) -> None:
        if encoder is not None and (model is not None or device is not None):
            raise InvalidArgumentError("give either an encoder or model/device, not both")
        enc = encoder or RawEncoder(model, batch_size=embed_batch_size, device=device or "cpu")
        super().__init__(model_name=enc.model_name, embed_batch_size=embed_batch_size,
                         model=None if model is None else str(model), device=enc.device, **kwargs)
        self._encoder = enc

    @classmethod
    def class_name(cls) -> str:
        return "NormRankEmbedding"

    @property
    def encoder(self) -> RawEncoder:
        """The raw encoder, shareable with a ``NormIndex`` or the postprocessor."""
        return self._encoder

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encoder.encode([query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encoder.encode([text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._encoder.encode(texts).tolist() if texts else []

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)
