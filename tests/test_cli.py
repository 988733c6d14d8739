"""The ``normrank`` command, called as ``main([...])`` with the real model, FAISS and files on disk."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from normrank.cli import main, read_source
from normrank.errors import DatasetError
from normrank.store import NormIndex
from tests.conftest import synthetic

COMMANDS = ("demo", "index", "search", "fit", "eval", "analyze")

DOCS = [
    ("mito", "Mitochondria", "Mitochondrial DNA encodes 13 proteins of the respiratory chain, 22 tRNAs and 2 rRNAs."),
    ("cell", "Cells", "Cells are the basic units of life."),
    ("vacc", "Vaccines", "Vaccines train the adaptive immune system to recognise a pathogen's antigens."),
    ("star", "Massive stars", "A star of ten solar masses exhausts its core hydrogen in about twenty million years."),
    ("sun", "The Sun", "The Sun is a star."),
    ("rna", "RNA", "Messenger RNA carries the genetic code from DNA to the ribosome, where proteins are made."),
    ("empty", "", "   "),
]


def _jsonl(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    return _jsonl(d / "docs.jsonl.gz", [{"_id": i, "title": t, "text": x} for i, t, x in DOCS], gz=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus_file, encoder):
    out = tmp_path_factory.mktemp("idx") / "index"
    assert main(["index", str(corpus_file), "--out", str(out), "--no-progress"]) == 0
    return out


# ------------------------------------------------------------------ help and usage
@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(cmd, capsys):
    assert main([cmd, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: normrank {cmd}")


def test_usage_errors_are_one_line(capsys):
    assert main(["eval", "x", "--folds", "3", "--train-split", "train"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not allowed with argument" in err and "\n" not in err
    assert main(["search", "dir", "q", "-k", "0"]) == 2
    assert "positive integer" in capsys.readouterr().err


# ------------------------------------------------------------------ index
def test_index_skips_empty_documents_with_a_note(built, capsys, corpus_file, tmp_path):
    index = NormIndex.load(built)
    assert sorted(index.ids()) == sorted(d[0] for d in DOCS if d[2].strip())
    rec = index.get(["mito"])[0]
    assert rec.text.startswith("Mitochondria\n") and rec.metadata == {"title": "Mitochondria"}
    assert main(["index", str(corpus_file), "--out", str(tmp_path / "again"), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "skipped 1 empty document(s)" in captured.err and "['empty']" in captured.err
    assert "indexed 6 documents" in captured.out


def test_read_source_handles_text_folders_and_beir(tmp_path):
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.md").write_text("# A note\nabout stars", encoding="utf-8")
    (folder / "sub" / "b.txt").write_text("a text about cells", encoding="utf-8")
    (folder / "c.txt").write_text("  \n", encoding="utf-8")
    (folder / "ignored.pdf").write_bytes(b"%PDF")
    ids, texts, metas, skipped = read_source(folder)
    assert ids == ["a.md", "sub/b.txt"] and skipped == ["c.txt"]
    assert metas[1] == {"path": "sub/b.txt"} and texts[0].startswith("# A note")
    beir = tmp_path / "beir"
    beir.mkdir()
    _jsonl(beir / "corpus.jsonl", [{"_id": "d1", "title": "T", "text": "body", "metadata": {"year": 1}}])
    ids, texts, metas, _ = read_source(beir)
    assert (ids, texts, metas) == (["d1"], ["T\nbody"], [{"year": 1, "title": "T"}])


def test_read_source_errors_name_the_problem(tmp_path):
    with pytest.raises(DatasetError, match="no such file or folder"):
        read_source(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no .txt or .md files"):
        read_source(tmp_path / "empty")
    bad = _jsonl(tmp_path / "bad.jsonl", [{"_id": "x", "body": "no text key"}])
    with pytest.raises(DatasetError, match=r"bad\.jsonl:1 has no 'text' field"):
        read_source(bad)
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    d = tmp_path / "lat"
    d.mkdir()
    (d / "x.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DatasetError, match="not UTF-8"):
        read_source(d)
    # a file name that is not UTF-8 becomes an id no store takes: named with its file, not as "metadata 0"
    names = tmp_path / "names"
    names.mkdir()
    (names / "ok.txt").write_text("fine")
    with open(bytes(names) + b"/caf\xe9.txt", "w") as fh:
        fh.write("a Latin-1 file name")
    with pytest.raises(DatasetError, match=r"names/caf\\xe9\.txt: the file name is not valid UTF-8"):
        read_source(names)


def test_index_error_is_one_line_with_exit_1(tmp_path, capsys):
    assert main(["index", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("normrank index: error: no such file or folder") and "\n" not in err
    (tmp_path / "o2").mkdir()
    (tmp_path / "o2" / "precious.txt").write_text("keep me")
    src = _jsonl(tmp_path / "d.jsonl", [{"_id": "1", "text": "hello world"}, {"_id": "2", "text": "other text"}])
    assert main(["index", str(src), "--out", str(tmp_path / "o2"), "--no-progress"]) == 1
    assert "not a normrank index" in capsys.readouterr().err
    assert (tmp_path / "o2" / "precious.txt").read_text() == "keep me"


# ------------------------------------------------------------------ search
def test_search_json_explains_every_hit(built, capsys):
    assert main(["search", str(built), "What does mitochondrial DNA encode?", "-k", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["hits"]) == 3 and res["hits"][0]["id"] == "mito"
    for h in res["hits"]:
        assert h["score"] == pytest.approx(h["cosine"] + h["weight"] * h["norm_feature"], abs=1e-5)
    scores = [h["score"] for h in res["hits"]]
    assert scores == sorted(scores, reverse=True)


def test_search_text_output_and_k_above_corpus(built, capsys):
    assert main(["search", str(built), "how long do stars live", "-k", "50"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 hits for 'how long do stars live' (plain cosine)")
    assert "star" in out.splitlines()[2]


def test_search_missing_index_is_an_error(tmp_path, capsys):
    assert main(["search", str(tmp_path / "none"), "q"]) == 1
    assert "no saved index" in capsys.readouterr().err


# ------------------------------------------------------------------ fit
def test_fit_saves_weights_and_query_calibration(built, tmp_path, capsys):
    built = shutil.copytree(built, tmp_path / "copy", symlinks=True)  # leave the shared index as it was
    queries = _jsonl(tmp_path / "q.jsonl", [
        {"_id": "1", "text": "mitochondrial genome"}, {"_id": "2", "text": "how vaccines work"},
        {"_id": "3", "text": "lifetime of massive stars"}, {"_id": "4", "text": "what is the sun"},
        {"_id": "5", "text": "genetic code carrier"}, {"_id": "6", "text": "units of life"}])
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n1\tmito\t1\n2\tvacc\t1\n3\tstar\t1\n4\tsun\t1\n5\trna\t1\n"
                     "6\tcell\t1\n")
    assert NormIndex.load(built).query_calibrator is None
    assert main(["fit", str(built), "--queries", str(queries), "--qrels", str(qrels), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_queries"] == 6
    reloaded = NormIndex.load(built)
    assert reloaded.weights.to_dict() == report["weights"]
    assert reloaded.query_calibrator is not None and reloaded.query_calibrator.n_fitted == 6
    # a qrels document the index lacks is named, with the way out
    qrels.write_text("1\tmito\t1\n2\tgone\t1\n")
    assert main(["fit", str(built), "--queries", str(queries), "--qrels", str(qrels)]) == 1
    err = capsys.readouterr().err
    assert "'gone'" in err and "--allow-missing-docs" in err
    assert main(["fit", str(built), "--queries", str(queries), "--qrels", str(qrels), "--allow-missing-docs"]) == 0


# ------------------------------------------------------------------ analyze
def test_analyze_reports_and_plots(built, tmp_path, capsys):
    png = tmp_path / "norms.png"
    assert main(["analyze", str(built), "--plot", str(png), "--json", "--top", "2"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert res["n_docs"] == 6 and len(res["most_specific"]) == 2 and len(res["least_specific"]) == 2
    top, bottom = res["most_specific"][0], res["least_specific"][0]
    assert top["norm_feature"] >= bottom["norm_feature"]
    assert -1 <= res["spearman_norm_length"] <= 1
    assert any("only 6 documents" in w for w in res["warnings"])
    assert "warning: only 6 documents" in captured.err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analyze_warns_when_the_norm_is_only_length(tmp_path, capsys):
    vecs, counts = synthetic(400, dim=16, seed=3)
    vecs = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    vecs *= (5.0 * counts.astype(np.float32) ** -0.3)[:, None]  # norm is an exact function of length
    index = NormIndex(dim=16)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(400)])
    index.save(tmp_path / "lenonly")
    assert main(["analyze", str(tmp_path / "lenonly")]) == 0
    captured = capsys.readouterr()
    assert "almost entirely text length" in captured.err


def test_analyze_quiet_on_a_real_collection(cranfield, tmp_path, capsys):
    index = NormIndex()
    index.add_vectors(cranfield.vectors, cranfield.token_counts, ids=cranfield.ids)
    index.save(tmp_path / "cran")
    assert main(["analyze", str(tmp_path / "cran"), "--json"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert res["warnings"] == [] and captured.err == ""
    assert res["spearman_norm_length"] < -0.5  # raw norm tracks length
    assert abs(res["spearman_feature_length"]) < 0.1  # the calibration removes it


# ------------------------------------------------------------------ eval
def test_eval_json_on_a_real_collection(data_dir, capsys, encoder):
    path = data_dir / "cranfield"
    if not path.is_dir():
        pytest.skip("cranfield not in the data folder")
    assert main(["eval", str(path), "--json", "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["dataset"] == "cranfield" and res["n_queries"] == 225
    assert res["protocol"] == "5-fold cv on test"
    for run in ("cosine", "bm25", "rawdot", "normrank"):
        assert set(res["runs"][run]) >= {"ndcg@10", "recall@100"}
        assert all(isinstance(v, float) and 0 <= v <= 1 for v in res["runs"][run].values())
    p = res["significance"]["normrank_vs_cosine"]["p_ndcg@10"]
    assert isinstance(p, float)
    delta = res["runs"]["normrank"]["ndcg@10"] - res["runs"]["cosine"]["ndcg@10"]
    assert p >= 0.05 or delta > 0  # the fitted blend is never significantly worse than cosine
    assert len(res["fit"]["per_fold"]) == 5
    assert res["runs"]["rawdot"]["ndcg@10"] < res["runs"]["cosine"]["ndcg@10"]


def test_eval_errors(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 1
    assert "no qrels" in capsys.readouterr().err
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("q\td\t1\n")
    assert main(["eval", str(tmp_path), "--split", "dev"]) == 1
    assert "available splits: ['test']" in capsys.readouterr().err


def test_eval_finds_a_collection_by_name_under_data(tmp_path, capsys):
    """`--data` names a folder of collections; a bare name is looked up there."""
    import json as _json

    from normrank.cli import main as _main

    root = tmp_path / "collections"
    coll = root / "tiny"
    (coll / "qrels").mkdir(parents=True)
    texts = ["Stars fuse hydrogen into helium in their cores.", "Bread is made from flour, water and yeast.",
             "Mount Everest is the highest mountain above sea level.", "Vaccines train the immune system.",
             "The Amazon is the largest river by discharge.", "Quicksort is a fast sorting algorithm on average."]
    (coll / "corpus.jsonl").write_text("\n".join(_json.dumps({"_id": f"d{i}", "title": "", "text": t})
                                                 for i, t in enumerate(texts)))
    qs = ["what do stars burn", "how is bread made", "highest mountain", "how do vaccines work",
          "largest river", "fast sorting"]
    (coll / "queries.jsonl").write_text("\n".join(_json.dumps({"_id": f"q{i}", "text": q}) for i, q in enumerate(qs)))
    (coll / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"q{i}\td{i}\t1\n" for i in range(len(qs))))
    assert _main(["eval", "tiny", "--data", str(root), "--folds", "2", "--json", "--no-progress"]) == 0
    out = _json.loads(capsys.readouterr().out)
    assert out["dataset"] == "tiny" and out["n_queries"] == 6
    assert out["runs"]["cosine"]["ndcg@10"] > 0.9
    assert _main(["eval", "no-such-collection", "--data", str(root), "--no-progress"]) == 1
    assert "no-such-collection" in capsys.readouterr().err


def test_index_with_an_onnx_backend_and_search_reopens_with_it(corpus_file, tmp_path, capsys, monkeypatch):
    """``--backend`` picks the encoder backend; the saved index records it, so ``search`` encodes the
    query with it too; a GPU device in the config is refused by name, in one line."""
    pytest.importorskip("onnxruntime", reason="the ONNX backends need normrank[onnx]")
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "idx-int8"
    assert main(["index", str(corpus_file), "--out", str(out), "--backend", "onnx-int8", "--no-progress"]) == 0
    assert NormIndex.load(out).encoder.backend == "onnx-int8"
    assert ", backend onnx-int8, raw norms" in capsys.readouterr().out
    assert main(["search", str(out), "What does mitochondrial DNA encode?", "-k", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "mito"
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("encoder:\n  device: cuda\n")
    assert main(["index", str(corpus_file), "--out", str(tmp_path / "x"), "--config", str(cfg),
                 "--backend", "onnx", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "CPU" in err and "--backend onnx" in err and len(err.splitlines()) == 1
    assert main(["index", str(corpus_file), "--out", str(tmp_path / "y"), "--backend", "tpu"]) == 2


# ------------------------------------------------------------------ an operator's hunt
def test_fit_refuses_to_save_over_a_reindex_made_while_it_ran(built, tmp_path, capsys, monkeypatch):
    """`normrank fit` loads, fits, saves. A `normrank index` into the same folder while the fit ran was
    silently undone (the fit saved the old documents back) and both exited 0. Now the fit names the
    change and saves nothing; the re-index stands. A `recalibrate` is held to the same."""
    folder = shutil.copytree(built, tmp_path / "copy", symlinks=True)
    queries = _jsonl(tmp_path / "q.jsonl", [{"_id": str(i), "text": t} for i, t in enumerate(
        ["mitochondrial genome", "how vaccines work", "lifetime of massive stars", "what is the sun"])])
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("0\tmito\t1\n1\tvacc\t1\n2\tstar\t1\n3\tsun\t1\n")
    other = _jsonl(tmp_path / "other.jsonl", [{"_id": "x1", "text": "Rivers carve valleys over ages."},
                                              {"_id": "x2", "text": "Glaciers move slowly downhill."}])
    real_fit = NormIndex.fit

    def fit_while_reindexed(self, *args, **kwargs):
        report = real_fit(self, *args, **kwargs)
        assert main(["index", str(other), "--out", str(folder), "--no-progress"]) == 0
        return report

    monkeypatch.setattr(NormIndex, "fit", fit_while_reindexed)
    assert main(["fit", str(folder), "--queries", str(queries), "--qrels", str(qrels)]) == 1
    assert "changed since it was loaded" in capsys.readouterr().err
    assert sorted(NormIndex.load(folder).ids()) == ["x1", "x2"]
    monkeypatch.setattr(NormIndex, "fit", real_fit)
    real_recalibrate = NormIndex.recalibrate

    def recalibrate_while_reindexed(self):
        real_recalibrate(self)
        assert main(["index", str(corpus_rows(tmp_path)), "--out", str(folder), "--no-progress"]) == 0

    monkeypatch.setattr(NormIndex, "recalibrate", recalibrate_while_reindexed)
    assert main(["recalibrate", str(folder)]) == 1
    assert "changed since it was loaded" in capsys.readouterr().err
    assert sorted(NormIndex.load(folder).ids()) == ["y1", "y2", "y3"]


def corpus_rows(tmp_path):
    return _jsonl(tmp_path / "three.jsonl", [{"_id": f"y{i}", "text": t} for i, t in enumerate(
        ["Bees pollinate flowers.", "Whales sing across oceans.", "Volcanoes build islands."], 1)])


def test_search_on_an_index_whose_documents_were_all_deleted_answers_nothing(built, tmp_path, capsys):
    """It said "k must be a positive integer, got 0" although no -k was given."""
    index = NormIndex.load(built)
    index.delete(index.ids())
    index.save(tmp_path / "emptied")
    assert main(["search", str(tmp_path / "emptied"), "wing", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["hits"] == [] and "holds no document" in captured.err
    assert main(["search", str(tmp_path / "emptied"), "   "]) == 1  # a bad query is still named
    assert "empty or whitespace only" in capsys.readouterr().err


def test_jsonl_with_a_byte_order_mark_and_title_only_rows_and_hidden_files_index(tmp_path, capsys, encoder):
    """Windows tools write a UTF-8 BOM: corpus.jsonl and queries.jsonl failed on it (the qrels reader and
    YAML skipped it). A row with a title and no text is its title, as `eval` (load_beir) reads it. A
    folder's hidden files (.git, editor backups) are not documents."""
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in [
        {"_id": "a", "text": "Stars fuse hydrogen."}, {"_id": "b", "title": "Only a title here"}]).encode())
    assert main(["index", str(bom), "--out", str(tmp_path / "i1"), "--no-progress"]) == 0
    got = {r.id: r.text for r in NormIndex.load(tmp_path / "i1").get(["a", "b"])}
    assert got == {"a": "Stars fuse hydrogen.", "b": "Only a title here"}
    docs = tmp_path / "docs"
    (docs / ".git").mkdir(parents=True)
    (docs / "note.md").write_text("Rivers carve valleys.")
    (docs / ".draft.md").write_text("A hidden draft.")
    (docs / ".git" / "secret.txt").write_text("Not a document.")
    assert main(["index", str(docs), "--out", str(tmp_path / "i2"), "--no-progress"]) == 0
    assert {r.metadata["path"] for r in NormIndex.load(tmp_path / "i2").get(NormIndex.load(tmp_path / "i2").ids())} \
        == {"note.md"}
    capsys.readouterr()
    no_text = _jsonl(tmp_path / "none.jsonl", [{"_id": "z"}])
    assert main(["index", str(no_text), "--out", str(tmp_path / "i3"), "--no-progress"]) == 1
    assert "has no 'text' field" in capsys.readouterr().err


