"""A consumer on another host, read and acted on from the producer's host
(issue 31, item 6), on a real ``redis-server``; the producer on both engines,
the consumer a SQLite file its bridge serves.

* ``inspect PRODUCER redis://...#NAME``, the drill-downs and the console's
  pages give the same report through the bridge as from the consumer's file.
* An action on the remote consumer (console, command line) is run and
  recorded on the consumer's host, with actor and reason, and seen in
  ``/actions`` and ``inspect``; refused, nothing changed, by a bridge not
  started with ``allow_actions``.
* No bridge answering: a sentence naming the location, within the timeout,
  never a hang (command line, console page).
* Malformed answers on the reply key are refused, never trusted; malformed
  questions are refused by the bridge, which goes on serving.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlencode
from wsgiref.util import setup_testing_defaults

import pytest

import console_scene as scene
from engine_reads import new_location
from redis_server import import_redis
from reliable_flow import Consumer
from reliable_flow._tools.drilldown import effect_report, event_report, flow_report
from reliable_flow._tools.inspection import inspect_files
from reliable_flow.console import make_app
from reliable_flow.errors import NotResolvable, RemoteError, TransportError
from reliable_flow.reservation import RESERVATION
from support import run_cli

redis = import_redis()

from reliable_flow.transport import _read_wire as rw
from reliable_flow.transport._wire import BadMessage
from reliable_flow.transport.redis import Bridge
from reliable_flow.transport.redis import _remote as remote_module
from reliable_flow.transport.redis._remote import RemoteInbox

NOW = 1_900_000_000.0


class BridgeHost:
    """The consumer's host: a bridge serving the consumer file, in a thread of
    its own (a Consumer belongs to the thread that opened it)."""

    def __init__(self, location: str, url: str, **kw: Any) -> None:
        self.location, self.url, self.kw = location, url, kw
        self.bridge: Any = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            with Consumer(self.location, RESERVATION) as consumer:
                self.bridge = Bridge(consumer, self.url, block=0.05, **self.kw)
                self._ready.set()
                try:
                    self.bridge.run(handle_signals=False)
                finally:
                    self.bridge.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> BridgeHost:  # noqa: PYI034 - Self needs Python 3.11
        self.thread.start()
        assert self._ready.wait(20), "the bridge did not start"
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the bridge did not stop"
        if self.error is not None:
            raise self.error


class Client:
    """The console called as a WSGI server calls it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.cookies: dict[str, str] = {}

    def get(self, path: str, query: str = "", *, method: str = "GET", body: bytes = b"") -> tuple[int, str]:
        environ: dict[str, Any] = {}
        setup_testing_defaults(environ)
        environ.update(REQUEST_METHOD=method, QUERY_STRING=query, CONTENT_LENGTH=str(len(body)),
                       PATH_INFO=unquote_to_bytes(path).decode("latin-1"),
                       HTTP_COOKIE="; ".join(f"{k}={v}" for k, v in self.cookies.items()))
        if method == "POST":
            environ["CONTENT_TYPE"] = "application/x-www-form-urlencoded"
        environ["wsgi.input"] = io.BytesIO(body)
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            answer["status"] = int(status.split()[0])
            for name, value in headers:
                if name == "Set-Cookie":
                    key, _, rest = value.partition("=")
                    self.cookies[key] = rest.split(";")[0]

        text = b"".join(self.app(environ, start_response)).decode("utf-8")
        return answer["status"], text

    def json(self, path: str, query: str = "") -> Any:
        status, text = self.get(path, query)
        assert status == 200, (path, status, text[:300])
        return json.loads(text)

    def act(self, action: str, **fields: str) -> tuple[int, str]:
        status, text = self.get(f"/act/{action}")
        assert status == 200, text[:300]
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', text)
        assert token is not None
        form = {"csrf": token.group(1), **fields}
        status, _ = self.get(f"/act/{action}", method="POST", body=urlencode(form).encode())
        page = self.get("/actions")[1]  # the flash sentence is shown on the next page
        found = re.search(r'<p class="flash[^"]*" role="status">(.*?)</p>', page, re.DOTALL)
        return status, "" if found is None else found.group(1).replace("&#x27;", "'").replace("&quot;", '"')


