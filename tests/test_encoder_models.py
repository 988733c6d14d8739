"""RawEncoder beyond MiniLM (issue 13 item 3), on tiny randomly initialised models built here.

No download: each model is a one-layer BERT or DistilBERT made from a config, with a WordPiece
tokenizer built from the demo corpus' words, wrapped in sentence-transformers modules and
saved to a temporary folder. They are wide where width matters (768 and 1024 dimensions)
and tiny everywhere else. What is checked against transformers run by hand: the raw vector
is exactly the model's pooling (CLS, max, mean) with only the normalisation dropped.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from normrank import RawEncoder, UnitNormError

try:  # sentence-transformers >= 6
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
except ImportError:  # pragma: no cover - older sentence-transformers
    from sentence_transformers.models import Normalize, Pooling, Transformer

MAX_LEN = 64
TEXTS = ["the peace of westphalia", "a", "metformin lowers hepatic glucose production in type 2 diabetes",
         "sourdough bread rises slowly " * 30]


def _vocab(demo_texts: list[str]) -> list[str]:
    words: dict[str, int] = {}
    for t in demo_texts:
        for w in re.findall(r"[a-z]+", t.lower()):
            words[w] = words.get(w, 0) + 1
    common = sorted(words, key=lambda w: (-words[w], w))[:300]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789")
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *[f"##{c}" for c in letters], *common,
            *".,;:'\"!?()-"]


def _tokenizer(vocab: list[str], token_type_ids: bool):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    names = ["input_ids", "token_type_ids", "attention_mask"] if token_type_ids else ["input_ids", "attention_mask"]
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=MAX_LEN,
                                   model_input_names=names)


def build_model(root: Path, name: str, vocab: list[str], *, arch: str = "bert", hidden: int = 768,
                pooling: str = "mean", normalize: str = "present", trained_norms: bool = True) -> Path:
    """Save a tiny sentence-transformers model; ``normalize``: present / missing (listed, folder absent) / none."""
    from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel

    torch.manual_seed(len(name))
    if arch == "bert":
        model = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=32, max_position_embeddings=MAX_LEN))
    else:
        model = DistilBertModel(DistilBertConfig(vocab_size=len(vocab), dim=hidden, n_layers=1, n_heads=4,
                                                 hidden_dim=32, max_position_embeddings=MAX_LEN))
    if trained_norms:  # at initialisation every LayerNorm has gain 1 and bias 0, so each token's norm is fixed
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.LayerNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0.0, 0.2)
    hf = root / f"{name}-hf"
    model.save_pretrained(hf)
    _tokenizer(vocab, token_type_ids=arch == "bert").save_pretrained(hf)
    transformer = Transformer(str(hf), max_seq_length=MAX_LEN)
    modules = [transformer, Pooling(hidden, pooling_mode=pooling)]
    if normalize != "none":
        modules.append(Normalize())
    from sentence_transformers import SentenceTransformer

    out = root / name
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    if normalize == "missing":  # as the all-mpnet-base-v2 zip ships: listed in modules.json, no folder
        shutil.rmtree(out / "2_Normalize")
        assert "Normalize" in (out / "modules.json").read_text()
    return out


def by_hand(folder: Path, texts: list[str], pooling: str) -> np.ndarray:
    """The pooled sentence vector computed with transformers alone (no sentence-transformers)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    if pooling == "cls":
        out = hidden[:, 0]
    elif pooling == "max":
        out = hidden.masked_fill(mask == 0, -1e9).max(dim=1).values
    else:
        out = (hidden * mask).sum(1) / mask.sum(1)
    return out.numpy()


