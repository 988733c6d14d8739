"""normrank.evaluation: protocol choice, qrels reading, exact top-k, paired tests, and the runs on Cranfield."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from normrank.errors import DatasetError, InvalidArgumentError
from normrank.evaluation import (
    Evaluator,
    Protocol,
    choose_protocol,
    eval_qids,
    exact_topk,
    load_collection,
    paired,
    read_qrels,
    scores,
)


def _beir(tmp_path, splits=("test",)):
    (tmp_path / "qrels").mkdir(parents=True)
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    for s in splits:
        (tmp_path / "qrels" / f"{s}.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return tmp_path


# ------------------------------------------------------------------ protocol
def test_single_split_defaults_to_five_fold_cv(tmp_path):
    p = choose_protocol(_beir(tmp_path))
    assert p == Protocol("test", folds=5)
    assert p.name == "5-fold cv on test"


def test_train_and_test_default_to_train_then_test(tmp_path):
    p = choose_protocol(_beir(tmp_path, ("test", "train")))
    assert (p.split, p.train_split, p.folds) == ("test", "train", None)
    assert choose_protocol(tmp_path, folds=3).folds == 3  # an explicit choice wins


def test_protocol_errors_name_the_problem(tmp_path):
    folder = _beir(tmp_path, ("test", "train"))
    with pytest.raises(InvalidArgumentError, match="not both"):
        choose_protocol(folder, train_split="train", folds=5)
    with pytest.raises(DatasetError, match="available splits"):
        choose_protocol(folder, split="dev")
    with pytest.raises(InvalidArgumentError, match="both 'test'"):
        choose_protocol(folder, train_split="test")
    with pytest.raises(InvalidArgumentError, match=r"folds must be in \[2, 1000\], got 1"):
        choose_protocol(folder, folds=1)
    # 2.5 ran 2 folds under the label "2.5-fold"; -1 failed late inside NumPy, unnamed
    with pytest.raises(InvalidArgumentError, match="folds must be an integer"):
        choose_protocol(folder.parent / folder.name, split="test", folds=2.5)
    for seed in (-1, 1.5):
        with pytest.raises(InvalidArgumentError, match="seed must be"):
            choose_protocol(folder, split="test", folds=3, seed=seed)
    with pytest.raises(DatasetError, match="no such folder"):
        choose_protocol(tmp_path / "missing")


def test_only_split_is_used_when_there_is_no_test(tmp_path):
    assert choose_protocol(_beir(tmp_path, ("dev",))).split == "dev"


# ------------------------------------------------------------------ qrels
def test_read_qrels_accepts_beir_and_trec_layouts(tmp_path):
    beir = tmp_path / "a.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t2\nq2\td1\t0\n")
    trec = tmp_path / "b.txt"
    trec.write_text("q1 0 d1 1\nq1 0 d2 2\nq2 0 d1 0\n")
    want = {"q1": {"d1": 1, "d2": 2}, "q2": {"d1": 0}}
    assert read_qrels(beir) == want
    assert read_qrels(trec) == want


def test_fit_and_eval_read_one_qrels_file_alike(tmp_path):
    """``fit`` (``read_qrels``) split on white space and ``eval`` (``load_beir``) on tabs: an id with a
    space (``normrank index`` names files ``my notes/a.txt``) became two fields for ``fit``, and TREC's
    columns read as BEIR's in ``eval``. One reader now: both give the same judgments."""
    import json

    from normrank.datasets import load_beir

    folder = tmp_path / "coll"
    (folder / "qrels").mkdir(parents=True)
    docs = {"my notes/d0.txt": "rivers", "my notes/d1.txt": "mountains", "184": "wings"}
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": q}) + "\n" for q in ("q0", "1")))
    layouts = {
        "beir": "query-id\tcorpus-id\tscore\nq0\tmy notes/d0.txt\t1\nq0\tmy notes/d1.txt\t0\n1\t184\t3\n",
        "beir, extra column": "q0\tmy notes/d0.txt\t1\tx\nq0\tmy notes/d1.txt\t0\tx\n1\t184\t3\tx\n",
        "trec, tabs": "q0\t0\tmy notes/d0.txt\t1\nq0\t0\tmy notes/d1.txt\t0\n1\t0\t184\t3\n",
    }
    want = {"q0": {"my notes/d0.txt": 1, "my notes/d1.txt": 0}, "1": {"184": 3}}
    for name, text in layouts.items():
        (folder / "qrels" / "test.tsv").write_text(text)
        assert read_qrels(folder / "qrels" / "test.tsv") == want, name
        assert load_beir(folder).qrels == want, name
    (folder / "qrels" / "test.tsv").write_text("1 0 184 3\n")  # TREC with spaces: ids without spaces
    assert read_qrels(folder / "qrels" / "test.tsv") == load_beir(folder).qrels == {"1": {"184": 3}}


