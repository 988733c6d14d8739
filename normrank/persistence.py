"""Atomic, verified folders: how a saved index survives crashes, races and tampering.

A saved index is a folder holding ``current`` (a symlink) and one ``v-<uuid>``
folder per saved version. A save writes a complete new version folder with a
manifest of SHA-256 checksums, fsyncs it, then swaps ``current`` with one atomic
``os.replace``. A process killed at any moment leaves ``current`` pointing at a
complete version, old or new; the next save sweeps up the half-written folder.
Loading checks every checksum, so a truncated or edited file is named instead of
half-loaded. Nothing here unpickles anything.

Ownership: normrank writes and removes only what it owns. A folder is normrank's when it
is empty or new, when it holds normrank's marker file ``.normrank`` (written by every save),
or (indexes saved before the marker) when every entry has a name normrank gives its own
(``current`` -> ``v-<32 hex>``, ``v-<32 hex>/``, ``.current-<32 hex>``, ``.lock``). Anything
else, e.g. a deployment layout ``current -> v-1.2.3``, ``v-1.2.2/``, ``settings.ini``, is
refused with :class:`IndexFormatError` before a single byte is written. Inside its own
folder a save sweeps only version folders that carry normrank's version marker (or a
normrank manifest, or are empty) and its own temporary links; other entries stay untouched.

Symlinks inside a saved folder are never followed: every file is opened with
``O_NOFOLLOW`` and a data file, manifest or ``.lock`` that is a link is refused.

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

import contextlib
import errno
import functools
import hashlib
import io
import json
import logging
import math
import mmap
import os
import re
import shutil
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from normrank.errors import ConcurrentUpdateError, IndexFormatError, PersistenceError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CURRENT = "current"
LOCK = ".lock"
#: Marker file at the root of every folder normrank saves into: the folder is normrank's.
MARKER = ".normrank"
#: Marker file inside every version folder, written first: the folder is normrank's to sweep.
VERSION_MARKER = ".normrank-version"
#: Empty file inside a version folder from its start until its save has published it (taken away after the
#: ``current`` link points at it): a first save killed between its manifest and its link leaves a complete-
#: looking version that is no saved index yet, which an ``rsync -r`` copy (a published version, link lost)
#: is not.
PENDING = ".normrank-pending"
_VERSION_NAME = re.compile(r"v-[0-9a-f]{32}")
#: Every file name a version folder of a saved index can hold, in any format (``tests/test_persistence.py``
#: checks it against the store's): a ``v-<hex>`` folder without the version marker or a manifest (a save
#: from before the marker, killed half-written) is normrank's only if it holds nothing else.
VERSION_FILE_NAMES = frozenset({
    MANIFEST, VERSION_MARKER, PENDING, "index.faiss", "norms.npy", "token_counts.npy", "tombstones.npy", "state.json",
    "records.jsonl", "ids.utf8", "texts.utf8", "lengths.npy", "metadata.json",
    "internal_ids.npy",  # written by early format-1 builds: still normrank's to sweep
})
_LINK_NAME = re.compile(r"\.current-[0-9a-f]{32}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: Bytes per piece of a big file's piece checksums (manifest ``pieces``); a multiple of every page size.
PIECE_BYTES = 2 << 20
_PIECE_MAX = 1 << 30

#: Test hook: when set, called with the stage name ("files_written", "manifest_written",
#: "before_publish", "published") during every save. Tests set it to ``os._exit`` to
#: prove a save killed at that moment loses nothing. Never set in production code.
_save_hook: Callable[[str], None] | None = None


def _stage(name: str) -> None:
    if _save_hook is not None:
        _save_hook(name)


def open_nofollow(path: Path, mode: str = "rb") -> IO[Any]:
    """Open a file of a saved index for reading without following a symlink (named error if it is one).

    Only a regular file is read: a FIFO in an unpacked archive made a load wait forever for a writer,
    and a device node (``/dev/zero`` as ``manifest.json``) read until memory ran out."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IndexFormatError(f"{path} is a symbolic link; refusing to follow it out of the index folder") \
                from None
        raise
    _require_regular(fd, path)
    fh = os.fdopen(fd, "rb")
    return fh if mode == "rb" else io.TextIOWrapper(fh, encoding="utf-8")


