"""Saved indexes: identical after a reload, named errors for damage, nothing lost to a crash.

Crash tests run a real second Python process that is killed in the middle of a save,
either deterministically (``os._exit`` from the save's stage hook) or by SIGKILL at a
random moment while it saves a growing index in a loop.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from normrank import (
    IndexFormatError,
    InvalidArgumentError,
    NormIndex,
    RawEncoder,
    Weights,
    persistence,
)
from normrank.doc_columns import COLUMN_FILES
from normrank.store import FORMAT_VERSION, SAVED_FILES
from tests.conftest import synthetic

ROOT = Path(__file__).resolve().parent.parent


def make_index(n: int = 60, dim: int = 16, seed: int = 0, **kwargs) -> NormIndex:
    vecs, counts = synthetic(n, dim=dim, seed=seed)
    index = NormIndex(dim=dim, weights=Weights(a=0.05), **kwargs)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(n)], texts=[f"text {i}" for i in range(n)],
                      metadatas=[{"i": i, "tag": ["x", "y"][i % 2], "nested": {"k": [i]}} for i in range(n)])
    return index


def queries(dim: int = 16, n: int = 5) -> list[np.ndarray]:
    return list(synthetic(n, dim=dim, seed=99)[0])


def snapshot(index: NormIndex, dim: int = 16, k: int = 5) -> tuple:
    """Everything a user can observe: ids, records, and search results."""
    ids = index.ids()
    qs = queries(dim)
    return ids, index.get(ids), index.search_batch(qs, k, query_token_counts=[12] * len(qs)), index.weights


def test_roundtrip_is_identical(tmp_path):
    index = make_index()
    index.set_weights(Weights(a=0.03, b=0.01, feature="raw"))
    index.calibrate_queries(norms=np.linspace(2, 6, 50), token_counts=np.arange(5, 55))
    index.delete(["d3", "d7"])
    q_hits = [index.search(q, 5, query_token_count=12) for q in queries()]
    index.save(tmp_path / "idx")
    loaded = NormIndex.load(tmp_path / "idx")
    assert snapshot(loaded) == snapshot(index)
    assert [loaded.search(q, 5, query_token_count=12) for q in queries()] == q_hits
    assert "d3" not in loaded and len(loaded) == 58
    # the loaded index keeps working: add, and it matches the original doing the same
    extra, counts = synthetic(3, dim=16, seed=5)
    for ix in (index, loaded):
        ix.add_vectors(extra, counts, ids=["e0", "e1", "e2"])
    assert snapshot(loaded) == snapshot(index)


@pytest.mark.parametrize("index_type", ["hnsw", "ivf"])
def test_roundtrip_approximate_indexes(tmp_path, index_type):
    index = make_index(n=400, index_type=index_type)
    index.delete([f"d{i}" for i in range(0, 400, 7)])
    index.save(tmp_path / "idx")
    loaded = NormIndex.load(tmp_path / "idx")
    assert snapshot(loaded) == snapshot(index)


def test_manifest_carries_version_dimension_count_and_checksums(tmp_path):
    folder = make_index(n=25).save(tmp_path / "idx")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["dim"] == 16 and manifest["count"] == 25
    assert set(manifest["files"]) == set(SAVED_FILES) | set(COLUMN_FILES)
    for name, digest in manifest["files"].items():
        assert persistence.sha256_file(folder / name) == digest
    assert (tmp_path / "idx" / "current").is_symlink()


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # flip one byte in the middle, size unchanged
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])


@pytest.mark.parametrize("how", ["truncate", "alter"])
@pytest.mark.parametrize("name", SAVED_FILES + COLUMN_FILES)
def test_damaged_file_is_named(tmp_path, name, how):
    folder = make_index(n=30).save(tmp_path / "idx")
    _damage(folder / name, how)
    with pytest.raises(IndexFormatError, match=f"checksum mismatch for {name}.*truncated or altered"):
        NormIndex.load(tmp_path / "idx")


def test_deleted_file_is_named(tmp_path):
    folder = make_index(n=30).save(tmp_path / "idx")
    (folder / "norms.npy").unlink()
    with pytest.raises(IndexFormatError, match="file norms.npy of the index .* is missing"):
        NormIndex.load(tmp_path / "idx")


def _edit_manifest(folder: Path, change) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    change(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def test_newer_format_version_says_upgrade(tmp_path):
    folder = make_index(n=30).save(tmp_path / "idx")
    _edit_manifest(folder, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(IndexFormatError, match=rf"format version {FORMAT_VERSION + 1}, newer than this normrank "
                                               rf"reads \({FORMAT_VERSION}\); upgrade normrank"):
        NormIndex.load(tmp_path / "idx")


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["files"].pop("ids.utf8"), "does not list ids.utf8"),
    (lambda m: m["files"].pop("index.faiss"), "does not list index.faiss"),
    (lambda m: m.update(count=m["count"] + 1), "inconsistent: 30 records.*manifest count 31"),
    (lambda m: m.update(dim=17), "inconsistent: manifest dim 17, state dim 16"),
    (lambda m: m.pop("format_version"), "no valid format_version"),
    (lambda m: m["files"].update({"../escape": "0" * 64}), "no valid 'files' table"),
])
def test_altered_manifest_is_refused(tmp_path, change, message):
    folder = make_index(n=30).save(tmp_path / "idx")
    _edit_manifest(folder, change)
    with pytest.raises(IndexFormatError, match=message):
        NormIndex.load(tmp_path / "idx")


def test_unreadable_manifest_and_bad_links(tmp_path):
    root = tmp_path / "idx"
    folder = make_index(n=30).save(root)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="manifest.json is not valid JSON"):
        NormIndex.load(root)
    (folder / "manifest.json").unlink()
    with pytest.raises(IndexFormatError, match="has no manifest.json: the save is incomplete"):
        NormIndex.load(root)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "current").unlink()
    os.symlink(str(outside), root / "current")
    with pytest.raises(IndexFormatError, match="outside the index folder; refusing to follow it"):
        NormIndex.load(root)
    with pytest.raises(FileNotFoundError, match="no saved index"):
        NormIndex.load(tmp_path / "nothing-here")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(IndexFormatError, match="is not a folder"):
        NormIndex.load(tmp_path / "afile")


def test_refuses_to_save_into_a_foreign_folder(tmp_path):
    (tmp_path / "mine" / "notes.txt").parent.mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(IndexFormatError, match="not a normrank index; refusing to write into it"):
        make_index(n=20).save(tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_failed_write_keeps_previous_and_leaves_no_debris(tmp_path):
    root = tmp_path / "idx"
    index = make_index(n=30)
    index.save(root)
    before = snapshot(NormIndex.load(root))

    def broken(folder: Path) -> None:
        (folder / "index.faiss").write_bytes(b"partial")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        persistence.write_versioned(root, broken, {"format_version": FORMAT_VERSION})
    assert snapshot(NormIndex.load(root)) == before
    assert len([p for p in root.iterdir() if p.name.startswith("v-")]) == 1


def test_a_failed_publish_leaves_no_link_behind(tmp_path, monkeypatch):
    """When the atomic swap of ``current`` itself fails, the version folder was removed but the staged
    ``.current-<hex>`` link to it stayed, dangling; now neither is left and the previous save loads."""
    root = tmp_path / "idx"
    index = make_index(n=30)
    index.save(root)
    before = snapshot(NormIndex.load(root))
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst).name == persistence.CURRENT:
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(persistence.os, "replace", failing_replace)
    with pytest.raises(OSError, match="Input/output error"):
        index.save(root)
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".current-")) == []
    assert len([p for p in root.iterdir() if p.name.startswith("v-")]) == 1
    assert snapshot(NormIndex.load(root)) == before


def test_an_index_copied_without_its_links_loads_and_a_save_into_it_is_refused(tmp_path):
    """``cp -r`` and ``shutil.copytree`` turn the ``current`` link into a copy of the version folder. It
    loads as it is; a save into it is refused by name before anything is written (the folder cannot be
    swapped for a link atomically), and saving the loaded index to a new folder works."""
    import shutil

    root = tmp_path / "idx"
    index = make_index(n=30)
    index.save(root)
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert not (copy / persistence.CURRENT).is_symlink()
    loaded = NormIndex.load(copy)
    assert snapshot(loaded) == snapshot(NormIndex.load(root))
    listing = sorted(p.name for p in copy.iterdir())
    with pytest.raises(IndexFormatError, match="cp -a"):
        loaded.save(copy)
    assert sorted(p.name for p in copy.iterdir()) == listing
    assert snapshot(NormIndex.load(copy)) == snapshot(loaded)
    loaded.save(tmp_path / "fresh")
    assert snapshot(NormIndex.load(tmp_path / "fresh")) == snapshot(loaded)


# ------------------------------------------------------------------ crashes

CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    import numpy as np
    from normrank import NormIndex, Weights
    from normrank import persistence
    from tests.conftest import synthetic

    path, stage = sys.argv[1], sys.argv[2]
    vecs, counts = synthetic(80, dim=16, seed=3)
    index = NormIndex(dim=16, weights=Weights(a=0.05))
    index.add_vectors(vecs[:50], counts[:50], ids=[f"d{{i}}" for i in range(50)])
    index.save(path)                        # the good version
    index.add_vectors(vecs[50:], counts[50:], ids=[f"d{{i}}" for i in range(50, 80)])
    index.delete(["d0"])
    persistence._save_hook = lambda s: os._exit(17) if s == stage else None
    index.save(path)                        # dies at `stage`
    os._exit(0)
""")