def test_read_qrels_names_the_bad_line(tmp_path):
    bad = tmp_path / "q.tsv"
    bad.write_text("q1\td1\t1\nq2\td2\n")
    with pytest.raises(DatasetError, match=r"q\.tsv:2"):
        read_qrels(bad)
    bad.write_text("q1\td1\tyes\n")
    with pytest.raises(DatasetError, match="'yes' is not a number"):
        read_qrels(bad)
    with pytest.raises(DatasetError, match="no qrels file"):
        read_qrels(tmp_path / "none.tsv")
    # a fractional grade became 0 in silence, and a pair judged twice kept the last grade
    bad.write_text("q1\td1\t1\nq1\td2\t0.7\n")
    with pytest.raises(DatasetError, match=r"q\.tsv:2: score '0\.7' is not a whole number"):
        read_qrels(bad)
    bad.write_text("q1\td1\t1\nq1\td2\t2.0\nq1\td1\t0\n")
    with pytest.raises(DatasetError, match=r"q\.tsv:3 judges query 'q1' and document 'd1' again \(first on line 1\)"):
        read_qrels(bad)
    bad.write_text("q1\td1\t1\nq1\td2\t2.0\n")
    assert read_qrels(bad) == {"q1": {"d1": 1, "d2": 2}}
    # 2**53 + 1 was read through float(), rounded to 2**53, and passed the bound
    for grade in ("9007199254740993", "-9007199254740993", "1e16"):
        bad.write_text(f"q1\td1\t{grade}\n")
        with pytest.raises(DatasetError, match=r"q\.tsv:1: score .* beyond 2\*\*53"):
            read_qrels(bad)


def test_evaluate_names_an_unknown_fit_option_before_any_work(tmp_path):
    from normrank.evaluation import evaluate

    with pytest.raises(InvalidArgumentError, match=r"unknown fit options \['fold'\]"):
        evaluate(_beir(tmp_path), fit_kwargs={"fold": 3})


