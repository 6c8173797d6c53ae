"""A bridge answers operators' questions about its consumer (issue 31,
item 6): the reads of ``inspect`` and the console on the producer's host
(:class:`~._remote.RemoteInbox`), and, only when it was started allowing
them, operator actions, run and recorded here as on the command line.

Questions come on the stream ``<prefix>:{NAME}:questions`` (read through
the bridge's consumer group, as requests are); each answer goes to the
question's own reply stream ``<prefix>:{NAME}:said:<id>``, kept
``REPLY_TTL`` seconds.  A question past its deadline is dropped unread
(its asker has given up); a malformed one (not of this version, an
unknown method, arguments of the wrong type, a reply address outside this
consumer's) is refused: answered with the error when it says where to,
never run.  A read runs in a read transaction of the consumer's store and
writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..._consumer import Consumer
from ..._observe import INFO, WARNING, WORKER, fields, log
from ...errors import ReliableFlowError
from .. import _read_wire as rw
from .. import _wire as wire
from ._connect import Keys, fields_of
from ._group import GroupReader

__all__ = ["NOT_ALLOWED", "Questions"]

#: The error type of an action refused because the bridge takes none.
NOT_ALLOWED = "ActionsNotAllowed"


class Questions:
    """The questions about ``consumer`` this bridge (member ``member`` of
    ``group``) answers; actions only when ``allow_actions``, a
    ``resolve`` / ``amend``'s result checked against ``producer`` (the
    bridge's executors' producer, or None).  ``asked``: the questions
    answered (reads and actions), ``acted``: the actions done,
    ``refused``: the malformed or not allowed ones."""

    def __init__(self, consumer: Consumer, client: Any, url: str, keys: Keys, group: str, member: str, *,
                 batch: int, claim_after: float, allow_actions: bool, producer: Any,
                 setup: Callable[[], None]) -> None:
        self.consumer, self.keys = consumer, keys
        self.allow_actions, self.producer = allow_actions, producer
        self.reader = GroupReader(client, url, keys.questions, group, member, batch=batch, claim_after=claim_after,
                                  setup=setup)
        self.asked = self.acted = self.refused = 0

    def serve(self) -> int:
        """Answer the questions waiting (never blocks); how many were answered."""
        entries = self.reader.read(None)
        if not entries:
            return 0
        now = time.time()
        uid = self.consumer.uid
        answers: list[tuple[str, dict[str, str]]] = []
        for entry in entries:
            raw: dict[str, str] = {}
            try:
                raw = wire.decode(fields_of(entry))
                q = rw.parse_question(raw)
                if not q.reply.startswith(self.keys.said + ":"):
                    raise wire.BadMessage("reply", "not a reply address of this consumer")
            except wire.BadMessage as exc:
                self._refused(f"malformed question refused: {exc}")
                reply, question_id = raw.get("reply", ""), raw.get("id", "")
                if reply.startswith(self.keys.said + ":") and 0 < len(question_id) <= 1024:
                    answers.append((reply, rw.error_fields(question_id, uid, "BadMessage", str(exc))))
                continue
            if q.deadline <= now:
                continue  # its asker has given up
            answers.append((q.reply, self._answer(q, uid)))
        self.reader.finish(f"answering questions about consumer {self.consumer.name!r}", answers,
                           [e[0] for e in entries])
        self.asked += len(answers)
        return len(answers)

    def _answer(self, q: rw.Question, uid: str) -> dict[str, str]:
        if q.kind == "read":
            try:
                with self.consumer.store.read() as reads:
                    value = getattr(reads, q.method)(**q.args)
            except ReliableFlowError as exc:  # the store could not be read: said, the asker decides
                return rw.error_fields(q.id, uid, type(exc).__name__, str(exc))
            return rw.answer_fields(q.id, uid, value)
        if not self.allow_actions:
            self._refused(f"action {q.method} refused: this bridge takes no actions")
            return rw.error_fields(q.id, uid, NOT_ALLOWED, (
                f"the bridge serving consumer {self.consumer.name!r} takes no operator actions from other hosts: "
                f"start it with --allow-actions (Bridge(allow_actions=True)), or act on the consumer's host"))
        if q.uid != uid:
            return rw.error_fields(q.id, uid, "ConsumerMismatch", (
                f"consumer {self.consumer.name!r} at {self.consumer.location} has storage uid {uid}, but the "
                f"action was for uid {q.uid}: another store serves this name now; look again"))
        try:
            done = _act(self.consumer, q.method, q.args, self.producer)
        except (ReliableFlowError, ValueError, TypeError, LookupError) as exc:  # refused: nothing changed
            return rw.error_fields(q.id, uid, type(exc).__name__, str(exc))
        self.acted += 1
        if WORKER.isEnabledFor(INFO):
            log(WORKER, INFO, "operator action from another host done",
                fields(consumer=self.consumer.name, action=q.method, actor=q.args["actor"]))
        return rw.answer_fields(q.id, uid, done)

    def _refused(self, text: str) -> None:
        self.refused += 1
        if WORKER.isEnabledFor(WARNING):
            log(WORKER, WARNING, text, fields(consumer=self.consumer.name))


def _act(consumer: Consumer, method: str, args: dict[str, Any], producer: Any) -> Any:
    """The action, through the same calls as the command line and the console."""
    from ..._tools.operator_actions import effect_action, inbox_action, prune_action

    who = {"actor": args["actor"], "reason": args["reason"]}
    if method == "prune":
        return prune_action(consumer, "consumer", args["older_than"], now=args["now"], limit=args["limit"],
                            forget_after=args["forget_after"], **who)
    if method in ("skip_event", "replace_event"):
        return inbox_action(consumer, method.split("_")[0], args["event_id"], envelope=args.get("envelope"), **who)
    return effect_action(consumer, method.split("_")[0], args["key"], result=args.get("result"),
                         failure=bool(args.get("failure")), producer=producer, **who)

