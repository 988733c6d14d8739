"""The per-call work of a search around the FAISS scan: the query's unit vector and the ``Hit`` objects.

Why a module: this work runs right after a scan has emptied the caches, where each NumPy call and each
Python-level field store costs several times its warm price; at 10k documents it was ~10% of a single
query (benchmarks/results/speed.md). ``normrank._fastpath`` (C, built by ``pip install`` where a compiler
is present) does it with the same arithmetic; without it, the Python code here gives the same values.
``NORMRANK_PURE_PYTHON=1`` in the environment, read at import, uses the Python code even where the C
module was built (to compare the two, or to rule the accelerator out when looking for a bug).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np

from normrank._validation import FLOAT32_MAX
from normrank.doc_columns import copy_metadata
from normrank.scoring import HIT_FIELDS, Hit

#: The C module's API_VERSION this file calls (normrank/_fastpath.c)
API_VERSION = 3

_c: Any
try:
    if os.environ.get("NORMRANK_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("NORMRANK_PURE_PYTHON is set")
    from normrank import _fastpath as _c

    if getattr(_c, "API_VERSION", None) != API_VERSION:  # built from older sources: an editable install
        warnings.warn("normrank._fastpath was built from other sources than this normrank; using the Python "
                      "path (same results, slower per call). Rebuild it: pip install -e .", stacklevel=1)
        raise ImportError("normrank._fastpath is out of date")
    try:
        _c.register_hit(Hit, copy_metadata)
    except (TypeError, AttributeError) as exc:  # Hit's fields are not the slots the C code fills
        warnings.warn(f"normrank._fastpath cannot build Hit objects here ({exc}); using the Python path",
                      stacklevel=1)
        raise ImportError(str(exc)) from exc
except ImportError:  # not built here (no C compiler at install), or turned off
    _c = None

# setting a slot through its member descriptor: what a frozen dataclass's __init__ does through
# object.__setattr__, without the attribute lookup per field
_SETTERS = tuple(getattr(Hit, f).__set__ for f in HIT_FIELDS)
_new = object.__new__


def accelerated() -> bool:
    """Whether the C module does this work in this process."""
    return _c is not None


def _unit_into(vector: np.ndarray, out: np.ndarray) -> float | None:
    """Write ``vector / norm`` (float32) into ``out`` and return the float64 norm; ``None`` when the norm
    is not finite, not above 1e-12 or beyond float32 (the caller's general path then names the
    problem). ``vector`` is 1-D and as long as ``out``.

    Same values as the batch path's ``np.linalg.norm(mat.astype(np.float64), axis=1)`` and
    ``mat / norms.astype(np.float32)``: NumPy's pairwise sum of the float32 squares in float64. The C
    version also answers ``None`` for a vector that is not C-contiguous native float32 or float64."""
    v = np.asarray(vector, dtype=np.float32)  # no copy: v is only read
    # np.linalg.norm's arithmetic (the same products, the same pairwise sum) in two NumPy calls, not four
    norm = math.sqrt(np.add.reduce(np.multiply(v, v, dtype=np.float64)))
    if not (math.isfinite(norm) and 1e-12 < norm <= FLOAT32_MAX):  # NaN or inf anywhere makes the norm so
        return None
    np.divide(v, np.float32(norm), out=out)
    return norm


#: :func:`_unit_into`, in C where it was built (no Python frame per call)
unit_into: Any = _c.unit_into if _c is not None else _unit_into


def _units_into(matrix: np.ndarray, out: np.ndarray, norms: np.ndarray, min_norm: float) -> bool:
    """:func:`_unit_into` for each row of a 2-D float matrix: the unit rows into the first columns of
    ``out`` (float32, ``(n, width >= dim)``, zeros after them), the float64 norms into ``norms``; False
    when a norm is not finite, at most ``min_norm`` or beyond float32."""
    mat = np.ascontiguousarray(matrix, dtype=np.float32)  # only read: no copy of a float32 matrix
    np.sqrt(np.add.reduce(np.multiply(mat, mat, dtype=np.float64), axis=1), out=norms)
    # the sum of the norms is finite only if every one is (NaN and infinity spread), and a float32 row
    # cannot overflow it
    if not (math.isfinite(np.add.reduce(norms)) and norms.min() > min_norm and norms.max() <= FLOAT32_MAX):
        return False
    dim = mat.shape[1]
    out[:, dim:] = 0.0
    np.divide(mat, norms[:, None].astype(np.float32), out=out[:, :dim])
    return True


def units_into(matrix: np.ndarray, out: np.ndarray, norms: np.ndarray, min_norm: float) -> bool:
    """:func:`_units_into`, in C where it was built (one pass instead of seven NumPy calls, ~0.3 ms of a
    64-query batch over 10k documents on caches a scan had emptied); the C code answers False also for
    a layout it does not read, which NumPy then reads."""
    if _c is not None and _c.units_into(matrix, out, norms, min_norm):
        return True
    return _units_into(matrix, out, norms, min_norm)


def _hit_rows(rows: Any, scores: Any, k: int, w: float | np.ndarray, labels: Any, columns: tuple[Any, ...],
              untied: int) -> list[list[Hit]] | None:
    """``Hit`` objects of an additive blend, one list per result row.

    ``rows`` and ``scores`` are FAISS's result buffers (C-contiguous, ``(n, width >= k)`` or one row of
    ``width``): positions, mapped to internal ids through ``labels`` unless it is ``None``, and float32
    scores. The first ``k`` of each row are read; -1 (no hit) is skipped. ``w`` is the weight, one
    float or float64 per row; a hit's cosine is ``score - w * g(d)`` in float64. ``columns`` is
    :meth:`DocColumns.hit_columns`. ``untied`` 1: ``None`` when a row has equal scores among its hits or
    a missing hit; 2: also when its ``k``-th and next scores are equal (rows wider than ``k``); the
    caller then orders the rows. 0: no check."""
    doc_ids, texts, metas, norms, counts, g = columns
    pos, sc = _first_k(rows, scores, k)
    if untied and _needs_ordering(pos, sc, k, untied, rows, scores):
        return None
    weights = [float(w)] * pos.shape[0] if np.ndim(w) == 0 else np.asarray(w, dtype=np.float64).tolist()
    out = []
    for prow, srow, wr in zip(pos.tolist(), sc.tolist(), weights):
        ids = [p if p < 0 or labels is None else int(labels[p]) for p in prow]
        glist = [g[i] if i >= 0 else 0.0 for i in ids]
        out.append(build_hits(ids, srow, [s - wr * gg for s, gg in zip(srow, glist)], glist,
                              [norms[i] if i >= 0 else 0.0 for i in ids], [counts[i] if i >= 0 else 0 for i in ids],
                              wr, (doc_ids, texts, metas)))
    return out


def _first_k(rows: Any, scores: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    width = np.asarray(rows).shape[-1]
    pos = np.asarray(rows, dtype=np.int64).reshape(-1, width)[:, :k]
    return pos, np.asarray(scores, dtype=np.float32).reshape(-1, width)[:, :k]


def _needs_ordering(pos: np.ndarray, sc: np.ndarray, k: int, untied: int, rows: Any, scores: Any) -> bool:
    """A missing hit or equal scores among the first ``k`` (with ``untied`` 2 also across the cut)."""
    if np.any(pos < 0) or np.any(sc[:, 1:] == sc[:, :-1]):
        return True
    full = np.asarray(scores, dtype=np.float32).reshape(pos.shape[0], -1)
    return bool(untied >= 2 and 0 < k < full.shape[1] and np.any(full[:, k - 1] == full[:, k]))


#: :func:`_hit_rows`, in C where it was built
hit_rows: Any = _c.hit_rows if _c is not None else _hit_rows


def _array_rows(rows: Any, scores: Any, k: int, w: float | np.ndarray, labels: Any, columns: tuple[Any, ...],
                out_scores: np.ndarray, out_cosines: np.ndarray, untied: int) -> list[list[str]] | None:
    """Result rows of an additive blend as ``search_arrays`` gives them: the ids of each row's first ``k``
    hits, with the float32 scores and the float64 ``score - w * g(d)`` written into ``out_scores`` and
    ``out_cosines`` (``(n, k)``). Arguments and ``untied`` as for :func:`_hit_rows`; every hit must be
    present (a missing one gives ``None`` with ``untied``, else ``ValueError``)."""
    pos, sc = _first_k(rows, scores, k)
    if untied and _needs_ordering(pos, sc, k, untied, rows, scores):
        return None
    if np.any(pos < 0):
        raise ValueError("array_rows: a missing hit (-1) needs untied")
    internal = pos if labels is None else np.asarray(labels, dtype=np.int64)[pos]
    doc_ids, g = columns[0], np.asarray(columns[5], dtype=np.float64)
    weights = np.full(pos.shape[0], float(w)) if np.ndim(w) == 0 else np.asarray(w, dtype=np.float64)
    out_scores[...] = sc
    np.subtract(sc, weights[:, None] * g[internal], out=out_cosines, dtype=np.float64)
    return [[doc_ids[i] for i in row] for row in internal.tolist()]


#: :func:`_array_rows`, in C where it was built
array_rows: Any = _c.array_rows if _c is not None else _array_rows

#: ``scan_topk(sgemm_address, queries, vectors, width, step, out_scores, out_positions)`` in C where it was
#: built, else ``None`` (normrank.batch_topk then uses FAISS's heaps: the same result)
scan_topk: Any = _c.scan_topk if _c is not None else None
#: ``lean_batch(...)`` in C where it was built, else ``None`` (see :func:`normrank.batch_topk.raw_batch_topk`)
lean_batch: Any = _c.lean_batch if _c is not None else None


def build_hits(rows: list[int], scores: list[float], cosines: list[float], g: list[float], norms: list[float],
               counts: list[int], w: float, docs: tuple[list[Any], list[Any], list[Any]]) -> list[Hit]:
    """``Hit`` objects for one result row given as Python lists (internal ids; -1 is skipped), each
    filled slot by slot: equal to ``Hit(...)`` without the frozen dataclass's ``object.__setattr__``
    per field. ``docs`` holds the ids, texts and metadata lists (:meth:`DocColumns.hit_columns`)."""
    s_id, s_score, s_cos, s_norm, s_feat, s_w, s_count, s_text, s_meta = _SETTERS
    doc_ids, texts, metas = docs[:3]
    out = []
    for i, sc, c, gg, nrm, cnt in zip(rows, scores, cosines, g, norms, counts):
        if i < 0:
            continue
        hit = _new(Hit)
        s_id(hit, doc_ids[i])
        s_score(hit, sc)
        s_cos(hit, c)
        s_norm(hit, nrm)
        s_feat(hit, gg)
        s_w(hit, w)
        s_count(hit, cnt)
        s_text(hit, texts[i])
        m = metas[i]
        s_meta(hit, {} if m is None else copy_metadata(m))
        out.append(hit)
    return out