def _require_regular(fd: int, path: Path) -> None:
    """Close ``fd`` and name the problem unless it is a regular file (opened with ``O_NONBLOCK``, which
    lets a FIFO open at once instead of waiting for a writer; a regular file ignores the flag)."""
    st_mode = os.fstat(fd).st_mode
    if stat.S_ISREG(st_mode):
        return
    os.close(fd)
    kind = ("a FIFO" if stat.S_ISFIFO(st_mode) else "a device" if stat.S_ISCHR(st_mode) or stat.S_ISBLK(st_mode)
            else "a socket" if stat.S_ISSOCK(st_mode) else "a folder" if stat.S_ISDIR(st_mode) else "not a file")
    raise IndexFormatError(f"{path} is {kind}, not a regular file; refusing to use it as part of the index")


def load_npy(fh: IO[bytes], path: Path) -> np.ndarray:
    """``np.load`` of a saved column, with the shape its header claims checked against the file's size
    first: a header claiming 10^12 rows raised a bare ``MemoryError`` instead of naming the file."""
    start = fh.tell()
    try:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read_header(fh)
    except (ValueError, TypeError, SyntaxError, OSError) as exc:
        raise IndexFormatError(f"{path} is not a valid .npy file: {exc}") from None
    if dtype.hasobject:
        raise IndexFormatError(f"{path} holds Python objects; a saved index never does (pickle is refused)")
    need = math.prod(shape) * dtype.itemsize
    have = os.fstat(fh.fileno()).st_size - fh.tell()
    if need != have:
        raise IndexFormatError(f"{path} is truncated or altered: its header claims {need} bytes of data, "
                               f"the file holds {have}")
    fh.seek(start)
    return np.load(fh, allow_pickle=False)


