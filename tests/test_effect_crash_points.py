"""The effect executor's three crash points, each in a real child process.

The test prepares the files (one pending ``notify`` effect in the consumer
file), then runs ``tests/children/effect_crash_child.py`` with
``RELIABLE_FLOW_CRASH_AT`` armed: the child opens the files, calls
``EffectExecutor.run_once()`` and dies with ``os._exit(73)`` at the point (no
COMMIT, no ROLLBACK, no ``finally``).  The effect function appends a line to a
file per call, so calls are counted across processes.

The test then checks what is on disk and recovers in its own process, with a
clock past the child's lease, as a restarted executor would:

* ``after_claim``: the claim committed, the call never happened: ``running``,
  attempt 1, under the child's lease, no call;
* ``after_call``: the call happened, its record did not: still ``running``,
  one call;
* ``after_commit``: the outcome committed: ``succeeded``.

Recovery: with ``reconcile`` the doubt is settled and the effect takes place
exactly once; with ``idempotent=True`` it is re-run with the same key; with
neither it is parked ``unknown`` and never called again.

Every test runs on both engines: SQLite files, and PostgreSQL schemas of the
session's private server (``tests/pg_cluster.py``); the child is given the
consumer's location string either way, and the test reads the effect row
back through the public API (``Consumer.effect``).  The expected tables are
the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from children.effect_crash_child import LEASE, NAME, OWNER, record_calls
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Happened,
    NotHappened,
    Producer,
    relay,
)
from reliable_flow.crash import CRASH_EXIT_CODE, ENV_VAR, EXECUTOR_CRASH_POINTS
from reliable_flow.reservation import RESERVATION

CHILD = Path(__file__).resolve().parent / "children" / "effect_crash_child.py"
SRC = Path(reliable_flow.__file__).resolve().parent.parent
NOW = 1000.0
KEY = f"default:A1:{NAME}"




class Files:
    """The stores (SQLite files or PostgreSQL schemas), the calls file, the working directory."""

    def __init__(self, where: Path, producer: Any, consumer: Any) -> None:
        self.dir = where
        self.producer = producer
        self.consumer = consumer
        self.calls = where / "calls.txt"

    def call_lines(self) -> list[str]:
        return self.calls.read_text(encoding="utf-8").splitlines() if self.calls.exists() else []




def prepare(where: Path, engine: str) -> Files:
    """Stores with one pending effect: A1 reserved, applied, ``notify`` scheduled."""
    if engine == "sqlite":
        files = Files(where, where / "producer.db", where / "consumer.db")
    else:
        from pg_cluster import pg_location

        files = Files(where, pg_location("fx_crash_p"), pg_location("fx_crash_c"))
    effects = EffectRegistry()
    effects.register(NAME, record_calls(str(files.calls)))

    def handler(ctx: ApplyContext) -> None:
        ctx.schedule(NAME, {"amount": ctx.event.payload["amount"]})

    with Producer(files.producer, RESERVATION) as p, \
            Consumer(files.consumer, RESERVATION, handlers=[handler], effects=effects, clock=lambda: NOW) as c:
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert relay(p, c).status == "accepted"
        assert c.apply_next("A").status == "applied"
        assert c.scheduled_effect(KEY).state == "pending"
    return files


def child_env(crash_at: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    if crash_at is not None:
        env[ENV_VAR] = crash_at
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_child(files: Files, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(files.consumer), str(files.calls), repr(NOW)],
        env=child_env(crash_at), cwd=files.dir, capture_output=True, text=True, timeout=60, check=False,
    )


def on_disk(files: Files) -> tuple[Any, ...]:
    with Consumer(files.consumer, RESERVATION) as c:
        e = c.scheduled_effect(KEY)
        assert e is not None
        # An executor claims as "<its policy's owner>/<its own hex>": compare the policy's part.
        owner = None if e.lease_owner is None else e.lease_owner.rpartition("/")[0]
        return (e.state, e.attempts, owner, e.due_at, e.result)


def recovery_registry(files: Files, mode: str, reconciled: list[EffectCall]) -> EffectRegistry:
    def was_sent(call: EffectCall) -> Happened | NotHappened:
        reconciled.append(call)
        sent = [line for line in files.call_lines() if line.split()[0] == call.key]
        return Happened({"sent": int(sent[-1].split()[1])}) if sent else NotHappened()

    effects = EffectRegistry()
    kw: dict[str, Any] = {"reconcile": {"reconcile": was_sent}, "idempotent": {"idempotent": True},
                          "neither": {}}[mode]
    effects.register(NAME, record_calls(str(files.calls)), **kw)
    return effects


RUNNING = ("running", 1, OWNER, NOW + LEASE, None)
SUCCEEDED = ("succeeded", 1, None, None, {"sent": 1})  # due_at not checked when None

# point -> what the child left: effect row, call lines
LEFT = {
    "executor.after_claim": (RUNNING, []),
    "executor.after_call": (RUNNING, [f"{KEY} 1"]),
    "executor.after_commit": (SUCCEEDED, [f"{KEY} 1"]),
}
# (point, mode) -> after recovery: state, result, call lines, reconcile calls
RECOVERED = {
    ("executor.after_claim", "reconcile"): ("succeeded", {"sent": 2}, [f"{KEY} 2"], 1),
    ("executor.after_claim", "idempotent"): ("succeeded", {"sent": 2}, [f"{KEY} 2"], 0),
    ("executor.after_claim", "neither"): ("unknown", None, [], 0),
    ("executor.after_call", "reconcile"): ("succeeded", {"sent": 1}, [f"{KEY} 1"], 1),
    ("executor.after_call", "idempotent"): ("succeeded", {"sent": 2}, [f"{KEY} 1", f"{KEY} 2"], 0),
    ("executor.after_call", "neither"): ("unknown", None, [f"{KEY} 1"], 0),
    ("executor.after_commit", "reconcile"): ("succeeded", {"sent": 1}, [f"{KEY} 1"], 0),
    ("executor.after_commit", "idempotent"): ("succeeded", {"sent": 1}, [f"{KEY} 1"], 0),
    ("executor.after_commit", "neither"): ("succeeded", {"sent": 1}, [f"{KEY} 1"], 0),
}


def test_every_executor_crash_point_is_covered() -> None:
    assert set(LEFT) == set(EXECUTOR_CRASH_POINTS)
    assert {point for point, _ in RECOVERED} == set(EXECUTOR_CRASH_POINTS)


def test_child_without_a_crash_point_runs_the_effect(tmp_path: Path, engine: str) -> None:
    files = prepare(tmp_path, engine)
    done = run_child(files, None)
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr
    assert on_disk(files)[0] == "succeeded"
    assert files.call_lines() == [f"{KEY} 1"]


@pytest.mark.parametrize("mode", ["reconcile", "idempotent", "neither"])
@pytest.mark.parametrize("point", EXECUTOR_CRASH_POINTS)
def test_executor_crash_point_then_recovery(tmp_path: Path, engine: str, point: str, mode: str) -> None:
    files = prepare(tmp_path, engine)
    crashed = run_child(files, point)
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert crashed.stdout == ""  # it never got to print

    row, lines = LEFT[point]
    state, attempts, owner, due_at, result = on_disk(files)
    assert (state, attempts, owner, result) == (row[0], row[1], row[2], row[4])
    if row[3] is not None:
        assert due_at == row[3]  # the lease the child took
    assert files.call_lines() == lines

    reconciled: list[EffectCall] = []
    clock = [NOW + LEASE + 1]  # past the child's lease
    with Consumer(files.consumer, RESERVATION, effects=recovery_registry(files, mode, reconciled)) as c:
        ex = EffectExecutor(c, policy=DeliveryPolicy(lease_seconds=LEASE, clock=lambda: clock[0],
                                                     random=lambda: 0.5, owner="restarted"))
        ex.run_until_idle()
        for _ in range(5):  # and nothing more happens, however long it runs
            clock[0] += 3600
            ex.run_until_idle()
        e = c.scheduled_effect(KEY)
        want_state, want_result, want_lines, want_reconciles = RECOVERED[(point, mode)]
        assert (e.state, e.result, e.lease_owner) == (want_state, want_result, None)
        assert files.call_lines() == want_lines
        assert len(reconciled) == want_reconciles
        assert all(call.key == KEY and call.attempt == 1 for call in reconciled)
        if want_state == "unknown":
            assert "neither reconcile nor idempotent=True" in e.reason
