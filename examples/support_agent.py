"""A support-ticket agent whose side effects -- e-mails, refunds -- happen once.

A ticket is a flow of the protocol ``SUPPORT_TICKET``, written here in user
code like ``examples/agent_tasks.py``::

    new -> opened -> answered
             |
             +--> tool_called -> tool_result -> answered
                       ^              |
                       +--------------+  (another tool call)

The agent commits each step into its producer file (``agent.db``).  The
support desk is a consumer named ``support`` (``support.db``) whose apply
handler, in the apply transaction of every step:

* writes a row into the desk's own table ``ticket_log`` (an ``AppSchema``);
* schedules ``notify``: e-mail the customer about the step (ordered per
  ticket).  The mail provider does not deduplicate, but can be asked whether
  a message with a given key went out: that is the effect's ``reconcile``;
* on ``tool_called``, schedules ``refund``: a payment API call registered
  ``idempotent=True``, because the API deduplicates by idempotency key.  Its
  result comes back into the ticket's flow as the step ``tool_result``
  (``Feedback``), with the event id ``<effect key>:result``.

The provider and the payment API are fakes in this process that count what
they received per key.  Both lose their reply once after doing the work (a
``TimeoutError``): the executor cannot know the work was done, so it
reconciles the e-mail and re-runs the refund with the same key.  The mail
provider also rate-limits once (``RetryLater``: nothing happened).

Run ``python examples/support_agent.py [DIR]`` (a temporary directory by
default).  The objects at module level also work with the command line, with
``examples/`` on ``PYTHONPATH``::

    python -m reliable_flow run --producer agent.db --consumer support=support.db \\
        --protocol support_agent:SUPPORT_TICKET --handlers support_agent:HANDLERS \\
        --effects support_agent:EFFECTS --app-schema support_agent:APP_SCHEMA
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

from reliable_flow import (
    ApplyContext,
    AppSchema,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    EffectState,
    Feedback,
    Happened,
    NotHappened,
    Producer,
    RetryLater,
    Worker,
)
from reliable_flow.protocol import PayloadError, Protocol, by_kind, exact, integer, text

__all__ = ["APP_SCHEMA", "EFFECTS", "HANDLERS", "MAIL", "PAYMENTS", "SUPPORT_TICKET", "main"]

# -- the protocol: a ticket's steps --------------------------------------------------------

TOOLS = ("refund",)
_CENTS = integer(1, 1_000_000)


def _step(state: str, kind: str, value: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    if kind == "opened":
        return {**value, "tool_calls": 0, "refunded_cents": 0}
    if kind == "tool_called":
        return {**data, "tool_calls": data["tool_calls"] + 1, "waiting_for": value["tool"]}
    if kind == "tool_result":
        if value["tool"] != data.get("waiting_for"):
            raise PayloadError("tool", f"no call of {value['tool']!r} is waiting for a result")
        rest = {k: v for k, v in data.items() if k != "waiting_for"}
        return {**rest, "refunded_cents": data["refunded_cents"] + value["amount_cents"]}
    return dict(data)  # answered: the answer itself stays in the event


def _project(state: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"customer": data["customer"], "tool_calls": data["tool_calls"], "refunded_cents": data["refunded_cents"]}


SUPPORT_TICKET = Protocol(
    name="support_ticket",
    initial="new",
    transitions={
        "new": ["opened"],
        "opened": ["tool_called", "answered"],
        "tool_called": ["tool_result"],
        "tool_result": ["tool_called", "answered"],
    },
    schemas={1: by_kind({
        "opened": exact({"customer": text(3, 254), "subject": text(1, 200), "order": text(1, 40)}),
        "tool_called": exact({"tool": text(choices=TOOLS), "amount_cents": _CENTS}),
        "tool_result": exact({"tool": text(choices=TOOLS), "refund_id": text(1, 64), "amount_cents": _CENTS}),
        "answered": exact({"text": text(1, 4000)}),
    })},
    step=_step,
    project=_project,
)

# -- the outside world: fakes that count what they received ---------------------------------

WORLD: list[str] = []  # what the fakes did during a worker pass, printed after the pass


def say(who: str, line: str) -> None:
    print(f"  {who:<8} {line}")


def world(who: str, line: str) -> None:
    WORLD.append(f"  {who:<8} {line}")



class RateLimited(Exception):
    """The mail provider's 429: the message was not accepted."""


