"""Deprecated: use ``haystack_integrations.components.rankers.normrank.ranker`` (aliased here).

Pipelines serialised under the old type name ``haystack_normrank.ranker.NormRankRanker`` keep
loading: Haystack imports this module, which registers the component under that name too
(``Pipeline.loads(..., allowed_modules=["haystack_normrank"])``, as Haystack only trusts
``haystack_integrations`` by default).
"""

import sys

from haystack import component

import haystack_normrank  # noqa: F401  (warns once)
from haystack_integrations.components.rankers.normrank import ranker as _ranker

component.registry.setdefault(_ranker.OLD_TYPE_NAME, _ranker.NormRankRanker)
sys.modules[__name__] = _ranker
