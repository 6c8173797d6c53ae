"""Crash points: named boundaries where a test can make the process die.

Set ``RELIABLE_FLOW_CRASH_AT=<point>`` and the process calls
``os._exit(73)`` when it reaches that point: no ``finally`` blocks, no
``atexit``, no COMMIT or ROLLBACK, just like a kill.  The variable is read
once at import, so an unset variable costs one ``is None`` test per point.
"""

from __future__ import annotations

import os

__all__ = [
    "ALL_CRASH_POINTS",
    "CRASH_EXIT_CODE",
    "CRASH_POINTS",
    "ENV_VAR",
    "EXECUTOR_CRASH_POINTS",
    "FEEDBACK_CRASH_POINTS",
    "RECEIVE_APPLY_CRASH_POINTS",
    "crash_point",
]

ENV_VAR = "RELIABLE_FLOW_CRASH_AT"
CRASH_EXIT_CODE = 73

CRASH_POINTS = (
    "advance.after_flow_write",
    "advance.after_outbox_insert",
    "advance.after_commit",
    "receive.after_inbox_insert",
    "receive.after_commit",
    "relay.after_mark",
    "relay.after_commit",
    "apply.after_projection",
    "apply.after_effect",
    "apply.after_commit",
)

# The effect executor's boundaries: the claim committed (before the call),
# the external call returned (before its outcome is recorded), the outcome
# committed.
EXECUTOR_CRASH_POINTS = (
    "executor.after_claim",
    "executor.after_call",
    "executor.after_commit",
)

# Feeding an effect's result or failure step back (``Feedback``): the step
# committed in the producer (before the effect is marked fed), and the mark
# committed in the consumer.
FEEDBACK_CRASH_POINTS = (
    "feedback.after_advance",
    "feedback.after_mark",
)

# The receive-and-apply mode (``Consumer(..., apply_on_receive=True)``):
# inside the receive transaction, after the projection and after the effect
# record of an event applied on arrival, and after that transaction
# committed.  ``receive.after_inbox_insert`` and ``receive.after_commit``
# fire in this mode too; the ten points above keep their default meaning.
RECEIVE_APPLY_CRASH_POINTS = (
    "receive_apply.after_projection",
    "receive_apply.after_effect",
    "receive_apply.after_commit",
)

ALL_CRASH_POINTS = CRASH_POINTS + EXECUTOR_CRASH_POINTS + FEEDBACK_CRASH_POINTS + RECEIVE_APPLY_CRASH_POINTS

_armed = os.environ.get(ENV_VAR) or None
if _armed is not None and _armed not in ALL_CRASH_POINTS:
    # A misspelt point would silently never fire and make a crash test pass
    # for the wrong reason, so refuse it loudly.
    raise ValueError(f"{ENV_VAR}={_armed!r} is not a crash point; choose one of {', '.join(ALL_CRASH_POINTS)}")


def crash_point(name: str) -> None:
    """Exit the process with code 73 if ``name`` is the armed crash point."""
    if _armed is not None and _armed == name:
        os._exit(CRASH_EXIT_CODE)
