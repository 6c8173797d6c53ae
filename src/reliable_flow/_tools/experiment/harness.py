"""The experiment's shared machinery: fresh files, child processes, observations.

Every scenario (in the ``scenarios_*`` modules) gets a :class:`Files` of its
own, opens it with :func:`open_files`, and records what it sees with the small
observation helpers below, which keep only JSON-able facts (never paths,
PIDs or timings).  Child processes come in two kinds: ``python -m
reliable_flow._tools.experiment.child`` for a process that must really exit
(:func:`run_child`), and ``multiprocessing`` spawn children for handshakes
and races, whose targets are the module-level functions here.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..._consumer import Consumer
from ..._producer import Producer
from ..._relay import relay
from ...records import DrainResult
from ...reservation import RESERVATION

__all__ = ["CHILD_MODULE", "CHILD_TIMEOUT", "RACERS", "STEPS", "Files", "Result", "Scenario"]

CHILD_TIMEOUT = 60.0  # seconds; a watchdog against hangs, never an ordering tool
RACERS = 6
STEPS = (("reserved", 1), ("confirmed", 2), ("released", 3))  # kind, seq of flow X's events X1..X3
#: What :func:`run_child` runs with ``python -m``: see :mod:`.child`.
CHILD_MODULE = "reliable_flow._tools.experiment.child"

Result = dict[str, Any]


@dataclass(frozen=True)
class Files:
    """The fresh files of one scenario (paths never reach the results)."""

    dir: Path

    @property
    def producer(self) -> str:
        return str(self.dir / "producer.db")

    @property
    def consumer(self) -> str:
        return str(self.dir / "consumer.db")


@dataclass(frozen=True)
class Scenario:
    name: str
    origin: str  # "seed" (the seed article's run_experiment.py) or "ours"
    run: Callable[[Files], Result]


# -- small helpers ------------------------------------------------------------------


@contextmanager
def open_paths(
    producer_path: str, consumer_path: str, schemas: set[int] | None = None
) -> Iterator[tuple[Producer, Consumer]]:
    """A producer and a consumer on the two files, closed on the way out."""
    with (
        Producer(producer_path, RESERVATION) as producer,
        Consumer(consumer_path, RESERVATION, schemas=schemas) as consumer,
    ):
        yield producer, consumer


def open_files(
    files: Files, schemas: set[int] | None = None
) -> AbstractContextManager[tuple[Producer, Consumer]]:
    """A producer and a consumer (reading ``schemas``, default the protocol's) on ``files``."""
    return open_paths(files.producer, files.consumer, schemas)


def create_files(files: Files) -> None:
    """Create both files, empty, before child processes open them."""
    with open_files(files):
        pass


def advance_flow(
    producer: Producer, flow_id: str, amount: int = 3, schemas: Iterable[int] = (1, 1, 1)
) -> list[str]:
    statuses = []
    for (kind, seq), schema in zip(STEPS, schemas):
        payload = {"amount": amount} if schema == 1 else {"units": amount}
        r = producer.advance(
            f"{flow_id}{seq}",
            flow_id,
            expected_seq=seq - 1,
            kind=kind,
            payload=payload,
            schema=schema,
        )
        statuses.append(str(r.status))
    return statuses


def advance_first(producer: Producer, event_id: str = "A1", flow_id: str = "A") -> str:
    """Commit the first step of a flow (reserved, amount 3); the status."""
    r = producer.advance(event_id, flow_id, expected_seq=0, kind="reserved", payload={"amount": 3})
    return str(r.status)


def event_of(producer: Producer, event_id: str) -> Result:
    event = producer.event(event_id)
    if event is None:
        raise LookupError(f"{event_id} is not in the outbox")
    return event


def outbox_of(producer: Producer, flow_id: str | None = None) -> list[Result]:
    return [
        {"event_id": e.event_id, "seq": e.seq, "accepted": e.accepted, "state": e.state}
        for e in producer.outbox(flow_id)
    ]


def inbox_of(consumer: Consumer, flow_id: str) -> list[Result]:
    # Without ``meta``: the frozen results predate it and must not change.
    return [{k: v for k, v in asdict(row).items() if k != "meta"} for row in consumer.inbox(flow_id)]


def effects_of(consumer: Consumer, flow_id: str) -> list[Result]:
    return [
        {"event_id": e.event_id, "seq": e.seq, "kind": e.kind}
        for e in consumer.applied(flow_id)
    ]


def drain_dict(result: DrainResult) -> Result:
    out: Result = {"applied": result.applied, "stop": str(result.stop)}
    if result.last is not None and result.last.reason is not None:
        out["reason"] = str(result.last.reason)
        out["at_seq"] = result.last.seq
    return out


def relay_until_idle(producer: Producer, consumer: Consumer, limit: int = 100) -> list[str]:
    statuses = []
    for _ in range(limit):
        status = str(relay(producer, consumer).status)
        statuses.append(status)
        if status == "idle":
            break
    return statuses


def observe(producer: Producer, consumer: Consumer, flow_id: str) -> Result:
    return {
        "flow": producer.flow(flow_id),
        "outbox": outbox_of(producer, flow_id),
        "inbox": inbox_of(consumer, flow_id),
        "projection": consumer.projection(flow_id),
        "effects": effects_of(consumer, flow_id),
    }


def run_sql(path: str, statement: str, params: tuple[Any, ...] = ()) -> int:
    """One statement in its own connection, as an operator at the sqlite3 prompt would."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    try:
        return conn.execute(statement, params).rowcount
    finally:
        conn.close()


def bodies(path: str, table: str) -> dict[str, str]:
    conn = sqlite3.connect(Path(path).as_uri() + "?mode=ro", uri=True)
    try:
        return dict(conn.execute(f"SELECT event_id, body FROM {table}").fetchall())
    finally:
        conn.close()


def error_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


# -- child processes ------------------------------------------------------------------


def _child_env(**extra: str) -> dict[str, str]:
    """The parent's environment without any RELIABLE_FLOW_* setting, able to import us."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    src = str(Path(__file__).resolve().parents[3])  # src/ of src/reliable_flow/_tools/experiment
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def run_child(command: str, args: list[str], files: Files, expect: int, **env: str) -> int:
    """Run ``python -m CHILD_MODULE command args...``; its exit code (stderr shown if not ``expect``)."""
    proc = subprocess.run(
        [sys.executable, "-m", CHILD_MODULE, command, *args],
        env=_child_env(**env),
        cwd=files.dir,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    if proc.returncode != expect:
        sys.stderr.write(
            f"experiment: child exited {proc.returncode}, expected {expect}\n{proc.stderr}"
        )
    return proc.returncode


def spawn() -> Any:
    # spawn, not fork: every child opens its own connections from scratch.
    return multiprocessing.get_context("spawn")


def join_all(procs: list[Any]) -> list[int | None]:
    codes = []
    for proc in procs:
        proc.join(CHILD_TIMEOUT)
        if proc.is_alive():
            proc.kill()
            proc.join()
        codes.append(proc.exitcode)
        proc.close()
    return codes


def receive_answer(reader: Any) -> Any:
    """What the child sent on its pipe ("timeout" / "died" if nothing came); closes the pipe."""
    try:
        return reader.recv() if reader.poll(CHILD_TIMEOUT) else "timeout"
    except EOFError:
        return "died"
    finally:
        reader.close()


def deliver_on_signal(
    producer_path: str, consumer_path: str, event_id: str, ready: Any, go: Any, answer: Any
) -> None:
    """Child of arrival_3_1_2: get ready to relay ``event_id``, wait for the parent's go."""
    with closing(answer), open_paths(producer_path, consumer_path) as (producer, consumer):
        ready.set()
        if not go.wait(CHILD_TIMEOUT):
            answer.send("timeout")
            return
        answer.send(str(relay(producer, consumer, event_id=event_id).status))


def _race_worker(
    op: str, producer_path: str, consumer_path: str, index: int, barrier: Any, answer: Any
) -> None:
    """One of six racers: open both files, meet the others at the barrier, do ``op`` once."""
    with closing(answer):
        try:
            with open_paths(producer_path, consumer_path) as (producer, consumer):
                envelope = producer.event("A1")
                barrier.wait(CHILD_TIMEOUT)
                answer.send(_race_step(op, producer, consumer, index, envelope))
        except Exception as exc:  # noqa: BLE001 -- reported as a status, shows in the results
            answer.send([f"error:{error_name(exc)}"])


def _race_step(
    op: str, producer: Producer, consumer: Consumer, index: int, envelope: Result | None
) -> list[str]:
    """What racer ``index`` does once past the barrier; the statuses it got."""
    if op == "advance_same":
        return [advance_first(producer)]
    if op == "advance_new":
        return [advance_first(producer, f"R{index}")]
    if op == "receive":
        assert envelope is not None
        return [str(consumer.receive(envelope).status)]
    if op == "apply":
        return [str(consumer.apply_next("A").status)]
    if op == "relay":
        return relay_until_idle(producer, consumer)
    raise ValueError(op)


def race(files: Files, op: str) -> tuple[list[list[str]], list[int | None]]:
    """Start six real processes together on a Barrier; their answers and exit codes."""
    ctx = spawn()
    barrier = ctx.Barrier(RACERS)
    procs, readers = [], []
    for index in range(1, RACERS + 1):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_race_worker,
            args=(op, files.producer, files.consumer, index, barrier, writer),
            name=f"reliable_flow-race-{op}-{index}",
        )
        proc.start()
        writer.close()
        procs.append(proc)
        readers.append(reader)
    answers = [receive_answer(reader) for reader in readers]
    codes = join_all(procs)
    return [a if isinstance(a, list) else [str(a)] for a in answers], codes


def race_outcome(files: Files, op: str) -> Result:
    """Race six processes on ``op``: the counts of their answers, and whether all exited 0."""
    answers, codes = race(files, op)
    return {"statuses": _counts(answers), "all_racers_exited_0": all_exited_0(codes)}


def all_exited_0(codes: list[int | None]) -> bool:
    if any(code != 0 for code in codes):
        sys.stderr.write(f"experiment: racers exited with {codes}\n")
        return False
    return True


def _counts(answers: list[list[str]]) -> dict[str, int]:
    return dict(sorted(Counter(s for statuses in answers for s in statuses).items()))
