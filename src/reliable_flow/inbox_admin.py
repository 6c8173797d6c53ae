"""Why a consumer's flow is stuck, and the operator's way past a bad accepted
event (``Consumer``'s operator methods): never automatic, every action
recorded with who, when and why."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from . import envelope
from .checks import check_text
from .core.operate import replace_in, skip_in, why_waiting
from .operations import InboxAction, StuckFlow
from .protocol import Protocol
from .store import InboxStore

__all__ = ["InboxAdmin"]



class InboxAdmin:
    """A consumer's inbox, for the operator."""

    protocol: Protocol
    #: Seconds since the epoch; stamps rows and actions (the consumer's clock).
    clock: Callable[[], float] = time.time

    @property
    def store(self) -> InboxStore:
        raise NotImplementedError

    def stuck(self, flow_id: str) -> StuckFlow:
        """What ``flow_id`` waits for, from one snapshot: its next seq, whether
        that step is ``ready``, ``blocked`` (with the reason and the stored
        detail), missing (a ``gap``) or there is nothing to do (``idle``),
        since when, and the flow's inbox rows from its next seq on."""
        flow_id = envelope.check_name("flow_id", flow_id)
        with self.store.read() as reads:
            return why_waiting(reads, flow_id)

    def event(self, event_id: str) -> dict[str, Any] | None:
        """The stored envelope of one inbox event (in any state), or None.

        A dict, because it is the envelope exactly as it arrived."""
        body = self.store.latest.body_of(check_text("event_id", event_id))
        return None if body is None else dict(json.loads(body))

    def skip_event(self, event_id: str, *, actor: str, reason: str) -> InboxAction:
        """Move the flow past an accepted event that cannot be applied; recorded.

        Only the flow's next step (seq ``last_seq + 1``), pending or blocked:
        the projection's ``last_seq`` becomes its seq with state and data
        unchanged, no handler runs and no effect is recorded; the row ends
        ``skipped`` and the flow applies its following steps.  A business
        decision ("this step may be left out"): never automatic.  Raises
        :class:`UnknownEvent` if the event is not in the inbox and
        :class:`NotResolvable` if it is not a waiting next step.
        """
        event_id, actor, reason = check_text("event_id", event_id), check_text("actor", actor), check_text("reason", reason)
        with self.store.write() as unit:
            return skip_in(unit, self.protocol, event_id, actor, reason, self.clock(), self.store.location)

    def replace_event(
        self, event_id: str, corrected_envelope: dict[str, Any] | str | bytes, *, actor: str, reason: str
    ) -> InboxAction:
        """Put a corrected event, re-issued by the producer's team, in place of
        a pending or blocked accepted one; recorded.

        ``corrected_envelope`` has the same flow and seq and a new event id;
        it is checked like any received envelope and stored pending, to be
        applied in order as usual.  The old row is kept, ``replaced`` (a
        relay of the old event still answers ``duplicate``).  Raises
        :class:`InvalidEnvelope` for a malformed or mismatched replacement,
        :class:`UnknownEvent` / :class:`NotResolvable` as :meth:`skip_event`.
        """
        event_id, actor, reason = check_text("event_id", event_id), check_text("actor", actor), check_text("reason", reason)
        corrected = envelope.parse(corrected_envelope)
        with self.store.write() as unit:
            return replace_in(unit, event_id, corrected, actor, reason, self.clock(), self.store.location)

    def operator_actions(self, event_id: str | None = None) -> list[InboxAction]:
        """Every recorded skip and replacement, oldest first; with ``event_id``,
        those of that event or naming it as the replacement."""
        return self.store.latest.inbox_actions(event_id)
