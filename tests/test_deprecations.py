"""Every deprecated alias, listed: each still works for this release and
warns (``DeprecationWarning``) naming its replacement.  The CHANGELOG lists
the same aliases (Unreleased, "One face").  Remove a row only together with
the alias itself."""

from __future__ import annotations

import importlib
import re
import sys
import warnings

import pytest

from reliable_flow._deprecated import MOVED, MOVED_MODULES

# -- names ------------------------------------------------------------------------------------
# (module the old name was public in, old name, replacement) - issue 19: the
# face keeps at most 40 names; records, errors and statuses are namespaces;
# three names say what they are (item 5).

RENAMED_NAMES = [
    ("reliable_flow", "Effect", "reliable_flow.records.ScheduledEffect"),
    ("reliable_flow", "EffectRecord", "reliable_flow.records.AppliedEvent"),
    ("reliable_flow", "Effects", "reliable_flow.EffectRegistry"),
    ("reliable_flow.statuses", "Effect", "reliable_flow.records.ScheduledEffect"),
    ("reliable_flow.statuses", "EffectRecord", "reliable_flow.records.AppliedEvent"),
    ("reliable_flow.effects", "Effects", "reliable_flow.EffectRegistry"),
    # one record type for every operator action
    *((module, name, "reliable_flow.records.OperatorAction")
      for module in ("reliable_flow", "reliable_flow.records")
      for name in ("EffectAction", "InboxAction", "RegistryAction")),
    ("reliable_flow.statuses", "EffectAction", "reliable_flow.records.OperatorAction"),
    ("reliable_flow.operations", "InboxAction", "reliable_flow.records.OperatorAction"),
    ("reliable_flow.operations", "RegistryAction", "reliable_flow.records.OperatorAction"),
]

MOVED_NAMES = [
    *(("reliable_flow", name, f"reliable_flow.records.{name}") for name in (
        "AdvanceResult", "ApplyResult", "ConsumerEntry", "DeliveryRecord", "DrainResult",
        "ExecutorStats", "InboxEntry", "InboxRow", "OperatorAction",
        "OutboxEntry", "PruneResult", "ReceiveResult", "RelayBatchResult",
        "RelayResult", "StuckFlow", "WorkerStats",
    )),
    *(("reliable_flow", name, f"reliable_flow.errors.{name}") for name in (
        "CommitOutcomeUnknown", "ConsumerMismatch", "DatabaseBusy", "EffectKeyConflict",
        "InvalidEnvelope", "NotResolvable", "ReadOnlyStorage", "SQLiteTooOld", "SchemaTooNew",
        "StorageError", "StorageFull", "TransactionConflict", "UnknownConsumer", "UnknownEffect",
        "UnknownEvent", "WrongFile", "WrongProcess", "WrongThread",
    )),
    ("reliable_flow", "DrainStop", "reliable_flow.statuses.DrainStop"),
    ("reliable_flow", "FlowWait", "reliable_flow.statuses.FlowWait"),
]

NAME_ALIASES = RENAMED_NAMES + MOVED_NAMES


