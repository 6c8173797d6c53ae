from __future__ import annotations

from pathlib import Path

import pytest

from reliable_flow import Consumer, Producer
from reliable_flow.reservation import RESERVATION

# The shared helpers (support.py) assert too: let pytest explain their failures
# like a test's.  Registered here, before any test module imports them.
pytest.register_assert_rewrite("support")


@pytest.fixture
def producer(tmp_path: Path) -> Producer:
    p = Producer(tmp_path / "producer.db", RESERVATION)
    yield p
    p.close()


@pytest.fixture
def consumer(tmp_path: Path) -> Consumer:
    c = Consumer(tmp_path / "consumer.db", RESERVATION)
    yield c
    c.close()
