"""How cosine and the norm feature combine into one score, and the record each hit carries.

``s(q, d) = cos(q, d) + w(q) * g(d)`` with ``w(q) = a + b * g_q(q)``. The query's own
feature only sets the weight: it scales every document's norm term alike, so it
cannot reorder documents by itself. Only ``g(d)`` moves documents.

Modes:

* ``additive`` (default): the formula above. It is the inner product of
  ``[q_hat, w(q)]`` and ``[d_hat, g(d)]``, so any inner-product index gives the exact
  blended top-k in one pass.
* ``tiebreak``: ``cos + epsilon * sign(w(q)) * (p_d - 1/2)`` with ``p_d = Phi(g(d))`` in
  (0, 1). The norm term stays inside (-epsilon/2, epsilon/2), so two documents swap
  only when their cosines differ by less than ``epsilon``. Still one inner product.
* ``multiplicative``: ``cos * (1 + w(q) * (p_d - 1/2))``, bounded to a factor in
  ``1 +- |w|/2``; served exactly by a cosine search with a provable stopping bound.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, NamedTuple

import numpy as np

from normrank._validation import (
    UNIT_NORM_TOLERANCE,
    as_matrix,
    as_token_counts,
    check_not_unit_length,
)
from normrank._validation import query_token_count as query_token_count_checked
from normrank.calibration import FEATURES, Feature, NormCalibrator
from normrank.errors import InvalidArgumentError, UnitNormError

logger = logging.getLogger(__name__)

#: The largest magnitude of ``a``, ``b`` and ``epsilon``. Scores are float32 sums of the cosine and the
#: weight times a feature of a few units: at 1000 a cosine is still read back within ~1e-4; at 1e6 it was
#: off by 0.05, and beyond float32's range (~3.4e38) the query column became infinite and the ranking
#: was the order documents were added in.
MAX_WEIGHT = 1000.0
#: Set while :meth:`Weights.from_saved` builds the weights of a saved index (no bound there).
_SAVED: contextvars.ContextVar[bool] = contextvars.ContextVar("normrank_saved_weights", default=False)

Mode = Literal["additive", "multiplicative", "tiebreak"]
MODES: tuple[str, ...] = ("additive", "multiplicative", "tiebreak")


@dataclass(frozen=True)
class Weights:
    """The blend's parameters; ``Weights()`` is plain cosine ranking.

    ``clip`` bounds the standardised feature to +-clip (``squash`` uses ``clip*tanh(g/clip)``
    instead of a hard clip) so no document can win on its norm alone. ``clip=None`` leaves it unbounded:
    on a corpus whose norms barely vary (a robust scale near its 1e-6 floor) a feature can reach thousands,
    and a hit's ``cosine``, read back from the float32 blended score minus ``w * g``, then loses precision
    (off by 0.3 at a = 1000 with g near 3,760 in a test); the ranking itself stays exact.
    """

    a: float = 0.0
    b: float = 0.0
    feature: Feature = "calibrated"
    mode: Mode = "additive"
    epsilon: float = 0.01
    clip: float | None = 3.0
    squash: bool = False

    def __post_init__(self) -> None:
        if self.feature not in FEATURES:
            raise InvalidArgumentError(f"unknown norm feature {self.feature!r}; choose one of {list(FEATURES)}")
        if self.mode not in MODES:
            raise InvalidArgumentError(f"unknown scoring mode {self.mode!r}; choose one of {list(MODES)}")
        for name in ("a", "b", "epsilon", "clip"):
            value = getattr(self, name)
            if name == "clip" and value is None:
                continue
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise InvalidArgumentError(f"weight {name} must be a number, got {value!r} ({type(value).__name__})")
            try:
                number = float(value)  # NumPy scalars become floats: JSON and equality agree
            except OverflowError:  # an int beyond float's range
                raise InvalidArgumentError(f"weight {name} must be finite, got an integer of {value.bit_length()} "
                                           "bits") from None
            object.__setattr__(self, name, number)
            if not math.isfinite(number):
                raise InvalidArgumentError(f"weight {name} must be finite, got {number}")
            if name != "clip" and abs(number) > MAX_WEIGHT and not _SAVED.get():
                raise InvalidArgumentError(
                    f"weight {name} must be within +-{MAX_WEIGHT:g}, got {number:g}: scores are float32, and a "
                    "larger weight leaves the cosine below their precision (ranking by the norm alone) or "
                    "overflows them to infinity")
        if not isinstance(self.squash, (bool, np.bool_)):
            raise InvalidArgumentError(f"squash must be True or False, got {self.squash!r}")
        object.__setattr__(self, "squash", bool(self.squash))
        if self.epsilon < 0:
            raise InvalidArgumentError(f"epsilon must be >= 0, got {self.epsilon}")
        if self.clip is not None and not self.clip > 0:
            raise InvalidArgumentError(f"clip must be positive or None, got {self.clip}")

    @property
    def is_cosine(self) -> bool:
        """True when the blend reduces to plain cosine ranking."""
        return self.a == 0.0 and self.b == 0.0

    def shape(self, g: np.ndarray | float) -> np.ndarray:
        """Clip or squash a standardised feature."""
        g = np.asarray(g, dtype=np.float64)
        if self.clip is None:
            return g
        if self.squash:
            return self.clip * np.tanh(g / self.clip)
        return np.clip(g, -self.clip, self.clip)

    def query_weight(self, g_query: np.ndarray | float) -> np.ndarray:
        """``w(q) = a + b * g_q``; the query feature is shaped like the documents'."""
        return self.a + self.b * self.shape(g_query)

    def replace(self, **changes: Any) -> Weights:
        return replace(self, **changes)

    @classmethod
    def from_saved(cls, values: dict[str, Any], where: str = "a saved index") -> Weights:
        """The weights a saved index or table holds. One saved before the ±:data:`MAX_WEIGHT` bound may hold
        a larger weight: it opens with a warning (refusing it made the index impossible to open and
        correct) and keeps answering as before; ``set_weights`` takes only values within the bound."""
        token = _SAVED.set(True)
        try:
            w = cls(**values)
        finally:
            _SAVED.reset(token)
        big = {k: getattr(w, k) for k in ("a", "b", "epsilon") if abs(getattr(w, k)) > MAX_WEIGHT}
        if big:
            logger.warning("%s holds the blend weight(s) %s, beyond +-%g: its scores lose the cosine below float32's "
                           "precision; set_weights to values within the bound", where, big, MAX_WEIGHT)
        return w

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(g: np.ndarray) -> np.ndarray:
    """``Phi(g)``: the standardised feature as a probability in (0, 1)."""
    from scipy.special import ndtr

    return ndtr(np.asarray(g, dtype=np.float64))


