"""The child of the failed-fsync / full-disk-at-COMMIT tests in ``test_storage_faults.py``.

Not collected by pytest.  Run as a script with ``fault_shim.so`` (built from
``fault_shim.c`` next to this file) in ``LD_PRELOAD`` and a minimal
environment::

    python tests/children/faulty_child.py OP MODE PRODUCER CONSUMER ARM

OP is ``advance``, ``receive``, ``apply_next`` or ``relay``; MODE is
``crash`` (one call with the shim armed), ``retry`` (then the same call again
with the shim disarmed) or ``unarmed`` (the shim loaded but never armed).
The shim fails while the file ARM exists.  The child prints what it saw as
one JSON line and leaves through ``os._exit(0)``: a crash, with no COMMIT, no
close and no checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from reliable_flow import Consumer, Producer, relay
from reliable_flow.errors import CommitOutcomeUnknown, StorageError
from reliable_flow.reservation import RESERVATION

A1 = {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1, "payload": {"amount": 3}}


def main(argv: list[str]) -> int:
    op, mode, producer_path, consumer_path, arm = argv[0:5]
    p = Producer(producer_path, RESERVATION)
    c = Consumer(consumer_path, RESERVATION)

    def call(first: bool) -> str:
        if op == "advance":
            return p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status.value
        if op == "receive":
            return c.receive(A1).status.value
        if op == "apply_next":
            return c.apply_next("A").status.value
        if op == "relay":
            return (relay(p, c) if first else relay(p, c, event_id="A1")).status.value
        raise SystemExit("unknown op " + op)

    # Prepare with fsync working.
    if op == "relay":
        assert relay(p, c).status == "idle"  # bind the consumer
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
    if op == "apply_next":
        assert c.receive(A1).status == "accepted"

    out: dict[str, Any] = {}
    if mode != "unarmed":
        open(arm, "w").close()
    try:
        out["first"] = call(True)
    except CommitOutcomeUnknown as exc:
        out["first"] = "CommitOutcomeUnknown"
        out["cause"] = getattr(exc.__cause__, "sqlite_errorname", repr(exc.__cause__))
        out["is_storage_error"] = isinstance(exc, StorageError)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out["first"] = type(exc).__name__ + ": " + str(exc)
    # Looked at without reopening anything (the library may have discarded the
    # connection after the failed COMMIT; the shim is still armed here).
    out["in_transaction"] = [x._store._db._conn is not None and x._store._db._conn.in_transaction for x in (p, c)]
    if os.path.exists(arm):
        os.remove(arm)
    if mode == "retry":
        try:
            out["retry"] = call(False)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out["retry"] = type(exc).__name__ + ": " + str(exc)
    print(json.dumps(out), flush=True)
    os._exit(0)  # a crash: no COMMIT, no close, no checkpoint


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
