"""Claim and settle: what to record when work is claimed, and after it failed.

A claim is a lease: the work's due time is pushed to ``now + lease`` and
the claimer's name recorded, so other workers skip it until it expires; a
claimer that dies simply lets it expire.  A failure settles into a
:class:`Retry`: one more failure, due again after a jittered backoff.  A
success clears failures, lease and error.  Stores write these values; the
decisions are made here once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from ._policy import DeliveryPolicy

__all__ = ["Retry", "claim_until", "error_text", "own_claims", "retry_after"]

MAX_ERROR_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Retry:
    """What a failed attempt leaves: the failure count, the next due time, the error."""

    failures: int
    due_at: float
    error: str


def claim_until(policy: DeliveryPolicy, now: float) -> float:
    """When a claim made at ``now`` expires (the policy must have a lease)."""
    if policy.lease_seconds is None:
        raise ValueError("this policy has no lease_seconds, so it makes no claims")
    return now + policy.lease_seconds


def own_claims(policy: DeliveryPolicy) -> DeliveryPolicy:
    """``policy`` with an owner no other claimer has: ``<policy.owner>/<random
    hex>``.  A claimer that checks "is this claim still mine?" before it
    records an outcome needs its own name, even when it was given a policy
    object (and so its owner) that another claimer shares: otherwise one's
    late outcome would overwrite the other's live claim."""
    return replace(policy, owner=f"{policy.owner}/{uuid.uuid4().hex[:12]}")


def error_text(exc: BaseException) -> str:
    """The stored description of a failure: its type and message, bounded."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def retry_after(policy: DeliveryPolicy, failures_before: int, now: float, exc: BaseException) -> Retry:
    """Settle a failed attempt: one more failure, due again after the backoff."""
    failures = failures_before + 1
    return Retry(failures, now + policy.backoff(failures), error_text(exc))
