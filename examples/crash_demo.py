"""Crash demo: kill a real process at each of the ten commit boundaries, then recover.

    python examples/crash_demo.py

For every crash point a child process runs "advance A1 -> relay -> drain"
with RELIABLE_FLOW_CRASH_AT set, and dies with os._exit(73) exactly there:
no finally blocks, no COMMIT, no ROLLBACK.  The parent then looks at both
files, recovers the way any caller would (advance the same A1 again, relay
until idle, drain), and shows that there is always exactly one effect.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from reliable_flow import Consumer, Producer, relay
from reliable_flow.crash import CRASH_POINTS, ENV_VAR
from reliable_flow.reservation import RESERVATION

CHILD = """
import sys
from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION
producer = Producer(sys.argv[1], RESERVATION)
consumer = Consumer(sys.argv[2], RESERVATION)
producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
relay(producer, consumer)
consumer.drain("A")
"""


def observe(producer: Producer, consumer: Consumer) -> str:
    flow = "flow" if producer.flow("A") else "-"
    outbox = producer.outbox("A")
    sent = ("accepted" if outbox[0].accepted else "unsent") if outbox else "-"
    inbox = consumer.inbox("A")
    effects = len(consumer.applied("A"))
    return f"{flow:<5} {sent:<9} {inbox[0].state if inbox else '-':<8} {effects}"


def recover(producer: Producer, consumer: Consumer) -> str:
    again = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    while relay(producer, consumer).status != "idle":
        pass
    consumer.drain("A")
    p = consumer.projection("A") or {}
    return f"{again.status:<9} {p.get('state')}/{p.get('last_seq')}/{p.get('held')}, effects={len(consumer.applied('A'))}"


def main() -> int:
    print("Each row: a child dies at the point; what the files hold right after; the recovery.")
    print(f"{'crash point':<28} {'exit':>4}  {'flow':<5} {'outbox':<9} {'inbox':<8} fx  "
          f"| re-advance projection (state/seq/held)")
    ok = True
    with tempfile.TemporaryDirectory(prefix="crash_demo_") as tmp:
        for point in CRASH_POINTS:
            where = Path(tmp) / point
            where.mkdir()
            p_path, c_path = where / "producer.db", where / "consumer.db"
            env = {**os.environ, ENV_VAR: point}
            child = subprocess.run(
                [sys.executable, "-c", CHILD, str(p_path), str(c_path)], env=env, timeout=60, check=False
            )
            with Producer(p_path, RESERVATION) as producer, Consumer(c_path, RESERVATION) as consumer:
                seen = observe(producer, consumer)
                after = recover(producer, consumer)
                ok &= child.returncode == 73 and len(consumer.applied("A")) == 1
            print(f"{point:<28} {child.returncode:>4}  {seen}   | {after}")
    print("Every recovery ends with exactly one effect." if ok else "SOMETHING WENT WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
