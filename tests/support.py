"""Helpers shared by the test files.

Not collected by pytest (no ``test_`` prefix).  The test files import it as
``from support import ...``: pytest puts ``tests/`` on ``sys.path`` (the
test files there are not a package), and :func:`child_env` puts it on the
``PYTHONPATH`` of child processes.  ``conftest.py`` registers this module
for pytest's assertion rewriting, so a failing ``assert`` in a helper
explains itself like one in a test.

* envelopes and flows: :data:`KINDS`, :func:`envelope`, :func:`canonical_body`,
  :func:`advance_step`, :func:`commit`, :func:`outbox_entry`,
  :func:`troubled_history` (the operator tests' stuck flows);
* relaying: :func:`relay_until_idle`, :func:`relay_log`;
* raw SQL, for what the public API has no accessor for (each call opens its
  own short-lived ``sqlite3`` connection; read-only where it only reads):
  :func:`sql_rows`, :func:`sql_count`, :func:`sql_pragma`, :func:`sql_execute`,
  and :func:`digest` of a file's bytes;
* time and transports: :class:`Clock`, :class:`Unreachable`;
* child processes (their code lives in ``tests/children/``, see
  :data:`CHILDREN`): :func:`child_env`, :func:`run_cli`, :func:`run_script`,
  :func:`child_process`; :func:`start_on_barrier` (``spawn`` processes
  released together at a barrier, with a watchdog); forked children:
  :func:`in_forked_child`, :func:`wait_child`, :func:`read_pipe`;
* the knobs of the randomized kill tests: :func:`chosen_seed`, :func:`kill_count`.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import queue
import random
import select
import sqlite3
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from reliable_flow import Consumer, Producer, relay
from reliable_flow.records import AdvanceResult, OutboxEntry, RelayResult
from reliable_flow.reservation import RESERVATION

TESTS = Path(__file__).resolve().parent
CHILDREN = TESTS / "children"  # child-process scripts: ``python tests/children/NAME.py ARGS``
SRC = Path(reliable_flow.__file__).resolve().parent.parent  # the src/ the tests import
CHILD_TIMEOUT = 60  # seconds a child process may take before the test fails

# -- envelopes and flows -------------------------------------------------------------------

KINDS = ("reserved", "confirmed", "released")  # the reservation steps, seq 1, 2, 3
_STEP_OF_SEQ = dict(enumerate(KINDS, start=1))


def envelope(
    event_id: str,
    flow_id: str,
    seq: int,
    *,
    kind: str | None = None,
    amount: int = 3,
    schema: int = 1,
    payload: dict[str, Any] | None = None,
    meta: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A hand-built envelope (a dict, as a transport would hand it over).

    ``kind`` defaults to the reservation step number ``seq`` (reserved,
    confirmed, released); ``payload`` to the reservation payload of
    ``schema``: ``{"amount": amount}`` for schema 1, ``{"units": amount}``
    otherwise.  ``meta`` is added only when given.
    """
    env: dict[str, Any] = {
        "event_id": event_id,
        "flow_id": flow_id,
        "seq": seq,
        "kind": kind if kind is not None else _STEP_OF_SEQ[seq],
        "schema": schema,
        "payload": payload if payload is not None else ({"amount": amount} if schema == 1 else {"units": amount}),
    }
    if meta is not None:
        env["meta"] = meta
    return env


def canonical_body(env: dict[str, Any]) -> str:
    """The body a file stores for ``env``, spelt out independently of the library:
    sorted keys, compact separators, non-ASCII as UTF-8 text."""
    return json.dumps(env, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def advance_step(
    target: Any, event_id: str, flow_id: str, seq: int, *, amount: int = 3, meta: dict[str, str] | None = None
) -> AdvanceResult:
    """``advance`` (on a Producer or a Batch) of reservation step number ``seq``."""
    result: AdvanceResult = target.advance(
        event_id, flow_id, expected_seq=seq - 1, kind=KINDS[seq - 1], payload={"amount": amount}, meta=meta
    )
    return result


def commit(producer: Producer, flow: str, upto: int = 3, *, amount: int = 3, sep: str = "") -> list[str]:
    """Commit reservation steps 1..``upto`` of ``flow`` as events ``<flow><sep><n>``; their ids."""
    ids = []
    for n in range(1, upto + 1):
        event_id = f"{flow}{sep}{n}"
        r = producer.advance(event_id, flow, expected_seq=n - 1, kind=KINDS[n - 1], payload={"amount": amount})
        assert (r.status, r.seq) == ("committed", n), r
        ids.append(event_id)
    return ids


def troubled_history(producer_at: Any, consumer_at: Any) -> None:
    """Write the operator tests' history into two new stores (either engine):
    A is blocked (schema 2), B has a gap, C1 is set aside, D1 was never
    relayed, B2 was redelivered by an operator."""
    with Producer(producer_at, RESERVATION) as producer, Consumer(consumer_at, RESERVATION) as consumer:
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"units": 3}, schema=2)
        for i, kind in enumerate(["reserved", "confirmed", "released"]):
            producer.advance(f"B{i + 1}", "B", expected_seq=i, kind=kind, payload={"amount": 2})
        producer.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 1})
        consumer.receive({"event_id": "C1", "flow_id": "C", "seq": 1, "kind": "reserved",
                          "schema": 1, "payload": {"amount": 9}})
        for event_id in ["A1", "A2", "B1", "B3", "C1"]:
            relay(producer, consumer, event_id=event_id)
        consumer.process_all()
        producer.advance("D1", "D", expected_seq=0, kind="reserved", payload={"amount": 1})
        producer.admin.redeliver("B2", consumer="default", actor="ops", reason="kick it")


