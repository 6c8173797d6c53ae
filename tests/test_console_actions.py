"""The console's actions (``make_app(read_only=False)``), on both engines,
called as a WSGI server calls it: each action done through the command
line's calls and recorded the same way; the CSRF token; read only by
default; refusals as sentences; bulk actions with a count and a dry run;
two operators retrying one effect at once."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from engine_reads import contents
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectExecutor,
    EffectRegistry,
    PermanentFailure,
    Producer,
    relay,
)
from reliable_flow._tools.drilldown import effect_report
from reliable_flow.console import make_app
from reliable_flow.errors import NotResolvable
from reliable_flow.reservation import RESERVATION
from support import dead_effects
from test_console import Client

At = Callable[[str], str]
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def scene(at: At) -> tuple[str, str]:
    """A producer and its consumer with something for every action: dead
    effects ``notify`` for A1, B1, C1, E1; C1 set aside; D1 pending, never
    relayed; A2 and F2 blocked (schema 2)."""
    p_at, c_at = at("producer"), at("consumer")
    effects = EffectRegistry()

    def declined(call: Any) -> Any:
        raise PermanentFailure("declined")

    effects.register("notify", declined)

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.flow_id in "ABCE":
            ctx.schedule("notify", {"flow": ctx.event.flow_id})

    with Producer(p_at, RESERVATION) as producer, \
            Consumer(c_at, RESERVATION, handlers=(handler,), effects=effects) as consumer:
        for flow in "ABE":
            producer.advance(f"{flow}1", flow, expected_seq=0, kind="reserved", payload={"amount": 3})
        producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"units": 3}, schema=2)
        producer.advance("F1", "F", expected_seq=0, kind="reserved", payload={"amount": 1})
        producer.advance("F2", "F", expected_seq=1, kind="confirmed", payload={"units": 1}, schema=2)
        producer.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 1})
        consumer.receive({"event_id": "C1", "flow_id": "C", "seq": 1, "kind": "reserved",
                          "schema": 1, "payload": {"amount": 9}})
        while relay(producer, consumer).status != "idle":
            pass
        consumer.process_all()
        EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=30)).run_until_idle()
        producer.advance("D1", "D", expected_seq=0, kind="reserved", payload={"amount": 1})
    return p_at, c_at


class Operator(Client):
    """A browser's worth of state: the cookies the console set, the forms' tokens."""

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        self.cookies: dict[str, str] = {}

    def call(self, path: str, query: str = "", *, method: str = "GET", body: bytes = b"",
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        sent = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items()), **FORM, **(headers or {})}
        status, got, text = self.get(path, query, method=method, body=body, headers=sent)
        cookie = got.get("Set-Cookie")
        if cookie:
            name, _, value = cookie.split(";")[0].partition("=")
            if "Max-Age=0" in cookie:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return status, got, text

    def token(self, action: str) -> str:
        status, _, text = self.call(f"/act/{action}")
        assert status == 200, text[:500]
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', text)
        assert found is not None
        return found.group(1)

    def act(self, action: str, **fields: str) -> tuple[str, str]:
        """POST the form (with its token, after loading it), follow the
        redirect: where it went and the flash sentence the page shows."""
        form = {"csrf": self.token(action), "actor": "alice", "reason": "INC-7: checked", **fields}
        status, headers, _ = self.call(f"/act/{action}", method="POST", body=urlencode(form).encode())
        assert status == 303, status
        to = headers["Location"]
        path, _, query = to.partition("?")
        status, _, text = self.call(path, query)
        assert status == 200, text[:500]
        found = re.search(r'<p class="flash[^"]*" role="status">(.*?)</p>', text, re.DOTALL)
        assert found is not None, text[:2000]
        return path, found.group(1).replace("&#x27;", "'").replace("&quot;", '"')


def test_each_action_is_done_and_recorded_as_the_command_line_records_it(at: At) -> None:
    p_at, c_at = scene(at)
    op = Operator(make_app(p_at, [c_at], read_only=False))
    envelope = ('{"event_id": "F2b", "flow_id": "F", "seq": 2, "kind": "confirmed", "schema": 1, '
                '"payload": {"units": 1}}')
    done = [
        ("redeliver", {"consumer": "default", "event_id": "C1"}, "event 'C1' is pending again"),
        ("skip-delivery", {"consumer": "default", "event_id": "D1"}, "will never get event 'D1'"),
        ("skip-event", {"consumer": "default", "event_id": "A2"}, "event 'A2' skipped"),
        ("replace-event", {"consumer": "default", "event_id": "F2", "envelope": envelope}, "replaced by 'F2b'"),
        ("retry", {"consumer": "default", "key": "default:A1:notify"}, "is pending again, due now"),
        ("resolve", {"consumer": "default", "key": "default:B1:notify", "result": '{"parcel": "P-7"}'},
         'is succeeded, result {"parcel": "P-7"}'),
        ("cancel", {"consumer": "default", "key": "default:E1:notify"}, "it will never run"),
        ("register", {"name": "billing", "from_now": "1"}, "consumer 'billing' registered"),
        ("remove", {"name": "billing"}, "consumer 'billing' removed"),
    ]
    for action, fields, said in done:
        path, flash = op.act(action, **fields)
        assert (path, said in flash) == ("/actions", True), (action, flash)
    log = [a for a in op.json("/api/actions")["log"] if a["actor"] == "alice"]  # not the scene's own registration
    assert len(log) == len(done) and {a["reason"] for a in log} == {"INC-7: checked"}
    assert "INC-7: checked" in op.ok("/actions")
    with Producer(p_at, RESERVATION) as producer, Consumer(c_at, RESERVATION) as consumer:
        assert [(a.action, a.event_id) for a in producer.admin.operator_actions()] == [
            ("redeliver", "C1"), ("skip", "D1")]
        assert [(a.action, a.consumer) for a in producer.admin.registry_actions() if a.actor == "alice"] == [
            ("register", "billing"), ("remove", "billing")]
        assert [(a.action, a.event_id) for a in consumer.admin.operator_actions()] == [
            ("skip", "A2"), ("replace", "F2")]
        assert [(a.action, a.key) for a in consumer.admin.effect_actions()] == [
            ("retry", "default:A1:notify"), ("resolve", "default:B1:notify"), ("cancel", "default:E1:notify")]
        assert consumer.scheduled_effect("default:B1:notify").result == {"parcel": "P-7"}
    # what `reliable-flow inspect --effect` shows
    assert [a["actor"] for a in effect_report(p_at, c_at, "default:A1:notify")["consumer"]["actions"]] == ["alice"]


def test_without_the_csrf_token_or_with_a_wrong_one_it_is_403_and_nothing_is_written(at: At) -> None:
    p_at, c_at = scene(at)
    app = make_app(p_at, [c_at], read_only=False)
    op, other = Operator(app), Operator(app)
    token, foreign = op.token("retry"), other.token("retry")
    elsewhere = Operator(make_app(p_at, [c_at], read_only=False)).token("retry")
    before = (contents(p_at), contents(c_at))
    fields = {"consumer": "default", "key": "default:A1:notify", "actor": "mallory", "reason": "x"}
    for form, cookies in [(fields, op.cookies),                                 # no token
                          ({**fields, "csrf": "0" * 64}, op.cookies),           # a made-up one
                          ({**fields, "csrf": foreign}, op.cookies),            # another session's
                          ({**fields, "csrf": elsewhere}, op.cookies),          # another console's
                          ({**fields, "csrf": token}, {})]:                     # the right one, no cookie
        status, _, text = op.get("/act/retry", method="POST", body=urlencode(form).encode(),
                                 headers={**FORM, "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())})
        assert status == 403 and "CSRF token" in text, (form, cookies, status)
    assert (contents(p_at), contents(c_at)) == before


def test_read_only_by_default_every_action_is_refused_and_nothing_written(at: At) -> None:
    p_at, c_at = scene(at)
    acting = Operator(make_app(p_at, [c_at], read_only=False))
    token = acting.token("retry")
    before = (contents(p_at), contents(c_at))
    op = Operator(make_app(p_at, [c_at]))
    for path in ("/act", "/act/retry", "/act/retry-all", "/act/nosuch"):
        assert op.call(path)[0] == 403, path
    form = {"csrf": token, "consumer": "default", "key": "default:A1:notify", "actor": "a", "reason": "r"}
    status, _, text = op.call("/act/retry", method="POST", body=urlencode(form).encode())
    assert status == 403 and "read only" in text
    assert op.call("/actions", method="POST")[0] == 405
    assert "read only" in op.ok("/actions") and 'href="/act"' not in op.ok("/actions")
    assert (contents(p_at), contents(c_at)) == before


def test_a_refused_action_is_a_sentence_and_nothing_is_recorded(at: At) -> None:
    p_at, c_at = scene(at)
    op = Operator(make_app(p_at, [c_at], read_only=False))
    assert op.act("cancel", consumer="default", key="default:A1:notify")[0] == "/actions"
    path, said = op.act("retry", consumer="default", key="default:A1:notify")
    assert path == "/act/retry" and said.startswith("refused: effect 'default:A1:notify' is cancelled")
    assert op.act("retry", consumer="default", key="nosuch")[1].startswith("not done: no effect with key 'nosuch'")
    assert "result" in op.act("resolve", consumer="default", key="default:B1:notify", result="{bad")[1]
    assert "actor" in op.act("retry", consumer="default", key="default:B1:notify", actor=" ")[1]
    assert "consumer must be one of" in op.act("retry", consumer="nobody", key="default:B1:notify")[1]
    assert "Traceback" not in op.ok("/act/retry")
    assert [a["action"] for a in op.json("/api/actions")["log"] if a["actor"] == "alice"] == ["cancel"]


def test_bulk_actions_count_offer_a_dry_run_and_act_only_on_what_was_shown(at: At) -> None:
    p_at, c_at = scene(at)
    op = Operator(make_app(p_at, [c_at], read_only=False))
    assert "The filter selects 4 now" in op.call("/act/retry-all", "consumer=default&state=dead&name=notify")[2]
    assert "The filter selects 0 now" in op.call("/act/retry-all", "consumer=default&state=dead&name=other")[2]
    assert "The filter selects 0 now" in op.call("/act/retry-all", "consumer=default&state=unknown")[2]
    before = (contents(p_at), contents(c_at))
    filt = {"consumer": "default", "state": "dead", "name": "notify"}
    path, said = op.act("retry-all", **filt, expected="4", mode="dry")
    assert path == "/act/retry-all" and said.startswith("dry run: 4 would be retried") and "nothing changed" in said
    assert (contents(p_at), contents(c_at)) == before
    said = op.act("retry-all", **filt, expected="3", mode="act")[1]  # the operator was shown another count
    assert said.startswith("not done: the filter now selects 4, not the 3")
    assert (contents(p_at), contents(c_at)) == before
    path, said = op.act("retry-all", **filt, expected="4", mode="act")
    assert path == "/actions" and said == "retried 4 of 4 for consumer 'default'"
    assert "The filter selects 0 now" in op.call("/act/retry-all", "consumer=default&state=dead")[2]

    assert "The filter selects 1 now: C1" in op.call("/act/redeliver-all", "consumer=default")[2]
    assert op.act("redeliver-all", consumer="default", expected="1", mode="dry")[1].startswith("dry run: 1 would")
    assert op.act("redeliver-all", consumer="default", expected="1", mode="act")[1] == \
        "redelivered 1 of 1 for consumer 'default'"
    with Producer(p_at, RESERVATION) as producer, Consumer(c_at, RESERVATION) as consumer:
        assert [(a.action, a.event_id, a.actor) for a in producer.admin.operator_actions()] == [
            ("redeliver", "C1", "alice")]
        assert sorted(a.key for a in consumer.admin.effect_actions() if a.action == "retry") == [
            f"default:{e}:notify" for e in ("A1", "B1", "C1", "E1")]


def test_two_operators_retrying_one_effect_at_once_one_takes_effect_the_other_is_told(at: At) -> None:
    p_at, c_at = scene(at)
    app = make_app(p_at, [c_at], read_only=False)  # one console, served by threads
    operators = [Operator(app), Operator(app)]
    forms = [{"csrf": op.token("retry"), "consumer": "default", "key": "default:A1:notify", "actor": f"op{i}",
              "reason": "at once"} for i, op in enumerate(operators)]
    start = threading.Barrier(2)
    answers: list[Any] = [None, None]

    def go(i: int) -> None:
        start.wait()
        answers[i] = operators[i].call("/act/retry", method="POST", body=urlencode(forms[i]).encode())

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    said = sorted(a[2] for a in answers)
    assert [a[0] for a in answers] == [303, 303]
    assert said[0] == "effect 'default:A1:notify' is pending again, due now"
    assert said[1].startswith("refused: effect 'default:A1:notify' is pending; retry needs one of"), said
    log = [a for a in operators[0].json("/api/actions")["log"] if a["action"] == "retry"]
    assert len(log) == 1 and log[0]["actor"] in ("op0", "op1")


def test_two_operators_retrying_the_same_effects_at_once_each_is_retried_once(engine: str, tmp_path: Path) -> None:
    """The store's side of the race above, with the stores open already (a
    narrow window, hit often): each effect's row is read and changed by one
    action at a time, so one retry of each is recorded and the other refused."""
    flows = [f"F{i}" for i in range(40)]
    consumer_at = dead_effects(engine, tmp_path, flows)
    keys = [f"default:{flow}1:notify" for flow in flows]
    done: list[list[str]] = [[], []]
    start = threading.Barrier(2)
    def go(i: int) -> None:
        with Consumer(consumer_at, RESERVATION) as consumer:  # a store is used on the thread that opened it
            start.wait()
            for key in keys:
                try:
                    consumer.admin.retry_effect(key, actor=f"op{i}", reason="at once")
                    done[i].append(key)
                except NotResolvable:
                    pass

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(done[0] + done[1]) == sorted(keys)
    with Consumer(consumer_at, RESERVATION) as consumer:
        assert sorted(a.key for a in consumer.admin.effect_actions()) == sorted(keys)


def test_hostile_ids_in_a_form_and_its_sentence_stay_text_and_a_forged_sentence_is_not_shown(at: At) -> None:
    p_at, c_at = scene(at)
    op = Operator(make_app(p_at, [c_at], read_only=False))
    hostile = '<script>alert("k")</script>'
    status, _, text = op.call("/act/retry", urlencode({"consumer": "default", "key": hostile}))
    assert status == 200 and hostile not in text and "&lt;script&gt;" in text
    path, said = op.act("retry", consumer="default", key=hostile)
    assert path == "/act/retry" and said.startswith("not done: no effect with key '&lt;script&gt;")
    op.cookies["rf_flash"] = "forged%20sentence.0000"
    status, _, text = op.call("/actions")
    assert status == 200 and "forged sentence" not in text and "rf_flash" not in op.cookies  # and cleared


def test_with_a_token_an_action_needs_it_too(at: At) -> None:
    p_at, c_at = scene(at)
    app = make_app(p_at, [c_at], read_only=False, token="s3cret")
    before = (contents(p_at), contents(c_at))
    op = Operator(app)
    assert op.call("/act/retry")[0] == 401
    form = {"consumer": "default", "key": "default:A1:notify", "actor": "a", "reason": "r"}
    assert op.call("/act/retry", method="POST", body=urlencode(form).encode())[0] == 401
    assert (contents(p_at), contents(c_at)) == before
    bearer = {"Authorization": "Bearer s3cret"}
    status, _, text = op.call("/act/retry", headers=bearer)
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', text)
    assert status == 200 and token is not None
    status, headers, _ = op.call("/act/retry", method="POST", headers=bearer,
                                 body=urlencode({**form, "csrf": token.group(1)}).encode())
    assert status == 303 and headers["Location"] == "/actions"


def test_a_consumer_is_registered_to_topics_and_resubscribed_from_the_console(at: At) -> None:
    from reliable_flow import Topic
    from test_topics import AGENT, KINDS, WHO

    p_at, c_at = at("producer"), at("consumer")
    declared = [Topic("agent.commands", kinds={"review.requested"}, role="command"),
                Topic("agent.notifications", kinds={"notification.sent"}),
                Topic("agent.audit", kinds=set(KINDS))]
    with Producer(p_at, AGENT, topics=declared) as producer:
        producer.admin.register_consumer("tools", topics=["agent.commands"], **WHO)
    Consumer(c_at, AGENT, name="tools").close()
    op = Operator(make_app(p_at, [c_at], read_only=False))
    assert 'name="topics"' in op.ok("/act/register") and 'name="topics"' in op.ok("/act/subscribe")
    path, said = op.act("register", name="audit", topics="agent.audit")
    assert (path, "of topics agent.audit" in said) == ("/actions", True), said
    path, said = op.act("subscribe", name="audit", topics="agent.audit, agent.notifications")
    assert (path, "subscribed to topics agent.audit, agent.notifications" in said) == ("/actions", True), said
    # refused, each a sentence naming what: nothing recorded
    assert "agent.nosuch" in op.act("subscribe", name="audit", topics="agent.nosuch")[1]
    assert "topics" in op.act("subscribe", name="audit", topics=" , ")[1]
    said = op.act("register", name="second", topics="agent.commands")[1]
    assert "tools" in said and "second" in said, said
    with Producer(p_at, AGENT) as producer:
        assert [(a.action, a.consumer, a.topics) for a in producer.admin.registry_actions()
                if a.reason == "INC-7: checked"] == [
            ("register", "audit", ("agent.audit",)), ("subscribe", "audit", ("agent.audit", "agent.notifications"))]
        assert {c.name: tuple(c.topics or ()) for c in producer.admin.consumers()} == {
            "tools": ("agent.commands",), "audit": ("agent.audit", "agent.notifications")}
