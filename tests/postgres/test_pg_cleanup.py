"""A test run stopped by SIGTERM or Ctrl-C leaves no private PostgreSQL
server and no ``/tmp/rf-pg-*`` directory behind (``tests/pg_cluster.py``).

Each case runs a real ``python -m pytest`` child on this repository's test
set-up (this file, with its conftest): the child's one test starts the
session's server (and, in the SIGTERM case, a second one of its own that it
never destroys, as a test's fixture cut short would), writes where they
are, and sleeps.  Then the child gets SIGTERM (as ``kill`` or a
CI timeout sends it) or SIGINT to its whole process group (as Ctrl-C in a
terminal does), and must exit with both servers stopped and both
directories removed.
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

from pg_cluster import (
    MISSING_BINARIES,
    PgCluster,
    find_bin_dir,
    get_pg_cluster,
    import_psycopg,
    pg_required,
)

#: Set (to the file to write) only in the child run: it selects the child's test.
CHILD = "RF_PG_CLEANUP_CHILD"
#: Set in the child when it also starts a server of its own.
EXTRA = "RF_PG_CLEANUP_EXTRA"
HERE = Path(__file__).resolve()

if os.environ.get(CHILD):

    def test_child_holds_its_servers_until_it_is_stopped() -> None:
        servers = [get_pg_cluster()]
        if os.environ.get(EXTRA):
            servers.append(PgCluster())  # a test's own server, never destroyed by the test
            servers[-1].start()
        state = {"roots": [str(s.root) for s in servers], "pids": [s.pid() for s in servers]}
        Path(os.environ[CHILD]).write_text(json.dumps(state))
        time.sleep(300)  # the parent stops us long before


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone


#: ``python -m pytest ARGS`` with SIGINT and SIGTERM as in a terminal (whatever
#: started this run may have ignored them, and an ignored signal stays ignored
#: across exec); set in the child itself, not in a ``preexec_fn`` (unsafe with threads).
_PYTEST_AS_IN_A_TERMINAL = (
    "import signal, sys, pytest; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "signal.signal(signal.SIGTERM, signal.SIG_DFL); "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_a_stopped_run_leaves_no_server_and_no_directory_behind(how: str, tmp_path: Path) -> None:
    import_psycopg()
    if find_bin_dir() is None:
        if pg_required():
            pytest.fail(MISSING_BINARIES, pytrace=False)
        pytest.skip(MISSING_BINARIES)
    info, log = tmp_path / "child.json", tmp_path / "child.log"
    env = {**os.environ, CHILD: str(info)}
    if how == "SIGTERM":
        env[EXTRA] = "1"
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", _PYTEST_AS_IN_A_TERMINAL, "-q", "-p", "no:cacheprovider",
             f"{HERE}::test_child_holds_its_servers_until_it_is_stopped"],
            cwd=HERE.parents[2], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state: dict[str, Any] = {"roots": [], "pids": []}
    try:
        deadline = time.monotonic() + 120
        while not info.exists() or not info.read_text():
            assert child.poll() is None, f"the child ended early ({child.returncode}):\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the child never started its servers:\n{log.read_text()}"
            time.sleep(0.05)
        state = json.loads(info.read_text())
        assert all(pid is not None and _alive(pid) for pid in state["pids"]), state
        assert all(Path(root).is_dir() for root in state["roots"]), state

        if how == "SIGTERM":
            os.kill(child.pid, signal.SIGTERM)
        else:
            os.killpg(child.pid, signal.SIGINT)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child did not exit after {how}:\n{log.read_text()}")

        output = log.read_text()
        assert child.returncode == pytest.ExitCode.INTERRUPTED, (child.returncode, output)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in state["pids"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in state["pids"] if _alive(pid)] == [], f"servers left running:\n{output}"
        assert [root for root in state["roots"] if Path(root).exists()] == [], f"directories left:\n{output}"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        for pid in state["pids"]:  # what a failed case left: gone all the same
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for root in state["roots"]:
            shutil.rmtree(root, ignore_errors=True)
