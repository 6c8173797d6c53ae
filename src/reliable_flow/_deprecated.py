"""Names kept for one release only: each access warns (``DeprecationWarning``)
with what to use instead.  Nothing in the package raises or returns them.

``reliable_flow.InboxFull`` / ``reliable_flow.errors.InboxFull`` and
``reliable_flow.Refused`` / ``reliable_flow.statuses.Refused``: a full
inbox is answered with ``ReceiveStatus.REFUSED`` on every path.

The operator methods of ``Producer`` and ``Consumer`` (``redeliver``,
``skip_event``, ``prune``, ...) moved to ``producer.admin`` and
``consumer.admin``: the old names are :class:`to_admin` attributes that
warn and then call the new method (:data:`TO_ADMIN` lists them).

``Producer.path`` and ``Consumer.path`` are ``location`` (one value, one
name), and so is the constructors' first parameter: the old attribute is a
:class:`renamed_to` attribute and the old keyword is accepted by
:func:`renamed_parameter`, both warning (:data:`RENAMED_ATTRIBUTES` and
:data:`RENAMED_PARAMETERS` list them).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from .errors import ReliableFlowError

__all__ = [
    "MOVED_MODULES", "RENAMED_ATTRIBUTES", "RENAMED_PARAMETERS", "TO_ADMIN", "install_moved_modules", "moved_module",
    "old_name", "renamed_parameter", "renamed_to", "to_admin",
]

_REFUSED = "a full inbox is answered with a ReceiveResult of status ReceiveStatus.REFUSED"


class InboxFull(ReliableFlowError):
    """Deprecated, no longer raised (see the module).  Its name still starts
    the ``last_error`` a relay records for a refused event."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Deprecated (see the module): what a ``Receiver`` answered when its
    inbox was full.  A relay still takes it as ``refused``, with a warning."""

    reason: str


_OLD: dict[str, dict[str, tuple[Any, str]]] = {
    "reliable_flow": {"InboxFull": (InboxFull, _REFUSED), "Refused": (Refused, _REFUSED)},
    "reliable_flow.errors": {"InboxFull": (InboxFull, _REFUSED)},
    "reliable_flow.statuses": {"Refused": (Refused, _REFUSED)},
}


#: Every method alias kept for one release: {class name: (old names)}; each
#: moved to the same name on ``.admin`` (``prune`` included).
TO_ADMIN: dict[str, tuple[str, ...]] = {}


class to_admin:
    """A method that moved to the owner's ``admin`` object: reading it warns
    (``DeprecationWarning`` naming the new call) and returns the admin's
    bound method of the same name."""

    def __init__(self) -> None:
        self.owner = self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner.__name__, name
        TO_ADMIN[owner.__name__] = (*TO_ADMIN.get(owner.__name__, ()), name)

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        warnings.warn(
            f"{self.owner}.{self.name} is deprecated; use {self.owner.lower()}.admin.{self.name}",
            DeprecationWarning, stacklevel=2,
        )
        return getattr(obj.admin, self.name)  # type: ignore[attr-defined]


# -- renamed attributes and parameters (issue 19, item 5: ``location`` only) ----------

#: Every attribute alias kept for one release: {class name: {old name: new name}}.
RENAMED_ATTRIBUTES: dict[str, dict[str, str]] = {}
#: Every constructor keyword alias kept for one release: {class name: {old: new}}.
RENAMED_PARAMETERS: dict[str, dict[str, str]] = {}

_F = TypeVar("_F", bound=Callable[..., Any])


class renamed_to:
    """An attribute renamed on its own class: reading the old name warns
    (``DeprecationWarning`` naming the new one) and returns the new one."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.owner = self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner.__name__, name
        RENAMED_ATTRIBUTES.setdefault(owner.__name__, {})[name] = self.new

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        warnings.warn(
            f"{self.owner}.{self.name} is deprecated; use {self.owner.lower()}.{self.new}",
            DeprecationWarning, stacklevel=2,
        )
        return getattr(obj, self.new)

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(f"{self.owner}.{self.name} is read-only (and deprecated; use {self.new})")


