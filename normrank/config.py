"""The ``normrank.yaml`` file: pydantic models, strict (``extra="forbid"``), one per section.

A typo must fail loudly: an unknown key or a wrong type raises :class:`ConfigError`
with the key's dotted path and the allowed keys or values, instead of being
silently ignored (a classic cause of "my setting did nothing").
"""

from __future__ import annotations

import os
import re
import reprlib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from normrank._validation import _numpy_scalar
from normrank.errors import ConfigError, InvalidArgumentError
from normrank.scoring import MAX_WEIGHT


class _Section(BaseModel):
    # allow_inf_nan: a NaN or infinite weight loaded fine and failed at the first query, naming no key
    # hide_input_in_errors: pydantic's own ValidationError (NormRankConfig(...) in Python) echoed the store
    # dict, DSN password and all; ConfigError shows the input itself, masked (_got)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False,
                              hide_input_in_errors=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML reads yes/no/on/off/true/false as booleans, and pydantic turned them into 1 and 0 for a
        number (``batch_size: yes`` became 1); the Python API refuses a bool there, and so does this."""
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _allows_bool(field.annotation):
                raise ValueError(f"expected a number, got the boolean {str(value).lower()} (YAML reads yes, no, on, "
                                 "off, true and false as booleans)")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _in_range(cls, value: Any, info: ValidationInfo) -> Any:
        """Every numeric option against the one range table (normrank._validation.OPTION_RANGES)."""
        from normrank._validation import OPTION_RANGES, check_option

        if info.field_name in OPTION_RANGES and value is not None:
            return check_option(info.field_name, value)  # InvalidArgumentError is a ValueError: pydantic names it
        return value


class EncoderConfig(_Section):
    model: str | None = Field(None, description="Local sentence-transformers folder; null = bundled all-MiniLM-L6-v2.")
    batch_size: int = Field(64, gt=0)
    device: str = "cpu"
    max_seq_length: int | None = Field(None, gt=0)
    show_progress: bool | None = None
    backend: Literal["torch", "onnx", "onnx-int8"] = Field(
        "torch", description="torch, or ONNX Runtime on the CPU (onnx = torch's vectors; onnx-int8 = 2.3x faster, "
        "norms move by up to ~8%): pip install 'normrank[onnx]'.")
    pooling: Literal["mean", "norm", "norm2", "inv_norm", "sif"] = Field(
        "mean", description="mean = the stock model; others weight tokens by their own norms (research option).")
    sif_a: float = Field(1e-3, gt=0, description="pooling: sif only: the SIF smoothing constant a / (a + p(word)).")

    @model_validator(mode="after")
    def _backend_runs_on_device(self) -> EncoderConfig:
        """An ONNX backend with a GPU device would only fail when the model loads: refuse it here, by the
        rule ``RawEncoder`` itself applies (InvalidArgumentError is a ValueError: pydantic names it)."""
        from normrank.onnx_backend import check_backend

        check_backend(self.backend, self.device)
        return self

    @field_validator("device")
    @classmethod
    def _device_is_a_torch_device(cls, value: str) -> str:
        """A typo (``gpu``) loaded and failed at the first query, with advice about model folders."""
        from normrank.encoders import check_device

        return check_device(value)

    @classmethod
    def from_encoder(cls, encoder: Any) -> EncoderConfig:
        """The settings that rebuild ``encoder`` (its ``describe()``), so a config round-trips."""
        from normrank.encoders import default_model_path

        d = dict(encoder.describe())
        model = d.get("model")
        if model is not None and str(model) == str(default_model_path()):
            model = None
        return cls(model=model, batch_size=d.get("batch_size", 64), device=d.get("device", "cpu"),
                   max_seq_length=d.get("max_seq_length"),
                   show_progress=getattr(encoder, "show_progress", None), backend=d.get("backend", "torch"),
                   pooling=d.get("pooling", "mean"), sif_a=d.get("sif_a", 1e-3))


class CalibrationConfig(_Section):
    max_bins: int = Field(12, gt=0, description="Quantile bins of log token count for the length curve.")
    min_per_bin: int = Field(20, gt=0)


class ScoringConfig(_Section):
    mode: Literal["additive", "multiplicative", "tiebreak"] = "additive"
    feature: Literal["calibrated", "raw"] = "calibrated"
    a: float = Field(0.0, ge=-MAX_WEIGHT, le=MAX_WEIGHT,
                     description="Constant part of the query weight w(q) = a + b * g_q.")
    b: float = Field(0.0, ge=-MAX_WEIGHT, le=MAX_WEIGHT, description="Query-conditioned part of w(q).")
    epsilon: float = Field(0.01, ge=0, le=MAX_WEIGHT, description="Tie-breaker band width (mode: tiebreak).")
    clip: float | None = Field(3.0, gt=0)
    squash: bool = False


class StoreConfig(_Section):
    backend: Literal["faiss", "pgvector"] = Field(
        "faiss", description="'faiss': in-process index saved at store.path; 'pgvector': PostgreSQL table "
        "store.table at store.dsn (pip install 'normrank[pgvector]').")
    index_type: Literal["flat", "hnsw", "ivf"] = "flat"
    dsn: str | None = Field(None, description="pgvector: PostgreSQL connection string (${VARS} expanded); "
                            "null reads $NORMRANK_PG_DSN.")
    table: str = Field("normrank_docs", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,53}$",
                       description="pgvector: the documents' table; {table}_normrank holds the calibration.")
    path: str | None = Field(None, description="Folder of a saved index to load (or to save to).")
    pad_to: int | None = Field(None, ge=1, description="Pad the augmented width to a multiple of this; "
                               "null picks it by index type (1 for each: 385 columns, the fewest bytes "
                               "a scan or a walk reads).")
    hnsw_m: int = Field(32, gt=0)
    ef_construction: int = Field(200, gt=0)
    ef_search: int = Field(128, gt=0)
    nlist: int = Field(256, gt=0)
    nprobe: int = Field(16, gt=0)

    def __repr_args__(self) -> Any:  # repr/str of the config never show the DSN's password
        from normrank.pg_connection import redact

        for key, value in super().__repr_args__():
            yield key, (redact(value) if key == "dsn" and isinstance(value, str) else value)

    @model_validator(mode="after")
    def _pgvector_index_types(self) -> StoreConfig:
        if self.backend == "pgvector" and self.index_type == "ivf":
            raise ValueError("index_type 'ivf' is FAISS-only; the pgvector backend takes 'flat' or 'hnsw'")
        if self.backend == "pgvector":  # pgvector's narrower limits, named at load (they failed at build_index)
            from normrank.pg_state import check_hnsw_build, check_pg_option

            for name in ("hnsw_m", "ef_construction", "ef_search"):
                try:
                    check_pg_option(name, getattr(self, name))
                except InvalidArgumentError as exc:
                    raise ValueError(f"store.{exc} (the pgvector backend's limit)") from None
            try:
                check_hnsw_build(self.hnsw_m, self.ef_construction)
            except InvalidArgumentError as exc:
                raise ValueError(f"store: {exc}") from None
        return self


class FitConfig(_Section):
    folds: int = Field(5, ge=2)
    alpha: float = Field(0.05, gt=0, le=1, description="One-sided p-value a blend must beat (1 = no significance gate).")
    min_gain: float = Field(0.0, ge=0)
    depth: int = Field(100, ge=10, description="Cosine candidates per labelled query (nDCG@10 needs at least 10).")
    seed: int = Field(0, ge=0, description="Seed of the cross-validation folds.")
    features: list[Literal["calibrated", "raw"]] = Field(default_factory=lambda: ["calibrated", "raw"], min_length=1)
    modes: list[Literal["additive", "multiplicative", "tiebreak"]] = Field(default_factory=lambda: ["additive"],
                                                                         min_length=1)


class ChunkingConfig(_Section):
    enabled: bool = Field(True, description="Split long documents into chunks when indexing (normrank.chunking).")
    size: int | None = Field(None, gt=0, description="Tokens per chunk (the encoder's own tokenizer, special tokens "
                             "excluded); null = the model's window minus its special tokens (254 for MiniLM).")
    overlap: int | None = Field(None, ge=0, description="Tokens shared by consecutive chunks; null = 15% of size.")
    rows: bool = Field(False, description="Also chunk rows of a BEIR folder or .jsonl file (their ids become "
                       "id#n, which qrels do not name); folders of .txt/.md files are always chunked when enabled.")

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingConfig:
        """The rule chunk_texts applies, named here instead of at the first document indexed."""
        if self.size is not None and self.overlap is not None and self.overlap >= self.size:
            raise ValueError(f"overlap ({self.overlap}) must be smaller than size ({self.size})")
        return self


Calibration = Literal["auto", "index", "candidates"]
_CALIBRATION_HELP = (
    "Document calibration of the re-rankers: 'index' takes it (and the query calibration) from the saved "
    "index at store.path, 'candidates' fits it on the candidates of each query, 'auto' uses the index when "
    "store.path holds one and the candidates otherwise."
)


class LangChainConfig(_Section):
    k: int = Field(4, gt=0, description="Documents returned per query (invoke(q, k=...) overrides it).")
    filter: dict[str, Any] | None = Field(None, description="Metadata filter: key -> value or list of values, "
                                          "or operators ($eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $exists, "
                                          "$and, $or, $not).")

    @field_validator("filter")
    @classmethod
    def _filter_means_something(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """An unknown operator or a NaN would otherwise only fail (or match nothing) at the first query."""
        from normrank.filters import check_filter

        check_filter(value)  # InvalidArgumentError is a ValueError: pydantic names it
        return _plain_data(value)


class LlamaIndexConfig(_Section):
    top_n: int = Field(5, gt=0, description="Nodes the postprocessor keeps.")
    keep_retrieval_score: bool = Field(True, description="Keep the incoming score in metadata['normrank']['retrieval_score'].")
    similarity_top_k: int = Field(10, gt=0, description="Nodes the first-stage NormRankRetriever returns.")
    calibration: Calibration = Field("auto", description=_CALIBRATION_HELP)
    cache_size: int = Field(10_000, ge=0, description="Node vectors kept in memory (by node id + content hash).")


class HaystackConfig(_Section):
    top_k: int = Field(10, gt=0, description="Documents the ranker returns.")
    keep_retrieval_score: bool = Field(True, description="Keep the incoming score in meta['normrank']['retrieval_score'].")
    calibration: Calibration = Field("auto", description=_CALIBRATION_HELP)
    cache_size: int = Field(10_000, ge=0, description="Document vectors kept in memory (by id + content hash).")
    score_threshold: float | None = Field(None, description="Return only documents whose blended score is at least "
                                          "this (null: no threshold).")


class NormRankConfig(_Section):
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    fit: FitConfig = Field(default_factory=FitConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    langchain: LangChainConfig = Field(default_factory=LangChainConfig)
    llamaindex: LlamaIndexConfig = Field(default_factory=LlamaIndexConfig)
    haystack: HaystackConfig = Field(default_factory=HaystackConfig)

    def to_dict(self) -> dict[str, Any]:
        """Every setting as plain data; ``load_config(config.to_dict()) == config``."""
        return self.model_dump(mode="json")

    def dumps(self) -> str:
        """The configuration as YAML text that :func:`load_config` reads back to an equal config.

        Written for normrank's own reader: text it would read as a number (``"1e3"``) is quoted, a ``${``
        is written ``$${`` (else the reload expanded it as a variable), and a line break YAML folds into a
        space (U+0085, U+2028) is escaped. A relative ``store.path`` or local ``encoder.model`` folder is
        written absolute, as this process resolves it: a file's relative paths are read relative to the
        file's folder, so written as they were they named another place once the file was elsewhere."""
        data = self.to_dict()
        if data["store"].get("path") and not os.path.isabs(os.path.expanduser(data["store"]["path"])):
            data["store"]["path"] = os.path.abspath(data["store"]["path"])
        model = data["encoder"].get("model")
        if model and not os.path.isabs(os.path.expanduser(model)) and (model.startswith(".") or _exists(Path(model))):
            data["encoder"]["model"] = os.path.abspath(model)
        data = _escape_variables(data)
        text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
        if _parse(text) != data:  # a line break written raw (NEL, LS) came back as a space
            text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=False)
        return text


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = NormRankConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
    return sorted(model.model_fields)


