"""ONNX Runtime for the transformer inside a :class:`normrank.RawEncoder` (``backend="onnx"`` / ``"onnx-int8"``).

Why: indexing is dominated by encoding. On the benchmark machine (2 AMD EPYC cores with AVX-512
VNNI) the int8 model encoded 256 Cranfield abstracts 2.3x as fast as torch; plain-cosine nDCG@10
moved by -0.0002 / +0.0071 / -0.0012 on Cranfield / CISI / SciFact, but raw norms by up to 8% and
the blend by up to -0.0095, so it is opt-in (``benchmarks/results/onnx.md``). The fp32 graph
computes torch's vectors at 1.13x.

Why not sentence-transformers' own ``backend="onnx"``: it needs optimum, whose ONNX package pins
transformers below 4.56, below what normrank runs with. This module needs only ``onnxruntime``
and ``onnx`` (``pip install 'normrank[onnx]'``): torch exports the transformer once, ONNX Runtime
quantises it, and the files are cached. Tokenisation, pooling and every module after the
transformer stay sentence-transformers' own, so token counts and pooling are unchanged.

Every session is checked against torch on texts of different lengths when it is built: a stale
or broken file is exported again, and a model that still disagrees is refused by name.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from normrank.encoders import preprocess
from normrank.errors import InvalidArgumentError, ModelLoadError

logger = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = ("torch", "onnx", "onnx-int8")
#: Bumped whenever the exported graph changes, so old cached files are not reused.
EXPORT_VERSION = 1
OPSET = 17
#: int8: dynamic quantisation of the MatMuls only (signed per-channel symmetric weights, unsigned
#: activations: the ``avx512_vnni`` configuration of optimum and sentence-transformers, minus the
#: embedding lookup). Quantising the embedding table too (ONNX Runtime's default op list) saves memory,
#: not time (both 2.4-2.5x torch), and moved nDCG@10 further on Cranfield: -0.0056 against -0.0002.
QUANT_OPS: tuple[str, ...] = ("MatMul",)
QUANT_OPTIONS = {"WeightSymmetric": True, "ActivationSymmetric": False}
#: Agreement with torch on the probe texts that a session must show before it is used: the fp32 graph
#: computes the same function (measured 6e-7 relative), int8 rounds weights and activations (measured
#: cosine >= 0.99 and norms within 8% on Cranfield abstracts); anything far outside is a broken file.
_TOLERANCE = {"onnx": (0.9999, 1e-3), "onnx-int8": (0.95, 0.25)}  # (min cosine, max relative norm change)
_PROBE = (
    "a",
    "the cat sat on the mat",
    ("Retrieval systems rank documents by the similarity of their embeddings to the query, and the norm of "
     "a raw embedding says how specific the text is."),
)


def reduce_range(cpuinfo: str | None = None) -> bool:
    """Quantise weights to 7 bits where the CPU has no VNNI. Without VNNI, x86 multiplies unsigned
    activations by signed weights in 16-bit pairs that can saturate, which ONNX Runtime's quantisation
    notes avoid with a reduced range; with VNNI (the benchmark machine) the full 8 bits are exact."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    return not ({"avx512_vnni", "avx_vnni"} & flags)


