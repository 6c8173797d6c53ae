"""The running totals of one effect executor (this process only)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ExecutorStats"]


@dataclass
class ExecutorStats:
    """Running totals of one executor object (this process only)."""

    passes: int = 0
    started: int = 0  # calls started off the executor's thread
    started_by_name: Counter[str] = field(default_factory=Counter)  # calls of each effect's function started
    renewals: int = 0  # leases renewed (by the executor, or a heartbeat)
    heartbeats: int = 0  # heartbeat() calls that renewed a lease
    rate_limited: int = 0  # effects put off by their rate_limit
    outcomes: Counter[str] = field(default_factory=Counter)
    fed: int = 0
    feedback_errors: int = 0
    errors: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "started": self.started,
                "started_by_name": dict(sorted(self.started_by_name.items())), "renewals": self.renewals,
                "heartbeats": self.heartbeats, "rate_limited": self.rate_limited,
                "outcomes": dict(sorted(self.outcomes.items())), "fed": self.fed,
                "feedback_errors": self.feedback_errors, "errors": self.errors, "last_error": self.last_error}