def sha256_file(path: Path) -> str:
    # file_digest reads into one reused buffer: a fresh 1 MB bytes object per chunk raised glibc's mmap
    # threshold and left ~9 MB of a 100k-document load's heap resident after the hash was done.
    with open_nofollow(path) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def sha256_piece(path: Path, offset: int, length: int) -> str:
    """SHA-256 of ``length`` bytes of ``path`` from ``offset`` (a multiple of the page size), read through
    a mapping: no buffer of ours (a freed multi-MB buffer raises glibc's mmap threshold, see
    :func:`sha256_file`), and the GIL is let go while it hashes. A file shorter than asked hashes short,
    so it does not match."""
    with open_nofollow(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        length = max(0, min(length, size - offset))
        if length == 0:
            return hashlib.sha256(b"").hexdigest()
        with mmap.mmap(fh.fileno(), length, offset=offset, access=mmap.ACCESS_READ) as mm:
            return hashlib.sha256(mm).hexdigest()


def piece_table(path: Path, piece: int = PIECE_BYTES) -> dict[str, Any]:
    """The manifest's ``pieces`` entry for one file: its size and the SHA-256 of each ``piece`` bytes.

    Why pieces as well as the whole-file digest: one SHA-256 stream runs on one core, and a load
    hashing ``index.faiss`` that way took as long as FAISS took to read it. Pieces are checked by every
    thread of the load that is free (:class:`DeferredDigests`). The whole-file digest stays in ``files``,
    so a normrank that predates pieces still loads the folder."""
    size = path.stat().st_size
    return {"size": size, "piece": piece,
            "sha256": [sha256_piece(path, off, piece) for off in range(0, size, piece)]}


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the OS after a load (glibc only; a no-op elsewhere).

    A load frees many large temporary buffers (file contents, id arrays, decoded blobs); glibc then
    serves later allocations from its heap and keeps the freed pages resident: ~6 MB of a 100k-document
    load's RSS (benchmarks/results/speed.md, section 5) that ``malloc_trim`` returns in about a millisecond.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


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
        fd = (os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK, 0o666) if exclusive
              else os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK))
    except FileNotFoundError:
        if exclusive:
            raise
        yield  # saved by an older normrank, or a read-only copy without a lock file
        return
    except PermissionError:
        if exclusive:
            raise
        # Loading without the lock here let a save remove the version being read (bare FileNotFoundError,
        # or "state.json is missing" as if the folder were damaged, 100 of 400 loads beside a saving writer).
        raise PersistenceError(errno.EACCES, f"cannot open {path} to lock the folder for reading (permission "
                               "denied): a load holds this lock so that no save removes the version it reads; "
                               "give this user read access to it, as to the saved files") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IndexFormatError(f"{path} is a symbolic link; refusing to follow it out of the index folder") \
                from None
        raise
    _require_regular(fd, path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def foreign_entries(root: Path) -> list[str]:
    """Names in ``root`` that show it is not normrank's folder; empty when normrank may write there.

    ``root`` is normrank's when it is empty, holds the ``.normrank`` marker (a regular file), or
    every entry is one normrank writes (folders saved before the marker existed).
    """
    if not root.is_dir():
        return []
    marker = root / MARKER
    if marker.is_file() and not marker.is_symlink():
        return []
    foreign = []
    for p in sorted(root.iterdir()):
        if _entry_kind(p) is None:
            foreign.append(p.name + ("/" if p.is_dir() and not p.is_symlink() else "")
                           + (f" -> {os.readlink(p)}" if p.is_symlink() else ""))
    return foreign


def _entry_kind(p: Path) -> str | None:
    """What ``p`` is among the entries normrank writes in an index folder: ``"file"`` (``.lock``, or the
    marker, which a save may write while the folder is listed), ``"current"``, ``"version"`` (a
    ``v-<hex>`` folder) or ``"link"`` (a ``.current-<hex>`` link being published); ``None`` for anything else."""
    name = p.name
    if name in (LOCK, MARKER) and p.is_file() and not p.is_symlink():
        return "file"
    if name == CURRENT and p.is_symlink() and _VERSION_NAME.fullmatch(os.readlink(p)):
        return "current"
    if _VERSION_NAME.fullmatch(name) and (_owned_version(p) or _holds_only_index_files(p)):
        return "version"
    if _LINK_NAME.fullmatch(name) and p.is_symlink():
        return "link"
    return None


def _check_owned(root: Path) -> None:
    foreign = foreign_entries(root)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise IndexFormatError(
            f"{root} is a non-empty folder that is not a normrank index; refusing to write into it (it holds "
            f"{shown}, which normrank did not write): save into a new or empty folder"
        )


def _write_marker(path: Path, content: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(content) + "\n")


#: ``write_versioned(if_current=...)``'s default: publish whatever ``current`` names meanwhile.
ANY_VERSION: Any = object()


def current_version(root: str | os.PathLike[str]) -> str | None:
    """The version folder ``current`` names in ``root`` (``None``: nothing published, or not a link)."""
    link = Path(root) / CURRENT
    return os.readlink(link) if link.is_symlink() else None


def write_versioned(
    root: str | os.PathLike[str],
    write_files: Callable[[Path], None],
    manifest_extra: dict[str, Any],
    *,
    pieces: Iterable[str] = (),
    if_current: Any = ANY_VERSION,
) -> Path:
    """Write a new version under ``root`` with ``write_files(folder)`` and publish it atomically.

    ``if_current``: publish only if ``current`` still names this version folder (``None``: nothing
    published yet), checked under the folder's lock; otherwise raise ``ConcurrentUpdateError`` and write
    nothing. It turns "load, change, save" into a compare-and-swap across processes.

    The files named in ``pieces`` (the big ones a load reads) also get piece checksums
    (:func:`piece_table`), which a load checks on every thread it has free.

    If ``write_files`` raises (disk full, a bug), the partial version is removed and
    ``current`` still names the previous complete version.

    Raises
    ------
    IndexFormatError
        ``root`` is a file, or a folder holding things normrank did not write (nothing is written).
    PersistenceError
        The operating system refused a write (disk full, quota, permissions, I/O error); the
        previous version is still ``current``. It is an ``OSError`` carrying the original ``errno``.
    """
    root = Path(root)
    if root.is_symlink() and not root.exists():
        raise IndexFormatError(f"{root} is a symbolic link to {os.readlink(root)!r}, which does not exist")
    if root.exists() and not root.is_dir():
        raise IndexFormatError(f"{root} exists and is not a folder")
    holder = _index_holding(root)
    if holder is not None:
        raise IndexFormatError(
            f"{root} is inside a version folder of the index saved at {holder}: nothing was saved there, "
            "because that index's next save removes its old version folders. Save into a folder of its own")
    _check_owned(root)
    if _copied_without_links(root):
        raise IndexFormatError(
            f"{root} is a copy of a saved index whose '{CURRENT}' link became a folder (cp -r, shutil.copytree): "
            "nothing was saved. Load it and save it to a new folder, or copy it keeping links "
            "(cp -a, shutil.copytree(..., symlinks=True))")
    had_save = os.path.lexists(root / CURRENT)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root, exclusive=True):
            _check_owned(root)  # another process may have written into it since the first check
            now = current_version(root)
            if if_current is not ANY_VERSION and now != if_current:
                raise ConcurrentUpdateError(
                    f"the index at {root} changed since it was loaded (another process saved {now or 'into it'}): "
                    "nothing was saved, so that change stands; load the index again and redo this one")
            # Without the marker the ownership check passed on names alone: every v-<hex> folder is ours.
            legacy = not (root / MARKER).is_file()
            if legacy:
                _write_marker(root / MARKER, {"kind": "normrank saved index",
                                              "note": "normrank writes and removes only its own entries here"})
            version = root / f"v-{uuid.uuid4().hex}"
            version.mkdir()
            link: Path | None = None
            try:
                _write_marker(version / VERSION_MARKER, {"kind": "normrank index version"})
                _write_marker(version / PENDING, {})
                write_files(version)
                _stage("files_written")
                files = sorted(p.name for p in version.iterdir()
                               if p.is_file() and p.name not in (VERSION_MARKER, PENDING))
                manifest = {**manifest_extra, **_checksums(version, files, [n for n in pieces if n in files])}
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
                if link is not None and os.path.lexists(link):  # not published: no link left behind
                    with contextlib.suppress(OSError):
                        os.unlink(link)
                remove_version(version)
                raise
            _fsync_dir(root)
            with contextlib.suppress(OSError):  # published: no longer a save in progress
                (version / PENDING).unlink()
                _fsync_dir(version)  # on disk too: a power loss must not bring the mark back into a live version
            _stage("published")
            _remove_stale(root, keep=version.name, every_version=legacy)
    except PersistenceError:
        raise
    except OSError as exc:
        if isinstance(exc, IndexFormatError):  # pragma: no cover - IndexFormatError is not an OSError
            raise
        raise PersistenceError(
            exc.errno, f"saving the index to {root} failed: {exc.strerror or exc}; "
            + ("the previous save is intact" if had_save else "nothing was saved")
        ) from exc
    return version