def doc_column(g_shaped: np.ndarray, mode: Mode) -> np.ndarray:
    """The extra coordinate stored after ``d_hat`` for this mode."""
    if mode == "tiebreak":
        return percentile(g_shaped) - 0.5
    return np.asarray(g_shaped, dtype=np.float64)


def query_column(w: np.ndarray, weights: Weights) -> np.ndarray:
    """The extra coordinate appended to ``q_hat``; 0 for multiplicative (served by cosine)."""
    w = np.asarray(w, dtype=np.float64)
    if weights.mode == "tiebreak":
        return weights.epsilon * np.sign(w)
    if weights.mode == "multiplicative":
        return np.zeros_like(w)
    return w


def blend(cos: np.ndarray, g_shaped: np.ndarray, w: np.ndarray, weights: Weights) -> np.ndarray:
    """Blended scores from cosines, shaped doc features and query weights (broadcasting)."""
    cos = np.asarray(cos, dtype=np.float64)
    if weights.mode == "additive":
        return cos + w * g_shaped
    p = percentile(g_shaped) - 0.5
    if weights.mode == "tiebreak":
        return cos + weights.epsilon * np.sign(w) * p
    return cos * (1.0 + w * p)


def multiplicative_bound(last_cosine: float, w: float) -> float:
    """The best multiplicative score a document with cosine at most ``last_cosine`` can reach.

    The factor ``1 + w * p`` lies in ``[1 - |w|/2, 1 + |w|/2]`` and a cosine in ``[-1, last]``; their
    product peaks at a corner. Past ``|w| = 2`` the factor can be negative, and then a document
    pointing away from the query (cosine -1) can score ``|w|/2 - 1``: a search that widened its cosine
    candidates only until ``last * factor`` was beaten returned a wrong top-k there.
    """
    half = abs(w) / 2
    return max(last_cosine + half * abs(last_cosine), half - 1.0)


