"""The SQL of the pgvector backend: table names, DDL, the advisory lock key, metadata filters.

Every identifier is quoted through :mod:`psycopg.sql` and every value is bound, never pasted.
The layout (``table`` defaults to ``normrank_docs``)::

    {table}           seq (insertion order), id, emb vector(dim+1), norm, token_count, text, metadata jsonb
    {table}_normrank  key -> jsonb: the calibrations, weights, settings and a version counter
    {table}_emb_hnsw  the HNSW index on emb (index_type="hnsw" only)
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from normrank._validation import check_metadata
from normrank.errors import InvalidArgumentError

#: A plain identifier short enough that ``{table}_normrank`` and ``{table}_emb_hnsw`` fit in 63 bytes.
TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,53}$")
STATE_SUFFIX = "_normrank"
INDEX_SUFFIX = "_emb_hnsw"


def check_table_name(table: Any) -> str:
    if not isinstance(table, str) or not TABLE_RE.fullmatch(table):  # match() let "docs\n" through
        raise InvalidArgumentError(
            f"table name {str(table)[:80]!r} is not a plain identifier (letters, digits, _; at most 54 characters)"
        )
    return table


@dataclass(frozen=True)
class TableNames:
    """The three relation names one normrank table uses, and SQL with them filled in."""

    table: str

    @property
    def state(self) -> str:
        return self.table + STATE_SUFFIX

    @property
    def index(self) -> str:
        return self.table + INDEX_SUFFIX

    def sql(self, text: str) -> Any:
        """``text`` with ``{t}``, ``{s}`` and ``{ix}`` as quoted identifiers (literal braces doubled)."""
        from psycopg import sql

        return sql.SQL(text).format(t=sql.Identifier(self.table), s=sql.Identifier(self.state),
                                    ix=sql.Identifier(self.index))

    def regclass_args(self) -> tuple[str, str, str]:
        """The names as ``to_regclass`` arguments (quoted, so case and underscores are kept)."""
        return f'"{self.table}"', f'"{self.state}"', f'"{self.index}"'

    def lock_key(self) -> int:
        """The advisory lock every writer of this table takes (a stable 64-bit hash of the name)."""
        return int.from_bytes(hashlib.sha256(f"normrank:{self.table}".encode()).digest()[:8], "big", signed=True)


def create_tables_sql(names: TableNames, dim: int) -> list[Any]:
    return [
        names.sql("CREATE TABLE {t} (seq bigint GENERATED ALWAYS AS IDENTITY, id text PRIMARY KEY, "
                  f"emb vector({int(dim) + 1}) NOT NULL, norm double precision NOT NULL, "
                  "token_count integer NOT NULL, text text, metadata jsonb NOT NULL DEFAULT '{{}}')"),
        names.sql("CREATE TABLE {s} (key text PRIMARY KEY, value jsonb NOT NULL)"),
    ]


def hnsw_index_sql(names: TableNames, m: int, ef_construction: int) -> Any:
    return names.sql("CREATE INDEX IF NOT EXISTS {ix} ON {t} USING hnsw (emb vector_ip_ops) "
                     f"WITH (m = {int(m)}, ef_construction = {int(ef_construction)})")


def filter_sql(flt: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A dict filter as SQL: ``key -> value`` or ``key -> [values]``, like NormIndex's matcher.

    A missing key reads as JSON ``null`` (Python's ``metadata.get(key)`` is ``None``). Keys and
    values pass the metadata checks first (no NUL, which jsonb cannot hold; no NaN, which JSON
    has no spelling for; no lone surrogate), so a bad filter is an ``InvalidArgumentError``
    naming the key, not a raw database error. A float of magnitude 2**53 or more (every such float is
    a whole number) is sent as that whole number (:func:`_exact_numbers`).
    """
    from psycopg.types.json import Jsonb

    parts, params = [], {}
    for i, (key, want) in enumerate(flt.items()):
        if not isinstance(key, str):
            raise InvalidArgumentError(f"filter keys must be strings, got {key!r}")
        values = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
        values = check_metadata({key: values}, "filter", allow_nul=False)[key]
        parts.append(f"coalesce(metadata -> %(fk{i})s, 'null'::jsonb) = ANY(%(fv{i})s::jsonb[])")
        params[f"fk{i}"] = key
        params[f"fv{i}"] = [Jsonb(_exact_numbers(v)) for v in values]
    return " AND ".join(parts), params


_EXACT_FLOAT_FROM = 2.0**53


def _exact_numbers(value: Any) -> Any:
    """``value`` with every float of magnitude 2**53 or more as the whole number it is, recursively.

    Why: psycopg sends a float as its shortest repr, which jsonb reads as an exact decimal:
    ``1.152921504606847e+18`` became 1152921504606847000, not 2**60, so ``{"v": float(2**60)}`` matched
    nothing on pgvector while the FAISS store (Python's ``==``, exact between int and float) matched the
    document holding ``2**60``. Sent as an int, jsonb compares the exact value, as Python does. Such
    floats are never stored on pgvector (``check_metadata(jsonb=True)`` refuses them), so only ints match.
    """
    if isinstance(value, float) and math.isfinite(value) and abs(value) >= _EXACT_FLOAT_FROM:
        return int(value)
    if isinstance(value, list):
        return [_exact_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _exact_numbers(v) for k, v in value.items()}
    return value


__all__ = ["TABLE_RE", "TableNames", "check_table_name", "create_tables_sql", "filter_sql", "hnsw_index_sql"]
