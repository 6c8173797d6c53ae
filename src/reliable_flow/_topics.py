"""Topics: the routing boundaries a producer declares (issue 32, source
document 001 section 2).

A topic is a name, the event kinds it carries, its role (``fact``: tells
anyone who cares; ``command``: asks exactly one consumer group to try an
action) and, optionally, its own retention and delivery policy.  A consumer
name subscribes to topics (``producer.admin.register_consumer(name,
topics=[...])`` / ``producer.admin.subscribe``) and then gets only the events
of its topics.  See docs/topics.md.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from . import _envelope as envelope
from ._checks import check_seconds
from .delivery import DeliveryPolicy
from .errors import InvalidEnvelope

__all__ = ["ROLES", "Topic", "check_topic_names", "declared"]

#: The roles a topic may have.
ROLES = ("command", "fact")


def _name(field: str, value: object) -> str:
    try:
        return envelope.check_name(field, value)
    except InvalidEnvelope as exc:
        raise ValueError(f"{field} {exc.problem}") from None


@dataclass(frozen=True)
class Topic:
    """One topic of a producer.

    ``name``: 1-128 characters, no control characters (advice: a dotted
    lower-case name of its purpose, ``agent.notifications``).  ``kinds``: the
    event kinds it carries, a non-empty collection of kind names (a kind may
    be in several topics).  ``role``: ``"fact"`` (default; any number of
    subscribers) or ``"command"`` (exactly one subscribing consumer name).
    ``retention``: seconds an event of this topic is kept at least once
    every subscriber accepted it (None: the producer's ``prune`` decides
    alone).  ``delivery``: the :class:`~reliable_flow.DeliveryPolicy` a relay
    uses for this topic's events (None: the relay's own).  Bad values raise
    ``ValueError`` / ``TypeError`` naming the field.
    """

    name: str
    kinds: Collection[str]
    role: str = "fact"
    retention: float | None = None
    delivery: DeliveryPolicy | None = None

    def __post_init__(self) -> None:
        _name("Topic name", self.name)
        if isinstance(self.kinds, (str, bytes)) or not isinstance(self.kinds, Collection):
            raise TypeError(f"Topic {self.name!r}: kinds must be a collection of kind names, got {self.kinds!r}")
        kinds = frozenset(_name(f"Topic {self.name!r}: kind", k) for k in self.kinds)
        if not kinds:
            raise ValueError(f"Topic {self.name!r}: kinds must name at least one kind")
        if self.role not in ROLES:
            raise ValueError(f"Topic {self.name!r}: role must be 'command' or 'fact', got {self.role!r}")
        if self.retention is not None:
            object.__setattr__(self, "retention", check_seconds(f"Topic {self.name!r}: retention", self.retention,
                                                                allow_zero=True))
        if self.delivery is not None and not isinstance(self.delivery, DeliveryPolicy):
            raise TypeError(f"Topic {self.name!r}: delivery must be a DeliveryPolicy or None, got {self.delivery!r}")
        object.__setattr__(self, "kinds", kinds)

    def described(self) -> dict[str, Any]:
        """What a store records of this topic (its declaration, JSON-able):
        the policy's numbers, not its clock or randomness."""
        policy = self.delivery
        return {
            "name": self.name, "kinds": sorted(self.kinds), "role": self.role, "retention": self.retention,
            "delivery": None if policy is None else {
                "lease_seconds": policy.lease_seconds, "wait_for_due": policy.wait_for_due,
                "backoff_base": policy.backoff_base, "backoff_cap": policy.backoff_cap,
            },
        }

    @classmethod
    def from_described(cls, held: dict[str, Any]) -> Topic:
        """The topic a store recorded (:meth:`described`)."""
        policy = held.get("delivery")
        return cls(str(held["name"]), list(held["kinds"]), str(held["role"]), held.get("retention"),
                   None if policy is None else DeliveryPolicy(**policy))


def declared(topics: object, kinds: Collection[str]) -> tuple[Topic, ...]:
    """``topics`` checked against the protocol's ``kinds``, sorted by name: a non-empty
    list of :class:`Topic` with distinct names, each kind a kind of the
    protocol, and every kind of the protocol in at least one topic (an event
    of a kind in no topic would reach nobody).  ``ValueError`` / ``TypeError``
    naming the topic and the kind otherwise."""
    if isinstance(topics, (str, bytes, Topic)) or not isinstance(topics, Collection):
        raise TypeError(f"topics must be a list of Topic, got {topics!r}")
    found = tuple(topics)
    if not found:
        raise ValueError("topics must declare at least one Topic (leave topics out for one topic of every kind)")
    for topic in found:
        if not isinstance(topic, Topic):
            raise TypeError(f"topics must hold Topic objects, got {topic!r}")
    names = [t.name for t in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"topics: topic {twice[0]!r} is declared twice")
    for topic in found:
        unknown = sorted(topic.kinds - set(kinds))
        if unknown:
            raise ValueError(f"Topic {topic.name!r}: kind {unknown[0]!r} is not a kind of the protocol "
                             f"(kinds: {', '.join(sorted(kinds))})")
    carried = {k for t in found for k in t.kinds}
    missing = sorted(set(kinds) - carried)
    if missing:
        raise ValueError(f"kind {missing[0]!r} is in no topic: every kind of the protocol must be in at least "
                         f"one topic (declared: {', '.join(names)})")
    return tuple(sorted(found, key=lambda t: t.name))


def declaration(topics: tuple[Topic, ...]) -> str:
    """The canonical text a store records of a declaration."""
    return json.dumps([t.described() for t in sorted(topics, key=lambda t: t.name)], sort_keys=True,
                      separators=(",", ":"))


def from_declaration(text: str) -> tuple[Topic, ...]:
    """The topics of a recorded declaration (:func:`declaration`)."""
    return tuple(Topic.from_described(d) for d in json.loads(text))


def check_topic_names(field: str, value: object) -> tuple[str, ...]:
    """A subscription's topic names: a non-empty list of distinct names, sorted."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise TypeError(f"{field} must be a list of topic names, got {value!r}")
    names = sorted({_name(f"{field}: topic", v) for v in value})
    if not names:
        raise ValueError(f"{field} must name at least one topic")
    return tuple(names)
