"""The Reader on every backend (memory, sqlite, and real Kafka and Pulsar), plus MessageId."""

from __future__ import annotations

import pickle
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from idempotent import Broker, MessageId, Producer, Reader
from idempotent.consumer.reader import MESSAGE_ID_VERSION, _PollState
from idempotent.errors import ConfigError, InvalidTopicError, ProducerClosedError, ReadTimeoutError
from idempotent.testing.conformance import topic_name

from ..conftest import LocalHarness, ServiceHarness, memory_harness, sqlite_harness


def fill(
    broker: Broker, topic: str, partitions: int, sends: Sequence[int], *, batched: bool = False
) -> list[tuple[int, bytes]]:
    """Create ``topic`` and store one record per entry of ``sends`` (its partition), and
    wait until they are visible; returns ``(partition, value)`` in send order."""
    broker.create_topic(topic, partitions)
    out = send(broker, topic, sends, start=0, batched=batched)
    for p in range(partitions):
        wait_visible(broker, topic, p, list(sends).count(p))
    return out


def send(
    broker: Broker, topic: str, sends: Sequence[int], start: int, *, batched: bool = False
) -> list[tuple[int, bytes]]:
    """One batch per record, or (``batched``) as few batches as the producer makes."""
    out = [(p, f"v{start + i}".encode()) for i, p in enumerate(sends)]
    with Producer(broker, producer_name=f"writer-{topic}", linger_ms=50 if batched else 0) as producer:
        futures = []
        for p, value in out:
            futures.append(producer.send(topic, value, key=b"k", partition=p, headers={"h": value}))
            if not batched:
                futures[-1].result(timeout=60)
        for future in futures:
            future.result(timeout=60)
    return out


def wait_visible(broker: Broker, topic: str, partition: int, count: int) -> None:
    """Wait until ``count`` records are readable: on Kafka an acknowledged record becomes
    visible to committed reads only once its transaction marker is written, just after."""
    deadline = time.monotonic() + 30
    while count and len(broker.read(topic, partition, 0, count)) < count:
        assert time.monotonic() < deadline, "records never became visible"
        time.sleep(0.01)


def values(messages: Sequence[Any]) -> list[bytes | None]:
    return [m.value for m in messages]


class ReaderSuite:
    """Reader behaviour every backend must show. Subclasses provide a ``harness`` fixture."""

    def test_reads_everything_in_order_with_identity(self, harness: Any) -> None:
        with harness.open() as broker:
            topic = topic_name()
            sent = fill(broker, topic, 1, [0] * 5)
            with Reader(broker, topic) as reader:
                messages = list(reader)
                assert not reader.has_message_available()
            assert values(messages) == [v for _, v in sent]
            offsets = [m.offset for m in messages]
            assert offsets == sorted(set(offsets))
            first = messages[0]
            assert (first.topic, first.partition, first.key, first.properties) == (topic, 0, b"k", {"h": b"v0"})
            assert [m.sequence for m in messages] == [0, 1, 2, 3, 4]
            assert len({m.producer_id for m in messages}) == 1 and first.producer_id >= 0
            assert first.timestamp > 0
            ids = [m.message_id for m in messages]
            assert ids == sorted(ids) and len(set(ids)) == 5
            assert [MessageId.deserialize(i.serialize()) for i in ids] == ids

    def test_resume_after_a_message_id(self, harness: Any) -> None:
        with harness.open() as broker:
            topic = topic_name()
            sent = fill(broker, topic, 1, [0] * 6, batched=True)  # resume inside a batch (a Pulsar entry)
            with Reader(broker, topic) as reader:
                head = [reader.read_next(30) for _ in range(3)]
            stored = head[-1].message_id.serialize()  # what an application would keep
            with Reader(broker, topic, MessageId.deserialize(stored)) as reader:
                assert values(list(reader)) == [v for _, v in sent[3:]]
            with Reader(broker, topic, head[-1].message_id, inclusive=True) as reader:
                assert values(list(reader)) == [v for _, v in sent[2:]]

    def test_latest_sees_only_later_messages_and_timeout_leaves_position(self, harness: Any) -> None:
        with harness.open() as broker:
            topic = topic_name()
            fill(broker, topic, 1, [0] * 2)
            with Reader(broker, topic, "latest") as reader:
                assert not reader.has_message_available()
                with pytest.raises(ReadTimeoutError) as caught:
                    reader.read_next(0.2)
                assert caught.value.retriable
                timer = threading.Timer(0.3, lambda: send(broker, topic, [0], start=2))
                timer.start()
                try:
                    message = reader.read_next(60)
                finally:
                    timer.join()
                assert message.value == b"v2"
                with pytest.raises(ReadTimeoutError):
                    reader.read_next(0)

    def test_seek(self, harness: Any) -> None:
        with harness.open() as broker:
            topic = topic_name()
            sent = fill(broker, topic, 1, [0] * 4)
            with Reader(broker, topic) as reader:
                messages = list(reader)
                reader.seek(messages[1].message_id)
                assert values(list(reader)) == [v for _, v in sent[2:]]
                reader.seek(messages[1].message_id, inclusive=True)
                assert reader.read_next(30).value == b"v1"
                reader.seek("earliest")
                assert reader.read_next(30).value == b"v0"
                reader.seek("latest")
                assert not reader.has_message_available()

    def test_partitions_in_turn_and_resume_per_partition(self, harness: Any) -> None:
        with harness.open() as broker:
            topic = topic_name()
            sent = fill(broker, topic, 3, [0, 0, 0, 1, 2, 2])
            with Reader(broker, topic) as reader:
                assert reader.partitions == [0, 1, 2]
                head = [reader.read_next(30) for _ in range(4)]
                # one message per partition in turn, skipping partitions with nothing left
                assert [(m.partition, m.value) for m in head] == [(0, b"v0"), (1, b"v3"), (2, b"v4"), (0, b"v1")]
                rest = list(reader)
            assert [(m.partition, m.value) for m in rest] == [(2, b"v5"), (0, b"v2")]
            last = {m.partition: m.message_id for m in head}
            with Reader(broker, topic, list(last.values())) as again:
                assert sorted(values(list(again))) == sorted([b"v5", b"v2"])
            with Reader(broker, topic, partition=2) as one:
                assert values(list(one)) == [v for p, v in sent if p == 2]


