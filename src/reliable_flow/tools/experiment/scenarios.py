"""``python -m reliable_flow experiment``: every named scenario, as frozen facts.

Each scenario runs on fresh files in its own temporary directory, with real
child processes where the point is a process boundary (a crash, a handshake,
a race), and returns a JSON-able dict of what it saw: statuses, states,
seqs, accepted marks, blocked reasons, effects and exit codes.  Never paths,
PIDs, timings, or which racing process won, so two runs give byte-identical
JSON.  ``--check`` compares a fresh run with the results frozen in
``experiment_results.json`` and prints a per-scenario diff on any difference.

The seed's scenarios come first, in the order the seed article tells them;
ours follow and are marked ``"origin": "ours"``.  The deliberately wrong implementations they
compare against live in :mod:`reliable_flow.tools.experiment.wrong_ways`.
"""

from __future__ import annotations

import difflib
import itertools
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .wrong_ways import UNSAFE_EXIT_CODE, NaiveLastWriteConsumer
from ...consumer import Consumer
from ...crash import CRASH_EXIT_CODE, CRASH_POINTS, ENV_VAR
from ...producer import Producer
from ...relay import relay
from ...reservation import RESERVATION
from ...statuses import DrainResult

__all__ = [
    "FORMAT",
    "FROZEN_RESULTS",
    "SCENARIOS",
    "Scenario",
    "check",
    "compare",
    "dumps",
    "run_experiment",
]

#: Version of the JSON layout; bump it when the layout (not a result) changes.
FORMAT = 1
#: The frozen results shipped with the package and checked by ``--check``.
FROZEN_RESULTS = Path(__file__).with_name("results.json")

CHILD_TIMEOUT = 60.0  # seconds; a watchdog against hangs, never an ordering tool
RACERS = 6
STEPS = (("reserved", 1), ("confirmed", 2), ("released", 3))  # kind, seq of flow X's events X1..X3

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
def _open(files: Files, schemas: set[int] | None = None) -> Iterator[tuple[Producer, Consumer]]:
    with (
        Producer(files.producer, RESERVATION) as producer,
        Consumer(files.consumer, RESERVATION, schemas=schemas) as consumer,
    ):
        yield producer, consumer


def _create(files: Files) -> None:
    """Create both files, empty, before child processes open them."""
    with _open(files):
        pass


