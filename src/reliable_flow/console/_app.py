"""The WSGI application: routes, query parameters, the token, the answers."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from .._tools.stores import Location
from ..statuses import EffectState
from . import _pages as pages
from ._data import BadRequest, Console, NotFound, Redact
from ._html import Html, href
from ._static import ASSETS

__all__ = ["ConsoleApp"]

StartResponse = Callable[..., Any]

#: Sent with every answer: nothing from elsewhere, no inline script or style,
#: no framing; the console's own stylesheet and script only.
_HEADERS = [
    ("Content-Security-Policy", ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                 "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]
_COOKIE = "rf_console"
_LIMIT = re.compile(r"[0-9]{1,4}")

# path -> the query parameters it takes
_PARAMS = {
    "/": (), "/api/overview": (), "/flows": ("q",), "/api/flows": ("q",),
    "/effects": ("consumer", "state", "name", "after", "limit"),
    "/api/effects": ("consumer", "state", "name", "after", "limit"),
    "/actions": (), "/api/actions": (), "/metrics": (), "/healthz": (), "/login": (),
}


class _Answer(Exception):
    """An answer other than 200, with its sentence."""

    def __init__(self, status: HTTPStatus, sentence: str) -> None:
        super().__init__(sentence)
        self.status, self.sentence = status, sentence


class ConsoleApp:
    """The console as a WSGI application (see :func:`reliable_flow.console.make_app`)."""

    def __init__(self, producer: Location, consumers: Sequence[Location], *, read_only: bool,
                 token: str | None, redact: Redact | None, stuck_after: float) -> None:
        if not isinstance(read_only, bool):
            raise TypeError(f"read_only must be True or False, got {read_only!r}")
        if not read_only:
            raise NotImplementedError("read_only=False: actions from the console are not implemented yet "
                                      "(issue 31, item 3); the console is read only")
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ValueError("token must be a non-empty string or None")
        if isinstance(stuck_after, bool) or not isinstance(stuck_after, (int, float)) \
                or not math.isfinite(stuck_after) or stuck_after < 0:
            raise ValueError(f"stuck_after must be a finite number of seconds >= 0, got {stuck_after!r}")
        self.read_only = read_only
        self._token = token
        self._cookie = None if token is None else hmac.new(
            token.encode("utf-8"), b"reliable_flow console login", hashlib.sha256).hexdigest()
        self.console = Console(producer, consumers, redact=redact, stuck_after=float(stuck_after))

    # -- WSGI -------------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        base = environ.get("SCRIPT_NAME", "").rstrip("/")
        method = environ.get("REQUEST_METHOD", "GET")
        raw = environ.get("PATH_INFO", "") or "/"
        api = raw.startswith("/api/") or raw == "/healthz" and "text/html" not in environ.get("HTTP_ACCEPT", "")
        try:
            try:  # WSGI hands the path over as latin-1 text of its bytes
                path = raw.encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):
                raise _Answer(HTTPStatus.BAD_REQUEST, "the path is not valid UTF-8") from None
            if path.startswith("/static/"):
                return self._static(path, method, start_response)
            if path == "/login" and self._token is not None:
                return self._login(environ, base, method, start_response)
            if method not in ("GET", "HEAD"):
                raise _Answer(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not answered here: the console is read only")
            if not self._authorised(environ):
                raise _Answer(HTTPStatus.UNAUTHORIZED, "this console needs its token: "
                              "send 'Authorization: Bearer <token>', or log in at /login")
            status, kind, body = self._route(path, environ, base, api)
        except (_Answer, BadRequest, NotFound) as exc:
            status, sentence = ((exc.status, exc.sentence) if isinstance(exc, _Answer) else
                                (HTTPStatus.BAD_REQUEST, str(exc)) if isinstance(exc, BadRequest) else
                                (HTTPStatus.NOT_FOUND, str(exc.args[0])))
            if api:
                kind, body = "application/json", _json({"error": sentence})
            else:
                kind, body = "text/html", pages.error_page(base, f"{status.value} {status.phrase}", sentence)
        return _send(start_response, method, status, kind, body,
                     [("WWW-Authenticate", "Bearer")] if status is HTTPStatus.UNAUTHORIZED else [])

    def _authorised(self, environ: dict[str, Any]) -> bool:
        if self._token is None or self._cookie is None:
            return True
        given = environ.get("HTTP_AUTHORIZATION", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), self._token.encode()):
            return True
        for part in environ.get("HTTP_COOKIE", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == _COOKIE and hmac.compare_digest(value.encode(), self._cookie.encode()):
                return True
        return False

    def _route(self, path: str, environ: dict[str, Any], base: str, api: bool) -> tuple[HTTPStatus, str, str]:
        c = self.console
        for prefix, one in (("/flows/", c.flow), ("/effects/", c.effect)):
            for where in (prefix, "/api" + prefix):
                if path.startswith(where) and len(path) > len(where):
                    _params(environ, ())
                    data = one(path[len(where):])
                    if where.startswith("/api"):
                        return HTTPStatus.OK, "application/json", _json(data)
                    page = pages.flow_page if prefix == "/flows/" else pages.effect_page
                    return HTTPStatus.OK, "text/html", page(base, data)
        if path not in _PARAMS:
            raise _Answer(HTTPStatus.NOT_FOUND, f"no page {path!r} here")
        query = _params(environ, _PARAMS[path])
        if path == "/metrics":
            return HTTPStatus.OK, "text/plain; version=0.0.4", c.metrics_text()
        if path == "/healthz":
            items = c.healthz()["attention"]
            status = HTTPStatus.SERVICE_UNAVAILABLE if items else HTTPStatus.OK
            if api:
                return status, "application/json", _json({"attention": items})
            return status, "text/html", pages.health_page(base, items)
        if path in ("/", "/api/overview"):
            overview = c.overview()
            return _page(path, overview, lambda: pages.overview_page(base, overview))
        if path in ("/flows", "/api/flows"):
            q = query.get("q")
            if q is None and path == "/api/flows":
                raise BadRequest("q is required: a flow id, an event id, an effect key or a correlation id")
            found = None if q is None else c.find_flows(q)
            return _page(path, found, lambda: pages.flows_page(base, found))
        if path in ("/effects", "/api/effects"):
            limit = query.get("limit", "50")
            if not _LIMIT.fullmatch(limit):
                raise BadRequest(f"limit must be a whole number between 1 and 500, got {limit!r}")
            listed = c.effects(consumer=query.get("consumer"), state=query.get("state") or None,
                               name=query.get("name") or None, after=query.get("after") or None, limit=int(limit))
            return _page(path, listed, lambda: pages.effects_page(
                base, listed, [t.name for t in c.targets], [s.value for s in EffectState]))
        log = c.actions()  # /actions, /api/actions
        return _page(path, log, lambda: pages.actions_page(base, log))

    def _static(self, path: str, method: str, start_response: StartResponse) -> Iterable[bytes]:
        asset = ASSETS.get(path[len("/static/"):])
        if asset is None or method not in ("GET", "HEAD"):
            return _send(start_response, method, HTTPStatus.NOT_FOUND, "text/plain", "no such asset", [])
        kind, body = asset
        headers = [("Content-Type", kind), ("Content-Length", str(len(body))), *_HEADERS]
        start_response("200 OK", headers)
        return [b"" if method == "HEAD" else body]

    def _login(self, environ: dict[str, Any], base: str, method: str,
               start_response: StartResponse) -> Iterable[bytes]:
        """``GET /login``: the form; ``POST /login``: the token checked, and a
        cookie (derived from the token, not the token) set for the console's path."""
        if method in ("GET", "HEAD"):
            return _send(start_response, method, HTTPStatus.OK, "text/html", pages.login_page(base, False), [])
        if method != "POST":
            return _send(start_response, method, HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", "GET or POST", [])
        try:
            length = min(int(environ.get("CONTENT_LENGTH") or 0), 4096)
        except ValueError:
            length = 0
        form = parse_qs(environ["wsgi.input"].read(length).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0].strip()
        if self._token is None or not hmac.compare_digest(given.encode(), self._token.encode()):
            return _send(start_response, method, HTTPStatus.FORBIDDEN, "text/html", pages.login_page(base, True), [])
        cookie = f"{_COOKIE}={self._cookie}; Path={base or '/'}; HttpOnly; SameSite=Strict"
        return _send(start_response, method, HTTPStatus.SEE_OTHER, "text/plain", "logged in",
                     [("Set-Cookie", cookie), ("Location", href(base, "/"))])


def _page(path: str, data: Any, html: Callable[[], Html]) -> tuple[HTTPStatus, str, str]:
    if path.startswith("/api/"):
        return HTTPStatus.OK, "application/json", _json(data)
    return HTTPStatus.OK, "text/html", html()


def _params(environ: dict[str, Any], allowed: Sequence[str]) -> dict[str, str]:
    """The query parameters, each once and each one the page takes, or a 400 saying which is not."""
    try:
        parsed = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True, encoding="utf-8",
                          errors="strict")
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid UTF-8") from None
    for name, values in parsed.items():
        if name not in allowed:
            takes = f"takes only {', '.join(allowed)}" if allowed else "takes no query parameter"
            raise BadRequest(f"unknown query parameter {name!r}: this page {takes}")
        if len(values) > 1:
            raise BadRequest(f"query parameter {name!r} is given {len(values)} times")
    return {name: values[0] for name, values in parsed.items()}


def _json(data: Any) -> str:
    """JSON with ``<``, ``>`` and ``&`` as ``\\u`` escapes: the same values, and
    nothing a browser that sniffs despite ``nosniff`` could take for markup."""
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") + "\n"


def _send(start_response: StartResponse, method: str, status: HTTPStatus, kind: str, body: str,
          extra: list[tuple[str, str]]) -> Iterable[bytes]:
    data = body.encode("utf-8")
    charset = "" if "charset" in kind or "version" in kind else "; charset=utf-8"
    if "version" in kind:
        kind += "; charset=utf-8"
    headers = [("Content-Type", kind + charset), ("Content-Length", str(len(data))), *_HEADERS, *extra]
    start_response(f"{status.value} {status.phrase}", headers)
    return [b"" if method == "HEAD" else data]
