"""A named producer's restart on Kafka after its stored state was lost, left older than the
data, or garbled (``__idempotent_producer_state``): rebuilt from the partitions' batch heads
within the window, or the restart refused; never silent duplicates."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

import idempotent
from idempotent.adapters.kafka.producer_log import STATE_TOPIC, state_key, state_partition
from idempotent.broker.config import BrokerConfig
from idempotent.compat import confluent_kafka as compat
from idempotent.compat.confluent_kafka import KafkaError, KafkaException
from idempotent.errors import ProducerStateLostError

pytestmark = pytest.mark.kafka


def _topic(kafka_service: Any, partitions: int, policy: str | None = None) -> str:
    name = f"state-{uuid.uuid4().hex[:10]}"
    with idempotent.connect(kafka_service.url) as broker:
        broker.create_topic(name, partitions)
        if policy is not None:
            broker.set_policy(policy, topic=name)
    return name


def _consumer(kafka_service: Any) -> Any:
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "group.id": f"state-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )


def _read(kafka_service: Any, topic: str, partition: int) -> list[Any]:
    """Every committed message of one partition (a plain confluent-kafka consumer)."""
    consumer = _consumer(kafka_service)
    consumer.assign([confluent_kafka.TopicPartition(topic, partition, confluent_kafka.OFFSET_BEGINNING)])
    out: list[Any] = []
    try:
        while True:
            message = consumer.poll(30)
            assert message is not None, f"no end of {topic}[{partition}] within 30 s"
            if message.error() is not None:
                assert message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, message.error()
                return out
            out.append(message)
    finally:
        consumer.close()


def _values(kafka_service: Any, topic: str, partitions: int) -> Counter[bytes]:
    return Counter(m.value() for p in range(partitions) for m in _read(kafka_service, topic, p))


def _state_value(kafka_service: Any, name: str, topic: str, partition: int) -> bytes | None:
    """The newest value of the producer's state key (None: no record, or a tombstone)."""
    key = state_key(name, topic, partition)
    value = None
    for message in _read(kafka_service, STATE_TOPIC, state_partition(name)):
        if message.key() == key:
            value = message.value()
    return value


def _lose_state(kafka_service: Any, name: str) -> None:
    """The state topic's partition holding the producer's keys loses every record, as when its
    only replica was lost and the partition came back empty."""
    partition = state_partition(name)
    consumer = _consumer(kafka_service)
    try:
        _, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(STATE_TOPIC, partition), timeout=30)
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": kafka_service.bootstrap})
    # Kafka deletes records of a compacted topic only while it is also a "delete" topic
    _cleanup_policy(admin, "compact,delete")
    try:
        deadline = time.monotonic() + 60
        while True:  # until the broker applies the policy: POLICY_VIOLATION meanwhile
            try:
                futures = admin.delete_records([confluent_kafka.TopicPartition(STATE_TOPIC, partition, high)])
                for future in futures.values():
                    future.result(30)
                break
            except confluent_kafka.KafkaException as exc:
                if exc.args[0].code() != confluent_kafka.KafkaError.POLICY_VIOLATION or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        _cleanup_policy(admin, "compact")
    assert _state_value(kafka_service, name, "x", 0) is None and not _read(kafka_service, STATE_TOPIC, partition)


def _cleanup_policy(admin: Any, policy: str) -> None:
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        STATE_TOPIC,
        incremental_configs=[ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _put_state(kafka_service: Any, name: str, topic: str, partition: int, value: bytes | None) -> None:
    """Store ``value`` as the newest state record of the producer on ``topic[partition]``."""
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_service.bootstrap})
    producer.produce(STATE_TOPIC, key=state_key(name, topic, partition), value=value, partition=state_partition(name))
    assert producer.flush(30) == 0


def _drop_in_run(kafka_service: Any, name: str, topic: str, lines: range, partitions: int) -> Counter[str]:
    """The docs' restart recipe with the confluent-kafka drop-in: ``last_sequence`` says where
    each partition's stored records end, every line of ``lines`` is sent with its sequence
    (line ``i`` to partition ``i % partitions``); what the delivery reports said."""
    producer = compat.Producer({"bootstrap.servers": kafka_service.bootstrap, "transactional.id": name, "linger.ms": 5})
    counts: Counter[str] = Counter()

    def report(err: Any, msg: Any) -> None:
        counts["failed" if err is not None else "duplicate" if msg.duplicate() else "new"] += 1

    try:
        producer.init_transactions(60)
        counts["last"] = sum(producer.last_sequence(topic, p) + 1 for p in range(partitions))
        for i in lines:
            while True:
                try:
                    producer.produce(topic, b"%d" % i, partition=i % partitions, on_delivery=report, sequence=i)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        assert producer.flush(120) == 0
    finally:
        producer.close()
    return counts


