"""Every script in examples/ runs, says what it should, and writes nothing into the repo.

New scripts are picked up by the glob; they must exit 0 and print something.
Scripts listed in EXPECTED must also print the given lines and, run without
arguments, leave neither files in the working directory nor temporary
directories behind.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from redis_server import MISSING as REDIS_MISSING
from redis_server import redis_required
from support import child_env, run_script

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
#: Scripts that start a private redis-server (and need the redis client).
NEEDS_REDIS = {"agent_two_hosts.py"}

EXPECTED: dict[str, list[str]] = {
    "quickstart.py": [
        "  advance A1 again -> existing: same id and body, so a retry is safe",
        "  projection A before drain: None  (accepted is not applied)",
        "drain A -> applied 3, stopped at idle: strictly in seq order",
        "  projection A: {'state': 'released', 'last_seq': 3, 'held': 0}",
        "relay A2 again -> duplicate; effects A: ['reserved', 'confirmed', 'released'] (one per event, ever)",
    ],
    "agent_tasks.py": [
        "advance T1-6 failed      -> invalid_transition (answered is final)",
        "process_all: T1 applied 5, stopped at idle",
        "projection T1: {'state': 'answered', 'last_seq': 5, 'answered': True, 'tool_calls': 2}",
        "effects T1: requested, planned, tool_called, tool_called, answered",
    ],
    "crash_demo.py": [
        ("advance.after_outbox_insert    73  -     -         -        0   "
         "| committed reserved/1/3, effects=1"),
        ("receive.after_commit           73  flow  unsent    pending  0   "
         "| existing  reserved/1/3, effects=1"),
        ("relay.after_commit             73  flow  accepted  pending  0   "
         "| existing  reserved/1/3, effects=1"),
        ("apply.after_commit             73  flow  accepted  applied  1   "
         "| existing  reserved/1/3, effects=1"),
        "Every recovery ends with exactly one effect.",
    ],
    "async_agent.py": [
        "  model  decides: call get_weather(city='Paris')",
        "  tool   result fed back as tools:C1-2:get_weather:result (seq 3): 18 C, cloudy",
        "  agent  advance C1-4 answered    -> committed",
        "  agent  advance C2-2 answered    -> committed",
        "  tools:C1-2:get_weather: 1 request",
        "  tools.db effects: {'succeeded': 2}; results fed back by this run: 2",
    ],
    "agent_two_hosts.py": [
        "  A     advance T1-2 tool_called  -> committed: search('Dune author') runs on host B",
        ("  B     result came home as tools:T1-2:search:result (seq 3): 3 results for 'Dune author', "
         "the first from an encyclopedia"),
        ("  B     failure came home as tools:T2-2:fetch_page:failure (seq 3): effect dead, "
         "RetryLater: HTTP 500 from https://example.org/"),
        "  A     advance T2-4 answered     -> committed: Sorry, I could not reach that page; try again later.",
        "  tools:T2-2:fetch_page: 3 calls",
        "  tools:T3-2:search: 1 call",
        "  A agent.db T3: state answered, seq 4",
        ("  B tools.db effects: {'succeeded': 2, 'dead': 1}; projections: "
         "[('T1', 'answered'), ('T2', 'answered'), ('T3', 'answered')]"),
    ],
}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run(script: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if script.name in NEEDS_REDIS and REDIS_MISSING:
        if redis_required():
            pytest.fail(REDIS_MISSING, pytrace=False)
        pytest.skip(REDIS_MISSING)
    env = child_env(
        PYTHONDONTWRITEBYTECODE="1",  # a stray __pycache__ is not the script's doing
        TMPDIR=str(tmp_path / "tmp"),  # so we can see whether temporary files are removed
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "cwd").mkdir(exist_ok=True)
    before = _tree(EXAMPLES)
    done = run_script(script, *args, cwd=tmp_path / "cwd", env=env, timeout=120)
    assert _tree(EXAMPLES) - before == set(), f"{script.name} wrote into {EXAMPLES}"
    assert done.returncode == 0, f"{script.name} exited {done.returncode}:\n{done.stderr}"
    return done


def test_the_documented_examples_exist() -> None:
    assert set(EXPECTED) <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_example_runs_cleanly(script: Path, tmp_path: Path) -> None:
    done = _run(script, tmp_path)
    assert done.stdout.strip(), f"{script.name} printed nothing"
    if script.name in EXPECTED:
        lines = done.stdout.splitlines()
        for line in EXPECTED[script.name]:
            assert line in lines, f"{script.name} did not print {line!r}:\n{done.stdout}"
        assert done.stderr == ""
        assert _tree(tmp_path / "cwd") == set(), "wrote into the working directory"
        assert _tree(tmp_path / "tmp") == set(), "left temporary files behind"


@pytest.mark.parametrize("script", ["quickstart.py", "agent_tasks.py", "async_agent.py", "agent_two_hosts.py"])
def test_example_keeps_its_files_in_a_given_directory_and_reruns_idempotently(
    script: str, tmp_path: Path
) -> None:
    kept = tmp_path / "kept"
    first = _run(EXAMPLES / script, tmp_path, str(kept))
    assert sorted(p.suffix for p in kept.glob("*.db")) == [".db", ".db"]
    second = _run(EXAMPLES / script, tmp_path, str(kept))
    # The second run re-sends every step: the producer answers "existing", and
    # nothing is delivered or applied twice.
    assert "committed" in first.stdout
    assert "-> committed" not in second.stdout
    assert "existing" in second.stdout
    assert "accepted" not in second.stdout.replace("(accepted is not applied)", "")
    if script == "quickstart.py":
        assert (
            "drain A -> applied 0, stopped at idle: strictly in seq order"
            in second.stdout.splitlines()
        )
    first_projection = [line for line in first.stdout.splitlines() if "projection" in line][-1]
    assert first_projection in second.stdout.splitlines()
