"""A producer on another host, through Redis: :class:`RemoteProducer` (what
an effect executor beside a consumer feeds results and failures into) and
:class:`ProducerServer` (the worker that relays from the producer serves
it: ``Worker(..., serve_as=NAME)``, ``reliable-flow run --serve-as NAME``).

The producer's store stays the authority.  A request carries one step --
the event id derived from the effect's key, the flow, the kind, the
payload -- and the server advances it at the flow's current seq in one
producer transaction (``existing`` when it is there already, so a request
sent twice, or read twice after a server died before acknowledging it,
adds the step once).  A request whose answer is lost is a failed feedback,
tried again on a later pass; Redis needs no persistence.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from ..._checks import check_count, check_seconds
from ..._envelope import check_name
from ..._observe import WARNING, WORKER, fields, log
from ..._producer import Producer, advance_at_current, check_at_current
from ...errors import InvalidEnvelope, ReliableFlowError, TransportError, WrongFile
from ...records import AdvanceResult
from .. import _advance_wire as aw
from .. import _wire as wire
from ._connect import check_key_part, check_url, connect, fields_of, shown, talking
from ._group import GroupReader

__all__ = ["ProducerServer", "RemoteProducer", "producer_location"]

GROUP = "rf-producer"
ANNOUNCE_EVERY = 5.0
DEFAULT_TIMEOUT = 10.0
MAX_REQUESTS = 10_000


class ProducerKeys:
    """The Redis keys of one producer name: its request stream, the hash
    its servers announce the producer's storage in, and the prefix of
    reply streams."""

    def __init__(self, prefix: str, name: str) -> None:
        base = f"{prefix}:{{producer:{name}}}"  # one hash slot per producer name (Redis Cluster)
        self.requests = f"{base}:requests"
        self.producer = f"{base}:producer"
        self.replies = f"{base}:answers"


def producer_location(location: str) -> tuple[str, str]:
    """``redis://host:6379/0#agent`` split into the server's URL and the
    producer's name; a ValueError naming ``producer`` otherwise."""
    if not isinstance(location, str) or "#" not in location:
        raise ValueError(f"producer: a remote producer is redis://host:port/db#NAME, got {location!r}")
    url, _, name = location.rpartition("#")
    try:
        check_url(url)
        name = check_key_part("producer name", urllib.parse.unquote(name))
    except ValueError as exc:
        raise ValueError(f"producer: {exc}") from None
    return url, name


