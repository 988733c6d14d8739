"""normrank.metrics equals trec_eval (pytrec_eval, which the dev install has) on real runs, ties included,
and the core needs neither pytrec-eval nor bm25s: without them `fit` works and `eval` names the extra."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from normrank.errors import InvalidArgumentError
from normrank.metrics import METRICS, per_query, ranked

pytrec_eval = pytest.importorskip("pytrec_eval")

_TREC = {"ndcg@10": "ndcg_cut_10", "ndcg@100": "ndcg_cut_100", "recall@10": "recall_10",
         "recall@100": "recall_100", "map": "map", "mrr": "recip_rank", "p@5": "P_5"}


def _trec(qrels, run, metric):
    ev = pytrec_eval.RelevanceEvaluator({q: dict(d) for q, d in qrels.items()},
                                        {"ndcg_cut", "recall", "map", "recip_rank", "P"})
    res = ev.evaluate({q: dict(d) for q, d in run.items()})
    return {q: res.get(q, {}).get(_TREC[metric], 0.0) for q in qrels if qrels[q]}


def _assert_equal(qrels, run):
    for metric in _TREC:
        mine, ref = per_query(qrels, run, metric), _trec(qrels, run, metric)
        assert mine.keys() == ref.keys()
        worst = max(abs(mine[q] - ref[q]) for q in ref)
        assert worst < 1e-12, (metric, worst)


def _cosine_run(qv, dv, ids, qids, depth, decimals=None):
    """Cosine scores of the top ``depth``; rounded to ``decimals`` to force many exact ties."""
    q = qv / np.linalg.norm(qv, axis=1, keepdims=True)
    d = dv / np.linalg.norm(dv, axis=1, keepdims=True)
    sims = (q @ d.T).astype(np.float64)
    if decimals is not None:
        sims = np.round(sims, decimals)
    run = {}
    for qi, qid in enumerate(qids):
        top = np.argsort(-sims[qi])[:depth]
        run[qid] = {ids[j]: float(sims[qi, j]) for j in top}
    return run


def test_equal_to_trec_eval_on_cranfield_cosine_runs(cranfield, encoder):
    ds = cranfield.data
    qids = [q for q in ds.qrels if ds.queries[q].strip()]
    qv = encoder.encode([ds.queries[q] for q in qids])
    qrels = {q: ds.qrels[q] for q in qids}  # graded 0..4, with zero-graded rows
    for decimals in (None, 2, 1):  # exact scores, then coarse ones with ties everywhere
        run = _cosine_run(qv, cranfield.vectors, cranfield.ids, qids, 100, decimals)
        _assert_equal(qrels, run)
    # ties really happen in the coarse run, so the tie-break is what is being compared
    coarse = _cosine_run(qv, cranfield.vectors, cranfield.ids, qids, 100, 1)
    assert any(len(set(r.values())) < len(r) for r in coarse.values())


def test_equal_to_trec_eval_on_the_demo_collection(demo_encoded):
    from normrank.datasets import demo_rows

    rows = demo_rows()
    ids = [r["_id"] for r in rows]
    vecs, _ = demo_encoded
    qrels = {f"t{i}": {ids[i]: 1 + i % 3, ids[(i + 1) % len(ids)]: 0} for i in range(len(ids))}
    for decimals in (None, 2):
        _assert_equal(qrels, _cosine_run(vecs, vecs, ids, list(qrels), 20, decimals))


def test_ties_go_to_the_larger_doc_id_as_in_trec_eval():
    # all three tie: trec_eval orders them c, b, a whatever the order given
    assert ranked({"a": 1.0, "c": 1.0, "b": 1.0}) == ["c", "b", "a"]
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "c": 1.0, "b": 1.0}}
    assert per_query(qrels, run, "mrr")["q"] == pytest.approx(1 / 3) == _trec(qrels, run, "mrr")["q"]


def test_edge_cases_match_trec_eval():
    qrels = {"none-relevant": {"a": 0, "b": -1}, "missing": {"a": 2}, "neg": {"a": -1, "b": 2, "c": 1}, "empty": {}}
    run = {"none-relevant": {"a": 1.0}, "neg": {"a": 3.0, "b": 2.0, "x": 2.0}}
    _assert_equal(qrels, run)
    assert "empty" not in per_query(qrels, run)  # no judgments: not a query of the evaluation
    assert per_query(qrels, run)["missing"] == 0.0  # judged but not in the run: counted as 0


def test_any_cutoff_and_unknown_metric():
    qrels = {"q": {"a": 1, "b": 1}}
    run = {"q": {"a": 3.0, "x": 2.0, "b": 1.0}}
    assert per_query(qrels, run, "recall@2")["q"] == 0.5
    assert per_query(qrels, run, "p@3")["q"] == pytest.approx(2 / 3)
    assert set(METRICS) <= {"ndcg@10", "ndcg@100", "recall@10", "recall@100", "map", "mrr"}
    with pytest.raises(InvalidArgumentError, match="unknown metric"):
        per_query(qrels, run, "ndcg@0")
    with pytest.raises(ValueError, match="unknown metric"):
        per_query(qrels, run, "bpref")


# ------------------------------------------------------------------ the core without the eval extra
_BLOCK = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None  # as if not installed\n"


def _run(code: str, names: tuple[str, ...]) -> subprocess.CompletedProcess:
    src = _BLOCK.format(names=list(names)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=600)


def test_fit_works_without_pytrec_eval_and_bm25s(tmp_path):
    code = """
    import json
    import numpy as np
    from normrank import NormIndex
    from normrank.datasets import demo_rows
    rows = demo_rows()
    texts = [r["title"] + "\\n" + r["text"] for r in rows]
    index = NormIndex.from_texts(texts, ids=[r["_id"] for r in rows])
    queries = {f"q{i}": r["title"] for i, r in enumerate(rows)}
    qrels = {f"q{i}": {r["_id"]: 1} for i, r in enumerate(rows)}
    report = index.fit(queries, qrels, features=["calibrated"])
    import sys
    assert "pytrec_eval" not in sys.modules or sys.modules["pytrec_eval"] is None
    print(json.dumps({"n": report.n_queries, "cos": report.cosine_ndcg}))
    """
    done = _run(code, ("pytrec_eval", "bm25s"))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["n"] > 10 and 0.5 < out["cos"] <= 1.0  # known-item search by title finds most passages


@pytest.mark.parametrize("missing", ["bm25s", "pytrec_eval"])
def test_eval_without_the_extra_names_it(tmp_path, missing):
    from normrank.datasets import demo_rows

    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    rows = demo_rows()[:12]
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": r["_id"], "text": r["text"]}) + "\n"
                                                 for r in rows))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": r["title"]}) + "\n"
                                                  for i, r in enumerate(rows)))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\t{r['_id']}\t1\n" for i, r in enumerate(rows)))
    code = f"""
    from normrank.cli import main
    raise SystemExit(main(["eval", {str(folder)!r}, "--folds", "2", "--json", "--no-progress"]))
    """
    done = _run(code, (missing,))
    if missing == "bm25s":  # the BM25 baseline is in the extra: one line naming it, no traceback
        assert done.returncode == 1
        assert 'pip install "normrank[eval]"' in done.stderr and "bm25s" in done.stderr
        assert "Traceback" not in done.stderr
    else:  # nothing needs pytrec_eval any more: eval runs and scores with normrank.metrics
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads(done.stdout)
        assert result["n_queries"] == 12 and 0.0 < result["runs"]["cosine"]["ndcg@10"] <= 1.0


def test_missing_bm25s_is_a_named_import_error():
    code = """
    from normrank.errors import MissingExtraError, NormRankError
    from normrank.evaluation import require_bm25s
    try:
        require_bm25s()
    except MissingExtraError as exc:
        assert isinstance(exc, ImportError) and isinstance(exc, NormRankError)
        print(exc)
    else:
        raise SystemExit("no error")
    """
    done = _run(code, ("bm25s",))
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'pip install "normrank[eval]"' in done.stdout
