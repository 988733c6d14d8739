"""The encoding cache (``normrank.cache``): an entry is never worth failing over, and a failed write leaves
nothing behind. Real model, real files."""

from __future__ import annotations

import errno
import logging

import numpy as np
import pytest

from normrank import cache

TEXTS = ["Stars fuse hydrogen into helium.", "Vaccines train the immune system.", "Rivers carve valleys."]


@pytest.mark.parametrize("damage", ["truncated", "empty", "not a zip"])
def test_a_damaged_cache_entry_is_encoded_again_and_rewritten(encoder, tmp_path, caplog, damage):
    """A cut or emptied entry (a power loss, a full disk) raised BadZipFile or EOFError on every later run
    of `normrank index` and `eval`, called 'unexpected' and naming no file."""
    want = cache.encode_cached(encoder, TEXTS, folder=tmp_path)
    path = tmp_path / f"{cache.cache_key(encoder, TEXTS)}.npz"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "not a zip": b"hello"}[damage])
    with caplog.at_level(logging.WARNING, logger="normrank.cache"):
        vecs, counts = cache.encode_cached(encoder, TEXTS, folder=tmp_path)
    assert str(path) in caplog.text and "encoding again" in caplog.text
    np.testing.assert_allclose(vecs, want[0], rtol=1e-5, atol=1e-6)
    assert counts.tolist() == want[1].tolist()
    with np.load(path) as entry:  # written anew, whole
        assert entry["vectors"].shape == want[0].shape


def test_a_write_that_fails_leaves_no_partial_file(encoder, tmp_path, monkeypatch, caplog):
    """On a full disk the part written stayed as a tmp*.npz file, turning 'the cache did not fit' into a
    full disk that broke later saves."""
    real_savez = np.savez

    def disk_full(file, **arrays):
        real_savez(file, **arrays)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.np, "savez", disk_full)
    with caplog.at_level(logging.WARNING, logger="normrank.cache"):
        vecs, counts = cache.encode_cached(encoder, TEXTS, folder=tmp_path)
    assert vecs.shape[0] == 3 and "could not write the encoding cache" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_a_module_folder_retrained_in_place_gets_a_new_key(tmp_path):
    """The key hashed a fixed list of top-level files: a ``2_Dense`` head (or a ``0_Transformer/`` folder)
    retrained and saved in place kept the key, and the cache served the old model's vectors."""
    import shutil

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense

    from normrank import RawEncoder
    from normrank.encoders import default_model_path

    root = tmp_path / "with-head"
    st = SentenceTransformer(str(default_model_path()), device="cpu")
    dense = Dense(384, 384, activation_function=torch.nn.Identity())
    torch.manual_seed(0)
    torch.nn.init.normal_(dense.linear.weight, std=0.1)
    SentenceTransformer(modules=[*(m for m in st if type(m).__name__ != "Normalize"), dense], device="cpu").save(
        str(root))
    plain = tmp_path / "plain"  # the usual layout: nothing beyond the listed files, the key as before
    shutil.copytree(default_model_path(), plain)
    before_plain = RawEncoder(str(plain)).fingerprint
    texts = ["hello world", "a second text"]
    first = RawEncoder(str(root))
    old, _ = cache.encode_cached(first, texts, folder=tmp_path / "cache")
    torch.manual_seed(1)
    torch.nn.init.normal_(dense.linear.weight, std=0.1)
    dense.save(str(root / "2_Dense"))  # same file names and sizes
    again = RawEncoder(str(root))
    assert again.fingerprint != first.fingerprint
    got, _ = cache.encode_cached(again, texts, folder=tmp_path / "cache")
    np.testing.assert_allclose(got, again.encode(texts), atol=1e-5)
    assert not np.allclose(got, old)
    assert RawEncoder(str(plain)).fingerprint == before_plain


@pytest.mark.parametrize(("texts", "error"), [(["ok", "\udcff"], "InvalidTextError"), (["ok", 5], "InvalidArgumentError")])
def test_bad_texts_are_named_before_the_cache_key(encoder, tmp_path, texts, error):
    """A lone surrogate or a non-string was a bare UnicodeEncodeError / AttributeError from the key's hash."""
    from normrank import errors

    with pytest.raises(getattr(errors, error)):
        cache.encode_cached(encoder, texts, folder=tmp_path)
    assert not list(tmp_path.iterdir())
