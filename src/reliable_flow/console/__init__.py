"""An operator console in the browser: why every flow waits, every effect's
timeline, the attention list ``inspect`` gives, as server-rendered pages and
their JSON twins (standard library only; see docs/console.md).

:func:`make_app` returns a WSGI application, to mount in any WSGI server (or,
through a WSGI-to-ASGI adapter, in an ASGI one); ``reliable-flow console``
serves it on its own.  It opens every store read only (SQLite ``mode=ro``, a
read-only PostgreSQL session) on each request and, unless actions are
allowed (``read_only=False``), writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._effects import EffectRegistry
from .._tools.stores import Location
from ._app import ConsoleApp
from ._data import Redact

__all__ = ["make_app"]


def make_app(producer: Location, consumers: Sequence[Location], *, read_only: bool = True,
             token: str | None = None, redact: Redact | None = None, stuck_after: float = 300,
             effects: EffectRegistry | None = None) -> ConsoleApp:
    """The console of ``producer`` and ``consumers`` as a WSGI application.

    Locations are what ``reliable-flow inspect`` takes: a SQLite file path or
    a ``postgresql://...#schema`` location; a consumer may be given as
    ``NAME=LOCATION``, and its store must then be that consumer.  A
    consumer on another host is its location on Redis,
    ``redis://host:6379/0#NAME``: read (and, with ``read_only=False``, acted
    on) through the ``reliable-flow bridge`` serving it (docs/console.md, "A
    consumer on another host"); a page that gets no answer from it is a 503
    with a sentence.  Every
    store is opened once here, read only, so a missing or wrong one raises
    now (``FileNotFoundError``, :class:`~reliable_flow.errors.WrongFile`,
    ``ValueError`` for a name that does not match,
    :class:`~reliable_flow.errors.TransportError` for a bridge that does
    not answer), not on the first page.

    ``read_only``: True (the default): nothing the console does writes to a
    store, and every action route (``/act``...) answers 403.  False: the
    operator actions are offered under ``/act`` (redeliver and skip a
    delivery, skip or replace an inbox event, retry / resolve / cancel /
    amend an effect, register / remove a consumer or change its topics
    (``subscribe``), the bulk retry and
    redeliver, and prune, each bulk one with a dry run), each through the
    same calls as the command line, recorded with the actor and reason the
    form asks for, and their JSON twins under ``/api/act`` (``GET`` for the
    fields and the CSRF token, ``POST`` answering the recorded actions, or
    the refusal with 409 / 400); every form
    carries a CSRF token bound to a cookie (a POST without it, or with a
    wrong one, is a 403 and writes nothing); the store an action writes to
    is opened writable for that request only.  ``effects``: the consumers'
    ``EffectRegistry``, which ``resolve`` checks a result against and
    ``amend`` needs (as ``--effects`` on the command line).  ``token``: when given, every request needs it,
    as ``Authorization: Bearer <token>`` or the cookie ``/login`` sets.
    ``redact(kind, payload) -> payload`` is applied to every payload a page
    or a JSON answer shows (kind: the event's kind or the effect's name),
    on a copy; a redact that raises shows ``{"redact_failed": ...}`` instead
    of the payload.  ``stuck_after``: seconds before a waiting flow needs
    attention, as ``inspect --stuck-after`` (a finite number >= 0).

    The pages: ``/`` (overview and attention list), ``/flows?q=``,
    ``/flows/<flow_id>``, ``/effects?consumer=&state=&name=&after=&limit=``,
    ``/effects/<key>``, ``/actions``, ``/metrics`` (Prometheus text),
    ``/healthz`` (200, or 503 with ``{"attention": [...]}``), and the JSON
    twins under ``/api/``.  A bad query parameter answers 400, an unknown id
    404, each with a sentence.
    """
    return ConsoleApp(producer, consumers, read_only=read_only, token=token, redact=redact,
                      stuck_after=stuck_after, effects=effects)
