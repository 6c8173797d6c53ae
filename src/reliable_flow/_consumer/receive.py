"""How a consumer takes events in: :class:`Receiving`, the work behind
``Consumer.receive`` / ``receive_many`` (the face opens nothing itself:
this opens the unit, lets :mod:`reliable_flow._core.receive` decide, then
crash points and logs), and :class:`Applying`, the consumer seen as a
:class:`~reliable_flow.Receiver` in the receive-and-apply mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .. import _envelope as envelope
from .._core.apply import ApplyRules
from .._core.conflicts import rerun_on_conflict
from .._core.receive import receive_in, receive_many_in
from .._envelope import Envelope
from .._observe import CONSUMER, INFO, Observer
from .._receiver import Receiver
from .._store import InboxStore
from ..crash import crash_point
from ..records import ApplyResult, ReceiveResult
from ..statuses import ApplyStatus, ReceiveStatus

__all__ = ["Applying", "ConsumerView", "Receiving"]


class Receiving:
    """One consumer's receive path over its ``store``: each call parses
    first (bad input raises before anything is opened), decides in one
    write unit (run again after a ``TransactionConflict``), and only then
    passes its crash points and counts and logs into ``observed``, the
    consumer's own :class:`~reliable_flow._observe.Observer`."""

    def __init__(self, store: InboxStore, name: str, max_inbox: int | None, clock: Callable[[], float],
                 observed: Observer, order: str = "strict") -> None:
        self.store, self.name, self.max_inbox, self.clock, self.observed = store, name, max_inbox, clock, observed
        self.order = order

    def one(self, envelope_in: dict[str, Any] | str | bytes, arrival: ApplyRules | None) -> ReceiveResult:
        """Receive one event (applying it on arrival when ``arrival`` is given)."""
        env = envelope.parse(envelope_in)
        store = self.store

        def once() -> ReceiveResult:
            with store.write() as unit:
                return receive_in(unit, env, self.max_inbox, store.location, self.clock(), arrival, self.order)

        result = rerun_on_conflict(once)
        if result.status == ReceiveStatus.ACCEPTED:
            crash_point("receive.after_commit")
            if result.applied:
                self._applied_on_arrival([(env, result)])
        if result.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO):
            self.observed.received(self.name, env.meta, result)
        return result

    def all(self, envelopes: Sequence[dict[str, Any] | str | bytes],
            arrival: ApplyRules | None) -> list[ReceiveResult]:
        """Receive several events in one transaction, every one parsed first."""
        parsed = [envelope.parse(e) for e in envelopes]
        store = self.store

        def once() -> list[ReceiveResult]:
            with store.write() as unit:
                return receive_many_in(unit, parsed, self.max_inbox, store.location, self.clock(), arrival,
                                       self.order)

        results = rerun_on_conflict(once)
        if any(r.status == ReceiveStatus.ACCEPTED for r in results):
            crash_point("receive.after_commit")
            applied = [(env, r) for env, r in zip(parsed, results) if r.applied]
            if applied:
                self._applied_on_arrival(applied)
        for env, r in zip(parsed, results):
            if r.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO):
                self.observed.received(self.name, env.meta, r)
        return results

    def _applied_on_arrival(self, applied: list[tuple[Envelope, ReceiveResult]]) -> None:
        """Count and log the events the receive commit also applied."""
        crash_point("receive_apply.after_commit")
        self.observed.applied += len(applied)
        if CONSUMER.isEnabledFor(INFO):
            self.observed.applies(self.name, [
                (ApplyResult(ApplyStatus.APPLIED, r.flow_id, r.seq, r.event_id), {"meta": env.meta})
                for env, r in applied
            ])


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def location(self) -> str: ...


class ConsumerView:
    """A consumer seen another way (in the receive-and-apply mode, of the
    sync or the asyncio face): named, stored and located as ``consumer``."""

    consumer: _Named

    @property
    def name(self) -> str:
        """The consumer's name (as ``consumer.name``)."""
        return self.consumer.name

    @property
    def uid(self) -> str:
        """The consumer store's identity (as ``consumer.uid``)."""
        return self.consumer.uid

    @property
    def location(self) -> str:
        """Where the consumer's store lives (as ``consumer.location``)."""
        return self.consumer.location

    def __repr__(self) -> str:
        return f"{self.consumer!r}.applying()"


class Applying(ConsumerView):
    """A consumer seen as a :class:`~reliable_flow.Receiver` in the
    receive-and-apply mode (:meth:`Consumer.applying`): same name, file and
    uid; only ``accept`` and ``accept_many`` differ (they apply on arrival
    with the consumer's ``rules``).  ``applied`` counts the events it
    applied on arrival."""

    def __init__(self, consumer: Receiver, receiving: Receiving, rules: ApplyRules) -> None:
        self.consumer, self._receiving, self._rules = consumer, receiving, rules
        self.applied = 0

    def accept(self, body: str) -> ReceiveResult:
        result = self._receiving.one(body, self._rules)
        if result.applied:
            self.applied += 1
        return result

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        results = self._receiving.all(bodies, self._rules)
        self.applied += sum(1 for r in results if r.applied)
        return results