def _checksums(version: Path, files: list[str], pieces: list[str]) -> dict[str, Any]:
    """The manifest's ``files`` (whole-file SHA-256) and, for ``pieces``, its ``pieces`` tables: the
    piece tables in a second thread while this one takes the whole-file digests (hashlib lets go of
    the GIL), so a save hashing each big file twice takes about as long as hashing it once."""
    if not pieces:
        return {"files": {name: sha256_file(version / name) for name in files}}
    with ThreadPoolExecutor(1, "normrank-save-pieces") as pool:
        tables = pool.submit(lambda: {name: piece_table(version / name) for name in pieces})
        whole = {name: sha256_file(version / name) for name in files}
        return {"files": whole, "pieces": tables.result()}


def _index_holding(root: Path) -> Path | None:
    """The saved index one of whose version folders holds ``root`` (through ``current`` or not), if any.

    Why: ``save("idx/current/backup")`` wrote a second index inside ``idx``'s live version, and the next
    ``save("idx")`` swept that version with everything in it."""
    real = Path(os.path.realpath(root))
    for p in (real, *real.parents):
        if (_VERSION_NAME.fullmatch(p.name) and ((p.parent / MARKER).is_file() or (p.parent / CURRENT).is_symlink())
                and any((p / name).is_file() for name in (VERSION_MARKER, MANIFEST)) and _owned_version(p)):
            return p.parent
    return None