def test_output_into_a_closed_pipe_stops_quietly(built, tmp_path):
    """`normrank search ... | head -1` printed "error: Broken pipe" and exited 1."""
    import subprocess
    import sys

    cmd = (f"{sys.executable} -c 'import sys; from normrank.cli import main; sys.exit(main(sys.argv[1:]))' "
           f"search {built} 'stars' -k 6 | head -1")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert done.stdout.count("\n") == 1 and done.stderr == ""
    assert done.returncode == 0


def test_reindexing_a_folder_keeps_the_fitted_blend(tmp_path, capsys, encoder):
    """`normrank index` into a folder that `fit` had tuned replaced the fitted blend (a=0.05) and the query
    calibration with the defaults' plain cosine, without a word. They are kept, with a note; a config's
    `scoring:` keys still win, as they do over a YAML's store.path."""
    from normrank import Weights

    docs = tmp_path / "docs"
    docs.mkdir()
    for i, t in enumerate(["Stars fuse hydrogen into helium.", "Bread rises with yeast.",
                           "Rivers carve valleys.", "Vaccines train the immune system."]):
        (docs / f"d{i}.txt").write_text(t, encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["index", str(docs), "--out", str(out), "--no-progress"]) == 0
    tuned = NormIndex.load(out)
    tuned.set_weights(Weights(a=0.05, b=0.01))
    tuned.calibrate_queries(["how do stars shine", "bread", "what carves a valley in the mountains", "vaccines"] * 3)
    tuned.save(out)
    (docs / "d9.txt").write_text("Glaciers move slowly.", encoding="utf-8")
    capsys.readouterr()
    assert main(["index", str(docs), "--out", str(out), "--no-progress"]) == 0
    assert "kept the blend fitted earlier" in capsys.readouterr().err
    again = NormIndex.load(out)
    assert len(again) == 5 and again.weights == Weights(a=0.05, b=0.01)
    assert again.query_calibrator.to_dict() == tuned.query_calibrator.to_dict()
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text("scoring:\n  a: 0.0\n", encoding="utf-8")
    assert main(["index", str(docs), "--out", str(out), "--config", str(cfg), "--no-progress"]) == 0
    assert NormIndex.load(out).weights == Weights(a=0.0, b=0.01)



