"""Checks at the door: vector batches, texts, metadata and every numeric option's range."""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from normrank.errors import (
    DimensionMismatchError,
    EmptyCorpusError,
    InvalidArgumentError,
    InvalidMetadataError,
    InvalidTextError,
    InvalidVectorError,
    UnitNormError,
)

#: Norms closer to 1 than this (all of them) mean the vectors were normalised.
UNIT_NORM_TOLERANCE = 1e-3
#: A relative spread of norms below this means the norm cannot rank anything.
MIN_RELATIVE_SPREAD = 1e-4

RAW_VECTORS_HINT = (
    "normrank needs raw, pre-normalisation embeddings: encode with normrank.RawEncoder, "
    "or build the sentence-transformers model without its Normalize module "
    "(SentenceTransformer(modules=[m for m in model if type(m).__name__ != 'Normalize'])). "
    "Hosted embedding APIs (OpenAI, TEI, ...) return unit vectors and carry no norm signal."
)


def real_numbers(given: np.ndarray) -> np.ndarray:
    """``given`` if it holds real numbers: float or int arrays, or object arrays (pandas ``.values`` of mixed
    columns) whose every element is an int or a float. Complex numbers, booleans, strings and other objects
    are an :class:`InvalidVectorError`: they were converted in silence (a complex vector lost its
    imaginary part)."""
    if given.dtype.kind == "O" and all(isinstance(x, (int, float, np.integer, np.floating))
                                       and not isinstance(x, (bool, np.bool_)) for x in given.flat):
        return given.astype(np.float64)
    if given.dtype.kind not in "fiu":
        raise InvalidVectorError(f"vectors must hold real numbers (float or int), got {given.dtype} values")
    return given