CASES = {  # name: (arch, hidden, pooling, normalize)
    "bert768-cls": ("bert", 768, "cls", "present"),
    "bert1024-max": ("bert", 1024, "max", "present"),
    "bert768-mean-normalize-missing": ("bert", 768, "mean", "missing"),
    "distilbert1024-mean-no-normalize": ("distilbert", 1024, "mean", "none"),
    "distilbert768-cls": ("distilbert", 768, "cls", "missing"),
}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, demo_texts) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    vocab = _vocab(demo_texts)
    out = {name: build_model(root, name, vocab, arch=a, hidden=h, pooling=p, normalize=n)
           for name, (a, h, p, n) in CASES.items()}
    out["constant-norm"] = build_model(root, "constant-norm", vocab, pooling="cls", trained_norms=False)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_raw_vector_is_the_models_own_pooling_without_the_normalisation(tiny_models, name):
    arch, hidden, pooling, normalize = CASES[name]
    folder = tiny_models[name]
    enc = RawEncoder(str(folder), show_progress=False)
    vecs, counts = enc.encode_with_counts(TEXTS)
    assert enc.dim == hidden and vecs.shape == (len(TEXTS), hidden) and vecs.dtype == np.float32
    assert not any(type(m).__name__ == "Normalize" for m in enc.model)
    expected = by_hand(folder, TEXTS, pooling)
    np.testing.assert_allclose(vecs, expected, atol=2e-4, rtol=1e-4)
    norms = np.linalg.norm(vecs, axis=1)
    assert (norms.max() - norms.min()) / norms.mean() > 1e-3  # the norm varies: there is a signal
    # Token counts follow the model's own tokenizer and window.
    tok = enc.model.tokenizer
    assert counts.tolist() == [min(len(tok(t)["input_ids"]), MAX_LEN) for t in TEXTS]
    assert counts[-1] == MAX_LEN and enc.truncated_texts == 1
    if arch == "distilbert":
        assert "token_type_ids" not in tok("a text")


def test_stock_model_direction_is_kept(tiny_models):
    """Where the Normalize module is on disk, stock output = raw vector / its norm."""
    from sentence_transformers import SentenceTransformer

    for name in ("bert768-cls", "bert1024-max"):
        stock = SentenceTransformer(str(tiny_models[name]), device="cpu")
        assert type(list(stock)[-1]).__name__ == "Normalize"
        raw = RawEncoder(str(tiny_models[name])).encode(TEXTS)
        np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), stock.encode(TEXTS), atol=1e-5)


def test_a_model_whose_norms_are_constant_is_refused(tiny_models):
    """CLS pooling straight out of an untrained final LayerNorm: every vector has norm sqrt(768)."""
    enc = RawEncoder(str(tiny_models["constant-norm"]))
    with pytest.raises(UnitNormError, match="constant norm even without its Normalize module"):
        enc.encode(["anything"])
    with pytest.raises(ValueError, match="carries no signal"):
        enc.token_counts(["anything"])


def test_fingerprints_differ_per_model_and_are_stable(tiny_models, encoder):
    fps = {name: RawEncoder(str(path)).fingerprint for name, path in tiny_models.items() if name in CASES}
    assert len(set(fps.values())) == len(fps)
    assert RawEncoder(str(tiny_models["bert768-cls"])).fingerprint == fps["bert768-cls"]
    # The bundled model keeps the fingerprint caches were written under (the 0.2.0 formula).
    h = hashlib.sha256()
    h.update(encoder.model_name.encode())
    h.update(b"256")
    root = Path(encoder.model_name)
    for name in ("modules.json", "config.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        if (root / name).is_file():
            h.update((root / name).read_bytes())
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (root / name).is_file():
            h.update(str((root / name).stat().st_size).encode())
    assert encoder.fingerprint == h.hexdigest()[:16]


def test_in_memory_models_get_fingerprints_of_their_weights(tiny_models):
    from sentence_transformers import SentenceTransformer

    a = RawEncoder.from_sentence_transformer(SentenceTransformer(str(tiny_models["bert768-cls"]), device="cpu"))
    b = RawEncoder.from_sentence_transformer(SentenceTransformer(str(tiny_models["bert768-cls"]), device="cpu"))
    c = RawEncoder.from_sentence_transformer(SentenceTransformer(str(tiny_models["bert1024-max"]), device="cpu"))
    assert a.fingerprint == b.fingerprint != c.fingerprint  # once all "in-memory": one cache entry for all


@pytest.mark.parametrize("name", list(CASES))
def test_the_onnx_backend_gives_each_models_torch_vectors(tiny_models, name, tmp_path, monkeypatch):
    """The fp32 ONNX export on other architectures (DistilBERT has no token_type_ids), widths and
    poolings (CLS, max, mean): torch's vectors and token counts."""
    pytest.importorskip("onnxruntime", reason="the ONNX backends need normrank[onnx]")
    monkeypatch.setenv("NORMRANK_CACHE", str(tmp_path))
    folder = str(tiny_models[name])
    ref, ref_counts = RawEncoder(folder, show_progress=False).encode_with_counts(TEXTS)
    got, counts = RawEncoder(folder, backend="onnx", batch_size=2, show_progress=False).encode_with_counts(TEXTS)
    np.testing.assert_array_equal(counts, ref_counts)
    np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-4)
    int8 = RawEncoder(folder, backend="onnx-int8", show_progress=False).encode(TEXTS)
    assert int8.shape == ref.shape and np.all(np.isfinite(int8))


