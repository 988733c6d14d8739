"""Searching a pgvector table: the blended top-k in SQL, and the cosine candidates fitting needs.

:class:`PgSearchMixin` is the read side of :class:`normrank.pgvector_store.PgVectorNormIndex`.
Each call runs in one ``REPEATABLE READ`` transaction whose first statement reads the table's
state (``PgVectorNormIndex._run``), so the weights and calibration a query is weighted with are
those of the very snapshot its rows come from: a search that overlaps a ``set_weights``, ``fit``
or ``recalibrate`` on another connection gives exactly the before or the after answer.

A document row holds ``[d_hat, c(d) * COLUMN_SCALE]``; the query ``[q_hat, w(q) / COLUMN_SCALE]``
makes ``ORDER BY emb <#> q`` return the blended top-k itself (one inner-product scan or one HNSW
walk). The bounded multiplicative blend widens cosine candidates until no unseen row can win.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from normrank.calibration import FEATURES, NormCalibrator
from normrank.candidate_set import CandidateSet
from normrank.errors import EmptyCorpusError, InvalidArgumentError
from normrank.filters import MetadataFilter, check_filter
from normrank.filters import match as _match
from normrank.index_base import _check_k
from normrank.pg_sql import TableNames, filter_sql
from normrank.pg_state import COLUMN_SCALE, PG_HIGH, check_pg_option
from normrank.scoring import Hit, Weights, blend, doc_column, multiplicative_bound, query_column

logger = logging.getLogger(__name__)
T = TypeVar("T")


class PgSearchMixin:
    """Searches of a pgvector table (mixed into ``PgVectorNormIndex``, which supplies the state)."""

    _names: TableNames
    _count: int
    _dim: int | None
    _weights: Weights
    calibrator: NormCalibrator
    query_calibrator: NormCalibrator | None
    index_type: str
    pgvector_version: tuple[int, ...]
    ef_search: int
    _run: Callable[..., Any]
    _encode_texts: Callable[..., Any]
    _encode_queries: Callable[..., Any]
    _query_weights: Callable[..., Any]
    _shaped_feature: Callable[..., Any]

    def search(
        self,
        query: str | np.ndarray,
        k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        query_token_count: int | None = None,
        exact: bool | None = None,
    ) -> list[Hit]:
        """The blended top-``k`` for one query (text, or a raw vector); ``exact=True`` skips the HNSW index."""
        return self.search_batch([query], k, filter=filter, exact=exact,
                                 query_token_counts=None if query_token_count is None else [query_token_count])[0]

    def search_batch(
        self,
        queries: Sequence[str | np.ndarray],
        k: int = 10,
        *,
        filter: MetadataFilter | None = None,
        query_token_counts: Sequence[int | None] | None = None,
        exact: bool | None = None,
    ) -> list[list[Hit]]:
        """Blended top-``k`` for many queries, in one transaction (one snapshot of rows and state).

        Plain dict filters (key -> value or list of values) run in SQL on the ``metadata`` jsonb column; with the HNSW index,
        ``hnsw.iterative_scan`` keeps walking until ``k`` rows match, and an exact scan
        of the matches follows if the walk still came back short. A callable filter, and a dict with
        operators (:mod:`normrank.filters`), is evaluated in Python over every row's metadata first (a
        full read: prefer plain dicts).
        """
        if isinstance(queries, (str, np.ndarray)) and not (isinstance(queries, np.ndarray) and queries.ndim == 2):
            raise InvalidArgumentError("search_batch takes a list of queries; use search() for one")
        k = _check_k(k)
        # named before any work; an operator filter comes back as a predicate (run in Python, below)
        filter = check_filter(filter, allow_nul=False)
        queries = list(queries)
        if not queries:
            return []
        encoded = self._encode_texts(queries)  # no state needed: outside the lock and the transaction

        def body(cur: Any) -> list[list[Hit]]:
            if not self._count:
                raise EmptyCorpusError("the index is empty: add documents before searching")
            if k > self._count:
                raise InvalidArgumentError(
                    f"k of {k} is larger than the number of documents ({self._count}); ask for k <= {self._count}")
            unit, norms, counts = self._encode_queries(queries, query_token_counts, encoded)
            w = self._query_weights(norms, counts)
            use_index = self.index_type == "hnsw" and not exact
            where, params = self._where(cur, filter)
            if where == "false":
                return [[] for _ in queries]
            if self._weights.mode == "multiplicative" and not self._weights.is_cosine:
                return [self._search_multiplicative(cur, unit[i], float(w[i]), k, where, params, use_index)
                        for i in range(len(queries))]
            qcol = query_column(w, self._weights)
            qaugs = [np.append(unit[i], np.float32(qcol[i] / COLUMN_SCALE)).astype(np.float32)
                     for i in range(len(queries))]
            results = self._fetch_many(cur, qaugs, k, where, params, use_index)
            return [self._hits(rows, float(w[i])) for i, rows in enumerate(results)]

        return self._run(body)

    def _where(self, cur: Any, flt: MetadataFilter | None) -> tuple[str | None, dict[str, Any]]:
        if flt is None:
            return None, {}
        if callable(flt):
            rows = cur.execute(self._names.sql("SELECT id, metadata FROM {t}"))
            allowed = [i for i, meta in rows if _match(meta, flt)]
            return ("id = ANY(%(allowed)s)", {"allowed": allowed}) if allowed else ("false", {})
        if not flt:
            return None, {}
        return filter_sql(flt)

    def _set_scan(self, cur: Any, indexed: bool, k: int) -> None:
        """Transaction-local planner settings: the HNSW walk (iterative, wide enough for k) or an exact scan."""
        if not indexed:
            cur.execute("SELECT set_config('enable_indexscan', 'off', true)")
            return
        iterative = ", set_config('hnsw.iterative_scan', 'strict_order', true)" \
            if self.pgvector_version >= (0, 8) else ""
        ef = min(max(check_pg_option("ef_search", self.ef_search), k), PG_HIGH["ef_search"])
        cur.execute("SELECT set_config('enable_indexscan', 'on', true), "
                    f"set_config('hnsw.ef_search', %s, true){iterative}", (str(ef),))

    def _fetch_many(self, cur: Any, qaugs: Sequence[np.ndarray], k: int, where: str | None,
                    params: Mapping[str, Any], use_index: bool) -> list[list[tuple]]:
        """Top-``k`` rows by inner product with each of ``qaugs``: (seq, id, -score, norm, token_count, text,
        metadata). The statements go out in one pipeline (one round trip for the batch, not one per query).
        """
        conn = cur.connection

        def query(indexed: bool) -> Any:
            order = "dist" if indexed else "dist, seq"
            return self._names.sql(
                f"SELECT seq, id, emb <#> %(q)s AS dist, norm, token_count, text, metadata FROM {{t}} "
                f"{'WHERE ' + where if where else ''} ORDER BY {order} LIMIT %(k)s")

        def run(indexed: bool, vectors: Sequence[np.ndarray]) -> list[list[tuple]]:
            self._set_scan(cur, indexed, k)
            sql = query(indexed)
            with conn.pipeline():
                cursors = [conn.cursor() for _ in vectors]
                for c, q in zip(cursors, vectors):
                    c.execute(sql, {"q": q, "k": int(k), **params})
            return [c.fetchall() for c in cursors]

        results = run(use_index, qaugs)
        if use_index:
            short = [i for i, rows in enumerate(results)
                     if len(rows) < k and (where is not None or len(rows) < self._count)]
            if short:
                logger.debug("the HNSW walk came back short for %d queries: exact scan of the matches", len(short))
                for i, rows in zip(short, run(False, [qaugs[i] for i in short])):
                    results[i] = rows
                self._set_scan(cur, True, k)
        return results

    def _search_multiplicative(self, cur: Any, unit: np.ndarray, w: float, k: int, where: str | None,
                               params: Mapping[str, Any], use_index: bool) -> list[Hit]:
        """Exact bounded-multiplicative top-k over cosine candidates, widened until no unseen row can win.

        The same stopping rule as ``NormIndex``: a row below the last candidate's cosine
        ``c`` scores at most ``c + |w|/2 * |c|``.
        """
        m = min(self._count, max(4 * k, 64))
        qaug = np.append(unit, np.float32(0.0)).astype(np.float32)
        while True:
            rows = self._fetch_many(cur, [qaug], m, where, params, use_index)[0]
            cos = -np.array([r[2] for r in rows], dtype=np.float64)
            seqs = np.array([r[0] for r in rows], dtype=np.int64)
            norms = np.array([r[3] for r in rows], dtype=np.float64)
            counts = np.array([r[4] for r in rows], dtype=np.int64)
            scores = blend(cos, self._shaped_feature(self.calibrator, norms, counts), w, self._weights)
            order = np.lexsort((seqs, -scores))[:k]
            last = cos[-1] if cos.size else -1.0
            bound = multiplicative_bound(last, w)
            if len(rows) < m or m >= self._count or (order.size == k and scores[order[-1]] >= bound):
                return self._hits([rows[j] for j in order.tolist()], w, scores=scores[order], cosines=cos[order])
            m = min(self._count, m * 4)

    def _hits(self, rows: Sequence[tuple], w: float, scores: np.ndarray | None = None,
              cosines: np.ndarray | None = None) -> list[Hit]:
        if not rows:
            return []
        norms = np.array([r[3] for r in rows], dtype=np.float64)
        counts = np.array([r[4] for r in rows], dtype=np.int64)
        g = self._shaped_feature(self.calibrator, norms, counts)
        if scores is None:
            scores = -np.array([r[2] for r in rows], dtype=np.float64)
        if cosines is None:
            qcol = float(query_column(np.array(w), self._weights))
            cosines = scores - qcol * doc_column(g, self._weights.mode)
        return [Hit(r[1], float(scores[j]), float(cosines[j]), float(r[3]), float(g[j]), float(w), int(r[4]),
                    r[5], dict(r[6])) for j, r in enumerate(rows)]

    def cosine_candidates(self, queries: Sequence[str | np.ndarray], depth: int,
                          query_token_counts: Sequence[int | None] | None = None) -> CandidateSet:
        """Cosine top-``depth`` per query with both norm features of documents and queries (for fitting)."""
        from normrank._validation import check_option

        if isinstance(queries, str) or (isinstance(queries, np.ndarray) and queries.ndim != 2):
            raise InvalidArgumentError("cosine_candidates takes a list of queries, got a single one")
        depth = check_option("depth", depth)
        queries = list(queries)
        encoded = self._encode_texts(queries)

        def body(cur: Any) -> CandidateSet:
            d = min(depth, self._count)
            unit, qn, qc = self._encode_queries(queries, query_token_counts, encoded)
            nq = len(unit)
            cos = np.full((nq, d), -np.inf)
            norms, counts = np.ones((nq, d)), np.ones((nq, d), dtype=np.int64)
            doc_ids: list[list[str]] = []
            qaugs = [np.append(unit[i], np.float32(0.0)).astype(np.float32) for i in range(nq)]
            results = self._fetch_many(cur, qaugs, d, None, {}, self.index_type == "hnsw") if d else [[]] * nq
            for i, rows in enumerate(results):
                doc_ids.append([r[1] for r in rows])
                cos[i, : len(rows)] = [-r[2] for r in rows]
                norms[i, : len(rows)] = [r[3] for r in rows]
                counts[i, : len(rows)] = [r[4] for r in rows]
            out = CandidateSet(doc_ids=doc_ids, cosine=cos)
            qcal = self.query_calibrator or self.calibrator
            valid = np.isfinite(cos)
            for feat in FEATURES:
                gd = self.calibrator.transform(norms.ravel(), counts.ravel(), feat).reshape(cos.shape)
                out.doc_features[feat] = np.where(valid, gd, 0.0)
                if np.all(qc >= 1):
                    out.query_features[feat] = qcal.transform(qn, qc, feat)
            return out

        return self._run(body)


__all__ = ["PgSearchMixin"]
