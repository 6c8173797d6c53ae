"""One shape per answer (issue 19, item 3): a full inbox is ``refused`` on
every path, ``RelayResult.applied`` says whether the receive commit applied
the event; the old names ``InboxFull`` / ``Refused`` are gone (1.0 face)."""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import new_location
from reliable_flow import (
    Consumer,
    DeliveryPolicy,
    Producer,
    ReceiveStatus,
    RelayStatus,
    Worker,
    relay,
    relay_batch,
)
from reliable_flow.records import ReceiveResult
from reliable_flow.reservation import RESERVATION
from support import commit, envelope, outbox_entry

FIXED = DeliveryPolicy(wait_for_due=False, clock=lambda: 1000.0, random=lambda: 0.5, backoff_base=0.5)


def _full(c: Consumer) -> None:
    """Fill a ``max_inbox=1`` inbox with a row that cannot be applied yet."""
    assert c.receive(envelope("B2", "B", 2)).status == "accepted"


def test_a_full_inbox_is_refused_on_every_receiving_path(engine: str, tmp_path: Path) -> None:
    with Consumer(new_location(engine, tmp_path, "c"), RESERVATION, max_inbox=1) as c:
        _full(c)
        later = envelope("C2", "C", 2)
        body = json.dumps(later)
        answers = [
            c.receive(later),
            c.receive_many([later, envelope("A1", "A", 1)])[0],
            c.accept(body),
            c.accept_many([body])[0],
            c.applying().accept(body),
            c.applying().accept_many([body])[0],
        ]
        for answer in answers:
            assert type(answer) is ReceiveResult and type(answer.status) is ReceiveStatus
            assert (answer.status, answer.event_id, answer.flow_id, answer.seq, answer.applied) == (
                "refused", "C2", "C", 2, False)
            assert (answer.reason or "").startswith("inbox full (max_inbox 1): ")
        assert c.inbox("C") == []  # nothing stored, on any path
        assert [e.event_id for e in c.inbox("A")] == ["A1"]  # the batch's next step still got in


def test_a_refused_relay_answers_refused_and_records_a_failed_send(engine: str, tmp_path: Path) -> None:
    policy = DeliveryPolicy(clock=lambda: 1000.0, random=lambda: 1.0, backoff_base=1.0)
    with Producer(new_location(engine, tmp_path, "p"), RESERVATION) as p, \
            Consumer(new_location(engine, tmp_path, "c"), RESERVATION, max_inbox=1) as c:
        commit(p, "A", 2)
        assert relay(p, c, policy=policy).status == "accepted"
        r = relay(p, c, policy=policy)  # A2: A1 is unapplied, and A2 is A's next step only once A1 applied
        assert (r.status, r.event_id, r.flow_id, r.seq, r.applied) == ("refused", "A2", "A", 2, False)
        assert type(r.status) is RelayStatus
        d = outbox_entry(p, "A2").deliveries["default"]
        assert (d.state, d.attempts, d.last_status, d.due_at) == ("pending", 1, None, 1001.0)
        assert (d.last_error or "").startswith("InboxFull: inbox full (max_inbox 1): ")
        assert relay(p, c, policy=policy).status == "idle"  # backing off


def test_relay_result_applied_says_whether_the_receive_commit_applied(engine: str, tmp_path: Path) -> None:
    with Producer(new_location(engine, tmp_path, "p"), RESERVATION) as p, \
            Consumer(new_location(engine, tmp_path, "c"), RESERVATION) as c:
        commit(p, "A", 3)
        commit(p, "B", 1)
        assert relay(p, c).applied is False  # two-step: stored, not applied
        assert c.apply_next("A").status == "applied"
        view = c.applying()
        r = relay(p, view)
        assert (r.event_id, r.status, r.applied) == ("A2", "accepted", True)
        batch = relay_batch(p, view, policy=FIXED)
        assert [(x.event_id, x.applied) for x in batch.results] == [("A3", True), ("B1", True)]
        assert view.applied == 3


def test_the_worker_counts_refusals_and_is_not_in_error(tmp_path: Path) -> None:
    with Producer(tmp_path / "p.db", RESERVATION) as p, Consumer(tmp_path / "c.db", RESERVATION, max_inbox=1) as c:
        commit(p, "A", 3)
        policy = DeliveryPolicy(clock=lambda: 1000.0, random=lambda: 1.0)
        worker = Worker(p, [c], policy=policy, relay_batch=5, apply_on_receive=False)
        worker.run_once()
        assert (worker.stats.relayed["accepted"], worker.stats.relayed["refused"]) == (1, 1)
        assert (worker.stats.errors, worker.stats.last_error) == (0, None)