def _advance_flow(
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


def _advance_first(producer: Producer, event_id: str = "A1", flow_id: str = "A") -> str:
    """Commit the first step of a flow (reserved, amount 3); the status."""
    r = producer.advance(event_id, flow_id, expected_seq=0, kind="reserved", payload={"amount": 3})
    return str(r.status)


def _event(producer: Producer, event_id: str) -> Result:
    event = producer.event(event_id)
    if event is None:
        raise LookupError(f"{event_id} is not in the outbox")
    return event


def _outbox(producer: Producer, flow_id: str | None = None) -> list[Result]:
    return [
        {"event_id": e.event_id, "seq": e.seq, "accepted": e.accepted, "state": e.state}
        for e in producer.outbox(flow_id)
    ]


def _inbox(consumer: Consumer, flow_id: str) -> list[Result]:
    return [asdict(row) for row in consumer.inbox(flow_id)]


def _effects(consumer: Consumer, flow_id: str) -> list[Result]:
    return [
        {"event_id": e.event_id, "seq": e.seq, "kind": e.kind}
        for e in consumer.effects(flow_id)
    ]


def _drain(result: DrainResult) -> Result:
    out: Result = {"applied": result.applied, "stop": str(result.stop)}
    if result.last is not None and result.last.reason is not None:
        out["reason"] = str(result.last.reason)
        out["at_seq"] = result.last.seq
    return out


def _relay_until_idle(producer: Producer, consumer: Consumer, limit: int = 100) -> list[str]:
    statuses = []
    for _ in range(limit):
        status = str(relay(producer, consumer).status)
        statuses.append(status)
        if status == "idle":
            break
    return statuses


def _observe(producer: Producer, consumer: Consumer, flow_id: str) -> Result:
    return {
        "flow": producer.flow(flow_id),
        "outbox": _outbox(producer, flow_id),
        "inbox": _inbox(consumer, flow_id),
        "projection": consumer.projection(flow_id),
        "effects": _effects(consumer, flow_id),
    }


def _sql(path: str, statement: str, params: tuple[Any, ...] = ()) -> int:
    """One statement in its own connection, as an operator at the sqlite3 prompt would."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    try:
        return conn.execute(statement, params).rowcount
    finally:
        conn.close()


def _bodies(path: str, table: str) -> dict[str, str]:
    conn = sqlite3.connect(Path(path).as_uri() + "?mode=ro", uri=True)
    try:
        return dict(conn.execute(f"SELECT event_id, body FROM {table}").fetchall())
    finally:
        conn.close()


def _error_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


# -- child processes ------------------------------------------------------------------


def _child_env(**extra: str) -> dict[str, str]:
    """The parent's environment without any RELIABLE_FLOW_* setting, able to import us."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    src = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _run_child(code: str, args: list[str], files: Files, expect: int, **env: str) -> int:
    """Run ``python -c code args...``; return its exit code (stderr shown if unexpected)."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
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


def _spawn() -> Any:
    # spawn, not fork: every child opens its own connections from scratch.
    return multiprocessing.get_context("spawn")


def _join(procs: list[Any]) -> list[int | None]:
    codes = []
    for proc in procs:
        proc.join(CHILD_TIMEOUT)
        if proc.is_alive():
            proc.kill()
            proc.join()
        codes.append(proc.exitcode)
        proc.close()
    return codes


def _receive_answer(reader: Any) -> Any:
    """What the child sent on its pipe ("timeout" / "died" if nothing came); closes the pipe."""
    try:
        return reader.recv() if reader.poll(CHILD_TIMEOUT) else "timeout"
    except EOFError:
        return "died"
    finally:
        reader.close()


def _deliver_on_signal(
    producer_path: str, consumer_path: str, event_id: str, ready: Any, go: Any, answer: Any
) -> None:
    """Child of arrival_3_1_2: get ready to relay ``event_id``, wait for the parent's go."""
    try:
        with (
            Producer(producer_path, RESERVATION) as producer,
            Consumer(consumer_path, RESERVATION) as consumer,
        ):
            ready.set()
            if not go.wait(CHILD_TIMEOUT):
                answer.send("timeout")
                return
            answer.send(str(relay(producer, consumer, event_id=event_id).status))
    finally:
        answer.close()


def _race_worker(
    op: str, producer_path: str, consumer_path: str, index: int, barrier: Any, answer: Any
) -> None:
    """One of six racers: open both files, meet the others at the barrier, do ``op`` once."""
    try:
        with (
            Producer(producer_path, RESERVATION) as producer,
            Consumer(consumer_path, RESERVATION) as consumer,
        ):
            envelope = producer.event("A1")
            barrier.wait(CHILD_TIMEOUT)
            statuses: list[str]
            if op == "advance_same":
                statuses = [_advance_first(producer)]
            elif op == "advance_new":
                statuses = [_advance_first(producer, f"R{index}")]
            elif op == "receive":
                assert envelope is not None
                statuses = [str(consumer.receive(envelope).status)]
            elif op == "apply":
                statuses = [str(consumer.apply_next("A").status)]
            elif op == "relay":
                statuses = _relay_until_idle(producer, consumer)
            else:
                raise ValueError(op)
            answer.send(statuses)
    except Exception as exc:  # noqa: BLE001 -- reported as a status, shows in the results
        answer.send([f"error:{_error_name(exc)}"])
    finally:
        answer.close()


def _race(files: Files, op: str) -> tuple[list[list[str]], list[int | None]]:
    """Start six real processes together on a Barrier; their answers and exit codes."""
    ctx = _spawn()
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
    answers = [_receive_answer(reader) for reader in readers]
    codes = _join(procs)
    return [a if isinstance(a, list) else [str(a)] for a in answers], codes


def _all_exited_0(codes: list[int | None]) -> bool:
    if any(code != 0 for code in codes):
        sys.stderr.write(f"experiment: racers exited with {codes}\n")
        return False
    return True


def _counts(answers: list[list[str]]) -> dict[str, int]:
    return dict(sorted(Counter(s for statuses in answers for s in statuses).items()))


# -- the seed's scenarios -------------------------------------------------------------


def unsafe_dual_write(files: Files) -> Result:
    """A child commits the flow row, then dies (exit 81) before the outbox write."""
    _create(files)
    code = (
        "import sys\n"
        "from reliable_flow.tools.experiment.wrong_ways import unsafe_dual_write_then_die\n"
        "unsafe_dual_write_then_die(sys.argv[1])\n"
    )
    exit_code = _run_child(code, [files.producer], files, expect=UNSAFE_EXIT_CODE)
    with _open(files) as (producer, consumer):
        flow = producer.flow("A")
        outbox = _outbox(producer)
        relayed = str(relay(producer, consumer).status)
        retry = _advance_first(producer)
        return {
            "child_exit_code": exit_code,
            "flow_A": flow,
            "outbox": outbox,
            "relay": relayed,
            "consumer_inbox_A": _inbox(consumer, "A"),
            "safe_advance_of_A1_afterwards": retry,
        }


def advance_idempotency(files: Files) -> Result:
    """Same id and body: existing; same id, other body: conflict; new id, old seq: stale."""
    with _open(files) as (producer, _):
        committed = _advance_flow(producer, "A")
        attempts = {
            "A1_again_identical": producer.advance(
                "A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}
            ),
            "A1_changed_amount": producer.advance(
                "A1", "A", expected_seq=0, kind="reserved", payload={"amount": 4}
            ),
            "A1_changed_flow": producer.advance(
                "A1", "B", expected_seq=0, kind="reserved", payload={"amount": 3}
            ),
            "A1_changed_schema": producer.advance(
                "A1", "A", expected_seq=0, kind="reserved", payload={"units": 3}, schema=2
            ),
            "A4_new_id_stale_expected_seq": producer.advance(
                "A4", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}
            ),
            "A4_new_id_step_after_released": producer.advance(
                "A4", "A", expected_seq=3, kind="reserved", payload={"amount": 3}
            ),
            "C1_new_flow_amount_0": producer.advance(
                "C1", "C", expected_seq=0, kind="reserved", payload={"amount": 0}
            ),
        }
        answers: Result = {}
        for name, r in attempts.items():
            entry: Result = {"status": str(r.status), "seq": r.seq}
            if r.status == "conflict":
                entry["reason"] = r.reason
            answers[name] = entry
        return {
            "first_three_advances": committed,
            "attempts": answers,
            "flow_A_after": producer.flow("A"),
            "outbox_after": _outbox(producer),
            "flows_B_and_C_after": [producer.flow("B"), producer.flow("C")],
        }


