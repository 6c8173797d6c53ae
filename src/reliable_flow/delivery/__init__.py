"""Claims, due times and backoff: one mechanism for everything that is retried.

The relay uses it for deliveries; anything else that claims work, sends it
somewhere and must retry later (an effect executor) uses the same pieces.
Nothing here touches storage: these functions compute what a store writes.
"""

from __future__ import annotations

from ._lease import Retry, claim_until, error_text, own_claims, retry_after
from ._policy import DEFAULT_LEASE_SECONDS, DeliveryPolicy, backoff_delay, check_seconds

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DeliveryPolicy",
    "Retry",
    "backoff_delay",
    "check_seconds",
    "claim_until",
    "error_text",
    "own_claims",
    "retry_after",
]
