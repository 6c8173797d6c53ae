"""``prune``: remove old finished events in bounded steps, each leaving a
tombstone that keeps deduplication exact.

Which rows are finished is the store's promise (``prune_step``); here is
the pacing, decided after each step the caller committed: one transaction
per step of at most ``batch_size`` events (:func:`next_take`), so a big
backlog never holds the write lock for long, until a step finds less than
it could take or ``limit`` events were pruned (:func:`tally`).

Why a pruned event is never applied or stored again (the consumer's
``UNIQUE(event_id)`` on effect records is gone with the record):

* ``receive`` stores an event only if its id has no tombstone and its seq
  is past its flow's last applied seq (``insert_new``; the slow path says
  ``duplicate`` / ``id_conflict`` from the tombstone, and
  ``sequence_conflict`` for a slot at or before ``last_seq``);
* only rows at or before their flow's ``last_seq`` are pruned, and
  ``last_seq`` never goes back (the projection is never pruned);
* ``apply`` only ever takes the row at ``last_seq + 1``.

So no row of a pruned event, nor a new one in its slot, can reach apply.
On the producer side the flow row is never pruned, so ``advance`` (which
needs ``expected_seq`` equal to the flow's seq) cannot reuse a pruned
slot, and a pruned id is answered from its tombstone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from .._store.records import Keep, PruneStep
from ..records import OperatorAction, PruneResult
from .topics import Routing

__all__ = ["NOTHING_YET", "Pruning", "next_take", "tally"]

#: What a prune has done before its first step.
NOTHING_YET = PruneResult(0, 0, 0, 0, 0, False)


class Pruning(Protocol):
    """A unit of work that can prune one step (both sides' units)."""

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep: ...

    def forget_tombstones(self, before: float, now: float, limit: int) -> int: ...

    def record_action(self, action: OperatorAction) -> None: ...


class TopicPruning(Pruning, Protocol):
    """A producer's unit: a pruning step that keeps what a test says, from a
    position on, and the first event committed after a time."""

    def prune_step(self, horizon: float, now: float, limit: int, keep: Keep | None = None,
                   after: int = 0) -> PruneStep: ...

    def first_after(self, when: float) -> int | None: ...


def next_take(so_far: PruneResult, batch_size: int, limit: int | None) -> int:
    """How many events the next step may prune: a batch, or what ``limit``
    leaves of it; 0 once ``limit`` events were pruned."""
    return batch_size if limit is None else min(batch_size, limit - so_far.events)


def tally(so_far: PruneResult, step: PruneStep, take: int) -> PruneResult:
    """``so_far`` and one more committed step, which could take ``take``:
    ``complete`` when the step found less than that (nothing is left; a
    producer's step counts the candidates it looked at, kept ones too)."""
    found = step.events if step.looked is None else step.looked
    return PruneResult(
        so_far.events + step.events, so_far.deliveries + step.deliveries,
        so_far.effect_records + step.effect_records, so_far.effect_rows + step.effect_rows,
        so_far.transactions + 1, found < take and step.effect_rows < take,
    )


def keep_by_topic(routing: Routing | None, age: float, at: float,
                  first_after: Callable[[float], int | None]) -> Keep | None:
    """The test a producer's pruning step applies to each candidate (older
    than ``age`` seconds at ``at``): keep it while the longest retention of
    the topics carrying its kind has not passed, judged by position as the
    step judges age (``first_after(t)``: the first event committed after
    ``t``; None: none).  None when no topic keeps events longer than ``age``."""
    longer: dict[str, float] = {}
    for topic in () if routing is None else routing.topics:
        if topic.retention is not None and topic.retention > age:
            for kind in topic.kinds:
                longer[kind] = max(longer.get(kind, 0.0), topic.retention)
    if not longer:
        return None
    bounds = {r: first_after(at - r) for r in set(longer.values())}

    def keep(pos: int, body: str) -> bool:
        wanted = longer.get(str(json.loads(body)["kind"]))
        bound = None if wanted is None else bounds[wanted]
        return bound is not None and pos >= bound

    return keep
