"""Scenarios of a process that dies half-way, and of a write that SQLite rejects.

The unsafe dual write and the crash points run a real child process
(:mod:`reliable_flow._tools.experiment.child`) and look at what its exit
leaves in the files; the trigger scenarios make one INSERT fail inside a
live transaction.  Every one of them then shows the recovery.
"""

from __future__ import annotations

from collections.abc import Callable

from ..._producer import Producer
from ..._relay import relay
from ...crash import CRASH_EXIT_CODE, ENV_VAR
from ...reservation import RESERVATION
from .harness import (
    Files,
    Result,
    advance_first,
    create_files,
    drain_dict,
    effects_of,
    error_name,
    inbox_of,
    observe,
    open_files,
    outbox_of,
    relay_until_idle,
    run_child,
    run_sql,
)
from .wrong_ways import UNSAFE_EXIT_CODE

__all__ = [
    "crash_scenario",
    "trigger_rejected_effect_insert",
    "trigger_rejected_outbox_insert",
    "unsafe_dual_write",
]


def unsafe_dual_write(files: Files) -> Result:
    """A child commits the flow row, then dies (exit 81) before the outbox write."""
    create_files(files)
    exit_code = run_child(
        "unsafe_dual_write", [files.producer], files, expect=UNSAFE_EXIT_CODE
    )
    with open_files(files) as (producer, consumer):
        flow = producer.flow("A")
        outbox = outbox_of(producer)
        relayed = str(relay(producer, consumer).status)
        retry = advance_first(producer)
        return {
            "child_exit_code": exit_code,
            "flow_A": flow,
            "outbox": outbox,
            "relay": relayed,
            "consumer_inbox_A": inbox_of(consumer, "A"),
            "safe_advance_of_A1_afterwards": retry,
        }


def crash_scenario(point: str) -> Callable[[Files], Result]:
    """The scenario ``crash_at:<point>``: see its ``__doc__``."""
    def run(files: Files) -> Result:
        exit_code = run_child(
            "crash",
            [files.producer, files.consumer],
            files,
            expect=CRASH_EXIT_CODE,
            **{ENV_VAR: point},
        )
        with open_files(files) as (producer, consumer):
            right_after = observe(producer, consumer, "A")
            again = advance_first(producer)
            relayed = relay_until_idle(producer, consumer)
            drained = drain_dict(consumer.drain("A"))
            after = observe(producer, consumer, "A")
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
        first = advance_first(producer)
        flow_before = producer.flow("A")
        run_sql(
            files.producer,
            "CREATE TRIGGER experiment_reject BEFORE INSERT ON outbox "
            "BEGIN SELECT RAISE(ABORT, 'outbox insert rejected by the experiment'); END",
        )
        try:
            producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
            raised = None
        except Exception as exc:  # noqa: BLE001 -- the point: which exception escapes
            raised = error_name(exc)
        flow_after = producer.flow("A")
        outbox_after = outbox_of(producer, "A")
        run_sql(files.producer, "DROP TRIGGER experiment_reject")
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
    with open_files(files) as (producer, consumer):
        advance_first(producer)
        relayed = str(relay(producer, consumer).status)
        run_sql(
            files.consumer,
            "CREATE TRIGGER experiment_reject BEFORE INSERT ON effect "
            "BEGIN SELECT RAISE(ABORT, 'effect insert rejected by the experiment'); END",
        )
        try:
            consumer.apply_next("A")
            raised = None
        except Exception as exc:  # noqa: BLE001 -- the point: which exception escapes
            raised = error_name(exc)
        right_after = {
            "projection": consumer.projection("A"),
            "effects": effects_of(consumer, "A"),
            "inbox": inbox_of(consumer, "A"),
        }
        run_sql(files.consumer, "DROP TRIGGER experiment_reject")
        retry = str(consumer.apply_next("A").status)
        return {
            "relay": relayed,
            "apply_next_raised": raised,
            "right_after": right_after,
            "apply_next_after_dropping_trigger": retry,
            "projection_after_retry": consumer.projection("A"),
            "effects_after_retry": effects_of(consumer, "A"),
        }
