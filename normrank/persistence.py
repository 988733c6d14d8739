"""Atomic, verified folders: how a saved index survives crashes, races and tampering.

A saved index is a folder holding ``current`` (a symlink) and one ``v-<uuid>``
folder per saved version. A save writes a complete new version folder with a
manifest of SHA-256 checksums, fsyncs it, then swaps ``current`` with one atomic
``os.replace``. A process killed at any moment leaves ``current`` pointing at a
complete version, old or new; the next save sweeps up the half-written folder.
Loading checks every checksum, so a truncated or edited file is named instead of
half-loaded. Nothing here unpickles anything.

Concurrency: a save holds an exclusive ``flock`` on ``<root>/.lock`` and a load a
shared one, so two savers (threads or processes) never delete each other's
unpublished version, and a save never sweeps away the version a reader is still
reading. (Without a ``.lock`` file, e.g. on a read-only copy, loads skip locking.)

What the checksums do and do not promise: they detect accidental truncation and
edits of any data file. They are not a signature: someone who can rewrite the
manifest can rewrite the checksums too. Loading reads only JSON, ``.npy`` without
pickle, and a FAISS file, so it never executes data either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from normrank.errors import IndexFormatError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CURRENT = "current"
LOCK = ".lock"
_OWNED_PREFIXES = ("v-", ".current-")

#: Test hook: when set, called with the stage name ("files_written", "manifest_written",
#: "before_publish", "published") during every save. Tests set it to ``os._exit`` to
#: prove a save killed at that moment loses nothing. Never set in production code.
_save_hook: Callable[[str], None] | None = None


def _stage(name: str) -> None:
    if _save_hook is not None:
        _save_hook(name)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _locked(root: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold ``flock`` on ``root/.lock``; per open file, so it also orders threads of one process."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: no cross-process locking
        yield
        return
    path = root / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if exclusive else os.open(path, os.O_RDONLY)
    except (FileNotFoundError, PermissionError):
        if exclusive:
            raise
        yield  # saved by an older normrank, or a read-only copy without a lock file
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _is_index_folder(root: Path) -> bool:
    """True for a saved index, an empty folder, or one holding only what this module writes
    (e.g. a first save that was killed before it published)."""
    if (root / CURRENT).is_symlink():
        return True
    for p in root.iterdir():
        if p.name in (CURRENT, LOCK) or p.name.startswith(_OWNED_PREFIXES):
            continue
        return False
    return True


def write_versioned(
    root: str | os.PathLike[str],
    write_files: Callable[[Path], None],
    manifest_extra: dict[str, Any],
) -> Path:
    """Write a new version under ``root`` with ``write_files(folder)`` and publish it atomically.

    If ``write_files`` raises (disk full, a bug), the partial version is removed and
    ``current`` still names the previous complete version.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise IndexFormatError(f"{root} exists and is not a folder")
    if root.is_dir() and not _is_index_folder(root):
        raise IndexFormatError(
            f"{root} is a non-empty folder that is not a normrank index; refusing to write into it"
        )
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root, exclusive=True):
        version = root / f"v-{uuid.uuid4().hex}"
        version.mkdir()
        try:
            write_files(version)
            _stage("files_written")
            files = sorted(p.name for p in version.iterdir() if p.is_file())
            manifest = {**manifest_extra, "files": {name: sha256_file(version / name) for name in files}}
            (version / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
            _stage("manifest_written")
            for name in [*files, MANIFEST]:
                with open(version / name, "rb") as fh:
                    os.fsync(fh.fileno())
            _fsync_dir(version)
            _stage("before_publish")
            link = root / f".current-{uuid.uuid4().hex}"
            os.symlink(version.name, link)
            os.replace(link, root / CURRENT)
        except BaseException:
            shutil.rmtree(version, ignore_errors=True)
            raise
        _fsync_dir(root)
        _stage("published")
        _remove_stale(root, keep=version.name)
    return version


def _remove_stale(root: Path, keep: str) -> None:
    """Remove superseded and half-written versions; safe because the caller holds the exclusive lock."""
    for p in root.iterdir():
        if p.name in (keep, CURRENT, LOCK):
            continue
        if p.name.startswith("v-") and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(".current-") and p.is_symlink():
            p.unlink(missing_ok=True)


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _verify(root: Path, format_version: int, required: Iterable[str]) -> tuple[Path, dict[str, Any]]:
    current = root / CURRENT
    if not current.is_symlink():
        raise IndexFormatError(f"{root} is not a saved normrank index (no '{CURRENT}' version link)")
    target = os.readlink(current)
    if not _plain_name(target) or not target.startswith("v-"):
        raise IndexFormatError(f"{current} points at {target!r}, outside the index folder; refusing to follow it")
    folder = root / target
    if not folder.is_dir() or folder.is_symlink():
        raise IndexFormatError(f"{current} points at {target}, which is missing: the index folder was altered")
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{folder} has no {MANIFEST}: the save is incomplete") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{folder / MANIFEST} is not valid JSON: the file was altered") from exc
    if not isinstance(manifest, dict):
        raise IndexFormatError(f"{folder / MANIFEST} is not a JSON object: the file was altered")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise IndexFormatError(f"{folder / MANIFEST} has no valid format_version (got {version!r})")
    if version > format_version:
        raise IndexFormatError(
            f"the index at {root} has format version {version}, newer than this normrank reads "
            f"({format_version}); upgrade normrank to load it"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(_plain_name(k) and isinstance(v, str) for k, v in files.items()):
        raise IndexFormatError(f"{folder / MANIFEST} has no valid 'files' table: the file was altered")
    for name in required:
        if name not in files:
            raise IndexFormatError(f"{MANIFEST} of the index at {root} does not list {name}: the file was altered")
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise IndexFormatError(f"file {name} of the index at {root} is missing")
        if sha256_file(path) != digest:
            raise IndexFormatError(
                f"checksum mismatch for {name} in the index at {root}: the file was truncated or altered"
            )
    return folder, manifest


@contextmanager
def reading(
    root: str | os.PathLike[str], format_version: int, required: Iterable[str] = ()
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Yield the verified current version folder and its manifest, holding the shared lock.

    Read every file inside the ``with`` block: a concurrent save may remove this
    version as soon as the block ends.
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no saved index at {root}")
    if not root.is_dir():
        raise IndexFormatError(f"{root} is not a folder, so it is not a saved normrank index")
    with _locked(root, exclusive=False):
        yield _verify(root, format_version, required)


def open_verified(
    root: str | os.PathLike[str], format_version: int, required: Iterable[str] = ()
) -> tuple[Path, dict[str, Any]]:
    """Check the current version and return it; prefer :func:`reading`, which keeps it locked."""
    with reading(root, format_version, required) as out:
        return out
