"""``reliable-flow execute`` (one consumer's effects, in a real process: a
SIGTERM during a call lets it finish and be recorded, exit 0; ``--until-idle``
runs what is due and exits 0; errors exit 2) and ``reliable-flow run`` with
handlers, effects and application schema per consumer.

The effect functions live in a module written into ``tmp_path`` (the
commands import ``module:ATTR`` from their working directory).
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import is_pg, new_location
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectRegistry,
    Producer,
    Worker,
    relay,
)
from reliable_flow._tools.cli import _parser
from reliable_flow.delivery import DEFAULT_LEASE_SECONDS
from reliable_flow.reservation import RESERVATION
from support import CHILD_TIMEOUT, child_env, commit, run_cli

# The effects module the child processes import.  ``wait`` tells the test its
# call started (a line on stdout), then blocks until the test writes a line to
# its stdin: the call is "in progress" for as long as the test wants.
FX = '''
import sys

from reliable_flow import EffectRegistry


def wait(call):
    print("started", call.flow_id, flush=True)
    sys.stdin.readline()
    return {"flow": call.flow_id}


def quick(call):
    return {"quick": call.flow_id}


def on_apply(ctx):
    if ctx.event.kind == "reserved":
        ctx.schedule(NAME, {"flow": ctx.event.flow_id})


NAME = "notify"
WAITING = EffectRegistry()
WAITING.register("notify", wait)
QUICK = EffectRegistry()
QUICK.register("notify", quick)
HANDLERS = [on_apply]
NOT_A_REGISTRY = 42
'''


def _notify_registry() -> EffectRegistry:
    effects = EffectRegistry()
    effects.register("notify", lambda call: {})  # scheduling needs the name only
    return effects


def _schedule(ctx: ApplyContext) -> None:
    if ctx.event.kind == "reserved":
        ctx.schedule("notify", {"flow": ctx.event.flow_id})


@pytest.fixture
def stores(engine: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A producer and a consumer ("mail") whose flows A and B each have a pending ``notify``."""
    (tmp_path / "fx.py").write_text(FX, encoding="utf-8")
    producer = new_location(engine, tmp_path, "producer")
    consumer = new_location(engine, tmp_path, "consumer")
    with Producer(producer, RESERVATION) as p, \
            Consumer(consumer, RESERVATION, name="mail", handlers=[_schedule], effects=_notify_registry()) as c:
        for flow in "AB":
            commit(p, flow, upto=1)
        while relay(p, c, register=True).status != "idle":
            pass
        assert sum(d.applied for d in c.process_all().values()) == 2
        assert c.effect_counts()["pending"] == 2
    yield producer, consumer


def states(consumer: str) -> dict[str, str]:
    with Consumer(consumer, RESERVATION) as c:
        return {e.flow_id: str(e.state) for e in c.scheduled_effects()}


def stopped(stderr: str) -> dict[str, Any]:
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("execute: stopped: "), stderr
    return dict(json.loads(last[len("execute: stopped: "):]))