# ------------------------------------------------------------------ pure helpers
def test_exact_topk_matches_a_full_sort_and_respects_the_mask():
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((300, 16)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    docs[7] = docs[3]  # an exact tie: the lower index must come first
    q = rng.standard_normal((5, 16)).astype(np.float32)
    q[0] = docs[3] * 10
    top = exact_topk(q, docs, 20)
    sims = q @ docs.T
    for i in range(5):
        want = np.lexsort((np.arange(300), -sims[i]))[:20]
        assert top[i].tolist() == want.tolist()
    assert top[0][:2].tolist() == [3, 7]
    keep = np.ones(300, dtype=bool)
    keep[[3, 7]] = False
    masked = exact_topk(q, docs, 20, keep)
    assert not set(masked.ravel().tolist()) & {3, 7}


def test_paired_counts_and_test():
    rng = np.random.default_rng(0)
    base = {f"q{i}": float(v) for i, v in enumerate(rng.uniform(0, 1, 60))}
    better = {q: v + 0.05 + rng.normal(0, 0.02) for q, v in base.items()}
    t = paired(better, base)
    assert t["improved"] + t["worsened"] + t["unchanged"] == 60
    assert t["delta"] > 0.04 and t["p"] < 1e-6 and t["ci95"] > 0
    x = [better[q] for q in sorted(base)]
    y = [base[q] for q in sorted(base)]
    assert t["p"] == pytest.approx(stats.ttest_rel(x, y).pvalue)
    same = paired(base, base)
    assert (same["p"], same["improved"], same["worsened"], same["unchanged"]) == (1.0, 0, 0, 60)
    mixed = paired({"a": 1.0, "b": 0.0, "c": 0.5}, {"a": 0.0, "b": 1.0, "c": 0.5})
    assert (mixed["improved"], mixed["worsened"], mixed["unchanged"]) == (1, 1, 1)


# ------------------------------------------------------------------ real collection
@pytest.fixture(scope="module")
def cran_eval(encoder, data_dir):
    path = data_dir / "cranfield"
    if not path.is_dir():
        pytest.skip("cranfield not in the data folder")
    coll = load_collection(path, ["test"], encoder, show_progress=False)
    return Evaluator(coll, encoder), coll


class _Recording(Evaluator):
    """The real evaluator, recording which queries each fit saw."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.fitted_on: list[list[str]] = []

    def _fit(self, train, qrels, fit_kwargs):
        self.fitted_on.append(list(train))
        return super()._fit(train, qrels, fit_kwargs)


def test_cross_validation_never_fits_on_the_queries_it_evaluates(cran_eval, encoder):
    _, coll = cran_eval
    ev = _Recording(coll, encoder)
    qids = eval_qids(coll, "test")[:60]
    runs, fit = ev.normrank_variants(Protocol("test", folds=3), qids, {"features": ["calibrated"]})
    assert len(ev.fitted_on) == 3 and len(fit["per_fold"]) == 3
    held_all: set[str] = set()
    for train, info in zip(ev.fitted_on, fit["per_fold"]):
        held = set(qids) - set(train)
        assert len(held) == info["n_eval_queries"] and len(train) == info["n_train_queries"]
        assert not held & held_all  # each query is held out exactly once
        held_all |= held
    assert held_all == set(qids)
    assert set(runs["fitted"]) == set(qids) == set(runs["forced"])


def test_train_split_fit_excludes_evaluated_queries(cran_eval, encoder):
    _, coll = cran_eval
    ev = _Recording(coll, encoder)
    qids = eval_qids(coll, "test")
    coll.qrels["pseudo-train"] = {q: coll.qrels["test"][q] for q in qids[:80]}  # overlaps the evaluated ones
    try:
        ev.normrank_variants(Protocol("test", train_split="pseudo-train"), qids[40:], None, ("fitted",))
    finally:
        del coll.qrels["pseudo-train"]
    assert ev.fitted_on == [qids[:40]]


def test_runs_on_cranfield_behave_as_measured(cran_eval):
    ev, coll = cran_eval
    qids = eval_qids(coll, "test")
    qrels = coll.qrels["test"]
    cos = ev.cosine(qids)
    # the index's cosine equals brute force over unit vectors (FAISS vs numpy)
    top = exact_topk(ev._unit_queries(qids), ev._unit, 10)
    same = sum(list(cos[q])[:10] == [coll.ids[j] for j in row] for q, row in zip(qids, top))
    assert same >= len(qids) - 2  # float ties may swap a pair
    s_cos, s_raw = scores(qrels, cos, qids), scores(qrels, ev.rawdot(qids), qids)
    cos_ndcg = np.mean(list(s_cos["ndcg@10"].values()))
    assert 0.35 < cos_ndcg < 0.42  # the prototype measured 0.382 (DESIGN.md)
    # raw dot lets long, generic (large-norm) texts win: clearly worse than cosine
    assert paired(s_raw["ndcg@10"], s_cos["ndcg@10"])["delta"] < -0.05
    # pruning by the calibrated feature removes documents, so Recall@100 cannot rise
    base, n0 = ev.pruned_cosine(qids, 0.0)
    pruned, n_drop = ev.pruned_cosine(qids, 0.10)
    assert n0 == 0 and n_drop == round(0.10 * len(coll.ids))
    r0 = np.mean(list(scores(qrels, base, qids)["recall@100"].values()))
    r1 = np.mean(list(scores(qrels, pruned, qids)["recall@100"].values()))
    assert r1 <= r0


def test_bm25_baseline_ranks_lexical_matches(cran_eval):
    ev, coll = cran_eval
    qids = eval_qids(coll, "test")[:30]
    run = ev.bm25(qids)
    assert set(run) == set(qids)
    ndcg = np.mean(list(scores(coll.qrels["test"], run, qids)["ndcg@10"].values()))
    assert ndcg > 0.2  # far above random (about 0.005 here)


def test_evaluate_train_then_test_on_a_split_folder(data_dir, tmp_path, encoder):
    """A folder with train and test qrels is evaluated train -> test, and reports as `normrank eval` does."""
    import shutil

    from normrank.evaluation import evaluate, format_report

    src = data_dir / "cranfield"
    if not src.is_dir():
        pytest.skip("cranfield not in the data folder")
    folder = tmp_path / "cran-split"
    (folder / "qrels").mkdir(parents=True)
    shutil.copy(src / "corpus.jsonl", folder / "corpus.jsonl")  # same texts: the cached encodings apply
    shutil.copy(src / "queries.jsonl", folder / "queries.jsonl")
    lines = (src / "qrels" / "test.tsv").read_text().splitlines()
    qids = list(dict.fromkeys(line.split("\t")[0] for line in lines[1:]))
    train = set(qids[:150])
    for name, keep in (("train", lambda q: q in train), ("test", lambda q: q not in train)):
        rows = [line for line in lines[1:] if keep(line.split("\t")[0])]
        (folder / "qrels" / f"{name}.tsv").write_text("\n".join([lines[0], *rows]) + "\n")
    res = evaluate(folder, encoder=encoder, show_progress=False)
    assert res["protocol"] == "train->test"
    assert res["fit"]["train_split"] == "train" and res["fit"]["n_train_queries"] == len(
        [q for q in qids[:150] if q in train])
    assert res["n_queries"] == len(qids) - 150
    assert set(res["runs"]) == {"cosine", "bm25", "rawdot", "normrank"}
    text = format_report(res)
    assert "train queries" in text and "verdict:" in text


def test_the_text_report_says_judged_queries_without_text_were_left_out(data_dir, tmp_path, encoder):
    """A judged query with no text is left out of the evaluation; ``--json`` counted it, the text report
    did not say so."""
    import json
    import shutil

    from normrank.evaluation import evaluate, format_report

    src = data_dir / "cranfield"
    if not src.is_dir():
        pytest.skip("cranfield not in the data folder")
    folder = tmp_path / "cran-blank"
    shutil.copytree(src, folder)
    rows = [json.loads(x) for x in (folder / "queries.jsonl").read_text().splitlines() if x.strip()]
    judged = {line.split("\t")[0] for line in (folder / "qrels" / "test.tsv").read_text().splitlines()[1:]}
    blank = next(r for r in rows if r["_id"] in judged)
    blank["text"] = ""
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # and a judged query whose every grade is 0: metrics are not defined for it, and it was dropped unsaid
    lines = (folder / "qrels" / "test.tsv").read_text().splitlines()
    zeroed = next(q for q in sorted(judged) if q != blank["_id"])
    (folder / "qrels" / "test.tsv").write_text("\n".join(
        [lines[0]] + [("\t".join(x.split("\t")[:2] + ["0"]) if x.split("\t")[0] == zeroed else x)
                      for x in lines[1:]]) + "\n")
    res = evaluate(folder, encoder=encoder, show_progress=False)
    assert res["skipped_empty_queries"] == 1 and res["queries_without_relevant"] == 1
    report = format_report(res)
    assert "1 judged queries without text left out" in report
    assert "1 judged queries with no relevant document (all grades <= 0) left out" in report


def test_qrels_trec_rounds_a_byte_order_mark_and_a_header_after_a_blank_line(tmp_path):
    """TREC-COVID puts its round (0.5, 1, 2) where other TREC qrels put 0: any white-space line of four
    fields is TREC's. A byte order mark and a header below a blank first line are skipped, not read as
    a judgment whose score is 'score'."""
    trec = tmp_path / "covid.txt"
    trec.write_text("1 0.5 010vptx3 2\n1 1 01sfpbj4 1\n2 2 02f0opkr 0\n")
    assert read_qrels(trec) == {"1": {"010vptx3": 2, "01sfpbj4": 1}, "2": {"02f0opkr": 0}}
    bom = tmp_path / "bom.tsv"
    bom.write_text("\ufeffquery-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    late = tmp_path / "late.tsv"
    late.write_text("\nquery-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert read_qrels(bom) == read_qrels(late) == {"q1": {"d1": 1}}
