"""``python -m reliable_flow experiment``: every named scenario, as frozen facts.

Each scenario runs on fresh files in its own temporary directory, with real
child processes where the point is a process boundary (a crash, a handshake,
a race), and returns a JSON-able dict of what it saw: statuses, states,
seqs, accepted marks, blocked reasons, effects and exit codes.  Never paths,
PIDs, timings, or which racing process won, so two runs give byte-identical
JSON.  ``--check`` compares a fresh run with the results frozen in
``results.json`` and prints a per-scenario diff on any difference.

The seed's scenarios come first, in the order the seed article tells them;
ours follow and are marked ``"origin": "ours"``.  The deliberately wrong implementations they
compare against live in :mod:`reliable_flow._tools.experiment.wrong_ways`.
"""

from __future__ import annotations

from .harness import Scenario
from .runner import FORMAT, FROZEN_RESULTS, SCENARIOS, check, compare, dumps, run_experiment

__all__ = ["FORMAT", "FROZEN_RESULTS", "SCENARIOS", "Scenario", "check", "compare", "dumps", "run_experiment"]
