"""examples/support_agent.py does each side effect once, and the runnable code
blocks of docs/effects.md print what their ``# -> ...`` comments say.

Both run in child processes, the way a reader would run them: ``python
SCRIPT`` with an environment that holds no ``RELIABLE_FLOW_*`` variable (no
crash point armed by accident) and this checkout's ``src/`` first on the path.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from types import ModuleType

import pytest

import reliable_flow
from reliable_flow import Consumer, EffectState, Producer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "support_agent.py"
DOC = ROOT / "docs" / "effects.md"
SRC = Path(reliable_flow.__file__).resolve().parent.parent
TIMEOUT = 120  # seconds


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd, env=_env(), check=False
    )


# -- the example ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    tmp_path = tmp_path_factory.mktemp("support_agent")
    done = _run(str(EXAMPLE), str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.stderr == ""
    return done, tmp_path


def test_the_example_sends_each_message_once_and_refunds_once(
    example_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, _ = example_run
    lines = done.stdout.splitlines()
    # The faults it meets: a rate limit, and a reply lost after the work was done, twice.
    assert "  mail     429 rate limited, nothing sent          [support:T-1002-1:notify]" in lines
    assert sum("the reply is lost" in line for line in lines) == 2
    # ... settled by reconcile (the e-mail) and by a re-run with the same key (the refund).
    assert "  mail     reconcile: was support:T-1001-2:notify sent? msg-3" in lines
    assert any(line.startswith("  payments key seen before: answers rf-1 again, no new refund") for line in lines)
    assert "  effect   support:T-1001-2:notify: in_doubt -> succeeded" in lines
    assert "  effect   support:T-1001-2:refund: in_doubt -> succeeded" in lines
    # Each message once, the refund once, the result fed back once.
    assert "  mail: 6 messages for 6 keys, each sent once" in lines
    sent = [line for line in lines if line.startswith("  mail     sent ")]
    assert len(sent) == 6
    assert len({re.search(r"\[(.+)\]$", line).group(1) for line in sent}) == 6  # type: ignore[union-attr]
    assert "  payments: support:T-1001-2:refund: 2 requests, 1 refund performed" in lines
    assert lines.count("  feedback support:T-1001-2:refund:result advanced into agent.db as tool_result") == 1
    assert "  agent.db T-1001 tool results: 1 (support:T-1001-2:refund:result at seq 3)" in lines
    assert "  agent.db T-1001: {'state': 'answered', 'seq': 4, 'tool_calls': 1, 'refunded_cents': 1999}" in lines
    assert "  agent    nothing to do: every ticket is answered" in lines


def _example_module() -> ModuleType:
    """The example as a module (for its protocol), without writing bytecode into examples/."""
    spec = importlib.util.spec_from_file_location("support_agent_under_test", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = before
    return module


def test_the_example_leaves_real_consumer_and_producer_files(
    example_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, where = example_run
    protocol = _example_module().SUPPORT_TICKET
    with (
        Producer(where / "agent.db", protocol) as producer,
        Consumer(where / "support.db", protocol, name="support") as consumer,
    ):
        counts = consumer.effect_counts()
        assert counts == {s.value: 0 for s in EffectState} | {"succeeded": 7}
        refund = consumer.scheduled_effect("support:T-1001-2:refund")
        assert refund is not None and refund.fed is True and refund.attempts == 2
        assert refund.result == {"refund_id": "rf-1", "amount_cents": 1999}
        notify = consumer.scheduled_effect("support:T-1001-2:notify")
        assert notify is not None and notify.attempts == 1  # reconciled, never sent again
        assert notify.result == {"message_id": "msg-3"}

        assert producer.flow("T-1001") == {
            "state": "answered", "seq": 4, "customer": "ada@example.com", "order": "5521",
            "subject": "Charged twice for order 5521", "tool_calls": 1, "refunded_cents": 1999,
        }
        kinds = [(e.event_id, producer.event(e.event_id)["kind"]) for e in producer.outbox("T-1001")]  # type: ignore[index]
        assert kinds == [
            ("T-1001-1", "opened"), ("T-1001-2", "tool_called"),
            ("support:T-1001-2:refund:result", "tool_result"), ("T-1001-4", "answered"),
        ]
        assert all(e.accepted for e in producer.outbox())
        assert consumer.projection("T-1001") == {
            "state": "answered", "last_seq": 4, "customer": "ada@example.com", "tool_calls": 1,
            "refunded_cents": 1999,
        }
        assert consumer.projection("T-1002") is not None
        assert consumer.projection("T-1002")["state"] == "answered"  # type: ignore[index]
    with closing(sqlite3.connect(f"file:{where / 'support.db'}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT ticket, seq, kind FROM ticket_log ORDER BY ticket, seq").fetchall()
    assert rows == [
        ("T-1001", 1, "opened"), ("T-1001", 2, "tool_called"), ("T-1001", 3, "tool_result"),
        ("T-1001", 4, "answered"), ("T-1002", 1, "opened"), ("T-1002", 2, "answered"),
    ]


def test_the_example_run_again_on_its_files_does_nothing_twice(tmp_path: Path) -> None:
    first = _run(str(EXAMPLE), str(tmp_path), cwd=tmp_path)
    second = _run(str(EXAMPLE), str(tmp_path), cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert "committed" not in second.stdout
    assert "  mail: 0 messages for 0 keys, each sent once" in second.stdout.splitlines()
    assert "  payments:" not in second.stdout
    assert "  agent.db T-1001 tool results: 1 (support:T-1001-2:refund:result at seq 3)" in second.stdout


# -- the runnable blocks of docs/effects.md ----------------------------------------------------

RUNNABLE = "<!-- runnable -->"


def runnable_blocks(page: Path) -> list[str]:
    """The ```python blocks right after a ``<!-- runnable -->`` line."""
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(re.escape(RUNNABLE) + r"\n```python\n(.*?)\n```\n", text, flags=re.DOTALL)
    assert len(blocks) == text.count(RUNNABLE), "a runnable marker not followed by a ```python block"
    return blocks


def expected_output(block: str) -> list[str]:
    """Every ``# -> text`` in the block, in order: the lines it must print."""
    return [m.group(1) for m in re.finditer(r"# -> (.*)$", block, flags=re.MULTILINE)]


BLOCKS = runnable_blocks(DOC)


def test_the_page_has_runnable_blocks_and_every_one_says_what_it_prints() -> None:
    assert len(BLOCKS) >= 6
    for block in BLOCKS:
        assert expected_output(block), f"a runnable block without '# -> ...':\n{block[:200]}"


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block{i + 1}")
def test_a_runnable_block_prints_what_its_comments_say(index: int, tmp_path: Path) -> None:
    block = BLOCKS[index]
    script = tmp_path / f"effects_block{index + 1}.py"
    script.write_text(block, encoding="utf-8")
    done = _run(str(script), cwd=tmp_path)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr}"
    assert done.stderr == ""
    assert done.stdout.splitlines() == expected_output(block)
    assert sorted(p.name for p in tmp_path.iterdir()) == [script.name], "the block left files behind"