@pytest.mark.parametrize("stage", ["files_written", "manifest_written", "before_publish", "published"])
def test_process_dying_mid_save_loses_nothing(tmp_path, stage):
    root = tmp_path / "idx"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT)))
    proc = subprocess.run([sys.executable, str(script), str(root), stage], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 17, proc.stderr
    vecs, counts = synthetic(80, dim=16, seed=3)
    expected = NormIndex(dim=16, weights=Weights(a=0.05))
    expected.add_vectors(vecs[:50], counts[:50], ids=[f"d{i}" for i in range(50)])
    if stage == "published":  # the new version was already live: it loads, complete
        expected.add_vectors(vecs[50:], counts[50:], ids=[f"d{i}" for i in range(50, 80)])
        expected.delete(["d0"])
    loaded = NormIndex.load(root)
    assert snapshot(loaded) == snapshot(expected)
    assert len(loaded) == (79 if stage == "published" else 50)
    # the dead save left a version folder behind; the next save sweeps it
    assert len([p for p in root.iterdir() if p.name.startswith("v-")]) == 2
    loaded.save(root)
    assert len([p for p in root.iterdir() if p.name.startswith("v-")]) == 1
    assert snapshot(NormIndex.load(root)) == snapshot(expected)


FIRST_SAVE_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from normrank import NormIndex, persistence
    from tests.conftest import synthetic

    path, stage = sys.argv[1], sys.argv[2]
    vecs, counts = synthetic(40, dim=16, seed=3)
    index = NormIndex(dim=16)
    index.add_vectors(vecs, counts, ids=[f"d{{i}}" for i in range(40)])
    persistence._save_hook = lambda s: os._exit(17) if s == stage else None
    index.save(path)                        # the first save into the folder dies at `stage`
    os._exit(0)
""")


@pytest.mark.parametrize("stage", ["files_written", "manifest_written", "before_publish"])
def test_a_first_save_killed_before_it_publishes_leaves_no_saved_index_yet(tmp_path, stage):
    """Killed after its manifest was written (its fsyncs, the slow part of a big save, come after it), a first
    save left a complete-looking version without the ``current`` link: loads raised the ``IndexFormatError`` of
    a damaged or foreign folder ("not a saved normrank index"), which load-or-create code and ``normrank search``
    take for damage. A version is marked pending until published, so the folder has no saved index yet."""
    root = tmp_path / "idx"
    script = tmp_path / "child.py"
    script.write_text(FIRST_SAVE_CHILD.format(root=str(ROOT)))
    proc = subprocess.run([sys.executable, str(script), str(root), stage], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 17, proc.stderr
    with pytest.raises(FileNotFoundError, match="no saved index at .* yet"):
        NormIndex.load(root)
    index = make_index(n=30)
    index.save(root)  # the next save publishes and sweeps the dead one
    assert [p.name for p in root.iterdir() if p.name.startswith("v-")] == [os.readlink(root / "current")]
    assert not (root / os.readlink(root / "current") / ".normrank-pending").exists()
    assert snapshot(NormIndex.load(root)) == snapshot(index)



def test_the_lock_and_marker_follow_the_umask_so_a_group_can_save(tmp_path):
    """``.lock`` and ``.normrank`` were always 0644 while every other file followed the umask: under umask
    002 (a nightly indexer and an app user sharing a group) the second user's save failed on ``.lock``."""
    old = os.umask(0o002)
    try:
        make_index(n=20).save(tmp_path / "idx")
    finally:
        os.umask(old)
    for name in (".lock", ".normrank"):
        assert (tmp_path / "idx" / name).stat().st_mode & 0o777 == 0o664


def test_a_load_that_cannot_open_the_lock_is_named_not_run_unlocked(tmp_path):
    """A reader that could not open an existing ``.lock`` loaded without it, and a save beside it removed the
    version it read: a bare ``FileNotFoundError`` or "state.json is missing" (100 of 400 loads). It is named."""
    import tempfile

    shared = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        shared.chmod(0o755)
        make_index(n=20).save(shared / "idx")
        for p in (shared / "idx").rglob("*"):
            if not p.is_symlink():
                p.chmod(0o755 if p.is_dir() else 0o644)
        (shared / "idx" / ".lock").chmod(0o000)
        code = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
if os.getuid() == 0:
    os.setgid(65534); os.setuid(65534)  # root reads any file: load as nobody
from normrank import NormIndex, PersistenceError
try:
    NormIndex.load({str(shared / "idx")!r})
except PersistenceError as exc:
    print("named:", exc)
"""
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
        assert "named: " in out.stdout and ".lock to lock the folder for reading" in out.stdout, out.stdout + out.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


LOOP_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from normrank import NormIndex, Weights
    from tests.conftest import synthetic

    path, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    vecs, counts = synthetic(batch * steps, dim=64, seed=11)
    index = NormIndex(dim=64, weights=Weights(a=0.05))
    for s in range(steps):
        lo, hi = s * batch, (s + 1) * batch
        index.add_vectors(vecs[lo:hi], counts[lo:hi], ids=[f"d{{i}}" for i in range(lo, hi)])
        index.save(path)
        print(s, flush=True)
""")


