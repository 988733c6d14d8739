"""Issue 10 (reliability round 2) for the FAISS store: each test failed on the code before the fix.

Real FAISS, real files, real threads; the only stand-in is a write step that raises ENOSPC
(a really full disk cannot be made portably), next to a real write limit (RLIMIT_FSIZE).
"""

from __future__ import annotations

import numpy as np
import pytest

from normrank import NormIndex, UnknownIdError, Weights
from tests.conftest import synthetic

DIM = 16


def make(n: int = 300, index_type: str = "flat", seed: int = 0, **kwargs) -> tuple[NormIndex, np.ndarray, np.ndarray]:
    vecs, counts = synthetic(n, dim=DIM, seed=seed)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type, nlist=4, **kwargs)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(n)], texts=[f"text {i}" for i in range(n)])
    return index, vecs, counts


# ------------------------------------------------------------------ vectors(ids)

@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_vectors_returns_the_added_raw_vectors_in_order(tmp_path, index_type):
    index, vecs, _ = make(index_type=index_type)
    index.delete(["d5", "d7"])
    order = [299, 0, 9, 100, 9]
    for ix in (index, NormIndex.load(index.save(tmp_path / "idx").parent)):
        got = ix.vectors([f"d{i}" for i in order])
        assert got.dtype == np.float32 and got.shape == (len(order), DIM)
        exp = vecs[order].astype(np.float64)
        unit_got = got / np.linalg.norm(got, axis=1, keepdims=True)
        np.testing.assert_allclose(unit_got, exp / np.linalg.norm(exp, axis=1, keepdims=True), atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(got.astype(np.float64), axis=1), np.linalg.norm(exp, axis=1),
                                   rtol=1e-6)
        with pytest.raises(UnknownIdError, match=r"unknown ids: \['d5'\]"):
            ix.vectors(["d1", "d5"])
        assert ix.vectors([]).shape == (0, DIM)
