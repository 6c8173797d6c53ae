"""The PostgreSQL-only tests: the shared fixtures (``producer``, ``consumer``,
``new_store``) are on the session's private PostgreSQL server here."""

from __future__ import annotations

import pytest

from pg_cluster import import_psycopg


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> str:
    import_psycopg()
    request.getfixturevalue("pg_cluster")
    return "postgres"
