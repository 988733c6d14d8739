"""Deprecated: use ``llama_index.retrievers.normrank`` (this name aliases that module)."""

import sys

import llama_index_normrank  # noqa: F401  (warns once)
from llama_index.retrievers.normrank import base as _base

sys.modules[__name__] = _base
