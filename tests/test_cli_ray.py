"""`normrank index --ray` keeps Ray's log lines off the terminal unless -v."""

from __future__ import annotations

import json
import shutil

import pytest

from normrank.cli import main
from normrank.store import NormIndex

pytest.importorskip("ray.data", reason="distributed encoding needs Ray Data: pip install 'normrank[ray]'")


def test_index_with_ray_is_quiet_without_verbose(tmp_path, capfd, encoder, monkeypatch):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"passage {i} about stars and cells"}) + "\n"
                           for i in range(12)), encoding="utf-8")
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--ray", "--ray-actors", "1",
                 "--no-progress"]) == 0
    captured = capfd.readouterr()
    assert captured.out.startswith("indexed 12 documents with Ray into")
    for noise in ("Started a local Ray instance", "Starting execution of Dataset", "Execution plan of Dataset",
                  "execution finished", "Data sink Parquet finished", " INFO "):
        assert noise not in captured.err, captured.err
    assert len(NormIndex.load(tmp_path / "idx")) == 12
    # again into the same --out: named before Ray starts, with what to do; a foreign --out too
    capfd.readouterr()
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--ray", "--no-progress"]) == 1
    err = capfd.readouterr().err
    assert "idx-encoded exists" in err and "earlier --ray run: delete it to encode again" in err
    # a blend fitted into the folder is kept by a --ray re-index too (it was reset to plain cosine)
    from normrank import Weights

    tuned = NormIndex.load(tmp_path / "idx")
    tuned.set_weights(Weights(a=0.05))
    tuned.save(tmp_path / "idx")
    shutil.rmtree(tmp_path / "idx-encoded")
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--ray", "--ray-actors", "1",
                 "--no-progress"]) == 0
    assert "kept the blend fitted earlier" in capfd.readouterr().err
    assert NormIndex.load(tmp_path / "idx").weights == Weights(a=0.05)
    # a `normrank fit` that saves while Ray encodes stands: the run saves only over the version it started
    # from (it wrote over the fit without a word)
    import normrank.distributed as distributed

    real_encode = distributed.encode_corpus

    def encode_while_a_fit_lands(*args, **kwargs):
        fit = NormIndex.load(tmp_path / "idx")
        fit.set_weights(Weights(a=0.07))
        fit.save(tmp_path / "idx", if_unchanged=True)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(distributed, "encode_corpus", encode_while_a_fit_lands)
    shutil.rmtree(tmp_path / "idx-encoded")
    assert main(["index", str(src), "--out", str(tmp_path / "idx"), "--ray", "--ray-actors", "1",
                 "--no-progress"]) == 1
    assert "changed while Ray encoded" in capfd.readouterr().err
    assert NormIndex.load(tmp_path / "idx").weights == Weights(a=0.07)
    monkeypatch.setattr(distributed, "encode_corpus", real_encode)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own file")
    assert main(["index", str(src), "--out", str(tmp_path / "mine"), "--ray", "--no-progress"]) == 1
    assert "not a normrank index" in capfd.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's own file"
    assert not (tmp_path / "mine-encoded").exists()