def outbox_entry(producer: Producer, event_id: str, consumer: str | None = None) -> OutboxEntry:
    """The one outbox entry of ``event_id`` (as ``producer.outbox(consumer=...)`` shows it)."""
    found = [e for e in producer.outbox(consumer=consumer) if e.event_id == event_id]
    assert len(found) == 1, found
    return found[0]


# -- relaying ------------------------------------------------------------------------------


def relay_until_idle(producer: Producer, consumer: Any, limit: int = 10_000, **kw: Any) -> list[RelayResult]:
    """``relay(producer, consumer, **kw)`` until it answers idle; every other answer, in order."""
    out = []
    for _ in range(limit):
        r = relay(producer, consumer, **kw)
        if r.status == "idle":
            return out
        out.append(r)
    raise AssertionError(f"relay never went idle in {limit} calls")


def relay_log(producer: Producer, consumer: Any, limit: int = 10_000, **kw: Any) -> list[str]:
    """:func:`relay_until_idle`, each answer as ``"<event_id> <status>"``."""
    return [f"{r.event_id} {r.status}" for r in relay_until_idle(producer, consumer, limit, **kw)]


# -- raw SQL -------------------------------------------------------------------------------


def sql_rows(path: str | os.PathLike[str], sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """The rows of one query, through a connection of its own with ``query_only`` on."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA query_only=ON")
        return conn.execute(sql, params).fetchall()


def sql_count(path: str | os.PathLike[str], table: str) -> int:
    """How many rows ``table`` holds."""
    return int(sql_rows(path, f'SELECT count(*) FROM "{table}"')[0][0])


def sql_pragma(path: str | os.PathLike[str], name: str) -> Any:
    """The value of ``PRAGMA <name>`` (user_version, application_id, journal_mode, ...)."""
    return sql_rows(path, f"PRAGMA {name}")[0][0]


def sql_execute(path: str | os.PathLike[str], *statements: str) -> None:
    """Run ``statements`` in order, each committed on its own (autocommit), on a connection of its own."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in statements:
            conn.execute(statement)


def digest(path: Path) -> str:
    """SHA-256 of the file's bytes, to show that something left it untouched."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- time and transports -------------------------------------------------------------------


class Clock:
    """An injected clock: time moves only when the test sets ``t``."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _body(envelope_in: Any) -> dict[str, Any]:
    return dict(json.loads(envelope_in)) if isinstance(envelope_in, (str, bytes)) else dict(envelope_in)


class Unreachable(Consumer):
    """A consumer behind a transport that fails: ``receive`` and ``receive_many``
    raise while ``down`` (set it to False and the transport works again).

    ``fail_flows``: only events of these flows fail (None: every event; a
    ``receive_many`` fails as a whole when one of its events does).
    ``exc``: builds what the transport raises from the number of the call
    (default: ``ConnectionError("consumer unreachable (call n)")``).
    ``calls`` counts the calls, ``sent`` lists every event id offered, in order.
    """

    def __init__(
        self,
        *args: Any,
        fail_flows: set[str] | None = None,
        exc: Callable[[int], BaseException] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.down = True
        self.fail_flows = fail_flows
        self.exc = exc or (lambda n: ConnectionError(f"consumer unreachable (call {n})"))
        self.calls = 0
        self.sent: list[str] = []

    def _offered(self, bodies: Iterable[dict[str, Any]]) -> None:
        """Count the call, note what was offered, and raise if the transport fails it."""
        self.calls += 1
        flows = []
        for body in bodies:
            self.sent.append(body["event_id"])
            flows.append(body["flow_id"])
        if self.down and (self.fail_flows is None or any(f in self.fail_flows for f in flows)):
            raise self.exc(self.calls)

    def receive(self, envelope_in: Any) -> Any:
        self._offered([_body(envelope_in)])
        return super().receive(envelope_in)

    def receive_many(self, envelopes: Any) -> Any:
        self._offered([_body(e) for e in envelopes])
        return super().receive_many(envelopes)


# -- child processes -----------------------------------------------------------------------


def chosen_seed() -> int:
    """``RELIABLE_FLOW_SEED`` if set (to replay a run), else a fresh random seed (print it)."""
    value = os.environ.get("RELIABLE_FLOW_SEED")
    return int(value) if value else random.SystemRandom().randrange(2**32)


def kill_count(default: int) -> int:
    """``RELIABLE_FLOW_KILLS`` if set, else ``default``: how many kills a kill test makes."""
    value = os.environ.get("RELIABLE_FLOW_KILLS")
    return int(value) if value else default


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: this one without any ``RELIABLE_FLOW_*``
    variable (no crash point armed, no seed or count meant for this process),
    with ``src/`` and ``tests/`` first on ``PYTHONPATH`` (the child imports this
    checkout and the modules under ``tests/``), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(TESTS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m reliable_flow ARGS`` in a child process, the way a user would."""
    return subprocess.run(
        [sys.executable, "-m", "reliable_flow", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env=child_env() if env is None else env, check=False,
    )


@contextmanager
def child_process(args: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None,
                  ) -> Iterator[subprocess.Popen[str]]:
    """``subprocess.Popen(args)`` with stdout and stderr piped as text, for a test that talks
    to the child while it runs.  Whatever happens in the block, the child is never left
    running: one still alive at the end is killed and reaped."""
    with subprocess.Popen(
        list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env() if env is None else env, cwd=cwd,
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def run_script(script: Path, *args: str, cwd: Path, env: dict[str, str] | None = None,
               timeout: float = CHILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``python SCRIPT ARGS`` (usually one in :data:`CHILDREN`) to the end; its output as text."""
    return subprocess.run(
        [sys.executable, str(script), *args],
        env=child_env() if env is None else env, capture_output=True, text=True, timeout=timeout, cwd=cwd,
        check=False,
    )


@dataclass(frozen=True)
class ChildReport:
    """What one process of :func:`start_on_barrier` sent back."""

    ok: bool
    value: Any = None  # what the target returned
    error: str = ""  # the traceback, when it raised
    sqlite_error: str | None = None  # the exception's ``sqlite_errorname``, if any


@dataclass(frozen=True)
class BarrierRun:
    """The processes of one :func:`start_on_barrier`: a report per index, and exit codes."""

    name: str
    reports: dict[int, ChildReport]
    exitcodes: list[int | None]

    @property
    def errors(self) -> dict[int, ChildReport]:
        return {i: r for i, r in self.reports.items() if not r.ok}

    def values(self) -> list[Any]:
        """Every process's return value, by index; fails if one raised or did not exit 0."""
        errors = self.errors
        assert not errors, f"{self.name}: children failed: " + "\n".join(r.error for r in errors.values())
        assert self.exitcodes == [0] * len(self.exitcodes), self.exitcodes
        return [self.reports[i].value for i in range(len(self.exitcodes))]


def _on_barrier(target: Callable[..., Any], args: tuple[Any, ...], index: int, barrier: Any, results: Any) -> None:
    """Runs in each child: ``target(*args, barrier)``, its outcome sent to the parent.
    Nothing escapes unreported (a BrokenBarrierError neither)."""
    try:
        report = ChildReport(True, target(*args, barrier))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never hangs it
        report = ChildReport(False, error="".join(traceback.format_exception(exc)),
                             sqlite_error=getattr(exc, "sqlite_errorname", None))
    results.put((index, report))


def start_on_barrier(target: Callable[..., Any], args_list: Sequence[tuple[Any, ...]], timeout: float,
                     name: str = "child") -> BarrierRun:
    """Start one ``spawn`` process per entry of ``args_list``, each running
    ``target(*args, barrier)`` with one barrier for all of them, and collect what
    each returned (or raised).

    ``target`` must be importable by the child (see ``tests/children/racers.py``);
    it waits at the barrier itself, so it can open its files first.  A watchdog
    of ``timeout`` seconds in all turns a hang into a failure: stragglers are
    killed, and a child that hung or died without a report fails the test here.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(args_list))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_on_barrier, args=(target, tuple(args), i, barrier, results), name=f"{name}-{i}")
        for i, args in enumerate(args_list)
    ]
    reports: dict[int, ChildReport] = {}
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        while len(reports) < len(procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                index, report = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break  # a child died without reporting
                continue
            reports[index] = report
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()) + 5)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        exitcodes = [p.exitcode for p in procs]
        for proc in procs:
            if proc.exitcode is not None:
                proc.close()
        results.close()
        results.join_thread()
    missing = sorted(set(range(len(procs))) - reports.keys())
    assert not missing, f"{name}: children {missing} hung or died without a report (exit codes {exitcodes})"
    return BarrierRun(name, reports, exitcodes)


def wait_child(pid: int, timeout: float = CHILD_TIMEOUT) -> int:
    """Exit code of a forked child; kills it and fails the test if it hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child {pid} did not finish within {timeout}s")


def read_pipe(fd: int) -> str:
    """Everything written to the pipe ``fd`` (waiting at most 5 s for each piece); closes it."""
    chunks = []
    while select.select([fd], [], [], 5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


def in_forked_child(work: Callable[[], str]) -> tuple[int, str]:
    """Run ``work`` in a forked child; return (exit code, what it reported).

    The child always leaves through ``os._exit``: exit 0 if ``work`` returned,
    1 if it raised (the report then names the exception).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_fd)
            try:
                message = work()
                code = 0
            except BaseException as exc:  # noqa: BLE001 - report anything to the parent
                message = f"{type(exc).__name__}: {exc}"
            os.write(write_fd, message.encode())
            os.close(write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    code = wait_child(pid)
    return code, read_pipe(read_fd)


# -- effects -------------------------------------------------------------------------------


class EffectWorld:
    """A producer and consumers on files in one directory, sharing one
    :class:`Clock`, for the handler and effect tests: ``push`` advances a
    reservation flow (event ids ``<flow><seq>``), ``deliver`` relays until
    idle, ``executor`` makes an ``EffectExecutor`` on the same clock with a
    fixed random source (0.5), so every backoff is exact."""

    def __init__(self, where: Path, protocol: Any = None, *, engine: str = "sqlite") -> None:
        from engine_reads import new_location  # engine_reads imports this module

        self.dir = where
        self.engine = engine
        self.protocol = RESERVATION if protocol is None else protocol
        self.clock = Clock()
        # a SQLite file in ``where``, or a PostgreSQL schema (``engine``)
        consumer_at = new_location(engine, where, "consumer")
        self.consumer_path: Any = Path(consumer_at) if engine == "sqlite" else consumer_at
        self.producer = Producer(new_location(engine, where, "producer"), self.protocol)
        self._open: list[Any] = [self.producer]

    def consumer(self, handlers: tuple[Callable[..., None], ...] = (), effects: Any = None, **kw: Any) -> Consumer:
        c = Consumer(self.consumer_path, self.protocol, handlers=handlers, effects=effects, clock=self.clock, **kw)
        self._open.append(c)
        return c

    def push(self, flow: str, upto: int = 1, *, amount: int = 3, meta: dict[str, str] | None = None,
             start: int = 1) -> None:
        """Advance ``flow`` through steps start..upto."""
        for seq in range(start, upto + 1):
            r = self.producer.advance(f"{flow}{seq}", flow, expected_seq=seq - 1, kind=KINDS[seq - 1],
                                      payload={"amount": amount}, meta=meta)
            assert r.status == "committed", r

    def deliver(self, consumer: Consumer) -> None:
        for _ in range(1000):
            if relay(self.producer, consumer).status == "idle":
                return
        raise AssertionError("relay never went idle")

    def executor(self, consumer: Consumer, *, owner: str = "exec-1", **kw: Any) -> Any:
        from reliable_flow import DeliveryPolicy, EffectExecutor

        return EffectExecutor(consumer, policy=DeliveryPolicy(
            lease_seconds=30, clock=self.clock, random=lambda: 0.5, owner=owner), **kw)

    def close(self) -> None:
        for thing in reversed(self._open):
            thing.close()


def dead_effects(engine: str, tmp_path: Path, flows: Sequence[str] = ("A", "B")) -> str:
    """A consumer store (its location) whose handler scheduled ``notify``
    for ``<flow>1`` of each of ``flows``, every one of them ``dead``."""
    from engine_reads import new_location
    from reliable_flow import (
        ApplyContext,
        DeliveryPolicy,
        EffectExecutor,
        EffectRegistry,
        PermanentFailure,
    )

    producer_at, consumer_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    effects = EffectRegistry()

    def declined(call: Any) -> Any:
        raise PermanentFailure("declined")

    effects.register("notify", declined)

    def handler(ctx: ApplyContext) -> None:
        ctx.schedule("notify", {"flow": ctx.event.flow_id})

    with Producer(producer_at, RESERVATION) as producer, \
            Consumer(consumer_at, RESERVATION, handlers=(handler,), effects=effects) as consumer:
        for flow in flows:
            producer.advance(f"{flow}1", flow, expected_seq=0, kind=KINDS[0], payload={"amount": 3})
        while relay(producer, consumer).status != "idle":
            pass
        consumer.process_all()
        EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=30)).run_until_idle()
        assert {e.key: e.state for e in consumer.scheduled_effects()} == {
            f"default:{flow}1:notify": "dead" for flow in flows}
    return consumer_at
