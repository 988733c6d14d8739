"""Metadata filters: what a dict filter means, checked at the door, the same on every backend.

A filter is a callable on the metadata dict, or a dict:

* ``{"key": value}`` matches documents whose ``metadata["key"]`` equals ``value`` (a missing key
  reads as ``None``); ``{"key": [v1, v2]}`` matches any of the listed values; several keys must
  all match.
* Operators, in the dialect LangChain users bring from Chroma and PGVector:
  ``{"key": {"$gt": 3}}`` with ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$in``,
  ``$nin`` and ``$exists``; and ``{"$and": [f, ...]}``, ``{"$or": [f, ...]}``, ``{"$not": f}``.

Why one module: the FAISS store matched in Python with ``==`` (so ``True`` matched ``1``) while
pgvector compared JSON (where it does not), an operator dict was compared as a value and matched
nothing in silence, and a NaN value matched nothing on FAISS but was refused on pgvector. Here a
filter is validated once, before any work, and means the same everywhere: equality is JSON's
(``true`` is not ``1``; ``1`` equals ``1.0``), order comparisons hold between two numbers or two
strings (by code point) and are false otherwise, and ``$ne`` / ``$nin`` match a missing key, as in
MongoDB. Plain dicts keep their fast path (pgvector runs them in SQL); operator filters become a
predicate (:func:`check_filter`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from normrank._validation import check_metadata
from normrank.errors import InvalidArgumentError, NormRankError

MetadataFilter = Mapping[str, Any] | Callable[[Mapping[str, Any]], bool]
Predicate = Callable[[Mapping[str, Any]], bool]

FIELD_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists")
LOGICAL_OPERATORS = ("$and", "$or", "$not")
_LISTS = (list, tuple, set, frozenset)


def check_filter(flt: Any, *, allow_nul: bool = True) -> MetadataFilter | None:
    """The filter to search with: ``None`` (no filter, also for ``{}``), the callable itself, the plain
    dict (key -> value or list of values), or a predicate compiled from an operator filter.

    Raises ``InvalidArgumentError`` (``InvalidMetadataError`` for NaN, infinity or NUL where the backend
    cannot hold it) naming what is wrong, before anything is searched.
    """
    if flt is None:
        return None
    if callable(flt):
        return _named_errors(flt)
    if not isinstance(flt, Mapping):
        raise InvalidArgumentError(f"filter must be a dict or a callable, got {type(flt).__name__}")
    if not flt:
        return None
    if not is_plain(flt):
        return _compile(flt, "filter", allow_nul)
    # the values as metadata is stored (through JSON: keys as strings, tuples as lists), so that a filter
    # matches what the same value gave when it was added, on every backend
    return {_key(key, "filter"): _plain_value(key, want, "filter", allow_nul) for key, want in flt.items()}


def _named_errors(fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """A caller's filter function whose failures are named: it is called with each document's metadata
    dict, and one written for LangChain's ``InMemoryVectorStore`` (which passes a ``Document``) failed
    with a bare ``AttributeError: 'dict' object has no attribute 'metadata'``. It gets a shallow copy of
    each dict, so it cannot add, remove or replace a stored document's keys (nested values are shared:
    a filter must not change them)."""
    if getattr(fn, "_normrank_guarded", False):
        return fn

    def guarded(metadata: dict[str, Any]) -> Any:
        try:
            # a shallow copy: with the store's own dict, a key the function set or popped was kept and saved.
            # Not a deep one: that made filter functions 13-15x slower over 100k documents with list values.
            return fn(dict(metadata))
        except NormRankError:
            raise
        except Exception as exc:
            raise InvalidArgumentError(
                f"the filter function raised {type(exc).__name__}: {exc}. normrank calls it with each "
                "document's metadata dict (LangChain's InMemoryVectorStore passes a Document: use "
                "lambda m: m['key'] == value, or a dict filter)") from exc

    guarded._normrank_guarded = True  # type: ignore[attr-defined]
    return guarded


def is_plain(flt: Mapping[str, Any]) -> bool:
    """A dict of key -> value (or list of values) with no operator anywhere: the form pgvector runs in SQL."""
    return not any(_is_operator_key(k) or _is_operator_dict(v) for k, v in flt.items())


def match(metadata: Mapping[str, Any], flt: MetadataFilter) -> bool:
    """Whether ``metadata`` passes ``flt`` (already checked by :func:`check_filter`)."""
    if callable(flt):
        return bool(flt(metadata))
    return all(_plain(metadata.get(key), want) for key, want in flt.items())


def _plain(have: Any, want: Any) -> bool:
    """A plain filter value: one value (JSON equality) or a list of accepted ones. The one reading of a
    plain dict, for :func:`match` and for the predicate an operator filter compiles to."""
    if isinstance(want, _LISTS):
        return any(same(have, w) for w in want)
    return same(have, want)


def same(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1`` (Python's ``==`` says it is), ``1`` is ``1.0``; lists and tuples
    compare alike, element by element, and so do dicts, key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, Mapping)) or isinstance(b, (list, tuple, Mapping)):
        return False
    return bool(a == b)


# ------------------------------------------------------------------ compiling
def _is_operator_key(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("$")


def _is_operator_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and any(_is_operator_key(k) for k in value)


def _key(key: Any, where: str) -> str:
    if not isinstance(key, str):
        raise InvalidArgumentError(f"{where} keys must be strings, got {key!r}")
    return key


def _plain_value(key: str, want: Any, where: str, allow_nul: bool) -> Any:
    """A plain filter value (one value, or a list of accepted ones) as stored metadata reads it."""
    return _values(key, list(want) if isinstance(want, _LISTS) else want, where, allow_nul)


def _values(name: str, value: Any, where: str, allow_nul: bool) -> Any:
    """``value`` checked as metadata is (finite numbers, JSON-able, no NUL where the backend has none);
    an error names it as ``where[name]``."""
    return check_metadata({name: value}, where, allow_nul=allow_nul)[name]


#: Deepest nesting of ``$and`` / ``$or`` / ``$not`` a filter may have (as nested metadata values): a
#: filter from a web request nested 200 deep raised a bare ``RecursionError``, which apps serve as a 500.
MAX_FILTER_DEPTH = 32


def _compile(flt: Mapping[str, Any], where: str, allow_nul: bool, depth: int = 0) -> Predicate:
    if depth > MAX_FILTER_DEPTH:
        raise InvalidArgumentError(f"filter: $and, $or and $not are nested more than {MAX_FILTER_DEPTH} deep")
    parts: list[Predicate] = []
    for key, want in flt.items():
        _key(key, where)
        if _is_operator_key(key):
            parts.append(_logical(key, want, where, allow_nul, depth))
        elif _is_operator_dict(want):
            parts.append(_field(key, want, f"{where}[{key!r}]", allow_nul))
        else:
            checked = _plain_value(key, want, where, allow_nul)
            parts.append(lambda m, key=key, want=checked: _plain(m.get(key), want))
    return lambda m: all(p(m) for p in parts)


def _logical(op: str, arg: Any, where: str, allow_nul: bool, depth: int) -> Predicate:
    if op == "$not":
        if not isinstance(arg, Mapping) or not arg:
            raise InvalidArgumentError(f"{where}: $not takes a non-empty filter dict, got {arg!r}")
        inner = _compile(arg, f"{where}.$not", allow_nul, depth + 1)
        return lambda m: not inner(m)
    if op in ("$and", "$or"):
        if not isinstance(arg, (list, tuple)) or not arg or not all(isinstance(f, Mapping) and f for f in arg):
            raise InvalidArgumentError(f"{where}: {op} takes a non-empty list of non-empty filter dicts, got {arg!r}")
        subs = [_compile(f, f"{where}.{op}[{i}]", allow_nul, depth + 1) for i, f in enumerate(arg)]
        if op == "$and":
            return lambda m: all(s(m) for s in subs)
        return lambda m: any(s(m) for s in subs)
    raise InvalidArgumentError(f"{where}: unknown operator {op!r} at the top level; use $and, $or or $not there, "
                               f"and {', '.join(FIELD_OPERATORS)} under a key")


def _field(key: str, ops: Mapping[str, Any], where: str, allow_nul: bool) -> Predicate:
    plain = [k for k in ops if not _is_operator_key(k)]
    if plain:
        raise InvalidArgumentError(f"{where} mixes operators with the plain key {plain[0]!r}; to match a nested "
                                   "dict that has keys starting with '$', use a callable filter")
    parts: list[Predicate] = []
    for op, arg in ops.items():
        if op not in FIELD_OPERATORS:
            raise InvalidArgumentError(f"{where}: unknown operator {op!r}; supported: {', '.join(FIELD_OPERATORS)} "
                                       f"(and {', '.join(LOGICAL_OPERATORS)} at the top level)")
        if op == "$exists":
            if not isinstance(arg, bool):
                raise InvalidArgumentError(f"{where}: $exists takes true or false, got {arg!r}")
            parts.append(lambda m, want=arg: (key in m) is want)
        elif op in ("$in", "$nin"):
            if not isinstance(arg, _LISTS):
                raise InvalidArgumentError(f"{where}: {op} takes a list of values, got {type(arg).__name__}")
            one_of = _one_of(key, _values(op, list(arg), where, allow_nul))
            parts.append(one_of if op == "$in" else (lambda m, f=one_of: not f(m)))
        elif op in ("$eq", "$ne"):
            equal = _equal(key, _values(op, arg, where, allow_nul))
            parts.append(equal if op == "$eq" else (lambda m, f=equal: not f(m)))
        else:
            parts.append(_order(key, op, _values(op, arg, where, allow_nul), where))
    return lambda m: all(p(m) for p in parts)


def _equal(key: str, want: Any) -> Predicate:
    return lambda m: same(m.get(key), want)


def _one_of(key: str, wants: list[Any]) -> Predicate:
    return lambda m: any(same(m.get(key), w) for w in wants)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _order(key: str, op: str, want: Any, where: str) -> Predicate:
    if not (_number(want) or isinstance(want, str)):
        raise InvalidArgumentError(f"{where}: {op} compares numbers or strings, got {want!r}")
    numeric = _number(want)

    def test(m: Mapping[str, Any]) -> bool:
        have = m.get(key)
        if not (_number(have) if numeric else isinstance(have, str)):
            return False  # another type (or missing): no order between them, so no match
        if op == "$gt":
            return have > want
        if op == "$gte":
            return have >= want
        if op == "$lt":
            return have < want
        return have <= want

    return test


__all__ = ["FIELD_OPERATORS", "LOGICAL_OPERATORS", "MetadataFilter", "Predicate", "check_filter", "is_plain",
           "match", "same"]