class RemoteProducer:
    """The producer served as ``name`` through the Redis server at ``url``
    (by a worker started with ``serve_as=name``): the target an
    :class:`~reliable_flow.EffectExecutor` given ``producer="redis://host#name"``
    feeds results and failures into.

    :meth:`advance_at_current` writes one request and waits for the answer
    until ``timeout`` seconds have passed; no answer raises
    :class:`~reliable_flow.errors.TransportError` (nothing is taken as
    fed: the executor tries again on a later pass, and the producer answers
    ``existing`` if the first request was advanced after all).  One request
    at a time per object (a lock).  ``close()`` drops the connection."""

    def __init__(self, url: str, name: str, *, timeout: float = DEFAULT_TIMEOUT, prefix: str = "rf") -> None:
        self.url = check_url(url)
        self.name = check_key_part("name", name)
        self.timeout = check_seconds("timeout", timeout, allow_zero=False)
        self.prefix = check_key_part("prefix", prefix)
        self.keys = ProducerKeys(self.prefix, self.name)
        self._reply = f"{self.keys.replies}:{wire.new_id()}"
        self._client = connect(self.url, timeout=self.timeout + 5.0)
        self._lock = threading.Lock()
        self._last = "0-0"
        self._uid: str | None = None
        #: Answers ignored: late, for another request, malformed.
        self.ignored = 0

    @classmethod
    def at(cls, location: str, **kw: Any) -> RemoteProducer:
        """The remote producer at ``redis://host:port/db#NAME``."""
        url, name = producer_location(location)
        return cls(url, name, **kw)

    @property
    def location(self) -> str:
        """Where the producer is: its name, through the server."""
        return f"{shown(self.url)}#{self.name}"

    def _announced_uid(self) -> str:
        if self._uid is None:
            info = talking(self.url, f"producer {self.name!r}", lambda: self._client.hgetall(self.keys.producer))
            try:
                uid = wire.decode(info).get("uid")
            except wire.BadMessage:
                uid = None
            if not uid:
                raise TransportError(
                    f"producer {self.name!r}: nobody serves it on Redis at {shown(self.url)} (start the worker "
                    f"that relays from it with `reliable-flow run --producer FILE --serve-as {self.name} --to URL`)")
            self._uid = uid
        return self._uid

    def advance_at_current(self, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
                           meta: dict[str, str] | None = None) -> AdvanceResult:
        """``advance_at_current`` on the producer's host: one producer
        transaction at the flow's current seq; its result.  A step the
        producer's protocol refuses raises
        :class:`~reliable_flow.errors.InvalidEnvelope`; a storage of another
        producer served under the name raises :class:`~reliable_flow.errors.WrongFile`."""
        got = self.advance_many([{"event_id": event_id, "flow_id": flow_id, "kind": kind, "payload": payload,
                                  "schema": schema, "meta": meta}])[0]
        if isinstance(got, Exception):
            raise got
        return got

    def check_at_current(self, event_id: str, flow_id: str, *, kind: str, payload: Any, schema: int = 1,
                         meta: dict[str, str] | None = None) -> AdvanceResult:
        """What :meth:`advance_at_current` would answer now, nothing
        committed over there (the same transaction, rolled back): how an
        operator's result is checked against the producer's protocol before
        it is recorded."""
        got = self.advance_many([{"event_id": event_id, "flow_id": flow_id, "kind": kind, "payload": payload,
                                  "schema": schema, "meta": meta}], check=True)[0]
        if isinstance(got, Exception):
            raise got
        return got

    def advance_many(self, steps: Sequence[Mapping[str, Any]], *,
                     check: bool = False) -> list[AdvanceResult | Exception]:
        """Several steps (each the keywords of :meth:`advance_at_current`:
        ``event_id``, ``flow_id``, ``kind``, ``payload``, and optionally
        ``schema``, ``meta``) sent at once, each its own request and its own
        producer transaction over there; the answers in order, each a result
        or the exception that step raised (a step not answered within
        ``timeout``: :class:`~reliable_flow.errors.TransportError`).  Raises
        only when the server cannot be reached, or another store answers
        under the name (:class:`~reliable_flow.errors.WrongFile`).  ``check``:
        only check each (:meth:`check_at_current`)."""
        if not steps:
            return []
        with self._lock:
            deadline = time.time() + self.timeout
            uid = self._announced_uid()
            requests = [aw.Advance(id=wire.new_id(), reply=self._reply, deadline=deadline, uid=uid,
                                   event_id=step["event_id"], flow_id=step["flow_id"], kind=step["kind"],
                                   schema=step.get("schema", 1), payload=step["payload"], meta=step.get("meta"),
                                   check=check)
                        for step in steps]
            sent: dict[str, dict[str, str]] = {}
            unsent: dict[str, Exception] = {}
            for request in requests:
                try:
                    sent[request.id] = aw.advance_fields(request)
                except (TypeError, ValueError) as exc:  # not JSON: refused here, as a local advance refuses it
                    unsent[request.id] = InvalidEnvelope("payload", f"is not JSON ({exc})")

            def send() -> None:
                pipe = self._client.pipeline(transaction=False)
                for one in sent.values():
                    pipe.xadd(self.keys.requests, one, maxlen=MAX_REQUESTS, approximate=True)
                pipe.expire(self._reply, int(self.timeout) + 60)
                pipe.execute()

            if sent:
                talking(self.url, f"feeding back to producer {self.name!r}", send)
            answers = self._wait(set(sent), deadline)
        out: list[AdvanceResult | Exception] = []
        for request in requests:
            if request.id in unsent:
                out.append(unsent[request.id])
                continue
            answer = answers.get(request.id)
            if answer is None:
                out.append(TransportError(
                    f"producer {self.name!r}: no answer from its worker via Redis at {shown(self.url)} within "
                    f"{self.timeout:g} s (event {request.event_id}); nothing taken as fed"))
                continue
            try:
                out.append(answer.outcome())
            except WrongFile:
                raise
            except Exception as exc:  # noqa: BLE001 - that step's answer, given back in its place
                out.append(exc)
        return out

    def _wait(self, ids: set[str], deadline: float) -> dict[str, aw.AdvanceAnswer]:
        """The answers to the requests ``ids`` that come before ``deadline``."""
        found: dict[str, aw.AdvanceAnswer] = {}
        while len(found) < len(ids):
            left = deadline - time.time()
            if left <= 0:
                break
            block = max(1, int(left * 1000))
            got = talking(self.url, f"waiting for producer {self.name!r}", lambda: self._client.xread(
                {self._reply: self._last}, count=100, block=block))  # noqa: B023 - called at once
            seen: list[Any] = []
            for _stream, entries in got or ():
                for entry in entries:
                    seen.append(entry[0])
                    self._last = entry[0].decode() if isinstance(entry[0], bytes) else str(entry[0])
                    try:
                        answer = aw.parse_advance_answer(wire.decode(fields_of(entry)))
                    except wire.BadMessage:
                        self.ignored += 1
                        continue
                    if answer.id in ids and answer.id not in found and time.time() <= deadline:
                        found[answer.id] = answer
                    else:
                        self.ignored += 1
            if seen:
                talking(self.url, "trimming the reply stream",
                        lambda: self._client.xdel(self._reply, *seen))  # noqa: B023 - called at once
        return found

    def close(self) -> None:
        """Drop the connection (a later call reconnects)."""
        self._client.close()

    def __enter__(self) -> RemoteProducer:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteProducer({self.location!r})"


