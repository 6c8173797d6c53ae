"""The consumer's application for ``test_transport_faults.py``: what the
bridge loads with ``--handlers children.transport_app:HANDLERS --effects
children.transport_app:EFFECTS``.

Not collected by pytest.  Every applied event schedules one effect,
``call_service``, keyed by the library (one key per event), that calls the
fake external service (``fake_service.py``, started by the test) on the Unix
socket named by ``$RF_TRANSPORT_SERVICE``.  Doubt (no answer in time, the
bridge killed during a call) is settled by ``reconcile=`` asking the
service whether the key was performed, so the service must see every key
performed exactly once: the effect outbox's exactly-once, over the
transport.  The calls are ``effect_kill_worker``'s (its client
``_exchange``: ``{"error"}`` is ``RetryLater``, no answer in time is
``OutcomeUnknown``), with longer timeouts (:data:`CALL_TIMEOUT`,
:data:`STATUS_TIMEOUT`: the bridge shares two cores with everything else);
the bridge's ``--effect-lease`` must be longer than both
(:data:`EFFECT_LEASE`).

Only ``reliable_flow`` and the other children are imported.
"""

from __future__ import annotations

import os
import time
from typing import Any

from reliable_flow._effects import EffectCall, EffectRegistry, Happened, NotHappened
from reliable_flow._handlers import ApplyContext

try:  # as the bridge imports it (tests/ on PYTHONPATH) and as a sibling script
    from children import effect_kill_worker as _service
except ImportError:  # pragma: no cover
    import effect_kill_worker as _service  # type: ignore[no-redef]

EFFECT = _service.EFFECT
CALL_TIMEOUT = 0.3  # a perform's deadline at the service
STATUS_TIMEOUT = 0.3  # a reconcile's
#: The bridge's ``--effect-lease``: longer than a call's and a reconcile's timeout.
EFFECT_LEASE = 1.5
MAX_ATTEMPTS = 1_000_000  # kills and "retry" answers must never exhaust an effect
SOCKET_ENV = "RF_TRANSPORT_SERVICE"


def schedule_call(ctx: ApplyContext) -> None:
    """The apply handler: every applied step schedules one call of the service."""
    ctx.schedule(EFFECT, {"flow": ctx.event.flow_id, "seq": ctx.event.seq, "step": ctx.event.kind})


def _effects() -> EffectRegistry:
    socket_path = os.environ.get(SOCKET_ENV)
    if not socket_path:
        raise RuntimeError(f"${SOCKET_ENV} must name the fake service's socket")
    owner = f"bridge-{os.getpid()}"

    def call_service(call: EffectCall) -> Any:
        request = {"op": "perform", "key": call.key, "payload": call.payload, "attempt": call.attempt,
                   "owner": owner, "deadline": time.monotonic() + CALL_TIMEOUT}
        answer = _service._exchange(socket_path, request, CALL_TIMEOUT)
        if "error" in answer:  # "retry" or "deadline": the service did nothing
            raise _service.RetryLater(f"service answered {answer['error']}")
        return answer["result"]

    def was_performed(call: EffectCall) -> Happened | NotHappened:
        answer = _service._exchange(socket_path, {"op": "status", "key": call.key, "attempt": call.attempt,
                                                  "owner": owner}, STATUS_TIMEOUT)
        return Happened(answer["result"]) if answer["performed"] else NotHappened()

    effects = EffectRegistry()
    effects.register(EFFECT, call_service, reconcile=was_performed, max_attempts=MAX_ATTEMPTS)
    return effects


HANDLERS = [schedule_call]


def __getattr__(name: str) -> Any:
    """``EFFECTS``, built on first use (the test imports this module for its constants)."""
    if name == "EFFECTS":
        effects = globals()["EFFECTS"] = _effects()
        return effects
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