def check_backend(backend: Any, device: str) -> str:
    """The backend name, refused at construction if unknown or paired with a device it cannot use."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise InvalidArgumentError(f"unknown encoder backend {backend!r}; choose one of {list(BACKENDS)}")
    if backend != "torch" and str(device) != "cpu":
        raise InvalidArgumentError(f"backend {backend!r} runs on the CPU; got device {device!r} (use backend 'torch')")
    return backend


def cache_root() -> Path:
    """Where exported models are kept: ``onnx/`` in normrank's cache (``$NORMRANK_CACHE``, else
    ``~/.cache/normrank``), beside the cached encodings."""
    from normrank.cache import cache_dir

    return cache_dir() / "onnx"


class OnnxTransformer:
    """The transformer of a sentence-transformers model as an ONNX Runtime session.

    ``token_embeddings(features)`` takes what the model's ``preprocess``/``tokenize`` returns and gives
    what its Transformer module would put under ``token_embeddings``. ``InferenceSession.run`` may be
    called from several threads at once.
    """

    def __init__(self, session: Any, input_names: list[str]) -> None:
        self.session = session
        self.input_names = input_names

    def token_embeddings(self, features: Mapping[str, Any]) -> np.ndarray:
        feed = {k: np.ascontiguousarray(features[k].cpu().numpy(), dtype=np.int64) for k in self.input_names}
        return self.session.run(None, feed)[0]


def load(model: Any, backend: str, weights_key: str, threads: int) -> OnnxTransformer:
    """The session for ``model`` (a sentence-transformers model without Normalize), exported and cached."""
    ort = _import_runtime(backend)
    transformer, hf = _transformer_of(model)
    names = _input_names(model, hf)
    folder, temporary = _folder(weights_key)
    try:
        return _session(ort, model, transformer, hf, names, backend, folder, threads)
    finally:
        if temporary:  # the session holds the model in memory; an 87 MB folder per process was left in /tmp
            shutil.rmtree(folder, ignore_errors=True)


def _session(ort: Any, model: Any, transformer: Any, hf: Any, names: list[str], backend: str, folder: Path,
             threads: int) -> OnnxTransformer:
    for attempt in (0, 1):
        path = _model_file(model, hf, names, backend, folder, fresh=attempt == 1)
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # a truncated or foreign file: export again once
            if attempt:
                raise ModelLoadError(f"ONNX Runtime could not load {path}: {exc}") from exc
            continue
        onnx_model = OnnxTransformer(session, names)
        problem = _disagreement(model, transformer, onnx_model, backend)
        if problem is None:
            return onnx_model
        if attempt:
            raise ModelLoadError(f"the {backend} export of this model disagrees with torch ({problem}); "
                                 "use backend 'torch' for it")
        logger.warning("cached %s model at %s disagrees with torch (%s); exporting it again", backend, path, problem)
    raise AssertionError("unreachable")  # pragma: no cover


def _import_runtime(backend: str) -> Any:
    try:
        import onnx  # noqa: F401  (the exporter and the quantiser need it)
        import onnxruntime
    except ImportError as exc:
        raise ModelLoadError(f"encoder backend {backend!r} needs onnxruntime and onnx: "
                             f"pip install 'normrank[onnx]' ({exc})") from exc
    return onnxruntime


def _transformer_of(model: Any) -> tuple[Any, Any]:
    first = model[0] if len(model) else None
    hf = getattr(first, "auto_model", None)
    if hf is None:
        raise ModelLoadError("the ONNX backends need a sentence-transformers model whose first module is a "
                             f"Transformer; this one starts with {type(first).__name__}")
    return first, hf


def _input_names(model: Any, hf: Any) -> list[str]:
    import inspect

    features = preprocess(model, ["a"])
    accepted = set(inspect.signature(hf.forward).parameters)
    names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in features and k in accepted]
    if "input_ids" not in names or "attention_mask" not in names:
        raise ModelLoadError(f"the ONNX backends need input_ids and attention_mask; the tokenizer gives {list(features)}")
    return names


def _folder(weights_key: str) -> tuple[Path, bool]:
    """The cache folder of this model's exports, and whether it is a temporary one (the cache is not writable)."""
    key = hashlib.sha256(f"{weights_key}|export={EXPORT_VERSION}|opset={OPSET}".encode()).hexdigest()[:20]
    folder = cache_root() / key
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
        return folder, False
    except OSError as exc:
        tmp = Path(tempfile.mkdtemp(prefix="normrank-onnx-"))
        logger.warning("cannot write the ONNX cache at %s (%s); exporting into %s, removed once loaded "
                       "(set NORMRANK_CACHE to a writable folder, or every process exports again)", folder, exc, tmp)
        return tmp, True


def _model_file(model: Any, hf: Any, names: list[str], backend: str, folder: Path, *, fresh: bool) -> Path:
    fp32 = folder / "model.onnx"
    if fresh or not fp32.is_file():
        _export(model, hf, names, fp32)
    if backend == "onnx":
        return fp32
    seven_bits = reduce_range()
    settings = repr((QUANT_OPS, sorted(QUANT_OPTIONS.items()), seven_bits))
    int8 = folder / f"model-int8-{hashlib.sha256(settings.encode()).hexdigest()[:8]}.onnx"
    if fresh or not int8.is_file():
        _quantize(fp32, int8, seven_bits)
    return int8


