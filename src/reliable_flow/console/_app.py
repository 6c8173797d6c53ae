"""The WSGI application: routes, query parameters, the token, the answers."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from .._tools.stores import Location
from ..errors import TransportError
from ..statuses import EffectState
from . import _forms as forms
from . import _pages as pages
from ._act import ACTIONS, BULK, Preview, Refused, perform, preview
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
_CSRF = "rf_csrf"    # a random session id; a form's token is an HMAC of it
_FLASH = "rf_flash"  # the sentence an action leaves for the page after its redirect, signed
_FORM_BYTES = 1 << 20
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
                 token: str | None, redact: Redact | None, stuck_after: float, effects: Any = None) -> None:
        if not isinstance(read_only, bool):
            raise TypeError(f"read_only must be True or False, got {read_only!r}")
        if effects is not None:
            from .._effects import EffectRegistry

            if not isinstance(effects, EffectRegistry):
                raise TypeError(f"effects must be an EffectRegistry or None, got {effects!r}")
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ValueError("token must be a non-empty string or None")
        if isinstance(stuck_after, bool) or not isinstance(stuck_after, (int, float)) \
                or not math.isfinite(stuck_after) or stuck_after < 0:
            raise ValueError(f"stuck_after must be a finite number of seconds >= 0, got {stuck_after!r}")
        self.read_only = read_only
        self.effects = effects
        self._secret = secrets.token_bytes(32)  # per app: a restart makes every open form load again
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
            acting = path in ("/act", "/api/act") or path.startswith(("/act/", "/api/act/"))
            if acting and self.read_only:
                raise _Answer(HTTPStatus.FORBIDDEN, "the console is read only: actions need "
                              "`reliable-flow console --allow-actions` (make_app(read_only=False))")
            if method not in ("GET", "HEAD") and not (acting and method == "POST"):
                raise _Answer(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not answered here"
                              + (": the console is read only" if self.read_only else ""))
            if not self._authorised(environ):
                raise _Answer(HTTPStatus.UNAUTHORIZED, "this console needs its token: "
                              "send 'Authorization: Bearer <token>', or log in at /login")
            session, fresh = self._session(environ)
            if acting and method == "POST":
                return self._post(path.partition("/act/")[2], environ, base, session, start_response, api)
            if acting and api:
                status, kind, body = self._act_json(path.partition("/act/")[2], environ, session)
            elif acting:
                status, kind, body = self._act_form(path, environ, base, session)
            else:
                status, kind, body = self._route(path, environ, base, api)
            extra = [] if fresh is None else [("Set-Cookie", self._set(_CSRF, fresh, base))]
            said = _cookies(environ).get(_FLASH)
            if said is not None and kind == "text/html":
                extra.append(("Set-Cookie", self._set(_FLASH, "", base, clear=True)))
                sentence = self._unsigned(said)
                if sentence is not None:
                    body = Html(body.replace("</h1>", "</h1>" + forms.flash(sentence), 1))
            return _send(start_response, method, status, kind, body, extra)
        except (_Answer, BadRequest, NotFound, TransportError) as exc:
            # TransportError: a consumer on another host whose bridge did not answer (or answered amiss)
            status, sentence = ((exc.status, exc.sentence) if isinstance(exc, _Answer) else
                                (HTTPStatus.SERVICE_UNAVAILABLE, str(exc)) if isinstance(exc, TransportError) else
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
        given_cookie = _cookies(environ).get(_COOKIE)
        return given_cookie is not None and hmac.compare_digest(given_cookie.encode(), self._cookie.encode())

    # -- actions ----------------------------------------------------------------------------------

    def _sign(self, text: str) -> str:
        return hmac.new(self._secret, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def _session(self, environ: dict[str, Any]) -> tuple[str, str | None]:
        """The browser's CSRF session id and, when it had none (or not one of
        ours), the new one to set; a read-only console keeps no session."""
        if self.read_only:
            return "", None
        given = _cookies(environ).get(_CSRF, "")
        if re.fullmatch(r"[0-9a-f]{32}", given):
            return given, None
        fresh = secrets.token_hex(16)
        return fresh, fresh

    def _set(self, name: str, value: str, base: str, *, clear: bool = False) -> str:
        return f"{name}={value}; Path={base or '/'}; HttpOnly; SameSite=Strict" + ("; Max-Age=0" if clear else "")

    def _signed(self, sentence: str) -> str:
        """``sentence`` as a cookie value: cut to fit a cookie, percent-encoded, signed."""
        sentence = sentence[:1000]
        while len(quote(sentence, safe="")) > 3000:
            sentence = sentence[: len(sentence) // 2] + "..."
        text = quote(sentence, safe="")
        return f"{text}.{self._sign(text)}"

    def _unsigned(self, value: str) -> str | None:
        text, _, sig = value.rpartition(".")
        return unquote(text) if hmac.compare_digest(sig.encode(), self._sign(text).encode()) else None

    def _act_form(self, path: str, environ: dict[str, Any], base: str, session: str) -> tuple[HTTPStatus, str, str]:
        """``GET /act``: every action; ``GET /act/<name>``: its form, filled from the query."""
        if path == "/act":
            _params(environ, ())
            return HTTPStatus.OK, "text/html", forms.act_index(base)
        name = path[len("/act/"):]
        action = ACTIONS.get(name) or BULK.get(name)
        if action is None:
            raise _Answer(HTTPStatus.NOT_FOUND, f"no action {name!r} here")
        values = _params(environ, [f.name for f in action.fields] + ["actor", "reason"])
        consumers = [t.name for t in self.console.targets]
        selection = None
        if name in BULK:
            values = {**_bulk_defaults(self), **values}
            try:
                selection = preview(self.console, name, values)
            except Refused as exc:  # the form again, saying what is wrong with its values
                selection = Preview(str(exc), [], {}, "Act")
        return HTTPStatus.OK, "text/html", forms.act_page(base, name, values, self._sign(session), consumers,
                                                          selection)

    def _act_json(self, name: str, environ: dict[str, Any], session: str) -> tuple[HTTPStatus, str, str]:
        """``GET /api/act``: every action, its fields and the CSRF token to
        send back; ``GET /api/act/<name>``: one, and for a bulk action what
        its filter selects now (the preview its form shows)."""
        token = self._sign(session)
        if not name:
            _params(environ, ())
            listed = {n: {"title": a.title, "does": a.does, "bulk": n in BULK,
                          "fields": [{"name": f.name, "label": f.label, "required": f.required} for f in a.fields]}
                      for n, a in {**ACTIONS, **BULK}.items()}
            return HTTPStatus.OK, "application/json", _json({"csrf": token, "actions": listed})
        action = ACTIONS.get(name) or BULK.get(name)
        if action is None:
            raise _Answer(HTTPStatus.NOT_FOUND, f"no action {name!r} here")
        values = _params(environ, [f.name for f in action.fields])
        answer: dict[str, Any] = {"csrf": token, "action": name, "fields": [f.name for f in action.fields]}
        if name in BULK:
            try:
                shown = preview(self.console, name, {**_bulk_defaults(self), **values})
            except Refused as exc:
                raise BadRequest(str(exc)) from None
            answer["preview"] = {"sentence": shown.sentence, "rows": shown.rows, "hidden": shown.hidden}
        return HTTPStatus.OK, "application/json", _json(answer)

    def _post(self, name: str, environ: dict[str, Any], base: str, session: str,
              start_response: StartResponse, api: bool = False) -> Iterable[bytes]:
        """``POST /act/<name>``: the CSRF token checked (a 403 otherwise, nothing
        written), the action done or refused, then a redirect (303) with its
        sentence: to ``/actions`` when something changed, else back to the form.
        ``POST /api/act/<name>`` (``api``), its JSON twin: the same checks and
        action, answered 200 with what was done and recorded, or the refusal
        sentence with a 409 (the rules, or the state moved on) or a 400."""
        action = ACTIONS.get(name) or BULK.get(name)
        if action is None:
            raise _Answer(HTTPStatus.NOT_FOUND, f"no action {name!r} here")
        form = _body(environ)
        token = form.pop("csrf", "") or environ.get("HTTP_X_CSRF_TOKEN", "")
        if not session or not _cookies(environ).get(_CSRF) or \
                not hmac.compare_digest(token.encode(), self._sign(session).encode()):
            raise _Answer(HTTPStatus.FORBIDDEN, "the form's CSRF token is missing or wrong (nothing was done): "
                          "load the form again and resend it")
        try:
            outcome = perform(self.console, name, form, self.effects)
            sentence, done = outcome.sentence, outcome.done
        except Refused as exc:
            if api:
                raise _Answer(HTTPStatus.CONFLICT if exc.conflict else HTTPStatus.BAD_REQUEST, str(exc)) from None
            sentence, done = str(exc), False
        if api:
            return _send(start_response, "POST", HTTPStatus.OK, "application/json",
                         _json({"done": done, "sentence": sentence, "actions": list(outcome.records)}), [])
        if done:
            to = href(base, "/actions")
        else:
            keep = {f.name: form.get(f.name, "") for f in action.fields if f.kind != "area"}
            to = href(base, "/act/" + name, {**keep, "actor": form.get("actor"), "reason": form.get("reason")})
        return _send(start_response, "POST", HTTPStatus.SEE_OTHER, "text/plain", sentence,
                     [("Location", to), ("Set-Cookie", self._set(_FLASH, self._signed(sentence), base))])

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
                    return HTTPStatus.OK, "text/html", page(base, data, not self.read_only)
        if path not in _PARAMS:
            raise _Answer(HTTPStatus.NOT_FOUND, f"no page {path!r} here")
        query = _params(environ, _PARAMS[path])
        if path == "/metrics":
            return HTTPStatus.OK, "text/plain; version=0.0.4", c.metrics_text()
        if path == "/healthz":
            health = c.healthz()
            items = health["attention"]
            status = HTTPStatus.SERVICE_UNAVAILABLE if items else HTTPStatus.OK
            if api:
                return status, "application/json", _json(health)
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
        return _page(path, log, lambda: pages.actions_page(base, log, self.read_only))

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


def _bulk_defaults(app: ConsoleApp) -> dict[str, str]:
    """What a bulk form starts with: the first consumer, dead effects, a week's retention."""
    return {"consumer": app.console.targets[0].name, "state": "dead", "store": "producer", "older_than": "604800"}


