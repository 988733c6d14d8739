"""Atomic, verified folders: how a saved index survives crashes and tampering.

A saved index is a folder holding ``current`` (a symlink) and one ``v-<uuid>``
folder per saved version. A save writes a complete new version folder with a
manifest of SHA-256 checksums, fsyncs it, then swaps ``current`` with one atomic
``os.replace``. A process killed at any moment leaves ``current`` pointing at a
complete version, old or new. Loading checks every checksum, so a truncated or
edited file is named instead of half-loaded. Nothing here unpickles anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normrank.errors import IndexFormatError

MANIFEST = "manifest.json"
CURRENT = "current"


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


def write_versioned(
    root: str | os.PathLike[str],
    write_files: Callable[[Path], None],
    manifest_extra: dict[str, Any],
) -> Path:
    """Write a new version under ``root`` with ``write_files(folder)`` and publish it atomically."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise IndexFormatError(f"{root} exists and is not a folder")
    if root.is_dir() and any(root.iterdir()) and not (root / CURRENT).is_symlink():
        raise IndexFormatError(
            f"{root} is a non-empty folder that is not a normrank index; refusing to write into it"
        )
    root.mkdir(parents=True, exist_ok=True)
    version = root / f"v-{uuid.uuid4().hex}"
    version.mkdir()
    write_files(version)
    files = sorted(p.name for p in version.iterdir() if p.is_file())
    manifest = {**manifest_extra, "files": {name: sha256_file(version / name) for name in files}}
    (version / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    for name in [*files, MANIFEST]:
        with open(version / name, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(version)
    link = root / f".current-{uuid.uuid4().hex}"
    os.symlink(version.name, link)
    os.replace(link, root / CURRENT)
    _fsync_dir(root)
    _remove_stale(root, keep=version.name)
    return version


def _remove_stale(root: Path, keep: str) -> None:
    for p in root.iterdir():
        if p.name in (keep, CURRENT):
            continue
        if p.name.startswith("v-") and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(".current-") and p.is_symlink():
            p.unlink(missing_ok=True)


def open_verified(root: str | os.PathLike[str], format_version: int) -> tuple[Path, dict[str, Any]]:
    """Return the current version folder and its manifest, after checking every file."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no saved index at {root}")
    current = root / CURRENT
    if not current.is_symlink() or not current.resolve().is_dir():
        raise IndexFormatError(f"{root} is not a saved normrank index (no '{CURRENT}' version link)")
    folder = current.resolve()
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{folder} has no {MANIFEST}: the save is incomplete") from exc
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{folder / MANIFEST} is not valid JSON: the file was altered") from exc
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise IndexFormatError(f"{folder / MANIFEST} has no format_version")
    if version > format_version:
        raise IndexFormatError(
            f"the index at {root} has format version {version}, newer than this normrank reads "
            f"({format_version}); upgrade normrank to load it"
        )
    for name, digest in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            raise IndexFormatError(f"file {name} of the index at {root} is missing")
        if sha256_file(path) != digest:
            raise IndexFormatError(
                f"checksum mismatch for {name} in the index at {root}: the file was truncated or altered"
            )
    return folder, manifest
