"""The ten crash points of SPEC section 5, each in a real child process.

The child runs advance A1 -> relay -> drain with ``RELIABLE_FLOW_CRASH_AT``
set and dies with ``os._exit(73)`` at that point (no COMMIT, no ROLLBACK, no
``finally``).  The parent then reads both files through the public API and
checks exactly what the SPEC table says is on disk, and only then recovers
the way a restarted process would: advance the same A1 again, relay until
idle, drain.  Every point must end with one effect for A1 and the
projection reserved / last_seq 1 / held 3.

Every point runs on both engines: SQLite files, and PostgreSQL schemas of
the session's private server (the child connects to them; the parent reads
what was committed through the stores' own read-only views,
``engine_reads.snapshot_of``).  The expected table is the same.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_reads import ENGINES, snapshot_of
from reliable_flow import Consumer, Producer, relay
from reliable_flow.crash import CRASH_EXIT_CODE, CRASH_POINTS, ENV_VAR, RECEIVE_APPLY_CRASH_POINTS
from reliable_flow.reservation import RESERVATION
from support import CHILDREN, child_env, run_script

WORKLOAD = CHILDREN / "workload.py"


@dataclass(frozen=True)
class Stores:
    """Where the child's producer and consumer stores live, and its working directory."""

    producer: Any
    consumer: Any
    cwd: Path


@pytest.fixture(params=ENGINES)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    if request.param == "sqlite":
        return Stores(tmp_path / "producer.db", tmp_path / "consumer.db", tmp_path)
    pytest.importorskip("psycopg")
    request.getfixturevalue("pg_cluster")
    from pg_cluster import pg_location

    return Stores(pg_location("crash_p"), pg_location("crash_c"), tmp_path)

PENDING = [{"event_id": "A1", "seq": 1, "state": "pending", "reason": None, "meta": {}}]
APPLIED = [{"event_id": "A1", "seq": 1, "state": "applied", "reason": None, "meta": {}}]
EFFECT = [{"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved"}]
FLOW = {"state": "reserved", "seq": 1, "amount": 3}
PROJECTION = {"state": "reserved", "last_seq": 1, "held": 3}

# point -> (on disk right after the exit, answers during recovery)
# on disk: producer flow, outbox A1 accepted? (None = no outbox row), inbox, projection, effects
# recovery: re-advance, relay answers until idle, drained count
EXPECTED: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    "advance.after_flow_write": ((None, None, [], None, []), ("committed", ["accepted", "idle"], 1)),
    "advance.after_outbox_insert": ((None, None, [], None, []), ("committed", ["accepted", "idle"], 1)),
    "advance.after_commit": ((FLOW, False, [], None, []), ("existing", ["accepted", "idle"], 1)),
    "receive.after_inbox_insert": ((FLOW, False, [], None, []), ("existing", ["accepted", "idle"], 1)),
    "receive.after_commit": ((FLOW, False, PENDING, None, []), ("existing", ["duplicate", "idle"], 1)),
    "relay.after_mark": ((FLOW, False, PENDING, None, []), ("existing", ["duplicate", "idle"], 1)),
    "relay.after_commit": ((FLOW, True, PENDING, None, []), ("existing", ["idle"], 1)),
    "apply.after_projection": ((FLOW, True, PENDING, None, []), ("existing", ["idle"], 1)),
    "apply.after_effect": ((FLOW, True, PENDING, None, []), ("existing", ["idle"], 1)),
    "apply.after_commit": ((FLOW, True, APPLIED, PROJECTION, EFFECT), ("existing", ["idle"], 0)),
}


def run_child(stores: Stores, crash_at: str | None, command: str = "crash-run") -> subprocess.CompletedProcess[str]:
    env = child_env() if crash_at is None else child_env(**{ENV_VAR: crash_at})
    return run_script(WORKLOAD, command, str(stores.producer), str(stores.consumer), env=env, cwd=stores.cwd)


def on_disk(stores: Stores) -> tuple[Any, ...]:
    """What the stores hold, read without writing (both opened read-only)."""
    snap = snapshot_of(stores.producer, stores.consumer)
    outbox = snap["producer"]["outbox"].get("A", [])
    assert [e["event_id"] for e in outbox] in ([], ["A1"])
    return (
        snap["producer"]["flows"].get("A"),
        outbox[0]["accepted"] if outbox else None,
        snap["consumer"]["inbox"].get("A", []),
        snap["consumer"]["projections"].get("A"),
        snap["consumer"]["effects"].get("A", []),
    )