class MailProvider:
    """Sends every message it is given (no deduplication), and can tell whether
    a message with a given idempotency key (sent as a header) went out."""

    def __init__(self) -> None:
        self.sends: Counter[str] = Counter()  # key -> messages actually sent
        self.message_id: dict[str, str] = {}
        self.rate_limit_once: set[str] = set()
        self.lose_reply_once: set[str] = set()

    def send(self, key: str, to: str, subject: str, body: str) -> str:
        if key in self.rate_limit_once:
            self.rate_limit_once.discard(key)
            world("mail", f"429 rate limited, nothing sent          [{key}]")
            raise RateLimited("429 Too Many Requests")
        self.sends[key] += 1
        self.message_id[key] = f"msg-{sum(self.sends.values())}"
        world("mail", f"sent {self.message_id[key]} to {to}: {subject!r}  [{key}]")
        if key in self.lose_reply_once:
            self.lose_reply_once.discard(key)
            world("mail", "... the reply is lost: the executor sees a timeout")
            raise TimeoutError("mail provider did not answer in 10 s")
        return self.message_id[key]

    def lookup(self, key: str) -> str | None:
        return self.message_id.get(key)


class PaymentAPI:
    """Refunds an order; a request with a key it has seen returns the first
    answer again without refunding twice (like Stripe's Idempotency-Key)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # key -> requests received
        self.performed: Counter[str] = Counter()  # key -> refunds actually made
        self.done: dict[str, dict[str, Any]] = {}
        self.lose_reply_once: set[str] = set()

    def refund(self, key: str, order: str, amount_cents: int) -> dict[str, Any]:
        self.requests[key] += 1
        if key in self.done:
            world("payments", f"key seen before: answers {self.done[key]['refund_id']} again, no new refund  [{key}]")
            return self.done[key]
        self.performed[key] += 1
        self.done[key] = {"refund_id": f"rf-{len(self.done) + 1}", "amount_cents": amount_cents}
        world("payments", f"refunded {amount_cents} cents on order {order} as {self.done[key]['refund_id']}  [{key}]")
        if key in self.lose_reply_once:
            self.lose_reply_once.discard(key)
            world("payments", "... the reply is lost: the executor sees a timeout")
            raise TimeoutError("payment API did not answer in 10 s")
        return self.done[key]


MAIL = MailProvider()
PAYMENTS = PaymentAPI()

# -- the effects: how each call reports its outcome ----------------------------------------


def send_mail(call: EffectCall) -> dict[str, Any]:
    try:
        message_id = MAIL.send(call.key, **call.payload)
    except RateLimited as exc:
        raise RetryLater(str(exc)) from exc  # certainly not sent: try again after a backoff
    return {"message_id": message_id}  # a TimeoutError propagates: "may have been sent"


def mail_was_sent(call: EffectCall) -> Happened | NotHappened:
    message_id = MAIL.lookup(call.key)
    world("mail", f"reconcile: was {call.key} sent? {message_id or 'no'}")
    return NotHappened() if message_id is None else Happened({"message_id": message_id})


def call_refund(call: EffectCall) -> dict[str, Any]:
    return PAYMENTS.refund(call.key, call.payload["order"], call.payload["amount_cents"])


EFFECTS = EffectRegistry()
EFFECTS.register("notify", send_mail, reconcile=mail_was_sent)
EFFECTS.register(
    "refund", call_refund, idempotent=True,
    feedback=Feedback(kind="tool_result", payload=lambda r: {"tool": "refund", **r}),
)

# -- the support desk: its own table, and what it does for each applied step -----------------

APP_SCHEMA = AppSchema("support_desk", [
    [  # version 1; append new migrations, never edit this one
        (
            "CREATE TABLE ticket_log(ticket TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, "
            "note TEXT NOT NULL, PRIMARY KEY (ticket, seq))"
        ),
    ],
])


def _message(ctx: ApplyContext) -> tuple[str, str]:
    ticket, p, data = ctx.event.flow_id, ctx.event.payload, ctx.data
    if ctx.event.kind == "opened":
        return f"[{ticket}] received", f"We got your ticket about {data['subject']!r}."
    if ctx.event.kind == "tool_called":
        return f"[{ticket}] refund started", f"We are refunding {p['amount_cents']} cents on order {data['order']}."
    if ctx.event.kind == "tool_result":
        return f"[{ticket}] refund done", f"Refund {p['refund_id']} of {p['amount_cents']} cents is on its way."
    return f"[{ticket}] answer", p["text"]


def support_desk(ctx: ApplyContext) -> None:
    """Runs inside the apply transaction: the row and the effects commit with the step, or not at all."""
    subject, body = _message(ctx)
    ctx.execute("INSERT INTO ticket_log(ticket, seq, kind, note) VALUES (?, ?, ?, ?)",
                (ctx.event.flow_id, ctx.event.seq, ctx.event.kind, subject))
    ctx.schedule("notify", {"to": ctx.data["customer"], "subject": subject, "body": body}, ordered=True)
    if ctx.event.kind == "tool_called" and ctx.event.payload["tool"] == "refund":
        ctx.schedule("refund", {"order": ctx.data["order"], "amount_cents": ctx.event.payload["amount_cents"]})


HANDLERS = [support_desk]

# -- the agent: decides each ticket's next step from its flow ------------------------------

TICKETS = {
    "T-1001": {"customer": "ada@example.com", "subject": "Charged twice for order 5521", "order": "5521"},
    "T-1002": {"customer": "bob@example.com", "subject": "How do I change my e-mail address?", "order": "7730"},
}


def agent_turn(producer: Producer) -> int:
    """One decision per ticket; the agent keeps no memory of its own, only the flows."""
    steps = 0
    for ticket, opening in TICKETS.items():
        flow = producer.flow(ticket) or {"state": "new", "seq": 0}
        seq, state = flow["seq"], flow["state"]
        if state == "new":
            kind, payload = "opened", opening
        elif state == "opened" and "charged twice" in flow["subject"].lower():
            kind, payload = "tool_called", {"tool": "refund", "amount_cents": 1999}
        elif state == "opened":
            kind, payload = "answered", {"text": "Settings > Account > E-mail; we sent you a link."}
        elif state == "tool_result":
            kind, payload = "answered", {"text": f"Refunded {flow['refunded_cents']} cents; sorry for the trouble."}
        else:
            continue  # tool_called: waiting for the tool's result; answered: done
        event_id = f"{ticket}-{seq + 1}"
        result = producer.advance(event_id, ticket, expected_seq=seq, kind=kind, payload=payload)
        say("agent", f"advance {event_id} {kind:<11} -> {result.status}")
        steps += 1
    return steps


# -- running it ---------------------------------------------------------------------------


class Clock:
    """The executor's clock: moved by hand, so backoffs cost no real time."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _effects(consumer: Consumer) -> dict[str, tuple[str, int, bool | None]]:
    return {e.key: (e.state.value, e.attempts, e.fed) for e in consumer.scheduled_effects()}


