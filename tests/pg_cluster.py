"""A private PostgreSQL server for the tests: ``initdb`` into a fresh
directory under ``/tmp``, listening only on a Unix socket inside it.

As root, ``initdb`` / ``pg_ctl`` run as the ``postgres`` user (PostgreSQL
refuses to run as root) and the directory is handed to that user; otherwise
they run as the current user.  ``fsync`` and ``synchronous_commit`` stay on:
the tests that kill the server rely on them.

    cluster = PgCluster()
    cluster.start()
    location = cluster.dsn("rf", schema="orders_outbox")
    cluster.kill()          # SIGKILL to the postmaster
    cluster.start()         # crash recovery, then serving again
    cluster.stop()

Nothing is left behind when a run is cut short: every cluster is registered
with ``tests/cleanup.py`` while its directory exists (stopped at exit, and
SIGTERM / SIGHUP unwind the run as Ctrl-C does).  :meth:`PgCluster.destroy`
and :func:`stop_session_cluster` may run any number of times.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

try:
    import cleanup
except ModuleNotFoundError:  # loaded by its path (benchmarks/postgres.py): so is its neighbour
    sys.path.append(str(Path(__file__).resolve().parent))
    import cleanup

__all__ = [
    "MISSING_BINARIES", "MISSING_PSYCOPG", "PG_DATABASE", "PgCluster", "find_bin_dir", "get_pg_cluster",
    "import_psycopg", "pg_location", "pg_required", "stop_session_cluster",
]

#: Where the server binaries are looked for, after ``$RELIABLE_FLOW_PG_BINDIR``:
#: Debian's versioned directories (newest first), then ``$PATH``.
_BIN_DIRS = ("/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin", "/usr/local/bin", "$PATH")
_TOOLS = ("initdb", "pg_ctl", "postgres")

#: The reason a PostgreSQL test skips on a machine without the server.
MISSING_BINARIES = (
    f"PostgreSQL server binaries not found ({', '.join(_TOOLS)} in $RELIABLE_FLOW_PG_BINDIR, "
    f"{', '.join(_BIN_DIRS)}): install the Debian package postgresql (apt-get install postgresql) "
    "to run these tests"
)
#: The reason a PostgreSQL test skips without the driver.
MISSING_PSYCOPG = (
    'psycopg (the PostgreSQL driver) is not installed: pip install -e ".[test]" to run these tests'
)


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in path.parent.name.split(".") if part.isdigit())


def find_bin_dir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    candidates: list[Path] = []
    if os.environ.get("RELIABLE_FLOW_PG_BINDIR"):
        candidates.append(Path(os.environ["RELIABLE_FLOW_PG_BINDIR"]))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    candidates += [Path("/usr/local/pgsql/bin"), Path("/usr/local/bin")]
    candidates += [Path(d) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for d in candidates:
        if all((d / tool).is_file() and os.access(d / tool, os.X_OK) for tool in _TOOLS):
            return d
    return None


def import_psycopg() -> Any:
    """``psycopg``, imported; when it is not installed the calling test (or
    module) is skipped saying what to install, or failed when
    ``CI`` / ``RELIABLE_FLOW_REQUIRE_POSTGRES`` is set."""
    import pytest

    try:
        import psycopg
        import psycopg_pool  # noqa: F401 - both come with the test extra
    except ImportError as exc:
        missing = f"{MISSING_PSYCOPG} ({exc})"
    else:
        return psycopg
    if pg_required():
        pytest.fail(missing, pytrace=False)
    pytest.skip(missing, allow_module_level=True)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is as good as gone


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


class PgCluster:
    """One PostgreSQL data directory and the server that serves it."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        found = bin_dir or find_bin_dir()
        if found is None:
            raise RuntimeError(MISSING_BINARIES)
        self.bin_dir = found
        self.root = Path(tempfile.mkdtemp(prefix="rf-pg-", dir="/tmp"))
        cleanup.register(self, self.destroy)
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log = self.root / "server.log"
        self.user = "postgres" if os.geteuid() == 0 else None
        self._initialised = False

    # -- running the tools -----------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        result = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
                               f"\n{self._log_tail()}")
        return result

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def _init(self) -> None:
        self.socket_dir.mkdir()
        if self.user is not None:
            shutil.chown(self.root, self.user, self.user)
            shutil.chown(self.socket_dir, self.user, self.user)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-locale", "--no-instructions")
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "max_connections": "200",
            "shared_buffers": "64MB",
            "max_locks_per_transaction": "256",
            "logging_collector": "off",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# reliable_flow tests\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._initialised = True

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (initialising the directory the first time); wait until it serves."""
        if not self._initialised:
            self._init()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Stop at once (``-m immediate``: no checkpoint; the next start recovers)."""
        if self.pid() is not None:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash would; wait until its backends,
        which notice its death, have exited too (they hold its shared memory)."""
        pid = self.pid()
        if pid is None:
            return
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        # The server refuses to start while the old postmaster's pid exists
        # at all (even as a zombie not yet reaped), or a backend lives on.
        while time.monotonic() < deadline and (
            Path(f"/proc/{pid}").exists() or any(_alive(p) for p in children)
        ):
            time.sleep(0.01)

    def restart(self) -> None:
        """Stop (immediately) and start again."""
        self.stop()
        self.start()

    def pid(self) -> int | None:
        """The postmaster's pid, or None when it is not running."""
        try:
            first = (self.data / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        pid = int(first)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def destroy(self) -> None:
        """Stop the server and remove its directory (again: nothing happens)."""
        try:
            try:
                self.stop()
            except Exception:  # noqa: BLE001 - pg_ctl failed (or the server was going): kill it
                self.kill()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            cleanup.forget(self)

    # -- databases ------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", schema: str | None = None) -> str:
        """A ``postgresql://`` location on the socket; ``schema`` as the fragment."""
        host = urllib.parse.quote(str(self.socket_dir), safe="")
        url = f"postgresql:///{dbname}?host={host}&user=postgres"
        return url if schema is None else f"{url}#{schema}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (if absent); its location without a schema."""
        import psycopg  # the tests' own use; the package imports it only in _store/postgres
        from psycopg import sql

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)


