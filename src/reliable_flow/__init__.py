"""reliable_flow: flow state and its events, committed, accepted and applied
in order, across two SQLite files (or PostgreSQL schemas, with the postgres
extra), surviving a process exit at any line.

Quick tour::

    from reliable_flow import Producer, Consumer, relay
    from reliable_flow.reservation import RESERVATION

    producer = Producer("producer.db", RESERVATION)
    consumer = Consumer("consumer.db", RESERVATION)
    producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    relay(producer, consumer)       # accepted: the consumer owns the event now
    consumer.apply_next("A")        # applied: projection + effect, once
"""

from __future__ import annotations

from typing import Any

from .consumer import Consumer
from .effects import (
    EffectCall,
    Effects,
    Feedback,
    Happened,
    NotHappened,
    OutcomeUnknown,
    PermanentFailure,
    RetryLater,
)
from .errors import *  # every public error, as listed in errors.__all__
from .executor import EffectExecutor, ExecutorStats
from .handlers import ApplyContext, AppSchema, Event
from .operations import (
    ConsumerEntry,
    FlowWait,
    InboxAction,
    InboxRow,
    PruneResult,
    RegistryAction,
    StuckFlow,
)
from .producer import Producer
from .protocol import PayloadError, Protocol
from .receiver import Receiver
from .relay import DeliveryPolicy, relay, relay_batch
from .statuses import *  # every status, result and record, as in statuses.__all__
from .store.open import PostgresLocation
from .tools.snapshot import snapshot
from .worker import Worker, WorkerStats

__version__ = "0.1.0"

# Sorted, and pinned by tests/test_public_api.py.
__all__ = [
    "AdvanceResult", "AdvanceStatus", "AppSchema", "ApplyContext", "ApplyResult", "ApplyStatus",
    "BlockReason", "CommitOutcomeUnknown", "Consumer", "ConsumerEntry", "ConsumerMismatch", "DatabaseBusy",
    "DeliveryPolicy", "DeliveryRecord", "DeliveryState", "DrainResult", "DrainStop", "Effect",
    "EffectAction", "EffectCall", "EffectExecutor", "EffectKeyConflict", "EffectRecord",
    "EffectState", "Effects", "Event", "ExecutorStats", "Feedback", "FlowWait", "Happened", "InboxAction", "InboxEntry",
    "InboxRow", "InboxState", "InvalidEnvelope", "NotHappened", "NotResolvable",
    "OperatorAction", "OutboxEntry", "OutcomeUnknown", "PayloadError", "PermanentFailure", "PostgresLocation",
    "Producer", "Protocol", "PruneResult", "ReadOnlyStorage", "ReceiveResult", "ReceiveStatus", "Receiver",
    "RegistryAction", "RelayBatchResult", "RelayResult", "RelayStatus", "ReliableFlowError",
    "RetryLater", "SQLiteTooOld", "SchemaTooNew", "StorageError", "StorageFull", "StuckFlow",
    "TransactionConflict", "UnknownConsumer", "UnknownEffect", "UnknownEvent", "Worker", "WorkerStats", "WrongFile", "WrongProcess", "WrongThread",
    "__version__", "relay", "relay_batch", "snapshot",
]



def __getattr__(name: str) -> Any:
    if name in ("InboxFull", "Refused"):  # deprecated, for one release
        from .deprecated import old_name

        return old_name(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
