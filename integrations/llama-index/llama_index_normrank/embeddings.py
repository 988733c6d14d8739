"""Deprecated: use ``llama_index.embeddings.normrank`` (this name aliases that module)."""

import sys

import llama_index_normrank  # noqa: F401  (warns once)
from llama_index.embeddings.normrank import base as _base

sys.modules[__name__] = _base