def _copied_without_links(root: Path) -> bool:
    """Whether ``root/current`` is a version folder itself, not the link to one: what ``cp -r`` and
    ``shutil.copytree`` (``symlinks=False``) make of a saved index. It loads as it is; a save into it is
    refused (a folder cannot be swapped for a link in one atomic step)."""
    current = root / CURRENT
    return not current.is_symlink() and current.is_dir() and (current / VERSION_MARKER).is_file()


def _holds_only_index_files(p: Path) -> bool:
    """A ``v-<hex>`` folder holding only files a save writes (see :data:`VERSION_FILE_NAMES`).

    Why: a folder whose only entry was a user's ``v-<32 hex>/`` folder (or an old index folder with one
    beside its versions) passed for an index saved before the marker existed, and a save into it
    deleted the user's folder and files."""
    if not _VERSION_NAME.fullmatch(p.name) or not p.is_dir() or p.is_symlink():
        return False
    try:
        return all(e.name in VERSION_FILE_NAMES and e.is_file() and not e.is_symlink() for e in p.iterdir())
    except OSError:
        return False


def _owned_version(p: Path) -> bool:
    """A version folder normrank wrote: its marker, a normrank manifest, or empty (killed right after mkdir)."""
    if not _VERSION_NAME.fullmatch(p.name) or not p.is_dir() or p.is_symlink():
        return False
    if (p / VERSION_MARKER).is_file() or not any(p.iterdir()):
        return True
    try:
        with open_nofollow(p / MANIFEST, "r") as fh:
            manifest = json.load(fh)
        return isinstance(manifest, dict) and str(manifest.get("kind", "")).startswith("normrank")
    except (OSError, ValueError, IndexFormatError):
        return False


def remove_version(version: Path) -> None:
    """Delete a version folder normrank wrote, its marker and manifest last.

    Why not ``rmtree``: it deletes in directory order, and a save killed (or interrupted) in the middle of
    sweeping an old version could take the marker and the manifest first. What was left was no longer
    recognisable as normrank's (:func:`_owned_version`), so no later save swept it: a half-deleted copy of
    an index sat in the folder for good. Now any interruption leaves the marker, or an empty folder.
    """
    last = (MANIFEST, VERSION_MARKER)
    try:
        for child in list(version.iterdir()):
            if child.name in last or child.name not in VERSION_FILE_NAMES:
                continue  # not a file a save writes: somebody put it there, and it is theirs
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    child.unlink()
        left = sorted(child.name for child in version.iterdir() if child.name not in last)
        if left:  # keep the marks, so a later save tries again
            foreign = [n for n in left if n not in VERSION_FILE_NAMES]
            if foreign:
                logger.warning("kept the old index version %s: it holds %s, which normrank did not write; "
                            "move them out and the next save removes it", version, ", ".join(foreign[:5]))
            return
    except OSError:
        return
    for name in last:
        with contextlib.suppress(OSError):
            (version / name).unlink()
    with contextlib.suppress(OSError):
        version.rmdir()


