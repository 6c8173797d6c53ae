"""Argument checks shared by every public call: one place for "a non-empty
string", "an int >= 1 (never a bool)" and "a finite number", each raising
``ValueError`` naming the argument, before anything is opened or written."""

from __future__ import annotations

import math

__all__ = ["check_count", "check_finite", "check_flag", "check_optional_count", "check_seconds", "check_text"]


def check_text(name: str, value: object) -> str:
    """A string with something other than blanks in it (an actor, a reason, a key)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def check_flag(name: str, value: object) -> bool:
    """A real bool: ``"no"`` or ``1`` must not quietly mean True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_count(name: str, value: object) -> int:
    """An int >= 1, never a bool."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def check_optional_count(name: str, value: object) -> int | None:
    """None, or an int >= 1 (never a bool)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
    return value


def check_finite(name: str, value: object, unit: str = "seconds") -> float:
    """A finite int or float (never a bool, NaN or an infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of {unit}, got {value!r}")
    return float(value)


def check_seconds(name: str, value: object, *, allow_zero: bool) -> float:
    """A duration in seconds: a finite int or float (never a bool), > 0 or >= 0."""
    if (
        isinstance(value, bool) or not isinstance(value, (int, float))
        or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)