# -- the 1.0 face: no old names -----------------------------------------------------------


OLD_NAMES = [
    ("reliable_flow", "InboxFull"), ("reliable_flow", "Refused"), ("reliable_flow.errors", "InboxFull"),
    ("reliable_flow.statuses", "Refused"), ("reliable_flow", "InboxAction"), ("reliable_flow", "EffectAction"),
    ("reliable_flow.records", "RegistryAction"), ("reliable_flow", "Effects"), ("reliable_flow", "Effect"),
    ("reliable_flow", "EffectRecord"), ("reliable_flow", "AdvanceResult"), ("reliable_flow", "StorageError"),
    ("reliable_flow", "FlowWait"),
]


@pytest.mark.parametrize(("module_name", "name"), OLD_NAMES)
def test_the_old_names_are_gone(module_name: str, name: str) -> None:
    """Before 1.0 there are no deprecation aliases (CHANGELOG, "Renamed since
    0.1.0"): an old name is an AttributeError, as any unknown name."""
    module = importlib.import_module(module_name)
    with pytest.raises(AttributeError):
        getattr(module, name)
    assert name not in module.__all__


@pytest.mark.parametrize("old", ["reliable_flow.consumer", "reliable_flow.store.sqlite.schema",
                                 "reliable_flow.delivery.policy", "reliable_flow.deprecated"])
def test_the_old_module_paths_do_not_import(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


@pytest.mark.parametrize(("cls", "old"), [(Producer, "path"), (Producer, "redeliver"), (Producer, "consumers"),
                                          (Consumer, "path"), (Consumer, "skip_event"), (Consumer, "effects")])
def test_the_old_attributes_are_gone(cls: type, old: str) -> None:
    assert not hasattr(cls, old)


def test_the_old_keyword_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="path"):
        Producer(path=tmp_path / "p.db", protocol=RESERVATION)  # type: ignore[call-arg]
    assert not (tmp_path / "p.db").exists()


# -- logging after the commit (issue 19, item 4) ---------------------------------------------


def _aborted_once(monkeypatch: pytest.MonkeyPatch, c: Consumer) -> None:
    """Have the engine abort the consumer's next write transaction once, at
    its very end (a ``TransactionConflict``: rolled back, and run again)."""
    from reliable_flow.errors import TransactionConflict

    store, calls = c._store, []
    real = store.write

    @contextlib.contextmanager
    def write(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **kwargs) as unit:
            yield unit
            calls.append(1)
            if len(calls) == 1:
                raise TransactionConflict("aborted to break a cycle (test)")

    monkeypatch.setattr(store, "write", write)


def _applied_records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, Any]]:
    return [(r.getMessage().split()[0], getattr(r, "event_id", None)) for r in caplog.records
            if r.name == "reliable_flow.consumer" and r.getMessage().startswith(("applied", "gap"))]


def test_an_apply_the_engine_aborted_and_ran_again_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level("INFO", logger="reliable_flow")
    with Consumer(tmp_path / "c.db", RESERVATION) as c:
        c.receive_many([envelope("A1", "A", 1), envelope("A2", "A", 2), envelope("B2", "B", 2)])
        _aborted_once(monkeypatch, c)
        assert c.drain("A", batch_size=5).applied == 2
        assert _applied_records(caplog) == [("applied", "A1"), ("applied", "A2")]
        caplog.clear()
        _aborted_once(monkeypatch, c)
        assert c.apply_next("B").status == "gap"
        assert [m for m, _ in _applied_records(caplog)] == ["gap"]
        assert c.metrics().applied == 2  # counted once too


def test_an_arrival_apply_the_engine_aborted_and_ran_again_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level("INFO", logger="reliable_flow")
    with Consumer(tmp_path / "c.db", RESERVATION, apply_on_receive=True) as c:
        _aborted_once(monkeypatch, c)
        assert c.receive(envelope("A1", "A", 1)).applied is True
        _aborted_once(monkeypatch, c)
        assert [r.applied for r in c.receive_many([envelope("A2", "A", 2), envelope("A3", "A", 3)])] == [True, True]
        assert _applied_records(caplog) == [("applied", "A1"), ("applied", "A2"), ("applied", "A3")]
        assert c.metrics().applied == 3
