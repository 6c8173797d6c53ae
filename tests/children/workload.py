"""The child-process side of the crash-point and kill tests.

Not collected by pytest (no ``test_`` prefix).  Two ways in:

* as a script, in a fresh interpreter started by the test with an explicit
  environment and a timeout::

      python tests/children/workload.py crash-run PRODUCER CONSUMER
      python tests/children/workload.py crash-run-apply PRODUCER CONSUMER
      python tests/children/workload.py kill-run PRODUCER CONSUMER JOURNAL SEED ROUND INCARNATION

* imported: :func:`plan_round` lets the kill test compute what the workload
  was asked to do.

Every child opens its own ``Producer`` / ``Consumer``; nothing is inherited.
With ``RELIABLE_FLOW_TEST_APPLY_ON_RECEIVE=1`` the kill workload's consumer
runs in the receive-and-apply mode.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass
from typing import Any

from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION

STEPS = ("reserved", "confirmed", "released")
FLOWS_PER_ROUND = 20
WORKLOAD_FAILED = 2  # exit code of a workload that saw an answer it must never see


# -- crash-point child -------------------------------------------------------------


def crash_run(producer_path: str, consumer_path: str) -> int:
    """advance A1 -> relay -> drain, the path every crash point lies on.

    Both files are opened (so both exist) before the first write.  With
    ``RELIABLE_FLOW_CRASH_AT`` set this never returns: the process exits 73.
    """
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert r.status == "committed", r
        d = relay(producer, consumer)
        assert d.status == "accepted", d
        drained = consumer.drain("A")
        assert (drained.applied, drained.stop) == (1, "idle"), drained
    return 0


def crash_run_apply(producer_path: str, consumer_path: str) -> int:
    """advance A1 -> relay to a consumer in the receive-and-apply mode, which
    applies A1 in its receive transaction -> drain finds nothing left."""
    with Producer(producer_path, RESERVATION) as producer, \
            Consumer(consumer_path, RESERVATION, apply_on_receive=True) as consumer:
        r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert r.status == "committed", r
        d = relay(producer, consumer)
        assert d.status == "accepted", d
        drained = consumer.drain("A")
        assert (drained.applied, drained.stop) == (0, "idle"), drained
    return 0


# -- the kill workload ---------------------------------------------------------------


@dataclass(frozen=True)
class RoundPlan:
    """What one round of the kill workload does; the same in every incarnation.

    ``FLOWS_PER_ROUND`` ordinary flows, each reserved -> confirmed ->
    released with one amount, plus two flows with a planted conflict:

    * ``poison``: before the producer ever advances it, the consumer receives
      an event with the producer's id ``<poison>-1`` but another amount.  The
      relay must answer ``id_conflict`` and never mark it accepted; the
      planted event applies, and the producer's seq 2 (other amount) blocks
      with ``invalid_payload``.
    * ``shadow``: the consumer receives ``<shadow>-planted`` at seq 1, so the
      producer's ``<shadow>-1`` is a ``sequence_conflict``; seq 2 and 3 apply
      on top of the planted seq 1 (same amount).
    """

    round_no: int
    amounts: dict[str, int]

    @property
    def prefix(self) -> str:
        return f"r{self.round_no}-"

    @property
    def poison(self) -> str:
        return f"{self.prefix}P"

    @property
    def shadow(self) -> str:
        return f"{self.prefix}Q"

    @property
    def flows(self) -> list[str]:
        return list(self.amounts)

    @staticmethod
    def event_id(flow_id: str, seq: int) -> str:
        return f"{flow_id}-{seq}"

    def envelope(self, flow_id: str, seq: int) -> dict[str, Any]:
        """The event the producer commits for ``flow_id`` at ``seq``."""
        return {"event_id": self.event_id(flow_id, seq), "flow_id": flow_id, "seq": seq,
                "kind": STEPS[seq - 1], "schema": 1, "payload": {"amount": self.amounts[flow_id]}}

    @property
    def planted(self) -> list[dict[str, Any]]:
        """Events the consumer receives directly, conflicting with the producer's."""
        poison = dict(self.envelope(self.poison, 1), payload={"amount": self.amounts[self.poison] + 1})
        shadow = dict(self.envelope(self.shadow, 1), event_id=f"{self.shadow}-planted")
        return [poison, shadow]

    @property
    def conflicting(self) -> dict[str, str]:
        """Producer events that must never be accepted, with the only answer allowed for them."""
        return {self.event_id(self.poison, 1): "id_conflict", self.event_id(self.shadow, 1): "sequence_conflict"}


def plan_round(seed: int, round_no: int) -> RoundPlan:
    rng = random.Random(f"{seed}:{round_no}:plan")
    names = [f"r{round_no}-F{i:02d}" for i in range(FLOWS_PER_ROUND)] + [f"r{round_no}-P", f"r{round_no}-Q"]
    return RoundPlan(round_no, {name: rng.randint(1, 1000) for name in names})


