"""Shared pieces of the benchmark suite: the workload, timing samples,
statistics, commit counting and the description of the machine.

Everything here is standard library plus ``reliable_flow`` itself (only its
envelope and protocol helpers, to build the exact rows the library stores).
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from reliable_flow import _envelope as envelope
from reliable_flow.reservation import RESERVATION

__all__ = [
    "STEPS",
    "CommitCounter",
    "Event",
    "Sample",
    "chunks",
    "event_rows",
    "machine",
    "make_events",
    "median",
    "new_id",
]

# The reservation protocol's lifecycle: one flow carries at most three events.
STEPS = ("reserved", "confirmed", "released")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of the workload, with every row value the library will store.

    ``body`` is the canonical envelope (what outbox and inbox hold), ``data``
    the flow data after the step (producer ``flow.data`` and consumer
    ``projection.data``), ``view`` the consumer projection view.
    """

    event_id: str
    flow_id: str
    seq: int
    kind: str
    amount: int
    body: str
    data: str
    view: str
    payload: dict[str, int]  # built in advance: the caller's dict, not the library's work


def new_id(rng: random.Random, bits: int = 128) -> str:
    """A random hex id (uuid4-like): inserts land anywhere in the indexes."""
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


def event_rows(event_id: str, flow_id: str, seq: int, amount: int, *, check: bool = True) -> Event:
    """Build one event's rows.  ``check=False`` skips ``envelope.make`` (used
    for the million-row prefill, where it would dominate build time); the
    result is the same canonical text (asserted on a sample by the caller)."""
    kind = STEPS[seq - 1]
    if check:
        body = envelope.make(
            event_id=event_id,
            flow_id=flow_id,
            seq=seq,
            kind=kind,
            schema=1,
            payload={"amount": amount},
        ).body
    else:
        # Hex ids and ints need no escaping: the template is the canonical text.
        body = _BODY % (event_id, flow_id, kind, amount, seq)
    data, view = _rows_of(kind, amount)
    return Event(event_id, flow_id, seq, kind, amount, body, data, view, {"amount": amount})


_BODY = '{"event_id":"%s","flow_id":"%s","kind":"%s","payload":{"amount":%d},"schema":1,"seq":%d}'


@functools.cache
def _rows_of(kind: str, amount: int) -> tuple[str, str]:
    """Canonical flow data and projection view after a step (few distinct values)."""
    data = {"amount": amount}
    return envelope.canonical(data), envelope.canonical(RESERVATION.view(kind, data))


def make_events(n: int, rng: random.Random, steps_per_flow: int = 3) -> list[Event]:
    """``n`` events, flow-major: each new flow gets ``steps_per_flow`` steps in order
    (reserved, confirmed, released), so both the insert and the update paths run."""
    if not 1 <= steps_per_flow <= len(STEPS):
        raise ValueError("steps_per_flow must be 1..3")
    out: list[Event] = []
    while len(out) < n:
        flow_id = "flow-" + new_id(rng, 64)
        amount = rng.randint(1, 1000)
        for seq in range(1, steps_per_flow + 1):
            if len(out) == n:
                break
            out.append(event_rows(new_id(rng), flow_id, seq, amount))
    return out


def chunks(items: Sequence[Event], size: int) -> Iterator[Sequence[Event]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed section: wall seconds (and this process's CPU seconds, which
    exclude waiting for fsync and for other processes) for ``events`` events."""

    seconds: float
    events: int
    cpu: float = 0.0

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu / self.events * 1e6

    @property
    def us_per_event(self) -> float:
        return self.seconds / self.events * 1e6


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


# -- commit counting (audit only: the trace callback costs time) ------------------


@dataclass
class CommitCounter:
    """Counts transactions on connections via ``set_trace_callback``.

    ``durable``: COMMITs of a write transaction that changed rows (each one
    is a WAL append plus an fsync under synchronous=FULL); ``lazy``: COMMITs
    that changed rows while the connection was at ``synchronous=NORMAL`` or
    ``OFF`` (a WAL append, no fsync: made durable by the next durable
    commit); ``empty``: COMMITs of a transaction that changed nothing (no
    WAL write, no fsync).  The connection's level is followed from the
    ``PRAGMA synchronous`` statements it runs after ``attach`` (every
    connection here starts at FULL).  Used in an untimed audit run, never
    while timing.
    """

    durable: int = 0
    empty: int = 0
    lazy: int = 0
    statements: int = 0
    _conns: list[sqlite3.Connection] = field(default_factory=list)

    def attach(self, conn: sqlite3.Connection) -> None:
        start = [conn.total_changes]
        full = [True]

        def trace(sql: str) -> None:
            self.statements += 1
            word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
            if word == "BEGIN":
                start[0] = conn.total_changes
            elif word in ("COMMIT", "END"):
                if conn.total_changes == start[0]:
                    self.empty += 1
                elif full[0]:
                    self.durable += 1
                else:
                    self.lazy += 1
            elif word == "PRAGMA":
                text = sql.replace(" ", "").lower()
                if "synchronous=" in text:
                    level = text.split("synchronous=", 1)[1].strip(";'\"")
                    full[0] = level not in ("normal", "off", "0", "1")

        conn.set_trace_callback(trace)
        self._conns.append(conn)

    def detach(self) -> None:
        for conn in self._conns:
            try:
                conn.set_trace_callback(None)
            except sqlite3.ProgrammingError:
                pass  # already closed
        self._conns.clear()

    def reset(self) -> None:
        self.durable = self.empty = self.lazy = self.statements = 0


@contextmanager
def counting(*conns: sqlite3.Connection) -> Iterator[CommitCounter]:
    counter = CommitCounter()
    for conn in conns:
        counter.attach(conn)
    try:
        yield counter
    finally:
        counter.detach()


# -- the machine --------------------------------------------------------------------


def _filesystem(path: str) -> str:
    """``fstype (device, mount point)`` of ``path``: ``df -T`` if present, else /proc/mounts."""
    try:
        out = subprocess.run(
            ["df", "-T", path], capture_output=True, text=True, timeout=10, check=True
        ).stdout.splitlines()
        fields = out[-1].split()
        if len(fields) >= 7:
            return f"{fields[1]} ({fields[0]} on {fields[-1]})"
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    try:
        real = os.path.realpath(path)
        best = ("", "?", "?")
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                dev, mnt, fstype = line.split()[:3]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                    best[0]
                ):
                    best = (mnt, fstype, dev)
        return f"{best[1]} ({best[2]} on {best[0]})"
    except OSError:
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine(tmp: str) -> dict[str, str]:
    """The facts that make a run's numbers comparable (or not) with another's."""
    return {
        "platform": platform.platform(),
        "cpu": f"{_cpu_model()}, {os.cpu_count()} logical CPUs",
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "sqlite": sqlite3.sqlite_version,
        "filesystem": f"{_filesystem(tmp)} for {tmp}",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
