""":class:`Bridge`: a consumer's side of the Redis transport."""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..._checks import check_count, check_flag, check_seconds
from ..._consumer import Consumer
from ..._effects.executor import EffectExecutor
from ..._envelope import parse as parse_body
from ..._loop import CANNOT_HEAL, Loop
from ..._observe import WARNING, WORKER, fields, log
from ..._receiver import Receiver
from ..._worker import WorkerStats, apply_open_flows, finish_executors, pump_executors
from ...errors import InvalidEnvelope, ReliableFlowError
from ...records import PassResult, ReceiveResult
from .. import _wire as wire
from ._connect import Keys, check_key_part, check_url, connect, denied, fields_of, shown, talking
from ._group import GroupReader
from ._owed import publish_owed
from ._questions import Questions

__all__ = ["Bridge", "BridgeStats"]

GROUP = "rf-bridge"
#: How often a bridge announces its consumer again (a Redis restarted
#: without persistence forgets it, and the group too: both are made anew).
ANNOUNCE_EVERY = 5.0
#: Refused messages kept for an operator to read (``XRANGE <prefix>:{NAME}:refused``).
MAX_REFUSED_KEPT = 1000


@dataclass
class BridgeStats(WorkerStats):
    """A worker's totals (``applied``, ``stops``, ``errors``, ``effects`` ...)
    and the transport's: ``requests`` read, ``answered``, ``received`` (the
    inbox's answers by status), ``expired`` (past their deadline when read:
    the sender had given up and sends again), ``malformed`` (refused and
    recorded, never applied), ``reclaimed`` (taken over from a bridge that
    died holding them); ``asked``: operators' questions answered (reads and
    actions), ``acted``: operator actions done for another host."""

    requests: int = 0
    answered: int = 0
    received: Counter[str] = field(default_factory=Counter)
    expired: int = 0
    malformed: int = 0
    reclaimed: int = 0
    asked: int = 0
    acted: int = 0
    last_malformed: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The totals as plain JSON-ready values (what ``reliable-flow bridge`` prints)."""
        out = super().as_dict()
        out.pop("relayed")
        out.update(requests=self.requests, answered=self.answered, received=dict(sorted(self.received.items())),
                   expired=self.expired, malformed=self.malformed, reclaimed=self.reclaimed,
                   asked=self.asked, acted=self.acted, last_malformed=self.last_malformed)
        return out


class Bridge:
    """Serves ``consumer`` to producers on other hosts through the Redis
    server at ``url``: reads the requests that :class:`RedisReceiver` objects
    write, hands their bodies to the consumer's receive, writes the answers,
    and only then acknowledges each request.

    * **Acknowledged after the commit, by construction.** A request is
      read through a consumer group; its answer is written after the inbox
      commit (or after the receive raised, nothing stored), and the request
      is acknowledged after that.  A bridge killed at any line leaves the
      request pending in the group: this bridge on restart, or another one
      after ``claim_after`` seconds, takes it over (``XAUTOCLAIM``); the
      inbox answers ``duplicate`` for what was stored already.
    * **Receive-and-apply by default** (``apply_on_receive``): an event that
      is its flow's next step is stored and applied in one commit.  Every
      pass also drains what waits (an event that arrived behind a gap is
      applied once the gap fills) and pumps ``executors``, as
      :class:`~reliable_flow.Worker` does.
    * **Several requests, one commit.** The requests of one read (up to
      ``batch``) go to the inbox in one ``receive_many`` transaction.
    * **Refused, never applied.** A message that is not a request of this
      version (missing or wrongly typed fields, too large, a body that is
      not an event envelope, a reply address outside this consumer's) is
      acknowledged, counted in ``stats.malformed``, logged and kept in the
      stream ``<prefix>:{NAME}:refused`` (the last 1,000); one with a reply
      address is answered with the error, so its sender stops waiting.
    * **Expired requests are dropped:** read after its deadline (a backlog
      after a partition), a request is acknowledged unread: its sender has
      given up and will send again.
    * **Another store under the name is refused:** a request for another
      storage uid is answered ``ConsumerMismatch`` and nothing is stored.
    * **What its effects owe producers is published** with each
      announcement (``<prefix>:{NAME}:owed``): the effects registered with
      ``feedback=`` whose step is not fed yet, a view for the producer's
      ``reliable-flow inspect`` (docs/operations.md).
    * **Operators' questions are answered** (``questions``): the reads of
      ``inspect`` and the console on another host
      (``<prefix>:{NAME}:questions``, :mod:`._questions`), each in a read
      transaction, between its requests; operator actions from another
      host only with ``allow_actions`` (refused with a sentence otherwise),
      run and recorded here as on the command line.

    Several bridges for one consumer are safe (the inbox decides); their
    ``name`` in the group must differ (default: host, process id).
    ``run()`` loops until :meth:`stop` or SIGTERM / SIGINT; a failure of a
    pass (Redis unreachable, a handler's bug) is recorded in ``stats`` and
    the bridge goes on, except what retrying cannot heal.
    """

    def __init__(
        self,
        consumer: Consumer,
        url: str,
        *,
        apply_on_receive: bool = True,
        executors: Sequence[EffectExecutor] = (),
        prefix: str = "rf",
        name: str | None = None,
        batch: int = 16,
        block: float = 0.5,
        claim_after: float = 10.0,
        apply_limit: int = 100,
        on_pass: Callable[[BridgeStats], None] | None = None,
        questions: bool = True,
        allow_actions: bool = False,
    ) -> None:
        if not isinstance(consumer, Consumer):
            raise TypeError(f"consumer must be a reliable_flow Consumer, got {type(consumer).__name__}")
        self.url = check_url(url)
        self.consumer = consumer
        self.apply_on_receive = check_flag("apply_on_receive", apply_on_receive)
        self._receiver: Receiver = consumer.applying() if apply_on_receive else consumer
        self.prefix = check_key_part("prefix", prefix)
        self.name = check_key_part("name", name) if name is not None else f"{socket.gethostname()}:{os.getpid()}"
        self.batch = check_count("batch", batch)
        self.block = check_seconds("block", block, allow_zero=False)
        self.claim_after = check_seconds("claim_after", claim_after, allow_zero=False)
        self.apply_limit = check_count("apply_limit", apply_limit)
        if not all(isinstance(e, EffectExecutor) for e in executors):
            raise TypeError("executors must be EffectExecutor objects")
        self.executors = list(executors)
        self.keys = Keys(self.prefix, consumer.name)
        self.stats = BridgeStats()
        self._on_pass = on_pass
        self._loop = Loop()
        self._client = connect(self.url, timeout=self.block + 5.0)
        self._announced_at = float("-inf")
        self._reader = GroupReader(self._client, self.url, self.keys.requests, GROUP, self.name, batch=self.batch,
                                   claim_after=self.claim_after, setup=self._setup)
        self._busy = False
        self._questions: Questions | None = None
        if check_flag("questions", questions):
            producer = next((e.producer for e in self.executors if e.producer is not None), None)
            self._questions = Questions(consumer, self._client, self.url, self.keys, GROUP, self.name,
                                        batch=self.batch, claim_after=self.claim_after,
                                        allow_actions=check_flag("allow_actions", allow_actions),
                                        producer=producer, setup=self._setup)
        elif check_flag("allow_actions", allow_actions):
            raise ValueError("allow_actions needs questions: actions come as questions")
        self._setup()

    # -- the group and the announcement ----------------------------------------------------

    def _setup(self) -> None:
        """Make the group (if missing), announce the consumer's storage and
        publish the steps its effects owe producers (a view for the
        producer's ``inspect``, :mod:`._owed`)."""
        def setup() -> None:
            for stream in [self.keys.requests] + ([self.keys.questions] if self._questions is not None else []):
                try:
                    self._client.xgroup_create(stream, GROUP, id="0", mkstream=True)
                except redis.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
            self._client.hset(self.keys.consumer, mapping={
                "uid": self.consumer.uid, "location": self.consumer.location, "name": self.consumer.name,
                "bridge": self.name, "at": repr(time.time())})
            publish_owed(self._client, self.keys, self.consumer, self.executors)

        talking(self.url, f"bridge for consumer {self.consumer.name!r}", setup)
        self._announced_at = time.monotonic()

    # -- the loop ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to return after the request in progress is answered."""
        self._loop.stop()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called or a stop signal arrived."""
        return self._loop.stopping

    def run(self, *, max_passes: int | None = None, handle_signals: bool = True) -> BridgeStats:
        """Serve until :meth:`stop`, SIGTERM / SIGINT or ``max_passes``;
        wait for the effect calls in flight; return the totals."""
        try:
            # Each pass waits up to ``block`` for requests itself: no idle sleep on top.
            self._loop.run(self.run_once, idle_sleep=0.0, max_passes=max_passes,
                           handle_signals=handle_signals, until_idle=False)
        finally:
            finish_executors(self.executors, self.stats)
        return self.stats

    def run_once(self) -> PassResult:
        """One pass: answer the requests waiting (up to ``batch``, waiting up
        to ``block`` seconds for one), apply what waits, pump the executors.
        Its ``wake_in`` is always 0.0: the next pass waits for requests
        itself (:class:`~reliable_flow.records.PassResult`)."""
        work = 0
        try:
            work += self._serve()
        except Exception as exc:  # noqa: BLE001 - recorded; the next pass tries again
            self._failed("requests", denied(self.url, f"bridge for consumer {self.consumer.name!r}", exc) or exc)
            if not self.stopping and isinstance(exc, (ConnectionError, redis.RedisError)):
                self._loop.idle(min(self.block, 0.5))  # the server is away: do not spin
        if not self.stopping:
            work += apply_open_flows(self.consumer, self.apply_limit, self.stats, self._failed,
                                     lambda: self.stopping)
        work += pump_executors(self.executors, self.apply_limit, self.stats, self._failed, lambda: self.stopping)
        self._busy = work > 0
        self.stats.passes += 1
        if self._on_pass is not None:
            self._on_pass(self.stats)
        return PassResult(work, 0.0)

    def _serve(self) -> int:
        if time.monotonic() - self._announced_at >= ANNOUNCE_EVERY:
            self._setup()
        asked = self._ask()
        entries = self._read(waits=not asked)
        if not entries:
            return asked
        return asked + self._answer(entries)

    def _ask(self) -> int:
        """Answer the operators' questions waiting (never blocks)."""
        if self._questions is None:
            return 0
        asked = self._questions.serve()
        self.stats.asked, self.stats.acted = self._questions.asked, self._questions.acted
        return asked

    def _read(self, *, waits: bool = True) -> list[Any]:
        """Requests to answer: first those this name held when it stopped,
        then any another bridge left unacknowledged for ``claim_after``
        seconds, then new ones (waiting up to ``block`` for a request or a
        question, when ``waits``)."""
        before = self._reader.reclaimed
        wait = self._wait_ms() if waits else None
        if self._questions is None or wait is None:
            entries = self._reader.read(wait)
        else:  # one wait for both streams: a question is answered as soon as it comes
            entries = self._reader.read(None)
            if not entries and self._reader.wait_either(self._questions.reader, wait):
                entries = self._reader.read(None)
        self.stats.reclaimed += self._reader.reclaimed - before
        return entries

    def _wait_ms(self) -> int | None:
        """How long a read waits for a request: not at all after a pass that
        did work (applies or effects may be due right away, as in a Worker),
        briefly while effect calls are in flight (to record them as they
        end), else ``block``."""
        if self._busy:
            return None  # XREADGROUP without BLOCK: answers at once
        if any(e.in_flight for e in self.executors):
            return max(1, int(min(self.block, 0.02) * 1000))
        return max(1, int(self.block * 1000))

    def _answer(self, entries: list[Any]) -> int:
        """Refuse the malformed, drop the expired, receive the rest in one
        transaction, answer every request, then acknowledge them all.

        Each body is parsed once, by the inbox's receive; only when that
        finds a body that is no envelope are the requests' bodies looked at
        one by one, to refuse those requests and receive the others."""
        now = time.time()
        good: list[tuple[int, Any, dict[str, str], wire.Request]] = []
        refused: list[tuple[int, Any, wire.BadMessage, dict[str, str]]] = []
        done: list[Any] = []  # acknowledged at the end, after every answer is written
        answers: list[tuple[str, dict[str, str]]] = []
        uid, location = self.consumer.uid, self.consumer.location
        for index, entry in enumerate(entries):
            self.stats.requests += 1
            entry_id = entry[0]
            done.append(entry_id)
            raw: dict[str, str] = {}
            try:
                raw = wire.decode(fields_of(entry))
                request = self._checked(raw)
            except wire.BadMessage as exc:
                refused.append((index, entry_id, exc, raw))
                continue
            if request.deadline <= now:
                self.stats.expired += 1
                continue
            if request.uid != uid:
                answers.append((request.reply, wire.error_fields(request.id, uid, location, _mismatch(
                    self.consumer, request.uid))))
                continue
            good.append((index, entry_id, raw, request))
        if good:
            try:
                answers.extend(self._receive([g[3] for g in good], uid, location, strict=True))
            except InvalidEnvelope:  # a body is no envelope: refuse its request, receive the others
                fine = []
                for index, entry_id, raw, request in good:
                    bad = _bad_body(request)
                    if bad is None:
                        fine.append((index, entry_id, raw, request))
                    else:
                        refused.append((index, entry_id, bad, raw))
                good = fine
                answers.extend(self._receive([g[3] for g in good], uid, location, strict=False))
        for _index, entry_id, why, raw in sorted(refused, key=lambda r: r[0]):  # recorded in the stream's order
            self._malformed(entry_id, why, raw, answers, uid, location)
        self._finish(answers, done)
        return len(good)

    def _checked(self, raw: dict[str, str]) -> wire.Request:
        """The request, its reply address one of this consumer's (its bodies
        are parsed by the receive)."""
        request = wire.parse_request(raw)
        if not request.reply.startswith(self.keys.replies + ":"):
            raise wire.BadMessage("reply", "not a reply stream of this consumer")
        return request

    def _receive(self, requests: list[wire.Request], uid: str, location: str, *,
                 strict: bool) -> list[tuple[str, dict[str, str]]]:
        """One inbox transaction for every body of ``requests``; the answers.
        ``strict``: a body that is no envelope raises ``InvalidEnvelope``
        (nothing stored) instead of being answered as a failed receive."""
        if not requests:
            return []
        bodies = [b for r in requests for b in r.bodies]
        try:
            results = self._receiver.accept_many(bodies)
        except Exception as exc:  # answered (nothing stored), recorded, retried by the sender
            if strict and isinstance(exc, InvalidEnvelope):
                raise
            self._failed("receive", exc)
            return [(r.reply, wire.error_fields(r.id, uid, location, exc)) for r in requests]
        out: list[tuple[str, dict[str, str]]] = []
        start = 0
        for r in requests:
            mine: list[ReceiveResult] = results[start:start + len(r.bodies)]
            start += len(r.bodies)
            for result in mine:
                self.stats.received[result.status.value] += 1
                if result.applied:
                    self.stats.applied += 1
            out.append((r.reply, wire.answer_fields(r.id, uid, location, mine)))
        return out

    def _finish(self, answers: list[tuple[str, dict[str, str]]], done: list[Any]) -> None:
        """Write the answers, then acknowledge the requests (one round trip)."""
        self._reader.finish(f"bridge for consumer {self.consumer.name!r}", answers, done)
        self.stats.answered += len(answers)

    def _malformed(self, entry_id: Any, exc: wire.BadMessage, raw: dict[str, str],
                   answers: list[tuple[str, dict[str, str]]], uid: str, location: str) -> None:
        """Record a refused message; answer it when it says where to."""
        self.stats.malformed += 1
        text = f"{exc}"
        self.stats.last_malformed = text
        entry = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        if WORKER.isEnabledFor(WARNING):
            log(WORKER, WARNING, "malformed request refused",
                fields(consumer=self.consumer.name, entry=entry, error=text))
        talking(self.url, "recording a refused request", lambda: self._client.xadd(
            self.keys.refused, {"entry": entry, "error": text[:1024], "at": repr(time.time())},
            maxlen=MAX_REFUSED_KEPT, approximate=True))
        reply, request_id = raw.get("reply", ""), raw.get("id", "")
        if reply.startswith(self.keys.replies + ":") and request_id and len(request_id) <= 1024:
            answers.append((reply, wire.error_fields(request_id, uid, location, InvalidEnvelope(exc.field,
                                                                                             exc.problem))))

    def _failed(self, where: str, exc: Exception) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{where}: {type(exc).__name__}: {exc}"
        if WORKER.isEnabledFor(WARNING):
            log(WORKER, WARNING, f"bridge error in {where}, going on",
                fields(status="error", consumer=self.consumer.name, where=where,
                       error=f"{type(exc).__name__}: {exc}"))
        if isinstance(exc, CANNOT_HEAL):
            raise exc

    def close(self) -> None:
        """Drop the connection to Redis (the consumer stays open: it is the caller's)."""
        self._client.close()

    def __enter__(self) -> Bridge:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Bridge({self.consumer!r}, {shown(self.url)!r})"


def _bad_body(request: wire.Request) -> wire.BadMessage | None:
    """The first body of ``request`` that is no event envelope, as a refusal; None when all are."""
    for i, body in enumerate(request.bodies):
        try:
            parse_body(body)
        except InvalidEnvelope as exc:
            return wire.BadMessage(f"bodies[{i}]", str(exc))
    return None


def _mismatch(consumer: Consumer, wanted: str) -> ReliableFlowError:
    from ...errors import ConsumerMismatch

    return ConsumerMismatch(
        f"consumer {consumer.name!r} at {consumer.location} has storage uid {consumer.uid}, but the request "
        f"was for uid {wanted}: another storage serves this name. Give each consumer storage its own name."
    )