def _applied(consumer: Consumer) -> set[tuple[str, int, str]]:
    return {(r.event_id, r.seq, r.kind) for flow in consumer.flows() for r in consumer.applied(flow)}


def settle(worker: Worker, consumer: Consumer, clock: Clock) -> None:
    """Worker passes until nothing is left to do; when only backoffs remain, move the clock on."""
    for _ in range(100):
        effects_before, applied_before = _effects(consumer), _applied(consumer)
        work = worker.run_once().work
        # The worker starts effect calls off its thread and records them on a
        # later pass; to tell the story pass by pass, wait for them here.
        work += sum(executor.finish() for executor in worker.executors)
        effects = _effects(consumer)
        # A pass relays and applies first, then runs the due effects: print it in that order.
        for event_id, seq, kind in sorted(_applied(consumer) - applied_before, key=lambda a: a[0]):
            names = [e.name for e in consumer.scheduled_effects() if e.event_id == event_id]
            say("support", f"applied {event_id} ({kind}): ticket_log row, scheduled {' + '.join(names)}")
        for line in WORLD:
            print(line)
        WORLD.clear()
        for key, (state, attempts, fed) in effects.items():
            old_state, old_attempts, old_fed = effects_before.get(key, ("pending", 0, None))
            if (state, attempts) != (old_state, old_attempts):
                error = consumer.scheduled_effect(key).last_error  # type: ignore[union-attr]
                why = f"  ({error})" if error and state in ("pending", "in_doubt") else ""
                say("effect", f"{key}: {old_state} -> {state}{why}")
            if fed and not old_fed:
                say("feedback", f"{key}:result advanced into agent.db as tool_result")
        if work:
            continue
        waiting = [e.due_at for e in consumer.scheduled_effects()
                   if e.state in (EffectState.PENDING, EffectState.IN_DOUBT)]
        if not waiting or min(waiting) <= clock.now:
            return  # idle, or only effects an operator must look at
        say("clock", f"+{min(waiting) - clock.now:.1f} s: a backoff is over")
        clock.now = min(waiting)
    raise RuntimeError("did not settle in 100 passes")


