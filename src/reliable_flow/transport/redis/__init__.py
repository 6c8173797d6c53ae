"""The Redis transport (the extra ``.[redis]``): a relay on one host
delivers to a consumer on another through a Redis server.

* :class:`RedisReceiver` (the producer's side): a
  :class:`~reliable_flow.Receiver` for ``relay`` / ``relay_batch`` /
  ``Worker``; each ``accept_many`` is one request on the consumer's stream,
  answered by the consumer's own inbox.
* :class:`Bridge` (the consumer's side; ``reliable-flow bridge``): reads
  the requests through a consumer group, receives (and applies) them,
  answers, and acknowledges each request only after the inbox commit.
* :class:`RemoteProducer` (an executor's side): a producer on another
  host that effects' results and failures are fed back into;
  :class:`ProducerServer` (the producer's side, run by
  ``Worker(serve_as=NAME)``) advances them there.

Redis is never the authority: it needs no persistence, and a request or an
answer it loses is a failed send, retried from the producer's outbox.  See
docs/transport.md for every failure window.
"""

from __future__ import annotations

try:
    import redis as _redis  # noqa: F401 - the client this transport needs
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "reliable_flow.transport.redis needs the redis client: pip install 'reliable_flow[redis]'"
    ) from exc

from ._bridge import Bridge, BridgeStats
from ._producer import ProducerServer, RemoteProducer
from ._receiver import RedisReceiver

__all__ = ["Bridge", "BridgeStats", "ProducerServer", "RedisReceiver", "RemoteProducer"]
