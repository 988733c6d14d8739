"""Reaching PostgreSQL for the pgvector backend: the connection string, its redaction, and the connection.

Everything here is about *getting* a usable connection: which DSN to use, how to name it in a
message without leaking its password (libpq's own error text can echo parts of a malformed
DSN), opening it with the ``vector`` extension enabled, and telling a dropped connection from
any other error so :class:`normrank.pgvector_store.PgVectorNormIndex` can reconnect once.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any
from urllib.parse import unquote

from normrank.errors import BackendError, ConfigError

#: Environment variable read when no connection string is given.
DSN_ENV = "NORMRANK_PG_DSN"
INSTALL_HINT = "pip install 'normrank[pgvector]'"
MASK = "***"

# ``scheme://user:PASSWORD@host``: everything between the user's ':' and the last '@' of the token.
# The password may hold quotes (libpq takes them as they are): masking runs to the token's last '@'.
_URI_SECRET = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@?#\s'\"]*:)(?P<secret>[^\s]*)@")
# ``password=VALUE`` or ``sslpassword=VALUE`` (keyword form, or a URI query parameter), quoted or not. Unquoted, the value
# runs to the next ``keyword=`` (or '&'): a password with a stray space (``password=my secret``) is
# malformed, and libpq quotes its second word back in the error.
_KEY_SECRET = re.compile(r"(?P<head>\b(?:\w*password|passwd|pass|pwd)\s*=\s*)"  # sslpassword too
                         r"(?P<secret>'(?:[^'\\]|\\.)*'|\"[^\"]*\"|(?:(?!\s+\w+\s*=)[^&\s]|\s(?!\s*\w+\s*=))+)",
                         re.IGNORECASE)
# A password is also masked piece by piece (libpq may echo only the part after a stray space or '@');
# pieces shorter than this are left alone, or every 'a' of a message would be masked for password 'a'.
_MIN_PIECE = 4


# ``scheme://user:PASSWORD/host...``: a URI whose '@' was typed as '/', which libpq then echoes whole. The part
# after the user's ':' is masked unless it is a port number (``host:5432/db``).
_URI_NO_AT = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@?#\s'\"]*:)(?P<secret>(?!\d+(?:/|$))[^/@\s'\"]+)"
                        r"(?=/)(?![^\s'\"]*@)")


def psycopg_module() -> Any:
    """``psycopg`` with ``pgvector.psycopg`` importable, or an ImportError saying what to install."""
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg
    except ImportError as exc:
        raise ImportError(f"the pgvector backend needs psycopg 3 and pgvector: {INSTALL_HINT}") from exc
    return psycopg


def resolve_dsn(dsn: str | None) -> str:
    """The connection string given, else ``$NORMRANK_PG_DSN``; a named error when neither is set."""
    if dsn is not None and not isinstance(dsn, str):
        raise ConfigError(f"the PostgreSQL connection string must be a str, got {type(dsn).__name__}")
    if dsn:
        return dsn
    env = os.environ.get(DSN_ENV)
    if env:
        return env
    raise ConfigError(
        f"no PostgreSQL connection string: pass dsn=..., set store.dsn in the YAML config, or set ${DSN_ENV} "
        "(e.g. postgresql://user@host/db or postgresql:///db?host=/run/postgresql)"
    )


def _secrets(dsn: str) -> list[str]:
    """The password-bearing parts of ``dsn`` (raw and percent-decoded) and their longer pieces."""
    found: list[str] = []
    for rx in (_URI_SECRET, _URI_NO_AT, _KEY_SECRET):
        for m in rx.finditer(dsn):
            s = m.group("secret").strip("'\"")
            found += [s, unquote(s)]
    pieces = [p for s in found for p in re.split(r"[\s'\"@&=]+", s)]
    out = {x for x in found + pieces if len(x) >= _MIN_PIECE}
    return sorted(out, key=len, reverse=True)  # longest first, so a piece never splits a longer match


def redact(text: str, dsn: str | None = None) -> str:
    """``text`` (a DSN, or a message that may quote one) with every password masked.

    Masks ``scheme://user:PASSWORD@`` and ``password=PASSWORD`` wherever they appear, and, when the
    ``dsn`` the message came from is given, every occurrence of that DSN's password or of a piece of
    it: libpq's parse errors quote fragments (``missing "=" after "pw" in connection info string``,
    ``invalid percent-encoded token: "p%zz"``, ``failed to resolve host 'rest-of-pw@host'``).
    """
    out = _URI_SECRET.sub(lambda m: m.group("head") + MASK + "@", str(text))
    out = _URI_NO_AT.sub(lambda m: m.group("head") + MASK, out)
    out = _KEY_SECRET.sub(lambda m: m.group("head") + MASK, out)
    for secret in _secrets(str(text) if dsn is None else dsn):
        out = out.replace(secret, MASK)
    return out


def error_text(exc: BaseException, dsn: str) -> str:
    """One line of an exception's text, safe to show: stripped, and with the DSN's password masked."""
    return redact(" ".join(str(exc).split()), dsn)


def connection_lost(exc: BaseException, conn: Any) -> bool:
    """Whether ``exc`` means the server connection is gone (terminated backend, restart, network)."""
    psycopg = psycopg_module()
    if not isinstance(exc, psycopg.OperationalError):
        return False
    return bool(conn is None or conn.closed or getattr(conn, "broken", False))


def let_go_in_child(conn: Any) -> None:
    """Drop, in a process forked from the one that opened it, a connection without touching its session.

    Why: a handle made before ``fork`` (a pre-fork server building its index in the parent) shared one
    connection between the workers: one got the other's rows as its results, others bare errors or a hang.
    Closing it here would send the server libpq's terminate message on the socket the parent still uses,
    so the child's copy of the socket is pointed at ``/dev/null`` first; the close then writes there.
    """
    with contextlib.suppress(Exception):
        fd = conn.fileno()
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(devnull, fd)  # the number stays taken, so nothing opened later is mistaken for it
        finally:
            os.close(devnull)
        conn.close()


def open_connection(dsn: str, timeout: int) -> tuple[Any, tuple[int, ...]]:
    """An autocommit connection with pgvector registered, and the extension's version.

    Enables the ``vector`` extension when it is installed but not yet created (a named error when
    the role may not). Every message names the server by its redacted DSN, and no libpq exception
    is chained: its text could hold the password.
    """
    psycopg = psycopg_module()
    from pgvector.psycopg import register_vector

    where = redact(dsn, dsn)
    failure = None
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=timeout)
    except psycopg.Error as exc:
        failure = f"cannot connect to PostgreSQL at {where}: {error_text(exc, dsn)}"
    if failure is not None:  # raised here, not in the except block: psycopg's error (which may quote the
        raise BackendError(failure)  # password) must not stay reachable as __context__
    try:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
            if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone() is None:
                raise BackendError(
                    f"the PostgreSQL server at {where} does not have the pgvector extension installed "
                    "('vector' is not in pg_available_extensions): install pgvector on the server "
                    "(e.g. the postgresql-NN-pgvector package or a pgvector image), then retry"
                )
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except psycopg.errors.InsufficientPrivilege as exc:
                raise BackendError(
                    f"the pgvector extension is installed on {where} but not enabled in this database, and "
                    f"this role may not enable it: ask an administrator to run CREATE EXTENSION vector "
                    f"({error_text(exc, dsn)})"
                ) from None
        register_vector(conn)
        ver = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
    except psycopg.Error as exc:
        conn.close()
        raise BackendError(f"PostgreSQL at {where} failed while setting up pgvector: {error_text(exc, dsn)}") \
            from None
    except BaseException:
        conn.close()
        raise
    return conn, tuple(int(x) for x in re.findall(r"\d+", ver)[:3])


__all__ = ["DSN_ENV", "connection_lost", "error_text", "open_connection", "psycopg_module", "redact",
           "resolve_dsn"]
