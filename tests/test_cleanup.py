"""The test helpers' one clean-up (``tests/cleanup.py``): what a process
registered is stopped once, newest first, at exit and on SIGTERM; a SIGTERM'd
test run using all three helpers (``pg_cluster``, ``redis_server``,
``netns``) leaves no server process, no namespace and no directory behind.

The first cases run a small Python child on ``cleanup`` alone (no servers:
quick); the last one runs a real ``python -m pytest`` child on this file
that starts the session's PostgreSQL and Redis servers, two test hosts with a
``redis-server`` and a ``sleep`` inside them, and is then sent SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve()
#: Set (to the file to write) only in the pytest child: it selects the child's test.
CHILD = "RF_CLEANUP_CHILD"

# -- cleanup alone ----------------------------------------------------------------------------

#: argv: NOTES-FILE MODE.  Registers three stops (one then forgotten), says
#: "ready", then waits to be signalled.
_SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
import cleanup

notes = open(sys.argv[1], "a")
def note(word):
    notes.write(word + "\\n")
    notes.flush()

mode = sys.argv[2]
if mode == "previous":
    signal.signal(signal.SIGTERM, lambda signum, frame: note("previous"))
cleanup.register("older", lambda: note("older"))
cleanup.register("newer", lambda: note("newer"))
cleanup.register("forgotten", lambda: note("forgotten"))
cleanup.forget("forgotten")
cleanup.register("failing", lambda: 1 / 0)
if mode == "fork":
    child = os.fork()
    if child == 0:  # exits normally: stops only its own
        cleanup.register("child's", lambda: note("child's"))
        sys.exit(0)
    os.waitpid(child, 0)
    child = os.fork()
    if child == 0:  # signalled: ends as without the handler, stopping nothing
        time.sleep(60)
        os._exit(0)
    time.sleep(0.2)
    os.kill(child, signal.SIGTERM)
    note("fork child ended by signal %s" % os.WTERMSIG(os.waitpid(child, 0)[1]))
    sys.exit(0)
try:
    note("ready")  # inside: a signal right after it still lands in the except below
    time.sleep(60)
except KeyboardInterrupt as exc:
    note("interrupted: %s" % exc)
    if mode != "swallow":
        sys.exit(2)
time.sleep(60)
"""


