"""``reliable_flow.console``: every page and its JSON twin on both engines,
called as a WSGI server calls it; hostile data shown as text; nothing written;
the token; the command line's refusals and its clean stop."""

from __future__ import annotations

import io
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote
from wsgiref.util import setup_testing_defaults

import pytest

from engine_reads import contents, is_pg
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectExecutor,
    EffectRegistry,
    PermanentFailure,
    Producer,
    Protocol,
    relay,
)
from reliable_flow._tools.drilldown import effect_report, flow_report
from reliable_flow._tools.inspection import inspect_files
from reliable_flow.console import make_app
from support import child_env, child_process, run_cli, troubled_history

At = Callable[[str], str]

#: In a flow id (no control characters: the envelope refuses them), a payload, an error, a reason.
SCRIPT = '<script>alert("x")</script>'
FLOW = "<script>f</script>'\"/?#%&"
EVENT = "ev<b>1</b>'\""
NOTE = f"{SCRIPT}\n\"quoted\" 'single' & <b>bold</b>"
SECRET = "hunter2-payload"
EFFECT_SECRET = "hunter2-effect"
NOTES = Protocol(name="notes", initial="new", transitions={"new": ["noted"], "noted": ["noted"]},
                 schemas={1: lambda kind, payload: dict(payload)})


class Client:
    """The console called as a WSGI server calls it."""

    def __init__(self, app: Any, script_name: str = "") -> None:
        self.app, self.script_name = app, script_name

    def get(self, path: str, query: str = "", *, method: str = "GET", headers: dict[str, str] | None = None,
            body: bytes = b"") -> tuple[int, dict[str, str], str]:
        environ: dict[str, Any] = {}
        setup_testing_defaults(environ)
        # what a server puts there: the path's bytes, percent-decoded, as latin-1 text
        from urllib.parse import unquote_to_bytes

        environ.update(REQUEST_METHOD=method, SCRIPT_NAME=self.script_name, QUERY_STRING=query,
                       PATH_INFO=unquote_to_bytes(path).decode("latin-1"), CONTENT_LENGTH=str(len(body)))
        environ["wsgi.input"] = io.BytesIO(body)
        environ.update({f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()})
        if "Content-Type" in (headers or {}):  # a server passes it as CONTENT_TYPE
            environ["CONTENT_TYPE"] = (headers or {})["Content-Type"]
        answer: dict[str, Any] = {}

        def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
            answer["status"], answer["headers"] = int(status.split()[0]), dict(response_headers)

        data = b"".join(self.app(environ, start_response))
        return answer["status"], answer["headers"], data.decode("utf-8")

    def ok(self, path: str, query: str = "") -> str:
        status, _, text = self.get(path, query)
        assert status == 200, (path, query, status, text[:500])
        return text

    def json(self, path: str, query: str = "", status: int = 200) -> Any:
        got, headers, text = self.get(path, query)
        assert got == status, (path, query, got, text[:500])
        assert headers["Content-Type"].startswith("application/json")
        return json.loads(text)


def _hostile(at: At) -> tuple[str, str]:
    """A producer and consumer (notes protocol) whose flow id, event id,
    payload, meta, effect payload, effect error and an operator's reason all
    hold markup, quotes and newlines; and a flow ``big`` with a payload near
    the envelope's limit."""
    effects = EffectRegistry()

    def declined(call: Any) -> Any:
        raise PermanentFailure(f"{SCRIPT}\nsecond line \"q\"")

    effects.register("notify", declined)

    def handler(ctx: ApplyContext) -> None:
        ctx.schedule("notify", {"to": SCRIPT, "secret": EFFECT_SECRET})

    p_at, c_at = at("producer"), at("consumer")
    with Producer(p_at, NOTES) as producer, Consumer(c_at, NOTES, handlers=(handler,), effects=effects) as consumer:
        producer.advance(EVENT, FLOW, expected_seq=0, kind="noted", payload={"note": NOTE, "secret": SECRET},
                         meta={"correlation_id": "corr<i>42</i>"})
        producer.advance("big1", "big", expected_seq=0, kind="noted",
                         payload={f"k{i}": "<" * 4000 for i in range(3)})
        while relay(producer, consumer).status != "idle":
            pass
        consumer.process_all()
        executor = EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=30))
        executor.run_until_idle()
        key = f"default:{EVENT}:notify"
        consumer.admin.retry_effect(key, actor="<i>ops</i>", reason=f"{SCRIPT}\ntry again")
        executor.run_until_idle()
        assert consumer.scheduled_effect(key).state == "dead"
    return p_at, c_at


