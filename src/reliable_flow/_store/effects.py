"""What the effect outbox asks of the consumer's storage.

The effect outbox lives in the consumer's store, because an apply handler
schedules effects in the apply transaction: an effect is written if and only
if its event is applied.  These methods are part of the consumer side's
units and reads (:class:`~reliable_flow._store.inbox.InboxUnit`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from ..records import EffectTransition, OperatorAction, ScheduledEffect
from ..statuses import EffectState

__all__ = ["EFFECT_COLUMNS", "EffectReads", "EffectUnit", "NewEffect"]

#: The columns a unit of work may change on an effect, and nothing else.
EFFECT_COLUMNS = frozenset({
    "state", "attempts", "failures", "due_at", "lease_owner", "last_error", "result", "reason", "fed",
})


@dataclass(frozen=True, slots=True)
class NewEffect:
    """An effect as an apply handler schedules it (JSON already canonical)."""

    key: str
    name: str
    payload: str
    event_id: str
    flow_id: str
    seq: int
    meta: str
    ordered: bool
    deadline: float | None
    version: int | None
    fed: bool | None
    created_at: float
    #: When it may first be taken up (``ctx.schedule(after=, at=)``); None: at once.
    due_at: float | None = None


class EffectReads(Protocol):
    """Reads of the effect outbox."""

    def effect(self, key: str) -> ScheduledEffect | None:
        """The effect with this idempotency key, or None."""

    def effect_list(
        self, state: EffectState | None = None, flow_id: str | None = None, limit: int | None = None, *,
        name: str | None = None, after: str | None = None,
    ) -> list[ScheduledEffect]:
        """Effects in scheduling order, filtered by state, flow and name, at
        most ``limit``; with ``after`` (a key), those scheduled after that
        effect (none if no effect has that key): a keyset page, which stays
        put while effects are added.  Each filter, alone or state and name
        together, reads an index in scheduling order."""

    def effect_counts(self, cap: int | None = None) -> dict[str, int]:
        """How many effects are in each state (states with none are left
        out); with ``cap``, each counted up to ``cap`` (``cap``: at least)."""

    def attention_effects(self, now: float, unfed_before: float, limit: int) -> list[ScheduledEffect]:
        """In scheduling order, up to ``limit`` effects that may need a person:
        dead, unknown, in doubt, running with the lease ended at ``now``,
        and those owing a step to the producer (``fed`` false) written at
        or before ``unfed_before`` or whose feeding was refused.  Each kind
        is read from an index, at most ``limit`` of it."""

    def effect_timers(self, now: float) -> dict[str, tuple[int, float]]:
        """Per name (names with none left out): how many ``pending`` effects
        are not due before a later time than ``now`` (delayed, backing off or
        rate limited), and the earliest of their due times."""

    def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        """Recorded operator actions on effects (target ``effect``; for one key
        if given), in order."""

    def effect_history(self, key: str) -> list[EffectTransition]:
        """Every recorded transition of the effect with this key, in the order
        written (empty for an unknown key, or once the effect was pruned)."""

    def effect_starts(self, name: str, since: float) -> tuple[int, float | None, float | None]:
        """How many calls of effects named ``name`` started (``claimed``
        transitions) after ``since``, when the first of them did and when the
        last did (both None when none did)."""

    def held_effect_counts(self, names: Collection[str], now: float) -> dict[str, int]:
        """Per name (of ``names``; names with none left out): effects held
        by an executor at ``now``: ``running`` or ``in_doubt`` with a
        ``lease_owner`` whose lease (``due_at``) has not run out."""

    def unfed_effects(self, limit: int, now: float) -> list[ScheduledEffect]:
        """Effects that still owe a step to their producer, oldest first:
        succeeded ones their result, ``dead``, ``cancelled``, ``expired`` and
        ``superseded`` ones their failure step, and ``unknown`` ones theirs
        once due (``due_at`` <= ``now``)."""

    def next_effect_due_at(self, names: Collection[str]) -> float | None:
        """The earliest ``due_at`` among effects of these ``names`` that an
        executor will take up without an operator: ``pending``, ``running``
        (its lease ends then) or ``in_doubt``; an ordered effect waiting behind
        an earlier unresolved ordered effect of its flow does not count (the
        earlier one's own time does, or it waits for an operator).  None
        when there is no such effect."""


class EffectUnit(EffectReads, Protocol):
    """Writes of the effect outbox, inside a consumer-side unit of work."""

    @property
    def engine(self) -> str:
        """Which engine runs the application's SQL: ``"sqlite"`` or ``"postgres"``."""

    def add_effect(self, new: NewEffect) -> ScheduledEffect | None:
        """Store a pending effect due at once; if its key is taken, store
        nothing and return the effect that holds it."""

    def due_effects(self, now: float, names: Collection[str], limit: int) -> list[ScheduledEffect]:
        """Effects an executor may take up now, oldest due first: ``pending``
        or ``in_doubt`` ones due at ``now``, and ``running`` ones whose lease
        ended; only these ``names``; never an ordered effect while an earlier
        ordered effect of its flow is unresolved (pending, running, in doubt,
        dead or unknown)."""

    def update_effect(self, key: str, changes: Mapping[str, Any], now: float) -> None:
        """Set these columns (a subset of :data:`EFFECT_COLUMNS`; ``result``
        as canonical JSON text) and ``updated_at``."""

    def add_transitions(self, rows: Sequence[EffectTransition]) -> None:
        """Append these rows to the effect history, in order."""

    def lock_effect_names(self, names: Collection[str]) -> None:
        """Until the unit ends, be the only unit claiming effects of these
        names (so a cap or rate limit is counted and used by one claimer at
        a time); other claimers of the same names wait."""

    def record_action(self, action: OperatorAction) -> None:
        """Append an operator action to its record, by its target: a skip or
        a replacement (``inbox``), a retry, resolve or cancel (``effect``),
        a prune (``retention``); any other target raises ``ValueError``."""

    def last_seq(self, flow_id: str) -> int:
        """The flow's last applied seq (0 before any)."""

    def user_execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement of the application's own SQL in this unit; its rows."""

    def app_version(self, name: str) -> int:
        """The version of the application's own tables named ``name`` (0 if never created)."""

    def set_app_version(self, name: str, version: int) -> None:
        """Record that the application's tables ``name`` are at ``version``."""

    def step(self) -> AbstractContextManager[None]:
        """A nested step: its writes vanish if it raises; the rest stays."""
