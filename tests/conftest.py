from __future__ import annotations

from pathlib import Path

import pytest

from reliable_flow import Consumer, Producer
from reliable_flow.reservation import RESERVATION

# The shared helpers (support.py) assert too: let pytest explain their failures
# like a test's.  Registered here, before any test module imports them.
pytest.register_assert_rewrite("support")


@pytest.fixture
def new_store(engine: str, tmp_path: Path):
    """``new_store(label)`` -> a fresh store location on the test's engine:
    a SQLite file under ``tmp_path`` or a new PostgreSQL schema (see
    ``engine_reads.new_location``)."""
    from engine_reads import new_location

    return lambda label="store": new_location(engine, tmp_path, label)


@pytest.fixture
def at(new_store):
    """``at(label)`` -> the store location named ``label`` on the test's engine,
    the same one on every call of the test (``new_store`` once per label): a
    SQLite file ``<label>.db`` under ``tmp_path`` or a PostgreSQL schema."""
    made: dict[str, str] = {}

    def location(label: str) -> str:
        if label not in made:
            made[label] = new_store(label)
        return made[label]

    return location


@pytest.fixture
def producer(new_store) -> Producer:
    """A reservation Producer on a fresh store of the test's engine (both engines;
    SQLite only under tests/sqlite/, whose conftest pins ``engine``)."""
    p = Producer(new_store("producer"), RESERVATION)
    yield p
    p.close()


@pytest.fixture
def consumer(new_store) -> Consumer:
    """A reservation Consumer (name "default") on a fresh store of the test's engine."""
    c = Consumer(new_store("consumer"), RESERVATION)
    yield c
    c.close()


# -- PostgreSQL: one private server for the whole run, started on first use ------------
# (the machinery is in pg_cluster.py, so the contract suite's conftest can use it too)

import os

from pg_cluster import get_pg_cluster, import_psycopg, pg_location


@pytest.fixture(scope="session")
def pg_cluster():
    """The private PostgreSQL server (``tests/pg_cluster.PgCluster``) of this run,
    started on first use; skipped (failed under CI) when it cannot start."""
    return get_pg_cluster()


@pytest.fixture
def pg_schema_location(pg_cluster) -> str:
    """A fresh, empty PostgreSQL store location (a new schema) for one test."""
    return pg_location("loc")


# -- Redis: one private server for the whole run, started on first use ----------------
# (the machinery is in redis_server.py; the two-host set-up in netns.py)

from redis_server import get_redis_server


@pytest.fixture(scope="session")
def redis_server():
    """The private Redis server (``tests/redis_server.RedisServer``, Unix socket
    only) of this run, started on first use; skipped (failed under CI or
    RELIABLE_FLOW_REQUIRE_REDIS) when it cannot start."""
    return get_redis_server()


@pytest.fixture
def redis_url(redis_server) -> str:
    """The session server's ``unix://...?db=0`` URL, every database emptied
    (FLUSHALL) before the test; the server started again if a test stopped it."""
    server = get_redis_server()
    server.flushall()
    return server.url(db=0)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """Stop every private server still running and remove the test hosts, after
    the fixtures' teardown: also when the run was interrupted (Ctrl-C, or
    SIGTERM / SIGHUP, which tests/cleanup.py turns into the same unwinding)."""
    import cleanup

    cleanup.stop_all()


# -- a service a test needs may not silently go missing ---------------------------------
# (environment variable, marker, words in a module's skip reason, what)

_REQUIREMENTS = (
    ("RELIABLE_FLOW_REQUIRE_POSTGRES", "postgres", ("psycopg", "PostgreSQL"), "PostgreSQL"),
    ("RELIABLE_FLOW_REQUIRE_REDIS", "redis", ("redis",), "Redis"),
    ("RELIABLE_FLOW_REQUIRE_NETNS", "netns", ("network namespace",), "two-host (network namespace)"),
    ("RELIABLE_FLOW_REQUIRE_BROWSER", "browser", ("selenium", "chromium", "browser"), "browser (headless chromium)"),
)


def _skip_reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """With RELIABLE_FLOW_REQUIRE_POSTGRES (_REDIS, _NETNS, _BROWSER) set, a module skipped
    for want of that service or its client (``pytest.importorskip("psycopg")``
    at its top, say) is a failure too."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped:
        return
    reason = _skip_reason(report)
    for env, _marker, words, what in _REQUIREMENTS:
        if os.environ.get(env) and any(word.lower() in reason.lower() for word in words):
            report.outcome = "failed"
            report.longrepr = f"{what} tests were skipped, and {env} is set: {reason}"
            return


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With RELIABLE_FLOW_REQUIRE_POSTGRES (_REDIS, _NETNS, _BROWSER) set, a skipped
    ``postgres`` (``redis``, ``netns``, ``browser``) test is a failure."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped:
        return
    if item.get_closest_marker("soak") is not None and not os.environ.get("RELIABLE_FLOW_SOAK"):
        return  # an opt-in soak left out on purpose, not for want of its service
    for env, marker, _words, what in _REQUIREMENTS:
        if os.environ.get(env) and item.get_closest_marker(marker) is not None:
            report.outcome = "failed"
            report.longrepr = f"a {what} test was skipped, and {env} is set: {_skip_reason(report)}"
            return


# -- both engines ---------------------------------------------------------------------------

from engine_reads import ENGINES


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """``"sqlite"`` or ``"postgres"`` (the private server started, or the
    test skipped / failed as ``pg_cluster`` says); with
    ``engine_reads.new_location`` for fresh stores."""
    if request.param == "postgres":
        import_psycopg()
        request.getfixturevalue("pg_cluster")
    return str(request.param)
