"""``producer.wait`` (issue 30, item 3): the flow once its seq passes a given
one, heard from a commit in another process within the documented latency
(SQLite: 1 s at most, about 50 ms; PostgreSQL: 100 ms), or None at the
timeout; the awaited one never holds the store's thread, and a cancelled
one leaves no thread and no connection behind.  Both engines, both faces.
"""

from __future__ import annotations

import asyncio
import gc
import math
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine_reads import is_pg, rows
from reliable_flow import Producer
from reliable_flow.aio import AsyncProducer
from reliable_flow.errors import InvalidEnvelope
from reliable_flow.reservation import RESERVATION
from support import CHILDREN, child_env

#: The documented latency (docs/concepts.md, "Waiting for a flow"): from
#: the commit in another process to ``wait`` returning.
LATENCY = {"sqlite": 1.0, "postgres": 0.1}
ROUNDS = 5


def reserve(producer: Producer, flow: str) -> None:
    assert producer.advance(f"{flow}-1", flow, expected_seq=0, kind="reserved",
                            payload={"amount": 1}).status.value == "committed"


def wait_threads(settle: float = 0.0) -> list[threading.Thread]:
    """The threads of awaited waits; with ``settle``, those still there after
    up to that many seconds (a thread ends just after its last call answered)."""
    deadline = time.monotonic() + settle
    while True:
        found = [t for t in threading.enumerate() if t.name == "reliable_flow.aio:wait"]
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.005)


