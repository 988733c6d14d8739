"""Tokenizer-aware chunking: long documents become passages that fit the model's window.

The model embeds at most ``max_seq_length`` tokens (256 for all-MiniLM-L6-v2); the rest of a
longer text is never seen, so a query quoting the end of a long file cannot find it. Chunking
splits such texts into passages measured in tokens of the encoder's *own* tokenizer, preferring
paragraph, then sentence, then word boundaries (Markdown files: headings and blocks first).

The splitting is done by ``semantic-text-splitter`` (the Rust ``text-splitter`` crate driving the
model's Hugging Face tokenizer): it counts tokens exactly, returns character offsets, and is
maintained and fast, so normrank does not carry a splitter of its own.

Defaults: ``size`` = the window minus the special tokens ([CLS]/[SEP]: 254 for MiniLM), so a
chunk is never truncated; ``overlap`` = 15% of ``size``. A text that already fits is kept whole.
Each chunk is an ordinary document for the index, so the length calibration uses the chunk's
own token count.

Ids and metadata: chunk ``n`` of document ``doc`` is ``doc#n`` with metadata ``source`` (``doc``),
``chunk`` (``n``), ``start`` and ``end`` (character offsets into the document, so
``text[start:end]`` is the chunk) on top of the document's own metadata. A document that fits
keeps its id and gets ``source``/``chunk`` 0/``start``/``end`` too.

Use::

    from normrank import NormIndex
    from normrank.chunking import chunk_files, chunk_texts

    index = NormIndex()
    ids, texts, metas = chunk_texts(long_texts, ids=names, encoder=index.encoder)
    index.add_texts(texts, ids=ids, metadatas=metas)
    ids, texts, metas = chunk_files(["notes/a.md", "notes/b.txt"], encoder=index.encoder)  # .md: Markdown-aware
    index.add_texts(texts, ids=ids, metadatas=metas)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from normrank._validation import is_blank_text
from normrank.encoders import RawEncoder, check_texts
from normrank.errors import InvalidArgumentError, MissingExtraError

logger = logging.getLogger(__name__)

#: Overlap between consecutive chunks when none is given, as a share of the chunk size.
DEFAULT_OVERLAP_SHARE = 0.15
#: Metadata keys every chunk carries.
CHUNK_KEYS = ("source", "chunk", "start", "end")


class Chunker:
    """Split texts into chunks of at most ``size`` tokens of ``encoder``'s tokenizer.

    Parameters
    ----------
    encoder:
        The encoder whose tokenizer measures the chunks (default: the bundled model).
    size:
        Tokens per chunk, special tokens excluded; ``None`` = the model's window minus them.
        Larger than that is refused: those chunks would be truncated.
    overlap:
        Tokens shared by consecutive chunks (at most); ``None`` = 15% of ``size``.

    Thread-safe: the splitters own a private copy of the tokenizer.
    """

    def __init__(self, encoder: RawEncoder | None = None, size: int | None = None,
                 overlap: int | None = None) -> None:
        self.encoder = encoder if encoder is not None else RawEncoder()
        model = self.encoder.model
        window = int(model.max_seq_length)
        with self.encoder._lock:  # the shared tokenizer re-applies its settings on every call
            tok = model.tokenizer
            specials = len(tok("x", add_special_tokens=True)["input_ids"]) - len(
                tok("x", add_special_tokens=False)["input_ids"])
        self.max_size = window - specials
        self.size = _check_int("chunk size", self.max_size if size is None else size, 1)
        if self.size > self.max_size:
            raise InvalidArgumentError(
                f"chunk size {self.size} is larger than the model's window allows ({window} tokens, {specials} "
                f"of them special): chunks would be truncated; choose at most {self.max_size}")
        default_overlap = int(round(DEFAULT_OVERLAP_SHARE * self.size))
        self.overlap = _check_int("chunk overlap", default_overlap if overlap is None else overlap, 0)
        if self.overlap >= self.size:
            raise InvalidArgumentError(f"chunk overlap ({self.overlap}) must be smaller than the chunk size ({self.size})")
        try:
            from semantic_text_splitter import MarkdownSplitter, TextSplitter
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise MissingExtraError("chunking needs semantic-text-splitter: pip install semantic-text-splitter") from exc
        private = self.encoder._private_tokenizer()  # the copy encoder.tokenize counts on: never truncates
        if private is not None:
            self._text = TextSplitter.from_huggingface_tokenizer(private, capacity=self.size, overlap=self.overlap)
            self._markdown = MarkdownSplitter.from_huggingface_tokenizer(private, capacity=self.size,
                                                                         overlap=self.overlap)
        else:  # a slow (pure Python) tokenizer: count through it, under the encoder's lock
            def count(text: str) -> int:
                with self.encoder._lock:
                    return len(model.tokenizer(text, add_special_tokens=False)["input_ids"])

            self._text = TextSplitter.from_callback(count, capacity=self.size, overlap=self.overlap)
            self._markdown = MarkdownSplitter.from_callback(count, capacity=self.size, overlap=self.overlap)

    def split(self, text: str, *, markdown: bool = False) -> list[tuple[int, int, str]]:
        """``(start, end, chunk)`` for every chunk of ``text``; ``text[start:end] == chunk``."""
        splitter = self._markdown if markdown else self._text
        return [(start, start + len(chunk), chunk) for start, chunk in splitter.chunk_indices(text)]

    def fits(self, texts: Sequence[str]) -> list[bool]:
        """Whether each text fits the model's window whole (is not truncated when encoded)."""
        items = check_texts(texts)
        if not items:
            return []
        return [not t for t in self.encoder._prepare(items)[2].tolist()]

    def __repr__(self) -> str:
        return f"Chunker(size={self.size}, overlap={self.overlap}, model={self.encoder.model_name!r})"


