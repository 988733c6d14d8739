"""Per-document data of a :class:`normrank.NormIndex`, held as columns by internal id.

Why columns: one frozen ``Record`` object (and its ``__dict__``) per document plus a dict
keyed by internal id cost ~900 bytes of RSS per document over a bare FAISS index, and
building 100k of them was most of a load. Here the numbers are NumPy arrays (norm, token
count, shaped feature g(d), alive flag), the strings are plain lists (the id and text
objects a user's own docstore would hold too), an empty metadata dict is stored as
``None``, and only the id -> internal id dict is per-document Python. A ``Record`` is
built on demand, for the few documents a caller asks for.

The id -> internal id dict is built on the first call that looks an id up (add, delete,
get, ``in``), not by a load: searches map internal ids to ids through the list, and a
1M-document dict took ~0.6 s and ~90 MB that a search-only service never uses. A load
still refuses repeated ids, with a set (a quarter of the dict's time).

On disk (format 2, beside ``index.faiss``; rows in ascending internal id, as FAISS
lists them): ``ids.utf8`` and ``texts.utf8`` are the strings concatenated, with their
lengths in characters in ``lengths.npy`` (text length -1 for no text), and
``metadata.json`` is one JSON array (``null`` for empty metadata). A load decodes each
blob once and slices it; format 1's ``records.jsonl`` still loads.
"""

from __future__ import annotations

import copy
import json
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from normrank.errors import IndexFormatError, UnknownIdError
from normrank.index_base import Record
from normrank.persistence import load_npy

#: The files :meth:`DocColumns.write` adds to a saved folder (format 2).
COLUMN_FILES = ("ids.utf8", "texts.utf8", "lengths.npy", "metadata.json")
_SCALARS = (str, int, float, bool, type(None))


