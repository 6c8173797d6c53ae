"""What the commands import by name (``--protocol``, ``--handlers``,
``--effects``, ``--app-schema``: ``module:ATTRIBUTE``), written once for
``run``, ``execute``, ``bridge`` and the operator commands; and which
protocol a command opens its stores with when ``--protocol`` is not given
(:func:`protocol_for`: the one the store records)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_PROTOCOL", "PROTOCOL_HELP", "OptionError", "load", "load_protocol", "protocol_for"]

#: The protocol a command opens its stores with when ``--protocol`` names
#: none and the stores record none (new stores, or stores older than the record).
DEFAULT_PROTOCOL = "reliable_flow.reservation:RESERVATION"
#: ``--protocol``'s help, the same for every command.
PROTOCOL_HELP = (f"the protocol object to import (default: the one the store records, see docs/operations.md; "
                 f"for a store that records none, {DEFAULT_PROTOCOL})")


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



def protocol_for(spec: str | None, *stores: tuple[str, Any]) -> Any:
    """The protocol a command opens its stores with: ``--protocol`` when
    given (``spec``); else the import path the first of ``stores`` (each
    ``("producer" | "consumer", location)``) that records one holds; else,
    when no store records one, :data:`DEFAULT_PROTOCOL`.  Each store is
    read read only; one that cannot be read here (missing, another schema
    version, a server not answering) is passed over, for the command's own
    open to report.  :class:`OptionError` when the recorded path cannot be
    imported, or when a store records a protocol name but no path (a store
    older than the record, made by a protocol other than the default)."""
    if spec is not None:
        return load_protocol(spec)
    from ..errors import ReliableFlowError
    from .stores import open_consumer, open_producer, recorded_protocol

    named: tuple[str, str] | None = None
    for kind, location in stores:
        if location is None:
            continue
        try:
            store = (open_producer if kind == "producer" else open_consumer)(location)
        except (ReliableFlowError, FileNotFoundError, ImportError, ValueError):
            continue
        try:
            name, path = recorded_protocol(store)
            shown = store.location
        finally:
            store.close()
        if path is not None:
            try:
                return load("--protocol", path, _is_protocol, "a reliable_flow Protocol")
            except OptionError as exc:
                reason = str(exc).removeprefix("--protocol: ")
                raise OptionError(f"{shown} records protocol {path!r}, but here {reason}; run the command where "
                                  f"that module imports, or give --protocol MODULE:ATTR") from None
        if named is None and name is not None:
            named = (shown, name)
    default = load_protocol(DEFAULT_PROTOCOL)
    if named is not None and named[1] != default.name:
        raise OptionError(f"{named[0]} was created for protocol {named[1]!r} and records no import path: "
                          f"give --protocol MODULE:ATTR")
    return default


def _is_protocol(obj: Any) -> bool:
    from ..protocol import Protocol

    return isinstance(obj, Protocol)