def canonical(obj: Any) -> str:
    """The library's canonical body: sorted keys, compact, UTF-8 text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class WorkloadError(Exception):
    """The library gave an answer the workload must never see."""


class KillWorkload:
    """One incarnation: everything it knows comes from the files, not from memory."""

    def __init__(self, producer: Producer, consumer: Consumer, plan: RoundPlan,
                 rng: random.Random, journal_fd: int, incarnation: int) -> None:
        self.p, self.c, self.plan, self.rng = producer, consumer, plan, rng
        self.fd = journal_fd
        self.incarnation = incarnation
        self.counter = 0

    # journal: one os.write per line, after the call returned -------------------

    def log(self, op: str, status: object, ident: object) -> None:
        # The trailing "." marks a whole line: a write cut by SIGKILL never has it.
        os.write(self.fd, f"{op} {status} {ident} {self.incarnation} .\n".encode())

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            raise WorkloadError(what)

    # what the files say ----------------------------------------------------------

    def seq(self, flow_id: str) -> int:
        flow = self.p.flow(flow_id)
        return 0 if flow is None else int(flow["seq"])

    def committed(self) -> list[tuple[str, int]]:
        return [(f, s) for f in self.plan.flows for s in range(1, self.seq(f) + 1)]

    # answers allowed for deliveries ---------------------------------------------------

    def check_delivery(self, op: str, status: str, event_id: str | None) -> None:
        self.log(op, status, event_id)
        if status in ("accepted", "duplicate", "idle"):
            self.expect(status != "idle" or event_id is None, f"{op}: idle with an event {event_id}")
            self.expect(event_id not in self.plan.conflicting, f"{op}: conflicting {event_id} was {status}")
            return
        want = self.plan.conflicting.get(str(event_id))
        self.expect(want == status, f"{op}: {event_id} answered {status}, allowed only {want}")

    # actions -------------------------------------------------------------------------

    def advance_next(self) -> None:
        open_flows = [f for f in self.plan.flows if self.seq(f) < len(STEPS)]
        if not open_flows:
            return
        flow_id = self.rng.choice(open_flows)
        seq = self.seq(flow_id) + 1
        env = self.plan.envelope(flow_id, seq)
        r = self.p.advance(env["event_id"], flow_id, expected_seq=seq - 1, kind=env["kind"], payload=env["payload"])
        self.log("advance", r.status, env["event_id"])
        self.expect(r.status == "committed" and r.seq == seq, f"advance next: {r}")

    def re_advance(self) -> None:
        done = self.committed()
        if not done:
            return
        flow_id, seq = self.rng.choice(done)
        env = self.plan.envelope(flow_id, seq)
        r = self.p.advance(env["event_id"], flow_id, expected_seq=seq - 1, kind=env["kind"], payload=env["payload"])
        self.log("advance", r.status, env["event_id"])
        self.expect(r.status == "existing" and r.seq == seq, f"re-advance: {r}")

    def stale_advance(self) -> None:
        started = [f for f in self.plan.flows if self.seq(f) >= 1]
        if not started:
            return
        flow_id = self.rng.choice(started)
        current = self.seq(flow_id)
        expected = self.rng.randrange(current)  # an old view of the flow
        self.counter += 1
        event_id = f"{flow_id}-stale-{self.incarnation}-{self.counter}"
        r = self.p.advance(event_id, flow_id, expected_seq=expected, kind=STEPS[expected],
                           payload={"amount": self.plan.amounts[flow_id]})
        self.log("advance", r.status, event_id)
        self.expect(r.status == "stale", f"stale advance: {r}")

    def conflicting_advance(self) -> None:
        done = self.committed()
        if not done:
            return
        flow_id, seq = self.rng.choice(done)
        env = self.plan.envelope(flow_id, seq)
        r = self.p.advance(env["event_id"], flow_id, expected_seq=seq - 1, kind=env["kind"],
                           payload={"amount": self.plan.amounts[flow_id] % 1000 + 1})
        self.log("advance", r.status, env["event_id"])
        self.expect(r.status == "conflict", f"conflicting advance: {r}")

    def relay_next(self) -> None:
        d = relay(self.p, self.c)
        self.check_delivery("relay", str(d.status), d.event_id)

    def relay_shuffled(self) -> None:
        """Explicit relays of committed events in a shuffled order: reordering and re-sends."""
        done = self.committed()
        chosen = self.rng.sample(done, min(len(done), self.rng.randint(1, 6)))
        for flow_id, seq in chosen:
            event_id = self.plan.event_id(flow_id, seq)
            d = relay(self.p, self.c, event_id=event_id)
            self.check_delivery("relay", str(d.status), d.event_id)

    def receive_direct(self) -> None:
        """A re-send that bypasses the relay (the producer does not learn of it)."""
        done = self.committed()
        if not done:
            return
        flow_id, seq = self.rng.choice(done)
        event = self.p.event(self.plan.event_id(flow_id, seq))
        self.expect(event is not None, f"committed {flow_id}:{seq} has no outbox event")
        r = self.c.receive(json.dumps(event))
        self.check_delivery("receive", str(r.status), r.event_id)

    def replant(self) -> None:
        for env in self.plan.planted:
            r = self.c.receive(env)
            self.log("plant", r.status, env["event_id"])
            self.expect(r.status in ("accepted", "duplicate"), f"planted receive: {r}")

    def check_apply(self, status: str, flow_id: str, event_id: str | None, reason: object) -> None:
        self.log("apply", status, event_id if event_id else flow_id)
        if status == "blocked":
            # Only a poison flow (this round's, or an earlier round's seen by
            # process_all) blocks, and only at its seq 2.
            self.expect(
                flow_id.endswith("-P") and (reason, event_id) == ("invalid_payload", self.plan.event_id(flow_id, 2)),
                f"apply {flow_id}: unexpected block of {event_id} ({reason})",
            )
        else:
            self.expect(status in ("applied", "gap", "idle"), f"apply {flow_id}: {status}")

    def apply_one(self) -> None:
        flow_id = self.rng.choice(self.plan.flows)
        r = self.c.apply_next(flow_id)
        self.check_apply(str(r.status), flow_id, r.event_id, r.reason)

    def drain_one(self) -> None:
        flow_id = self.rng.choice(self.plan.flows)
        r = self.c.drain(flow_id, limit=self.rng.randint(1, 3))
        self.log("drain", r.stop, f"{flow_id}:{r.applied}")
        if r.last is not None and r.stop != "limit":
            self.check_apply(str(r.last.status), flow_id, r.last.event_id, r.last.reason)

    def process_everything(self) -> None:
        for flow_id, r in self.c.process_all(limit=self.rng.randint(1, 3)).items():
            self.log("drain", r.stop, f"{flow_id}:{r.applied}")
            if r.last is not None and r.stop != "limit":
                self.check_apply(str(r.last.status), flow_id, r.last.event_id, r.last.reason)

    ACTIONS = (
        ("advance_next", 8), ("re_advance", 1), ("stale_advance", 1), ("conflicting_advance", 1),
        ("relay_next", 4), ("relay_shuffled", 3), ("receive_direct", 1), ("replant", 0.2),
        ("apply_one", 4), ("drain_one", 1), ("process_everything", 0.5),
    )

    def finished(self) -> bool:
        """Every flow fully committed, nothing left to relay, nothing left to apply."""
        if any(self.seq(f) < len(STEPS) for f in self.plan.flows):
            return False
        d = relay(self.p, self.c)
        self.check_delivery("relay", str(d.status), d.event_id)
        if d.status != "idle":
            return False
        results = self.c.process_all()
        for flow_id, r in results.items():
            self.log("drain", r.stop, f"{flow_id}:{r.applied}")
            if r.last is not None and r.stop != "limit":
                self.check_apply(str(r.last.status), flow_id, r.last.event_id, r.last.reason)
        return all(r.applied == 0 for r in results.values())

    def run(self) -> None:
        self.replant()  # before any advance of this incarnation: the conflicts are planted first
        names = [name for name, _ in self.ACTIONS]
        weights = [w for _, w in self.ACTIONS]
        while not self.finished():
            for _ in range(20):
                getattr(self, self.rng.choices(names, weights)[0])()


def kill_run(producer_path: str, consumer_path: str, journal: str, seed: int, round_no: int,
             incarnation: int) -> int:
    plan = plan_round(seed, round_no)
    rng = random.Random(f"{seed}:{round_no}:{incarnation}:actions")
    fd = os.open(journal, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")  # end a line the previous incarnation was killed in the middle of
        on_receive = os.environ.get("RELIABLE_FLOW_TEST_APPLY_ON_RECEIVE") == "1"
        with Producer(producer_path, RESERVATION) as producer, \
                Consumer(consumer_path, RESERVATION, apply_on_receive=on_receive) as consumer:
            print("ready", flush=True)
            try:
                KillWorkload(producer, consumer, plan, rng, fd, incarnation).run()
            except WorkloadError as exc:
                print(f"WORKLOAD INVARIANT BROKEN (seed {seed}, round {round_no}, incarnation "
                      f"{incarnation}): {exc}", file=sys.stderr, flush=True)
                return WORKLOAD_FAILED
            print("done", flush=True)
    finally:
        os.close(fd)
    return 0


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "crash-run":
        return crash_run(*args)
    if command == "crash-run-apply":
        return crash_run_apply(*args)
    if command == "kill-run":
        producer_path, consumer_path, journal, seed, round_no, incarnation = args
        return kill_run(producer_path, consumer_path, journal, int(seed), int(round_no), int(incarnation))
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
