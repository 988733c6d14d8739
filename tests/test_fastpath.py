"""``normrank._fastpath`` (the optional C hot path) against the Python path it replaces, on real FAISS indexes.

Each case runs the same searches twice in one process, once with the C functions and once with
``normrank.fastpath``'s Python ones, and asks for equal ``Hit`` lists: ids, order and every float to the
last bit. A subprocess with ``NORMRANK_PURE_PYTHON=1`` checks that the switch users have is honoured.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import weakref
from dataclasses import asdict, field, fields, make_dataclass, replace

import numpy as np
import pytest

import normrank.store as store_mod
from normrank import Hit, NormIndex, Weights, fastpath, scoring
from tests.conftest import synthetic

DIM = 48
needs_c = pytest.mark.skipif(not fastpath.accelerated(), reason="normrank._fastpath was not built here")


@pytest.fixture
def pure_python(monkeypatch):
    """Switch the store to the Python functions for the duration of a ``with``."""
    class Switch:
        def __enter__(self):
            monkeypatch.setattr(store_mod, "unit_into", fastpath._unit_into)
            monkeypatch.setattr(store_mod, "hit_rows", fastpath._hit_rows)
            monkeypatch.setattr(store_mod, "array_rows", fastpath._array_rows)
            monkeypatch.setattr(fastpath, "units_into", fastpath._units_into)
            monkeypatch.setattr(fastpath, "scan_topk", None)  # FAISS's heaps
            monkeypatch.setattr(fastpath, "lean_batch", None)

        def __exit__(self, *exc):
            monkeypatch.undo()

    return Switch()


def _corpus(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return synthetic(n, dim=DIM, seed=seed)


def _build(index_type: str = "flat", n: int = 600, **kw) -> NormIndex:
    vecs, counts = _corpus(n, seed=5)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type, **kw)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(n)], texts=[f"text {i}" for i in range(n)],
                      metadatas=[{"n": i, "tags": ["x", i]} if i % 3 else {} for i in range(n)])
    return index


def _searches(index: NormIndex, queries: np.ndarray) -> list:
    out = [index.search(q, 10) for q in queries]  # the single-vector path
    out += index.search_batch(list(queries[:4]), 10)  # a small batch: FAISS's kernel
    out += index.search_batch(list(queries), 7)  # an sgemm batch
    out += index.search_batch(queries, 7)  # a matrix: one C call for the unit rows and the scan
    out += index.search_batch(queries.astype(np.float64), 4, query_token_counts=[5] * len(queries))
    got = index.search_arrays(queries, 5)
    out.append([got.ids, got.scores.tolist(), got.cosines.tolist()])
    out += [index.search(q.astype(np.float64), 3) for q in queries[:3]]  # float64 queries
    out += [index.search(np.asfortranarray(np.stack([q, q]))[0], 5) for q in queries[:3]]  # a strided vector
    out += [index.search(q.astype(np.float16), 4) for q in queries[:2]]  # a dtype the C code does not read
    for q in queries[:4]:  # search_arrays of one query: its single-vector path
        got = index.search_arrays(q[None, :], 6)
        out.append([got.ids, got.scores.tolist(), got.cosines.tolist(), got.scores.flags.c_contiguous])
    return out


def _fields(rows: list) -> list:
    """Every value of every hit, as plain data: equal lists mean equal hits to the last bit."""
    return [[tuple(asdict(h).values()) if isinstance(h, Hit) else h for h in row] for row in rows]


@needs_c
@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_c_and_python_give_the_same_hits(index_type, pure_python):
    index = _build(index_type)
    queries, _ = _corpus(12, seed=6)
    fast = _fields(_searches(index, queries))
    with pure_python:
        slow = _fields(_searches(index, queries))
    assert fast == slow
    assert all(len(row) for row in fast)


@needs_c
def test_same_hits_after_deletes_adds_and_a_load_with_position_gaps(tmp_path, monkeypatch, pure_python):
    """Positions that are not internal ids (an index saved with gaps by an older normrank) are mapped
    through the labels in C as in Python; pending deletes take the general path in both."""
    index = _build()
    queries, _ = _corpus(12, seed=7)
    index.delete([f"d{i}" for i in range(0, 600, 4)])
    index.add_vectors(*_corpus(5, seed=8), ids=[f"n{i}" for i in range(5)])
    with monkeypatch.context() as m:
        m.setattr(NormIndex, "_renumber_flat", lambda self: None)  # an older normrank's compaction
        index._compact()
        index.save(tmp_path / "gaps")
    loaded = NormIndex.load(tmp_path / "gaps")
    loaded.search(queries[0], 1)
    assert not loaded._positions_are_ids
    for idx in (index, loaded):
        fast = _fields(_searches(idx, queries))
        with pure_python:
            slow = _fields(_searches(idx, queries))
        assert fast == slow


@needs_c
def test_equal_scores_fall_back_to_the_ordered_path(pure_python):
    """Duplicates tie; the C builder hands such a row back (``None``) and the Python ordering answers:
    ties in insertion order, with every path alike."""
    vecs, counts = _corpus(50, seed=9)
    vecs = np.concatenate([np.repeat(vecs[:1], 6, axis=0), vecs[1:]])
    counts = np.concatenate([np.repeat(counts[:1], 6), counts[1:]])
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(len(vecs))])
    for k in (2, 4, 8):
        fast = index.search(vecs[0], k)
        with pure_python:
            assert _fields([fast]) == _fields([index.search(vecs[0], k)])
        assert [h.id for h in fast[: min(k, 6)]] == [f"d{i}" for i in range(min(k, 6))]


@needs_c
def test_unit_vector_is_numpys_to_the_last_bit():
    rng = np.random.default_rng(0)
    for dim in (1, 7, 8, 9, 127, 128, 129, 300, 384, 385, 768, 1024, 1536):
        for scale in (1e-3, 1.0, 37.0, 1e15):
            v = (rng.standard_normal(dim) * scale).astype(np.float32)
            c_out, py_out = np.zeros(dim, np.float32), np.zeros(dim, np.float32)
            norm_c, norm_py = fastpath.unit_into(v, c_out), fastpath._unit_into(v, py_out)
            assert norm_c == norm_py == float(np.linalg.norm(v[None].astype(np.float64), axis=1)[0])
            assert np.array_equal(c_out, py_out)
            assert np.array_equal(c_out, (v[None] / np.float32(norm_c))[0])
            v64 = v.astype(np.float64) * 1.0000001
            c64, p64 = np.zeros(dim, np.float32), np.zeros(dim, np.float32)
            assert fastpath.unit_into(v64, c64) == fastpath._unit_into(v64, p64) and np.array_equal(c64, p64)


@needs_c
def test_unit_rows_of_a_batch_are_numpys_to_the_last_bit():
    rng = np.random.default_rng(1)
    c = fastpath._c
    for n, dim, width in ((1, 384, 392), (64, 384, 385), (5, 129, 129), (3, 7, 16)):
        for dtype in (np.float32, np.float64):
            mat = (rng.standard_normal((n, dim)) * rng.uniform(0.01, 50, (n, 1))).astype(dtype)
            outs = [np.full((n, width), np.nan, np.float32) for _ in range(2)]
            norms = [np.empty(n) for _ in range(2)]
            assert c.units_into(mat, outs[0], norms[0], 1e-6) and fastpath._units_into(mat, outs[1], norms[1], 1e-6)
            assert np.array_equal(outs[0], outs[1]) and np.array_equal(norms[0], norms[1])
            assert np.array_equal(norms[0], np.linalg.norm(mat.astype(np.float32).astype(np.float64), axis=1))
            assert not outs[0][:, dim:].any()
    mat = rng.standard_normal((4, 8)).astype(np.float32)
    out, norms = np.empty((4, 8), np.float32), np.empty(4)
    for bad in (np.zeros(8), np.full(8, np.nan), np.full(8, 3e38)):
        worse = mat.copy()
        worse[2] = bad
        assert not c.units_into(worse, out, norms, 1e-6) and not fastpath._units_into(worse, out, norms, 1e-6)
    assert not c.units_into(np.asfortranarray(mat), out, norms, 1e-6)  # a layout it leaves to NumPy
    assert fastpath.units_into(np.asfortranarray(mat), out, norms, 1e-6)  # which reads it
    with pytest.raises(ValueError):
        c.units_into(mat, np.empty((4, 7), np.float32), norms, 1e-6)


@needs_c
@pytest.mark.parametrize("bad", [np.zeros(8), np.full(8, np.nan), np.r_[np.ones(7), np.inf],
                                 np.full(8, 3e38, dtype=np.float32), np.full(8, 1e39)])
def test_unit_vector_refuses_what_python_refuses(bad):
    assert fastpath.unit_into(bad, np.zeros(8, np.float32)) is None
    assert fastpath._unit_into(bad, np.zeros(8, np.float32)) is None


@needs_c
def test_unit_vector_leaves_other_layouts_to_the_general_path():
    out = np.zeros(4, np.float32)
    assert fastpath.unit_into(np.ones(8, np.float32)[::2], out) is None  # strided
    assert fastpath.unit_into(np.ones(4, np.float16), out) is None
    assert fastpath.unit_into(np.ones(4, ">f4"), out) is None  # byte-swapped
    with pytest.raises(ValueError, match="shorter"):
        fastpath.unit_into(np.ones(5, np.float32), out)


@needs_c
def test_hit_rows_checks_what_it_is_given():
    index = _build(n=40)
    cols = index._docs.hit_columns()
    rows, scores = np.array([[0, 1, 2]], np.int64), np.array([[0.3, 0.2, 0.1]], np.float32)
    assert [h.id for h in fastpath.hit_rows(rows, scores, 3, 0.1, None, cols, 1)[0]] == ["d0", "d1", "d2"]
    with pytest.raises(IndexError):
        fastpath.hit_rows(np.array([[0, 99]], np.int64), scores[:, :2], 2, 0.1, None, cols, 0)
    with pytest.raises(TypeError):
        fastpath.hit_rows(rows.astype(np.int32), scores, 3, 0.1, None, cols, 0)
    with pytest.raises(ValueError):
        fastpath.hit_rows(rows, scores, 4, 0.1, None, cols, 0)
    out_s, cos = np.zeros((1, 3), np.float32), np.zeros((1, 3))
    for impl in (fastpath.array_rows, fastpath._array_rows):
        assert impl(rows, scores, 3, 0.1, None, cols, out_s, cos, 1) == [["d0", "d1", "d2"]]
        assert out_s.tolist() == scores.tolist()
        assert cos.tolist() == [[float(s) - 0.1 * index._docs.g[i] for i, s in enumerate(scores[0])]]
        assert impl(np.array([[0, -1, 2]]), scores, 3, 0.1, None, cols, out_s, cos, 1) is None
        wide_rows, wide_scores = np.array([[0, 1, 2, 3]]), np.array([[0.3, 0.2, 0.1, 0.1]], np.float32)
        assert impl(wide_rows, wide_scores, 3, 0.1, None, cols, out_s, cos, 2) is None  # a tie across the cut
        assert impl(wide_rows, wide_scores, 3, 0.1, None, cols, out_s, cos, 1) == [["d0", "d1", "d2"]]
        with pytest.raises(ValueError):
            impl(rows, scores, 3, 0.1, None, cols, out_s, np.zeros((1, 2)), 1)
    for impl in (fastpath.hit_rows, fastpath._hit_rows):
        assert impl(wide_rows, wide_scores, 3, 0.1, None, cols, 2) is None
        assert [h.id for h in impl(wide_rows, wide_scores, 3, 0.1, None, cols, 1)[0]] == ["d0", "d1", "d2"]


def test_hits_are_slotted_values_that_copy_and_pickle():
    hit = Hit(id="a", score=0.5, cosine=0.4, norm=2.0, norm_feature=0.1, weight=0.02, token_count=3,
              metadata={"k": [1]})
    assert not hasattr(hit, "__dict__")
    assert pickle.loads(pickle.dumps(hit)) == hit and replace(hit, score=1.0).score == 1.0
    with pytest.raises(AttributeError):
        hit.score = 2.0  # type: ignore[misc]
    index = _build(n=40)
    found = index.search(_corpus(1, seed=3)[0][0], 3)
    assert all(type(h) is Hit and not hasattr(h, "__dict__") for h in found)
    found[0].metadata["mutated"] = True  # a copy: the stored metadata is not touched
    assert "mutated" not in (index.get([found[0].id])[0].metadata)


def _hit_before_slots() -> type:
    """``Hit`` as normrank defined it before the slots (a ``__dict__`` per hit), under the same module and
    name, so that pickle records it as ``normrank.scoring.Hit``."""
    spec = [(f.name, f.type, field(default=f.default, default_factory=f.default_factory)) for f in fields(Hit)]
    cls = make_dataclass("Hit", spec, frozen=True)
    cls.__module__ = "normrank.scoring"
    return cls


def test_pickles_read_both_ways_across_the_slots_change(monkeypatch):
    """A hit a service cached with pickle before the slots loads with its values (a slotted dataclass's
    default ``__setstate__`` zipped the fields with the old dict's keys: every field got its own name), and
    a pickle made now loads in a normrank from before (its state is still a dict of fields)."""
    fields_ = {"id": "doc-7", "score": 0.5, "cosine": 0.4, "norm": 2.0, "norm_feature": 0.1, "weight": 0.02,
               "token_count": 3, "text": "hello", "metadata": {"k": [1]}}
    old_cls = _hit_before_slots()
    with monkeypatch.context() as m:  # pickle finds the class by its module and name, as an old normrank's
        m.setattr(scoring, "Hit", old_cls)
        old_bytes = [pickle.dumps(old_cls(**fields_), protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
    for data in old_bytes:
        loaded = pickle.loads(data)
        assert type(loaded) is Hit and asdict(loaded) == fields_
    new_bytes = pickle.dumps(Hit(**fields_))

    class BeforeSlots(pickle.Unpickler):
        def find_class(self, module, name):
            return old_cls if (module, name) == ("normrank.scoring", "Hit") else super().find_class(module, name)

    assert asdict(BeforeSlots(io.BytesIO(new_bytes)).load()) == fields_
    with pytest.raises(TypeError, match="without the fields"):
        Hit.__new__(Hit).__setstate__({"id": "x"})


def test_hits_can_be_weakly_referenced():
    hit = Hit(id="a", score=0.5, cosine=0.4, norm=2.0, norm_feature=0.1, weight=0.02, token_count=3)
    ref = weakref.ref(hit)
    cache = weakref.WeakValueDictionary({"a": hit})
    assert ref() is hit and cache["a"] is hit
    found = _build(n=40).search(_corpus(1, seed=3)[0][0], 3)  # built by the C code where it runs
    assert weakref.ref(found[0])() is found[0]


def test_pure_python_switch_gives_the_same_answers(tmp_path):
    """``NORMRANK_PURE_PYTHON=1`` turns the C module off; the answers stay the same."""
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        sys.path.insert(0, {os.getcwd()!r})
        import normrank.fastpath as fp
        from normrank import NormIndex, Weights
        from tests.conftest import synthetic
        vecs, counts = synthetic(300, dim={DIM}, seed=5)
        index = NormIndex(dim={DIM}, weights=Weights(a=0.05))
        index.add_vectors(vecs, counts, ids=[f"d{{i}}" for i in range(300)])
        qs, _ = synthetic(6, dim={DIM}, seed=6)
        rows = [[[h.id, h.score, h.cosine, h.norm_feature] for h in index.search(q, 5)] for q in qs]
        print(json.dumps({{"c": fp.accelerated(), "rows": rows}}))
    """)
    runs = {}
    for flag in ("0", "1"):
        env = {**os.environ, "NORMRANK_PURE_PYTHON": flag}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        runs[flag] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["1"]["c"] is False and runs["0"]["c"] is fastpath.accelerated()
    assert runs["0"]["rows"] == runs["1"]["rows"]


