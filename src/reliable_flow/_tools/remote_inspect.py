"""``reliable-flow inspect PRODUCER [redis://host:port/db[#CONSUMER]]``: what a
producer's flows wait for from consumers on other hosts (issue 30, item 5).

A producer's store cannot tell why a result does not come home from an
effect executor beside a consumer on another host.  That side's bridge
publishes a summary of the effects that still owe a producer a step
(:mod:`reliable_flow.transport.redis._owed`); this report reads it for the
consumers in the producer's registry (or the one named), and lists the
flows waiting for a result for ``stuck_after`` seconds or more, with the
effect's key.  Without a location, the place the producer was served
(``serve_as``, recorded in its store) is used.

The summary is a view as of its ``at`` (stale when its bridge stopped),
never an authority; the producer's store is only read.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import asdict
from typing import Any

from .._core.identity import SERVED_AS, STORE_UID, served_where
from .._core.owed import STALE_AFTER, pair_refusal, waiting_for, waiting_items
from ..errors import ConsumerMismatch
from .drilldown import DEFAULT_STUCK_AFTER, when
from .stores import REMOTE_SCHEMES, Location, is_remote, open_producer, shown

__all__ = ["REMOTE_SCHEMES", "check_registered", "format_remote_report", "is_remote", "remote_report"]


def check_registered(producer_path: Location, location: str) -> None:
    """Refuse (``ConsumerMismatch``) a consumer on Redis (``URL#NAME``) whose
    name the producer's registry does not hold, before asking its bridge."""
    url, _, name = location.rpartition("#")
    store = open_producer(producer_path)
    try:
        with store.read() as p:
            names = sorted(e.name for e in p.consumers())
        where = shown(producer_path, store)
    finally:
        store.close()
    if name and name not in names:
        owed = importlib.import_module("reliable_flow.transport.redis._connect")
        raise ConsumerMismatch(
            f"producer {where} and consumer {name!r} at {owed.shown(url)} share no registration: the "
            f"producer's consumer registry holds {names}, not {name!r}")


def _where(location: str | None, served: dict[str, str] | None, producer: str) -> tuple[str, str | None, str]:
    """The Redis URL, the consumer named (None: every registered one) and the key prefix."""
    prefix = served["prefix"] if served is not None else "rf"
    if location is None:
        if served is None:
            raise ValueError(
                f"no consumer given, and producer {producer} was never served to other hosts (no {SERVED_AS} "
                f"recorded): give the consumer's store, or its location on Redis (redis://host:6379/0#NAME)")
        if ":***@" in served["url"]:
            raise ValueError(
                f"producer {producer} is served on Redis at {served['url']}, whose password is not recorded: "
                f"give the location with it (inspect PRODUCER 'redis://:PASSWORD@host:6379/0')")
        return served["url"], None, prefix
    url, hashed, name = location.rpartition("#") if "#" in location else (location, "", "")
    connect = importlib.import_module("reliable_flow.transport.redis._connect")
    connect.check_url(url)
    if hashed and not name:
        raise ValueError(f"consumer: a consumer on Redis is redis://host:port/db#NAME, got {connect.shown(location)!r}")
    return url, name or None, prefix


def remote_report(producer_path: Location, location: str | None = None, *,
                  stuck_after: float = DEFAULT_STUCK_AFTER, now: float | None = None) -> dict[str, Any]:
    """The producer's registry and, per consumer on Redis at ``location``
    (``redis://host:port/db#NAME`` for one, without ``#NAME`` for every
    registered one; None: where the producer was served), what it publishes:
    its bridge's announcement and the effects owing this producer a step.
    ``attention``: flows waiting for a result ``stuck_after`` seconds or
    more (kind ``waiting_for_result``, with ``effect_key``), a stale summary
    listing such effects, set-aside deliveries, another store announced
    under a registered name.  Raises ``ConsumerMismatch`` when the named
    consumer shares no registration with the producer (not in its registry,
    or announced with another storage uid than the registry binds)."""
    now = time.time() if now is None else now
    store = open_producer(producer_path)
    try:
        with store.read() as p:
            registry = p.consumers()
            uid = p.meta_value(STORE_UID)
            served = served_where(p.meta_value(SERVED_AS))
        where = shown(producer_path, store)
    finally:
        store.close()
    url, name, prefix = _where(location, served, where)
    owed = importlib.import_module("reliable_flow.transport.redis._owed")
    shown_url = owed.shown(url)
    entries = {e.name: e for e in registry}
    if name is not None and name not in entries:
        raise ConsumerMismatch(
            f"producer {where} and consumer {name!r} at {shown_url} share no registration: the "
            f"producer's consumer registry holds {sorted(entries)}, not {name!r}")
    ours = {v for v in (uid, None if served is None else served["name"]) if v is not None}
    consumers: list[dict[str, Any]] = []
    attention: list[dict[str, Any]] = []
    for consumer in [name] if name is not None else sorted(entries):
        announcement, summary = owed.announced(url, consumer, prefix)
        entry = entries[consumer]
        other = (announcement is not None and entry.uid is not None and announcement.get("uid")
                 and announcement["uid"] != entry.uid)
        if other and name is not None:
            raise ConsumerMismatch(pair_refusal(where, shown_url, registry, name, announcement["uid"]))
        if other:
            attention.append(_item("other_store", consumer, None, None, None,
                                   f"Redis announces {consumer!r} with storage uid {announcement['uid']}; the "
                                   f"producer binds the name to {entry.uid}: another store under that name"))
        item: dict[str, Any] = {"name": consumer, "backlog": entry.backlog, "set_aside": entry.set_aside,
                                "announced": announcement, "summary": None, "unreadable": None}
        if isinstance(summary, str):
            item["unreadable"] = summary
        elif summary is not None:
            mine = [e for e in summary["effects"] if e["producer"] is None or e["producer"] in ours]
            stale = now - summary["at"] >= STALE_AFTER
            item["summary"] = {"at": summary["at"], "count": summary["count"], "truncated": summary["truncated"],
                               "stale": stale, "effects": mine,
                               "other_producers": len(summary["effects"]) - len(mine)}
            waiting = waiting_items(summary, ours, now, stuck_after)
            attention += waiting
            if stale and mine:
                attention.append(_item("summary_stale", consumer, None, None, summary["at"],
                                       "its bridge has not published since then: is it running? (what it "
                                       "owes may have changed)"))
        if entry.set_aside:
            attention.append(_item("set_aside", consumer, None, None, None,
                                   f"{entry.set_aside} deliveries set aside (a conflict): see docs/operations.md"))
        consumers.append(item)
    return {"checked_at": now, "stuck_after": stuck_after,
            "producer": {"location": where, "uid": uid, "served_as": served,
                         "registry": [asdict(e) for e in registry]},
            "redis": shown_url, "prefix": prefix, "consumers": consumers, "attention": attention}


def _item(kind: str, consumer: str, flow_id: str | None, effect_key: str | None, since: float | None,
          detail: str) -> dict[str, Any]:
    return {"kind": kind, "consumer": consumer, "flow_id": flow_id, "effect_key": effect_key, "since": since,
            "detail": detail}


def format_remote_report(report: dict[str, Any]) -> str:
    """The report of :func:`remote_report` as plain text for a terminal."""
    p = report["producer"]
    served = p["served_as"]
    lines = [f"producer {p['location']} (uid {p['uid']})"
             + (f": served as {served['name']!r} on {served['url']}" if served else "")]
    for c in report["consumers"]:
        head = f"consumer {c['name']!r} on {report['redis']}: backlog {c['backlog']}, set aside {c['set_aside']}"
        a = c["announced"]
        lines.append(head + ("; no bridge announces it" if a is None else
                             f"; announced by bridge {a.get('bridge', '?')} (uid {a.get('uid', '?')})"))
        s = c["summary"]
        if c["unreadable"]:
            lines.append(f"  its summary of owed steps cannot be read: {c['unreadable']}")
        elif s is None:
            lines.append("  publishes no summary of owed steps (no bridge of this version serves it, or Redis "
                         "restarted empty)")
        else:
            more = " or more" if s["truncated"] else ""
            lines.append(f"  as of {when(s['at'])}{' (stale)' if s['stale'] else ''}: {s['count']}{more} effects "
                         f"owe a step, {len(s['effects'])} of them listed for this producer"
                         + (f" ({s['other_producers']} for other producers)" if s["other_producers"] else ""))
            for e in s["effects"]:
                target = "" if e["producer"] is not None else " (producer not known to the bridge)"
                lines.append(f"    flow {e['flow_id']!r} effect {e['key']} ({e['name']}): {e['state']} since "
                             f"{when(e['since'])}, waits for {waiting_for(e['state'], e['fed'], e['refused'])}"
                             + target)
    items = report["attention"]
    if not items:
        return "\n".join(lines + [f"nothing needs attention (stuck after {report['stuck_after']:g} s)"])
    lines.append(f"needs attention ({len(items)}):")
    for a in items:
        what = "".join(f" {k.replace('_', ' ')} {a[k]!r}" for k in ("flow_id", "effect_key") if a.get(k))
        state = f" ({a['state']})" if a.get("state") else ""
        since = f"  since {when(a['since'])}" if a.get("since") else ""
        lines.append(f"  {a['kind']}:{what}{state}  consumer={a['consumer']}{since}")
        lines.append(f"    {a['detail']}")
    return "\n".join(lines)
