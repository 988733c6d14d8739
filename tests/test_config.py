"""The YAML configuration: strict validation with useful messages, and the documented example file.

The example at the repo root must stay in step with the pydantic models (every key present and
commented) and must build every adapter.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from normrank import ConfigError, NormIndex, Weights, build_index, load_config
from normrank.config import NormRankConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "normrank.example.yaml"


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out |= _keys(field.annotation, f"{prefix}{name}.")
    return out


def _yaml_keys(data: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in data.items():
        out.add(prefix + key)
        if isinstance(value, dict) and prefix == "":
            out |= _yaml_keys(value, f"{key}.")
    return out


def test_example_file_documents_every_key_with_its_default():
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert _yaml_keys(data) == _keys(NormRankConfig)
    assert load_config(EXAMPLE) == NormRankConfig()  # the documented values are the defaults


def test_every_key_in_the_example_is_commented():
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*[a-z_]+:", line):
            assert "#" in line, f"undocumented key line: {line!r}"


@pytest.mark.parametrize(("data", "expected"), [
    ({"langchain": {"kk": 3}}, r"unknown key 'langchain\.kk'; allowed keys here: filter, k"),
    ({"scoring": {"mode": "sideways"}}, r"'scoring\.mode'.*'additive', 'multiplicative' or 'tiebreak'.*sideways"),
    ({"llamaindex": {"calibration": "corpus"}}, r"'llamaindex\.calibration'.*'auto', 'index' or 'candidates'"),
    ({"haystack": {"top_k": "ten"}}, r"'haystack\.top_k'.*valid integer.*'ten'"),
    ({"haystack": {"top_k": 0}}, r"'haystack\.top_k'.*greater than 0"),
    ({"encoder": {"batch_size": -1}}, r"'encoder\.batch_size'.*greater than 0"),
    ({"store": {"index_type": "annoy"}}, r"'store\.index_type'.*'flat', 'hnsw' or 'ivf'"),
    ({"fit": {"modes": ["additive", "x"]}}, r"'fit\.modes\.1'.*'additive', 'multiplicative' or 'tiebreak'"),
    ({"lanchain": {"k": 3}}, r"unknown key 'lanchain'; allowed keys here: calibration, chunking, encoder, fit, haystack"),
    ({"scoring": "additive"}, r"'scoring'.*valid dictionary"),
    ({"encoder": {"device": "gpu"}}, r"'encoder\.device'.*torch device such as 'cpu', 'cuda'.*got 'gpu'"),
    ({"scoring": {"a": 1e39}}, r"'scoring\.a'.*less than or equal to 1000"),
    ({"scoring": {"b": -2000}}, r"'scoring\.b'.*greater than or equal to -1000"),
    ({"scoring": {"mode": "tiebreak", "epsilon": 1e6}}, r"'scoring\.epsilon'.*less than or equal to 1000"),
])
def test_wrong_key_or_type_names_the_path_and_the_allowed(data, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(data)


def test_errors_from_a_file_name_the_file(tmp_path):
    bad = tmp_path / "normrank.yaml"
    bad.write_text("scoring:\n  a: 0.1\n  mdoe: additive\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"in .*normrank\.yaml: unknown key 'scoring\.mdoe'; allowed keys here: a, b"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad.write_text("scoring: [a\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


def test_a_partial_file_keeps_the_other_defaults(tmp_path):
    path = tmp_path / "normrank.yaml"
    path.write_text("scoring:\n  a: 0.02\nlangchain:\n  k: 7\n", encoding="utf-8")
    config = load_config(path)
    assert config.scoring.a == 0.02 and config.langchain.k == 7
    assert config.haystack.top_k == 10 and config.store.index_type == "flat"


def test_example_file_builds_every_adapter(encoder):
    from haystack_integrations.components.rankers.normrank import NormRankRanker
    from langchain_normrank import NormRankRetriever as LangChainRetriever
    from llama_index.postprocessor.normrank import NormRankPostprocessor
    from llama_index.retrievers.normrank import NormRankRetriever as LlamaRetriever

    config = load_config(EXAMPLE)
    with pytest.warns(UserWarning, match="empty index"):  # the example has no saved index: an empty one
        lc = LangChainRetriever.from_config(EXAMPLE)
    assert isinstance(lc.index, NormIndex) and lc.k == config.langchain.k and lc.filter is None
    with pytest.raises(ValueError, match="allow_empty=True"):  # EmptyCorpusError, not a silent []
        lc.invoke("anything")
    assert LangChainRetriever.from_config(EXAMPLE, allow_empty=True).invoke("anything") == []
    li = LlamaRetriever.from_config(EXAMPLE)
    assert li.similarity_top_k == config.llamaindex.similarity_top_k
    post = NormRankPostprocessor.from_config(EXAMPLE)
    assert (post.top_n, post.keep_retrieval_score, post.cache_size) == (5, True, 10_000)
    assert post.weights == Weights() and post.calibrator is None
    ranker = NormRankRanker.from_config(EXAMPLE)
    assert (ranker.top_k, ranker.keep_retrieval_score, ranker.cache_size) == (10, True, 10_000)
    assert ranker.weights == Weights() and ranker.to_dict()["init_parameters"]["model"] is None


def test_one_file_configures_everything(tmp_path, encoder, demo_texts, demo_encoded):
    """A saved index plus per-adapter options: every adapter serves that index's blend."""
    from haystack_integrations.components.rankers.normrank import NormRankRanker
    from langchain_normrank import NormRankRetriever
    from llama_index.postprocessor.normrank import NormRankPostprocessor

    index = NormIndex(encoder, weights=Weights(a=0.02))
    index.add_vectors(*demo_encoded, ids=[f"d{i}" for i in range(len(demo_texts))], texts=demo_texts)
    index.save(tmp_path / "idx")
    path = tmp_path / "normrank.yaml"
    path.write_text(
        f"store:\n  path: {tmp_path / 'idx'}\n"
        "langchain:\n  k: 2\n"
        "llamaindex:\n  top_n: 3\n  calibration: index\n"
        "haystack:\n  top_k: 4\n  calibration: index\n", encoding="utf-8")
    assert build_index(path).weights == Weights(a=0.02)
    lc = NormRankRetriever.from_config(path)
    assert len(lc.invoke("stars")) == 2 and lc.invoke("stars")[0].metadata["normrank"]["weight"] == pytest.approx(0.02)
    post = NormRankPostprocessor.from_config(path)
    assert post.top_n == 3 and post.weights == Weights(a=0.02) and post.calibrator == index.calibrator
    ranker = NormRankRanker.from_config(path)
    assert ranker.top_k == 4 and ranker.weights == Weights(a=0.02) and ranker.calibrator == index.calibrator