def accepted_is_not_applied(files: Files) -> Result:
    """Three events relayed: all accepted marks true, all inbox rows pending, nothing applied."""
    with _open(files) as (producer, consumer):
        _advance_flow(producer, "A")
        relayed = _relay_until_idle(producer, consumer)
        return {
            "relay": relayed,
            **{k: v for k, v in _observe(producer, consumer, "A").items() if k != "flow"},
        }


def arrival_3_1_2(files: Files) -> Result:
    """Event 3 arrives, then 1 (from a real child held by an Event), then 2."""
    _create(files)
    ctx = _spawn()
    ready, go = ctx.Event(), ctx.Event()
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=_deliver_on_signal,
        args=(files.producer, files.consumer, "A1", ready, go, writer),
        name="reliable_flow-arrival-child",
    )
    with _open(files) as (producer, consumer):
        _advance_flow(producer, "A")
        child.start()
        writer.close()
        try:
            child_ready = ready.wait(CHILD_TIMEOUT)
            stages = []

            def stage(event_id: str, by: str, status: str) -> None:
                drained = consumer.drain("A")
                stages.append(
                    {
                        "delivered": event_id,
                        "by": by,
                        "relay": status,
                        "drain": _drain(drained),
                        "applied_prefix": [e.seq for e in consumer.effects("A")],
                    }
                )

            stage("A3", "parent", str(relay(producer, consumer, event_id="A3").status))
            go.set()
            child_status = _receive_answer(reader)
        finally:
            go.set()  # never leave the child waiting, whatever happened above
            reader.close()
            (child_exit,) = _join([child])
        stage("A1", "child process", str(child_status))
        stage("A2", "parent", str(relay(producer, consumer, event_id="A2").status))
        return {
            "child_was_ready_before_3": child_ready,
            "child_exit_code": child_exit,
            "stages": stages,
            "projection": consumer.projection("A"),
            "effect_kinds": [e.kind for e in consumer.effects("A")],
            "inbox_states": [row["state"] for row in _inbox(consumer, "A")],
        }


