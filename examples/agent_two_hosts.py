"""An asyncio agent on host A, its tools on host B, and no hand-written return path.

A task is a flow of the protocol ``TASK``::

    new -> asked -> tool_called -> tool_result -> answered
                               \\-> tool_failed -> answered

**Host A** (this process) is the agent: asyncio code with an
``AsyncProducer`` on ``agent.db``.  For each task it commits the question,
decides a tool call and commits it as the step ``tool_called``, then
``await producer.wait(task, after_seq=seq)``: no polling loop, no code of
its own that fetches results.  Beside it, on the same event loop, an
``AsyncWorker`` relays the steps to the consumer ``tools`` through Redis
and serves the producer there as ``agent`` (``serve_as="agent"``); the
command-line form of that worker is::

    reliable-flow run --producer agent.db --to redis://redis-host:6379/0 \\
        --consumer tools --serve-as agent

**Host B** is another process: ``reliable-flow bridge`` on ``tools.db``
with the tools (``EFFECTS``) and ``--producer redis://...#agent``::

    reliable-flow bridge tools.db --name tools --redis redis://redis-host:6379/0 \\
        --protocol agent_two_hosts:TASK --handlers agent_two_hosts:HANDLERS \\
        --effects agent_two_hosts:EFFECTS --producer 'redis://redis-host:6379/0#agent'

Its apply handler schedules each tool call as an effect; its executor calls
the tool and feeds the result back into the agent's flow through Redis
(``Feedback(kind="tool_result")``), where host A's worker advances it in
one producer transaction.  The tool ``fetch_page`` always fails (the site
answers 500): after its last attempt the effect is ``dead`` and its failure
step ``tool_failed`` comes home the same way (``on_failure="tool_failed"``),
so the agent's task does not wait for ever.  Host B cannot open
``agent.db``, and host A never reads ``tools.db`` while B runs.

The script starts a private ``redis-server`` (the Debian package's, on a
Unix socket in a temporary directory, no persistence) and host B as a
child process, runs three tasks, prints their stories and what each host
recorded, stops everything and exits 0.  Without ``redis-server`` or the
``redis`` package it says what to install and exits 2.

Run ``python examples/agent_two_hosts.py [DIR]`` (a temporary directory by
default; with DIR the files are kept, and a second run finds every task
answered and calls no tool again).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from reliable_flow import ApplyContext, EffectCall, EffectRegistry, Feedback, RetryLater
from reliable_flow.aio import AsyncProducer, AsyncWorker
from reliable_flow.protocol import Protocol, by_kind, exact, optional, text

__all__ = ["EFFECTS", "HANDLERS", "TASK", "main"]

# -- the protocol: a task's steps, shared by both hosts ----------------------------------------

TOOLS = ("search", "fetch_page")

TASK = Protocol(
    name="task",
    initial="new",
    transitions={
        "new": ["asked"],
        "asked": ["tool_called"],
        "tool_called": ["tool_result", "tool_failed"],
        "tool_result": ["answered"],
        "tool_failed": ["answered"],
    },
    schemas={1: by_kind({
        "asked": exact({"question": text(1, 2000)}),
        "tool_called": exact({"tool": text(choices=TOOLS), "arg": text(1, 200)}),
        "tool_result": exact({"found": text(1, 2000)}),
        # what an effect that failed feeds back (Feedback(on_failure=...)'s default payload)
        "tool_failed": exact({"key": text(), "effect_state": text(), "reason": optional(text()),
                              "error": optional(text())}),
        "answered": exact({"answer": text(1, 4000)}),
    })},
)

# -- host B: the tools, run by the bridge's effect executor --------------------------------------

#: Where host B's tools note each call they receive (the "provider's" own log),
#: so host A can tell afterwards what was performed, and how often.
CALL_LOG = "AGENT_TWO_HOSTS_CALL_LOG"


def _note(call: EffectCall) -> None:
    path = os.environ.get(CALL_LOG)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{call.key} {call.attempt}\n")


def search(call: EffectCall) -> dict[str, Any]:
    """A search provider that deduplicates by idempotency key: always answers."""
    _note(call)
    return {"found": f"3 results for {call.payload['arg']!r}, the first from an encyclopedia"}


def fetch_page(call: EffectCall) -> dict[str, Any]:
    """A page fetcher whose site is down: every attempt answers 500."""
    _note(call)
    raise RetryLater(f"HTTP 500 from {call.payload['arg']}")


EFFECTS = EffectRegistry()
EFFECTS.register("search", search, idempotent=True,
                 feedback=Feedback(kind="tool_result", on_failure="tool_failed"))
EFFECTS.register("fetch_page", fetch_page, idempotent=True, max_attempts=3,
                 feedback=Feedback(kind="tool_result", on_failure="tool_failed"))


def call_tools(ctx: ApplyContext) -> None:
    """Host B's apply handler: a ``tool_called`` step schedules its tool
    call, in the apply transaction, exactly once."""
    if ctx.event.kind == "tool_called":
        ctx.schedule(ctx.event.payload["tool"], {"arg": ctx.event.payload["arg"]})


HANDLERS = [call_tools]

# -- host A: the agent ----------------------------------------------------------------------------

QUESTIONS = {
    "T1": ("Who wrote Dune?", "search", "Dune author"),
    "T2": ("What does example.org say today?", "fetch_page", "https://example.org/"),
    "T3": ("When was Dune published?", "search", "Dune first edition"),
}


async def work_on(producer: AsyncProducer, task: str) -> list[str]:
    """One task, from the question to the answer; its story, as lines."""
    question, tool, arg = QUESTIONS[task]
    story = [f"task {task}: {question!r}"]

    def say(who: str, line: str) -> None:
        story.append(f"  {who:<5} {line}")

    asked = await producer.advance(f"{task}-1", task, expected_seq=0, kind="asked", payload={"question": question})
    say("A", f"advance {task}-1 asked        -> {asked.status}")
    flow = await producer.flow(task)
    assert flow is not None
    if flow["state"] == "asked":
        called = await producer.advance(f"{task}-2", task, expected_seq=1, kind="tool_called",
                                        payload={"tool": tool, "arg": arg})
        say("A", f"advance {task}-2 tool_called  -> {called.status}: {tool}({arg!r}) runs on host B")
        flow = await producer.flow(task)
        assert flow is not None
    if flow["state"] == "tool_called":
        # The whole return path: host B's executor feeds the result (or the failure)
        # through Redis, host A's worker advances it here, and wait() hears the commit.
        came = await producer.wait(task, after_seq=flow["seq"], timeout=60)
        if came is None:
            raise TimeoutError(f"task {task}: nothing came home within 60 s")
        flow = came
        step = (await producer.outbox(task))[-1]
        if flow["state"] == "tool_result":
            say("B", f"result came home as {step.event_id} (seq {step.seq}): {flow['found']}")
        else:
            say("B", f"failure came home as {step.event_id} (seq {step.seq}): effect {flow['effect_state']}, "
                     f"{flow.get('error', flow.get('reason'))}")
    if flow["state"] in ("tool_result", "tool_failed"):
        answer = (f"Here is what I found: {flow['found']}." if flow["state"] == "tool_result"
                  else "Sorry, I could not reach that page; try again later.")
        done = await producer.advance(f"{task}-4", task, expected_seq=flow["seq"], kind="answered",
                                      payload={"answer": answer})
        say("A", f"advance {task}-4 answered     -> {done.status}: {answer}")
    else:
        say("A", f"already {flow['state']} at seq {flow['seq']}: nothing to do")
    return story


async def host_a(where: Path, url: str) -> tuple[list[list[str]], dict[str, Any]]:
    """The agent and its worker on one event loop; the stories and what agent.db says."""
    from reliable_flow.transport.redis import RedisReceiver

    async with AsyncProducer(where / "agent.db", TASK) as producer:
        with RedisReceiver(url, "tools") as tools:
            worker = AsyncWorker(producer, [tools], register=True, serve_as="agent", idle_sleep=0.05)
            running = asyncio.create_task(worker.run(handle_signals=False))
            try:
                stories = await asyncio.gather(*(work_on(producer, task) for task in QUESTIONS))
            finally:
                worker.stop()  # the step in progress finishes, then run() returns
                await running
            # Deliver the answers too, so host B's file holds every step.
            await AsyncWorker(producer, [tools], register=True).run(until_idle=True, handle_signals=False)
        flows = {task: await producer.flow(task) for task in QUESTIONS}
        return stories, {"flows": flows, "served": dict(worker.stats.served)}


# -- the two hosts' plumbing: a private redis-server and host B's process ------------------------


def find_redis_server() -> str | None:
    for candidate in (shutil.which("redis-server"), "/usr/bin/redis-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def start_redis(binary: str, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server on a Unix socket in ``root`` (no TCP, no
    persistence: the transport needs none); its process and URL."""
    import redis

    sock = root / "redis.sock"
    (root / "redis.conf").write_text(
        f'port 0\nunixsocket {sock}\nunixsocketperm 700\ndir {root}\nsave ""\nappendonly no\n'
        f"logfile {root / 'redis.log'}\n")
    proc = subprocess.Popen([binary, str(root / "redis.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"unix://{sock}?db=0"
    deadline = time.monotonic() + 20
    while True:
        try:
            with redis.Redis.from_url(url) as client:
                client.ping()
            return proc, url
        except (redis.ConnectionError, FileNotFoundError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"redis-server did not start; see {root / 'redis.log'}") from None
            time.sleep(0.05)


def start_host_b(where: Path, url: str) -> subprocess.Popen[bytes]:
    """``reliable-flow bridge`` over tools.db in a process of its own, once it serves."""
    here = str(Path(__file__).resolve().parent)  # so --effects agent_two_hosts:EFFECTS imports this file
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p),
               PYTHONDONTWRITEBYTECODE="1", **{CALL_LOG: str(where / "calls.log")})
    log = open(where / "host-b.log", "wb")  # noqa: SIM115 - the child holds it; closed below
    with log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reliable_flow", "bridge", str(where / "tools.db"), "--name", "tools", "--redis", url,
             "--protocol", "agent_two_hosts:TASK", "--handlers", "agent_two_hosts:HANDLERS",
             "--effects", "agent_two_hosts:EFFECTS", "--producer", f"{url}#agent", "--concurrency", "4"],
            env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while b"serving consumer" not in (where / "host-b.log").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("host B did not start:\n" + (where / "host-b.log").read_text(errors="replace"))
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen[bytes], name: str) -> None:
    """SIGTERM (the step in progress finishes), SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"{name} did not stop on SIGTERM; killed", file=sys.stderr)


def report(where: Path, stories: list[list[str]], seen: dict[str, Any]) -> None:
    from reliable_flow import Consumer

    for story in stories:
        print("\n".join(story))
    print("what host B's tools received (their own log):")
    calls = Counter(line.split()[0] for line in (where / "calls.log").read_text().splitlines()) \
        if (where / "calls.log").exists() else Counter()
    for key, n in sorted(calls.items()):
        print(f"  {key}: {n} call{'s' if n > 1 else ''}")
    if not calls:
        print("  nothing: no tool was called in this run")
    print("what the files say:")
    for task, flow in seen["flows"].items():
        print(f"  A agent.db {task}: state {flow['state']}, seq {flow['seq']}")
    print(f"  A steps fed back from host B and committed by the worker this run: "
          f"{seen['served'].get('committed', 0)}")
    with Consumer(where / "tools.db", TASK, name="tools") as tools:  # B has stopped: its file, read once
        counts = {state: n for state, n in tools.effect_counts().items() if n}
        print(f"  B tools.db effects: {counts}; projections: "
              f"{[(t, (tools.projection(t) or {}).get('state')) for t in QUESTIONS]}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    binary = find_redis_server()
    try:
        import redis  # noqa: F401 - the transport's client
    except ImportError:
        print('agent_two_hosts: needs the redis package (pip install -e ".[test]" or ".[redis]")', file=sys.stderr)
        return 2
    if binary is None:
        print("agent_two_hosts: needs redis-server on $PATH (Debian: apt-get install redis-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="agent_two_hosts_") as tmp:
        where = Path(args[0] if args else tmp).resolve()
        where.mkdir(parents=True, exist_ok=True)
        (where / "calls.log").unlink(missing_ok=True)
        # A Unix socket's path is at most ~100 bytes: a short directory of its own for it.
        with tempfile.TemporaryDirectory(prefix="rf-redis-", dir="/tmp") as redis_dir:
            server, url = start_redis(binary, Path(redis_dir))
            try:
                host_b = start_host_b(where, url)
                try:
                    stories, seen = asyncio.run(host_a(where, url))
                finally:
                    stop(host_b, "host B")
            finally:
                stop(server, "redis-server")
        report(where, stories, seen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
