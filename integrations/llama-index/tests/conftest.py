"""Fixtures of this integration's tests: the real bundled model, the demo corpus the core ships, and a
throwaway PostgreSQL, from the one shared copy in :mod:`normrank.testing`."""

from normrank.testing import (  # noqa: F401
    demo_encoded,
    demo_ids,
    demo_index,
    demo_queries,
    demo_texts,
    encoder,
    model_calls,
    pg_dsn,
    pg_table_factory,
)
