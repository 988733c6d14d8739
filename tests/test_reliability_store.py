"""Issue 10 (reliability round 2) for the FAISS store: each test failed on the code before the fix.

Real FAISS, real files, real threads; the only stand-in is a write step that raises ENOSPC
(a really full disk cannot be made portably), next to a real write limit (RLIMIT_FSIZE).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from normrank import (
    IndexFormatError,
    InvalidArgumentError,
    InvalidMetadataError,
    InvalidTextError,
    NormCalibrator,
    NormIndex,
    PersistenceError,
    UnknownIdError,
    Weights,
    persistence,
)
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


def observable(index: NormIndex) -> tuple:
    """Everything a user can see of the store: ids, records, weights, calibrations, search results."""
    ids = index.ids()
    qv, qc = synthetic(4, dim=DIM, seed=99)
    hits = index.search_batch(list(qv), min(5, len(index)), query_token_counts=qc.tolist())
    return (ids, index.get(ids), index.weights, index.calibrator.to_dict(),
            index.query_calibrator.to_dict() if index.query_calibrator else None, hits)


def assert_same_answers(got: tuple, want: tuple, index_type: str) -> None:
    """``got == want``, except that a rebuilt HNSW graph may round a hit's scores differently in the last
    float32 bit (FAISS sums some inner products four neighbours at a time, in an order set by the graph):
    there the same hits in the same order, with scores to float32 rounding."""
    if index_type != "hnsw":
        assert got == want
        return
    assert got[:5] == want[:5]
    for row_got, row_want in zip(got[5], want[5], strict=True):
        assert [h.id for h in row_got] == [h.id for h in row_want]
        for a, b in zip(row_got, row_want):
            assert a.score == pytest.approx(b.score, rel=1e-6, abs=1e-6)
            assert a.cosine == pytest.approx(b.cosine, rel=1e-6, abs=1e-6)
            assert (a.norm, a.norm_feature, a.weight, a.token_count, a.text, a.metadata) == (
                b.norm, b.norm_feature, b.weight, b.token_count, b.text, b.metadata)


def listing(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed) with its content or link target."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = ("-> " + os.readlink(p)) if p.is_symlink() else ("dir" if p.is_dir() else p.read_text())
    return out


# ------------------------------------------------------------------ 1. the user's own folders are never touched

def deployment_layout(root: Path) -> Path:
    """A common deployment layout: ``current -> v-1.2.3``, ``v-1.2.2/``, ``v-1.2.3/``, ``settings.ini``."""
    for version in ("v-1.2.2", "v-1.2.3"):
        (root / version).mkdir(parents=True)
        (root / version / "app.py").write_text(f"print('{version}')\n")
    os.symlink("v-1.2.3", root / "current")
    (root / "settings.ini").write_text("[app]\nport = 8080\n")
    return root


def test_save_refuses_a_deployment_folder_and_writes_nothing(tmp_path):
    root = deployment_layout(tmp_path / "deploy")
    before = listing(root)
    index, _, _ = make(n=40)
    state = observable(index)
    with pytest.raises(IndexFormatError, match=r"not a normrank index; refusing to write into it \(it holds "
                                               r"current -> v-1\.2\.3, settings\.ini, v-1\.2\.2/, v-1\.2\.3/"):
        index.save(root)
    assert listing(root) == before  # not even a .lock or a marker
    assert observable(index) == state


def test_cli_index_out_refuses_a_deployment_folder(tmp_path):
    from normrank.cli import main

    root = deployment_layout(tmp_path / "deploy")
    before = listing(root)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"_id": f"d{i}", "text": f"passage {i}"}) for i in range(5)) + "\n")
    try:
        code = main(["index", str(corpus), "--out", str(root)])
    except SystemExit as exc:
        code = exc.code
    except IndexFormatError:
        code = 1
    assert code not in (0, None)
    assert listing(root) == before


def test_a_normrank_folder_keeps_entries_normrank_did_not_write(tmp_path):
    """Inside its own (marked) folder a save sweeps only its own old versions, nothing else."""
    root = tmp_path / "idx"
    index, _, _ = make(n=40)
    first = index.save(root)
    assert (root / persistence.MARKER).is_file() and (first / persistence.VERSION_MARKER).is_file()
    (root / "README.txt").write_text("ours, not normrank's")
    (root / "v-1.0.0").mkdir()
    (root / "v-1.0.0" / "keep.txt").write_text("keep")
    second = index.save(root)
    assert not first.exists() and second.exists()
    assert (root / "README.txt").read_text() == "ours, not normrank's"
    assert (root / "v-1.0.0" / "keep.txt").read_text() == "keep"
    assert observable(NormIndex.load(root)) == observable(index)


def test_an_index_saved_before_the_marker_still_loads_and_saves(tmp_path):
    root = tmp_path / "idx"
    index, _, _ = make(n=40)
    old = index.save(root)
    (root / persistence.MARKER).unlink()  # exactly what an older normrank left
    (old / persistence.VERSION_MARKER).unlink()
    assert observable(NormIndex.load(root)) == observable(index)
    index.delete(["d1"])
    new = index.save(root)
    assert not old.exists()  # its own old version is swept
    assert [p.name for p in root.iterdir() if p.name.startswith("v-")] == [new.name]
    assert observable(NormIndex.load(root)) == observable(index)


def test_a_users_folder_named_like_a_version_is_never_taken_for_one(tmp_path):
    """A ``v-<32 hex>`` folder holding anything a save does not write is the user's: a folder whose only
    entry it was passed for an index saved before the marker, and a save deleted it with its files; one
    beside an old index's versions was swept with them."""
    user = f"v-{'0123456789abcdef' * 2}"
    alone = tmp_path / "alone"
    (alone / user).mkdir(parents=True)
    (alone / user / "thesis.tex").write_text("three years of work")
    index, _, _ = make(n=40)
    with pytest.raises(IndexFormatError, match="not a normrank index; refusing to write into it"):
        index.save(alone)
    assert sorted(p.name for p in alone.iterdir()) == [user]
    assert (alone / user / "thesis.tex").read_text() == "three years of work"

    root = tmp_path / "idx"
    old = index.save(root)
    (root / persistence.MARKER).unlink()  # an index saved before the marker ...
    (old / persistence.VERSION_MARKER).unlink()
    (root / user).mkdir()  # ... with the user's folder beside it: foreign, so the folder is refused whole
    (root / user / "notes.txt").write_text("keep")
    with pytest.raises(IndexFormatError, match="not a normrank index; refusing to write into it"):
        index.save(root)
    assert (root / user / "notes.txt").read_text() == "keep" and old.exists()
    assert observable(NormIndex.load(root)) == observable(index)


