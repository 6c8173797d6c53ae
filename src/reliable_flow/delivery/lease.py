"""Claim and settle: what to record when work is claimed, and after it failed.

A claim is a lease: the work's due time is pushed to ``now + lease`` and
the claimer's name recorded, so other workers skip it until it expires; a
claimer that dies simply lets it expire.  A failure settles into a
:class:`Retry`: one more failure, due again after a jittered backoff.  A
success clears failures, lease and error.  Stores write these values; the
decisions are made here once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .policy import DeliveryPolicy

__all__ = ["Retry", "claim_until", "error_text", "retry_after"]

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


def error_text(exc: BaseException) -> str:
    """The stored description of a failure: its type and message, bounded."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def retry_after(policy: DeliveryPolicy, failures_before: int, now: float, exc: BaseException) -> Retry:
    """Settle a failed attempt: one more failure, due again after the backoff."""
    failures = failures_before + 1
    return Retry(failures, now + policy.backoff(failures), error_text(exc))
