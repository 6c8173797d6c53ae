"""The producer's consumer registry on PostgreSQL: which names get
deliveries, which consumer store each is bound to, and the record of changes.

A mixin of :class:`~reliable_flow.store.postgres.outbox.PgOutbox`.

Registering (or removing) a name must not race with ``append_event``: an
event committed while a name is being registered would otherwise be
pending for nobody new (``append_event`` read the consumer table before the
name was there, and the registration's "every committed event" did not see
the event yet).  So a unit takes the schema's ``registry`` advisory lock:
``append_event`` and pruning in shared mode, registration, binding checks
and removal in exclusive mode.  A registration therefore waits for the
appends in flight and the appends after it see the new name.
"""

from __future__ import annotations

from ...operations import ConsumerEntry, RegistryAction
from .base import PgView

__all__ = ["CONSUMERS", "REGISTRY_LOCK", "PgRegistry"]

REGISTRY_LOCK = "registry"
CONSUMERS = (
    "SELECT c.name, c.uid, c.registered_at, c.from_pos, "
    "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'pending'), "
    "(SELECT count(*) FROM delivery d WHERE d.consumer = c.name AND d.state = 'set_aside') "
    "FROM consumer c ORDER BY c.name"
)
_REGISTER = (
    "INSERT INTO consumer(name, uid, registered_at, from_pos) "
    "SELECT %s, NULL, %s, CASE WHEN %s THEN (SELECT coalesce(max(pos), 0) FROM outbox) END"
)
_PENDING_FOR_ALL = "INSERT INTO delivery(consumer, pos) SELECT %s, pos FROM outbox"


class PgRegistry(PgView):
    """Registering, binding and removing consumer names."""

    def has_consumers(self) -> bool:
        self._lock(REGISTRY_LOCK)
        return self._one("SELECT 1 FROM consumer LIMIT 1") is not None

    def is_registered(self, name: str) -> bool:
        self._lock(REGISTRY_LOCK)
        return self._one("SELECT 1 FROM consumer WHERE name = %s", (name,)) is not None

    def register_consumer(self, name: str, now: float, from_now: bool) -> None:
        """A name with no store yet: from now, after the last committed event; else from the first."""
        self._lock(REGISTRY_LOCK)
        self._run(_REGISTER, (name, now, bool(from_now)))
        if not from_now:
            self._run(_PENDING_FOR_ALL, (name,))

    def add_consumer(self, name: str, uid: str) -> None:
        """Bind a consumer name to a store; every event already committed is pending for it."""
        self._lock(REGISTRY_LOCK)
        self._run("INSERT INTO consumer(name, uid) VALUES (%s, %s)", (name, uid))
        self._run(_PENDING_FOR_ALL, (name,))

    def bound_uid(self, name: str) -> str | None:
        row = self._one("SELECT uid FROM consumer WHERE name = %s", (name,))
        return None if row is None or row[0] is None else str(row[0])

    def bind_consumer(self, name: str, uid: str) -> None:
        self._run("UPDATE consumer SET uid = %s WHERE name = %s AND uid IS NULL", (uid, name))

    def remove_consumer(self, name: str) -> None:
        self._lock(REGISTRY_LOCK)
        self._run("DELETE FROM delivery WHERE consumer = %s", (name,))
        self._run("DELETE FROM consumer WHERE name = %s", (name,))

    def record_registry_action(self, action: RegistryAction) -> None:
        self._run(
            "INSERT INTO registry_action(at, consumer, action, actor, reason) VALUES (%s, %s, %s, %s, %s)",
            (action.at, action.consumer, action.action, action.actor, action.reason),
        )

    def consumers(self) -> list[ConsumerEntry]:
        return [
            ConsumerEntry(name, uid, uid is not None, registered_at, from_pos is not None, int(backlog),
                          int(set_aside))
            for name, uid, registered_at, from_pos, backlog, set_aside in self._rows(CONSUMERS)
        ]

    def registry_actions(self, consumer: str | None = None) -> list[RegistryAction]:
        where, params = ("WHERE consumer = %s", (consumer,)) if consumer is not None else ("", ())
        return [
            RegistryAction(*r)
            for r in self._rows(
                f"SELECT at, consumer, action, actor, reason FROM registry_action {where} ORDER BY id", params
            )
        ]