def test_version_file_names_cover_every_file_a_save_writes(tmp_path):
    from normrank.doc_columns import COLUMN_FILES
    from normrank.store import SAVED_FILES

    assert {*SAVED_FILES, *COLUMN_FILES, "records.jsonl", persistence.MANIFEST,
            persistence.VERSION_MARKER} <= persistence.VERSION_FILE_NAMES
    index, _, _ = make(n=10)
    version = index.save(tmp_path / "idx")
    assert {p.name for p in version.iterdir()} <= persistence.VERSION_FILE_NAMES


# ------------------------------------------------------------------ 2 and 10. text and metadata at the door

BAD_TEXT = "caf\udcff"


@pytest.mark.parametrize("where", ["id", "text", "metadata value", "metadata key", "nested metadata"])
def test_lone_surrogates_are_refused_at_the_door(tmp_path, where, encoder):
    vecs, counts = synthetic(2, dim=384, seed=3)
    base, bvecs = NormIndex(encoder), synthetic(30, dim=384, seed=4)
    base.add_vectors(*bvecs, ids=[f"d{i}" for i in range(30)])
    ids, texts, metas = ["n0", "n1"], ["ok", "fine"], [{"a": 1}, {"b": 2}]
    if where == "id":
        ids = ["n0", BAD_TEXT]
    elif where == "text":
        texts = ["ok", BAD_TEXT]
    elif where == "metadata value":
        metas = [{"a": 1}, {"b": BAD_TEXT}]
    elif where == "metadata key":
        metas = [{"a": 1}, {BAD_TEXT: 1}]
    else:
        metas = [{"a": 1}, {"b": [{"c": BAD_TEXT}]}]
    before = base.ids(), base.get(base.ids())
    with pytest.raises(InvalidTextError, match=r"lone surrogate '\\udcff' at position 3, which cannot be written "
                                               r"as UTF-8") as info:
        base.add_vectors(vecs, counts, ids=ids, texts=texts, metadatas=metas)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidTextError, match="lone surrogate"):
        base.add_texts(texts, ids=ids, metadatas=metas)
    assert (base.ids(), base.get(base.ids())) == before
    base.save(tmp_path / "idx")  # a save still works: nothing unwritable got in
    assert NormIndex.load(tmp_path / "idx", encoder=encoder).ids() == before[0]
    with pytest.raises(InvalidTextError, match="query 0 is not valid Unicode text"):
        base.search(BAD_TEXT, 3)


def nested(depth: int) -> dict:
    d: dict = {}
    cur = d
    for _ in range(depth - 1):
        cur["x"] = {}
        cur = cur["x"]
    return d


@pytest.mark.parametrize(("meta", "message"), [
    (nested(700), "metadata 1 is nested more than 32 levels deep"),
    (nested(33), "metadata 1 is nested more than 32 levels deep"),
    ({"blob": "x" * 1_100_000}, "metadata 1 is larger than 1,000,000 bytes"),
    ({"many": ["y" * 1000] * 1100}, "metadata 1 is larger than 1,000,000 bytes"),
    ({"score": float("nan")}, r"metadata 1\['score'\] is nan; metadata numbers must be finite"),
    ({"when": object()}, "metadata 1 is not JSON-serialisable"),
])
def test_unbounded_metadata_is_refused_and_what_is_accepted_saves_and_searches(tmp_path, meta, message):
    index, _, _ = make(n=40)
    before = observable(index)
    vecs, counts = synthetic(2, dim=DIM, seed=8)
    with pytest.raises(InvalidMetadataError, match=message) as info:
        index.add_vectors(vecs, counts, ids=["m0", "m1"], metadatas=[{}, meta])
    assert isinstance(info.value, InvalidArgumentError)
    assert observable(index) == before
    deepest = nested(32)  # the bound itself is accepted, saves, reloads and comes back from search
    index.add_vectors(vecs, counts, ids=["m0", "m1"], metadatas=[{"n": 1}, deepest])
    back = NormIndex.load(index.save(tmp_path / "idx").parent)
    hits = back.search(vecs[1], len(back), query_token_count=int(counts[1]))
    assert next(h for h in hits if h.id == "m1").metadata == deepest


# ------------------------------------------------------------------ 4. fit publishes atomically

def test_searches_during_a_fit_see_the_before_or_the_after_state(encoder, demo_encoded, demo_texts):
    vecs, counts = demo_encoded
    index = NormIndex(encoder, weights=Weights(a=0.02, b=0.03))
    ids = [f"doc{i}" for i in range(len(demo_texts))]
    index.add_vectors(vecs, counts, ids=ids, texts=demo_texts)
    index.calibrate_queries(["stars", "a long question about how the immune system learns to fight a virus"])
    queries = {f"q{i}": t for i, t in enumerate(["How do vaccines work?", "stars and planets", "coffee",
                                                  "volcano eruptions", "the speed of light", "ocean tides"])}
    qrels = {q: {ids[(3 * i) % len(ids)]: 1, ids[(3 * i + 1) % len(ids)]: 1} for i, q in enumerate(queries)}
    probe_vecs, probe_counts = encoder.encode_with_counts(["immune response", "planets", "hot drinks"])

    def answer(ix: NormIndex) -> list:
        return ix.search_batch(list(probe_vecs), 5, query_token_counts=probe_counts.tolist())

    def searching_while(action) -> list:
        """Run ``action`` while two threads search; return every answer they got."""
        results: list = []
        errors: list[BaseException] = []
        running = threading.Event()
        running.set()

        def reader() -> None:
            try:
                while running.is_set() or len(results) < 2:
                    results.append(answer(index))
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            action()
        finally:
            running.clear()
            for t in threads:
                t.join(timeout=120)
        assert errors == []
        return results

    before = answer(index)
    reports: list = []
    # a fit that succeeds publishes its query calibration and weights together ...
    seen = searching_while(lambda: reports.append(index.fit(queries, qrels, alpha=0.999, min_gain=0.0)))
    after = answer(index)
    assert index.query_calibrator is not None and reports[0].n_queries == len(queries)
    assert after != before, "the fit changed nothing observable, so the test proves nothing"
    torn = [r for r in seen if r != before and r != after]
    assert not torn, f"{len(torn)} of {len(seen)} searches saw neither the before nor the after state"

    # ... and a fit that fails (bad folds) changes nothing at any moment
    def failing_fit() -> None:
        with pytest.raises(InvalidArgumentError, match=r"folds must be an integer in \[2, 1000\], got 'five'"):
            index.fit(queries, qrels, folds="five")

    seen = searching_while(failing_fit)
    assert all(r == after for r in seen) and answer(index) == after


