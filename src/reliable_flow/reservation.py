"""The seed's reservation protocol (SPEC section 3).

new -> reserved -> confirmed -> released, one step at a time.  Schema 1
carries ``{"amount": n}``, schema 2 ``{"units": n}``; ``reserved`` fixes n
and every later step must carry the same n.  The consumer shows ``held``:
n while reserved or confirmed, 0 once released.  Producers accept schemas
1 and 2; consumers decode only 1 unless opened with ``schemas={1, 2}``.
"""

from __future__ import annotations

from typing import Any

from .protocol import PayloadError, Protocol, exact, integer

__all__ = ["RESERVATION"]

_N = integer(1, 1_000_000)


def _step(state: str, kind: str, value: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    if kind != "reserved" and value["amount"] != data["amount"]:
        raise PayloadError("amount", f"must stay {data['amount']} as reserved, got {value['amount']}")
    return {"amount": value["amount"]}


def _project(state: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"held": data["amount"] if state in ("reserved", "confirmed") else 0}


RESERVATION = Protocol(
    name="reservation",
    initial="new",
    transitions={"new": ["reserved"], "reserved": ["confirmed"], "confirmed": ["released"]},
    schemas={
        1: exact({"amount": _N}),
        2: exact({"units": _N}, rename={"units": "amount"}),
    },
    step=_step,
    project=_project,
    consumer_schemas={1},
)
