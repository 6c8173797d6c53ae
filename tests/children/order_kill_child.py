"""The producer, worker and executor that ``test_order_kill.py`` SIGKILLs:
three consumers with their own orders (issue 32, item 5).

Not collected by pytest.  Run as a script, in a fresh interpreter started by
the test with an explicit environment::

    python tests/children/order_kill_child.py ROLE STORES SEED

ROLE is ``producer``, ``worker`` or ``executor``; STORES a JSON object
naming the location of ``producer`` and of each consumer (``audit``,
``recent``, ``stats``; a SQLite path or a PostgreSQL location); SEED makes
the incarnation's choices.  Each child keeps no state of its own: every
incarnation reads the stores and carries on, until it is killed (or a
watchdog of :data:`MAX_SECONDS`).

* ``producer``: advances each flow's planned steps (:func:`kind_of`) in
  bursts of one to three steps of a flow chosen at random, as
  ``expected_seq`` = the flow's seq, with a short random pause between two
  bursts; exits once every flow is complete.
* ``worker``: a :class:`Worker` over the three consumers, one pass at a
  time; before a pass it may wait a moment and push a shuffled (or newest
  first) batch of ``recent``'s or ``stats``'s due events straight into it (arrivals out of order, the relay sending them
  again later: duplicates).
* ``executor``: an :class:`EffectExecutor` of ``stats``, whose handler
  schedules one ``count`` effect per applied event.

The topics: ``shop.orders`` carries ``placed``, ``shop.prices`` carries
``priced``; ``audit`` (strict) subscribes to the orders, ``recent``
(latest) to the prices, ``stats`` (any) to both.  Only the standard
library and ``reliable_flow`` are imported.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

from reliable_flow import Consumer, DeliveryPolicy, Producer, Protocol, Topic, Worker
from reliable_flow._effects import EffectCall, EffectRegistry
from reliable_flow._effects.executor import EffectExecutor
from reliable_flow._handlers import ApplyContext

KINDS = ("placed", "priced")
#: Every kind from every state; each event carries its state (a snapshot:
#: the default step merges it in), so any order of applying is legal.
SHOP = Protocol(name="shop", initial="new", transitions={s: KINDS for s in ("new", *KINDS)},
                schemas={1: lambda kind, payload: dict(payload)})
TOPICS = [Topic("shop.orders", kinds={"placed"}), Topic("shop.prices", kinds={"priced"})]
SUBSCRIPTIONS = {"audit": ["shop.orders"], "recent": ["shop.prices"], "stats": ["shop.orders", "shop.prices"]}
ORDERS = {"audit": "strict", "recent": "latest", "stats": "any"}
EFFECT = "count"
LEASE = 0.3  # seconds: a killed child's leases run out soon after
MAX_SECONDS = 120.0


def kind_of(flow: str, seq: int) -> str:
    """The planned kind of ``flow``'s event ``seq`` (the same in every process)."""
    return KINDS[random.Random(f"{flow}:{seq}").randrange(len(KINDS))]


def event_id(flow: str, seq: int) -> str:
    return f"{flow}-{seq}"


def flows(n: int) -> list[str]:
    return [f"F{i:02d}" for i in range(n)]


def schedule_count(ctx: ApplyContext) -> None:
    ctx.schedule(EFFECT, {"seq": ctx.event.seq})


def effects() -> EffectRegistry:
    def count(call: EffectCall) -> Any:
        return {"counted": call.payload["seq"]}

    registry = EffectRegistry()
    registry.register(EFFECT, count, idempotent=True, max_attempts=1_000_000)
    return registry


def policy() -> DeliveryPolicy:
    return DeliveryPolicy(lease_seconds=LEASE, backoff_base=0.01, backoff_cap=0.05)


def open_producer(stores: dict[str, str]) -> Producer:
    return Producer(stores["producer"], SHOP, topics=TOPICS)


def open_consumer(stores: dict[str, str], name: str, **kw: Any) -> Consumer:
    extra: dict[str, Any] = {"handlers": [schedule_count], "effects": effects()} if name == "stats" else {}
    return Consumer(stores[name], SHOP, name=name, order=ORDERS[name], **extra, **kw)


def produce(stores: dict[str, str], n_flows: int, steps: int, rng: random.Random, announce: bool = True) -> None:
    with open_producer(stores) as p:
        if announce:
            print("ready", flush=True)
        while True:
            left = [f for f in flows(n_flows) if (p.flow(f) or {"seq": 0})["seq"] < steps]
            if not left:
                return
            flow = rng.choice(left)
            for _ in range(rng.randint(1, 3)):  # a burst of one flow's steps: they pile up for the worker
                seq = (p.flow(flow) or {"seq": 0})["seq"] + 1
                if seq > steps:
                    break
                p.advance(event_id(flow, seq), flow, expected_seq=seq - 1, kind=kind_of(flow, seq), payload={"n": seq})
            time.sleep(rng.uniform(0, 0.4))


def push_shuffled(p: Producer, consumer: Consumer, rng: random.Random) -> None:
    """A batch of the consumer's due events, shuffled or newest first, straight into it."""
    bodies = [b for _, b in p.store.latest.next_due(consumer.name, float("inf"), 40)]
    if rng.random() < 0.5:
        rng.shuffle(bodies)
    else:
        bodies.reverse()  # newest first
    # The any consumer applies in arrival order only on arrival (a later pass
    # takes its pending rows oldest first).
    target = consumer.applying() if consumer.order == "any" or rng.random() < 0.5 else consumer
    for body in bodies:
        target.accept(body)


def work(stores: dict[str, str], rng: random.Random) -> None:
    with open_producer(stores) as p:
        consumers = [open_consumer(stores, name) for name in ORDERS]
        try:
            worker = Worker(p, consumers, policy=policy(), relay_batch=rng.choice((1, 5, 20)),
                            apply_on_receive=rng.random() < 0.5, idle_sleep=0.005)
            print("ready", flush=True)
            while True:
                if rng.random() < 0.5:
                    time.sleep(rng.uniform(0, 0.3))  # let events pile up, to shuffle them
                    push_shuffled(p, rng.choice(consumers[1:]), rng)
                worker.run_once()
                time.sleep(0.002)
        finally:
            for c in consumers:
                c.close()


def execute(stores: dict[str, str]) -> None:
    with open_consumer(stores, "stats") as c:
        executor = EffectExecutor(c, policy=policy())
        print("ready", flush=True)
        while True:
            if not executor.run_once().work:
                time.sleep(0.005)


def main(argv: list[str]) -> int:
    role, stores, seed = argv[0], json.loads(argv[1]), int(argv[2])
    n_flows, steps = int(argv[3]), int(argv[4])
    watchdog = threading.Timer(MAX_SECONDS, os._exit, (3,))
    watchdog.daemon = True
    watchdog.start()
    rng = random.Random(seed)
    if role == "producer":
        produce(stores, n_flows, steps, rng)
    elif role == "worker":
        work(stores, rng)
    elif role == "executor":
        execute(stores)
    else:
        raise SystemExit(f"unknown role {role!r}")
    return 0


if __name__ == "__main__":
    import importlib

    # Run as the module the test imports, so the protocol's import path is one.
    sys.exit(importlib.import_module("children.order_kill_child").main(sys.argv[1:]))
