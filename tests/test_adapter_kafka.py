"""The Kafka backend against a real Kafka 4.x broker: the shared suite plus Kafka specifics."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from idempotent import Outcome
from idempotent.testing.conformance import BackendConformance, check_stale_owner_is_fenced, small_config, topic_name

from .conftest import ServiceHarness

pytestmark = pytest.mark.kafka


@pytest.fixture
def harness(kafka_service: Any) -> ServiceHarness:
    return ServiceHarness(kafka_service.url, "kafka")


class TestKafkaConformance(BackendConformance):
    pass


def test_plain_kafka_consumer_reads_records_unchanged(harness: ServiceHarness, kafka_service: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    broker = harness.open(small_config())
    topic = "plain/" + topic_name()
    broker.create_topic(topic, 1)
    s = broker.init_producer()
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"v1", b"v2"])
    broker.close()
    consumer = Consumer(
        {"bootstrap.servers": kafka_service.bootstrap, "group.id": "plain", "isolation.level": "read_committed"}
    )
    consumer.assign([TopicPartition(topic.replace("/", "."), 0, 0)])
    messages = consumer.consume(2, 20)
    consumer.close()
    assert [m.value() for m in messages] == [b"v1", b"v2"]
    headers = dict(messages[1].headers())
    assert headers["idem.pid"] == str(s.producer_id).encode() and headers["idem.seq"] == b"1"


def test_stale_owner_is_fenced(harness: ServiceHarness) -> None:
    first = harness.open(small_config())
    topic = topic_name("own")
    first.create_topic(topic, 1)
    s = first.init_producer("owner-test")
    assert first.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    second = harness.open(small_config())  # takes the partition over when it first touches it
    s2 = second.init_producer("owner-test")
    assert second.produce(topic, 0, s2.producer_id, s2.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    from idempotent.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="fenced"):
        first.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"stale"])
    assert [r.value for r in second.read(topic, 0, 0, 10)] == [b"a", b"b"]
    first.abandon()
    second.close()


def test_stale_owner_with_a_lapsed_lease_is_fenced(harness: ServiceHarness) -> None:
    check_stale_owner_is_fenced(harness)


def test_takeover_of_a_writer_that_died_inside_a_transaction(
    harness: ServiceHarness, kafka_service: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from confluent_kafka import KafkaException, Producer

    topic = topic_name("died")
    first = harness.open(small_config())
    first.create_topic(topic, 1)
    s = first.init_producer(topic)
    assert first.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    first.abandon()
    # the partition's writer as a killed process leaves it: inside a transaction, records sent
    stale = Producer(
        {"bootstrap.servers": kafka_service.bootstrap, "transactional.id": f"idempotent-{topic.replace('/', '.')}-0"}
    )
    stale.init_transactions(30)
    stale.begin_transaction()
    headers = [("idem.pid", b"%d" % s.producer_id), ("idem.epoch", b"0"), ("idem.seq", b"1"), ("idem.count", b"1")]
    stale.produce(topic.replace("/", "."), b"stale", partition=0, headers=headers)
    stale.flush(30)

    caplog.set_level("INFO", logger="idempotent.adapters.kafka")
    second = harness.open(small_config())
    s2 = second.init_producer(topic)
    assert s2.last_sequences[(topic, 0)] == 0  # the open transaction was aborted, not replayed
    assert second.produce(topic, 0, s2.producer_id, s2.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    assert [r.value for r in second.read(topic, 0, 0, 10)] == [b"a", b"b"]
    with pytest.raises(KafkaException):  # fenced: the dead writer's transaction can never commit
        stale.commit_transaction(30)
    second.close()
    # the coordinator aborted the open transaction and said "concurrent transactions" until it
    # had: librdkafka's "GETPID ... retrying" is the normal course of a takeover, not a warning
    takeover = [r for r in caplog.records if r.getMessage().startswith("GETPID")]
    assert all(r.name == "idempotent.adapters.kafka.librdkafka" for r in takeover)
    assert not [r.getMessage() for r in takeover if r.levelno > logging.INFO]


def test_librdkafka_log_lines_of_the_admin_client_reach_python_logging(caplog: pytest.LogCaptureFixture) -> None:
    from adapters.kafka import KafkaBackend
    from idempotent.errors import BackendUnavailableError

    caplog.set_level("DEBUG", logger="idempotent.adapters.kafka.librdkafka")
    with pytest.raises(BackendUnavailableError):
        KafkaBackend("kafka://127.0.0.1:1", timeout=1.0)  # nothing listens there
    lines = [r for r in caplog.records if r.name == "idempotent.adapters.kafka.librdkafka"]
    assert any("Connection refused" in r.getMessage() and r.levelno >= logging.WARNING for r in lines)
