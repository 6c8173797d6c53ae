"""Topics and subscriptions (issue 32): which consumers get an event, the
seq of the flow's previous event for each of them, and whether a
declaration or a subscription is allowed.

A consumer whose subscription is NULL (registered without topics, or before
topics existed) gets every event, as before topics: its deliveries are
written by the engine's append, with no ``prev_seq`` (it is ``seq - 1``).
A consumer subscribed to topics gets the events of a kind one of its topics
carries: :func:`route_in` writes its delivery in the advance's own
transaction, with the seq of the last event of the flow routed to it before
(``flow_head``), so its ``prev_seq`` is fixed when the event commits and
never depends on what is pruned later.  A subscription change holds for
the events committed after it (the registry lock orders it against
appends), so no event is half-seen; the position it holds after is
recorded (``topics_from``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from .._envelope import Envelope
from .._store import OutboxUnit
from .._topics import Topic, declaration, from_declaration
from ..delivery import DeliveryPolicy
from ..errors import TopicError
from ..records import OperatorAction
from .operate import unknown_consumer

__all__ = ["TOPICS", "Routing", "check_topics", "declare_in", "policy_by_topic", "register_routed_in", "route_in",
           "routes_of", "subscribe_in"]

#: The ``meta`` key holding a producer's declared topics (:func:`declaration`).
TOPICS = "topics"


@dataclass(frozen=True)
class Routing:
    """A producer's declared topics, and the topics each kind is in."""

    topics: tuple[Topic, ...]
    by_kind: dict[str, frozenset[str]] = field(init=False)

    def __post_init__(self) -> None:
        by_kind: dict[str, set[str]] = {}
        for topic in self.topics:
            for kind in topic.kinds:
                by_kind.setdefault(kind, set()).add(topic.name)
        object.__setattr__(self, "by_kind", {k: frozenset(v) for k, v in by_kind.items()})

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.topics)

    def topic(self, name: str) -> Topic:
        return next(t for t in self.topics if t.name == name)

    def of_kind(self, kind: str) -> frozenset[str]:
        """The topics carrying ``kind`` (none for a kind in no topic)."""
        return self.by_kind.get(kind, frozenset())


def _subscribers(subscriptions: Sequence[tuple[str, tuple[str, ...]]], topic: str) -> list[str]:
    return [name for name, topics in subscriptions if topic in topics]


def _check_subscriptions(routing: Routing, subscriptions: Sequence[tuple[str, tuple[str, ...]]],
                         location: str) -> None:
    """Every subscribed topic declared, at most one subscriber per command topic."""
    for name, topics in subscriptions:
        for wanted in topics:
            if wanted not in routing.names:
                raise TopicError(
                    f"topic {wanted!r} is subscribed by consumer {name!r} in {location} but is not declared "
                    f"(declared: {', '.join(sorted(routing.names))}); a topic is not renamed or dropped "
                    f"while consumers subscribe to it: subscribe them to other topics first")
    for topic in routing.topics:
        names = _subscribers(subscriptions, topic.name)
        if topic.role == "command" and len(names) > 1:
            raise TopicError(
                f"command topic {topic.name!r} has one subscribing consumer, and {location} has "
                f"{' and '.join(repr(n) for n in sorted(names))}: a command asks exactly one component")


def declare_in(unit: OutboxUnit, routing: Routing | None, location: str) -> Routing | None:
    """The producer's routing after its open: the declaration given
    (checked against the subscriptions the store holds, then recorded), or,
    with none given (None), the one the store recorded, if any."""
    held = unit.meta_value(TOPICS)
    if routing is None:
        return None if held is None else Routing(from_declaration(held))
    text = declaration(routing.topics)
    if held != text:
        _check_subscriptions(routing, unit.subscriptions(), location)
        unit.set_meta(TOPICS, text)
    return routing


