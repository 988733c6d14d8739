"""Every bad input a user can hand the command line is one line on stderr and exit 1, naming the file
and line; the traceback only with -v."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from normrank import DatasetError, load_beir
from normrank.cli import main

TEXTS = ["Stars fuse hydrogen into helium in their cores.", "Bread is made from flour, water and yeast.",
         "Mount Everest is the highest mountain above sea level.", "Vaccines train the immune system.",
         "The Amazon is the largest river by discharge.", "Quicksort is a fast sorting algorithm on average."]
QUERIES = ["what do stars burn", "how is bread made", "highest mountain", "how do vaccines work",
           "largest river", "fast sorting"]


def _beir(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n"
                                               for i, t in enumerate(TEXTS)), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n"
                                                for i, q in enumerate(QUERIES)), encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"q{i}\td{i}\t1\n" for i in range(len(QUERIES))))
    return root


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"normrank {command}: error: ") and "Traceback" not in err
    return lines[0]


def _corpus_lines(root: Path) -> list[str]:
    return (root / "corpus.jsonl").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(("damage", "expected"), [
    ("latin1", r"corpus\.jsonl:3 is not UTF-8 text"),
    ("number", r"corpus\.jsonl:2 is a number, not a JSON object"),
    ("array", r"corpus\.jsonl:2 is an array, not a JSON object"),
    ("no_id", r"corpus\.jsonl:4 has no usable '_id'"),
    ("query_no_id", r"queries\.jsonl:2 has no usable '_id'"),
    ("duplicate", r"corpus\.jsonl:7 repeats document id 'd2' \(first on line 3\)"),
    ("truncated_gz", r"corpus\.jsonl\.gz is a truncated or corrupt gzip file"),
    ("bad_qrels", r"test\.tsv is not UTF-8 text"),
])
def test_eval_on_a_broken_collection_is_one_line(tmp_path, capsys, damage, expected):
    root = _beir(tmp_path / "coll")
    lines = _corpus_lines(root)
    if damage == "latin1":
        with open(root / "corpus.jsonl", "wb") as fh:
            fh.write(("\n".join(lines[:2]) + "\n").encode())
            fh.write(json.dumps({"_id": "x", "text": "PLACEHOLDER"}).replace("PLACEHOLDER", "caf\xe9")
                     .encode("latin-1") + b"\n")
    elif damage in ("number", "array"):
        lines.insert(1, "42" if damage == "number" else '["d9", "text"]')
        (root / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif damage == "no_id":
        lines[3] = json.dumps({"title": "", "text": "no id here"})
        (root / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif damage == "query_no_id":
        (root / "queries.jsonl").write_text('{"_id": "q0", "text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    elif damage == "duplicate":
        lines.append(json.dumps({"_id": "d2", "text": "a second document with the id d2"}))
        (root / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif damage == "truncated_gz":
        data = gzip.compress(("\n".join(lines) + "\n").encode() * 50)
        (root / "corpus.jsonl").unlink()
        (root / "corpus.jsonl.gz").write_bytes(data[: len(data) // 2])
    elif damage == "bad_qrels":
        (root / "qrels" / "test.tsv").write_bytes(b"query-id\tcorpus-id\tscore\nq\xe91\td1\t1\n")
    assert main(["eval", str(root), "--no-progress"]) == 1
    line = _one_error_line(capsys, "eval")
    assert __import__("re").search(expected, line), line


def test_duplicate_corpus_ids_are_refused_by_the_loader_and_by_index(tmp_path, capsys, encoder):
    root = _beir(tmp_path / "coll")
    lines = _corpus_lines(root)
    lines.append(json.dumps({"_id": "d0", "text": "another d0"}))
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"corpus\.jsonl:7 repeats document id 'd0' \(first on line 1\)"):
        load_beir(root)
    assert main(["index", str(root), "--out", str(tmp_path / "idx"), "--no-progress"]) == 1
    assert "d0" in _one_error_line(capsys, "index")
    assert not (tmp_path / "idx").exists()


def test_fit_with_a_queries_line_that_is_an_array(tmp_path, capsys, encoder):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--no-progress"]) == 0
    capsys.readouterr()
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"_id": "q0", "text": "stars"}\n["q1", "bread"]\n', encoding="utf-8")
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("q0\td0\t1\n", encoding="utf-8")
    assert main(["fit", str(tmp_path / "idx"), "--queries", str(queries), "--qrels", str(qrels)]) == 1
    assert "q.jsonl:2 is an array, not a JSON object" in _one_error_line(capsys, "fit")


def test_an_unexpected_error_is_one_line_and_verbose_shows_the_traceback(tmp_path, capsys):
    bad = tmp_path / "normrank.yaml"
    bad.write_text("scoring: [a\n", encoding="utf-8")
    root = _beir(tmp_path / "coll")
    assert main(["eval", str(root), "--config", str(bad), "--no-progress"]) == 1
    line = _one_error_line(capsys, "eval")
    assert "not valid YAML" in line
    assert main(["-v", "eval", str(root), "--config", str(bad), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("normrank eval: error: ")
    # -v after the command as well: it was "unrecognized arguments: -v" (exit 2)
    assert main(["eval", str(root), "--config", str(bad), "--no-progress", "-v"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("normrank eval: error: ")


def test_a_missing_extra_names_the_pip_command(tmp_path, capsys, monkeypatch, encoder):
    """With bm25s not importable (as on a core-only install), `eval` says which extra to install."""
    monkeypatch.setitem(sys.modules, "bm25s", None)  # makes `import bm25s` raise ImportError, as if absent
    root = _beir(tmp_path / "coll")
    assert main(["eval", str(root), "--folds", "2", "--no-progress"]) == 1
    line = _one_error_line(capsys, "eval")
    assert 'pip install "normrank[eval]"' in line or "pip install 'normrank[eval]'" in line, line


def test_an_os_error_on_an_output_file_is_one_line(tmp_path, capsys, encoder):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--no-progress"]) == 0
    capsys.readouterr()
    pytest.importorskip("matplotlib")
    png = tmp_path / "no-such-folder" / "plot.png"
    assert main(["analyze", str(tmp_path / "idx"), "--plot", str(png)]) == 2  # refused at the door now
    line = _one_error_line(capsys, "analyze")
    assert "no such folder" in line and "plot.png" in line


@pytest.mark.parametrize(("rows", "expected"), [
    ([{"_id": None, "text": "a"}, {"_id": "d1", "text": "b"}], r"docs\.jsonl:1 has no usable '_id'"),
    ([{"_id": "d1", "text": "a"}, {"_id": "", "text": "b"}], r"docs\.jsonl:2 has no usable '_id'"),
    ([{"_id": "d1", "text": "a"}, {"_id": "d1", "text": "b"}], r"docs\.jsonl:2 repeats document id 'd1' \(first on line 1\)"),
    ([{"id": ["x"], "text": "a"}], r"docs\.jsonl:1 has no usable 'id'"),
    # a text or title that is not a string was indexed as its Python repr ("['a', 'b']", "True"), 0 skipped
    ([{"_id": "d1", "text": "a"}, {"_id": "d2", "text": ["first", "second"]}],
     r"docs\.jsonl:2 has a 'text' that is a list \(\"\['first', 'second'\]\"\); expected a string"),
    ([{"_id": "d1", "text": True}], r"docs\.jsonl:1 has a 'text' that is a bool"),
    ([{"_id": "d1", "text": 0}], r"docs\.jsonl:1 has a 'text' that is a int"),
    ([{"_id": "d1", "title": {"t": 1}, "text": "a"}], r"docs\.jsonl:1 has a 'title' that is a dict"),
])
def test_index_names_the_line_of_a_bad_jsonl_id(tmp_path, capsys, rows, expected):
    """``"_id": null`` became the document id "None"; every id problem names its file and line, as
    ``load_beir`` does, and nothing is written."""
    import re

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--no-progress"]) == 1
    assert re.search(expected, _one_error_line(capsys, "index"))
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize("command", [["search", "{idx}", "stars"], ["analyze", "{idx}"], ["recalibrate", "{idx}"]])
def test_a_missing_index_folder_is_a_plain_one_line_error(tmp_path, capsys, command):
    args = [a.replace("{idx}", str(tmp_path / "nosuch")) for a in command]
    assert main(args) == 1
    line = _one_error_line(capsys, command[0])
    assert "no saved index at" in line and "unexpected" not in line


@pytest.mark.parametrize(("yaml_text", "expected"), [
    ("scoring:\n  a: 0.02\nscoring:\n  b: 0.1\n", "line 3: the key 'scoring' is given twice"),
    ("scoring:\n  a: 0.02\n  a: 0.5\n", "line 3: the key 'a' is given twice"),
    ("encoder:\n  batch_size: yes\n", "'encoder.batch_size': .*boolean true"),
    ("scoring:\n  a: on\n", "'scoring.a': .*boolean true"),
    ("scoring:\n  a: .nan\n", "'scoring.a': Input should be a finite number"),
    ("fit:\n  features: []\n", "'fit.features': List should have at least 1 item"),
    ("chunking:\n  size: 50\n  overlap: 80\n", r"overlap \(80\) must be smaller than size \(50\)"),
])
def test_a_yaml_setting_that_would_be_lost_or_fail_later_is_named_at_load(tmp_path, capsys, yaml_text, expected):
    """Duplicate keys (YAML keeps the last), booleans for numbers (pydantic made them 1 and 0), NaN,
    empty option lists and an overlap at least the chunk size: each was accepted and did nothing, or
    failed at the first query without naming the key."""
    import re

    cfg = tmp_path / "normrank.yaml"
    cfg.write_text(yaml_text, encoding="utf-8")
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--config", str(cfg), "--no-progress"]) == 1
    assert re.search(expected, _one_error_line(capsys, "index"))
    assert not (tmp_path / "idx").exists()


def test_a_max_seq_length_the_model_cannot_take_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text("encoder:\n  max_seq_length: 5000\n", encoding="utf-8")
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": t * 200}) + "\n" for i, t in enumerate(TEXTS)))
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--config", str(cfg), "--no-progress"]) == 1
    line = _one_error_line(capsys, "index")
    assert "max_seq_length 5000" in line and "512 token positions" in line and "unexpected" not in line


def test_load_beir_names_a_text_that_is_not_a_string(tmp_path):
    from normrank.datasets import load_beir
    from normrank.errors import DatasetError

    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "rivers"}) + "\n", encoding="utf-8")
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": None, "text": "ok"}) + "\n"
                                           + json.dumps({"_id": "d2", "text": ["a", "b"]}) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"corpus\.jsonl:2 has a 'text' that is a list"):
        load_beir(tmp_path)
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "ok"}) + "\n", encoding="utf-8")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": 42}) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"queries\.jsonl:1 has a 'text' that is a int"):
        load_beir(tmp_path)


def test_folds_that_leave_a_fold_one_training_query_are_named(tmp_path, capsys, encoder):
    """3 judged queries in 2 folds: one fold fits on 1 query. The fit's own error ("needs at least 2
    labelled queries") did not say that the folds were why."""
    root = _beir(tmp_path / "coll")
    lines = (root / "qrels" / "test.tsv").read_text().splitlines()
    (root / "qrels" / "test.tsv").write_text("\n".join(lines[:4]) + "\n")  # header + 3 judged queries
    assert main(["eval", str(root), "--folds", "2", "--no-progress"]) == 1
    line = _one_error_line(capsys, "eval")
    assert "3 judged queries in 2 folds leave 1 query to fit a fold on" in line and "more folds" in line
    assert main(["eval", str(root), "--folds", "3", "--no-progress"]) == 0  # 2 training queries per fold


def test_a_plot_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys):
    """`--plot report.txt` ran the whole evaluation, then failed in matplotlib ("Format 'txt' is not supported")."""
    from normrank.cli import main

    for bad, words in (("report.txt", "is not an image file name"), (str(tmp_path / "nope" / "x.png"), "no such folder")):
        for argv in (["eval", "anything", "--plot", bad], ["analyze", str(tmp_path), "--plot", bad]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert words in err and len(err.strip().splitlines()) == 1


def test_a_literal_tilde_in_out_is_the_home_folder_on_every_run(tmp_path, capsys, monkeypatch, encoder):
    """A regression hunt: `--out '~/idx'` (quoted, as from a Makefile) saved into $HOME/idx while the run's own
    version check looked at ./~/idx, so every re-index failed with ConcurrentUpdateError."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    for _ in range(2):
        assert main(["index", str(src), "--out", "~/idx", "--no-progress"]) == 0, capsys.readouterr().err
    assert (home / "idx" / "current").is_symlink() and not (tmp_path / "~").exists()
    assert main(["search", "~/idx", "a query", "-k", "1", "--json"]) == 0
