"""`normrank eval --model A --model B` and `normrank index --model`: the bundled MiniLM beside a tiny randomly
initialised BERT saved here (built from a config, no download), one side-by-side report, encodings cached per model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from normrank.cli import main


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 32-d, 2-layer BERT with random weights and MiniLM's tokenizer, saved as a stock ST folder."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    from normrank.encoders import default_model_path

    root = tmp_path_factory.mktemp("tiny")
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=512))
    bert.save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    st = SentenceTransformer(modules=[Transformer(str(root / "hf"), max_seq_length=128), Pooling(32, "mean"),
                                      Normalize()], device="cpu")
    st.save(str(root / "tiny-bert"))
    return root / "tiny-bert"


@pytest.fixture(scope="module")
def demo_beir(tmp_path_factory) -> Path:
    """Known-item search on the bundled demo corpus: each title is a query for its passage."""
    from normrank.datasets import demo_rows

    folder = tmp_path_factory.mktemp("demo-beir")
    (folder / "qrels").mkdir()
    rows = demo_rows()
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": r["_id"], "text": r["text"]}) + "\n"
                                                 for r in rows))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": r["title"]}) + "\n"
                                                  for i, r in enumerate(rows)))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\t{r['_id']}\t1\n" for i, r in enumerate(rows)))
    return folder


def test_two_models_side_by_side_json_text_and_png(demo_beir, tiny_model, tmp_path, capsys, monkeypatch, encoder):
    from normrank.cache import cache_key
    from normrank.encoders import RawEncoder, default_model_path

    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))
    png = tmp_path / "models.png"
    argv = ["eval", str(demo_beir), "--model", str(default_model_path()), "--model", str(tiny_model),
            "--folds", "3", "--no-progress"]
    assert main([*argv, "--json", "--plot", str(png)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in res["summary"]] == ["all-MiniLM-L6-v2", "tiny-bert"]
    assert [r["dim"] for r in res["summary"]] == [384, 32]
    assert len(res["models"]) == 2 and all(m["n_queries"] == res["n_queries"] == 48 for m in res["models"])
    mini, tiny = res["summary"]
    for row, full in zip(res["summary"], res["models"]):
        sig = full["significance"]["normrank_vs_cosine"]
        assert row["gain"] == pytest.approx(full["runs"]["normrank"]["ndcg@10"] - full["runs"]["cosine"]["ndcg@10"])
        assert row["p"] == sig["p_ndcg@10"] and 0.0 <= row["p"] <= 1.0
        assert row["bm25"] == full["runs"]["bm25"]["ndcg@10"]  # the same BM25 for every model
    assert mini["bm25"] == tiny["bm25"]
    assert mini["cosine"] > tiny["cosine"] + 0.2  # a trained model finds its passages; random weights do not
    assert png.read_bytes()[:4] == b"\x89PNG"
    # each model's encodings are cached under its own fingerprint
    texts = [json.loads(line)["text"] for line in (demo_beir / "corpus.jsonl").read_text().splitlines()]
    for model in (None, tiny_model):
        assert (tmp_path / "cache" / f"{cache_key(RawEncoder(model), texts)}.npz").is_file()
    n_cached = len(list((tmp_path / "cache").glob("*.npz")))
    assert main(argv) == 0  # the text report, from the cache
    text = capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("*.npz"))) == n_cached
    assert "all-MiniLM-L6-v2" in text and "tiny-bert" in text and "gain" in text and "[tiny-bert]" in text
    assert text.count("verdict:") == 2


def test_same_model_twice_and_a_missing_model_are_errors(demo_beir, tmp_path, capsys):
    from normrank.encoders import default_model_path

    assert main(["eval", str(demo_beir), "--model", str(default_model_path()), "--model",
                 str(default_model_path()), "--folds", "3"]) == 1
    assert "the same model is given twice" in capsys.readouterr().err
    assert main(["eval", str(demo_beir), "--model", str(tmp_path / "nope"), "--folds", "3"]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.strip().splitlines()) == 1


def test_index_with_model_saves_and_searches_with_that_model(demo_beir, tiny_model, tmp_path, capsys, monkeypatch):
    from normrank.store import NormIndex

    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "idx"
    assert main(["index", str(demo_beir), "--out", str(out), "--model", str(tiny_model), "--no-progress"]) == 0
    assert "tiny-bert" in capsys.readouterr().out
    index = NormIndex.load(out)
    assert Path(index.encoder.model_name) == tiny_model.resolve() and index.encoder.dim == 32
    hits = index.search("photosynthesis", 3)
    assert len(hits) == 3 and all(np.isfinite(h.score) for h in hits)
    assert main(["search", str(out), "photosynthesis", "-k", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["hits"]) == 2


def test_single_model_keeps_the_single_report_and_writes_a_png(demo_beir, tmp_path, capsys, monkeypatch, encoder):
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))
    png = tmp_path / "one.png"
    assert main(["eval", str(demo_beir), "--folds", "3", "--json", "--no-progress", "--plot", str(png)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["runs"]) == {"cosine", "bm25", "rawdot", "normrank"} and "models" not in res
    assert png.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ the benchmark scripts' --model
def _bench(name: str):
    import importlib.util
    import sys

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location(f"bench_{name}_models_test", root / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_quality_with_a_model_folder_writes_labelled_files_and_the_table_reads_them(
        data_dir, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))
    quality, models = _bench("quality"), _bench("models")
    assert quality.main(["--tiny", "--data", str(data_dir), "--collections", "cranfield", "--out", str(tmp_path),
                         "--model", str(tiny_model)]) == 0
    assert not (tmp_path / "quality.md").exists()  # the default model's files are left alone
    md = (tmp_path / "quality_tiny-bert.md").read_text()
    assert "tiny-bert (raw, 32-d)" in md and "| cranfield-tiny | normrank |" in md
    assert (tmp_path / "quality_cranfield-tiny_tiny-bert.png").read_bytes()[:4] == b"\x89PNG"
    # a later run of another collection keeps this one, and the merged report renders
    data = json.loads((tmp_path / "quality_tiny-bert.json").read_text())
    other = {**data["results"][0], "name": "other", "prune": {0.05: data["results"][0]["prune"]["0.05"],
                                                              0.1: data["results"][0]["prune"]["0.1"]}}
    merged = quality.merge_earlier(tmp_path / "quality_tiny-bert.json", [other])
    assert [r["name"] for r in merged] == ["cranfield-tiny", "other"]
    assert "- other:" in quality.markdown(merged, data["meta"]) and "- cranfield-tiny:" in quality.markdown(
        merged, data["meta"])
    # the per-model table: a non-tiny copy of that json, as a full run writes it
    data["meta"]["tiny"] = ""
    (tmp_path / "quality_tiny-bert.json").write_text(json.dumps(data))
    table = models.write_table(tmp_path).read_text()
    row = next(line for line in table.splitlines() if line.startswith("| tiny-bert | cranfield-tiny |"))
    nr = next(r for r in data["results"][0]["rows"] if r["run"] == "normrank")
    assert f"{nr['ndcg@10']:.4f}" in row and f"{nr['t_ndcg']['delta']:+.4f}" in row
    assert "Missing cells" in table and "tiny-bert / scifact" in table


def test_model_names_of_the_benchmark_scripts(tiny_model):
    models = _bench("models")
    assert models.resolve(None) == (None, "", "all-MiniLM-L6-v2") == models.resolve("minilm")
    path, label, name = models.resolve(str(tiny_model))
    assert Path(path) == tiny_model.resolve() and label == name == "tiny-bert"
    assert models.suffixed("quality.md", "mpnet") == "quality_mpnet.md"
    assert models.suffixed("quality_cisi.png", "mpnet") == "quality_cisi_mpnet.png"
    assert models.suffixed("quality.md", "") == "quality.md"
    with pytest.raises(SystemExit, match="neither minilm, mpnet nor a model folder"):
        models.resolve("/no/such/model")


def _variant(src: Path, dst: Path, n_queries: int, *, extras: bool = False) -> Path:
    """A copy of ``src`` judging only its first ``n_queries`` queries; ``extras`` adds an empty document and a
    query judged only with grade 0 (both left out of the evaluation, which the report must say)."""
    import shutil

    shutil.copytree(src, dst)
    lines = (src / "qrels" / "test.tsv").read_text().splitlines()
    rows = lines[1:n_queries + 1]
    if extras:
        with (dst / "corpus.jsonl").open("a") as fh:
            fh.write(json.dumps({"_id": "empty-doc", "text": ""}) + "\n")
        rows.append(f"{lines[-1].split()[0]}\t{lines[-1].split()[1]}\t0")
    (dst / "qrels" / "test.tsv").write_text("\n".join([lines[0], *rows]) + "\n")
    return dst


def test_a_named_data_folder_wins_over_a_same_named_folder_here(demo_beir, tmp_path, capsys, monkeypatch, encoder):
    """A researcher's hunt: `eval mycoll --data DIR` read ./mycoll when the working folder had one, and the
    report did not say which folder it read."""
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data"
    _variant(demo_beir, data / "mycoll", 48)
    here = tmp_path / "here"
    _variant(demo_beir, here / "mycoll", 20)
    monkeypatch.chdir(here)
    monkeypatch.delenv("NORMRANK_DATA", raising=False)
    argv = ["eval", "mycoll", "--folds", "3", "--json", "--no-progress"]
    assert main([*argv, "--data", str(data)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_queries"] == 48 and res["path"] == str((data / "mycoll").resolve())
    monkeypatch.setenv("NORMRANK_DATA", str(data))
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["n_queries"] == 48
    monkeypatch.delenv("NORMRANK_DATA")
    monkeypatch.setattr("normrank.datasets.default_data_dir", lambda: None)
    assert main(argv) == 0  # no data folder named: the folder here, as given
    res = json.loads(capsys.readouterr().out)
    assert res["n_queries"] == 20 and res["path"] == str((here / "mycoll").resolve())
    assert main(["eval", "./mycoll", "--data", str(data), "--folds", "3", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["n_queries"] == 20  # a path is a path
    monkeypatch.chdir(here / "mycoll")
    assert main(["eval", ".", "--folds", "3", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["dataset"] == "mycoll"  # "." was shown as an empty name


def test_the_side_by_side_report_says_what_was_left_out(demo_beir, tiny_model, tmp_path, capsys, monkeypatch,
                                                        encoder):
    from normrank.encoders import default_model_path

    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path / "cache"))
    coll = _variant(demo_beir, tmp_path / "coll", 47, extras=True)
    argv = ["eval", str(coll), "--model", str(default_model_path()), "--model", str(tiny_model),
            "--folds", "3", "--no-progress"]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "1 empty documents skipped" in first and "1 judged queries with no relevant document" in first
    assert main([*argv, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["skipped_empty_docs"], res["queries_without_relevant"]) == (1, 1)


def test_a_relative_model_path_that_does_not_exist_is_named_at_once(demo_beir, tmp_path, capsys, monkeypatch):
    """`--model models/nope` beside a `models` folder failed with the hub library's "couldn't connect to
    huggingface.co". It is still tried as a hub name in the local cache (a folder here named like a hub
    organisation must not hide that model), and the error says what was looked for."""
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(demo_beir), "--model", "models/nope", "--folds", "3"]) == 1
    err = capsys.readouterr().err
    assert "there is no folder 'models/nope'" in err and "local Hugging Face cache" in err
    assert "huggingface.co" not in err
