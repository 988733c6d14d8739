"""The raw encoder keeps the norm and nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest

from normrank import EmptyTextError, ModelLoadError, RawEncoder

TEXTS = [
    "hello world",
    "The Peace of Westphalia, signed in 1648, ended the Thirty Years' War.",
    "x",
    "Metformin lowers hepatic glucose production and is first-line for type 2 diabetes.",
]


def test_raw_norms_are_not_unit(encoder):
    vecs = encoder.encode(TEXTS)
    norms = np.linalg.norm(vecs, axis=1)
    assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), encoder.dim)
    assert np.all(np.abs(norms - 1.0) > 0.5), norms
    assert norms.std() > 0.05


def test_normalised_raw_vectors_equal_the_stock_model(encoder):
    from sentence_transformers import SentenceTransformer

    stock = SentenceTransformer(encoder.model_name, device="cpu")
    assert type(list(stock)[-1]).__name__ == "Normalize"
    expected = stock.encode(TEXTS, convert_to_numpy=True)
    raw = encoder.encode(TEXTS)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), expected, atol=1e-5)
    # The stock pipeline really does destroy the norm, even when asked not to normalise.
    unnormalised = stock.encode(TEXTS, normalize_embeddings=False)
    np.testing.assert_allclose(np.linalg.norm(unnormalised, axis=1), 1.0, atol=1e-5)


def test_token_counts_follow_the_models_tokenizer_and_truncation(encoder):
    long_text = "retrieval " * 1000
    counts = encoder.token_counts(["hello world", long_text])
    assert counts[0] == 4  # [CLS] hello world [SEP]
    assert counts[1] == encoder.model.max_seq_length == 256
    vecs, counts2 = encoder.encode_with_counts(["hello world", long_text])
    assert np.array_equal(counts, counts2) and vecs.shape[0] == 2


def test_blank_texts_are_refused(encoder):
    with pytest.raises(EmptyTextError, match="text 1 is empty or whitespace only"):
        encoder.encode(["fine", "   \n"])


def test_missing_model_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="does not exist"):
        RawEncoder(str(missing))


def test_fingerprint_is_stable_and_depends_on_settings(encoder):
    other = RawEncoder(encoder.model_name, max_seq_length=128)
    assert encoder.fingerprint == RawEncoder(encoder.model_name).fingerprint
    assert other.fingerprint != encoder.fingerprint


# ----------------------------------------------------------- long texts (issue 10 item 13)
from pathlib import Path  # noqa: E402

from normrank import InvalidTextError, NormIndex  # noqa: E402
from normrank.encoders import prefix_budget, safe_prefix, truncation_summary  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"


def _long_real_texts(demo_texts: list[str]) -> list[str]:
    """Long texts of several shapes, from real prose (the README and the demo corpus)."""
    readme = README.read_text(encoding="utf-8")
    demo = "\n\n".join(demo_texts + demo_texts[::-1] + demo_texts[1::2])  # ~14,000 characters
    texts = [
        readme,
        demo,
        " ".join(demo.split()),  # one paragraph, single spaces
        "".join(demo.split()),  # no whitespace at all: the window grows to the whole text
        "\u6587\u672c\u68c0\u7d22\u7cfb\u7edf\u6839\u636e\u5411\u91cf\u6392\u5e8f\u3002" * 900,  # CJK, no spaces
        "x" * 30_000 + " " + demo,  # one huge word (a single [UNK]) first
        demo.replace(" ", "  \t ") + " \u00e9\u0301 caf\u00e9 \U0001f600" * 500,  # odd whitespace, accents, emoji
    ]
    # Every start offset moves the cut point somewhere else in the prose.
    texts += [demo[s:] for s in range(1, 5000, 397)] + [readme[s:] for s in range(7, 9000, 1499)]
    return texts


def _byte_level_bpe(corpus: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>", "<pad>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def _unigram_metaspace(corpus: list[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>", "<pad>"],
                                                            unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")


def test_safe_prefix_keeps_exactly_the_tokens_of_the_full_text(encoder, demo_texts):
    """The cut is invisible: the first max_tokens tokens of the prefix are the full text's, for the
    bundled WordPiece tokenizer, a byte-level BPE and a SentencePiece-style Unigram, on long real texts."""
    texts = _long_real_texts(demo_texts)
    tokenizers = {"wordpiece": encoder.model.tokenizer, "bpe": _byte_level_bpe(demo_texts),
                  "unigram": _unigram_metaspace(demo_texts)}
    cut = 0
    for name, tok in tokenizers.items():
        for limit in (256, 512):
            for t in texts:
                head = safe_prefix(t, tok, limit)
                assert t.startswith(head)
                cut += len(head) < len(t)
                full = tok(t, truncation=True, max_length=limit)["input_ids"]
                mine = tok(head, truncation=True, max_length=limit)["input_ids"]
                assert mine == full, (name, limit, t[:40])
    assert cut >= len(tokenizers) * 2 * (len(texts) - 3)  # nearly every text really was cut


@pytest.mark.parametrize("sep", ["\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f"])
def test_a_cut_never_falls_on_a_character_the_tokenizer_deletes(encoder, sep):
    """Python calls these whitespace; WordPiece deletes them as control characters and joins the words
    around them. A cut there joined a hash to a long base64 run in the full text (one [UNK]) but not in
    the prefix: the vector was not the model's own (cosine 0.97, norm off by 16%)."""
    tok = encoder.model.tokenizer
    blob = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA" * 40
    text = "information " * 225 + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" + sep + blob + " end of the document"
    head = safe_prefix(text, tok, 256)
    assert tok(head, truncation=True, max_length=256)["input_ids"] == tok(text, truncation=True, max_length=256)["input_ids"]
    mine = encoder.encode([text])[0]
    theirs = encoder.model.encode([text], convert_to_numpy=True, normalize_embeddings=False)[0]
    np.testing.assert_allclose(mine / np.linalg.norm(mine), theirs / np.linalg.norm(theirs), atol=1e-5)


