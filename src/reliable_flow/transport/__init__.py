"""Transports: carry a relay's requests to a consumer on another host, and
its answers back, over a broker that is never the authority.

* :mod:`reliable_flow.transport.redis` (the extra ``.[redis]``):
  :class:`~reliable_flow.transport.redis.RedisReceiver` on the producer's
  side, :class:`~reliable_flow.transport.redis.Bridge` on the consumer's.

The producer's outbox is the durable buffer and the consumer's inbox
deduplicates by event id and body with no window, so a transport needs no
persistence, no deduplication, no ordering and no dead-letter queue of its
own: a request or answer it loses is a failed send that the relay retries.
What crosses the wire is :mod:`reliable_flow.transport._wire` (broker
neutral); a second broker is a sub-package beside ``redis`` with its own
receiver and bridge, and a fixture in the tests (see docs/transport.md).

This package imports no broker client: only its sub-packages do.
"""

__all__: list[str] = []
