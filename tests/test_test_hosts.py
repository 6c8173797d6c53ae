"""The test harness of the Redis transport, tried for real: a private
``redis-server`` (``tests/redis_server.py``) and two test hosts in network
namespaces (``tests/netns.py``) with their faults."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redis_server import MISSING, RedisServer, import_redis, redis_required


def _need_redis() -> None:
    if MISSING is not None:
        if redis_required():
            pytest.fail(MISSING, pytrace=False)
        pytest.skip(MISSING)


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.redis
def test_a_private_server_answers_through_its_url_and_is_gone_after_stop() -> None:
    _need_redis()
    redis = import_redis()
    server = RedisServer()
    try:
        server.start()
        assert server.url().startswith("unix:///tmp/rf-redis-")
        client = redis.Redis.from_url(server.url(db=3))
        assert client.ping() is True
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert server.command("CONFIG", "GET", "save") == [b"save", b""]
        assert server.command("CONFIG", "GET", "appendonly") == [b"appendonly", b"no"]
        client.close()
        pid = server.pid()
        assert pid is not None
        server.stop()
        assert server.pid() is None and _dead(pid)
        assert not server.socket.exists()
    finally:
        server.destroy()
    assert not server.root.exists()


@pytest.mark.redis
def test_kill_then_start_serves_again_on_the_same_socket_and_tcp_port() -> None:
    _need_redis()
    redis = import_redis()
    with RedisServer(bind="127.0.0.1") as server:
        assert server.url() == f"redis://127.0.0.1:{server.port}/0"
        tcp = redis.Redis.from_url(server.url())
        assert tcp.ping() is True
        first = server.pid()
        assert first is not None
        server.kill()
        assert server.pid() is None and _dead(first)
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(server.unix_url(), socket_timeout=1).ping()
        server.start()
        assert server.pid() not in (None, first)
        assert redis.Redis.from_url(server.unix_url()).ping() is True
        assert redis.Redis.from_url(server.tcp_url(db=1)).ping() is True


@pytest.mark.redis
def test_the_session_server_gives_each_test_an_empty_database(redis_url: str) -> None:
    redis = import_redis()
    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 0
    client.set("left", "behind")  # the next test's redis_url flushes it
    client.close()


# -- two hosts ------------------------------------------------------------------------------

#: Run in host a: connect to ADDRESS:PORT, PING, print what came back; exit 1 on a timeout.
_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        s.sendall(b"PING\\r\\n")
        print(s.recv(100).decode().strip())
except OSError as exc:
    print(type(exc).__name__, exc)
    sys.exit(1)
"""


def _ping_from(host, server: RedisServer, timeout: float = 0.5) -> subprocess.CompletedProcess[str]:
    assert server.bind is not None
    return host.python(_CLIENT, server.bind, str(server.port), str(timeout))


@pytest.fixture
def hosts():
    from netns import Hosts, require_netns

    require_netns()
    with Hosts() as made:
        yield made
    listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    assert all(h.name not in listed for h in made), listed


@pytest.mark.netns
@pytest.mark.redis
def test_two_hosts_talk_over_their_veth_until_partitioned_or_dropping(hosts) -> None:
    _need_redis()
    a, b = hosts.a, hosts.b
    assert (a.address, b.address) == ("10.213.0.1", "10.213.0.2")
    server = RedisServer(bind=b.address, netns=b)
    try:
        server.start()
        assert server.url() == "redis://10.213.0.2:6379/0"
        listed = subprocess.run(["ip", "netns", "pids", b.name], check=False, capture_output=True, text=True).stdout
        assert str(server.pid()) in listed.split()  # ip netns exec execs the server itself
        # Not reachable from outside the namespaces (the address means nothing
        # there: the packets go wherever the default route leads, not to b).
        outside = subprocess.run([sys.executable, "-c", _CLIENT, b.address, "6379", "0.3"],
                                 check=False, capture_output=True, text=True, timeout=30)
        assert "+PONG" not in outside.stdout, outside.stdout

        assert _ping_from(a, server).stdout.strip() == "+PONG"

        hosts.partition()
        started = time.monotonic()
        blocked = _ping_from(a, server)
        assert blocked.returncode == 1 and "timed out" in blocked.stdout, blocked.stdout
        assert time.monotonic() - started < 10
        hosts.heal()
        assert _ping_from(a, server).stdout.strip() == "+PONG"

        hosts.drop_randomly(100)
        assert _ping_from(a, server).returncode == 1
        hosts.clear_faults()
        assert _ping_from(a, server).stdout.strip() == "+PONG"

        hosts.partition(seconds=0.3)  # heals by itself
        time.sleep(0.6)
        assert _ping_from(a, server, timeout=2).stdout.strip() == "+PONG"
    finally:
        server.destroy()


@pytest.mark.netns
def test_leaving_the_hosts_kills_their_processes_and_removes_the_namespaces() -> None:
    from netns import Hosts, require_netns

    require_netns()
    with Hosts(3) as made:
        names = [h.name for h in made]
        sleeper = made[2].popen(["sleep", "60"])
        reply = made[0].python(_CLIENT, made[2].address, "9", "0.5")  # nothing listens: refused
        assert "ConnectionRefused" in reply.stdout, reply.stdout
    assert sleeper.poll() is not None
    listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    assert not any(name in listed for name in names), listed
    assert not any(line.startswith(f"rf-{os.getpid()}-") for line in listed.splitlines())
