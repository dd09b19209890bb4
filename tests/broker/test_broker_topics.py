"""The broker's topic lookup: topics created elsewhere after it opened, and partitions added."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import idempotent
from idempotent import Outcome, Producer
from idempotent.adapters.memory import MemoryBackend
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.errors import ConfigError, InvalidTopicError

from ..conftest import memory_harness, sqlite_harness


def _eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _grow(broker: Broker, topic: str, partitions: int) -> None:
    """Add partitions to a memory topic behind the brokers' backs, as Kafka's tools would."""
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    with backend._store.lock:
        backend._store.topics[topic] = partitions


def test_a_topic_another_broker_created_after_this_one_opened_keeps_its_partition_count() -> None:
    """Issue 21 item 5: a broker that meets a topic it does not know reads the topic records
    again before creating anything, and uses the count the topic has."""
    harness = memory_harness()
    first = harness.open()  # opened before the topic exists
    other = harness.open()
    try:
        other.create_topic("orders", 4)
        assert first.partitions_for("orders") == 4
        assert first.topics()["orders"] == 4
        s = first.init_producer()
        assert first.produce("orders", 3, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
        first.create_topic("orders", 4)  # the same count: nothing to do
        with pytest.raises(InvalidTopicError, match="exists with 4 partitions, not 1"):
            first.create_topic("orders", 1)
    finally:
        first.close()
        other.close()


def test_a_producer_opened_before_the_topic_was_created_elsewhere_uses_its_partitions() -> None:
    harness = memory_harness()
    broker = harness.open()
    with Producer(broker) as producer:
        creator = harness.open()
        creator.create_topic("keyed", 4)
        creator.close()
        assert producer.partitions_for("keyed") == 4
        assert producer.send("keyed", b"v", partition=3).result(10).partition == 3
    broker.close()


def test_explicit_create_of_a_topic_another_process_created_with_another_count_is_refused(tmp_path: object) -> None:
    harness = sqlite_harness(tmp_path)  # type: ignore[arg-type]
    first = harness.open()
    first.close()
    late = harness.open()  # knows no topics
    early = idempotent.connect(harness.url)
    early.create_topic("t", 3)
    early.close()
    try:
        with pytest.raises(InvalidTopicError, match="exists with 3 partitions, not 2"):
            late.create_topic("t", 2)
        assert late.partitions_for("t") == 3
    finally:
        late.close()


def test_partitions_added_later_are_learnt_after_the_refresh_interval() -> None:
    harness = memory_harness()
    broker = harness.open(BrokerConfig(topic_refresh_interval=0.2))
    try:
        broker.create_topic("grows", 2)
        _grow(broker, "grows", 5)
        assert broker.partitions_for("grows") == 2  # trusted for topic_refresh_interval
        time.sleep(0.25)
        assert broker.partitions_for("grows") == 2  # read again in the background meanwhile
        assert _eventually(lambda: broker.partitions_for("grows") == 5)
        assert broker.topics()["grows"] == 5
    finally:
        broker.close()


def test_a_request_for_a_partition_added_later_reads_the_count_again() -> None:
    harness = memory_harness()
    broker = harness.open(BrokerConfig(topic_refresh_interval=3600))
    try:
        broker.create_topic("grows", 2)
        s = broker.init_producer()
        _grow(broker, "grows", 3)
        time.sleep(1.05)  # a miss reads the count again at most once a second per topic
        assert broker.produce("grows", 2, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
        with pytest.raises(InvalidTopicError, match=r"partitions 0\.\.2, not 3"):
            broker.produce("grows", 3, s.producer_id, s.producer_epoch, 0, [b"a"])
    finally:
        broker.close()


def test_without_create_only_recorded_topics_are_known() -> None:
    harness = memory_harness()
    broker = harness.open()
    other = harness.open()
    try:
        with pytest.raises(InvalidTopicError, match="unknown topic"):
            broker.partitions_for("later", create=False)
        other.create_topic("later", 2)
        assert broker.partitions_for("later", create=False) == 2
    finally:
        broker.close()
        other.close()


def test_with_auto_creation_off_an_existing_topic_is_used_and_a_missing_one_refused() -> None:
    harness = memory_harness()
    broker = harness.open(BrokerConfig(auto_create_topics=False))
    other = harness.open()
    try:
        with pytest.raises(InvalidTopicError, match="auto_create_topics is off"):
            broker.partitions_for("absent")
        assert "absent" not in other.topics() and other.backend.describe_topic("absent") is None
        other.create_topic("present", 3)
        assert broker.partitions_for("present") == 3
    finally:
        broker.close()
        other.close()


def test_topic_refresh_interval_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="topic_refresh_interval"):
        BrokerConfig(topic_refresh_interval=-1)


def test_a_slow_backend_never_holds_up_a_lookup_of_a_known_topic() -> None:
    """The count of a known topic is read again in the background: a producer's periodic
    lookup gets the count known at once even while the backend does not answer."""
    harness = memory_harness()
    broker = harness.open(BrokerConfig(topic_refresh_interval=0))
    try:
        broker.create_topic("t", 2)
        backend = broker.backend
        release = threading.Event()
        described = threading.Event()
        plain = backend.describe_topic

        def stuck(topic: str) -> int | None:
            described.set()
            release.wait(10)
            return plain(topic)

        backend.describe_topic = stuck  # type: ignore[method-assign]
        started = time.monotonic()
        assert [broker.partitions_for("t") for _ in range(50)] == [2] * 50
        assert time.monotonic() - started < 1.0
        assert described.wait(5)
        _grow(broker, "t", 3)
        release.set()
        assert _eventually(lambda: broker.partitions_for("t") == 3)
    finally:
        release.set()
        broker.close()
