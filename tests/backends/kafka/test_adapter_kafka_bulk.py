"""Bulk calls into librdkafka (idempotent.adapters.kafka.bulk) against a real Kafka: the direct path
stores exactly what confluent-kafka's ``produce_batch`` stores, in order, reports a refused
suffix the same way, and is never used on an object whose layout is not confluent-kafka's."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from idempotent.adapters.kafka.bulk import DISABLE_ENV, BulkWriter, attach, bulk_columns
from idempotent.core.records import Record, RecordColumns

pytestmark = pytest.mark.kafka


def _read(kafka_service: Any, topic: str, count: int) -> list[tuple[bytes | None, bytes | None, int]]:
    consumer = Consumer({"bootstrap.servers": kafka_service.bootstrap, "group.id": uuid.uuid4().hex})
    try:
        consumer.assign([TopicPartition(topic, 1, 0)])
        found: list[tuple[bytes | None, bytes | None, int]] = []
        while len(found) < count:
            message = consumer.poll(10)
            assert message is not None, f"only {len(found)} of {count} records came back"
            assert message.error() is None
            found.append((message.value(), message.key(), message.offset()))
        return found
    finally:
        consumer.close()


def _producer(kafka_service: Any, **config: Any) -> Producer:
    return Producer({"bootstrap.servers": kafka_service.bootstrap, "linger.ms": 5, **config})


@pytest.fixture
def topic(kafka_service: Any) -> str:
    name = f"bulk-{uuid.uuid4().hex[:8]}"
    producer = _producer(kafka_service)
    producer.produce(name, b"create", partition=0)  # auto-created with the broker's default
    assert producer.flush(30) == 0
    metadata = producer.list_topics(name, timeout=10)
    if len(metadata.topics[name].partitions) < 2:
        from confluent_kafka.admin import AdminClient, NewPartitions

        admin = AdminClient({"bootstrap.servers": kafka_service.bootstrap})
        admin.create_partitions([NewPartitions(name, 2)])[name].result(30)
    return name


@pytest.fixture(params=[True, False], ids=["direct", "produce_batch"])
def direct(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both paths: librdkafka's own bulk call, and produce_batch (the fallback, forced)."""
    if not request.param:
        monkeypatch.setenv(DISABLE_ENV, "0")
    return bool(request.param)


def _writer(producer: Producer, direct: bool) -> BulkWriter:
    writer = BulkWriter(producer)
    assert (writer._direct is not None) is direct
    return writer


def test_values_and_keys_are_stored_in_order_without_a_report_each(
    kafka_service: Any, topic: str, direct: bool
) -> None:
    reports: list[Any] = []
    producer = _producer(kafka_service, on_delivery=lambda err, msg: reports.append(err))
    writer = _writer(producer, direct)
    values = [b"v%d" % i * (i % 7) for i in range(500)]  # b"" included
    keys = [b"k%d" % (i % 13) for i in range(500)]
    assert writer.produce(topic, 1, values[:250], keys[:250]) == (250, "")
    assert writer.produce(topic, 1, values[250:], None) == (250, "")
    assert producer.flush(30) == 0
    stored = _read(kafka_service, topic, 500)
    assert [value for value, _, _ in stored] == values
    assert [key for _, key, _ in stored] == keys[:250] + [None] * 250
    assert [offset for _, _, offset in stored] == list(range(500))
    # the direct path's records carry no state object: the default report never runs for them
    assert reports == ([] if direct else [None] * 500)


def test_a_none_value_or_key_takes_produce_batch(kafka_service: Any, topic: str) -> None:
    producer = _producer(kafka_service)
    writer = BulkWriter(producer)
    assert writer._direct is not None
    assert writer.produce(topic, 1, [b"a", None, b"c"], [None, b"k", b"l"]) == (3, "")
    assert producer.flush(30) == 0
    assert [(v, k) for v, k, _ in _read(kafka_service, topic, 3)] == [(b"a", None), (None, b"k"), (b"c", b"l")]


def test_a_full_queue_refuses_a_suffix_and_says_so(kafka_service: Any, topic: str, direct: bool) -> None:
    producer = _producer(kafka_service, **{"queue.buffering.max.messages": 10, "linger.ms": 60_000})
    writer = _writer(producer, direct)
    assert writer.produce(topic, 1, [b"%d" % i for i in range(25)], None) == (10, "_QUEUE_FULL")
    assert producer.flush(30) == 0
    assert [v for v, _, _ in _read(kafka_service, topic, 10)] == [b"%d" % i for i in range(10)]


def test_only_a_confluent_kafka_producer_is_attached() -> None:
    class Lookalike:
        def produce_batch(self, *args: Any, **kwargs: Any) -> int:
            raise AssertionError("not called")

    assert attach(Lookalike()) is None
    assert attach(object()) is None
    assert attach(Producer({"bootstrap.servers": "127.0.0.1:1"})) is not None


def test_bulk_columns_take_only_records_without_headers_or_times() -> None:
    assert bulk_columns(RecordColumns([b"a", b"b"], [b"k", None])) == ([b"a", b"b"], [b"k", None])
    assert bulk_columns(RecordColumns([b"a"], None, [None])) == ([b"a"], None)
    assert bulk_columns(RecordColumns([b"a"], None, [5])) is None
    assert bulk_columns([Record(b"a"), Record(b"b")]) == ([b"a", b"b"], None)
    assert bulk_columns([Record(b"a", b"k"), Record(b"b")]) == ([b"a", b"b"], [b"k", None])
    assert bulk_columns([Record(b"a", headers=(("h", b"1"),))]) is None
    assert bulk_columns([Record(b"a", timestamp=7)]) is None


def test_only_exact_bytes_are_passed_by_address() -> None:
    class Blob(bytes):
        pass

    bulk = attach(Producer({"bootstrap.servers": "127.0.0.1:1"}))
    assert bulk is not None
    for values, keys in (([b"a", None], None), ([b"a", "text"], None), ([b"a", Blob(b"b")], None), ([b"a"], [None])):
        assert bulk.produce("never-written", 0, values, keys) is None  # nothing queued: the caller falls back