#: Longest echo of a user's value inside an error message.
MAX_ECHO = 80
#: Largest configuration file read (a settings file is a few kB).
MAX_CONFIG_BYTES = 1 << 20


def _short(value: Any) -> str:
    """``repr(value)`` cut to :data:`MAX_ECHO` characters: an error never echoes unbounded input."""
    from normrank.pg_connection import redact

    def masked(v: Any, depth: int = 0) -> Any:  # a DSN's password is never echoed, not even cut short
        if isinstance(v, str):
            return redact(v)
        if isinstance(v, dict) and depth < 3:
            return {k: masked(x, depth + 1) for k, x in v.items()}
        if isinstance(v, (list, tuple)) and depth < 3:  # a DSN given as a list is echoed too
            return [masked(x, depth + 1) for x in v]
        return v

    value = masked(value)
    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlist, r.maxdict, r.maxlevel = MAX_ECHO, MAX_ECHO, 6, 6, 3
    try:
        text = r.repr(value)
    except RecursionError:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_ECHO else text[:MAX_ECHO - 3] + "..."


def _allows_bool(annotation: Any) -> bool:
    """Whether a field's type takes a boolean (``bool``, ``bool | None``, ``Any``, a dict of anything)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is dict or origin is list:
        return False  # a bool for a whole dict or list is refused by pydantic itself
    return any(_allows_bool(a) for a in typing.get_args(annotation) if a is not type(None))


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors and aliases: a settings file never needs them, and an
    alias bomb (a few hundred bytes expanding to billions of nodes) would hang the loader. Numbers with an
    exponent and no dot (``1e-2``) are floats, as in YAML 1.2 (YAML 1.1 reads them as text, which the
    strict check would refuse)."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ConfigError(f"line {event.start_mark.line + 1}: YAML anchors and aliases (&name, *name) are not "
                              "allowed in a normrank configuration; write the value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # type: ignore[override]
        """Refuse a key given twice in one mapping: YAML keeps the last one, so a whole section (or a
        setting) written earlier in the file did nothing, in silence."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is None:
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(f"line {line}: the key {_short(key)} is given twice in one section (first on "
                                      f"line {seen[key]}); YAML would keep only the last, so write it once")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