def test_fit_options_are_named_errors_and_change_nothing(encoder, demo_encoded, demo_texts):
    vecs, counts = demo_encoded
    index = NormIndex(encoder, weights=Weights(a=0.02, b=0.03))
    index.add_vectors(vecs, counts, ids=[f"doc{i}" for i in range(len(vecs))])
    index.calibrate_queries(["stars", "vaccines and the immune system"])
    queries, qrels = {"q1": "stars", "q2": "coffee"}, {"q1": {"doc1": 1}, "q2": {"doc2": 1}}
    cal = index.query_calibrator.to_dict()
    for options, message in (({"folds": "five"}, "folds must be an integer"), ({"folds": 1}, r"folds must be in \[2"),
                             ({"folds": True}, "folds must be an integer .* got the bool True"),
                             ({"alpha": float("nan")}, "alpha must be a finite number"),
                             ({"grid_a": ["x"]}, "grid_a must be a list of finite numbers"),
                             ({"features": "raw"}, "features must be a list"),
                             ({"depth": 0}, r"depth must be in \[1, 100000\], got 0")):
        with pytest.raises(InvalidArgumentError, match=message):
            index.fit(queries, qrels, **options)
        assert index.query_calibrator.to_dict() == cal and index.weights == Weights(a=0.02, b=0.03)
    report = index.fit(queries, qrels, folds=np.int64(2), seed=np.int64(1))
    assert report.folds == 2


# ------------------------------------------------------------------ 6 and 15. deletes: cheap, and gone from the file

def _all_vectors(saved) -> np.ndarray:
    import faiss

    index = faiss.downcast_index(saved)  # `saved` owns the C++ object: keep it referenced
    if isinstance(index, faiss.IndexIVFFlat):
        parts = []
        for i in range(index.nlist):
            n = index.invlists.list_size(i)
            if n:
                codes = faiss.rev_swig_ptr(index.invlists.get_codes(i), n * index.code_size)
                parts.append(np.frombuffer(bytes(codes), dtype=np.float32).reshape(n, index.d))
        return np.concatenate(parts)
    assert saved is not None
    inner = faiss.downcast_index(index.index)  # an IndexFlat, or an IndexHNSWFlat over one
    return inner.reconstruct_n(0, inner.ntotal)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_a_deleted_document_is_not_in_the_saved_faiss_file(tmp_path, index_type):
    index, vecs, _ = make(n=300, index_type=index_type)
    gone = [3, 50, 299]
    index.delete([f"d{i}" for i in gone])
    before = observable(index)
    folder = index.save(tmp_path / "idx")
    assert_same_answers(observable(index), before, index_type)  # compacting on save changes no answer
    stored = _all_vectors(__import__("faiss").read_index(str(folder / "index.faiss")))
    assert stored.shape[0] == 297
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    sims = stored[:, :DIM] @ unit.T  # each stored direction against every added document
    best = sims.argmax(axis=1)
    assert np.all(sims.max(axis=1) > 0.9999)
    assert not set(best.tolist()) & set(gone), "a deleted document's vector is still in index.faiss"
    assert np.load(folder / "tombstones.npy").size == 0
    assert observable(NormIndex.load(tmp_path / "idx")) == observable(index)  # the saved graph itself
    assert_same_answers(observable(NormIndex.load(tmp_path / "idx")), before, index_type)


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw"])
def test_one_at_a_time_deletes_across_compactions_give_exact_answers(index_type):
    """Single deletes are tombstones compacted in batches; answers stay those of a fresh index."""
    n = 700
    index, vecs, counts = make(n=n, index_type=index_type)
    rng = np.random.default_rng(1)
    gone = sorted(rng.choice(n, 400, replace=False).tolist())
    for i in gone:
        assert index.delete([f"d{i}"]) == 1
    keep = [i for i in range(n) if i not in set(gone)]
    fresh = NormIndex(dim=DIM, weights=Weights(a=0.05), calibrator=index.calibrator, index_type="flat")
    fresh.add_vectors(vecs[keep], counts[keep], ids=[f"d{i}" for i in keep])
    qv, qc = synthetic(6, dim=DIM, seed=9)
    got = index.search_batch(list(qv), 10, query_token_counts=qc.tolist())
    ref = fresh.search_batch(list(qv), 10, query_token_counts=qc.tolist())
    assert all(not {h.id for h in row} & {f"d{i}" for i in gone} for row in got)
    if index_type == "flat":
        assert [[h.id for h in r] for r in got] == [[h.id for h in r] for r in ref]
    assert index.ids() == [f"d{i}" for i in keep] and len(index) == len(keep)
    np.testing.assert_allclose(index.vectors([f"d{i}" for i in keep[:20]]), vecs[keep[:20]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("index_type", "n", "deleted", "k"), [("ivf", 2000, 1900, 50), ("hnsw", 1000, 990, 10)])
def test_approximate_indexes_give_k_hits_while_k_documents_are_live(index_type, n, deleted, k):
    """An HNSW walk past many deleted documents, or IVF lists a compaction emptied, came back short of k
    (7-10 of 10; 29-38 of 50) on every path without a filter, while an always-true filter and the pgvector
    backend gave k. Short rows are now scored exactly over the live documents; full rows stay."""
    vecs, counts = synthetic(n, dim=DIM, seed=0)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type)  # IVF: 51 lists, 16 probed
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(n)])
    index.delete([f"d{i}" for i in range(deleted)])
    live = {f"d{i}" for i in range(deleted, n)}
    qv, qc = synthetic(8, dim=DIM, seed=31)
    hits = [index.search(q, k, query_token_count=int(c)) for q, c in zip(qv, qc)]
    hits += index.search_batch(list(qv), k, query_token_counts=qc.tolist())
    rows = [([h.id for h in row], [h.score for h in row]) for row in hits]  # (ids, scores)
    arrays = index.search_arrays(list(qv), k, query_token_counts=qc.tolist())
    rows += [(ids, scores.tolist()) for ids, scores in zip(arrays.ids, arrays.scores)]
    for ids, scores in rows:
        assert len(ids) == k and len(set(ids)) == k and set(ids) <= live
        assert all(a >= b for a, b in itertools.pairwise(scores))
    every = index.search_batch(list(qv), k, filter=lambda m: True, query_token_counts=qc.tolist())
    assert all(len(r) == k for r in every)
    if len(live) == k:  # every live document is in every row: the same set as brute force
        assert all(set(ids) == live for ids, _ in rows)
    cands = index.cosine_candidates(list(qv), k)
    assert all(len(r) == k for r in cands.doc_ids)