def naive_consumer(files: Files) -> Result:
    """An id-only-dedup consumer that overwrites by arrival order, against ours, on 3,1,2,3."""
    arrivals = ["A3", "A1", "A2", "A3"]
    with _open(files) as (producer, consumer):
        _advance_flow(producer, "A")
        events = {eid: _event(producer, eid) for eid in ("A1", "A2", "A3")}
        with NaiveLastWriteConsumer(str(files.dir / "naive.db")) as naive:
            naive_answers = [naive.receive(events[eid]) for eid in arrivals]
            naive_state = naive.state("A")
        ours = []
        for eid in arrivals:
            status = str(relay(producer, consumer, event_id=eid).status)
            ours.append({"event": eid, "relay": status, "drain": _drain(consumer.drain("A"))})
        return {
            "arrivals": arrivals,
            "naive": {"answers": naive_answers, "final": naive_state},
            "reliable_flow": {
                "steps": ours,
                "final": consumer.projection("A"),
                "effect_kinds": [e.kind for e in consumer.effects("A")],
            },
        }


def schema_upgrade(files: Files) -> Result:
    """Seq 2 and 3 in schema 2: blocked unsupported_schema, then applied unchanged after upgrade."""
    with Producer(files.producer, RESERVATION) as producer:
        with Consumer(files.consumer, RESERVATION) as old:
            advanced = _advance_flow(producer, "A", schemas=(1, 2, 2))
            relayed = _relay_until_idle(producer, old)
            before = {
                "drain": _drain(old.drain("A")),
                "drain_again": _drain(old.drain("A")),
                "projection": old.projection("A"),
                "inbox": _inbox(old, "A"),
            }
        with Consumer(files.consumer, RESERVATION, schemas={1, 2}) as upgraded:
            after = {
                "drain": _drain(upgraded.drain("A")),
                "projection": upgraded.projection("A"),
                "inbox": _inbox(upgraded, "A"),
                "effects": _effects(upgraded, "A"),
            }
    unchanged = _bodies(files.producer, "outbox") == _bodies(files.consumer, "inbox")
    return {
        "advance": advanced,
        "relay": relayed,
        "schema_1_consumer": before,
        "schemas_1_2_consumer_same_file": after,
        "inbox_bodies_equal_outbox_bodies": unchanged,
    }


def flow_isolation(files: Files) -> Result:
    """A gets 1 and 3 (gap at 2), B gets 1, 2, 3: process_all moves B to the end, A stays."""
    with _open(files) as (producer, consumer):
        _advance_flow(producer, "A")
        _advance_flow(producer, "B")
        delivered = {
            eid: str(relay(producer, consumer, event_id=eid).status)
            for eid in ("A1", "A3", "B1", "B2", "B3")
        }
        drained = {flow: _drain(d) for flow, d in consumer.process_all().items()}
        return {
            "delivered": delivered,
            "process_all": drained,
            "projection_A": consumer.projection("A"),
            "projection_B": consumer.projection("B"),
            "outbox_A": _outbox(producer, "A"),
            "inbox_A": _inbox(consumer, "A"),
        }


def _plant_conflicting_a1(producer: Producer, consumer: Consumer) -> str:
    """Commit A1 and B1; put into the consumer an A1 with another body (amount 4, not 3)."""
    for flow_id in ("A", "B"):
        _advance_first(producer, f"{flow_id}1", flow_id)
    return str(consumer.receive({**_event(producer, "A1"), "payload": {"amount": 4}}).status)


