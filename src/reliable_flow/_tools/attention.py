"""What needs a person, read from indexes and bounded: the one list that
``inspect`` and the console both show, so they give the same items in the
same order (issue 31, item 5).

No read here walks every flow, delivery or effect: the flows that may need
attention come from the index of rows still waiting, the set-aside
deliveries from theirs, the effects from the index of each state (and of
the unfed ones); each is read at most ``limit`` (plus one) at a time, and a
list cut short says so (``more``).
"""

from __future__ import annotations

from typing import Any

from .._core.operate import why_waiting
from .._core.owed import unfed_too_long
from .._store import InboxReads, OutboxReads
from ..records import ScheduledEffect
from .drilldown import consumer_attention, effect_item, set_aside_attention

__all__ = ["EVERY", "attention_items", "unfed_item"]

#: ``limit`` for every item (``inspect``): larger than any store holds.
EVERY = 2**62

# The flows read from the index per round, and how many flows a bounded list
# examines at most per item asked for (a flow read as a candidate may turn
# out not to need attention: ready or at a gap, but not for long enough).
_PAGE = 500
_EXAMINED_PER_ITEM = 20

# Candidates are read with a second to spare, so a float rounded the other
# way at the boundary never drops one; the core's tests then decide exactly.
_SPARE = 1.0


def attention_items(p: OutboxReads, c: InboxReads, now: float, stuck_after: float,
                    limit: int = EVERY) -> tuple[list[dict[str, Any]], bool]:
    """The consumer's and the producer's items, in ``inspect``'s order: flows
    blocked, or ready / at a gap for ``stuck_after`` seconds (by flow id);
    set-aside deliveries (by consumer, then commit order); effects waiting
    for a person (scheduling order); effects whose step is not fed too long
    (scheduling order).  At most ``limit``, and whether the list was cut
    (there may be more than shown)."""
    want = limit if limit >= EVERY else limit + 1  # one more than shown tells whether there are more
    name = c.meta().get("name")
    items: list[dict[str, Any]] = []
    more = _flow_items(c, name, now, stuck_after, want, items)
    if len(items) < want:
        items += [set_aside_attention(s.consumer, s.flow_id, s.seq, s.event_id, s.last_status)
                  for s in p.set_aside(want - len(items))]
    if len(items) < want:
        effects = c.attention_effects(now, now - stuck_after + _SPARE, want)
        more = more or len(effects) >= want
        items += [item for e in effects if (item := effect_item(name, e, now)) is not None]
        items += [unfed_item(name, e) for e in effects if unfed_too_long(e, now, stuck_after)]
    return items[:limit], more or len(items) > limit


def _flow_items(c: InboxReads, name: str | None, now: float, stuck_after: float, want: int,
                items: list[dict[str, Any]]) -> bool:
    """Append the flows' items (up to ``want``); True if it stopped at the
    bound on flows examined with more candidates left."""
    examined, after = 0, ""  # every flow id is longer than "": all come after it
    budget = EVERY if want >= EVERY else max(_PAGE, want * _EXAMINED_PER_ITEM)
    while len(items) < want:
        page = min(_PAGE, budget - examined)
        if page <= 0:
            return True
        flows = c.waiting_flows(now - stuck_after + _SPARE, after, page)
        for flow in flows:
            item = consumer_attention(name, why_waiting(c, flow), now, stuck_after)
            if item is not None:
                items.append(item)
        examined += len(flows)
        if len(flows) < page:
            return False
        after = flows[-1]
    return False


def unfed_item(name: str | None, e: ScheduledEffect) -> dict[str, Any]:
    """A finished effect whose step the producer still waits for, too long."""
    return {"kind": "result_not_fed", "consumer": name, "flow_id": e.flow_id, "seq": e.seq,
            "event_id": e.event_id, "since": e.updated_at, "reason": None, "effect_key": e.key,
            "detail": f"effect {e.name!r} ended {e.state.value}; its step is not fed into the producer: is an "
                      "executor with producer= running for this consumer?"}