#: The keys :meth:`Hit.as_metadata` adds to a framework document: what the adapters expose.
SCORE_KEYS: tuple[str, ...] = ("relevance_score", "cosine", "norm_feature", "weight", "norm")


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Hit:
    """One result with its explanation; compares by value, so tests can compare runs.

    Slots, not a ``__dict__``: a search builds one per result, and a hit without a dict is about a third
    of the memory to write, which on the caches a scan has just emptied was ~10 us of a 10k-document
    single query (benchmarks/results/speed.md). It keeps what the dict gave users: weak references, and
    pickles that a normrank from before the slots reads, and reads (its state is still a dict of fields).

    ``cosine`` is what a plain vector store would rank by, ``norm`` the raw embedding norm,
    ``norm_feature`` the shaped calibrated feature ``g(d)``, ``weight`` the query's ``w(q)``,
    ``score`` the blend the list is sorted by.
    """

    id: str
    score: float
    cosine: float
    norm: float
    norm_feature: float
    weight: float
    token_count: int
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def explain(self) -> dict[str, float]:
        return {"cosine": self.cosine, "norm": self.norm, "norm_feature": self.norm_feature,
                "weight": self.weight, "score": self.score}

    def as_metadata(self) -> dict[str, float]:
        """The score (as ``relevance_score``) and its parts: the metadata every adapter adds."""
        return {"relevance_score": self.score, "cosine": self.cosine, "norm_feature": self.norm_feature,
                "weight": self.weight, "norm": self.norm}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getstate__(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in HIT_FIELDS}

    def __setstate__(self, state: dict[str, Any] | Sequence[Any]) -> None:
        # a dict of fields (this normrank, and one from before the slots), or the list of values a slotted
        # dataclass pickles by default; anything else is refused, not read into the wrong fields
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = state[1]  # (None, slots) from object.__reduce_ex__ of a slotted class
        if isinstance(state, dict):
            missing = [f for f in HIT_FIELDS if f not in state]
            if missing:
                raise TypeError(f"a pickled Hit without the fields {missing}")
            values = [state[f] for f in HIT_FIELDS]
        elif isinstance(state, (list, tuple)) and len(state) == len(HIT_FIELDS):
            values = list(state)
        else:
            raise TypeError(f"cannot read a pickled Hit from a state of type {type(state).__name__}")
        for f, v in zip(HIT_FIELDS, values):
            object.__setattr__(self, f, v)


#: Hit's fields in order: its pickled state, and the slots normrank.fastpath fills
HIT_FIELDS = tuple(f.name for f in fields(Hit))


class HitArrays(NamedTuple):
    """Many queries' blended top-``k`` as arrays: what :meth:`NormIndex.search_arrays` returns.

    For callers that want FAISS-like output (evaluation, batch scoring, services that serialise
    numbers): no ``Hit`` object per result. Row ``i`` holds query ``i``'s hits, best first, in the
    order and with the values ``search_batch`` gives. A row with fewer than ``k`` hits (a filter that
    leaves fewer documents) has a shorter ``ids[i]``, ``-inf`` scores and ``nan`` cosines after its hits.
    """

    ids: list[list[str]]
    scores: np.ndarray  # float32 (queries, k): the blended score
    cosines: np.ndarray  # float64 (queries, k)


_warned_no_query_calibration = False

#: Bins of at least this many candidates when :func:`rescore` calibrates on the candidates themselves.
CANDIDATE_MIN_PER_BIN = 5


