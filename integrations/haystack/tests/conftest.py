"""Fixtures of this integration's tests: the real bundled model, the demo corpus the core ships, and a
throwaway PostgreSQL, from the one shared copy in :mod:`normrank.testing`."""

from normrank.testing import demo_encoded, demo_texts, encoder, pg_dsn, pg_table_factory  # noqa: F401
