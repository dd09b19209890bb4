"""The confluent-kafka drop-in's passed-through consumers: ``consume()`` wakes for signals."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest

from idempotent.compat import confluent_kafka as compat
from idempotent.compat._kafka_consumer import CONSUME_SLICE


class _Woken(Exception):
    pass


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def unreachable() -> Iterator[Any]:
    """A drop-in consumer subscribed to a topic on a port nothing listens on."""
    consumer = compat.Consumer(
        {"bootstrap.servers": f"127.0.0.1:{_closed_port()}", "group.id": "g", "session.timeout.ms": 1000}
    )
    consumer.subscribe(["t"])
    yield consumer
    consumer.close()


@pytest.fixture
def woken_by_sigusr1() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise _Woken

    previous = signal.signal(signal.SIGUSR1, handler)
    yield
    signal.signal(signal.SIGUSR1, previous)


def _signal_after(delay: float) -> None:
    def later() -> None:
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=later, daemon=True).start()


def test_consumer_classes_stay_confluent_kafkas() -> None:
    assert issubclass(compat.Consumer, confluent_kafka.Consumer)
    assert compat.Consumer.__name__ == "Consumer" and compat.Consumer is compat.Consumer
    assert issubclass(compat.DeserializingConsumer, confluent_kafka.DeserializingConsumer)


@pytest.mark.usefixtures("woken_by_sigusr1")
@pytest.mark.parametrize("timeout", [-1, None, 5.0])
def test_a_signal_interrupts_consume_without_waiting_for_its_timeout(unreachable: Any, timeout: float | None) -> None:
    # confluent-kafka's own consume() runs the handler only after its whole timeout (for ever
    # with -1), so this waits at most 5 s with the native class, and the check below fails
    _signal_after(0.3)
    started = time.monotonic()
    with pytest.raises(_Woken):
        if timeout == 5.0:
            unreachable.consume(num_messages=10, timeout=timeout)
        else:
            unreachable.consume(timeout=timeout)
    assert time.monotonic() - started < 0.3 + 4 * CONSUME_SLICE


def test_consume_still_waits_for_its_whole_timeout(unreachable: Any) -> None:
    started = time.monotonic()
    assert unreachable.consume(num_messages=10, timeout=0.7) == []
    assert 0.7 <= time.monotonic() - started < 2.0
    assert unreachable.consume(num_messages=0, timeout=5.0) == []  # at once, as confluent-kafka does
    with pytest.raises(ValueError):
        unreachable.consume(num_messages=2_000_000, timeout=1.0)


@pytest.mark.kafka
def test_consume_returns_up_to_num_messages_from_a_real_kafka(kafka_service: Any) -> None:
    """Messages that arrive over several waits are returned together, in order, and no more
    than ``num_messages`` of them."""
    bootstrap = kafka_service.bootstrap
    topic = f"wakeable-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        producer.produce(topic, f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = compat.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}"})
    consumer.assign([compat.TopicPartition(topic, 0, compat.OFFSET_BEGINNING)])
    try:
        first = consumer.consume(num_messages=20, timeout=30)
        rest = consumer.consume(num_messages=20, timeout=30 * CONSUME_SLICE)
    finally:
        consumer.close()
    assert [m.value() for m in first] == [f"v{i}".encode() for i in range(20)]
    assert [m.value() for m in rest] == [f"v{i}".encode() for i in range(20, 30)]


def test_the_identity_headers_taken_off_are_the_backends() -> None:
    """The drop-in's consumer takes off exactly the headers the Kafka backend adds."""
    from idempotent.adapters.kafka.heads import IDENTITY_HEADERS
    from idempotent.compat._kafka_consumer import IDENTITY_HEADERS as taken_off

    assert taken_off == IDENTITY_HEADERS


def test_without_identity_keeps_the_applications_headers_in_order() -> None:
    from idempotent.compat._kafka_consumer import without_identity

    mixed = confluent_kafka.Message(
        topic="t",
        value=b"v",
        headers=[("b", b"2"), ("a", b"1"), ("idem.src.topic", b"s"), ("idem.pid", b"7"), ("idem.count", b"1")],
    )
    assert without_identity(mixed).headers() == [("b", b"2"), ("a", b"1"), ("idem.src.topic", b"s")]
    only_identity = confluent_kafka.Message(topic="t", value=b"v", headers=[("idem.count", b"3")])
    assert without_identity(only_identity).headers() is None
    plain = confluent_kafka.Message(topic="t", value=b"v")
    assert without_identity(plain).headers() is None
    assert without_identity(None) is None


@pytest.mark.kafka
def test_drop_in_consumers_read_the_headers_the_application_wrote(kafka_service: Any) -> None:
    """Records produced one batch each through the named drop-in (each is its batch's head, so
    each carries the identity headers in the topic) read back through the drop-in's ``poll``,
    ``consume`` and ``DeserializingConsumer`` with exactly the headers the application set;
    confluent-kafka's own consumer still sees the identity (what docs/migration.md says)."""
    bootstrap = kafka_service.bootstrap
    topic = f"plain-headers-{uuid.uuid4().hex[:8]}"
    producer = compat.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"ph-{uuid.uuid4().hex[:8]}"})
    written: list[list[tuple[str, bytes]] | None] = []
    for i in range(6):
        headers = None if i % 2 == 0 else [("app", b"%d" % i), ("idem.src.offset", b"%d" % i)]
        written.append(headers)
        producer.produce(topic, f"v{i}".encode(), partition=0, headers=headers)
        assert producer.flush(30) == 0  # one batch per record: every record is a head
    config = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}

    def read(consumer: Any, use_consume: bool) -> list[Any]:
        consumer.assign([compat.TopicPartition(topic, 0, compat.OFFSET_BEGINNING)])
        messages: list[Any] = []
        deadline = time.monotonic() + 30
        try:
            while len(messages) < 6 and time.monotonic() < deadline:
                got = consumer.consume(6 - len(messages), 1.0) if use_consume else [consumer.poll(1.0)]
                messages += [m for m in got if m is not None and m.error() is None]
        finally:
            consumer.close()
        return messages

    native = read(confluent_kafka.Consumer({**config, "group.id": f"n-{uuid.uuid4().hex}"}), True)
    assert all(any(name == "idem.pid" for name, _ in m.headers() or ()) for m in native)
    for consumer, use_consume in (
        (compat.Consumer({**config, "group.id": f"p-{uuid.uuid4().hex}"}), False),
        (compat.Consumer({**config, "group.id": f"c-{uuid.uuid4().hex}"}), True),
        (compat.DeserializingConsumer({**config, "group.id": f"d-{uuid.uuid4().hex}"}), False),
    ):
        messages = read(consumer, use_consume)
        assert [m.value() for m in messages] == [f"v{i}".encode() for i in range(6)]
        assert [m.headers() for m in messages] == written
