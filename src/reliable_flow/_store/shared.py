"""What every engine computes the same way, whatever its SQL: a store's
identity check, an event's summary delivery state, and the checked values
of an effect update.  Engines import these instead of keeping copies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records import DeliveryRecord
from ..statuses import DeliveryState, EffectState
from .effects import EFFECT_COLUMNS

__all__ = ["delivery_summary", "effect_changes", "identity_problem"]


def identity_problem(meta: Mapping[str, str], protocol: str | None, name: str | None = None) -> str | None:
    """Why an existing store does not match what it is opened as (another
    protocol; for a consumer, another name), or None.  ``None`` for either
    argument accepts any."""
    if protocol is not None and meta.get("protocol") != protocol:
        return f"was created for protocol {meta.get('protocol')!r}, not {protocol!r}"
    if name is not None and meta.get("name") != name:
        return f"belongs to consumer {meta.get('name')!r}, not {name!r}"
    return None


def delivery_summary(chosen: Mapping[str, DeliveryRecord]) -> DeliveryState:
    """All chosen consumers together: set aside if any set it aside, accepted
    only if every one accepted, skipped if the rest were skipped."""
    states = {d.state for d in chosen.values()}
    if DeliveryState.SET_ASIDE in states:
        return DeliveryState.SET_ASIDE
    if chosen and states == {DeliveryState.ACCEPTED}:
        return DeliveryState.ACCEPTED
    if chosen and states <= {DeliveryState.ACCEPTED, DeliveryState.SKIPPED}:
        return DeliveryState.SKIPPED
    return DeliveryState.PENDING


def effect_changes(changes: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    """The columns (sorted) and stored values of an effect update; a column
    that may not change raises ``ValueError``, an unknown state too."""
    unknown = set(changes) - EFFECT_COLUMNS
    if unknown:
        raise ValueError(f"not an effect column that may change: {sorted(unknown)}")
    columns = sorted(changes)
    values = [
        EffectState(changes[c]).value if c == "state"
        else (None if changes[c] is None else int(changes[c])) if c == "fed"
        else changes[c]
        for c in columns
    ]
    return columns, values
