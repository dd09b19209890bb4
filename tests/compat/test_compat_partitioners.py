"""The drop-ins put a keyed record where the native client's partitioner puts it: measured
against the real clients writing into real Kafka and Pulsar topics."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

import idempotent
from idempotent.compat import _partitioners

#: librdkafka's partitioners
PARTITIONERS = ("consistent_random", "consistent", "random", "murmur2", "murmur2_random", "fnv1a", "fnv1a_random")

#: keys of every shape: empty, one byte to long, text, non-ASCII, binary
KAFKA_KEYS: list[bytes | str] = [
    b"",
    b"a",
    b"ab",
    b"abc",
    b"abcd",
    b"abcdefg",
    b"abcdefgh",
    b"\xff\x00\x80binary",
    "ünïcode-key",
    "text-key",
    b"x" * 300,
    *[b"customer-%d" % i for i in range(120)],
]
PULSAR_KEYS = [
    "a",
    "ab",
    "abc",
    "abcd",
    "abcdefg",
    "abcdefgh",
    "ünïcode",
    "k" * 300,
    *[f"order-{i}" for i in range(120)],
]


def _kafka_topic(kafka_service: Any, partitions: int) -> str:
    """A plain Kafka topic of ``partitions`` partitions (recorded by a broker of this project,
    so that the drop-in needs no adoption)."""
    name = f"partitioner-{uuid.uuid4().hex[:10]}"
    broker = idempotent.connect(kafka_service.url)
    try:
        broker.create_topic(name, partitions)
    finally:
        broker.close()
    return name


def _placed(producer: Any, topic: str, keys: list[bytes | str | None], pause: float = 0.0) -> list[int]:
    """The partition each message landed in, from its delivery report."""
    placed: dict[int, int] = {}
    for index, key in enumerate(keys):

        def report(err: Any, msg: Any, index: int = index) -> None:
            assert err is None, err
            placed[index] = msg.partition()

        producer.produce(topic, b"v", key=key, on_delivery=report)
        producer.poll(0)
        if pause:
            time.sleep(pause)
    assert producer.flush(60) == 0
    return [placed[i] for i in range(len(keys))]


def _deterministic(partitioner: str, key: bytes | str | None) -> bool:
    """Whether librdkafka's ``partitioner`` places a message with ``key`` by its key."""
    if partitioner == "random":
        return False
    if partitioner == "consistent_random":
        return bool(key)
    return key is not None or partitioner in ("consistent", "murmur2", "fnv1a")


@pytest.mark.kafka
@pytest.mark.parametrize("partitioner", [p for p in PARTITIONERS if p != "random"])
def test_keyed_records_land_where_librdkafkas_partitioner_puts_them(kafka_service: Any, partitioner: str) -> None:
    """The same keys through librdkafka and through the drop-in, into one plain 7-partition
    topic, land in the same partitions; ``consistent``, ``murmur2`` and ``fnv1a`` put messages
    without a key where an empty key goes, and the drop-in too."""
    import confluent_kafka

    from idempotent.compat import confluent_kafka as drop_in

    topic = _kafka_topic(kafka_service, 7)
    keys = [k for k in [None, *KAFKA_KEYS] if _deterministic(partitioner, k)]
    native = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_service.bootstrap, "partitioner": partitioner, "linger.ms": 0}
    )
    expected = _placed(native, topic, keys)
    ours = drop_in.Producer({"idempotent.broker.url": kafka_service.url, "partitioner": partitioner})
    assert _placed(ours, topic, keys) == expected
    ours.close()
    assert len(set(expected)) == 7


