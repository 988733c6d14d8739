"""The evidence benchmark runs end to end on a tiny input, and its statistics are right.

The tiny run uses the real model and the real lexical files (skipped where ../shared/data
is absent); it checks the report's structure and that every number is finite, never
the values themselves (those are the benchmark's job, not a test's).
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parent.parent


def _load_script():
    spec = importlib.util.spec_from_file_location("normrank_bench_evidence", ROOT / "benchmarks" / "evidence.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ev = _load_script()


# ------------------------------------------------------------------ statistics (pure logic)
def test_spearman_matches_scipy_and_partial_removes_a_confounder():
    rng = np.random.default_rng(1)
    c = rng.normal(size=2000)
    x = c + 0.3 * rng.normal(size=2000)
    y = c + 0.3 * rng.normal(size=2000)
    assert ev.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-9)
    assert ev.spearman(x, y) > 0.8
    assert abs(ev.spearman(x, y, covars=c)) < 0.08  # x and y share nothing beyond c


def test_spearman_ci_brackets_the_estimate_and_narrows_with_n():
    rng = np.random.default_rng(2)
    x = rng.normal(size=400)
    y = -x + rng.normal(size=400)
    small = ev.spearman_ci(x[:50], y[:50], n_boot=300)
    large = ev.spearman_ci(x, y, n_boot=300)
    assert small.lo <= small.value <= small.hi and large.lo <= large.value <= large.hi
    assert large.hi < 0
    assert (large.hi - large.lo) < (small.hi - small.lo)


def test_cluster_accuracy_resamples_clusters_and_scores_ties_half():
    assert list(ev.credit(np.array([2, 1, 1]), np.array([1, 1, 2]))) == [1.0, 0.5, 0.0]
    correct = np.array([1, 1, 1, 1, 0, 0, 1, 0], float)
    clusters = ["a", "a", "a", "a", "b", "b", "c", "d"]
    st = ev.cluster_accuracy_ci(correct, clusters, n_boot=500)
    assert st.value == pytest.approx(5 / 8)
    assert 0.0 <= st.lo <= st.value <= st.hi <= 1.0
    assert st.hi - st.lo > 0.2  # four clusters only: the interval must be wide


def test_verdict_reads_the_direction_against_the_claim():
    assert ev.verdict(ev.Stat(-0.4, -0.5, -0.3), expected_sign=-1) == "holds"
    assert ev.verdict(ev.Stat(-0.05, -0.08, -0.02), expected_sign=-1) == "holds, weak"
    assert "opposite" in ev.verdict(ev.Stat(0.4, 0.3, 0.5), expected_sign=-1)
    assert ev.verdict(ev.Stat(0.1, -0.1, 0.3), expected_sign=1).startswith("not shown")
    assert ev.verdict(ev.Stat(0.7, 0.6, 0.8), expected_sign=1, chance=0.5) == "holds"
    assert "opposite" in ev.verdict(ev.Stat(0.3, 0.2, 0.4), expected_sign=1, chance=0.5)


# ------------------------------------------------------------------ WordNet reader
def _mini_wordnet(folder: Path) -> None:
    """Three nouns in WordNet's own file format: entity <- animal <- dog."""
    header = "  1 license header line\n"
    folder.joinpath("index.noun").write_text(
        header
        + "animal n 1 1 @ 1 0 00000200  \n"
        + "dog n 2 1 @ 2 0 00000300 00000200  \n"
        + "entity n 1 0 1 0 00000100  \n")
    folder.joinpath("data.noun").write_text(
        header
        + "00000100 03 n 01 entity 0 000 | that which exists\n"
        + "00000200 05 n 01 animal 0 001 @ 00000100 n 0000 | a living organism\n"
        + "00000300 05 n 02 dog 0 domestic_dog 0 001 @ 00000200 n 0000 | a canine\n")


def test_wordnet_depth_reads_the_wordnet_file_format(tmp_path):
    _mini_wordnet(tmp_path)
    depth = ev.wordnet_noun_depth(tmp_path)
    assert (depth("entity"), depth("animal"), depth("dog"), depth("cat")) == (0, 1, 2, None)
    assert ev.wordnet_noun_depth(tmp_path / "missing") is None


def test_wordnet_depth_on_the_installed_wordnet_when_present():
    depth = ev.wordnet_noun_depth(ev.DEFAULT_WORDNET)
    if depth is None:
        pytest.skip(f"no WordNet at {ev.DEFAULT_WORDNET} (apt-get install wordnet-base)")
    assert depth("entity") == 0
    assert depth("dog") > depth("animal") > depth("entity")


# ------------------------------------------------------------------ the tiny end-to-end run
@pytest.fixture(scope="module")
def lexical(data_dir) -> Path:
    path = data_dir / "lexical"
    if not path.is_dir():
        pytest.skip(f"no lexical resources in {data_dir}")
    return path


_NUM = re.compile(r"[+-]?\d+\.\d+|nan|inf", re.IGNORECASE)


def test_tiny_run_writes_a_complete_finite_report(lexical, encoder, tmp_path):
    rc = ev.main(["--tiny", "--data", str(lexical), "--out", str(tmp_path), "--wordnet", str(tmp_path / "none")],
                 encoder=encoder)
    assert rc == 0
    md = (tmp_path / "evidence.md").read_text(encoding="utf-8")
    for section in ("## Summary", "## 1. Frequency", "## 2. Specificity", "### WordNet depth",
                    "## 3. Uncertainty", "## Method notes"):
        assert section in md
    summary = md.split("## Summary", 1)[1].split("![summary]", 1)[0]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    claims = {line.split("|")[1].strip() for line in rows}
    assert claims == {"1 frequency", "2 specificity", "3 uncertainty"}
    assert any("BLESS" in r for r in rows) and any("BIBLESS" in r for r in rows)
    assert any("ChaosNLI" in r for r in rows) and any("concreteness" in r for r in rows)
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 8, line  # no stray pipe splits a cell
        numbers = _NUM.findall(cells[4] + " " + cells[5])
        assert len(numbers) == 6, line
        assert all(math.isfinite(float(v)) for v in numbers), line
        assert cells[7].split(" ")[0].strip("*") in {"holds", "holds,", "not", "opposite"}, line
    assert not re.search(r"\bnan\b", md, re.IGNORECASE)
    # WordNet was pointed at a missing folder: the depth analysis says it was skipped
    assert "WordNet not found" in md and "WordNet noun depth" not in summary
    for png in ("evidence_frequency.png", "evidence_specificity.png", "evidence_uncertainty.png",
                "evidence_summary.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_run_returns_finite_statistics_with_wordnet_when_installed(lexical, encoder, tmp_path):
    if ev.wordnet_noun_depth(ev.DEFAULT_WORDNET) is None:
        pytest.skip("no WordNet installed; the skip path is covered above")
    args = ev.build_parser().parse_args(["--tiny", "--data", str(lexical), "--out", str(tmp_path)])
    result = ev.run(args, encoder)
    assert any(r.dataset.startswith("WordNet") for r in result.rows)
    for r in result.rows:
        assert r.n >= 10
        assert r.raw.finite() and r.controlled.finite(), r.dataset
        assert all(s.finite() for s in r.extra.values()), r.dataset
    assert all(math.isfinite(v) for v in result.sanity.values())


def test_missing_data_folder_is_one_clear_error(tmp_path, capsys):
    assert ev.main(["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 1
    assert "does not exist" in capsys.readouterr().err
