"""The scenario table, running it, and checking a run against the frozen results.

The seed's scenarios come first, in the order the seed article tells them;
ours follow and are marked ``"origin": "ours"``.  The scenarios themselves
live in the ``scenarios_*`` modules, their machinery in
:mod:`reliable_flow._tools.experiment.harness`.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...crash import CRASH_POINTS, ENV_VAR
from .harness import Files, Result, Scenario, error_name
from .scenarios_core import (
    accepted_is_not_applied,
    advance_idempotency,
    consumer_blocks_invalid_events,
    poison_isolation_and_explicit_relay,
    poison_resolved_then_explicit_relay,
    schema_upgrade,
)
from .scenarios_crash import (
    crash_scenario,
    trigger_rejected_effect_insert,
    trigger_rejected_outbox_insert,
    unsafe_dual_write,
)
from .scenarios_order import (
    arrival_3_1_2,
    arrival_all_permutations,
    flow_isolation,
    naive_consumer,
)
from .scenarios_race import (
    race_apply_next_one_event,
    race_new_ids_expected_seq_0,
    race_receive_one_envelope,
    race_relay_several_events,
    race_same_event_advanced,
)

__all__ = ["FORMAT", "FROZEN_RESULTS", "SCENARIOS", "check", "compare", "dumps", "run_experiment"]

#: Version of the JSON layout; bump it when the layout (not a result) changes.
FORMAT = 1
#: The frozen results shipped with the package and checked by ``--check``.
FROZEN_RESULTS = Path(__file__).with_name("results.json")

# -- the table, running and checking ----------------------------------------------------

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("unsafe_dual_write", "seed", unsafe_dual_write),
    Scenario("advance_idempotency", "seed", advance_idempotency),
    Scenario("accepted_is_not_applied", "seed", accepted_is_not_applied),
    Scenario("arrival_3_1_2", "seed", arrival_3_1_2),
    Scenario("naive_consumer", "seed", naive_consumer),
    Scenario("schema_upgrade", "seed", schema_upgrade),
    Scenario("flow_isolation", "seed", flow_isolation),
    Scenario("poison_isolation_and_explicit_relay", "seed", poison_isolation_and_explicit_relay),
    *(Scenario(f"crash_at:{point}", "seed", crash_scenario(point)) for point in CRASH_POINTS),
    Scenario("trigger_rejected_outbox_insert", "seed", trigger_rejected_outbox_insert),
    Scenario("trigger_rejected_effect_insert", "seed", trigger_rejected_effect_insert),
    Scenario("race_same_event_advanced", "seed", race_same_event_advanced),
    Scenario("race_new_ids_expected_seq_0", "seed", race_new_ids_expected_seq_0),
    Scenario("race_receive_one_envelope", "seed", race_receive_one_envelope),
    Scenario("race_apply_next_one_event", "seed", race_apply_next_one_event),
    Scenario("race_relay_several_events", "seed", race_relay_several_events),
    Scenario("poison_resolved_then_explicit_relay", "ours", poison_resolved_then_explicit_relay),
    Scenario("arrival_all_permutations", "ours", arrival_all_permutations),
    Scenario("consumer_blocks_invalid_events", "ours", consumer_blocks_invalid_events),
)


def _run_one(scenario: Scenario) -> Result:
    with tempfile.TemporaryDirectory(prefix="reliable_flow_experiment_") as tmp:
        try:
            return scenario.run(Files(Path(tmp)))
        except Exception as exc:  # noqa: BLE001 -- one broken scenario must not hide the rest
            traceback.print_exc(file=sys.stderr)
            return {"error": error_name(exc)}


def run_experiment(names: Iterable[str] | None = None) -> Result:
    """Run the scenarios (all, or those named) in order, each on fresh files; a JSON-able dict."""
    if os.environ.get(ENV_VAR):
        raise RuntimeError(
            f"unset {ENV_VAR} before running the experiment; it arms its own crash points"
        )
    wanted = None if names is None else set(names)
    unknown = sorted((wanted or set()) - {s.name for s in SCENARIOS})
    if unknown:
        raise ValueError(f"no such scenario: {', '.join(unknown)}")
    chosen = [s for s in SCENARIOS if wanted is None or s.name in wanted]
    return {
        "experiment": "reliable_flow",
        "format": FORMAT,
        "scenario_count": len(chosen),
        "scenarios": [{"name": s.name, "origin": s.origin, "result": _run_one(s)} for s in chosen],
    }


def dumps(results: Result) -> str:
    """The one serialisation used for output files and comparisons."""
    return json.dumps(results, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _by_name(results: Any) -> dict[str, Any] | None:
    if not isinstance(results, dict) or not isinstance(results.get("scenarios"), list):
        return None
    out = {}
    for entry in results["scenarios"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return None
        out[entry["name"]] = entry
    return out


def _diff(old: Any, new: Any, old_label: str, new_label: str) -> str:
    a = [] if old is None else dumps(old).splitlines(keepends=True)
    b = [] if new is None else dumps(new).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, fromfile=old_label, tofile=new_label))


def compare(frozen: Any, current: Result) -> tuple[bool, str]:
    """``(True, "")`` if equal, else ``(False, text)``: a unified diff per differing scenario."""
    if dumps(frozen) == dumps(current):
        return True, ""
    old, new = _by_name(frozen), _by_name(current)
    if old is None or new is None:
        return False, _diff(
            frozen, current, "frozen", "now"
        ) + "the frozen results do not have the expected layout\n"
    parts = []
    changed = []
    for name in [*old, *(n for n in new if n not in old)]:
        if old.get(name) == new.get(name):
            continue
        changed.append(name)
        if name not in new:
            what = "is in the frozen results but was not produced by this run"
        elif name not in old:
            what = "is new: not in the frozen results"
        else:
            what = "differs"
        parts.append(f"=== scenario {name} {what}\n")
        parts.append(_diff(old.get(name), new.get(name), f"frozen/{name}", f"now/{name}"))
    if not changed and list(old) != list(new):
        parts.append("=== the scenarios ran in another order\n")
        changed.append("(order)")
    rest_old = {k: v for k, v in frozen.items() if k != "scenarios"}
    rest_new = {k: v for k, v in current.items() if k != "scenarios"}
    if rest_old != rest_new:
        parts.append("=== top-level fields differ\n")
        parts.append(_diff(rest_old, rest_new, "frozen", "now"))
    parts.append(
        f"experiment: {len(changed)} scenario(s) differ from the frozen results: "
        f"{', '.join(changed) or '(top-level fields only)'}\n"
    )
    return False, "".join(parts)


def check(
    frozen_path: str | os.PathLike[str] | None = None, current: Result | None = None
) -> tuple[bool, str]:
    """Compare a run (``current``, or a fresh one) with the frozen results file."""
    path = Path(frozen_path) if frozen_path is not None else FROZEN_RESULTS
    frozen = json.loads(path.read_text(encoding="utf-8"))
    if current is None:
        current = run_experiment()
    return compare(frozen, current)