@pytest.fixture
def scene_stores(engine: str, tmp_path: Any) -> tuple[str, str]:
    """The console's showcase: the producer on the test's engine, the consumer a SQLite file."""
    p_at, c_at = new_location(engine, tmp_path, "producer"), str(tmp_path / "consumer.db")
    scene.build(p_at, c_at)
    return p_at, c_at


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Questions wait 1 s for an answer (not 5 s) in this process."""
    monkeypatch.setattr(remote_module, "DEFAULT_TIMEOUT", 1.0)


def _html(page: str) -> str:
    """A page without its times and ages (two pages are never taken at one instant)."""
    page = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "T", page)
    page = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "T", page)  # the time shown, read a second apart
    return re.sub(r"\b\d+(\.\d+)?\s?(s|min|h|d)\b", "AGE", page)


def _without_times(report: Any) -> Any:
    return {k: v for k, v in report.items() if k != "checked_at"}


def test_inspect_and_the_console_read_a_consumer_on_another_host_as_its_file(
        scene_stores: tuple[str, str], redis_url: str) -> None:
    p_at, c_at = scene_stores
    there = f"{redis_url}#default"
    with BridgeHost(c_at, redis_url):
        assert inspect_files(p_at, there, now=NOW) == inspect_files(p_at, c_at, now=NOW)
        for flow in (scene.APPLIED, scene.GAP, scene.BLOCKED, "no-such-flow"):
            assert flow_report(p_at, there, flow, now=NOW) == flow_report(p_at, c_at, flow, now=NOW)
        assert event_report(p_at, there, f"{scene.BLOCKED}-2", now=NOW) == event_report(
            p_at, c_at, f"{scene.BLOCKED}-2", now=NOW)
        assert effect_report(p_at, there, scene.DEAD, now=NOW) == effect_report(p_at, c_at, scene.DEAD, now=NOW)
        # the command line: the same JSON, the same exit code (something needs attention)
        far, near = run_cli("inspect", p_at, there, "--json"), run_cli("inspect", p_at, c_at, "--json")
        assert (far.returncode, near.returncode) == (1, 1), far.stderr
        assert _without_times(json.loads(far.stdout)) == _without_times(json.loads(near.stdout))
        far = run_cli("inspect", p_at, there, "--effect", scene.DEAD)
        assert far.returncode == 1 and "history:" in far.stdout and scene.REASON in far.stdout, far.stderr
        # the console: every JSON page as from the file; the HTML pages show the same words
        remote, local = Client(make_app(p_at, [there])), Client(make_app(p_at, [c_at]))
        for path, query in (("/api/flows/" + quote(scene.GAP), ""), ("/api/flows/" + quote(scene.BLOCKED), ""),
                            ("/api/flows", "q=checkout-5521"), ("/api/effects", ""), ("/api/effects", "state=dead"),
                            ("/api/effects/" + quote(scene.DEAD), ""), ("/api/actions", "")):
            assert _without_times(remote.json(path, query)) == _without_times(local.json(path, query)), path
        far_view, near_view = remote.json("/api/overview"), local.json("/api/overview")
        assert far_view["attention"] == near_view["attention"] and len(far_view["attention"]) == scene.ATTENTION
        [c] = far_view["consumers"]
        assert c["location"] == there and c["name"] == "default"
        ages = ("oldest_unaccepted_age", "oldest_unapplied_age")  # read a moment apart
        near = {k: v for k, v in near_view["consumers"][0].items() if k not in ages}
        assert {k: v for k, v in c.items() if k not in ages} == {**near, "location": there}
        for _name, path, _words in scene.PAGES:  # the HTML pages: the same, but for where the consumer is
            at, _, query = path.partition("?")
            (status, far_page), (_, near_page) = remote.get("/" + at, query), local.get("/" + at, query)
            assert status in (200, 503), (path, status)
            assert _html(far_page).replace(there, c_at) == _html(near_page), path


def test_an_action_on_a_remote_consumer_is_recorded_on_its_host(scene_stores: tuple[str, str],
                                                                 redis_url: str) -> None:
    p_at, c_at = scene_stores
    there = f"{redis_url}#default"
    with BridgeHost(c_at, redis_url, allow_actions=True) as host:
        console = Client(make_app(p_at, [there], read_only=False))
        status, page = console.act("retry", consumer="default", key=scene.DEAD, actor="bob", reason="INC-9: relay up")
        assert status == 303, page[:300]
        assert f"effect {scene.DEAD!r} is pending again, due now" in page
        # recorded in the consumer's own store, on its host, with actor and reason
        with Consumer(c_at, RESERVATION) as consumer:
            [*_, last] = consumer.admin.effect_actions(scene.DEAD)
            assert (last.action, last.actor, last.reason) == ("retry", "bob", "INC-9: relay up")
            assert consumer.scheduled_effect(scene.DEAD).state == "pending"
        log = console.json("/api/actions")["log"]
        assert (log[0]["actor"], log[0]["store"], log[0]["target"]) == ("bob", "consumer default", "effect")
        # the command line, the same way: a skip of the blocked event, then a refusal by the rules
        done = run_cli("inbox", "skip", there, f"{scene.BLOCKED}-2", "--actor", "carol", "--reason", "INC-10",
                       "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["previous_state"] == "blocked"
        again = run_cli("inbox", "skip", there, f"{scene.BLOCKED}-2", "--actor", "carol", "--reason", "twice")
        assert again.returncode == 1 and "refused" in again.stderr, again.stderr
        far = json.loads(run_cli("inspect", p_at, there, "--json").stdout)
        assert [(a["action"], a["actor"]) for a in far["consumer"]["actions"]] == [("skip", "carol")]
        assert host.bridge.stats.acted == 2
        remote = RemoteInbox(there)
        with pytest.raises(NotResolvable):  # pending now: not retryable; the refusal comes back as it was raised
            remote.act_remotely("retry_effect", key=scene.DEAD, actor="bob", reason="again")
        remote.close()
    with Consumer(c_at, RESERVATION) as consumer:
        assert [a.actor for a in consumer.admin.operator_actions()] == ["carol"]


def test_a_prune_of_a_remote_consumer_counts_there_and_is_recorded_there(scene_stores: tuple[str, str],
                                                                         redis_url: str) -> None:
    p_at, c_at = scene_stores
    there = f"{redis_url}#default"
    with Consumer(c_at, RESERVATION) as consumer:
        before = sum(len(consumer.inbox(f)) for f in consumer.flows())
    with BridgeHost(c_at, redis_url, allow_actions=True) as host:
        console = Client(make_app(p_at, [there], read_only=False))
        _, said = console.act("prune", store="default", older_than="0", mode="dry", actor="dan", reason="look")
        counted = re.search(r"the prune would remove (\d+) inbox rows", said)
        assert counted is not None and int(counted.group(1)) > 0, said
        _, said = console.act("prune", store="default", older_than="0", limit="1", mode="act", actor="dan",
                              reason="INC-11: disk")
        assert said.startswith("default: pruned 1 inbox rows"), said
        assert host.bridge.stats.acted == 1
        log = console.json("/api/actions")["log"]
        assert (log[0]["actor"], log[0]["target"]) == ("dan", "retention")
    with Consumer(c_at, RESERVATION) as consumer:
        assert [(a.actor, a.reason) for a in consumer.admin.retention_actions()] == [("dan", "INC-11: disk")]
        assert sum(len(consumer.inbox(f)) for f in consumer.flows()) == before - 1


def test_a_bridge_not_allowing_actions_refuses_them_and_nothing_changes(scene_stores: tuple[str, str],
                                                                         redis_url: str) -> None:
    p_at, c_at = scene_stores
    there = f"{redis_url}#default"
    with BridgeHost(c_at, redis_url) as host:
        remote = RemoteInbox(there)
        with pytest.raises(RemoteError, match="takes no operator actions from other hosts: start it with "
                                              "--allow-actions"):
            remote.act_remotely("cancel_effect", key=scene.DEAD, actor="bob", reason="no")
        remote.close()
        done = run_cli("effect", "retry", there, scene.DEAD, "--actor", "bob", "--reason", "try")
        assert done.returncode == 2 and "--allow-actions" in done.stderr, done.stderr
        console = Client(make_app(p_at, [there], read_only=False))
        _, page = console.act("cancel", consumer="default", key=scene.DEAD, actor="bob", reason="no")
        assert "not done" in page and "--allow-actions" in page
        assert host.bridge.stats.acted == 0
    with Consumer(c_at, RESERVATION) as consumer:
        assert consumer.scheduled_effect(scene.DEAD).state == "dead"
        assert [a.actor for a in consumer.admin.effect_actions(scene.DEAD)] == [scene.ACTOR]


def test_no_bridge_answering_is_a_sentence_naming_the_location_not_a_hang(
        scene_stores: tuple[str, str], redis_url: str, quick: None) -> None:
    p_at, c_at = scene_stores
    there = f"{redis_url}#default"
    with BridgeHost(c_at, redis_url):
        console = Client(make_app(p_at, [there]))
        assert console.get("/api/overview")[0] == 200
    started = time.monotonic()
    with pytest.raises(TransportError, match=r"no bridge answered for consumer 'default' on unix://.* within 1 s"):
        inspect_files(p_at, there)
    assert time.monotonic() - started < 5
    status, text = console.get("/api/overview")
    assert status == 503 and "no bridge answered for consumer 'default'" in json.loads(text)["error"]
    status, text = console.get(f"/flows/{scene.GAP}")
    assert status == 503 and "is `reliable-flow bridge` running for it" in text
    started = time.monotonic()
    done = run_cli("inspect", p_at, there)  # the command's own timeout: 5 s
    assert done.returncode == 2 and "no bridge answered for consumer 'default'" in done.stderr, done.stderr
    assert time.monotonic() - started < 30
    # a name the producer never registered is refused at once, without asking
    done = run_cli("inspect", p_at, f"{redis_url}#stranger")
    assert done.returncode == 2 and "share no registration" in done.stderr


def _hostile_answerer(url: str, answer: Any, stop: threading.Event) -> None:
    """Answers every question on the consumer's stream with ``answer(question_fields)``."""
    client = redis.Redis.from_url(url, decode_responses=True)
    last = "0"
    while not stop.is_set():
        got = client.xread({"rf:{default}:questions": last}, count=10, block=50)
        for _stream, entries in got or ():
            for entry_id, fields in entries:
                last = entry_id
                client.xadd(fields["reply"], answer(fields))
    client.close()


