"""The "earliest due time" reads, for every engine: ``OutboxReads.next_due_at``
and ``EffectReads.next_effect_due_at`` (what ``Worker.run(until_idle=True)``
sleeps on).

Checked through the store interface only (units, snapshots, ``latest``).
"""

from __future__ import annotations

from contract_support import append, bind, env

from reliable_flow._store.effects import NewEffect
from reliable_flow.delivery import Retry
from reliable_flow.statuses import DeliveryState, EffectState

S = EffectState





def new_effect(key: str, *, flow: str = "F", seq: int = 1, name: str = "notify", ordered: bool = False,
               created: float = 100.0) -> NewEffect:
    return NewEffect(key, name, '{"n":1}', f"{flow}{seq}", flow, seq, "{}", ordered, None, None, None, created)


def add_effects(store, *effects: NewEffect) -> None:
    with store.write() as unit:
        for effect in effects:
            assert unit.add_effect(effect) is None


def set_effect(store, key: str, **changes: object) -> None:
    with store.write() as unit:
        unit.update_effect(key, changes, 500.0)


# -- deliveries ---------------------------------------------------------------------------


def test_nothing_pending_has_no_due_time(outbox):
    assert outbox.latest.next_due_at("a") is None
    append(outbox, env("E1"))
    assert outbox.latest.next_due_at("a") is None  # no consumer bound yet: nothing pending for "a"
    bind(outbox, "a")
    assert outbox.latest.next_due_at("nobody") is None


def test_a_new_delivery_is_due_at_once(outbox):
    bind(outbox, "a")
    append(outbox, env("E1"))
    due = outbox.latest.next_due_at("a")
    assert due is not None and due <= 0.0
    with outbox.read() as reads:
        assert reads.next_due_at("a") == due


def test_the_earliest_of_leases_and_backoffs_per_consumer(outbox):
    bind(outbox, "a", "b")
    p1, p2, p3 = append(outbox, env("E1"), env("E2", "G"), env("E3", "H"))
    with outbox.write() as unit:
        unit.claim("a", [p1], 130.0, "relay-1", 100.0)
        unit.set_retry("a", p2, Retry(1, 120.5, "ConnectionError: down"), 100.0)
        unit.set_retry("a", p3, Retry(2, 160.0, "ConnectionError: down"), 100.0)
    assert outbox.latest.next_due_at("a") == 120.5
    assert outbox.latest.next_due_at("b") <= 0.0  # another consumer's deliveries are its own
    with outbox.write() as unit:
        unit.mark("a", [(p2, "accepted")], [], 121.0)
    assert outbox.latest.next_due_at("a") == 130.0


def test_accepted_set_aside_and_skipped_deliveries_wait_for_nothing(outbox):
    bind(outbox, "a")
    p1, p2, p3 = append(outbox, env("E1"), env("E2", "G"), env("E3", "H"))
    with outbox.write() as unit:
        unit.mark("a", [(p1, "accepted")], [(p2, "id_conflict")], 100.0)
        unit.resolve("a", p3, DeliveryState.SKIPPED, 100.0)
    assert outbox.latest.next_due_at("a") is None
    with outbox.write() as unit:
        unit.resolve("a", p2, DeliveryState.PENDING, 200.0)  # an operator's redeliver: due at once
    due = outbox.latest.next_due_at("a")
    assert due is not None and due <= 200.0


# -- effects ------------------------------------------------------------------------------


def test_no_open_effect_has_no_due_time(inbox):
    assert inbox.latest.next_effect_due_at(["notify"]) is None
    add_effects(inbox, new_effect("k1"))
    assert inbox.latest.next_effect_due_at([]) is None
    assert inbox.latest.next_effect_due_at(["other"]) is None  # only the names asked for


def test_pending_running_and_in_doubt_effects_count_with_their_due_time(inbox):
    add_effects(inbox, new_effect("k1"), new_effect("k2", flow="G"), new_effect("k3", flow="H"))
    due = inbox.latest.next_effect_due_at(["notify"])
    assert due is not None and due <= 100.0  # scheduled: due at once
    set_effect(inbox, "k1", state=S.RUNNING, due_at=530.0, lease_owner="exec-1")
    set_effect(inbox, "k2", state=S.IN_DOUBT, due_at=520.0)
    set_effect(inbox, "k3", state=S.PENDING, due_at=540.0, failures=1)
    assert inbox.latest.next_effect_due_at(["notify"]) == 520.0
    with inbox.read() as reads:
        assert reads.next_effect_due_at(["notify", "other"]) == 520.0


def test_settled_and_parked_effects_wait_for_nothing(inbox):
    add_effects(inbox, *(new_effect(f"k{i}", flow=f"F{i}") for i in range(6)))
    for key, state in zip([f"k{i}" for i in range(6)],
                          [S.SUCCEEDED, S.DEAD, S.UNKNOWN, S.EXPIRED, S.SUPERSEDED, S.CANCELLED]):
        set_effect(inbox, key, state=state, due_at=600.0)
    assert inbox.latest.next_effect_due_at(["notify"]) is None


def test_an_ordered_effect_behind_an_unresolved_one_waits_on_that_one(inbox):
    add_effects(inbox, new_effect("first", ordered=True), new_effect("second", seq=2, ordered=True))
    set_effect(inbox, "first", state=S.PENDING, due_at=700.0)
    set_effect(inbox, "second", state=S.PENDING, due_at=650.0)
    # "second" cannot run before "first" resolves: the first's time is the one that counts.
    assert inbox.latest.next_effect_due_at(["notify"]) == 700.0
    set_effect(inbox, "first", state=S.DEAD)
    # Behind a dead effect it waits for an operator, not for a time.
    assert inbox.latest.next_effect_due_at(["notify"]) is None
    set_effect(inbox, "first", state=S.SUCCEEDED)
    assert inbox.latest.next_effect_due_at(["notify"]) == 650.0
