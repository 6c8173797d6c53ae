"""How a consumer takes events in (``Consumer.receive``, ``receive_many``,
and the :class:`Receiver` face that ``relay`` calls), in the default mode
or the receive-and-apply mode."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from . import envelope
from .core.apply import ApplyRules
from .core.conflicts import rerun_on_conflict
from .core.receive import receive_in
from .crash import crash_point
from .envelope import Envelope
from .observe import CONSUMER, INFO, Observer
from .statuses import ApplyResult, ApplyStatus, ReceiveResult, ReceiveStatus
from .store import InboxStore
from .tracing import traced

__all__ = ["Applying", "Receiving"]


class Receiving:
    """The receiving half of :class:`~reliable_flow.Consumer`."""

    max_inbox: int | None
    clock: Callable[[], float] = time.time
    _name: str
    _rules: ApplyRules
    _on_arrival: ApplyRules | None
    _observed: Observer

    @property
    def store(self) -> InboxStore:
        raise NotImplementedError

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def uid(self) -> str:
        raise NotImplementedError

    @property
    def location(self) -> str:
        raise NotImplementedError

    @traced("reliable_flow.receive")
    def receive(self, envelope_in: dict[str, Any] | str | bytes) -> ReceiveResult:
        """Store an event durably, once; the consumer owns it after ``accepted``.

        Guarantees: ``accepted`` is returned only after COMMIT, so the event
        survives any later crash.  The same event id with the same canonical
        body is ``duplicate`` (nothing written); with another body
        ``id_conflict``; a new id in a (flow, seq) slot already taken is
        ``sequence_conflict``.  A schema this consumer cannot decode is still
        accepted, unchanged.  Malformed input raises ``InvalidEnvelope``; a
        full inbox (``max_inbox``) answers ``refused``, storing nothing (the
        flow's very next step is always let in).  In the
        receive-and-apply mode ``applied=True`` says the same commit also
        applied the event.
        """
        return self._receive(envelope_in, self._on_arrival)

    def _receive(self, envelope_in: dict[str, Any] | str | bytes, arrival: ApplyRules | None) -> ReceiveResult:
        env = envelope.parse(envelope_in)

        def once() -> ReceiveResult:
            with self.store.write() as unit:
                return receive_in(unit, env, self.max_inbox, self.store.location, self.clock(), arrival)

        result = rerun_on_conflict(once)
        if result.status == ReceiveStatus.ACCEPTED:
            crash_point("receive.after_commit")
            if result.applied:
                self._applied_on_arrival([(env, result)])
        if result.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO):
            self._observed.received(self._name, env.meta, result)
        return result

    def _applied_on_arrival(self, applied: list[tuple[Envelope, ReceiveResult]]) -> None:
        """Count and log the events the receive commit also applied."""
        crash_point("receive_apply.after_commit")
        self._observed.applied += len(applied)
        if CONSUMER.isEnabledFor(INFO):
            self._observed.applies(self._name, [
                (ApplyResult(ApplyStatus.APPLIED, r.flow_id, r.seq, r.event_id), {"meta": env.meta})
                for env, r in applied
            ])

    def receive_many(
        self, envelopes: Sequence[dict[str, Any] | str | bytes]
    ) -> list[ReceiveResult]:
        """Receive several events in one transaction; one entry per event, in order.

        Same checks and statuses as :meth:`receive`.  Every envelope is
        validated before anything is stored: one malformed envelope raises
        ``InvalidEnvelope`` and stores none.  An event that a full inbox
        (``max_inbox``) refuses is answered ``refused`` and not stored; the others
        are still examined, exactly as separate ``receive`` calls would be
        (so a flow's next step still gets in).
        """
        return self._receive_many(envelopes, self._on_arrival)

    def _receive_many(
        self, envelopes: Sequence[dict[str, Any] | str | bytes], arrival: ApplyRules | None
    ) -> list[ReceiveResult]:
        parsed = [envelope.parse(e) for e in envelopes]

        def once() -> list[ReceiveResult]:
            with self.store.write() as unit:
                now = self.clock()
                return [receive_in(unit, env, self.max_inbox, self.store.location, now, arrival) for env in parsed]

        results = rerun_on_conflict(once)
        if any(r.status == ReceiveStatus.ACCEPTED for r in results):
            crash_point("receive.after_commit")
            applied = [(env, r) for env, r in zip(parsed, results) if r.applied]
            if applied:
                self._applied_on_arrival(applied)
        for env, r in zip(parsed, results):
            if r.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO):
                self._observed.received(self._name, env.meta, r)
        return results

    # -- as a Receiver (what relay() calls) -------------------------------------------

    def accept(self, body: str) -> ReceiveResult:
        """:meth:`receive`, as a :class:`~reliable_flow.receiver.Receiver` answers."""
        return self.receive(body)

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        """:meth:`receive_many`, as a :class:`~reliable_flow.receiver.Receiver` answers."""
        return self.receive_many(bodies)

    def applying(self) -> Applying:
        """This consumer as a :class:`Receiver` in the receive-and-apply mode,
        whatever ``apply_on_receive`` says: relaying to it applies each
        arriving event that is its flow's next step in the receive
        transaction (see :class:`~reliable_flow.Consumer`).  What
        :class:`~reliable_flow.Worker` relays to by default."""
        return Applying(self)

class Applying:
    """A consumer seen as a :class:`Receiver` in the receive-and-apply mode
    (:meth:`Consumer.applying`): same name, file and uid; only ``accept``
    and ``accept_many`` differ.  ``applied`` counts the events it applied
    on arrival."""

    def __init__(self, consumer: Receiving) -> None:
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
        result = self.consumer._receive(body, self.consumer._rules)
        if result.applied:
            self.applied += 1
        return result

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        results = self.consumer._receive_many(bodies, self.consumer._rules)
        self.applied += sum(1 for r in results if r.applied)
        return results

    def __repr__(self) -> str:
        return f"{self.consumer!r}.applying()"
