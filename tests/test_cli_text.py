"""The default (text) output of every command, as a user reads it, and the rough edges of issue 12."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from normrank.cli import main
from normrank.store import NormIndex
from tests.test_cli_errors import QUERIES, TEXTS, _beir, _one_error_line

LONG = "handbook/chapter-07-the-physics-of-stars/section-03-main-sequence-lifetimes.md#4"


@pytest.fixture(scope="module")
def chunked(tmp_path_factory, encoder):
    """An index of chunk-like rows: long path#n ids and `source` metadata, two chunks per file."""
    d = tmp_path_factory.mktemp("chunked")
    rows = []
    for i, t in enumerate(TEXTS):
        src = f"docs/{'a' * 30}-{i}.md"
        for n, part in enumerate((t, f"More about it: {t.lower()}")):
            rows.append({"_id": f"{src}#{n}", "text": part, "metadata": {"source": src, "chunk": n}})
    rows.append({"_id": LONG, "text": "A star of ten solar masses lives about twenty million years.",
                 "metadata": {"source": LONG.split("#")[0], "chunk": 4}})
    src = d / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = d / "index"
    assert main(["index", str(src), "--out", str(out), "--no-progress"]) == 0
    return out


def test_index_text_output(tmp_path, capsys, encoder):
    root = _beir(tmp_path / "coll")
    assert main(["index", str(root), "--out", str(tmp_path / "idx"), "--no-progress"]) == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"indexed 6 documents into .*idx \(model .*, raw norms \d\.\d{3}\.\.\d\.\d{3}\)", out)


def test_index_refuses_a_foreign_out_folder_before_reading_anything(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "settings.ini").write_text("keep")
    # the source does not even exist: the --out check comes first, before any reading or encoding
    assert main(["index", str(tmp_path / "no-such-source"), "--out", str(out), "--no-progress"]) == 1
    line = _one_error_line(capsys, "index")
    assert "is a non-empty folder that is not a normrank index" in line and "no-such-source" not in line
    assert (out / "settings.ini").read_text() == "keep" and sorted(p.name for p in out.iterdir()) == ["settings.ini"]