@pytest.mark.parametrize(("answer", "said"), [
    (lambda q: {"v": "1", "id": "someone-else", "uid": "u", "ok": "{}"}, "id: not the question asked"),
    (lambda q: {"v": "2", "id": q["id"], "uid": "u", "ok": "{}"}, "v: wire version '2'"),
    (lambda q: {"v": "1", "id": q["id"], "uid": "u", "ok": "{not json"}, "ok: not JSON"),
    (lambda q: {"v": "1", "id": q["id"], "uid": "u", "ok": "NaN"}, "ok: not JSON"),
    (lambda q: {"v": "1", "id": q["id"], "uid": "u", "ok": json.dumps({"uid": 7})}, "ok['uid']: must be text"),
    (lambda q: {"v": "1", "id": q["id"], "uid": "u", "ok": "[[" * 100_000}, "ok: not JSON"),
    (lambda q: {"v": "1", "id": q["id"]}, "ok: missing"),
])
def test_a_malformed_answer_on_the_reply_key_is_refused(redis_url: str, answer: Any, said: str) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=_hostile_answerer, args=(redis_url, answer, stop), daemon=True)
    thread.start()
    try:
        remote = RemoteInbox(f"{redis_url}#default", timeout=5)
        with pytest.raises(TransportError, match="is malformed and was refused: " + re.escape(said)), \
                remote.read() as reads:
            reads.meta()
        remote.close()
    finally:
        stop.set()
        thread.join(5)


