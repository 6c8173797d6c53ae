from __future__ import annotations

from pathlib import Path

import pytest

from reliable_flow import Consumer, Producer
from reliable_flow.reservation import RESERVATION


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