def test_reindexing_does_not_save_over_a_fit_that_landed_while_it_encoded(tmp_path, capsys, encoder, monkeypatch):
    """`normrank index` reads the fitted blend when it starts, then encodes for minutes; a `normrank fit` that
    saved in between was written over without a word (the fit lost). The run now saves only over the version
    it started from: it stops with a named error, and the fit stands. A run with nothing in between saves."""
    import normrank.cache as cli  # cmd_index encodes through normrank.cache.encode_cached
    from normrank import Weights

    docs = tmp_path / "docs"
    docs.mkdir()
    for i, t in enumerate(["Stars fuse hydrogen into helium.", "Bread rises with yeast.", "Rivers carve valleys."]):
        (docs / f"d{i}.txt").write_text(t, encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["index", str(docs), "--out", str(out), "--no-progress"]) == 0
    real_encode = cli.encode_cached

    def encode_while_a_fit_lands(*args, **kwargs):
        fit = NormIndex.load(out)  # what `normrank fit` does meanwhile, in another process
        fit.set_weights(Weights(a=0.07))
        fit.save(out, if_unchanged=True)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(cli, "encode_cached", encode_while_a_fit_lands)
    capsys.readouterr()
    assert main(["index", str(docs), "--out", str(out), "--no-progress"]) == 1
    assert "changed while this run encoded" in capsys.readouterr().err
    assert NormIndex.load(out).weights == Weights(a=0.07)
    monkeypatch.setattr(cli, "encode_cached", real_encode)
    assert main(["index", str(docs), "--out", str(out), "--no-progress"]) == 0  # run again: the fit is kept
    assert NormIndex.load(out).weights == Weights(a=0.07)
    fresh = tmp_path / "fresh"  # into a new folder where another run publishes first: the same
    monkeypatch.setattr(cli, "encode_cached", lambda *a, **k: (make_first(fresh), real_encode(*a, **k))[1])
    assert main(["index", str(docs), "--out", str(fresh), "--no-progress"]) == 1
    assert len(NormIndex.load(fresh)) == 2