def test_a_yaml_without_an_encoder_section_reopens_a_saved_index_with_its_own_encoder(tmp_path, demo_texts):
    """``build_index`` (and every ``from_config``) passed the file's default encoder: an index encoded with
    another pooling or backend was reopened with torch mean pooling, and queries no longer matched."""
    from normrank.config import build_index
    from normrank.pooling import PooledEncoder
    from normrank.store import NormIndex

    index = NormIndex(PooledEncoder(pooling="norm", show_progress=False))
    index.add_texts(demo_texts[:6], ids=[f"d{i}" for i in range(6)])
    index.save(tmp_path / "ix")
    (tmp_path / "plain.yaml").write_text("store:\n  path: ix\n", encoding="utf-8")
    reopened = build_index(tmp_path / "plain.yaml")
    assert isinstance(reopened.encoder, PooledEncoder) and reopened.encoder.pooling == "norm"
    assert [h.id for h in reopened.search(demo_texts[2], 3)] == [h.id for h in index.search(demo_texts[2], 3)]
    (tmp_path / "mine.yaml").write_text("store:\n  path: ix\nencoder:\n  batch_size: 8\n", encoding="utf-8")
    assert build_index(tmp_path / "mine.yaml").encoder.describe().get("pooling", "mean") == "mean"  # the file wins


