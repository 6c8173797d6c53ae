"""Explanations for RESULTS.md (written after profiling; numbers filled in from the run)."""

from __future__ import annotations

from typing import Any

NOTES = "TODO"


def why(name: str, result: Any, prof: dict[str, Any] | None) -> str:
    return "TODO"


def why_scaling(op: str, scaling: Any) -> str:
    return "TODO"