def rescore(
    query_vector: np.ndarray | Sequence[float],
    doc_vectors: np.ndarray | Sequence[Sequence[float]],
    doc_token_counts: Sequence[int] | np.ndarray,
    *,
    weights: Weights,
    calibrator: NormCalibrator | None = None,
    query_calibrator: NormCalibrator | None = None,
    query_token_count: int | None = None,
    ids: Sequence[str] | None = None,
) -> list[Hit]:
    """Blend-score documents another retriever found, returned as hits in input order.

    Re-rankers (the LlamaIndex postprocessor, the Haystack ranker) receive candidates
    rather than searching a :class:`~normrank.store.NormIndex`; this gives them exactly
    the index's arithmetic. All vectors must be raw and from one model.

    ``calibrator`` is the document calibration, ideally fitted on the whole corpus
    (``NormIndex.calibrator``). ``None`` fits one on these candidates: the feature then
    says how a document's norm sits among the other candidates of its length, which is
    coarse on a handful of texts but needs no corpus. ``query_calibrator`` (else the
    document one) and ``query_token_count`` are needed only when ``weights.b != 0``.

    Raises
    ------
    InvalidArgumentError
        Counts or ids do not match the documents, or ``b != 0`` without a query token count.
    UnitNormError
        The document vectors (or, with ``b != 0``, the query vector) are unit length.
    """
    qcount = query_token_count_checked(query_token_count)  # named as the stores name it, whatever the blend
    query = as_matrix(query_vector)
    if query.shape[0] != 1:
        raise InvalidArgumentError(f"expected one query vector, got {query.shape[0]}")
    docs = as_matrix(doc_vectors, query.shape[1])
    counts = as_token_counts(doc_token_counts)  # as the stores read them: 7.9 and True are refused, not cut
    if counts.size != docs.shape[0]:
        raise InvalidArgumentError(f"{counts.size} token counts for {docs.shape[0]} documents")
    names = [str(i) for i in range(docs.shape[0])] if ids is None else list(ids)
    if len(names) != docs.shape[0]:
        raise InvalidArgumentError(f"{len(names)} ids for {docs.shape[0]} documents")
    norms = np.linalg.norm(docs.astype(np.float64), axis=1)
    # as the stores do against a calibrated corpus: equal norms are duplicates, and with no corpus
    # calibration, candidates of one norm get a zero feature from their own calibration
    check_not_unit_length(norms)
    cal = calibrator if calibrator is not None else NormCalibrator(min_per_bin=CANDIDATE_MIN_PER_BIN).fit(norms, counts)
    g = weights.shape(cal.transform(norms, counts, weights.feature))
    q_norm = float(np.linalg.norm(query.astype(np.float64)))
    if weights.b == 0.0:
        w = float(weights.a)
    else:
        if qcount < 1:
            raise InvalidArgumentError(
                "the query-conditioned weight (b != 0) needs the query's token count: pass query_token_count"
            )
        if abs(q_norm - 1.0) < UNIT_NORM_TOLERANCE:
            raise UnitNormError(
                "the query vector is unit length, so its norm cannot set the query-conditioned weight "
                "(b != 0): pass a raw vector from normrank.RawEncoder"
            )
        qcal = query_calibrator
        if qcal is None:
            global _warned_no_query_calibration
            if not _warned_no_query_calibration:  # a re-ranker calls this per query: once, not every time
                _warned_no_query_calibration = True
                logger.warning("no query calibration: using the document calibration for query features "
                               "(pass query_calibrator, e.g. from NormIndex.fit or calibrate_queries); logged once")
            qcal = cal
        w = float(weights.query_weight(qcal.transform([q_norm], [qcount], weights.feature))[0])
    cos = (docs.astype(np.float64) / norms[:, None]) @ (query[0].astype(np.float64) / q_norm)
    scores = blend(cos, g, w, weights)
    return [Hit(names[i], float(scores[i]), float(cos[i]), float(norms[i]), float(g[i]), w, int(counts[i]))
            for i in range(docs.shape[0])]
