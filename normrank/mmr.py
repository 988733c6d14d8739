"""Maximal marginal relevance over blended hits, shared by the LangChain and LlamaIndex stores.

Why one function: both frameworks offer an MMR search mode, and a user switching frameworks should get
the same documents for the same ``lambda`` (LangChain's ``lambda_mult``, LlamaIndex's ``mmr_threshold``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from normrank.errors import InvalidArgumentError
from normrank.scoring import Hit


def check_lambda(value: object, name: str = "lambda_mult") -> float:
    """A number in [0, 1] (NumPy numbers too, as the stock stores take them); 1 = relevance only."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating))
            or not 0 <= value <= 1):
        raise InvalidArgumentError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def mmr_select(hits: Sequence[Hit], vectors: np.ndarray, k: int, lambda_mult: float) -> list[Hit]:
    """``k`` of ``hits`` (best first, with their stored raw ``vectors`` in the same order), each chosen for
    ``lambda_mult * relevance - (1 - lambda_mult) * redundancy``.

    Relevance is the blended score, so ``lambda_mult=1`` keeps exactly the similarity order; redundancy is
    the largest cosine to a document already chosen, from the stored vectors. Ties go to the better-ranked
    document.
    """
    if len(hits) <= 1:
        return list(hits[:k])
    raw = np.asarray(vectors, dtype=np.float64)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    sims = unit @ unit.T
    relevance = np.array([h.score for h in hits])
    chosen = [0]
    redundancy = sims[0].copy()
    while len(chosen) < min(k, len(hits)):
        marginal = lambda_mult * relevance - (1.0 - lambda_mult) * redundancy
        marginal[chosen] = -np.inf
        best = int(np.argmax(marginal))
        chosen.append(best)
        redundancy = np.maximum(redundancy, sims[best])
    return [hits[i] for i in chosen]