def test_a_drop_in_restarted_after_its_state_partition_was_lost_stores_no_line_twice(kafka_service: Any) -> None:
    topic, name, count = _topic(kafka_service, 2, "monotonic"), f"importer-{uuid.uuid4().hex[:6]}", 3000
    first = _drop_in_run(kafka_service, name, topic, range(count), 2)
    assert (first["new"], first["duplicate"], first["failed"]) == (count, 0, 0)
    assert _state_value(kafka_service, name, topic, 0) is not None

    _lose_state(kafka_service, name)

    again = _drop_in_run(kafka_service, name, topic, range(count), 2)  # resent from its first line
    assert again["last"] > 0  # the rebuilt state says where the stored lines end
    assert (again["new"], again["duplicate"], again["failed"]) == (0, count, 0)
    stored = _values(kafka_service, topic, 2)
    assert len(stored) == count and set(stored.values()) == {1}


def _producer_run(
    kafka_service: Any, name: str, topic: str, lines: range, config: BrokerConfig | None = None
) -> tuple[int, int, int]:
    """``idempotent.Producer`` named ``name`` sends ``lines`` (sequence = line) to partition 0:
    ``(last sequence at start, new, duplicates)``."""
    options: dict[str, Any] = {} if config is None else {"config": config}
    with idempotent.Producer(kafka_service.url, producer_name=name, **options) as producer:
        last = producer.last_sequence(topic, 0)
        futures = [producer.send(topic, b"%d" % i, partition=0, sequence=i) for i in lines]
        producer.flush()
        results = [f.result(60) for f in futures if f is not None]
    duplicates = sum(1 for r in results if r.duplicate)
    return last, len(results) - duplicates, duplicates


def test_a_producer_restarted_after_its_state_was_lost_answers_every_resend_as_a_duplicate(
    kafka_service: Any,
) -> None:
    topic, name, count = _topic(kafka_service, 1), f"lost-{uuid.uuid4().hex[:6]}", 2000
    assert _producer_run(kafka_service, name, topic, range(count)) == (-1, count, 0)
    _lose_state(kafka_service, name)
    assert _producer_run(kafka_service, name, topic, range(count)) == (count - 1, 0, count)
    assert _state_value(kafka_service, name, topic, 0) is not None  # the rebuilt state is stored at once
    assert _producer_run(kafka_service, name, topic, range(count, count + 10)) == (count - 1, 10, 0)
    stored = [m.value() for m in _read(kafka_service, topic, 0)]
    assert stored == [b"%d" % i for i in range(count + 10)]


def test_a_state_older_than_the_data_is_completed_from_the_partition(kafka_service: Any) -> None:
    topic, name = _topic(kafka_service, 1), f"stale-{uuid.uuid4().hex[:6]}"
    assert _producer_run(kafka_service, name, topic, range(500))[1:] == (500, 0)
    older = _state_value(kafka_service, name, topic, 0)
    assert older is not None
    assert _producer_run(kafka_service, name, topic, range(500, 1500)) == (499, 1000, 0)
    _put_state(kafka_service, name, topic, 0, older)  # the state topic went back to the older state

    assert _producer_run(kafka_service, name, topic, range(1500)) == (1499, 0, 1500)
    assert [m.value() for m in _read(kafka_service, topic, 0)] == [b"%d" % i for i in range(1500)]


def test_an_unreadable_state_is_rebuilt_not_taken_as_empty(kafka_service: Any) -> None:
    topic, name = _topic(kafka_service, 1), f"garbled-{uuid.uuid4().hex[:6]}"
    assert _producer_run(kafka_service, name, topic, range(300))[1:] == (300, 0)
    _put_state(kafka_service, name, topic, 0, b"\xc1 not a state")
    assert _producer_run(kafka_service, name, topic, range(300)) == (299, 0, 300)
    assert len(_read(kafka_service, topic, 0)) == 300
    _put_state(kafka_service, name, topic, 0, None)  # a tombstone for its key: missing
    assert _producer_run(kafka_service, name, topic, range(300)) == (299, 0, 300)
    assert len(_read(kafka_service, topic, 0)) == 300