def poison_isolation_and_explicit_relay(files: Files) -> Result:
    """A1 conflicts in the consumer: it is set aside, B1 still flows, explicit relay works."""
    with _open(files) as (producer, consumer):
        planted = _plant_conflicting_a1(producer, consumer)
        plain = []
        for _ in range(3):
            r = relay(producer, consumer)
            plain.append({"status": str(r.status), "event_id": r.event_id})
        a1 = next(e for e in producer.outbox("A") if e.event_id == "A1")
        explicit = {
            eid: str(relay(producer, consumer, event_id=eid).status) for eid in ("B1", "A1")
        }
        return {
            "planted_A1_with_amount_4": planted,
            "plain_relays": plain,
            "A1_in_outbox": {k: getattr(a1, k) for k in ("accepted", "state", "last_status")},
            "explicit_relays": explicit,
            "outbox_B": _outbox(producer, "B"),
            "drain_B": _drain(consumer.drain("B")),
            "projection_B": consumer.projection("B"),
            "inbox_A": _inbox(consumer, "A"),
        }


_CRASH_CHILD = """\
import sys
from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION
with Producer(sys.argv[1], RESERVATION) as producer, Consumer(sys.argv[2], RESERVATION) as consumer:
    producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    relay(producer, consumer)
    consumer.drain("A")
"""


def _crash_scenario(point: str) -> Callable[[Files], Result]:
    def run(files: Files) -> Result:
        exit_code = _run_child(
            _CRASH_CHILD,
            [files.producer, files.consumer],
            files,
            expect=CRASH_EXIT_CODE,
            **{ENV_VAR: point},
        )
        with _open(files) as (producer, consumer):
            right_after = _observe(producer, consumer, "A")
            again = _advance_first(producer)
            relayed = _relay_until_idle(producer, consumer)
            drained = _drain(consumer.drain("A"))
            after = _observe(producer, consumer, "A")
        return {
            "crash_point": point,
            "child_exit_code": exit_code,
            "right_after_exit": right_after,
            "recovery": {"advance_A1_again": again, "relay_until_idle": relayed, "drain": drained},
            "after_recovery": after,
            "effect_count_after_recovery": len(after["effects"]),
        }

    run.__name__ = f"crash_at_{point.replace('.', '_')}"
    run.__doc__ = f"A child with {ENV_VAR}={point} runs advance A1, relay, drain; then recovery."
    return run


def trigger_rejected_outbox_insert(files: Files) -> Result:
    """A trigger makes the outbox insert fail: the flow's update rolls back with it."""
    with Producer(files.producer, RESERVATION) as producer:
        first = _advance_first(producer)
        flow_before = producer.flow("A")
        _sql(
            files.producer,
            "CREATE TRIGGER experiment_reject BEFORE INSERT ON outbox "
            "BEGIN SELECT RAISE(ABORT, 'outbox insert rejected by the experiment'); END",
        )
        try:
            producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
            raised = None
        except Exception as exc:  # noqa: BLE001 -- the point: which exception escapes
            raised = _error_name(exc)
        flow_after = producer.flow("A")
        outbox_after = _outbox(producer, "A")
        _sql(files.producer, "DROP TRIGGER experiment_reject")
        retry = str(
            producer.advance(
                "A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}
            ).status
        )
        return {
            "advance_A1": first,
            "advance_A2_raised": raised,
            "flow_unchanged": flow_after == flow_before,
            "flow_after": flow_after,
            "outbox_after": outbox_after,
            "advance_A2_after_dropping_trigger": retry,
            "flow_after_retry": producer.flow("A"),
        }


def trigger_rejected_effect_insert(files: Files) -> Result:
    """A trigger makes the effect insert fail: projection and inbox mark roll back with it."""
    with _open(files) as (producer, consumer):
        _advance_first(producer)
        relayed = str(relay(producer, consumer).status)
        _sql(
            files.consumer,
            "CREATE TRIGGER experiment_reject BEFORE INSERT ON effect "
            "BEGIN SELECT RAISE(ABORT, 'effect insert rejected by the experiment'); END",
        )
        try:
            consumer.apply_next("A")
            raised = None
        except Exception as exc:  # noqa: BLE001 -- the point: which exception escapes
            raised = _error_name(exc)
        right_after = {
            "projection": consumer.projection("A"),
            "effects": _effects(consumer, "A"),
            "inbox": _inbox(consumer, "A"),
        }
        _sql(files.consumer, "DROP TRIGGER experiment_reject")
        retry = str(consumer.apply_next("A").status)
        return {
            "relay": relayed,
            "apply_next_raised": raised,
            "right_after": right_after,
            "apply_next_after_dropping_trigger": retry,
            "projection_after_retry": consumer.projection("A"),
            "effects_after_retry": _effects(consumer, "A"),
        }


