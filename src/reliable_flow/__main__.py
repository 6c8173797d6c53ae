"""``python -m reliable_flow``: see :mod:`reliable_flow._tools.cli`."""

from ._tools.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
