"""Two hosts of an agent's round trip, in one test process (issue 30): the
``ask`` protocol, host B's consumer ``tools`` behind a bridge whose executor
feeds results into the producer served as ``agent`` (:class:`ToolsHost`),
and :func:`until`, host A's worker passes until a condition holds.  Shared
by tests/test_transport_feedback.py and tests/test_inspect_remote.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from reliable_flow import ApplyContext, Consumer, EffectExecutor, EffectRegistry, Worker
from reliable_flow.protocol import Protocol, by_kind, exact, text

ASK = Protocol(
    name="ask", initial="new",
    transitions={"new": ["asked"], "asked": ["answered"]},
    schemas={1: by_kind({"asked": exact({"q": text()}), "answered": exact({"a": text()})})},
)
TOOLS = "tools"


def schedule(ctx: ApplyContext) -> None:
    """The consumer's handler: every asked flow schedules ``look_up``."""
    if ctx.event.kind == "asked":
        ctx.schedule("look_up", {"q": ctx.event.payload["q"]})


class ToolsHost:
    """Host B: a bridge serving the ``tools`` consumer, whose executor feeds
    results into the remote producer ``agent``; in a thread of its own (a
    Consumer belongs to the thread that opened it)."""

    def __init__(self, location: str, url: str, effects: EffectRegistry) -> None:
        from reliable_flow.transport.redis import Bridge

        self.bridge_class = Bridge
        self.location, self.url, self.effects = location, url, effects
        self.error: BaseException | None = None
        self.bridge: Any = None
        self.executor: EffectExecutor | None = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            with Consumer(self.location, ASK, name=TOOLS, handlers=[schedule], effects=self.effects) as consumer:
                self.executor = EffectExecutor(consumer, producer=f"{self.url}#agent")
                self.bridge = self.bridge_class(consumer, self.url, executors=[self.executor], block=0.05)
                self._ready.set()
                try:
                    self.bridge.run(handle_signals=False)
                finally:
                    self.bridge.close()
                    self.executor.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> ToolsHost:  # noqa: PYI034 - Self needs Python 3.11
        self.thread.start()
        assert self._ready.wait(20), "host B did not start"
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "host B did not stop"
        if self.error is not None:
            raise self.error


def until(check: Callable[[], Any], worker: Worker, timeout: float = 20.0) -> Any:
    """Worker passes (host A) until ``check()`` is truthy; its value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        worker.run_once()
        got = check()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"not reached within {timeout} s; worker: {worker.stats.as_dict()}")