def test_search_text_shows_long_ids_with_an_ellipsis(chunked, capsys):
    assert main(["search", str(chunked), "how long do massive stars live", "-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "3 hits for 'how long do massive stars live' (plain cosine)"
    assert lines[1].split()[:2] == ["#", "id"]
    first = lines[2]
    assert "\u2026" in first and first.split()[1].endswith("main-sequence-lifetimes.md#4")
    assert first.split()[1].startswith("handbook/chap") and len(first.split()[1]) == 48
    # ids that fit are shown whole, never silently cut
    for line in lines[3:]:
        assert re.search(r"docs/a{30}-\d\.md#\d", line), line


def test_search_tries_a_blend_from_the_command_line(chunked, capsys):
    assert main(["search", str(chunked), "stars", "-k", "4", "--a", "0.05", "--feature", "raw"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("(additive blend, a=+0.05 b=+0, feature raw)")
    assert main(["search", str(chunked), "stars", "-k", "4", "--a", "0.05", "--feature", "raw", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["weights"]["a"] == 0.05 and res["weights"]["feature"] == "raw"
    for h in res["hits"]:
        assert h["weight"] == pytest.approx(0.05)
        assert h["score"] == pytest.approx(h["cosine"] + 0.05 * h["norm_feature"], abs=1e-5)
    assert NormIndex.load(chunked).weights.is_cosine  # trying a blend never changes the saved index
    assert main(["search", str(chunked), "stars", "--b", "0.1"]) == 1
    assert "needs a query calibration" in _one_error_line(capsys, "search")
    assert main(["search", str(chunked), "stars", "--cosine", "--a", "0.1"]) == 1
    _one_error_line(capsys, "search")


def test_search_groups_chunks_by_source(chunked, capsys):
    assert main(["search", str(chunked), "how is bread made", "-k", "2", "--group-by", "source"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 source groups for 'how is bread made'")
    headers = [x for x in lines if x.startswith("source ")]
    assert len(headers) == 2 and headers[0].startswith(f"source docs/{'a' * 30}-1.md  (best score")
    assert "2 hits" in headers[0]
    assert main(["search", str(chunked), "how is bread made", "-k", "2", "--group-by", "source", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [g["key"] for g in res["groups"]][0] == f"docs/{'a' * 30}-1.md"
    assert all(len({h["metadata"]["source"] for h in res["hits"] if h["id"] in g["ids"]}) == 1
               for g in res["groups"])
    # -k bounds the hits shown per group too: a file of many chunks never prints a page of them
    assert main(["search", str(chunked), "how is bread made", "-k", "1", "--group-by", "source", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["groups"]) == 1 and len(res["groups"][0]["ids"]) == 1 and len(res["hits"]) == 1
    # a key no hit has (a typo) is named on stderr, with the keys the hits do have
    assert main(["search", str(chunked), "how is bread made", "-k", "2", "--group-by", "sourc"]) == 0
    err = capsys.readouterr().err
    assert "no hit has the metadata key 'sourc'" in err and "source" in err


def test_group_by_finds_k_groups_past_a_source_of_many_chunks(tmp_path, capsys, encoder):
    """One file of ~120 chunks that all match filled the fixed depth (10 k hits), and ``-k 3 --group-by
    source`` showed one group where four files were indexed; the search now goes deeper until k groups."""
    import random

    docs = tmp_path / "docs"
    docs.mkdir()
    rnd = random.Random(1)
    said = ["Mitochondria produce ATP for the cell.", "The powerhouse of the cell is the mitochondrion.",
            "Cells get energy from mitochondria."]
    (docs / "long.md").write_text("\n\n".join(" ".join(rnd.choice(said) for _ in range(30)) for _ in range(60)))
    (docs / "plants.txt").write_text("Chloroplasts capture light energy in plant cells.")
    (docs / "ribosomes.txt").write_text("Ribosomes build proteins inside the cell.")
    (docs / "paris.txt").write_text("The Eiffel Tower is in Paris.")
    out = tmp_path / "idx"
    assert main(["index", str(docs), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    long_chunks = sum(1 for i in NormIndex.load(out).ids() if i.startswith("long.md"))
    assert long_chunks > 30  # more than 10 k: the case is reached
    for k in (2, 3, 4):
        assert main(["search", str(out), "energy in the cell", "-k", str(k), "--group-by", "source", "--json"]) == 0
        res = json.loads(capsys.readouterr().out)
        assert len(res["groups"]) == k and res["groups"][0]["key"] == "long.md"
        assert len(res["hits"]) == sum(len(g["ids"]) for g in res["groups"])
    assert main(["search", str(out), "energy in the cell", "-k", "3", "--group-by", "source"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("3 source groups for 'energy in the cell'")


def test_fit_text_output_and_the_empty_document_message(tmp_path, capsys, encoder):
    root = _beir(tmp_path / "coll")
    lines = (root / "corpus.jsonl").read_text().splitlines()
    lines.append(json.dumps({"_id": "blank", "title": "", "text": "  "}))
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["index", str(root), "--out", str(tmp_path / "idx"), "--no-progress"]) == 0
    assert "skipped 1 empty document(s)" in capsys.readouterr().err
    qrels = root / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "q0\tblank\t1\n")
    args = ["fit", str(tmp_path / "idx"), "--queries", str(root / "queries.jsonl"), "--qrels", str(qrels)]
    assert main(args) == 1
    line = _one_error_line(capsys, "fit")
    assert "'blank'" in line and "skips documents with no text" in line and "--allow-missing-docs" in line
    assert main([*args, "--allow-missing-docs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fitted on 6 queries: ")
    assert out[2].startswith("  cross-validated nDCG@10: cosine ") and out[-1].startswith("saved the weights into")


def test_eval_text_output_cross_validated_and_train_split(tmp_path, capsys, encoder):
    root = _beir(tmp_path / "coll")
    assert main(["eval", str(root), "--folds", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("coll: 6 evaluated queries (2-fold cv on test), 6 documents")
    assert re.search(r"fit: \d/2 folds accepted a norm blend", out)
    assert "verdict: " in out and "  cosine " in out and "  normrank " in out
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                              "".join(f"q{i}\td{i}\t1\n" for i in range(3)))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"q{i}\td{i}\t1\n" for i in range(3, 6)))
    assert main(["eval", str(root), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "(train->test)" in out and "fit on 3 train queries: " in out and "verdict: " in out


def test_analyze_text_output_and_the_recalibrate_command(tmp_path, capsys):
    def batch(n, seed, lo, hi, nlo, nhi):
        r = np.random.default_rng(seed)
        v = r.normal(size=(n, 16)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        return (v * r.uniform(nlo, nhi, size=n)[:, None]).astype(np.float32), r.integers(lo, hi, size=n)

    index = NormIndex(dim=16)  # calibrated on short texts; long texts with larger norms added later
    index.add_vectors(*batch(400, 1, 5, 40, 2.9, 3.1), ids=[f"a{i}" for i in range(400)])
    index.add_vectors(*batch(390, 2, 100, 300, 3.3, 3.5), ids=[f"b{i}" for i in range(390)])
    index.save(tmp_path / "idx")
    assert main(["analyze", str(tmp_path / "idx")]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("790 documents; current blend: plain cosine")
    assert "most specific (highest calibrated norm):" in captured.out
    assert "still tracks length" in captured.err and "`normrank recalibrate DIR`" in captured.err
    assert main(["recalibrate", str(tmp_path / "idx")]) == 0
    out = capsys.readouterr().out
    m = re.fullmatch(r"recalibrated 790 documents in .*: Spearman\(calibrated feature, token count\) "
                     r"([+-]\d\.\d{3}) -> ([+-]\d\.\d{3})\n", out)
    assert m and float(m.group(1)) > 0.3 and abs(float(m.group(2))) < 0.3
    assert main(["analyze", str(tmp_path / "idx")]) == 0
    assert "still tracks length" not in capsys.readouterr().err


def test_recalibrate_keeps_every_document(chunked, tmp_path, capsys):
    copy = shutil.copytree(chunked, tmp_path / "copy", symlinks=True)
    before = NormIndex.load(copy)
    assert main(["recalibrate", str(copy)]) == 0
    after = NormIndex.load(copy)
    assert sorted(after.ids()) == sorted(before.ids()) and after.weights == before.weights
    assert main(["recalibrate", str(tmp_path / "nothing")]) == 1
    _one_error_line(capsys, "recalibrate")


def test_eval_shows_progress_while_fitting_unless_asked_not_to(tmp_path, capsys, encoder):
    root = _beir(tmp_path / "coll")
    assert main(["eval", str(root), "--folds", "2"]) == 0
    err = capsys.readouterr().err
    assert "normrank eval: searching 6 queries with cosine, BM25 and raw dot" in err
    assert "normrank eval: fitting 1/2 on 3 queries" in err and "normrank eval: fitting 2/2 on 3 queries" in err
    assert main(["eval", str(root), "--folds", "2", "--no-progress"]) == 0
    assert "fitting" not in capsys.readouterr().err


def test_analyze_counts_only_documents_that_were_cut(tmp_path, capsys, encoder):
    """Stored counts are capped at the window, so a document of exactly 256 tokens looked cut too
    (analyze said 109 where index had cut 107); analyze re-tokenises the stored texts at the window."""
    exact = ("word " * 254).strip()
    assert encoder.token_counts([exact])[0] == 256 and encoder.count_truncated([exact]) == 0
    src = tmp_path / "docs.jsonl"
    rows = [exact, "word " * 400, "word " * 300, *TEXTS]
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(rows)))
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--no-chunking", "--no-progress"]) == 0
    assert "2 of" in capsys.readouterr().err  # index's own count: two documents cut
    assert main(["analyze", str(tmp_path / "idx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["truncation"]["truncated"] == 2 and report["truncation"]["exact"] is True


def test_index_into_a_pgvector_table_says_so_and_search_reads_it_through_the_config(
        tmp_path, capsys, encoder, pg_dsn, pg_table_factory):
    """With store.backend pgvector, `index` said it indexed "into <out>", a folder it never makes, and
    `search` took only saved folders, so the CLI could not search the table it had filled."""
    import yaml

    from normrank.pgvector_store import PgVectorNormIndex

    root = tmp_path / "docs"
    root.mkdir()
    for i, text in enumerate(TEXTS):
        (root / f"d{i}.txt").write_text(text, encoding="utf-8")
    table = pg_table_factory("cli_pg")
    config = tmp_path / "pg.yaml"
    config.write_text(yaml.safe_dump({"store": {"backend": "pgvector", "dsn": pg_dsn, "table": table},
                                      "chunking": {"enabled": False}}), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["index", str(root), "--out", str(out), "--config", str(config), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert f"into the PostgreSQL table '{table}'" in captured.out and str(out) not in captured.out
    assert "--out is not used" in captured.err and not out.exists()
    assert main(["search", str(config), QUERIES[0], "-k", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    pg = PgVectorNormIndex(pg_dsn, table, encoder)
    try:
        assert [h["id"] for h in got["hits"]] == [h.id for h in pg.search(QUERIES[0], 3)]
        before = pg.weights
        assert main(["search", str(config), QUERIES[0], "--a", "0.5"]) != 0  # would change the shared table
        assert "every process" in _one_error_line(capsys, "search")
        again = PgVectorNormIndex(pg_dsn, table, encoder)
        assert again.weights == before
        again.close()
        # run again (a nightly re-index) after the source changed: the source's documents are replaced. The
        # second run failed with DuplicateIdError after encoding everything. Rows this run's source does not
        # name (a removed file, another source's or an app's documents) are kept: the table is shared.
        (root / "d0.txt").write_text("Glaciers carve valleys slowly.", encoding="utf-8")
        (root / "d1.txt").unlink()
        held = sorted(pg.ids())
        assert main(["index", str(root), "--out", str(out), "--config", str(config), "--no-progress"]) == 0
        assert "kept 1 other(s)" in capsys.readouterr().err
        third = PgVectorNormIndex(pg_dsn, table, encoder)
        assert sorted(third.ids()) == held
        assert third.get(["d0.txt"])[0].text == "Glaciers carve valleys slowly." and third.weights == before
        third.close()
    finally:
        pg.close()


def test_search_through_a_config_opens_a_saved_index_as_build_index_does(tmp_path, capsys, encoder):
    """``search <normrank.yaml>`` on a saved folder loaded it and ignored the file's scoring: section, so
    the same file ranked one way in the CLI and another in every from_config adapter."""
    import yaml

    from normrank import build_index

    root = _beir(tmp_path / "coll")
    out = tmp_path / "idx"
    assert main(["index", str(root), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    config = tmp_path / "normrank.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(out)}, "scoring": {"a": 2.0, "feature": "raw"}}),
                      encoding="utf-8")
    assert main(["search", str(config), QUERIES[0], "-k", "4", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = build_index(config)
    assert got["weights"] == want.weights.to_dict() and got["weights"]["a"] == 2.0
    assert [h["id"] for h in got["hits"]] == [h.id for h in want.search(QUERIES[0], 4)]
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "nothing-here")}}), encoding="utf-8")
    assert main(["search", str(config), QUERIES[0]]) == 1
    assert "no saved index" in _one_error_line(capsys, "search")


def test_analyze_does_not_advise_a_recalibration_that_cannot_help_a_small_index(tmp_path, capsys):
    """On a 54-passage index analyze advised `normrank recalibrate`, which printed the same Spearman, and the
    advice came back: with too few documents the calibration has too few length bins. It says so now."""
    r = np.random.default_rng(3)
    counts = r.integers(5, 300, size=54)
    v = r.normal(size=(54, 16)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    v *= (1.0 + counts / 100.0 + r.uniform(0, 0.05, size=54))[:, None].astype(np.float32)  # norm ~ length
    index = NormIndex(dim=16)
    index.add_vectors(v.astype(np.float32), counts, ids=[f"d{i}" for i in range(54)])
    index.save(tmp_path / "idx")
    assert main(["analyze", str(tmp_path / "idx")]) == 0
    err = capsys.readouterr().err
    assert "still tracks length" in err  # the small calibration left length in: the advice must fit that
    assert "`normrank recalibrate DIR`" not in err and "too few length bins" in err
    assert "only 54 documents" in err
