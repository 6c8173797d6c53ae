"""Traps of SQLite files (moved from ``tests/test_traps.py``, which runs on both
engines): a relative path and ``os.chdir``, a directory as the file path, a
directory name that is not valid UTF-8, a full file inside a batch
(``PRAGMA max_page_count``), and a consumer file whose write lock another
process holds.
"""

from __future__ import annotations

import os
import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from reliable_flow import Consumer, Producer, Worker, relay, relay_batch, snapshot
from reliable_flow._store.sqlite import SqliteOutboxStore
from reliable_flow.errors import StorageError, StorageFull, WrongFile
from reliable_flow.reservation import RESERVATION
from support import commit, outbox_entry, run_cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
RELEASED = {"state": "released", "last_seq": 3, "held": 0}


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_relative_path_is_made_absolute_so_reopen_after_chdir_opens_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(first)
    with Producer("producer.db", RESERVATION) as p, Consumer("consumer.db", RESERVATION) as c:
        assert (p.location, c.location) == (str(first / "producer.db"), str(first / "consumer.db"))
        commit(p, "A", upto=1)
        relay(p, c)
        os.chdir(elsewhere)
        p.reopen()
        c.reopen()
        # Before: reopen() created an empty producer.db here and this answered "stale".
        assert p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}).status == "committed"
        assert relay(p, c).status == "accepted"
        assert c.drain("A").applied == 2
    assert listing(elsewhere) == []
    assert SqliteOutboxStore("x.db", "p").location == str(elsewhere / "x.db")
    assert snapshot("../first/producer.db", "../first/consumer.db")["producer"]["flows"]["A"]["seq"] == 2


def test_a_directory_as_the_path_says_it_is_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    for open_it in (lambda: Producer(folder, RESERVATION), lambda: Consumer(folder, RESERVATION),
                    lambda: snapshot(folder, folder)):
        with pytest.raises(WrongFile, match=re.escape(f"{folder} is a directory, not a")):
            open_it()
    assert listing(folder) == []
    done = run_cli("inspect", str(folder), str(folder))
    assert done.returncode == 2 and "is a directory" in done.stderr and "Traceback" not in done.stderr


def test_snapshot_and_inspect_read_files_under_a_non_utf8_directory_name(tmp_path: Path) -> None:
    raw = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    try:
        os.mkdir(raw)
    except OSError as exc:  # a file system that only takes UTF-8 names
        pytest.skip(f"cannot create a non-UTF-8 name here: {exc}")
    folder = Path(os.fsdecode(raw))
    with Producer(folder / "p.db", RESERVATION) as p, Consumer(folder / "c.db", RESERVATION) as c:
        commit(p, "A")
        while relay(p, c).status != "idle":
            pass
        c.process_all()
        p_path, c_path = p.location, c.location
    assert "\udce9" in p_path  # the undecodable byte, as os.fsdecode keeps it
    snap = snapshot(p_path, c_path)
    assert snap["consumer"]["projections"]["A"] == RELEASED
    done = run_cli("inspect", p_path, c_path, "--json")
    assert done.returncode == 0, done.stderr
    assert '"flows": 1' in done.stdout


def test_a_locked_consumer_file_is_recorded_and_the_worker_goes_on_with_the_others(tmp_path: Path) -> None:
    with Producer(tmp_path / "p.db", RESERVATION) as p, \
            Consumer(tmp_path / "locked.db", RESERVATION, name="locked", busy_timeout=0.05) as locked, \
            Consumer(tmp_path / "free.db", RESERVATION, name="free") as free:
        for flow in ("A", "B"):
            commit(p, flow)
        for c in (locked, free):  # in both inboxes, not applied yet
            assert relay_batch(p, c, register=True).counts == {"accepted": 6}
        commit(p, "C")
        with closing(sqlite3.connect(tmp_path / "locked.db", isolation_level=None)) as holder:
            holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            worker = Worker(p, [locked, free], idle_sleep=0)
            stats = worker.run(max_passes=1, handle_signals=False)  # before the fix: raised DatabaseBusy
            holder.execute("ROLLBACK")
        # The first consumer failed (relay of C1, and the apply of each flow), the second did everything.
        assert stats.errors == 3 and "DatabaseBusy" in (stats.last_error or ""), stats
        assert [free.projection(f) for f in "ABC"] == [RELEASED] * 3
        assert [locked.projection(f) for f in "ABC"] == [None] * 3
        assert "DatabaseBusy" in (outbox_entry(p, "C1").deliveries["locked"].last_error or "")
        # Once the lock is gone, the next run catches up (waiting out C1's backoff).
        Worker(p, [locked, free], idle_sleep=0).run(until_idle=True, handle_signals=False)
        assert [locked.projection(f) for f in "ABC"] == [RELEASED] * 3


def test_advances_after_a_failed_one_in_a_batch_raise_storage_error_as_documented(producer: Producer) -> None:
    conn = producer._store._db.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    big = {f"k{i}": "x" * 1800 for i in range(8)}
    later: list[BaseException] = []
    try:
        with pytest.raises(StorageError), producer.batch() as b:
            b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
            with pytest.raises(StorageFull):
                b.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 3}, meta=big)
            try:
                b.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 3})
            except Exception as exc:  # noqa: BLE001 - examined below
                later.append(exc)
    finally:
        conn.execute("PRAGMA max_page_count = 1073741823")
    [error] = later
    assert type(error) is StorageError and not isinstance(error, RuntimeError)
    row = next(line for line in (DOCS / "storage-faults.md").read_text(encoding="utf-8").splitlines()
               if "test_advances_after_a_storage_error_inside_a_batch" in line)
    assert "`StorageError`" in row and "RuntimeError" not in row
    assert str(error).split(";")[0] in row