def test_pgvector_limits_are_named_at_load():
    """pgvector allows less than FAISS (hnsw_m <= 100, ef_search <= 1000, ef_construction >= 2 hnsw_m): the
    YAML accepted such values and they failed later, in build_index or after the CLI loaded the model,
    without the key's name. FAISS keeps its wider ranges."""
    base = {"backend": "pgvector", "dsn": "postgresql://u:secret@localhost/db"}
    for extra, key in (({"ef_search": 5000}, "store.ef_search"), ({"hnsw_m": 200, "ef_construction": 1000},
                                                                    "store.hnsw_m"),
                       ({"hnsw_m": 64, "ef_construction": 100}, "ef_construction >= 2 * hnsw_m")):
        with pytest.raises(ConfigError, match=re.escape(key)) as info:
            load_config({"store": {**base, **extra}})
        assert "secret" not in str(info.value)
    assert load_config({"store": {"ef_search": 5000, "hnsw_m": 200, "ef_construction": 300}}).store.ef_search == 5000
    assert load_config({"store": {**base, "ef_search": 1000, "hnsw_m": 100}}).store.hnsw_m == 100


def test_a_folder_given_as_the_config_file_is_named_as_a_folder(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)


@pytest.mark.parametrize(("index_type", "name", "value"), [("hnsw", "ef_search", 7), ("ivf", "nprobe", 3)])
def test_a_saved_index_takes_the_files_search_settings_and_refuses_other_build_settings(
        tmp_path, index_type, name, value):
    """``store.ef_search`` / ``store.nprobe`` were silently ignored for an index saved at ``store.path``
    (searched with the saved 128 / 16), and a ``store.index_type`` other than the saved one was too."""
    from .conftest import synthetic

    vecs, counts = synthetic(600, dim=16, seed=3)
    index = NormIndex(dim=16, weights=Weights(a=0.05), index_type=index_type, nlist=8)
    index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(600)])
    index.save(tmp_path / "ix")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"store:\n  path: ix\n  index_type: {index_type}\n  {name}: {value}\n", encoding="utf-8")
    opened = build_index(cfg)
    assert getattr(opened, name) == value
    if index_type == "hnsw":
        import faiss

        assert faiss.downcast_index(opened._index.index).hnsw.efSearch == value
    else:
        assert opened._index.nprobe == value
    cfg.write_text("store:\n  path: ix\n", encoding="utf-8")
    assert getattr(build_index(cfg), name) == getattr(index, name)  # not named: as saved
    other = "flat" if index_type != "flat" else "hnsw"
    for line in (f"index_type: {other}", "nlist: 4" if index_type == "ivf" else "hnsw_m: 8"):
        cfg.write_text(f"store:\n  path: ix\n  {line}\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=f"store.{line.split(':')[0]} is .* but the index saved at"):
            build_index(cfg)
    # a setting of another kind of index is of no use to this one: ignored, as when an index is built
    cfg.write_text(f"store:\n  path: ix\n  {'hnsw_m: 8' if index_type == 'ivf' else 'nlist: 4'}\n", encoding="utf-8")
    assert len(build_index(cfg)) == 600
    # the calibration: section applies when an index is built: another value was ignored in silence
    cfg.write_text("store:\n  path: ix\ncalibration:\n  max_bins: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="calibration.max_bins is 3, but the index saved at .* was calibrated with 12"):
        build_index(cfg)
    cfg.write_text("store:\n  path: ix\ncalibration:\n  max_bins: 12\n", encoding="utf-8")
    assert build_index(cfg).calibrator.max_bins == 12


@pytest.mark.parametrize("backend", ["faiss", "pgvector"])
def test_scoring_keys_the_file_names_override_a_saved_blend_and_the_rest_keep_it(
        tmp_path, encoder, demo_encoded, backend, request):
    """The section was compared with the defaults as a whole: ``scoring: {a: 0.0, b: 0.0}`` (plain cosine,
    as the example says) left a saved a=0.03 on, and ``scoring: {clip: 2.0}`` alone reset it to cosine."""
    from normrank.config import build_index
    from normrank.scoring import Weights
    from normrank.store import NormIndex

    vecs, counts = demo_encoded
    saved = Weights(a=0.03, feature="raw")
    if backend == "faiss":
        index = NormIndex(encoder, weights=saved)
        index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(len(vecs))])
        index.save(tmp_path / "ix")
        store = "store:\n  path: ix\n"
    else:
        from normrank.pgvector_store import PgVectorNormIndex

        dsn, table = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_table_factory")("cfg")
        index = PgVectorNormIndex(dsn, table, encoder, weights=saved)
        index.add_vectors(vecs, counts, ids=[f"d{i}" for i in range(len(vecs))])
        store = f"store:\n  backend: pgvector\n  dsn: {dsn}\n  table: {table}\n"
    for scoring, want in (("", saved), ("scoring: {}\n", saved),
                          ("scoring:\n  a: 0.0\n  b: 0.0\n", saved.replace(a=0.0)),
                          ("scoring:\n  clip: 2.0\n", saved.replace(clip=2.0))):
        (tmp_path / "c.yaml").write_text(store + scoring, encoding="utf-8")
        assert build_index(tmp_path / "c.yaml").weights == want, scoring
        if backend == "pgvector":  # the same file again changes nothing: no write, the state version stays
            version = PgVectorNormIndex(dsn, table)._version
            assert build_index(tmp_path / "c.yaml").weights == want and PgVectorNormIndex(dsn, table)._version == version
        if backend == "pgvector":  # the table is shared: put the saved blend back for the next case
            index.set_weights(saved)


