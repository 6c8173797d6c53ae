"""The durability budget: which commits wait for the disk, and why a lost
non-durable one is harmless.

The relay's accepted and conflict marks are committed without fsync (WAL,
``synchronous=NORMAL``).  A power loss or OS crash can drop such a commit
but never a later commit without it.  These tests drop it for real: they
keep the producer file's bytes (database and WAL) as the disk would hold
them after the last durable commit, relay, and then put those bytes back,
as recovery after a power loss would find them.  The only consequence may
be a re-send that the inbox answers ``duplicate`` (or the same conflict),
writing nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from reliable_flow import Consumer, Producer, relay, relay_batch
from reliable_flow.reservation import RESERVATION
from support import commit, digest, envelope

SUFFIXES = ("", "-wal")


def _disk_image(path: Path, into: Path) -> None:
    """The bytes of a live WAL database as a crash would leave them (the
    connection is idle and every commit so far reached the files)."""
    into.mkdir()
    for suffix in SUFFIXES:
        source = Path(str(path) + suffix)
        if source.exists():
            shutil.copyfile(source, into / (path.name + suffix))


def _power_loss(path: Path, image: Path) -> None:
    """Put the saved bytes back, as if nothing written since had reached the disk."""
    for suffix in (*SUFFIXES, "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    for suffix in SUFFIXES:
        saved = image / (path.name + suffix)
        if saved.exists():
            shutil.copyfile(saved, Path(str(path) + suffix))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield tmp_path / "producer.db", tmp_path / "consumer.db"


def _bytes(path: Path) -> list[str]:
    """Digests of the database file and its WAL: any write changes one of them."""
    return [digest(Path(str(path) + suffix)) for suffix in SUFFIXES if Path(str(path) + suffix).exists()]


def _states(p: Producer, c: Consumer) -> dict[str, str]:
    return {e.event_id: e.deliveries[c.name].state for e in p.outbox()}


def test_a_lost_accepted_mark_only_causes_a_duplicate_resend(pair: tuple[Path, Path], tmp_path: Path) -> None:
    p_path, c_path = pair
    p, c = Producer(p_path, RESERVATION), Consumer(c_path, RESERVATION)
    assert relay(p, c).status == "idle"  # binds the consumer
    ids = commit(p, "A", 3)
    _disk_image(p_path, tmp_path / "image")  # everything durable so far: the events, none marked

    assert [relay(p, c).status for _ in ids] == ["accepted"] * 3
    assert _states(p, c) == dict.fromkeys(ids, "accepted")
    consumer_before = _bytes(c_path)
    p.close()  # (the process dies; the marks were never fsynced and the power goes)
    _power_loss(p_path, tmp_path / "image")

    p = Producer(p_path, RESERVATION)
    try:
        assert _states(p, c) == dict.fromkeys(ids, "pending"), "the marks were expected to be lost"
        assert [relay(p, c).status for _ in ids] == ["duplicate"] * 3
        assert relay(p, c).status == "idle"
        assert _states(p, c) == dict.fromkeys(ids, "accepted")
        assert _bytes(c_path) == consumer_before, "a duplicate re-send wrote to the consumer file"
        assert c.drain("A").applied == 3
        assert [e.state for e in c.inbox("A")] == ["applied"] * 3
    finally:
        p.close()
        c.close()


def test_a_lost_conflict_mark_sets_the_event_aside_again(pair: tuple[Path, Path], tmp_path: Path) -> None:
    p_path, c_path = pair
    p, c = Producer(p_path, RESERVATION), Consumer(c_path, RESERVATION)
    assert relay(p, c).status == "idle"
    # The inbox already holds A1 with another body: the relay's answer is a conflict.
    assert c.receive(envelope("A1", "A", 1, payload={"amount": 99})).status == "accepted"
    commit(p, "A", 1)
    _disk_image(p_path, tmp_path / "image")
    assert relay_batch(p, c, limit=10).counts == {"id_conflict": 1}
    consumer_before = _bytes(c_path)
    p.close()
    _power_loss(p_path, tmp_path / "image")

    p = Producer(p_path, RESERVATION)
    try:
        assert _states(p, c) == {"A1": "pending"}
        assert relay(p, c).status == "id_conflict"
        assert _states(p, c) == {"A1": "set_aside"}
        assert relay(p, c).status == "idle"
        assert _bytes(c_path) == consumer_before
    finally:
        p.close()
        c.close()