def test_a_malformed_record_in_an_answer_is_refused(redis_url: str) -> None:
    effect = {f: None for f in ("key", "name", "event_id", "flow_id", "lease_owner", "last_error", "reason",
                                "fed", "result", "deadline", "version", "waiting_behind", "waiting_behind_state")}
    effect.update(key="k", name="n", payload={}, event_id="e", flow_id="f", seq=1, meta={}, state="exploded",
                  ordered=False, attempts=0, failures=0, due_at=0.0, created_at=0.0, updated_at=0.0)
    cases = [({**effect}, "ok.state: unknown EffectState 'exploded'"),
             ({**effect, "state": "dead", "seq": True}, "ok.seq: must be a whole number, got True"),
             ({**effect, "state": "dead", "due_at": 1e400}, "ok.due_at: must be a finite number"),
             ({**effect, "state": "dead", "extra": 1}, "extra ['extra']"),
             ({k: v for k, v in effect.items() if k != "meta"}, "missing ['meta']")]
    for value, said in cases:
        text = json.dumps(value).replace("Infinity", "1e400")
        with pytest.raises(BadMessage, match=re.escape(said)):
            rw.parse_answer({"v": "1", "id": "q", "uid": "u", "ok": text}, "q",
                            lambda v: rw.read_answer("effect", v))