# ------------------------------------------------------------------ 12 and 14. numeric options, one table

@pytest.mark.parametrize(("option", "value", "message"), [
    ("ef_search", 2_000_000_000, r"ef_search must be in \[1, 65536\], got 2000000000"),
    ("ef_search", 2e9, r"ef_search must be an integer in \[1, 65536\], got 2000000000.0 \(float\)"),
    ("nprobe", 0, r"nprobe must be in \[1, 1048576\], got 0"),
    ("hnsw_m", True, "hnsw_m must be an integer .* got the bool True"),
    ("nlist", "256", r"nlist must be an integer in \[1, 1048576\], got '256' \(str\)"),
    ("pad_to", -1, r"pad_to must be in \[1, 1024\], got -1"),
    ("ef_construction", 10**9, r"ef_construction must be in \[4, 65536\]"),
])
def test_numeric_options_are_range_checked_at_construction_and_when_set(option, value, message):
    with pytest.raises(InvalidArgumentError, match=message):
        NormIndex(dim=DIM, **{option: value})
    index, _, _ = make(n=60, index_type="hnsw")
    before = observable(index)
    with pytest.raises(InvalidArgumentError, match=message):
        setattr(index, option, value)
    assert observable(index) == before
    index.ef_search = np.int64(64)  # NumPy integers are integers
    assert index.ef_search == 64 and type(index.ef_search) is int


def test_nprobe_and_ef_search_set_later_take_effect():
    import faiss

    index, _, _ = make(n=400, index_type="ivf")
    index.nprobe = 1
    assert index._index.nprobe == 1
    hnsw, _, _ = make(n=100, index_type="hnsw")
    hnsw.ef_search = 7
    assert faiss.downcast_index(hnsw._index.index).hnsw.efSearch == 7
    with pytest.raises(InvalidArgumentError, match="pad_to is fixed once the index holds documents"):
        hnsw.pad_to = 16  # HNSW's default is 1: a different width


def _rewrite(folder: Path, name: str, data: bytes) -> None:
    """Replace a saved file and fix its checksum, as someone able to edit the folder would."""
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = persistence.sha256_file(folder / name)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("ef_search", 2e9, r"invalid setting in state.json: ef_search must be an integer in \[1, 65536\]"),
    ("ef_search", 2_000_000_000, r"invalid setting in state.json: ef_search must be in \[1, 65536\]"),
    ("nprobe", -5, "invalid setting in state.json: nprobe must be in"),
    ("index_type", "annoy", "unknown index_type 'annoy' in state.json"),
    ("dim", "16", "invalid dim '16' in state.json"),
])
def test_a_tampered_state_json_is_refused_before_it_is_used(tmp_path, key, value, message):
    index, _, _ = make(n=60, index_type="hnsw")
    folder = index.save(tmp_path / "idx")
    state = json.loads((folder / "state.json").read_text())
    state[key] = value
    _rewrite(folder, "state.json", json.dumps(state).encode())
    with pytest.raises(IndexFormatError, match=message):
        NormIndex.load(tmp_path / "idx")


def test_k_accepts_numpy_integers():
    index, vecs, counts = make(n=60)
    hits = index.search(vecs[0], np.int64(3), query_token_count=int(counts[0]))
    assert [h.id for h in hits] == [h.id for h in index.search(vecs[0], 3, query_token_count=int(counts[0]))]
    assert len(index.search_batch([vecs[1]], np.int32(2), query_token_counts=[5])[0]) == 2
    with pytest.raises(InvalidArgumentError, match="k must be a positive integer, got np.True_|k must be a positive"):
        index.search(vecs[0], np.bool_(True), query_token_count=5)


# ------------------------------------------------------------------ 14. wrong FAISS file, disk full

@pytest.mark.parametrize(("saved_as", "replacement", "message"), [
    ("flat", "bare flat", r"index.faiss holds a IndexFlatIP, but state.json says index_type 'flat'"),
    ("flat", "hnsw", r"holds a IndexIDMap2\(IndexHNSWFlat\), but state.json says index_type 'flat'"),
    ("hnsw", "flat", r"holds a IndexIDMap2\(IndexFlatIP\), but state.json says index_type 'hnsw'"),
    ("ivf", "flat", r"holds a IndexIDMap2\(IndexFlatIP\), but state.json says index_type 'ivf'"),
    ("flat", "l2 flat", r"saved as an inner-product IndexIDMap2\(IndexFlat\)"),
])
def test_a_valid_faiss_file_of_the_wrong_type_is_named(tmp_path, saved_as, replacement, message):
    import faiss

    index, vecs, _ = make(n=300, index_type=saved_as)
    folder = index.save(tmp_path / "idx")
    width = index.augmented_dim
    data = np.zeros((300, width), dtype=np.float32)
    data[:, :DIM] = vecs
    if replacement == "bare flat":
        other = faiss.IndexFlatIP(width)
        other.add(data)
    else:
        inner = (faiss.IndexHNSWFlat(width, 8, faiss.METRIC_INNER_PRODUCT) if replacement == "hnsw"
                 else faiss.IndexFlatL2(width) if replacement == "l2 flat" else faiss.IndexFlatIP(width))
        other = faiss.IndexIDMap2(inner)
        other.add_with_ids(data, np.arange(300, dtype=np.int64))
    _rewrite(folder, "index.faiss", faiss.serialize_index(other).tobytes())
    with pytest.raises(IndexFormatError, match=message):
        NormIndex.load(tmp_path / "idx")


