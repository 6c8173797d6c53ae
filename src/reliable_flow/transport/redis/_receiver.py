""":class:`RedisReceiver`: a consumer on another host, as a relay sees it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..._checks import check_seconds
from ..._envelope import check_name
from ..._observe import RELAY, WARNING, fields, log
from ..._producer import Producer
from ...errors import ConsumerMismatch, TransportError
from ...records import ReceiveResult
from .. import _wire as wire
from ._connect import Keys, check_key_part, check_url, connect, fields_of, shown, talking
from ._owed import record_served
from ._producer import ProducerServer

__all__ = ["RedisReceiver"]

#: The default time a request waits for its answer (well inside the relay's
#: default 30 s lease, so one relay's retry never overlaps another's send).
DEFAULT_TIMEOUT = 10.0
#: Requests kept in a consumer's stream at most (trimmed approximately);
#: a request trimmed before a bridge read it is a failed send, retried.
DEFAULT_MAX_REQUESTS = 10_000
#: How often a waiting request answers the producer's own requests (:meth:`RedisReceiver.serve_meanwhile`).
MEANWHILE = 0.05


class RedisReceiver:
    """A :class:`~reliable_flow.Receiver` for the consumer named
    ``consumer_name``, served by a :class:`Bridge` on the consumer's host
    through the Redis server at ``url``.

    ``accept_many(bodies)`` writes one request (the bodies, a reply stream
    of its own, and a deadline ``timeout`` seconds ahead) to the consumer's
    request stream and waits for the answer until that deadline.  The
    answer is the consumer's own: ``accepted`` only once the inbox commit
    is done, ``duplicate``, the conflicts and ``refused`` as the consumer
    gave them, so the relay marks, sets aside and backs off as for a
    consumer in process.  No answer by the deadline (a lost request or
    answer, a dead bridge, an unreachable server) raises
    :class:`~reliable_flow.errors.TransportError`: a failed send, retried
    after backoff, never an acceptance.  An answer arriving later, or for
    another request, or malformed, is ignored.

    ``uid`` and ``location`` are the consumer storage's, as its bridge
    announced them in Redis (read on first use, so a worker can start while
    the server or the bridge is not up yet); each request carries the uid,
    and a bridge serving another store under the name refuses it with
    :class:`~reliable_flow.errors.ConsumerMismatch`.

    One request at a time per object (a lock); the relay calls it from one
    thread.  ``close()`` drops the connection.

    A worker that also serves its producer (``Worker(..., serve_as=NAME)``)
    hands its server to :meth:`serve_meanwhile`: while a request waits for
    its answer, the producer's requests are answered too, every
    :data:`MEANWHILE` seconds.  Else a bridge whose executor waits for the
    producer's answer to a result it feeds, and this relay waiting for that
    bridge's answer, would each wait for the other until the relay's timeout.
    """

    def __init__(
        self,
        url: str,
        consumer_name: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        prefix: str = "rf",
        max_requests: int = DEFAULT_MAX_REQUESTS,
    ) -> None:
        self.url = check_url(url)
        self._name = check_name("consumer_name", consumer_name)
        self.timeout = check_seconds("timeout", timeout, allow_zero=False)
        self.prefix = check_key_part("prefix", prefix)
        if type(max_requests) is not int or max_requests < 1:
            raise ValueError(f"max_requests must be an int >= 1, got {max_requests!r}")
        self.max_requests = max_requests
        self._keys = Keys(self.prefix, self._name)
        self._reply = self._keys.reply(wire.new_id())
        self._client = connect(self.url, timeout=self.timeout + 5.0)
        self._lock = threading.Lock()
        self._last = "0-0"
        self._uid: str | None = None
        self._location: str | None = None
        #: Answers ignored: late (after their deadline), for another request, malformed.
        self.ignored = 0
        self._meanwhile: ProducerServer | None = None

    # -- what a relay reads -------------------------------------------------------------

    @property
    def name(self) -> str:
        """The consumer's name (the producer keeps delivery state under it)."""
        return self._name

    @property
    def uid(self) -> str:
        """The consumer storage's uid, as its bridge announced it."""
        if self._uid is None:
            self._announced()
        assert self._uid is not None
        return self._uid

    @property
    def location(self) -> str:
        """Where the consumer is: its storage's location, through the server."""
        if self._location is None:
            try:
                self._announced()
            except TransportError:
                return f"{self._name} via {shown(self.url)}"
        return f"{self._location} via {shown(self.url)}"

    def _announced(self) -> None:
        info = talking(self.url, f"consumer {self._name!r}", lambda: self._client.hgetall(self._keys.consumer))
        try:
            info = wire.decode(info)
        except wire.BadMessage:
            info = {}
        uid = info.get("uid")
        if not uid:
            raise TransportError(
                f"consumer {self._name!r}: no bridge has announced it on Redis at {shown(self.url)} "
                f"(start `reliable-flow bridge CONSUMER --redis URL` on the consumer's host)"
            )
        self._uid, self._location = str(uid), str(info.get("location") or self._name)

    # -- sending ------------------------------------------------------------------------

    def accept(self, body: str) -> ReceiveResult:
        """One body: see :meth:`accept_many`."""
        return self.accept_many([body])[0]

    def accept_many(self, bodies: Sequence[str]) -> list[ReceiveResult]:
        """Send the bodies as one request and return the consumer's answers,
        one per body in order; raise :class:`TransportError` when no answer
        came before the deadline (nothing is taken as accepted)."""
        bodies = list(bodies)
        if not bodies:
            return []
        if len(bodies) > wire.MAX_BODIES:
            raise ValueError(f"bodies: at most {wire.MAX_BODIES} in one request, got {len(bodies)}")
        event_ids = [_event_id(i, body) for i, body in enumerate(bodies)]
        with self._lock:
            request = wire.Request(id=wire.new_id(), reply=self._reply, deadline=time.time() + self.timeout,
                                   uid=self.uid, bodies=tuple(bodies))
            self._send(request)
            answer = self._wait(request, event_ids)
        if answer.uid != request.uid:
            raise ConsumerMismatch(
                f"consumer {self._name!r} via {shown(self.url)}: answered by storage uid {answer.uid} "
                f"({answer.location}), but the producer delivers to uid {request.uid}. Give each consumer "
                f"storage its own name."
            )
        return answer.outcome()

    def _send(self, request: wire.Request) -> None:
        def send() -> None:
            pipe = self._client.pipeline(transaction=False)
            pipe.xadd(self._keys.requests, wire.request_fields(request), maxlen=self.max_requests,
                      approximate=True)
            # The reply stream outlives a request only briefly: a worker that dies leaves no litter.
            pipe.expire(self._reply, int(self.timeout) + 60)
            pipe.execute()

        talking(self.url, f"sending to consumer {self._name!r}", send)

    def _wait(self, request: wire.Request, event_ids: list[str]) -> wire.Answer:
        while True:
            left = request.deadline - time.time()
            if left <= 0:
                raise TransportError(
                    f"consumer {self._name!r}: no answer from its bridge via Redis at {shown(self.url)} "
                    f"within {self.timeout:g} s (request {request.id}, {len(request.bodies)} events); "
                    f"nothing taken as accepted"
                )
            if self._meanwhile is not None:
                self._serve_meanwhile()
                left = min(left, MEANWHILE)
            block = max(1, int(left * 1000))
            read = self._read(block)
            seen: list[Any] = []
            found: wire.Answer | None = None
            for _stream, entries in read or ():
                for entry in entries:
                    entry_id = entry[0]
                    seen.append(entry_id)
                    self._last = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                    answer = self._parsed(fields_of(entry))
                    if found is None and answer is not None and wire.matches(answer, request, event_ids):
                        if time.time() > request.deadline:
                            self._ignored("late", request.id)  # the relay has given up on it by now
                        else:
                            found = answer
                    elif answer is not None:
                        self._ignored("for another request", answer.id)
            if seen:
                self._trim(seen)
            if found is not None:
                return found

    def _read(self, block_ms: int) -> Any:
        return talking(self.url, f"waiting for consumer {self._name!r}",
                       lambda: self._client.xread({self._reply: self._last}, count=16, block=block_ms))

    def _trim(self, seen: list[Any]) -> None:
        talking(self.url, "trimming the reply stream", lambda: self._client.xdel(self._reply, *seen))

    def _parsed(self, raw: dict[Any, Any]) -> wire.Answer | None:
        try:
            return wire.parse_answer(wire.decode(raw))
        except wire.BadMessage as exc:
            self._ignored(f"malformed ({exc})", "?")
            return None

    def _ignored(self, why: str, request_id: str) -> None:
        self.ignored += 1
        if RELAY.isEnabledFor(WARNING):
            log(RELAY, WARNING, "answer ignored", fields(consumer=self._name, request=request_id, why=why))

    def serve_meanwhile(self, server: ProducerServer) -> None:
        """Answer ``server``'s requests while a request of this receiver
        waits for its answer (on the thread that sends, which must be the
        thread of ``server``'s producer: a relay holds no producer
        transaction while it waits)."""
        if not isinstance(server, ProducerServer):
            raise TypeError(f"server must be a ProducerServer, got {type(server).__name__}")
        self._meanwhile = server

    def _serve_meanwhile(self) -> None:
        assert self._meanwhile is not None
        try:
            self._meanwhile.serve_once()
        except Exception:  # noqa: BLE001, S110 - the worker's own serve step meets it again and records it
            pass

    def producer_server(self, producer: Producer, name: str) -> ProducerServer:
        """A server of ``producer`` as ``name`` on this receiver's Redis
        server and prefix: what ``Worker(..., serve_as=name)`` answers
        remote executors' feedback with; where is recorded in the
        producer's store (``meta`` row ``served_as``, for ``inspect``)."""
        server = ProducerServer(producer, self.url, name, prefix=self.prefix)
        record_served(producer, self.url, server.name, self.prefix)
        return server

    def close(self) -> None:
        """Drop the connection (a later call reconnects)."""
        self._client.close()

    def __enter__(self) -> RedisReceiver:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisReceiver({shown(self.url)!r}, {self._name!r})"


def _event_id(i: int, body: object) -> str:
    """A body's event id (the bodies a relay sends are canonical envelopes)."""
    if not isinstance(body, str):
        raise TypeError(f"bodies[{i}] must be a canonical event body (str), got {type(body).__name__}")
    try:
        event_id = json.loads(body).get("event_id")
    except (ValueError, AttributeError):
        event_id = None
    if not isinstance(event_id, str):
        raise ValueError(f"bodies[{i}] is not a reliable_flow event body (no event_id)")  # noqa: TRY004
    return event_id
