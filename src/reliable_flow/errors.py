"""Every exception reliable_flow raises on purpose.

A status (``duplicate``, ``stale``, ``gap`` ...) is an answer; an exception
means the call could not give one: the input was malformed, or the storage
failed.  The classes do not depend on a storage engine: a storage error
keeps the engine driver's own exception (``sqlite3.Error`` today) chained as
``__cause__`` (``raise ... from``), so any engine's failures fit this tree.

::

    ReliableFlowError
     +-- InvalidEnvelope (also ValueError)     bad input; nothing was stored
     +-- UnknownEvent (also LookupError)       relay(event_id=...) names no outbox event
     +-- UnknownConsumer (also LookupError)    a consumer name the producer has not registered
     +-- WrongFile                             not a file of the expected kind
     |    +-- SchemaTooNew                     written by a newer reliable_flow
     +-- ConsumerMismatch                      two consumer files share one name
     +-- NotResolvable (also ValueError)       operator action on something in the wrong state
     +-- TopicError (also ValueError)          a topic or subscription refused (unknown, renamed, 2nd commander)
     +-- EffectKeyConflict (also ValueError)   an effect key reused for another effect
     +-- UnknownEffect (also LookupError)      no such effect (name not registered, key not stored)
     +-- ScheduleConflict (also ValueError)    a schedule name already stored with another definition
     +-- UnknownSchedule (also LookupError)    no recurring schedule of that name is stored
     +-- LeaseLost                             call.heartbeat() after the executor lost the claim
     +-- SQLiteTooOld                          linked SQLite is older than 3.24
     +-- WrongProcess                          object used after fork()
     +-- WrongThread                           object used in a thread other than its opener's
     +-- TransportError (also ConnectionError) a transport carried no answer; nothing taken as accepted
     |    +-- RemoteError                      the far side's receive raised (its error in the message)
     |    +-- TransportDenied                  the broker refused us (password, ACL, protected mode)
     +-- StorageError                          the storage engine failed underneath us
          +-- StorageFull                      disk or database full; nothing written
          +-- ReadOnlyStorage                  the store cannot be written; nothing written
          +-- DatabaseBusy                     write lock held through every retry
          |    +-- TransactionConflict         aborted to break a deadlock / serialization conflict
          +-- CommitOutcomeUnknown             COMMIT itself failed
"""

from __future__ import annotations

__all__ = [
    "CommitOutcomeUnknown",
    "ConsumerMismatch",
    "DatabaseBusy",
    "EffectKeyConflict",
    "InvalidEnvelope",
    "LeaseLost",
    "NotResolvable",
    "ReadOnlyStorage",
    "ReliableFlowError",
    "RemoteError",
    "SQLiteTooOld",
    "ScheduleConflict",
    "SchemaTooNew",
    "StorageError",
    "StorageFull",
    "TopicError",
    "TransactionConflict",
    "TransportDenied",
    "TransportError",
    "UnknownConsumer",
    "UnknownEffect",
    "UnknownEvent",
    "UnknownSchedule",
    "WrongFile",
    "WrongProcess",
    "WrongThread",
]


class ReliableFlowError(Exception):
    """Root of every exception this package raises on purpose."""


class InvalidEnvelope(ReliableFlowError, ValueError):
    """An envelope or an argument broke the envelope rules.

    ``field`` names the offending field, dotted for nested ones
    (``payload.amount``, ``meta.trace``); ``envelope`` means the whole
    input (not an object, not JSON, too large).  Nothing was stored.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class UnknownEvent(ReliableFlowError, LookupError):
    """An explicit ``event_id`` that is not in the producer's outbox."""


class UnknownConsumer(ReliableFlowError, LookupError):
    """A consumer name the producer has not registered.

    ``relay`` / ``relay_batch`` / ``Worker`` refuse it, so a typo'd name does
    not silently start a second delivery state from the first event.  Register
    it with ``producer.admin.register_consumer`` or pass ``register=True``.  The
    first consumer of a producer that has none is registered implicitly.
    """


class WrongFile(ReliableFlowError):
    """The path is not a reliable_flow file of the kind that was asked for.

    Raised before anything is written: a foreign file is never converted.
    """


class SchemaTooNew(WrongFile):
    """The file was written by a newer reliable_flow than this one."""


class ConsumerMismatch(ReliableFlowError):
    """A consumer's name is already bound, in the producer, to another file.

    Delivery state is kept per consumer name; letting a second file use the
    name would make events look accepted by a file that never stored them.
    """