def test_a_bridge_refuses_malformed_questions_and_goes_on(scene_stores: tuple[str, str], redis_url: str) -> None:
    p_at, c_at = scene_stores
    there = f"{redis_url}#default"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    base = {"v": "1", "deadline": repr(time.time() + 30), "kind": "read", "uid": ""}
    bad = [({"method": "write", "args": "{}"}, "method: 'write' is not a read method a bridge answers"),
           ({"method": "__class__", "args": "{}"}, "method: '__class__' is not a read"),
           ({"method": "effect", "args": '{"key": 7}'}, "args.key: must be text"),
           ({"method": "effect", "args": '{"key": "k", "more": 1}'}, "effect takes exactly ['key']"),
           ({"method": "effect_list", "args": '{"state": "nope", "flow_id": null, "limit": null, "name": null, "after": null}'},
            "unknown EffectState 'nope'"),
           ({"kind": "act", "method": "drop_table", "args": "{}"}, "'drop_table' is not an action a bridge runs")]
    with BridgeHost(c_at, redis_url, allow_actions=True) as host:
        for i, (fields, said) in enumerate(bad):
            reply = f"rf:{{default}}:said:bad{i}"
            client.xadd("rf:{default}:questions", {**base, "id": f"bad{i}", "reply": reply, **fields})
            got = client.xread({reply: "0"}, block=5000)
            [[_, [(_, answer)]]] = got
            assert answer["error"] == "BadMessage" and said in answer["message"], answer
        # a reply address outside this consumer's: not answered there
        client.xadd("rf:{default}:questions", {**base, "id": "x", "reply": "elsewhere", "method": "meta",
                                               "args": "{}"})
        # an action whose uid is not the store's: refused, nothing done
        reply = "rf:{default}:said:uid"
        client.xadd("rf:{default}:questions", {**base, "kind": "act", "id": "uid", "reply": reply,
                                               "uid": "another-store", "method": "cancel_effect",
                                               "args": json.dumps({"key": scene.DEAD, "actor": "a", "reason": "r"})})
        [[_, [(_, answer)]]] = client.xread({reply: "0"}, block=5000)
        assert answer["error"] == "ConsumerMismatch"
        assert inspect_files(p_at, there, now=NOW) == inspect_files(p_at, c_at, now=NOW)  # still serving
        assert not client.exists("elsewhere")
        assert host.bridge.stats.acted == 0
    client.close()


