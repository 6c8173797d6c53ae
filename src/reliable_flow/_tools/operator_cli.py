"""Operator actions from the command line: one command per operator method
of the Python API, each recorded with ``--actor`` and ``--reason``.

* ``effect retry|resolve|cancel|amend CONSUMER_DB KEY``: ``consumer.admin.retry_effect``
  / ``resolve_effect`` (``--result JSON``) / ``cancel_effect`` /
  ``amend_effect`` (``--result JSON`` or ``--failure``); ``resolve`` and
  ``amend`` check the result against the effect's ``Feedback``
  (``--effects``) and the producer's protocol (``--producer``) before
  anything is recorded;
* ``schedule pause|resume|remove CONSUMER_DB NAME``: ``consumer.admin.pause_schedule``
  / ``resume_schedule`` / ``remove_schedule`` (a recurring effect schedule);
* ``delivery redeliver|skip PRODUCER_DB CONSUMER_NAME EVENT_ID``:
  ``producer.admin.redeliver`` / ``skip``;
* ``inbox skip|replace CONSUMER_DB EVENT_ID``: ``consumer.admin.skip_event`` /
  ``replace_event`` (``--envelope FILE``);
* ``registry register|remove|subscribe PRODUCER_DB NAME``:
  ``producer.admin.register_consumer`` (``--from-now``, ``--topics``) /
  ``remove_consumer`` / ``subscribe`` (``--topics``, required).
* ``retention prune STORE --older-than SECONDS``: ``producer.admin.prune`` or
  ``consumer.admin.prune`` (the store's kind decides), ``--batch-size``,
  ``--limit``, ``--forget-after``; ``--dry-run`` counts what it would
  remove, read only (no actor or reason needed, nothing recorded).

The command only parses its arguments, opens the store and calls the
method, which decides and records.  A store must already exist: it is first
opened read only (as ``inspect`` does, so a missing file or schema is
refused and nothing is created), then as a ``Producer`` / ``Consumer`` of
``--protocol``, or of the protocol the store records when it is not given.  Exit codes: 0 done (one line on stdout, or the recorded
action with ``--json``); 1 refused by the rules (``NotResolvable``: e.g. the
event or effect is not in a state the action may leave, a name already
registered), nothing changed; 2 an error (bad arguments, a store that
cannot be opened, an unknown event, key or consumer), nothing changed.
Messages go to stderr as ``COMMAND: message``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .._checks import check_text
from ..errors import NotResolvable, ReliableFlowError
from ..records import OperatorAction
from ._cli_common import is_remote
from .loading import PROTOCOL_HELP, OptionError, load, protocol_for
from .operator_actions import (
    delivery_action,
    effect_action,
    inbox_action,
    prune_action,
    registry_action,
    schedule_action,
    store_kind,
    would_prune,
)

__all__ = ["add_operator_commands", "run_operator_command"]

_RECORDED = "recorded with who, when and why"


def _text(name: str) -> Callable[[str], str]:
    """An argparse type: the API's own check for an actor or a reason (not blank)."""
    def parse(value: str) -> str:
        try:
            return check_text(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON value (e.g. '{{\"parcel\": \"P-7\"}}'), got {value!r}: {exc}") \
            from None


def _action(group: Any, name: str, help_text: str, store: str, *targets: tuple[str, str]) -> argparse.ArgumentParser:
    """One action's parser: the store, its targets, and the options every action takes."""
    parser: argparse.ArgumentParser = group.add_parser(name, help=help_text, description=f"{help_text}; "
                                                        f"{_RECORDED}. Exit 0 done, 1 refused by the rules, 2 "
                                                        f"an error. See docs/operations.md.")
    parser.add_argument("store", metavar=store,
                        help="an existing SQLite file or postgresql://...#schema location (never created)"
                        + ("; or a consumer on another host, redis://host:6379/0#NAME, acted on through its "
                           "bridge (started with --allow-actions)" if store == "CONSUMER_DB" else ""))
    for dest, metavar in targets:
        parser.add_argument(dest, metavar=metavar)
    parser.add_argument("--actor", required=True, type=_text("actor"), help="who decided (recorded)")
    parser.add_argument("--reason", required=True, type=_text("reason"), help="why (recorded)")
    parser.add_argument("--protocol", metavar="MODULE:ATTR", help=PROTOCOL_HELP)
    parser.add_argument("--json", action="store_true", help="print the recorded action as JSON")
    return parser


def add_operator_commands(sub: Any) -> None:
    """Register the ``effect``, ``schedule``, ``delivery``, ``inbox``, ``registry`` and ``retention`` commands on ``sub``."""
    effect = sub.add_parser("effect", help="retry / resolve / cancel an effect (recorded operator actions)",
                            description="Operator actions on a consumer's effect outbox.")
    actions = effect.add_subparsers(dest="action", metavar="ACTION", required=True)
    _action(actions, "retry", "run a dead or unknown effect again, now, with a fresh attempt budget",
            "CONSUMER_DB", ("key", "KEY"))
    resolve = _action(actions, "resolve", "record that the effect did take place (checked by hand)",
                      "CONSUMER_DB", ("key", "KEY"))
    resolve.add_argument("--result", type=_json_value, default=None, metavar="JSON",
                         help="the effect's result, a JSON value (default: null)")
    _checks(resolve, required=False)
    _action(actions, "cancel", "decide that the effect will never run", "CONSUMER_DB", ("key", "KEY"))
    amend = _action(actions, "amend", "replace the result of an effect whose feedback was refused (or switch it "
                    "to its failure step); the executor then feeds it once", "CONSUMER_DB", ("key", "KEY"))
    choice = amend.add_mutually_exclusive_group(required=True)
    choice.add_argument("--result", type=_json_value, metavar="JSON", help="the effect's new result, a JSON value")
    choice.add_argument("--failure", action="store_true",
                        help="feed its failure step (Feedback on_failure) instead; it becomes cancelled")
    _checks(amend, required=True)

    schedule = sub.add_parser("schedule", help="pause / resume / remove a recurring effect schedule (recorded)",
                              description="Operator actions on a consumer's recurring effect schedules.")
    actions = schedule.add_subparsers(dest="action", metavar="ACTION", required=True)
    _action(actions, "pause", "stop a schedule's ticks until it is resumed", "CONSUMER_DB", ("name", "NAME"))
    _action(actions, "resume", "let a paused schedule tick again from its next tick", "CONSUMER_DB",
            ("name", "NAME"))
    _action(actions, "remove", "delete a schedule (an executor declaring it records it again when it opens)",
            "CONSUMER_DB", ("name", "NAME"))
    delivery = sub.add_parser("delivery", help="redeliver / skip an event for one consumer (recorded)",
                              description="Operator actions on a producer's deliveries to one consumer.")
    actions = delivery.add_subparsers(dest="action", metavar="ACTION", required=True)
    targets = (("consumer", "CONSUMER_NAME"), ("event_id", "EVENT_ID"))
    _action(actions, "redeliver", "put a set-aside or pending event back in line for the consumer, due now; "
            "a lease a relay holds on it is released at once", "PRODUCER_DB", *targets)
    _action(actions, "skip", "decide that the consumer will never get this event", "PRODUCER_DB", *targets)

    inbox = sub.add_parser("inbox", help="skip / replace an accepted event in a consumer's inbox (recorded)",
                           description="The operator's way past a bad accepted event.")
    actions = inbox.add_subparsers(dest="action", metavar="ACTION", required=True)
    _action(actions, "skip", "move the flow past its next step (pending or blocked) without applying it",
            "CONSUMER_DB", ("event_id", "EVENT_ID"))
    replace = _action(actions, "replace", "put a corrected event (same flow and seq, a new event id) in place "
                      "of a pending or blocked one", "CONSUMER_DB", ("event_id", "EVENT_ID"))
    replace.add_argument("--envelope", required=True, metavar="FILE",
                         help="the corrected envelope as JSON, in FILE ('-': standard input)")

    registry = sub.add_parser("registry", help="register / remove / subscribe a consumer name of a producer "
                                               "(recorded)",
                              description="The producer's consumer registry.")
    actions = registry.add_subparsers(dest="action", metavar="ACTION", required=True)
    register = _action(actions, "register", "register a consumer name, so relays deliver to it",
                       "PRODUCER_DB", ("name", "NAME"))
    register.add_argument("--from-now", action="store_true",
                          help="only events committed from now on (default: every event from the first one)")
    register.add_argument("--topics", type=_topic_names, metavar="TOPIC[,TOPIC...]",
                          help="only the events of these topics of the producer (default: every event)")
    _action(actions, "remove", "remove a consumer name and every delivery to it", "PRODUCER_DB", ("name", "NAME"))
    subscribe = _action(actions, "subscribe", "change the topics a consumer name gets, from now on",
                        "PRODUCER_DB", ("name", "NAME"))
    subscribe.add_argument("--topics", required=True, type=_topic_names, metavar="TOPIC[,TOPIC...]",
                           help="the producer's topics it gets from now on")

    retention = sub.add_parser("retention", help="prune old finished rows of a producer or consumer (recorded)",
                               description="Retention: see docs/operations.md.")
    actions = retention.add_subparsers(dest="action", metavar="ACTION", required=True)
    prune = actions.add_parser("prune", help="remove old finished rows, leaving tombstones",
                               description=f"producer.admin.prune / consumer.admin.prune (the store's kind decides); "
                                           f"{_RECORDED}. Exit 0 done, 2 an error. See docs/operations.md.")
    prune.add_argument("store", metavar="STORE",
                       help="an existing producer or consumer store: SQLite file or postgresql://...#schema")
    prune.add_argument("--older-than", required=True, type=float, metavar="SECONDS",
                       help="remove finished rows older than this many seconds")
    prune.add_argument("--batch-size", type=int, default=500, help="rows per transaction (default 500)")
    prune.add_argument("--limit", type=int, default=None, help="at most this many rows in all (default: all)")
    prune.add_argument("--forget-after", type=float, default=None, metavar="SECONDS",
                       help="also forget tombstones pruned longer ago than this (>= --older-than; default never)")
    prune.add_argument("--dry-run", action="store_true",
                       help="only count what it would remove now, read only; nothing recorded")
    prune.add_argument("--actor", type=_text("actor"), help="who decided (recorded; required unless --dry-run)")
    prune.add_argument("--reason", type=_text("reason"), help="why (recorded; required unless --dry-run)")
    prune.add_argument("--protocol", metavar="MODULE:ATTR", help=PROTOCOL_HELP)
    prune.add_argument("--json", action="store_true", help="print the recorded action (or the dry run's counts) "
                                                            "as JSON")


def _topic_names(value: str) -> list[str]:
    """``--topics a,b``: the topic names (checked by the producer)."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--topics must name at least one topic")
    return names


def _checks(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """``--effects`` and ``--producer``: what a result is checked against before it is recorded."""
    parser.add_argument("--effects", required=required, metavar="MODULE:ATTR",
                        help="the consumer's EffectRegistry: the result is built into the step its Feedback feeds "
                             "(refused, nothing recorded, if that fails)" + ("" if required else " (default: no check)"))
    parser.add_argument("--producer", metavar="LOCATION",
                        help="the producer's store (SQLite path or postgresql://...#schema, opened with --protocol), or a "
                             "producer on another host served by `run --serve-as NAME` (URL#NAME): "
                             "the step is checked against its protocol at the flow's current seq, nothing committed")


# -- opening -----------------------------------------------------------------------------------


@contextmanager
def _opened(args: argparse.Namespace, kind: str) -> Iterator[Any]:
    """The store as a ``Producer`` / ``Consumer``, only if it exists already."""
    from .operator_actions import opened_owner

    effects = None
    if getattr(args, "effects", None):
        from .._effects import EffectRegistry

        effects = load("--effects", args.effects, lambda o: isinstance(o, EffectRegistry),
                       "a reliable_flow EffectRegistry")
    # a consumer on another host (URL#NAME) is acted on over there, with its own protocol and effects
    remote = kind == "consumer" and is_remote(args.store)
    protocol = None if remote else protocol_for(args.protocol, (kind, args.store))
    with opened_owner(kind, args.store, protocol, effects) as owner:
        yield owner


@contextmanager
def _checking(args: argparse.Namespace, protocol: Any) -> Iterator[Any]:
    """``--producer``'s store as a ``Producer`` (only if it exists already), or None."""
    from .._producer import Producer
    from .stores import open_producer

    if not getattr(args, "producer", None):
        yield None
        return
    if is_remote(args.producer):  # on another host: checked over there, by the worker serving it
        try:
            from ..transport.redis import RemoteProducer
        except ImportError as exc:
            raise OptionError(str(exc)) from None
        try:
            remote = RemoteProducer.at(args.producer)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        with remote:
            yield remote
        return
    open_producer(args.producer).close()
    with Producer(args.producer, protocol) as producer:
        yield producer


def _envelope(source: str) -> str:
    try:
        if source == "-":
            return sys.stdin.read()
        with open(source, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"cannot read --envelope {source}: {exc}") from None


# -- the actions: (record, what happened) ------------------------------------------------------


def _effect(args: argparse.Namespace) -> tuple[OperatorAction, str]:
    with _opened(args, "consumer") as consumer:
        who = {"actor": args.actor, "reason": args.reason}
        if args.action in ("resolve", "amend") and not is_remote(args.store):  # remote: checked over there
            with _checking(args, consumer.protocol) as producer:
                return effect_action(consumer, args.action, args.key, result=args.result,
                                     failure=getattr(args, "failure", False), producer=producer, **who)
        if args.action in ("resolve", "amend"):
            return effect_action(consumer, args.action, args.key, result=args.result,
                                 failure=getattr(args, "failure", False), **who)
        return effect_action(consumer, args.action, args.key, **who)


def _schedule(args: argparse.Namespace) -> tuple[OperatorAction, str]:
    with _opened(args, "consumer") as consumer:
        return schedule_action(consumer, args.action, args.name, actor=args.actor, reason=args.reason)


def _delivery(args: argparse.Namespace) -> tuple[OperatorAction, str]:
    with _opened(args, "producer") as producer:
        return delivery_action(producer, args.action, args.consumer, args.event_id, actor=args.actor,
                               reason=args.reason)


def _inbox(args: argparse.Namespace) -> tuple[OperatorAction, str]:
    corrected = _envelope(args.envelope) if args.action == "replace" else None
    with _opened(args, "consumer") as consumer:
        return inbox_action(consumer, args.action, args.event_id, actor=args.actor, reason=args.reason,
                            envelope=corrected)


def _registry(args: argparse.Namespace) -> tuple[OperatorAction, str]:
    with _opened(args, "producer") as producer:
        return registry_action(producer, args.action, args.name, actor=args.actor, reason=args.reason,
                               from_now=getattr(args, "from_now", False), topics=getattr(args, "topics", None))


def _retention(args: argparse.Namespace) -> tuple[OperatorAction, str]:
    if args.actor is None or args.reason is None:
        raise OptionError("--actor and --reason are required (they are recorded); --dry-run needs neither")
    args.kind = store_kind(args.store)
    with _opened(args, args.kind) as owner:
        return prune_action(owner, args.kind, args.older_than, actor=args.actor, reason=args.reason,
                            batch_size=args.batch_size, limit=args.limit, forget_after=args.forget_after)


def _dry_run(args: argparse.Namespace) -> int:
    import time

    try:
        counts, said = would_prune(args.store, args.older_than, time.time(), limit=args.limit,
                                   forget_after=args.forget_after)
    except _ERRORS as exc:
        print(f"retention prune: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(counts, indent=2, sort_keys=True) + "\n")
    else:
        print(f"retention prune: {said}")
    return 0


_GROUPS: dict[str, Callable[[argparse.Namespace], tuple[OperatorAction, str]]] = {
    "effect": _effect, "schedule": _schedule, "delivery": _delivery, "inbox": _inbox, "registry": _registry, "retention": _retention,
}

#: Exit 2: a store that cannot be opened (missing, wrong kind, another
#: protocol, needs an upgrade, server unreachable), an unknown event, key or
#: consumer, a malformed location, value or envelope, no postgres extra.
_ERRORS = (OptionError, ReliableFlowError, FileNotFoundError, ImportError, ValueError)


def run_operator_command(args: argparse.Namespace) -> int | None:
    """Run an operator command and return its exit code; None if ``args`` is another command."""
    run = _GROUPS.get(getattr(args, "command", None) or "")
    if run is None:
        return None
    name = f"{args.command} {args.action}"
    if getattr(args, "dry_run", False):
        return _dry_run(args)
    try:
        record, done = run(args)
    except NotResolvable as exc:
        print(f"{name}: refused: {exc}", file=sys.stderr)
        return 1
    except _ERRORS as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(record.as_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    else:
        print(f"{name}: {done}; recorded: actor {record.actor!r}, reason {record.reason!r}")
    return 0
