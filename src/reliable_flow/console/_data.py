"""What the console shows, as JSON-able dicts, read from the stores read only.

Every answer comes from the operator tools ``inspect`` uses
(:mod:`reliable_flow._tools.inspection`, :mod:`reliable_flow._tools.drilldown`,
:mod:`reliable_flow._tools.metrics_report`), so the console and ``inspect``
give the same items in the same order; this module only gathers them per
consumer and adds what a page shows besides (payloads, through ``redact``;
the projection; the search).  It is the one seam the pages read through:
indexed keyset reads (issue 31, item 5) and a consumer on another host
(item 6) change this module, not the pages.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._envelope import MAX_ID_CHARS
from .._store import InboxReads, OutboxReads
from .._tools.attention import attention_items
from .._tools.drilldown import effect_dict, effect_report_of, flow_report_of, when
from .._tools.metrics_report import metrics_files
from .._tools.stores import Location, open_consumer, open_producer, shown
from ..metrics import prometheus_text
from ..records import ScheduledEffect
from ..statuses import EffectState
from ._reads import Reader

__all__ = ["BadRequest", "Console", "NotFound", "Redact", "Target", "parse_consumer"]

#: ``redact(kind, payload) -> payload``: kind is the event's kind or the effect's name.
Redact = Callable[[str, Any], Any]

#: Where the overview's counts stop (a count at the cap means at least that
#: many): counting further would walk the rows; at scale the figures worth
#: knowing (what waits) are small, the large ones (what is done) are not.
COUNT_CAP = 10_000

#: At most this many flows found by a search.
FOUND_LIMIT = 100

#: The keys a search finds a flow by, in the order they are tried.
MATCHES = ("flow_id", "event_id", "effect_key", "correlation_id")


class BadRequest(ValueError):
    """A query parameter or an id the console cannot take: a 400, with this sentence."""


class NotFound(LookupError):
    """Nothing under this id in any store: a 404, with this sentence."""


@dataclass(frozen=True)
class Target:
    """One consumer store: the ``name`` its store records (the producer keeps
    its deliveries under it), where it is, and how a page names that place
    (a PostgreSQL location without its password)."""

    name: str
    location: Location
    shown: str


def parse_consumer(item: Location) -> tuple[str | None, Location]:
    """``NAME=LOCATION`` or a location alone.  A string whose text before the
    first ``=`` holds no ``/``, ``:``, ``#`` or ``?`` names the consumer
    (a location's own ``=``, as in ``?sslmode=``, comes after one of them)."""
    if isinstance(item, str):
        name, sep, rest = item.partition("=")
        if sep and name and rest and not any(c in name for c in "/:#?\\"):
            return name, rest
    return None, item


def _target(item: Location) -> Target:
    wanted, location = parse_consumer(item)
    store = open_consumer(location)
    try:
        with store.read() as reads:
            name = reads.meta().get("name") or "default"
        where = shown(location, store)
    finally:
        store.close()
    if wanted is not None and wanted != name:
        raise ValueError(f"consumers: {wanted}={where} names consumer {wanted!r}, "
                         f"but that store is consumer {name!r}")
    return Target(name, location, where)


def _redacted(redact: Redact | None, kind: str, payload: Any) -> Any:
    """The payload as the console may show it: through ``redact`` (a copy, so a
    redact that edits in place changes nothing stored); a redact that fails
    shows nothing of the payload, never the payload itself."""
    if redact is None:
        return payload
    try:
        return redact(kind, copy.deepcopy(payload))
    except Exception as exc:  # noqa: BLE001 - the operator's function; hide the payload, say why
        return {"redact_failed": type(exc).__name__}


class Console:
    """A producer and its consumers, read on every call (nothing cached but
    the applied-per-minute samples this object takes itself)."""

    def __init__(self, producer: Location, consumers: Sequence[Location], *, redact: Redact | None,
                 stuck_after: float) -> None:
        if isinstance(consumers, (str, bytes, os.PathLike)):
            raise TypeError("consumers must be a list of consumer locations, got one location")
        if not consumers:
            raise ValueError("consumers: give at least one consumer location")
        if redact is not None and not callable(redact):
            raise TypeError(f"redact must be a function redact(kind, payload) -> payload, got {redact!r}")
        store = open_producer(producer)  # refuse a missing or wrong store now, not on the first page
        try:
            self.producer_shown = shown(producer, store)
        finally:
            store.close()
        self.producer = producer
        self.targets = [_target(item) for item in consumers]
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError(f"consumers: a consumer is given twice: {names}")
        self._readers = {t.name: Reader(producer, t.location) for t in self.targets}
        self.redact = redact
        self.stuck_after = stuck_after
        self._samples: deque[tuple[float, dict[str, int]]] = deque(maxlen=720)
        #: At most this many attention items on the overview and ``/healthz``.
        self.attention_limit = 100
        self._lock = threading.Lock()

    # -- the overview ---------------------------------------------------------------------------

    def overview(self, now: float | None = None) -> dict[str, Any]:
        """Per consumer the figures the overview shows, each read from an
        index (a count stops at ``COUNT_CAP``: that figure means at least);
        ``attention``: every consumer's ``inspect`` items in its order
        (consumers in the order given), an item two share (a set-aside
        event, from the producer) once, at most ``attention_limit`` of them
        (``attention_more``: the list was cut; ``inspect`` lists them all)."""
        now = time.time() if now is None else now
        consumers, attention, more, sizes = [], [], False, (0, 0)
        for i, t in enumerate(self.targets):
            def read(p: OutboxReads, c: InboxReads, name: str = t.name, first: bool = i == 0) -> Any:
                return (*attention_items(p, c, now, self.stuck_after, self.attention_limit),
                        p.pending_summary(name, now, COUNT_CAP), c.waiting_summary(COUNT_CAP),
                        c.effect_counts(cap=COUNT_CAP), c.applies_recorded(), p.sizes(COUNT_CAP) if first else None,
                        c.schedules(), c.effect_timers(now))

            items, cut, delivery, waiting, effects, applied, produced, schedules, timers = \
                self._readers[t.name].run(read)
            sizes = produced or sizes
            unapplied = waiting.pending + waiting.blocked
            consumers.append({
                "name": t.name, "location": t.shown,
                "backlog": delivery.pending + unapplied, "undelivered": delivery.pending, "unapplied": unapplied,
                "blocked": waiting.blocked, "in_flight": delivery.leased + effects.get("running", 0),
                "oldest_unaccepted_age": _age(now, delivery.oldest_committed_at),
                "oldest_unapplied_age": _age(now, waiting.oldest_received_at),
                "applied": applied, "effects": effects,
                "schedules": [{k: v for k, v in s.as_dict().items() if k != "payload"} for s in schedules],
                "timers": [{"name": n, "waiting": k, "next_due": due} for n, (k, due) in sorted(timers.items())],
            })
            more = more or cut
            attention += [item for item in items if item not in attention]
        self._sample(now, {c["name"]: c["applied"] for c in consumers})
        return {"checked_at": now, "stuck_after": self.stuck_after, "producer": self.producer_shown,
                "produced": {"events": sizes[0], "flows": sizes[1]}, "count_cap": COUNT_CAP,
                "consumers": consumers, "attention": attention[:self.attention_limit],
                "attention_more": more or len(attention) > self.attention_limit,
                "applied_per_minute": self.applied_per_minute()}

    def _sample(self, now: float, applied: dict[str, int]) -> None:
        with self._lock:
            if not self._samples or now - self._samples[-1][0] >= 1.0:
                self._samples.append((now, applied))

    def applied_per_minute(self) -> dict[str, list[list[float]]]:
        """Per consumer ``[time, events applied per minute]`` between the
        samples this console took (one per overview, at most one a second;
        the last 720): not stored anywhere, so it starts again with the
        console.  Counted from the applies recorded (a prune lowers nothing)."""
        with self._lock:
            samples = list(self._samples)
        out: dict[str, list[list[float]]] = {t.name: [] for t in self.targets}
        for (t0, a0), (t1, a1) in itertools.pairwise(samples):
            for name, points in out.items():
                if name in a0 and name in a1 and t1 > t0:
                    points.append([t1, max(0, a1[name] - a0[name]) * 60.0 / (t1 - t0)])
        return out

    def healthz(self) -> dict[str, Any]:
        """``{"attention": [...]}``: the overview's list, in ``inspect --json``'s
        item shape (and ``"more": true`` when it was cut)."""
        overview = self.overview()
        return {"attention": overview["attention"], **({"more": True} if overview["attention_more"] else {})}

    def metrics_text(self) -> str:
        """``prometheus_text`` of the producer (once) and every consumer."""
        now = time.time()
        snapshots: list[Any] = []
        for i, t in enumerate(self.targets):
            p, c = metrics_files(self.producer, t.location, now)
            snapshots += ([p] if i == 0 else []) + [c]
        return prometheus_text(snapshots)

    # -- flows ------------------------------------------------------------------------------------

    def find_flows(self, q: str) -> dict[str, Any]:
        """The flows ``q`` names, as a flow id, an event id, an effect key or a
        correlation id (``meta["correlation_id"]`` of an event a consumer
        received), each once, with what matched; at most ``FOUND_LIMIT`` (by
        flow id; ``more``: there are more)."""
        q = _checked("q", q)
        found: dict[str, set[str]] = {}
        more = False

        def read(p: OutboxReads, c: InboxReads) -> bool:
            if p.flow_state(q) is not None or c.projection(q) is not None or c.inbox_rows(q):
                found.setdefault(q, set()).add("flow_id")
            event = p.find_event(q)
            if event is not None:
                found.setdefault(str(json.loads(event.body)["flow_id"]), set()).add("event_id")
            row = c.inbox_row(q)
            if row is not None:
                found.setdefault(row.row().flow_id, set()).add("event_id")
            effect = c.effect(q)
            if effect is not None:
                found.setdefault(effect.flow_id, set()).add("effect_key")
            correlated = c.flows_by_correlation(q, FOUND_LIMIT + 1)  # an index of the events' meta
            for flow in correlated[:FOUND_LIMIT]:
                found.setdefault(flow, set()).add("correlation_id")
            return len(correlated) > FOUND_LIMIT

        for t in self.targets:
            more = self._readers[t.name].run(read) or more
        flows = sorted(found)
        return {"q": q, "flows": [{"flow_id": f, "matched": [m for m in MATCHES if m in found[f]]}
                                  for f in flows[:FOUND_LIMIT]], "more": more or len(flows) > FOUND_LIMIT}

    def flow(self, flow_id: str, now: float | None = None) -> dict[str, Any]:
        """One flow: per consumer ``inspect --flow``'s report (its ``attention``
        the consumers' items, once), the events' payloads (redacted), the
        projection, the effects' payloads, and one sentence of why it waits."""
        flow_id = _checked("flow_id", flow_id)
        now = time.time() if now is None else now
        reports, consumers, attention = [], [], []
        events: list[dict[str, Any]] = []
        for t in self.targets:
            def read(p: OutboxReads, c: InboxReads, first: bool = not events) -> Any:
                report = flow_report_of(p, c, flow_id, stuck_after=self.stuck_after, now=now)
                bodies = [p.find_event(e["event_id"]) for e in report["producer"]["events"]] if first else []
                return report, c.projection(flow_id), {e.key: e for e in c.effect_list(flow_id=flow_id)}, bodies

            report, projection, stored, bodies = self._readers[t.name].run(read)
            if not events:
                events = [self._event(body, e) for body, e in zip(bodies, report["producer"]["events"])]
            effects = [self._effect(e, stored.get(e["key"])) for e in report["consumer"]["effects"]]
            projection = self._merged(projection, events)
            deliveries = {e["seq"]: e["deliveries"].get(t.name) for e in report["producer"]["events"]}
            consumers.append({"name": t.name, "flow": report["consumer"]["flow"], "projection": projection,
                              "effects": effects, "why": why_sentence(report["consumer"]["flow"], deliveries)})
            attention += [item for item in report["attention"] if item not in attention]
            reports.append(report)
        known = reports[0]["producer"]["flow"] is not None or events or any(
            c["projection"] is not None or c["flow"]["rows"] or c["effects"] for c in consumers)
        if not known:
            raise NotFound(f"no flow {flow_id!r} in the producer or any consumer")
        return {"checked_at": now, "stuck_after": self.stuck_after, "flow_id": flow_id,
                "producer": {"flow": self._merged(reports[0]["producer"]["flow"], events), "events": events},
                "consumers": consumers, "attention": attention}

    def _merged(self, data: dict[str, Any] | None, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        """A flow's data or projection, which merge its payloads: its fields
        through the redaction of every kind of the flow's events, in turn
        (the library's own ``state`` / ``seq`` / ``last_seq`` kept as they are)."""
        if data is None or self.redact is None:
            return data
        own = {k: data[k] for k in ("state", "seq", "last_seq") if k in data}
        fields: Any = {k: v for k, v in data.items() if k not in own}
        for kind in dict.fromkeys(str(e["kind"]) for e in events if "kind" in e):
            fields = _redacted(self.redact, kind, fields)
        return {**(fields if isinstance(fields, dict) else {"redacted": fields}), **own}

    def _event(self, stored: Any, entry: dict[str, Any]) -> dict[str, Any]:
        body = None if stored is None else json.loads(stored.body)
        out = dict(entry)
        if body is not None:
            out.update(kind=body["kind"], schema=body["schema"], meta=body.get("meta", {}),
                       payload=_redacted(self.redact, body["kind"], body["payload"]))
        return out

    def _effect(self, shown_dict: dict[str, Any], stored: Any) -> dict[str, Any]:
        out = dict(shown_dict)
        if stored is not None:
            out["payload"] = _redacted(self.redact, stored.name, stored.payload)
            out["result"] = None if stored.result is None else _redacted(self.redact, stored.name, stored.result)
        return out

    # -- effects ----------------------------------------------------------------------------------

    def consumer_named(self, name: str | None) -> Target:
        """The consumer ``name`` (the first one given for None)."""
        if name is None:
            return self.targets[0]
        for t in self.targets:
            if t.name == name:
                return t
        raise BadRequest(f"consumer must be one of {[t.name for t in self.targets]}, got {name!r}")

    def effects(self, *, consumer: str | None = None, state: str | None = None, name: str | None = None,
                after: str | None = None, limit: int = 50) -> dict[str, Any]:
        """A page of one consumer's effects in scheduling order, filtered by
        state and name: those after the key ``after`` (keyset, from an index:
        a page stays put while effects are added), at most ``limit``;
        ``next`` is the ``after`` of the page that follows (None on the last)."""
        target = self.consumer_named(consumer)
        wanted = None
        if state is not None:
            states = [s.value for s in EffectState]
            if state not in states:
                raise BadRequest(f"state must be one of {states}, got {state!r}")
            wanted = EffectState(state)
        if name is not None:
            name = _checked("name", name)
        if after is not None:
            after = _checked("after", after)
        if not 1 <= limit <= 500:
            raise BadRequest(f"limit must be between 1 and 500, got {limit}")

        def read(_: OutboxReads, c: InboxReads) -> list[ScheduledEffect] | None:
            if after is not None and c.effect(after) is None:
                return None
            return c.effect_list(state=wanted, name=name, after=after, limit=limit + 1)  # a keyset read

        page = self._readers[target.name].run(read)
        if page is None:
            raise BadRequest(f"after must be the key of an effect (the last of the page before), got {after!r}")
        more, page = len(page) > limit, page[:limit]
        return {"consumer": target.name, "state": state, "name": name, "after": after, "limit": limit,
                "effects": [self._effect(effect_dict(e), e) for e in page],
                "next": page[-1].key if more and page else None}

    def effect(self, key: str, now: float | None = None) -> dict[str, Any]:
        """``inspect --effect``'s report from the consumer that holds ``key``
        (or whose history names it), with its payload and result, redacted."""
        key = _checked("key", key, limit=1024)
        def read(_: OutboxReads, c: InboxReads) -> tuple[dict[str, Any], ScheduledEffect | None]:
            return effect_report_of(c, key, stuck_after=self.stuck_after, now=now), c.effect(key)

        for t in self.targets:
            report, stored = self._readers[t.name].run(read)
            cons = report["consumer"]
            if cons["effect"] is None and not cons["history"] and not cons["actions"]:
                continue
            if cons["effect"] is not None:
                cons["effect"] = self._effect(cons["effect"], stored)
            return report
        raise NotFound(f"no effect {key!r} in any consumer (nor a history of one)")

    # -- the operator action log ------------------------------------------------------------------

    def actions(self) -> dict[str, Any]:
        """Every recorded operator action, as the stores keep them:
        ``producer`` (deliveries, registry, prunes), per consumer (inbox,
        effects, prunes); ``log``: all of them, newest first, each with its store."""
        producer = self._readers[self.targets[0].name].run(lambda p, _: {
            "operator_actions": [a.as_dict() for a in p.operator_actions()],
            "registry_actions": [a.as_dict() for a in p.registry_actions()],
            "retention_actions": [a.as_dict() for a in p.retention_actions()]})
        consumers = {t.name: self._readers[t.name].run(lambda _, c: {
            "actions": [a.as_dict() for a in c.inbox_actions()],
            "effect_actions": [a.as_dict() for a in c.effect_actions()],
            "retention_actions": [a.as_dict() for a in c.retention_actions()],
            "schedule_actions": [a.as_dict() for a in c.schedule_actions()]}) for t in self.targets}
        targets = {"operator_actions": "delivery", "registry_actions": "registry", "actions": "inbox",
                   "effect_actions": "effect", "retention_actions": "retention", "schedule_actions": "schedule"}
        log = [{**a, "store": "producer", "target": targets[k]} for k in producer for a in producer[k]]
        log += [{**a, "store": f"consumer {n}", "target": targets[k]} for n, d in consumers.items() for k in d
                for a in d[k]]
        log.sort(key=lambda a: -float(a.get("at") or 0))
        return {"producer": producer, "consumers": consumers, "log": log}


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _checked(field: str, value: str, limit: int = MAX_ID_CHARS) -> str:
    """An id as the stores keep them (1 to 128 characters, no control
    characters; an effect key, which holds a consumer name, an event id and
    an effect name, up to ``limit``), or a 400 naming the field."""
    if not 1 <= len(value) <= limit:
        raise BadRequest(f"{field} must be 1 to {limit} characters, got {len(value)}")
    if _CONTROL.search(value) is not None:
        raise BadRequest(f"{field} must not contain control characters")
    return value


def _age(now: float, since: float | None) -> float | None:
    return None if since is None else max(0.0, now - since)


def why_sentence(flow: dict[str, Any], deliveries: dict[int, dict[str, Any] | None]) -> str:
    """One sentence of why the flow waits at this consumer: what the consumer
    holds first (blocked, a gap, ready, an effect), else what the producer's
    delivery of the next event waits for (a lease, a backoff)."""
    wait, next_seq = flow["wait"], flow["next_seq"]
    since = f" since {when(flow['since'])}" if flow["since"] else ""
    if wait == "blocked":
        return f"blocked: {flow['reason']}" + (f": {flow['detail']}" if flow["detail"] else "") + since
    if wait == "gap":
        return f"waiting for seq {next_seq}{since}"
    if wait == "ready":
        return f"seq {next_seq} is here and waits for an apply{since} (is a worker running?)"
    if wait == "effect":
        return f"waiting for an effect: {flow['detail']}{since}"
    d = deliveries.get(next_seq)
    if d is None:
        return f"nothing waits: applied up to seq {flow['last_seq']}"
    if d["state"] == "set_aside":
        return f"seq {next_seq} was set aside: the consumer answered {d['last_status']}"
    if d["state"] == "pending" and d["lease_owner"] and not d["lease_expired"]:
        return f"lease held by {d['lease_owner']} until {when(d['due_at'])}"
    if d["state"] == "pending" and d["due_at"] and d["attempts"]:
        return f"backoff until {when(d['due_at'])}" + (f" after: {d['last_error']}" if d["last_error"] else "")
    if d["state"] == "pending":
        return f"seq {next_seq} is not delivered yet (is a relay running?)"
    return f"seq {next_seq} is {d['state']} at the producer"