def test_reads_are_served_from_the_allow_list_only(redis_url: str) -> None:
    remote = RemoteInbox(f"{redis_url}#default", timeout=0.2)
    with remote.read() as reads:
        with pytest.raises(AttributeError, match="answers only the reads"):
            reads.insert_new  # noqa: B018 - the attribute itself is refused
        with pytest.raises(TypeError):
            reads.effect("k", "extra")
    with pytest.raises(Exception, match="only its host writes"):
        remote.write()
    remote.close()
    # every read of the consumer's read view is served to other hosts: a new read method goes in READS,
    # or the console and inspect would fail on a remote consumer where they call it
    assert set(rw.READS) == {n for n in dir(rw.InboxReads) if not n.startswith("_")}
    for method in rw.READS:  # and its arguments and answer are of types the wire knows how to read back
        for name, hint in rw._signature(method)[1].items():
            for probe in (12345, [{"x": 1}], {"x": [1]}):
                try:
                    rw.typed(hint, probe, f"{method}.{name}")
                except BadMessage as exc:
                    assert "cannot be read as" not in str(exc), exc


@pytest.mark.redis
@pytest.mark.netns
def test_two_hosts_inspect_and_an_action_through_the_bridge(engine: str, tmp_path: Any) -> None:
    """Host B: redis-server and ``reliable-flow bridge --allow-actions`` on the
    consumer's SQLite file; host A: ``inspect`` and ``effect retry`` given
    ``redis://B:PORT/0#default``; the producer on the test's engine."""
    from netns import Hosts, require_netns
    from redis_server import RedisServer
    from support import child_env

    require_netns()
    p_at, c_at = new_location(engine, tmp_path, "producer"), str(tmp_path / "consumer.db")
    scene.build(p_at, c_at)
    cli = [sys.executable, "-m", "reliable_flow"]
    with Hosts() as hosts:
        server = RedisServer(bind=hosts.b.address, netns=hosts.b)
        try:
            server.start()
            url = server.tcp_url()
            there = f"{url}#default"
            bridge = hosts.b.popen([*cli, "bridge", c_at, "--redis", url, "--allow-actions", "--report-every", "0"],
                                   env=child_env(), stderr=subprocess.PIPE, text=True)
            assert bridge.stderr is not None
            assert bridge.stderr.readline().startswith("bridge: serving consumer 'default'")
            seen = hosts.a.run([*cli, "inspect", p_at, there, "--json"], env=child_env())
            assert seen.returncode == 1, seen.stderr
            near = run_cli("inspect", p_at, c_at, "--json")  # the file itself, as host B reads it
            assert near.returncode == 1, near.stderr
            assert _without_times(json.loads(seen.stdout)) == _without_times(json.loads(near.stdout))
            done = hosts.a.run([*cli, "effect", "retry", there, scene.DEAD, "--actor", "dave", "--reason",
                                "INC-11: from host A", "--json"], env=child_env())
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["actor"] == "dave"
            seen = hosts.a.run([*cli, "inspect", p_at, there, "--effect", scene.DEAD], env=child_env())
            assert "INC-11: from host A" in seen.stdout and "pending" in seen.stdout, seen.stderr
            bridge.terminate()
            _out, err = bridge.communicate(timeout=30)
            assert bridge.returncode == 0, err
        finally:
            server.destroy()
    with Consumer(c_at, RESERVATION) as consumer:  # recorded in the consumer's own store, on host B
        assert [a.actor for a in consumer.admin.effect_actions(scene.DEAD)] == [scene.ACTOR, "dave"]
