"""``python -m reliable_flow``: see :mod:`reliable_flow.cli`."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
