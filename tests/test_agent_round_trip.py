"""The agent's round trip across hosts under SIGKILLs (issue 30, "Tests and
measurements", first bullet): results and failures come home through the
transport, with no code of the application's on the way back.

Two hosts in network namespaces (``tests/netns.py``), every process started
and killed by the test:

* host A: the agent (``python -m children.agent_app agent``, an
  :class:`~reliable_flow.aio.AsyncProducer`): each task advances a
  ``called`` step, then awaits ``producer.wait(flow, after_seq=seq)`` for its
  result or failure step, and makes its next call or ends (seeded: one or two
  calls per task, ``search``, ``fetch`` or ``broken``); and the worker that
  relays from its store and serves it: ``reliable-flow run --producer AGENT
  --to URL --consumer tools --serve-as agent`` (the CLI);
* host B: ``redis-server`` (bound to B's veth address), ``reliable-flow bridge
  TOOLS --producer URL#agent --concurrency 32`` (stores, applies, runs the
  tools and feeds their results and failure steps home), and a second
  executor, ``reliable-flow execute TOOLS --producer URL#agent --concurrency
  32``;
* the provider (``children/fake_service.py``, in the test's namespace on a
  Unix socket) performs each call it accepts and logs it: 503s, 429s with a
  Retry-After, answers after the caller's timeout (settled by the tools'
  ``reconcile``), and 500 for every call of ``broken`` (dead after
  ``agent_app.BROKEN_ATTEMPTS``: its failure step comes home).

The application's code is only the agent's loop, the protocol, the apply
handler and the tool functions (``children/agent_app.py``); the way back --
feeding, the request over Redis, advancing on host A -- is the library's.

Faults, one at a time in a seeded order with random gaps: SIGKILL of the
agent, the worker, the bridge, the executor and ``redis-server`` (which
restarts empty), each started again after a short pause.  Then the agent
runs until every task is final (it exits 0), everything delivered is
applied and every effect settled and fed, the worker, bridge and executor
stop on SIGTERM (exit 0), and the test checks from the stores and the
provider's log:

* every task final on both hosts: the agent's flow at its last result step
  (or its failure step, for a task whose tool is ``broken``) at the planned
  seq, the agent saw it, and the tools' consumer applied exactly the
  producer's events of the flow, in order, its projection at the same seq;
* each result and each failure step fed exactly once: per effect key one
  ``<key>:result`` (succeeded) or one ``<key>:failure`` (dead), never both,
  never twice, its payload the effect's result (or failure); every effect
  ``fed``; no other event in the producer but the agent's own calls;
* 0 performed twice at the provider, and every succeeded effect performed
  exactly once with the result the consumer recorded; ``broken`` never
  performed;
* 0 lost: one effect per ``called`` step, every delivery accepted;
* the faults happened (each kind counted), and no process logged a traceback.

Both engines: the two stores as SQLite files, or as PostgreSQL schemas of
the private server (reached from both namespaces on its Unix socket).  The
default size (:data:`DEFAULT`) keeps both runs within about 2.5 minutes on
two cores; ``RELIABLE_FLOW_SOAK=1`` adds the larger :data:`SOAK` runs.  The
seed is printed; ``RELIABLE_FLOW_SEED=<seed>`` replays the plan and the fault
order (where a kill lands depends on timing).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from children import agent_app
from engine_reads import new_location
from redis_server import RedisServer
from reliable_flow import Consumer, Producer
from support import child_env, chosen_seed
from test_transport_faults import WAIT, Campaign, Proc, Service, _need_redis, soak, wait_started

APP = "children.agent_app"
NAME = "agent"  # the producer's name on Redis
STARTUP = 3.0  # seconds a process may take to start its loop
DRAIN = 120.0  # the agent finishing every task after the faults; the stores settling
SEND_TIMEOUT, RELAY_LEASE = 2.0, 5.0  # the worker's --send-timeout and --lease
CLAIM_AFTER = 2.0
CONCURRENCY = 32  # the tools' calls in flight, per executor
P_FAIL, P_THROTTLE, P_LATE = 0.1, 0.1, 0.05  # the provider's 503s, 429s and late answers
ROLES = ("agent", "worker", "bridge", "executor")


@dataclass(frozen=True)
class Size:
    tasks: int
    pace: float  # seconds between two tasks' starts
    kills: int  # of each of the agent, worker, bridge, executor and redis-server
    gap: tuple[float, float] = (1.0, 2.0)  # seconds between two faults


DEFAULT = Size(tasks=120, pace=0.25, kills=3)
SOAK = Size(tasks=400, pace=0.12, kills=8)


@dataclass
class RoundTrip(Campaign):
    """One run: the agent's store on host A, the tools' on host B."""

    agent_at: str = ""
    tools_at: str = ""
    began_wall: float = 0.0
    engine: str = "sqlite"

    @property
    def agent_log(self) -> Path:
        return self.tmp / "agent-saw.jsonl"


def fault_plan(size: Size, rng: random.Random) -> list[str]:
    plan_ = [f"kill {role}" for role in (*ROLES, "redis")] * size.kills
    rng.shuffle(plan_)
    return plan_


def start_processes(run: RoundTrip, service: Service, a_host: Any, b_host: Any) -> None:
    size, url = run.size, run.url
    env = child_env(**{agent_app.PROVIDER_ENV: service.socket})
    home = f"{url}#{NAME}"
    argv = {
        "agent": lambda: [sys.executable, "-m", APP, "agent", run.agent_at, str(run.seed), str(size.tasks),
                          repr(run.began_wall), str(size.pace), str(run.agent_log)],
        "worker": lambda: [sys.executable, "-m", "reliable_flow", "run", "--producer", run.agent_at, "--to", url,
                           "--consumer", agent_app.CONSUMER, "--serve-as", NAME, "--send-timeout", str(SEND_TIMEOUT),
                           "--lease", str(RELAY_LEASE), "--idle-sleep", "0.1", "--report-every", "0"],
        "bridge": lambda: [sys.executable, "-m", "reliable_flow", "bridge", run.tools_at, "--redis", url,
                           "--name", agent_app.CONSUMER, "--bridge-name", f"bridge-{run.procs['bridge'].incarnations}",
                           "--handlers", f"{APP}:HANDLERS", "--effects", f"{APP}:EFFECTS", "--producer", home,
                           "--effect-lease", str(agent_app.EFFECT_LEASE), "--concurrency", str(CONCURRENCY),
                           "--claim-after", str(CLAIM_AFTER), "--report-every", "0"],
        "executor": lambda: [sys.executable, "-m", "reliable_flow", "execute", run.tools_at,
                             "--effects", f"{APP}:EFFECTS", "--producer", home,
                             "--lease", str(agent_app.EFFECT_LEASE), "--concurrency", str(CONCURRENCY),
                             "--idle-sleep", "0.1"],
    }
    hosts = {"agent": a_host, "worker": a_host, "bridge": b_host, "executor": b_host}
    for role in ROLES:
        run.procs[role] = Proc(role, argv[role], run.tmp / f"{role}.log", env, hosts[role])
    run.procs["bridge"].start()
    run.wait_for("the bridge to announce the consumer", lambda: bool(run.redis.command(
        "HGET", f"rf:{{{agent_app.CONSUMER}}}:consumer", "uid")) or not run.procs["bridge"].alive(), WAIT)
    run.expect_alive("bridge")
    for role in ("executor", "worker", "agent"):
        run.procs[role].start()
    run.note("started")


def inject_faults(run: RoundTrip, rng: random.Random) -> None:
    """One SIGKILL at a time, with random gaps; each killed process (or
    ``redis-server``, empty) started again after a short random pause."""
    for fault in fault_plan(run.size, rng):
        time.sleep(rng.uniform(*run.size.gap))
        run.expect_alive("worker", "bridge", "executor")
        run.note(fault)
        run.faults[fault] += 1
        role = fault.split()[1]
        if role == "redis":
            wait_started(run)
            run.redis.kill()
            time.sleep(rng.uniform(0.2, 1.0))
            run.redis.start()
        else:
            proc = run.procs[role]
            if role == "agent" and not proc.alive():  # it finished early: nothing to kill, none to start
                run.note("the agent has finished already")
                continue
            proc.kill()
            time.sleep(rng.uniform(0.2, 1.0))
            proc.start()
        run.note(f"{fault}: over")


def settled(run: RoundTrip) -> tuple[bool, str]:
    """Whether every event the agent's producer holds is accepted by the tools
    and applied there, and every effect is final and fed; and what is not."""
    with Producer(run.agent_at, agent_app.AGENT) as producer:
        outbox = producer.outbox()
    with Consumer(run.tools_at, agent_app.AGENT, name=agent_app.CONSUMER) as consumer:
        applied = sum(len(consumer.applied(f)) for f in consumer.flows())
        effects = consumer.scheduled_effects()
    accepted = sum(1 for e in outbox if agent_app.CONSUMER in e.deliveries
                   and str(e.deliveries[agent_app.CONSUMER].state) == "accepted")
    states = Counter(str(e.state) for e in effects)
    unfed = sum(1 for e in effects if not e.fed)
    done = accepted == len(outbox) and applied == len(outbox) and unfed == 0 \
        and set(states) <= {"succeeded", "dead"}
    return done, f"events {len(outbox)}, accepted {accepted}, applied {applied}, effects {dict(states)}, unfed {unfed}"


def drain(run: RoundTrip) -> None:
    """The agent runs until every task is final (exit 0); the stores settle;
    the worker, bridge and executor stop on SIGTERM (exit 0)."""
    agent = run.procs["agent"]
    deadline = time.monotonic() + DRAIN
    while agent.alive() and time.monotonic() < deadline:
        run.expect_alive("worker", "bridge", "executor")  # the agent waits for them: say so at once
        time.sleep(0.5)
    code = agent.wait(0.1)
    run.note(f"agent exited {code}")
    if code != 0:
        run.fail(f"the agent did not finish every task within {DRAIN:g}s after the faults (code {code}); "
                 f"{settled(run)[1]}")
    seen: list[str] = [""]

    def done() -> bool:
        run.expect_alive("worker", "bridge", "executor")
        ok, what = settled(run)
        if what != seen[0]:
            seen[0] = what
            run.note(what)
        return ok

    run.wait_for("every event applied and every effect settled and fed", done, DRAIN, 0.5)
    for role in ("worker", "bridge", "executor"):
        proc = run.procs[role]
        pause = proc.started + STARTUP - time.monotonic()  # a SIGTERM before its handlers exist ends it -15
        if pause > 0:
            time.sleep(pause)
        code = proc.terminate()
        run.note(f"{role} stopped by SIGTERM: {code}")
        if code != 0:
            run.fail(f"the {role} did not stop cleanly on SIGTERM within {WAIT:g}s (code {code})")


# -- the invariants ------------------------------------------------------------------------


def check(run: RoundTrip, service: Service) -> None:
    wanted = agent_app.plan(run.seed, run.size.tasks)
    problems: list[str] = []
    with Producer(run.agent_at, agent_app.AGENT) as producer:
        flows = {flow: producer.flow(flow) for flow in wanted}
        outboxes = {flow: producer.outbox(flow) for flow in wanted}
        every = producer.outbox()
        payloads = {e.event_id: (producer.event(e.event_id) or {}).get("payload") for e in every}
    with Consumer(run.tools_at, agent_app.AGENT, name=agent_app.CONSUMER) as consumer:
        applied = {flow: [(a.event_id, a.seq) for a in consumer.applied(flow)] for flow in consumer.flows()}
        projections = {flow: consumer.projection(flow) for flow in wanted}
        effects = {e.key: e for e in consumer.scheduled_effects()}
    performed, outcomes = service.performances()
    saw = [json.loads(line) for line in run.agent_log.read_text().splitlines()] if run.agent_log.exists() else []
    finals = {entry["flow"] for entry in saw if "final" in entry}
    woke = Counter(entry["saw"] for entry in saw if "waited" in entry)

    fed: Counter[str] = Counter()
    strangers = [e.event_id for e in every if e.flow_id not in wanted]
    if strangers:
        problems.append(f"events of flows the agent never made: {strangers[:5]}")
    not_accepted = [e.event_id for e in every if agent_app.CONSUMER not in e.deliveries
                    or str(e.deliveries[agent_app.CONSUMER].state) != "accepted"]
    if not_accepted:
        problems.append(f"{len(not_accepted)} events not accepted by the tools (lost): {not_accepted[:5]}")
    for flow, calls in wanted.items():
        final, last_seq = agent_app.final_of(calls)
        expected: list[str] = []
        for n, tool in enumerate(calls, start=1):
            key = f"{agent_app.CONSUMER}:{flow}:call{n}:{tool}"
            expected += [f"{flow}:call{n}", f"{key}:{'failure' if tool == 'broken' else 'result'}"]
        ids = [e.event_id for e in outboxes[flow]]
        if ids != expected or [e.seq for e in outboxes[flow]] != list(range(1, len(ids) + 1)):
            problems.append(f"{flow}: the producer holds {ids}, want {expected}")
        state = flows[flow] or {}
        if (state.get("state"), state.get("seq")) != (final, last_seq):
            problems.append(f"{flow}: the agent's flow is {state}, want {final} at seq {last_seq}")
        if flow not in finals:
            problems.append(f"{flow}: the agent never saw it final")
        if applied.get(flow) != [(event_id, seq) for seq, event_id in enumerate(ids, start=1)]:
            problems.append(f"{flow}: the tools applied {applied.get(flow)}, the producer holds {ids}")
        projection = projections[flow] or {}
        if (projection.get("state"), projection.get("last_seq")) != (final, last_seq):
            problems.append(f"{flow}: the tools' projection is {projection}, want {final} at {last_seq}")

    keys_home: Counter[str] = Counter()
    for event in every:
        for suffix in (":result", ":failure"):
            if event.event_id.endswith(suffix):
                keys_home[event.event_id.removesuffix(suffix)] += 1
                fed[suffix[1:]] += 1
    calls_made = {e.event_id for e in every if ":call" in e.event_id and not e.event_id.endswith((":result", ":failure"))}
    by_event = Counter(e.event_id for e in effects.values())
    if set(by_event) != calls_made or any(n != 1 for n in by_event.values()):
        problems.append(f"effects per call: {len(by_event)} calls have effects (want {len(calls_made)}); "
                        f"missing {sorted(calls_made - set(by_event))[:5]}, more than one "
                        f"{[k for k, n in by_event.items() if n != 1][:5]}")
    for key, effect in effects.items():
        tool = effect.name
        want_state = "dead" if tool == "broken" else "succeeded"
        if str(effect.state) != want_state or not effect.fed:
            problems.append(f"{key}: {effect.state} fed={effect.fed}, want {want_state} and fed")
        if keys_home[key] != 1:
            problems.append(f"{key}: {keys_home[key]} steps came home, want exactly one")
        step = f"{key}:{'failure' if tool == 'broken' else 'result'}"
        if tool != "broken" and payloads.get(step) != effect.result:
            problems.append(f"{key}: the result step holds {payloads.get(step)}, the effect {effect.result}")
        if tool == "broken" and (payloads.get(step) or {}).get("effect_state") != "dead":
            problems.append(f"{key}: the failure step holds {payloads.get(step)}")
        did = performed.get(key, [])
        if tool == "broken" and did:
            problems.append(f"{key}: the broken tool was performed {did}")
        if tool != "broken" and did != [effect.result]:
            problems.append(f"{key}: the provider performed {did}, the consumer recorded {effect.result}")
    twice = {k: v for k, v in performed.items() if len(v) > 1}
    unknown = sorted(k for k in performed if k not in effects)
    if twice or unknown:
        problems.append(f"the provider: performed twice {dict(list(twice.items())[:5])}, unknown keys {unknown[:5]}")

    for proc in run.procs.values():
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        if "Traceback" in text:
            at = text.index("Traceback")
            problems.append(f"the {proc.role}'s log shows a traceback: {text[max(0, at - 300):at + 1500]}")

    tools = Counter(tool for calls in wanted.values() for tool in calls)
    print(f"agent round trip [{run.engine}, two hosts]: seed={run.seed} tasks={len(wanted)} calls={dict(tools)} "
          f"faults={dict(sorted(run.faults.items()))} kills={ {r: p.kills for r, p in run.procs.items()} } incarnations={ {r: p.incarnations for r, p in run.procs.items()} } "
          f"fed home {dict(fed)} agent's waits answered {dict(woke)} provider {dict(sorted(outcomes.items()))} "
          f"performed twice={len(twice)} in {time.monotonic() - run.began:.1f}s", flush=True)
    print("  " + "; ".join(run.timeline), flush=True)
    if problems:
        run.fail(f"{len(problems)} invariant violations:\n" + "\n".join(problems[:40]))
    assert run.faults == Counter(fault_plan(run.size, random.Random(f"{run.seed}:faults"))), run.diagnosis()
    assert fed["result"] > 0 and fed["failure"] > 0, f"no result or no failure came home: {dict(fed)}"
    assert outcomes["fail"] > 0 and outcomes["throttled"] > 0 and outcomes["late"] > 0, dict(outcomes)


# -- the tests -------------------------------------------------------------------------------


def round_trip(tmp_path: Path, engine: str, size: Size) -> None:
    _need_redis()
    from netns import Hosts, require_netns

    require_netns()
    seed = chosen_seed()
    print(f"seed {seed} (RELIABLE_FLOW_SEED={seed} replays the plan)")
    agent_at, tools_at = new_location(engine, tmp_path, "agent"), new_location(engine, tmp_path, "tools")
    # Made here, so the stores record the protocol's import path and every command finds it there.
    Producer(agent_at, agent_app.AGENT).close()
    Consumer(tools_at, agent_app.AGENT, name=agent_app.CONSUMER).close()
    service: Service | None = None
    with Hosts() as hosts:
        redis = RedisServer(bind=hosts.b.address, netns=hosts.b)
        try:
            redis.start()
            service = Service(tmp_path / "provider.log", seed, p_fail=P_FAIL, p_late=P_LATE,
                              more=("--p-throttle", str(P_THROTTLE)))
            run = RoundTrip(seed, size, tmp_path, redis, redis.tcp_url(), hosts=hosts, agent_at=agent_at,
                            tools_at=tools_at, began_wall=time.time() + 2.0, engine=engine)
            try:
                start_processes(run, service, hosts.a, hosts.b)
                inject_faults(run, random.Random(f"{seed}:faults"))
                drain(run)
            finally:
                for proc in run.procs.values():
                    proc.kill()
            check(run, service)
        finally:
            if service is not None:
                service.stop()
            redis.destroy()


@pytest.mark.redis
@pytest.mark.netns
def test_results_and_failures_come_home_through_kills_of_every_process(tmp_path: Path, engine: str) -> None:
    round_trip(tmp_path, engine, DEFAULT)


@soak
@pytest.mark.redis
@pytest.mark.netns
def test_soak_round_trip(tmp_path: Path, engine: str) -> None:
    round_trip(tmp_path, engine, SOAK)