def chunk_texts(
    texts: Sequence[str],
    ids: Sequence[str] | None = None,
    metadatas: Sequence[Mapping[str, Any]] | None = None,
    *,
    encoder: RawEncoder | None = None,
    size: int | None = None,
    overlap: int | None = None,
    markdown: bool | Sequence[bool] = False,
    only_long: bool = True,
    chunker: Chunker | None = None,
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """``(ids, texts, metadatas)`` of the chunks of ``texts``, ready for ``index.add_texts``.

    ``ids`` default to ``"0"``, ``"1"``, ...; ``markdown`` (one flag, or one per text) splits at
    Markdown structure first. With ``only_long`` (the default) a text that fits the model's
    window stays one document under its own id; otherwise every text becomes ``id#n`` chunks.

    Each chunk's metadata is its text's plus :data:`CHUNK_KEYS`: ``source`` (the text's id), ``chunk``
    (its number) and ``start``/``end`` (``text[start:end]`` is the chunk). A key the caller's metadata
    already holds (a loader's ``source`` URL) keeps the caller's value, with a logged warning.
    """
    items = check_texts(texts)
    doc_ids = [str(i) for i in range(len(items))] if ids is None else [str(i) for i in ids]
    if len(doc_ids) != len(items):
        raise InvalidArgumentError(f"got {len(doc_ids)} ids for {len(items)} texts")
    metas: list[Mapping[str, Any]] = [{}] * len(items) if metadatas is None else list(metadatas)
    if len(metas) != len(items):
        raise InvalidArgumentError(f"got {len(metas)} metadatas for {len(items)} texts")
    flags = [markdown] * len(items) if isinstance(markdown, bool) else [bool(m) for m in markdown]
    if len(flags) != len(items):
        raise InvalidArgumentError(f"got {len(flags)} markdown flags for {len(items)} texts")
    chunker = chunker or Chunker(encoder, size, overlap)
    fits = chunker.fits(items) if only_long else [False] * len(items)
    out_ids: list[str] = []
    out_texts: list[str] = []
    out_metas: list[dict[str, Any]] = []
    kept: set[str] = set()
    for doc_id, text, meta, md, whole in zip(doc_ids, items, metas, flags, fits):
        if not isinstance(meta, Mapping):
            raise InvalidArgumentError(f"metadata of {doc_id!r} is a {type(meta).__name__}, expected a mapping")
        kept.update(k for k in CHUNK_KEYS if k in meta)
        if whole:
            out_ids.append(doc_id)
            out_texts.append(text)
            out_metas.append({"source": doc_id, "chunk": 0, "start": 0, "end": len(text), **meta})
            continue
        for n, (start, end, chunk) in enumerate(chunker.split(text, markdown=md)):
            out_ids.append(f"{doc_id}#{n}")
            out_texts.append(chunk)
            out_metas.append({"source": doc_id, "chunk": n, "start": start, "end": end, **meta})
    if kept:
        logger.warning("metadata already holds %s (a document loader's 'source', say): the caller's values are "
                       "kept, so those chunks do not carry normrank's own (their document id and offsets)",
                       ", ".join(repr(k) for k in CHUNK_KEYS if k in kept))
    if len(set(out_ids)) < len(out_ids):  # a chunk's id#n is another document's own id
        seen: dict[str, str] = {}
        for cid, meta in zip(out_ids, out_metas):
            if cid in seen:
                raise InvalidArgumentError(
                    f"chunk id {cid!r} is given twice: chunk ids are the document id plus #n, and "
                    f"{seen[cid]!r} and {meta.get('source', cid)!r} both give it; rename the document whose own "
                    "id ends in #n")
            seen[cid] = str(meta.get("source", cid))
    return out_ids, out_texts, out_metas


def chunk_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    encoder: RawEncoder | None = None,
    size: int | None = None,
    overlap: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """``(ids, texts, metadatas)`` of the chunks of UTF-8 text files (``.md`` split as Markdown).

    As :func:`chunk_texts`: ``index.add_texts(texts, ids=ids, metadatas=metas)``. A file's id
    (its chunks' ``source``) is its path relative to ``root`` when given, else as passed. Empty
    files are skipped with a logged note.
    """
    from normrank.sources import read_text_file

    if isinstance(paths, str | os.PathLike):
        raise InvalidArgumentError("expected a list of file paths, got a single path")
    names, texts, metas, md = [], [], [], []
    for p in paths:
        path = Path(p)
        text = read_text_file(path)  # not stripped: a chunk's start/end index the file as read
        name = path.as_posix()
        if root is not None:
            try:
                name = path.resolve().relative_to(Path(root).resolve()).as_posix()
            except ValueError:
                raise InvalidArgumentError(f"{path} is not inside root {root}") from None
        if is_blank_text(text):
            logger.warning("skipping empty file %s", path)
            continue
        names.append(name)
        texts.append(text)
        metas.append({"path": name})
        md.append(path.suffix.lower() == ".md")
    if not texts:
        return [], [], []
    return chunk_texts(texts, names, metas, encoder=encoder, size=size, overlap=overlap, markdown=md)


def _check_int(what: str, value: Any, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise InvalidArgumentError(f"{what} must be an integer >= {lowest}, got {value!r}")
    return int(value)





def chunk_documents(
    ids: Sequence[str],
    texts: Sequence[str],
    metadatas: Sequence[Mapping[str, Any]],
    *,
    encoder: RawEncoder,
    kind: str = "files",
    enabled: bool = True,
    size: int | None = None,
    overlap: int | None = None,
    rows: bool = False,
) -> tuple[list[str], list[str], list[dict[str, Any]], int]:
    """What ``normrank index`` (and Ray indexing) does with a source read by :func:`normrank.sources.read_source`.

    Files (``kind="files"``) are chunked when ``enabled``; rows only with ``rows=True``, since
    qrels name their ids. Returns ``(ids, texts, metadatas, truncated)``: ``truncated`` is how
    many documents left whole are longer than the model's window (the caller says so once; the
    encoder will not log it again).
    """
    if enabled and (kind == "files" or rows):
        markdown = [str(i).lower().endswith(".md") for i in ids] if kind == "files" else False
        out_ids, out_texts, out_metas = chunk_texts(texts, ids, metadatas, encoder=encoder, size=size,
                                                    overlap=overlap, markdown=markdown)
        return out_ids, out_texts, out_metas, 0
    truncated = encoder.count_truncated(texts)
    if truncated:
        encoder._warned_truncation = True  # the caller reports it, with advice fitting its interface
    return list(ids), list(texts), [dict(m) for m in metadatas], truncated


__all__ = ["CHUNK_KEYS", "DEFAULT_OVERLAP_SHARE", "Chunker", "chunk_documents", "chunk_files", "chunk_texts"]
