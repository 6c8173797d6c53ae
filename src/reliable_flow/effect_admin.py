"""Reading the effect outbox and acting on it as an operator (``Consumer``'s
effect methods): every action recorded with who, when and why."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .checks import check_text
from .core.admin import effect_action_in
from .core.effects import with_waits
from .effects import check_json_value
from .observe import CONSUMER, operator_action
from .statuses import Effect, EffectAction, EffectState
from .store import InboxStore

__all__ = ["EffectAdmin"]


class EffectAdmin:
    """The effect outbox of a consumer's store, for reading and for operators."""

    #: Seconds since the epoch; stamps operator actions (the consumer's clock).
    clock: Callable[[], float] = time.time

    @property
    def store(self) -> InboxStore:
        raise NotImplementedError

    def effect(self, key: str) -> Effect | None:
        """The effect with this idempotency key, or None (``waiting_behind``
        says which earlier ordered effect of its flow it waits for, if any)."""
        reads = self.store.latest
        found = reads.effect(key)
        return None if found is None else with_waits(reads, [found])[0]

    def effect_outbox(
        self, *, state: EffectState | str | None = None, flow_id: str | None = None, limit: int | None = None
    ) -> list[Effect]:
        """Effects in the order they were scheduled, optionally only one state / flow."""
        chosen = None if state is None else EffectState(state)
        reads = self.store.latest
        return with_waits(reads, reads.effect_list(chosen, flow_id, limit))

    def effect_counts(self) -> dict[str, int]:
        """How many effects are in each state; every state is listed (0 if none)."""
        counts = self.store.latest.effect_counts()
        return {s.value: counts.get(s.value, 0) for s in EffectState}

    def effect_actions(self, key: str | None = None) -> list[EffectAction]:
        """Recorded operator actions on effects (for one key if given), oldest first."""
        return self.store.latest.effect_actions(key)

    def retry_effect(self, key: str, *, actor: str, reason: str) -> EffectAction:
        """Run a dead or unknown effect again, with the same key, now, with a
        fresh ``max_attempts`` budget (``attempts`` starts again from 0; the
        retry itself is recorded in ``effect_actions``).

        For an ``unknown`` effect only after checking by hand that it did
        not happen: this is the one way an effect in doubt is re-run blindly.
        """
        return self._act("retry", key, actor, reason)

    def resolve_effect(self, key: str, *, result: Any = None, actor: str, reason: str) -> EffectAction:
        """Record that the effect did take place (checked by hand), with its result."""
        return self._act("resolve", key, actor, reason, check_json_value("result", result))

    def cancel_effect(self, key: str, *, actor: str, reason: str) -> EffectAction:
        """Decide that the effect will never run; recorded, never automatic."""
        return self._act("cancel", key, actor, reason)

    def _act(self, action: str, key: str, actor: str, reason: str, result: str | None = None) -> EffectAction:
        check_text("key", key)
        check_text("actor", actor)
        check_text("reason", reason)
        now = self.clock()
        with self.store.write() as unit:
            record, effect = effect_action_in(unit, action, key, actor, reason, now, self.store.location, result)
        operator_action(CONSUMER, record, getattr(self, "name", None), key=key, event_id=effect.event_id,
                        flow_id=effect.flow_id, previous_state=str(effect.state))
        return record
