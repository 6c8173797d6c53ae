"""The console's reads of one consumer and its producer, on stores it keeps
open between pages (issue 31, item 5).

Opening a store costs more than most pages' reads: on PostgreSQL a new
server process per connection, the schema's identity checked, the catalog
read again.  A :class:`Reader` opens the pair once, read only, on a thread of
its own (a store object belongs to the thread that opened it), and runs
each page's reads there, in a read transaction of their own (on PostgreSQL a
read-only snapshot): requests from the server's threads queue for it.  It
closes the stores and ends its thread after ``IDLE`` seconds without a
request, and after any read that raised (the next request opens them again:
a server restarted meanwhile is simply reconnected).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from .._core.owed import pair_refusal
from .._store import InboxReads, OutboxReads
from .._tools.stores import Location, open_consumer, open_producer, shown
from ..errors import ConsumerMismatch

__all__ = ["IDLE", "Reader"]

#: Seconds without a request before a reader closes its stores (a console
#: refreshing every 2 s keeps them open; one left alone holds no connection).
IDLE = 10.0

T = TypeVar("T")
Job = tuple[Callable[[OutboxReads, InboxReads], Any], "Future[Any]"]


class Reader:
    """Runs read functions on one producer-consumer pair, kept open."""

    def __init__(self, producer: Location, consumer: Location) -> None:
        self.producer, self.consumer = producer, consumer
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, read: Callable[[OutboxReads, InboxReads], T]) -> T:
        """``read(producer_reads, consumer_reads)``'s answer (or what it
        raised), run in one read transaction of each store; the pair is
        checked (one store's producer, the other its consumer) when opened."""
        done: Future[T] = Future()
        with self._lock:
            self._jobs.put((read, done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="console-reader", daemon=True)
                self._thread.start()
        return done.result()

    def _serve(self) -> None:
        stores: tuple[Any, Any] | None = None
        try:
            while True:
                try:
                    read, done = self._jobs.get(timeout=IDLE)
                except queue.Empty:
                    with self._lock:  # no request queued while we decide: the next one starts a thread
                        if self._jobs.empty():
                            self._thread = None
                            return
                    continue
                try:
                    if stores is None:
                        stores = self._open()
                    with stores[0].read() as p, stores[1].read() as c:
                        done.set_result(read(p, c))
                except BaseException as exc:  # noqa: BLE001 - handed to the request's thread
                    done.set_exception(exc)
                    _close(stores)
                    stores = None
        finally:
            _close(stores)

    def _open(self) -> tuple[Any, Any]:
        producer = open_producer(self.producer)
        try:
            consumer = open_consumer(self.consumer)
        except BaseException:
            producer.close()
            raise
        try:
            with producer.read() as p, consumer.read() as c:
                meta = c.meta()
                why = pair_refusal(shown(self.producer, producer), shown(self.consumer, consumer), p.consumers(),
                                   meta.get("name"), meta.get("uid"))
            if why is not None:
                raise ConsumerMismatch(why)
        except BaseException:
            _close((producer, consumer))
            raise
        return producer, consumer


def _close(stores: tuple[Any, Any] | None) -> None:
    if stores is not None:
        for store in stores:
            store.close()
