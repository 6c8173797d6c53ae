"""The experiment's child process: ``python -m reliable_flow._tools.experiment.child COMMAND ...``.

The scenarios that need a process to really exit (at an armed crash point,
or half-way through the unsafe dual write) run this module in a fresh
interpreter through :func:`reliable_flow._tools.experiment.harness._run_child`
and look only at its exit code and at the files it leaves behind.

Commands:

``crash PRODUCER_DB CONSUMER_DB``
    Advance A1 (reserved, amount 3), relay, drain flow A.  Run with
    ``RELIABLE_FLOW_CRASH_AT`` set, it exits 73 at that point.
``unsafe_dual_write PRODUCER_DB``
    The deliberately wrong dual write of A1, dying (exit 81) between its two
    commits; see :mod:`reliable_flow._tools.experiment.wrong_ways`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from ..._relay import relay
from .harness import advance_first, open_paths
from .wrong_ways import unsafe_dual_write_then_die

__all__ = ["COMMANDS", "main"]


def advance_relay_drain(producer_path: str, consumer_path: str) -> None:
    """Advance A1, relay it and drain flow A: every crash point lies on this path."""
    with open_paths(producer_path, consumer_path) as (producer, consumer):
        advance_first(producer)
        relay(producer, consumer)
        consumer.drain("A")


#: Command name -> what the child does with the file paths that follow it.
COMMANDS: dict[str, Callable[..., None]] = {
    "crash": advance_relay_drain,
    "unsafe_dual_write": unsafe_dual_write_then_die,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; 0 if it returned, 2 on a usage error (a crash exits on its own)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        print(f"usage: child {{{','.join(COMMANDS)}}} FILE...", file=sys.stderr)
        return 2
    command, *paths = args
    COMMANDS[command](*paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
