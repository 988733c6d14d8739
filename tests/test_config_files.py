"""A YAML file as users write it: paths relative to the file, ${VAR}s, hostile input, round trips."""

from __future__ import annotations

import numpy as np
import pytest

from normrank import ConfigError, ModelLoadError, load_config
from normrank.config import MAX_ECHO, EncoderConfig, NormRankConfig, build_encoder

BOMB = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 1: YAML anchors and aliases .* not allowed") as err:
        load_config(path)
    assert len(str(err.value)) < 400


def test_a_single_alias_is_refused_too(tmp_path):
    path = tmp_path / "n.yaml"
    path.write_text("langchain: &lc\n  k: 3\nhaystack: *lc\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_config(path)


def test_errors_never_echo_unbounded_input(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("scoring:\n  mode: " + "x" * 200_000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"'scoring\.mode'") as err:
        load_config(path)
    assert len(str(err.value)) < 300 + MAX_ECHO
    with pytest.raises(ConfigError) as err:
        load_config({"langchain": {"k": list(range(100_000))}})
    assert len(str(err.value)) < 300 + MAX_ECHO


def test_deep_and_non_utf8_yaml_are_config_errors(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("scoring: " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(deep)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("store:\n  path: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8 text .* at byte 18"):
        load_config(latin)
    huge = tmp_path / "huge.yaml"  # more digits than Python reads: a bare ValueError escaped
    huge.write_text("store:\n  ef_search: " + "9" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds a value YAML cannot read"):
        load_config(huge)


def test_store_path_is_relative_to_the_file_not_the_working_folder(tmp_path, monkeypatch):
    conf = tmp_path / "project" / "conf"
    conf.mkdir(parents=True)
    path = conf / "normrank.yaml"
    path.write_text("store:\n  path: ../indexes/main\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert load_config(path).store.path == str(conf / ".." / "indexes" / "main")
    path.write_text(f"store:\n  path: {tmp_path / 'abs'}\n", encoding="utf-8")
    assert load_config(path).store.path == str(tmp_path / "abs")
    # a dict has no file: its paths stay as given
    assert load_config({"store": {"path": "rel"}}).store.path == "rel"


def test_a_relative_model_folder_is_relative_to_the_file(tmp_path):
    (tmp_path / "models" / "mini").mkdir(parents=True)
    path = tmp_path / "normrank.yaml"
    path.write_text("encoder:\n  model: ./models/mini\n", encoding="utf-8")
    assert load_config(path).encoder.model == str(tmp_path / "models" / "mini")
    path.write_text("encoder:\n  model: sentence-transformers/some-hub-name\n", encoding="utf-8")
    assert load_config(path).encoder.model == "sentence-transformers/some-hub-name"  # not a folder here


def test_env_vars_expand_in_every_string(tmp_path, monkeypatch):
    monkeypatch.setenv("NR_TEST_DIR", "idx")
    monkeypatch.setenv("NR_TEST_DSN", "postgresql://u@h/db")
    monkeypatch.setenv("NR_TEST_SRC", "faq")
    path = tmp_path / "normrank.yaml"
    path.write_text("store:\n  path: data/${NR_TEST_DIR}\n  dsn: ${NR_TEST_DSN}\n"
                    "langchain:\n  filter: {source: [\"${NR_TEST_SRC}\", \"$${NOT_A_VAR}\"]}\n", encoding="utf-8")
    config = load_config(path)
    assert config.store.path == str(tmp_path / "data" / "idx")
    assert config.store.dsn == "postgresql://u@h/db"
    assert config.langchain.filter == {"source": ["faq", "${NOT_A_VAR}"]}


def test_a_missing_env_var_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("NR_SURELY_UNSET", raising=False)
    path = tmp_path / "normrank.yaml"
    path.write_text("store:\n  dsn: postgresql://${NR_SURELY_UNSET}@h/db\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"'store\.dsn' names the environment variable NR_SURELY_UNSET, which is "
                                          "not set"):
        load_config(path)


def test_every_encoder_setting_round_trips(tmp_path):
    config = load_config({"encoder": {"pooling": "sif", "sif_a": 0.01, "batch_size": 8, "max_seq_length": 128,
                                      "show_progress": False, "device": "cpu"}, "scoring": {"a": 0.02}})
    assert load_config(config.to_dict()) == config
    path = tmp_path / "dumped.yaml"
    path.write_text(config.dumps(), encoding="utf-8")
    assert load_config(path) == config
    assert load_config(path).encoder.pooling == "sif"



@pytest.mark.parametrize("given", [
    {"langchain": {"filter": {"version": "1e3", "n": "-2E5"}}},  # read back as the floats 1000.0 and -200000.0
    {"store": {"dsn": "postgresql://u:p${HOME}@h/db"}},  # a dict's literal ${: the reload expanded it
    {"langchain": {"filter": {"tag": "x$${y", "t": "a\x85b\u2028c d\u00e9"}}},  # NEL and LS folded into spaces
    {"langchain": {"filter": {"year": np.int64(2024), "w": [np.float32(0.5), (1, 2)]}}},  # to_dict failed
])
def test_dumps_reads_back_to_an_equal_config(given, tmp_path):
    """``dumps()`` promises YAML that ``load_config`` reads back to an equal config; text that normrank's reader
    takes for a number, a literal ``${``, line breaks YAML folds and NumPy numbers broke it."""
    config = load_config(given)
    assert load_config(config.to_dict()) == config
    path = tmp_path / "dumped.yaml"
    path.write_text(config.dumps(), encoding="utf-8")
    assert load_config(path) == config
    path.write_text(load_config(path).dumps(), encoding="utf-8")  # and again
    assert load_config(path) == config



def test_dumps_keeps_relative_paths_naming_the_same_place(tmp_path, monkeypatch):
    """A config made in Python with relative paths, dumped to a file in another folder, read back with them
    re-rooted at the file's folder: another index and model. ``dumps`` writes them absolute, as resolved here."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "minilm").mkdir(parents=True)
    config = load_config({"store": {"path": "indexes/main"}, "encoder": {"model": "./models/minilm"}})
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (elsewhere / "normrank.yaml").write_text(config.dumps(), encoding="utf-8")
    back = load_config(elsewhere / "normrank.yaml")
    assert back.store.path == str(tmp_path / "indexes" / "main")
    assert back.encoder.model == str(tmp_path / "models" / "minilm")
    hub = load_config({"encoder": {"model": "sentence-transformers/all-MiniLM-L6-v2"}})  # a name, not a folder
    assert "model: sentence-transformers/all-MiniLM-L6-v2" in hub.dumps()


def test_encoder_config_from_a_built_encoder_rebuilds_it(encoder):
    config = NormRankConfig(encoder=EncoderConfig(pooling="norm2", batch_size=16, max_seq_length=200))
    built = build_encoder(config)
    back = EncoderConfig.from_encoder(built)
    assert back.pooling == "norm2" and back.batch_size == 16 and back.max_seq_length == 200
    assert back.model is None  # the bundled model stays "null", portable across machines
    assert EncoderConfig.from_encoder(encoder).pooling == "mean"


def test_a_model_path_too_long_for_the_system_is_named_by_the_encoder(tmp_path):
    """A 2,000-character ``encoder.model`` made ``load_config`` raise a bare ``OSError`` (ENAMETOOLONG); the
    config loads, and the encoder names the model it cannot load, in a message of readable length."""
    path = tmp_path / "normrank.yaml"
    path.write_text("encoder:\n  model: " + "m" * 2000 + "\n", encoding="utf-8")
    config = load_config(path)
    assert config.encoder.model == "m" * 2000
    with pytest.raises(ModelLoadError, match="could not load embedding model") as info:
        _ = build_encoder(config).dim
    assert len(str(info.value)) < 1000 and "(2,000 characters)" in str(info.value)