@pytest.mark.skipif(os.environ.get("NORMRANK_PURE_PYTHON", "") not in ("", "0"), reason="turned off on purpose")
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_the_accelerator_is_built_where_a_compiler_is():
    """``pip install`` builds the optional extension when it can; a missing build here means the
    install step (setup.py) broke, which the fallback would otherwise hide."""
    assert fastpath.accelerated()


def test_a_stale_build_is_left_unused_with_a_warning():
    """An editable install whose C module was built from older sources (another API version) must not be
    called with this version's arguments: the Python path answers, and a warning says to rebuild."""
    script = textwrap.dedent(f"""
        import sys, types, warnings
        sys.path.insert(0, {os.getcwd()!r})
        sys.modules["normrank._fastpath"] = types.ModuleType("normrank._fastpath")  # no API_VERSION
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            import normrank.fastpath as fp
        print(fp.accelerated(), any("Rebuild it" in str(w.message) for w in seen))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def _faiss_heaps_topk(flat, q: np.ndarray, k: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    from normrank import batch_topk

    saved, fastpath.scan_topk = fastpath.scan_topk, None
    try:
        return batch_topk.sgemm_topk(flat, q, k, width)
    finally:
        fastpath.scan_topk = saved


@needs_c
def test_the_c_heaps_keep_faiss_heaps_answer_to_the_last_bit():
    """scan_topk's heaps skip losing scores 16 at a time; what they keep, and in which order, must be what
    FAISS's heaps keep: equal scores (whole-number vectors tie often), NaN rows, zero rows, k above the
    number of vectors, any block size and any width."""
    import faiss

    from normrank import faiss_blas
    from normrank.batch_topk import stored_vectors

    sgemm = faiss_blas.sgemm()
    if sgemm is None:
        pytest.skip("no bundled OpenBLAS in this faiss build")
    rng = np.random.default_rng(11)
    for trial in range(120):
        n, d, rows, k = int(rng.integers(1, 2500)), int(rng.integers(1, 33)), int(rng.integers(1, 40)), int(rng.integers(1, 25))
        xb = rng.normal(size=(n, d)).astype(np.float32)
        q = rng.normal(size=(rows, d)).astype(np.float32)
        if trial % 2:  # whole numbers: many equal scores
            xb, q = np.round(xb).astype(np.float32), np.round(q).astype(np.float32)
        if trial % 5 == 0:
            xb[rng.integers(0, n, 3)] = np.nan
            xb[rng.integers(0, n, 3)] = 0.0
        width, step = int(rng.integers(1, d + 1)), int(rng.integers(1, 3000))
        flat = faiss.IndexFlatIP(d)
        flat.add(xb)
        want_s, want_p = _faiss_heaps_topk(flat, q, k, width)
        got_s, got_p = np.empty((rows, k), np.float32), np.empty((rows, k), np.int64)
        fastpath.scan_topk(sgemm.address, q, stored_vectors(flat), width, step, got_s, got_p)
        assert np.array_equal(got_p, want_p), trial
        assert np.array_equal(got_s, want_s, equal_nan=True), trial
        assert min(k, n) == 0 or (got_p[:, :min(k, n)] >= 0).all() or np.isnan(xb).any()


@needs_c
def test_one_call_batch_matches_the_steps_it_replaces():
    """lean_batch writes the augmented queries and scans them in one call: the same float32 rows as
    _plain_batch plus the weight column, and the same scores and positions as sgemm_topk over them."""
    from normrank import batch_topk
    from normrank.index_base import _plain_batch

    index = _build(n=900)
    inner, _ = index._flat_parts()
    queries, _ = _corpus(40, seed=12)
    for q in (queries, queries.astype(np.float64)):
        found = batch_topk.raw_batch_topk(q, [3] * len(q), DIM, 0.625, index._flat_vectors, 11)
        assert found is not None
        qaug, scores, pos = found
        want = _plain_batch(q, None, DIM, inner.d)[0]
        want[:, DIM] = 0.625
        assert np.array_equal(qaug, want)
        want_s, want_p = batch_topk.sgemm_topk(inner, want, 11, DIM + 1)
        assert np.array_equal(scores, want_s) and np.array_equal(pos, want_p)


@needs_c
@pytest.mark.parametrize("case", ["bool count", "numpy count", "zero count", "count too big", "counts short",
                                  "nan row", "zero row", "fortran", "rows of a list", "too few rows",
                                  "other width"])
def test_one_call_batch_leaves_other_batches_to_the_general_path(case, pure_python):
    """Anything but a plain float matrix with plain counts goes to the general path, which reads it or names
    what is wrong, exactly as without the C module."""
    from normrank import batch_topk
    from normrank.errors import NormRankError

    index = _build(n=300)
    queries, _ = _corpus(20, seed=13)
    counts: list = [4] * 20
    q: object = queries.copy()
    if case == "bool count":
        counts[3] = True
    elif case == "numpy count":
        counts[3] = np.int64(4)
    elif case == "zero count":
        counts[3] = 0
    elif case == "count too big":
        counts[3] = 2**31
    elif case == "counts short":
        counts = counts[:-1]
    elif case == "nan row":
        queries[2, 5] = np.nan
        q = queries
    elif case == "zero row":
        queries[2] = 0.0
        q = queries
    elif case == "fortran":
        q = np.asfortranarray(queries)
    elif case == "rows of a list":
        q = list(queries)
    elif case == "too few rows":
        q = queries[: batch_topk.SGEMM_MIN_BATCH - 1]
        counts = counts[: batch_topk.SGEMM_MIN_BATCH - 1]
    elif case == "other width":
        q = queries[:, :-1]
    assert batch_topk.raw_batch_topk(q, counts, DIM, 0.5, index._flat_vectors, 5) is None

    def answer():
        try:
            return _fields(index.search_batch(q, 5, query_token_counts=counts))
        except NormRankError as exc:
            return type(exc).__name__, str(exc)

    fast = answer()
    with pure_python:
        slow = answer()
    assert fast == slow


@needs_c
def test_the_c_scan_checks_what_it_is_given():
    import faiss

    from normrank import faiss_blas

    sgemm = faiss_blas.sgemm()
    if sgemm is None:
        pytest.skip("no bundled OpenBLAS in this faiss build")
    q, xb = np.ones((3, 4), np.float32), np.ones((10, 4), np.float32)
    s, p = np.empty((3, 2), np.float32), np.empty((3, 2), np.int64)
    with pytest.raises(TypeError, match="queries has the wrong type"):
        fastpath.scan_topk(sgemm.address, q.astype(np.float64), xb, 4, 8, s, p)
    with pytest.raises(TypeError, match="out_positions has the wrong type"):
        fastpath.scan_topk(sgemm.address, q, xb, 4, 8, s, p.astype(np.int32))
    with pytest.raises(ValueError, match="width"):
        fastpath.scan_topk(sgemm.address, q, xb, 5, 8, s, p)
    with pytest.raises(ValueError):
        fastpath.scan_topk(sgemm.address, q, np.ones((10, 3), np.float32), 3, 8, s, p)
    with pytest.raises(ValueError):
        fastpath.scan_topk(0, q, xb, 4, 8, s, p)
    with pytest.raises(ValueError, match="not C-contiguous"):
        fastpath.scan_topk(sgemm.address, q, xb, 4, 8, s, np.empty((3, 2), np.int64)[:, ::-1])
    fastpath.scan_topk(sgemm.address, q, xb, 4, 8, s, p)
    flat = faiss.IndexFlatIP(4)
    flat.add(xb)
    want_s, want_p = _faiss_heaps_topk(flat, q, 2, 4)  # ten equal scores: the first two seen, as FAISS keeps them
    assert s.tolist() == want_s.tolist() == [[4.0, 4.0]] * 3 and p.tolist() == want_p.tolist()
    assert sorted(p[0].tolist()) == [0, 1]


def test_batches_searched_from_many_threads_get_the_single_threaded_answer():
    """The batch scan runs without the GIL: threads searching one index at once must each get what a lone
    search gets."""
    import concurrent.futures

    index = _build(n=2000)
    queries, _ = _corpus(64, seed=14)
    want = _fields(index.search_batch(queries, 10))
    want_arrays = index.search_arrays(queries, 10)

    def one(i: int):
        if i % 2:
            got = index.search_arrays(queries, 10)
            return got.ids == want_arrays.ids and np.array_equal(got.scores, want_arrays.scores)
        return _fields(index.search_batch(queries, 10)) == want

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(one, range(40)))


def test_a_batch_gives_the_same_answer_on_one_thread_and_on_more():
    """The block size follows the OpenMP thread count (the C code asks the bundled runtime); the scores and
    the order may not."""
    import faiss

    index = _build(n=5000)
    queries, _ = _corpus(64, seed=15)
    before = faiss.omp_get_max_threads()
    answers = []
    try:
        for threads in (1, 2, 1):
            faiss.omp_set_num_threads(threads)
            got = index.search_arrays(queries, 10)
            answers.append((_fields(index.search_batch(queries, 10)), got.ids, got.scores.tobytes()))
    finally:
        faiss.omp_set_num_threads(before)
    assert answers[0] == answers[1] == answers[2]
