"""``CandidateSet``: the cosine top-``depth`` lists a fit scores every blend on.

Its own small module so :mod:`normrank.fitting` needs nothing from the stores that build it
(``store`` -> ``fitting`` only, no import cycle). ``normrank.store`` re-exports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class CandidateSet:
    """Cosine top-``depth`` per query with both norm features: what fitting scores on."""

    doc_ids: list[list[str]]
    cosine: np.ndarray  # (nq, depth), -inf where a query has fewer candidates
    doc_features: dict[str, np.ndarray] = field(default_factory=dict)  # feature -> (nq, depth)
    query_features: dict[str, np.ndarray] = field(default_factory=dict)  # feature -> (nq,)

    def subset(self, rows: Sequence[int] | np.ndarray) -> CandidateSet:
        """The candidates of some queries only (e.g. one cross-validation fold)."""
        rows = np.asarray(rows, dtype=np.int64)
        return CandidateSet(
            doc_ids=[self.doc_ids[i] for i in rows.tolist()],
            cosine=self.cosine[rows],
            doc_features={f: v[rows] for f, v in self.doc_features.items()},
            query_features={f: v[rows] for f, v in self.query_features.items()},
        )
