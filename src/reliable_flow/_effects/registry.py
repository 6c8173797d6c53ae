"""Side effects outside the file: what an effect is, and how its function answers.

Register each effect once, by name, in an :class:`EffectRegistry` that
both the consumer (so apply handlers can only schedule known effects) and
the :class:`~reliable_flow.EffectExecutor` use::

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

import asyncio
import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _envelope as envelope
from .._checks import check_count, check_optional_count, check_seconds
from ..errors import InvalidEnvelope, LeaseLost, UnknownEffect
from .every import ScheduleSpec, declare

__all__ = [
    "EffectCall",
    "EffectRegistry",
    "EffectSpec",
    "Feedback",
    "Happened",
    "Lease",
    "NotHappened",
    "OutcomeUnknown",
    "PermanentFailure",
    "RetryLater",
    "ScheduleSpec",
    "check_json_object",
    "check_json_value",
]


class RetryLater(Exception):
    """Raised by an effect function: nothing happened; try again after a backoff.

    ``after``: seconds until the next attempt instead of the backoff (a
    provider's ``Retry-After``): a finite number >= 0, never a bool, else
    ``ValueError`` naming ``after`` is raised where the ``RetryLater`` is
    made.  The attempt is counted either way, bounded by ``max_attempts``.
    """

    def __init__(self, *args: object, after: float | None = None) -> None:
        super().__init__(*args)
        if after is not None:
            check_seconds("after", after, allow_zero=True)
        self.after: float | None = None if after is None else float(after)


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


class Lease:
    """The executor's side of one call's claim, shared with the call's thread:
    whether the claim was lost, and a way to ask for its renewal.  Plain
    attribute reads and writes, and a callback that only queues."""

    __slots__ = ("lost", "renew")

    def __init__(self, renew: Callable[[], None]) -> None:
        self.lost = False
        self.renew = renew


@dataclass(frozen=True, slots=True)
class EffectCall:
    """What an effect function (or its reconcile) is called with.

    ``heartbeat()`` says "still working": the executor extends the claim's
    lease at once (it also renews the leases of its calls in flight by
    itself while its process lives, when they run off its thread).  Safe
    from any thread.  Once the claim was lost, ``lease_lost`` is True and
    ``heartbeat()`` raises :class:`~reliable_flow.errors.LeaseLost`: stop,
    whatever the call returns now is discarded.  Outside an executor (a
    test calling the function itself) ``heartbeat()`` does nothing.
    """

    key: str
    name: str
    payload: dict[str, Any]
    meta: dict[str, str]
    attempt: int
    flow_id: str
    event_id: str
    lease: Lease | None = field(default=None, repr=False, compare=False)

    @property
    def lease_lost(self) -> bool:
        """True once the executor knows the claim is no longer this call's."""
        return self.lease is not None and self.lease.lost

    def heartbeat(self) -> None:
        """Extend the claim's lease; ``LeaseLost`` once it was lost."""
        if self.lease is None:
            return
        if not self.lease.lost:
            self.lease.renew()
        if self.lease.lost:
            raise LeaseLost(f"effect {self.key!r}: the claim was lost; stop, the outcome will be discarded")

    async def aheartbeat(self) -> None:
        """:meth:`heartbeat` for an ``async def`` function: the wait for the
        renewal to be written happens on a worker thread, so the executor's
        event loop (and the other calls on it) go on meanwhile."""
        if self.lease is None:
            return
        await asyncio.to_thread(self.heartbeat)


@dataclass(frozen=True, slots=True)
class Feedback:
    """Advance an effect's result into the executor's producer as the next step
    of a flow, with the event id ``<effect key>:result``; and, with
    ``on_failure``, its failure as a step of its own, ``<effect key>:failure``.

    ``kind`` is the step's kind; ``payload(result)`` builds its payload (by
    default the result itself, which must then be an object); ``flow(effect
    flow id)`` names the flow (by default the effect's own flow id).

    ``on_failure``: the failure step, advanced exactly once when the effect
    ends ``dead``, ``cancelled``, ``expired`` or ``superseded``, or stays
    ``unknown`` for ``unknown_after`` seconds: a kind (its payload is
    ``{"key", "effect_state", "reason", "error"}``: the effect's key, the
    state it ended in, why, and its last error; the last two left out when
    there is none), or a ``Feedback`` whose
    ``payload`` builds the step's payload from that object (its ``flow``,
    else this one's, names the flow).  Without it (None) a failure feeds
    nothing back.  ``unknown_after``: seconds an effect parked ``unknown``
    waits for an operator before its failure step is fed (0: at once); None
    (the default): an unknown effect feeds nothing until an operator acts
    (its cancel feeds the failure step).  The failure step is fed at most
    once per effect, even when an operator retries it and it fails again.

    ``kind`` must be a valid event kind (a string of 1-128 characters, no
    control characters), ``payload`` / ``flow`` callables or None,
    ``on_failure`` a kind, a ``Feedback`` without its own ``on_failure`` or
    ``unknown_after``, or None, and ``unknown_after`` a finite number of
    seconds >= 0 (only with ``on_failure``): anything else raises
    ``InvalidEnvelope`` / ``TypeError`` / ``ValueError`` naming the field
    here, not after the effect ran.  A ``payload`` or ``flow`` function that
    raises is recorded as refused feedback (the effect's ``last_error``) and
    tried again on the executor's next pass.
    """

    kind: str
    payload: Callable[[Any], dict[str, Any]] | None = None
    flow: Callable[[str], str] | None = None
    on_failure: str | Feedback | None = None
    unknown_after: float | None = None

    def __post_init__(self) -> None:
        envelope.check_name("kind", self.kind)
        for name in ("payload", "flow"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")
        failure = self.on_failure
        if isinstance(failure, Feedback):
            if failure.on_failure is not None or failure.unknown_after is not None:
                raise ValueError("on_failure: a failure step has no failure step of its own "
                                 "(give on_failure and unknown_after on the outer Feedback)")
        elif isinstance(failure, str):
            envelope.check_name("on_failure", failure)
        elif failure is not None:
            raise TypeError(f"on_failure must be a kind, a Feedback or None, got {type(failure).__name__}")
        if self.unknown_after is not None:
            seconds = check_seconds("unknown_after", self.unknown_after, allow_zero=True)
            if failure is None:
                raise ValueError("unknown_after needs on_failure (the step an unknown effect feeds)")
            object.__setattr__(self, "unknown_after", seconds)

    @property
    def failure_step(self) -> Feedback | None:
        """How the failure step is built (``on_failure`` as a ``Feedback``; its
        ``flow`` defaults to this one's), or None when none is fed."""
        failure = self.on_failure
        if failure is None:
            return None
        if isinstance(failure, str):
            return Feedback(failure, flow=self.flow)
        return failure if failure.flow is not None or self.flow is None else \
            Feedback(failure.kind, failure.payload, self.flow)


Run = Callable[[EffectCall], Any]
Reconcile = Callable[[EffectCall], "Happened | NotHappened"]


@dataclass(frozen=True)
class EffectSpec:
    """A registered effect: its function, how doubt about it is settled, and
    how fast it may be called (see :meth:`EffectRegistry.register`)."""

    name: str
    run: Run
    reconcile: Reconcile | None = None
    idempotent: bool = False
    max_attempts: int = 5
    feedback: Feedback | None = None
    concurrency: int | None = None
    timeout: float | None = None
    rate_limit: tuple[int, float] | None = None

    @property
    def is_async(self) -> bool:
        """Whether ``run`` is an ``async def`` function (run on the executor's event loop)."""
        return inspect.iscoroutinefunction(self.run)

    @property
    def reconcile_is_async(self) -> bool:
        return self.reconcile is not None and inspect.iscoroutinefunction(self.reconcile)


@dataclass
class EffectRegistry:
    """The registry of effects, by name."""

    _specs: dict[str, EffectSpec] = field(default_factory=dict)
    _schedules: dict[str, ScheduleSpec] = field(default_factory=dict)

    def register(
        self, name: str, run: Run, *, reconcile: Reconcile | None = None, idempotent: bool = False,
        max_attempts: int = 5, feedback: Feedback | None = None, concurrency: int | None = None,
        timeout: float | None = None, rate_limit: tuple[int, float] | None = None,
    ) -> EffectSpec:
        """Register ``run`` under ``name``; returns its spec.  A name registers once.

        ``run`` and ``reconcile`` may be plain functions (called on the
        executor's threads) or ``async def`` functions (awaited on an event
        loop the executor owns).

        ``concurrency``: at most this many calls of this name in flight at
        once across every executor of the consumer, counted from the store
        (claims whose lease has not run out), not per process.

        ``timeout``: seconds after which the executor stops waiting for a
        call and records the attempt as in doubt (then reconcile, re-run by
        key or park, as for any doubt).  The claim stays held (its lease
        renewed) until the call really returns or the process dies, so
        nothing runs the effect again meanwhile; the late outcome is
        discarded.  Python cannot stop a thread: the function keeps running
        until it returns, so make it return (its own timeouts).

        ``rate_limit``: ``(count, period_seconds)``: at most ``count`` calls
        of this name start per ``period_seconds`` across every executor of
        the consumer, counted from the durable effect history; an effect
        over the limit waits (pending) until a start leaves the window.

        Each option refuses bad input with an error naming it (NaN,
        infinities, zero or negative, bools), and nothing is registered.
        """
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
        check_optional_count("concurrency", concurrency)
        if timeout is not None:
            check_seconds("timeout", timeout, allow_zero=False)
        limit = _rate_limit(rate_limit)
        spec = EffectSpec(name, run, reconcile, idempotent, max_attempts, feedback, concurrency,
                          None if timeout is None else float(timeout), limit)
        self._specs[name] = spec
        return spec

    def every(
        self, name: str, payload: Mapping[str, Any] | None = None, *, interval: float | None = None,
        cron: str | None = None, tz: str = "UTC", missed: str = "one", schedule: str | None = None,
    ) -> ScheduleSpec:
        """Declare a recurring effect: the registered effect ``name`` with
        ``payload`` (a JSON object; default ``{}``) on every tick, each tick
        performed exactly once in effect across executors and crashes.

        Exactly one of ``interval`` (seconds, at least 0.001: ticks at the
        multiples of ``interval`` since the Unix epoch, so ``interval=3600``
        ticks on the hour, UTC) and ``cron`` (five fields, ``"0 8 * * 1-5"``,
        matched on the wall clock of ``tz``, an IANA time zone name; see
        docs/effects.md for daylight-saving changes).

        ``missed``: a tick is missed when its time passed while no executor
        took it (every executor down, or paused): ``"one"`` (the default)
        performs the latest missed tick, ``"all"`` every missed tick (the
        latest 100 at most; older ones are counted as skipped), ``"skip"``
        none (the next tick only).  ``schedule``: the schedule's name, what
        identifies it (default: ``name``); one registry declares a name once.

        The consumer's store records the schedule when an executor with this
        registry opens; the same name stored with another definition is
        refused there (:class:`~reliable_flow.errors.ScheduleConflict`)
        until an operator removes it (``consumer.admin.remove_schedule``).
        Each tick becomes an effect keyed ``schedule:<schedule>:<tick epoch
        seconds>``, of flow ``schedule:<schedule>``.

        Bad input raises an error naming the argument (``interval``, ``cron``
        and its field, ``tz``, ``missed``, ``payload``, ``schedule``) and
        nothing is declared.
        """
        envelope.check_name("name", name)
        if name not in self._specs:
            raise UnknownEffect(f"effect {name!r} is not registered: register it before its schedule")
        text = check_json_object("payload", {} if payload is None else payload)
        spec = declare(name, text, interval, cron, tz, missed, schedule)
        if spec.schedule in self._schedules:
            raise ValueError(f"schedule {spec.schedule!r} is already declared in this registry")
        self._schedules[spec.schedule] = spec
        return spec

    @property
    def schedules(self) -> dict[str, ScheduleSpec]:
        """The recurring schedules declared here (:meth:`every`), by schedule name."""
        return dict(self._schedules)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._specs))

    def __len__(self) -> int:
        return len(self._specs)

    def get(self, name: str) -> EffectSpec | None:
        return self._specs.get(name)


def _rate_limit(value: object) -> tuple[int, float] | None:
    """``(count, period_seconds)``: a positive int and a positive finite number."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"rate_limit must be a pair (count, period_seconds), got {value!r}")
    count, period = value
    check_count("rate_limit count", count)
    check_seconds("rate_limit period_seconds", period, allow_zero=False)
    return count, float(period)


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
