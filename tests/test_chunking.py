"""Chunking long documents (issue 12 item 1): tokenizer-aware, offsets exact, on by default for files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from normrank import ConfigError, InvalidArgumentError, NormIndex
from normrank.analysis import analyze_index, index_arrays
from normrank.chunking import Chunker, chunk_files, chunk_texts
from normrank.cli import main
from normrank.datasets import demo_rows

README = Path(__file__).resolve().parents[1] / "README.md"
CHANGELOG = README.parent / "CHANGELOG.md"
ENDING = next(r for r in demo_rows() if r["_id"] == "hist-2")["text"]  # the Westphalia passage


def _long_file_text() -> str:
    """~1,500 words of real prose that end with a passage found nowhere else. The prose is the released
    0.1.0 section of the CHANGELOG, which never changes (the README's opening did, with every feature)."""
    text = CHANGELOG.read_text(encoding="utf-8")
    words = text[text.index("## [0.1.0]"):].split(" ")
    head = " ".join(words[:1450])
    return f"{head}\n\n{ENDING}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("notes")
    (d / "long.md").write_text(_long_file_text(), encoding="utf-8")
    for r in demo_rows():
        if r["_id"] != "hist-2":
            (d / f"{r['_id']}.txt").write_text(f"{r['title']}\n{r['text']}", encoding="utf-8")
    return d


def _query() -> str:
    return ENDING.rstrip(".").split(". ")[-1]  # a sentence quoted from the very end of long.md


def test_a_query_quoting_the_end_of_a_long_file_finds_its_last_chunk(folder, tmp_path, capsys, encoder):
    assert len(_long_file_text().split()) >= 1400
    out = tmp_path / "idx"
    assert main(["index", str(folder), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "chunked 48 documents into" in err
    assert main(["search", str(out), _query(), "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    index = NormIndex.load(out, encoder=encoder)
    chunks = sorted((i for i in index.ids() if i.startswith("long.md#")), key=lambda i: int(i.split("#")[1]))
    assert len(chunks) >= 6
    assert hits[0]["id"] == chunks[-1]
    meta = hits[0]["metadata"]
    text = _long_file_text().strip()
    assert meta["source"] == "long.md" and meta["chunk"] == len(chunks) - 1
    assert text[meta["start"] : meta["end"]] == hits[0]["text"] and meta["end"] == len(text)
    # The same folder without chunking: the file is cut at 256 tokens and the quote no longer finds it.
    flat = tmp_path / "flat"
    assert main(["index", str(folder), "--out", str(flat), "--no-progress", "--no-chunking"]) == 0
    err = capsys.readouterr().err
    assert "note: 1 of 48 documents are longer than the model's window of 256 tokens and were truncated" in err
    flat_index = NormIndex.load(flat, encoder=encoder)
    flat_hits = flat_index.search(_query(), 48)
    long_rank = [h.id for h in flat_hits].index("long.md")
    assert long_rank > 0 and flat_hits[long_rank].cosine < hits[0]["cosine"] - 0.2
    # analyze says how many documents were cut at the window.
    assert analyze_index(flat_index).truncation == {"max_tokens": 256, "truncated": 1, "share": 1 / 48, "exact": True}
    assert main(["analyze", str(flat)]) == 0
    assert "truncated at 256: 1 documents" in capsys.readouterr().out


def test_chunks_fit_the_window_overlap_and_prefer_paragraphs(encoder):
    paragraphs = [f"{r['title']}. {r['text']}" for r in demo_rows()]
    text = "\n\n".join(paragraphs)
    chunker = Chunker(encoder)
    assert (chunker.size, chunker.overlap) == (254, 38)
    pieces = chunker.split(text)
    assert len(pieces) >= 3
    counts = encoder.token_counts([p for _, _, p in pieces])
    assert counts.max() <= 256  # never truncated: size + [CLS] + [SEP]
    for (s1, e1, p1), (s2, _, _) in zip(pieces, pieces[1:]):
        assert text[s1:e1] == p1
        assert s2 < e1  # consecutive chunks overlap
    starts = {0} | {len("\n\n".join(paragraphs[:i])) + 2 for i in range(1, len(paragraphs))}
    sentence_starts = {i + 2 for i in range(len(text)) if text[i : i + 2] in (". ", "\n\n")}
    assert all(s in starts | sentence_starts for s, _, _ in pieces)  # chunks start at paragraph/sentence starts
    # Without overlap, the chunks tile the paragraphs: no paragraph is split when each fits.
    tiles = Chunker(encoder, size=120, overlap=0).split(text)
    assert all(s in starts for s, _, _ in tiles)
    assert encoder.token_counts([p for _, _, p in tiles]).max() <= 122


def test_chunk_texts_ids_metadata_and_short_texts_kept_whole(encoder):
    long_text = _long_file_text()
    ids, texts, metas = chunk_texts([long_text, "A short note."], ids=["long", "short"],
                                    metadatas=[{"lang": "en"}, {"lang": "fr"}], encoder=encoder, size=100, overlap=10)
    assert ids[-1] == "short" and texts[-1] == "A short note."
    assert metas[-1] == {"lang": "fr", "source": "short", "chunk": 0, "start": 0, "end": 13}
    n = len(ids) - 1
    assert ids[:n] == [f"long#{i}" for i in range(n)]
    for i, (t, m) in enumerate(zip(texts[:n], metas[:n])):
        assert m == {"lang": "en", "source": "long", "chunk": i, "start": m["start"], "end": m["end"]}
        assert long_text[m["start"] : m["end"]] == t
    assert encoder.token_counts(texts[:n]).max() <= 102
    # only_long=False chunks every text, even one that fits.
    ids2, _, _ = chunk_texts(["A short note."], ids=["s"], encoder=encoder, only_long=False)
    assert ids2 == ["s#0"]


def test_the_calibration_sees_each_chunks_own_token_count(encoder, tmp_path):
    (tmp_path / "a.md").write_text(_long_file_text(), encoding="utf-8")
    (tmp_path / "b.txt").write_text("Coffee beans are roasted seeds.", encoding="utf-8")
    ids, texts, metas = chunk_files([tmp_path / "a.md", tmp_path / "b.txt"], encoder=encoder, root=tmp_path)
    assert ids[-1] == "b.txt" and ids[0] == "a.md#0" and metas[0]["path"] == "a.md"
    index = NormIndex(encoder)
    index.add_texts(texts, ids=ids, metadatas=metas)
    got_ids, _, counts, _ = index_arrays(index)
    by_id = dict(zip(got_ids, counts.tolist()))
    assert [by_id[i] for i in ids] == encoder.token_counts(texts).tolist()
    assert len(set(by_id.values())) > 2  # chunks of different lengths, not one capped value


def test_bad_chunk_settings_are_named(encoder, folder, tmp_path, capsys):
    with pytest.raises(InvalidArgumentError, match="larger than the model's window allows"):
        Chunker(encoder, size=300)
    with pytest.raises(InvalidArgumentError, match="overlap .* must be smaller than the chunk size"):
        Chunker(encoder, size=50, overlap=50)
    with pytest.raises(InvalidArgumentError, match="chunk size must be an integer"):
        Chunker(encoder, size=0)
    assert main(["index", str(folder), "--out", str(tmp_path / "x"), "--chunk-size", "1000"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chunk size 1000 is larger than the model's window" in err
    assert main(["index", str(folder), "--out", str(tmp_path / "x"), "--chunk-overlap", "-1"]) == 2
    assert not (tmp_path / "x").exists()


def test_yaml_chunking_section(folder, tmp_path, capsys, encoder):
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text("chunking:\n  size: 64\n  overlap: 8\n", encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["index", str(folder), "--out", str(out), "--config", str(cfg), "--no-progress"]) == 0
    index = NormIndex.load(out, encoder=encoder)
    ids, _, counts, _ = index_arrays(index)
    assert sum(i.startswith("long.md#") for i in ids) > 20 and counts.max() <= 66
    cfg.write_text("chunking:\n  sise: 64\n", encoding="utf-8")
    from normrank.config import load_config

    with pytest.raises(ConfigError, match="unknown key 'chunking.sise'"):
        load_config(cfg)


def test_rows_are_not_chunked_unless_asked(tmp_path, capsys, encoder):
    src = tmp_path / "corpus.jsonl"
    rows = [{"_id": "long", "text": _long_file_text()}, {"_id": "s", "text": "Coffee beans are roasted seeds."}]
    src.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    assert main(["index", str(src), "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert "--chunk-rows splits them" in capsys.readouterr().err
    assert sorted(NormIndex.load(tmp_path / "a", encoder=encoder).ids()) == ["long", "s"]
    assert main(["index", str(src), "--out", str(tmp_path / "b"), "--no-progress", "--chunk-rows"]) == 0
    ids = NormIndex.load(tmp_path / "b", encoder=encoder).ids()
    assert "s" in ids and "long#0" in ids and "long" not in ids


def test_cli_and_distributed_do_not_import_each_other():
    code = ("import sys, normrank.distributed, normrank.sources; assert 'normrank.cli' not in sys.modules; "
            "import normrank.cli; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    from normrank.cli import read_source
    from normrank.sources import read_source as moved

    assert read_source is moved


def test_chunker_counts_with_a_private_tokenizer_under_threads(encoder):
    from concurrent.futures import ThreadPoolExecutor

    chunker = Chunker(encoder, size=80, overlap=12)
    text = _long_file_text()
    expected = chunker.split(text)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: chunker.split(text) if i % 2 else encoder.token_counts([text] * 8),
                                range(12)))
    for i, r in enumerate(results):
        if i % 2:
            assert r == expected
        else:
            assert np.array_equal(r, np.full(8, 256))


def test_chunk_offsets_index_the_file_as_python_reads_it(tmp_path, encoder):
    """``start``/``end`` indexed the file's text with its surrounding white space stripped, so a passage
    highlighted in the file landed on the wrong characters whenever the file began with a blank line."""
    from normrank.chunking import chunk_texts
    from normrank.sources import read_source

    para = "Rivers carve valleys over long spans of time, and the valleys guide later rivers. " * 12
    (tmp_path / "notes.md").write_text("\n\n  " + para + "\n\n" + para.replace("Rivers", "Glaciers") + "\n\n",
                                       encoding="utf-8")
    (tmp_path / "crlf.txt").write_bytes(("\r\n" + para + "\r\n\r\n" + para).encode("utf-8"))
    ids, texts, metas, skipped = read_source(tmp_path)
    assert not skipped
    cids, ctexts, cmetas = chunk_texts(texts, ids, metas, encoder=encoder, size=64, overlap=8)
    assert len(cids) > len(ids)
    for text, meta in zip(ctexts, cmetas):
        with open(tmp_path / meta["path"], encoding="utf-8") as f:
            whole = f.read()
        assert whole[meta["start"]:meta["end"]] == text


def test_chunk_files_offsets_index_the_file_as_read(tmp_path, encoder):
    """chunk_files stripped each file before chunking, so with a leading blank line every offset was off;
    now ``open(path).read()[start:end]`` is the chunk, as on the command line."""
    from normrank.chunking import chunk_files

    para = "Rivers carve valleys over long spans of time, and the valleys guide later rivers. " * 12
    (tmp_path / "a.md").write_text("\n\n   " + para + "\n\n" + para.replace("Rivers", "Glaciers") + "\n", encoding="utf-8")
    (tmp_path / "short.txt").write_text("\n  A short note.\n", encoding="utf-8")
    (tmp_path / "blank.txt").write_text(" \n\t\n", encoding="utf-8")
    ids, texts, metas = chunk_files(sorted(tmp_path.iterdir()), encoder=encoder, size=64, overlap=8, root=tmp_path)
    assert {m["path"] for m in metas} == {"a.md", "short.txt"} and len(ids) > 2
    for text, meta in zip(texts, metas):
        with open(tmp_path / meta["path"], encoding="utf-8") as f:
            assert f.read()[meta["start"]:meta["end"]] == text


def test_chunk_texts_keeps_the_callers_own_chunk_keys(encoder, caplog):
    """A loader's ``source`` URL (or a transcript's ``start``) was replaced by the chunk's own value."""
    long_text = _long_file_text()
    with caplog.at_level("WARNING", logger="normrank.chunking"):
        _, _, metas = chunk_texts([long_text, "A short note."], ids=["long", "short"],
                                        metadatas=[{"source": "https://example.org/paper.pdf", "page": 3},
                                                   {"start": "00:01:02"}], encoder=encoder, size=100, overlap=10)
    assert all(m["source"] == "https://example.org/paper.pdf" and m["page"] == 3 for m in metas[:-1])
    assert [m["chunk"] for m in metas[:-1]] == list(range(len(metas) - 1))
    assert metas[-1] == {"source": "short", "chunk": 0, "start": "00:01:02", "end": 13}
    assert "'source', 'start'" in caplog.text and "kept" in caplog.text


def test_a_chunk_id_that_is_another_documents_id_is_named(encoder):
    """A long row `x` (chunks x#0, x#1, ...) beside a row whose own id is `x#1` gave "id 'x#1' is given twice
    in this batch", which did not say why."""
    from normrank.chunking import chunk_texts
    from normrank.errors import InvalidArgumentError

    long = "Rivers carve valleys over long spans of time, and the valleys guide later rivers. " * 40
    with pytest.raises(InvalidArgumentError, match=r"chunk id 'x#1' is given twice: .*'x' and 'x#1' both give it"):
        chunk_texts([long, "A short row."], ["x", "x#1"], [{}, {}], encoder=encoder, size=64, overlap=8)
