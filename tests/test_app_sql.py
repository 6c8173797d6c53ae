"""The application's SQL, the same on both engines: a handler's
``ctx.execute`` with ``?`` placeholders (translated for PostgreSQL outside
literals and comments), ``ctx.engine``, and ``AppSchema`` migrations given
per engine.

Every test runs on a SQLite file and on a PostgreSQL schema (the ``engine``
fixture); the ones about PostgreSQL's translation alone run there only.
The translation on the text alone is in ``test_placeholders.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_reads import new_location, rows
from reliable_flow import ApplyContext, AppSchema, Consumer
from reliable_flow._handlers import Handler
from reliable_flow.reservation import RESERVATION
from support import envelope

# Each engine's own way to number rows; the index is the same SQL on both.
SHOP = AppSchema("shop", [
    {"sqlite": ["CREATE TABLE note(id INTEGER PRIMARY KEY AUTOINCREMENT, flow TEXT NOT NULL, text TEXT NOT NULL)"],
     "postgres": ["CREATE TABLE note(id BIGSERIAL PRIMARY KEY, flow TEXT NOT NULL, text TEXT NOT NULL)"]},
    ["CREATE INDEX note_flow ON note(flow)"],
])


def consumer(location: Any, handler: Handler, schema: AppSchema = SHOP) -> Consumer:
    return Consumer(location, RESERVATION, handlers=(handler,), app_schema=schema)


def apply_one(c: Consumer, flow: str = "A") -> str:
    """Receive step 1 of ``flow`` and apply it; the apply status."""
    assert c.receive(envelope(f"{flow}1", flow, 1)).status == "accepted"
    return str(c.apply_next(flow).status)


@pytest.fixture
def postgres(pg_cluster: Any) -> str:
    pytest.importorskip("psycopg")
    return "postgres"


# -- ? placeholders on both engines ---------------------------------------------------------------


def test_question_mark_sql_writes_and_reads_app_rows_on_both_engines(engine: str, tmp_path: Path) -> None:
    location = new_location(engine, tmp_path, "consumer")
    seen: list[Any] = []

    def handler(ctx: ApplyContext) -> None:
        seen.append(ctx.engine)
        ctx.execute(
            "INSERT INTO note(flow, text) -- why? because.\n"
            "VALUES (?, 'who''s there? 100%') /* and where? */",
            (ctx.event.flow_id,),
        )
        ctx.execute("INSERT INTO note(flow, text) VALUES (?, ?)", (ctx.event.flow_id, "it's ?"))
        seen.append(ctx.execute(
            "SELECT id, text FROM note WHERE flow = ? AND text LIKE '%?%' AND text <> '?' ORDER BY id",
            (ctx.event.flow_id,),
        ))

    with consumer(location, handler) as c:
        assert apply_one(c) == "applied"
    assert seen == [engine, [(1, "who's there? 100%"), (2, "it's ?")]]
    assert rows(location, "SELECT id, flow, text FROM note ORDER BY id") == [
        (1, "A", "who's there? 100%"), (2, "A", "it's ?")]


def test_per_engine_migrations_apply_once_and_record_the_same_versions(engine: str, tmp_path: Path) -> None:
    location = new_location(engine, tmp_path, "consumer")
    consumer(location, lambda ctx: None).close()
    assert rows(location, "SELECT name, version FROM app_schema") == [("shop", 2)]
    # Appending a third migration (one SQL for both) runs only that one.
    more = AppSchema("shop", [*SHOP.migrations, ["INSERT INTO note(flow, text) VALUES ('-', 'v3')"]])
    for _ in range(2):
        consumer(location, lambda ctx: None, more).close()
    assert rows(location, "SELECT name, version FROM app_schema") == [("shop", 3)]
    assert rows(location, "SELECT id, flow, text FROM note") == [(1, "-", "v3")]


def test_a_handler_branches_on_ctx_engine_for_sql_that_differs(engine: str, tmp_path: Path) -> None:
    location = new_location(engine, tmp_path, "consumer")
    found: list[Any] = []
    by_engine = {
        "sqlite": "SELECT json_extract(?, '$.amount') IS NOT NULL",
        "postgres": "SELECT CAST(? AS jsonb) ?? 'amount'",  # jsonb's ? operator, doubled
    }

    def handler(ctx: ApplyContext) -> None:
        found.append(bool(ctx.execute(by_engine[ctx.engine], ('{"amount": 3}',))[0][0]))

    with consumer(location, handler) as c:
        assert apply_one(c) == "applied"
    assert found == [True]


def test_a_placeholder_count_mismatch_is_the_drivers_error_and_leaves_nothing(engine: str, tmp_path: Path) -> None:
    location = new_location(engine, tmp_path, "consumer")

    def handler(ctx: ApplyContext) -> None:
        ctx.execute("INSERT INTO note(flow, text) VALUES (?, 'x')", (ctx.event.flow_id,))
        ctx.execute("INSERT INTO note(flow, text) VALUES (?, ?)", (ctx.event.flow_id,))

    with consumer(location, handler) as c:
        assert c.receive(envelope("A1", "A", 1)).status == "accepted"
        with pytest.raises(Exception, match=r"(?i)bindings|placeholder"):
            c.apply_next("A")
        assert c.projection("A") is None
    assert rows(location, "SELECT count(*) FROM note") == [(0,)]


def test_named_placeholders_are_refused_before_anything_runs(engine: str, tmp_path: Path) -> None:
    location = new_location(engine, tmp_path, "consumer")
    errors: list[Exception] = []

    def handler(ctx: ApplyContext) -> None:
        for params in ({"flow": ctx.event.flow_id}, ctx.event.flow_id):  # a mapping; one string (not a list)
            try:
                ctx.execute("INSERT INTO note(flow, text) VALUES (:flow, 'x')", params)
            except TypeError as exc:
                errors.append(exc)

    with consumer(location, handler) as c:
        assert apply_one(c) == "applied"
    assert len(errors) == 2 and all("params must be a sequence" in str(e) for e in errors)
    assert rows(location, "SELECT count(*) FROM note") == [(0,)]


# -- PostgreSQL's translation ---------------------------------------------------------------------


def test_psycopg_style_sql_without_question_marks_still_runs_on_postgres(postgres: str, tmp_path: Path) -> None:
    location = new_location(postgres, tmp_path, "consumer")

    def handler(ctx: ApplyContext) -> None:
        ctx.execute("INSERT INTO note(flow, text) VALUES (%s, %s)", (ctx.event.flow_id, "50%"))
        ctx.execute("INSERT INTO note(flow, text) VALUES ('B', '100%')")  # no parameters: % is plain

    with consumer(location, handler) as c:
        assert apply_one(c) == "applied"
    assert rows(location, "SELECT flow, text FROM note ORDER BY id") == [("A", "50%"), ("B", "100%")]


def test_mixing_question_marks_and_psycopg_placeholders_is_refused_on_postgres(
    postgres: str, tmp_path: Path,
) -> None:
    location = new_location(postgres, tmp_path, "consumer")

    def handler(ctx: ApplyContext) -> None:
        ctx.execute("INSERT INTO note(flow, text) VALUES (?, %s)", (ctx.event.flow_id, "x"))

    with consumer(location, handler) as c:
        assert c.receive(envelope("A1", "A", 1)).status == "accepted"
        with pytest.raises(ValueError, match=r"sql mixes \? placeholders with psycopg's '%s'"):
            c.apply_next("A")
        assert c.projection("A") is None
    assert rows(location, "SELECT count(*) FROM note") == [(0,)]


def test_dollar_quoted_and_escaped_literals_keep_their_question_marks_on_postgres(
    postgres: str, tmp_path: Path,
) -> None:
    location = new_location(postgres, tmp_path, "consumer")

    def handler(ctx: ApplyContext) -> None:
        ctx.execute("INSERT INTO note(flow, text) VALUES (?, $$a ? b$$ || E'\\'?\\'' || $t$ $$?$$ $t$ || ?)",
                    (ctx.event.flow_id, "!"))

    with consumer(location, handler) as c:
        assert apply_one(c) == "applied"
    assert rows(location, "SELECT text FROM note") == [("a ? b'?' $$?$$ !",)]