def _fill_the_disk_at_token_counts(monkeypatch) -> None:
    """The one stand-in: writing token_counts.npy fails with ENOSPC, as on a full disk."""
    real_save = np.save

    def full_disk(file, *args, **kwargs):
        if str(file).endswith("token_counts.npy"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(file, *args, **kwargs)

    monkeypatch.setattr(np, "save", full_disk)


def test_disk_full_during_save_is_named_and_loses_nothing(tmp_path, monkeypatch):
    root = tmp_path / "idx"
    index, vecs, counts = make(n=80)
    index.save(root)
    saved = observable(NormIndex.load(root))
    index.add_vectors(vecs[:5] * 1.01, counts[:5], ids=[f"new{i}" for i in range(5)])
    index.delete(["d2"])
    in_memory = observable(index)
    _fill_the_disk_at_token_counts(monkeypatch)
    with pytest.raises(PersistenceError, match=r"saving the index to .* failed: No space left on device; the "
                                               r"previous save is intact") as info:
        index.save(root)
    monkeypatch.undo()
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert observable(index) == in_memory
    assert observable(NormIndex.load(root)) == saved
    assert len([p for p in root.iterdir() if p.name.startswith("v-")]) == 1  # no half-written debris
    index.save(root)  # space again: the next save works
    assert observable(NormIndex.load(root)) == in_memory


FSIZE_CHILD = """
import json, resource, signal, sys
sys.path.insert(0, {root!r})
from normrank import NormIndex, PersistenceError, Weights
from tests.conftest import synthetic

path = sys.argv[1]
vecs, counts = synthetic(3000, dim=64, seed=2)
index = NormIndex(dim=64, weights=Weights(a=0.05))
index.add_vectors(vecs[:50], counts[:50], ids=[f"d{{i}}" for i in range(50)])
index.save(path)
index.add_vectors(vecs[50:], counts[50:], ids=[f"d{{i}}" for i in range(50, 3000)])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # the OS refuses writes past 200 kB
try:
    index.save(path)
except PersistenceError as exc:
    print(json.dumps({{"errno": exc.errno, "message": str(exc), "n": len(index)}}))
"""


def test_a_real_write_limit_during_save_is_a_persistence_error(tmp_path):
    """Not a stand-in: the kernel refuses the FAISS write (RLIMIT_FSIZE, EFBIG), mid-file."""
    import subprocess
    import sys

    root = tmp_path / "idx"
    script = tmp_path / "child.py"
    script.write_text(FSIZE_CHILD.format(root=str(Path(__file__).resolve().parent.parent)))
    proc = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errno"] == errno.EFBIG and "the previous save is intact" in out["message"] and out["n"] == 3000
    assert NormIndex.load(root).ids() == [f"d{i}" for i in range(50)]
    assert len([p for p in root.iterdir() if p.name.startswith("v-")]) == 1


# ------------------------------------------------------------------ 15. symlinks in a saved folder are not followed

@pytest.mark.parametrize("name", ["texts.utf8", "metadata.json", "state.json", "index.faiss", "manifest.json"])
def test_a_file_linked_outside_the_folder_is_refused(tmp_path, name):
    index, _, _ = make(n=40)
    folder = index.save(tmp_path / "idx")
    outside = tmp_path / f"outside-{name}"
    outside.write_bytes((folder / name).read_bytes())  # same content, so the checksum alone would pass
    (folder / name).unlink()
    os.symlink(outside, folder / name)
    with pytest.raises(IndexFormatError, match="is a symbolic link; refusing to follow it"):
        NormIndex.load(tmp_path / "idx")


def test_a_lock_file_linked_outside_is_not_followed(tmp_path):
    root = tmp_path / "idx"
    index, _, _ = make(n=40)
    index.save(root)
    victim = tmp_path / "precious.txt"
    victim.write_text("do not touch")
    (root / ".lock").unlink()
    os.symlink(victim, root / ".lock")
    with pytest.raises(IndexFormatError, match=r"\.lock is a symbolic link; refusing to follow it"):
        NormIndex.load(root)
    with pytest.raises((IndexFormatError, PersistenceError), match="symbolic link|not a normrank index"):
        index.save(root)
    assert victim.read_text() == "do not touch"


# ------------------------------------------------------------------ issue 11 item 5: no store <-> fitting cycle

def test_fitting_does_not_import_the_store():
    import subprocess
    import sys

    code = ("import sys, inspect, normrank.fitting; "
            "assert 'normrank.store' not in sys.modules, 'fitting imported the store'; "
            "f = inspect.getsource(normrank.fitting); "
            "assert 'from normrank.store' not in f and 'import normrank.store' not in f, 'fitting imports the store'; "
            "import normrank.store; src = inspect.getsource(normrank.store); "
            "assert '\\nfrom normrank.fitting' not in src and '\\nimport normrank.fitting' not in src")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]


@pytest.mark.parametrize(("yaml_text", "message"), [
    ("store:\n  ef_search: 2000000000\n", r"'store.ef_search': Value error, ef_search must be in \[1, 65536\]"),
    ("store:\n  ef_search: 2.0e+9\n", r"'store.ef_search': Value error, ef_search must be in \[1, 65536\]"),
    ("fit:\n  folds: 100000\n", r"'fit.folds': Value error, folds must be in \[2, 1000\]"),
    ("store:\n  nprobe: 99999999\n", r"'store.nprobe': Value error, nprobe must be in \[1, 1048576\]"),
])
def test_yaml_options_use_the_same_range_table(tmp_path, yaml_text, message):
    from normrank import ConfigError, load_config

    cfg = tmp_path / "normrank.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_config(cfg)


def test_calibration_settings_and_a_tampered_calibration_are_named(tmp_path):
    from normrank.calibration import NormCalibrator

    assert NormCalibrator(max_bins=np.int64(6)).max_bins == 6
    with pytest.raises(InvalidArgumentError, match=r"max_bins must be in \[1, 1000\], got 0"):
        NormCalibrator(max_bins=0)
    with pytest.raises(InvalidArgumentError, match="min_per_bin must be an integer"):
        NormCalibrator(min_per_bin=2.5)
    index, _, _ = make(n=60)
    folder = index.save(tmp_path / "idx")
    state = json.loads((folder / "state.json").read_text())
    state["calibrator"]["knots_y"][0] = float("nan")
    _rewrite(folder, "state.json", json.dumps(state).encode())
    with pytest.raises(IndexFormatError, match="calibration data is invalid: calibration knots must be"):
        NormIndex.load(tmp_path / "idx")


def test_weights_take_numbers_only_and_numpy_scalars_become_floats():
    w = Weights(a=np.float32(0.25), b=np.int64(0), clip=np.int64(2))
    assert (w.a, w.b, w.clip) == (0.25, 0.0, 2.0) and all(type(x) is float for x in (w.a, w.b, w.clip))
    for options, message in (({"a": "0.1"}, r"weight a must be a number, got '0.1' \(str\)"),
                             ({"b": True}, "weight b must be a number, got True"),
                             ({"clip": float("inf")}, "weight clip must be finite"),
                             ({"squash": "yes"}, "squash must be True or False")):
        with pytest.raises(InvalidArgumentError, match=message):
            Weights(**options)


