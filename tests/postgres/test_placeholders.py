"""The ``?`` -> ``%s`` translation of the application's SQL for PostgreSQL
(``_store/postgres/placeholders.py``), on the text alone: no server.

What runs on a real server (both engines, through a handler) is in
``test_app_sql.py``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")  # the module is pure Python, but its package opens with the engine

from reliable_flow._store.postgres.placeholders import pyformat, split


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT ?", "SELECT %s"),
    ("INSERT INTO t(a, b) VALUES (?,?)", "INSERT INTO t(a, b) VALUES (%s,%s)"),
    ("SELECT ?::int + ?", "SELECT %s::int + %s"),
    # string literals keep their "?", doubled quotes included
    ("SELECT 'it''s ?', ?", "SELECT 'it''s ?', %s"),
    ("SELECT '?'||?||'?'", "SELECT '?'||%s||'?'"),
    ("SELECT '', ?", "SELECT '', %s"),
    # E'' strings: a backslash escapes the quote; elsewhere it does not
    ("SELECT E'it\\'s ?', ?", "SELECT E'it\\'s ?', %s"),
    ("SELECT e'\\\\', ?", "SELECT e'\\\\', %s"),
    ("SELECT E'x''\\'?', ?", "SELECT E'x''\\'?', %s"),  # a doubled quote, then an escaped one
    ("SELECT 'a\\', ?", "SELECT 'a\\', %s"),
    ("SELECT name'x\\', ?", "SELECT name'x\\', %s"),  # not an E prefix: part of a name
    ("SELECT U&'d\\0061t?', ?", "SELECT U&'d\\0061t?', %s"),
    # quoted identifiers
    ('SELECT "why?", "a""?" FROM t WHERE x = ?', 'SELECT "why?", "a""?" FROM t WHERE x = %s'),
    # dollar quotes, plain and tagged; a tag's $$ inside does not close it
    ("SELECT $$ ? ' $$, ?", "SELECT $$ ? ' $$, %s"),
    ("SELECT $fn$ a ? $$ b ? $fn$, ?", "SELECT $fn$ a ? $$ b ? $fn$, %s"),
    ("SELECT a$b$ , ?", "SELECT a$b$ , %s"),  # "$" inside a name opens nothing
    ("SELECT $1, ?", "SELECT $1, %s"),  # a numbered parameter is no tag
    # comments: line, block, nested block
    ("SELECT ? -- why?\n, ?", "SELECT %s -- why?\n, %s"),
    ("SELECT ? -- why?", "SELECT %s -- why?"),
    ("/* a? /* b? */ c? */ SELECT ?", "/* a? /* b? */ c? */ SELECT %s"),
    ("SELECT 1-?", "SELECT 1-%s"),
    ("SELECT 6/?", "SELECT 6/%s"),
    # % is psycopg's: doubled everywhere once parameters are used
    ("SELECT * FROM t WHERE a LIKE 'x%' AND b = ?", "SELECT * FROM t WHERE a LIKE 'x%%' AND b = %s"),
    ("SELECT ? % 2, $$50%$$ -- 100%\n", "SELECT %s %% 2, $$50%%$$ -- 100%%\n"),
    ("SELECT a %sum FROM t WHERE b = ?", "SELECT a %%sum FROM t WHERE b = %s"),  # modulo, not %s
    # PostgreSQL's own ? operators, written ??
    ("SELECT data ?? 'k' FROM t WHERE id = ?", "SELECT data ? 'k' FROM t WHERE id = %s"),
    ("SELECT data ??| ?, data ??& ?", "SELECT data ?| %s, data ?& %s"),
    ("SELECT data ??? FROM t", "SELECT data ?%s FROM t"),
    ("SELECT data ?? 'k' FROM t", "SELECT data ? 'k' FROM t"),
    # unterminated: the rest is the literal / comment; the server says what is wrong
    ("SELECT ?, 'abc?", "SELECT %s, 'abc?"),
    ("SELECT ? /* ?", "SELECT %s /* ?"),
    ("SELECT ?, $x$ ?", "SELECT %s, $x$ ?"),
])
def test_question_marks_outside_literals_and_comments_become_psycopg_placeholders(sql: str, expected: str) -> None:
    assert pyformat(sql) == expected


@pytest.mark.parametrize("sql", [
    "SELECT 1",
    "SELECT %s",  # psycopg's own style, as before ? was accepted
    "INSERT INTO t VALUES (%s, %(name)s, 'x%%')",
    "SELECT 'why?', \"who?\", $$ ? $$ -- ?\n/* ? */",
    "SELECT * FROM t WHERE a LIKE 'x%'",  # no parameters: no % is read
    "",
])
def test_sql_without_question_marks_is_passed_unchanged(sql: str) -> None:
    assert pyformat(sql) is None


@pytest.mark.parametrize("sql", [
    "SELECT ?, %s",
    "SELECT %s WHERE a = ?",
    "SELECT ?, %(name)s",
    "SELECT ?, %b",
    "SELECT ?, %t",
    "SELECT data ? %s",  # the old way of writing jsonb's ? with psycopg: ambiguous now
])
def test_mixing_question_marks_with_psycopg_placeholders_is_refused(sql: str) -> None:
    with pytest.raises(ValueError, match=r"sql mixes \? placeholders with psycopg's"):
        pyformat(sql)


@pytest.mark.parametrize("sql", [
    "SELECT ?, 'it''s ?', E'a\\'b', \"c\"\"d\", $t$ x $t$ -- e\n/* f /* g */ */ a$b$ %",
    "SELECT 'abc",
    "/* open",
    "",
    "$$",
])
def test_split_keeps_every_character_in_order(sql: str) -> None:
    assert "".join(text for _, text in split(sql)) == sql


def test_split_tells_code_from_literals_and_comments() -> None:
    assert list(split("SELECT 'a''' || \"b\"\"\" -- c\n/* d */ $$e$$")) == [
        (True, "SELECT "), (False, "'a'''"), (True, " || "), (False, '"b"""'), (True, " "), (False, "-- c\n"),
        (False, "/* d */"), (True, " "), (False, "$$e$$"),
    ]
