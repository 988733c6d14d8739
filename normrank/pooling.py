"""Norm-aware pooling: an encoder mode that weights each token by its own contextual norm.

Stock sentence-transformers models mean-pool their token embeddings. In the spirit of
Word Rotator's Distance (Yokoi et al. 2020: a token's norm is its importance) and SIF
(Arora et al. 2017: down-weight frequent words), :class:`PooledEncoder` pools with
other weights instead:

* ``mean``: the stock pooling (the same vectors as :class:`normrank.RawEncoder`);
* ``norm``: weights ``||t_i||``, so tokens the model treats as salient count more;
* ``norm2``: weights ``||t_i||^2`` (sharper);
* ``inv_norm``: weights ``1 / ||t_i||`` (the opposite hypothesis, for the record);
* ``sif``: weights ``a / (a + p(token))`` with ``p`` the token's English word frequency
  from ``wordfreq`` (installed with ``normrank[bench]``).

Measured as a first-stage retriever with all-MiniLM-L6-v2 (``benchmarks/research.py``;
``benchmarks/results/research.md``). Against mean pooling, nDCG@10 changed on
scifact / cranfield / cisi by:

* norm: -0.010 / +0.000 / -0.013;
* norm2: -0.027 (p = 0.002) / -0.008 / -0.034 (p = 0.017);
* inv_norm: -0.003 / -0.007 / +0.005;
* sif: +0.004 / +0.006 / +0.001 (none significant).

The model was trained with mean pooling, so ``mean`` stays the default everywhere.
This encoder is an opt-in mode, kept so the experiment can be re-run on other models.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from normrank.encoders import RawEncoder, check_texts
from normrank.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

POOLINGS: tuple[str, ...] = ("mean", "norm", "norm2", "inv_norm", "sif")


def pool(tokens: np.ndarray, mask: np.ndarray, mode: str, token_weights: np.ndarray | None = None) -> np.ndarray:
    """Pool a batch of token embeddings ``(n, t, dim)`` under ``mask`` ``(n, t)`` with ``mode``.

    ``token_weights`` (``(n, t)``) is required for ``sif`` and ignored otherwise.
    """
    if mode not in POOLINGS:
        raise InvalidArgumentError(f"unknown pooling {mode!r}; choose one of {list(POOLINGS)}")
    tokens = np.asarray(tokens, dtype=np.float32)
    m = np.asarray(mask, dtype=np.float32)
    if mode == "mean":
        w = m
    elif mode == "sif":
        if token_weights is None:
            raise InvalidArgumentError("sif pooling needs token_weights (a / (a + p(token))) per token")
        w = m * np.asarray(token_weights, dtype=np.float32)
    else:
        norms = np.linalg.norm(tokens, axis=2)
        if mode == "norm":
            w = m * norms
        elif mode == "norm2":
            w = m * norms**2
        else:
            w = m / np.maximum(norms, 1e-6)
    denom = np.maximum(w.sum(axis=1, keepdims=True), 1e-9)
    return (tokens * w[:, :, None]).sum(axis=1) / denom


def check_sif_a(value: Any) -> float:
    """The SIF constant as a float: a positive, finite number (infinity made every weight NaN), else
    ``InvalidArgumentError``; the one check the encoder and the re-rankers' settings share."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not (np.isfinite(value) and value > 0):
        raise InvalidArgumentError(f"sif_a must be a positive finite number, got {value!r}")
    return float(value)


