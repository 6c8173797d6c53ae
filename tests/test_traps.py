"""Traps a user could walk into, each closed with a clear answer.

Every bad input raises an exception that names the argument or field, and
stores nothing; every misuse that used to surface as a raw ``sqlite3`` error
(or, worse, as a silent wrong answer) now says what happened and what to do.
The section titles give the trap's number in the issue.  On both engines
(the ``at`` fixture); the traps of SQLite files (a relative path, a directory,
a non-UTF-8 directory name, a locked file) are in
``tests/sqlite/test_traps_sqlite.py``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from engine_reads import rows, store_exists
from reliable_flow import (
    Consumer,
    DeliveryPolicy,
    EffectRegistry,
    Producer,
    Protocol,
    RetryLater,
    Worker,
    relay,
    relay_batch,
)
from reliable_flow._tools.cli import main as cli_main
from reliable_flow.errors import (
    ConsumerMismatch,
    DatabaseBusy,
    SchemaTooNew,
    StorageError,
    WrongFile,
    WrongThread,
)
from reliable_flow.protocol import exact, integer
from reliable_flow.reservation import RESERVATION
from support import CHILD_TIMEOUT, child_env, commit, envelope, outbox_entry, run_cli

At = Callable[[str], str]  # the ``at`` fixture of conftest.py: a store location by label, on the test's engine

DOCS = Path(__file__).resolve().parent.parent / "docs"
RELEASED = {"state": "released", "last_seq": 3, "held": 0}


def outbox_rows(path: str | os.PathLike[str]) -> int:
    return int(rows(path, "SELECT count(*) FROM outbox")[0][0])


@pytest.fixture
def pair(at: At) -> Iterator[tuple[Producer, Consumer]]:
    with Producer(at("producer"), RESERVATION) as p, Consumer(at("consumer"), RESERVATION) as c:
        yield p, c


# -- 1. a relative path, os.chdir, reopen() ------------------------------------------------
# (a SQLite file's: tests/sqlite/test_traps_sqlite.py)


# -- 2. one object, two threads -----------------------------------------------------------


def in_thread(call: Callable[[], Any], name: str = "helper-thread") -> BaseException | None:
    """Run ``call`` in another thread; what it raised, if anything."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            raised.append(exc)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join(CHILD_TIMEOUT)
    assert not thread.is_alive()
    return raised[0] if raised else None


def test_a_producer_used_from_a_second_thread_raises_wrong_thread(pair: tuple[Producer, Consumer]) -> None:
    producer, consumer = pair
    opener = threading.current_thread().name
    for call in (
        lambda: producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}),
        lambda: producer.outbox(),
        lambda: relay(producer, consumer),
        lambda: consumer.receive(envelope("A1", "A", 1)),
        producer.close,
    ):
        raised = in_thread(call)
        assert isinstance(raised, WrongThread), repr(raised)
        assert not isinstance(raised, sqlite3.Error)
        message = str(raised)
        assert f"opened in thread {opener!r}" in message and "'helper-thread'" in message, message
        assert "one object per thread" in message
    assert isinstance(WrongThread("x"), reliable_flow.ReliableFlowError)
    # Nothing was stored, and the objects still work in their own thread.
    assert producer.outbox() == [] and consumer.flows() == []
    commit(producer, "A", upto=1)
    assert relay(producer, consumer).status == "accepted"


def test_one_object_per_thread_on_the_same_files_works(pair: tuple[Producer, Consumer]) -> None:
    producer, consumer = pair

    def own_objects() -> None:
        with Producer(producer.location, RESERVATION) as p, Consumer(consumer.location, RESERVATION) as c:
            commit(p, "T", upto=1)
            assert relay(p, c).status == "accepted"

    assert in_thread(own_objects) is None
    assert [e.event_id for e in producer.outbox()] == ["T1"]


# -- 3. relay's arguments swapped ----------------------------------------------------------


@pytest.mark.parametrize("call", [relay, relay_batch], ids=["relay", "relay_batch"])
def test_relay_with_swapped_or_wrong_arguments_is_a_clear_type_error(
    pair: tuple[Producer, Consumer], call: Callable[..., Any]
) -> None:
    producer, consumer = pair
    commit(producer, "A", upto=1)
    with pytest.raises(TypeError, match=r"producer must be a reliable_flow Producer, got Consumer"):
        call(consumer, producer)
    with pytest.raises(TypeError, match=r"consumer must be a Consumer \(or another Receiver\), got Producer"):
        call(producer, producer)
    with pytest.raises(TypeError, match=r"consumer must be a Consumer .*got str"):
        call(producer, "consumer.db")
    # Nothing was bound, sent or stored.
    assert rows(producer.location, "SELECT count(*) FROM consumer") == [(0,)]
    assert consumer.flows() == []


