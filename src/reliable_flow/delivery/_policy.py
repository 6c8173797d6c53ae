"""How work is claimed and retried: :class:`DeliveryPolicy` and its backoff."""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .._checks import check_flag, check_seconds, check_text

__all__ = ["DEFAULT_LEASE_SECONDS", "DeliveryPolicy", "backoff_delay", "check_seconds"]

#: The lease of every long-running claimer unless told otherwise: a
#: ``Worker``'s relays, ``reliable-flow run --lease`` / ``--effect-lease``,
#: ``reliable-flow execute --lease`` and an ``EffectExecutor``.  One value, so
#: the command line and the Python objects agree (docs/worker.md, "Leases").
DEFAULT_LEASE_SECONDS = 30.0


def backoff_delay(failures: int, base: float, cap: float, rand: Callable[[], float]) -> float:
    """Seconds to wait after ``failures`` consecutive failures (>= 1):
    ``rand() * min(cap, base * 2**(failures-1))``, exponential with full jitter."""
    ceiling = min(cap, base * 2 ** min(failures - 1, 62))
    return float(rand() * ceiling)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class DeliveryPolicy:
    """How a relay claims events and retries failed sends.

    lease_seconds: None (the default for plain :func:`relay`) sends without
        claiming.  A number makes the relay first claim the event for that
        long, so concurrent relays (threads or processes) skip it; a relay
        that dies mid-send loses the claim when it expires and the event is
        sent again.  Use it whenever several relays share one producer.
    wait_for_due: True: only events that are due are sent, so ``idle``
        means "nothing due now" and a backing-off event waits its turn.
        Plain ``relay()`` without a policy uses False: it sends the next
        pending event even if it is backing off, so its ``idle`` means
        "nothing left to deliver".
    backoff_base, backoff_cap: after the n-th consecutive failure to send,
        the event waits ``random() * min(cap, base * 2**(n-1))`` seconds
        (exponential backoff with full jitter).
    clock, random: injectable for tests; ``clock`` returns seconds.
    owner: the name this relay's claims are recorded under.
    """

    lease_seconds: float | None = None
    wait_for_due: bool = True
    backoff_base: float = 0.5
    backoff_cap: float = 300.0
    clock: Callable[[], float] = time.time
    random: Callable[[], float] = random.random
    owner: str = field(default_factory=_owner)

    def __post_init__(self) -> None:
        check_text("owner", self.owner)
        check_flag("wait_for_due", self.wait_for_due)
        # Finite only: NaN or infinity would make every due time NaN or never.
        if self.lease_seconds is not None:
            try:
                check_seconds("lease_seconds", self.lease_seconds, allow_zero=False)
            except ValueError:
                raise ValueError(
                    f"lease_seconds must be None or a finite number > 0, got {self.lease_seconds!r}"
                ) from None
        for name in ("backoff_base", "backoff_cap"):
            check_seconds(name, getattr(self, name), allow_zero=True)

    def backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failed sends (>= 1)."""
        return backoff_delay(failures, self.backoff_base, self.backoff_cap, self.random)