class PooledEncoder(RawEncoder):
    """A :class:`RawEncoder` whose sentence vector is a re-weighted pooling of token embeddings.

    Parameters
    ----------
    model:
        As for :class:`RawEncoder` (``None`` = bundled all-MiniLM-L6-v2).
    pooling:
        One of :data:`POOLINGS`; ``"mean"`` reproduces the stock vectors.
    sif_a:
        The SIF smoothing constant ``a`` (Arora et al. use 1e-3).

    Token counts, caching and the index work exactly as with :class:`RawEncoder`; the
    cache key (``fingerprint``) includes the pooling, so modes never share cache entries.
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *, pooling: str = "norm",
                 sif_a: float = 1e-3, **kwargs: Any) -> None:
        if pooling not in POOLINGS:
            raise InvalidArgumentError(f"unknown pooling {pooling!r}; choose one of {list(POOLINGS)}")
        sif_a = check_sif_a(sif_a)
        super().__init__(model, **kwargs)
        self.pooling = pooling
        self.sif_a = sif_a
        self._vocab_weights: np.ndarray | None = None

    @property
    def model_fingerprint(self) -> str:
        """The model's fingerprint without the pooling: one forward pass serves every pooling."""
        return RawEncoder.fingerprint.fget(self)  # type: ignore[attr-defined]

    @property
    def fingerprint(self) -> str:
        base = self.model_fingerprint
        return hashlib.sha256(f"{base}|pool={self.pooling}|a={self.sif_a}".encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "pooling": self.pooling, "sif_a": self.sif_a}

    def vocab_weights(self) -> np.ndarray:
        """SIF weight ``a / (a + p)`` for every id in the tokenizer's vocabulary (special tokens: 1)."""
        if self._vocab_weights is None:
            try:
                from wordfreq import word_frequency
            except ImportError as exc:
                raise ImportError("sif pooling needs wordfreq: pip install 'normrank[bench]'") from exc
            tok = self.model.tokenizer
            with self._lock:  # the tokenizer is shared with other threads
                special = set(tok.all_special_ids)
                vocab = tok.get_vocab()
            out = np.ones(len(vocab) if max(vocab.values()) < len(vocab) else max(vocab.values()) + 1,
                          dtype=np.float32)
            for piece, idx in vocab.items():
                if idx in special:
                    continue
                word = piece[2:] if piece.startswith("##") else piece
                out[idx] = self.sif_a / (self.sif_a + word_frequency(word, "en"))
            self._vocab_weights = out
        return self._vocab_weights

    def _encode_prepared(self, heads: list[str], show: bool) -> np.ndarray:
        """Pooled raw float32 embeddings of texts already cut by ``_prepare``, shape (n, dim)."""
        return self._pool(heads, (self.pooling,), show)[self.pooling]

    def encode_poolings(self, texts: Sequence[str], poolings: Sequence[str] = POOLINGS, *,
                        show_progress: bool | None = None) -> dict[str, np.ndarray]:
        """Several poolings of the same forward pass (one model run for all of them)."""
        items = check_texts(texts)
        for p in poolings:
            if p not in POOLINGS:
                raise InvalidArgumentError(f"unknown pooling {p!r}; choose one of {list(POOLINGS)}")
        if not items:
            return {p: np.zeros((0, self.dim), dtype=np.float32) for p in poolings}
        heads, _counts, truncated = self._prepare(items)
        self._note_truncation(truncated)
        return self._pool(heads, poolings, self._progress(len(items), show_progress))

    def _pool(self, items: list[str], poolings: Sequence[str], show: bool) -> dict[str, np.ndarray]:
        dim = self.dim
        out = {p: np.zeros((len(items), dim), dtype=np.float32) for p in poolings}
        weights = self.vocab_weights() if "sif" in poolings else None
        done = 0
        for n_batch, (idx, features) in enumerate(self._forward_batches(items)):  # torch's or the ONNX session
            tokens = features["token_embeddings"].float().cpu().numpy()
            mask = features["attention_mask"].cpu().numpy()
            ids = features["input_ids"].cpu().numpy()
            tw = weights[ids] if weights is not None else None
            for p in poolings:
                out[p][idx] = pool(tokens, mask, p, tw)
            done += len(idx)
            if show and n_batch % 20 == 0:
                logger.info("pooled %d / %d texts", done, len(items))
        return out