def as_matrix(vectors: np.ndarray | Sequence[Sequence[float]], dim: int | None = None) -> np.ndarray:
    """Return a C-contiguous float32 (n, dim) copy, refusing anything that would corrupt an index.

    Numbers only (float or int arrays or lists): complex vectors lost their imaginary part, and vectors of
    strings or booleans were converted, in silence."""
    given = real_numbers(vectors if isinstance(vectors, np.ndarray) else np.asarray(vectors))
    with np.errstate(over="ignore", under="ignore"):  # named below, by row (numpy's RuntimeWarning said nothing)
        arr = np.array(given, dtype=np.float32, copy=True)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise DimensionMismatchError(f"expected a 2-D array of vectors, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise EmptyCorpusError("no vectors given: the batch is empty")
    if dim is not None and arr.shape[1] != dim:
        raise DimensionMismatchError(
            f"dimension mismatch: got vectors of dimension {arr.shape[1]}, expected {dim}"
        )
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        if given.dtype.kind == "f" and np.isfinite(np.asarray(given, dtype=np.float64).reshape(arr.shape)[rows]).all():
            raise InvalidVectorError(f"vectors hold values beyond float32's range, {FLOAT32_MAX:.3g}, which the "
                                     f"index stores (rows {rows})")
        raise InvalidVectorError(f"vectors contain NaN or infinity (rows {rows})")
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(arr, axis=1)
    zero = norms <= 1e-12
    if zero.any():
        rows = np.flatnonzero(zero)[:5].tolist()
        if not np.asarray(given, dtype=np.float64).reshape(arr.shape)[rows].any():
            raise InvalidVectorError(f"all-zero vectors have no direction and no norm (rows {rows})")
        raise InvalidVectorError(f"vectors with a norm of at most 1e-12 are too small to have a direction "
                                 f"that survives float32 (rows {rows}); encoders give norms near 1-10")
    if arr.size and max(float(arr.max()), -float(arr.min())) > FLOAT32_MAX / np.sqrt(arr.shape[1]):
        # only then can a norm pass float32's range: the unit vector became all zeros (a query ranked by
        # g(d) alone, in silence), so such rows are named (the float64 norms only for this rare case)
        over = np.linalg.norm(arr.astype(np.float64), axis=1) > FLOAT32_MAX
        if over.any():
            rows = np.flatnonzero(over)[:5].tolist()
            raise InvalidVectorError(f"vectors whose norm is beyond float32's range, {FLOAT32_MAX:.3g} (rows {rows})")
    return np.ascontiguousarray(arr)


#: Floats of this magnitude or more are whole numbers, which jsonb prints (and Python reads back) as ints.
JSONB_FLOAT_LIMIT = float(2**53)

#: The largest float32: a vector norm above it cannot be stored or divided by.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_not_unit_length(norms: np.ndarray) -> None:
    """Refuse only unit-length vectors, not equal norms: against a corpus calibration a text added twice
    (or candidates that are duplicates) is fine, while unit vectors carry no norm at all."""
    if np.all(np.abs(np.asarray(norms, dtype=np.float64) - 1.0) < UNIT_NORM_TOLERANCE):
        check_norm_signal(norms)


def check_norm_signal(norms: np.ndarray) -> None:
    """Refuse unit-length or constant-norm vectors, which make every norm feature zero."""
    norms = np.asarray(norms, dtype=np.float64)
    if norms.size == 0:
        raise EmptyCorpusError("no vectors given: the batch is empty")
    if np.all(np.abs(norms - 1.0) < UNIT_NORM_TOLERANCE):
        raise UnitNormError(
            f"the embeddings are already unit length (norms {norms.min():.6f}..{norms.max():.6f}), "
            f"so their norm carries no signal. {RAW_VECTORS_HINT}"
        )
    if norms.size >= 2:
        spread = (norms.max() - norms.min()) / max(float(np.mean(norms)), 1e-12)
        if spread < MIN_RELATIVE_SPREAD:
            raise UnitNormError(
                f"the embeddings all have the same norm ({np.mean(norms):.6f}, relative spread "
                f"{spread:.2e}), so their norm carries no signal. {RAW_VECTORS_HINT}"
            )


# ---------------------------------------------------------------------------------------------
# Text and metadata checks at the door. Both backends (FAISS here, pgvector) call these before
# anything is stored, so a value that is accepted also saves, reloads and searches: a lone
# surrogate cannot be written as UTF-8 (every later save failed), PostgreSQL text and jsonb
# cannot hold NUL, and metadata nested hundreds deep broke every search returning it.

#: Deepest metadata nesting accepted (the metadata dict itself is level 1).
MAX_METADATA_DEPTH = 32
#: Largest metadata accepted, as UTF-8 JSON bytes.
MAX_METADATA_BYTES = 1_000_000


#: Unicode categories of characters with no content on their own: control and format characters (a
#: zero-width space, a byte-order mark, a soft hyphen), combining marks with nothing to combine with
#: (accents, variation selectors, the combining grapheme joiner) and private-use code points. MiniLM's
#: tokenizer turns a text of any of them, or of U+FFFD, into nothing but ``[CLS] [SEP]``.
_NOTHING_TO_READ = frozenset({"Cc", "Cf", "Mn", "Me", "Co"})


def is_blank_text(text: str) -> bool:
    """True when ``text`` has nothing a model reads: only whitespace, control and format characters,
    combining marks, private-use characters and U+FFFD (see :data:`_NOTHING_TO_READ`).

    Why not ``str.strip``: a zero-width space (U+200B), byte-order mark (U+FEFF), soft hyphen or a lone
    control character survives ``strip()``, and the tokenizer drops it, so such a text was embedded as the
    bare ``[CLS] [SEP]`` vector and stored as a document with no content.
    """
    if not text.isascii():
        return all(ch.isspace() or ch == "\ufffd" or unicodedata.category(ch) in _NOTHING_TO_READ for ch in text)
    return not text.strip() or all(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in text)


def check_adapter_state(value: Any) -> dict[str, Any]:
    """An adapter state (``NormIndex.adapter_state``) as saved: a dict of JSON values, deep-copied through JSON;
    anything else is an :class:`InvalidArgumentError`, named before anything is written."""
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"adapter_state must be a dict, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"adapter_state must hold JSON values only: {exc}") from None


def check_adapter_entry(key: Any, value: Any) -> Any:
    """One ``adapter_state`` entry: a non-empty string key and a JSON value (returned as JSON gives it back)."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"an adapter_state key must be a non-empty string, got {key!r}")
    return check_adapter_state({key: value})[key]


def check_text(value: str, what: str, *, allow_nul: bool = True) -> str:
    """Refuse a string that cannot be stored as UTF-8 (a lone surrogate such as ``"\\udcff"``).

    ``allow_nul=False`` also refuses NUL characters, which PostgreSQL text and jsonb cannot hold.
    ``what`` names the value in the message (``"id 3"``, ``"text 0"``, ``"metadata 2 key 'a'"``).
    Returns it as a plain ``str`` (an ``np.str_`` or other subclass was stored as itself until a save and
    load turned it into ``str``). Raises :class:`~normrank.errors.InvalidTextError`.
    """
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidTextError(
                f"{what} is not valid Unicode text: it holds the lone surrogate {value[exc.start]!r} at "
                f"position {exc.start}, which cannot be written as UTF-8 (decode bytes with errors='replace')"
            ) from None
    if not allow_nul and "\x00" in value:
        raise InvalidTextError(f"{what} holds a NUL character (\\x00) at position {value.index(chr(0))}, "
                               "which this backend cannot store")
    return value if type(value) is str else str.__str__(value)


def _numpy_scalar(value: Any) -> Any:
    """NumPy's bool, integer and float scalars (what pandas rows and array elements are) as the Python
    values they hold; they were refused ("metadata 0['v'] is a bool" for ``np.True_``)."""
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        held = value.item()
        # np.longdouble's item() is itself: handed back to json it recursed without end (RecursionError)
        return float(held) if isinstance(held, np.floating) else held
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def check_metadata(metadata: Any, what: str = "metadata", *, allow_nul: bool = True,
                   max_depth: int = MAX_METADATA_DEPTH, max_bytes: int = MAX_METADATA_BYTES,
                   jsonb: bool = False) -> dict[str, Any]:
    """Validate one metadata dict and return a deep copy of it through JSON.

    Accepted: dicts with string keys (int, float, bool and None keys become strings, as JSON
    does) and values that are str, int, finite float, bool, None, list, tuple or dict (NumPy's bool,
    integer and float scalars become the Python values they hold), nested at
    most ``max_depth`` deep and at most ``max_bytes`` as UTF-8 JSON. Strings (keys and values)
    pass :func:`check_text`. The walk is iterative, so hostile nesting cannot overflow the stack.

    ``jsonb`` (pgvector): also refuse the floats PostgreSQL's jsonb gives back as something else. It keeps
    numbers as decimals, so a float of magnitude 2**53 or more came back as an int (1e16 as
    10000000000000000) and -0.0 as 0.0, where the FAISS store gives back the float that was stored.

    Raises :class:`~normrank.errors.InvalidMetadataError` (an ``InvalidArgumentError``) naming the path.
    """
    if not isinstance(metadata, Mapping):
        raise InvalidMetadataError(f"{what} is a {type(metadata).__name__}, expected a dict")
    budget = max_bytes
    stack: list[tuple[Any, str, int]] = [(metadata, what, 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            check_text(value, path, allow_nul=allow_nul)
            budget -= len(value)
        elif isinstance(value, (bool, int, np.bool_, np.integer)) or value is None:
            budget -= 8
        elif isinstance(value, (float, np.floating)):
            value = float(value)  # NumPy's float32 (not a float subclass) as the number it holds
            if not math.isfinite(value):
                raise InvalidMetadataError(f"{path} is {value}; metadata numbers must be finite (JSON has no NaN "
                                           "or infinity)")
            if jsonb and (abs(value) >= JSONB_FLOAT_LIMIT or (value == 0.0 and math.copysign(1.0, value) < 0)):
                raise InvalidMetadataError(
                    f"{path} is {value!r}, which PostgreSQL's jsonb would give back as "
                    f"{int(value) if value else 0.0!r} (it keeps numbers as decimals): store it as an int or a "
                    "string, or as a float below 2**53 in magnitude")
            budget -= 8
        elif isinstance(value, (Mapping, list, tuple)):
            if depth > max_depth:
                raise InvalidMetadataError(f"{what} is nested more than {max_depth} levels deep; flatten it")
            if isinstance(value, Mapping):
                _check_keys_distinct_as_json(value, path)
                for key, item in value.items():
                    if isinstance(key, str):
                        check_text(key, f"{path} key {key[:40]!r}", allow_nul=allow_nul)
                        budget -= len(key)
                    elif not (key is None or isinstance(key, (bool, int, float))) or (
                            isinstance(key, float) and not math.isfinite(key)):
                        raise InvalidMetadataError(f"{path} has the key {key!r} ({type(key).__name__}); metadata "
                                                   "keys must be strings")
                    stack.append((item, f"{path}[{str(key)[:40]!r}]", depth + 1))
            else:
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        else:
            raise InvalidMetadataError(f"{what} is not JSON-serialisable: {path} is a {type(value).__name__}")
        if budget < 0:
            break
    try:
        text = json.dumps(dict(metadata), ensure_ascii=False, allow_nan=False, default=_numpy_scalar)
    except (TypeError, ValueError) as exc:  # pragma: no cover - the walk above refuses these first
        raise InvalidMetadataError(f"{what} is not JSON-serialisable: {exc}") from exc
    size = len(text.encode("utf-8")) if budget >= 0 else -1
    if budget < 0 or size > max_bytes:
        raise InvalidMetadataError(f"{what} is larger than {max_bytes:,} bytes as JSON; store big payloads "
                                   "elsewhere and keep a reference in the metadata")
    return json.loads(text)


def _check_keys_distinct_as_json(mapping: Mapping[Any, Any], path: str) -> None:
    """JSON keys are strings, so ``{1: "a", "1": "b"}`` would keep one value and drop the other in silence."""
    if all(isinstance(k, str) for k in mapping):
        return
    seen: dict[str, Any] = {}
    for key in mapping:
        if isinstance(key, str):
            as_json = key
        elif key is None or isinstance(key, (bool, int, float)):
            as_json = json.dumps(key)  # what json.dumps makes of it as a key: None -> "null", True -> "true"
        else:
            continue  # not a key JSON can hold: the walk names it
        if as_json in seen:
            raise InvalidMetadataError(f"{path} has the keys {seen[as_json]!r} and {key!r}, which are the same key "
                                       f"{as_json!r} in JSON: one value would be lost")
        seen[as_json] = key


# ---------------------------------------------------------------------------------------------
# Every numeric option's allowed range, in one place. Constructors, setters, fit options, the
# YAML configuration and a loaded state.json all call check_option, so a value that is out of
# range (ef_search=2e9 took 74 s and 15 GiB on 60 documents) is named before it is used.


@dataclass(frozen=True)
class OptionRange:
    """Closed range ``[low, high]`` of one option; ``integer`` options refuse floats."""

    low: float
    high: float
    integer: bool = True
    why: str = ""

    def describe(self) -> str:
        return f"[{self.low:g}, {self.high:g}]" if not self.integer else f"[{int(self.low)}, {int(self.high)}]"


#: Option name -> allowed range. The same names as the keyword arguments and YAML keys.
OPTION_RANGES: dict[str, OptionRange] = {
    # searching
    "k": OptionRange(1, 10_000_000, why="results per query"),
    "top_k": OptionRange(1, 10_000_000, why="results per query"),
    "top_n": OptionRange(1, 10_000_000, why="results per query"),
    "similarity_top_k": OptionRange(1, 10_000_000, why="results per query"),
    "fetch_k": OptionRange(1, 10_000_000, why="candidates per query"),
    # index structure (FAISS and pgvector)
    "pad_to": OptionRange(1, 1024, why="augmented width multiple"),
    "hnsw_m": OptionRange(2, 256, why="HNSW links per node"),
    "ef_construction": OptionRange(4, 65_536, why="HNSW build beam"),
    "ef_search": OptionRange(1, 65_536, why="HNSW search beam"),
    "nlist": OptionRange(1, 1 << 20, why="IVF lists"),
    "nprobe": OptionRange(1, 1 << 20, why="IVF lists searched"),
    "dim": OptionRange(1, 65_536, why="vector dimension"),
    "connect_timeout": OptionRange(1, 3600, why="seconds to wait for a database server"),
    # encoding and batching
    "batch_size": OptionRange(1, 65_536, why="texts per encoder batch"),
    "max_seq_length": OptionRange(1, 8192, why="tokens kept per text"),
    "cache_size": OptionRange(0, 100_000_000, why="cached vectors"),
    # calibration
    "max_bins": OptionRange(1, 1000, why="length bins"),
    "min_per_bin": OptionRange(1, 100_000_000, why="documents per length bin"),
    # fitting
    "folds": OptionRange(2, 1000, why="cross-validation folds"),
    "depth": OptionRange(1, 100_000, why="cosine candidates per training query"),
    "seed": OptionRange(0, 2**32 - 1, why="random seed"),
    "alpha": OptionRange(0.0, 1.0, integer=False, why="significance level"),
    "min_gain": OptionRange(0.0, 1.0, integer=False, why="nDCG gain required"),
}


def check_option(name: str, value: Any, *, low: float | None = None, high: float | None = None) -> Any:
    """Check ``value`` against :data:`OPTION_RANGES` [``name``] and return it as a Python int or float.

    NumPy integers count as integers (``k=np.int64(3)`` works); bool, str and, for integer options,
    float are refused. ``low``/``high`` narrow the range where one backend allows less (pgvector's
    ``hnsw.ef_search`` stops at 1000). Raises :class:`~normrank.errors.InvalidArgumentError` naming
    the option, the value and the range.
    """
    spec = OPTION_RANGES[name]
    lo = spec.low if low is None else max(spec.low, low)
    hi = spec.high if high is None else min(spec.high, high)
    rng = OptionRange(lo, hi, spec.integer).describe()
    shown = repr(value) if not isinstance(value, str) else repr(value[:40])
    if isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be {'an integer' if spec.integer else 'a number'} in {rng}, "
                                   f"got the bool {shown}")
    if spec.integer:
        if not isinstance(value, (int, np.integer)):
            raise InvalidArgumentError(f"{name} must be an integer in {rng}, got {shown} ({type(value).__name__})")
        out: Any = int(value)
    else:
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidArgumentError(f"{name} must be a number in {rng}, got {shown} ({type(value).__name__})")
        out = float(value)
        if not math.isfinite(out):
            raise InvalidArgumentError(f"{name} must be a finite number in {rng}, got {shown}")
    if not lo <= out <= hi:
        raise InvalidArgumentError(f"{name} must be in {rng}, got {shown}")
    return out


#: Token counts are stored as 32-bit integers, so a count above this could not be saved and reloaded.
MAX_TOKEN_COUNT = 2**31 - 1


def query_token_count(count: Any) -> int:
    """A query's token count as given, -1 where it is unknown; anything but a positive whole number is
    named (``int()`` turned "5" and 7.9 into counts, and 0 read as "no count given"). One check for the
    stores' searches and ``scoring.rescore`` (the re-rankers), which took "12" to a bare TypeError and
    7.5 or True as counts."""
    if count is None:
        return -1
    if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)) or count < 1:
        raise InvalidArgumentError(f"a query token count must be a positive integer (or None), got {count!r}")
    if count > MAX_TOKEN_COUNT:
        raise InvalidArgumentError(f"a query token count of {count} is above {MAX_TOKEN_COUNT}")
    return int(count)


def as_token_counts(token_counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Whole numbers >= 1, one per vector: ints, or floats that are whole. Booleans, strings and nested
    lists are refused, not converted (``True`` became 1, ``"5"`` 5 and ``[[5]]`` 5 in silence, where a
    query's ``query_token_count="5"`` was refused)."""
    if isinstance(token_counts, (str, bytes)):
        raise InvalidArgumentError(f"token counts must be whole numbers >= 1, got a {type(token_counts).__name__}")
    try:
        given = np.asarray(token_counts)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"token counts must be whole numbers >= 1: {exc}") from exc
    if given.dtype.kind == "b" or (not isinstance(token_counts, np.ndarray) and given.ndim == 1
                                   and any(isinstance(c, (bool, np.bool_)) for c in token_counts)):
        raise InvalidArgumentError("token counts must be whole numbers >= 1, not True/False")
    if given.ndim > 1 or given.dtype.kind not in "iuf":
        raise InvalidArgumentError(f"token counts must be whole numbers >= 1 in a flat list, got {given.dtype} "
                                   f"values of shape {given.shape}")
    raw = given.astype(np.float64).ravel()
    if not np.all(np.isfinite(raw)) or np.any(raw != np.round(raw)) or np.any(raw < 1):
        raise InvalidArgumentError("token counts must be whole numbers >= 1")
    if np.any(raw > MAX_TOKEN_COUNT):  # both backends store 32-bit counts (FAISS sidecar, pgvector integer)
        raise InvalidArgumentError(f"token counts must be whole numbers >= 1 and <= {MAX_TOKEN_COUNT}")
    return raw.astype(np.int64)
