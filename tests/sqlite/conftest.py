"""The SQLite-only tests: the shared fixtures (``producer``, ``consumer``,
``new_store``) stay on SQLite here, whatever the ``engine`` parameters of
tests/conftest.py are."""

from __future__ import annotations

import pytest


@pytest.fixture
def engine() -> str:
    return "sqlite"