def race_same_event_advanced(files: Files) -> Result:
    """Six processes advance the same A1 at once: one commits, five see it existing."""
    _create(files)
    answers, codes = _race(files, "advance_same")
    with _open(files) as (producer, _):
        return {
            "statuses": _counts(answers),
            "all_racers_exited_0": _all_exited_0(codes),
            "flow_A": producer.flow("A"),
            "outbox_A": _outbox(producer, "A"),
        }


def race_new_ids_expected_seq_0(files: Files) -> Result:
    """Six new ids for flow A at expected_seq 0 at once: one commits, five are stale."""
    _create(files)
    answers, codes = _race(files, "advance_new")
    with _open(files) as (producer, _):
        outbox = producer.outbox("A")
        return {
            "statuses": _counts(answers),
            "all_racers_exited_0": _all_exited_0(codes),
            "flow_A": producer.flow("A"),
            "outbox_A_count": len(outbox),
            "outbox_A_seqs": [e.seq for e in outbox],
        }


def race_receive_one_envelope(files: Files) -> Result:
    """Six processes receive the same envelope at once: one accepted, five duplicate."""
    with _open(files) as (producer, _):
        _advance_first(producer)
    answers, codes = _race(files, "receive")
    with _open(files) as (_, consumer):
        return {
            "statuses": _counts(answers),
            "all_racers_exited_0": _all_exited_0(codes),
            "inbox_A": _inbox(consumer, "A"),
        }


def race_apply_next_one_event(files: Files) -> Result:
    """Six processes call apply_next on one pending event: exactly one effect."""
    with _open(files) as (producer, consumer):
        _advance_first(producer)
        relay(producer, consumer)
    answers, codes = _race(files, "apply")
    with _open(files) as (_, consumer):
        return {
            "statuses": _counts(answers),
            "all_racers_exited_0": _all_exited_0(codes),
            "projection_A": consumer.projection("A"),
            "effects_A": _effects(consumer, "A"),
            "inbox_A": _inbox(consumer, "A"),
        }


def race_relay_several_events(files: Files) -> Result:
    """Six processes relay six pending events until idle: each stored once, all marked accepted.

    Which racer got ``accepted`` and how many ``duplicate`` answers there were
    depend on scheduling, so only the deterministic facts are recorded.
    """
    with _open(files) as (producer, _):
        _advance_flow(producer, "A")
        _advance_flow(producer, "B")
    answers, codes = _race(files, "relay")
    seen = {s for statuses in answers for s in statuses}
    with _open(files) as (producer, consumer):
        return {
            "statuses_within_accepted_duplicate_idle": seen <= {"accepted", "duplicate", "idle"},
            "accepted_total": sum(statuses.count("accepted") for statuses in answers),
            "every_racer_ended_idle": all(statuses[-1:] == ["idle"] for statuses in answers),
            "all_racers_exited_0": _all_exited_0(codes),
            "inbox": {flow: _inbox(consumer, flow) for flow in ("A", "B")},
            "outbox_accepted": {e.event_id: e.accepted for e in producer.outbox()},
            "then_process_all": {flow: _drain(d) for flow, d in consumer.process_all().items()},
        }


# -- ours ----------------------------------------------------------------------------


