"""SIGKILL a busy workload at random moments; after every kill the files must
still satisfy every invariant of SPEC section 1.

The workload (``children/workload.py kill-run``) runs rounds of 20 flows x 3 steps
plus two flows with a planted conflict through advance / relay / apply, in a
random order: explicit relays of shuffled event ids (out-of-order arrival),
plain relays, duplicate re-sends (re-advance, re-relay, direct receive),
stale and conflicting advances.  It keeps no state of its own: each
incarnation reads the files and carries on.  After each call returns it
appends one line to a journal (``op status id incarnation .``), so the test
knows what the library *answered* before the kill, and can check that none
of it was lost or doubled.

Between two incarnations, with no process touching the files, the test
checks (public API plus read-only SQL where there is no accessor):

* committed implies both rows; nothing committed, accepted or applied is
  ever lost (monotonic against every earlier check and against the journal);
* accepted implies the same event (same body) is in the inbox;
* at most one effect per event, and no event answered ``applied`` twice;
* every flow's applied events are a gap-free legal prefix of its inbox;
* conflicts are never accepted, and stale / conflicting advances never stored.

Default: 100 kills (about 20 s on two cores).  ``RELIABLE_FLOW_KILLS=N`` changes
the count of the default test; ``RELIABLE_FLOW_SOAK=1`` runs the opt-in soak
test with 1000 kills.  The seed is printed; ``RELIABLE_FLOW_SEED=<seed>``
replays the same plan and the same per-incarnation choices (the kill
moments are timing-dependent and are not exactly reproducible).

On PostgreSQL (schemas of the session's private server) the same campaign
runs with fewer kills (``POSTGRES_KILLS``, 60 by default; scaled by
``RELIABLE_FLOW_KILLS`` too): the child dies with its connections open, the
server rolls back whatever it had not committed, and the checks read the
schemas back through ``engine_reads`` (read-only stores and queries).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from children import workload
from engine_reads import bodies, snapshot_of
from engine_reads import effect_counts as stored_effect_counts
from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION
from support import CHILDREN, child_env, chosen_seed, kill_count

WORKLOAD = CHILDREN / "workload.py"
DEFAULT_KILLS = 100
POSTGRES_KILLS = 60  # the PostgreSQL campaign's share of DEFAULT_KILLS
# Each call is a round trip and a durable commit on the server: an incarnation
# gets less done per second, so the kills come later for the rounds to progress.
POSTGRES_MAX_KILL_DELAY = 0.25
SOAK_KILLS = 1000
MAX_KILL_DELAY = 0.08  # seconds after "ready"; a round of work takes a few hundred ms
EARLY_KILL_SHARE = 0.1  # kills that may land while the child starts and opens the files
EXTRA_KILLS_FACTOR = 3  # at most this many times the kills asked for, to see every answer of MUST_SEE
ROUND_TIMEOUT = 120  # an uninterrupted incarnation must finish its round within this
MUST_SEE = (  # answers a campaign must have produced, or it did not test much
    "relay accepted", "relay duplicate", "receive duplicate", "advance existing", "advance stale",
    "advance conflict", "relay id_conflict", "relay sequence_conflict", "apply gap", "apply blocked",
    "apply applied",
)
# What the shorter campaigns (another mode, another engine) must show: they
# share the workload, so the rarer answers are the main campaign's to prove;
# with fewer rounds done a gap, say, may not happen in every run.
MUST_SEE_SHORT = ("relay accepted", "relay duplicate", "receive duplicate", "advance existing", "advance stale")


# -- reading the files ----------------------------------------------------------------


class Journal:
    """What the library answered, as the workload wrote it down after each call.

    Read incrementally: each :meth:`refresh` parses only the lines appended
    since the last one (a line cut by the kill is left for later, and is
    never completed, so it is simply never counted).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.torn = 0
        self.answers: Counter[str] = Counter()  # "op status" -> how many
        self.by_answer: dict[str, Counter[str]] = {}  # "op status" -> Counter of ids

    def refresh(self) -> Journal:
        if not self.path.exists():
            return self
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            fields = line.split(" ")
            if len(fields) != 5 or fields[4] != ".":
                self.torn += 1  # cut by a kill (then ended by the next incarnation)
                continue
            op, status, ident = fields[:3]
            self.answers[f"{op} {status}"] += 1
            self.by_answer.setdefault(f"{op} {status}", Counter())[ident] += 1
        return self

    def ids(self, ops: tuple[str, ...], *statuses: str) -> Counter[str]:
        """How often each id got one of ``statuses`` from one of ``ops``."""
        out: Counter[str] = Counter()
        for op in ops:
            for status in statuses:
                out.update(self.by_answer.get(f"{op} {status}", Counter()))
        return out


