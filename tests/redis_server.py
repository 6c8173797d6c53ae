"""A private ``redis-server`` for the tests, in a fresh directory under ``/tmp``,
listening on a Unix socket inside it and, when asked, on a TCP address too
(also inside a network namespace, see ``tests/netns.py``).

No persistence by default (``save ""``, ``appendonly no``): the Redis
transport must not need it.  ``appendonly=True`` turns the append-only file on
for a test that wants it.

    server = RedisServer()                              # Unix socket only
    server.start()                                      # waits until it answers PING
    server.url()            # unix:///tmp/rf-redis-.../redis.sock?db=0
    server.kill()           # SIGKILL, as a crash would
    server.start()          # serving again, on the same socket / address
    server.stop()           # SHUTDOWN NOSAVE, SIGKILL when that does not work
    server.destroy()        # stop and remove the directory

    RedisServer(bind="127.0.0.1", port=free_port())     # also redis://127.0.0.1:PORT/0
    RedisServer(bind=hosts.b.address, netns=hosts.b)    # ip netns exec NAME redis-server ...

Nothing is left behind when a run is cut short, as in ``tests/pg_cluster.py``:
every server is registered with ``tests/cleanup.py`` while its directory
exists.  :meth:`RedisServer.destroy` and :func:`stop_session_server` may run
any number of times.

The module needs no Redis client: it talks to the server with a few lines of
RESP (:meth:`RedisServer.command`).  The tests of the transport need the
``redis`` package (:func:`import_redis`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import cleanup

__all__ = [
    "MISSING", "MISSING_BINARY", "MISSING_REDIS_PY", "RedisReplyError", "RedisServer", "find_redis_server",
    "free_port", "get_redis_server", "import_redis", "redis_required", "stop_session_server",
]

_FALLBACK = "/usr/bin/redis-server"

#: The reason a Redis test skips on a machine without the server.
MISSING_BINARY = (
    f"redis-server not found ($RELIABLE_FLOW_REDIS_SERVER, $PATH, {_FALLBACK}): install the Debian "
    "package redis-server (apt-get install redis-server) to run these tests"
)
#: The reason a Redis test skips without the client.
MISSING_REDIS_PY = (
    'redis (the Redis client for Python) is not installed: pip install -e ".[test]" to run these tests'
)


def find_redis_server() -> str | None:
    """``$RELIABLE_FLOW_REDIS_SERVER``, else ``redis-server`` on ``$PATH``, else
    ``/usr/bin/redis-server``, when executable; else None."""
    candidates = [os.environ.get("RELIABLE_FLOW_REDIS_SERVER") or "", shutil.which("redis-server") or "",
                  _FALLBACK]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _missing() -> str | None:
    if find_redis_server() is None:
        return MISSING_BINARY
    try:
        import redis  # noqa: F401 - the test extra brings it
    except ImportError as exc:
        return f"{MISSING_REDIS_PY} ({exc})"
    return None


#: Why the Redis tests cannot run here (no server binary, or no ``redis``
#: package), or None when they can; as found when this module was imported.
MISSING: str | None = _missing()

_REQUIRED_ENV = ("CI", "RELIABLE_FLOW_REQUIRE_REDIS")


def redis_required() -> bool:
    """True when a Redis test may not be skipped (CI, or asked for)."""
    return any(os.environ.get(name) for name in _REQUIRED_ENV)


def _skip_or_fail(reason: str) -> Any:
    import pytest

    if redis_required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_redis() -> Any:
    """``redis`` (the client), imported; when it is not installed the calling
    test (or module) is skipped saying what to install, or failed when ``CI`` /
    ``RELIABLE_FLOW_REQUIRE_REDIS`` is set."""
    try:
        import redis
    except ImportError as exc:
        return _skip_or_fail(f"{MISSING_REDIS_PY} ({exc})")
    return redis


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` just now (in this process's network namespace)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- a few lines of RESP -----------------------------------------------------------------


class RedisReplyError(RuntimeError):
    """The server answered a command with an error (``-ERR ...``)."""


def _encode(args: tuple[str | bytes | int, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def reply(self) -> Any:
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            return None if int(rest) < 0 else self.exactly(int(rest))
        if kind == b"*":
            return None if int(rest) < 0 else [self.reply() for _ in range(int(rest))]
        raise ConnectionError(f"not a RESP reply: {line[:80]!r}")


# -- the server ----------------------------------------------------------------------------


def _ns_name(netns: object) -> str | None:
    if netns is None or isinstance(netns, str):
        return netns
    return str(netns.name)  # type: ignore[attr-defined] # a tests/netns.Host


class RedisServer:
    """One ``redis-server`` process and the directory it lives in.

    ``bind`` / ``port``: also listen on TCP at that address (``port=0`` with a
    ``bind`` picks a free port: here with :func:`free_port`, in a namespace
    6379, free in a fresh one).  ``netns``: a namespace name or a
    ``tests/netns.Host``, to run the server there.  ``appendonly`` /
    ``appendfsync``: the append-only file.  ``config``: more directives
    (``{"maxmemory": "64mb"}``), written last.
    """

    def __init__(
        self,
        *,
        bind: str | None = None,
        port: int = 0,
        netns: object = None,
        appendonly: bool = False,
        appendfsync: str = "always",
        config: dict[str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise RuntimeError(MISSING_BINARY)
        self.binary = found
        self.netns = _ns_name(netns)
        self.bind = bind
        if bind is not None and port == 0:
            port = 6379 if self.netns is not None else free_port(bind)
        self.port = port if bind is not None else 0
        self.root = Path(tempfile.mkdtemp(prefix="rf-redis-", dir="/tmp"))
        cleanup.register(self, self.destroy)
        self.socket = self.root / "redis.sock"
        self.log = self.root / "redis.log"
        self.stderr_log = self.root / "stderr.log"
        self.conf = self.root / "redis.conf"
        settings: dict[str, str] = {
            "port": str(self.port),
            "unixsocket": str(self.socket),
            "unixsocketperm": "700",
            "dir": str(self.root),
            "logfile": str(self.log),
            "pidfile": str(self.root / "redis.pid"),
            "daemonize": "no",
            "protected-mode": "no",  # reachable only in its namespace / on loopback anyway
            "save": '""',
            "appendonly": "yes" if appendonly else "no",
            "appendfsync": appendfsync,
            "databases": "16",
        }
        if bind is not None:
            settings["bind"] = bind
        settings.update(config or {})
        self.conf.write_text("".join(f"{key} {value}\n" for key, value in settings.items()))
        self._proc: subprocess.Popen[bytes] | None = None

    # -- addresses ---------------------------------------------------------------------

    def unix_url(self, db: int = 0) -> str:
        """``unix:///tmp/rf-redis-.../redis.sock?db=N`` (redis-py's form)."""
        return f"unix://{self.socket}?db={db}"

    def tcp_url(self, db: int = 0) -> str:
        """``redis://HOST:PORT/N``; a server without TCP has none (ValueError)."""
        if self.bind is None:
            raise ValueError("this Redis server listens on its Unix socket only (no bind= given)")
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"redis://{host}:{self.port}/{db}"

    def url(self, db: int = 0) -> str:
        """The TCP URL when the server listens on TCP, else the Unix socket's."""
        return self.tcp_url(db) if self.bind is not None else self.unix_url(db)

    # -- talking to it -----------------------------------------------------------------

    def command(self, *args: str | bytes | int, timeout: float = 10.0) -> Any:
        """One command over the Unix socket; its reply (``str`` for a status,
        ``bytes`` for a bulk string, ``int``, ``list``, None); an error reply
        raises :class:`RedisReplyError`."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket))
            sock.sendall(_encode(args))
            return _Reader(sock).reply()

    def ping(self, timeout: float = 1.0) -> bool:
        """True when the server answers PING on its socket."""
        try:
            return bool(self.command("PING", timeout=timeout) == "PONG")
        except (OSError, ConnectionError, RedisReplyError):
            return False

    def flushall(self) -> None:
        """Empty every logical database."""
        self.command("FLUSHALL", "SYNC")

    # -- lifecycle ---------------------------------------------------------------------

    def _log_tail(self) -> str:
        out = []
        for path in (self.stderr_log, self.log):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")[-3000:]
                if text.strip():
                    out.append(f"--- {path}:\n{text}")
        return "\n".join(out)

    def pid(self) -> int | None:
        """The server's pid, or None when it is not running."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return None
        return proc.pid

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (on the same socket / address as before, after a
        stop or kill); wait until it answers PING.  Already running: nothing."""
        if self.pid() is not None:
            return
        cmd = [self.binary, str(self.conf)]
        if self.netns is not None:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        with open(self.stderr_log, "ab") as err:
            # Its own session: a Ctrl-C in the terminal reaches pytest, which stops it.
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                          cwd=self.root, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)} exited ({self._proc.returncode}) before serving:\n"
                                   f"{self._log_tail()}")
            if self.ping(timeout=0.5):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{' '.join(cmd)} did not answer PING on {self.socket} within "
                                   f"{timeout:g}s:\n{self._log_tail()}")
            time.sleep(0.01)

    def stop(self, timeout: float = 10.0) -> None:
        """SHUTDOWN NOSAVE (the socket file goes); SIGKILL when it does not end
        within ``timeout``.  Not running: nothing."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(OSError, ConnectionError, RedisReplyError):
            self.command("SHUTDOWN", "NOSAVE", timeout=timeout)  # the connection just closes
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and wait until it is gone
        (its socket file stays, stale; the next start replaces it)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop (SHUTDOWN NOSAVE) and start again on the same socket / address."""
        self.stop()
        self.start(timeout)

    def destroy(self) -> None:
        """Stop the server and remove its directory (again: nothing happens)."""
        try:
            try:
                self.stop()
            except Exception:  # noqa: BLE001 - go on: kill it
                self.kill()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            cleanup.forget(self)

    def __enter__(self) -> RedisServer:  # noqa: PYI034 - no typing_extensions for 3.10
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<RedisServer {self.url()} pid={self.pid()}>"


# -- the test session's server --------------------------------------------------------------

_session: dict[str, object] = {}


def _session_server() -> RedisServer:
    found = _session.get("server")
    if isinstance(found, RedisServer):
        if found.pid() is None:  # a test stopped or killed it: serve again
            found.start()
        return found
    if "error" in _session:
        raise RuntimeError(str(_session["error"]))
    missing = _missing()
    if missing is not None:
        _session["error"] = missing
        raise RuntimeError(missing)
    try:
        server = RedisServer()
        try:
            server.start()
        except BaseException:
            server.destroy()
            raise
    except Exception as exc:
        _session["error"] = f"cannot start a private Redis server: {type(exc).__name__}: {exc}"
        raise RuntimeError(str(_session["error"])) from exc
    _session["server"] = server
    cleanup.register(server, stop_session_server)  # stopped, it is no longer the session's
    return server


def get_redis_server() -> RedisServer:
    """The session's server (Unix socket only), started on first use.  When it
    cannot start the test is skipped, or failed when ``CI`` or
    ``RELIABLE_FLOW_REQUIRE_REDIS`` is set."""
    try:
        return _session_server()
    except RuntimeError as exc:
        return _skip_or_fail(str(exc))  # type: ignore[no-any-return]


def stop_session_server() -> None:
    """Stop the session's server and remove its directory."""
    server = _session.pop("server", None)
    if isinstance(server, RedisServer):
        server.destroy()

