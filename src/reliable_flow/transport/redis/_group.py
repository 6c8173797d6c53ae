"""Reading a request stream through a Redis consumer group, and answering:
what the bridge (a consumer's side) and the producer server (a producer's
side) share.

A request is acknowledged only after its answer is written, so a member
killed at any line leaves it pending in the group: the same member takes
it again first on restart (its pending entries), or another member after
``claim_after`` seconds (``XAUTOCLAIM``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from ._connect import talking

__all__ = ["GroupReader"]

#: Seconds a reply stream lives after an answer is written to it (the
#: sender's own EXPIRE at send time finds no stream before the first answer).
REPLY_TTL = 600


class GroupReader:
    """One member (``member``) of ``group`` on the stream ``stream``;
    ``setup`` makes the group again when the server lost it (restarted
    empty).  ``reclaimed`` counts the entries taken over from other members."""

    def __init__(self, client: Any, url: str, stream: str, group: str, member: str, *, batch: int,
                 claim_after: float, setup: Callable[[], None]) -> None:
        self.client, self.url, self.stream, self.group, self.member = client, url, stream, group, member
        self.batch, self.claim_after, self.setup = batch, claim_after, setup
        self.own_pending = True  # after a start: first what this member held when it stopped
        self.claimed_at = float("-inf")
        self.reclaimed = 0
        self.arrived = 0  # entries wait() took for this member (it may run on another thread than read())

    def read(self, block_ms: int | None) -> list[Any]:
        """Entries to answer: this member's pending ones, then others' left
        ``claim_after`` seconds, then new ones (waiting up to ``block_ms``;
        None: not at all)."""
        client = self.client
        try:
            if self.own_pending:
                arrived = self.arrived
                got = client.xreadgroup(self.group, self.member, {self.stream: "0"}, count=self.batch)
                entries = [e for _s, es in got or () for e in es if e[1]]
                if entries:
                    return entries
                if arrived == self.arrived:  # no wait() took one meanwhile (from another thread)
                    self.own_pending = False
            # Another member's leftovers can only be claim_after old: look twice per that period.
            if time.monotonic() - self.claimed_at >= self.claim_after / 2:
                claimed = client.xautoclaim(self.stream, self.group, self.member, int(self.claim_after * 1000),
                                            count=self.batch)
                entries = [e for e in (claimed[1] if claimed else ()) if e and e[1]]
                if entries:
                    self.reclaimed += len(entries)
                    return entries  # there may be more: look again on the next pass
                self.claimed_at = time.monotonic()
            got = client.xreadgroup(self.group, self.member, {self.stream: ">"}, count=self.batch, block=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):  # the server restarted empty: make the group again
                self.setup()
                return []
            raise
        return [e for _s, es in got or () for e in es]

    def wait(self, block_ms: int) -> bool:
        """Wait up to ``block_ms`` for a new entry; True when one came (it is
        this member's now, read again by the next :meth:`read`)."""
        try:
            got = self.client.xreadgroup(self.group, self.member, {self.stream: ">"}, count=self.batch,
                                         block=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                self.setup()
                return False
            raise
        if any(es for _s, es in got or ()):
            self.arrived += 1
            self.own_pending = True
            return True
        return False

    def wait_either(self, other: GroupReader, block_ms: int) -> bool:
        """Wait up to ``block_ms`` for a new entry on this stream or on
        ``other``'s (a reader of the same group and member, on the same
        client): one wait for both; True when one came (it is this member's
        now, read again by the next :meth:`read` of its reader)."""
        try:
            got = self.client.xreadgroup(self.group, self.member, {self.stream: ">", other.stream: ">"},
                                         count=self.batch, block=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                self.setup()
                return False
            raise
        came = False
        for stream, entries in got or ():
            if entries:
                name = stream.decode() if isinstance(stream, bytes) else stream
                reader = self if name == self.stream else other
                reader.arrived += 1
                reader.own_pending = True
                came = True
        return came

    def finish(self, what: str, answers: Sequence[tuple[str, dict[str, str]]], done: Sequence[Any]) -> None:
        """Write the answers, then acknowledge and drop the entries ``done``
        (one round trip): an answered request is of no use any more."""
        def finish() -> None:
            pipe = self.client.pipeline(transaction=False)
            for reply, answer in answers:
                pipe.xadd(reply, answer, maxlen=1000, approximate=True)
                pipe.expire(reply, REPLY_TTL)  # no litter when its sender is gone for good
            if done:
                pipe.xack(self.stream, self.group, *done)
                pipe.xdel(self.stream, *done)
            pipe.execute()

        talking(self.url, what, finish)