def _remove_stale(root: Path, keep: str, every_version: bool = False) -> None:
    """Remove superseded and half-written versions normrank wrote; safe because the caller holds the lock.

    ``every_version``: the folder had no marker and held only names normrank gives (an index saved
    before the marker), so each ``v-<32 hex>`` folder in it is normrank's, even a half-written one.
    """
    for p in root.iterdir():
        if p.name in (keep, CURRENT, LOCK, MARKER):
            continue
        if _owned_version(p) or (every_version and _VERSION_NAME.fullmatch(p.name) and _holds_only_index_files(p)):
            remove_version(p)
        elif _LINK_NAME.fullmatch(p.name) and p.is_symlink():
            p.unlink(missing_ok=True)


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _verify(root: Path, format_version: int, required: Iterable[str],
            deferred: Iterable[str] = ()) -> tuple[Path, dict[str, Any]]:
    current = root / CURRENT
    if _copied_without_links(root):
        folder = current  # a copy that turned the link into the version folder itself (cp -r, copytree)
    elif not os.path.lexists(current) and _nothing_saved_yet(root):
        # empty, or only what a save writes before it publishes (.lock, the marker, a version without its
        # manifest): nothing is saved yet, as when the folder does not exist; a first save may be running
        raise FileNotFoundError(f"no saved index at {root} yet: nothing has been published there "
                                "(a first save into it may still be running)")
    elif not current.is_symlink():
        raise IndexFormatError(f"{root} is not a saved normrank index (no '{CURRENT}' version link)")
    else:
        target = os.readlink(current)
        if not _plain_name(target) or not target.startswith("v-"):
            raise IndexFormatError(f"{current} points at {target!r}, outside the index folder; refusing to follow it")
        folder = root / target
        if folder.is_symlink():
            raise IndexFormatError(f"{folder} is a symbolic link; refusing to follow it out of the index folder")
        if not folder.is_dir():
            raise IndexFormatError(f"{current} points at {target}, which is missing: the index folder was altered")
    try:
        with open_nofollow(folder / MANIFEST, "r") as fh:
            manifest = json.loads(fh.read())
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
        if path.is_symlink():
            raise IndexFormatError(
                f"file {name} of the index at {root} is a symbolic link; refusing to follow it out of the index folder")
        if not path.is_file():
            raise IndexFormatError(f"file {name} of the index at {root} is missing")
        if name not in deferred and sha256_file(path) != digest:
            raise _mismatch(name, root)
    return folder, manifest


def _nothing_saved_yet(root: Path) -> bool:
    """Whether ``root`` holds only what a first save writes before it publishes: ``.lock``, the marker,
    ``.current-*`` links and version folders without a manifest or still marked pending (:data:`PENDING`). A complete version (a copy that lost its
    ``current`` link, ``rsync -r``) or anything else is not "nothing": that folder is named, not treated as
    missing, or load-or-create code would save over it."""
    for p in root.iterdir():
        kind = _entry_kind(p)
        if kind in ("file", "link") or (kind == "version" and (not os.path.lexists(p / MANIFEST)
                                                               or os.path.lexists(p / PENDING))):
            continue
        return False
    return True