class DocColumns:
    """Ids, texts, metadata, norms, token counts and g(d), indexed by internal id.

    Internal ids are positions: a deleted slot stays, empty, until the index compacts FAISS and
    :meth:`renumber` gives the live documents the ids ``0..n-1`` again (without it, a store whose
    deletes kept pace with its adds held a slot for every document it ever had: +70 MB over a
    million updates of a 10k corpus). The caller (the index) holds the lock; nothing here locks.
    """

    def __init__(self) -> None:
        self.ids: list[str | None] = []
        self.texts: list[str | None] = []
        self.metas: list[dict[str, Any] | None] = []
        self._by_id: dict[str, int] | None = {}  # None: not built yet (see the module docstring)
        self._count = 0
        self.norms = np.zeros(0, dtype=np.float32)  # float32-exact by construction (_check_batch)
        self.counts = np.zeros(0, dtype=np.int32)  # <= MAX_TOKEN_COUNT, checked at the door
        self.g = np.zeros(0, dtype=np.float64)  # the shaped feature stored in the FAISS column
        self.alive = np.zeros(0, dtype=bool)
        self._live: np.ndarray | None = None
        self._id_array: np.ndarray | None = None  # ids as an object array: built by the first id_array()
        self._views: tuple[memoryview, memoryview, memoryview] | None = None  # see views()
        self._hit_columns: tuple[Any, ...] | None = None  # see hit_columns()

    # ------------------------------------------------------------ size
    def __len__(self) -> int:
        return self._count

    @property
    def by_id(self) -> dict[str, int]:
        """Id -> internal id of every live document, built on first use."""
        if self._by_id is None:
            ids = self.ids
            if self._count == len(ids):  # no deleted slots: every position holds an id
                self._by_id = dict(zip(ids, range(len(ids))))  # type: ignore[arg-type]
            else:
                self._by_id = {x: i for i, x in enumerate(ids) if x is not None}
        return self._by_id

    @property
    def next(self) -> int:
        """The next internal id to hand out."""
        return len(self.ids)

    def _grow(self, need: int) -> None:
        if need <= self.norms.size:
            return
        cap = max(need, 2 * self.norms.size, 64)
        for name in ("norms", "counts", "g", "alive"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)
        self._views = self._hit_columns = None

    # ------------------------------------------------------------ changing
    def append(self, ids: Sequence[str], texts: Sequence[str | None], metas: Sequence[dict[str, Any]],
               norms: np.ndarray, counts: np.ndarray, g: np.ndarray) -> None:
        """Store a batch under the next internal ids (:attr:`next` on); the caller has checked every value."""
        start, n = self.next, len(ids)
        self._grow(start + n)
        sl = slice(start, start + n)
        self.norms[sl], self.counts[sl], self.g[sl], self.alive[sl] = norms, counts, g, True
        self.ids.extend(ids)
        self.texts.extend(texts)
        self.metas.extend(m or None for m in metas)
        by_id = self.by_id
        for j, x in enumerate(ids):
            by_id[x] = start + j
        self._count += n
        self._live = None
        if self._id_array is not None:  # kept up to date once built, growing like the numeric columns
            if self._id_array.size < self.next:
                grown = np.empty(max(self.next, 2 * self._id_array.size), dtype=object)
                grown[:start] = self._id_array[:start]
                self._id_array = grown
            self._id_array[sl] = ids

    def remove(self, internal: Sequence[int]) -> None:
        by_id = self.by_id
        for iid in internal:
            del by_id[self.ids[iid]]  # type: ignore[index]
            self.ids[iid] = self.texts[iid] = self.metas[iid] = None
            self.alive[iid] = False
            self._count -= 1
            if self._id_array is not None:
                self._id_array[iid] = None
        self._live = None

    def renumber(self) -> np.ndarray:
        """Give the live documents the internal ids ``0..n-1``, in their order; returns the old ids
        (ascending), so the caller renumbers FAISS alike. A no-op when no slot is empty."""
        live = self.live()
        n = int(live.size)
        if n == self.next:
            return live
        rows = live.tolist()
        self.ids = [self.ids[i] for i in rows]
        self.texts = [self.texts[i] for i in rows]
        self.metas = [self.metas[i] for i in rows]
        cap = max(n, 64)
        for name in ("norms", "counts", "g"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[:n] = old[live]
            setattr(self, name, new)
        self.alive = np.zeros(cap, dtype=bool)
        self.alive[:n] = True
        self._by_id, self._live, self._id_array, self._views, self._hit_columns = None, None, None, None, None
        return live

    def set_g(self, internal: np.ndarray, g: np.ndarray) -> None:
        self.g[internal] = g

    # ------------------------------------------------------------ reading
    def live(self) -> np.ndarray:
        """Live internal ids, ascending (cached until the next change)."""
        if self._live is None:
            self._live = np.flatnonzero(self.alive[: self.next]).astype(np.int64)
        return self._live

    def id_array(self) -> np.ndarray:
        """The ids by internal id as a NumPy object array, so a whole result matrix of internal ids maps to
        ids in one ``take`` (a Python loop over 640 hits was ~35 us of a 64-query ``search_arrays``); at
        least :attr:`next` long (a deleted slot holds ``None``), kept up to date once built."""
        if self._id_array is None:
            arr = np.empty(len(self.ids), dtype=object)
            arr[:] = self.ids
            self._id_array = arr
        return self._id_array

    def views(self) -> tuple[memoryview, memoryview, memoryview]:
        """Norms, token counts and g(d) as memoryviews, for the few documents of one result row.

        Why: indexing a memoryview gives a Python float or int in CPython's own code, where a NumPy
        fancy index plus ``tolist`` per column are calls into NumPy that, right after a scan has left
        the caches cold, cost microseconds each (benchmarks/results/speed.md). Same values as
        ``tolist()``: float32 and float64 read as the same Python float. Rebuilt when the columns grow.
        """
        if self._views is None:
            self._views = (memoryview(self.norms), memoryview(self.counts), memoryview(self.g))
        return self._views

    def hit_columns(self) -> tuple[Any, ...]:
        """What a ``Hit`` is built from, in one tuple: ids, texts and metadata (the lists) and :meth:`views`;
        :func:`normrank.fastpath.hit_rows` reads it. Rebuilt when the columns grow or are renumbered."""
        if self._hit_columns is None:
            self._hit_columns = (self.ids, self.texts, self.metas, *self.views())
        return self._hit_columns

    def internal_ids(self, wanted: Sequence[str], unknown: str = "unknown ids") -> np.ndarray:
        """Internal ids of ``wanted``, in order; ``UnknownIdError`` naming up to five missing ones."""
        by_id = self.by_id
        missing = [x for x in wanted if x not in by_id]
        if missing:
            raise UnknownIdError(f"{unknown}: {missing[:5]}")
        return np.array([by_id[x] for x in wanted], dtype=np.int64)

    def norms_counts(self, internal: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(internal, dtype=np.int64)
        return self.norms[idx].astype(np.float64), self.counts[idx].astype(np.int64)

    def metadata(self, iid: int) -> dict[str, Any]:
        """The stored dict itself (for filters); an empty one for documents without metadata."""
        return self.metas[iid] or {}

    def record(self, iid: int) -> Record:
        """A :class:`Record` with a private copy of the metadata."""
        rec = object.__new__(Record)
        rec.__dict__.update(id=self.ids[iid], text=self.texts[iid], metadata=copy_metadata(self.metas[iid]),
                            norm=float(self.norms[iid]), token_count=int(self.counts[iid]))
        return rec

    # ------------------------------------------------------------ files
    def write(self, folder: Path, live: np.ndarray) -> None:
        """Write the string and metadata columns of ``live`` (ascending) into ``folder``."""
        rows = live.tolist()
        ids = [self.ids[i] for i in rows]
        texts = [self.texts[i] for i in rows]
        lengths = np.empty((len(ids), 2), dtype=np.int64)
        lengths[:, 0] = [len(x) for x in ids]  # type: ignore[arg-type]
        lengths[:, 1] = [-1 if t is None else len(t) for t in texts]
        (folder / "ids.utf8").write_bytes("".join(ids).encode("utf-8"))  # type: ignore[arg-type]
        (folder / "texts.utf8").write_bytes("".join(t for t in texts if t).encode("utf-8"))
        np.save(folder / "lengths.npy", lengths, allow_pickle=False)
        with open(folder / "metadata.json", "w", encoding="utf-8") as fh:
            json.dump([self.metas[i] for i in rows], fh, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def read_rows(opener: Callable[[str], BinaryIO], where: Any) -> Rows:
        """The rows of the files :meth:`write` made, checked against each other (not yet against FAISS).

        Needs nothing from ``index.faiss``, so a load runs it while FAISS reads that file."""
        with opener("lengths.npy") as fh:
            lengths = load_npy(fh, Path(where) / "lengths.npy")
        with opener("ids.utf8") as fh:
            id_blob = fh.read().decode("utf-8")
        with opener("texts.utf8") as fh:
            text_blob = fh.read().decode("utf-8")
        with opener("metadata.json") as fh:
            metas = json.loads(fh.read().decode("utf-8"))
        if (lengths.dtype.kind != "i" or lengths.ndim != 2 or lengths.shape[1] != 2 or not isinstance(metas, list)
                or len(metas) != lengths.shape[0] or np.any(lengths[:, 0] < 1) or np.any(lengths[:, 1] < -1)):
            raise IndexFormatError(f"the index at {where} is inconsistent: the document columns do not match "
                                   "each other")
        ids: list[str] = _slices(id_blob, np.ascontiguousarray(lengths[:, 0]), where, "ids.utf8")  # type: ignore[assignment]
        texts = _slices(text_blob, np.ascontiguousarray(lengths[:, 1]), where, "texts.utf8", nullable=True)
        return Rows.checked(ids, texts, metas, where)

    @staticmethod
    def records_rows(rows: list[Any], where: Any) -> Rows:
        """The rows of format 1's ``records.jsonl`` (``{"id", "text", "metadata"}`` per line)."""
        texts = [r["text"] for r in rows]
        if not set(map(type, texts)) <= {str, type(None)}:
            raise IndexFormatError(f"the index at {where} has a text that is not a string")
        return Rows.checked([r["id"] for r in rows], texts, [r["metadata"] for r in rows], where)

    @classmethod
    def from_rows(cls, rows: Rows, internal: np.ndarray, total: int, norms: np.ndarray, counts: np.ndarray,
                  where: Any) -> DocColumns:
        """Columns of ``rows`` stored under the FAISS ids ``internal`` (ascending), out of ``total`` slots."""
        ids, texts, metas = rows.ids, rows.texts, rows.metas
        n = internal.size
        if not (len(ids) == norms.size == counts.size == n):
            raise IndexFormatError(f"the index at {where} is inconsistent: {len(ids)} records, {n} ids, "
                                   f"{norms.size} norms, {counts.size} token counts")
        if n and (int(internal[0]) < 0 or int(internal[-1]) >= total or np.any(np.diff(internal) <= 0)):
            raise IndexFormatError(f"the index at {where} is inconsistent: FAISS ids repeat or fall outside 0..{total - 1}")
        cols = cls()
        cols._grow(total)
        if n == total:  # no deleted slots (the usual case): the rows are the columns
            cols.ids, cols.texts, cols.metas = ids, texts, metas  # type: ignore[assignment]
        else:
            cols.ids, cols.texts, cols.metas = [None] * total, [None] * total, [None] * total
            for p, x, t, m in zip(internal.tolist(), ids, texts, metas):
                cols.ids[p], cols.texts[p], cols.metas[p] = x, t, m
        cols._by_id, cols._count = None, n
        cols.norms[internal] = norms
        cols.counts[internal] = counts
        cols.alive[internal] = True
        return cols


class Rows(NamedTuple):
    """A saved index's documents in file order, each column checked on its own."""

    ids: list[str]
    texts: list[str | None]
    metas: list[dict[str, Any] | None]

    @classmethod
    def checked(cls, ids: list[str], texts: list[str | None], metas: list[Any], where: Any) -> Rows:
        if not len(ids) == len(texts) == len(metas):
            raise IndexFormatError(f"the index at {where} is inconsistent: {len(ids)} ids, {len(texts)} texts, "
                                   f"{len(metas)} metadata entries")
        if not set(map(type, metas)) <= {dict, type(None)}:
            raise IndexFormatError(f"the index at {where} has metadata that is not a JSON object")
        if not set(map(type, ids)) <= {str} or "" in ids:  # cheap: a 100k-document load checks it in ~3 ms
            raise IndexFormatError(f"the index at {where} has an id that is not a non-empty string")
        if len(set(ids)) != len(ids):  # a set: the id -> internal id dict is built later, on first use
            raise IndexFormatError(f"the index at {where} is inconsistent: its records repeat an id")
        return cls(ids, texts, [m or None for m in metas])


def _slices(blob: str, lengths: np.ndarray, where: Any, name: str, *, nullable: bool = False) -> list[str | None]:
    """Cut ``blob`` at ``lengths`` (-1 = ``None`` when ``nullable``). The offsets are iterated from
    ``array.array`` (one short-lived int at a time): lists of 100k+ Python ints, freed mid-load between
    the strings that stay, left ~60 bytes per document of fragmented heap in the loaded process."""
    clean = np.maximum(lengths, 0) if nullable else lengths
    if clean.size and int(clean.max()) > len(blob):  # else the int64 sum could wrap round to the blob's length
        raise IndexFormatError(f"the index at {where} is inconsistent: {name} does not hold the lengths "
                               "lengths.npy gives")
    ends = np.cumsum(clean, dtype=np.int64)
    if (int(ends[-1]) if ends.size else 0) != len(blob):
        raise IndexFormatError(f"the index at {where} is inconsistent: {name} does not hold the lengths "
                               "lengths.npy gives")
    starts = array("q", (ends - clean).tobytes())
    stops = array("q", ends.tobytes())
    nulls = lengths < 0 if nullable else None
    if nulls is None or not nulls.any():
        return [blob[a:b] for a, b in zip(starts, stops)]
    if nulls.all():
        return [None] * int(lengths.size)
    flags = array("b", nulls.astype(np.int8).tobytes())
    return [None if z else blob[a:b] for a, b, z in zip(starts, stops, flags)]


def copy_metadata(meta: dict[str, Any] | None) -> dict[str, Any]:
    """A private copy for the caller: flat dicts of scalars by ``dict()``, nested ones by deep copy."""
    if not meta:
        return {}
    for v in meta.values():
        if not isinstance(v, _SCALARS):
            return copy.deepcopy(meta)
    return dict(meta)
