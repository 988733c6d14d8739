"""Haystack ranker that re-ranks by cosine plus a calibrated norm term (normrank)."""

from __future__ import annotations

try:
    import haystack  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by tests/test_extras.py
    raise ImportError(
        "haystack_integrations.components.rankers.normrank needs haystack-ai, which is not installed: "
        "pip install normrank-haystack"
    ) from exc

from haystack_integrations.components.rankers.normrank.ranker import NormRankRanker

try:  # pipelines serialised under the old type name (haystack_normrank.ranker.NormRankRanker) keep loading
    from haystack.core.serialization import allow_deserialization_module
except ImportError:  # pragma: no cover - Haystack without a deserialization allowlist
    pass
else:  # only our own deprecated alias module, which defines nothing but this component
    allow_deserialization_module("haystack_normrank.ranker")

__all__ = ["NormRankRanker"]
