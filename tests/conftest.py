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

from pg_cluster import get_pg_cluster, import_psycopg, pg_location, stop_all_clusters


@pytest.fixture(scope="session")
def pg_cluster():
    """The private PostgreSQL server (``tests/pg_cluster.PgCluster``) of this run,
    started on first use; skipped (failed under CI) when it cannot start."""
    return get_pg_cluster()


@pytest.fixture
def pg_schema_location(pg_cluster) -> str:
    """A fresh, empty PostgreSQL store location (a new schema) for one test."""
    return pg_location("loc")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """Stop every private server still running, after the fixtures' teardown:
    also when the run was interrupted (Ctrl-C, or SIGTERM, which pg_cluster
    turns into the same unwinding)."""
    stop_all_clusters()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """With RELIABLE_FLOW_REQUIRE_POSTGRES set, a module skipped for want of
    psycopg (``pytest.importorskip("psycopg")`` at its top) is a failure too."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("RELIABLE_FLOW_REQUIRE_POSTGRES"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "psycopg" in reason or "PostgreSQL" in reason:
            report.outcome = "failed"
            report.longrepr = f"PostgreSQL tests were skipped, and RELIABLE_FLOW_REQUIRE_POSTGRES is set: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With RELIABLE_FLOW_REQUIRE_POSTGRES set, a skipped ``postgres`` test is a failure."""
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped and os.environ.get("RELIABLE_FLOW_REQUIRE_POSTGRES")
        and item.get_closest_marker("postgres") is not None
    ):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"a PostgreSQL test was skipped, and RELIABLE_FLOW_REQUIRE_POSTGRES is set: {reason}"


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