def _every_page(client: Client, key: str) -> list[str]:
    """Every page and JSON twin of a scenario (the text of each)."""
    flow = quote(FLOW, safe="")
    pages = [("/", ""), ("/api/overview", ""), ("/flows", ""), ("/flows", f"q={quote(EVENT)}"),
             ("/api/flows", f"q={quote(EVENT)}"), (f"/flows/{flow}", ""), (f"/api/flows/{flow}", ""),
             ("/effects", ""), ("/api/effects", ""), (f"/effects/{quote(key, safe='')}", ""),
             (f"/api/effects/{quote(key, safe='')}", ""), ("/actions", ""), ("/api/actions", ""), ("/metrics", ""),
             ("/flows/big", "")]
    texts = [client.ok(path, query) for path, query in pages]
    status, _, health = client.get("/healthz")
    assert status == 503
    return [*texts, health]


# -- every page, both engines ---------------------------------------------------------------------


def test_every_page_answers_what_inspect_answers(at: At) -> None:
    p_at, c_at = at("producer"), at("consumer")
    troubled_history(p_at, c_at)
    client = Client(make_app(p_at, [c_at]))
    overview = client.json("/api/overview")
    report = inspect_files(p_at, c_at)
    assert overview["attention"] == report["attention"]  # the same items, the same order
    assert [a["kind"] for a in overview["attention"]] == ["blocked", "set_aside"]
    (default,) = overview["consumers"]
    assert default["blocked"] == len(report["consumer"]["blocked"]) and overview["attention_more"] is False
    assert overview["produced"] == {"events": report["producer"]["events"], "flows": report["producer"]["flows"]}
    assert (default["name"], default["undelivered"], default["unapplied"]) == ("default", 2, 2)
    html = client.ok("/")
    assert "unsupported_schema" in html and "set_aside" in html and 'href="/flows/A"' in html
    assert "Needs attention (2)" in html and "<svg" in html

    assert client.json("/api/flows", "q=A2")["flows"] == [{"flow_id": "A", "matched": ["event_id"]}]
    assert client.json("/api/flows", "q=B")["flows"] == [{"flow_id": "B", "matched": ["flow_id"]}]
    assert client.json("/api/flows", "q=nothing")["flows"] == []
    assert 'href="/flows/A"' in client.ok("/flows", "q=A2")

    flow_a = client.json("/api/flows/A")
    assert flow_a["consumers"][0]["flow"] == flow_report(p_at, c_at, "A")["consumer"]["flow"]
    assert flow_a["consumers"][0]["why"].startswith("blocked: unsupported_schema: schema 2 is not decoded")
    assert [e["payload"] for e in flow_a["producer"]["events"]] == [{"amount": 3}, {"units": 3}]
    assert "waiting for seq 2" in client.ok("/flows/B")
    page_c = client.ok("/flows/C")
    assert "id_conflict" in page_c and "Consumer default" in page_c
    assert "is not delivered yet" in client.json("/api/flows/D")["consumers"][0]["why"]

    actions = client.json("/api/actions")
    assert [(a["action"], a["event_id"], a["reason"]) for a in actions["producer"]["operator_actions"]] == [
        ("redeliver", "B2", "kick it")]
    assert "kick it" in client.ok("/actions")
    assert "reliable_flow_" in client.ok("/metrics")
    status, _, text = client.get("/healthz")
    assert status == 503 and json.loads(text) == {"attention": report["attention"]}
    status, _, text = client.get("/healthz", headers={"Accept": "text/html"})
    assert status == 503 and "2 need attention" in text


