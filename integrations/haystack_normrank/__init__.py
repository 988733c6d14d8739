"""Haystack integration of normrank: ``NormRankRanker``, a re-ranking component.

Install with ``pip install "normrank[haystack]"``.
"""

from __future__ import annotations

try:
    import haystack  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_extras.py
    raise ImportError(
        'haystack_normrank needs haystack-ai, which is not installed: pip install "normrank[haystack]"'
    ) from exc

from haystack_normrank.ranker import NormRankRanker

__all__ = ["NormRankRanker"]
