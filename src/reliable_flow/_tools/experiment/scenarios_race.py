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
    advance_first,
    advance_flow,
    all_exited_0,
    create_files,
    drain_dict,
    effects_of,
    inbox_of,
    open_files,
    outbox_of,
    race,
    race_outcome,
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
    create_files(files)
    outcome = race_outcome(files, "advance_same")
    with open_files(files) as (producer, _):
        return {**outcome, "flow_A": producer.flow("A"), "outbox_A": outbox_of(producer, "A")}


def race_new_ids_expected_seq_0(files: Files) -> Result:
    """Six new ids for flow A at expected_seq 0 at once: one commits, five are stale."""
    create_files(files)
    outcome = race_outcome(files, "advance_new")
    with open_files(files) as (producer, _):
        outbox = producer.outbox("A")
        return {
            **outcome,
            "flow_A": producer.flow("A"),
            "outbox_A_count": len(outbox),
            "outbox_A_seqs": [e.seq for e in outbox],
        }


def race_receive_one_envelope(files: Files) -> Result:
    """Six processes receive the same envelope at once: one accepted, five duplicate."""
    with open_files(files) as (producer, _):
        advance_first(producer)
    outcome = race_outcome(files, "receive")
    with open_files(files) as (_, consumer):
        return {**outcome, "inbox_A": inbox_of(consumer, "A")}


def race_apply_next_one_event(files: Files) -> Result:
    """Six processes call apply_next on one pending event: exactly one effect."""
    with open_files(files) as (producer, consumer):
        advance_first(producer)
        relay(producer, consumer)
    outcome = race_outcome(files, "apply")
    with open_files(files) as (_, consumer):
        return {
            **outcome,
            "projection_A": consumer.projection("A"),
            "effects_A": effects_of(consumer, "A"),
            "inbox_A": inbox_of(consumer, "A"),
        }


def race_relay_several_events(files: Files) -> Result:
    """Six processes relay six pending events until idle: each stored once, all marked accepted.

    Which racer got ``accepted`` and how many ``duplicate`` answers there were
    depend on scheduling, so only the deterministic facts are recorded.
    """
    with open_files(files) as (producer, _):
        advance_flow(producer, "A")
        advance_flow(producer, "B")
    answers, codes = race(files, "relay")
    seen = {s for statuses in answers for s in statuses}
    with open_files(files) as (producer, consumer):
        return {
            "statuses_within_accepted_duplicate_idle": seen <= {"accepted", "duplicate", "idle"},
            "accepted_total": sum(statuses.count("accepted") for statuses in answers),
            "every_racer_ended_idle": all(statuses[-1:] == ["idle"] for statuses in answers),
            "all_racers_exited_0": all_exited_0(codes),
            "inbox": {flow: inbox_of(consumer, flow) for flow in ("A", "B")},
            "outbox_accepted": {e.event_id: e.accepted for e in producer.outbox()},
            "then_process_all": {flow: drain_dict(d) for flow, d in consumer.process_all().items()},
        }