def listening(location: str) -> int:
    """How many connections are open for waits: on PostgreSQL the sessions
    listening on the schema's channel; on SQLite the sqlite3 connections
    open in this process, less the store's own (SQLite keeps a closed
    connection's file descriptor for the next open of the same file while
    another connection of the process holds a lock on it, so descriptors
    are no measure)."""
    if is_pg(location):
        from reliable_flow._store.watch import channel

        schema = urllib.parse.unquote(location.partition("#")[2])
        found = rows(location, "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                               "AND query LIKE ?", (f"%LISTEN%{channel(schema)}%",))
        return int(found[0][0])
    gc.collect()
    return sum(1 for conn in gc.get_objects() if isinstance(conn, sqlite3.Connection) and _open(conn)) - 1


def _open(conn: sqlite3.Connection) -> bool:
    try:
        conn.in_transaction  # noqa: B018 - raises once closed
    except sqlite3.ProgrammingError:
        return False
    return True


@contextmanager
def committer(location: str, delay: float, tmp_path: Path) -> Iterator[Any]:
    """A producer in another process: ``commit(flow)`` makes it advance
    ``flow`` after ``delay`` seconds; ``committed()`` reads the time.time()
    it took right after that commit."""
    with subprocess.Popen([sys.executable, str(CHILDREN / "advance_child.py"), location, str(delay)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=child_env(), cwd=tmp_path) as proc:
      try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""

        class Child:
            @staticmethod
            def commit(flow: str) -> None:
                proc.stdin.write(flow + "\n")
                proc.stdin.flush()

            @staticmethod
            def committed() -> float:
                line = proc.stdout.readline()
                assert line, proc.stderr.read() if proc.stderr else ""
                return float(line)

        yield Child
        proc.stdin.close()
        assert proc.wait(30) == 0
      finally:
        if proc.poll() is None:  # never left running
            proc.kill()
            proc.communicate()


# -- heard from another process ----------------------------------------------------------


@pytest.mark.parametrize("face", ["sync", "aio"])
def test_wait_returns_within_its_latency_after_a_commit_in_another_process(
        engine: str, new_store: Any, tmp_path: Path, face: str) -> None:
    location = new_store("producer")
    latencies = []
    with Producer(location, RESERVATION) as producer, committer(location, 0.3, tmp_path) as child:
        aproducer = AsyncProducer(location, RESERVATION) if face == "aio" else None
        try:
            for i in range(ROUNDS):
                flow = f"F{i}"
                child.commit(flow)
                if aproducer is None:
                    got = producer.wait(flow, after_seq=0, timeout=10)
                else:
                    got = asyncio.run(aproducer.wait(flow, after_seq=0, timeout=10))
                returned = time.time()
                latencies.append(returned - child.committed())
                assert got == producer.flow(flow) == {"state": "reserved", "seq": 1, "amount": 1}
        finally:
            if aproducer is not None:
                asyncio.run(aproducer.close())
    print(f"{engine} {face}: latency ms", [round(x * 1000, 1) for x in latencies])
    assert max(latencies) <= 1.0, latencies
    assert statistics.median(latencies) <= LATENCY[engine], latencies


# -- at once, and at the timeout -------------------------------------------------------------


def test_wait_returns_at_once_when_the_flow_is_past_and_none_at_the_timeout(producer: Producer) -> None:
    reserve(producer, "A")
    started = time.monotonic()
    assert producer.wait("A", after_seq=0, timeout=None) == producer.flow("A")
    assert producer.wait("A", after_seq=0, timeout=0) == producer.flow("A")
    assert time.monotonic() - started < 0.5
    assert producer.wait("A", after_seq=1, timeout=0) is None  # seq 1 is not past 1
    assert producer.wait("nobody", after_seq=0, timeout=0) is None
    started = time.monotonic()
    assert producer.wait("A", after_seq=1, timeout=0.3) is None
    assert 0.3 <= time.monotonic() - started < 2


def test_the_awaited_wait_returns_at_once_and_none_at_the_timeout(new_store: Any) -> None:
    async def main() -> None:
        async with AsyncProducer(new_store("producer"), RESERVATION) as producer:
            await producer.advance("A-1", "A", expected_seq=0, kind="reserved", payload={"amount": 1})
            started = time.monotonic()
            assert await producer.wait("A", after_seq=0, timeout=None) == await producer.flow("A")
            assert time.monotonic() - started < 0.5
            assert await producer.wait("A", after_seq=1, timeout=0) is None
            started = time.monotonic()
            assert await producer.wait("B", after_seq=0, timeout=0.3) is None
            assert 0.3 <= time.monotonic() - started < 2
            assert wait_threads(settle=1) == []

    asyncio.run(main())


# -- the awaited wait: the store's thread stays free; cancelled, nothing is left ---------------


def test_other_calls_go_on_while_a_wait_is_awaited(new_store: Any) -> None:
    async def main() -> None:
        async with AsyncProducer(new_store("producer"), RESERVATION) as producer:
            waiting = asyncio.create_task(producer.wait("A", after_seq=0, timeout=None))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            # Each of these needs the store's thread; none waits for the wait.
            assert await asyncio.wait_for(producer.flows(), 2) == []
            await asyncio.wait_for(producer.advance("B-1", "B", expected_seq=0, kind="reserved",
                                                    payload={"amount": 2}), 2)
            assert await asyncio.wait_for(producer.flow("B"), 2) == {"state": "reserved", "seq": 1, "amount": 2}
            assert not waiting.done()  # another flow moved: still waiting
            await asyncio.wait_for(producer.advance("A-1", "A", expected_seq=0, kind="reserved",
                                                    payload={"amount": 1}), 2)
            assert await asyncio.wait_for(waiting, 2) == {"state": "reserved", "seq": 1, "amount": 1}

    asyncio.run(main())


def test_a_cancelled_wait_leaves_no_thread_and_no_connection(new_store: Any) -> None:
    location = new_store("producer")

    async def main() -> None:
        async with AsyncProducer(location, RESERVATION) as producer:
            assert wait_threads() == [] and listening(location) == 0
            waits = [asyncio.create_task(producer.wait(f"F{i}", after_seq=0, timeout=None)) for i in range(3)]
            await asyncio.sleep(0.3)
            assert len(wait_threads()) == 3
            assert listening(location) == 3
            for task in waits:
                task.cancel()
            started = time.monotonic()
            for task in waits:
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, 5)  # a hang would fail here
            assert time.monotonic() - started < 1  # woken, not left to run out
            assert listening(location) == 0  # closed before the CancelledError came
            assert wait_threads(settle=1) == []
            assert listening(location) == 0
            # A timeout from outside is a cancellation too.
            with pytest.raises(asyncio.TimeoutError):  # not TimeoutError before Python 3.11
                await asyncio.wait_for(producer.wait("G", after_seq=0, timeout=None), 0.2)
            assert listening(location) == 0 and wait_threads(settle=1) == []
            assert await producer.flows() == []  # the producer still works

    asyncio.run(main())


def test_a_sync_wait_leaves_no_connection(producer: Producer) -> None:
    assert producer.wait("A", after_seq=0, timeout=0.1) is None
    assert listening(producer.location) == 0


# -- bad arguments ---------------------------------------------------------------------------

BAD = [
    ({"flow_id": 5}, InvalidEnvelope, "flow_id"),
    ({"flow_id": ""}, InvalidEnvelope, "flow_id"),
    ({"flow_id": None}, InvalidEnvelope, "flow_id"),
    ({"after_seq": -1}, ValueError, "after_seq"),
    ({"after_seq": True}, ValueError, "after_seq"),
    ({"after_seq": 1.0}, ValueError, "after_seq"),
    ({"after_seq": "1"}, ValueError, "after_seq"),
    ({"timeout": math.nan}, ValueError, "timeout"),
    ({"timeout": math.inf}, ValueError, "timeout"),
    ({"timeout": -0.1}, ValueError, "timeout"),
    ({"timeout": True}, ValueError, "timeout"),
    ({"timeout": "1"}, ValueError, "timeout"),
]


@pytest.mark.parametrize(("bad", "error", "field"), BAD, ids=lambda v: repr(v) if isinstance(v, dict) else "")
def test_bad_arguments_are_refused_naming_the_field(producer: Producer, bad: dict[str, Any],
                                                    error: type[Exception], field: str) -> None:
    args: dict[str, Any] = {"flow_id": "A", "after_seq": 0, "timeout": 1, **bad}
    flow_id = args.pop("flow_id")
    with pytest.raises(error, match=field):
        producer.wait(flow_id, **args)

    async def awaited() -> None:
        async with AsyncProducer(producer.location, RESERVATION) as aproducer:
            with pytest.raises(error, match=field):
                await aproducer.wait(flow_id, **args)
            assert wait_threads() == []  # refused before any was started

    asyncio.run(awaited())
    assert listening(producer.location) == 0
