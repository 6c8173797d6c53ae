"""A v1 consumer file (before the effect outbox) upgraded in place: SQLite
file migrations (``PRAGMA user_version``), then effects work on it.

Moved from ``tests/test_effects.py`` (which runs on both engines): the point
here is a SQLite file's own migration.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import AppSchema, EffectCall, EffectRegistry
from reliable_flow import _envelope as envelope
from reliable_flow._store.sqlite.connection import Database
from reliable_flow._store.sqlite.schema import CONSUMER, FileKind
from support import KINDS, EffectWorld

World = EffectWorld


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


class Script:
    """An effect function answering ``step`` to every call (as in
    ``tests/test_effects.py``); ``calls`` records every call."""

    def __init__(self, step: Any) -> None:
        self.step = step
        self.calls: list[EffectCall] = []

    def __call__(self, call: EffectCall) -> Any:
        self.calls.append(call)
        return self.step


# -- 7. a v1 consumer file upgraded in place ----------------------------------------------------

V1 = FileKind("consumer", CONSUMER.application_id, CONSUMER.migrations[:1])


def body(flow: str, seq: int) -> str:
    return envelope.make(event_id=f"{flow}{seq}", flow_id=flow, seq=seq, kind=KINDS[seq - 1], schema=1,
                         payload={"amount": 3}).body


def test_v1_consumer_file_upgrades_in_place_and_effects_work(world: World) -> None:
    path = world.consumer_path
    db = Database(path, V1, on_create=lambda conn: conn.executemany(
        "INSERT INTO meta(key, value) VALUES (?, ?)", [("protocol", "reservation"), ("name", "old"), ("uid", "u-1")]))
    with db.write() as conn:
        conn.executemany("INSERT INTO inbox(event_id, flow_id, seq, body, state) VALUES (?, ?, ?, ?, ?)", [
            ("A1", "A", 1, body("A", 1), "applied"), ("A2", "A", 2, body("A", 2), "pending"),
            ("B1", "B", 1, body("B", 1), "pending")])
        conn.execute("INSERT INTO projection VALUES ('A', 'reserved', 1, '{\"amount\":3}', '{\"held\":3}')")
        conn.execute("INSERT INTO effect(event_id, flow_id, seq, kind) VALUES ('A1', 'A', 1, 'reserved')")
    db.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'effect_outbox'").fetchone()[0] == 0

    run = Script({"ok": True})
    effects = EffectRegistry()
    effects.register("notify", run)
    c = world.consumer((lambda ctx: ctx.schedule("notify", {"kind": ctx.event.kind}),), effects,
                       app_schema=AppSchema("shop", [["CREATE TABLE note(x)"]]))
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == CONSUMER.version
        assert conn.execute("SELECT name, version FROM app_schema").fetchall() == [("shop", 1)]
    assert (c.name, c.uid) == ("old", "u-1")
    assert [(e.event_id, e.state) for e in c.inbox("A")] == [("A1", "applied"), ("A2", "pending")]
    assert [(e.event_id, e.state) for e in c.inbox("B")] == [("B1", "pending")]
    assert c.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert [e.event_id for e in c.applied("A")] == ["A1"]
    assert c.effect_counts()["pending"] == 0
    assert {f: r.applied for f, r in c.process_all().items()} == {"A": 1, "B": 1}
    assert world.executor(c).run_until_idle() == 2
    assert sorted(e.key for e in c.scheduled_effects(state="succeeded")) == ["old:A2:notify", "old:B1:notify"]
    assert len(run.calls) == 2
