"""The ``normrank.yaml`` file: pydantic models, strict (``extra="forbid"``), one per section.

A typo must fail loudly: an unknown key or a wrong type raises :class:`ConfigError`
with the key's dotted path and the allowed keys or values, instead of being
silently ignored (a classic cause of "my setting did nothing").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from normrank.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EncoderConfig(_Section):
    model: str | None = Field(None, description="Local sentence-transformers folder; null = bundled all-MiniLM-L6-v2.")
    batch_size: int = Field(64, gt=0)
    device: str = "cpu"
    max_seq_length: int | None = Field(None, gt=0)
    show_progress: bool | None = None
    pooling: Literal["mean", "norm", "norm2", "inv_norm", "sif"] = Field(
        "mean", description="mean = the stock model; others weight tokens by their own norms (research option).")


class CalibrationConfig(_Section):
    max_bins: int = Field(12, gt=0, description="Quantile bins of log token count for the length curve.")
    min_per_bin: int = Field(20, gt=0)


class ScoringConfig(_Section):
    mode: Literal["additive", "multiplicative", "tiebreak"] = "additive"
    feature: Literal["calibrated", "raw"] = "calibrated"
    a: float = Field(0.0, description="Constant part of the query weight w(q) = a + b * g_q.")
    b: float = Field(0.0, description="Query-conditioned part of w(q).")
    epsilon: float = Field(0.01, ge=0, description="Tie-breaker band width (mode: tiebreak).")
    clip: float | None = Field(3.0, gt=0)
    squash: bool = False


class StoreConfig(_Section):
    backend: Literal["faiss", "pgvector"] = Field(
        "faiss", description="'faiss': in-process index saved at store.path; 'pgvector': PostgreSQL table "
        "store.table at store.dsn (pip install 'normrank[pgvector]').")
    index_type: Literal["flat", "hnsw", "ivf"] = "flat"
    dsn: str | None = Field(None, description="pgvector: PostgreSQL connection string ($VARS expanded); "
                            "null reads $NORMRANK_PG_DSN.")
    table: str = Field("normrank_docs", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,53}$",
                       description="pgvector: the documents' table; {table}_normrank holds the calibration.")
    path: str | None = Field(None, description="Folder of a saved index to load (or to save to).")
    pad_to: int = Field(1, ge=1, description="Pad the augmented width to a multiple of this (1 = none).")
    hnsw_m: int = Field(32, gt=0)
    ef_construction: int = Field(200, gt=0)
    ef_search: int = Field(128, gt=0)
    nlist: int = Field(256, gt=0)
    nprobe: int = Field(16, gt=0)

    @model_validator(mode="after")
    def _pgvector_index_types(self) -> StoreConfig:
        if self.backend == "pgvector" and self.index_type == "ivf":
            raise ValueError("index_type 'ivf' is FAISS-only; the pgvector backend takes 'flat' or 'hnsw'")
        return self


class FitConfig(_Section):
    folds: int = Field(5, ge=2)
    alpha: float = Field(0.05, gt=0, lt=1)
    min_gain: float = Field(0.0, ge=0)
    depth: int = Field(100, gt=0)
    features: list[Literal["calibrated", "raw"]] = Field(default_factory=lambda: ["calibrated", "raw"])
    modes: list[Literal["additive", "multiplicative", "tiebreak"]] = Field(default_factory=lambda: ["additive"])


Calibration = Literal["auto", "index", "candidates"]
_CALIBRATION_HELP = (
    "Document calibration of the re-rankers: 'index' takes it (and the query calibration) from the saved "
    "index at store.path, 'candidates' fits it on the candidates of each query, 'auto' uses the index when "
    "store.path holds one and the candidates otherwise."
)


class LangChainConfig(_Section):
    k: int = Field(4, gt=0, description="Documents returned per query (invoke(q, k=...) overrides it).")
    filter: dict[str, Any] | None = Field(None, description="Metadata filter: key -> value or list of values.")


class LlamaIndexConfig(_Section):
    top_n: int = Field(5, gt=0, description="Nodes the postprocessor keeps.")
    keep_retrieval_score: bool = Field(True, description="Keep the incoming score in metadata['retrieval_score'].")
    similarity_top_k: int = Field(10, gt=0, description="Nodes the first-stage NormRankRetriever returns.")
    calibration: Calibration = Field("auto", description=_CALIBRATION_HELP)
    cache_size: int = Field(10_000, ge=0, description="Node vectors kept in memory (by node id + content hash).")


class HaystackConfig(_Section):
    top_k: int = Field(10, gt=0, description="Documents the ranker returns.")
    keep_retrieval_score: bool = Field(True, description="Keep the incoming score in meta['retrieval_score'].")
    calibration: Calibration = Field("auto", description=_CALIBRATION_HELP)
    cache_size: int = Field(10_000, ge=0, description="Document vectors kept in memory (by id + content hash).")


class NormRankConfig(_Section):
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    fit: FitConfig = Field(default_factory=FitConfig)
    langchain: LangChainConfig = Field(default_factory=LangChainConfig)
    llamaindex: LlamaIndexConfig = Field(default_factory=LlamaIndexConfig)
    haystack: HaystackConfig = Field(default_factory=HaystackConfig)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = NormRankConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
    return sorted(model.model_fields)


def _format(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown key '{path}'; allowed keys here: {', '.join(_allowed_keys(err['loc']))}")
        else:
            lines.append(f"'{path}': {err['msg']} (got {err.get('input')!r})")
    return f"invalid normrank configuration {source}: " + "; ".join(lines)


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig | None = None) -> NormRankConfig:
    """Read and validate a YAML file (or a dict); ``None`` gives the defaults."""
    if source is None:
        return NormRankConfig()
    if isinstance(source, NormRankConfig):
        return source
    where = "(dict)"
    if isinstance(source, Mapping):
        data: Any = dict(source)
    else:
        path = Path(source)
        where = f"in {path}"
        if not path.is_file():
            raise ConfigError(f"configuration file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"configuration file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"invalid normrank configuration {where}: the top level must be a mapping of sections")
    try:
        return NormRankConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc, where)) from None


def build_encoder(config: NormRankConfig) -> Any:
    from normrank.encoders import RawEncoder

    e = config.encoder
    options = {"batch_size": e.batch_size, "device": e.device, "max_seq_length": e.max_seq_length,
               "show_progress": e.show_progress}
    if e.pooling != "mean":
        from normrank.pooling import PooledEncoder

        return PooledEncoder(e.model, pooling=e.pooling, **options)
    return RawEncoder(e.model, **options)


def build_weights(config: NormRankConfig) -> Any:
    from normrank.scoring import Weights

    return Weights(**config.scoring.model_dump())


def build_index(source: Any = None) -> Any:
    """An empty ``NormIndex`` as the config describes, or the saved one at ``store.path`` if it exists.

    A saved index keeps its fitted weights unless the file sets non-default scoring.
    """
    from normrank.calibration import NormCalibrator
    from normrank.store import NormIndex

    config = load_config(source)
    encoder = build_encoder(config)
    s = config.store
    if s.backend == "pgvector":  # the table keeps its state; only settings the file names override it
        from normrank.pgvector_store import PgVectorNormIndex

        given = s.model_fields_set
        return PgVectorNormIndex(
            os.path.expandvars(s.dsn) if s.dsn else None, s.table, encoder,
            weights=build_weights(config) if config.scoring != ScoringConfig() else None,
            index_type=s.index_type if "index_type" in given else None, hnsw_m=s.hnsw_m,
            ef_construction=s.ef_construction, ef_search=s.ef_search if "ef_search" in given else None,
            calibrator=None if config.calibration == CalibrationConfig() else
            NormCalibrator(config.calibration.max_bins, config.calibration.min_per_bin),
        )
    if s.path and Path(s.path).exists():
        index = NormIndex.load(s.path, encoder=encoder)
        if config.scoring != ScoringConfig():
            index.set_weights(build_weights(config))
        return index
    return NormIndex(
        encoder, weights=build_weights(config), index_type=s.index_type, pad_to=s.pad_to, hnsw_m=s.hnsw_m,
        ef_construction=s.ef_construction, ef_search=s.ef_search, nlist=s.nlist, nprobe=s.nprobe,
        calibrator=None if config.calibration == CalibrationConfig() else
        NormCalibrator(config.calibration.max_bins, config.calibration.min_per_bin),
    )


def saved_index(config: NormRankConfig, calibration: str, section: str) -> Any:
    """The saved index at ``store.path`` when an adapter section's ``calibration`` wants it, else ``None``.

    ``candidates``: never; ``auto``: when one is saved there; ``index``: required, else ConfigError.
    """
    if calibration == "candidates":
        return None
    path = config.store.path
    if path and Path(path).exists():
        return build_index(config)
    if calibration == "index":
        raise ConfigError(
            f"'{section}.calibration' is 'index' but store.path ({path!r}) holds no saved index; "
            "save one there, or choose one of: auto, index, candidates"
        )
    return None
