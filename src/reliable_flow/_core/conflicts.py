"""Running a transaction the library owns again when the engine aborted it to
break a lock cycle (:class:`~reliable_flow.errors.TransactionConflict`).

Only whole transactions are re-run, and only those whose every step is the
library's own (a single advance, a receive, an apply step, a relay mark):
nothing of an aborted one was written, and nothing it did reached outside
its transaction, so running it again is the same as running it once.  A
``producer.batch()`` holds user code and is never re-run here.  SQLite
never raises the error (one writer at a time), so there this is a plain
call.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import TransactionConflict

__all__ = ["CONFLICT_ATTEMPTS", "rerun_on_conflict"]

#: How many times a transaction is run in all before the conflict is raised.
CONFLICT_ATTEMPTS = 4

T = TypeVar("T")


def rerun_on_conflict(work: Callable[[], T], attempts: int = CONFLICT_ATTEMPTS) -> T:
    """``work()``; run again (after a short jittered pause, so the two sides
    of a cycle do not meet again at once) while the engine aborts it as a
    conflict, at most ``attempts`` runs in all."""
    attempt = 1
    while True:
        try:
            return work()
        except TransactionConflict:
            if attempt >= attempts:
                raise
        time.sleep(random.uniform(0, 0.02 * 2**attempt))
        attempt += 1