# -- the test session's server ------------------------------------------------------------

#: The database the tests' stores live in (one schema per store).
PG_DATABASE = "rf_tests"
_REQUIRED_ENV = ("CI", "RELIABLE_FLOW_REQUIRE_POSTGRES")
_session: dict[str, object] = {}
_names = itertools.count(1)


def pg_required() -> bool:
    """True when a PostgreSQL test may not be skipped (CI, or asked for)."""
    return any(os.environ.get(name) for name in _REQUIRED_ENV)


def _session_cluster() -> PgCluster:
    found = _session.get("cluster")
    if isinstance(found, PgCluster):
        return found
    if "error" in _session:
        raise RuntimeError(str(_session["error"]))
    try:
        import psycopg  # noqa: F401 - the test extra brings it
    except ImportError as exc:
        _session["error"] = f"{MISSING_PSYCOPG} ({exc})"
        raise RuntimeError(str(_session["error"])) from exc
    if find_bin_dir() is None:
        _session["error"] = MISSING_BINARIES
        raise RuntimeError(MISSING_BINARIES)
    try:
        cluster = PgCluster()
        try:
            cluster.start()
            cluster.create_database(PG_DATABASE)
        except BaseException:
            cluster.destroy()
            raise
    except Exception as exc:
        _session["error"] = f"cannot start a private PostgreSQL server: {type(exc).__name__}: {exc}"
        raise RuntimeError(str(_session["error"])) from exc
    _session["cluster"] = cluster
    cleanup.register(cluster, stop_session_cluster)  # stopped, it is no longer the session's
    return cluster


def get_pg_cluster() -> PgCluster:
    """The session's server, started on first use.  When it cannot start the
    test is skipped, or failed when ``CI`` or ``RELIABLE_FLOW_REQUIRE_POSTGRES`` is set."""
    import pytest

    try:
        return _session_cluster()
    except RuntimeError as exc:
        if pg_required():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


def pg_location(label: str = "store") -> str:
    """A fresh, empty store location: a new schema in :data:`PG_DATABASE` (cheap)."""
    cluster = get_pg_cluster()
    safe = "".join(ch if ch.isalnum() else "_" for ch in label.lower())[:30]
    return cluster.dsn(PG_DATABASE, schema=f"t{os.getpid()}_{next(_names)}_{safe}")


def stop_session_cluster() -> None:
    """Stop the session's server (``-m immediate``) and remove its directory."""
    cluster = _session.pop("cluster", None)
    if isinstance(cluster, PgCluster):
        cluster.destroy()

