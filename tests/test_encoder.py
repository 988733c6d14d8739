"""The raw encoder keeps the norm and nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest

from normrank import EmptyTextError, ModelLoadError, RawEncoder

TEXTS = [
    "hello world",
    "The Peace of Westphalia, signed in 1648, ended the Thirty Years' War.",
    "x",
    "Metformin lowers hepatic glucose production and is first-line for type 2 diabetes.",
]


def test_raw_norms_are_not_unit(encoder):
    vecs = encoder.encode(TEXTS)
    norms = np.linalg.norm(vecs, axis=1)
    assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), encoder.dim)
    assert np.all(np.abs(norms - 1.0) > 0.5), norms
    assert norms.std() > 0.05


def test_normalised_raw_vectors_equal_the_stock_model(encoder):
    from sentence_transformers import SentenceTransformer

    stock = SentenceTransformer(encoder.model_name, device="cpu")
    assert type(list(stock)[-1]).__name__ == "Normalize"
    expected = stock.encode(TEXTS, convert_to_numpy=True)
    raw = encoder.encode(TEXTS)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), expected, atol=1e-5)
    # The stock pipeline really does destroy the norm, even when asked not to normalise.
    unnormalised = stock.encode(TEXTS, normalize_embeddings=False)
    np.testing.assert_allclose(np.linalg.norm(unnormalised, axis=1), 1.0, atol=1e-5)


def test_token_counts_follow_the_models_tokenizer_and_truncation(encoder):
    long_text = "retrieval " * 1000
    counts = encoder.token_counts(["hello world", long_text])
    assert counts[0] == 4  # [CLS] hello world [SEP]
    assert counts[1] == encoder.model.max_seq_length == 256
    vecs, counts2 = encoder.encode_with_counts(["hello world", long_text])
    assert np.array_equal(counts, counts2) and vecs.shape[0] == 2


def test_blank_texts_are_refused(encoder):
    with pytest.raises(EmptyTextError, match="text 1 is empty or whitespace only"):
        encoder.encode(["fine", "   \n"])


def test_missing_model_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="does not exist"):
        RawEncoder(str(missing))


def test_fingerprint_is_stable_and_depends_on_settings(encoder):
    other = RawEncoder(encoder.model_name, max_seq_length=128)
    assert encoder.fingerprint == RawEncoder(encoder.model_name).fingerprint
    assert other.fingerprint != encoder.fingerprint
