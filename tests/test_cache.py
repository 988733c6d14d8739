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