@pytest.mark.parametrize("name", ["a", "b", "epsilon"])
def test_weights_beyond_what_float32_scores_hold_are_refused(name):
    """a=1e39 became an infinite query column in FAISS's float32 (the ranking was the order documents
    were added in) and broke every search on a pgvector table; 2**1100 was a bare OverflowError."""
    for value in (1e39, -1e39, 1e6, 1000.5, 2**1100):
        with pytest.raises(InvalidArgumentError, match=f"weight {name} must be (within|finite)"):
            Weights(**{name: value})
    assert getattr(Weights(**{name: 1000}), name) == 1000.0
    assert getattr(Weights(**{name: 0.0}), name) == 0.0


def test_an_index_saved_with_a_weight_beyond_the_bound_still_opens(tmp_path, caplog):
    """Indexes and tables saved before the bound may hold a = 1500: they open, with a warning, and keep
    answering (refusing them made them impossible to open and correct); new values stay bounded."""
    index, vecs, _ = make(n=60)
    index.set_weights(Weights.from_saved({"a": 1500.0}))
    want = index.search(vecs[2], 5, query_token_count=12)
    index.save(tmp_path / "big")
    with caplog.at_level("WARNING", logger="normrank.scoring"):
        loaded = NormIndex.load(tmp_path / "big")
    assert "beyond +-1000" in caplog.text and loaded.weights.a == 1500.0
    assert loaded.search(vecs[2], 5, query_token_count=12) == want
    loaded.set_weights(Weights(a=0.02))  # and can be corrected
    with pytest.raises(InvalidArgumentError, match="within"):
        loaded.set_weights(Weights(a=1500.0))


def test_the_largest_weight_still_ranks_and_reads_cosines_back():
    """At the bound a blend still ranks as the float64 blend does, and each hit's cosine is read back
    within 1e-3."""
    index, vecs, _ = make(n=200)
    q = vecs[7] + 0.5 * vecs[11]
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    cos = unit @ (q / np.linalg.norm(q))
    for w in (Weights(a=1000.0), Weights(a=-1000.0, clip=None)):
        index.set_weights(w)
        every = index.search(q, len(index), query_token_count=12)
        g = {h.id: h.norm_feature for h in every}
        want = sorted(g, key=lambda i: -(cos[int(i[1:])] + w.a * g[i]))[:10]
        hits = index.search(q, 10, query_token_count=12)
        assert [h.id for h in hits] == want
        for h in hits:
            assert abs(h.cosine - cos[int(h.id[1:])]) < 1e-3 and np.isfinite(h.score)


def test_a_first_save_that_fails_says_nothing_was_saved_and_a_dangling_link_is_named(tmp_path, monkeypatch):
    """"The previous save is intact" was said when there had never been one; a symbolic link to nowhere
    gave "[Errno 17] File exists"."""
    index, _, _ = make(n=40)
    _fill_the_disk_at_token_counts(monkeypatch)
    with pytest.raises(PersistenceError, match="No space left on device; nothing was saved"):
        index.save(tmp_path / "first")
    monkeypatch.undo()
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(IndexFormatError, match="is a symbolic link to .*nowhere.*, which does not exist"):
        index.save(tmp_path / "link")
    assert not (tmp_path / "nowhere").exists()


def test_a_query_vector_without_its_count_is_a_missing_token_count_error_that_search_up_to_mends(encoder):
    """With b != 0 a raw query vector needs its token count: the error is MissingTokenCountError (an
    InvalidArgumentError), and search_up_to given the query's text counts it and answers as if it had been
    passed (what the LlamaIndex adapters rely on when the blend changes under them)."""
    from normrank import MissingTokenCountError
    from normrank.index_base import search_up_to

    vecs, counts = synthetic(60, dim=384, seed=2)
    index = NormIndex(encoder, weights=Weights(a=0.01, b=0.02))
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(60)])
    index.calibrate_queries(norms=np.linspace(2, 6, 50), token_counts=np.arange(5, 55))
    q = vecs[3] * 1.3
    with pytest.raises(MissingTokenCountError, match="without its token count"):
        index.search(q, 5)
    assert issubclass(MissingTokenCountError, InvalidArgumentError)
    text = "how long do massive stars live"
    got = search_up_to(index, q, 5, list, count_text=text)
    assert got == index.search(q, 5, query_token_count=int(encoder.token_counts([text])[0]))


# ------------------------------------------------------------------ a folder from an untrusted source (security hunt)