def _body(environ: dict[str, Any]) -> dict[str, str]:
    """A POST's fields: a form (``application/x-www-form-urlencoded``) or a
    JSON object, whose values become the form's texts (a string as it is, a
    number as written, true as a ticked checkbox, false and null as absent;
    ``result``, any JSON value, as its JSON text)."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > _FORM_BYTES:
        raise BadRequest(f"the form is larger than {_FORM_BYTES} bytes")
    try:
        text = environ["wsgi.input"].read(length).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the form is not valid UTF-8") from None
    if not environ.get("CONTENT_TYPE", "").startswith("application/json"):
        try:
            parsed = parse_qs(text, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise BadRequest("the form is not valid UTF-8") from None
        return {k: v[0] for k, v in parsed.items()}
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(given, dict):
        raise BadRequest("the body must be a JSON object of the action's fields")
    form: dict[str, str] = {}
    for key, value in given.items():
        if key == "result":
            form[key] = json.dumps(value)
        elif isinstance(value, str):
            form[key] = value
        elif value is True:
            form[key] = "1"
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            form[key] = json.dumps(value)
        elif value is not False and value is not None:
            raise BadRequest(f"{key}: must be a string, a number or true/false, got {type(value).__name__}")
    return form


def _cookies(environ: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in environ.get("HTTP_COOKIE", "").split(";"):
        name, _, value = part.strip().partition("=")
        out.setdefault(name, value)
    return out


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
