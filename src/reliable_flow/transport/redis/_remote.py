"""A consumer on another host, read (and acted on) through its bridge
(issue 31, item 6): what ``reliable-flow inspect PRODUCER
redis://host:6379/0#NAME``, the console and the operator commands open for
a consumer location on Redis.

:class:`RemoteInbox` stands where the tools open a consumer's store read
only (:func:`reliable_flow._tools.stores.open_consumer`): its read views
send each read (a method of :data:`~reliable_flow.transport._read_wire.READS`
and its arguments) as a question on ``<prefix>:{NAME}:questions``, and the
bridge serving the consumer answers it from the consumer's store on its
host (:mod:`._questions`).  Each read is answered in a read transaction of
its own, so a read view is not one snapshot (as ``latest`` is not).  No
answer before the deadline: a :class:`~reliable_flow.errors.TransportError`
naming the location, never a hang.  An answer that is not one of this
version is refused, never trusted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..._envelope import check_name
from ...errors import (
    ConsumerMismatch,
    NotResolvable,
    TransportError,
    UnknownEffect,
    UnknownEvent,
    WrongFile,
)
from ...records import OperatorAction
from .. import _read_wire as rw
from .. import _wire as wire
from ._connect import Keys, check_url, connect, fields_of, shown, talking

__all__ = ["DEFAULT_TIMEOUT", "RemoteInbox", "RemoteReads", "split_location"]

#: Seconds a question waits for the bridge's answer.
DEFAULT_TIMEOUT = 5.0
#: Questions kept waiting for a bridge (a stopped one's grow no further).
MAX_WAITING = 1000
#: The far side's refusals raised as the same errors here (the tools tell them apart).
_ERRORS: dict[str, type[Exception]] = {
    "NotResolvable": NotResolvable, "UnknownEffect": UnknownEffect, "UnknownEvent": UnknownEvent,
    "ConsumerMismatch": ConsumerMismatch, "ValueError": ValueError, "TypeError": TypeError,
    "InvalidEnvelope": ValueError,
}


def split_location(location: str) -> tuple[str, str]:
    """``redis://host:port/db#NAME`` as the URL and the consumer's name; a
    ValueError naming ``consumer`` when the name is missing."""
    url, hashed, name = location.rpartition("#")
    if not hashed or not name:
        raise ValueError(f"consumer: a consumer on Redis is redis://host:port/db#NAME, got {shown(location)!r}")
    check_url(url)
    try:
        check_name("consumer", name)
    except ValueError as exc:
        raise ValueError(f"consumer: {exc}") from None
    return url, name


class RemoteInbox:
    """The consumer ``NAME`` served by a bridge on the Redis server of
    ``location`` (``redis://host:port/db#NAME``): read views that ask the
    bridge (:meth:`read`, :attr:`latest`) and :meth:`act_remotely` for an
    operator action run and recorded on the consumer's host.  Nothing is
    written from here: :meth:`write` refuses.  ``timeout``: seconds a
    question waits for its answer (default :data:`DEFAULT_TIMEOUT`)."""

    def __init__(self, location: str, *, timeout: float | None = None, prefix: str = "rf") -> None:
        self.url, self.name = split_location(location)
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.keys = Keys(prefix, self.name)
        self._client = connect(self.url, timeout=self.timeout + 5.0)
        self.protocol = None  # the consumer's protocol is its host's: nothing here decodes with it
        self.uid: str | None = None  # the store's, once a read said it

    @property
    def location(self) -> str:
        return f"{shown(self.url)}#{self.name}"

    @property
    def latest(self) -> RemoteReads:
        return RemoteReads(self)

    @contextmanager
    def read(self) -> Iterator[RemoteReads]:
        yield RemoteReads(self)

    def write(self, **_: Any) -> Any:
        raise WrongFile(f"consumer {self.location} is on another host: only its host writes to it (an "
                        f"operator action goes there through its bridge)")

    def close(self) -> None:
        self._client.close()

    def reopen(self) -> None:
        self._client.close()
        self._client = connect(self.url, timeout=self.timeout + 5.0)

    def __enter__(self) -> RemoteInbox:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteInbox({self.location!r})"

    # -- asking --------------------------------------------------------------------------------

    def ask(self, method: str, args: dict[str, Any]) -> Any:
        """The answer to the read ``method`` with ``args`` (JSON-able, by name), checked."""
        return self._call("read", method, args, lambda value: rw.read_answer(method, value))

    def act_remotely(self, method: str, *, actor: str, reason: str, **args: Any) -> tuple[OperatorAction, str]:
        """Run the operator action ``method`` (of
        :data:`~reliable_flow.transport._read_wire.ACTIONS`) on the consumer's
        host, recorded there with ``actor`` and ``reason``: the record and
        its sentence, or the refusal raised as it was over there
        (``NotResolvable``, ``UnknownEffect`` ...).  Refused unless its bridge
        runs with ``allow_actions``."""
        if method not in rw.ACTIONS:
            raise ValueError(f"action must be one of {sorted(rw.ACTIONS)}, got {method!r}")
        unknown = sorted(set(args) - set(rw.ACTIONS[method]))
        if unknown:
            raise TypeError(f"{method} takes no {unknown}")
        wanted = {**{n: args.get(n, False if hint is bool else None) for n, hint in rw.ACTIONS[method].items()},
                  "actor": actor, "reason": reason}
        if self.uid is None:  # the action goes to the store the operator read: its uid is checked there
            self.uid = str(self.ask("meta", {}).get("uid") or "")
        return self._call("act", method, rw.plain(wanted), rw.action_answer)  # type: ignore[no-any-return]

    def _call(self, kind: str, method: str, args: dict[str, Any], read: Any) -> Any:
        question_id = wire.new_id()
        reply = f"{self.keys.said}:{question_id}"
        deadline = time.time() + self.timeout
        q = rw.Question(question_id, reply, deadline, kind, method, args, (self.uid or "") if kind == "act" else "")
        talking(self.url, f"asking consumer {self.name!r}", lambda: self._client.xadd(
            self.keys.questions, rw.question_fields(q), maxlen=MAX_WAITING, approximate=True))
        # The reply stream is left to expire (the bridge sets its EXPIRE): the commands of a relay's
        # ACL user suffice to ask (docs/transport.md, "Security").
        got = self._wait(reply, deadline)
        if got is None:
            raise TransportError(
                f"no bridge answered for consumer {self.name!r} on {shown(self.url)} within {self.timeout:g} s "
                f"(asked {method}): is `reliable-flow bridge` running for it, of a version that answers "
                f"questions (not started with --no-questions)?")
        try:
            uid, value, error = rw.parse_answer(wire.decode(fields_of(got)), question_id, read)
        except wire.BadMessage as exc:
            raise TransportError(f"the answer from consumer {self.location} to {method} is malformed and was "
                                 f"refused: {exc}") from None
        if error is not None:
            raise _raised(error[0], error[1])
        if kind == "read" and method == "meta" and isinstance(value, dict):
            self.uid = value.get("uid") or self.uid
        elif uid and self.uid is None:
            self.uid = uid
        return value

    def _wait(self, reply: str, deadline: float) -> Any:
        """The first entry of the reply stream ``reply``, or None at the deadline."""
        while True:
            left = deadline - time.time()
            if left <= 0:
                return None
            got = talking(self.url, f"asking consumer {self.name!r}", lambda: self._client.xread(
                {reply: "0"}, count=1, block=max(1, int(left * 1000))))  # noqa: B023 - called at once
            entries = [e for _s, es in got or () for e in es]
            if entries:
                return entries[0]


def _raised(kind: str, message: str) -> Exception:
    """The far side's error as this side raises it (``RemoteError`` for any other)."""
    from ...errors import RemoteError

    known = _ERRORS.get(kind)
    return RemoteError(kind, message) if known is None else known(message)


class RemoteReads:
    """A read view of a :class:`RemoteInbox`: each method of
    :data:`~reliable_flow.transport._read_wire.READS` asks the bridge; any
    other attribute is an ``AttributeError`` (nothing else is served)."""

    def __init__(self, store: RemoteInbox) -> None:
        self._store = store

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_") or method not in rw.READS:
            raise AttributeError(f"a consumer on another host answers only the reads "
                                 f"{', '.join(rw.READS)}; not {method!r}")

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._store.ask(method, rw.call_args(method, args, kwargs))

        call.__name__ = method
        return call
