"""The public surface: exported names, typing marker, command line, statuses and results."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.metadata
import importlib.resources
import json
import pkgutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from reliable_flow import Consumer, Producer, relay, statuses
from support import child_env, run_cli

# Pinned from src/reliable_flow/__init__.py: adding or removing a public name
# is an API change and must update this list on purpose.
PUBLIC_NAMES = [
    "AdvanceStatus",
    "AppSchema",
    "ApplyContext",
    "ApplyStatus",
    "BlockReason",
    "Consumer",
    "ConsumerAdmin",
    "DeliveryPolicy",
    "DeliveryState",
    "EffectCall",
    "EffectExecutor",
    "EffectRegistry",
    "EffectState",
    "Event",
    "Feedback",
    "Happened",
    "InboxState",
    "NotHappened",
    "OutcomeUnknown",
    "PayloadError",
    "PermanentFailure",
    "PostgresLocation",
    "Producer",
    "ProducerAdmin",
    "Protocol",
    "ReceiveStatus",
    "Receiver",
    "RelayStatus",
    "ReliableFlowError",
    "RetryLater",
    "Topic",
    "Worker",
    "__version__",
    "errors",
    "records",
    "relay",
    "relay_batch",
    "snapshot",
    "statuses",
]

# The namespaces (issue 19): every result and record, every error, every status enum.
RECORD_NAMES = [
    "AdvanceResult", "AppliedEvent", "ApplyResult", "ConsumerEntry", "DeliveryRecord",
    "DrainResult", "EffectSchedule", "EffectTransition", "ExecutorStats", "InboxEntry", "InboxRow",
    "OperatorAction", "OutboxEntry", "PassResult", "PruneResult", "ReceiveResult",
    "RelayBatchResult", "RelayResult", "ScheduledEffect", "StuckFlow", "WorkerStats",
]
STATUS_NAMES = [
    "ActionTarget", "AdvanceStatus", "ApplyStatus", "BlockReason", "DeliveryState", "DrainStop", "EffectState",
    "FlowWait", "InboxState", "ReceiveStatus", "RelayStatus", "Transition",
]

# Statuses the SPEC fixes (section 2); an enum may have more members, never fewer.
SPEC_STATUSES = {
    "AdvanceStatus": {"committed", "existing", "conflict", "stale", "invalid_transition", "invalid_payload"},
    "ReceiveStatus": {"accepted", "duplicate", "id_conflict", "sequence_conflict", "refused"},
    "RelayStatus": {"accepted", "duplicate", "id_conflict", "sequence_conflict", "refused", "idle"},
    "ApplyStatus": {"applied", "gap", "blocked", "idle"},
    "BlockReason": {"unsupported_schema", "invalid_payload", "invalid_transition"},
    "DrainStop": {"gap", "blocked", "idle", "limit"},
}

RESULT_TYPES = [name for name in RECORD_NAMES if name.endswith("Result")]
assert {"AdvanceResult", "ReceiveResult", "RelayResult", "ApplyResult", "DrainResult"} <= set(RESULT_TYPES)


def _env() -> dict[str, str]:
    return child_env(PYTHONWARNINGS="error")


# -- exported names -------------------------------------------------------------------------


def test_all_is_sorted_and_unique() -> None:
    assert reliable_flow.__all__ == sorted(reliable_flow.__all__)
    assert len(set(reliable_flow.__all__)) == len(reliable_flow.__all__)


def test_all_is_pinned() -> None:
    assert sorted(reliable_flow.__all__) == PUBLIC_NAMES


def test_the_face_has_at_most_40_names() -> None:
    assert len(reliable_flow.__all__) <= 40


def test_the_namespaces_are_pinned() -> None:
    assert sorted(reliable_flow.records.__all__) == RECORD_NAMES
    assert sorted(reliable_flow.statuses.__all__) == STATUS_NAMES
    errors = reliable_flow.errors
    assert "ReliableFlowError" in errors.__all__
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.ReliableFlowError), name
    for name in STATUS_NAMES:
        assert issubclass(getattr(reliable_flow.statuses, name), enum.Enum), name
    for name in RECORD_NAMES:
        assert dataclasses.is_dataclass(getattr(reliable_flow.records, name)), name


def test_each_namespace_defines_what_it_lists() -> None:
    """Records are defined in ``records.py`` only, and ``statuses.py`` holds
    the enums alone (issue 29): no record is re-exported from elsewhere."""
    for name in RECORD_NAMES:
        assert getattr(reliable_flow.records, name).__module__ == "reliable_flow.records", name
    for name in STATUS_NAMES:
        assert getattr(reliable_flow.statuses, name).__module__ == "reliable_flow.statuses", name
    defined = {name for name, value in vars(reliable_flow.statuses).items()
               if isinstance(value, type) and value.__module__ == "reliable_flow.statuses"}
    assert defined == {*STATUS_NAMES, "_StrEnum"}
    assert not any(dataclasses.is_dataclass(value) for value in vars(reliable_flow.statuses).values())


def test_the_face_names_are_the_namespace_objects() -> None:
    for name in PUBLIC_NAMES:
        if name in STATUS_NAMES:
            assert getattr(reliable_flow, name) is getattr(reliable_flow.statuses, name)
    assert reliable_flow.ReliableFlowError is reliable_flow.errors.ReliableFlowError


def test_field_checks_come_from_where_protocols_are_written() -> None:
    from reliable_flow.protocol import (  # noqa: F401 - the import under test
        PayloadError,
        Protocol,
        boolean,
        by_kind,
        exact,
        integer,
        number,
        optional,
        text,
    )

    assert exact({"n": integer(1, 3)})("x", {"n": 2}) == {"n": 2}


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_every_public_name_exists(name: str) -> None:
    assert hasattr(reliable_flow, name)
    assert getattr(reliable_flow, name) is not None


def test_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, Any] = {}
    exec("from reliable_flow import *", namespace)  # noqa: S102 - the statement under test
    namespace.pop("__builtins__")
    assert sorted(namespace) == PUBLIC_NAMES


def _modules() -> list[str]:
    return sorted(
        info.name for info in pkgutil.walk_packages(reliable_flow.__path__, prefix="reliable_flow.")
    )


def test_the_module_walk_finds_the_core_modules() -> None:
    found = set(_modules())
    core = {
        "_consumer", "_envelope", "errors", "_producer", "protocol", "_receiver",
        "_relay", "reservation", "statuses", "_worker", "__main__",
        "_core.advance", "_core.apply", "_core.receive", "_core.relay",
        "_store.outbox", "_store.inbox", "_store.sqlite.connection", "_store.sqlite.schema",
        "_store.sqlite.outbox", "_store.sqlite.inbox", "delivery._policy", "delivery._lease",
        "_tools.cli", "_tools.snapshot", "_tools.inspection", "_tools.experiment.runner",
    }
    assert {f"reliable_flow.{m}" for m in core} <= found


#: The modules user code imports (docs/architecture.md, "The public modules");
#: every other module is private: its name, or a package above it, starts
#: with an underscore (issue 19, item 1).
PUBLIC_MODULES = [
    "reliable_flow", "reliable_flow.aio", "reliable_flow.console", "reliable_flow.crash", "reliable_flow.delivery",
    "reliable_flow.errors",
    "reliable_flow.metrics", "reliable_flow.protocol", "reliable_flow.records", "reliable_flow.reservation",
    "reliable_flow.statuses", "reliable_flow.tracing", "reliable_flow.transport", "reliable_flow.transport.redis",
]


def _private(module_name: str) -> bool:
    return any(part.startswith("_") for part in module_name.split(".")[1:])


def test_every_module_but_the_public_ones_is_private() -> None:
    public = sorted(m for m in ["reliable_flow", *_modules()] if not _private(m))
    assert public == PUBLIC_MODULES
    assert _private("reliable_flow._core.apply") and _private("reliable_flow.delivery._lease")
    assert not _private("reliable_flow.errors")


@pytest.mark.parametrize("module_name", _modules())
def test_every_module_defines_all_and_every_name_exists(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert "__all__" in vars(module), f"{module_name} has no __all__"
    names = module.__all__
    assert isinstance(names, (list, tuple))
    assert len(set(names)) == len(names)
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == []


def test_py_typed_is_shipped() -> None:
    marker = importlib.resources.files("reliable_flow").joinpath("py.typed")
    assert marker.is_file()


def test_installed_version_matches_dunder_version() -> None:
    assert isinstance(reliable_flow.__version__, str)
    assert importlib.metadata.version("reliable_flow") == reliable_flow.__version__


def test_exception_tree() -> None:
    root = reliable_flow.ReliableFlowError
    assert issubclass(root, Exception)
    for name in (
        "InvalidEnvelope", "UnknownEvent", "WrongFile", "SchemaTooNew", "ConsumerMismatch",
        "SQLiteTooOld", "WrongProcess", "StorageError", "CommitOutcomeUnknown",
    ):
        assert issubclass(getattr(reliable_flow.errors, name), root), name
    assert issubclass(reliable_flow.errors.InvalidEnvelope, ValueError)
    assert issubclass(reliable_flow.errors.UnknownEvent, LookupError)
    assert issubclass(reliable_flow.errors.SchemaTooNew, reliable_flow.errors.WrongFile)
    assert issubclass(reliable_flow.errors.CommitOutcomeUnknown, reliable_flow.errors.StorageError)
    assert issubclass(reliable_flow.PayloadError, ValueError)
    exported = [getattr(reliable_flow, n) for n in reliable_flow.__all__]
    errors = [e for e in exported if isinstance(e, type) and issubclass(e, BaseException)]
    # Raised by user code to tell the library something (a protocol's payload
    # rule, an effect function's outcome); the library never raises them at a caller.
    assert sorted(e.__name__ for e in errors if not issubclass(e, root)) == [
        "OutcomeUnknown", "PayloadError", "PermanentFailure", "RetryLater",
    ]
    err = reliable_flow.errors.InvalidEnvelope("seq", "must be an int")
    assert (err.field, err.problem, str(err)) == ("seq", "must be an int", "seq: must be an int")


# -- command line ---------------------------------------------------------------------------


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=60, env=_env())


def test_cli_version(tmp_path: Path) -> None:
    done = _run_cli("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"reliable_flow {reliable_flow.__version__}"
    assert list(tmp_path.iterdir()) == []


def test_cli_help(tmp_path: Path) -> None:
    done = _run_cli("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    assert "demo" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_cli_unknown_command_fails(tmp_path: Path) -> None:
    done = _run_cli("no-such-command", cwd=tmp_path)
    assert done.returncode != 0
    assert "invalid choice" in done.stderr


# -- statuses -------------------------------------------------------------------------------


def _status_members() -> list[Any]:
    out = []
    for name in statuses.__all__:
        cls = getattr(statuses, name)
        if isinstance(cls, type) and issubclass(cls, enum.Enum):
            out.extend(pytest.param(member, id=f"{name}.{member.name}") for member in cls)
    return out


@pytest.mark.parametrize("member", _status_members())
def test_status_is_its_plain_string(member: Any) -> None:
    value = member.value
    assert isinstance(value, str)
    assert isinstance(member, str)
    assert member == value
    assert value == member
    assert str(member) == value
    assert f"{member}" == value
    assert format(member, "") == value
    assert json.dumps(member) == json.dumps(value)
    assert hash(member) == hash(value)
    assert {value: 1}[member] == 1
    assert type(member)(value) is member
    assert value == value.lower() and " " not in value


@pytest.mark.parametrize("enum_name", sorted(SPEC_STATUSES))
def test_status_enums_cover_the_spec(enum_name: str) -> None:
    cls = getattr(reliable_flow.statuses, enum_name)
    assert SPEC_STATUSES[enum_name] <= {m.value for m in cls}


def test_status_enums_reject_unknown_values() -> None:
    with pytest.raises(ValueError):
        reliable_flow.AdvanceStatus("commited")
    assert reliable_flow.ApplyStatus.APPLIED != "applied "


# -- results --------------------------------------------------------------------------------


def _sample(cls: type) -> Any:
    fields = {f.name: None for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    return cls(**fields)


@pytest.mark.parametrize("name", RESULT_TYPES)
def test_result_types_are_frozen_dataclasses(name: str) -> None:
    cls = getattr(reliable_flow.records, name)
    assert dataclasses.is_dataclass(cls)
    result = _sample(cls)
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(result, first, "changed")
    # New attributes are refused too (CPython < 3.12 raises TypeError here for
    # frozen slotted dataclasses, gh-90055; the point is that it raises).
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        result.extra = 1
    assert not hasattr(result, "extra")
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(result, first)


def test_real_results_are_frozen(producer: Producer, consumer: Consumer) -> None:
    advanced = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    relayed = relay(producer, consumer)
    applied = consumer.apply_next("A")
    drained = consumer.drain("A")
    received = consumer.receive(producer.event("A1") or {})
    assert (advanced.status, relayed.status, applied.status, drained.stop, received.status) == (
        "committed", "accepted", "applied", "idle", "duplicate",
    )
    assert type(advanced.status) is reliable_flow.AdvanceStatus
    assert type(relayed.status) is reliable_flow.RelayStatus
    assert type(applied.status) is reliable_flow.ApplyStatus
    assert type(drained.stop) is reliable_flow.statuses.DrainStop
    assert type(received.status) is reliable_flow.ReceiveStatus
    for result in (advanced, relayed, applied, drained, received):
        for field in dataclasses.fields(result):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(result, field.name, "other")
    assert drained.applied == 0
    assert advanced == reliable_flow.records.AdvanceResult(reliable_flow.AdvanceStatus.COMMITTED, "A1", "A", 1)