def test_a_model_retrained_in_place_gets_a_new_fingerprint(tiny_models, tmp_path):
    """Retraining saves weights of the same size over the old ones; the cache key must change with the
    content (a size-based key served the old model's cached vectors to eval and index), and with the
    tokenizer's vocabulary too."""
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from normrank.cache import encode_cached

    folder = tmp_path / "mine"
    shutil.copytree(tiny_models["bert768-cls"], folder)
    texts = ["a short note", "another, somewhat longer note about rivers"]
    before = RawEncoder(str(folder))
    old_fp = before.fingerprint
    old_vecs = encode_cached(before, texts, folder=tmp_path / "cache")[0]
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    tensors = load_file(str(weights))
    name = next(k for k, v in tensors.items() if v.ndim == 2)
    tensors[name] = tensors[name] + np.float32(0.05)
    with safe_open(str(weights), "np") as f:
        meta = f.metadata()
    save_file(tensors, str(weights), metadata=meta)
    assert weights.stat().st_size == size  # the same size: only the content tells the models apart
    after = RawEncoder(str(folder))
    assert after.fingerprint != old_fp
    new_vecs = encode_cached(after, texts, folder=tmp_path / "cache")[0]
    np.testing.assert_allclose(new_vecs, after.encode(texts), rtol=1e-5, atol=1e-6)
    assert not np.allclose(new_vecs, old_vecs)
    vocab = folder / "vocab.txt"
    if vocab.is_file():
        vocab.write_text(vocab.read_text(encoding="utf-8") + "zzzunseen\n", encoding="utf-8")
        assert RawEncoder(str(folder)).fingerprint != after.fingerprint


def test_an_index_whose_model_folder_is_gone_refuses_text_and_keeps_its_encoder(tiny_models, tmp_path, caplog):
    """A saved index whose model folder is missing still opens; text cannot be encoded (``ModelLoadError``)
    instead of being encoded by the bundled model, and a save writes the recorded encoder back unchanged,
    so once the folder is back the index encodes queries as its documents were encoded."""
    import json
    import logging
    import shutil

    from normrank import ModelLoadError, NormIndex

    folder = tmp_path / "mine"
    shutil.copytree(tiny_models["bert768-cls"], folder)
    index = NormIndex(RawEncoder(str(folder)))
    texts = [f"note {i} about rivers and {'mountains ' * (i % 5)}" for i in range(30)]
    index.add_texts(texts, ids=[f"d{i}" for i in range(30)])
    index.save(tmp_path / "idx")
    vector = index.encoder.encode(["rivers and mountains"])[0]
    aside = tmp_path / "aside"
    folder.rename(aside)
    with caplog.at_level(logging.WARNING, logger="normrank"):
        loaded = NormIndex.load(tmp_path / "idx")
    assert "is not on this machine" in caplog.text
    with pytest.raises(ModelLoadError, match="mine"):
        loaded.search("rivers and mountains", 5)
    with pytest.raises(ModelLoadError, match="mine"):
        loaded.add_texts(["one more note"])
    assert [h.id for h in loaded.search(vector, 5, query_token_count=6)] == [
        h.id for h in index.search(vector, 5, query_token_count=6)]
    loaded.delete(["d0"])
    loaded.save(tmp_path / "idx")  # keeps the recorded encoder, not the bundled model's
    state = json.loads((tmp_path / "idx" / "current" / "state.json").read_text())
    assert state["encoder"]["model"] == str(folder)
    aside.rename(folder)
    back = NormIndex.load(tmp_path / "idx")
    index.delete(["d0"])
    assert [h.id for h in back.search("rivers and mountains", 5)] == [h.id for h in index.search("rivers and mountains", 5)]
