"""Pieces the retriever and the vector store share: documents out of hits, token counts, locks.

No scoring happens here: hits come from the index with their scores and explanations.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from normrank._validation import check_option
from normrank.candidate_vectors import EXPLANATION_KEY  # noqa: F401  (re-exported to the LangChain modules)
from normrank.errors import EmptyCorpusError, InvalidArgumentError
from normrank.scoring import Hit

logger = logging.getLogger(__name__)


TokenCounter = Callable[[list[str]], Sequence[int]]

_WORDS = re.compile(r"\w+|[^\w\s]")


def check_k(k: Any, name: str = "k") -> int:
    """``k`` (or ``fetch_k``) as a Python int in normrank's one table of option ranges; numpy integers pass."""
    return check_option(name, k)


def check_index_kwargs(index_class: type, kwargs: Mapping[str, Any]) -> None:
    """A named error for a setting the index does not take (instead of Python's TypeError)."""
    import inspect

    params = inspect.signature(index_class.__init__).parameters
    allowed = sorted(n for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise InvalidArgumentError(f"unknown setting(s) {unknown} for a new {index_class.__name__}; "
                                   f"it takes: {', '.join(allowed)}")


def to_document(hit: Hit, explanation_key: str | None) -> Document:
    """A new ``Document`` for a hit: its stored metadata, plus ``metadata[explanation_key]`` =
    ``{"score", "cosine", "norm", "norm_feature", "weight"}`` when a key is given.

    A stored metadata key equal to ``explanation_key`` is the user's and is kept; the explanation
    is then left out (logged), never written over it.
    """
    metadata = dict(hit.metadata)
    if explanation_key is not None:
        if explanation_key in metadata:
            logger.warning("document %r has its own metadata key %r; its value is kept and the normrank score "
                           "explanation is left out (choose another explanation_key)", hit.id, explanation_key)
        else:
            metadata[explanation_key] = hit.explain()
    return Document(page_content=hit.text or "", metadata=metadata, id=hit.id)


def check_explanation_key(metadatas: Sequence[Mapping[str, Any]], explanation_key: str | None) -> None:
    """Refuse documents whose metadata already uses the explanation key: searches could not explain them."""
    if explanation_key is None:
        return
    for i, m in enumerate(metadatas):
        if isinstance(m, Mapping) and explanation_key in m:
            raise InvalidArgumentError(
                f"metadata {i} has the key {explanation_key!r}, which this store uses for the score explanation "
                f"of search results (a previous search's explanation?): drop or rename that key, or build the "
                f"store with another explanation_key"
            )


def approximate_token_counts(texts: list[str]) -> list[int]:
    """Words and punctuation marks plus 2 (for [CLS] and [SEP]): a rough WordPiece count.

    Used when the embeddings expose no tokenizer. The count only bins documents by length for the
    norm calibration, and the same function counts documents and queries, so it only needs to be
    consistent and roughly proportional to the model's tokens.
    """
    return [len(_WORDS.findall(t)) + 2 for t in texts]


def _tokenizer_counter(tokenizer: Any, max_length: int | None) -> TokenCounter:
    def count(texts: list[str]) -> list[int]:
        kwargs: dict[str, Any] = {"add_special_tokens": True}
        if max_length:
            kwargs.update(truncation=True, max_length=int(max_length))
        return [len(ids) for ids in tokenizer(list(texts), **kwargs)["input_ids"]]

    return count


def resolve_token_counter(embedding: Embeddings, given: TokenCounter | None) -> tuple[TokenCounter, str]:
    """How the store counts tokens for ``embedding``, and a name for it (for logs and ``repr``).

    In order: the counter given; normrank's own encoder; a Hugging Face tokenizer the embeddings
    carry (``.tokenizer``, or ``.client``/``._client`` of a sentence-transformers model); else
    :func:`approximate_token_counts`.
    """
    from langchain_normrank.embeddings import NormRankEmbeddings

    if given is not None:
        if not callable(given):
            raise InvalidArgumentError(f"token_counter must be callable, got {type(given).__name__}")
        return given, "given"
    if isinstance(embedding, NormRankEmbeddings):
        return embedding.token_counts, "normrank encoder"
    for owner in (embedding, getattr(embedding, "client", None), getattr(embedding, "_client", None)):
        tok = getattr(owner, "tokenizer", None) if owner is not None else None
        if tok is not None and callable(tok):
            return _tokenizer_counter(tok, getattr(owner, "max_seq_length", None)), "tokenizer"
    return approximate_token_counts, "approximate (words + 2)"


def empty_error(where: str) -> EmptyCorpusError:
    return EmptyCorpusError(
        f"the index behind this {where} is empty, so every search would return nothing. Check the index "
        "path (store.path in the YAML is the folder of a NormIndex.save()), add documents first, or pass "
        "allow_empty=True to get an empty result instead"
    )


def warn_empty(where: str) -> None:
    warnings.warn(
        f"this {where} is built on an empty index: searches raise EmptyCorpusError until documents are "
        "added (is the index path right?). Pass allow_empty=True if that is intended.",
        UserWarning,
        stacklevel=4,
    )


class ReadWriteLock:
    """Many readers or one writer; a waiting writer holds back new readers (so writes are not starved).

    The vector store replaces a document as delete + add; searches take the read side so they see
    the store before or after a replacement, never the moment in between. Not re-entrant.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()
