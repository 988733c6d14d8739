"""Deprecated import path: use ``haystack_integrations.components.rankers.normrank``.

Kept so existing code and pipelines serialised under the old name keep loading; warns on import.
"""

from __future__ import annotations

import warnings

from haystack_integrations.components.rankers.normrank import NormRankRanker

warnings.warn(
    "haystack_normrank is deprecated; import NormRankRanker from haystack_integrations.components.rankers.normrank",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["NormRankRanker"]
