"""The README's first command: the demo runs on embedded defaults and shows both rankings."""

from __future__ import annotations

from normrank import NormIndex
from normrank.cli import main


def test_demo_runs_saves_and_explains(tmp_path, capsys):
    out = tmp_path / "demo-index"
    assert main(["demo", "--out", str(out), "--query", "How high is the tallest mountain?", "-k", "2"]) == 0
    text = capsys.readouterr().out
    assert "cosine ranking" in text and "normrank ranking" in text
    assert "geo-2" in text and "geo-1" in text  # Everest and the generic mountains passage
    index = NormIndex.load(out)
    assert len(index) == 48


def test_cli_errors_are_one_line(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path / "x"), "-k", "0", "--query", "stars"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "k must be a positive integer" in err[0]
