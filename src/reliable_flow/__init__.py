"""reliable_flow: flow state and its events, committed, accepted and applied
in order, across two SQLite files, surviving a process exit at any line.

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

from .consumer import Consumer
from .errors import (
    CommitOutcomeUnknown,
    ConsumerMismatch,
    InvalidEnvelope,
    ReliableFlowError,
    SchemaTooNew,
    SQLiteTooOld,
    StorageError,
    UnknownEvent,
    WrongFile,
    WrongProcess,
)
from .producer import Producer
from .protocol import PayloadError, Protocol
from .relay import relay
from .snapshot import snapshot
from .statuses import (
    AdvanceResult,
    AdvanceStatus,
    ApplyResult,
    ApplyStatus,
    BlockReason,
    DeliveryState,
    DrainResult,
    DrainStop,
    InboxState,
    ReceiveResult,
    ReceiveStatus,
    RelayResult,
    RelayStatus,
)

__version__ = "0.1.0"

__all__ = [
    "AdvanceResult",
    "AdvanceStatus",
    "ApplyResult",
    "ApplyStatus",
    "BlockReason",
    "CommitOutcomeUnknown",
    "Consumer",
    "ConsumerMismatch",
    "DeliveryState",
    "DrainResult",
    "DrainStop",
    "InboxState",
    "InvalidEnvelope",
    "PayloadError",
    "Producer",
    "Protocol",
    "ReceiveResult",
    "ReceiveStatus",
    "RelayResult",
    "RelayStatus",
    "ReliableFlowError",
    "SQLiteTooOld",
    "SchemaTooNew",
    "StorageError",
    "UnknownEvent",
    "WrongFile",
    "WrongProcess",
    "__version__",
    "relay",
    "snapshot",
]