@dataclass
class Observed:
    """Everything seen at earlier checks, to prove nothing disappears later."""

    outbox: set[str] = field(default_factory=set)
    accepted: set[str] = field(default_factory=set)
    inbox: set[str] = field(default_factory=set)
    effects: dict[str, list[str]] = field(default_factory=dict)


def check_invariants(producer_path: Path | str, consumer_path: Path | str, plans: dict[str, workload.RoundPlan],
                     journal: Journal, seen: Observed, where: str) -> None:
    """Every invariant, on files no process is using.  ``plans`` maps flow id -> its round's plan."""
    snap = snapshot_of(producer_path, consumer_path)
    flows, outbox = snap["producer"]["flows"], snap["producer"]["outbox"]
    out_body = bodies(producer_path, "outbox")
    in_body = bodies(consumer_path, "inbox")
    effect_counts = dict(stored_effect_counts(consumer_path))
    rounds = {plan.round_no: plan for plan in plans.values()}.values()
    conflicting = {event_id for plan in rounds for event_id in plan.conflicting}
    planted = {env["event_id"]: workload.canonical(env) for plan in rounds for env in plan.planted}

    # Producer: committed implies the flow row and every outbox row, as planned, nothing else.
    assert set(flows) | set(outbox) <= set(plans), f"{where}: unplanned flows {set(flows) - set(plans)}"
    for flow_id, plan in plans.items():
        flow, events = flows.get(flow_id), outbox.get(flow_id, [])
        n = 0 if flow is None else flow["seq"]
        assert [e["event_id"] for e in events] == [plan.event_id(flow_id, s) for s in range(1, n + 1)], where
        if flow is not None:
            assert flow == {"state": workload.STEPS[n - 1], "seq": n, "amount": plan.amounts[flow_id]}, where
        for seq in range(1, n + 1):
            # Conflicting advances never overwrote a body; stale ones never stored an event.
            event_id = plan.event_id(flow_id, seq)
            assert out_body[event_id] == workload.canonical(plan.envelope(flow_id, seq)), (where, event_id)
    all_events = {e["event_id"]: e for events in outbox.values() for e in events}
    assert set(out_body) == set(all_events), where

    # Accepted implies stored in the inbox with the same body; conflicts never accepted.
    for event_id, entry in all_events.items():
        if entry["accepted"]:
            assert in_body.get(event_id) == out_body[event_id], f"{where}: {event_id} accepted, not in inbox"
        if event_id in conflicting:
            assert not entry["accepted"], f"{where}: conflicting {event_id} was marked accepted"
            assert entry["state"] in ("pending", "set_aside"), (where, entry)
    # Every inbox row is either a producer event with its exact body, or a planted one.
    for event_id, body in in_body.items():
        assert body == out_body.get(event_id) and event_id not in conflicting or body == planted.get(event_id), (
            f"{where}: inbox holds {event_id} with a body nobody sent: {body}"
        )

    # Applied: a gap-free, legal prefix per flow, one effect per event.
    inbox_by_flow, effects_by_flow = snap["consumer"]["inbox"], snap["consumer"]["effects"]
    projections = snap["consumer"]["projections"]
    assert set(inbox_by_flow) <= set(plans), where
    assert all(count == 1 for count in effect_counts.values()), f"{where}: effect twice: {effect_counts}"
    for flow_id, rows in inbox_by_flow.items():
        plan = plans[flow_id]
        effects = effects_by_flow.get(flow_id, [])
        k = len(effects)
        assert [e["seq"] for e in effects] == list(range(1, k + 1)), f"{where}: {flow_id} applied with a gap"
        by_seq = {row["seq"]: row for row in rows}
        assert [e["event_id"] for e in effects] == [by_seq[s]["event_id"] for s in range(1, k + 1)], where
        assert [e["kind"] for e in effects] == list(workload.STEPS[:k]), f"{where}: {flow_id} illegal order"
        state = RESERVATION.initial
        for e in effects:  # each applied step is legal from the state before it
            assert e["kind"] in RESERVATION.transitions[state], (where, flow_id, state, e)
            state = e["kind"]
        assert all(row["state"] == "applied" for row in rows if row["seq"] <= k), where
        assert all(row["state"] != "applied" for row in rows if row["seq"] > k), f"{where}: applied past a gap"
        amounts = [json.loads(in_body[e["event_id"]])["payload"]["amount"] for e in effects]
        assert len(set(amounts)) <= 1, f"{where}: {flow_id} applied steps with different amounts {amounts}"
        for row in rows:
            if row["state"] == "blocked":
                assert (flow_id, row["seq"], row["reason"]) == (plan.poison, 2, "invalid_payload"), (where, row)
        if k == 0:
            assert projections.get(flow_id) is None, where
        else:
            held = amounts[0] if state in ("reserved", "confirmed") else 0
            assert projections[flow_id] == {"state": state, "last_seq": k, "held": held}, where
        assert all(effect_counts.get(e["event_id"]) == 1 for e in effects), where
    assert sum(len(v) for v in effects_by_flow.values()) == len(effect_counts), where

    # Nothing seen before has disappeared.
    accepted_now = {e for e, entry in all_events.items() if entry["accepted"]}
    effects_now = {f: [e["event_id"] for e in v] for f, v in effects_by_flow.items()}
    assert seen.outbox <= set(all_events), f"{where}: outbox lost {seen.outbox - set(all_events)}"
    assert seen.accepted <= accepted_now, f"{where}: accepted mark lost {seen.accepted - accepted_now}"
    assert seen.inbox <= set(in_body), f"{where}: inbox lost {seen.inbox - set(in_body)}"
    for flow_id, ids in seen.effects.items():
        assert effects_now.get(flow_id, [])[: len(ids)] == ids, f"{where}: effects of {flow_id} changed"
    seen.outbox, seen.accepted, seen.inbox, seen.effects = set(all_events), accepted_now, set(in_body), effects_now

    # Nothing the library answered before a kill was lost or done twice.
    committed = journal.ids(("advance",), "committed")
    assert max(committed.values(), default=0) <= 1, f"{where}: committed twice: {committed.most_common(3)}"
    assert set(committed) | set(journal.ids(("advance",), "existing")) <= set(all_events), f"{where}: lost"
    assert not set(journal.ids(("advance",), "stale")) & set(all_events), f"{where}: a stale advance was stored"
    stored = journal.ids(("relay", "receive", "plant"), "accepted")
    assert max(stored.values(), default=0) <= 1, f"{where}: an event stored twice: {stored.most_common(3)}"
    assert set(journal.ids(("relay", "receive", "plant"), "accepted", "duplicate")) <= set(in_body), where
    assert set(journal.ids(("relay",), "accepted", "duplicate")) <= accepted_now, f"{where}: accepted mark lost"
    assert set(journal.ids(("relay", "receive"), "id_conflict", "sequence_conflict")) <= conflicting, where
    applied = journal.ids(("apply",), "applied")
    assert max(applied.values(), default=0) <= 1, f"{where}: an event applied twice: {applied.most_common(3)}"
    assert set(applied) <= set(effect_counts), f"{where}: an event answered applied has no effect"


