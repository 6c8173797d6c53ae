"""Test hosts in network namespaces, joined by a veth pair, made and removed
by the tests: traffic only between them (nothing is routed out).

    with Hosts() as hosts:                       # namespaces rf-<pid>-<n>a, rf-<pid>-<n>b
        a, b = hosts.a, hosts.b                  # a.address == "10.213.0.1", b: "10.213.0.2"
        proc = b.popen(["redis-server", "--bind", b.address])   # ip netns exec ... redis-server
        a.run([sys.executable, "-c", "..."])     # subprocess.run in a's namespace
        hosts.partition()                        # nftables: drop everything on the veths
        hosts.heal()
        hosts.partition(seconds=3)               # ... healing itself 3 s later (a timer)
        hosts.drop_randomly(30)                  # each packet dropped with 30 % chance
        hosts.clear_faults()
    # every process in the namespaces killed, the namespaces (and so the veths) gone

Two hosts are one veth pair; more (``Hosts(3)``) hang off a bridge in a
namespace of its own (``rf-<pid>-<n>sw``).  Addresses are in
``10.213.0.0/24``, which exists only inside these namespaces.  The kernel has
no ``netem`` qdisc here: faults are nftables rules (a table ``inet
rf_partition`` / ``inet rf_drop`` in each host's namespace).  A partition
drops in and out (the sender's own kernel refuses too: a UDP ``sendto`` fails
with EPERM, a TCP connect times out); ``drop_randomly`` drops on input only,
so each packet gets exactly one chance to be lost and senders notice nothing.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables): :func:`available` says
whether this machine has them.  As with the private servers, every set of
hosts is listed while it exists; SIGTERM / SIGHUP unwind the run (chaining
to the handlers set before) and ``atexit`` removes whatever is left.  On
creation, namespaces left by a dead test process (``rf-<dead pid>-...``) are
removed too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import cleanup

__all__ = [
    "SUBNET", "Host", "Hosts", "available", "netns_required", "require_netns",
]

#: Where the hosts' addresses are (``.1``, ``.2``, ...): only inside the namespaces.
SUBNET = "10.213.0.0/24"
_PREFIX = "10.213.0."
_IFNAME = "veth0"
_NAME = re.compile(r"^rf-(\d+)-")
_REQUIRED_ENV = ("CI", "RELIABLE_FLOW_REQUIRE_NETNS")
_counter = itertools.count(1)


def netns_required() -> bool:
    """True when a two-host test may not be skipped (CI, or asked for)."""
    return any(os.environ.get(name) for name in _REQUIRED_ENV)


def _ip(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


_available: dict[str, tuple[bool, str]] = {}


def available() -> tuple[bool, str]:
    """(True, "") when this machine can make the test hosts, else (False, why):
    root, ``ip`` and ``nft`` present, a namespace can be made and nftables
    works inside it.  Found once per process."""
    if "result" not in _available:
        _available["result"] = _probe()
    return _available["result"]


def _probe() -> tuple[bool, str]:
    how = "network namespaces for the two-host tests"
    if os.geteuid() != 0:
        return False, f"{how} need root (this process runs as uid {os.geteuid()})"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return False, (f"{how} need {' and '.join(missing)}: install the Debian packages iproute2 and "
                       "nftables (apt-get install iproute2 nftables)")
    name = f"rf-{os.getpid()}-probe"
    try:
        _ip("netns", "add", name)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return False, f"{how}: cannot create one: {exc}"
    try:
        nft = subprocess.run(["ip", "netns", "exec", name, "nft", "list", "ruleset"],
                             check=False, capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
        if nft.returncode != 0:
            return False, f"{how}: nft does not work inside one: {nft.stderr.strip()}"
    finally:
        _ip("netns", "delete", name, check=False)
    return True, ""


def require_netns() -> None:
    """Skip the calling test when the hosts cannot be made here (saying why), or
    fail it when ``CI`` / ``RELIABLE_FLOW_REQUIRE_NETNS`` is set."""
    import pytest

    ok, why = available()
    if ok:
        return
    if netns_required():
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _existing_namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace(name: str) -> None:
    """SIGKILL every process in namespace ``name`` (before it is deleted)."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _delete_namespace(name: str) -> None:
    _kill_namespace(name)
    _ip("netns", "delete", name, check=False)


def _remove_stale() -> None:
    """Namespaces a dead test process left (``rf-<pid>-...``, that pid gone)."""
    for name in _existing_namespaces():
        match = _NAME.match(name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            _delete_namespace(name)


class Host:
    """One test host: a network namespace with ``lo`` and one interface
    (``veth0``) at :attr:`address`."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name  #: the namespace's name (``ip netns exec NAME ...``)
        self.address = address  #: its IPv4 address, e.g. ``10.213.0.1``
        self.ifname = _IFNAME
        self.processes: list[subprocess.Popen[Any]] = []

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run in this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` in this namespace (``ip netns exec`` execs the
        program: the Popen's pid is the program's).  It is SIGKILLed when the
        hosts are removed, if still running."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        proc: subprocess.Popen[Any] = subprocess.Popen(self.command(argv), **kw)
        self.processes.append(proc)
        return proc

    def run(self, argv: Sequence[str], *, check: bool = False, capture_output: bool = True,
            text: bool = True, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` in this namespace (output captured as text by default)."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.command(argv), check=check, capture_output=capture_output,
                              text=text, timeout=timeout, **kw)

    def python(self, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``python -c CODE ARGS...`` (this interpreter) in this namespace."""
        return self.run([sys.executable, "-c", code, *args], timeout=timeout)

    def nft(self, script: str) -> None:
        """Load an nftables script (``nft -f -``) in this namespace."""
        result = self.run(["nft", "-f", "-"], input=script, stdin=None, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"nft in {self.name} failed: {result.stderr.strip()}\n{script}")

    def kill_processes(self) -> None:
        """SIGKILL every process in this namespace, and reap those started here."""
        _kill_namespace(self.name)
        for proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.address}>"