def poison_resolved_then_explicit_relay(files: Files) -> Result:
    """The set-aside A1 after an operator removes the consumer's wrong, unapplied copy."""
    with _open(files) as (producer, consumer):
        _plant_conflicting_a1(producer, consumer)
        first = _relay_until_idle(producer, consumer)
        removed = _sql(
            files.consumer, "DELETE FROM inbox WHERE event_id = 'A1' AND state <> 'applied'"
        )
        plain = str(relay(producer, consumer).status)
        explicit = str(relay(producer, consumer, event_id="A1").status)
        a1 = next(e for e in producer.outbox("A") if e.event_id == "A1")
        return {
            "relay_until_idle_before_fix": first,
            "operator_deleted_inbox_rows": removed,
            "plain_relay_after_fix": plain,
            "explicit_relay_A1": explicit,
            "A1_in_outbox": {k: getattr(a1, k) for k in ("accepted", "state", "last_status")},
            "drain_A": _drain(consumer.drain("A")),
            "projection_A": consumer.projection("A"),
            "effects_A": _effects(consumer, "A"),
        }


def arrival_all_permutations(files: Files) -> Result:
    """All six arrival orders of A1..A3, relay + drain after each: one end state, one order."""
    finals = {}
    for order in itertools.permutations(("A1", "A2", "A3")):
        sub = Files(files.dir / "-".join(order))
        sub.dir.mkdir()
        with _open(sub) as (producer, consumer):
            _advance_flow(producer, "A")
            for eid in order:
                relay(producer, consumer, event_id=eid)
                consumer.drain("A")
            finals[",".join(order)] = {
                "projection": consumer.projection("A"),
                "effect_kinds": [e.kind for e in consumer.effects("A")],
            }
    distinct = {json.dumps(v, sort_keys=True) for v in finals.values()}
    return {"per_order": finals, "all_orders_end_the_same": len(distinct) == 1}


def consumer_blocks_invalid_events(files: Files) -> Result:
    """Events our producer would refuse, received directly: blocked with a reason, never skipped."""

    def env(event_id: str, flow_id: str, seq: int, kind: str, amount: int) -> Result:
        return {
            "event_id": event_id,
            "flow_id": flow_id,
            "seq": seq,
            "kind": kind,
            "schema": 1,
            "payload": {"amount": amount},
        }

    planted = [
        env("X1", "X", 1, "reserved", 3),
        env("X2", "X", 2, "released", 3),
        env("X3", "X", 3, "released", 3),
        env("Y1", "Y", 1, "reserved", 3),
        env("Y2", "Y", 2, "confirmed", 4),
    ]
    with Consumer(files.consumer, RESERVATION) as consumer:
        received = {e["event_id"]: str(consumer.receive(e).status) for e in planted}
        first = {flow: _drain(d) for flow, d in consumer.process_all().items()}
        second = {flow: _drain(d) for flow, d in consumer.process_all().items()}
        return {
            "received": received,
            "process_all": first,
            "process_all_again": second,
            "inbox": {flow: _inbox(consumer, flow) for flow in ("X", "Y")},
            "projections": {flow: consumer.projection(flow) for flow in ("X", "Y")},
        }


# -- the table, running and checking ----------------------------------------------------

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("unsafe_dual_write", "seed", unsafe_dual_write),
    Scenario("advance_idempotency", "seed", advance_idempotency),
    Scenario("accepted_is_not_applied", "seed", accepted_is_not_applied),
    Scenario("arrival_3_1_2", "seed", arrival_3_1_2),
    Scenario("naive_consumer", "seed", naive_consumer),
    Scenario("schema_upgrade", "seed", schema_upgrade),
    Scenario("flow_isolation", "seed", flow_isolation),
    Scenario("poison_isolation_and_explicit_relay", "seed", poison_isolation_and_explicit_relay),
    *(Scenario(f"crash_at:{point}", "seed", _crash_scenario(point)) for point in CRASH_POINTS),
    Scenario("trigger_rejected_outbox_insert", "seed", trigger_rejected_outbox_insert),
    Scenario("trigger_rejected_effect_insert", "seed", trigger_rejected_effect_insert),
    Scenario("race_same_event_advanced", "seed", race_same_event_advanced),
    Scenario("race_new_ids_expected_seq_0", "seed", race_new_ids_expected_seq_0),
    Scenario("race_receive_one_envelope", "seed", race_receive_one_envelope),
    Scenario("race_apply_next_one_event", "seed", race_apply_next_one_event),
    Scenario("race_relay_several_events", "seed", race_relay_several_events),
    Scenario("poison_resolved_then_explicit_relay", "ours", poison_resolved_then_explicit_relay),
    Scenario("arrival_all_permutations", "ours", arrival_all_permutations),
    Scenario("consumer_blocks_invalid_events", "ours", consumer_blocks_invalid_events),
)


