"""A store records the import path of the protocol that created it (issue 30,
item 6), and the commands use it when ``--protocol`` is not given.

* ``Protocol.import_path()``: ``module:ATTRIBUTE`` of the very object, or
  None (built in a function, bound to two names, a script's ``__main__``);
* ``Producer`` / ``Consumer`` record it in ``meta`` (``protocol_path``) the
  first time a store is opened with an importable protocol, on both
  engines; the first path stays, another one only logs a warning;
* ``run``, ``execute`` and the operator commands open such a store without
  ``--protocol``; a path that does not import where the command runs, and
  a store that records a name but no path, are exit 2 with one sentence.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from engine_reads import rows
from reliable_flow import Consumer, Producer
from reliable_flow.protocol import Protocol, exact, integer
from reliable_flow.reservation import RESERVATION
from support import child_env, run_cli

_MODULE = '''
from reliable_flow import EffectRegistry
from reliable_flow.protocol import Protocol, exact, integer

ORDERS = Protocol(name="orders", initial="new", transitions={"new": ["paid"], "paid": ["paid"]},
                  schemas={1: exact({"n": integer(1, 100)})})
EFFECTS = EffectRegistry()


def another():
    return Protocol(name="orders", initial="new", transitions={"new": ["paid"], "paid": ["paid"]},
                    schemas={1: exact({"n": integer(1, 100)})})
'''


def _orders(protocol: Protocol | None = None, **changes: Any) -> Protocol:
    """A protocol named "orders" built here, in a function: no import path."""
    return Protocol(name="orders", initial="new", transitions={"new": ["paid"], "paid": ["paid"]},
                    schemas={1: exact({"n": integer(1, 100)})}, **changes)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A module of the application's, ``app_<hex>`` in ``tmp_path`` (the
    commands run there), holding ``ORDERS`` and an empty ``EFFECTS``."""
    name = f"app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


def _recorded(location: str) -> list[str]:
    return [str(r[0]) for r in rows(location, "SELECT value FROM meta WHERE key = 'protocol_path'")]


# -- Protocol.import_path ------------------------------------------------------------------------


def test_import_path_names_the_object_where_its_module_holds_it(app: Any) -> None:
    assert app.ORDERS.import_path() == f"{app.__name__}:ORDERS"
    assert RESERVATION.import_path() == "reliable_flow.reservation:RESERVATION"


def test_no_import_path_for_a_protocol_built_in_a_function_or_bound_twice(app: Any) -> None:
    assert _orders().import_path() is None
    app.ALIAS = app.ORDERS  # two names: which one is meant cannot be told
    assert app.ORDERS.import_path() is None


