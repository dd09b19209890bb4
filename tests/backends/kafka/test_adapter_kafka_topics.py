"""Kafka topics that exist already: made by Kafka's own tools, by another broker, or after the
producer started; and partitions added later."""

from __future__ import annotations

import time
from typing import Any

import pytest

import idempotent
from idempotent import Outcome, Producer
from idempotent.broker.broker import BrokerConfig
from idempotent.testing.conformance import small_config, topic_name

pytestmark = pytest.mark.kafka


def _admin(kafka_service: Any) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka_service.bootstrap})


def _make_topic(kafka_service: Any, name: str, partitions: int) -> None:
    """Create a plain Kafka topic the way Kafka's tools do (AdminClient)."""
    from confluent_kafka.admin import NewTopic

    admin = _admin(kafka_service)
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(timeout=10).topics.get(name, None).partitions or {}) != partitions:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _grow(kafka_service: Any, name: str, partitions: int) -> None:
    from confluent_kafka.admin import NewPartitions

    admin = _admin(kafka_service)
    for future in admin.create_partitions([NewPartitions(name, partitions)]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic=name, timeout=10).topics[name].partitions) != partitions:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _plain_produce(kafka_service: Any, name: str, messages: list[tuple[int, bytes]]) -> None:
    from confluent_kafka import Producer as KafkaProducer

    plain = KafkaProducer({"bootstrap.servers": kafka_service.bootstrap, "linger.ms": 0})
    for partition, value in messages:
        plain.produce(name, value, partition=partition)
    assert plain.flush(30) == 0