def make_first(folder) -> None:
    vecs, counts = synthetic(2, dim=384, seed=5)
    index = NormIndex(dim=384)
    index.add_vectors(vecs, counts, ids=["x", "y"])
    index.save(folder)


def test_fit_names_qrels_that_judge_a_chunked_file(tmp_path, capsys, encoder):
    """The qrels name `notes/whales.txt`, which `normrank index` stored as passages `notes/whales.txt#0..#n`.
    The error said such documents were empty or from another corpus and advised --allow-missing-docs,
    which would fit with every judged file unretrievable."""
    docs = tmp_path / "docs" / "notes"
    docs.mkdir(parents=True)
    (docs / "whales.txt").write_text("Whales are large marine mammals that breathe air. " * 80, encoding="utf-8")
    (docs / "bread.txt").write_text("Bread rises with yeast.", encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["index", str(tmp_path / "docs"), "--out", str(out), "--no-progress"]) == 0
    assert any(i.startswith("notes/whales.txt#") for i in NormIndex.load(out).ids())
    queries = _jsonl(tmp_path / "q.jsonl", [{"_id": "1", "text": "whales"}, {"_id": "2", "text": "bread"}])
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("1\tnotes/whales.txt\t1\n2\tnotes/bread.txt\t1\n")
    capsys.readouterr()
    assert main(["fit", str(out), "--queries", str(queries), "--qrels", str(qrels)]) == 1
    err = capsys.readouterr().err
    assert "split into passages" in err and "'notes/whales.txt'" in err and "--no-chunking" in err


