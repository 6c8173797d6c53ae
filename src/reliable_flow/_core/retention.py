"""``prune``: remove old finished events in bounded steps, each leaving a
tombstone that keeps deduplication exact.

Which rows are finished is the store's promise (``prune_step``); here is
the pacing: one transaction per step of at most ``batch_size`` events, so a
big backlog never holds the write lock for long, until a step finds less
than it could take or ``limit`` events were pruned.

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

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Protocol

from .._store.records import PruneStep
from ..records import PruneResult

__all__ = ["Pruning", "prune"]


class Pruning(Protocol):
    """A unit of work that can prune one step (both sides' units)."""

    def prune_step(self, horizon: float, now: float, limit: int) -> PruneStep: ...

    def forget_tombstones(self, before: float, now: float, limit: int) -> int: ...


def prune(
    write: Callable[[], AbstractContextManager[Pruning]], horizon: float, now: float,
    batch_size: int, limit: int | None, forget_before: float | None = None,
) -> PruneResult:
    """Prune what is finished and older than ``horizon``, step by step; then
    forget tombstones stamped before ``forget_before``, if given."""
    result = _prune(write, horizon, now, batch_size, limit)
    if forget_before is None:
        return result
    forgotten, transactions = 0, result.transactions
    while True:
        with write() as unit:
            gone = unit.forget_tombstones(forget_before, now, batch_size)
        forgotten += gone
        transactions += 1
        if gone < batch_size:
            return replace(result, tombstones_forgotten=forgotten, transactions=transactions)


def _prune(
    write: Callable[[], AbstractContextManager[Pruning]], horizon: float, now: float,
    batch_size: int, limit: int | None,
) -> PruneResult:
    events = deliveries = records = effect_rows = transactions = 0
    while True:
        take = batch_size if limit is None else min(batch_size, limit - events)
        if take <= 0:
            return PruneResult(events, deliveries, records, effect_rows, transactions, False)
        with write() as unit:
            step = unit.prune_step(horizon, now, take)
        transactions += 1
        events += step.events
        deliveries += step.deliveries
        records += step.effect_records
        effect_rows += step.effect_rows
        if step.events < take and step.effect_rows < take:
            return PruneResult(events, deliveries, records, effect_rows, transactions, True)