def check_round_finished(producer_path: Path | str, consumer_path: Path | str, plan: workload.RoundPlan) -> None:
    """An uninterrupted end of a round: everything through, except what must stay stuck."""
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        for flow_id in plan.flows:
            assert producer.flow(flow_id)["seq"] == 3
            for event in producer.outbox(flow_id):
                if event.event_id in plan.conflicting:
                    assert (event.accepted, event.state, event.last_status) == (
                        False, "set_aside", plan.conflicting[event.event_id]
                    ), event
                else:
                    assert event.accepted, event
            expected_last = 1 if flow_id == plan.poison else 3
            projection = consumer.projection(flow_id)
            assert projection is not None and projection["last_seq"] == expected_last, (flow_id, projection)
        # The poison flow is blocked at seq 2; every other flow went all the way.
        assert consumer.projection(plan.poison) == {
            "state": "reserved", "last_seq": 1, "held": plan.amounts[plan.poison] + 1}
        assert [r.state for r in consumer.inbox(plan.poison)] == ["applied", "blocked", "pending"]
        assert [e.event_id for e in consumer.applied(plan.shadow)] == [
            f"{plan.shadow}-planted", f"{plan.shadow}-2", f"{plan.shadow}-3"]
        assert relay(producer, consumer).status == "idle"


