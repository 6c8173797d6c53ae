"""How a consumer takes events in: the work behind ``Consumer.receive`` /
``receive_many`` (private functions of the consumer), and :class:`Applying`,
the consumer seen as a :class:`Receiver` in the receive-and-apply mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import _envelope as envelope
from ._core.apply import ApplyRules
from ._core.conflicts import rerun_on_conflict
from ._core.receive import receive_in, receive_many_in
from ._envelope import Envelope
from ._observe import CONSUMER, INFO
from .crash import crash_point
from .records import ApplyResult, ReceiveResult
from .statuses import ApplyStatus, ReceiveStatus

if TYPE_CHECKING:
    from ._consumer import Consumer

__all__ = ["Applying", "receive_all", "receive_one"]


def receive_one(consumer: Consumer, envelope_in: dict[str, Any] | str | bytes,
                arrival: ApplyRules | None) -> ReceiveResult:
    """Receive one event (applying it on arrival when ``arrival`` is given)."""
    env = envelope.parse(envelope_in)
    store = consumer.store

    def once() -> ReceiveResult:
        with store.write() as unit:
            return receive_in(unit, env, consumer.max_inbox, store.location, consumer.clock(), arrival)

    result = rerun_on_conflict(once)
    if result.status == ReceiveStatus.ACCEPTED:
        crash_point("receive.after_commit")
        if result.applied:
            _applied_on_arrival(consumer, [(env, result)])
    if result.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO):
        consumer._observed.received(consumer.name, env.meta, result)
    return result


def receive_all(consumer: Consumer, envelopes: Sequence[dict[str, Any] | str | bytes],
                arrival: ApplyRules | None) -> list[ReceiveResult]:
    """Receive several events in one transaction, every one parsed first."""
    parsed = [envelope.parse(e) for e in envelopes]
    store = consumer.store

    def once() -> list[ReceiveResult]:
        with store.write() as unit:
            now = consumer.clock()
            return receive_many_in(unit, parsed, consumer.max_inbox, store.location, now, arrival)

    results = rerun_on_conflict(once)
    if any(r.status == ReceiveStatus.ACCEPTED for r in results):
        crash_point("receive.after_commit")
        applied = [(env, r) for env, r in zip(parsed, results) if r.applied]
        if applied:
            _applied_on_arrival(consumer, applied)
    for env, r in zip(parsed, results):
        if r.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO):
            consumer._observed.received(consumer.name, env.meta, r)
    return results


def _applied_on_arrival(consumer: Consumer, applied: list[tuple[Envelope, ReceiveResult]]) -> None:
    """Count and log the events the receive commit also applied."""
    crash_point("receive_apply.after_commit")
    consumer._observed.applied += len(applied)
    if CONSUMER.isEnabledFor(INFO):
        consumer._observed.applies(consumer.name, [
            (ApplyResult(ApplyStatus.APPLIED, r.flow_id, r.seq, r.event_id), {"meta": env.meta})
            for env, r in applied
        ])


class Applying:
    """A consumer seen as a :class:`Receiver` in the receive-and-apply mode
    (:meth:`Consumer.applying`): same name, file and uid; only ``accept``
    and ``accept_many`` differ.  ``applied`` counts the events it applied
    on arrival."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.applied = 0

    @property
    def name(self) -> str:
        return self.consumer.name

    @property
    def uid(self) -> str:
        return self.consumer.uid

    @property
    def location(self) -> str:
        return self.consumer.location

    def accept(self, body: str) -> ReceiveResult:
        result = receive_one(self.consumer, body, self.consumer._rules)
        if result.applied:
            self.applied += 1
        return result

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        results = receive_all(self.consumer, bodies, self.consumer._rules)
        self.applied += sum(1 for r in results if r.applied)
        return results

    def __repr__(self) -> str:
        return f"{self.consumer!r}.applying()"
