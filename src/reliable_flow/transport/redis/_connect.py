"""The Redis side of the transport: the client, the key names, and errors
that name the server."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from ..._envelope import check_name
from ...errors import InvalidEnvelope, TransportDenied, TransportError

__all__ = ["Keys", "check_key_part", "check_url", "connect", "denied", "shown", "talking"]

_T = TypeVar("_T")
_SCHEMES = ("redis", "rediss", "unix")


def check_url(url: object) -> str:
    """A Redis URL (``redis://host:port/db``, ``rediss://...``,
    ``unix:///path/to/socket?db=0``); a ValueError naming ``url`` otherwise."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"url must be a Redis URL (redis://host:port/db or unix:///path), got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"url must start with redis://, rediss:// or unix://, got {shown(url)!r}")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"url: a unix:// URL needs the socket's path, got {shown(url)!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"url: no host in {shown(url)!r}")
    return url


def check_key_part(name: str, value: object) -> str:
    """An argument that becomes part of a Redis key (``prefix``, a bridge's
    ``name``): 1-128 characters, no control characters; a ValueError naming
    the argument otherwise (it is no envelope field: not ``InvalidEnvelope``)."""
    try:
        return check_name(name, value)
    except InvalidEnvelope as exc:
        raise ValueError(f"{name} {exc.problem}, got {value!r}"[:300]) from None


def shown(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def connect(url: str, *, timeout: float) -> Any:
    """A client for ``url`` (connecting lazily); socket operations time out
    after ``timeout`` s.  Typed ``Any``: the client's answers are checked
    field by field (:mod:`reliable_flow.transport._wire`), not trusted by type."""
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                health_check_interval=0, retry_on_timeout=False)


def talking(url: str, what: str, call: Callable[[], _T]) -> _T:
    """``call()``, with a failure to reach the server raised as a
    :class:`TransportError` naming it, and a refusal (credentials, ACL,
    protected mode) as a :class:`TransportDenied` (see :func:`denied`)."""
    try:
        return call()
    except (redis.RedisError, OSError) as exc:
        refused = denied(url, what, exc)
        if refused is not None:
            raise refused from exc
        if not isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
            raise
        detail = str(exc).rstrip(". ")
        where = f"{what}: " if what else ""
        raise TransportError(f"{where}cannot reach Redis at {shown(url)} ({type(exc).__name__}: {detail})") from exc


def denied(url: str, what: str, exc: BaseException) -> TransportDenied | None:
    """``exc`` as a :class:`TransportDenied` (one sentence naming the URL
    without its password) when it is the server refusing this client: a
    wrong or missing password or user (``WRONGPASS``, ``NOAUTH``), an ACL
    user without the command (``NOPERM``), protected mode (``DENIED``);
    else None: retrying may heal it."""
    text = str(exc)
    first = text.split(". ")[0].rstrip(". ")
    where = f"{what}: " if what else ""
    if text.startswith("NOAUTH") or "must be called with the client already authenticated" in text:
        reason = "requires a password (or an ACL user and its password) and the URL gives none"
    elif isinstance(exc, redis.AuthenticationError) or text.startswith("WRONGPASS"):
        reason = f"refused the password or ACL user the URL gives ({first})"
    elif isinstance(exc, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        reason = f"refused a command the transport needs to the URL's ACL user ({first}; see docs/transport.md)"
    elif text.startswith("DENIED") or "protected mode" in text:
        reason = ("is in protected mode and refuses clients from other hosts while its default user has no "
                  "password (set a password or an ACL user, or bind and firewall it and turn protected-mode off)")
    else:
        return None
    return TransportDenied(f"{where}Redis at {shown(url)} {reason}")


class Keys:
    """The Redis keys of one consumer name: its request stream, the hash
    its bridges announce the consumer's storage in, the stream of refused
    messages, the summary of the effects that owe a producer a step
    (:mod:`._owed`), the prefix of reply streams, and the stream of
    operators' questions and its replies' prefix (:mod:`._questions`)."""

    def __init__(self, prefix: str, consumer: str) -> None:
        base = f"{prefix}:{{{consumer}}}"  # one hash slot per consumer (Redis Cluster)
        self.requests = f"{base}:requests"
        self.consumer = f"{base}:consumer"
        self.refused = f"{base}:refused"
        self.owed = f"{base}:owed"
        self.replies = f"{base}:answers"
        self.questions = f"{base}:questions"
        self.said = f"{base}:said"

    def reply(self, receiver_id: str) -> str:
        return f"{self.replies}:{receiver_id}"


def fields_of(entry: Any) -> dict[Any, Any]:
    """The field map of one stream entry ``(id, fields)``."""
    return dict(entry[1]) if entry[1] else {}