_VAR = re.compile(r"\$\$\{|\$\{([^}]*)\}")


def _validate_lax(data: Mapping[str, Any], where: str) -> NormRankConfig:
    """A config given as a dict from Python: NumPy numbers and tuples are taken, as the Python API takes them."""
    try:
        return NormRankConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc, where)) from None


def _validate(data: Mapping[str, Any], from_env: set[str], where: str) -> NormRankConfig:
    """The config, with every value of the type its key takes, as the Python API checks it: YAML's
    ``hnsw_m: '32'``, ``a: '0.02'`` and ``k: 4.0`` were converted in silence where ``NormIndex(hnsw_m="32")``
    and ``Weights(a="0.02")`` refuse them. A value that came from an environment variable is text by
    nature, and is converted (``a: ${NR_A}``) when the strict check fails only there; so is a whole float
    where an integer goes (YAML reads ``2.0e+9`` as a float), whose range is then named."""
    try:
        return NormRankConfig.model_validate(data, strict=True)
    except ValidationError as exc:
        lenient = set(from_env)  # and whole floats for integers (2.0e+9, 4.0): range-checked as the number
        lenient.update(".".join(str(x) for x in e["loc"]) for e in exc.errors()
                       if e["type"] == "int_type" and isinstance(e.get("input"), float) and e["input"].is_integer())
        if any(".".join(str(x) for x in e["loc"]) not in lenient for e in exc.errors()):
            # named without the values the lax check would convert
            raise ConfigError(_format(exc, where, lenient)) from None
    return _validate_lax(data, where)