def test_sigkill_during_save_loop_leaves_a_complete_index(tmp_path):
    """SIGKILL at random moments while a process keeps saving a growing index.

    Whatever moment the kill lands on, the folder loads, and it equals exactly the state
    after some number of whole batches: no torn or partial version is ever visible.
    """
    batch, steps = 4000, 40
    script = tmp_path / "loop.py"
    script.write_text(LOOP_CHILD.format(root=str(ROOT)))
    vecs, counts = synthetic(batch * steps, dim=64, seed=11)
    rng = np.random.default_rng(0)
    root = tmp_path / "idx"
    mid_save = 0  # kills that left a half-written version folder behind
    for attempt in range(6):
        proc = subprocess.Popen([sys.executable, str(script), str(root), str(batch), str(steps)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "0"  # one save has completed
        time.sleep(float(rng.uniform(0.05, 1.0)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        live = os.readlink(root / "current")
        mid_save += any(p.name.startswith("v-") and p.name != live for p in root.iterdir())
        loaded = NormIndex.load(root)
        n = len(loaded)
        assert n % batch == 0 and n >= batch
        assert loaded.ids() == [f"d{i}" for i in range(n)]
        expected = NormIndex(dim=64, weights=Weights(a=0.05))
        for s in range(n // batch):
            lo, hi = s * batch, (s + 1) * batch
            expected.add_vectors(vecs[lo:hi], counts[lo:hi], ids=[f"d{i}" for i in range(lo, hi)])
        assert snapshot(loaded, dim=64, k=10) == snapshot(expected, dim=64, k=10)
        if mid_save >= 2:
            break
    # saving is ~85% of the loop's time, so kills land mid-save; make sure the test saw that case
    assert mid_save >= 1, "no kill landed in the middle of a save; the test proved nothing"


# ------------------------------------------------------------------ concurrent savers and readers

def test_save_waits_for_a_reader_and_never_pulls_files_from_under_it(tmp_path):
    root = tmp_path / "idx"
    index = make_index(n=30)
    index.save(root)
    done = threading.Event()

    def save_again() -> None:
        index.save(root)
        done.set()

    with persistence.reading(root, FORMAT_VERSION, SAVED_FILES) as (folder, _):
        saver = threading.Thread(target=save_again)
        saver.start()
        saver.join(timeout=1.0)
        assert not done.is_set(), "the save swept the version a reader was reading"
        assert all((folder / name).is_file() for name in SAVED_FILES)
    saver.join(timeout=60)
    assert done.is_set()
    assert not folder.exists()  # swept once the reader let go
    assert snapshot(NormIndex.load(root)) == snapshot(index)


def test_concurrent_saves_and_loads_never_break_the_folder(tmp_path):
    root = tmp_path / "idx"
    indexes = [make_index(n=40 + 10 * i, seed=i) for i in range(3)]
    indexes[0].save(root)
    expected = {len(ix): snapshot(ix) for ix in indexes}
    errors: list[BaseException] = []
    seen: list[int] = []

    def saver(ix: NormIndex) -> None:
        try:
            for _ in range(5):
                ix.save(root)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    def loader() -> None:
        try:
            for _ in range(10):
                got = NormIndex.load(root)
                assert snapshot(got) == expected[len(got)]
                seen.append(len(got))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=saver, args=(ix,)) for ix in indexes] + \
        [threading.Thread(target=loader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert len(seen) == 20
    final = NormIndex.load(root)
    assert snapshot(final) == expected[len(final)]
    assert len([p for p in root.iterdir() if p.name.startswith("v-")]) == 1


@pytest.mark.parametrize("writer", ["this normrank", "before the marker"])
def test_first_save_killed_before_publishing_does_not_block_the_next(tmp_path, writer):
    """Regression: a folder holding only a dead save's debris used to be refused as 'not a normrank index'.

    The debris is what a first save killed mid-write leaves: the lock file, (since the ownership
    marker) the folder's marker, and a half-written ``v-<uuid hex>`` version folder.
    """
    root = tmp_path / "idx"
    dead = root / f"v-{'d' * 32}"
    dead.mkdir(parents=True)
    (root / ".lock").write_bytes(b"")
    if writer == "this normrank":
        (root / persistence.MARKER).write_text("{}")
        (dead / persistence.VERSION_MARKER).write_text("{}")
    (dead / "index.faiss").write_bytes(b"half")
    index = make_index(n=20)
    index.save(root)
    assert [p.name for p in root.iterdir() if p.name.startswith("v-")] == [os.readlink(root / "current")]
    assert snapshot(NormIndex.load(root)) == snapshot(index)


# ------------------------------------------------------------------ format 1 (records.jsonl) still loads

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _v1_copy(tmp_path: Path) -> Path:
    root = tmp_path / "index-v1"
    shutil.copytree(FIXTURES / "index-v1", root, symlinks=True)
    return root


def test_an_index_saved_in_format_1_loads_searches_and_resaves_as_format_2(tmp_path):
    """``tests/fixtures/index-v1`` was written by normrank before column storage (one JSON object per
    document in records.jsonl). It loads to the same index a fresh build of its data gives, and saving
    it again writes format 2, which loads to the same answers."""
    sys.path.insert(0, str(FIXTURES))
    try:
        from make_index_v1 import fixture_data
    finally:
        sys.path.remove(str(FIXTURES))
    d = fixture_data()
    fresh = NormIndex(dim=16, weights=Weights(**d["weights"]), pad_to=8)  # as the fixture was saved: same scores
    fresh.add_vectors(d["vecs"], d["counts"], ids=d["ids"], texts=d["texts"], metadatas=d["metas"])
    fresh.delete(d["deleted"])
    root = _v1_copy(tmp_path)
    v1 = root / os.readlink(root / "current")
    assert json.loads((v1 / "manifest.json").read_text())["format_version"] == 1 and (v1 / "records.jsonl").is_file()
    old = NormIndex.load(root)
    assert old.ids() == fresh.ids() and len(old) == 22
    assert old.get(old.ids()) == fresh.get(fresh.ids())
    for q in d["queries"]:
        assert old.search(q, 6, query_token_count=9) == fresh.search(q, 6, query_token_count=9)
        assert old.search(q, 4, query_token_count=9, filter={"source": "s0"}) == \
            fresh.search(q, 4, query_token_count=9, filter={"source": "s0"})
    np.testing.assert_array_equal(old.vectors(["doc-1", "dök/0#ü\n0"]), fresh.vectors(["doc-1", "dök/0#ü\n0"]))
    old.add_vectors(d["vecs"][:2], [5, 6], ids=["new-a", "new-b"], texts=["a", None])
    folder = old.save(root)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION == 2 and not (folder / "records.jsonl").exists()
    again = NormIndex.load(root)
    assert again.ids() == old.ids() and again.get(again.ids()) == old.get(old.ids())
    for q in d["queries"]:
        assert again.search(q, 8, query_token_count=9) == old.search(q, 8, query_token_count=9)


def test_format_1_without_its_records_is_named(tmp_path):
    root = _v1_copy(tmp_path)
    v1 = root / os.readlink(root / "current")
    _edit_manifest(v1, lambda m: m["files"].pop("records.jsonl"))
    with pytest.raises(IndexFormatError, match="does not list records.jsonl"):
        NormIndex.load(root)


@pytest.mark.parametrize(("change", "message"), [
    (lambda f: np.save(f / "lengths.npy", np.load(f / "lengths.npy")[:-1]), "document columns do not match"),
    (lambda f: np.save(f / "lengths.npy", np.load(f / "lengths.npy") + np.array([1, 0])), "ids.utf8 does not hold"),
    (lambda f: np.save(f / "lengths.npy", np.load(f / "lengths.npy") * np.array([1, 0])), "texts.utf8 does not hold"),
    (lambda f: (f / "metadata.json").write_text("[1]"), "document columns do not match"),
    (lambda f: (f / "metadata.json").write_text(json.dumps([[]] * 30)), "metadata that is not a JSON object"),
    (lambda f: (f / "ids.utf8").write_text((f / "ids.utf8").read_text().replace("d1", "d0")), "repeat an id"),
])
def test_inconsistent_document_columns_are_named(tmp_path, change, message):
    """Columns that pass their checksums (rewritten with the manifest) but disagree with each other."""
    folder = make_index(n=30).save(tmp_path / "idx")
    change(folder)
    m = json.loads((folder / "manifest.json").read_text())
    for name in COLUMN_FILES:
        m["files"][name] = persistence.sha256_file(folder / name)
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match=message):
        NormIndex.load(tmp_path / "idx")


def test_a_damaged_faiss_file_is_named_even_when_faiss_fails_first(tmp_path):
    """index.faiss is checksummed while FAISS parses it: a header FAISS cannot read still gives the
    checksum error that names the file, not FAISS's own message."""
    folder = make_index(n=30).save(tmp_path / "idx")
    data = bytearray((folder / "index.faiss").read_bytes())
    data[0:4] = b"XXXX"  # not a FAISS index type
    (folder / "index.faiss").write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="checksum mismatch for index.faiss"):
        NormIndex.load(tmp_path / "idx")


@pytest.mark.parametrize("helpers", [0, 1, 3])
def test_deferred_checksums_are_each_taken_once_by_whichever_thread_is_free(tmp_path, monkeypatch,
                                                                          helpers: int) -> None:
    """A load's big files are checksummed by helper threads and by its own threads once they are free
    (DeferredDigests): every file is hashed exactly once, the first altered file in the caller's order
    is named, and an unreadable file is the error, with no helper at all too."""
    names = [f"f{i}.bin" for i in range(5)]
    files = {}
    for i, name in enumerate(names):
        (tmp_path / name).write_bytes(bytes([i]) * (200_000 + i))
        files[name] = (tmp_path / name, persistence.sha256_file(tmp_path / name))
    (tmp_path / "f1.bin").write_bytes(b"altered")
    (tmp_path / "f3.bin").write_bytes(b"altered too")
    hashed: list[str] = []
    real = persistence.sha256_file

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(persistence, "sha256_file", counting)
    digests = persistence.DeferredDigests(files, helpers)
    workers = [threading.Thread(target=digests.work) for _ in range(3)]
    for w in workers:
        w.start()
    assert digests.first_bad() == "f1.bin"
    for w in workers:
        w.join()
    assert sorted(hashed) == sorted(names)  # each once, whoever took it
    (tmp_path / "f0.bin").unlink()
    with pytest.raises(FileNotFoundError):
        persistence.DeferredDigests(files, helpers).first_bad()


def test_a_checksum_left_unfinished_by_an_interrupted_thread_is_redone_not_waited_for(tmp_path) -> None:
    """A load's own thread takes checksums too; a Ctrl-C between taking one and finishing it must not
    leave the load's exit (first_bad, in that same thread) waiting forever for a result no thread will
    produce: the thread redoes it."""
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 100_000)
    out: list[object] = []

    def load_thread() -> None:
        digests = persistence.DeferredDigests({"big.bin": (path, persistence.sha256_file(path))}, helpers=0)
        with digests._changed:  # as if interrupted right after taking the job
            digests._owner[0] = threading.get_ident()
            digests._next = 1
        out.append(digests.first_bad())

    worker = threading.Thread(target=load_thread, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "first_bad waited for a checksum nobody computes"
    assert out == [None]


def test_columns_survive_deletes_saves_and_later_changes(tmp_path):
    """Deleted slots leave holes in the internal ids; a save and load keep every live document's id,
    text (None included), metadata and numbers, and the loaded index keeps adding and deleting with
    fresh internal ids, the same as the index it was saved from."""
    index = make_index(n=60)
    index.add_vectors(synthetic(3, dim=16, seed=4)[0], [3, 4, 5], ids=["t-none", "t-empty-meta", "t-ü"],
                      texts=[None, "", "ü ✓"], metadatas=[{}, {}, {"k": {"deep": [1, None]}}])
    index.delete([f"d{i}" for i in range(0, 60, 3)] + ["t-empty-meta"])
    index.save(tmp_path / "idx")
    loaded = NormIndex.load(tmp_path / "idx")
    assert loaded.ids() == index.ids() and loaded.get(loaded.ids()) == index.get(index.ids())
    assert [r.text for r in loaded.get(["t-none", "t-ü"])] == [None, "ü ✓"]
    assert loaded.get(["t-none"])[0].metadata == {}
    extra, counts = synthetic(5, dim=16, seed=7)
    for idx in (index, loaded):
        idx.add_vectors(extra, counts, ids=[f"x{i}" for i in range(5)], texts=[f"x {i}" for i in range(5)])
        idx.delete(["d1", "x2"])
    assert loaded.ids() == index.ids() and loaded.get(loaded.ids()) == index.get(index.ids())
    for q in queries():
        assert loaded.search(q, 12) == index.search(q, 12)
        assert loaded.search(q, 5, filter={"tag": "x"}) == index.search(q, 5, filter={"tag": "x"})
    hit = loaded.search(queries()[0], 1)[0]
    hit.metadata["tag"] = "changed"  # a hit's metadata is the caller's copy
    assert loaded.get([hit.id])[0].metadata.get("tag") != "changed"


def test_loading_with_an_encoder_that_encodes_otherwise_warns(tmp_path, encoder, demo_texts, caplog):
    """``NormIndex.load(path, encoder=...)`` took any encoder in silence; one that would not encode queries
    like the documents (other pooling, window or int8 weights) is named, one that would (a batch size,
    torch's vectors on ONNX Runtime) is not."""
    import logging

    from normrank.pooling import PooledEncoder

    index = NormIndex.from_texts(demo_texts[:8], encoder=encoder)
    index.save(tmp_path / "ix")
    other = [(PooledEncoder(pooling="norm", show_progress=False), "pooling 'mean' -> 'norm'"),
             (RawEncoder(max_seq_length=128, show_progress=False), "max_seq_length None -> 128")]
    same = [RawEncoder(batch_size=7, show_progress=False)]
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        pass
    else:
        other.append((RawEncoder(backend="onnx-int8", show_progress=False), "weights 'float32' -> 'int8'"))
        same.append(RawEncoder(backend="onnx", show_progress=False))
    for enc, words in other:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="normrank"):
            NormIndex.load(tmp_path / "ix", encoder=enc)
        assert words in caplog.text and "another encoder" in caplog.text
    for enc in same:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="normrank"):
            NormIndex.load(tmp_path / "ix", encoder=enc)
        assert "another encoder" not in caplog.text


def _big_index(n: int = 3000) -> NormIndex:
    """Wide enough (385 x 4 bytes a row) that index.faiss spans three 2 MiB checksum pieces."""
    vecs, counts = synthetic(n, dim=384, seed=3)
    index = NormIndex(dim=384, weights=Weights(a=0.05), pad_to=1)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(n)], texts=[f"t{i}" for i in range(n)])
    return index