# -- 4. Protocol's arguments ---------------------------------------------------------------

_DECODE = exact({"n": integer(1, 9)})
_GOOD: dict[str, Any] = {"name": "p", "initial": "new", "transitions": {"new": ["open"]}, "schemas": {1: _DECODE}}


@pytest.mark.parametrize(
    ("argument", "value", "error", "named"),
    [
        ("name", "", ValueError, "name"),
        ("name", 7, ValueError, "name"),
        ("initial", None, ValueError, "initial"),
        ("transitions", [("new", "open")], TypeError, "transitions"),
        ("transitions", {"new": "open"}, TypeError, r"transitions\['new'\]"),
        ("transitions", {"new": [1]}, ValueError, r"transitions\['new'\]"),
        ("transitions", {"": ["open"]}, ValueError, "transitions"),
        ("schemas", [_DECODE], TypeError, "schemas"),
        ("schemas", {True: _DECODE}, ValueError, "schemas"),
        ("schemas", {1.0: _DECODE}, ValueError, "schemas"),
        ("schemas", {"1": _DECODE}, ValueError, "schemas"),
        ("schemas", {1: "decoder"}, TypeError, r"schemas\[1\]"),
        ("schemas", {}, ValueError, "schemas"),
        ("step", "merge", TypeError, "step"),
        ("project", None, TypeError, "project"),
        ("consumer_schemas", 1, TypeError, "consumer_schemas"),
        ("consumer_schemas", "1", TypeError, "consumer_schemas"),
        ("consumer_schemas", {True}, ValueError, "consumer_schemas"),
        ("consumer_schemas", [2], ValueError, "consumer_schemas"),
        ("producer_schemas", [1.0], ValueError, "producer_schemas"),
        ("producer_schemas", set(), ValueError, "producer_schemas"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None,
)
def test_every_protocol_argument_is_checked_with_a_message_naming_it(
    argument: str, value: Any, error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named) as raised:
        Protocol(**{**_GOOD, argument: value})
    assert "dictionary update sequence" not in str(raised.value)
    assert Protocol(**_GOOD).schemas == {1: _DECODE}  # the good arguments are fine


# -- 5. Consumer(schemas=) versions are ints ------------------------------------------------


@pytest.mark.parametrize("schemas", [{True}, {1.0}, [1, True], (1.0, 2)], ids=["true", "1.0", "1-true", "floats"])
def test_consumer_schemas_must_be_ints_not_bools_or_floats(at: At, schemas: Any) -> None:
    path = at("c")
    with pytest.raises(ValueError, match="schemas must hold int versions"):
        Consumer(path, RESERVATION, schemas=schemas)
    assert not store_exists(path)


# -- 6. A full inbox's refusal names the event ----------------------------------------------


def test_inbox_full_names_the_event_id_the_flow_and_the_seq(at: At) -> None:
    with Consumer(at("c"), RESERVATION, max_inbox=1) as c:
        assert c.receive(envelope("ev-A2", "flowA", 2)).status == "accepted"
        refused = c.receive(envelope("ev-B2", "flowB", 2))
        assert refused.status == "refused"
        message = refused.reason or ""
        assert "event 'ev-B2' (flow 'flowB', seq 2) refused" in message, message
        assert c.inbox("flowB") == []


# -- 7. run --protocol module:ATTR from the current directory -------------------------------

TICKETS = '''
from reliable_flow import Protocol
from reliable_flow.protocol import exact, integer

X = Protocol(
    name="tickets",
    initial="new",
    transitions={"new": ["open"], "open": ["closed"]},
    schemas={1: exact({"n": integer(1, 9)})},
)
'''


def _cli_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m reliable_flow``."""
    script = shutil.which("reliable-flow", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "reliable_flow"]


def test_run_imports_the_protocol_module_from_the_current_directory(tmp_path: Path, at: At) -> None:
    (tmp_path / "tickets.py").write_text(TICKETS, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("tickets_for_the_test", tmp_path / "tickets.py")
    assert spec is not None and spec.loader is not None
    tickets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tickets)
    with Producer(at("p"), tickets.X) as p:
        assert p.advance("T1", "T", expected_seq=0, kind="open", payload={"n": 1}).status == "committed"
        assert p.advance("T2", "T", expected_seq=1, kind="closed", payload={"n": 2}).status == "committed"
    done = subprocess.run(
        [*_cli_command(), "run", "--producer", at("p"), "--consumer", f"desk={at('c')}", "--protocol", "tickets:X",
         "--until-idle", "--report-every", "0"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False,
    )
    assert done.returncode == 0, done.stderr
    with Consumer(at("c"), tickets.X) as c:
        assert c.projection("T") == {"state": "closed", "last_seq": 2, "n": 2}


# -- 8. durations are finite ---------------------------------------------------------------

BAD_SECONDS = [math.nan, math.inf, -math.inf, -1, True, "1"]


@pytest.mark.parametrize("field", ["lease_seconds", "backoff_base", "backoff_cap"])
@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
def test_delivery_policy_durations_must_be_finite_numbers(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{field} must be .*finite number"):
        DeliveryPolicy(**{field: value})


def test_a_lease_of_zero_is_refused_and_a_backoff_of_zero_is_allowed() -> None:
    with pytest.raises(ValueError, match="lease_seconds"):
        DeliveryPolicy(lease_seconds=0)
    assert DeliveryPolicy(backoff_base=0, backoff_cap=0).backoff(3) == 0


@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
def test_worker_idle_sleep_must_be_a_finite_number(pair: tuple[Producer, Consumer], value: Any) -> None:
    producer, consumer = pair
    with pytest.raises(ValueError, match="idle_sleep must be a finite number"):
        Worker(producer, [consumer], idle_sleep=value)
    assert Worker(producer, [consumer], idle_sleep=0).idle_sleep == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [(o, v) for o in ("--lease", "--effect-lease") for v in ("0", "-1", "nan", "inf", "x")]
    + [(o, v) for o in ("--idle-sleep", "--report-every") for v in ("-1", "-0.5", "nan", "inf", "-inf", "1e999")],
)
def test_run_duration_options_must_be_finite(
    at: At, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["run", "--producer", str(at("p")), "--consumer", f"a={at('a')}",
                  "--once", f"{option}={value}"])  # "=": a value like -1 is not taken for an option
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and f"argument {option}: must be a finite number of seconds" in err, err
    assert not store_exists(at("p")) and not store_exists(at("a"))


def test_a_bad_duration_on_the_command_line_is_a_usage_error_without_traceback(tmp_path: Path, at: At) -> None:
    done = run_cli("run", "--producer", at("p"), "--consumer", f"a={at('a')}", "--lease", "nan", "--once", cwd=tmp_path)
    assert done.returncode == 2
    assert "usage:" in done.stderr and "--lease" in done.stderr and "Traceback" not in done.stderr
    assert not store_exists(at("p")) and not store_exists(at("a"))


@pytest.mark.parametrize("cls", [Producer, Consumer])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=repr)
def test_busy_timeout_must_be_finite(at: At, cls: Callable[..., Any], value: float) -> None:
    with pytest.raises(ValueError, match="busy_timeout"):
        cls(at("x"), RESERVATION, busy_timeout=value)
    assert not store_exists(at("x"))


# -- 9. run until idle ---------------------------------------------------------------------


class FailsFirst(Consumer):
    """A consumer whose first ``fails`` receives raise (a transport that recovers)."""

    fails = 2

    def receive(self, envelope_in: Any) -> Any:
        if self.fails > 0:
            self.fails -= 1
            raise ConnectionError("consumer briefly unreachable")
        return super().receive(envelope_in)


def test_run_until_idle_waits_out_backoffs_and_returns_when_all_is_done(at: At) -> None:
    with Producer(at("p"), RESERVATION) as p, FailsFirst(at("c"), RESERVATION) as c:
        commit(p, "A")
        commit(p, "B")
        policy = DeliveryPolicy(backoff_base=0.2, backoff_cap=0.2, random=lambda: 1.0)
        worker = Worker(p, [c], policy=policy, idle_sleep=30)  # an idle sleep would show as a hang
        started = time.monotonic()
        stats = worker.run(until_idle=True, handle_signals=False)
        took = time.monotonic() - started
    assert stats.errors == 2 and "briefly unreachable" in (stats.last_error or "")
    assert 0.2 <= took < 10, took  # the backoffs of 0.2 s were waited out, and no idle sleep of 30 s
    with Consumer(at("c"), RESERVATION) as again:
        assert again.projection("A") == again.projection("B") == RELEASED


class DiesMidSend(Consumer):
    """The relay process dies mid-send: a BaseException passes the relay's
    ``except Exception``, so nothing records the failure and the lease stays."""

    def accept(self, body: str) -> Any:
        raise KeyboardInterrupt


def test_run_until_idle_waits_out_a_lease_left_by_a_dead_relay(at: At) -> None:
    with Producer(at("p"), RESERVATION) as p:
        commit(p, "A", upto=1)
        with DiesMidSend(at("c"), RESERVATION) as dying, pytest.raises(KeyboardInterrupt):
            relay(p, dying, policy=DeliveryPolicy(lease_seconds=0.4, owner="dead-relay"))
        leased = outbox_entry(p, "A1").deliveries["default"]
        assert (leased.state, leased.lease_owner) == ("pending", "dead-relay")
        with Consumer(at("c"), RESERVATION) as c:
            started = time.monotonic()
            Worker(p, [c], policy=DeliveryPolicy(lease_seconds=30), idle_sleep=30).run(
                until_idle=True, handle_signals=False)
            took = time.monotonic() - started
            assert c.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert 0.2 < took < 10, took


def test_run_until_idle_waits_for_an_effect_backing_off(at: At) -> None:
    calls: list[int] = []

    def notify(call: Any) -> dict[str, int]:
        calls.append(call.attempt)
        if len(calls) == 1:
            raise RetryLater("the mail server said later")
        return {"sent": len(calls)}

    effects = EffectRegistry()
    effects.register("notify", notify)

    def schedule(ctx: Any) -> None:
        ctx.schedule("notify", {"flow": ctx.event.flow_id})

    with Producer(at("p"), RESERVATION) as p, \
            Consumer(at("c"), RESERVATION, handlers=[schedule], effects=effects) as c:
        commit(p, "A", upto=1)
        executor = reliable_flow.EffectExecutor(
            c, policy=DeliveryPolicy(lease_seconds=30, backoff_base=0.3, backoff_cap=0.3, random=lambda: 1.0))
        Worker(p, [c], executors=[executor], idle_sleep=30).run(until_idle=True, handle_signals=False)
        [effect] = c.scheduled_effects()
        assert (effect.state, len(calls)) == ("succeeded", 2)


def test_run_until_idle_does_not_wait_for_what_waits_for_a_person(pair: tuple[Producer, Consumer]) -> None:
    producer, consumer = pair
    consumer.receive(envelope("G2", "G", 2))  # flow G waits at a gap for seq 1, which nobody will send
    commit(producer, "A")
    with Consumer(consumer.location, RESERVATION) as c:  # (same file, name "default")
        c.receive(envelope("A1", "A", 1, amount=9))  # A1 arrives with another body: id_conflict, set aside
    started = time.monotonic()
    stats = Worker(producer, [consumer], idle_sleep=30).run(until_idle=True, handle_signals=False)
    assert time.monotonic() - started < 10
    assert outbox_entry(producer, "A1", "default").state == "set_aside"
    assert stats.stops["gap"] >= 1
    assert consumer.projection("G") is None


def test_run_until_idle_from_the_command_line_exits_0_when_done(tmp_path: Path, at: At) -> None:
    with Producer(at("p"), RESERVATION) as p:
        for flow in "ABC":
            commit(p, flow)
    done = run_cli("run", "--producer", at("p"), "--consumer", f"a={at('a')}", "--until-idle", "--idle-sleep", "30",
                   cwd=tmp_path, timeout=CHILD_TIMEOUT)
    assert done.returncode == 0, done.stderr
    with Consumer(at("a"), RESERVATION) as c:
        assert [c.projection(f) for f in "ABC"] == [RELEASED] * 3


def test_once_is_documented_as_one_pass_not_until_idle(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--once run one pass and exit: at most 100 relays per consumer" in help_text
    assert "not 'until idle'" in help_text and "--until-idle" in help_text
    doc = " ".join((DOCS / "worker.md").read_text(encoding="utf-8").split())
    assert "at most `relay_batch` (100) relays per consumer" in doc and 'It is *not* "until idle"' in doc
    assert "`--until-idle`" in doc and "worker.run(until_idle=True)" in doc


# -- 10. errors that retrying cannot heal stop run ------------------------------------------


def _name_bound_to_another_file(at: At) -> tuple[str, str]:
    """A producer whose consumer name "a" is bound to a.db, and b.db, another file named "a"."""
    with Producer(at("p"), RESERVATION) as p, Consumer(at("a"), RESERVATION, name="a") as a:
        commit(p, "A")
        assert relay(p, a).status == "accepted"
    with Consumer(at("b"), RESERVATION, name="a"):
        pass
    return at("p"), at("b")


@pytest.mark.parametrize("mode", ["--once", "--until-idle"])
def test_run_stops_with_exit_2_on_a_consumer_name_bound_to_another_file(tmp_path: Path, at: At, mode: str) -> None:
    producer, other = _name_bound_to_another_file(at)
    done = run_cli("run", "--producer", str(producer), "--consumer", f"a={other}", mode, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "run: cannot go on: ConsumerMismatch" in done.stderr and "another file" in done.stderr
    assert "Traceback" not in done.stderr
    with Consumer(other, RESERVATION) as c:
        assert c.flows() == []


def test_worker_run_raises_consumer_mismatch_after_recording_it(at: At) -> None:
    producer, other = _name_bound_to_another_file(at)
    with Producer(producer, RESERVATION) as p, Consumer(other, RESERVATION) as c:
        worker = Worker(p, [c], idle_sleep=0)
        with pytest.raises(ConsumerMismatch, match="another file"):
            worker.run(max_passes=5, handle_signals=False)
        assert worker.stats.errors == 1 and "ConsumerMismatch" in (worker.stats.last_error or "")


class Raises(Consumer):
    """A consumer whose every receive raises ``error``."""

    error: Exception = RuntimeError("set by the test")

    def accept(self, body: str) -> Any:
        raise self.error


@pytest.mark.parametrize("error", [SchemaTooNew("c.db was written by a newer reliable_flow"),
                                   WrongFile("c.db is not a consumer file")], ids=type)
def test_worker_run_raises_what_retrying_cannot_heal(at: At, error: Exception) -> None:
    with Producer(at("p"), RESERVATION) as p, Raises(at("c"), RESERVATION) as c:
        commit(p, "A", upto=1)
        c.error = error
        with pytest.raises(type(error)):
            Worker(p, [c], idle_sleep=0).run(max_passes=5, handle_signals=False)


@pytest.mark.parametrize("error", [StorageError("disk I/O error"), DatabaseBusy("locked"),
                                   ConnectionError("down")], ids=type)
def test_worker_records_and_retries_transient_errors(at: At, error: Exception) -> None:
    with Producer(at("p"), RESERVATION) as p, Raises(at("c"), RESERVATION) as c:
        commit(p, "A", upto=1)
        c.error = error
        policy = DeliveryPolicy(backoff_base=0)  # due again at once: every pass retries
        stats = Worker(p, [c], policy=policy, idle_sleep=0).run(max_passes=3, handle_signals=False)
        assert (stats.passes, stats.errors) == (3, 3)
        assert outbox_entry(p, "A1").deliveries["default"].attempts == 3


# -- 11. relay from a protocol hook during advance ------------------------------------------


def _hooked(hook: Callable[[], Any]) -> Protocol:
    """RESERVATION's rules, with ``hook()`` called from ``step`` (inside advance's transaction)."""

    def step(state: str, kind: str, value: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        hook()
        return {**data, **value}

    return Protocol(name="hooked", initial=RESERVATION.initial, transitions=RESERVATION.transitions,
                    schemas=RESERVATION.schemas, step=step)


def test_relay_from_a_protocol_hook_says_it_is_inside_a_transaction_of_the_producer(at: At) -> None:
    objects: dict[str, Any] = {}
    protocol = _hooked(lambda: relay(objects["producer"], objects["consumer"]))
    with Producer(at("p"), protocol) as p, Consumer(at("c"), protocol) as c:
        objects.update(producer=p, consumer=c)
        with pytest.raises(RuntimeError) as raised:
            p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        message = str(raised.value)
        assert "inside an open transaction of this producer (a batch, or a protocol hook during advance)" in message
        assert "producer.batch()" not in message
        assert p.outbox() == [] and p.flow("A") is None and c.flows() == []


# -- 12. outbox() / advance() on the producer inside its own batch --------------------------


@pytest.mark.parametrize("call", ["outbox", "advance", "redeliver"])
def test_calls_on_the_producer_inside_its_batch_raise_a_clear_runtime_error(
    pair: tuple[Producer, Consumer], call: str
) -> None:
    producer, _ = pair
    calls: dict[str, Callable[[], Any]] = {
        "outbox": producer.outbox,
        "advance": lambda: producer.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 3}),
        "redeliver": lambda: producer.admin.redeliver("A1", consumer="default", actor="me", reason="test"),
    }
    advice = "use the batch's advance inside the block; read after it"
    with pytest.raises(RuntimeError, match=advice) as raised, producer.batch() as b:
        b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        calls[call]()
    assert not isinstance(raised.value, sqlite3.Error)
    assert "cannot start a transaction within a transaction" not in str(raised.value)
    assert outbox_rows(producer.location) == 0  # the batch rolled back as a whole
    # Caught inside the block, the batch goes on and commits its own advances.
    with producer.batch() as b:
        b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        with pytest.raises(RuntimeError, match="inside an open transaction of its own"):
            calls[call]()
    assert [e.event_id for e in producer.outbox()] == ["A1"]


def test_a_read_from_a_protocol_hook_during_advance_raises_the_same_clear_error(at: At) -> None:
    objects: dict[str, Producer] = {}
    with Producer(at("p"), _hooked(lambda: objects["p"].outbox())) as p:
        objects["p"] = p
        with pytest.raises(RuntimeError, match=r"\(a batch, or a protocol hook during advance\)"):
            p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert outbox_rows(p.location) == 0


# -- 13. a directory as the file path -------------------------------------------------------
# (a SQLite file's: tests/sqlite/test_traps_sqlite.py)


# -- 14. a directory whose name is not valid UTF-8 ------------------------------------------
# (a SQLite file's: tests/sqlite/test_traps_sqlite.py)


# -- 15. the storage-faults page names the error a broken batch raises ---------------------
# (a SQLite file's: tests/sqlite/test_traps_sqlite.py)


# -- 16. a consumer whose file is locked ----------------------------------------------------
# (a SQLite file's: tests/sqlite/test_traps_sqlite.py)


# -- 17. the worker's lease default --------------------------------------------------------


def test_worker_and_run_share_one_30_s_lease_default_documented_once(pair: tuple[Producer, Consumer]) -> None:
    """Issue 18, 7i: ``Worker`` used to take no lease while ``run`` leased 30 s."""
    from reliable_flow._tools.cli import _parser
    from reliable_flow.delivery import DEFAULT_LEASE_SECONDS

    producer, consumer = pair
    assert Worker(producer, [consumer]).policy.lease_seconds == DEFAULT_LEASE_SECONDS == 30.0
    args = _parser().parse_args(["run", "--producer", "p.db", "--consumer", "a=a.db"])
    assert args.lease == DEFAULT_LEASE_SECONDS
    doc = " ".join((DOCS / "worker.md").read_text(encoding="utf-8").split())
    assert "`Worker(...)` and `reliable-flow run` agree: both lease for 30 s by default" in doc
    assert "no lease by default" not in doc
    # Stated in one place: the other pages point to worker.md instead of repeating it.
    for page in sorted(DOCS.glob("*.md")):
        if page.name not in ("worker.md", "api.md"):
            text = " ".join(page.read_text(encoding="utf-8").split())
            assert not re.search(r"`Worker[^.]*lease[^.]*default|default[^.]*lease[^.]*`Worker", text), page.name


# -- flags and names that must not quietly mean something else ----------------------------------


@pytest.mark.parametrize("value", ["no", 1, 0, None])
def test_register_and_from_now_must_be_real_bools(at: At, value: object) -> None:
    with Producer(at("p"), RESERVATION) as p, Consumer(at("c"), RESERVATION) as c:
        with pytest.raises(TypeError, match="register"):
            relay(p, c, register=value)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="register"):
            relay_batch(p, c, register=value)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="from_now"):
            p.admin.register_consumer("audit", from_now=value, actor="ops", reason="new")  # type: ignore[arg-type]
        assert p.admin.consumers() == []  # nothing registered by any of them


@pytest.mark.parametrize("name", ["", "   "])
def test_a_blank_consumer_name_is_refused(at: At, name: str) -> None:
    with Producer(at("p"), RESERVATION) as p:
        with pytest.raises(ValueError, match="name"):
            p.admin.register_consumer(name, actor="ops", reason="new")
        assert p.admin.consumers() == []


@pytest.mark.parametrize(("field", "value", "error"), [
    ("owner", "", ValueError), ("owner", "  ", ValueError), ("owner", 5, ValueError),
    ("wait_for_due", "no", TypeError), ("wait_for_due", 1, TypeError),
])
def test_delivery_policy_owner_and_wait_for_due_are_checked(field: str, value: object, error: type) -> None:
    with pytest.raises(error, match=field):
        reliable_flow.DeliveryPolicy(**{field: value})
