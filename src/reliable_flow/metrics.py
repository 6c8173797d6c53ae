"""Metrics: a snapshot of each side (``Producer.metrics()``,
``Consumer.metrics()``, ``reliable-flow metrics``), and its Prometheus text.

The snapshots are frozen dataclasses, like every other read result: their
fields are fixed and typed, and :meth:`as_dict` gives the JSON-able form.

What the files do not store is counted in the process instead and is None
when read from the files alone (the CLI): the duplicates a consumer object
received and the events it applied since it was opened.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ._core.order import ORDER_META, STRICT
from ._observe import Observer
from ._store.inbox import InboxReads
from ._store.outbox import OutboxReads
from .statuses import DeliveryState, EffectState, InboxState

__all__ = [
    "ConsumerMetrics", "DeliveryMetrics", "ExecutorMetrics", "ProducerMetrics", "consumer_metrics", "producer_metrics",
    "prometheus_text",
]


@dataclass(frozen=True)
class DeliveryMetrics:
    """The deliveries of a producer's events to one consumer.

    ``pending`` / ``accepted`` / ``set_aside`` / ``skipped``: events in each
    delivery state.  ``retries``: sends beyond each event's first (failed
    sends, and re-sends after a crash or a redeliver).  ``failing``: pending
    events whose last send failed (backing off).  ``leased``: pending events
    claimed by a relay right now.  ``untried``: pending events never sent.
    ``oldest_pending_age``: seconds since the oldest pending delivery was
    last written (claimed, failed, redelivered) -- an approximation: it
    goes by when the delivery was last written, not by the event's commit
    time (stored since producer schema v4, for retention), so a pending
    event never sent has no age and shows up in ``untried`` instead; None
    when no pending event has one.
    """

    pending: int = 0
    accepted: int = 0
    set_aside: int = 0
    skipped: int = 0
    retries: int = 0
    failing: int = 0
    leased: int = 0
    untried: int = 0
    oldest_pending_age: float | None = None


@dataclass(frozen=True)
class ProducerMetrics:
    """A producer file counted at ``at`` (seconds since the epoch).

    ``events`` and ``flows`` in the file; ``unbound_events``: events
    committed before any consumer was bound (no relay has run yet);
    ``consumers``: :class:`DeliveryMetrics` per consumer name.
    """

    at: float
    events: int
    flows: int
    unbound_events: int
    consumers: dict[str, DeliveryMetrics]

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as plain dicts (JSON-able)."""
        return asdict(self)


@dataclass(frozen=True)
class ConsumerMetrics:
    """A consumer file counted at ``at`` (seconds since the epoch).

    From the file: ``inbox`` rows per state (every state listed), ``blocked``
    rows per reason, ``gaps`` (flows stopped at a missing seq), ``effects``
    per state (every state listed, ``unknown`` included); ``timers``: per
    effect name, the ``pending`` effects waiting for a time (delayed with
    ``schedule(after=, at=)``, backing off, or put off by a rate limit) and
    ``next_due``, the earliest of their due times (seconds since the epoch);
    ``schedules``: per recurring schedule (``EffectRegistry.every``), its
    ``next_at`` and ``last_tick`` (epoch seconds; ``last_tick`` None before
    the first), ``paused`` and ``skipped`` (missed ticks not performed).
    ``order``: the consumer's own order (``strict``, ``latest``, ``any``;
    docs/operations.md); ``inbox["superseded"]`` counts the events a
    ``latest`` consumer set aside because a newer one applied, and
    ``gaps`` is always 0 for a ``latest`` or ``any`` consumer (it never
    waits for a missing seq).

    From this process only, None when read from the file alone (nothing of
    it is stored): ``duplicates`` received and ``applied`` events since the
    :class:`~reliable_flow.Consumer` object was opened, ``seconds_open``, and
    ``applied_per_second`` = applied / seconds_open (the rate since opened;
    for a rate over a window, take ``applied`` twice, or let Prometheus'
    ``rate()`` do it on ``reliable_flow_applied_total``).
    """

    at: float
    consumer: str
    inbox: dict[str, int]
    blocked: dict[str, int]
    gaps: int
    effects: dict[str, int]
    duplicates: int | None = None
    applied: int | None = None
    seconds_open: float | None = None
    applied_per_second: float | None = None
    timers: dict[str, int] = field(default_factory=dict)
    next_due: dict[str, float] = field(default_factory=dict)
    schedules: dict[str, dict[str, Any]] = field(default_factory=dict)
    order: str = "strict"

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as plain dicts (JSON-able)."""
        return asdict(self)


@dataclass(frozen=True)
class ExecutorMetrics:
    """An effect executor's calls at ``at`` (seconds since the epoch), counted
    in this process since the :class:`~reliable_flow.EffectExecutor` was
    made (nothing of it is stored; the effects' states are in
    :class:`ConsumerMetrics`).

    ``in_flight``: calls not returned yet, per effect name (a call past its
    timeout included: it still holds its slot); ``started``: calls of each
    effect's function started; ``rate_limited``: effects put off by their
    ``rate_limit``; ``heartbeats``: ``call.heartbeat()`` calls that renewed
    a lease; ``renewals``: leases renewed (by heartbeats and by the
    executor itself); ``timeouts``: calls recorded in doubt for outliving
    their ``timeout``; ``lease_lost``: outcomes discarded because another
    executor held the effect; ``outcomes``: every outcome counted.
    """

    at: float
    consumer: str
    owner: str
    concurrency: int
    in_flight: dict[str, int]
    started: dict[str, int]
    rate_limited: int
    heartbeats: int
    renewals: int
    timeouts: int
    lease_lost: int
    outcomes: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as plain dicts (JSON-able)."""
        return asdict(self)