def test_effects_pages_page_by_key_and_show_the_history(at: At) -> None:
    p_at, c_at = _hostile(at)
    client = Client(make_app(p_at, [c_at]))
    key = f"default:{EVENT}:notify"
    listed = client.json("/api/effects", "state=dead&name=notify")
    assert [e["key"] for e in listed["effects"]] == [key, "default:big1:notify"] and listed["next"] is None
    assert client.json("/api/effects", "state=succeeded")["effects"] == []
    assert client.json("/api/effects", "name=other")["effects"] == []
    report = client.json(f"/api/effects/{quote(key, safe='')}")
    expected = effect_report(p_at, c_at, key)
    assert report["consumer"]["history"] == expected["consumer"]["history"]
    assert report["attention"] == expected["attention"]
    assert [t["transition"] for t in report["consumer"]["history"]][:2] == ["scheduled", "claimed"]
    assert "due_at" in report["consumer"]["history"][0]
    html = client.ok(f"/effects/{quote(key, safe='')}")
    assert 'class="timeline"' in html and "<strong>scheduled</strong>" in html and "retry" in html


def test_keyset_pages_follow_one_another(tmp_path: Path) -> None:
    at = {label: str(tmp_path / f"{label}.db") for label in ("producer", "consumer")}
    effects = EffectRegistry()
    effects.register("notify", lambda call: None)

    def handler(ctx: ApplyContext) -> None:
        ctx.schedule("notify", {"n": ctx.event.flow_id})

    with Producer(at["producer"], NOTES) as producer, \
            Consumer(at["consumer"], NOTES, handlers=(handler,), effects=effects) as consumer:
        for n in range(7):
            producer.advance(f"e{n}", f"f{n}", expected_seq=0, kind="noted", payload={})
        while relay(producer, consumer).status != "idle":
            pass
        consumer.process_all()
    client = Client(make_app(at["producer"], [at["consumer"]]))
    seen, after = [], ""
    for _ in range(4):
        page = client.json("/api/effects", f"limit=3&after={quote(after)}")
        seen += [e["key"] for e in page["effects"]]
        if page["next"] is None:
            break
        after = page["next"]
    assert seen == [f"default:e{n}:notify" for n in range(7)]
    html = client.ok("/effects", "limit=3")
    assert "next page" in html and "after=default%3Ae2%3Anotify" in html


# -- hostile data ------------------------------------------------------------------------------------


def test_hostile_text_is_escaped_on_every_page(at: At) -> None:
    p_at, c_at = _hostile(at)
    client = Client(make_app(p_at, [c_at]))
    key = f"default:{EVENT}:notify"
    for text in _every_page(client, key):
        assert "<script>" not in text and "<b>" not in text and "<i>" not in text
    flow_page = client.ok(f"/flows/{quote(FLOW, safe='')}")
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in flow_page  # the payload, as text
    assert "&lt;script&gt;f&lt;/script&gt;&#x27;&quot;/?#%&amp;" in flow_page  # the flow id, as text
    assert f'href="/flows/{quote(FLOW, safe="")}"' in client.ok("/")  # in an attribute: encoded
    assert "second line" in flow_page  # the effect's error, newline and all
    # the search finds the flow by its correlation id and by its effect's key
    assert client.json("/api/flows", f"q={quote('corr<i>42</i>')}")["flows"] == [
        {"flow_id": FLOW, "matched": ["correlation_id"]}]
    assert client.json("/api/flows", f"q={quote(key)}")["flows"] == [{"flow_id": FLOW, "matched": ["effect_key"]}]
    # a payload near the envelope's limit: cut on the page, whole in the JSON twin
    big = client.ok("/flows/big")
    assert "more characters: see the JSON twin" in big
    assert client.json("/api/flows/big")["producer"]["events"][0]["payload"]["k2"] == "<" * 4000


def test_redact_hides_payloads_everywhere(at: At) -> None:
    p_at, c_at = _hostile(at)
    seen: list[str] = []

    def redact(kind: str, payload: Any) -> Any:
        seen.append(kind)
        payload.pop("secret", None)  # in place: the console hands over a copy
        return payload

    client = Client(make_app(p_at, [c_at], redact=redact))
    key = f"default:{EVENT}:notify"
    for text in _every_page(client, key):
        assert SECRET not in text and EFFECT_SECRET not in text
    assert {"noted", "notify"} <= set(seen)
    with Consumer(c_at, NOTES) as consumer:  # nothing stored changed
        assert consumer.scheduled_effect(key).payload["secret"] == EFFECT_SECRET

    def broken(kind: str, payload: Any) -> Any:
        raise RuntimeError(SECRET)

    failing = Client(make_app(p_at, [c_at], redact=broken))
    flow = failing.json(f"/api/flows/{quote(FLOW, safe='')}")
    assert flow["producer"]["events"][0]["payload"] == {"redact_failed": "RuntimeError"}
    assert SECRET not in failing.ok(f"/flows/{quote(FLOW, safe='')}")


