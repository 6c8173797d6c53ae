"""The demo is the first thing a newcomer runs: it must work and say what it claims."""

from __future__ import annotations

from pathlib import Path

from support import run_cli


def test_demo_tells_the_story_and_leaves_nothing_behind(tmp_path: Path) -> None:
    done = run_cli("demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "apply_next(A) -> gap: seq 1 is missing" in out
    assert "relay A1 -> duplicate" in out
    assert "drain(A) -> applied 2, stopped at idle" in out
    assert "projection A: released, last_seq 3, held 0; effects: reserved, confirmed, released" in out
    assert "stopped at blocked (unsupported_schema at seq 2)" in out
    assert "B2     B       2  yes        yes       no       blocked (unsupported_schema)" in out
    assert "C1     C       1  yes        no        no       -" in out
    assert "drain(B) applied 2, stopped at idle" in out
    assert "C1     C       1  yes        yes       yes      applied" in out
    assert max(len(line) for line in out.splitlines()) <= 100  # fits a terminal
    assert list(tmp_path.iterdir()) == []


def test_demo_keeps_its_files_when_asked_and_they_inspect_cleanly(tmp_path: Path) -> None:
    where = tmp_path / "kept"
    done = run_cli("demo", "--dir", str(where), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (where / "producer.db").exists() and (where / "consumer.db").exists()
    again = run_cli("demo", "--dir", str(where), cwd=tmp_path)  # a second run starts afresh
    assert again.returncode == 0, again.stderr
    assert again.stdout == done.stdout
    report = run_cli("inspect", str(where / "producer.db"), str(where / "consumer.db"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "to consumer 'default': 7 accepted, 0 undelivered, 0 set aside" in report.stdout
    assert "inbox 0 pending, 0 blocked, 7 applied" in report.stdout
    assert "no blocked events, no gaps" in report.stdout