@pytest.mark.parametrize("where", ["manifest", "lock"])
def test_a_fifo_in_a_saved_folder_is_named_not_waited_on(tmp_path, where):
    import subprocess
    import sys

    root = tmp_path / "idx"
    index, _, _ = make(n=40)
    folder = index.save(root)
    target = folder / "manifest.json" if where == "manifest" else root / ".lock"
    target.unlink()
    os.mkfifo(target)
    # in a child with a timeout: on the old code the open waited for a writer for ever
    code = ("import sys; from normrank import NormIndex, IndexFormatError\n"
            f"try:\n    NormIndex.load({str(root)!r})\nexcept IndexFormatError as e:\n    print('NAMED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert "NAMED" in proc.stdout and "is a FIFO, not a regular file" in proc.stdout, proc.stderr[-800:]


def test_a_device_as_manifest_is_named_not_read(tmp_path):
    root = tmp_path / "idx"
    index, _, _ = make(n=40)
    folder = index.save(root)
    (folder / "manifest.json").unlink()
    try:
        os.mknod(folder / "manifest.json", 0o644 | __import__("stat").S_IFCHR, os.makedev(1, 5))  # /dev/zero
    except PermissionError:
        pytest.skip("making a device node needs root")
    with pytest.raises(IndexFormatError, match="is a device, not a regular file"):
        NormIndex.load(root)


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    head = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    head += b" " * (64 - (10 + len(head) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head


@pytest.mark.parametrize("name", ["norms.npy", "token_counts.npy", "tombstones.npy", "lengths.npy"])
def test_a_npy_header_claiming_more_than_the_file_holds_is_named(tmp_path, name):
    index, _, _ = make(n=40)
    folder = index.save(tmp_path / "idx")
    shape = (10**12, 2) if name == "lengths.npy" else (10**12,)
    descr = "<f4" if name == "norms.npy" else "<i8"
    _rewrite(folder, name, _npy_header(descr, shape) + b"\0" * 64)  # checksum matches: only the header lies
    with pytest.raises(IndexFormatError, match=rf"{name} is truncated or altered: its header claims"):
        NormIndex.load(tmp_path / "idx")


def test_text_lengths_that_wrap_round_to_the_file_size_are_named(tmp_path):
    index, _, _ = make(n=5)
    folder = index.save(tmp_path / "idx")
    lengths = np.load(folder / "lengths.npy")
    total = int(lengths[:, 1].sum())
    lengths[:4, 1] = 2**62  # four of them add up to 2**64: zero, in int64
    lengths[4, 1] = total
    buf = __import__("io").BytesIO()
    np.save(buf, lengths)
    _rewrite(folder, "lengths.npy", buf.getvalue())
    with pytest.raises(IndexFormatError, match="texts.utf8 does not hold the lengths"):
        NormIndex.load(tmp_path / "idx")


def test_a_save_inside_another_index_version_is_refused_and_a_user_file_there_survives(tmp_path, caplog):
    outer = tmp_path / "idx"
    a, _, _ = make(n=40)
    b, _, _ = make(n=30, seed=1)
    a.save(outer)
    for inside in (outer / "current" / "backup", Path(os.path.realpath(outer / "current")) / "deep" / "b"):
        with pytest.raises(IndexFormatError, match="is inside a version folder of the index saved at"):
            b.save(inside)
        assert not inside.exists()
    # a user's note put into the live version by hand is not swept with it
    note = Path(os.path.realpath(outer / "current")) / "NOTES.txt"
    note.write_text("mine")
    with caplog.at_level("WARNING", logger="normrank.persistence"):
        a.save(outer)
    assert note.read_text() == "mine"
    assert "which normrank did not write" in caplog.text
    assert NormIndex.load(outer).ids() == a.ids()


# ------------------------------------------------------------------ an endurance hunt: a churning corpus

def _turn_over(index, rounds: range, step: int) -> None:
    """Replace ``step`` documents per round by ones whose norms are e^0.4 larger (round r: d{r*step}... out,
    n{r}-* in)."""
    for r in rounds:
        v, c = synthetic(step, dim=DIM, seed=100 + r)
        index.delete([f"d{i}" for i in range(r * step, (r + 1) * step)])
        index.add_vectors(v * np.exp(0.4), c, ids=[f"n{r}-{i}" for i in range(step)])


def _fitted_on(vectors: np.ndarray, counts: np.ndarray) -> NormCalibrator:
    """The calibration a fresh index fits on exactly these documents."""
    fresh = NormIndex(dim=DIM)
    fresh.add_vectors(vectors, counts)
    return fresh.calibrator


def _new_documents(rounds: range, step: int = 100) -> tuple[np.ndarray, np.ndarray]:
    parts = [synthetic(step, dim=DIM, seed=100 + r) for r in rounds]
    return (np.concatenate([v for v, _ in parts]) * np.exp(0.4),  # as _turn_over adds them
            np.concatenate([c for _, c in parts]))


def _same_top10(index, other, seed: int = 999) -> None:
    for q in synthetic(20, dim=DIM, seed=seed)[0]:
        assert [(h.id, round(h.score, 5)) for h in index.search(q, 10)] == \
               [(h.id, round(h.score, 5)) for h in other.search(q, 10)]


def test_an_automatic_calibration_follows_a_corpus_that_turns_over_at_a_constant_size(tmp_path):
    """The calibration was refitted only when the corpus doubled: replaced 100 at a time, a corpus kept the
    one fitted on documents long gone, and every top-10 of 50 differed from a fresh index's. It is refitted
    by the delete that brings the documents deleted since the fit to half of those it was fitted on. Adding
    the documents a calibration was fitted on (EncodedCorpus.into) must not refit it: deletes are counted."""
    index, _, _ = make(n=400)
    _turn_over(index, range(1), 100)
    # a save and load in the middle must not lose count of what was deleted since the fit
    index = NormIndex.load(index.save(tmp_path / "idx").parent)
    assert index._removed_since_calibration == 100
    _turn_over(index, range(1, 4), 100)  # refitted when half could have been replaced: rounds 1 and 3
    # round 3's delete left n0-n2 (none of the first 400): the calibration is theirs
    assert index.calibrator.n_fitted == 300 and index._removed_since_calibration == 100 - 100
    assert index.calibrator.to_dict() == _fitted_on(*_new_documents(range(3))).to_dict()
    fresh = NormIndex(dim=DIM, weights=Weights(a=0.05), calibrator=_fitted_on(*_new_documents(range(3))))
    for r in range(4):
        v, c = _new_documents(range(r, r + 1))
        fresh.add_vectors(v, c, ids=[f"n{r}-{i}" for i in range(100)])
    assert sorted(index.ids()) == sorted(fresh.ids())
    _same_top10(index, fresh)
    given = NormIndex(dim=DIM, weights=Weights(a=0.05))
    given.calibrator = NormCalibrator.from_dict(fresh.calibrator.to_dict())  # as EncodedCorpus.into does
    for r in range(4):
        v, c = _new_documents(range(r, r + 1))
        given.add_vectors(v, c, ids=[f"n{r}-{i}" for i in range(100)])
    assert given.calibrator.to_dict() == fresh.calibrator.to_dict()  # not refitted


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_a_sync_that_only_deletes_refits_the_automatic_calibration(index_type):
    """A sync that only deletes (LangChain index(cleanup="full") dropping a source, LlamaIndex
    delete_ref_doc) never reached an add, the only place the refit was decided: the calibration of the 400
    documents stayed after 300 of them were gone (24 of 24 top-10s differed from a fresh index's)."""
    vecs, counts = synthetic(400, dim=DIM, seed=5)
    vecs[:300] *= np.float32(np.exp(0.6))  # the documents that will go have larger norms
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(400)])
    assert index.calibrator.n_fitted == 400
    index.delete([f"d{i}" for i in range(199)])
    assert index.calibrator.n_fitted == 400 and index._removed_since_calibration == 199
    index.delete(["d199"])  # half of what it was fitted on: refitted here
    assert index.calibrator.n_fitted == 200 and index._removed_since_calibration == 0
    for i in range(200, 300):  # one at a time, as a framework's per-document delete does
        index.delete([f"d{i}"])
    assert index.calibrator.n_fitted == 100  # refitted again at the 100th
    fresh = NormIndex(dim=DIM, weights=Weights(a=0.05), index_type=index_type)
    fresh.add_vectors(vecs[300:], counts[300:], ids=[f"d{i}" for i in range(300, 400)])
    assert index.calibrator.to_dict() == fresh.calibrator.to_dict()
    _same_top10(index, fresh)


def test_a_refit_that_fails_leaves_the_delete_or_add_done_and_is_tried_again(monkeypatch, caplog):
    """A delete whose refit ran out of memory raised MemoryError with its documents gone: the caller was
    told nothing was deleted. The delete (or add) stands, the old calibration and index stay whole, the
    failure is logged, and the next change refits."""
    vecs, counts = synthetic(160, dim=DIM, seed=9)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(vecs[:100], counts[:100], ids=[f"d{i}" for i in range(100)])
    before = index.calibrator.to_dict()
    real, calls = NormIndex._rebuild, []

    def out_of_memory_once(self):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("the rebuild did not fit")
        return real(self)

    monkeypatch.setattr(NormIndex, "_rebuild", out_of_memory_once)
    with caplog.at_level("WARNING", logger="normrank.store"):
        assert index.delete([f"d{i}" for i in range(50)]) == 50
    assert "could not be refitted (MemoryError" in caplog.text
    assert len(index) == 50 and "d0" not in index and index.calibrator.to_dict() == before
    same = NormIndex(dim=DIM, weights=Weights(a=0.05), calibrator=NormCalibrator.from_dict(before))
    same.add_vectors(vecs[50:100], counts[50:100], ids=[f"d{i}" for i in range(50, 100)])
    _same_top10(index, same)
    index.delete(["d50"])  # tried again, and done
    assert index.calibrator.n_fitted == 49 and index._removed_since_calibration == 0
    calls.clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="normrank.store"):  # an add whose refit fails: stored all the same
        index.add_vectors(vecs[100:160], counts[100:160], ids=[f"n{i}" for i in range(60)])
    assert "could not be refitted" in caplog.text and len(index) == 109 and index.calibrator.n_fitted == 49


