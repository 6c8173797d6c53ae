"""``python -m reliable_flow experiment``: every named scenario, as frozen facts."""

from __future__ import annotations

from .scenarios import FORMAT, FROZEN_RESULTS, SCENARIOS, Scenario, check, compare, dumps, run_experiment

__all__ = ["FORMAT", "FROZEN_RESULTS", "SCENARIOS", "Scenario", "check", "compare", "dumps", "run_experiment"]