def recover(stores: Stores, apply_on_receive: bool = False) -> tuple[str, list[str], int]:
    """What a restarted process does (with its consumer in the same mode):
    same advance again, relay until idle, drain."""
    with Producer(stores.producer, RESERVATION) as producer, \
            Consumer(stores.consumer, RESERVATION, apply_on_receive=apply_on_receive) as consumer:
        again = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        answers: list[str] = []
        while not answers or answers[-1] != "idle":
            assert len(answers) < 10, answers
            answers.append(str(relay(producer, consumer).status))
        drained = consumer.drain("A")
        assert drained.stop == "idle"
        assert [asdict(e) for e in consumer.applied("A")] == EFFECT
        assert consumer.projection("A") == PROJECTION
        assert [asdict(r) for r in consumer.inbox("A")] == APPLIED
        assert producer.flow("A") == FLOW
        assert [(e.event_id, e.accepted) for e in producer.outbox("A")] == [("A1", True)]
        # Recovering twice changes nothing: every step is safe to repeat.
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "existing"
        assert relay(producer, consumer, event_id="A1").status == "duplicate"
        assert consumer.apply_next("A").status == "idle"
        assert [asdict(e) for e in consumer.applied("A")] == EFFECT
        return str(again.status), answers, drained.applied


def test_the_ten_points_are_the_spec_table() -> None:
    assert tuple(EXPECTED) == CRASH_POINTS


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_point_leaves_the_spec_state_and_recovers_to_one_effect(stores: Stores, point: str) -> None:
    child = run_child(stores, point)
    assert child.returncode == CRASH_EXIT_CODE, (child.returncode, child.stderr)
    assert child.stdout == "" and child.stderr == ""
    before, recovery = EXPECTED[point]
    assert on_disk(stores) == before
    assert recover(stores) == recovery


def test_without_the_variable_the_same_child_runs_to_the_end(stores: Stores) -> None:
    """The control: the child path really is advance -> relay -> drain."""
    child = run_child(stores, None)
    assert child.returncode == 0, child.stderr
    assert on_disk(stores) == (FLOW, True, APPLIED, PROJECTION, EFFECT)
    assert recover(stores) == ("existing", ["idle"], 0)


def test_a_misspelt_point_is_refused_instead_of_never_firing(tmp_path: Path) -> None:
    child = run_child(Stores(tmp_path / "producer.db", tmp_path / "consumer.db", tmp_path), "advance.after_comit")
    assert child.returncode not in (0, CRASH_EXIT_CODE)
    assert "is not a crash point" in child.stderr
    assert not (tmp_path / "producer.db").exists()


# -- the receive-and-apply mode (Consumer(..., apply_on_receive=True)) ----------------------------
# The child runs advance A1 -> relay into a consumer that applies A1 in its
# receive transaction -> drain (nothing left).  Points on that path, with what
# is on disk right after the exit and what recovery (in the same mode) answers.
APPLY_MODE: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    "advance.after_commit": ((FLOW, False, [], None, []), ("existing", ["accepted", "idle"], 0)),
    "receive.after_inbox_insert": ((FLOW, False, [], None, []), ("existing", ["accepted", "idle"], 0)),
    "receive_apply.after_projection": ((FLOW, False, [], None, []), ("existing", ["accepted", "idle"], 0)),
    "receive_apply.after_effect": ((FLOW, False, [], None, []), ("existing", ["accepted", "idle"], 0)),
    "receive.after_commit": ((FLOW, False, APPLIED, PROJECTION, EFFECT), ("existing", ["duplicate", "idle"], 0)),
    "receive_apply.after_commit": ((FLOW, False, APPLIED, PROJECTION, EFFECT),
                                   ("existing", ["duplicate", "idle"], 0)),
    "relay.after_mark": ((FLOW, False, APPLIED, PROJECTION, EFFECT), ("existing", ["duplicate", "idle"], 0)),
    "relay.after_commit": ((FLOW, True, APPLIED, PROJECTION, EFFECT), ("existing", ["idle"], 0)),
}


def test_the_mode_has_its_own_points_and_the_spec_table_is_unchanged() -> None:
    assert set(RECEIVE_APPLY_CRASH_POINTS) <= set(APPLY_MODE)
    assert not set(RECEIVE_APPLY_CRASH_POINTS) & set(CRASH_POINTS)


@pytest.mark.parametrize("point", list(APPLY_MODE))
def test_receive_and_apply_crash_point_leaves_one_commit_or_none(stores: Stores, point: str) -> None:
    child = run_child(stores, point, "crash-run-apply")
    assert child.returncode == CRASH_EXIT_CODE, (child.returncode, child.stderr)
    before, recovery = APPLY_MODE[point]
    assert on_disk(stores) == before
    assert recover(stores, apply_on_receive=True) == recovery


@pytest.mark.parametrize("point", ["apply.after_projection", "apply.after_effect", "apply.after_commit"])
def test_in_the_mode_the_apply_points_are_never_reached(stores: Stores, point: str) -> None:
    """A1 is applied on arrival: the two-step apply path does not run for it."""
    child = run_child(stores, point, "crash-run-apply")
    assert child.returncode == 0, child.stderr
    assert on_disk(stores) == (FLOW, True, APPLIED, PROJECTION, EFFECT)