def test_a_calibration_set_by_hand_is_not_refitted_by_deletes():
    vecs, counts = synthetic(400, dim=DIM, seed=6)
    mine = _fitted_on(vecs, counts)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05), calibrator=mine)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(400)])
    index.delete([f"d{i}" for i in range(390)])
    assert index.calibrator.to_dict() == mine.to_dict()


def test_a_small_calibration_follows_a_store_that_shrank_then_grew():
    """"Refit on every add while fewer than 40 documents inform it" failed after a shrink: 30 added, 14
    deleted, 1 added, and the fit was still the one on 30 documents while the store held 17 others."""
    vecs, counts = synthetic(31, dim=DIM, seed=7)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    for i in range(30):
        index.add_vectors(vecs[i:i + 1], counts[i:i + 1], ids=[f"d{i}"])
    assert index.calibrator.n_fitted == 30
    index.delete([f"d{i}" for i in range(14)])
    assert index.calibrator.n_fitted == 16
    index.add_vectors(vecs[30:], counts[30:], ids=["d30"])
    assert index.calibrator.n_fitted == 17
    assert index.calibrator.to_dict() == _fitted_on(vecs[14:], counts[14:]).to_dict()
    fresh = NormIndex(dim=DIM, weights=Weights(a=0.05), calibrator=_fitted_on(vecs[14:], counts[14:]))
    fresh.add_vectors(vecs[14:], counts[14:], ids=[f"d{i}" for i in range(14, 31)])
    _same_top10(index, fresh)


def test_an_upsert_refused_by_the_add_keeps_the_calibration_it_had():
    """An upsert deletes, then adds; the delete must not refit before the add: a refused add puts the old
    documents back, and the store must rank as it did before the call."""
    from normrank.index_base import upsert_vectors

    vecs, counts = synthetic(300, dim=DIM, seed=8)
    index = NormIndex(dim=DIM, weights=Weights(a=0.05))
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(300)])
    def top10() -> list:
        return [[(h.id, round(h.score, 5)) for h in index.search(q, 10)] for q in vecs[:5]]

    before, hits = index.calibrator.to_dict(), top10()
    real_add, failed = index.add_vectors, []

    def add_once_out_of_memory(*args, **kwargs):
        if not failed:
            failed.append(1)
            raise MemoryError("the replacement batch did not fit")
        return real_add(*args, **kwargs)

    index.add_vectors = add_once_out_of_memory
    with pytest.raises(MemoryError):
        upsert_vectors(index, vecs[:200] * 2, list(counts[:200]), [f"d{i}" for i in range(200)],
                       [None] * 200, [{}] * 200)
    del index.add_vectors
    assert len(index) == 300 and index.calibrator.to_dict() == before
    assert top10() == hits
    assert index._removed_since_calibration == 0
    # the put-back skipped the lone-vector unit check (one of these has a norm within 1e-3 of 1)
    assert np.any(np.abs(np.linalg.norm(vecs[:200], axis=1) - 1) < 1e-3)


def test_a_tilde_path_is_the_home_folder_as_in_a_shell(tmp_path, monkeypatch):
    """save("~/idx") made a folder named "~" in the working folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    index, _, _ = make(n=30)
    index.save("~/idx")
    assert (tmp_path / "home" / "idx" / "current").is_symlink() and not (tmp_path / "~").exists()
    assert NormIndex.load("~/idx").ids() == index.ids()


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_updates_do_not_keep_a_slot_for_every_document_ever_added(tmp_path, index_type):
    """An endurance hunt: 1,000 documents each updated 50 times (delete + add) left 51,000 internal slots, in
    the process and, after a save and load, in the folder: memory grew with every document ever added."""
    index, vecs, counts = make(n=300, index_type=index_type)
    for r in range(30):
        index.delete([f"d{i}" for i in range(300)])
        index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(300)], texts=[f"text {i}" for i in range(300)])
    assert index._docs.next <= 300 + max(1000 if index_type == "hnsw" else 256, 300)  # bounded by compaction
    loaded = NormIndex.load(index.save(tmp_path / "idx").parent)
    assert loaded._docs.next == len(loaded) == 300
    fresh, _, _ = make(n=300, index_type=index_type)
    for q in synthetic(10, dim=DIM, seed=5)[0]:
        assert [h.id for h in loaded.search(q, 10)] == [h.id for h in fresh.search(q, 10)]
        assert [h.id for h in index.search(q, 10)] == [h.id for h in fresh.search(q, 10)]
    index.delete(index.ids())  # deleting everything starts the numbering again
    index._compact()
    index.add_vectors(vecs[:20], counts[:20], ids=[f"e{i}" for i in range(20)])
    assert index._docs.next == 20 and index.search(vecs[3], 1)[0].id == "e3"