def test_values_from_environment_variables_are_converted_and_checked(tmp_path, monkeypatch):
    """A ${VAR} value is text by nature: it is converted to the key's type (and checked), while the same
    text written in the file is refused; an error elsewhere is named without the variable's value."""
    monkeypatch.setenv("NR_A", "0.05")
    monkeypatch.setenv("NR_K", "7")
    monkeypatch.setenv("NR_BAD", "many")
    f = tmp_path / "env.yaml"
    f.write_text("scoring:\n  a: ${NR_A}\nlangchain:\n  k: ${NR_K}\n", encoding="utf-8")
    config = load_config(f)
    assert (config.scoring.a, config.langchain.k) == (0.05, 7)
    f.write_text("langchain:\n  k: ${NR_BAD}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"'langchain\.k': Input should be a valid integer.*\(got 'many'\)"):
        load_config(f)
    f.write_text("scoring:\n  a: ${NR_A}\nstore:\n  hnsw_m: '32'\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"'store\.hnsw_m'") as info:
        load_config(f)
    assert "scoring.a" not in str(info.value)


def test_a_whole_float_where_an_integer_goes_is_read_as_that_number():
    """YAML reads 2.0e+9 as a float: a whole float is taken as the integer it is and range-checked (the
    range is what is wrong with it), a fractional one is a type error."""
    assert load_config({"langchain": {"k": 4.0}}).langchain.k == 4
    with pytest.raises(ConfigError, match=r"'store\.ef_search': Value error, ef_search must be in \[1, 65536\]"):
        load_config({"store": {"ef_search": 2.0e9}})


@pytest.mark.parametrize(("text", "expected"), [
    ("store:\n  hnsw_m: '32'\n", r"'store\.hnsw_m': Input should be a valid integer \(got '32'\)"),
    ("scoring:\n  a: '0.02'\n", r"'scoring\.a': Input should be a valid number \(got '0.02'\)"),
    ("langchain:\n  k: 4.5\n", r"'langchain\.k': Input should be a valid integer \(got 4.5\)"),
    ("chunking:\n  enabled: 'yes'\n", r"'chunking\.enabled': Input should be a valid boolean"),
])
def test_a_file_value_of_the_wrong_type_is_refused_not_converted(tmp_path, text, expected):
    """A YAML file's '32' for an integer (or '0.02' for a number) was converted in silence, where the
    Python API refuses it; a dict from Python keeps taking NumPy numbers and tuples, as the API does."""
    f = tmp_path / "bad.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=expected):
        load_config(f)


def test_exponents_without_a_dot_and_python_values_load():
    """YAML 1.1 reads 1e-2 as text: it is a number here, as in YAML 1.2. A dict from Python takes NumPy
    scalars and tuples."""
    import numpy as np

    config = load_config({"store": {"hnsw_m": np.int64(16)}, "fit": {"modes": ("additive", "tiebreak")},
                          "scoring": {"squash": np.bool_(True)}})
    assert (config.store.hnsw_m, config.fit.modes, config.scoring.squash) == (16, ["additive", "tiebreak"], True)



def test_a_yaml_exponent_without_a_dot_is_a_number(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("scoring:\n  a: 1e-2\n  epsilon: 5e-3\nfit:\n  alpha: 5e-2\nstore:\n  ef_search: 1e3\n",
                 encoding="utf-8")
    config = load_config(f)
    assert (config.scoring.a, config.scoring.epsilon, config.fit.alpha, config.store.ef_search) == (0.01, 0.005, 0.05, 1000)