def renamed_parameter(owner: str, old: str, new: str) -> Callable[[_F], _F]:
    """Decorates ``owner.__init__``: a caller still passing ``old=`` by
    keyword is warned (``DeprecationWarning`` naming ``new``) and its value
    is passed as ``new=``.  Positional calls are unchanged."""
    RENAMED_PARAMETERS.setdefault(owner, {})[old] = new

    def decorate(init: _F) -> _F:
        @functools.wraps(init)
        def accepting_old(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{owner}() got both {new}= and its deprecated name {old}=")
                warnings.warn(
                    f"{owner}({old}=...) is deprecated; use {owner}({new}=...)", DeprecationWarning, stacklevel=2
                )
                kwargs[new] = kwargs.pop(old)
            return init(*args, **kwargs)

        return cast(_F, accepting_old)

    return decorate


# -- moved and renamed names (issue 19): the one table of them -----------------------
# Each old name, per module it was public in, and the dotted path of what
# replaces it.  tests/test_deprecations.py lists every one, and so does the
# CHANGELOG ("One face").

_RENAMED = {  # old name -> new name, same meaning (issue 19, item 5)
    "Effect": "reliable_flow.records.ScheduledEffect",
    "EffectRecord": "reliable_flow.records.AppliedEvent",
    "Effects": "reliable_flow.EffectRegistry",
}
_TO_RECORDS = (  # result and record dataclasses, now in reliable_flow.records
    "AdvanceResult", "ApplyResult", "ConsumerEntry", "DeliveryRecord", "DrainResult",
    "ExecutorStats", "InboxEntry", "InboxRow", "OperatorAction",
    "OutboxEntry", "PruneResult", "ReceiveResult", "RelayBatchResult",
    "RelayResult", "StuckFlow", "WorkerStats",
)
#: One record type for every operator action (issue 19, item 5): the three
#: others are ``OperatorAction`` with their ``target``.
_TO_OPERATOR_ACTION = ("EffectAction", "InboxAction", "RegistryAction")
_TO_ERRORS = (  # every error but ReliableFlowError, now only in reliable_flow.errors
    "CommitOutcomeUnknown", "ConsumerMismatch", "DatabaseBusy", "EffectKeyConflict",
    "InvalidEnvelope", "NotResolvable", "ReadOnlyStorage", "SQLiteTooOld", "SchemaTooNew",
    "StorageError", "StorageFull", "TransactionConflict", "UnknownConsumer", "UnknownEffect",
    "UnknownEvent", "WrongFile", "WrongProcess", "WrongThread",
)
_TO_STATUSES = ("DrainStop", "FlowWait")  # enums used less often, now only in reliable_flow.statuses

MOVED: dict[str, dict[str, str]] = {
    "reliable_flow": {
        **{name: f"reliable_flow.records.{name}" for name in _TO_RECORDS},
        **{name: "reliable_flow.records.OperatorAction" for name in _TO_OPERATOR_ACTION},
        **{name: f"reliable_flow.errors.{name}" for name in _TO_ERRORS},
        **{name: f"reliable_flow.statuses.{name}" for name in _TO_STATUSES},
        **_RENAMED,
    },
    "reliable_flow.statuses": {
        **{name: _RENAMED[name] for name in ("Effect", "EffectRecord")},
        "EffectAction": "reliable_flow.records.OperatorAction",
    },
    "reliable_flow.operations": {name: "reliable_flow.records.OperatorAction" for name in ("InboxAction", "RegistryAction")},
    "reliable_flow.records": {name: "reliable_flow.records.OperatorAction" for name in _TO_OPERATOR_ACTION},
    "reliable_flow.effects": {"Effects": _RENAMED["Effects"]},
}


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def old_name(module: str, name: str) -> Any:
    """A module's ``__getattr__``: the deprecated ``name`` with a warning, or
    ``AttributeError`` as for any missing name."""
    moved = MOVED.get(module, {}).get(name)
    if moved is not None:
        warnings.warn(f"{module}.{name} is deprecated: use {moved}", DeprecationWarning, stacklevel=3)
        return _resolve(moved)
    found = _OLD.get(module, {}).get(name)
    if found is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value, instead = found
    warnings.warn(f"{module}.{name} is deprecated: {instead}", DeprecationWarning, stacklevel=3)
    return value


# -- moved modules (issue 19, item 1: internal modules private) ----------------------
# Every internal module was renamed with a leading underscore (httpx's
# pattern); an old dotted path still imports for one release, as a copy of
# the new module's names that warns once when first imported.  Changing an
# attribute of the copy does not reach the real module.

#: Every old module path kept for one release: {old dotted prefix: new one}.
#: A prefix covers its submodules (``reliable_flow.store.sqlite.schema``).
MOVED_MODULES: dict[str, str] = {
    **{f"reliable_flow.{name}": f"reliable_flow._{name}" for name in (
        "checks", "consumer", "consumer_admin", "core", "deprecated", "effects", "envelope", "executor",
        "handlers", "loop", "observe", "operations", "producer", "producer_admin", "receiver", "receiving",
        "relay", "retention", "store", "tools", "worker",
    )},
    "reliable_flow.delivery.lease": "reliable_flow.delivery._lease",
    "reliable_flow.delivery.policy": "reliable_flow.delivery._policy",
}


def moved_module(old: str) -> str | None:
    """The module that replaced the dotted path ``old``, or None if it did not move."""
    parts = old.split(".")
    for end in range(len(parts), 1, -1):
        new = MOVED_MODULES.get(".".join(parts[:end]))
        if new is not None:
            return ".".join([new, *parts[end:]])
    return None


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as a warning copy of the module that replaced it."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = moved_module(fullname)
        if new is None:
            return None
        real = importlib.import_module(new)
        return importlib.util.spec_from_loader(
            fullname, self, is_package=hasattr(real, "__path__"),
        )

    def exec_module(self, module: types.ModuleType) -> None:
        new = moved_module(module.__name__)
        assert new is not None
        real = importlib.import_module(new)
        warnings.warn(
            f"module {module.__name__} is deprecated (internal modules are private): "
            f"import from reliable_flow, reliable_flow.records / errors / statuses, or {new}",
            DeprecationWarning, stacklevel=2,
        )
        module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__") or k == "__getattr__"})
        module.__dict__["__all__"] = list(getattr(real, "__all__", ()))
        if hasattr(real, "__path__"):
            module.__path__ = []  # submodules come through this finder too
        parent, _, child = module.__name__.rpartition(".")
        same_name = getattr(sys.modules.get(parent), child, None)
        if callable(same_name) and not isinstance(same_name, types.ModuleType):
            # The import system now sets ``parent.child`` to this module, which
            # would hide the function of that name (``reliable_flow.relay``):
            # the module stays callable as that function.
            module.__class__ = _CallableModule
            module.__dict__["__wrapped__"] = same_name


class _CallableModule(types.ModuleType):
    """An old module path whose name is also a function of its package."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["__wrapped__"](*args, **kwargs)


def install_moved_modules() -> None:
    """Put the finder of old module paths on ``sys.meta_path`` (once), after
    the normal finders: it is asked only for a name that no file has."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