def test_real_collection_documents_joined_keep_their_tokens(encoder, data_dir):
    from normrank.datasets import load_beir

    tok = encoder.model.tokenizer
    _, texts, _ = load_beir(data_dir / "cisi", "test").doc_items()
    for start in range(0, 600, 60):
        long_text = "\n\n".join(texts[start : start + 60])
        head = safe_prefix(long_text, tok, 256)
        assert len(head) < len(long_text)
        assert tok(head, truncation=True, max_length=256)["input_ids"] == \
            tok(long_text, truncation=True, max_length=256)["input_ids"]


def test_a_huge_text_is_cut_before_tokenising_and_encodes_as_its_beginning(encoder, demo_texts):
    demo = "\n\n".join(demo_texts)
    huge = (demo + "\n\n") * (10_000_000 // len(demo))
    assert len(huge) > 9_000_000
    head = safe_prefix(huge, encoder.model.tokenizer, encoder.max_tokens)
    assert len(head) <= prefix_budget(encoder.max_tokens)  # 10 MB never reaches the tokenizer
    vecs, counts = encoder.encode_with_counts([huge, demo[:20_000]])
    assert counts.tolist() == [256, 256]
    np.testing.assert_allclose(vecs[0], vecs[1], atol=1e-5)


def test_truncation_is_logged_once_and_counted(encoder, caplog):
    fresh = RawEncoder.from_sentence_transformer(encoder.model)  # a new encoder sharing the loaded model
    assert fresh.truncated_texts == 0
    long = "retrieval of long documents " * 200
    with caplog.at_level("WARNING", logger="normrank.encoders"):
        fresh.encode([long, "short text", long + " again"])
        fresh.encode_with_counts([long])
        fresh.encode(["short text"])
    warnings = [r for r in caplog.records if r.name == "normrank.encoders"]
    assert len(warnings) == 1
    assert "2 of 3 texts are longer than the model's window of 256 tokens" in warnings[0].getMessage()
    assert fresh.truncated_texts == 3
    # Counting (what `analyze` reports) neither encodes nor adds to the counter.
    assert fresh.count_truncated([long, "short", "a " * 254, "a " * 255]) == 2  # 254 + 2 specials fits
    assert fresh.token_counts(["a " * 254, "a " * 255]).tolist() == [256, 256]
    assert fresh.truncated_texts == 3


def test_truncation_summary_of_stored_token_counts():
    assert truncation_summary([4, 256, 100, 256], 256) == {"max_tokens": 256, "truncated": 2, "share": 0.5}
    assert truncation_summary([], 256)["truncated"] == 0


def test_a_lone_surrogate_is_a_named_error_not_a_tokenizer_type_error(encoder, demo_encoded, demo_texts):
    for call in (encoder.encode, encoder.token_counts, encoder.encode_with_counts):
        with pytest.raises(InvalidTextError, match=r"text 1 is not valid Unicode text.*'\\udcff' at position 4"):
            call(["fine", "bad \udcff text"])
    vecs, counts = demo_encoded
    index = NormIndex(encoder)
    index.add_vectors(vecs, counts, texts=demo_texts)
    with pytest.raises(InvalidTextError):
        index.search("query \ud800", 3)
    with pytest.raises(ValueError):  # callers catching the builtin keep working
        encoder.encode(["\udcff"])
    assert len(index.search("Westphalia", 3)) == 3


def test_a_max_seq_length_beyond_the_models_positions_is_named_at_load():
    """Accepted, it failed at the first long text inside torch ("size of tensor a (2802) must match ... (512)")."""
    with pytest.raises(ModelLoadError, match="512 token positions"):
        RawEncoder(max_seq_length=5000, show_progress=False).encode(["x"])
    enc = RawEncoder(max_seq_length=512, show_progress=False)
    assert enc.max_tokens == 512 and enc.token_counts(["word " * 600])[0] == 512


def test_a_device_typo_is_named_at_construction_and_a_missing_device_when_the_model_loads():
    """``device="gpu"`` built an encoder that failed at the first query with advice about model folders;
    "cuda" on a machine without one failed the same way."""
    import torch

    from normrank import ModelLoadError, RawEncoder
    from normrank.errors import InvalidArgumentError

    for bad in ("gpu", "CUDA", "cuda:x", "cuda:01", "", 0):
        with pytest.raises(InvalidArgumentError, match="device must be a torch device"):
            RawEncoder(device=bad)
    for good in (torch.device("cpu"), "cpu", "xla", "privateuseone:0", "cuda:1"):  # every device torch names
        assert RawEncoder(device=good).device == str(good)
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    enc = RawEncoder(device="cuda:0")  # may be meant for a worker that has one: checked when the model loads
    with pytest.raises(ModelLoadError, match=r"device 'cuda:0' is not available: this machine has 0 CUDA device"):
        enc.encode(["a query"])
