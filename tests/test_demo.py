"""The README's first command: `normrank demo` fits on bundled judged queries, prints the verdict, and
shows side by side where a blend moves a result and why, never a blend that ranks its queries worse."""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest

from normrank import NormIndex, Weights
from normrank.cli import main
from normrank.datasets import demo_qrels, demo_rows
from normrank.metrics import per_query


@pytest.fixture(scope="module")
def demo(tmp_path_factory, encoder):
    out = tmp_path_factory.mktemp("demo") / "demo-index"
    buf = io.StringIO()  # capsys is function-scoped; one demo run serves every test here
    with contextlib.redirect_stdout(buf):
        code = main(["demo", "--out", str(out)])
    return code, buf.getvalue(), out


def _ndcg(index: NormIndex, weights: Weights) -> float:
    queries = {q["_id"]: q["text"] for q in demo_rows("demo_queries.jsonl")}
    qrels = demo_qrels()
    old = index.weights
    index.set_weights(weights)
    try:
        run = {q: {h.id: h.score for h in index.search(queries[q], 10)} for q in qrels}
    finally:
        index.set_weights(old)
    return float(np.mean(list(per_query(qrels, run, "ndcg@10").values())))


def test_bundled_judgements_are_complete():
    queries = {q["_id"] for q in demo_rows("demo_queries.jsonl")}
    qrels = demo_qrels()
    docs = {d["_id"] for d in demo_rows()}
    assert set(qrels) == queries and len(queries) >= 30
    assert all(d in docs and g in (1, 2) for judged in qrels.values() for d, g in judged.items())
    assert all(2 in judged.values() for judged in qrels.values())  # every query has an answer


def test_demo_prints_the_cross_validated_verdict(demo):
    code, text, out = demo
    assert code == 0
    assert re.search(r"fit: 5-fold cross-validation over the 40 queries", text)
    verdict = [x for x in text.splitlines() if x.startswith("verdict: ")]
    assert len(verdict) == 1
    index = NormIndex.load(out)
    assert len(index) == 48 and index.query_calibrator is not None
    if "plain cosine kept" in verdict[0]:
        assert index.weights.is_cosine  # the saved index uses what the fit chose
    else:
        assert re.search(r"p=[0-9.e-]+", verdict[0]) and not index.weights.is_cosine


def test_the_shown_blend_is_never_worse_than_cosine_on_the_demo_queries(demo):
    code, text, out = demo
    m = re.search(r"(the fitted blend|the best blend on all judged queries \(not adopted\)): "
                  r"(additive|multiplicative) a=([-+][0-9.e-]+) b=([-+][0-9.e-]+) \((calibrated|raw) feature\)", text)
    if m is None:
        assert "no blend to show" in text
        return
    shown = Weights(a=float(m.group(3)), b=float(m.group(4)), mode=m.group(2), feature=m.group(5))
    index = NormIndex.load(out)
    assert _ndcg(index, shown) >= _ndcg(index, Weights()) - 1e-9  # measured here, not read from the output
    stated = re.search(r"nDCG@10 on the 40 judged queries: cosine ([0-9.]+), blend ([0-9.]+) \((\d+) better, "
                       r"(\d+) worse", text)
    assert stated and float(stated.group(2)) >= float(stated.group(1))
    assert float(stated.group(1)) == pytest.approx(_ndcg(index, Weights()), abs=1e-4)
    assert "WORSE" not in text


def test_every_moved_hit_is_explained_and_adds_up(demo):
    _, text, _ = demo
    blocks = [b for b in text.split("\n\n") if b.startswith("query: ")]
    for block in blocks:
        rows = [x for x in block.splitlines() if re.match(r"  \d ", x)]
        for row in rows:
            right = row.split("|")[1].split()
            cosine, g, w, term, score = (float(x) for x in right[-5:])
            assert term == pytest.approx(w * g, abs=2e-3) and score == pytest.approx(cosine + term, abs=2e-3)
        for why in re.findall(r"why: (\S+) (rose|fell) from (\d+) to (\d+)", block):
            assert (why[1] == "rose") == (int(why[2]) > int(why[3]))


def test_demo_with_your_own_query_and_weight(tmp_path, capsys, encoder):
    """A hand weight is labelled as yours and measured; a harmful one is called out, not presented as normrank."""
    assert main(["demo", "--out", str(tmp_path / "d"), "--query", "How high is the tallest mountain?", "-k", "2",
                 "--a", "-0.03"]) == 0
    text = capsys.readouterr().out
    assert "your blend: additive a=-0.03 b=+0" in text
    stated = re.search(r"cosine ([0-9.]+), blend ([0-9.]+)", text)
    worse = float(stated.group(2)) < float(stated.group(1))
    assert ("WORSE than plain cosine" in text) == worse
    assert "query: How high is the tallest mountain?" in text and "geo-2" in text and "geo-1" in text


def test_cli_errors_are_one_line(tmp_path, capsys):
    """``-k 0`` is a usage error the parser catches (exit 2, as for ``search``; docs/guarantees.md)."""
    code = main(["demo", "--out", str(tmp_path / "x"), "-k", "0", "--query", "stars"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "must be a positive integer, got 0" in err[0]


def test_a_plain_cosine_blend_of_yours_is_called_yours(tmp_path, capsys, encoder):
    """``--a 0 --b 0`` said "plain cosine was also the best ranking on the judged queries", which the run
    without them contradicts (the best blend there beats cosine on those queries)."""
    assert main(["demo", "--out", str(tmp_path / "d"), "--a", "0", "--b", "0"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "no blend to show: the blend you gave is plain cosine (a = 0, b = 0)"
