"""Apply handlers: user code that runs inside the apply transaction of an event.

A handler is a function of one :class:`ApplyContext`, registered with
``Consumer(..., handlers=[...])``.  It runs after the projection of every
event the consumer applies, in the same transaction, so everything it does
-- rows in the application's own tables (:meth:`ApplyContext.execute`),
effects it schedules (:meth:`ApplyContext.schedule`) or cancels -- commits
with the apply, or not at all::

    def notify(ctx: ApplyContext) -> None:
        if ctx.event.kind == "answered":
            ctx.execute(SAVE_ANSWER, (ctx.event.flow_id, ctx.event.payload["text"]))
            ctx.schedule("send_email", {"to": ctx.data["email"], "text": ctx.event.payload["text"]})

(``SAVE_ANSWER`` is the application's own statement on its own table;
docs/effects.md shows whole examples.)

A handler that raises :class:`~reliable_flow.PayloadError` blocks the event
(``invalid_payload`` with its message as the detail), leaving nothing of
the apply; any other exception rolls the apply back and propagates, and the
flow stays where it was.

The application's own tables are created and migrated with the library's,
by an :class:`AppSchema` given to the consumer.

The same SQL runs on both engines: ``ctx.execute`` takes ``?`` placeholders
on SQLite and on PostgreSQL (where they become psycopg's ``%s``, except in
string literals, quoted names and comments; PostgreSQL's own ``?``
operators, such as jsonb's ``?``, ``?|`` and ``?&``, are written ``??``).
Where the engines differ, ``ctx.engine`` says which one runs the handler,
and a migration of an :class:`AppSchema` may be given per engine.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _envelope as envelope
from ._checks import check_finite, check_optional_count, check_seconds, check_text
from ._core.effects import cancel_in, default_key, schedule_in
from ._effects import EffectRegistry, check_json_object
from ._store.effects import EffectUnit, NewEffect
from .errors import UnknownEffect
from .protocol import PayloadError

__all__ = ["ENGINES", "AppSchema", "ApplyContext", "Event", "Handler", "Migration"]

#: The engines, as ``ctx.engine`` names them and as keys of a per-engine migration.
ENGINES = ("sqlite", "postgres")
#: One migration of an :class:`AppSchema`: its SQL statements, the same on
#: every engine, or ``{"sqlite": [...], "postgres": [...]}`` (each engine
#: named; ``[]`` when one has nothing to do).
Migration = Sequence[str] | Mapping[str, Sequence[str]]

# Comments and blanks before the first keyword, which SQLite skips too.
_LEADING_COMMENTS = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.DOTALL)
_TRANSACTION_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE|VACUUM|ATTACH|DETACH)\b", re.IGNORECASE)


#: The event being applied, as stored in the inbox: an
#: :class:`~reliable_flow._envelope.Envelope` (``event_id``, ``flow_id``,
#: ``seq``, ``kind``, ``schema``, ``payload``, ``meta`` and its canonical ``body``).
Event = envelope.Envelope


@dataclass(frozen=True)
class AppSchema:
    """The application's own tables in the consumer's store, as ordered
    migrations: ``migrations[i]`` brings version ``i`` to ``i + 1``.  Applied
    when the consumer opens, each in one transaction with its version
    record; append migrations, never edit old ones.

    A migration is a list of SQL statements run on either engine, or a
    mapping with a list per engine, where their SQL differs::

        AppSchema("shop", [
            {"sqlite": [HOLD_TABLE_SQLITE], "postgres": [HOLD_TABLE_POSTGRES]},  # differs per engine
            [HOLD_INDEX],  # the same on both
        ])

    The recorded version counts migrations, whichever form each has."""

    name: str
    migrations: Sequence[Migration]

    def __post_init__(self) -> None:
        envelope.check_name("name", self.name)
        if isinstance(self.migrations, (str, bytes)) or not isinstance(self.migrations, Sequence):
            raise ValueError(  # noqa: TRY004 - ValueError, as AppSchema always raised for a bad shape
                f"migrations must be a list of migrations (each a list of SQL statements, or "
                f"{{engine: [statements]}}), got {self.migrations!r}"
            )
        for i, migration in enumerate(self.migrations):
            field = f"migrations[{i}]"
            if not isinstance(migration, Mapping):
                _check_statements(field, migration)
                continue
            unknown = [e for e in migration if e not in ENGINES]
            if unknown:
                raise ValueError(f"{field} names unknown engine {unknown[0]!r} (engines: {', '.join(ENGINES)})")
            missing = [e for e in ENGINES if e not in migration]
            if missing:
                raise ValueError(
                    f"{field} must give the statements of every engine; {missing[0]!r} is missing "
                    f"(give [] if it has nothing to do)"
                )
            for engine in ENGINES:
                _check_statements(f"{field}[{engine!r}]", migration[engine])

    def statements(self, version: int, engine: str) -> list[str]:
        """The statements that bring version ``version - 1`` to ``version`` on ``engine``."""
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= len(self.migrations):
            raise ValueError(f"version must be from 1 to {len(self.migrations)}, got {version!r}")
        migration = self.migrations[version - 1]
        return list(migration[engine] if isinstance(migration, Mapping) else migration)


def _check_statements(field: str, statements: object) -> None:
    if isinstance(statements, (str, bytes)) or not isinstance(statements, Sequence):
        raise ValueError(f"{field} must be a list of SQL statements, got {statements!r}")  # noqa: TRY004 - as above
    for j, statement in enumerate(statements):
        if not isinstance(statement, str) or not statement.strip():
            raise ValueError(f"{field}[{j}] must be a non-empty SQL statement, got {statement!r}")


class ApplyContext:
    """What a handler sees and may do while one event is applied.

    ``event``; ``previous_state``, ``state`` and ``data`` (the flow's, after
    this event); ``consumer``, the consumer's name; ``engine``, the engine
    the consumer's store is on (``"sqlite"`` or ``"postgres"``), for SQL that
    must differ; ``scheduled``, the keys this handler call scheduled."""

    def __init__(
        self, unit: EffectUnit, event: Event, previous_state: str, state: str, data: dict[str, Any],
        consumer: str, effects: EffectRegistry | None, now: float,
    ) -> None:
        self._unit = unit
        self._effects = effects
        self._now = now
        self.event = event
        self.previous_state = previous_state
        self.state = state
        self.data = copy.deepcopy(data)
        self.consumer = consumer
        self.engine: str = unit.engine
        self.scheduled: list[str] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on the application's own tables, inside the apply
        transaction; returns its rows.  Transaction control is refused: the
        library commits or rolls back the whole apply.

        ``?`` placeholders, one per value of ``params``, on both engines (on
        PostgreSQL: not in string literals, quoted names or comments; its
        ``?`` operators written ``??``; a statement without any ``?`` is
        passed unchanged, so psycopg's ``%s`` keeps working).  Named
        placeholders are not supported."""
        if not isinstance(sql, str) or _TRANSACTION_CONTROL.match(_LEADING_COMMENTS.sub("", sql)):
            raise ValueError(f"sql must be one statement without transaction control, got {sql!r}")
        if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
            raise TypeError(
                f"params must be a sequence of values for the ? placeholders (named placeholders are not "
                f"supported), got {type(params).__name__}"
            )
        return self._unit.user_execute(sql, params)

    def schedule(
        self, name: str, payload: dict[str, Any], *, key: str | None = None, deadline: float | None = None,
        version: int | None = None, ordered: bool = False, after: float | None = None, at: float | None = None,
    ) -> str:
        """Schedule the effect ``name`` with ``payload``; returns its idempotency key.

        The key is ``<consumer>:<event id>:<name>`` unless ``key`` is given
        (give one to schedule one name twice for an event); it never changes
        across retries.  ``deadline`` (seconds since the epoch; default the
        event's ``meta["expires_at"]``, if any) after which it is never run;
        ``version``: it is superseded, never run, once the flow is applied
        past this seq; ``ordered``: it waits while an earlier ordered effect
        of the same flow is unresolved.  ``after`` (seconds from now, >= 0)
        or ``at`` (seconds since the epoch), not both, delay it: no executor
        starts it before that time on its clock (durable: the time is stored
        with the effect, which until then is ``pending`` and can be cancelled,
        superseded or expire like any other).  Bad input raises
        ``ValueError`` naming the argument, and nothing is scheduled.
        """
        envelope.check_name("name", name)
        if self._effects is not None and name not in self._effects:
            raise UnknownEffect(f"effect {name!r} is not registered (registered: {list(self._effects)})")
        body = check_json_object("payload", payload)
        chosen = default_key(self.consumer, self.event.event_id, name) if key is None else key
        if not isinstance(chosen, str) or not chosen or len(chosen) > 512:
            raise ValueError(f"key must be a non-empty string of at most 512 characters, got {key!r}")
        if deadline is None and "expires_at" in self.event.meta:
            deadline = _epoch("meta.expires_at", self.event.meta["expires_at"])
        if deadline is not None:
            deadline = _finite("deadline", deadline)
        check_optional_count("version", version)
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be a bool, got {ordered!r}")
        due_at = _due_at(self._now, after, at)
        schedule_in(self._unit, NewEffect(
            chosen, name, body, self.event.event_id, self.event.flow_id, self.event.seq,
            envelope.canonical(self.event.meta), ordered, deadline, version, None, self._now, due_at,
        ))
        self.scheduled.append(chosen)
        return chosen

    def cancel(self, key: str, reason: str) -> None:
        """Cancel a pending effect (e.g. one this flow scheduled earlier and no
        longer needs), with a reason; it will never run."""
        check_text("reason", reason)
        cancel_in(self._unit, key, reason, self._now, self._effects)