def _expand(value: Any, where: str, loc: str = "", expanded: set[str] | None = None) -> Any:
    """``${NAME}`` -> the environment variable in every string value; ``$${`` is a literal ``${``.
    The keys (dotted) of values that took a variable are added to ``expanded``.

    Raises
    ------
    ConfigError
        A named variable is not set (the message names it and the key).
    """
    if isinstance(value, dict):
        return {k: _expand(v, where, f"{loc}.{k}" if loc else str(k), expanded) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, where, f"{loc}.{i}", expanded) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value
    if expanded is not None and any(m.group(0) != "$${" for m in _VAR.finditer(value)):
        expanded.add(loc)

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name = m.group(1)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"invalid normrank configuration {where}: '{loc}': {_short('${' + name + '}')} is "
                              "not a variable reference (${NAME}; write $${ for a literal ${)")
        if name not in os.environ:
            raise ConfigError(f"invalid normrank configuration {where}: '{loc}' names the environment variable "
                              f"{name}, which is not set")
        return os.environ[name]

    return _VAR.sub(sub, value)


_StrictLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                    list("-+0123456789"))


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that knows :class:`_StrictLoader`'s floats, so it quotes the text ``"1e3"``
    (written plain, the reload read it as 1000.0)."""


_Dumper.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeDumper.yaml_implicit_resolvers.items()}
_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def _escape_variables(value: Any) -> Any:
    """Every ``${`` in a string value written ``$${``: what :func:`_expand` reads back as ``${``."""
    if isinstance(value, dict):
        return {k: _escape_variables(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape_variables(v) for v in value]
    return value.replace("${", "$${") if isinstance(value, str) else value


def _plain_data(value: Any) -> Any:
    """NumPy numbers as the Python values they hold and tuples as lists, as JSON (and ``to_dict``) writes
    them: a dict config's ``np.int64`` was taken, then ``to_dict`` and ``dumps`` could not write it."""
    if isinstance(value, dict):
        return {k: _plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_data(v) for v in value]
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return _numpy_scalar(value)  # as metadata reads them (np.longdouble included)
    return value.item() if isinstance(value, np.generic) else value


def _parse(text: str) -> Any:
    """YAML text read by :class:`_StrictLoader` (a SafeLoader subclass, driven directly as yaml.load would)."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _read_yaml(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"configuration file {path} is {size:,} bytes; a normrank configuration is at most "
                              f"{MAX_CONFIG_BYTES:,}")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"configuration file {path} cannot be read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return _parse(text)
    except ConfigError as exc:
        raise ConfigError(f"configuration file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration file {path} is not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise ConfigError(f"configuration file {path} is nested too deeply to be a normrank configuration") from None
    except ValueError as exc:  # an integer of more than 4,300 digits: Python refuses to read it
        raise ConfigError(f"configuration file {path} holds a value YAML cannot read: {str(exc)[:200]}") from None


def _resolve_paths(config: NormRankConfig, base: Path) -> None:
    """Relative paths in a file are relative to the file's folder, not to the working folder."""
    if config.store.path:
        p = Path(config.store.path).expanduser()
        config.store.path = str(p if p.is_absolute() else base / p)
    model = config.encoder.model
    if model:
        p = Path(model).expanduser()
        if not p.is_absolute() and (model.startswith((".", "~")) or _exists(base / p)):
            config.encoder.model = str(base / p)
        elif model.startswith("~"):
            config.encoder.model = str(p)


def _exists(path: Path) -> bool:
    """``path.exists()``, false for a name the system refuses (too long: a bare ``OSError`` from
    ``load_config``); the encoder then names the model folder it cannot find."""
    try:
        return path.exists()
    except OSError:
        return False


def _format(exc: ValidationError, source: str, skip: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if path in skip:  # a value from an environment variable, which the lax check converts
            continue
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown key '{path}'; allowed keys here: {', '.join(_allowed_keys(err['loc']))}")
        else:
            lines.append(f"'{path}': {err['msg']} (got {_short(err.get('input'))})")
    return f"invalid normrank configuration {source}: " + "; ".join(lines)


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | NormRankConfig | None = None) -> NormRankConfig:
    """Read and validate a YAML file (or a dict); ``None`` gives the defaults.

    In a file, ``${NAME}`` in any string value is the environment variable ``NAME`` (unset: a
    :class:`ConfigError` naming it; ``$${`` writes a literal ``${``), and relative paths
    (``store.path``, a relative ``encoder.model`` folder) are relative to the file's folder.
    Anchors and aliases are refused, and no error message echoes more than a short excerpt.
    """
    if source is None:
        return NormRankConfig()
    if isinstance(source, NormRankConfig):
        return source
    where = "(dict)"
    base: Path | None = None
    from_env: set[str] = set()
    if isinstance(source, Mapping):
        data: Any = dict(source)
    else:
        path = Path(source)
        where = f"in {path}"
        if path.is_dir():
            raise ConfigError(f"configuration file {path} is a folder; give the normrank.yaml inside it")
        if not path.is_file():
            raise ConfigError(f"configuration file {path} does not exist")
        data = _read_yaml(path)
        data = {} if data is None else data
        if isinstance(data, Mapping):
            data = _expand(dict(data), where, expanded=from_env)
        base = path.resolve().parent
    if not isinstance(data, Mapping):
        raise ConfigError(f"invalid normrank configuration {where}: the top level must be a mapping of sections")
    try:
        # a file strictly (its text gave '32' for an int); a dict from Python as the Python API takes values
        config = _validate(data, from_env, where) if base is not None else _validate_lax(data, where)
    except RecursionError:
        raise ConfigError(f"invalid normrank configuration {where}: nested too deeply") from None
    if base is not None:
        _resolve_paths(config, base)
    return config


def build_encoder(config: NormRankConfig) -> Any:
    from normrank.candidate_vectors import build_encoder as from_options

    e = config.encoder
    return from_options(e.model, pooling=e.pooling, sif_a=e.sif_a, batch_size=e.batch_size, device=e.device,
                        max_seq_length=e.max_seq_length, show_progress=e.show_progress, backend=e.backend)


def build_weights(config: NormRankConfig) -> Any:
    from normrank.scoring import Weights

    return Weights(**config.scoring.model_dump())


def _override_weights(index: Any, config: NormRankConfig) -> None:
    """Set the ``scoring`` keys the file names on a saved index or table; the others keep their saved values.

    Why by key: the section was compared with the defaults as a whole, so ``scoring: {a: 0.0, b: 0.0}``
    (plain cosine, as the example file says) left a saved blend on, and ``scoring: {clip: 2.0}`` alone
    reset a saved (or fitted) blend to plain cosine."""
    given = {key: getattr(config.scoring, key) for key in config.scoring.model_fields_set}
    if given and (wanted := index.weights.replace(**given)) != index.weights:  # unchanged: no write (a
        index.set_weights(wanted)  # pgvector table's state row was rewritten by every service start)


def build_index(source: Any = None) -> Any:
    """An empty ``NormIndex`` as the config describes, the saved one at ``store.path`` if it exists, or,
    with ``store.backend: pgvector``, a ``PgVectorNormIndex`` on ``store.table`` (which may already hold
    documents; its stored state is kept unless the file sets other values).

    A saved index keeps its fitted weights unless the file sets non-default scoring, and its own encoder
    (model, pooling, backend) unless the file has an ``encoder:`` section: a YAML without one reopened an
    ``onnx-int8`` index with torch. The file's ``store.ef_search`` and ``store.nprobe`` apply to it; a
    build-time store setting other than the saved one is a :class:`ConfigError` (:func:`_apply_store_settings`).
    """
    from normrank.calibration import NormCalibrator
    from normrank.store import NormIndex

    config = load_config(source)
    s = config.store
    saved = s.backend != "pgvector" and bool(s.path) and Path(str(s.path)).exists()
    # None: NormIndex.load rebuilds the encoder the index was saved with
    encoder = None if saved and not config.encoder.model_fields_set else build_encoder(config)
    if s.backend == "pgvector":  # the table keeps its state; only settings the file names override it
        from normrank.pgvector_store import PgVectorNormIndex

        given = s.model_fields_set
        index = PgVectorNormIndex(
            s.dsn or None, s.table, encoder, weights=None,
            index_type=s.index_type if "index_type" in given else None, hnsw_m=s.hnsw_m,
            ef_construction=s.ef_construction, ef_search=s.ef_search if "ef_search" in given else None,
            calibrator=None if config.calibration == CalibrationConfig() else
            NormCalibrator(config.calibration.max_bins, config.calibration.min_per_bin),
        )
        _override_weights(index, config)
        return index
    if saved:
        index = NormIndex.load(str(s.path), encoder=encoder)
        _apply_store_settings(index, s)
        _check_calibration_settings(index, config)
        _override_weights(index, config)
        return index
    return NormIndex(
        encoder, weights=build_weights(config), index_type=s.index_type, pad_to=s.pad_to, hnsw_m=s.hnsw_m,
        ef_construction=s.ef_construction, ef_search=s.ef_search, nlist=s.nlist, nprobe=s.nprobe,
        calibrator=None if config.calibration == CalibrationConfig() else
        NormCalibrator(config.calibration.max_bins, config.calibration.min_per_bin),
    )


#: Store settings a saved index was built with: a file may repeat them, not change them.
_BUILD_SETTINGS = ("index_type", "pad_to", "hnsw_m", "ef_construction", "nlist")


def _check_calibration_settings(index: Any, config: NormRankConfig) -> None:
    """A ``calibration:`` key that differs from how the saved index was calibrated is a :class:`ConfigError`:
    it applies when an index is calibrated, and ``calibration: {max_bins: 3}`` on a saved index was ignored."""
    cal = config.calibration
    for name in sorted(cal.model_fields_set):
        value, saved = getattr(cal, name), getattr(index.calibrator, name)
        if value != saved:
            raise ConfigError(
                f"calibration.{name} is {value!r}, but the index saved at {config.store.path} was calibrated with "
                f"{saved!r}: it applies when an index is built; rebuild it (normrank index --config with this "
                f"file), or leave calibration.{name} out to open it as saved")


def _apply_store_settings(index: Any, store: Any) -> None:
    """The ``store:`` settings the file names, on the index saved at ``store.path``: the search-time ones
    (``ef_search``, ``nprobe``) are applied; a build-time one that differs from what the index was built
    with is refused. Both were silently ignored: a file's ``ef_search: 7`` searched with the saved 128."""
    given = store.model_fields_set
    # a setting the saved kind of index has no use for is ignored, as it is when a new index is built
    unused = {"flat": ("hnsw_m", "ef_construction", "nlist"), "hnsw": ("nlist",),
              "ivf": ("hnsw_m", "ef_construction")}.get(index.index_type, ())
    for name in _BUILD_SETTINGS:
        if name in unused:
            continue
        value = getattr(store, name)
        if name in given and value is not None and value != getattr(index, name):
            raise ConfigError(
                f"store.{name} is {value!r}, but the index saved at {store.path} was built with "
                f"{getattr(index, name)!r}: a build-time setting applies when an index is built; rebuild it "
                f"(normrank index), or leave store.{name} out to open it as saved")
    for name in ("ef_search", "nprobe"):
        if name in given:
            setattr(index, name, getattr(store, name))


def saved_index(config: NormRankConfig, calibration: str, section: str) -> Any:
    """The saved index at ``store.path`` when an adapter section's ``calibration`` wants it, else ``None``.

    ``candidates``: never; ``auto``: when one is saved there; ``index``: required, else ConfigError.
    """
    if calibration == "candidates":
        return None
    if config.store.backend == "pgvector":  # the table is the saved index (every process ranks alike from it)
        index = build_index(config)
        if len(index) or calibration == "index":
            return index
        index.close()  # an empty table: the re-ranker calibrates per call, and needs no connection
        return None
    path = config.store.path
    if path and Path(path).exists():
        return build_index(config)
    if calibration == "index":
        raise ConfigError(
            f"'{section}.calibration' is 'index' but store.path ({path!r}) holds no saved index; "
            "save one there, or choose one of: auto, index, candidates"
        )
    if path:  # 'auto' with a path that holds nothing: most likely a misplaced path, so say so
        import warnings

        warnings.warn(f"store.path ({path!r}) holds no saved index, so the {section} re-ranker calibrates on each "
                      "call's candidates and uses the configured weights; fix store.path to use the index, or "
                      f"set {section}.calibration: candidates to silence this", UserWarning, stacklevel=3)
    return None
