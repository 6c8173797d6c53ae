"""Optional OpenTelemetry spans (``pip install reliable_flow[otel]``).

When ``opentelemetry`` (the API package) is importable, ``advance``,
``receive``, ``relay`` / ``relay_batch``, ``apply_next`` / ``drain`` /
``process_all`` and each effect execution run inside a span named
``reliable_flow.<operation>`` with the attributes ``reliable_flow.event_id``,
``reliable_flow.flow_id``, ``reliable_flow.seq``, ``reliable_flow.status``
(and ``reliable_flow.applied``, ``reliable_flow.effect_key`` where they
apply).  The spans go wherever the application's tracer provider sends them
(with the API alone, nowhere; and while no provider is set, no span is
made at all).  Set ``RELIABLE_FLOW_OTEL=0`` to turn them
off even when the package is installed.

Without the package, :func:`traced` returns the function itself: the
decorated methods are the plain functions and cost nothing more.  The
choice is made once, when this module is imported.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["ACTIVE", "ENV_VAR", "attributes_of", "traced"]

ENV_VAR = "RELIABLE_FLOW_OTEL"
F = TypeVar("F", bound=Callable[..., Any])


def _available() -> bool:
    if os.environ.get(ENV_VAR, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # "opentelemetry" absent or a broken install
        return False


#: True when spans are made (opentelemetry importable and not turned off).
ACTIVE = _available()
_tracer: Any = None


def _get_tracer() -> Any:
    global _tracer
    if _tracer is None:
        from opentelemetry.trace import get_tracer

        # A proxy until the application sets a provider; it follows the provider then.
        _tracer = get_tracer("reliable_flow")
    return _tracer


def _no_provider() -> bool:
    """True while the application has set no tracer provider.  Every span
    would then be a non-recording one carrying its parent's context, which
    the code inside sees all the same without it: no span is made (it costs
    about 15 µs a call).  Asked at each call: a provider set later is
    followed from then on."""
    from opentelemetry.trace import ProxyTracerProvider, get_tracer_provider

    return isinstance(get_tracer_provider(), ProxyTracerProvider)


_FIELDS = ("event_id", "flow_id", "seq", "applied", "key")


def attributes_of(value: Any) -> dict[str, Any]:
    """Span attributes read from a result or record: ids, seq, status."""
    out: dict[str, Any] = {}
    for name in _FIELDS:
        found = getattr(value, name, None)
        if isinstance(found, (str, int)) and not isinstance(found, bool):
            out[f"reliable_flow.{'effect_key' if name == 'key' else name}"] = found
    if isinstance(value, str):  # a state itself (an effect's)
        return {"reliable_flow.status": str(value)}
    status = getattr(value, "status", None) or getattr(value, "stop", None) or getattr(value, "state", None)
    if status is not None:
        out["reliable_flow.status"] = str(status)
    if isinstance(value, Mapping):  # process_all: {flow: DrainResult}
        out["reliable_flow.flows"] = len(value)
        out["reliable_flow.applied"] = sum(int(getattr(r, "applied", 0)) for r in value.values())
    counts = getattr(value, "counts", None)  # relay_batch
    if isinstance(counts, Mapping):
        for status_name, n in counts.items():
            out[f"reliable_flow.{status_name}"] = int(n)
    return out


def traced(name: str, before: Callable[..., Mapping[str, Any]] | None = None) -> Callable[[F], F]:
    """Run the function in a span ``name`` when tracing is active; otherwise
    return it unchanged.  ``before(*args, **kwargs)`` gives attributes known
    before the call; the result's are added after it."""

    def decorate(fn: F) -> F:
        if not ACTIVE:
            return fn

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _no_provider():
                return fn(*args, **kwargs)
            with _get_tracer().start_as_current_span(name) as span:
                # Without an SDK the span records nothing: build no attributes.
                recording = span.is_recording()
                if recording and before is not None:
                    span.set_attributes(dict(before(*args, **kwargs)))
                result = fn(*args, **kwargs)
                if recording and result is not None:
                    span.set_attributes(attributes_of(result))
                return result

        return wrapper  # type: ignore[return-value]

    return decorate
