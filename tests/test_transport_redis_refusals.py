"""A Redis server that refuses the client (issue 30, item 6): a wrong or
missing password, an ACL user without a command the transport needs
(``NOPERM``), protected mode; and a server that is not there.  ``run --to``
and ``bridge`` end with exit 2 and one sentence naming the URL without its
password, never a traceback, at start and in the middle of a run.  An ACL
user with the command set docs/transport.md gives carries events end to end.
A relay-only ``run`` reports only what it did.

Each test has a private ``redis-server`` of its own (tests/redis_server.py),
configured through its Unix socket (``CONFIG SET``, ``ACL SETUSER``).
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_server import RedisServer, import_redis, redis_required
from reliable_flow import Consumer, Producer
from reliable_flow.errors import TransportDenied
from reliable_flow.reservation import RESERVATION
from support import child_env, child_process, commit, run_cli

redis = import_redis()

from reliable_flow.transport.redis import Bridge

pytestmark = pytest.mark.redis

NAME = "default"
SECRET = "s3cret-Pw"

#: The ACL rules docs/transport.md gives for each side (keep them in step).
RELAY_RULES = ("resetkeys", "~rf:*", "resetchannels", "-@all", "+ping", "+select", "+hgetall", "+xadd", "+expire",
               "+xread", "+xdel")
BRIDGE_RULES = ("resetkeys", "~rf:*", "resetchannels", "-@all", "+ping", "+select", "+hset", "+xgroup|create",
                "+xreadgroup", "+xautoclaim", "+xadd", "+expire", "+xack", "+xdel")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private server on loopback TCP, configured by each test."""
    s = RedisServer(bind="127.0.0.1")
    s.start()
    yield s
    s.destroy()


def _url(server: RedisServer, user: str = "", password: str | None = None) -> str:
    auth = "" if password is None else f"{user}:{password}@"
    return f"redis://{auth}127.0.0.1:{server.port}/0"


def _user(server: RedisServer, name: str, *rules: str) -> None:
    server.command("ACL", "SETUSER", name, "reset", "on", f">{SECRET}", *rules)


def _stores(tmp_path: Path, flows: int = 1) -> tuple[str, str]:
    p_at, c_at = str(tmp_path / "producer.db"), str(tmp_path / "consumer.db")
    with Producer(p_at, RESERVATION) as producer:
        for i in range(flows):
            commit(producer, f"F{i}", 2)
    Consumer(c_at, RESERVATION).close()
    return p_at, c_at


def _run_to(p_at: str, url: str, tmp_path: Path) -> Any:
    return run_cli("run", "--producer", p_at, "--to", url, "--consumer", NAME, "--until-idle", "--send-timeout", "5",
                   "--report-every", "0", cwd=tmp_path, timeout=60)


def _bridge(c_at: str, url: str, tmp_path: Path) -> Any:
    return run_cli("bridge", c_at, "--redis", url, "--once", "--report-every", "0", cwd=tmp_path, timeout=60)


