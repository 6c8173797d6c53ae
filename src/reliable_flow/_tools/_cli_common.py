"""What the long-running commands share (``run`` and ``execute`` in
worker_cli.py, ``bridge`` in bridge_cli.py), written once: the options they
spell alike, ``--schemas``, a store that fails to open as an
:class:`OptionError`, the progress lines, the loop's tail (closing, the
``stopped:`` and ``cannot go on:`` lines, the exit code) and, for ``run``
and ``bridge``, SIGTERM / SIGINT from the command's start.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

from .._checks import check_seconds
from ..errors import ReliableFlowError
from .loading import PROTOCOL_HELP, OptionError

__all__ = [
    "RELAY_ONLY", "Caught", "EarlySignals", "Opened", "add_shared", "command", "count_type", "counts", "is_remote",
    "opening",
    "reporter", "schemas_option", "seconds_type", "serve", "stopped",
]


def seconds_type(allow_zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, > 0 (or >= 0 with ``allow_zero``)."""
    def parse(text: str) -> float:
        try:
            return check_seconds("value", float(text), allow_zero=allow_zero)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds {'>= 0' if allow_zero else '> 0'}, got {text!r}"
            ) from None

    return parse


def count_type(text: str) -> int:
    """An argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def command(name: str, body: Callable[[], int]) -> int:
    """``body()``'s exit code; an :class:`OptionError` is printed as
    ``<name>: <message>`` on stderr (exit 2)."""
    try:
        return body()
    except OptionError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2


def add_shared(parser: Any, *options: str) -> None:
    """Add ``options`` (in that order) where several commands spell them alike."""
    specs: dict[str, dict[str, Any]] = {
        "--producer": {"metavar": "LOCATION",
                       "help": "where results of effects with feedback= are advanced: a producer store this host "
                               "can open, or a producer on another host served by `reliable-flow run --serve-as "
                               "NAME --to URL` there, given as URL#NAME (redis://host:6379/0#NAME)"},
        "--protocol": {"metavar": "MODULE:ATTR", "help": PROTOCOL_HELP},
        "--idle-sleep": {"type": seconds_type(True), "default": 0.5, "metavar": "SECONDS",
                         "help": "how long to sleep after a pass that found nothing (default 0.5)"},
        "--report-every": {"type": seconds_type(True), "default": 10.0, "metavar": "SECONDS",
                           "help": "print progress counts to stderr this often (0: only at exit)"},
    }
    for option in options:
        parser.add_argument(option, **specs[option])


def is_remote(location: str | None) -> bool:
    """A ``--producer`` that names a producer on another host (``redis://host#NAME``), not a store."""
    return location is not None and location.startswith(("redis://", "rediss://", "unix://"))


def schemas_option(text: str | None) -> set[int] | None:
    """``--schemas N,N`` as a set; None when not given (the protocol's)."""
    if not text:
        return None
    try:
        return {int(x) for x in text.split(",")}
    except ValueError:
        raise OptionError(f"--schemas must be comma-separated ints, got {text!r}") from None


@contextmanager
def opening(close: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Around opening stores and building a loop: a ReliableFlowError or
    ValueError (e.g. a consumer name the producer has not registered)
    closes what is open (``close``) and becomes an :class:`OptionError`."""
    try:
        yield
    except (ReliableFlowError, ValueError) as exc:
        close()
        raise OptionError(str(exc)) from None


class Opened:
    """The stores a command opened, closed in the reverse order by :meth:`close`."""

    def __init__(self) -> None:
        self._things: list[Any] = []

    def add(self, thing: Any) -> Any:
        """``thing``, now closed by :meth:`close`."""
        self._things.append(thing)
        return thing

    def close(self) -> None:
        for thing in reversed(self._things):
            thing.close()


#: What a relay-only ``run`` (``--to``: no consumer here) reports: it
#: applies nothing and runs no effect, so those counts would mean nothing.
RELAY_ONLY = ("passes", "relayed", "served", "errors", "last_error")


def counts(stats: Any, only: tuple[str, ...] | None = None) -> str:
    """``stats`` as sorted JSON; with ``only``, just those keys."""
    shown = stats.as_dict()
    if only is not None:
        shown = {key: shown[key] for key in only if key in shown}
    return json.dumps(shown, sort_keys=True)


def reporter(command: str, every: float, only: tuple[str, ...] | None = None) -> Callable[[Any], None]:
    """A loop's ``on_pass``: ``<command>: {counts}`` on stderr (``only``
    those keys, if given), at most once every ``every`` seconds (0: never,
    only the ``stopped:`` line at exit)."""
    last = [time.monotonic()]

    def report(stats: Any) -> None:
        if every > 0 and time.monotonic() - last[0] >= every:
            last[0] = time.monotonic()
            print(f"{command}: {counts(stats, only)}", file=sys.stderr, flush=True)

    return report


class Caught:
    """``with caught:`` around a loop's run: the ReliableFlowError it raises
    (a loop raises only what retrying cannot heal) is kept in ``failure``."""

    failure: ReliableFlowError | None = None

    def __enter__(self) -> Caught:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if isinstance(exc, ReliableFlowError):
            self.failure = exc
            return True
        return False


def serve(command: str, looper: Any, run: Callable[[], object], close: Callable[[], None],
          only: tuple[str, ...] | None = None) -> int:
    """``run()`` the loop, ``close()`` the stores whatever happens, then
    :func:`stopped` with ``looper.stats`` (``only`` those keys, if given)."""
    caught = Caught()
    try:
        with caught:
            run()
    finally:
        close()
    return stopped(command, looper.stats, caught.failure, only)


def stopped(command: str, stats: Any, failure: ReliableFlowError | None,
            only: tuple[str, ...] | None = None) -> int:
    """The last lines of a loop's command: ``<command>: stopped: {counts}``,
    then ``<command>: cannot go on: ...`` after an error (exit 2); else exit 0."""
    print(f"{command}: stopped: {counts(stats, only)}", file=sys.stderr, flush=True)
    if failure is not None:
        print(f"{command}: cannot go on: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
        return 2
    return 0


class EarlySignals:
    """SIGTERM / SIGINT from the command's start (main thread only; the
    previous handlers are put back on exit).  The loop installs its own
    handlers while it runs; a signal that comes before (options loading,
    stores opening, a server being reached) is kept and stops the loop given
    to :meth:`watch` before its first pass, so the command ends as on a
    signal during the loop (``stopped:``, exit 0) instead of being killed.
    Once the loop had its turn (stopped, or a pass done), and for a second
    signal while the command is still starting, a signal does what it would
    do without this handler (SIGTERM ends the process, SIGINT raises
    KeyboardInterrupt)."""

    def __init__(self) -> None:
        self._signalled = False
        self._looper: Any = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> EarlySignals:  # noqa: PYI034 - Self needs Python 3.11
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def watch(self, looper: Any) -> None:
        """Stop ``looper`` (before it runs) on a signal that came or comes."""
        self._looper = looper
        if self._signalled:
            looper.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        looper = self._looper
        # A second signal while the command is still starting (a store that
        # takes long to open, a server that does not answer) acts as it
        # would without this handler: an operator can always end it.
        starting = looper is None and not self._signalled
        if starting or (looper is not None and not (looper.stopping or looper.stats.passes)):
            self._signalled = True
            if looper is not None:
                looper.stop()
            return
        previous = self._previous[signal.Signals(signum)]
        if callable(previous):  # SIGINT's default: KeyboardInterrupt
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