def usable_pieces(manifest: dict[str, Any], name: str, path: Path) -> dict[str, Any] | None:
    """The manifest's piece table for ``name`` when it is well formed and covers the file as it is now
    (whole pieces of a page-aligned size, one digest string each, the file's size); else ``None``, and the
    whole-file digest alone decides. The pieces only speed the check up: ``files`` stays the authority,
    as it is for a normrank that predates pieces (a folder whose file and ``files`` entry were rewritten
    together, pieces left stale, loads as it does there)."""
    pieces = manifest.get("pieces")
    table = pieces.get(name) if isinstance(pieces, dict) else None
    if not isinstance(table, dict):
        return None
    size, piece, digests = table.get("size"), table.get("piece"), table.get("sha256")
    if not (type(size) is int and size >= 0 and type(piece) is int and 0 < piece <= _PIECE_MAX
            and piece % mmap.ALLOCATIONGRANULARITY == 0 and isinstance(digests, list)
            and len(digests) == -(-size // piece) and all(isinstance(d, str) for d in digests)):
        return None
    try:
        return table if path.stat().st_size == size else None
    except OSError:
        return None


def _mismatch(name: str, root: Path) -> IndexFormatError:
    return IndexFormatError(f"checksum mismatch for {name} in the index at {root}: the file was truncated or altered")


class DeferredDigests:
    """Checksums of a load's big files, computed while the files are parsed.

    Why: hashing ``index.faiss`` before reading it cost a hash pass plus a read. Each checksum is taken
    by whichever thread is free first: helper threads of its own where the machine has cores to spare,
    and any thread that calls :meth:`work` (a load's parsing threads, once their own file is done). A
    thread per file instead put four threads (two hashes, FAISS's read, the parse) on the benchmark
    machine's two cores, and the parse, the longest, shared its core with the others. A file saved with
    piece checksums (manifest ``pieces``) is one job per piece, so the threads share even one big file.

    ``files`` maps a name to ``(path, whole-file digest)`` or ``(path, whole-file digest, pieces)``
    with ``pieces`` the file's manifest table (:func:`piece_table`) or ``None``.
    """

    def __init__(self, files: dict[str, tuple[Any, ...]], helpers: int) -> None:
        # jobs in the caller's order (biggest file first): (name, path, offset, length); length None = whole file
        self._jobs: list[tuple[str, Path, int, int | None]] = []
        self._expected: dict[str, list[str]] = {}  # name -> the digest of each of its jobs, in order
        self._whole: dict[str, tuple[Path, str]] = {}  # pieced files: the whole-file digest, which decides
        for name, (path, digest, *rest) in files.items():
            table = rest[0] if rest else None
            if table is None:
                self._jobs.append((name, path, 0, None))
                self._expected[name] = [digest]
            else:
                self._whole[name] = (path, digest)
                piece = table["piece"]
                self._jobs += [(name, path, off, piece) for off in range(0, table["size"], piece)]
                self._expected[name] = list(table["sha256"])
        self._owner: list[int | None] = [None] * len(self._jobs)  # the thread that took each job
        self._next = 0  # jobs before this index are taken
        self._results: dict[int, str | BaseException] = {}  # job index -> digest or error
        self._changed = threading.Condition()
        for _ in range(min(helpers, len(self._jobs))):
            threading.Thread(target=self.work, name="normrank-checksum", daemon=True).start()

    def work(self) -> None:
        """Compute pending checksums in the calling thread until none is left to start."""
        me = threading.get_ident()
        while True:
            with self._changed:
                i = self._next
                if i == len(self._jobs):
                    return
                self._owner[i] = me  # before the job counts as taken: see first_bad
                self._next = i + 1
            self._compute(i)

    def _compute(self, i: int) -> None:
        _, path, offset, length = self._jobs[i]
        try:
            result: str | BaseException = sha256_file(path) if length is None else sha256_piece(path, offset, length)
        except BaseException as exc:  # noqa: BLE001  (re-raised by first_bad(), in the caller's thread)
            result = exc
        with self._changed:
            self._results[i] = result
            self._changed.notify_all()

    def first_bad(self) -> str | None:
        """The first file (in the caller's order) whose checksum does not match, once all are known."""
        self.work()
        me = threading.get_ident()
        with self._changed:  # a job this thread took but never finished (a Ctrl-C in between) is redone here,
            lost = [i for i, owner in enumerate(self._owner[: self._next])  # not waited for forever
                    if owner == me and i not in self._results]
        for i in lost:
            self._compute(i)
        with self._changed:
            self._changed.wait_for(lambda: len(self._results) == len(self._jobs))
        got: dict[str, list[str | BaseException]] = {name: [] for name in self._expected}
        for i, job in enumerate(self._jobs):
            got[job[0]].append(self._results[i])
        for name, expected in self._expected.items():
            for result in got[name]:
                if isinstance(result, BaseException):
                    raise result
            if got[name] != expected and (name not in self._whole  # stale pieces: the whole-file digest decides
                                          or sha256_file(self._whole[name][0]) != self._whole[name][1]):
                return name
        return None


def spare_cores(busy: int) -> int:
    """Cores this process may use beyond ``busy`` threads of its own (0 when there are none)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(0, cores - busy)


@contextmanager
def reading(
    root: str | os.PathLike[str], format_version: int, required: Iterable[str] = (), *,
    deferred: Iterable[str] = (),
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Yield the verified current version folder and its manifest, holding the shared lock.

    Read every file inside the ``with`` block: a concurrent save may remove this
    version as soon as the block ends. Files named in ``deferred`` (large ones) are
    checksummed in threads while the block reads them; a mismatch raises the same
    ``IndexFormatError`` when the block ends, in place of any error the block raised while
    parsing the altered file, so nothing read from it is ever returned.
    """
    with reading_deferred(root, format_version, required, deferred=deferred, busy_threads=1) as (folder, manifest, _):
        yield folder, manifest


@contextmanager
def reading_deferred(
    root: str | os.PathLike[str], format_version: int, required: Iterable[str] = (), *,
    deferred: Iterable[str] = (), busy_threads: int = 1,
) -> Iterator[tuple[Path, dict[str, Any], DeferredDigests]]:
    """:func:`reading`, also yielding the deferred checksums (:class:`DeferredDigests`) so that the
    caller's threads can take them: helper threads start only for the cores that ``busy_threads``
    threads of the caller leave free, and a caller thread that calls ``digests.work()`` when its own
    file is parsed takes the rest."""
    root = _saved_root(root)
    deferred = tuple(deferred)
    with _locked(root, exclusive=False):
        folder, manifest = _verify(root, format_version, required, deferred)
        files = {name: (folder / name, manifest["files"][name], usable_pieces(manifest, name, folder / name))
                 for name in deferred if name in manifest["files"]}
        digests = DeferredDigests(files, spare_cores(busy_threads))
        try:
            yield folder, manifest, digests
        except BaseException as exc:
            bad = digests.first_bad()
            if bad is not None:
                raise _mismatch(bad, root) from exc
            raise
        bad = digests.first_bad()
        if bad is not None:
            raise _mismatch(bad, root)


def _saved_root(root: str | os.PathLike[str]) -> Path:
    """``root`` as a path, if it can hold a saved index: else ``FileNotFoundError`` or :class:`IndexFormatError`."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no saved index at {root}")
    if not root.is_dir():
        raise IndexFormatError(f"{root} is not a folder, so it is not a saved normrank index")
    return root


class _AllBut:
    """Every name but one: :func:`_verify`'s ``deferred`` (not hashed) for a read of one file."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __contains__(self, other: object) -> bool:
        return other != self.name


def read_verified_file(root: str | os.PathLike[str], format_version: int, name: str) -> bytes:
    """One file of the current version, checksummed, without hashing the others: a look at a saved index's
    settings (``normrank index`` carries a fitted blend over) costs nothing like a load."""
    root = _saved_root(root)
    with _locked(root, exclusive=False):
        folder, _ = _verify(root, format_version, (name,), _AllBut(name))  # type: ignore[arg-type]
        with open_nofollow(folder / name, "rb") as fh:
            return fh.read()


def open_verified(
    root: str | os.PathLike[str], format_version: int, required: Iterable[str] = ()
) -> tuple[Path, dict[str, Any]]:
    """Check the current version and return it; prefer :func:`reading`, which keeps it locked."""
    with reading(root, format_version, required) as out:
        return out
