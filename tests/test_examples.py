"""The framework examples run as written, print a sensible ranking, and appear verbatim in the README."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*_example.py"))
LINE = re.compile(r"^(?P<score>-?\d+\.\d{3}) \(cos (?P<cos>-?\d+\.\d{3})")


def test_there_is_one_example_per_framework():
    assert {p.name for p in EXAMPLES} >= {"langchain_example.py", "llamaindex_example.py", "haystack_example.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_ranks_the_relevant_text_first(path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    assert len(lines) == 2, proc.stdout
    parsed = [LINE.match(x) for x in lines]
    assert all(parsed), proc.stdout
    scores = [float(m["score"]) for m in parsed]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0 <= float(m["cos"]) <= 1.0 for m in parsed)
    # "How do plants turn light into energy?" -> photosynthesis first
    assert "Photosynthesis" in lines[0], proc.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_readme_shows_the_example_verbatim(path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = path.read_text(encoding="utf-8").strip()
    assert code in readme, f"README.md does not contain {path.name} verbatim"
