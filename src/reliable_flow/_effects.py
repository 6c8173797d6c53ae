"""Side effects outside the file: what an effect is, and how its function answers.

Register each effect once, by name, in an :class:`EffectRegistry` that
both the consumer (so apply handlers can only schedule known effects) and
the :class:`~reliable_flow._executor.EffectExecutor` use::

    effects = EffectRegistry()
    effects.register("send_email", send_email, reconcile=email_was_sent)
    effects.register("refund", call_refund_api, idempotent=True)

The function gets an :class:`EffectCall` (the idempotency ``key``, the same on
every attempt, ``payload``, ``meta``, ``attempt``) and returns a JSON value,
the result.  It says how it failed by what it raises:

* :class:`RetryLater` -- certainly nothing happened; try again after a backoff;
* :class:`PermanentFailure` -- it will never work; the effect goes ``dead``;
* :class:`OutcomeUnknown` (or ``TimeoutError``, or any other exception) --
  it may have happened.  Before any new attempt the effect is reconciled
  (``reconcile(call)`` answers :class:`Happened` or :class:`NotHappened`), or
  re-run with the same key when the target deduplicates by key
  (``idempotent=True``); with neither it is parked as ``unknown``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _envelope as envelope
from ._checks import check_count
from .errors import InvalidEnvelope

__all__ = [
    "EffectCall",
    "EffectRegistry",
    "EffectSpec",
    "Feedback",
    "Happened",
    "NotHappened",
    "OutcomeUnknown",
    "PermanentFailure",
    "RetryLater",
]


class RetryLater(Exception):
    """Raised by an effect function: nothing happened; try again after a backoff."""


class PermanentFailure(Exception):
    """Raised by an effect function: this will never succeed; the effect goes dead."""


class OutcomeUnknown(Exception):
    """Raised by an effect function (or reconcile): it may or may not have happened."""


@dataclass(frozen=True, slots=True)
class Happened:
    """A reconcile answer: the effect did take place; ``result`` is what it returned."""

    result: Any = None


@dataclass(frozen=True, slots=True)
class NotHappened:
    """A reconcile answer: the effect certainly did not take place; it may run."""


@dataclass(frozen=True, slots=True)
class EffectCall:
    """What an effect function (or its reconcile) is called with."""

    key: str
    name: str
    payload: dict[str, Any]
    meta: dict[str, str]
    attempt: int
    flow_id: str
    event_id: str


@dataclass(frozen=True, slots=True)
class Feedback:
    """Advance an effect's result into the executor's producer as the next step
    of a flow, with the event id ``<effect key>:result``.

    ``kind`` is the step's kind; ``payload(result)`` builds its payload (by
    default the result itself, which must then be an object); ``flow(effect
    flow id)`` names the flow (by default the effect's own flow id).

    ``kind`` must be a valid event kind (a string of 1-128 characters, no
    control characters), and ``payload`` / ``flow`` callables or None:
    anything else raises ``InvalidEnvelope`` / ``TypeError`` naming the
    field here, not after the effect ran.  A ``payload`` or ``flow``
    function that raises is recorded as refused feedback (the effect's
    ``last_error``) and tried again on the executor's next pass.
    """

    kind: str
    payload: Callable[[Any], dict[str, Any]] | None = None
    flow: Callable[[str], str] | None = None

    def __post_init__(self) -> None:
        envelope.check_name("kind", self.kind)
        for name in ("payload", "flow"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")


Run = Callable[[EffectCall], Any]
Reconcile = Callable[[EffectCall], "Happened | NotHappened"]


@dataclass(frozen=True)
class EffectSpec:
    """A registered effect: its function and how doubt about it is settled."""

    name: str
    run: Run
    reconcile: Reconcile | None = None
    idempotent: bool = False
    max_attempts: int = 5
    feedback: Feedback | None = None


@dataclass
class EffectRegistry:
    """The registry of effects, by name."""

    _specs: dict[str, EffectSpec] = field(default_factory=dict)

    def register(
        self, name: str, run: Run, *, reconcile: Reconcile | None = None, idempotent: bool = False,
        max_attempts: int = 5, feedback: Feedback | None = None,
    ) -> EffectSpec:
        """Register ``run`` under ``name``; returns its spec.  A name registers once."""
        envelope.check_name("name", name)
        if name in self._specs:
            raise ValueError(f"effect {name!r} is already registered")
        if not callable(run):
            raise TypeError(f"run must be callable, got {type(run).__name__}")
        if reconcile is not None and not callable(reconcile):
            raise TypeError(f"reconcile must be callable or None, got {type(reconcile).__name__}")
        if not isinstance(idempotent, bool):
            raise TypeError(f"idempotent must be a bool, got {idempotent!r}")
        check_count("max_attempts", max_attempts)
        if feedback is not None and not isinstance(feedback, Feedback):
            raise TypeError(f"feedback must be a Feedback or None, got {type(feedback).__name__}")
        spec = EffectSpec(name, run, reconcile, idempotent, max_attempts, feedback)
        self._specs[name] = spec
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._specs))

    def __len__(self) -> int:
        return len(self._specs)

    def get(self, name: str) -> EffectSpec | None:
        return self._specs.get(name)


def check_json_object(field_name: str, value: object) -> str:
    """The canonical JSON text of an object of JSON values (any nesting), or
    ``InvalidEnvelope`` naming the field: no NaN or infinities, string keys."""
    if not isinstance(value, Mapping):
        raise InvalidEnvelope(field_name, f"must be an object, got {type(value).__name__}")
    _check_json(field_name, value)
    return envelope.canonical(value)


def check_json_value(field_name: str, value: object) -> str:
    """The canonical JSON text of any JSON value, or ``InvalidEnvelope``."""
    _check_json(field_name, value)
    return envelope.canonical({"v": value})[5:-1]


def _check_json(path: str, value: object) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidEnvelope(path, "must be valid Unicode (lone surrogate found)") from None
        return
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEnvelope(path, "floats must be finite")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidEnvelope(path, f"keys must be strings, got {type(key).__name__}")
            _check_json(path, key)
            _check_json(f"{path}.{key}", item)
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(f"{path}[{index}]", item)
        return
    raise InvalidEnvelope(path, f"must be JSON (object, array, string, number, bool, null), "
                                         f"got {type(value).__name__}")


def __getattr__(name: str) -> Any:
    if name == "Effects":  # deprecated, for one release: the registry's old name
        from ._deprecated import old_name

        return old_name("reliable_flow.effects", name)  # its public name until 0.2
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