@pytest.mark.parametrize(("path", "query", "status", "words"), [
    ("/flows/%00x", "", 400, "flow_id must not contain control characters"),
    ("/flows/" + "x" * 129, "", 400, "flow_id must be 1 to 128 characters"),
    ("/flows/%ff", "", 400, "not valid UTF-8"),
    ("/api/flows/nope", "", 404, "no flow 'nope'"),
    ("/effects/nokey", "", 404, "no effect 'nokey'"),
    ("/api/flows", "", 400, "q is required"),
    ("/flows", "q=%0A", 400, "q must not contain control characters"),
    ("/flows", "q=a&q=b", 400, "given 2 times"),
    ("/effects", "state=bogus", 400, "state must be one of"),
    ("/api/effects", "limit=0", 400, "limit must be between 1 and 500"),
    ("/effects", "limit=-1", 400, "limit must be a whole number"),
    ("/effects", "after=missing", 400, "after must be the key of an effect (the last of the page before)"),
    ("/effects", "consumer=other", 400, "consumer must be one of ['default']"),
    ("/", "x=1", 400, "unknown query parameter 'x'"),
    ("/nothing", "", 404, "no page '/nothing'"),
])
def test_bad_requests_get_a_sentence(tmp_path: Path, path: str, query: str, status: int, words: str) -> None:
    p_at, c_at = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    troubled_history(p_at, c_at)
    got, headers, text = Client(make_app(p_at, [c_at])).get(path, query)
    assert got == status
    if path.startswith("/api/"):
        assert words in json.loads(text)["error"]
    else:
        assert "text/html" in headers["Content-Type"] and words.replace("'", "&#x27;") in text


def test_nothing_is_written_and_nothing_but_get_is_answered(at: At) -> None:
    p_at, c_at = _hostile(at)
    before = (contents(p_at), contents(c_at))
    client = Client(make_app(p_at, [c_at]))
    _every_page(client, f"default:{EVENT}:notify")
    assert client.get("/", method="POST")[0] == 405
    assert client.get("/flows/big", method="DELETE")[0] == 405
    assert (contents(p_at), contents(c_at)) == before


@pytest.mark.postgres
def test_a_postgresql_password_is_never_shown(pg_cluster: Any, tmp_path: Path) -> None:
    from engine_reads import new_location

    p_at, c_at = new_location("postgres", tmp_path, "producer"), new_location("postgres", tmp_path, "consumer")
    troubled_history(p_at, c_at)
    url, _, schema = c_at.partition("#")
    with_password = f"{url}&password=sw0rdfish-secret#{schema}"  # the test server trusts: it is ignored
    client = Client(make_app(p_at.replace("#", "&password=sw0rdfish-secret#"), [f"default={with_password}"]))
    for path in ("/", "/api/overview", "/flows/A", "/api/flows/A", "/actions", "/metrics"):
        assert "sw0rdfish" not in client.ok(path)
    assert "password=***" in client.ok("/")  # the location is shown, its password left out


# -- the token, the mount, the arguments -----------------------------------------------------------