def test_no_import_path_for_a_script_run_by_path(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(_MODULE + "print(ORDERS.import_path())\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env(),
                          check=False, timeout=60)
    assert done.stdout.strip() == "None", done.stderr
    as_module = subprocess.run([sys.executable, "-m", "script"], capture_output=True, text=True, cwd=tmp_path,
                               env=child_env(), check=False, timeout=60)
    assert as_module.stdout.strip() == "script:ORDERS", as_module.stderr


# -- what a store records --------------------------------------------------------------------------


def test_producer_and_consumer_record_the_path_once(new_store: Any, app: Any) -> None:
    p_at, c_at = new_store("producer"), new_store("consumer")
    Producer(p_at, app.ORDERS).close()
    Consumer(c_at, app.ORDERS).close()
    path = f"{app.__name__}:ORDERS"
    assert _recorded(p_at) == [path]
    assert _recorded(c_at) == [path]
    Producer(p_at, app.ORDERS).close()  # opened again: still one row
    Consumer(c_at, app.ORDERS).close()
    assert _recorded(p_at) == [path]
    assert _recorded(c_at) == [path]


def test_a_store_made_without_a_path_records_it_when_one_opens_it(new_store: Any, app: Any) -> None:
    p_at, c_at = new_store("producer"), new_store("consumer")
    Producer(p_at, _orders()).close()
    Consumer(c_at, _orders()).close()
    assert _recorded(p_at) == [] and _recorded(c_at) == []
    Producer(p_at, app.ORDERS).close()
    Consumer(c_at, app.ORDERS).close()
    assert _recorded(p_at) == [f"{app.__name__}:ORDERS"]
    assert _recorded(c_at) == [f"{app.__name__}:ORDERS"]


def test_another_path_of_the_same_protocol_keeps_the_first_and_warns(
        new_store: Any, app: Any, caplog: pytest.LogCaptureFixture) -> None:
    p_at, c_at = new_store("producer"), new_store("consumer")
    Producer(p_at, app.ORDERS).close()
    Consumer(c_at, app.ORDERS).close()
    app.OTHER = app.another()  # the same name, under another path of the module
    with caplog.at_level(logging.WARNING, logger="reliable_flow"):
        Producer(p_at, app.OTHER).close()
        Consumer(c_at, app.OTHER).close()
    first = f"{app.__name__}:ORDERS"
    assert _recorded(p_at) == [first] and _recorded(c_at) == [first]
    warned = [r.getMessage() for r in caplog.records if "keeps its recorded protocol path" in r.getMessage()]
    assert len(warned) == 2 and all(first in w and f"{app.__name__}:OTHER" in w for w in warned)


def test_another_protocol_is_still_refused(new_store: Any, app: Any) -> None:
    p_at = new_store("producer")
    Producer(p_at, app.ORDERS).close()
    with pytest.raises(Exception, match="was created for protocol 'orders', not 'reservation'"):
        Producer(p_at, RESERVATION)
    assert _recorded(p_at) == [f"{app.__name__}:ORDERS"]


# -- the commands ----------------------------------------------------------------------------------


def _commit(location: str, protocol: Protocol, *flows: str) -> None:
    with Producer(location, protocol) as producer:
        for flow in flows:
            assert producer.advance(f"{flow}1", flow, expected_seq=0, kind="paid", payload={"n": 1}).status == "committed"


def test_commands_open_a_store_with_the_protocol_it_records(new_store: Any, app: Any, tmp_path: Path) -> None:
    p_at, c_at = new_store("producer"), new_store("consumer")
    _commit(p_at, app.ORDERS, "A", "B")
    done = run_cli("run", "--producer", p_at, "--consumer", f"shop={c_at}", "--until-idle", "--report-every", "0",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Consumer(c_at, app.ORDERS) as consumer:
        assert consumer.projection("A") == {"state": "paid", "last_seq": 1, "n": 1}
    registered = run_cli("registry", "register", p_at, "audit", "--actor", "ops", "--reason", "new reader",
                         cwd=tmp_path)
    assert registered.returncode == 0, registered.stderr
    skipped = run_cli("delivery", "skip", p_at, "audit", "A1", "--actor", "ops", "--reason", "not for audit",
                      cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr
    executed = run_cli("execute", c_at, "--effects", f"{app.__name__}:EFFECTS", "--producer", p_at,
                       "--until-idle", cwd=tmp_path)
    assert executed.returncode == 0, executed.stderr


def test_a_recorded_path_that_does_not_import_here_is_one_sentence(new_store: Any, app: Any,
                                                                  tmp_path: Path) -> None:
    p_at, c_at = new_store("producer"), new_store("consumer")
    _commit(p_at, app.ORDERS, "A")
    Consumer(c_at, app.ORDERS).close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if not p_at.startswith("postgres"):
        p_at, c_at = str(Path(p_at).resolve()), str(Path(c_at).resolve())
    for args, name in ((("run", "--producer", p_at, "--consumer", f"shop={c_at}", "--once"), "run"),
                       (("execute", c_at, "--effects", "reliable_flow:EffectRegistry"), "execute"),
                       (("inbox", "skip", c_at, "A1", "--actor", "ops", "--reason", "r"), "inbox skip")):
        done = run_cli(*args, cwd=elsewhere)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"{name}: ")
        assert f"records protocol '{app.__name__}:ORDERS'" in lines[0] and "--protocol" in lines[0]
    given = run_cli("run", "--producer", p_at, "--consumer", f"shop={c_at}", "--once", "--report-every", "0",
                    "--protocol", "reliable_flow.reservation:RESERVATION", cwd=elsewhere)
    assert given.returncode == 2 and "not 'reservation'" in given.stderr  # --protocol wins, checked by name


def test_a_store_with_a_name_but_no_path_asks_for_protocol(new_store: Any, tmp_path: Path) -> None:
    p_at = new_store("producer")
    _commit(p_at, _orders(), "A")
    done = run_cli("run", "--producer", p_at, "--consumer", "shop=" + new_store("consumer"), "--once",
                   cwd=tmp_path)
    assert done.returncode == 2
    assert "created for protocol 'orders' and records no import path: give --protocol" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_new_stores_still_default_to_the_reservation_protocol(tmp_path: Path) -> None:
    p_at, c_at = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    done = run_cli("run", "--producer", p_at, "--consumer", f"default={c_at}", "--once", "--report-every", "0",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _recorded(p_at) == ["reliable_flow.reservation:RESERVATION"]


def test_the_help_says_where_the_default_protocol_comes_from() -> None:
    for command in (("run",), ("bridge",), ("execute",), ("effect", "retry"), ("registry", "register")):
        text = run_cli(*command, "--help").stdout
        assert "the one the store records" in textwrap.dedent(" ".join(text.split())), command
