"""What the re-ranking adapters share: candidate vectors, the explanation key, weights from a dict.

Where a candidate's raw vector comes from (the LlamaIndex postprocessor, the Haystack ranker)
    1. a raw embedding the candidate carries (the encoder's dimension, not unit length:
       framework embedders normalise, so theirs are re-encoded), used for this call only;
    2. the vector a normrank index holds for the same id and the same text
       (``from_index``), so re-ranking documents of a normrank store costs no model call;
    3. an LRU cache of vectors *the encoder* produced, keyed by id and a hash of the text;
    4. the encoder, for what is left (then cached).
    A caller's embedding is never cached: one call's crafted vector cannot change another
    call's score for the same document (issue 10 item 8).

The explanation
    Everything normrank adds to a framework document lives under one metadata key,
    :data:`EXPLANATION_KEY` (``"normrank"``), a dict of plain floats, so a user's own keys
    (``weight``, ``norm``, ``cosine``, ``relevance_score``, ...) are never overwritten or
    hidden. The blended score itself goes where the framework keeps scores
    (``NodeWithScore.score``, ``Document.score``).

Framework-agnostic, so each adapter maps its own objects to ``(id, text, embedding)``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np

from normrank._validation import (
    check_option,
    check_text,
    is_blank_text,
)
from normrank.calibration import NormCalibrator
from normrank.encoders import RawEncoder, default_model_path
from normrank.errors import (
    InvalidArgumentError,
    InvalidTextError,
    NormRankError,
    UnknownIdError,
)
from normrank.scoring import Hit, Weights

logger = logging.getLogger(__name__)

Candidate = tuple[str, str, Sequence[float] | None]  # (id, text, stored embedding or None)

#: The one metadata key normrank writes on a framework document: ``{"score", "cosine", "norm_feature",
#: "weight", "norm"}`` (+ ``"retrieval_score"`` in the re-rankers). Reserved: a re-ranker replaces it.
EXPLANATION_KEY = "normrank"

#: The keys of the explanation dict of a scored document.
EXPLANATION_FIELDS: tuple[str, ...] = ("score", "cosine", "norm_feature", "weight", "norm")


def explain(hit: Hit) -> dict[str, float]:
    """A hit's score and its parts (:data:`EXPLANATION_FIELDS`) as plain floats: the value under
    :data:`EXPLANATION_KEY`."""
    return {k: float(v) for k, v in hit.explain().items()}


def explanation(hit: Hit, **extra: Any) -> dict[str, dict[str, Any]]:
    """``{"normrank": {score, cosine, norm_feature, weight, norm, **extra}}`` for a document's metadata."""
    return {EXPLANATION_KEY: {**explain(hit), **extra}}


def unscored_explanation(reason: str, **extra: Any) -> dict[str, dict[str, Any]]:
    """The explanation of a candidate passed through unscored (e.g. it has no text)."""
    return {EXPLANATION_KEY: {**dict.fromkeys(EXPLANATION_FIELDS), "skipped": reason, **extra}}


def is_explanation(value: Any) -> bool:
    """Whether a metadata value is normrank's own explanation (from an earlier stage), not user data."""
    return isinstance(value, Mapping) and set(EXPLANATION_FIELDS) <= set(value)


