"""The operator's side of a consumer (``consumer.admin``): the way past a
bad accepted event (skip or replace it), the effects an operator retries,
resolves or cancels, and retention.

Nothing here runs by itself: each action is asked for by a person and
recorded with who, when and why.  See docs/operations.md and
docs/effects.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .. import _envelope as envelope
from .._checks import check_text
from .._core.admin import effect_action_in
from .._core.operate import replace_in, skip_in
from .._effects import check_json_value
from .._observe import CONSUMER, operator_action
from .._retention import DEFAULT_PRUNE_BATCH, prune_older_than
from .._store import InboxStore
from ..protocol import Protocol as FlowProtocol
from ..records import OperatorAction, PruneResult

__all__ = ["ConsumerAdmin"]


class Owner(Protocol):
    """What the admin object reads of its consumer (public members only)."""

    protocol: FlowProtocol
    clock: Callable[[], float]

    @property
    def name(self) -> str: ...

    @property
    def store(self) -> InboxStore: ...


class ConsumerAdmin:
    """A consumer's operator actions, as ``consumer.admin``: move a flow past
    an accepted event that cannot be applied (:meth:`skip_event`,
    :meth:`replace_event`), act on effects (:meth:`retry_effect`,
    :meth:`resolve_effect`, :meth:`cancel_effect`) and retention
    (:meth:`prune`).  Every action is recorded (:meth:`operator_actions`,
    :meth:`effect_actions`), stamped with the consumer's ``clock``; none is
    ever taken automatically.  What to look at first: ``consumer.stuck``,
    ``consumer.event``, ``consumer.scheduled_effects``."""

    def __init__(self, consumer: Owner) -> None:
        self._consumer = consumer

    @property
    def _store(self) -> InboxStore:
        return self._consumer.store

    # -- accepted events --------------------------------------------------------------

    def skip_event(self, event_id: str, *, actor: str, reason: str) -> OperatorAction:
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
        with self._store.write() as unit:
            return skip_in(unit, self._consumer.protocol, event_id, actor, reason, self._consumer.clock(),
                           self._store.location)

    def replace_event(
        self, event_id: str, corrected_envelope: dict[str, Any] | str | bytes, *, actor: str, reason: str
    ) -> OperatorAction:
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
        with self._store.write() as unit:
            return replace_in(unit, event_id, corrected, actor, reason, self._consumer.clock(), self._store.location)

    def operator_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        """Every recorded skip and replacement (target ``inbox``), oldest
        first; with ``event_id``, those of that event or naming it as the
        replacement."""
        return self._store.latest.inbox_actions(event_id)

    # -- effects ----------------------------------------------------------------------

    def retry_effect(self, key: str, *, actor: str, reason: str) -> OperatorAction:
        """Run a dead or unknown effect again, with the same key, now, with a
        fresh ``max_attempts`` budget (``attempts`` starts again from 0; the
        retry itself is recorded in ``effect_actions``).

        For an ``unknown`` effect only after checking by hand that it did
        not happen: this is the one way an effect in doubt is re-run blindly.
        """
        return self._effect_action("retry", key, actor, reason)

    def resolve_effect(self, key: str, *, result: Any = None, actor: str, reason: str) -> OperatorAction:
        """Record that the effect did take place (checked by hand), with its result."""
        return self._effect_action("resolve", key, actor, reason, check_json_value("result", result))

    def cancel_effect(self, key: str, *, actor: str, reason: str) -> OperatorAction:
        """Decide that the effect will never run; recorded, never automatic."""
        return self._effect_action("cancel", key, actor, reason)

    def _effect_action(
        self, action: str, key: str, actor: str, reason: str, result: str | None = None
    ) -> OperatorAction:
        check_text("key", key)
        check_text("actor", actor)
        check_text("reason", reason)
        now = self._consumer.clock()
        with self._store.write() as unit:
            record, effect = effect_action_in(unit, action, key, actor, reason, now, self._store.location, result)
        operator_action(CONSUMER, record, self._consumer.name, key=key, event_id=effect.event_id,
                        flow_id=effect.flow_id, previous_state=str(effect.state))
        return record

    def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        """Recorded operator actions on effects (target ``effect``; for one key
        if given), oldest first."""
        return self._store.latest.effect_actions(key)

    # -- retention ------------------------------------------------------------------

    def prune(
        self, older_than: float, *, now: float | None = None, batch_size: int = DEFAULT_PRUNE_BATCH,
        limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Remove inbox rows received more than ``older_than`` seconds before
        ``now`` (default: ``clock()``) that are applied, skipped or replaced,
        with their effect records, and finished effect-outbox rows
        (succeeded, expired, superseded, cancelled; fed when feedback was
        asked) last written before then.

        Each removed row leaves a tombstone (id, flow, seq, SHA-256 of the
        body), so re-sending the event still answers ``duplicate`` (same
        body) or ``id_conflict``, and a new event for its slot
        ``sequence_conflict``; a pruned event is never applied again.
        ``forget_after`` (seconds, >= ``older_than``; default never) removes
        tombstones pruned longer ago, so the file stops growing: a re-sent
        event whose tombstone is forgotten is answered ``sequence_conflict``
        (its slot is at or before the flow's last applied seq), never stored
        or applied again.  Never removes a pending or blocked row, a projection, or an
        effect not yet finished.  Works in transactions of at most
        ``batch_size`` rows, up to ``limit`` rows in all (None: until
        done); each transaction is recorded.
        """
        return prune_older_than(
            self._store.write, older_than, self._consumer.clock() if now is None else now, batch_size, limit,
            forget_after,
        )

    def __repr__(self) -> str:
        return f"{self._consumer!r}.admin"