def _import(module: str) -> object:
    """The module, its own deprecation (an old module path) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(module)


def _resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_the_table_lists_every_alias() -> None:
    table = {(module, old, new) for module, names in MOVED.items() for old, new in names.items()}
    assert set(NAME_ALIASES) == table
    assert len(NAME_ALIASES) == len(table)


@pytest.mark.parametrize(("module", "old", "new"), NAME_ALIASES, ids=lambda v: str(v))
def test_old_name_warns_naming_its_replacement(module: str, old: str, new: str) -> None:
    replacement = _resolve(new)
    old_module = _import(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is deprecated: use {new}$"):
        value = getattr(old_module, old)
    assert value is replacement


@pytest.mark.parametrize(("module", "old", "new"), NAME_ALIASES, ids=lambda v: str(v))
def test_from_import_of_old_name_warns(module: str, old: str, new: str) -> None:
    namespace: dict[str, object] = {}
    _import(module)
    with pytest.warns(DeprecationWarning, match=new):
        exec(f"from {module} import {old}", namespace)  # noqa: S102 - the statement under test
    assert namespace[old] is _resolve(new)


@pytest.mark.parametrize(("module", "old", "new"), NAME_ALIASES, ids=lambda v: str(v))
def test_old_name_is_not_exported(module: str, old: str, new: str) -> None:
    assert old not in _import(module).__all__  # type: ignore[attr-defined]


def test_new_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _, _, new in NAME_ALIASES:
            _resolve(new)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import reliable_flow

    with pytest.raises(AttributeError, match="no_such_name"):
        reliable_flow.no_such_name  # noqa: B018 - the access under test


# -- modules ----------------------------------------------------------------------------------
# (old module path, the private module that replaced it) - issue 19, item 1:
# internal modules are private; a package's entry covers its submodules.

MODULE_ALIASES = [
    *((f"reliable_flow.{name}", f"reliable_flow._{name}") for name in (
        "checks", "consumer", "consumer_admin", "core", "deprecated", "effects", "envelope", "executor",
        "handlers", "loop", "observe", "operations", "producer", "producer_admin", "receiver", "receiving",
        "relay", "retention", "store", "tools", "worker",
    )),
    ("reliable_flow.delivery.lease", "reliable_flow.delivery._lease"),
    ("reliable_flow.delivery.policy", "reliable_flow.delivery._policy"),
]


def test_the_module_table_lists_every_alias() -> None:
    assert sorted(MODULE_ALIASES) == sorted(MOVED_MODULES.items())


@pytest.fixture(autouse=True)
def _keep_the_relay_function():  # type: ignore[no-untyped-def]
    """Importing the old path ``reliable_flow.relay`` binds the package's
    ``relay`` to that (callable) module; put the function back afterwards."""
    import reliable_flow
    from reliable_flow._relay import relay

    yield
    reliable_flow.relay = relay


def test_the_old_relay_module_path_leaves_relay_callable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import reliable_flow
    from reliable_flow.reservation import RESERVATION

    _forget("reliable_flow.relay")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        importlib.import_module("reliable_flow.relay")
    assert isinstance(reliable_flow.relay, type(reliable_flow))  # the import system bound the module
    producer = reliable_flow.Producer(str(tmp_path / "p.db"), RESERVATION)
    consumer = reliable_flow.Consumer(str(tmp_path / "c.db"), RESERVATION)
    producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 1})
    assert reliable_flow.relay(producer, consumer).status == "accepted"
    producer.close()
    consumer.close()


def _forget(old: str) -> None:
    """Drop the alias (and its submodules) so the next import runs it again."""
    for name in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        del sys.modules[name]


@pytest.mark.parametrize(("old", "new"), MODULE_ALIASES + [
    ("reliable_flow.store.sqlite.schema", "reliable_flow._store.sqlite.schema"),
    ("reliable_flow.core.apply", "reliable_flow._core.apply"),
    ("reliable_flow.tools.experiment.harness", "reliable_flow._tools.experiment.harness"),
], ids=lambda v: str(v))
def test_old_module_path_warns_naming_its_replacement_and_has_its_names(old: str, new: str) -> None:
    real = importlib.import_module(new)
    _forget(next(k for k in MOVED_MODULES if old == k or old.startswith(k + ".")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.import_module(old)
    # a package on the old path warns too, on its way to the submodule
    said = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert any(re.fullmatch(rf"module {re.escape(old)} is deprecated .* {re.escape(new)}", m) for m in said), said
    assert alias is not real and alias.__name__ == old
    assert alias.__all__ == real.__all__  # type: ignore[attr-defined]
    assert all(getattr(alias, name) is getattr(real, name) for name in real.__all__)


def test_a_from_import_through_an_old_path_gives_the_real_objects() -> None:
    from reliable_flow._store.sqlite.schema import CONSUMER as real

    _forget("reliable_flow.store")
    namespace: dict[str, object] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec("from reliable_flow.store.sqlite.schema import CONSUMER", namespace)  # noqa: S102
    assert any(str(w.message).endswith("reliable_flow._store.sqlite.schema") for w in caught)
    assert namespace["CONSUMER"] is real


def test_a_path_that_never_existed_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("reliable_flow.no_such_module")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("reliable_flow.store.no_such_module")


def test_the_private_modules_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _, new in MODULE_ALIASES:
            importlib.import_module(new)


# -- methods ----------------------------------------------------------------------------------
# (added by the Producer/Consumer restructuring: old method -> new method)

# Producer's and Consumer's operator methods moved to ``.admin`` (issue 19,
# item 2): (class, old method); each is now ``<object>.admin.<same name>``.
METHOD_ALIASES = [
    *(("Producer", name) for name in (
        "redeliver", "skip", "operator_actions", "prune",
        "consumers", "register_consumer", "remove_consumer", "registry_actions",
    )),
    *(("Consumer", name) for name in (
        "skip_event", "replace_event", "operator_actions", "prune",
        "retry_effect", "resolve_effect", "cancel_effect", "effect_actions",
    )),
]


def test_the_method_table_lists_every_alias() -> None:
    from reliable_flow._deprecated import TO_ADMIN

    assert {(cls, name) for cls, names in TO_ADMIN.items() for name in names} == set(METHOD_ALIASES)


@pytest.fixture
def sides(tmp_path):
    """A producer and a consumer that applied A1, which scheduled one effect
    (``default:A1:notify``): every read has something to answer."""
    from reliable_flow import Consumer, EffectRegistry, Producer, relay
    from reliable_flow.reservation import RESERVATION

    effects = EffectRegistry()
    effects.register("notify", lambda call: {})
    with (
        Producer(str(tmp_path / "p.db"), RESERVATION) as p,
        Consumer(str(tmp_path / "c.db"), RESERVATION, handlers=[lambda ctx: ctx.schedule("notify", {})],
                 effects=effects) as c,
    ):
        p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 1})
        relay(p, c)
        c.apply_next("A")
        yield {"Producer": p, "Consumer": c}


@pytest.mark.parametrize(("cls", "name"), METHOD_ALIASES, ids=lambda v: str(v))
def test_old_method_warns_naming_its_replacement_and_still_works(sides, cls: str, name: str) -> None:
    owner = sides[cls]
    with pytest.warns(DeprecationWarning, match=rf"^{cls}\.{name} is deprecated; use {cls.lower()}\.admin\.{name}$"):
        method = getattr(owner, name)
    assert method == getattr(owner.admin, name)  # the same bound method: the same behaviour
    if name in ("operator_actions", "registry_actions", "consumers", "effect_actions"):
        with pytest.warns(DeprecationWarning):
            assert getattr(owner, name)() == getattr(owner.admin, name)()
    if name == "prune":
        with pytest.warns(DeprecationWarning):
            assert getattr(owner, name)(0).complete


def test_the_new_methods_do_not_warn(sides) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sides["Producer"].admin.operator_actions()
        sides["Producer"].admin.consumers()
        sides["Consumer"].admin.operator_actions()
        sides["Consumer"].admin.effect_actions()
        sides["Consumer"].applied("A")
        sides["Consumer"].scheduled_effect("default:A1:notify")
        sides["Consumer"].scheduled_effects()


# -- attributes and constructor keywords ------------------------------------------------------
# ``path`` and ``location`` were one value under two names, and the consumer's
# three reads now say what they read: applied events, or rows of the effect
# outbox (issue 19, item 5): (class, old name, new name).

ATTRIBUTE_ALIASES = [
    ("Producer", "path", "location"), ("Consumer", "path", "location"),
    ("Consumer", "effects", "applied"), ("Consumer", "effect", "scheduled_effect"),
    ("Consumer", "effect_outbox", "scheduled_effects"),
]
# The arguments each renamed method is called with (in ``sides``, each answers something).
METHOD_CALLS: dict[str, tuple[object, ...]] = {
    "effects": ("A",), "effect": ("default:A1:notify",), "effect_outbox": (),
}
PARAMETER_ALIASES = [("Producer", "path", "location"), ("Consumer", "path", "location")]


def test_the_attribute_tables_list_every_alias() -> None:
    from reliable_flow._deprecated import RENAMED_ATTRIBUTES, RENAMED_PARAMETERS

    listed = {(cls, old, new) for cls, names in RENAMED_ATTRIBUTES.items() for old, new in names.items()}
    assert listed == set(ATTRIBUTE_ALIASES)
    listed = {(cls, old, new) for cls, names in RENAMED_PARAMETERS.items() for old, new in names.items()}
    assert listed == set(PARAMETER_ALIASES)


@pytest.mark.parametrize(("cls", "old", "new"), ATTRIBUTE_ALIASES, ids=lambda v: str(v))
def test_old_attribute_warns_naming_its_replacement_and_still_works(sides, cls: str, old: str, new: str) -> None:
    owner = sides[cls]
    with pytest.warns(DeprecationWarning, match=rf"^{cls}\.{old} is deprecated; use {cls.lower()}\.{new}$"):
        value = getattr(owner, old)
    assert value == getattr(owner, new)  # a method: the same bound method
    if old in METHOD_CALLS:
        answer = getattr(owner, new)(*METHOD_CALLS[old])
        assert answer  # not empty: the comparison below means something
        with pytest.warns(DeprecationWarning, match=rf"use {cls.lower()}\.{new}$"):
            assert getattr(owner, old)(*METHOD_CALLS[old]) == answer
    with pytest.raises(AttributeError, match="read-only"):
        setattr(owner, old, "elsewhere")


@pytest.mark.parametrize(("cls", "old", "new"), PARAMETER_ALIASES, ids=lambda v: str(v))
def test_old_keyword_warns_naming_its_replacement_and_still_works(tmp_path, cls: str, old: str, new: str) -> None:
    import reliable_flow
    from reliable_flow.reservation import RESERVATION

    make = getattr(reliable_flow, cls)
    where = str(tmp_path / f"{cls.lower()}.db")
    with pytest.warns(DeprecationWarning, match=rf"^{cls}\({old}=\.\.\.\) is deprecated; use {cls}\({new}=\.\.\.\)$"):
        opened = make(**{old: where, "protocol": RESERVATION})
    with opened:
        assert opened.location == where
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with make(**{new: where, "protocol": RESERVATION}) as again, make(where, RESERVATION) as positional:
            assert again.location == positional.location == where
    with pytest.raises(TypeError, match="both"):
        make(**{old: where, new: where, "protocol": RESERVATION})
