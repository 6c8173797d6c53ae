"""HTML written safely: every value escaped unless it is :class:`Html` already.

The pages build their markup from :func:`tag`, :func:`table` and
:func:`link`, which escape every value they are given (``html.escape`` with
``quote=True``: text and attribute values alike), so a flow id, a payload,
an error text or a reason holding ``<script>``, quotes or newlines shows as
text and never as markup.  Only this module makes :class:`Html`.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["Html", "age", "chart", "esc", "href", "join", "link", "page", "path_to", "payload", "table", "tag", "when"]

#: A payload shown on a page is cut here (the JSON twin has all of it).
SHOWN_CHARS = 8_000


class Html(str):
    """Markup already safe to send: made here only."""

    __slots__ = ()


def esc(value: Any) -> Html:
    """``value`` as text in HTML (or inside a quoted attribute): ``& < > " '`` escaped."""
    if isinstance(value, Html):
        return value
    return Html(html.escape("-" if value is None else str(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Html:
    return Html(esc(sep).join(esc(p) for p in parts))


_VOID = frozenset({"input", "meta", "link", "br"})


def tag(element: str, /, *children: Any, **attrs: Any) -> Html:
    """``<element attrs>children</element>``; an attribute named ``class_`` is
    ``class``, ``data_x`` is ``data-x``; a None or False attribute is left
    out, a True one is written bare."""
    shown = "".join(f' {k.rstrip("_").replace("_", "-")}' + ("" if v is True else f'="{esc(v)}"')
                    for k, v in attrs.items() if v is not None and v is not False)
    if element in _VOID:
        return Html(f"<{element}{shown}>")
    return Html(f"<{element}{shown}>{join(children)}</{element}>")


def path_to(prefix: str, ident: str) -> str:
    """``prefix`` and an id as one percent-encoded path segment (a flow id may
    hold ``/``, ``?``, ``#`` or ``%``)."""
    return prefix + quote(ident, safe="")


def href(base: str, path: str, query: Mapping[str, Any] | None = None) -> str:
    """The URL of ``path`` (percent-encoded already, see :func:`path_to`) under
    ``base`` (the mount point, ``SCRIPT_NAME``), with ``query``'s non-empty values."""
    url = quote(base, safe="/") + path
    kept = {k: v for k, v in (query or {}).items() if v not in (None, "")}
    return url + ("?" + urlencode(kept) if kept else "")


def link(base: str, path: str, text: Any, query: Mapping[str, Any] | None = None) -> Html:
    return tag("a", text, href=href(base, path, query))


def when(seconds: float | None) -> Html:
    """An epoch time as UTC ISO 8601 in a ``<time>`` element ("-" for none)."""
    if not seconds:
        return esc("-")
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return tag("time", moment.strftime("%Y-%m-%d %H:%M:%S"), datetime=moment.isoformat(timespec="seconds"))


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def payload(value: Any) -> Html:
    """A JSON value in a ``<pre>``, escaped, cut at :data:`SHOWN_CHARS` characters."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    if len(text) > SHOWN_CHARS:
        text = text[:SHOWN_CHARS] + f"\n... ({len(text) - SHOWN_CHARS} more characters: see the JSON twin)"
    return tag("pre", text, class_="payload")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str = "none",
          class_: str | None = None) -> Html:
    body = [tag("tr", *(tag("td", cell) for cell in row)) for row in rows]
    if not body:
        return tag("p", empty, class_="empty")
    return tag("table", tag("thead", tag("tr", *(tag("th", h) for h in headers))), tag("tbody", *body),
               class_=class_)


def chart(points: Sequence[Sequence[float]], *, label: str, width: int = 240, height: int = 48) -> Html:
    """A small inline SVG line of ``[time, value]`` points (no style attribute,
    so the page's Content-Security-Policy needs no inline styles)."""
    title = tag("title", label)
    if len(points) < 2:
        return tag("svg", title, tag("text", "collecting samples", x=4, y=height // 2 + 4, font_size=11,
                                     fill="currentColor"),
                   width=width, height=height, viewBox=f"0 0 {width} {height}", role="img", class_="chart")
    t0, t1 = points[0][0], points[-1][0]
    top = max(max(p[1] for p in points), 1.0)
    span = max(t1 - t0, 1e-9)
    line = " ".join(f"{(p[0] - t0) / span * (width - 2) + 1:.1f},{height - 2 - p[1] / top * (height - 14):.1f}"
                    for p in points)
    return tag("svg", title,
               tag("text", f"max {top:.0f}/min", x=4, y=11, font_size=10, fill="currentColor"),
               tag("polyline", points=line, fill="none", stroke="currentColor", stroke_width=1.5),
               width=width, height=height, viewBox=f"0 0 {width} {height}", role="img", class_="chart")


_NAV = (("/", "Overview"), ("/flows", "Flows"), ("/effects", "Effects"), ("/actions", "Actions"),
        ("/metrics", "Metrics"), ("/healthz", "Health"))


def page(base: str, title: str, body: Html, *, refresh_ms: int | None = None, api: str | None = None) -> Html:
    """A whole page: the navigation, ``body`` in ``<main>``, the stylesheet
    and the live-refresh script (both served by the console itself).  With
    ``refresh_ms`` the script fetches the page again that often and swaps its
    ``<main>``; without JavaScript the page is complete as it is."""
    nav = tag("nav", *(link(base, path, text) for path, text in _NAV),
              *([tag("a", "JSON", href=quote(base, safe="/") + api)] if api else []))
    head = Html(
        '<meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{tag('title', title + ' - reliable_flow console')}"
        f'<link rel="stylesheet" href="{esc(href(base, "/static/console.css"))}">'
        f'<script src="{esc(href(base, "/static/console.js"))}" defer></script>'
    )
    main = tag("main", tag("h1", title), body, id="main", data_refresh_ms=refresh_ms)
    return Html(f"<!doctype html>\n<html lang=\"en\"><head>{head}</head><body>{nav}{main}</body></html>\n")
