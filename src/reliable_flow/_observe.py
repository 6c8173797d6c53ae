"""Logs: one stdlib :mod:`logging` logger per component, structured fields.

Loggers (configure them like any other; the library only adds a
``NullHandler`` to ``reliable_flow``, so nothing is printed unless the
application configures logging):

* ``reliable_flow.producer`` -- advances (committed, existing, conflict, ...)
  and operator actions on deliveries;
* ``reliable_flow.relay`` -- what each consumer answered (accepted,
  duplicate, set aside) and failed sends;
* ``reliable_flow.consumer`` -- receives, applies, blocks, gaps and operator
  actions on effects;
* ``reliable_flow.executor`` -- effect outcomes;
* ``reliable_flow.worker`` -- errors the worker loop recorded and went on from.

Every record carries, as attributes (``extra=``), ``event_id``,
``flow_id``, ``seq``, ``status``, ``consumer``, and from the event's
``meta`` ``correlation_id``, ``causation_id`` and ``trace`` (None when
absent), plus what the outcome adds (``reason``, ``detail``, ``error``,
``key``, ``actor``...).  A formatter can print them by name
(``%(correlation_id)s``).

INFO: the outcomes worth seeing.  WARNING: conflicts, set-asides, blocks,
effects dead or unknown, failed sends, worker errors.  A block or a gap that
is found again on a later pass is logged again only at DEBUG.

Cost when a level is off: callers test ``logger.isEnabledFor(level)`` first,
so the hot path builds no dict and formats nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .records import ApplyResult, OperatorAction
from .statuses import ApplyStatus

__all__ = [
    "CONSUMER", "DEBUG", "EXECUTOR", "INFO", "PRODUCER", "RELAY", "WARNING", "WORKER",
    "Observer", "advanced", "body_fields", "fields", "log", "operator_action",
]

DEBUG, INFO, WARNING = logging.DEBUG, logging.INFO, logging.WARNING

logging.getLogger("reliable_flow").addHandler(logging.NullHandler())

PRODUCER = logging.getLogger("reliable_flow.producer")
CONSUMER = logging.getLogger("reliable_flow.consumer")
RELAY = logging.getLogger("reliable_flow.relay")
WORKER = logging.getLogger("reliable_flow.worker")
EXECUTOR = logging.getLogger("reliable_flow.executor")

#: The meta keys copied onto every record (None when the event has none).
META_FIELDS = ("correlation_id", "causation_id", "trace")


def fields(
    event_id: str | None = None, flow_id: str | None = None, seq: int | None = None, status: object = None,
    consumer: str | None = None, meta: Mapping[str, Any] | None = None, **more: Any,
) -> dict[str, Any]:
    """The structured fields of one record (``extra=``)."""
    out: dict[str, Any] = {
        "event_id": event_id, "flow_id": flow_id, "seq": seq,
        "status": None if status is None else str(status), "consumer": consumer,
    }
    meta = meta or {}
    for key in META_FIELDS:
        out[key] = meta.get(key)
    out.update(more)
    return out


def body_fields(body: str, status: object = None, consumer: str | None = None, **more: Any) -> dict[str, Any]:
    """:func:`fields` of an event known only by its canonical body (parsed here)."""
    try:
        event = json.loads(body)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        return fields(status=status, consumer=consumer, **more)
    meta = event.get("meta")
    return fields(event.get("event_id"), event.get("flow_id"), event.get("seq"), status, consumer,
                  meta if isinstance(meta, dict) else None, **more)


def _text(message: str, extra: Mapping[str, Any]) -> str:
    shown = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None and k != "status")
    return f"{message} {shown}" if shown else message


def log(logger: logging.Logger, level: int, message: str, extra: dict[str, Any]) -> None:
    """Write one record; the fields are both attributes and part of the text."""
    if logger.isEnabledFor(level):
        logger.log(level, "%s", _text(message, extra), extra=extra)


def advanced(result: Any, meta: Mapping[str, Any] | None) -> None:
    """Log an advance: committed / existing / stale ... at INFO, a conflict
    (the same event id with another body) at WARNING."""
    level = WARNING if result.status == "conflict" else INFO
    if PRODUCER.isEnabledFor(level):
        log(PRODUCER, level, f"advance: {result.status}",
            fields(result.event_id, result.flow_id, result.seq, result.status, None, meta, reason=result.reason))


def operator_action(logger: logging.Logger, action: OperatorAction, consumer: str | None = None,
                    **more: Any) -> None:
    """Log an operator's recorded decision (INFO), with who and why."""
    if logger.isEnabledFor(INFO):
        extra = fields(action.event_id, status=action.action, consumer=consumer or action.consumer,
                       actor=action.actor, reason=action.reason)
        extra.update(more)
        log(logger, INFO, f"operator action: {action.action}", extra)


class Observer:
    """What one :class:`~reliable_flow.Consumer` object counted since it was
    opened (this process only: nothing of it is stored), and which repeated
    findings (a block, a gap) it already logged."""

    _SEEN_CAP = 10_000

    def __init__(self) -> None:
        self.opened = time.monotonic()
        self.applied = 0
        self.duplicates = 0
        self._seen: set[tuple[Any, ...]] = set()

    def applies(self, consumer: str, outcomes: Iterable[tuple[ApplyResult, Any]]) -> None:
        """Log apply outcomes of a transaction that has now committed: applied
        and gap at INFO, blocked at WARNING (idle: nothing).  Each comes with
        what it is about: the event (a dict with its ``meta``), or at a gap the
        body of the row waiting after it (a str, parsed only here, when the
        record is wanted).  A block or a gap already logged drops to DEBUG."""
        if not CONSUMER.isEnabledFor(WARNING):
            return
        for result, source in outcomes:
            status = result.status
            if status is ApplyStatus.IDLE:
                continue
            level = INFO if status is ApplyStatus.APPLIED or status is ApplyStatus.GAP else WARNING
            if not CONSUMER.isEnabledFor(level):
                continue
            event = json.loads(source) if isinstance(source, str) else source or {}
            extra = fields(result.event_id, result.flow_id, result.seq, status, consumer, event.get("meta"))
            once: tuple[Any, ...] | None = None
            if status is ApplyStatus.BLOCKED:
                extra.update(reason=None if result.reason is None else str(result.reason), detail=result.detail)
                once = ("blocked", result.event_id, result.reason)
            elif status is ApplyStatus.GAP:  # the meta is the waiting event's
                extra.update(detail=result.detail, waiting_event_id=event.get("event_id"),
                             waiting_seq=event.get("seq"))
                once = ("gap", result.flow_id, result.seq)
            if once is not None:
                if once in self._seen:
                    level = DEBUG  # found again on a later pass: not news
                else:
                    if len(self._seen) >= self._SEEN_CAP:
                        self._seen.clear()
                    self._seen.add(once)
            log(CONSUMER, level, str(status), extra)

    def received(self, consumer: str, meta: Mapping[str, Any] | None, result: Any) -> None:
        """Count a duplicate and log a receive: accepted / duplicate / refused
        (a full inbox) at INFO, a conflict at WARNING."""
        status = result.status
        if status == "duplicate":
            self.duplicates += 1
        level = INFO if status in ("accepted", "duplicate", "refused") else WARNING
        if CONSUMER.isEnabledFor(level):
            log(CONSUMER, level, f"received: {status}",
                fields(result.event_id, result.flow_id, result.seq, status, consumer, meta, reason=result.reason))

    def seconds_open(self) -> float:
        return time.monotonic() - self.opened
