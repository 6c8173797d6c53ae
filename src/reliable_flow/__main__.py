"""``python -m reliable_flow``: see :mod:`reliable_flow.tools.cli`."""

from .tools.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