@pytest.mark.parametrize("face", [[], ["--async"]], ids=["sync", "async"])
def test_execute_until_idle_runs_what_is_due_and_exits_0(stores: tuple[str, str], tmp_path: Path,
                                                         face: list[str]) -> None:
    producer, consumer = stores
    done = run_cli("execute", consumer, "--effects", "fx:QUICK", "--producer", producer, "--until-idle",
                   "--idle-sleep", "30", *face, cwd=tmp_path, timeout=CHILD_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert stopped(done.stderr)["outcomes"] == {"succeeded": 2}
    assert states(consumer) == {"A": "succeeded", "B": "succeeded"}
    with Consumer(consumer, RESERVATION) as c:
        assert c.scheduled_effect("mail:A1:notify").result == {"quick": "A"}


@pytest.mark.parametrize("face", [[], ["--async"]], ids=["sync", "async"])
def test_execute_stops_on_sigterm_after_the_call_in_progress_is_recorded(
    stores: tuple[str, str], tmp_path: Path, face: list[str],
) -> None:
    _, consumer = stores
    proc = subprocess.Popen(
        [sys.executable, "-m", "reliable_flow", "execute", consumer, "--effects", "fx:WAITING", *face],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=child_env(PYTHONDONTWRITEBYTECODE="1"),
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready, _, _ = select.select([proc.stdout], [], [], CHILD_TIMEOUT)
        assert ready, "no effect call started within the timeout"
        started = proc.stdout.readline().split()
        assert started[0] == "started", started
        assert states(consumer)[started[1]] == "running"  # the call is in progress
        proc.send_signal(signal.SIGTERM)
        proc.stdin.write("go\n")  # only now may the call in progress end
        proc.stdin.flush()
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and out == ""  # no second call started
    other = "B" if started[1] == "A" else "A"
    assert states(consumer) == {started[1]: "succeeded", other: "pending"}
    assert stopped(err)["outcomes"] == {"succeeded": 1}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--effects", "fx:NOT_A_REGISTRY"], "execute: --effects: fx:NOT_A_REGISTRY is not a reliable_flow EffectRegistry"),
        (["--effects", "fx"], "execute: --effects must look like module:ATTRIBUTE"),
        (["--effects", "no_such_module:X"], "execute: --effects: cannot import 'no_such_module'"),
        (["--effects", "fx:QUICK", "--protocol", "fx:QUICK"], "execute: --protocol: fx:QUICK is not a reliable_flow"),
    ],
)
def test_execute_refuses_bad_options_with_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "fx.py").write_text(FX, encoding="utf-8")
    Consumer(tmp_path / "c.db", RESERVATION).close()
    done = run_cli("execute", "c.db", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_execute_creates_no_consumer_file(tmp_path: Path) -> None:
    (tmp_path / "fx.py").write_text(FX, encoding="utf-8")
    done = run_cli("execute", "missing.db", "--effects", "fx:QUICK", "--until-idle", cwd=tmp_path)
    assert done.returncode == 2 and "execute: no consumer file at 'missing.db'" in done.stderr
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x"])
def test_execute_lease_must_be_a_finite_number(tmp_path: Path, value: str) -> None:
    done = run_cli("execute", "c.db", "--effects", "fx:QUICK", f"--lease={value}", cwd=tmp_path)
    assert done.returncode == 2 and "argument --lease: must be a finite number of seconds" in done.stderr


# -- run: handlers, effects and application schema per consumer ------------------------------


@pytest.fixture
def two_consumers(engine: str, tmp_path: Path) -> tuple[list[str], str, str]:
    (tmp_path / "fx.py").write_text(FX, encoding="utf-8")
    producer = new_location(engine, tmp_path, "producer")
    mail, audit = new_location(engine, tmp_path, "mail"), new_location(engine, tmp_path, "audit")
    with Producer(producer, RESERVATION) as p:
        commit(p, "A", upto=1)
    args = ["--producer", producer, "--consumer", f"mail={mail}", "--consumer", f"audit={audit}", "--register",
            "--report-every", "0"]
    return args, mail, audit


def test_run_takes_handlers_and_effects_per_consumer(two_consumers: tuple[list[str], str, str],
                                                     tmp_path: Path) -> None:
    args, mail, audit = two_consumers
    done = run_cli("run", *args, "--handlers", "mail=fx:HANDLERS", "--effects", "mail=fx:QUICK", "--until-idle",
                   cwd=tmp_path, timeout=CHILD_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert states(mail) == {"A": "succeeded"}
    assert states(audit) == {}  # audit has neither handlers nor effects: it only applied
    with Consumer(audit, RESERVATION) as c:
        assert c.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}


def test_run_without_a_name_still_applies_to_every_consumer(two_consumers: tuple[list[str], str, str],
                                                            tmp_path: Path) -> None:
    args, mail, audit = two_consumers
    done = run_cli("run", *args, "--handlers", "fx:HANDLERS", "--effects", "fx:QUICK", "--until-idle",
                   cwd=tmp_path, timeout=CHILD_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert states(mail) == states(audit) == {"A": "succeeded"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--effects", "nobody=fx:QUICK"], ("run: --effects 'nobody=fx:QUICK' names consumer 'nobody', "
                                            "which is not one of --consumer: mail, audit")),
        (["--handlers", "fx:HANDLERS", "--handlers", "fx:HANDLERS"], "run: --handlers is given twice for every"),
        (["--effects", "mail=fx:QUICK", "--effects", "mail=fx:QUICK"], "run: --effects is given twice for consumer"),
        (["--app-schema", "mail=fx:QUICK"], "run: --app-schema: fx:QUICK is not a reliable_flow AppSchema"),
    ],
)
def test_run_refuses_a_per_consumer_option_it_cannot_use(two_consumers: tuple[list[str], str, str],
                                                          tmp_path: Path, extra: list[str], message: str) -> None:
    args, mail, _ = two_consumers
    done = run_cli("run", *args, *extra, "--once", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    if not is_pg(mail):
        assert not Path(mail).exists()  # refused before anything was opened


# -- 7i. one lease default for Worker and the command line -----------------------------------


def test_worker_and_the_command_line_share_the_30_s_lease_default(tmp_path: Path) -> None:
    with Producer(tmp_path / "p.db", RESERVATION) as p, Consumer(tmp_path / "c.db", RESERVATION) as c:
        assert Worker(p, [c]).policy.lease_seconds == DEFAULT_LEASE_SECONDS == 30.0  # before: None
        assert Worker(p, [c], policy=DeliveryPolicy()).policy.lease_seconds is None  # still possible on purpose
    run = _parser().parse_args(["run", "--producer", "p.db", "--consumer", "a=a.db"])
    execute = _parser().parse_args(["execute", "c.db", "--effects", "fx:QUICK"])
    assert run.lease == run.effect_lease == execute.lease == DEFAULT_LEASE_SECONDS
