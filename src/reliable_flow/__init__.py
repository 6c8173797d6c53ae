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

from . import errors, records, statuses
from ._consumer import Consumer, ConsumerAdmin
from ._effects import (
    EffectCall,
    EffectRegistry,
    Feedback,
    Happened,
    NotHappened,
    OutcomeUnknown,
    PermanentFailure,
    RetryLater,
)
from ._effects.executor import EffectExecutor
from ._handlers import ApplyContext, AppSchema, Event
from ._producer import Producer
from ._producer_admin import ProducerAdmin
from ._receiver import Receiver
from ._relay import DeliveryPolicy, relay, relay_batch
from ._store.open import PostgresLocation
from ._tools.snapshot import snapshot
from ._topics import Topic
from ._worker import Worker
from .errors import ReliableFlowError
from .protocol import PayloadError, Protocol
from .statuses import (
    AdvanceStatus,
    ApplyStatus,
    BlockReason,
    DeliveryState,
    EffectState,
    InboxState,
    ReceiveStatus,
    RelayStatus,
)

__version__ = "0.1.0"

# What a user writes daily; at most 40 names (issue 19).  Results and records
# are in ``reliable_flow.records``, every error in ``reliable_flow.errors``,
# every status enum in ``reliable_flow.statuses``.  Sorted, and pinned by
# tests/test_public_api.py.
__all__ = [
    "AdvanceStatus", "AppSchema", "ApplyContext", "ApplyStatus", "BlockReason", "Consumer",
    "ConsumerAdmin", "DeliveryPolicy", "DeliveryState", "EffectCall", "EffectExecutor", "EffectRegistry",
    "EffectState", "Event", "Feedback", "Happened", "InboxState", "NotHappened", "OutcomeUnknown",
    "PayloadError", "PermanentFailure", "PostgresLocation", "Producer", "ProducerAdmin", "Protocol",
    "ReceiveStatus", "Receiver", "RelayStatus", "ReliableFlowError", "RetryLater", "Topic", "Worker",
    "__version__", "errors", "records", "relay", "relay_batch", "snapshot", "statuses",
]