def test_big_files_carry_piece_checksums_and_keep_whole_file_ones(tmp_path):
    """index.faiss and texts.utf8 are saved with a SHA-256 per 2 MiB piece (threads of a load share
    them) and still with their whole-file SHA-256, so a normrank that predates pieces loads the folder."""
    index = _big_index()
    folder = index.save(tmp_path / "idx")
    manifest = json.loads((folder / "manifest.json").read_text())
    table = manifest["pieces"]["index.faiss"]
    data = (folder / "index.faiss").read_bytes()
    assert table["size"] == len(data) and table["piece"] == persistence.PIECE_BYTES and len(table["sha256"]) == 3
    p = table["piece"]
    assert table["sha256"] == [hashlib.sha256(data[i:i + p]).hexdigest() for i in range(0, len(data), p)]
    assert manifest["files"]["index.faiss"] == hashlib.sha256(data).hexdigest()
    assert set(manifest["pieces"]) == {"index.faiss", "texts.utf8"}
    assert snapshot(NormIndex.load(tmp_path / "idx"), dim=384) == snapshot(index, dim=384)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("how", ["alter", "truncate", "append"])
def test_damage_in_any_piece_is_named(tmp_path, where, how):
    folder = _big_index().save(tmp_path / "idx")
    path = folder / "index.faiss"
    data = bytearray(path.read_bytes())
    if how == "truncate":
        del data[{"first": 100, "middle": len(data) // 2, "last": len(data) - 1}[where]:]
    elif how == "append":
        data += b"\0" * {"first": 1, "middle": 4096, "last": persistence.PIECE_BYTES}[where]
    else:
        data[{"first": 7, "middle": len(data) // 2, "last": len(data) - 1}[where]] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="checksum mismatch for index.faiss.*truncated or altered"):
        NormIndex.load(tmp_path / "idx")


def test_a_folder_saved_without_pieces_loads_and_is_still_checked(tmp_path):
    """Folders saved before piece checksums (no ``pieces`` in the manifest) are checked file by file."""
    index = _big_index()
    folder = index.save(tmp_path / "idx")
    _edit_manifest(folder, lambda m: m.pop("pieces"))
    assert snapshot(NormIndex.load(tmp_path / "idx"), dim=384) == snapshot(index, dim=384)
    _damage(folder / "index.faiss", "alter")
    with pytest.raises(IndexFormatError, match="checksum mismatch for index.faiss"):
        NormIndex.load(tmp_path / "idx")


@pytest.mark.parametrize("change", [
    lambda m: m.update(pieces=[]),
    lambda m: m["pieces"]["index.faiss"].update(piece=1000),  # not page aligned
    lambda m: m["pieces"]["index.faiss"].update(piece=0),
    lambda m: m["pieces"]["index.faiss"]["sha256"].pop(),  # fewer digests than pieces
    lambda m: m["pieces"]["index.faiss"].update(size=True),
    lambda m: m["pieces"]["index.faiss"].update(size=12),
    lambda m: m["pieces"]["index.faiss"]["sha256"].__setitem__(1, "0" * 64),  # a stale digest
])
def test_the_whole_file_digest_decides_when_pieces_are_malformed_or_stale(tmp_path, change):
    """Pieces only speed the check up; ``files`` stays the authority, as for a normrank that predates
    them: a malformed or stale piece table loads when the file matches its whole-file digest (a folder
    whose file and ``files`` entry were rewritten together loads as it does there), and names the file
    when it does not."""
    index = _big_index(n=2000)
    folder = index.save(tmp_path / "idx")
    _edit_manifest(folder, change)
    assert snapshot(NormIndex.load(tmp_path / "idx"), dim=384) == snapshot(index, dim=384)
    _damage(folder / "index.faiss", "alter")
    with pytest.raises(IndexFormatError, match="checksum mismatch for index.faiss"):
        NormIndex.load(tmp_path / "idx")


@pytest.mark.parametrize("helpers", [0, 2])
def test_pieces_are_each_hashed_once_by_whichever_thread_is_free(tmp_path, monkeypatch, helpers: int) -> None:
    """A file with piece checksums is one job per piece: threads share one big file, each piece is
    hashed once, and an altered piece names its file (the first such file in the caller's order)."""
    piece = 4 * mmap.ALLOCATIONGRANULARITY
    files = {}
    for i, name in enumerate(["a.bin", "b.bin"]):
        (tmp_path / name).write_bytes(bytes(range(256)) * (piece * 5 // 256 + 3 * i))
        files[name] = (tmp_path / name, persistence.sha256_file(tmp_path / name),
                       persistence.piece_table(tmp_path / name, piece))
    calls: list[tuple[str, int]] = []
    real = persistence.sha256_piece

    def counting(path: Path, offset: int, length: int) -> str:
        calls.append((path.name, offset))
        return real(path, offset, length)

    monkeypatch.setattr(persistence, "sha256_piece", counting)
    digests = persistence.DeferredDigests(files, helpers)
    workers = [threading.Thread(target=digests.work) for _ in range(2)]
    for w in workers:
        w.start()
    assert digests.first_bad() is None
    for w in workers:
        w.join()
    n_pieces = sum(len(f[2]["sha256"]) for f in files.values())
    assert sorted(calls) == sorted(set(calls)) and len(calls) == n_pieces == 11  # 5 whole pieces; 5 and a part
    data = bytearray((tmp_path / "b.bin").read_bytes())
    data[piece * 3 + 5] ^= 0xFF
    (tmp_path / "b.bin").write_bytes(bytes(data))
    assert persistence.DeferredDigests(files, helpers).first_bad() == "b.bin"


@pytest.mark.parametrize("layout", ["empty", "lock only", "marker and lock", "unpublished version"])
def test_a_folder_a_first_save_is_still_writing_has_no_saved_index_yet(tmp_path, layout):
    """What a first save leaves before it publishes reads as no index yet (FileNotFoundError, as before the
    folder existed), not as a damaged or foreign folder (IndexFormatError); a folder with foreign content
    and no ``current`` is still named as not an index."""
    root = tmp_path / "idx"
    root.mkdir()
    if layout != "empty":
        (root / ".lock").touch()
    if layout in ("marker and lock", "unpublished version"):
        (root / ".normrank").write_text('{"kind": "normrank saved index"}\n')
    if layout == "unpublished version":
        (root / ("v-" + "ab" * 16)).mkdir()
        (root / ("v-" + "ab" * 16) / ".normrank-version").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="no saved index at .* yet"):
        NormIndex.load(root)
    (root / ".normrank").unlink(missing_ok=True)
    (root / "notes.txt").write_text("mine")
    with pytest.raises(IndexFormatError, match="not a saved normrank index"):
        NormIndex.load(root)


def test_a_complete_version_without_its_current_link_is_named_not_missing(tmp_path):
    """A copy that lost its ``current`` link (``rsync -r``) holds the marker and a complete version: it is
    named, not read as "nothing saved yet" (load-or-create code would have saved over it)."""
    folder = make_index(n=30).save(tmp_path / "src")
    dst = tmp_path / "dst"
    dst.mkdir()
    shutil.copy(tmp_path / "src" / ".normrank", dst / ".normrank")
    shutil.copytree(folder, dst / folder.name)
    with pytest.raises(IndexFormatError, match="not a saved normrank index"):
        NormIndex.load(dst)


def test_loads_racing_first_saves_see_nothing_or_the_index(tmp_path):
    """A reader polling folders that another process saves into for the first time gets
    FileNotFoundError until the save is published, then the index: never IndexFormatError."""
    writer = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(ROOT)!r})
        from normrank import NormIndex, Weights
        rng = np.random.default_rng(0)
        idx = NormIndex(dim=16, weights=Weights(a=0.02))
        idx.add_vectors(rng.standard_normal((50, 16)).astype(np.float32), rng.integers(5, 99, 50))
        for k in range(40):
            idx.save({str(tmp_path)!r} + f"/i{{k}}")
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    seen: dict[str, int] = {}
    k = 0
    deadline = time.monotonic() + 120
    while k < 40 and time.monotonic() < deadline:
        try:
            NormIndex.load(tmp_path / f"i{k}")
            k += 1
            seen["loaded"] = seen.get("loaded", 0) + 1
        except FileNotFoundError:
            seen["not yet"] = seen.get("not yet", 0) + 1
    assert proc.wait(timeout=120) == 0
    assert seen.get("loaded") == 40, seen


@pytest.mark.parametrize("after", [1, 2, 4, 7])
def test_a_sweep_interrupted_part_way_is_finished_by_the_next_save(tmp_path, monkeypatch, after):
    """A save that is interrupted (Ctrl-C, a kill) while it deletes the old version used to leave what
    ``rmtree`` had not reached yet; when that took the marker and the manifest first, the leftover was
    not recognisably normrank's and stayed for good (a half copy of ``index.faiss`` in the worst case).
    The marks go last now, so the next save sweeps whatever an interruption leaves."""
    vecs, counts = synthetic(60, dim=8, seed=4)
    index = NormIndex(dim=8)
    index.add_vectors(vecs, counts, ids=[f"s{i}" for i in range(60)])
    root = tmp_path / "idx"
    index.save(root)
    old = os.readlink(root / "current")
    real_unlink, calls = Path.unlink, []

    def interrupted(self, missing_ok=False):
        if self.parent.name == old:
            calls.append(self.name)
            if len(calls) == after:
                raise KeyboardInterrupt
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", interrupted)
    with pytest.raises(KeyboardInterrupt):
        index.save(root)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert (root / old).is_dir()  # the interruption left the old version part-deleted ...
    assert persistence.VERSION_MARKER in os.listdir(root / old) or not os.listdir(root / old)
    loaded = NormIndex.load(root)  # ... the published one answers ...
    assert loaded.search(vecs[3], 5) == index.search(vecs[3], 5)
    index.save(root)  # ... and the next save sweeps the leftover
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("v-")) == [os.readlink(root / "current")]


def test_adapter_state_is_saved_checked_and_loaded(tmp_path):
    """``NormIndex.adapter_state`` (what an adapter keeps with the index) is saved with it and loaded back;
    a value JSON cannot hold is refused by name before anything is written, and an old save has none."""
    index = make_index()
    assert index.adapter_state == {}
    index.adapter_state["llama_index"] = {"deleted_reference_nodes": ["in1", "é"]}
    index.save(tmp_path / "idx")
    again = NormIndex.load(tmp_path / "idx")
    assert again.adapter_state == {"llama_index": {"deleted_reference_nodes": ["in1", "é"]}}
    again.adapter_state["x"] = {1, 2}
    with pytest.raises(InvalidArgumentError, match="adapter_state must hold JSON values only"):
        again.save(tmp_path / "idx")
    again.adapter_state["x"] = float("nan")
    with pytest.raises(InvalidArgumentError, match="adapter_state must hold JSON values only"):
        again.save(tmp_path / "idx")
    assert NormIndex.load(tmp_path / "idx").adapter_state == {"llama_index": {"deleted_reference_nodes": ["in1", "é"]}}
    fresh = make_index(n=10)
    fresh.update_adapter_state("mine", {"n": [1, 2.5, None]})
    assert fresh.adapter_state == {"mine": {"n": [1, 2.5, None]}}
    for key, value in (("", 1), (3, 1), ("k", {1, 2}), ("k", float("inf"))):
        with pytest.raises(InvalidArgumentError, match="adapter_state"):
            fresh.update_adapter_state(key, value)
    assert fresh.adapter_state == {"mine": {"n": [1, 2.5, None]}}


@pytest.mark.parametrize("change", [Weights(a=0.5, feature="raw"), Weights(a=0.5, mode="tiebreak")])
def test_an_emptied_ivf_index_saves_after_a_blend_change(tmp_path, change):
    """Deleting every document, then changing the feature or mode, rebuilt the index to nothing: the save
    failed with "an IVF index that never held a document", and the folder kept the deleted documents."""
    index = make_index(n=200, index_type="ivf", nlist=4)
    index.save(tmp_path / "idx")
    index.delete(index.ids())
    index.set_weights(change)
    index.save(tmp_path / "idx")
    again = NormIndex.load(tmp_path / "idx")
    assert len(again) == 0 and again.weights == change
    vecs, counts = synthetic(20, dim=16, seed=9)
    again.add_vectors(vecs, counts, ids=[f"n{i}" for i in range(20)])
    assert len(again.search(vecs[3], 5)) == 5
    again.set_weights(Weights())
    assert [h.id for h in again.search(vecs[3], 1)] == ["n3"]