def test_a_lost_state_is_rebuilt_past_another_writers_open_transaction(kafka_service: Any) -> None:
    """A read_committed read of the partition ends where another writer's open transaction
    begins; the producer's own batches committed after that are there all the same. The
    rebuild reads on to the high watermark (waiting for that transaction to end), so none of
    them is taken as new."""
    topic, name = _topic(kafka_service, 1), f"behind-{uuid.uuid4().hex[:6]}"
    assert _producer_run(kafka_service, name, topic, range(100)) == (-1, 100, 0)
    other = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_service.bootstrap, "transactional.id": f"open-{uuid.uuid4().hex[:8]}"}
    )
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(topic, b"open", partition=0)
    assert other.flush(30) == 0
    assert _producer_run(kafka_service, name, topic, range(100, 200)) == (99, 100, 0)
    _put_state(kafka_service, name, topic, 0, None)  # a tombstone for its key: missing
    ended = threading.Timer(3.0, other.abort_transaction, args=(30,))
    ended.start()
    started = time.monotonic()
    try:
        assert _producer_run(kafka_service, name, topic, range(200)) == (199, 0, 200)
    finally:
        ended.join()
    assert time.monotonic() - started >= 2.0, "the restart did not meet the open transaction: the test proves nothing"
    assert [m.value() for m in _read(kafka_service, topic, 0)] == [b"%d" % i for i in range(200)]


def _others_write(kafka_service: Any, topic: str, count: int) -> None:
    with idempotent.Producer(kafka_service.url) as other:  # an anonymous producer
        for i in range(count):
            other.send(topic, b"other-%d" % i, partition=0)
        other.flush()


def test_a_lost_state_the_window_cannot_rebuild_refuses_the_restart(kafka_service: Any) -> None:
    topic, name = _topic(kafka_service, 1), f"refused-{uuid.uuid4().hex[:6]}"
    assert _producer_run(kafka_service, name, topic, range(20))[1:] == (20, 0)
    _others_write(kafka_service, topic, 300)
    _lose_state(kafka_service, name)

    small = BrokerConfig(state_rebuild_records=100)
    started = time.monotonic()
    with pytest.raises(ProducerStateLostError) as refused:
        _producer_run(kafka_service, name, topic, range(20), small)
    assert time.monotonic() - started < 25  # refused at once, not retried until the init timeout
    error = refused.value
    assert (error.producer_name, error.topic, error.partition) == (name, topic, 0)
    assert "state_rebuild_records" in str(error) and "new producer name" in str(error)
    assert len(_read(kafka_service, topic, 0)) == 320  # nothing was written

    # a window that reaches the producer's batches rebuilds it (and stores it)
    assert _producer_run(kafka_service, name, topic, range(20), BrokerConfig(state_rebuild_records=1000)) == (
        19,
        0,
        20,
    )
    assert len(_read(kafka_service, topic, 0)) == 320
    assert _state_value(kafka_service, name, topic, 0) is not None

    # a stored state that the window does not reach cannot be told from a stale one: refused too
    _others_write(kafka_service, topic, 300)
    with pytest.raises(ProducerStateLostError, match="older than the window"):
        _producer_run(kafka_service, name, topic, range(20), small)
    # a restart that reads more than half its window past the stored state stores it again, so
    # the next restart reads only what was written since
    window = BrokerConfig(state_rebuild_records=400)
    assert _producer_run(kafka_service, name, topic, range(20), window) == (19, 0, 20)
    _others_write(kafka_service, topic, 300)
    assert _producer_run(kafka_service, name, topic, range(20), window) == (19, 0, 20)
    assert len(_read(kafka_service, topic, 0)) == 920


def test_a_drop_in_whose_lost_state_the_window_cannot_rebuild_fails_with_a_fatal_error(kafka_service: Any) -> None:
    topic, name = _topic(kafka_service, 1, "monotonic"), f"refused-{uuid.uuid4().hex[:6]}"
    assert _drop_in_run(kafka_service, name, topic, range(20), 1)["new"] == 20
    _others_write(kafka_service, topic, 300)
    _lose_state(kafka_service, name)

    errors: list[Any] = []
    producer = compat.Producer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "transactional.id": name,
            "idempotent.state.rebuild.records": 100,
            "error_cb": errors.append,
        }
    )
    try:
        with pytest.raises(KafkaException) as refused:
            producer.init_transactions(60)
        error = refused.value.args[0]  # librdkafka's _FATAL, naming the fatal error
        assert isinstance(error, KafkaError)
        assert (error.code(), error.fatal(), error.retriable()) == (KafkaError._FATAL, True, False)
        assert error.str().startswith("_STATE: ") and isinstance(error.cause, ProducerStateLostError)
        assert name in error.str() and f"{topic}[0]" in error.str() and "state_rebuild_records" in error.str()
        producer.poll(1)  # error_cb is served by poll, with the fatal error itself
        (reported,) = errors
        assert (reported.code(), reported.fatal(), reported.retriable()) == (KafkaError._STATE, True, False)
        with pytest.raises(KafkaException):  # nothing is sent by a refused producer
            producer.produce(topic, b"x", partition=0, sequence=0)
    finally:
        producer.close()
    assert len(_read(kafka_service, topic, 0)) == 320