def with_explanation(metadata: Mapping[str, Any], parts: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``metadata`` plus the explanation ``parts``, never replacing the user's own keys.

    An earlier normrank stage's explanation is replaced. If the user's metadata holds its own
    ``"normrank"`` key, it is kept, the explanation is left out and a warning says so.
    """
    own = metadata.get(EXPLANATION_KEY)
    if EXPLANATION_KEY in metadata and not is_explanation(own):
        logger.warning("%s has its own metadata key %r: it is kept and normrank's score explanation is left out",
                       what, EXPLANATION_KEY)
        return dict(metadata)
    return {**metadata, **parts}


def weights_from(value: Weights | Mapping[str, Any] | None) -> Weights:
    """``Weights`` from itself, ``None`` (plain cosine) or a dict, refusing unknown keys by name.

    A misspelt key (``{"alpha": 0.02}``) would otherwise leave the blend at plain cosine
    without a word.
    """
    if value is None:
        return Weights()
    if isinstance(value, Weights):
        return value
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"weights must be a normrank.Weights or a dict, got {type(value).__name__}")
    allowed = [f.name for f in fields(Weights)]
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise InvalidArgumentError(f"unknown weights keys {unknown}; allowed keys: {allowed}")
    try:
        return Weights(**dict(value))
    except NormRankError:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"invalid weights {dict(value)!r}: {exc}") from exc


def model_setting(encoder: RawEncoder) -> str | None:
    """The ``model`` setting that rebuilds ``encoder``: ``None`` for the bundled model (portable)."""
    if encoder.model_name in ("in-memory", str(default_model_path())):
        return None
    return encoder.model_name


def encoder_settings(encoder: RawEncoder) -> dict[str, Any]:
    """Every setting that rebuilds ``encoder`` (``model``, ``batch_size``, ..., ``pooling``, ``sif_a``)."""
    settings = dict(encoder.describe())
    settings.pop("show_progress", None)
    settings["model"] = model_setting(encoder)
    settings.setdefault("pooling", getattr(encoder, "pooling", "mean"))
    settings.setdefault("sif_a", getattr(encoder, "sif_a", 1e-3))
    return settings


def check_encoder_options(options: Mapping[str, Any]) -> None:
    """Refuse out-of-range ``batch_size`` / ``max_seq_length``, and an unknown ``backend`` (or one that
    cannot run on ``device``), at construction, not at the first query."""
    if options.get("batch_size") is not None:
        check_option("batch_size", options["batch_size"])
    if options.get("max_seq_length") is not None:
        check_option("max_seq_length", options["max_seq_length"])
    if options.get("device") is not None:
        from normrank.encoders import check_device

        check_device(options["device"])
    if "backend" in options:
        from normrank.onnx_backend import check_backend

        check_backend(options["backend"], options.get("device") or "cpu")


def build_encoder(model: str | None, *, pooling: str = "mean", sif_a: float = 1e-3,
                  **options: Any) -> RawEncoder:
    """The encoder the settings describe: a ``RawEncoder``, or a ``PooledEncoder`` for another pooling.
    The one place that choice is made: configs, re-rankers and reopened indexes all build through it."""
    options.setdefault("show_progress", False)
    if pooling != "mean":
        from normrank.pooling import PooledEncoder

        return PooledEncoder(model, pooling=pooling, sif_a=sif_a, **options)
    return RawEncoder(model, **options)


_WARNED_DIMENSIONS: set[tuple[str, int, int]] = set()


def note_other_dimension(vector: Any, dim: int, owner: str) -> None:
    """Log (once per process for each re-ranker kind and pair of sizes) that a query embedding of another
    dimension is ignored: an embedder for another model upstream (768-d mpnet before a MiniLM ranker) was
    ignored without a word, and the query encoded again."""
    try:
        n = len(vector)
    except TypeError:
        return
    key = (owner, n, dim)
    if vector is not None and n != dim and key not in _WARNED_DIMENSIONS:
        _WARNED_DIMENSIONS.add(key)
        logger.warning("%s: the query embedding has %d dimensions and its encoder gives %d (another model's?); "
                       "it is ignored and the query text encoded instead (logged once)", owner, n, dim)


#: How near 1 the norm of a caller's embedding must be to count as a normalising embedder's output (then
#: it is encoded again). Wider than :data:`UNIT_NORM_TOLERANCE`: a stock embedder in bfloat16 gives unit
#: vectors whose norms miss 1 by up to ~3e-3, and 16 of 20 of them passed for raw vectors while the rest
#: were encoded, so one ranking mixed norms near 1 with norms near 5. Encoding a raw vector that happens to
#: be this near 1 again costs a model call, never a wrong score.
GIVEN_UNIT_TOLERANCE = 1e-2

#: A caller's raw embedding is this encoder's when, against the encoder's own vector for the same text,
#: the cosine is at least this and the norms differ by at most this share. Loose enough for the model's own
#: numerics (onnx-int8 sets its quantisation scale per batch: one text's vector in two batches gave cosines
#: down to 0.989 and norms 6.4% apart; half precision stays far within), tight enough for what it must catch
#: (another model's raw vectors: cosines near 0; int8 integers: norms ~300 times larger).
SAME_MODEL_MIN_COSINE = 0.95
SAME_MODEL_NORM_SHARE = 0.10


def _norm_of(vector: Sequence[float] | None, dim: int) -> float | None:
    """The norm of a finite vector of ``dim`` numbers, else ``None``."""
    if vector is None:
        return None
    try:
        if len(vector) != dim:
            return None
        arr = np.asarray(vector, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if arr.shape != (dim,) or not np.all(np.isfinite(arr)):
        return None
    return float(np.linalg.norm(arr))


def is_raw(vector: Sequence[float] | None, dim: int) -> bool:
    """True when ``vector`` may stand in for a fresh raw encoding: right dimension, finite, not unit length
    (within :data:`GIVEN_UNIT_TOLERANCE`). Whether it comes from this encoder's model is
    :class:`EmbeddingCheck`'s question."""
    norm = _norm_of(vector, dim)
    return norm is not None and norm > GIVEN_UNIT_TOLERANCE and abs(norm - 1.0) >= GIVEN_UNIT_TOLERANCE


def _is_unit(vector: Sequence[float] | None, dim: int) -> bool:
    norm = _norm_of(vector, dim)
    return norm is not None and abs(norm - 1.0) < GIVEN_UNIT_TOLERANCE


def same_model(given: np.ndarray, own: np.ndarray) -> bool:
    """Whether a caller's raw vector and the encoder's own for the same text agree (:data:`SAME_MODEL_MIN_COSINE`,
    :data:`SAME_MODEL_NORM_SHARE`): an int8 embedder's vectors (norms ~2000) or another 384-d model's
    raw vectors were trusted, and ranked documents by another model's geometry."""
    g, o = np.asarray(given, dtype=np.float64).ravel(), np.asarray(own, dtype=np.float64).ravel()
    gn, on = float(np.linalg.norm(g)), float(np.linalg.norm(o))
    if g.shape != o.shape or gn == 0.0 or on == 0.0:
        return False
    return float(g @ o) / (gn * on) >= SAME_MODEL_MIN_COSINE and abs(gn / on - 1.0) <= SAME_MODEL_NORM_SHARE


#: Query texts whose own vectors a re-ranker keeps to check raw query embeddings against.
QUERIES_KEPT = 256


class EmbeddingCheck:
    """Whether the raw embeddings a re-ranker's callers pass come from its own encoder's model.

    Until one has matched, each call's first raw document embedding is compared with the encoder's own
    vector for the same text (one model call, whose vector is then used and cached); once one has, only
    embeddings whose text's own vector is at hand anyway (cached: free) are compared. Raw query embeddings
    are compared whenever the re-ranker has encoded that query text before (free). A mismatch makes that
    call encode its texts (or query) instead, with a warning (once): a wrong model upstream costs model
    calls, not a ranking by another model's geometry, and one odd document (its text edited after it was
    embedded) costs only the call it came in.
    """

    def __init__(self, owner: str = "re-ranker") -> None:
        self.owner = owner
        self._lock = threading.Lock()
        self._matched: set[str] = set()
        self._warned: set[str] = set()

    def reset(self) -> None:
        with self._lock:
            self._matched.clear()
            self._warned.clear()

    def matched(self, kind: str) -> bool:
        """Whether an embedding of ``kind`` (``"document"``, ``"query"``) has matched the encoder's own."""
        with self._lock:
            return kind in self._matched

    def record(self, kind: str, ok: bool) -> bool:
        """Note a comparison for ``kind``; returns ``ok`` (whether this call may use such embeddings)."""
        with self._lock:
            if ok:
                self._matched.add(kind)
                return True
            first = kind not in self._warned
            self._warned.add(kind)
        if first:
            logger.warning("%s: a raw %s embedding given to it does not match its own encoding of the same text "
                           "(another model, quantised vectors, or an embedding of other text, such as the text "
                           "with its metadata); that call encodes its texts instead (logged once)",
                           self.owner, kind)
        return False


def unscorable(text: str | None) -> str | None:
    """Why a re-ranker cannot score a candidate (no text; text holding a lone surrogate, which cannot be
    encoded), else ``None``. One such candidate used to fail the whole ranking, named by its batch position;
    the re-rankers pass it through last, unscored, with this reason."""
    if is_blank(text):
        return "no text"
    try:
        check_text(text, "candidate")  # type: ignore[arg-type]
    except InvalidTextError:
        return "text is not valid Unicode"
    return None


def split_scorable(texts: Sequence[str | None], ids: Sequence[str], what: str) -> tuple[list[int], dict[int, str]]:
    """(positions to score, {position: why it cannot be scored}) of a re-ranker's candidates, logging the
    unscorable ones (up to five ids); ``what`` names them ("documents", "nodes")."""
    why = {i: reason for i, t in enumerate(texts) if (reason := unscorable(t)) is not None}
    if why:
        logger.warning("%d of %d %s have no text or text that is not valid Unicode, and cannot be scored; passed "
                       "through last, unscored: %s", len(why), len(texts), what, [ids[i] for i in list(why)[:5]])
    return [i for i in range(len(texts)) if i not in why], why


def is_blank(text: str | None) -> bool:
    """True for ``None``, ``""``, whitespace or invisible characters only: nothing to embed."""
    return text is None or is_blank_text(str(text))


def calibrator_from_texts(encoder: RawEncoder, texts: Sequence[str]) -> NormCalibrator:
    """A document calibration fitted on representative corpus texts (encodes them)."""
    vectors, counts = encoder.encode_with_counts(list(texts))
    return NormCalibrator().fit(np.linalg.norm(vectors.astype(np.float64), axis=1), counts)


def _text_key(cid: str, text: str) -> tuple[str, str]:
    return cid, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def stored_vectors(source: Any, items: Sequence[tuple[str, str]], dim: int) -> dict[int, tuple[np.ndarray, int]]:
    """Vectors and token counts ``source`` holds for the ``(id, text)`` items it stores with that same text.

    Positions in ``items`` map to ``(raw vector, token count)``. Used only when ``source`` has
    ``vectors(ids)`` (``NormIndex``); anything that goes wrong (an id deleted meanwhile, a
    backend without ``vectors``) just means those candidates are encoded.
    """
    if source is None or not callable(getattr(source, "vectors", None)):
        return {}
    try:
        wanted = [i for i, (cid, _) in enumerate(items) if cid in source]
        if not wanted:
            return {}
        ids = [items[i][0] for i in wanted]
        records = source.get(ids)
        vecs = np.asarray(source.vectors(ids), dtype=np.float32)
        after = source.get(ids)  # a document replaced in between (same id, new text) is not trusted
    except (UnknownIdError, KeyError, NotImplementedError, InvalidArgumentError) as exc:
        logger.debug("stored vectors not used: %s", exc)
        return {}
    if vecs.ndim != 2 or vecs.shape != (len(wanted), dim) or len(records) != len(wanted) or len(after) != len(wanted):
        return {}
    out: dict[int, tuple[np.ndarray, int]] = {}
    for j, i in enumerate(wanted):
        rec, again = records[j], after[j]
        same = (rec.id == again.id == items[i][0] and rec.text == again.text == items[i][1]
                and rec.token_count == again.token_count and rec.norm == again.norm)
        if same:
            out[i] = (vecs[j], int(rec.token_count))
    return out


def as_index(source: Any) -> Any:
    """The normrank index behind ``source``: a ``NormIndex`` itself, or a normrank vector store's ``.index``."""
    for candidate in (source, getattr(source, "index", None)):
        if candidate is not None and all(hasattr(candidate, a) for a in ("encoder", "weights", "calibrator",
                                                                          "query_calibrator", "search")):
            return candidate
    raise InvalidArgumentError(
        f"from_index takes a normrank.NormIndex (or a normrank vector store), got {type(source).__name__}")


class CandidateVectorCache:
    """Thread-safe LRU of ``(id, text hash) -> (the encoder's raw vector or None, token count)``.

    Only vectors the encoder produced are cached; a caller's embedding is used for its own
    call only (the entry then keeps just the token count, which depends on the text alone).
    """

    def __init__(self, size: int = 10_000, owner: str = "re-ranker") -> None:
        self.size = check_option("cache_size", size)
        self._items: OrderedDict[tuple[str, str], tuple[np.ndarray | None, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._queries: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.check = EmbeddingCheck(owner)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._queries.clear()
        self.check.reset()

    def query_vector(self, encoder: RawEncoder, text: str | None, embedding: Sequence[float] | None, *,
                     of_text: bool = True) -> tuple[np.ndarray, int | None] | None:
        """A caller's raw query embedding and the query's token count (``None`` for a blank query), when
        it may be used; ``None`` when the query must be encoded instead (then hand the encoder's vector to
        :meth:`note_query`).

        A raw query embedding costs no model call (that is what it is for), so it is not probed as document
        embeddings are: it is compared with the encoder's own vector for the same query text whenever this
        re-ranker encoded that text before (free); a mismatch makes that call encode the query.
        ``of_text=False``: the embedding is of other strings on purpose (LlamaIndex's HyDE sets
        ``custom_embedding_strs``), so it is not compared."""
        if not is_raw(embedding, encoder.dim):
            return None
        vec = np.asarray(embedding, dtype=np.float32)
        if of_text and not is_blank(text):
            with self._lock:
                own = self._queries.get(_text_key("", text))  # type: ignore[arg-type]  # not blank
            if own is not None and not self.check.record("query", same_model(vec, own)):
                return None
        return vec, (None if is_blank(text) else int(encoder.token_counts([text])[0]))

    def note_query(self, text: str, vector: np.ndarray) -> None:
        """Remember the encoder's own vector for a query text (a few hundred), to check later raw query
        embeddings of the same text against (:meth:`query_vector`)."""
        if not self.size:  # cache_size=0: nothing kept
            return
        with self._lock:
            key = _text_key("", text)
            self._queries[key] = np.array(vector, dtype=np.float32, copy=True)
            self._queries.move_to_end(key)
            while len(self._queries) > QUERIES_KEPT:
                self._queries.popitem(last=False)

    def _usable_given(self, encoder: RawEncoder, candidates: Sequence[Candidate], given: list[int],
                      cached: Mapping[int, tuple[np.ndarray | None, int]],
                      probed: dict[int, tuple[np.ndarray, int]]) -> list[int]:
        """The positions in ``given`` whose caller embeddings may be used (see :class:`EmbeddingCheck`).
        A vector encoded to decide is left in ``probed``: it is the encoder's own (cached; used if the caller's
        is not)."""
        if not given:
            return given
        dim = encoder.dim
        if any(_is_unit(c[2], dim) for c in candidates):  # a normalising embedder upstream: none is raw
            logger.debug("%s: raw and unit-length embeddings in one call; all are encoded again", self.check.owner)
            return []
        for i in given:
            own = cached.get(i)
            if own is not None and own[0] is not None and not self.check.record(
                    "document", same_model(np.asarray(candidates[i][2]), own[0])):
                return []
        if not self.check.matched("document"):
            i = given[0]
            vectors, counts = encoder.encode_with_counts([candidates[i][1]])
            probed[i] = (np.array(vectors[0], dtype=np.float32, copy=True), int(counts[0]))
            if not self.check.record("document", same_model(np.asarray(candidates[i][2]), vectors[0])):
                return []
        return given

    def vectors(self, encoder: RawEncoder, candidates: Sequence[Candidate], *,
                known: Mapping[int, tuple[np.ndarray, int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Raw vectors (n, dim) and token counts (n,) for ``candidates`` (all with text), encoding only what is new.

        ``known``: vectors and counts already resolved for some positions (e.g. by
        :func:`stored_vectors` from the index the candidates came from); they win.
        """
        n = len(candidates)
        keys = [_text_key(cid, text) for cid, text, _ in candidates]
        cached: dict[int, tuple[np.ndarray | None, int]] = {}
        with self._lock:
            for i, key in enumerate(keys):
                entry = self._items.get(key)
                if entry is not None:
                    self._items.move_to_end(key)
                    cached[i] = entry
        dim = encoder.dim
        found: dict[int, tuple[np.ndarray, int]] = dict(known or {})
        given = [i for i in range(n) if i not in found and is_raw(candidates[i][2], dim)]
        probed: dict[int, tuple[np.ndarray, int]] = {}
        given = self._usable_given(encoder, candidates, given, cached, probed)
        for i, (vec, count) in probed.items():  # the encoder's own: cached, and used unless the caller's matched
            cached[i] = (vec, count)
        need_counts = [i for i in given if i not in cached]
        counts = encoder.token_counts([candidates[i][1] for i in need_counts]) if need_counts else []
        fresh_counts = dict(zip(need_counts, (int(c) for c in counts)))
        for i in given:
            count = cached[i][1] if i in cached else fresh_counts[i]
            found[i] = (np.asarray(candidates[i][2], dtype=np.float32), count)
        for i in range(n):
            if i not in found and i in cached and cached[i][0] is not None:
                found[i] = (cached[i][0], cached[i][1])  # type: ignore[assignment]  # checked not None
        todo = [i for i in range(n) if i not in found]
        encoded: dict[int, tuple[np.ndarray, int]] = dict(probed)
        if todo:
            vectors, new_counts = encoder.encode_with_counts([candidates[i][1] for i in todo])
            for j, i in enumerate(todo):
                encoded[i] = found[i] = (np.array(vectors[j], dtype=np.float32, copy=True), int(new_counts[j]))
        if self.size:
            with self._lock:
                for i, (vec, count) in encoded.items():
                    self._items[keys[i]] = (vec, count)
                    self._items.move_to_end(keys[i])
                for i, count in fresh_counts.items():
                    if keys[i] not in self._items:
                        self._items[keys[i]] = (None, count)
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return (np.stack([found[i][0] for i in range(n)]),
                np.array([found[i][1] for i in range(n)], dtype=np.int64))


def current_blend(source: Any, weights: Weights, calibrator: NormCalibrator | None,
                  query_calibrator: NormCalibrator | None, *, own_weights: bool
                  ) -> tuple[Weights, NormCalibrator | None, NormCalibrator | None]:
    """The weights and calibrations a re-ranker ranks with: ``source``'s as they are now for one built on an
    index (``source.blend_settings()``: a ``set_weights``, ``fit`` or ``recalibrate`` there, or by another
    process on a pgvector table, applies at once; ``own_weights`` keeps weights given to ``from_index``),
    else the re-ranker's own. Shared by the Haystack ranker and the LlamaIndex postprocessor."""
    if source is None:
        return weights, calibrator, query_calibrator
    live_weights, live_calibrator, live_query_calibrator = source.blend_settings()
    return (weights if own_weights else live_weights), live_calibrator, live_query_calibrator