# -- backends ------------------------------------------------------------------------------


class TestReaderMemory(ReaderSuite):
    @pytest.fixture
    def harness(self) -> LocalHarness:
        return memory_harness()


class TestReaderSqlite(ReaderSuite):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> LocalHarness:
        return sqlite_harness(tmp_path)


@pytest.mark.kafka
class TestReaderKafka(ReaderSuite):
    @pytest.fixture
    def harness(self, kafka_service: Any) -> ServiceHarness:
        return ServiceHarness(kafka_service.url, "kafka")


@pytest.mark.pulsar
class TestReaderPulsar(ReaderSuite):
    @pytest.fixture
    def harness(self, pulsar_service: Any) -> ServiceHarness:
        url = f"{pulsar_service.url}?{urllib.parse.urlencode({'admin_url': pulsar_service.admin_url})}"
        return ServiceHarness(url, "pulsar", options={"admin_url": pulsar_service.admin_url})


# -- sparse offsets and lifecycle (embedded) -------------------------------------------------


class SparseBroker:
    """A broker whose offsets are ten apart (as Pulsar's and Kafka's may be): the Reader must
    never assume that ``offset + 1`` is a message."""

    def __init__(self, broker: Broker) -> None:
        self.inner = broker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def url(self) -> str:
        return self.inner.url

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[Any]:
        import attrs

        records = self.inner.read(topic, partition, -(-offset // 10), max_records)
        return [attrs.evolve(r, offset=r.offset * 10) for r in records]

    def end_offset(self, topic: str, partition: int) -> int:
        end = self.inner.end_offset(topic, partition)
        return 0 if end == 0 else (end - 1) * 10 + 1


def test_sparse_offsets() -> None:
    with memory_harness().open() as inner:
        topic = topic_name()
        sent = fill(inner, topic, 1, [0] * 4)
        broker: Any = SparseBroker(inner)
        with Reader(broker, topic, max_records=1) as reader:
            messages = list(reader)
            assert [m.offset for m in messages] == [0, 10, 20, 30]
            reader.seek(messages[1].message_id)
            assert values(list(reader)) == [v for _, v in sent[2:]]
        with Reader(broker, topic, "latest") as reader:
            assert not reader.has_message_available()
            send(inner, topic, [0], start=4)
            assert reader.read_next(10).value == b"v4"


def test_url_lifecycle_and_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with pytest.raises(InvalidTopicError):
        Reader(url, "missing")
    reader = Reader(url, "made", create=True)
    assert reader.topic == "made" and reader.positions() == {0: 0}
    with pytest.raises(ConfigError):
        reader.seek(MessageId("other", 0, 1))
    with pytest.raises(ConfigError):
        reader.seek(MessageId("made", 5, 1))
    with pytest.raises(ConfigError):
        Reader(reader.broker, "made", "newest")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Reader(reader.broker, "made", partition=1)
    reader.close()
    reader.close()
    with pytest.raises(ProducerClosedError):
        reader.read_next(0)
    with pytest.raises(ProducerClosedError):
        reader.has_message_available()
    with Reader(url, "made") as again:  # the first reader closed the broker it opened; data stays
        assert not again.has_message_available()


# -- MessageId -----------------------------------------------------------------------------


def test_message_id_encoding_is_stable() -> None:
    mid = MessageId("orders", 3, 300)
    # version 1 | partition 3 | offset 300 as LEB128 (0xAC 0x02) | topic
    assert mid.serialize() == bytes([MESSAGE_ID_VERSION, 3, 0xAC, 0x02]) + b"orders"
    big = MessageId("t/ü", 70_000, (2**40 - 1) << 40 | 5 << 20 | 7)  # a Pulsar-style offset
    assert MessageId.deserialize(big.serialize()) == big
    assert MessageId.deserialize(bytearray(mid.serialize())) == mid
    assert pickle.loads(pickle.dumps(mid)) == mid and str(mid) == "orders[3]@300"


def test_message_id_order_and_hash() -> None:
    ids = [MessageId("a", 1, 0), MessageId("a", 0, 5), MessageId("b", 0, 0), MessageId("a", 0, 1 << 41)]
    assert sorted(ids) == [MessageId("a", 0, 5), MessageId("a", 0, 1 << 41), MessageId("a", 1, 0), MessageId("b", 0, 0)]
    assert MessageId("a", 0, 5) < MessageId("a", 0, 6) and MessageId("a", 0, 6) > MessageId("a", 0, 5)
    assert len({MessageId("a", 0, 5), MessageId("a", 0, 5), MessageId("a", 0, 6)}) == 2


@pytest.mark.parametrize(
    "data",
    [b"", b"\x02\x00\x00t", b"\x01", b"\x01\x80", b"\x01\x00\x00\xff", b"\x01\x00\x00", "text"],
    ids=["empty", "version", "no-partition", "truncated", "bad-utf8", "no-topic", "str"],
)
def test_message_id_rejects_garbage(data: Any) -> None:
    with pytest.raises(ConfigError):
        MessageId.deserialize(data)


@pytest.mark.parametrize("args", [("", 0, 0), ("t", -1, 0), ("t", 0, -1), ("t", True, 0), ("t", 0, 1.5)])
def test_message_id_validates(args: tuple[Any, Any, Any]) -> None:
    with pytest.raises(ConfigError):
        MessageId(*args)


# -- polling -------------------------------------------------------------------------------


def test_poll_backoff_is_pure_and_bounded() -> None:
    poll = _PollState(0.005, 0.04)
    assert poll.due(0.0)
    waits = []
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):
        poll.empty(now)
        waits.append(round(poll.next_poll - now, 6))
        assert not poll.due(now) and poll.due(poll.next_poll)
    assert waits == [0.005, 0.01, 0.02, 0.04, 0.04]
    poll.found()
    assert poll.due(0.0)
    poll.empty(10.0)
    assert poll.next_poll == pytest.approx(10.005)


class CountingBroker:
    """Counts end_offset and read calls per partition."""

    def __init__(self, broker: Broker) -> None:
        self.inner = broker
        self.calls: Counter[int] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def url(self) -> str:
        return self.inner.url

    def end_offset(self, topic: str, partition: int) -> int:
        self.calls[partition] += 1
        return self.inner.end_offset(topic, partition)

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[Any]:
        self.calls[partition] += 1
        return self.inner.read(topic, partition, offset, max_records)


def test_idle_partitions_are_not_polled_per_message() -> None:
    with memory_harness().open() as inner:
        topic = topic_name()
        fill(inner, topic, 3, [0] * 200)
        broker: Any = CountingBroker(inner)
        with Reader(broker, topic, max_records=10) as reader:
            assert values([reader.read_next(10) for _ in range(200)]) == [f"v{i}".encode() for i in range(200)]
        # partition 0 needs 20 reads (plus a few end_offset checks); the empty partitions are
        # asked on a backoff, not once per message
        assert broker.calls[0] <= 30
        assert broker.calls[1] <= 20 and broker.calls[2] <= 20


def test_an_idle_reader_sleeps() -> None:
    with memory_harness().open() as inner:
        topic = topic_name()
        inner.create_topic(topic, 2)
        broker: Any = CountingBroker(inner)
        with (
            Reader(broker, topic, min_poll_interval=0.01, max_poll_interval=0.1) as reader,
            pytest.raises(ReadTimeoutError),
        ):
            reader.read_next(0.5)
        # at most: a first poll, then waits of 10, 20, 40, 80 and 100 ms (no busy loop)
        assert 1 <= broker.calls[0] <= 9 and 1 <= broker.calls[1] <= 9
