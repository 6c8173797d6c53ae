"""The console's showcase: one small producer and consumer with something on
every page.  tests/test_console_browser.py loads every page of it in
chromium, and docs/console/screenshots.py photographs the same pages for
docs/console.md, so the pictures show what the tests check.

Standard library and reliable_flow only: the screenshot script imports it
with nothing of the test suite around it.
"""

from __future__ import annotations

from typing import Any

from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    PermanentFailure,
    Producer,
    relay,
)
from reliable_flow.reservation import RESERVATION

APPLIED = "order-17"  # reserved, confirmed, released: every event applied
GAP = "order-18"  # seq 2 never relayed: the consumer waits for it
BLOCKED = "order-19"  # seq 2 has schema 2, which the consumer does not decode
DEAD = f"default:{APPLIED}-1:notify"  # the dead effect, retried once by an operator
ACTOR, REASON = "alice", "INC-42: the mail relay is back"
EVENTS, FLOWS = 8, 3  # what the overview counts
ATTENTION = 2  # the blocked flow and the dead effect


def build(producer_at: str, consumer_at: str) -> None:
    """Write the showcase into two new stores (a SQLite file or a
    ``postgresql://...#schema`` location each): :data:`APPLIED` applied with
    its ``notify`` effect dead after an operator's retry (two attempts in its
    history, the action in the log), the other two ``notify`` effects done,
    :data:`GAP` waiting for seq 2, :data:`BLOCKED` blocked on schema 2."""
    effects = EffectRegistry()

    def notify(call: EffectCall) -> dict[str, Any]:
        if call.payload["flow"] == APPLIED:
            raise PermanentFailure("mail relay refused: 550 mailbox unavailable")
        return {"sent": call.payload["flow"]}

    effects.register("notify", notify)

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("notify", {"flow": ctx.event.flow_id})

    with Producer(producer_at, RESERVATION) as producer, \
            Consumer(consumer_at, RESERVATION, handlers=(handler,), effects=effects) as consumer:
        for i, kind in enumerate(("reserved", "confirmed", "released")):
            producer.advance(f"{APPLIED}-{i + 1}", APPLIED, expected_seq=i, kind=kind, payload={"amount": 3},
                             meta={"correlation_id": "checkout-5521"})
            producer.advance(f"{GAP}-{i + 1}", GAP, expected_seq=i, kind=kind, payload={"amount": 2})
        producer.advance(f"{BLOCKED}-1", BLOCKED, expected_seq=0, kind="reserved", payload={"amount": 1})
        producer.advance(f"{BLOCKED}-2", BLOCKED, expected_seq=1, kind="confirmed", payload={"units": 1},
                         schema=2)
        for flow, upto in ((APPLIED, 3), (GAP, 3), (BLOCKED, 2)):
            for seq in range(1, upto + 1):
                if (flow, seq) != (GAP, 2):
                    relay(producer, consumer, event_id=f"{flow}-{seq}")
        consumer.process_all()
        executor = EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=30))
        executor.run_until_idle()
        consumer.admin.retry_effect(DEAD, actor=ACTOR, reason=REASON)
        executor.run_until_idle()
        dead = consumer.scheduled_effect(DEAD)
        assert dead is not None and dead.state == "dead", dead

#: Each page of the showcase worth a picture: its name (the screenshot's
#: file name), its path under the console's URL and words it must show.
PAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("overview", "", (f"Needs attention ({ATTENTION})", "unsupported_schema", "effect_dead", "applied per minute")),
    ("flows-search", "flows?q=checkout-5521", (APPLIED, "correlation_id")),
    ("flow-gap", f"flows/{GAP}", ("Why it waits: waiting for seq 2", f"{GAP}-3")),
    ("flow-blocked", f"flows/{BLOCKED}", ("Why it waits: blocked: unsupported_schema", f"{BLOCKED}-2")),
    ("effects", "effects", (DEAD, "succeeded", "mail relay refused")),
    ("effect", f"effects/{DEAD.replace(':', '%3A')}", ("notify of consumer default: dead", "History", "claimed",
                                                        "operator", REASON)),
    ("actions", "actions", (REASON, ACTOR, "register relay default")),
    ("healthz", "healthz", (f"{ATTENTION} need attention", "effect_dead")),
)