def test_the_token_is_needed_for_every_page(tmp_path: Path) -> None:
    p_at, c_at = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    troubled_history(p_at, c_at)
    client = Client(make_app(p_at, [c_at], token="s3cret-token"))
    for path in ("/", "/api/overview", "/flows/A", "/metrics", "/healthz"):
        status, headers, _ = client.get(path)
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer", path
    assert client.get("/", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert client.get("/", headers={"Authorization": "Bearer s3cret-token"})[0] == 200
    assert client.get("/login")[0] == 200
    assert client.get("/login", method="POST", body=b"token=wrong")[0] == 403
    status, headers, _ = client.get("/login", method="POST", body=b"token=s3cret-token")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"].split(";")[0]
    assert "s3cret-token" not in cookie and "HttpOnly" in headers["Set-Cookie"]
    assert client.get("/flows/A", headers={"Cookie": cookie})[0] == 200
    assert client.get("/flows/A", headers={"Cookie": "rf_console=forged"})[0] == 401


def test_mounted_under_a_prefix_every_link_keeps_it(tmp_path: Path) -> None:
    p_at, c_at = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    troubled_history(p_at, c_at)
    html = Client(make_app(p_at, [c_at]), script_name="/ops/console").ok("/")
    assert 'href="/ops/console/flows/A"' in html and 'src="/ops/console/static/console.js"' in html
    assert 'href="/flows' not in html


def test_make_app_refuses_bad_arguments(tmp_path: Path) -> None:
    p_at, c_at = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    troubled_history(p_at, c_at)
    with pytest.raises(TypeError, match="consumers must be a list"):
        make_app(p_at, c_at)
    with pytest.raises(ValueError, match="at least one consumer"):
        make_app(p_at, [])
    for bad in (float("nan"), float("inf"), -1, True, "5"):
        with pytest.raises(ValueError, match="stuck_after"):
            make_app(p_at, [c_at], stuck_after=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="read_only"):
        make_app(p_at, [c_at], read_only="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="effects"):
        make_app(p_at, [c_at], read_only=False, effects="mod:REGISTRY")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token"):
        make_app(p_at, [c_at], token=" ")
    with pytest.raises(ValueError, match="names consumer 'billing', but that store is consumer 'default'"):
        make_app(p_at, [f"billing={c_at}"])
    with pytest.raises(FileNotFoundError):
        make_app(p_at, [str(tmp_path / "absent.db")])
    assert not (tmp_path / "absent.db").exists()
    assert make_app(p_at, [f"default={c_at}"]).console.targets[0].name == "default"


# -- the command line ----------------------------------------------------------------------------------


def test_the_command_refuses_what_it_must(tmp_path: Path) -> None:
    p_at, c_at = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    troubled_history(p_at, c_at)
    exposed = run_cli("console", p_at, c_at, "--host", "0.0.0.0", "--port", "0")
    assert exposed.returncode == 2 and "without --token-file" in exposed.stderr
    acting = run_cli("console", p_at, c_at, "--port", "0", "--allow-actions", "--effects", "no_such_module:X")
    assert acting.returncode == 2 and "--effects" in acting.stderr
    missing = run_cli("console", p_at, str(tmp_path / "absent.db"), "--port", "0")
    assert missing.returncode == 2 and "absent.db" in missing.stderr


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_server_serves_and_stops_cleanly(tmp_path: Path, stop: signal.Signals) -> None:
    from urllib.request import urlopen

    p_at, c_at = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    troubled_history(p_at, c_at)
    (tmp_path / "token").write_text("tok\n")
    args = [sys.executable, "-m", "reliable_flow", "console", p_at, c_at, "--port", "0",
            "--token-file", str(tmp_path / "token")]
    with child_process(args, cwd=tmp_path, env=child_env()) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        from urllib.request import Request

        with urlopen(Request(url + "api/overview", headers={"Authorization": "Bearer tok"}), timeout=10) as r:
            assert json.loads(r.read())["attention"][0]["kind"] == "blocked"
        started = time.monotonic()
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "console: stopped" in out and time.monotonic() - started < 5
    assert not is_pg(p_at)


def test_several_consumers_each_answer_for_themselves(tmp_path: Path) -> None:
    from reliable_flow.reservation import RESERVATION

    p_at, c_at, b_at = (str(tmp_path / f"{n}.db") for n in ("p", "c", "b"))
    troubled_history(p_at, c_at)
    with Producer(p_at, RESERVATION) as producer, Consumer(b_at, RESERVATION, name="billing") as billing:
        producer.admin.register_consumer("billing", actor="ops", reason="a second reader")
        relay(producer, billing, event_id="A1")
        billing.process_all()
    client = Client(make_app(p_at, [c_at, f"billing={b_at}"]))
    overview = client.json("/api/overview")
    assert [c["name"] for c in overview["consumers"]] == ["default", "billing"]
    expected = inspect_files(p_at, c_at)["attention"]
    expected += [a for a in inspect_files(p_at, b_at)["attention"] if a not in expected]
    assert overview["attention"] == expected  # each inspect's items, in its order; the shared set-aside once
    assert [a["kind"] for a in overview["attention"]].count("set_aside") == 1
    flow = client.json("/api/flows/A")
    assert [c["name"] for c in flow["consumers"]] == ["default", "billing"]
    assert set(flow["producer"]["events"][0]["deliveries"]) == {"default", "billing"}
    assert client.json("/api/effects", "consumer=billing")["consumer"] == "billing"
    assert "to billing" in client.ok("/flows/A")