def producer_metrics(reads: OutboxReads, now: float) -> ProducerMetrics:
    """Count a producer store (inside ``store.read()`` for one snapshot)."""
    counts = reads.outbox_counts(now)
    per: dict[str, dict[str, Any]] = {name: {} for name in counts.consumers}
    for group in counts.deliveries:
        into = per.setdefault(group.consumer, {})
        into[group.state] = group.count
        into["retries"] = into.get("retries", 0) + group.retries
        if group.state == DeliveryState.PENDING:  # failing, leased, untried: pending events only
            into.update(failing=group.failing, leased=group.leased, untried=group.untried)
            if group.oldest_touch is not None:
                into["oldest_pending_age"] = max(0.0, now - group.oldest_touch)
    return ProducerMetrics(
        now, counts.events, counts.flows, 0 if counts.consumers else counts.events,
        {name: DeliveryMetrics(**values) for name, values in sorted(per.items())},
    )


def consumer_metrics(reads: InboxReads, now: float, observer: Observer | None = None) -> ConsumerMetrics:
    """Count a consumer store (inside ``store.read()`` for one snapshot); with
    the ``observer`` of a live object, its in-process counts too."""
    counts = reads.inbox_counts()
    stored = reads.effect_counts()
    timers = reads.effect_timers(now)
    meta = reads.meta()
    name, order = meta.get("name", ""), meta.get(ORDER_META, STRICT)
    live: dict[str, Any] = {}
    if observer is not None:
        seconds = observer.seconds_open()
        live = {"duplicates": observer.duplicates, "applied": observer.applied, "seconds_open": seconds,
                "applied_per_second": observer.applied / seconds if seconds > 0 else 0.0}
    return ConsumerMetrics(
        now, name,
        {s.value: counts.by_state.get(s.value, 0) for s in InboxState},
        dict(sorted(counts.blocked.items())),
        counts.gaps if order == STRICT else 0,
        {s.value: stored.get(s.value, 0) for s in EffectState},
        **live,
        timers={name: n for name, (n, _due) in timers.items()},
        next_due={name: due for name, (_n, due) in timers.items()},
        schedules={s.schedule: {"next_at": s.next_at, "last_tick": s.last_tick, "paused": s.paused,
                                "skipped": s.skipped} for s in reads.schedules()},
        order=order,
    )


# -- Prometheus text exposition format ----------------------------------------------------

_Sample = tuple[str, str, str, dict[str, str], float]  # name, type, help, labels, value


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 2**53):
        return str(int(value))
    return repr(float(value))


def _producer_samples(m: ProducerMetrics) -> Iterator[_Sample]:
    yield "reliable_flow_outbox_events", "gauge", "Events in the producer's outbox.", {}, m.events
    yield "reliable_flow_producer_flows", "gauge", "Flows in the producer file.", {}, m.flows
    yield ("reliable_flow_unbound_events", "gauge", "Events committed before any consumer was bound.", {},
           m.unbound_events)
    for consumer, d in m.consumers.items():
        for state in DeliveryState:
            yield ("reliable_flow_deliveries", "gauge", "Outbox events per consumer and delivery state.",
                   {"consumer": consumer, "state": state.value}, getattr(d, state.value))
        # A gauge, not a counter: it is summed over the deliveries still stored,
        # so pruning lowers it (a counter must never go down).
        yield ("reliable_flow_delivery_retries", "gauge",
               "Sends beyond each event's first, over the deliveries still stored, per consumer.",
               {"consumer": consumer}, d.retries)
        yield ("reliable_flow_deliveries_failing", "gauge", "Pending deliveries whose last send failed.",
               {"consumer": consumer}, d.failing)
        yield ("reliable_flow_deliveries_leased", "gauge", "Pending deliveries claimed by a relay now.",
               {"consumer": consumer}, d.leased)
        yield ("reliable_flow_deliveries_untried", "gauge", "Pending deliveries never sent.",
               {"consumer": consumer}, d.untried)
        if d.oldest_pending_age is not None:
            yield ("reliable_flow_oldest_pending_age_seconds", "gauge",
                   "Seconds since the oldest pending delivery was last written (sent, failed, claimed).",
                   {"consumer": consumer}, d.oldest_pending_age)


