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

#: adapter package -> (framework module it needs, extra that installs it, distribution in that extra)
ADAPTERS = {
    "langchain_normrank": ("langchain_core", "langchain", "langchain-core"),
    "llama_index_normrank": ("llama_index", "llamaindex", "llama-index-core"),
    "haystack_normrank": ("haystack", "haystack", "haystack-ai"),
}


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
        for match in MENTION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for name in match.group(1).split(","):
                found.setdefault(name.strip(), set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_mentioned_extra_exists():
    mentions = _mentions()
    assert {"langchain", "llamaindex", "haystack"} <= set(mentions)  # the scan does see the adapters' hints
    unknown = {name: sorted(files) for name, files in mentions.items() if name not in _extras()}
    assert not unknown, f"extras named in the sources but missing from pyproject.toml: {unknown}"


def test_the_scan_would_catch_a_wrong_extra():
    text = 'raise ImportError(\'pip install "normrank' + '[langchian]"\')'  # split: the scan reads this file
    assert [m.group(1) for m in MENTION.finditer(text)] == ["langchian"]
    assert "langchian" not in _extras()


@pytest.mark.parametrize("package", sorted(ADAPTERS))
def test_each_adapter_extra_installs_its_framework(package):
    _, extra, dist = ADAPTERS[package]
    assert dist in {_dist(r) for r in _extras()[extra]}
    spec = next(r for r in _extras()[extra] if _dist(r) == dist)
    assert "<" in spec, f"{spec}: bound the host framework's major version"


def test_all_includes_every_adapter_extra():
    extras = _extras()
    for package, (_, extra, _dist_name) in ADAPTERS.items():
        missing = set(extras[extra]) - set(extras["all"])
        assert not missing, f"[all] lacks {sorted(missing)} from [{extra}] ({package})"


@pytest.mark.parametrize("package", sorted(ADAPTERS))
def test_missing_framework_raises_an_import_error_naming_the_extra(package):
    module, extra, _ = ADAPTERS[package]
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
    assert f'pip install "normrank[{extra}]"' in out.stdout, out.stdout


def test_import_normrank_does_not_import_any_framework():
    code = ("import sys, normrank\n"
            "print(sorted(m for m in ('langchain_core', 'llama_index', 'haystack', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
