"""Install hints that are true: every ``normrank[...]`` named anywhere is a real extra, and a
missing framework raises an ImportError that names the extra which installs it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MENTION = re.compile(r"normrank\[([A-Za-z0-9_,\- ]+)\]")
SCANNED = (".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".rst")
SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".venv", "node_modules"}

INTEGRATIONS = ROOT / "integrations"

#: adapter module -> (framework module it needs, folder in integrations/, distribution that installs it)
ADAPTERS = {
    "langchain_normrank": ("langchain_core", "langchain", "langchain-normrank"),
    "llama_index.postprocessor.normrank": ("llama_index.core", "llama-index", "llama-index-normrank"),
    "llama_index.vector_stores.normrank": ("llama_index.core", "llama-index", "llama-index-normrank"),
    "llama_index.embeddings.normrank": ("llama_index.core", "llama-index", "llama-index-normrank"),
    "llama_index.retrievers.normrank": ("llama_index.core", "llama-index", "llama-index-normrank"),
    "haystack_integrations.components.rankers.normrank": ("haystack", "haystack", "normrank-haystack"),
}
#: distribution -> the framework it must pin below its next major (or minor, for 0.x)
FRAMEWORKS = {"langchain-normrank": "langchain-core", "llama-index-normrank": "llama-index-core",
              "normrank-haystack": "haystack-ai"}


def _extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["optional-dependencies"]


def _dist(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def _mentions() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in ROOT.rglob("*"):
        if not path.is_file() or path.suffix not in SCANNED or SKIP_DIRS & set(path.relative_to(ROOT).parts):
            continue
        if any(part.endswith(".egg-info") for part in path.parts):
            continue
        if path.name == "CHANGELOG.md":  # history names the extras earlier versions had
            continue
        for match in MENTION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for name in match.group(1).split(","):
                found.setdefault(name.strip(), set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_mentioned_extra_exists():
    mentions = _mentions()
    assert {"eval", "pgvector", "ray"} <= set(mentions)  # the scan does see the install hints
    unknown = {name: sorted(files) for name, files in mentions.items() if name not in _extras()}
    assert not unknown, f"extras named in the sources but missing from pyproject.toml: {unknown}"


def test_the_scan_would_catch_a_wrong_extra():
    text = 'raise ImportError(\'pip install "normrank' + '[langchian]"\')'  # split: the scan reads this file
    assert [m.group(1) for m in MENTION.finditer(text)] == ["langchian"]
    assert "langchian" not in _extras()


def _integration(folder: str) -> dict:
    with open(INTEGRATIONS / folder / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]


@pytest.mark.parametrize("dist", sorted(FRAMEWORKS))
def test_each_integration_is_its_own_distribution_bounding_its_framework(dist):
    folder = next(f for _, f, d in ADAPTERS.values() if d == dist)
    project = _integration(folder)
    assert project["name"] == dist
    deps = {_dist(r): r for r in project["dependencies"]}
    assert "normrank" in deps
    spec = deps[FRAMEWORKS[dist]]
    assert "<" in spec, f"{spec}: bound the host framework's next breaking release"
    assert (INTEGRATIONS / folder / "tests").is_dir()


def test_requirements_dev_installs_every_integration():
    lines = (ROOT / "requirements-dev.txt").read_text().splitlines()
    for folder in {f for _, f, _ in ADAPTERS.values()}:
        assert any(line.startswith(f"-e ./integrations/{folder}") for line in lines), folder


def test_core_needs_no_framework_and_no_eval_library():
    with open(ROOT / "pyproject.toml", "rb") as fh:
        core = {_dist(r) for r in tomllib.load(fh)["project"]["dependencies"]}
    assert not core & {"langchain-core", "llama-index-core", "haystack-ai", "pytrec-eval-terrier", "bm25s"}


@pytest.mark.parametrize("package", sorted(ADAPTERS))
def test_missing_framework_raises_an_import_error_naming_the_distribution(package):
    module, _, dist = ADAPTERS[package]
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None  # as if the framework were not installed\n"
        "try:\n"
        f"    import {package}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert f"pip install {dist}" in out.stdout, out.stdout


@pytest.mark.parametrize("old, new", [("llama_index_normrank", "llama_index.postprocessor.normrank"),
                                      ("haystack_normrank", "haystack_integrations.components.rankers.normrank")])
def test_old_import_paths_still_work_with_a_deprecation_warning(old, new):
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            f"    import {old} as old_mod\n"
            f"import {new} as new_mod\n"
            "print(any(issubclass(w.category, DeprecationWarning) for w in caught))\n"
            "print(all(getattr(old_mod, n) is getattr(new_mod, n) for n in new_mod.__all__))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"], out.stdout


def test_import_normrank_does_not_import_any_framework():
    code = ("import sys, normrank\n"
            "print(sorted(m for m in ('langchain_core', 'llama_index', 'haystack', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