def _schedule_samples(m: ConsumerMetrics) -> Iterator[_Sample]:
    """Each recurring schedule's next and last tick, paused state and skipped ticks."""
    who = {"consumer": m.consumer}
    for name, s in m.schedules.items():
        yield ("reliable_flow_schedule_next_tick_timestamp_seconds", "gauge",
               "When a recurring schedule next ticks (epoch seconds).", {**who, "schedule": name}, s["next_at"])
    for name, s in m.schedules.items():
        if s["last_tick"] is not None:
            yield ("reliable_flow_schedule_last_tick_timestamp_seconds", "gauge",
                   "The time of a recurring schedule's latest tick made an effect (epoch seconds).",
                   {**who, "schedule": name}, s["last_tick"])
    for name, s in m.schedules.items():
        yield ("reliable_flow_schedule_paused", "gauge", "1 while an operator paused the recurring schedule.",
               {**who, "schedule": name}, 1 if s["paused"] else 0)
    for name, s in m.schedules.items():
        yield ("reliable_flow_schedule_skipped_ticks", "gauge",
               "Missed ticks of a recurring schedule that were not performed (missed one / skip / past the all bound).",
               {**who, "schedule": name}, s["skipped"])


def _consumer_samples(m: ConsumerMetrics) -> Iterator[_Sample]:
    who = {"consumer": m.consumer}
    yield ("reliable_flow_consumer_order", "gauge", "The consumer's own order (strict, latest, any): 1 for its own.",
           {**who, "order": m.order}, 1)
    for state, n in m.inbox.items():
        yield "reliable_flow_inbox_rows", "gauge", "Inbox rows per state.", {**who, "state": state}, n
    for reason, n in m.blocked.items():
        yield "reliable_flow_inbox_blocked", "gauge", "Blocked inbox rows per reason.", {**who, "reason": reason}, n
    yield "reliable_flow_flows_at_gap", "gauge", "Flows stopped at a missing seq.", who, m.gaps
    for state, n in m.effects.items():
        yield "reliable_flow_effects", "gauge", "Side effects per state.", {**who, "state": state}, n
    for name, n in m.timers.items():
        yield ("reliable_flow_effects_waiting_for_time", "gauge",
               "Pending effects not due yet (delayed, backing off, rate limited), per name.",
               {**who, "effect": name}, n)
    for name, due in m.next_due.items():
        yield ("reliable_flow_effect_next_due_timestamp_seconds", "gauge",
               "When the earliest pending effect of a name not due yet is due (epoch seconds).",
               {**who, "effect": name}, due)
    yield from _schedule_samples(m)
    if m.duplicates is not None:
        yield ("reliable_flow_duplicates_received_total", "counter",
               "Duplicate events received since this process opened the consumer.", who, m.duplicates)
    if m.applied is not None:
        yield ("reliable_flow_applied_total", "counter",
               "Events applied since this process opened the consumer.", who, m.applied)
    if m.applied_per_second is not None:
        yield ("reliable_flow_applied_per_second", "gauge",
               "Events applied per second since this process opened the consumer.", who, m.applied_per_second)


def _executor_samples(m: ExecutorMetrics) -> Iterator[_Sample]:
    who = {"consumer": m.consumer, "owner": m.owner}
    yield "reliable_flow_effect_concurrency", "gauge", "Calls an executor keeps in flight at most.", who, m.concurrency
    yield ("reliable_flow_effect_calls_in_flight", "gauge", "Effect calls not returned yet, all names.", who,
           sum(m.in_flight.values()))
    for name, n in m.in_flight.items():
        yield ("reliable_flow_effect_calls_in_flight_by_name", "gauge", "Effect calls not returned yet, per name.",
               {**who, "effect": name}, n)
    for name, n in m.started.items():
        yield ("reliable_flow_effect_starts_total", "counter", "Calls of an effect's function started.",
               {**who, "effect": name}, n)
    for metric, text, value in (
        ("rate_limited", "Effects put off by their rate_limit.", m.rate_limited),
        ("heartbeats", "heartbeat() calls that renewed a lease.", m.heartbeats),
        ("lease_renewals", "Leases of calls in flight renewed.", m.renewals),
        ("timeouts", "Calls recorded in doubt for outliving their timeout.", m.timeouts),
        ("leases_lost", "Outcomes discarded because another executor held the effect.", m.lease_lost),
    ):
        yield f"reliable_flow_effect_{metric}_total", "counter", text, who, value


def prometheus_text(snapshots: Iterable[ProducerMetrics | ConsumerMetrics | ExecutorMetrics]) -> str:
    """The snapshots in the Prometheus text exposition format (version
    0.0.4): ``# HELP`` and ``# TYPE`` once per metric, samples grouped
    under it, labels ``consumer`` / ``state`` / ``reason`` (and ``owner`` /
    ``effect`` for an executor's)."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for snap in snapshots:
        samples = (_producer_samples(snap) if isinstance(snap, ProducerMetrics)
                   else _executor_samples(snap) if isinstance(snap, ExecutorMetrics) else _consumer_samples(snap))
        for name, kind, text, labels, value in samples:
            family = families.setdefault(name, (kind, text, []))
            shown = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            family[2].append(f"{name}{{{shown}}} {_number(value)}" if shown else f"{name} {_number(value)}")
    lines: list[str] = []
    for name, (kind, text, rows) in families.items():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *rows]
    return "\n".join(lines) + "\n"
