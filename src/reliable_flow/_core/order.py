"""Each consumer's own order (issue 32, item 5): ``strict``, ``latest`` or
``any``, decided here on the consumer's unit of work.

- ``strict`` (the default): a flow's events apply in the flow's order, each
  once; a missing one is a gap (``_core/apply.py``, unchanged).
The apply step of a ``latest`` or ``any`` consumer is
``_core.apply.unordered_apply_in``, with these rules.

- ``latest``: an event applies only when its seq is newer than the flow's
  projection (``last_seq``), as a snapshot of the producer's state at that
  seq: the steps between are not needed, so the protocol's transition
  check is not made (its schema and payload rules are).  Among the rows
  waiting, the newest applies; the older ones, and any later arrival at or
  below ``last_seq``, are set aside as ``superseded`` ("superseded by seq
  N"), never applied, never waited for.  No gaps.
- ``any``: each event applies once, on arrival, in any order (the handler's
  work must be commutative); ``last_seq`` is the highest seq applied, the
  projection's state that event's kind, and its data every applied step
  folded in, in arrival order.  No gaps; deduplication and the body
  comparison are receive's, as in ``strict``.

A blocked row (unknown schema, payload rules, a handler's payload error)
waits for an operator in every mode; an ``any`` consumer's other rows of
the flow apply meanwhile, and a ``latest`` consumer's flow moves on when a
newer event arrives (the blocked one is then superseded).
"""

from __future__ import annotations

from typing import Any

from .._envelope import Envelope
from .._store import FlowState, InboxUnit
from ..errors import WrongFile
from ..protocol import PayloadError, Protocol, Rejected
from ..statuses import BlockReason

__all__ = [
    "ANY", "LATEST", "ORDERS", "ORDER_META", "STRICT", "after", "applies_on_arrival", "check_order", "held_order_in",
    "late_arrival_in", "superseded_detail", "unordered_data",
]

STRICT, LATEST, ANY = "strict", "latest", "any"
ORDERS = (STRICT, LATEST, ANY)
#: The inbox's meta key holding its consumer's order.
ORDER_META = "order"


def check_order(order: object) -> str:
    """``order`` when it is one of :data:`ORDERS`, else a ValueError naming it."""
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(repr(o) for o in ORDERS)}; got {order!r}")
    return order


def held_order_in(unit: InboxUnit, order: str, location: str) -> str:
    """Record ``order`` as the inbox's unless one is held already; a store
    holding another order is refused,
    naming both (``WrongFile``): a reopen never changes a consumer's order."""
    held = unit.add_meta(ORDER_META, order)
    if held != order:
        raise WrongFile(
            f"{location} is the inbox of an order={held!r} consumer; it cannot be opened with "
            f"order={order!r} (a consumer's order is fixed when its inbox is first opened); nothing was changed"
        )
    return held


def superseded_detail(seq: int) -> str:
    """A superseded row's detail: the seq that made it so."""
    return f"superseded by seq {seq}"


def applies_on_arrival(order: str, env: Envelope, last: int) -> bool:
    """Whether the event just stored may apply in the receive transaction,
    the flow's last applied seq being ``last``."""
    if order == ANY:
        return True
    if order == LATEST:
        return env.seq > last
    return env.previous <= last < env.seq


def late_arrival_in(unit: InboxUnit, env: Envelope, last: int, now: float | None) -> bool:
    """A ``latest`` consumer's event new to the inbox whose seq is at or
    before the flow's last applied seq ``last``: stored superseded by
    ``last`` (True); a newer one is left to the caller (False)."""
    if env.seq > last:
        return False
    unit.insert(env, now)
    unit.supersede(env.flow_id, last + 1, superseded_detail(last))
    return True


def unordered_data(protocol: Protocol, known: FlowState, kind: str, schema: int,
                   payload: Any) -> dict[str, Any]:
    """The flow's data after a step applied out of the flow's order: the
    schema and the payload rules as :meth:`Protocol.next_data`, without its
    transition check (the steps between are not seen)."""
    decoder = protocol.schemas.get(schema)
    if decoder is None:
        raise Rejected(BlockReason.INVALID_PAYLOAD,
                       f"schema {schema} is not defined by protocol {protocol.name!r} (known: {sorted(protocol.schemas)})")
    try:
        new = protocol.step(known.state, kind, decoder(kind, payload), known.data)
    except PayloadError as exc:
        raise Rejected(BlockReason.INVALID_PAYLOAD, str(exc)) from None
    protocol.view(kind, new)  # the library's own keys refused, as in order
    return new


def after(order: str, known: FlowState, seq: int, kind: str, new_data: dict[str, Any]) -> FlowState:
    """The projection after applying ``seq``: a ``latest`` consumer's is that
    event's state; an ``any`` consumer's keeps the newest state and seq
    applied, with every applied step's data."""
    if order == ANY and seq < known.seq:
        return FlowState(known.state, known.seq, new_data)
    return FlowState(kind, seq, new_data)