def test_search_table_escapes_control_characters_in_ids(tmp_path, capsys, encoder):
    """An id with a newline or tab (a file name can hold both) broke the result table over two lines."""
    src = _jsonl(tmp_path / "docs.jsonl", [
        {"_id": "odd\nname\t1", "text": "Stars fuse \x1b[2Jhydrogen into helium.", "metadata": {"source": "a\nb"}},
        {"_id": "plain", "text": "Bread rises with yeast.", "metadata": {"source": "c\x1b[31m"}}])
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "what do stars burn", "-k", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("   1 ", "   2 "))]
    assert len(rows) == 2 and "odd\\nname\\t1" in rows[0] and "\t" not in rows[0], out
    assert len(out.strip().splitlines()) == 4, out  # the title, the header and two hits
    assert "\x1b" not in out  # an ESC sequence in a text (it cleared the screen) is not printed
    # group headers print the group's value escaped as well (a newline split the header over two lines)
    assert main(["search", str(tmp_path / "idx"), "what do stars burn", "-k", "2", "--group-by", "source"]) == 0
    out = capsys.readouterr().out
    assert "source a\\nb  (best score" in out and "source c\\x1b[31m  (best score" in out and "\x1b" not in out


def test_index_options_that_were_ignored_are_named(tmp_path, capsys, encoder):
    """`--no-chunking --chunk-size 50` dropped the chunk size in silence; a config's `store.path` other than
    --out was neither written nor mentioned, and `normrank search CONFIG` then found no index; the config's
    `encoder.show_progress: false` still drew a bar."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Stars fuse hydrogen into helium.", encoding="utf-8")
    (docs / "b.txt").write_text("Bread rises with yeast.", encoding="utf-8")
    assert main(["index", str(docs), "--out", str(tmp_path / "i0"), "--no-chunking", "--chunk-size", "50"]) == 1
    assert "--no-chunking cannot go with --chunk-size" in capsys.readouterr().err
    cfg = tmp_path / "normrank.yaml"
    cfg.write_text("store:\n  path: elsewhere\nencoder:\n  show_progress: false\n", encoding="utf-8")
    assert main(["index", str(docs), "--out", str(tmp_path / "i1"), "--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert "the config's store.path" in err and "elsewhere" in err
    assert "it/s" not in err and "%|" not in err  # no progress bar
    assert not (tmp_path / "elsewhere").exists() and len(NormIndex.load(tmp_path / "i1")) == 2
