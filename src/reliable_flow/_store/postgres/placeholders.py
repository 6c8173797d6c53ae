"""The application's ``?`` placeholders, turned into psycopg's ``%s``.

A handler's ``ctx.execute(sql, params)`` takes SQLite's ``?`` placeholders
on both engines.  :func:`pyformat` rewrites a statement for psycopg:

* each ``?`` outside string literals (``'...'`` with ``''`` doubled quotes,
  ``E'...'`` with backslash escapes), quoted identifiers (``"..."``),
  dollar-quoted strings (``$$...$$``, ``$tag$...$tag$``) and comments
  (``-- ...``, nested ``/* ... */``) becomes ``%s``;
* ``??`` there becomes one literal ``?``: how PostgreSQL's operators that
  contain a question mark are written (jsonb ``?``, ``?|``, ``?&`` as
  ``??``, ``??|``, ``??&``; or call ``jsonb_exists(...)`` and its kin);
* every ``%`` anywhere (a ``LIKE 'a%'`` pattern, the modulo operator)
  becomes ``%%``, since psycopg reads ``%`` in the whole text once
  parameters are given.

A statement with no ``?`` outside literals and comments is left alone
(:func:`pyformat` returns None): it is written in psycopg's own ``%s`` style,
as before ``?`` was accepted, or takes no parameters.  A statement that has
both (``?`` and ``%s`` / ``%(name)s``) is refused: which one was meant cannot
be told.  Named placeholders are not supported.

Pure Python, no psycopg: the text only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = ["pyformat", "split"]

# A dollar quote's tag follows the rules of an identifier, without "$".
_DOLLAR_TAG = re.compile(r"\$(?:[^\W\d]\w*)?\$")
# psycopg's own placeholders: %s, %b, %t, %(name)s (not "% s" or "%sum": a modulo).
_PSYCOPG = re.compile(r"%(?:\([^)]*\))?[sbt](?!\w)")
_QUESTION = re.compile(r"\?\??")


def _identifier_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$"


def _quoted_end(sql: str, start: int, quote: str, backslash: bool) -> int:
    """Where the quoted text opened at ``start`` ends (past its closing
    quote; the end of ``sql`` when it is never closed: the server says so)."""
    j = start + 1
    while j < len(sql):
        ch = sql[j]
        if backslash and ch == "\\":
            j += 2
        elif ch == quote:
            if not sql.startswith(quote, j + 1):
                return j + 1
            j += 2  # a doubled quote stands for one
        else:
            j += 1
    return len(sql)


def _comment_end(sql: str, start: int) -> int:
    """Where the block comment opened at ``start`` ends; they nest in PostgreSQL."""
    depth, j = 0, start
    while j < len(sql):
        if sql.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif sql.startswith("*/", j):
            depth, j = depth - 1, j + 2
            if depth == 0:
                return j
        else:
            j += 1
    return len(sql)


def _opaque_end(sql: str, i: int) -> int | None:
    """If a literal, quoted identifier or comment starts at ``i``, where it ends."""
    ch = sql[i]
    if ch == "'":
        escaped = i > 0 and sql[i - 1] in "eE" and (i < 2 or not _identifier_char(sql[i - 2]))
        return _quoted_end(sql, i, "'", escaped)
    if ch == '"':
        return _quoted_end(sql, i, '"', False)
    if sql.startswith("--", i):
        newline = sql.find("\n", i)
        return len(sql) if newline < 0 else newline + 1
    if sql.startswith("/*", i):
        return _comment_end(sql, i)
    if ch == "$" and (i == 0 or not _identifier_char(sql[i - 1])):
        tag = _DOLLAR_TAG.match(sql, i)
        if tag is not None:
            close = sql.find(tag.group(), tag.end())
            return len(sql) if close < 0 else close + len(tag.group())
    return None


def split(sql: str) -> Iterator[tuple[bool, str]]:
    """``sql`` in pieces, in order: ``(True, code)`` or ``(False, text)`` for a
    literal, quoted identifier, dollar-quoted string or comment."""
    start = i = 0
    while i < len(sql):
        end = _opaque_end(sql, i) if sql[i] in "'\"-/$" else None
        if end is None:
            i += 1
            continue
        if start < i:
            yield True, sql[start:i]
        yield False, sql[i:end]
        start = i = end
    if start < len(sql):
        yield True, sql[start:]


def pyformat(sql: str) -> str | None:
    """``sql`` written with ``?`` placeholders, for psycopg (``%s``, ``%%``);
    None when it has no ``?`` outside literals and comments (pass it as it is)."""
    pieces = list(split(sql))
    if not any(code and "?" in text for code, text in pieces):
        return None
    out = []
    for code, text in pieces:
        if code:
            found = _PSYCOPG.search(text)
            if found is not None:
                raise ValueError(
                    f"sql mixes ? placeholders with psycopg's {found.group()!r}: use ? only "
                    f"(write a literal %, e.g. the modulo operator, as it is), got {sql!r}"
                )
            text = _QUESTION.sub(lambda m: "?" if m.group() == "??" else "%s", text.replace("%", "%%"))
        else:
            text = text.replace("%", "%%")
        out.append(text)
    return "".join(out)
