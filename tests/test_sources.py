"""Reading a corpus from disk (``normrank.sources``): what `normrank index` and Ray indexing read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from normrank.errors import DatasetError, InvalidMetadataError, InvalidTextError
from normrank.sources import read_source


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_linked_folders_are_read_once_and_loops_end(tmp_path):
    """``Path.rglob`` (Python 3.11) skipped a linked folder without a word while it read linked files."""
    shared = tmp_path / "shared"
    shared.mkdir()
    for name in ("a.txt", "b.md", "c.txt"):
        (shared / name).write_text(f"Shared document {name}.", encoding="utf-8")
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "local.txt").write_text("A local document.", encoding="utf-8")
    os.symlink(shared, docs / "shared")
    os.symlink(shared, docs / "sub" / "again")  # a second link to the same folder: read once
    os.symlink(docs, docs / "sub" / "loop")  # a loop back to the root: ends
    ids, texts, metas, skipped = read_source(docs)
    assert ids == ["local.txt", "shared/a.txt", "shared/b.md", "shared/c.txt"]
    assert len(set(texts)) == len(texts) == 4 and not skipped
    assert all(m["path"] == i for i, m in zip(ids, metas))


def test_jsonl_fields_beside_text_are_metadata(tmp_path):
    """Top-level fields such as ``url`` and ``year`` were dropped without a word; the row's own ``metadata``
    wins a clash, and a ``metadata`` that is not an object is named by its line."""
    src = _jsonl(tmp_path / "docs.jsonl", [
        {"_id": "a", "text": "Stars fuse hydrogen.", "url": "https://example.org/a", "year": 2021,
         "metadata": {"year": 2020, "tags": ["x"]}},
        {"id": "b", "title": "Bread", "text": "Bread rises with yeast.", "source": {"kind": "book"}},
        {"_id": "c", "text": "Rivers carve valleys.", "metadata": None},
    ])
    ids, _, metas, _ = read_source(src)
    by_id = dict(zip(ids, metas))
    assert by_id["a"] == {"url": "https://example.org/a", "year": 2020, "tags": ["x"]}
    assert by_id["b"] == {"source": {"kind": "book"}, "title": "Bread"}
    assert by_id["c"] == {}
    bad = _jsonl(tmp_path / "bad.jsonl", [{"_id": "a", "text": "ok"}, {"_id": "b", "text": "ok", "metadata": [1]}])
    with pytest.raises(DatasetError, match=r"bad.jsonl:2 has a 'metadata' that is a list"):
        read_source(bad)


@pytest.mark.parametrize("row, error, where", [
    ('{"_id": "e", "text": "caf\\udcff"}', InvalidTextError, "text"),
    ('{"_id": "e", "title": "\\udcff", "text": "fine"}', InvalidTextError, "title"),
    ('{"_id": "e", "text": "fine", "metadata": {"k": "\\udcff"}}', InvalidTextError, "metadata"),
    ('{"_id": "e", "text": "fine", "score": NaN}', InvalidMetadataError, "metadata"),
])
def test_a_bad_row_is_named_by_file_and_line(tmp_path, row, error, where):
    """Text no store accepts was named by its position in the batch ("text 3"), off by every empty row
    skipped before it, with neither file nor line."""
    src = _jsonl(tmp_path / "docs.jsonl", [{"_id": "a", "text": ""}, {"_id": "b", "text": "Fine."}, row])
    with pytest.raises(error, match=rf"docs.jsonl:3 {where}"):
        read_source(src)


def test_jsonl_suffixes_in_capitals_are_read(tmp_path):
    """``DOCS.JSONL`` and ``docs.jsonl.GZ`` were refused ("neither a folder nor a .jsonl file") while a
    folder's ``NOTE.TXT`` was read."""
    import gzip

    rows = [{"_id": "a", "text": "Stars fuse hydrogen."}, {"_id": "b", "text": "Bread rises."}]
    upper = _jsonl(tmp_path / "DOCS.JSONL", rows)
    packed = tmp_path / "docs.jsonl.GZ"
    packed.write_bytes(gzip.compress(upper.read_bytes()))
    for src in (upper, packed):
        assert read_source(src)[0] == ["a", "b"]


def test_a_beir_corpus_row_needs_its_id_a_jsonl_file_row_is_numbered(tmp_path):
    """`eval` refused a BEIR folder whose rows had no `_id`, while `index` numbered them by line, so qrels with
    numeric ids judged the wrong documents in silence. A plain .jsonl file still numbers them (documented)."""
    beir = tmp_path / "beir"
    beir.mkdir()
    _jsonl(beir / "corpus.jsonl", [{"text": "Stars fuse hydrogen."}, {"text": "Bread rises."}])
    with pytest.raises(DatasetError, match=r"corpus.jsonl:1 has no usable '_id'"):
        read_source(beir)
    assert read_source(beir / "corpus.jsonl")[0] == ["1", "2"]
    # `id` does not stand in for `_id` in a BEIR folder, as eval reads it; in a .jsonl file it names the row,
    # and beside an `_id` it is metadata like any other field
    _jsonl(beir / "corpus.jsonl", [{"id": "a", "text": "Stars fuse hydrogen."}])
    with pytest.raises(DatasetError, match=r"corpus.jsonl:1 has no usable '_id'"):
        read_source(beir)
    assert read_source(beir / "corpus.jsonl")[:3] == (["a"], ["Stars fuse hydrogen."], [{}])
    _jsonl(beir / "corpus.jsonl", [{"_id": "a", "id": "ext-7", "text": "Stars fuse hydrogen."}])
    assert read_source(beir)[2] == [{"id": "ext-7"}]
