"""The operator's side of a consumer (``consumer.admin``): the way past a
bad accepted event (skip or replace it), the effects an operator retries,
resolves, cancels or amends (after refused feedback), and retention.

Nothing here runs by itself: each action is asked for by a person and
recorded with who, when and why.  See docs/operations.md and
docs/effects.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from .. import _envelope as envelope
from .._checks import check_text
from .._core.admin import amend_in, effect_action_in
from .._core.operate import replace_in, skip_in
from .._core.schedules import schedule_action_in
from .._effects import EffectRegistry, check_json_value
from .._effects.feedstep import RemoteTarget, check_feedback
from .._observe import CONSUMER, operator_action
from .._producer import Producer
from .._retention import DEFAULT_PRUNE_BATCH, prune_older_than
from .._store import InboxStore
from ..errors import UnknownEffect
from ..protocol import Protocol as FlowProtocol
from ..records import EffectSchedule, OperatorAction, PruneResult

__all__ = ["ConsumerAdmin"]


class Owner(Protocol):
    """What the admin object reads of its consumer (public members only)."""

    protocol: FlowProtocol
    clock: Callable[[], float]
    effect_registry: EffectRegistry | None

    @property
    def name(self) -> str: ...

    @property
    def store(self) -> InboxStore: ...


class ConsumerAdmin:
    """A consumer's operator actions, as ``consumer.admin``: move a flow past
    an accepted event that cannot be applied (:meth:`skip_event`,
    :meth:`replace_event`), act on effects (:meth:`retry_effect`,
    :meth:`resolve_effect`, :meth:`cancel_effect`, :meth:`amend_effect`), recurring
    schedules (:meth:`pause_schedule`, :meth:`resume_schedule`,
    :meth:`remove_schedule`) and retention (:meth:`prune`).  Every action is recorded (:meth:`operator_actions`,
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
        """Record that the effect did take place (checked by hand), with its result.

        When the consumer was given the effect's registry (``effects=``) and
        the effect has ``feedback=``, the result is first built into its
        step: a ``Feedback`` function that raises, or a step that is not a
        valid envelope, raises :class:`NotResolvable` and nothing is
        recorded (``reliable-flow effect resolve --producer`` also checks it
        against the producer's protocol).  An effect whose failure step came
        home already then feeds its result too."""
        text = check_json_value("result", result)
        self._check(key, None, result=result)
        return self._effect_action("resolve", key, actor, reason, text)

    def cancel_effect(self, key: str, *, actor: str, reason: str) -> OperatorAction:
        """Decide that the effect will never run; recorded, never automatic.
        An effect with ``Feedback(on_failure=...)`` then feeds its failure
        step (once: not again if it came home already)."""
        return self._effect_action("cancel", key, actor, reason)

    def amend_effect(self, key: str, *, result: Any = None, failure: bool = False, actor: str, reason: str,
                     producer: Producer | RemoteTarget | None = None) -> OperatorAction:
        """The way out for an effect whose feedback was refused (its
        ``last_error`` begins ``feedback``): replace its result with
        ``result`` (it is ``succeeded``), or, with ``failure=True``, switch
        a succeeded one to its failure step (it is ``cancelled``, its reason
        naming the operator); the executor's next pass feeds the step, once.

        Checked before anything is recorded, as :meth:`resolve_effect`
        checks, and (given ``producer``, a sync ``Producer`` of the
        producer's store, used on this thread, or a ``RemoteProducer`` of
        one on another host) against the producer's protocol at the flow's
        current seq, nothing committed: a step that
        would be refused raises :class:`NotResolvable`.  Needs the effect's
        registry (``Consumer(..., effects=)``) with ``feedback=`` for its
        name.  Raises :class:`NotResolvable` for an effect whose feedback
        was not refused, and for ``failure`` on an effect that failed
        already (its failure step is what was refused); recorded as a
        ``resolve`` (result replaced) or ``cancel`` (failure step) whose
        reason begins ``amend:``."""
        if not isinstance(failure, bool):
            raise TypeError(f"failure must be a bool, got {failure!r}")
        text = check_json_value("result", result)
        check_text("key", key)
        actor, reason = check_text("actor", actor), check_text("reason", reason)
        registry = self._consumer.effect_registry
        effect = self._store.latest.effect(key)
        if effect is None:
            raise UnknownEffect(f"no effect with key {key!r} in {self._store.location}")
        spec = None if registry is None else registry.get(effect.name)
        if spec is None or spec.feedback is None:
            raise ValueError(f"effect {key!r}: amend needs its registry with feedback= for {effect.name!r} "
                             f"(Consumer(..., effects=...)), to build the step it feeds")
        self._check(key, producer, result=result, failure=failure, actor=actor, reason=reason)
        with self._store.write() as unit:
            record, before = amend_in(unit, key, actor, reason, self._consumer.clock(), self._store.location,
                                      None if failure else text, failure)
        operator_action(CONSUMER, record, self._consumer.name, key=key, event_id=before.event_id,
                        flow_id=before.flow_id, previous_state=str(before.state))
        return record

    def _check(self, key: str, producer: Producer | RemoteTarget | None, **would: Any) -> None:
        """:func:`~reliable_flow._effects.feedstep.check_feedback` of the effect
        with this key (an unknown key is left to the action to refuse)."""
        effect = self._store.latest.effect(check_text("key", key))
        if effect is not None:
            check_feedback(effect, self._consumer.effect_registry, producer, **would)

    def _effect_action(
        self, action: str, key: str, actor: str, reason: str, result: str | None = None
    ) -> OperatorAction:
        check_text("key", key)
        check_text("actor", actor)
        check_text("reason", reason)
        now = self._consumer.clock()
        registry = self._consumer.effect_registry
        with self._store.write() as unit:
            held = unit.effect(key)
            spec = None if registry is None or held is None else registry.get(held.name)
            record, effect = effect_action_in(unit, action, key, actor, reason, now, self._store.location, result,
                                              spec)
        operator_action(CONSUMER, record, self._consumer.name, key=key, event_id=effect.event_id,
                        flow_id=effect.flow_id, previous_state=str(effect.state))
        return record

    def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        """Recorded operator actions on effects (target ``effect``; for one key
        if given), oldest first."""
        return self._store.latest.effect_actions(key)

    # -- recurring schedules ----------------------------------------------------------

    def schedules(self) -> list[EffectSchedule]:
        """Every recurring schedule the store holds (``EffectRegistry.every``,
        recorded when an executor opened), by name: its next and last tick,
        whether it is paused, how many missed ticks it skipped."""
        return self._store.latest.schedules()

    def pause_schedule(self, name: str, *, actor: str, reason: str) -> OperatorAction:
        """Stop a schedule's ticks; recorded.  No tick is made while it is
        paused, and the ticks whose time passes meanwhile are never
        performed (paused, not missed).  Raises :class:`UnknownSchedule` for
        a name not stored and :class:`NotResolvable` if already paused."""
        return self._schedule_action("pause", name, actor, reason)

    def resume_schedule(self, name: str, *, actor: str, reason: str) -> OperatorAction:
        """Let a paused schedule tick again from its first tick after now;
        recorded.  :class:`NotResolvable` if it is not paused."""
        return self._schedule_action("resume", name, actor, reason)

    def remove_schedule(self, name: str, *, actor: str, reason: str) -> OperatorAction:
        """Delete a schedule from the store; recorded.  The effects its ticks
        made stay.  An executor whose registry still declares it records it
        again when it opens, with that definition: the way to change a
        schedule's definition (remove, then deploy the new one); to stop one
        the code still declares, pause it."""
        return self._schedule_action("remove", name, actor, reason)

    def schedule_actions(self, name: str | None = None) -> list[OperatorAction]:
        """Recorded pauses, resumes and removals (target ``schedule``; for one
        schedule if given), oldest first."""
        return self._store.latest.schedule_actions(name)

    def _schedule_action(self, action: str, name: str, actor: str, reason: str) -> OperatorAction:
        name, actor, reason = check_text("name", name), check_text("actor", actor), check_text("reason", reason)
        with self._store.write() as unit:
            record = schedule_action_in(unit, action, name, actor, reason, self._consumer.clock())
        operator_action(CONSUMER, record, self._consumer.name, schedule=name)
        return record

    # -- retention ------------------------------------------------------------------

    def prune(
        self, older_than: float, *, actor: str, reason: str, now: float | None = None,
        batch_size: int = DEFAULT_PRUNE_BATCH, limit: int | None = None, forget_after: float | None = None,
    ) -> PruneResult:
        """Remove inbox rows received more than ``older_than`` seconds before
        ``now`` (default: ``clock()``) that are applied, skipped, replaced or superseded,
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

        Recorded with ``actor`` and ``reason`` (non-blank) as an operator
        action of target ``retention`` (:meth:`retention_actions`), stamped
        with ``clock()``, in the same transaction as the first step: nothing
        is removed unrecorded.  Bad arguments raise ``ValueError`` /
        ``TypeError`` before anything is opened.
        """
        at = self._consumer.clock()
        result, record = prune_older_than(
            self._store.write, older_than, at if now is None else now, batch_size, limit, forget_after,
            actor=actor, reason=reason, at=at,
        )
        operator_action(CONSUMER, record, self._consumer.name, horizon=record.horizon, events=result.events)
        return replace(result, action=record)

    def retention_actions(self) -> list[OperatorAction]:
        """Every recorded prune of this store, oldest first: target
        ``retention``, with its ``horizon`` and ``forget_before``."""
        return self._store.latest.retention_actions()

    def __repr__(self) -> str:
        return f"{self._consumer!r}.admin"
