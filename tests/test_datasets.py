"""The BEIR loader reads any BEIR folder and names what is wrong with a broken one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from normrank import DatasetError, load_beir


def _write_beir(root: Path, *, gz: bool = False, qrels: str = "query-id\tcorpus-id\tscore\nq1\td1\t1\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rows = "\n".join(json.dumps({"_id": f"d{i}", "title": f"T{i}", "text": f"text {i}"}) for i in range(3))
    if gz:
        with gzip.open(root / "corpus.jsonl.gz", "wt") as fh:
            fh.write(rows)
    else:
        (root / "corpus.jsonl").write_text(rows)
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a question"}) + "\n")
    (root / "qrels").mkdir(exist_ok=True)
    (root / "qrels" / "test.tsv").write_text(qrels)
    return root


@pytest.mark.parametrize("gz", [False, True])
def test_loads_a_user_beir_folder(tmp_path, gz):
    ds = load_beir(_write_beir(tmp_path / "mine", gz=gz))
    assert ds.name == "mine" and len(ds.corpus) == 3 and ds.queries == {"q1": "a question"}
    assert ds.qrels == {"q1": {"d1": 1}} and ds.corpus["d2"].full_text == "T2\ntext 2"


def test_missing_files_and_splits_are_named(tmp_path):
    with pytest.raises(DatasetError, match="no such folder"):
        load_beir(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no corpus.jsonl or corpus.jsonl.gz"):
        load_beir(tmp_path / "empty")
    root = _write_beir(tmp_path / "b")
    with pytest.raises(DatasetError, match=r"no qrels/train.tsv; available splits: \['test'\]"):
        load_beir(root, "train")


def test_dangling_qrels_ids_are_named(tmp_path):
    root = _write_beir(tmp_path / "c", qrels="query-id\tcorpus-id\tscore\nq1\td9\t1\nq7\td1\t1\n")
    with pytest.raises(DatasetError, match=r"1 queries \(e.g. \['q7'\]\), 1 documents \(e.g. \['d9'\]\)"):
        load_beir(root)


def test_bad_json_names_the_line(tmp_path):
    root = _write_beir(tmp_path / "d")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "ok"}\n{broken\n')
    with pytest.raises(DatasetError, match="queries.jsonl:2 is not valid JSON"):
        load_beir(root)


@pytest.mark.data
def test_shared_collections_load(data_dir):
    sizes = {"scifact": (5183, 300), "cranfield": (1400, 225), "cisi": (1460, 76)}
    for name, (docs, judged) in sizes.items():
        ds = load_beir(data_dir / name)
        assert len(ds.corpus) == docs and len(ds.qrels) == judged
    assert len(load_beir(data_dir / "scifact", "train").qrels) == 809
    ids, texts, skipped = load_beir(data_dir / "cranfield").doc_items()
    assert skipped == ["471", "995"] and len(ids) == len(texts) == 1398


def test_every_broken_line_is_named_with_file_and_line(tmp_path):
    from normrank.datasets import read_jsonl, read_queries

    root = _write_beir(tmp_path / "e")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n\n{"_id": "d1", "text": "b"}\n')
    with pytest.raises(DatasetError, match=r"corpus\.jsonl:3 repeats document id 'd1' \(first on line 1\)"):
        load_beir(root)
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n3.5\n')
    with pytest.raises(DatasetError, match=r"corpus\.jsonl:2 is a number, not a JSON object"):
        read_jsonl(root / "corpus.jsonl")
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": null, "text": "b"}\n')
    with pytest.raises(DatasetError, match=r"corpus\.jsonl:2 has no usable '_id'"):
        load_beir(root)
    (root / "queries.jsonl").write_bytes(b'{"_id": "q1", "text": "ok"}\n{"_id": "q2", "text": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=r"queries\.jsonl:2 is not UTF-8 text"):
        read_queries(root / "queries.jsonl")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "a"}\n{"_id": "q1", "text": "b"}\n')
    with pytest.raises(DatasetError, match=r"queries\.jsonl:2 repeats query id 'q1'"):
        read_queries(root / "queries.jsonl")
    with pytest.raises(DatasetError, match="no such file"):
        read_jsonl(root / "missing.jsonl")


def test_a_truncated_gzip_is_a_dataset_error(tmp_path):
    from normrank.datasets import read_jsonl

    data = gzip.compress(b"".join(json.dumps({"_id": str(i), "text": "x" * 50}).encode() + b"\n"
                                  for i in range(500)))
    path = tmp_path / "corpus.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=r"corpus\.jsonl\.gz is a truncated or corrupt gzip file"):
        read_jsonl(path)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DatasetError, match="truncated or corrupt gzip"):
        read_jsonl(path)


def test_hidden_qrels_files_are_not_splits_and_an_empty_corpus_is_named(tmp_path):
    """A researcher's hunt: macOS's "._dev.tsv" beside "dev.tsv" was a split of its own, so a folder with only a
    dev split asked for --split; an empty corpus was reported as "names ids the collection lacks: 0 queries"."""
    from normrank.datasets import available_splits

    root = _write_beir(tmp_path / "mac")
    (root / "qrels" / "test.tsv").rename(root / "qrels" / "dev.tsv")
    (root / "qrels" / "._dev.tsv").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    assert available_splits(root) == ["dev"]
    assert load_beir(root, "dev").qrels == {"q1": {"d1": 1}}
    empty = _write_beir(tmp_path / "empty")
    (empty / "corpus.jsonl").write_text("")
    with pytest.raises(DatasetError, match="holds no documents"):
        load_beir(empty)


def test_grades_far_beyond_the_usual_range_are_warned_about(tmp_path, caplog):
    """TREC qrels with tabs and an iteration of 1 read as BEIR's: document '1' graded 184, silently."""
    from normrank.datasets import read_qrels_file

    root = _write_beir(tmp_path / "trec", qrels="q1\t1\t2\textra\n")
    with caplog.at_level("WARNING", logger="normrank.datasets"):
        assert read_qrels_file(root / "qrels" / "test.tsv") == {"q1": {"1": 2}}
    assert "relevance grades reach" not in caplog.text
    (root / "qrels" / "test.tsv").write_text("q1\t1\t184\t3\n")
    with caplog.at_level("WARNING", logger="normrank.datasets"):
        assert read_qrels_file(root / "qrels" / "test.tsv") == {"q1": {"1": 184}}
    assert "relevance grades reach 184" in caplog.text and "check the columns" in caplog.text