class ProducerServer:
    """Serves ``producer`` as ``name`` on the Redis server at ``url``: each
    :meth:`serve_once` answers the advance requests waiting (up to
    ``batch``), each in one producer transaction, writes the answers, and
    only then acknowledges the requests.  A server killed at any line
    leaves its requests pending in the group; it takes them again on
    restart (or another server after ``claim_after`` seconds), and the
    producer answers ``existing`` for a step already there.  A request past
    its deadline is dropped unread (its sender has given up and sends
    again); a malformed one is answered with the error when it says where.
    ``served`` counts the answers by status (``refused`` for a step the
    protocol refused)."""

    def __init__(self, producer: Producer, url: str, name: str, *, prefix: str = "rf", batch: int = 100,
                 claim_after: float = 30.0) -> None:
        if not isinstance(producer, Producer):
            raise TypeError(f"producer must be a Producer, got {type(producer).__name__}")
        self.producer = producer
        self.url = check_url(url)
        self.name = check_name("serve_as", name)
        self.prefix = check_key_part("prefix", prefix)
        self.keys = ProducerKeys(self.prefix, self.name)
        self.batch = check_count("batch", batch)
        self.claim_after = check_seconds("claim_after", claim_after, allow_zero=False)
        self.member = f"{socket.gethostname()}-{os.getpid()}"
        self._client = connect(self.url, timeout=10.0)
        self._announced_at = -ANNOUNCE_EVERY
        self._reader = GroupReader(self._client, self.url, self.keys.requests, GROUP, self.member, batch=batch,
                                   claim_after=claim_after, setup=self._announce)
        self.served: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()

    @property
    def where(self) -> str:
        """The server and prefix it serves on (one server per pair)."""
        return f"{self.url} {self.prefix}"

    def _announce(self) -> None:
        def setup() -> None:
            try:
                self._client.xgroup_create(self.keys.requests, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._refuse_another_store(wire.decode(self._client.hgetall(self.keys.producer)))
            self._client.hset(self.keys.producer, mapping={
                "uid": self.producer.uid, "location": self.producer.location, "name": self.name,
                "server": self.member, "at": repr(time.time())})

        talking(self.url, f"serving producer {self.name!r}", setup)
        self._announced_at = time.monotonic()

    def _refuse_another_store(self, held: dict[str, str]) -> None:
        """Another producer store announced under this name lately (within
        three announcement periods): serving both would send each step to
        either store.  Retrying cannot heal it: ``WrongFile``."""
        try:
            at = float(held.get("at", "0"))
        except ValueError:
            at = 0.0
        uid = held.get("uid")
        if uid and uid != self.producer.uid and time.time() - at < 3 * ANNOUNCE_EVERY:
            raise WrongFile(
                f"producer name {self.name!r} on Redis at {shown(self.url)} is served for another store "
                f"({held.get('location', '?')}, uid {uid}) than {self.producer.location} (uid {self.producer.uid}): "
                f"two producer stores are served under one name; give each its own")

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a request (what an idle worker does
        instead of sleeping); True when one came (it is then this member's,
        answered by the next :meth:`serve_once`)."""
        if time.monotonic() - self._announced_at >= ANNOUNCE_EVERY:
            self._announce()
        block = max(1, int(seconds * 1000))
        return talking(self.url, f"serving producer {self.name!r}", lambda: self._reader.wait(block))

    def serve_once(self) -> int:
        """Answer the requests waiting (never blocks); how many were answered."""
        if time.monotonic() - self._announced_at >= ANNOUNCE_EVERY:
            self._announce()
        entries = talking(self.url, f"serving producer {self.name!r}", lambda: self._reader.read(None))
        if not entries:
            return 0
        now, uid, location = time.time(), self.producer.uid, self.producer.location
        answers: list[tuple[str, dict[str, str]]] = []
        for entry in entries:
            raw: dict[str, str] = {}
            try:
                raw = wire.decode(fields_of(entry))
                request = aw.parse_advance(raw)
                if not request.reply.startswith(self.keys.replies + ":"):
                    raise wire.BadMessage("reply", "not a reply stream of this producer")
            except wire.BadMessage as exc:
                self.served["malformed"] += 1
                _warn(self.name, f"malformed request refused: {exc}")
                reply, request_id = raw.get("reply", ""), raw.get("id", "")
                if reply.startswith(self.keys.replies + ":") and request_id:
                    answers.append((reply, wire.error_fields(request_id, uid, location,
                                                             InvalidEnvelope(exc.field, exc.problem))))
                continue
            if request.deadline <= now:
                self.served["expired"] += 1
                continue
            answers.append((request.reply, self._advance(request, uid, location)))
        self._reader.finish(f"serving producer {self.name!r}", answers, [e[0] for e in entries])
        return len(answers)

    def _advance(self, request: aw.Advance, uid: str, location: str) -> dict[str, str]:
        if request.uid != uid:
            self.served["mismatch"] += 1
            return wire.error_fields(request.id, uid, location, WrongFile(
                f"producer {self.name!r} served from {location} has storage uid {uid}, but the request is "
                f"for uid {request.uid}: two producer stores are served under one name; give each its own"))
        advance = check_at_current if request.check else advance_at_current
        try:
            result = advance(self.producer, request.event_id, request.flow_id, kind=request.kind,
                             payload=request.payload, schema=request.schema, meta=request.meta)
        except (ValueError, TypeError) as exc:  # InvalidEnvelope: not a valid step; nothing stored
            self.served["refused"] += 1
            return wire.error_fields(request.id, uid, location, exc)
        except ReliableFlowError as exc:  # a storage error: answered (nothing stored), the sender tries again
            self.served["error"] += 1
            _warn(self.name, f"advance failed: {type(exc).__name__}: {exc}")
            return wire.error_fields(request.id, uid, location, exc)
        self.served["checked" if request.check else result.status.value] += 1
        return aw.advance_answer_fields(request.id, uid, location, result)

    def unreported(self) -> Counter[str]:
        """The answers counted in :attr:`served` since the last call (the
        worker's tally: some are answered while a relay waits)."""
        news = self.served - self._reported
        self._reported = Counter(self.served)
        return news

    def close(self) -> None:
        """Drop the connection (the producer stays open: it is the caller's)."""
        self._client.close()

    def __repr__(self) -> str:
        return f"ProducerServer({self.name!r}, {shown(self.url)!r})"


def _warn(name: str, text: str) -> None:
    if WORKER.isEnabledFor(WARNING):
        log(WORKER, WARNING, text, fields(producer=name))