def _one_sentence(done: Any, command: str, url_shown: str, *words: str) -> str:
    """The command ended with exit 2 and one line naming the URL (password masked)."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{command}: ") and url_shown in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_wrong_or_missing_password_is_exit_2_and_one_sentence(server: RedisServer, tmp_path: Path) -> None:
    p_at, c_at = _stores(tmp_path)
    server.command("CONFIG", "SET", "requirepass", SECRET)
    wrong = _url(server, "", "not-it")
    masked = f"redis://:***@127.0.0.1:{server.port}/0"
    _one_sentence(_run_to(p_at, wrong, tmp_path), "run", masked, "refused the password")
    _one_sentence(_bridge(c_at, wrong, tmp_path), "bridge", masked, "refused the password")
    none = _url(server)
    _one_sentence(_run_to(p_at, none, tmp_path), "run", none, "requires a password")
    _one_sentence(_bridge(c_at, none, tmp_path), "bridge", none, "requires a password")
    right = _url(server, "", SECRET)
    with Consumer(c_at, RESERVATION) as consumer, Bridge(consumer, right):
        pass  # announced: the right password is all it took
    once = run_cli("run", "--producer", p_at, "--to", right, "--consumer", NAME, "--once", "--send-timeout", "1",
                   "--report-every", "0", cwd=tmp_path, timeout=60)
    assert once.returncode == 0, once.stderr  # no bridge serves: a failed send, retried later, not a refusal


def test_a_wrong_acl_user_is_exit_2(server: RedisServer, tmp_path: Path) -> None:
    p_at, c_at = _stores(tmp_path)
    _user(server, "relay", *RELAY_RULES)
    url = _url(server, "relay", "not-it")
    masked = f"redis://relay:***@127.0.0.1:{server.port}/0"
    _one_sentence(_run_to(p_at, url, tmp_path), "run", masked, "refused the password or ACL user")
    _one_sentence(_bridge(c_at, url, tmp_path), "bridge", masked, "refused the password or ACL user")


def test_an_acl_user_without_a_command_ends_the_bridge_at_start(server: RedisServer, tmp_path: Path) -> None:
    _p_at, c_at = _stores(tmp_path)
    _user(server, "bridge", *(r for r in BRIDGE_RULES if r != "+xgroup|create"))
    url = _url(server, "bridge", SECRET)
    line = _one_sentence(_bridge(c_at, url, tmp_path), "bridge", f"redis://bridge:***@127.0.0.1:{server.port}/0",
                         "refused a command", "xgroup")
    assert "docs/transport.md" in line


def test_an_acl_user_without_a_command_ends_the_bridge_mid_run(server: RedisServer, tmp_path: Path) -> None:
    """Announced, then XREADGROUP taken away: the next pass raises TransportDenied."""
    _p_at, c_at = _stores(tmp_path)
    _user(server, "bridge", *(r for r in BRIDGE_RULES if r != "+xreadgroup"))
    with Consumer(c_at, RESERVATION) as consumer, Bridge(consumer, _url(server, "bridge", SECRET),
                                                        block=0.1) as bridge:
        with pytest.raises(TransportDenied, match="xreadgroup"):
            bridge.run(max_passes=3, handle_signals=False)
        assert bridge.stats.errors == 1  # recorded once, then raised: not retried for ever


def test_an_acl_user_without_a_command_ends_run_to_mid_run(server: RedisServer, tmp_path: Path) -> None:
    """PING passes at start; the first send is refused (no XADD): exit 2, the
    stopped line and one sentence, no traceback."""
    p_at, c_at = _stores(tmp_path)
    with Consumer(c_at, RESERVATION) as consumer, Bridge(consumer, _url(server)):
        pass  # announced by the (password-less) default user
    _user(server, "relay", *(r for r in RELAY_RULES if r != "+xadd"))
    done = _run_to(p_at, _url(server, "relay", SECRET), tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("run: cannot go on: TransportDenied: ") and "'xadd'" in last, done.stderr
    assert f"redis://relay:***@127.0.0.1:{server.port}/0" in last


def test_the_documented_acl_rules_carry_events_end_to_end(server: RedisServer, tmp_path: Path) -> None:
    p_at, c_at = _stores(tmp_path, flows=3)
    _user(server, "relay", *RELAY_RULES)
    _user(server, "bridge", *BRIDGE_RULES)
    server.command("ACL", "SETUSER", "default", "off")  # nothing else may connect
    bridge_url, relay_url = _url(server, "bridge", SECRET), _url(server, "relay", SECRET)
    args = [sys.executable, "-m", "reliable_flow", "bridge", c_at, "--redis", bridge_url, "--report-every", "0"]
    with child_process(args, cwd=tmp_path, env=child_env()) as proc:
        assert proc.stderr is not None
        started = proc.stderr.readline()  # written once the bridge has announced: no race with the run
        assert started.startswith("bridge: serving consumer"), started
        done = _run_to(p_at, relay_url, tmp_path)
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.rsplit("run: stopped: ", 1)[1])["relayed"] == {"accepted": 6}
    assert proc.returncode == 0, err
    assert "Traceback" not in err and SECRET not in err + done.stderr
    # what the bridge published (HSET, EXPIRE) the producer's inspect reads as the relay's user (HGETALL)
    seen = run_cli("inspect", p_at, relay_url, cwd=tmp_path)
    assert seen.returncode == 0, seen.stderr
    assert "0 effects owe a step" in seen.stdout and SECRET not in seen.stdout + seen.stderr, seen.stdout
    # the consumer's full report, asked of its bridge as the relay's user (XADD, XREAD), answered by the
    # bridge's (XREADGROUP, XADD, EXPIRE, XACK, XDEL)
    with child_process(args, cwd=tmp_path, env=child_env()) as proc:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("bridge: serving consumer")
        seen = run_cli("inspect", p_at, f"{relay_url}#{NAME}", cwd=tmp_path)
        proc.terminate()
        proc.communicate(timeout=30)
    assert seen.returncode == 0, seen.stderr
    assert "no blocked events, no gaps" in seen.stdout and SECRET not in seen.stdout + seen.stderr, seen.stdout


def test_a_relay_only_run_reports_only_what_it_did(server: RedisServer, tmp_path: Path) -> None:
    p_at, c_at = _stores(tmp_path, flows=2)
    with Consumer(c_at, RESERVATION) as consumer, Bridge(consumer, _url(server)):
        pass
    args = [sys.executable, "-m", "reliable_flow", "bridge", c_at, "--redis", _url(server), "--report-every", "0"]
    with child_process(args, cwd=tmp_path, env=child_env()) as proc:
        done = run_cli("run", "--producer", p_at, "--to", _url(server), "--consumer", NAME, "--until-idle",
                       "--report-every", "0.001", cwd=tmp_path, timeout=60)
        proc.terminate()
        proc.communicate(timeout=30)
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line.split(": ", 1)[1]) for line in done.stderr.splitlines()
               if line.startswith("run: {")]
    stopped = json.loads(done.stderr.rsplit("run: stopped: ", 1)[1])
    assert reports, done.stderr
    for counts in [*reports, stopped]:
        assert set(counts) == {"passes", "relayed", "errors", "last_error"}, counts
    assert stopped["relayed"] == {"accepted": 4}
    local = run_cli("run", "--producer", p_at, "--consumer", f"other={tmp_path / 'other.db'}", "--register",
                    "--until-idle", "--report-every", "0", cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stderr.rsplit("run: stopped: ", 1)[1])["applied"] == 4  # a local consumer: applied


def _outside_address() -> str | None:
    """An address of this host that is not loopback (a client from it is
    "another host" to protected mode), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the outgoing address
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_protected_mode_is_exit_2_and_one_sentence(tmp_path: Path) -> None:
    address = _outside_address()
    if address is None:
        if redis_required():
            pytest.fail("no non-loopback address to reach protected mode from", pytrace=False)
        pytest.skip("no non-loopback address to reach protected mode from")
    p_at, c_at = _stores(tmp_path)
    server = RedisServer(bind="0.0.0.0", config={"protected-mode": "yes"})
    try:
        server.start()
        url = f"redis://{address}:{server.port}/0"
        _one_sentence(_run_to(p_at, url, tmp_path), "run", url, "protected mode")
        _one_sentence(_bridge(c_at, url, tmp_path), "bridge", url, "protected mode")
    finally:
        server.destroy()


def test_no_server_is_exit_2_and_one_sentence(tmp_path: Path) -> None:
    p_at, c_at = _stores(tmp_path)
    url = "redis://:pw-not-shown@127.0.0.1:1/0"
    masked = "redis://:***@127.0.0.1:1/0"
    assert "pw-not-shown" not in _one_sentence(_run_to(p_at, url, tmp_path), "run", masked, "cannot reach Redis")
    _one_sentence(_bridge(c_at, url, tmp_path), "bridge", masked, "cannot reach Redis")
