"""The state a pgvector table keeps beside its rows, and the settings' ranges.

One JSON row (``{table}_normrank``, key ``'state'``) holds what ranking needs besides the rows:
the calibrations, the weights, the HNSW settings, the row count and a version counter every
write bumps. :class:`TableState` is that row as a value: written with :meth:`TableState.to_json`,
read back with :meth:`TableState.from_json`, which range-checks every setting through the same
table as the FAISS backend (:data:`normrank._validation.OPTION_RANGES`), narrowed to what
pgvector accepts, so a tampered row is a named :class:`~normrank.errors.IndexFormatError`
instead of, say, a 2e9-wide search.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from normrank._validation import check_option
from normrank.calibration import NormCalibrator
from normrank.errors import IndexFormatError, InvalidArgumentError, NormRankError
from normrank.scoring import Weights

PgIndexType = Literal["flat", "hnsw"]
PG_INDEX_TYPES: tuple[str, ...] = ("flat", "hnsw")
FORMAT_VERSION = 1
KIND = "normrank.PgVectorNormIndex"
#: pgvector indexes ``vector`` columns of at most 2,000 dimensions, and stores at most 16,000.
MAX_HNSW_DIM = 2000
MAX_DIM = 16000
#: The norm column is stored times this and the query's divided by it: the same inner product,
#: but document-to-document distances (which build the HNSW graph) stay nearly cosine. Stored
#: unscaled, g(d) * g(d') (up to 9 at clip 3) swamps the cosine and wrecks the graph: recall@10
#: fell to 0.66 at ef_search 40 on SciFact, against 0.99 with the scaled column.
COLUMN_SCALE = 0.01
#: pgvector's own upper limits (``hnsw.ef_search`` <= 1000, ``m`` <= 100, ``ef_construction`` <= 1000).
PG_HIGH: dict[str, int] = {"hnsw_m": 100, "ef_construction": 1000, "ef_search": 1000}


def check_pg_option(name: str, value: Any) -> int:
    """``value`` checked against the shared range of ``name``, narrowed to what pgvector accepts."""
    return check_option(name, value, high=PG_HIGH.get(name))


def check_index_type(index_type: Any) -> str:
    if index_type not in PG_INDEX_TYPES:
        raise InvalidArgumentError(
            f"unknown index_type {index_type!r} for the pgvector backend; choose one of {list(PG_INDEX_TYPES)}")
    return index_type


def check_hnsw_build(hnsw_m: int, ef_construction: int) -> None:
    if ef_construction < 2 * hnsw_m:
        raise InvalidArgumentError(f"pgvector needs ef_construction >= 2 * hnsw_m; got ef_construction "
                                   f"{ef_construction} with hnsw_m {hnsw_m}")


@dataclass(frozen=True)
class TableState:
    """Everything a handle must agree on with the table to rank as its writer did."""

    dim: int
    index_type: str
    hnsw_m: int
    ef_construction: int
    ef_search: int
    weights: Weights
    calibrator: NormCalibrator
    query_calibrator: NormCalibrator | None
    auto_calibrated: bool
    count: int
    version: int
    column_key: tuple[Any, ...] | None
    encoder: dict[str, Any] | None
    adapter_state: dict[str, Any] = field(default_factory=dict)  # see NormIndex.adapter_state
    removed_since_calibration: int = 0  # see index_base.needs_recalibration

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION, "kind": KIND, "dim": self.dim, "index_type": self.index_type,
            "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction, "ef_search": self.ef_search,
            "weights": self.weights.to_dict(), "count": self.count, "auto_calibrated": self.auto_calibrated,
            "calibrator": self.calibrator.to_dict(),
            "query_calibrator": self.query_calibrator.to_dict() if self.query_calibrator else None,
            "column_key": list(self.column_key) if self.column_key else None, "version": self.version,
            "column_scale": COLUMN_SCALE, "encoder": self.encoder, "adapter_state": self.adapter_state,
            "removed_since_calibration": self.removed_since_calibration,
        }

    @classmethod
    def from_json(cls, table: str, state: Any) -> TableState:
        """The stored state, every field checked; :class:`IndexFormatError` naming the bad one otherwise."""
        if not isinstance(state, Mapping):
            raise IndexFormatError(f"the state row of table {table} is not a JSON object")
        if state.get("kind", KIND) != KIND:
            raise IndexFormatError(f"the state row of table {table} is of kind {str(state.get('kind'))[:60]!r}, "
                                   "not a normrank pgvector table")
        if state.get("column_scale", COLUMN_SCALE) != COLUMN_SCALE:
            raise IndexFormatError(f"table {table} stores its norm column scaled by {state['column_scale']!r}, "
                                   f"this normrank by {COLUMN_SCALE}: rebuild the table with this version")
        fmt = state.get("format_version", 0)
        if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
            raise IndexFormatError(f"table {table} has state format {fmt!r}, newer than this normrank reads "
                                   f"({FORMAT_VERSION}); upgrade normrank")
        try:
            dim, count, version = (_whole(state, "dim", 1, MAX_DIM), _whole(state, "count", 0, 2**62),
                                   _whole(state, "version", 0, 2**62))
            added = _whole({"removed_since_calibration": 0, **state}, "removed_since_calibration", 0, 2**62)  # older: none
            index_type = check_index_type(state["index_type"])
            hnsw_m, ef_construction, ef_search = (check_pg_option(k, state[k])
                                                  for k in ("hnsw_m", "ef_construction", "ef_search"))
            if not isinstance(state["weights"], Mapping):
                raise InvalidArgumentError("weights is not a JSON object")
            weights = Weights.from_saved(state["weights"], "the table")
            calibrator = NormCalibrator.from_dict(state["calibrator"])
            qcal = state.get("query_calibrator")
            query_calibrator = NormCalibrator.from_dict(qcal) if qcal else None
            if not isinstance(state["auto_calibrated"], bool):
                raise InvalidArgumentError("auto_calibrated is not a bool")
            key = state.get("column_key")
            encoder = state.get("encoder")
            if encoder is not None and not isinstance(encoder, Mapping):
                raise InvalidArgumentError("encoder is not a JSON object")
            adapter_state = state.get("adapter_state") or {}  # older tables have none
            if not isinstance(adapter_state, Mapping):
                raise InvalidArgumentError("adapter_state is not a JSON object")
        except (KeyError, TypeError, ValueError, NormRankError) as exc:
            detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise IndexFormatError(f"the state of table {table} could not be read: {detail}") from None
        return cls(dim, index_type, hnsw_m, ef_construction, ef_search, weights, calibrator, query_calibrator,
                   state["auto_calibrated"], count, version, tuple(key) if key else None,
                   dict(encoder) if encoder else None, copy.deepcopy(dict(adapter_state)), added)


def _whole(state: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = state[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be a whole number in [{low}, {high}], got {json.dumps(value)[:40]}")
    return value


__all__ = ["COLUMN_SCALE", "FORMAT_VERSION", "MAX_HNSW_DIM", "PG_INDEX_TYPES", "PgIndexType", "TableState",
           "check_hnsw_build", "check_index_type", "check_pg_option"]