# -- the campaign -----------------------------------------------------------------------


@dataclass
class Campaign:
    kills: int = 0
    early_kills: int = 0
    rounds: int = 0
    incarnations: int = 0
    seconds: float = 0.0


def start_workload(tmp_path: Path, seed: int, round_no: int, incarnation: int,
                   on_receive: bool = False, stores: tuple[Any, Any] | None = None) -> subprocess.Popen[bytes]:
    """The workload child on ``stores`` (producer, consumer locations; default the two files in ``tmp_path``)."""
    producer, consumer = stores or (tmp_path / "producer.db", tmp_path / "consumer.db")
    stderr = open(tmp_path / f"stderr-{incarnation}.txt", "wb")  # noqa: SIM115 - closed below
    try:
        return subprocess.Popen(
            [sys.executable, str(WORKLOAD), "kill-run", str(producer), str(consumer),
             str(tmp_path / "journal.txt"), str(seed), str(round_no), str(incarnation)],
            env=child_env(RELIABLE_FLOW_TEST_APPLY_ON_RECEIVE="1" if on_receive else "0"),
            stdout=subprocess.PIPE, stderr=stderr, cwd=tmp_path,
        )
    finally:
        stderr.close()


def wait_for_ready(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return bool(ready) and proc.stdout.readline() == b"ready\n"


def run_campaign(tmp_path: Path, kills: int, seed: int, on_receive: bool = False,
                 stores: tuple[Any, Any] | None = None, max_kill_delay: float = MAX_KILL_DELAY,
                 must_see: tuple[str, ...] = MUST_SEE) -> Campaign:
    """``kills`` SIGKILLs of the workload on ``stores`` (default: two SQLite files in ``tmp_path``),
    each at most ``max_kill_delay`` seconds after the workload is ready."""
    print(f"\nkill test: RELIABLE_FLOW_SEED={seed} RELIABLE_FLOW_KILLS={kills} apply_on_receive={on_receive}",
          flush=True)
    rng = random.Random(seed)
    producer_path, consumer_path = stores or (tmp_path / "producer.db", tmp_path / "consumer.db")
    journal_path = tmp_path / "journal.txt"
    journal = Journal(journal_path)
    stats = Campaign()
    seen = Observed()
    plan = workload.plan_round(seed, 0)
    plans = dict.fromkeys(plan.flows, plan)
    started = time.monotonic()
    ever_ready = False
    while True:
        # The campaign ends after ``kills`` kills, unless a rare answer it
        # must have produced has not appeared yet: on a loaded machine each
        # incarnation gets fewer calls done before its kill, and a gap, say,
        # may take more of them.  It then goes on killing (every check still
        # made after each kill), up to EXTRA_KILLS_FACTOR times as many.
        final = stats.kills >= kills and (
            kills < 50 or stats.kills >= kills * EXTRA_KILLS_FACTOR or not _missing(journal.refresh(), must_see))
        incarnation = stats.incarnations
        stats.incarnations += 1
        where = f"seed {seed}, round {plan.round_no}, after incarnation {incarnation}"
        with start_workload(tmp_path, seed, plan.round_no, incarnation, on_receive,
                            (producer_path, consumer_path)) as proc:
            try:
                early = False
                if final:  # let it finish the round: the watchdog is the timeout
                    returncode = proc.wait(timeout=ROUND_TIMEOUT)
                else:
                    early = rng.random() < EARLY_KILL_SHARE
                    if early:
                        time.sleep(rng.uniform(0, 0.15))  # kill timing only: may land before "ready"
                    else:
                        assert wait_for_ready(proc, 60), f"{where}: workload never became ready"
                        time.sleep(rng.uniform(0, max_kill_delay))
                    proc.send_signal(signal.SIGKILL)  # no-op if it already finished its round
                    returncode = proc.wait(timeout=30)
            finally:
                if proc.poll() is None:  # a hang or a failed assertion: never leave it running
                    proc.kill()
                    proc.wait(timeout=30)
            out = proc.stdout.read() if proc.stdout else b""
        stderr_file = tmp_path / f"stderr-{incarnation}.txt"
        stderr = stderr_file.read_text()
        stderr_file.unlink()
        assert returncode in (0, -signal.SIGKILL), f"{where}: workload exited {returncode}:\n{stderr}"
        assert returncode != 0 or stderr == "", stderr
        if returncode == -signal.SIGKILL:
            stats.kills += 1
            stats.early_kills += early
        ever_ready = ever_ready or not early or out.startswith(b"ready\n")
        if ever_ready:  # both files were created completely: check everything
            check_invariants(producer_path, consumer_path, plans, journal.refresh(), seen, where)
        else:  # every kill so far landed while the stores were being opened: nothing can be recorded
            # (the child creates its journal before it opens the stores, which
            # on PostgreSQL takes long enough for a kill to land in between)
            assert not journal_path.exists() or journal_path.read_bytes() == b"", where
        if returncode == 0:
            assert b"done\n" in out, out
            check_round_finished(producer_path, consumer_path, plan)
            stats.rounds += 1
            if final:
                break
            plan = workload.plan_round(seed, plan.round_no + 1)
            plans.update(dict.fromkeys(plan.flows, plan))
    stats.seconds = time.monotonic() - started
    counts = journal.refresh().answers
    print(f"kill test: seed={seed} kills={stats.kills} (early {stats.early_kills}) rounds={stats.rounds} "
          f"incarnations={stats.incarnations} torn journal lines={journal.torn} in {stats.seconds:.1f}s; "
          f"answers {dict(sorted(counts.items()))}",
          flush=True)
    # The workload really exercised what the invariants are about (with a
    # handful of kills a gap, say, may simply not have happened yet).
    if kills >= 50:
        missing = _missing(journal, must_see)
        assert not missing, f"the workload never produced {missing} in {stats.kills} kills: {counts}"
    return stats


def _missing(journal: Journal, must_see: tuple[str, ...]) -> list[str]:
    """The answers of ``must_see`` the journal has not recorded yet."""
    return [answer for answer in must_see if journal.answers[answer] == 0]


def test_kill_restart_loses_nothing_and_doubles_nothing(tmp_path: Path) -> None:
    kills = kill_count(DEFAULT_KILLS)
    stats = run_campaign(tmp_path, kills, chosen_seed())
    assert stats.kills >= kills


def test_kill_restart_in_the_receive_and_apply_mode(tmp_path: Path) -> None:
    """The same campaign with the consumer applying on arrival: a kill inside
    the one receive-and-apply transaction leaves neither the row nor its
    apply, and nothing is lost or applied twice (half the kills: the mode
    shares every other step with the campaign above)."""
    kills = max(1, kill_count(DEFAULT_KILLS) // 2)
    stats = run_campaign(tmp_path, kills, chosen_seed(), on_receive=True, must_see=MUST_SEE_SHORT)
    assert stats.kills >= kills


@pytest.mark.postgres
@pytest.mark.parametrize("on_receive", [False, True], ids=["two-step", "receive-and-apply"])
def test_kill_restart_on_postgres(tmp_path: Path, pg_cluster: Any, on_receive: bool) -> None:
    """The campaign on PostgreSQL schemas: a SIGKILLed client's open
    transaction is rolled back by the server, a COMMIT it sent is kept or
    not as a whole; nothing acknowledged is lost or doubled.  (The
    receive-and-apply mode with a third of the kills.)"""
    from pg_cluster import pg_location

    share = POSTGRES_KILLS * kill_count(DEFAULT_KILLS) // DEFAULT_KILLS
    kills = max(1, share // 3 if on_receive else share)
    stores = (pg_location("kill_p"), pg_location("kill_c"))
    stats = run_campaign(tmp_path, kills, chosen_seed(), on_receive=on_receive, stores=stores,
                         max_kill_delay=POSTGRES_MAX_KILL_DELAY, must_see=MUST_SEE_SHORT)
    assert stats.kills >= kills


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("RELIABLE_FLOW_SOAK"), reason="soak run: set RELIABLE_FLOW_SOAK=1")
def test_kill_soak(tmp_path: Path) -> None:
    kills = kill_count(SOAK_KILLS)
    stats = run_campaign(tmp_path, kills, chosen_seed())
    assert stats.kills >= kills


def test_the_workload_alone_finishes_a_round(tmp_path: Path) -> None:
    """The control: without kills one incarnation does a whole round and exits 0."""
    seed = chosen_seed()
    print(f"\nRELIABLE_FLOW_SEED={seed}")
    with start_workload(tmp_path, seed, 0, 0) as proc:
        try:
            returncode = proc.wait(timeout=ROUND_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert returncode == 0, (tmp_path / "stderr-0.txt").read_text()
    plan = workload.plan_round(seed, 0)
    check_invariants(tmp_path / "producer.db", tmp_path / "consumer.db", dict.fromkeys(plan.flows, plan),
                     Journal(tmp_path / "journal.txt").refresh(), Observed(), f"seed {seed}")
    check_round_finished(tmp_path / "producer.db", tmp_path / "consumer.db", plan)


def test_gapped_and_blocked_flows_do_not_stop_the_others(tmp_path: Path) -> None:
    """A: 1 and 3 (gap at 2); P: seq 2 blocked; B: 1, 2, 3 all apply."""
    with Producer(tmp_path / "producer.db", RESERVATION) as producer, \
            Consumer(tmp_path / "consumer.db", RESERVATION) as consumer:
        for flow_id in ("A", "B", "P"):
            for seq, kind in enumerate(workload.STEPS, start=1):
                r = producer.advance(f"{flow_id}{seq}", flow_id, expected_seq=seq - 1, kind=kind,
                                     payload={"amount": 4})
                assert r.status == "committed"
        consumer.receive({"event_id": "P1", "flow_id": "P", "seq": 1, "kind": "reserved", "schema": 1,
                          "payload": {"amount": 5}})  # planted: P's seq 2 (amount 4) cannot apply on it
        for event_id in ("A3", "A1", "B3", "P2", "B1", "B2", "P3", "P1"):
            assert relay(producer, consumer, event_id=event_id).status in ("accepted", "id_conflict")
        result = consumer.process_all()
        assert {f: (r.applied, str(r.stop)) for f, r in result.items()} == {
            "A": (1, "gap"), "B": (3, "idle"), "P": (1, "blocked")}
        assert consumer.projection("B") == {"state": "released", "last_seq": 3, "held": 0}
        assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 4}
        assert consumer.inbox("P")[1].reason == "invalid_payload"
        # A2 is the only event left to deliver; once it arrives, A moves on.
        assert (relay(producer, consumer).status, relay(producer, consumer).status) == ("accepted", "idle")
        assert consumer.drain("A").applied == 2
        assert consumer.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