def route_in(unit: OutboxUnit, routing: Routing, env: Envelope) -> None:
    """After ``env`` was appended: a delivery to every subscribed consumer
    one of whose topics carries its kind, each with its ``prev_seq`` (the
    seq of the flow's last event routed to it, 0 for none: always written,
    so its gap names the event it misses), and the flow's heads moved to it."""
    carried = routing.of_kind(env.kind)
    names = [name for name, topics in unit.subscriptions() if carried.intersection(topics)]
    if not names:
        return
    heads = unit.flow_heads(env.flow_id)
    routes = [(name, heads.get(name, 0)) for name in names]
    unit.deliver(env.event_id, routes, env.flow_id, env.seq)


def routes_of(routing: Routing, topics: Sequence[str],
              events: Sequence[tuple[int, str, int, str]]) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """For a consumer registered from the first event with ``topics``: the
    stored ``events`` (pos, flow, seq, canonical body, in commit order) it
    gets, each as (pos, prev_seq), its prev_seq the seq of the flow's
    previous one it gets (0: none); and the heads they leave."""
    heads: dict[str, int] = {}
    out = []
    for pos, flow_id, seq, body in events:
        if routing.of_kind(str(json.loads(body)["kind"])).intersection(topics):
            out.append((pos, heads.get(flow_id, 0)))
            heads[flow_id] = seq
    return out, heads


def policy_by_topic(routing: Routing | None, policy: DeliveryPolicy) -> Callable[[str], DeliveryPolicy]:
    """What a relay uses for an event, from its body: the relay's ``policy``
    with the lease (when the relay claims at all) and the backoff of the
    first topic, by name, that carries the event's kind and declares a
    delivery policy; the relay's own for every other event (and always for
    a producer without topics).  Its due-time rule, owner and clock stay
    the relay's."""
    declaring = [] if routing is None else [t for t in routing.topics if t.delivery is not None]
    if not declaring:
        return lambda body: policy
    chosen: dict[str, DeliveryPolicy] = {}

    def of(body: str) -> DeliveryPolicy:
        kind = str(json.loads(body)["kind"])
        if kind not in chosen:
            topic = next((t for t in declaring if kind in t.kinds), None)
            own = None if topic is None else topic.delivery
            chosen[kind] = policy if own is None else replace(
                policy, backoff_base=own.backoff_base, backoff_cap=own.backoff_cap,
                lease_seconds=policy.lease_seconds if policy.lease_seconds is None or own.lease_seconds is None
                else own.lease_seconds)
        return chosen[kind]

    return of


def check_topics(routing: Routing | None, topics: Sequence[str], location: str) -> None:
    """Every name in ``topics`` a declared topic."""
    if routing is None:
        raise TopicError(f"producer {location} declares no topics; subscribe to topics after declaring them "
                         f"(Producer(..., topics=[Topic(...)]))")
    unknown = [t for t in topics if t not in routing.names]
    if unknown:
        raise TopicError(f"topic {unknown[0]!r} is not declared by producer {location} "
                         f"(declared: {', '.join(sorted(routing.names))})")


def subscribe_in(unit: OutboxUnit, routing: Routing | None, name: str, topics: Sequence[str],
                 record: OperatorAction, location: str) -> int:
    """Subscribe the registered ``name`` to ``topics`` from now on (every
    event committed after the last one committed now); recorded.  The
    position it holds after is returned."""
    check_topics(routing, topics, location)
    assert routing is not None
    if not unit.is_registered(name):
        raise unknown_consumer(location, name, unit.consumers())
    others = [(n, t) for n, t in unit.subscriptions() if n != name]
    _check_subscriptions(routing, [*others, (name, tuple(topics))], location)
    position = unit.subscribe(name, tuple(topics), None)
    unit.record_action(record)
    return position


def register_routed_in(unit: OutboxUnit, routing: Routing | None, name: str, topics: Sequence[str],
                       from_now: bool, location: str) -> None:
    """The subscription of ``name``, registered in this same transaction
    (its deliveries not yet written): from now, or from the first stored
    event, its deliveries written here with their prev_seqs."""
    check_topics(routing, topics, location)
    assert routing is not None
    _check_subscriptions(routing, [*unit.subscriptions(), (name, tuple(topics))], location)
    if from_now:
        unit.subscribe(name, tuple(topics), None)
        return
    unit.subscribe(name, tuple(topics), 0)
    routes, heads = routes_of(routing, topics, unit.event_bodies())
    unit.deliver_all(name, routes, heads)