def _plain_read(kafka_service: Any, name: str, partition: int, count: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": kafka_service.bootstrap, "group.id": "plain", "isolation.level": "read_committed"}
    )
    consumer.assign([TopicPartition(name, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < count and time.monotonic() < deadline:
        for message in consumer.consume(count - len(values), 1):
            if message.error() is None:
                values.append(message.value())
    consumer.close()
    return values


def test_a_topic_made_by_kafkas_tools_is_used_with_its_partitions(kafka_service: Any) -> None:
    """Issue 22: producing to an existing 6-partition topic made by Kafka's tools failed with
    ``Kafka topic 'legacy' exists with 6 partitions, not 1``."""
    name = topic_name("legacy").replace("/", ".")
    _make_topic(kafka_service, name, 6)
    broker = idempotent.connect(kafka_service.url, small_config())
    try:
        assert broker.partitions_for(name) == 6
        s = broker.init_producer()
        assert broker.produce(name, 5, s.producer_id, s.producer_epoch, 0, [b"into-5"]).outcome is Outcome.ACCEPTED
        assert broker.topics()[name] == 6
    finally:
        broker.close()
    assert _plain_read(kafka_service, name, 5, 1) == [b"into-5"]
    fresh = idempotent.connect(kafka_service.url, small_config())  # adopted: in the topic records
    try:
        assert fresh.topics()[name] == 6
        assert fresh.backend.list_topics()[name] == 6
    finally:
        fresh.close()


def test_the_drop_in_produces_keyed_records_into_an_existing_topic(kafka_service: Any) -> None:
    from idempotent.compat import confluent_kafka as drop_in

    name = topic_name("legacy").replace("/", ".")
    _make_topic(kafka_service, name, 6)
    producer = drop_in.Producer({"idempotent.broker.url": kafka_service.url})
    reports: list[Any] = []
    for i in range(60):
        producer.produce(name, b"v%d" % i, key=b"key-%d" % i, on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush(60) == 0
    assert [err for err, _ in reports] == [None] * 60
    assert {msg.partition() for _, msg in reports} == set(range(6))


def test_a_topic_another_broker_creates_after_the_producer_opened_is_used_with_its_partitions(
    kafka_service: Any,
) -> None:
    """Issue 21 item 5: a drop-in Producer opened ``kafka://B``; a topic was then created with 4
    partitions through ``idempotent.connect("kafka://B").create_topic(...)``; producing to it
    from the first producer failed with ``Kafka topic '...' exists with 4 partitions, not 1``."""
    from idempotent.compat import confluent_kafka as drop_in

    producer = drop_in.Producer({"idempotent.broker.url": kafka_service.url})
    name = topic_name("later").replace("/", ".")
    creator = idempotent.connect(kafka_service.url)
    creator.create_topic(name, 4)
    creator.close()
    reports: list[Any] = []
    for i in range(40):
        producer.produce(name, b"v", key=b"k%d" % i, on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush(60) == 0
    assert [err for err, _ in reports] == [None] * 40
    assert {msg.partition() for _, msg in reports} == set(range(4))


def test_an_adopted_topic_replays_from_where_it_was_adopted(kafka_service: Any) -> None:
    """Records other Kafka producers wrote before the topic was adopted are not replayed (a
    legacy topic may hold millions); what the brokers wrote after it is, and survives a
    restart as duplicates."""
    name = topic_name("history").replace("/", ".")
    _make_topic(kafka_service, name, 2)
    _plain_produce(kafka_service, name, [(p, b"old-%d" % i) for i in range(50) for p in (0, 1)])
    broker = idempotent.connect(kafka_service.url, small_config())
    s = broker.init_producer("history-writer")
    assert broker.produce(name, 1, s.producer_id, s.producer_epoch, 0, [b"a", b"b"]).outcome is Outcome.ACCEPTED
    broker.close()

    fresh = idempotent.connect(kafka_service.url, small_config())
    try:
        batches = list(fresh.backend.replay(name, 1, 0))
        assert [(b.producer_id, b.record_count) for b in batches] == [(s.producer_id, 2)]
        from idempotent.adapters.meta import TopicOrigin

        assert fresh.backend.metadata.origin(name) == TopicOrigin(adopted=True, starts=(50, 50))  # type: ignore[attr-defined]
        again = fresh.init_producer("history-writer")
        dup = fresh.produce(name, 1, again.producer_id, again.producer_epoch, 0, [b"a", b"b"])
        assert dup.outcome is Outcome.DUPLICATE and dup.base_offset == batches[0].base_offset
        assert [r.value for r in fresh.read(name, 1, 0, 100)][-3:] == [b"old-49", b"a", b"b"]
    finally:
        fresh.close()


def test_the_first_origin_record_of_a_topic_wins() -> None:
    """Brokers racing to record one topic each write an origin; every broker folds the first in
    log order, whose ends are before any broker's batches (adapters/meta.py)."""
    from idempotent.adapters.meta import MetaLog, TopicOrigin, origin_key, pack_origin

    log: MetaLog[int] = MetaLog()
    log.apply(origin_key("t", "a"), pack_origin(TopicOrigin(adopted=False)), 0)
    log.apply(origin_key("t", "b"), pack_origin(TopicOrigin(adopted=True, starts=(7, 9))), 1)
    log.apply(origin_key("u.v", "c"), pack_origin(TopicOrigin(adopted=True, starts=(3,), partitioned=False)), 2)
    assert log.origins == {
        "t": TopicOrigin(adopted=False),
        "u.v": TopicOrigin(adopted=True, starts=(3,), partitioned=False),
    }
    assert log.origins["u.v"].start(0) == 3 and log.origins["u.v"].start(1) == 0


def test_a_partition_added_with_kafkas_tools_is_served(kafka_service: Any) -> None:
    """A broker that knows a topic serves a partition added to it since, when asked for it
    (it reads the count again, at most once a second per topic), and records the new count."""
    name = topic_name("grows").replace("/", ".")
    broker = idempotent.connect(kafka_service.url, small_config())
    try:
        broker.create_topic(name, 2)
        s = broker.init_producer()
        assert broker.produce(name, 1, s.producer_id, s.producer_epoch, 0, [b"before"]).outcome is Outcome.ACCEPTED
        _grow(kafka_service, name, 4)
        time.sleep(1.05)
        assert broker.produce(name, 3, s.producer_id, s.producer_epoch, 0, [b"after"]).outcome is Outcome.ACCEPTED
        assert broker.partitions_for(name) == 4
    finally:
        broker.close()
    assert _plain_read(kafka_service, name, 3, 1) == [b"after"]
    fresh = idempotent.connect(kafka_service.url)
    try:  # the grown count is in the topic records
        assert fresh.topics()[name] == 4
    finally:
        fresh.close()


def test_brokers_and_producers_learn_added_partitions_after_their_refresh_interval(kafka_service: Any) -> None:
    name = topic_name("grows").replace("/", ".")
    _make_topic(kafka_service, name, 2)
    broker = idempotent.connect(kafka_service.url, BrokerConfig(topic_refresh_interval=0.5))
    try:
        with Producer(broker, metadata_max_age_ms=300) as producer:
            assert producer.partitions_for(name) == 2
            _grow(kafka_service, name, 5)
            assert broker.partitions_for(name) == 2  # trusted for topic_refresh_interval
            time.sleep(0.6)
            deadline = time.monotonic() + 20  # read again in the background, then asked again
            while producer.partitions_for(name) != 5:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            keys = [b"k%d" % i for i in range(50)]
            partitions = {producer.send(name, b"v", key=key).result(30).partition for key in keys}
            assert partitions == set(range(5))
    finally:
        broker.close()


def test_a_topic_deleted_with_kafkas_tools_is_not_listed(
    kafka_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``idempotent topics list`` waited 30 s reading a topic deleted with Kafka's tools (still
    in the topic records), then failed with ``reading <topic>[0] timed out``."""
    from ...cli_helpers import run

    kept, gone = topic_name("kept").replace("/", "."), topic_name("gone").replace("/", ".")
    broker = idempotent.connect(kafka_service.url, small_config())
    try:
        for name in (kept, gone):
            broker.create_topic(name, 1)
            s = broker.init_producer()
            assert broker.produce(name, 0, s.producer_id, s.producer_epoch, 0, [b"x"]).outcome is Outcome.ACCEPTED
    finally:
        broker.close()
    admin = _admin(kafka_service)
    for future in admin.delete_topics([gone]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while gone in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    code, out, err = run(capsys, "topics", "list", kafka_service.url)
    assert code == 0, err
    assert kept in out and gone not in out
