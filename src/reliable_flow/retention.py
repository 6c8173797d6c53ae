"""``prune`` for both sides: argument checks, then :mod:`reliable_flow.core.retention`.

See ``docs/operations.md`` ("Retention") for what is removed, what stays,
and the deduplication guarantee after pruning.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager

from .core.retention import Pruning, prune
from .operations import PruneResult

__all__ = ["DEFAULT_PRUNE_BATCH", "prune_older_than"]

DEFAULT_PRUNE_BATCH = 500


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


def prune_older_than(
    write: Callable[[], AbstractContextManager[Pruning]], older_than: object, now: object,
    batch_size: object, limit: object, forget_after: object = None,
) -> PruneResult:
    """Check the arguments of a ``prune`` call (bad ones raise ``ValueError``
    before anything is opened) and prune up to ``now - older_than``."""
    age = _number("older_than", older_than)
    if age < 0:
        raise ValueError(f"older_than must be >= 0 seconds, got {older_than!r}")
    at = _number("now", now)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    forget_before = None
    if forget_after is not None:
        keep = _number("forget_after", forget_after)
        if keep < age:
            raise ValueError(f"forget_after must be >= older_than ({age:g} s), got {forget_after!r}")
        forget_before = at - keep
    return prune(write, at - age, at, batch_size, limit, forget_before)
