"""The six-process races: six real processes meet at a Barrier and do one thing at once.

Each scenario records the multiset of answers (never which racer won) and
what the files hold afterwards; the racers themselves are
:func:`reliable_flow._tools.experiment.harness._race_worker`.
"""

from __future__ import annotations

from ..._relay import relay
from .harness import (
    Files,
    Result,
    _advance_first,
    _advance_flow,
    _all_exited_0,
    _create,
    _drain,
    _effects,
    _inbox,
    _open,
    _outbox,
    _race,
    _race_outcome,
)

__all__ = [
    "race_apply_next_one_event",
    "race_new_ids_expected_seq_0",
    "race_receive_one_envelope",
    "race_relay_several_events",
    "race_same_event_advanced",
]


def race_same_event_advanced(files: Files) -> Result:
    """Six processes advance the same A1 at once: one commits, five see it existing."""
    _create(files)
    outcome = _race_outcome(files, "advance_same")
    with _open(files) as (producer, _):
        return {**outcome, "flow_A": producer.flow("A"), "outbox_A": _outbox(producer, "A")}


def race_new_ids_expected_seq_0(files: Files) -> Result:
    """Six new ids for flow A at expected_seq 0 at once: one commits, five are stale."""
    _create(files)
    outcome = _race_outcome(files, "advance_new")
    with _open(files) as (producer, _):
        outbox = producer.outbox("A")
        return {
            **outcome,
            "flow_A": producer.flow("A"),
            "outbox_A_count": len(outbox),
            "outbox_A_seqs": [e.seq for e in outbox],
        }


def race_receive_one_envelope(files: Files) -> Result:
    """Six processes receive the same envelope at once: one accepted, five duplicate."""
    with _open(files) as (producer, _):
        _advance_first(producer)
    outcome = _race_outcome(files, "receive")
    with _open(files) as (_, consumer):
        return {**outcome, "inbox_A": _inbox(consumer, "A")}


def race_apply_next_one_event(files: Files) -> Result:
    """Six processes call apply_next on one pending event: exactly one effect."""
    with _open(files) as (producer, consumer):
        _advance_first(producer)
        relay(producer, consumer)
    outcome = _race_outcome(files, "apply")
    with _open(files) as (_, consumer):
        return {
            **outcome,
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