def _export(model: Any, hf: Any, names: list[str], target: Path) -> None:
    """Trace the transformer with eager attention into ``target`` (atomically: no half-written file is
    ever seen under the final name). Eager attention exports to plain MatMul/Softmax, which ONNX Runtime
    fuses and quantises: int8 ran 53 texts/s against 41 with the SDPA trace on the benchmark machine."""
    import torch

    class _Body(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: Any) -> Any:
            return self.inner(**dict(zip(names, inputs, strict=True)), return_dict=True).last_hidden_state

    features = preprocess(model, ["hello world", "a second, longer example sentence"])
    example = tuple(features[k].cpu() for k in names)
    axes = {k: {0: "batch", 1: "tokens"} for k in [*names, "token_embeddings"]}
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    setter = getattr(hf, "set_attn_implementation", None)
    old = getattr(hf.config, "_attn_implementation", None)
    try:
        if setter is not None and old not in (None, "eager"):
            setter("eager")
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer's notes on shape-dependent Python branches: the trace is checked against torch on
            # padded batches of other lengths (_disagreement) instead
            warnings.simplefilter("ignore")
            kwargs: dict[str, Any] = {"dynamo": False} if "dynamo" in _export_params(torch) else {}
            torch.onnx.export(_Body(hf).eval(), example, str(tmp), input_names=names,
                              output_names=["token_embeddings"], dynamic_axes=axes, opset_version=OPSET, **kwargs)
        os.replace(tmp, target)
    except Exception as exc:
        raise ModelLoadError(f"could not export the model to ONNX: {type(exc).__name__}: {exc}") from exc
    finally:
        if setter is not None and old not in (None, "eager"):
            setter(old)
        tmp.unlink(missing_ok=True)


def _export_params(torch: Any) -> set[str]:
    import inspect

    return set(inspect.signature(torch.onnx.export).parameters)


def _quantize(src: Path, target: Path, seven_bits: bool) -> None:
    """Dynamic int8 with :data:`QUANT_OPS`, :data:`QUANT_OPTIONS` and 7-bit weights if ``seven_bits``
    (:func:`reduce_range`; all named in the file, so a change of settings, or a cache shared with another
    CPU, never reuses an old file)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # the quantiser logs a pre-processing tip on the root logger
    try:
        quantize_dynamic(str(src), str(tmp), per_channel=True, reduce_range=seven_bits, weight_type=QuantType.QInt8,
                         op_types_to_quantize=list(QUANT_OPS), extra_options=dict(QUANT_OPTIONS))
        os.replace(tmp, target)
    except Exception as exc:
        raise ModelLoadError(f"could not quantise the ONNX model: {type(exc).__name__}: {exc}") from exc
    finally:
        root.setLevel(level)
        tmp.unlink(missing_ok=True)


def _disagreement(model: Any, transformer: Any, onnx_model: OnnxTransformer, backend: str) -> str | None:
    """``None`` if the session's sentence vectors on the probe texts (one padded batch) match torch's."""
    import torch

    features = dict(preprocess(model, list(_PROBE)))
    with torch.inference_mode():
        ref = sentence_vectors(model, dict(transformer(dict(features))))
        got = sentence_vectors(model, {**features, "token_embeddings": torch.from_numpy(
            onnx_model.token_embeddings(features))})
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    rn, gn = np.linalg.norm(ref64, axis=1), np.linalg.norm(got64, axis=1)
    if not np.all(np.isfinite(gn)) or np.any(gn <= 0):
        return "non-finite or zero vectors"
    cos = float(np.min(np.sum(ref64 * got64, axis=1) / (rn * gn)))
    rel = float(np.max(np.abs(gn - rn) / rn))
    min_cos, max_rel = _TOLERANCE[backend]
    if cos < min_cos or rel > max_rel:
        return f"min cosine {cos:.5f}, max relative norm change {rel:.2e}"
    return None


def sentence_vectors(model: Any, features: dict[str, Any]) -> np.ndarray:
    """Run the modules after the transformer (pooling, dense, ...) on ``features`` holding
    ``token_embeddings``: sentence-transformers' own code, so pooling equals the torch path's."""
    for module in list(model)[1:]:
        features = module(features)
    return features["sentence_embedding"].float().cpu().numpy()
