"""A fake external service in a process of its own, for ``test_effect_kill.py``.

Not collected by pytest.  Run as a script::

    python tests/children/fake_service.py --socket PATH --log PATH --seed N --dedup 0|1
        [--p-fail P] [--p-late P] [--late-delay S] [--max-seconds S] [--p-throttle P]

It listens on the Unix domain socket PATH only (no network address) and
prints ``ready`` on stdout once it accepts connections.  It stops when its
stdin reaches end of file (the test closes it, or the test process died), or
after ``--max-seconds`` whatever happens, so it never outlives a test run by
much.

Protocol: one JSON request per connection, one line, then one JSON answer
line (or none).

* ``{"op": "perform", "key": K, "payload": {...}, "attempt": N, "deadline": D}``
  where ``D`` is the caller's deadline on ``time.monotonic()`` (CLOCK_MONOTONIC
  is one clock for every process of the machine).  A request read at or
  after its deadline is refused without performing anything (a gRPC-style
  deadline: the caller has given up, so nothing may happen on its behalf
  later; this is what makes "the caller timed out" mean "whatever happened,
  happened before the deadline").  Otherwise, with seeded probabilities:

  - ``fail`` (``--p-fail``): nothing performed, answers ``{"error": "retry"}``;
  - ``throttled`` (``--p-throttle``, 0 by default): nothing performed,
    answers ``{"error": "throttled", "after": S}`` (an HTTP 429 with a
    ``Retry-After`` of S, 0.05-0.3 s);
  - ``late`` (``--p-late``): performed, and the answer is held back until
    ``--late-delay`` seconds after the deadline (the caller sees a timeout);
  - else performed, answers ``{"ok": true, "result": {"receipt": ...}}``.

  With ``--dedup 1`` (an "idempotent target") a key already performed is
  never performed again: the stored result is answered at once (``dedup``).

  ``"broken": true`` (a tool that always fails, ``test_agent_round_trip``):
  nothing performed, answers ``{"error": "broken"}`` (an HTTP 500), logged
  ``broken``; drawn before nothing, so the other calls' draws are as without it.

  Optional (the concurrent kill tests): ``"hold": S`` -- the service works
  ``S`` seconds before it decides (a long call), and then decides only if
  the caller is still connected: a caller gone meanwhile (killed, or it
  gave up on a lost lease and closed the connection) is logged
  ``abandoned`` and nothing is performed for it.  A caller that dies while
  it holds its claim thus has nothing performed after its death, so
  nothing is performed after its lease can have run out (the executor
  renews a lease every third of it while its process lives).
  ``"kind": K`` is only logged.  With either, a ``fail`` answer also
  carries ``"after": S`` (a ``Retry-After``, 0.02-0.2 s).

* ``{"op": "status", "key": K}``: answers ``{"ok": true, "performed": bool,
  "result": <the last result or null>}``, never fails, never delays.

Every request read is appended to the log before it is answered, one JSON
line flushed and fsynced: ``{"n", "op", "key", "attempt", "outcome",
"performed", "result"}``; ``outcome`` is one of ``fail``, ``performed``,
``late`` (performed, answer delayed), ``dedup``, ``expired`` (past its
deadline), ``throttled``, ``broken``, ``abandoned`` (a held call whose caller was gone when it was to be
decided), ``status``, ``garbled`` (an incomplete request: its sender died
while sending); a held call also logs its ``hold`` and ``kind``, ``read_at``
and ``at`` (``time.monotonic()`` when it was read and decided), and its
line is written when it is decided (after the hold).  ``performed`` is true
exactly for ``performed`` and ``late``.  Requests are decided one at a time
(one lock), so a ``status`` answer includes every perform decided before
it (a held call is decided when its hold ends, not when it is read).

Only the standard library is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import selectors
import socket
import socketserver
import sys
import threading
import time
from typing import Any

READ_TIMEOUT = 5.0  # a connection that sends no complete line in this long is dropped


class Service:
    """The decisions and the log; every request goes through :meth:`handle` under one lock."""

    def __init__(self, log_path: str, seed: int, dedup: bool, p_fail: float, p_late: float,
                 late_delay: float, p_throttle: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.late_delay = late_delay
        self.dedup = dedup
        self.p_fail = p_fail
        self.p_late = p_late
        self.p_throttle = p_throttle
        self.lock = threading.Lock()
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed by close()
        self.n = 0
        self.performances = 0
        self.results: dict[str, Any] = {}  # key -> result of its last performance

    def close(self) -> None:
        with self.lock:
            self.log.close()

    def _write(self, entry: dict[str, Any]) -> None:
        self.n += 1
        line = json.dumps({"n": self.n, **entry}, sort_keys=True) + "\n"
        self.log.write(line.encode())
        self.log.flush()
        os.fsync(self.log.fileno())

    def handle(self, raw: bytes, caller_gone: Any = None) -> tuple[dict[str, Any] | None, float | None]:
        """Decide, log, and return (answer or None, monotonic time to hold the answer until).

        ``caller_gone()``: whether the caller closed its connection (asked,
        under the lock, only for a held call, when its hold is over)."""
        read_at = time.monotonic()
        try:
            hold = float(json.loads(raw).get("hold") or 0.0)
        except (ValueError, TypeError, AttributeError):
            hold = 0.0
        if hold > 0:  # the work takes this long; the decision comes at its end
            time.sleep(hold)
        with self.lock:
            try:
                request = json.loads(raw)
                op, key = request["op"], str(request["key"])
            except (ValueError, KeyError, TypeError):
                self._write({"op": None, "key": None, "attempt": None, "owner": None, "outcome": "garbled",
                             "performed": False, "result": None})
                return None, None
            call = {"op": op, "key": key, "attempt": request.get("attempt"), "owner": request.get("owner")}
            held = "hold" in request or "kind" in request
            if held:  # when it was read and when decided (CLOCK_MONOTONIC): which calls overlapped
                call.update(hold=request.get("hold"), kind=request.get("kind"), read_at=read_at,
                            at=time.monotonic())

            def log(outcome: str, result: Any = None, **extra: Any) -> None:
                self._write({**call, "outcome": outcome, "performed": outcome in ("performed", "late"),
                             "result": result, **extra})

            if op == "status":
                performed, result = key in self.results, self.results.get(key)
                log("status", result, status_performed=performed)
                return {"ok": True, "performed": performed, "result": result}, None
            deadline = float(request["deadline"])
            if time.monotonic() >= deadline:  # the caller has given up: do nothing for it
                log("expired")
                return {"error": "deadline"}, None
            if hold > 0 and caller_gone is not None and caller_gone():  # it died (or gave up) meanwhile
                log("abandoned")
                return None, None
            if request.get("broken"):  # a tool that always answers 500: never performs
                log("broken")
                return {"error": "broken"}, None
            if self.dedup and key in self.results:
                log("dedup", self.results[key])
                return {"ok": True, "result": self.results[key]}, None
            draw = self.rng.random()
            if draw < self.p_fail:
                log("fail")
                if held:  # a Retry-After
                    return {"error": "retry", "after": round(0.02 + 0.18 * (draw / self.p_fail), 3)}, None
                return {"error": "retry"}, None
            if draw < self.p_fail + self.p_throttle:  # a 429 with a Retry-After
                log("throttled")
                return {"error": "throttled", "after": round(0.05 + 0.25 * self.rng.random(), 3)}, None
            self.performances += 1
            result = {"receipt": f"{key}#{self.performances}"}
            self.results[key] = result
            late = draw < self.p_fail + self.p_throttle + self.p_late
            log("late" if late else "performed", result)
            return {"ok": True, "result": result}, (deadline + self.late_delay) if late else None


class Handler(socketserver.StreamRequestHandler):
    timeout = READ_TIMEOUT

    def handle(self) -> None:
        service: Service = self.server.service  # type: ignore[attr-defined]
        try:
            raw = self.rfile.readline(1 << 20)
        except OSError:
            return
        if not raw.endswith(b"\n"):
            if raw:
                service.handle(b"")  # logged as garbled, nothing performed
            return
        answer, hold_until = service.handle(raw, lambda: _closed(self.connection))
        if answer is None:
            return
        if hold_until is not None:
            time.sleep(max(0.0, hold_until - time.monotonic()))
        try:
            self.wfile.write(json.dumps(answer).encode() + b"\n")
            self.wfile.flush()
        except OSError:
            pass  # the caller is gone (killed, or gave up): nothing to tell


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed the connection (it sends nothing after its one line)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        # (a socket with a timeout waits for it even with MSG_DONTWAIT: peek only when readable)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # open, nothing to read
    except OSError:
        return True  # reset


class Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = False  # server_close() joins the handler threads
    block_on_close = True
    request_queue_size = 64


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--dedup", type=int, choices=(0, 1), required=True)
    parser.add_argument("--p-fail", type=float, default=0.2)
    parser.add_argument("--p-late", type=float, default=0.2)
    parser.add_argument("--late-delay", type=float, default=0.1)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--p-throttle", type=float, default=0.0)
    args = parser.parse_args(argv)
    service = Service(args.log, args.seed, bool(args.dedup), args.p_fail, args.p_late, args.late_delay,
                      args.p_throttle)
    if os.path.exists(args.socket):
        os.unlink(args.socket)
    server = Server(args.socket, Handler)
    server.service = service  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    print("ready", flush=True)
    end = time.monotonic() + args.max_seconds
    with selectors.DefaultSelector() as sel:  # stop at end of stdin, or at the latest at --max-seconds
        sel.register(sys.stdin.buffer, selectors.EVENT_READ)
        while (remaining := end - time.monotonic()) > 0:
            if sel.select(min(remaining, 1.0)) and not os.read(sys.stdin.fileno(), 4096):
                break
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
    service.close()
    os.unlink(args.socket)
    print(f"stopped after {service.n} requests, {service.performances} performances", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
