"""LinkInjector: the faults the comparison injects between a producer and an in-process broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import idempotent
from idempotent import Outcome, Producer, ProduceRequest
from idempotent.api import BrokerAPI
from idempotent.compare.faults import LinkInjector
from idempotent.errors import BrokerConnectionError, RequestTimeoutError


@pytest.fixture
def broker() -> Iterator[idempotent.Broker]:
    opened = idempotent.connect(f"memory://{uuid.uuid4().hex}")
    assert isinstance(opened, idempotent.Broker)
    yield opened
    opened.close()


def _request(session: idempotent.ProducerSession, sequence: int, value: bytes) -> ProduceRequest:
    return ProduceRequest.build("t", 0, session.producer_id, session.producer_epoch, sequence, [value])


def test_a_lost_answer_is_stored_and_a_duplicate_is_stored_once(broker: idempotent.Broker) -> None:
    link = LinkInjector(broker)
    assert isinstance(link, BrokerAPI)
    s = link.init_producer()
    link.arm_lost_ack()
    with pytest.raises(RequestTimeoutError):
        link.submit_request(_request(s, 0, b"a")).result(5)
    link.arm_duplicate()
    assert link.submit_request(_request(s, 1, b"b")).result(5).outcome is Outcome.ACCEPTED
    assert [r.value for r in broker.read("t", 0)] == [b"a", b"b"]
    assert link.injected == {"lost-ack": 1, "duplicate-request": 1}


def test_a_round_reaches_the_broker_as_one_group(broker: idempotent.Broker) -> None:
    groups: list[list[int]] = []

    inner_submit = broker.submit_requests

    def recorded(requests: list[ProduceRequest]) -> list[object]:
        groups.append([r.header.base_sequence for r in requests])
        return inner_submit(requests)  # type: ignore[return-value]

    broker.submit_requests = recorded  # type: ignore[method-assign]
    link = LinkInjector(broker)
    s = link.init_producer()
    link.arm_duplicate()
    answers = link.submit_requests([_request(s, 0, b"a"), _request(s, 1, b"b")])
    assert [a.result(5).outcome for a in answers] == [Outcome.ACCEPTED, Outcome.ACCEPTED]
    assert groups == [[0, 0, 1]]  # the copy right behind its original, in one group
    assert [r.value for r in broker.read("t", 0)] == [b"a", b"b"]


def test_a_severed_link_fails_every_later_call_and_the_producer_sees_it(broker: idempotent.Broker) -> None:
    link = LinkInjector(broker)
    with Producer(link, producer_name="p") as producer:
        producer.send("t", b"x", partition=0).result(5)
        link.sever()
        with pytest.raises(BrokerConnectionError):
            link.topics()
        with pytest.raises(BrokerConnectionError):
            link.submit_request(_request(link.inner.init_producer(), 0, b"y"))