def app_rows(path: Path) -> list[tuple[Any, ...]]:
    """The desk's own table is plain SQLite: read it read-only."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT ticket, seq, kind, note FROM ticket_log ORDER BY ticket, seq").fetchall()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # The faults this run will meet, by idempotency key (<consumer>:<event id>:<effect name>).
    MAIL.rate_limit_once.add("support:T-1002-1:notify")
    MAIL.lose_reply_once.add("support:T-1001-2:notify")
    PAYMENTS.lose_reply_once.add("support:T-1001-2:refund")
    clock = Clock()
    # No jitter (random() == 1.0), so every run prints the same backoffs.
    policy = DeliveryPolicy(lease_seconds=30, clock=clock, random=lambda: 1.0)
    with tempfile.TemporaryDirectory(prefix="support_agent_") as tmp:
        where = Path(args[0] if args else tmp)
        where.mkdir(parents=True, exist_ok=True)
        with (
            Producer(where / "agent.db", SUPPORT_TICKET) as producer,
            Consumer(where / "support.db", SUPPORT_TICKET, name="support", handlers=HANDLERS,
                     effects=EFFECTS, app_schema=APP_SCHEMA, clock=clock) as consumer,
        ):
            executor = EffectExecutor(consumer, policy=policy, producer=producer)
            worker = Worker(producer, [consumer], policy=policy, idle_sleep=0, executors=[executor])
            for turn in range(1, 10):
                print(f"turn {turn}: the agent looks at its tickets")
                if agent_turn(producer) == 0:
                    say("agent", "nothing to do: every ticket is answered")
                    break
                settle(worker, consumer, clock)
            print("what the outside world saw:")
            sent = MAIL.sends
            twice = sorted(key for key, n in sent.items() if n > 1)
            once = f"SENT MORE THAN ONCE: {twice}" if twice else "each sent once"
            print(f"  mail: {sum(sent.values())} messages for {len(sent)} keys, {once}")
            for key, n in PAYMENTS.requests.items():
                print(f"  payments: {key}: {n} requests, {PAYMENTS.performed[key]} refund performed")
            print("what the files say:")
            flow = producer.flow("T-1001") or {}
            shown = {k: flow.get(k) for k in ("state", "seq", "tool_calls", "refunded_cents")}
            results = [f"{e.event_id} at seq {e.seq}" for e in producer.outbox("T-1001")
                       if e.event_id.endswith(":result")]
            print(f"  agent.db T-1001: {shown}")
            print(f"  agent.db T-1001 tool results: {len(results)} ({', '.join(results)})")
            print(f"  support.db T-1001: {consumer.projection('T-1001')}")
            print(f"  support.db ticket_log: {len(app_rows(where / 'support.db'))} rows")
            print(f"  support.db effect_counts: {consumer.effect_counts()}")
            print(f"  executor stats: {executor.stats.as_dict()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
