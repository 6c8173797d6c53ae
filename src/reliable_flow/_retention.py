"""``prune`` for both sides: argument checks, then one unit of work per step, paced by
:mod:`reliable_flow._core.retention`.

See ``docs/operations.md`` ("Retention") for what is removed, what stays,
and the deduplication guarantee after pruning.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from ._checks import check_count, check_finite, check_optional_count, check_text
from ._core.retention import NOTHING_YET, keep_by_topic, next_take, tally
from ._core.topics import Routing
from .records import OperatorAction, PruneResult
from .statuses import ActionTarget

__all__ = ["DEFAULT_PRUNE_BATCH", "prune_older_than"]

DEFAULT_PRUNE_BATCH = 500


def prune_older_than(
    write: Callable[[], AbstractContextManager[Any]], older_than: object, now: object,
    batch_size: object, limit: object, forget_after: object = None, *, actor: object, reason: object,
    at: float, routing: Routing | None = None,
) -> tuple[PruneResult, OperatorAction]:
    """Check the arguments of a ``prune`` call (bad ones raise ``ValueError``
    before anything is opened) and prune up to ``now - older_than``; with
    ``routing`` (a producer's topics), each event is kept too while a topic
    carrying its kind keeps it (its ``retention``).

    The prune is recorded (target ``retention``, stamped ``at``, with the
    actor and reason) in its first transaction, with its first step: no row
    is removed unless the record commits with it."""
    who, why = check_text("actor", actor), check_text("reason", reason)
    age = check_finite("older_than", older_than)
    if age < 0:
        raise ValueError(f"older_than must be >= 0 seconds, got {older_than!r}")
    when = check_finite("now", now)
    size = check_count("batch_size", batch_size)
    most = check_optional_count("limit", limit)
    forget_before = None
    if forget_after is not None:
        keep = check_finite("forget_after", forget_after)
        if keep < age:
            raise ValueError(f"forget_after must be >= older_than ({age:g} s), got {forget_after!r}")
        forget_before = when - keep
    record = OperatorAction(at=at, target=ActionTarget.RETENTION, action="prune", horizon=when - age,
                            forget_before=forget_before, actor=who, reason=why)
    unrecorded = True
    result, after = NOTHING_YET, 0
    while not result.complete and (take := next_take(result, size, most)) > 0:
        with write() as unit:
            if unrecorded:
                unit.record_action(record)
            if routing is None:
                step = unit.prune_step(when - age, when, take)
            else:
                kept_by = keep_by_topic(routing, age, when, unit.first_after)
                # Kept candidates stay behind: the next step looks after them.
                step = unit.prune_step(when - age, when, take, kept_by, after)
                after = after if step.last_pos is None else step.last_pos
        result, unrecorded = tally(result, step, take), False
    while forget_before is not None:
        with write() as unit:
            if unrecorded:
                unit.record_action(record)
            gone = unit.forget_tombstones(forget_before, when, size)
        unrecorded = False
        result = replace(result, tombstones_forgotten=result.tombstones_forgotten + gone,
                         transactions=result.transactions + 1)
        if gone < size:
            break
    return result, record  # the first loop ran at least once (limit >= 1): recorded