def _run_script(tmp_path: Path, mode: str, signals: int) -> tuple[int, list[str]]:
    notes = tmp_path / "notes"
    notes.touch()
    code = _SCRIPT.format(tests=str(HERE.parent))
    child = subprocess.Popen([sys.executable, "-c", code, str(notes), mode],
                             stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if mode == "fork":
            return child.wait(30), notes.read_text().splitlines()
        deadline = time.monotonic() + 30
        while "ready" not in notes.read_text():
            assert child.poll() is None and time.monotonic() < deadline, notes.read_text()
            time.sleep(0.01)
        for _ in range(signals):
            seen = len(notes.read_text().splitlines())
            child.send_signal(signal.SIGTERM)
            while len(notes.read_text().splitlines()) == seen and child.poll() is None:
                time.sleep(0.01)
        return child.wait(30), notes.read_text().splitlines()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_sigterm_unwinds_and_the_exit_stops_each_registered_thing_once_newest_first(tmp_path: Path) -> None:
    rc, notes = _run_script(tmp_path, "unwind", signals=1)
    assert (rc, notes) == (2, ["ready", "interrupted: stopped by SIGTERM", "newer", "older"])


def test_a_second_sigterm_stops_everything_at_once_and_ends_the_process_by_it(tmp_path: Path) -> None:
    rc, notes = _run_script(tmp_path, "swallow", signals=2)
    assert (rc, notes) == (-signal.SIGTERM, ["ready", "interrupted: stopped by SIGTERM", "newer", "older"])


def test_the_handler_set_before_is_still_called(tmp_path: Path) -> None:
    rc, notes = _run_script(tmp_path, "previous", signals=1)
    assert (rc, notes) == (2, ["ready", "previous", "interrupted: stopped by SIGTERM", "newer", "older"])


def test_a_forked_child_stops_only_its_own_and_ends_by_a_signal_as_without_the_handler(tmp_path: Path) -> None:
    rc, notes = _run_script(tmp_path, "fork", signals=0)
    assert (rc, notes) == (0, ["child's", f"fork child ended by signal {int(signal.SIGTERM)}", "newer", "older"])


# -- a SIGTERM'd test run with all three helpers ----------------------------------------------

if os.environ.get(CHILD):

    def test_child_holds_servers_and_hosts_until_it_is_stopped() -> None:
        from netns import Hosts
        from pg_cluster import get_pg_cluster
        from redis_server import RedisServer, get_redis_server

        pg, redis = get_pg_cluster(), get_redis_server()
        hosts = Hosts().create()  # never removed by the test, as a fixture cut short
        inside = RedisServer(bind=hosts.b.address, netns=hosts.b)  # never destroyed either
        inside.start()
        sleeper = hosts.a.popen(["sleep", "300"])
        state = {
            "pids": [pg.pid(), redis.pid(), inside.pid(), sleeper.pid],
            "roots": [str(pg.root), str(redis.root), str(inside.root)],
            "namespaces": [h.name for h in hosts],
        }
        Path(os.environ[CHILD]).write_text(json.dumps(state))
        time.sleep(300)  # the parent stops us long before


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone


def _children(pids: list[int]) -> list[int]:
    """The processes whose parent is one of ``pids`` (a postmaster's backends)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent in pids:
                found.append(int(entry.name))
    return found


def _namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _need_all_three() -> None:
    from netns import require_netns
    from pg_cluster import MISSING_BINARIES, find_bin_dir, import_psycopg, pg_required
    from redis_server import MISSING, redis_required

    import_psycopg()
    for missing, required in ((None if find_bin_dir() else MISSING_BINARIES, pg_required()),
                              (MISSING, redis_required())):
        if missing is not None:
            if required:
                pytest.fail(missing, pytrace=False)
            pytest.skip(missing)
    require_netns()


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.netns
def test_a_sigterm_to_a_run_using_all_three_helpers_leaves_nothing_behind(tmp_path: Path) -> None:
    _need_all_three()
    info, log = tmp_path / "child.json", tmp_path / "child.log"
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"{HERE}::test_child_holds_servers_and_hosts_until_it_is_stopped"],
            cwd=HERE.parents[1], env={**os.environ, CHILD: str(info)}, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    state: dict[str, Any] = {"pids": [], "roots": [], "namespaces": []}
    try:
        deadline = time.monotonic() + 120
        while not info.exists() or not info.read_text():
            assert child.poll() is None, f"the child ended early ({child.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the child never started its servers:\n{log.read_text()}"
            time.sleep(0.05)
        state = json.loads(info.read_text())
        state["pids"] += _children(state["pids"][:1])  # the postmaster's backends
        assert all(pid is not None and _alive(pid) for pid in state["pids"]), state
        assert all(Path(root).is_dir() for root in state["roots"]), state
        assert set(state["namespaces"]) <= set(_namespaces()), state

        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child did not exit after SIGTERM:\n{log.read_text()}")

        output = log.read_text()
        assert child.returncode == pytest.ExitCode.INTERRUPTED, (child.returncode, output)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in state["pids"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in state["pids"] if _alive(pid)] == [], f"processes left running:\n{output}"
        assert [root for root in state["roots"] if Path(root).exists()] == [], f"directories left:\n{output}"
        assert set(state["namespaces"]) & set(_namespaces()) == set(), f"namespaces left:\n{output}"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        for pid in state["pids"]:  # what a failed case left: gone all the same
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for root in state["roots"]:
            shutil.rmtree(root, ignore_errors=True)
        for name in set(state["namespaces"]) & set(_namespaces()):
            subprocess.run(["ip", "netns", "delete", name], check=False)
