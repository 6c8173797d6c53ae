from __future__ import annotations

from reliable_flow import Consumer, Producer, relay
from reliable_flow.records import InboxEntry


def test_one_event_goes_committed_accepted_applied(producer: Producer, consumer: Consumer) -> None:
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    assert (r.status, r.seq, r.event_id) == ("committed", 1, "A1")
    assert relay(producer, consumer).status == "accepted"
    assert producer.outbox("A")[0].accepted is True
    assert consumer.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]
    assert consumer.apply_next("A").status == "applied"
    assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert relay(producer, consumer).status == "idle"
