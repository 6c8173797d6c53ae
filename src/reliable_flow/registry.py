"""A producer's consumers as a registry (``Producer``'s registry methods):
which names get deliveries, listed, registered and removed by an operator,
every change recorded with who, when and why."""

from __future__ import annotations

import time

from . import envelope
from .checks import check_flag, check_text
from .core.operate import register_in, remove_in
from .errors import InvalidEnvelope
from .operations import ConsumerEntry, RegistryAction
from .store import OutboxStore

__all__ = ["ConsumerRegistry"]



def _name(value: object) -> str:
    check_text("name", value)
    try:
        return envelope.check_name("name", value)
    except InvalidEnvelope as exc:
        raise ValueError(f"name {exc.problem}") from None


class ConsumerRegistry:
    """The consumer registry of a producer's store."""

    @property
    def store(self) -> OutboxStore:
        raise NotImplementedError

    def consumers(self) -> list[ConsumerEntry]:
        """Every registered consumer, by name: its file's ``uid`` (None until
        its first relay binds one), when it was registered, whether it gets
        only events committed from then on, its ``backlog`` (deliveries still
        pending) and how many deliveries are set aside."""
        return self.store.latest.consumers()

    def register_consumer(
        self, name: str, from_now: bool = False, *, actor: str, reason: str
    ) -> RegistryAction:
        """Register a consumer name, so ``relay`` delivers to it; recorded.

        Without ``from_now`` every event already committed becomes pending for
        it (a new consumer catches up from the first event); with
        ``from_now=True`` it gets only events committed from now on.  Its
        first relay binds the name to that consumer's file.  A name already
        registered raises :class:`NotResolvable`.
        """
        name = _name(name)
        record = RegistryAction(time.time(), name, "register", check_text("actor", actor), check_text("reason", reason))
        with self.store.write() as unit:
            register_in(unit, name, check_flag("from_now", from_now), record, self.store.location)
        return record

    def remove_consumer(self, name: str, *, actor: str, reason: str) -> RegistryAction:
        """Remove a consumer name and every delivery to it; recorded.

        New events are no longer kept for it and ``relay`` to it raises
        :class:`UnknownConsumer` (unless registered again).  Its consumer
        file is not touched.  A name that is not registered raises
        :class:`UnknownConsumer`.  Objects of other processes remember a
        binding until reopened: stop the relays to the name first.
        """
        name = _name(name)
        record = RegistryAction(time.time(), name, "remove", check_text("actor", actor), check_text("reason", reason))
        with self.store.write() as unit:
            remove_in(unit, name, record, self.store.location)
        self.store.forget_binding(name)
        return record

    def registry_actions(self, name: str | None = None) -> list[RegistryAction]:
        """Every recorded registration and removal (of one name if given), oldest first."""
        return self.store.latest.registry_actions(name)
