"""The async worker process of the SIGKILL test in ``test_aio_worker.py``:
``worker_child.py``'s ``kill`` / ``finish`` modes, with ``AsyncProducer``,
``AsyncConsumer`` and ``AsyncWorker`` on one event loop.

Not collected by pytest.  Run as a script::

    python tests/children/aio_worker_child.py kill DIR SEED     # feed, re-send and work until killed
    python tests/children/aio_worker_child.py finish DIR SEED   # the same, until everything is settled

DIR names the store of each label as in ``worker_child.py``.  Each pass of
the worker runs as a task while the same loop advances and re-sends
events, so the kills land while relays, applies and the application's own
calls are all in progress on their threads.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from worker_child import CONFLICT, FLOWS, STEPS, amount, at

from reliable_flow import DeliveryPolicy
from reliable_flow.aio import AsyncConsumer, AsyncProducer, AsyncWorker
from reliable_flow.reservation import RESERVATION

__all__ = ["main"]


async def seq_of(producer: AsyncProducer, flow: str) -> int:
    found = await producer.flow(flow)
    return 0 if found is None else int(found["seq"])


async def settled(producer: AsyncProducer) -> bool:
    for flow in FLOWS:
        if await seq_of(producer, flow) < 3:
            return False
    return all(
        len(e.deliveries) == 2 and all(d.state in ("accepted", "set_aside") for d in e.deliveries.values())
        for e in await producer.outbox()
    )


async def feed(producer: AsyncProducer, consumers: list[AsyncConsumer], rng: random.Random,
               quota: list[int]) -> int:
    """The application's side: advance a few steps, now and then re-send one; 0 or 2 (an answer never allowed)."""
    for _ in range(rng.randint(0, 2)):
        open_flows = [f for f in FLOWS if await seq_of(producer, f) < 3]
        if quota[0] <= 0 or not open_flows:
            break
        flow = rng.choice(open_flows)
        seq = await seq_of(producer, flow)
        r = await producer.advance(f"{flow}-{seq + 1}", flow, expected_seq=seq, kind=STEPS[seq],
                                   payload={"amount": amount(flow)})
        if r.status != "committed":
            print("advance answered", r, file=sys.stderr)
            return 2
        quota[0] -= 1
    if rng.random() < 0.3:  # the network delivers a committed event again
        ids = [e.event_id for e in await producer.outbox()]
        if ids:
            event_id, consumer = rng.choice(ids), rng.choice(consumers)
            status = (await consumer.receive(await producer.event(event_id))).status  # type: ignore[arg-type]
            conflict = {"id_conflict"} if (consumer.name, event_id) == CONFLICT else set()
            if status not in {"accepted", "duplicate"} | conflict:
                print("receive answered", status, "for", event_id, file=sys.stderr)
                return 2
    return 0


async def kill_mode(d: str, seed: int, finish: bool) -> int:
    rng = random.Random(seed)
    producer = await AsyncProducer.open(at(d, "producer"), RESERVATION)
    consumers = [await AsyncConsumer.open(at(d, name), RESERVATION, name=name) for name in ("projection", "audit")]
    policy = DeliveryPolicy(lease_seconds=0.2, backoff_base=0.01, backoff_cap=0.05)
    worker = AsyncWorker(producer, consumers, policy=policy, relay_batch=rng.randint(1, 8),
                         apply_limit=rng.randint(1, 3), idle_sleep=0, register=True)
    quota = [60 if finish else rng.randint(1, 4)]  # events this incarnation may commit
    print("ready", flush=True)
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline:
        # The worker's pass and the application's calls at once, on one loop.
        work, fed = await asyncio.gather(worker.run_once(), feed(producer, consumers, rng, quota))
        if fed:
            return fed
        if finish and work.work == 0 and await settled(producer):
            print("done", json.dumps(worker.stats.as_dict()), flush=True)
            return 0
    return 3


def main(argv: list[str]) -> int:
    mode, d = argv[0], argv[1]
    return asyncio.run(kill_mode(d, int(argv[2]), mode == "finish"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