_PARTITION = "rf_partition"
_DROP = "rf_drop"


def _table(name: str, body: str) -> str:
    # Declaring then deleting makes the load idempotent (no error when absent).
    return (f"table inet {name}\ndelete table inet {name}\n"
            f"table inet {name} {{\n{body}}}\n")


class Hosts:
    """``n`` test hosts (2 by default), made on ``__enter__`` (or
    :meth:`create`) and removed on ``__exit__`` (or :meth:`remove`)."""

    def __init__(self, n: int = 2) -> None:
        if n < 2:
            raise ValueError("Hosts needs at least two hosts")
        if n > 250:
            raise ValueError("at most 250 hosts")
        self.tag = f"rf-{os.getpid()}-{next(_counter)}"
        self.hosts = [Host(f"{self.tag}{chr(ord('a') + i) if i < 26 else i}", f"{_PREFIX}{i + 1}")
                      for i in range(n)]
        self.switch: str | None = f"{self.tag}sw" if n > 2 else None
        self._namespaces: list[str] = []
        self._heal_timer: threading.Timer | None = None

    # -- the hosts ---------------------------------------------------------------------

    @property
    def a(self) -> Host:
        return self.hosts[0]

    @property
    def b(self) -> Host:
        return self.hosts[1]

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    # -- making and removing -----------------------------------------------------------

    def create(self) -> Hosts:
        ok, why = available()
        if not ok:
            raise RuntimeError(why)
        _remove_stale()
        cleanup.register(self, self.remove)
        try:
            for name in [h.name for h in self.hosts] + ([self.switch] if self.switch else []):
                _ip("netns", "add", name)
                self._namespaces.append(name)
                _ip("-n", name, "link", "set", "lo", "up")
            if self.switch is None:
                a, b = self.hosts
                _ip("link", "add", _IFNAME, "netns", a.name, "type", "veth", "peer", "name", _IFNAME,
                    "netns", b.name)
            else:
                _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
                _ip("-n", self.switch, "link", "set", "br0", "up")
                for i, host in enumerate(self.hosts):
                    port = f"p{i}"
                    _ip("link", "add", _IFNAME, "netns", host.name, "type", "veth", "peer", "name", port,
                        "netns", self.switch)
                    _ip("-n", self.switch, "link", "set", port, "master", "br0")
                    _ip("-n", self.switch, "link", "set", port, "up")
            for host in self.hosts:
                _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", _IFNAME)
                _ip("-n", host.name, "link", "set", _IFNAME, "up")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Kill every process in the namespaces, then delete them (their veth
        ends go with them).  Again: nothing happens."""
        self._cancel_heal()
        try:
            for host in self.hosts:
                with contextlib.suppress(Exception):
                    host.kill_processes()
            for name in self._namespaces:
                _delete_namespace(name)
            self._namespaces.clear()
        finally:
            cleanup.forget(self)

    def __enter__(self) -> Hosts:  # noqa: PYI034 - no typing_extensions for 3.10
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- faults ------------------------------------------------------------------------

    def _cancel_heal(self) -> None:
        timer, self._heal_timer = self._heal_timer, None
        if timer is not None:
            timer.cancel()

    def partition(self, seconds: float | None = None, hosts: Sequence[Host] | None = None) -> None:
        """Drop every packet in and out of the veth of each of ``hosts`` (all
        by default): TCP connects time out, connections stall.  With
        ``seconds``, :meth:`heal` runs by itself that much later (a timer
        thread: this returns at once)."""
        self._cancel_heal()
        body = (f'  chain input {{ type filter hook input priority -100; policy accept; '
                f'iifname "{_IFNAME}" drop; }}\n'
                f'  chain output {{ type filter hook output priority -100; policy accept; '
                f'oifname "{_IFNAME}" drop; }}\n')
        for host in hosts if hosts is not None else self.hosts:
            host.nft(_table(_PARTITION, body))
        if seconds is not None:
            self._heal_timer = threading.Timer(seconds, self.heal)
            self._heal_timer.daemon = True
            self._heal_timer.start()

    def heal(self) -> None:
        """End the partition (random drops, if any, stay)."""
        self._cancel_heal()
        for host in self.hosts:
            host.run(["nft", "delete", "table", "inet", _PARTITION])  # absent: an error, ignored

    def drop_randomly(self, percent: int) -> None:
        """Drop each packet arriving at any host's veth with ``percent`` %
        chance (``numgen random mod 100 < percent``; 100 drops all, 0 none), as
        a lossy link would: on input, so the sender's kernel sees nothing (an
        output drop would fail its ``sendto`` with EPERM) and each packet gets
        exactly one chance.  Replaces an earlier rate."""
        if not 0 <= percent <= 100:
            raise ValueError("percent is between 0 and 100")
        # (nft's numgen compares to 0..99 only: 100 is a plain drop)
        chance = "" if percent >= 100 else f"numgen random mod 100 < {int(percent)} "
        body = (f'  chain input {{ type filter hook input priority -90; policy accept; '
                f'iifname "{_IFNAME}" {chance}drop; }}\n')
        for host in self.hosts:
            host.nft(_table(_DROP, body))

    def clear_faults(self) -> None:
        """No partition, no random drops."""
        self._cancel_heal()
        for host in self.hosts:
            host.run(["nft", "delete", "table", "inet", _PARTITION])
            host.run(["nft", "delete", "table", "inet", _DROP])

    def __repr__(self) -> str:
        return f"<Hosts {', '.join(h.name for h in self.hosts)}>"

