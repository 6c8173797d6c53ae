"""``reliable-flow console``: the operator console (:mod:`reliable_flow.console`)
served by a threaded wsgiref server until SIGTERM / Ctrl-C (exit 0); exit 2
on an error, the message prefixed by ``console:``.  See docs/console.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import ReliableFlowError
from ._cli_common import seconds_type
from .loading import OptionError

__all__ = ["add_console_command", "console_command"]


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {text!r}")
    return value


def add_console_command(sub: Any) -> None:
    """Add ``console`` to the subcommands ``sub``."""
    console = sub.add_parser(
        "console", help="the operator console in the browser (read only unless --allow-actions), until SIGTERM / Ctrl-C",
        description="Serves the overview, the attention list, flows, effects and their histories, the "
                    "operator action log, /metrics and /healthz, as pages and JSON, from PRODUCER and "
                    "each CONSUMER (a file or postgresql://...#schema, or redis://host:6379/0#NAME for a "
                    "consumer on another host, read through its `reliable-flow bridge`; a consumer also as "
                    "NAME=LOCATION), "
                    "opened read only. See docs/console.md.",
    )
    console.add_argument("producer", metavar="PRODUCER")
    console.add_argument("consumers", metavar="CONSUMER", nargs="+")
    console.add_argument("--host", default="127.0.0.1",
                         help="the address to listen on (default 127.0.0.1; any other than loopback "
                              "needs --token-file)")
    console.add_argument("--port", type=_port, default=8470, help="the port (default 8470; 0: a free one)")
    console.add_argument("--allow-actions", action="store_true",
                         help="let operators act from the console (redeliver, skip, replace, retry, resolve, "
                              "cancel, amend, register, remove, bulk retry / redeliver), each recorded; "
                              "default: read only")
    console.add_argument("--effects", metavar="MODULE:ATTR",
                         help="the consumers' EffectRegistry: resolve checks a result against it, amend needs it")
    console.add_argument("--token-file", metavar="FILE",
                         help="a file holding the token every request must carry (Bearer, or /login)")
    console.add_argument("--stuck-after", type=seconds_type(True), default=300.0, metavar="SECONDS",
                         help="a gap, or a next step pending, older than this needs attention (default 300)")


def console_command(args: argparse.Namespace) -> int:
    from ..console import make_app
    from ..console._serve import is_loopback, serve

    token = None
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            print(f"console: cannot read --token-file: {exc}", file=sys.stderr)
            return 2
        if not token:
            print(f"console: --token-file {args.token_file} is empty", file=sys.stderr)
            return 2
    elif not is_loopback(args.host):
        print(f"console: refusing to listen on {args.host} (not loopback) without --token-file: anyone "
              "who reaches it would read every flow", file=sys.stderr)
        return 2
    try:
        effects = None
        if args.effects:
            from .._effects import EffectRegistry
            from .loading import load

            effects = load("--effects", args.effects, lambda o: isinstance(o, EffectRegistry),
                           "a reliable_flow EffectRegistry")
        app = make_app(args.producer, args.consumers, read_only=not args.allow_actions, token=token,
                       stuck_after=args.stuck_after, effects=effects)
    except (ReliableFlowError, OptionError, FileNotFoundError, ImportError, ValueError, TypeError) as exc:
        print(f"console: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        mode = "read only" if app.read_only else "actions allowed"
        print(f"console: serving {app.console.producer_shown} on {url} ({mode}; Ctrl-C stops)", flush=True)

    try:
        serve(app, args.host, args.port, ready)
    except OSError as exc:
        print(f"console: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print("console: stopped", flush=True)
    return 0
