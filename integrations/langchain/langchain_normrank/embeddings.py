"""``NormRankEmbeddings``: LangChain ``Embeddings`` that keep the raw (pre-normalisation) norm.

LangChain's HuggingFace embeddings keep the model's ``Normalize`` module even with
``normalize_embeddings=False``, so their vectors are unit length and the norm is gone.
These come from :class:`normrank.RawEncoder`: same direction as the stock model's
output, length left in, for users who want raw vectors in another store or analysis.
"""

from __future__ import annotations

import asyncio
import os

from langchain_core.embeddings import Embeddings

from normrank.encoders import RawEncoder
from normrank.errors import InvalidArgumentError


class NormRankEmbeddings(Embeddings):
    """Raw sentence embeddings (``list[float]`` per text) from the bundled or a local model.

    Parameters
    ----------
    model:
        A local sentence-transformers folder, or ``None`` for the bundled all-MiniLM-L6-v2.
    encoder:
        An existing :class:`normrank.RawEncoder` to share (then leave ``model``, ``batch_size``
        and ``device`` unset).
    batch_size, device:
        Passed to the encoder (defaults 64 and ``"cpu"``).
    backend:
        The encoder's backend: ``"torch"`` (default), or ``"onnx"`` / ``"onnx-int8"`` on ONNX Runtime
        (CPU; ``pip install 'normrank[onnx]'``; see :class:`normrank.RawEncoder`).

    Raises
    ------
    InvalidArgumentError
        Both an encoder and encoder settings are given.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        encoder: RawEncoder | None = None,
        batch_size: int | None = None,
        device: str | None = None,
        backend: str | None = None,
    ) -> None:
        if encoder is not None:
            if model is not None or batch_size is not None or device is not None or backend is not None:
                raise InvalidArgumentError("give either an encoder or model/batch_size/device/backend, not both")
            self.encoder = encoder
        else:
            self.encoder = RawEncoder(model, batch_size=batch_size or 64, device=device or "cpu",
                                      backend=backend or "torch")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Raw vectors of ``texts`` (an empty list gives an empty list)."""
        if not texts:
            return []
        return self.encoder.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """The raw vector of one query."""
        return self.encoder.encode([text])[0].tolist()

    def token_counts(self, texts: list[str]) -> list[int]:
        """Tokens the model sees per text: the length the norm calibration conditions on."""
        return self.encoder.token_counts(texts).tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents`, run in a worker thread so the event loop stays free."""
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`, run in a worker thread."""
        return await asyncio.to_thread(self.embed_query, text)
