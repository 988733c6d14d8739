"""Deprecated: use ``haystack_integrations.components.rankers.normrank.ranker`` (aliased here)."""

import sys

import haystack_normrank  # noqa: F401  (warns once)
from haystack_integrations.components.rankers.normrank import ranker as _ranker

sys.modules[__name__] = _ranker