@pytest.mark.kafka
@pytest.mark.parametrize("partitioner", ["consistent_random", "murmur2_random", "fnv1a_random", "random"])
def test_records_librdkafka_places_at_random_are_spread(kafka_service: Any, partitioner: str) -> None:
    """Messages without a key (and with an empty one under ``consistent_random``) go to a
    random partition, kept for ``sticky.partitioning.linger.ms``; the drop-in put an empty key
    of ``consistent_random`` into partition 0."""
    import confluent_kafka

    from idempotent.compat import confluent_kafka as drop_in

    topic = _kafka_topic(kafka_service, 7)
    keys: list[bytes | str | None] = [None, b""] * 30 if partitioner == "consistent_random" else [None] * 60
    conf = {"partitioner": partitioner, "sticky.partitioning.linger.ms": 1}
    native = confluent_kafka.Producer({"bootstrap.servers": kafka_service.bootstrap, "linger.ms": 0, **conf})
    _placed(native, topic, [b"warm-up"])  # before its metadata arrives, librdkafka holds messages back
    assert len(set(_placed(native, topic, keys, pause=0.003))) > 1
    ours = drop_in.Producer({"idempotent.broker.url": kafka_service.url, **conf})
    _placed(ours, topic, [b"warm-up"])  # so does the drop-in until it is connected: then they go in a burst
    assert len(set(_placed(ours, topic, keys, pause=0.003))) > 1
    if partitioner == "consistent_random":
        assert len(set(_placed(ours, topic, [b""] * 40, pause=0.003))) > 1
    ours.close()


def test_sticky_partitioning_keeps_one_partition_for_its_linger() -> None:
    from idempotent.compat import confluent_kafka as drop_in

    producer = drop_in.Producer({"idempotent.broker.url": f"memory://{uuid.uuid4().hex}"})
    try:
        started = time.monotonic()
        chosen = {producer._choose("t", 50, None) for _ in range(200)}
        assert len(chosen) == 1 or time.monotonic() - started > 0.01  # one partition for 10 ms
        assert producer._choose("t", 50, b"k") == _partitioners.consistent(b"k", 50)
    finally:
        producer.close()


# -- Pulsar ----------------------------------------------------------------------------------


def _pulsar_topic(pulsar_service: Any, partitions: int) -> str:
    """A partitioned Pulsar topic of ``partitions`` partitions (recorded by a broker of this
    project, so that the drop-in needs no adoption)."""
    local = f"partitioner-{uuid.uuid4().hex[:10]}"
    broker = idempotent.connect(pulsar_service.connect_url)
    try:
        broker.create_topic(local, partitions)
    finally:
        broker.close()
    return f"persistent://public/default/{local}"


@pytest.mark.pulsar
def test_keyed_messages_land_where_pulsar_clients_default_routing_puts_them(pulsar_service: Any) -> None:
    """pulsar-client routes a keyed message by the C++ library's BoostHash of the key; the
    drop-in hashed with CRC32 and so put most keys elsewhere."""
    import pulsar

    from idempotent.compat import pulsar as drop_in

    topic = _pulsar_topic(pulsar_service, 5)
    client = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        native = client.create_producer(topic)
        expected = [native.send(b"n", partition_key=key).partition() for key in PULSAR_KEYS]
    finally:
        client.close()
    ours = drop_in.Client(pulsar_service.connect_url)
    try:
        producer = ours.create_producer(topic)
        assert [producer.send(b"d", partition_key=key).partition() for key in PULSAR_KEYS] == expected
        # an empty key is no key (pulsar-client sets none): spread round robin, stored without one
        spread = {producer.send(b"e", partition_key="").partition() for _ in range(10)}
        assert len(spread) == 5
    finally:
        ours.close()
    assert len(set(expected)) == 5


def test_pulsar_partition_follows_the_boost_hash() -> None:
    assert _partitioners.pulsar_partition("key", 1) == 0
    assert _partitioners.pulsar_partition(None, 4) is None and _partitioners.pulsar_partition("", 4) is None
    # values of boost::hash<std::string> (Boost 1.81 and later, 64-bit) masked as BoostHash does
    assert [_partitioners.pulsar_partition(k, 7) for k in ("key1", "key2", "k1", "abcdefgh")] == [1, 6, 6, 5]
    with pytest.raises(ValueError, match="partition_count"):
        _partitioners.pulsar_partition("k", 0)