def _run_one(scenario: Scenario) -> Result:
    with tempfile.TemporaryDirectory(prefix="reliable_flow_experiment_") as tmp:
        try:
            return scenario.run(Files(Path(tmp)))
        except Exception as exc:  # noqa: BLE001 -- one broken scenario must not hide the rest
            traceback.print_exc(file=sys.stderr)
            return {"error": _error_name(exc)}


def run_experiment(names: Iterable[str] | None = None) -> Result:
    """Run the scenarios (all, or those named) in order, each on fresh files; a JSON-able dict."""
    if os.environ.get(ENV_VAR):
        raise RuntimeError(
            f"unset {ENV_VAR} before running the experiment; it arms its own crash points"
        )
    wanted = None if names is None else set(names)
    unknown = sorted((wanted or set()) - {s.name for s in SCENARIOS})
    if unknown:
        raise ValueError(f"no such scenario: {', '.join(unknown)}")
    chosen = [s for s in SCENARIOS if wanted is None or s.name in wanted]
    return {
        "experiment": "reliable_flow",
        "format": FORMAT,
        "scenario_count": len(chosen),
        "scenarios": [{"name": s.name, "origin": s.origin, "result": _run_one(s)} for s in chosen],
    }


def dumps(results: Result) -> str:
    """The one serialisation used for output files and comparisons."""
    return json.dumps(results, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _by_name(results: Any) -> dict[str, Any] | None:
    if not isinstance(results, dict) or not isinstance(results.get("scenarios"), list):
        return None
    out = {}
    for entry in results["scenarios"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return None
        out[entry["name"]] = entry
    return out


def _diff(old: Any, new: Any, old_label: str, new_label: str) -> str:
    a = [] if old is None else dumps(old).splitlines(keepends=True)
    b = [] if new is None else dumps(new).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, fromfile=old_label, tofile=new_label))


def compare(frozen: Any, current: Result) -> tuple[bool, str]:
    """``(True, "")`` if equal, else ``(False, text)``: a unified diff per differing scenario."""
    if dumps(frozen) == dumps(current):
        return True, ""
    old, new = _by_name(frozen), _by_name(current)
    if old is None or new is None:
        return False, _diff(
            frozen, current, "frozen", "now"
        ) + "the frozen results do not have the expected layout\n"
    parts = []
    changed = []
    for name in [*old, *(n for n in new if n not in old)]:
        if old.get(name) == new.get(name):
            continue
        changed.append(name)
        if name not in new:
            what = "is in the frozen results but was not produced by this run"
        elif name not in old:
            what = "is new: not in the frozen results"
        else:
            what = "differs"
        parts.append(f"=== scenario {name} {what}\n")
        parts.append(_diff(old.get(name), new.get(name), f"frozen/{name}", f"now/{name}"))
    if not changed and list(old) != list(new):
        parts.append("=== the scenarios ran in another order\n")
        changed.append("(order)")
    rest_old = {k: v for k, v in frozen.items() if k != "scenarios"}
    rest_new = {k: v for k, v in current.items() if k != "scenarios"}
    if rest_old != rest_new:
        parts.append("=== top-level fields differ\n")
        parts.append(_diff(rest_old, rest_new, "frozen", "now"))
    parts.append(
        f"experiment: {len(changed)} scenario(s) differ from the frozen results: "
        f"{', '.join(changed) or '(top-level fields only)'}\n"
    )
    return False, "".join(parts)


def check(
    frozen_path: str | os.PathLike[str] | None = None, current: Result | None = None
) -> tuple[bool, str]:
    """Compare a run (``current``, or a fresh one) with the frozen results file."""
    path = Path(frozen_path) if frozen_path is not None else FROZEN_RESULTS
    frozen = json.loads(path.read_text(encoding="utf-8"))
    if current is None:
        current = run_experiment()
    return compare(frozen, current)