class NotResolvable(ReliableFlowError, ValueError):
    """An operator action names something whose state does not allow it: an
    event's delivery or inbox state, a consumer name already registered."""


class TopicError(ReliableFlowError, ValueError):
    """A topic declaration or a subscription is refused (nothing stored): an
    unknown topic, a second subscriber of a command topic, a topic renamed
    or dropped while consumers subscribe to it.  The message names the topic
    (and the consumers concerned)."""


class EffectKeyConflict(ReliableFlowError, ValueError):
    """An apply handler scheduled an effect under a key that another effect
    (another name, payload or event) already holds.  The apply rolls back."""


class UnknownEffect(ReliableFlowError, LookupError):
    """An effect name that is not registered, or a key that is not stored."""


class ScheduleConflict(ReliableFlowError, ValueError):
    """A recurring schedule (``EffectRegistry.every``) is declared under a
    name the consumer's store already holds with another definition (effect,
    payload, interval or cron, time zone, missed): refused when the executor
    opens, nothing changed.  An operator's ``remove_schedule`` lets the new
    definition be recorded by the next executor that opens."""


class UnknownSchedule(ReliableFlowError, LookupError):
    """No recurring schedule of that name is stored in the consumer's store."""


class LeaseLost(ReliableFlowError):
    """Raised by ``EffectCall.heartbeat()`` once the executor knows the claim
    on the effect is no longer its own (its lease ran out and another
    executor took the effect up, or an operator acted on it): stop the work.
    Whatever the call returns afterwards is discarded, not recorded."""


class TransportError(ReliableFlowError, ConnectionError):
    """A transport (``reliable_flow.transport``) could not carry a request
    or its answer: the broker is unreachable, or no answer came before the
    request's deadline.  Nothing is taken as accepted: the relay records a
    failed send and retries after its backoff, and the consumer's inbox
    answers ``duplicate`` for what had arrived after all.  The message names
    the broker's URL and the consumer."""


class RemoteError(TransportError):
    """The consumer's side answered that its receive raised (its storage
    failed, or the request was malformed): ``remote_type`` is the name of
    the exception over there, and the message its text.  Nothing was stored
    by that request."""

    def __init__(self, remote_type: str, message: str) -> None:
        super().__init__(f"{remote_type}: {message}")
        self.remote_type = remote_type


class TransportDenied(TransportError):
    """The broker refused this client rather than failing to answer: a
    wrong or missing password or ACL user, an ACL user without a command
    the transport needs (``NOPERM``), or a Redis server in protected mode
    refusing clients from other hosts.  Retrying cannot heal it: a
    ``Worker`` or ``Bridge`` records it and raises it (the commands exit 2).
    The message names the server's URL without its password."""


class SQLiteTooOld(ReliableFlowError):
    """The sqlite3 module is linked against SQLite older than 3.24."""


class WrongProcess(ReliableFlowError):
    """A Producer or Consumer was used in a process other than its opener.

    SQLite connections must not cross ``fork()``.  Call ``reopen()`` in the
    child to get a fresh connection there.
    """


class WrongThread(ReliableFlowError):
    """A Producer or Consumer was used in a thread other than the one that opened it.

    A SQLite connection belongs to the thread that made it: use one object
    per thread (each thread opens its own object on the same file).
    """


class StorageError(ReliableFlowError):
    """The storage engine failed underneath an operation; the transaction
    was rolled back.

    The driver's original exception (e.g. :class:`sqlite3.Error`) is chained
    as ``__cause__``.
    """


class StorageFull(StorageError):
    """The disk (or ``PRAGMA max_page_count``) is full.  Nothing was written;
    retry once space is back."""


class ReadOnlyStorage(StorageError):
    """The file cannot be written (read-only mount, ``mode=ro``, ``query_only``).
    Nothing was written."""


class DatabaseBusy(StorageError):
    """Another connection held the write lock through the busy timeout and
    every retry.  Nothing was written; the call can be retried."""


class TransactionConflict(DatabaseBusy):
    """The engine aborted the transaction to break a lock cycle (a deadlock)
    or a serialization conflict with a concurrent one (PostgreSQL; SQLite's
    single writer has none).  Nothing of it was written.  The library re-runs
    the transactions it owns a few times before raising this; a
    ``producer.batch()`` that raises it wrote nothing and can be redone."""


class CommitOutcomeUnknown(StorageError):
    """COMMIT itself failed, so the write may or may not be durable.

    Retrying the same call with the same event id is safe: the retry returns
    ``existing`` / ``duplicate`` / the already-applied state if the first
    attempt did reach the disk, and does the work once if it did not.
    """
