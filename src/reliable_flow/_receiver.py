"""What a relay needs from a consumer: the :class:`Receiver` interface.

:class:`~reliable_flow.Consumer` satisfies it in process; a client that
reaches a consumer over a network can satisfy it too, and ``relay`` and
``relay_batch`` will deliver to it unchanged.  (``Worker`` also applies
events, so it takes real ``Consumer`` objects.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .records import ReceiveResult

__all__ = ["Answer", "Receiver", "is_receiver"]

#: A receiver's answer to one event: a :class:`ReceiveResult` (status
#: ``refused`` when its inbox is full).  Kept as a name for one release;
#: use :class:`ReceiveResult`.
Answer = ReceiveResult


@runtime_checkable
class Receiver(Protocol):
    """A consumer as a relay sees it.

    ``name`` is the name producers keep delivery state under; ``uid``
    identifies the storage behind it (two stores may not share a name);
    ``location`` says where it is, for messages.

    ``accept(body)`` must store the event durably before it answers
    ``accepted`` (or report ``duplicate`` / ``id_conflict`` /
    ``sequence_conflict`` having stored nothing), answer ``refused`` when
    it has no room (nothing stored; the relay retries after a backoff), and
    raise for anything else (nothing stored, the relay records the failure
    and retries after a backoff).  ``applied=True`` says the event was also
    applied in the commit that stored it.
    ``accept_many`` answers a list of bodies in one durable step, one
    answer per body, in order.
    """

    @property
    def name(self) -> str:
        """The name producers keep this consumer's delivery state under."""

    @property
    def uid(self) -> str:
        """The identity of the storage behind the name."""

    @property
    def location(self) -> str:
        """Where the consumer is (a path, an address), for messages."""

    def accept(self, body: str) -> ReceiveResult:
        """Store one canonical event body durably, or say why not (see the class)."""

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        """Store several bodies in one durable step; one answer per body, in order."""


_MEMBERS = ("name", "uid", "location", "accept", "accept_many")
_RECEIVER_TYPES: set[type] = set()  # classes that define every member themselves


def is_receiver(obj: object) -> bool:
    """``isinstance(obj, Receiver)`` without reading its properties: on
    Python < 3.12 the structural check evaluates each one, and a network
    receiver's ``uid`` may ask its server (and raise while it is away).
    A class that defines every member is remembered, so a relay pays for
    the look-up once per class, not once per call."""
    cls = type(obj)
    if cls in _RECEIVER_TYPES:
        return True
    own = getattr(obj, "__dict__", {})
    on_class = True
    for member in _MEMBERS:
        if any(member in vars(k) for k in cls.__mro__):
            continue
        if member not in own:
            return False
        on_class = False
    if not (callable(getattr(cls, "accept", None)) or callable(own.get("accept"))):
        return False
    if on_class:
        _RECEIVER_TYPES.add(cls)
    return True
