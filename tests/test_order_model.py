"""A model of each consumer's own order (issue 32, item 5) against a
reference, on both engines.

Hypothesis draws a producer's history (two flows, interleaved, of kinds in
several topics), a consumer's subscription and order (``strict``,
``latest``, ``any``), whether it applies on arrival, and what the network
does to its deliveries: arrivals permuted, duplicated, some lost.  The
consumer's events are those of a kind one of its topics carries.  After
every arrival (and ``process_all``):

* ``strict``: the applied events are exactly the longest prefix (per flow)
  of its events that has arrived, each once, and a later arrival is
  reported as a gap naming the missing event for it;
* ``any``: every arrived event for it is applied exactly once, whatever the
  order; ``last_seq`` is the highest applied; never a gap;
* ``latest``: each apply was of a seq newer than every one applied before
  it; the projection is at the newest arrived event; every other arrived
  event is stored ``superseded`` (its detail names a newer seq), none left
  waiting; never a gap;
* nobody ever waits on an event not for it (the answer is idle, or for
  ``strict`` a gap naming an event for it).

Once the lost ones are delivered again: ``strict`` and ``any`` have applied
every event for it exactly once, ``latest`` is at its last event.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_reads import new_location
from reliable_flow import Consumer, Producer
from test_topics import AGENT, KINDS, WHO, topics

_LABELS = itertools.count()
TOPIC_NAMES = [t.name for t in topics()]
CARRIES = {t.name: t.kinds for t in topics()}

history = st.lists(st.tuples(st.sampled_from(["A", "B"]), st.sampled_from(KINDS)), min_size=1, max_size=12)
subscription = st.sets(st.sampled_from(TOPIC_NAMES), min_size=1)


def _for_it(kind: str, subscribed: set[str]) -> bool:
    return any(kind in CARRIES[t] for t in subscribed)


def _check(c: Consumer, order: str, events: dict[str, list[tuple[int, str]]], arrived: set[str]) -> None:
    """The invariants after an arrival (see the module docstring)."""
    for flow, mine in events.items():
        applied = [(a.seq, a.event_id) for a in c.applied(flow)]
        came = [e for e in mine if e[1] in arrived]
        answer = c.apply_next(flow)  # nothing left to apply: answers without writing
        last = (c.projection(flow) or {"last_seq": 0})["last_seq"]
        if order == "strict":
            prefix = list(itertools.takewhile(lambda e: e[1] in arrived, mine))
            assert applied == prefix, (flow, applied, prefix)
            rest = mine[len(prefix):]
            later = [i for i, e in enumerate(rest) if e[1] in arrived]
            if later:
                assert (answer.status, answer.seq) == ("gap", rest[later[0] - 1][0]), (flow, answer, rest)
                continue
        elif order == "any":
            assert sorted(applied) == came, (flow, applied, came)  # each arrived one once, any order
            assert last == max((s for s, _ in came), default=0)
        else:
            seqs = [s for s, _ in applied]
            assert seqs == sorted(set(seqs)), (flow, seqs)  # only ever newer states
            assert last == max((s for s, _ in came), default=0)  # at the newest arrived
            states = {e.event_id: e.state for e in c.inbox(flow)}
            for seq, event_id in came:
                if (seq, event_id) not in applied:
                    assert states[event_id] == "superseded", (flow, event_id, states)
                    detail = c.store.latest.inbox_row(event_id).detail  # type: ignore[union-attr]
                    assert detail is not None and int(detail.rsplit(" ", 1)[1]) >= seq, detail
            assert "pending" not in states.values() and "blocked" not in states.values()
        assert answer.status == "idle", (flow, answer)  # never waits on an event (not) for it


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=history, subscribed=subscription, order=st.sampled_from(["strict", "latest", "any"]),
       on_arrival=st.booleans(), data=st.data())
def test_each_order_matches_its_reference(engine: str, tmp_path: Path, steps: list[tuple[str, str]],
                                          subscribed: set[str], order: str, on_arrival: bool, data: Any) -> None:
    n = next(_LABELS)
    with Producer(new_location(engine, tmp_path, f"p{n}"), AGENT, topics=topics()) as p, \
            Consumer(new_location(engine, tmp_path, f"c{n}"), AGENT, name="sub", order=order,
                     apply_on_receive=on_arrival) as c:
        p.admin.register_consumer("sub", topics=sorted(subscribed), **WHO)
        seqs: dict[str, int] = {"A": 0, "B": 0}
        events: dict[str, list[tuple[int, str]]] = {"A": [], "B": []}
        for i, (flow, kind) in enumerate(steps):
            event_id = f"{flow}-{i}"
            assert p.advance(event_id, flow, expected_seq=seqs[flow], kind=kind, payload={"n": i}).status == "committed"
            seqs[flow] += 1
            if _for_it(kind, subscribed):
                events[flow].append((seqs[flow], event_id))
        bodies = {json.loads(b)["event_id"]: b for _, b in p.store.latest.next_due("sub", float("inf"), 1000)}
        ids = sorted(bodies)
        lost = data.draw(st.sets(st.sampled_from(ids)) if ids else st.just(set()), label="lost")
        kept = [i for i in ids if i not in lost]
        again = data.draw(st.lists(st.sampled_from(kept), max_size=4) if kept else st.just([]), label="duplicated")
        arrivals = data.draw(st.permutations(kept + again), label="arrivals")
        arrived: set[str] = set()
        for event_id in arrivals:
            status = c.accept(bodies[event_id]).status
            assert status == ("duplicate" if event_id in arrived else "accepted"), (event_id, status)
            arrived.add(event_id)
            c.process_all()
            _check(c, order, events, arrived)
        for event_id in sorted(lost):  # delivered again
            assert c.accept(bodies[event_id]).status == "accepted"
            arrived.add(event_id)
        c.process_all()
        _check(c, order, events, arrived)
        for flow, mine in events.items():
            applied = [(a.seq, a.event_id) for a in c.applied(flow)]
            if order == "strict":
                assert applied == mine
            elif order == "any":
                assert sorted(applied) == mine
            else:
                assert applied[-1:] == mine[-1:]
            assert (c.projection(flow) or {"last_seq": 0})["last_seq"] == (mine[-1][0] if mine else 0)
