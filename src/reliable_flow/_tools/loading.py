"""What the commands import by name (``--protocol``, ``--handlers``,
``--effects``, ``--app-schema``: ``module:ATTRIBUTE``), written once for
``run``, ``execute`` and the operator commands."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_PROTOCOL", "OptionError", "load", "load_protocol"]

#: The protocol a command opens its stores with unless ``--protocol`` names another.
DEFAULT_PROTOCOL = "reliable_flow.reservation:RESERVATION"


class OptionError(Exception):
    """A bad option value found after parsing: the command prints
    ``<command>: <message>`` and exits 2, having opened nothing."""


def load(option: str, spec: str, check: Callable[[Any], bool], what: str) -> Any:
    """``module:ATTRIBUTE``, importable from the current directory as with
    ``python -m``; :class:`OptionError` naming ``option`` when it is
    malformed, cannot be imported, or fails ``check`` (``what`` it must be)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise OptionError(f"{option} must look like module:ATTRIBUTE, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as exc:
        raise OptionError(f"{option}: cannot import {module_name!r}: {exc}") from None
    if not check(obj):
        raise OptionError(f"{option}: {spec} is not {what}")
    return obj


def load_protocol(spec: str) -> Any:
    """``--protocol``: a :class:`~reliable_flow.protocol.Protocol` object."""
    from ..protocol import Protocol

    return load("--protocol", spec, lambda o: isinstance(o, Protocol), "a reliable_flow Protocol")
