"""The console's prune (a form with a dry run, for the producer and each
consumer), the JSON twins of every action (``/api/act/...``) and resolve /
amend checked against the consumers' effect registry, on both engines,
called as a WSGI server calls it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from children.feedback_crash_child import CONSUMER as AGENT
from children.feedback_crash_child import TASK as CHILD_TASK
from children.feedback_crash_child import handler as child_handler
from children.feedback_crash_child import registry as child_registry
from engine_reads import contents, count, new_location
from reliable_flow import (
    Consumer,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    PermanentFailure,
    Producer,
    relay,
)
from reliable_flow.console import make_app
from reliable_flow.reservation import RESERVATION
from test_console_actions import Operator, scene

At = Callable[[str], str]
JSON = {"Content-Type": "application/json"}


def api_token(op: Operator, action: str = "") -> str:
    """The CSRF token a JSON client reads from ``GET /api/act[/action]`` (with its cookie)."""
    status, _, text = op.call("/api/act" + (f"/{action}" if action else ""))
    assert status == 200, text
    return str(json.loads(text)["csrf"])


def post_json(op: Operator, action: str, fields: dict[str, Any], token: str | None = None,
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    sent = {**JSON, **({} if token is None else {"X-CSRF-Token": token}), **(headers or {})}
    status, got, text = op.call(f"/api/act/{action}", method="POST", body=json.dumps(fields).encode(),
                                headers=sent)
    assert got["Content-Type"].startswith("application/json"), text
    return status, json.loads(text)


# -- prune from the console ------------------------------------------------------------------------


def test_prune_from_the_console_counts_first_and_is_recorded_on_each_store(at: At) -> None:
    p_at, c_at = scene(at)
    op = Operator(make_app(p_at, [c_at], read_only=False))
    time.sleep(0.01)  # every event is older than "now" by a little
    page = op.call("/act/prune", "store=producer&older_than=0")[2]
    found = re.search(r"Now the prune would remove (\d+) events", page)
    assert found is not None, page[:3000]
    shown = int(found.group(1))
    assert shown >= 1 and 'name="now"' in page and 'value="producer" selected' in page
    before = (contents(p_at), contents(c_at))
    path, said = op.act("prune", store="producer", older_than="0", mode="dry")
    assert (path, said) == ("/act/prune", f"dry run: the prune would remove {shown} events; nothing changed")
    assert (contents(p_at), contents(c_at)) == before  # a dry run writes nothing, records nothing
    now = re.search(r'name="now" value="([0-9.e+]+)"', page)
    assert now is not None
    path, said = op.act("prune", store="producer", older_than="0", now=now.group(1), mode="act")
    assert path == "/actions" and said.startswith(f"producer: pruned {shown} events"), said
    # a consumer's store: its applied rows and finished effects
    assert "Now the prune would remove 0 inbox rows" not in op.call("/act/prune", "store=default&older_than=0")[2]
    path, said = op.act("prune", store="default", older_than="0", limit="2", mode="act")
    assert path == "/actions" and said.startswith("default: pruned 2 inbox rows"), said
    with Producer(p_at, RESERVATION) as producer, Consumer(c_at, RESERVATION) as consumer:
        [mine] = producer.admin.retention_actions()
        assert (mine.actor, mine.reason, mine.horizon) == ("alice", "INC-7: checked", float(now.group(1)))
        assert [(a.actor, a.action) for a in consumer.admin.retention_actions()] == [("alice", "prune")]
    log = [a for a in op.json("/api/actions")["log"] if a["target"] == "retention"]
    assert [a["store"] for a in log] == ["consumer default", "producer"]
    assert "rows before" in op.ok("/actions")
    # refusals: a sentence, nothing recorded
    assert op.act("prune", store="producer", older_than="soon", mode="act")[1] == \
        "not done: older_than: must be a number of seconds, got 'soon'"
    assert "older_than must be &gt;= 0" in op.act("prune", store="producer", older_than="-5", mode="act")[1]
    assert op.act("prune", store="producer", older_than="0", now=str(time.time() + 3600), mode="act")[1] \
        .endswith("is in the future")
    status, _, text = op.call("/act/prune", "store=nobody&older_than=0")
    assert status == 400 and "consumer must be one of" in text
    assert "older_than: must be a number of seconds" in op.call("/act/prune", "older_than=x")[2]
    assert count(p_at, "retention_action") == 1


# -- the JSON twins ----------------------------------------------------------------------------------


def test_the_json_twins_act_and_answer_the_recorded_action_or_the_refusal(at: At) -> None:
    p_at, c_at = scene(at)
    op = Operator(make_app(p_at, [c_at], read_only=False))
    listed = json.loads(op.call("/api/act")[2])
    assert {"retry", "resolve", "prune", "retry-all"} <= set(listed["actions"]) and listed["csrf"]
    token = api_token(op)
    who = {"actor": "bob", "reason": "INC-8"}
    status, answer = post_json(op, "retry", {"consumer": "default", "key": "default:A1:notify", **who}, token)
    assert status == 200 and answer["done"] is True
    assert answer["sentence"] == "effect 'default:A1:notify' is pending again, due now"
    [record] = answer["actions"]
    assert record == {"at": record["at"], "key": "default:A1:notify", "action": "retry", **who}
    assert record in op.json("/api/actions")["consumers"]["default"]["effect_actions"]  # inspect's shape
    # refused by the rules: 409 with the sentence; bad input: 400; nothing recorded
    status, answer = post_json(op, "retry", {"consumer": "default", "key": "default:A1:notify", **who}, token)
    assert status == 409 and answer["error"].startswith("refused: effect 'default:A1:notify' is pending")
    status, answer = post_json(op, "retry", {"consumer": "default", "key": "nosuch", **who}, token)
    assert status == 400 and answer["error"].startswith("not done: no effect with key 'nosuch'")
    # a JSON value as the result, true as a ticked checkbox
    status, answer = post_json(op, "resolve", {"consumer": "default", "key": "default:B1:notify",
                                               "result": {"parcel": "P-7"}, **who}, token)
    assert status == 200 and answer["sentence"].endswith('result {"parcel": "P-7"}')
    status, answer = post_json(op, "register", {"name": "audit", "from_now": True, **who}, token)
    assert status == 200 and answer["actions"][0]["consumer"] == "audit"
    assert "gets events committed from now on" in answer["sentence"]
    # form fields work too, with the token as a field
    form = urlencode({"csrf": token, "name": "audit", **who}).encode()
    status, _, text = op.call("/api/act/remove", method="POST", body=form)
    assert status == 200 and json.loads(text)["done"] is True
    # a bulk action: its preview, then the count it was shown
    preview = json.loads(op.call("/api/act/retry-all", "consumer=default&state=dead")[2])["preview"]
    assert preview["sentence"] == "The filter selects 2 now" and preview["hidden"] == {"expected": "2"}
    status, answer = post_json(op, "retry-all", {"consumer": "default", "state": "dead", "expected": "5",
                                                 "mode": "act", **who}, token)
    assert status == 409 and "the filter now selects 2, not the 5" in answer["error"]
    status, answer = post_json(op, "retry-all", {"consumer": "default", "state": "dead", "mode": "dry", **who},
                               token)
    assert status == 200 and answer["done"] is False and answer["actions"] == []
    status, answer = post_json(op, "retry-all", {"consumer": "default", "state": "dead", "expected": 2,
                                                 "mode": "act", **who}, token)
    assert status == 200 and [a["action"] for a in answer["actions"]] == ["retry", "retry"]
    status, answer = post_json(op, "prune", {"store": "producer", "older_than": 0, "mode": "act", **who}, token)
    assert status == 200 and answer["actions"][0]["action"] == "prune" and answer["actions"][0]["actor"] == "bob"
    # malformed bodies: 400, a sentence
    for body in (b"[1, 2]", b"{not json", json.dumps({"consumer": ["default"]}).encode()):
        status, _, text = op.call("/api/act/retry", method="POST", body=body, headers={**JSON, "X-CSRF-Token": token})
        assert status == 400 and "error" in json.loads(text), body
    assert op.call("/api/act/nosuch")[0] == 404


def test_the_json_twins_keep_the_csrf_read_only_and_token_rules(at: At) -> None:
    p_at, c_at = scene(at)
    before = (contents(p_at), contents(c_at))
    fields = {"consumer": "default", "key": "default:A1:notify", "actor": "mallory", "reason": "x"}
    # read only: 403, as every /act route
    ro = Operator(make_app(p_at, [c_at]))
    assert ro.call("/api/act")[0] == 403
    assert post_json(ro, "retry", fields)[0] == 403
    # no CSRF token, a made-up one, or the right one without its cookie: 403
    op = Operator(make_app(p_at, [c_at], read_only=False))
    token = api_token(op)
    assert post_json(op, "retry", fields)[0] == 403
    assert post_json(op, "retry", fields, "0" * 64)[0] == 403
    cookies, op.cookies = op.cookies, {}
    status, answer = post_json(op, "retry", fields, token)
    assert status == 403 and "CSRF token" in answer["error"]
    op.cookies = cookies
    # with a token: a Bearer request needs the CSRF token too (as the forms do)
    guarded = Operator(make_app(p_at, [c_at], read_only=False, token="s3cret"))
    assert guarded.call("/api/act")[0] == 401
    assert post_json(guarded, "retry", fields)[0] == 401
    bearer = {"Authorization": "Bearer s3cret"}
    status, _, text = guarded.call("/api/act", headers=bearer)
    assert status == 200
    assert post_json(guarded, "retry", fields, headers=bearer)[0] == 403
    assert (contents(p_at), contents(c_at)) == before
    status, answer = post_json(guarded, "retry", fields, json.loads(text)["csrf"], headers=bearer)
    assert status == 200 and answer["actions"][0]["actor"] == "mallory"


# -- resolve and amend, checked against the effect registry -------------------------------------------


def refused_and_dead(engine: str, tmp_path: Path) -> tuple[str, str, str, str]:
    """F0's tool failed (dead, its failure step fed); F1's tool answered a
    result the producer refused (an extra field): what the command line's
    resolve / amend test starts from."""
    producer_at = str(new_location(engine, tmp_path, "producer"))
    consumer_at = str(new_location(engine, tmp_path, "consumer"))
    bad = EffectRegistry()
    bad.register("call_tool", lambda call: (_ for _ in ()).throw(PermanentFailure("500"))
                 if call.payload["tool"] == "broken" else {"output": "x", "extra": 1},
                 feedback=Feedback("tool_result", on_failure="tool_failed"))
    with Producer(producer_at, CHILD_TASK) as p, \
            Consumer(consumer_at, CHILD_TASK, handlers=[child_handler], effects=bad, name=AGENT) as c:
        for i, name in enumerate(["broken", "calc"]):
            p.advance(f"F{i}-1", f"F{i}", expected_seq=0, kind="tool_called", payload={"tool": name})
        while relay(p, c).status != "idle":
            pass
        c.process_all()
        EffectExecutor(c, producer=p).run_until_idle()
    return producer_at, consumer_at, f"{AGENT}:F0-1:call_tool", f"{AGENT}:F1-1:call_tool"


def test_resolve_and_amend_check_the_result_against_the_effect_registry(engine: str, tmp_path: Path) -> None:
    producer_at, consumer_at, dead, refused = refused_and_dead(engine, tmp_path)
    who = {"actor": "ops", "reason": "INC-9"}
    # without the registry: amend cannot build the step, and says so
    bare = Operator(make_app(producer_at, [consumer_at], read_only=False))
    status, answer = post_json(bare, "amend", {"consumer": AGENT, "key": refused, "result": {"output": "7"}, **who},
                               api_token(bare))
    assert status == 400 and "amend needs its registry with feedback=" in answer["error"]
    op = Operator(make_app(producer_at, [consumer_at], read_only=False, effects=child_registry()))
    token = api_token(op)
    # a result the producer would refuse: 409, nothing recorded (checked against the producer too)
    status, answer = post_json(op, "amend", {"consumer": AGENT, "key": refused, "result": {"output": 7}, **who},
                               token)
    assert status == 409 and "would be refused as feedback (invalid_payload" in answer["error"]
    status, answer = post_json(op, "resolve", {"consumer": AGENT, "key": dead, "result": {"output": 7}, **who},
                               token)
    assert status == 409 and "would be refused as feedback" in answer["error"]
    path, said = op.act("amend", consumer=AGENT, key=refused, result='{"output": 7}')  # the form: the same
    assert path == "/act/amend" and "would be refused as feedback" in said
    with Consumer(consumer_at, CHILD_TASK) as c:
        assert c.admin.effect_actions() == [] and c.scheduled_effect(dead).state == "dead"
    # the right result: recorded as the command line records it, then fed once
    status, answer = post_json(op, "amend", {"consumer": AGENT, "key": refused, "result": {"output": "7"}, **who},
                               token)
    assert status == 200 and answer["sentence"].endswith("fed on the next executor pass")
    assert answer["actions"][0] == {"at": answer["actions"][0]["at"], "key": refused, "action": "resolve",
                                    "actor": "ops", "reason": "amend: INC-9"}
    with Producer(producer_at, CHILD_TASK) as p, \
            Consumer(consumer_at, CHILD_TASK, handlers=[child_handler], effects=child_registry(), name=AGENT) as c:
        for _ in range(3):
            EffectExecutor(c, producer=p).run_once()
        assert p.flow("F1")["output"] == "7"
        assert [(a.key, a.action) for a in c.admin.effect_actions()] == [(refused, "resolve")]