Handler = Callable[[ApplyContext], None]


def _due_at(now: float, after: object, at: object) -> float | None:
    """When a delayed effect is first due (None: at once); refuses both, NaN,
    infinities, bools, non-numbers and negative values, naming the argument."""
    if after is not None and at is not None:
        raise ValueError(f"give after or at, not both (got after={after!r}, at={at!r})")
    if after is not None:
        return now + check_seconds("after", after, allow_zero=True)
    if at is not None:
        return check_seconds("at", at, allow_zero=True)  # epoch seconds; one in the past is due at once
    return None


def _finite(name: str, value: object) -> float:
    return check_finite(name, value, "seconds since the epoch")


class _BadMeta(PayloadError):
    """The event's own meta breaks a rule: the event blocks (invalid_payload)."""

    def __init__(self, field: str, problem: str) -> None:
        ValueError.__init__(self, f"meta.{field}: {problem}")
        self.field = field
        self.problem = problem


def _epoch(name: str, text: str) -> float:
    """``meta.expires_at`` as epoch seconds, or an ISO 8601 time with a zone."""
    from datetime import datetime

    try:
        return _finite(name, float(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _BadMeta("expires_at", f"must be epoch seconds or an ISO 8601 time, got {text!r}") from None
    if moment.tzinfo is None:
        raise _BadMeta("expires_at", f"must name its time zone (e.g. ...Z), got {text!r}")
    return moment.timestamp()
