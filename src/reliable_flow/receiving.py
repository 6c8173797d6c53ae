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
from .errors import InboxFull
from .observe import CONSUMER, INFO, Note, Observer
from .receiver import Answer
from .statuses import ReceiveResult, ReceiveStatus, Refused
from .store import InboxStore
from .tracing import traced

__all__ = ["Applying", "Receiving"]


def _accept(call: Callable[[], ReceiveResult]) -> Answer:
    try:
        return call()
    except InboxFull as exc:
        return Refused(str(exc))


def _refused_as_answers(results: list[ReceiveResult | None]) -> list[Answer]:
    return [Refused("inbox full (max_inbox)") if r is None else r for r in results]


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
        full inbox (``max_inbox``) raises ``InboxFull``.  In the
        receive-and-apply mode ``applied=True`` says the same commit also
        applied the event.
        """
        return self._receive(envelope_in, self._on_arrival)

    def _receive(self, envelope_in: dict[str, Any] | str | bytes, arrival: ApplyRules | None) -> ReceiveResult:
        env = envelope.parse(envelope_in)
        notes = self._arrival_notes(arrival)

        def once() -> ReceiveResult:
            if notes:
                notes.clear()  # of a run the engine aborted
            with self.store.write() as unit:
                return receive_in(unit, env, self.max_inbox, self.store.location, self.clock(), arrival, notes)

        result = rerun_on_conflict(once)
        if result.status == ReceiveStatus.ACCEPTED:
            crash_point("receive.after_commit")
            if result.applied:
                self._applied_on_arrival(1, notes)
        if result.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO):
            self._observed.received(self._name, env.meta, result)
        return result

    @staticmethod
    def _arrival_notes(arrival: ApplyRules | None) -> list[Note] | None:
        """Where the receive-and-apply mode puts its log records until the commit."""
        return [] if arrival is not None and CONSUMER.isEnabledFor(INFO) else None

    def _applied_on_arrival(self, count: int, notes: list[Note] | None) -> None:
        crash_point("receive_apply.after_commit")
        self._observed.applied += count
        self._observed.emit(notes)

    def receive_many(
        self, envelopes: Sequence[dict[str, Any] | str | bytes]
    ) -> list[ReceiveResult | None]:
        """Receive several events in one transaction; one entry per event, in order.

        Same checks and statuses as :meth:`receive`.  Every envelope is
        validated before anything is stored: one malformed envelope raises
        ``InvalidEnvelope`` and stores none.  An event that a full inbox
        (``max_inbox``) refuses gets ``None`` and is not stored; the others
        are still examined, exactly as separate ``receive`` calls would be
        (so a flow's next step still gets in).
        """
        return self._receive_many(envelopes, self._on_arrival)

    def _receive_many(
        self, envelopes: Sequence[dict[str, Any] | str | bytes], arrival: ApplyRules | None
    ) -> list[ReceiveResult | None]:
        parsed = [envelope.parse(e) for e in envelopes]
        notes = self._arrival_notes(arrival)

        def once() -> list[ReceiveResult | None]:
            if notes:
                notes.clear()  # of a run the engine aborted
            answers: list[ReceiveResult | None] = []
            with self.store.write() as unit:
                now = self.clock()
                for env in parsed:
                    try:
                        answers.append(receive_in(unit, env, self.max_inbox, self.store.location, now, arrival, notes))
                    except InboxFull:
                        answers.append(None)
            return answers

        results = rerun_on_conflict(once)
        if any(r is not None and r.status == ReceiveStatus.ACCEPTED for r in results):
            crash_point("receive.after_commit")
            applied = sum(1 for r in results if r is not None and r.applied)
            if applied:
                self._applied_on_arrival(applied, notes)
        for env, r in zip(parsed, results):
            if r is not None and (r.status is not ReceiveStatus.ACCEPTED or CONSUMER.isEnabledFor(INFO)):
                self._observed.received(self._name, env.meta, r)
        return results

    # -- as a Receiver (what relay() calls) -------------------------------------------

    def accept(self, body: str) -> Answer:
        """:meth:`receive`, with a full inbox answered as :class:`Refused`."""
        return _accept(lambda: self.receive(body))

    def accept_many(self, bodies: Sequence[str]) -> list[Answer]:
        """:meth:`receive_many`, with each event a full inbox turned away answered as :class:`Refused`."""
        return _refused_as_answers(self.receive_many(bodies))

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

    def accept(self, body: str) -> Answer:
        consumer = self.consumer
        answer = _accept(lambda: consumer._receive(body, consumer._rules))
        if isinstance(answer, ReceiveResult) and answer.applied:
            self.applied += 1
        return answer

    def accept_many(self, bodies: Sequence[str]) -> list[Answer]:
        results = self.consumer._receive_many(bodies, self.consumer._rules)
        self.applied += sum(1 for r in results if r is not None and r.applied)
        return _refused_as_answers(results)

    def __repr__(self) -> str:
        return f"{self.consumer!r}.applying()"
