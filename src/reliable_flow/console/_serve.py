"""``reliable-flow console``'s server: wsgiref, a thread per request, a clean
stop on SIGTERM / SIGINT."""

from __future__ import annotations

import ipaddress
import signal
import socket
import socketserver
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

__all__ = ["is_loopback", "serve"]


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a browser's kept-alive connection does not hold the stop up


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    """No access log: a refreshing page would write a line every two seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(app: Callable[..., Any], host: str, port: int, ready: Callable[[str], None]) -> None:
    """Serve ``app`` on ``host``:``port`` (0: a free port) until SIGTERM or
    SIGINT; ``ready(url)`` once it listens.  Returns after the server closed."""
    cls = _Server6 if ":" in host else _Server
    server = cls((host, port), _Quiet)
    server.set_app(app)
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():  # shutdown() waits for serve_forever: not from its own thread
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        shown = f"[{host}]" if ":" in host else host
        ready(f"http://{shown}:{server.server_address[1]}/")
        server.serve_forever(poll_interval=0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.server_close()
