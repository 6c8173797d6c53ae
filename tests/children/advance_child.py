"""A producer in a process of its own, for the ``wait`` tests of ``test_wait.py``.

Not collected by pytest.  Run as a script::

    python tests/children/advance_child.py LOCATION DELAY

LOCATION is a store location (a SQLite path or a ``postgresql://...#schema``
string).  It opens a reservation Producer there and prints ``ready``; then,
for each line FLOW read from stdin, it sleeps DELAY seconds, advances FLOW
from seq 0 to 1 (``reserved``) and prints ``time.time()`` taken right after
the commit returned.  It ends at the end of stdin.
"""

from __future__ import annotations

import sys
import time

from reliable_flow import Producer
from reliable_flow.reservation import RESERVATION


def main(argv: list[str]) -> int:
    location, delay = argv[0], float(argv[1])
    with Producer(location, RESERVATION) as producer:
        print("ready", flush=True)
        for line in sys.stdin:
            flow = line.strip()
            time.sleep(delay)
            result = producer.advance(f"{flow}-1", flow, expected_seq=0, kind="reserved", payload={"amount": 1})
            committed = time.time()
            assert result.status.value == "committed", result
            print(committed, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
