"""The broker's observer hook: which events are reported, with what, and that observers cannot
change what the broker does."""

from __future__ import annotations

import pytest

from idempotent import Outcome, ProduceResult
from idempotent.adapters.memory import MemoryBackend
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.broker.observer import BrokerObserver
from idempotent.core.checker import CheckerConfig
from idempotent.errors import BackendUnavailableError, ConfigError, InvalidBatchError

from ..conftest import memory_harness


class Recorder(BrokerObserver):
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def produce_completed(
        self, topic: str, partition: int, result: ProduceResult, record_count: int, byte_count: int, seconds: float
    ) -> None:
        assert seconds >= 0
        self.events.append(("produce", topic, partition, result.outcome, record_count, byte_count))

    def produce_failed(self, topic: str, partition: int, error: BaseException, seconds: float) -> None:
        self.events.append(("failed", topic, partition, type(error).__name__))

    def append_completed(self, topic: str, partition: int, seconds: float, ok: bool) -> None:
        self.events.append(("append", topic, partition, ok))

    def partition_recovered(self, topic: str, partition: int, seconds: float, replayed_batches: int) -> None:
        self.events.append(("recovered", topic, partition, replayed_batches))

    def snapshot_written(self, topic: str, partition: int, ok: bool) -> None:
        self.events.append(("snapshot", topic, partition, ok))

    def producers_evicted(self, topic: str, partition: int, count: int) -> None:
        self.events.append(("evicted", topic, partition, count))

    def producer_initialised(self, named: bool, ok: bool) -> None:
        self.events.append(("init", named, ok))


def open_broker(**checker: float) -> tuple[Broker, MemoryBackend, Recorder]:
    config = BrokerConfig(checker=CheckerConfig(**checker), maintenance_interval=0)  # type: ignore[arg-type]
    backend = MemoryBackend(memory_harness().url)
    broker = Broker(backend, config)
    recorder = Recorder()
    broker.add_observer(recorder)
    return broker, backend, recorder


def test_events_of_a_produce_session() -> None:
    broker, backend, rec = open_broker(snapshot_entries=2)
    s = broker.init_producer("app")
    with pytest.raises(ConfigError):
        broker.init_producer("")
    pid, epoch = s.producer_id, s.producer_epoch
    broker.produce("t", 0, pid, epoch, 0, [b"ab", b"c"])
    broker.produce("t", 0, pid, epoch, 0, [b"ab", b"c"])
    broker.produce("t", 0, pid, epoch, 2, [b"d"])  # the second batch: a snapshot is due with the third
    broker.produce("t", 0, pid, epoch, 3, [b"e"])
    with pytest.raises(InvalidBatchError):
        broker.produce("t", 0, pid, epoch, 4, [])
    backend.faults.lose_ack = 1
    with pytest.raises(BackendUnavailableError):
        broker.produce("t", 0, pid, epoch, 4, [b"f"])
    assert broker.produce("t", 0, pid, epoch, 4, [b"f"]).outcome is Outcome.DUPLICATE
    broker.close()
    assert rec.events == [
        ("init", True, True),
        ("init", True, False),
        ("recovered", "t", 0, 0),
        ("append", "t", 0, True),
        ("produce", "t", 0, Outcome.ACCEPTED, 2, 16 + 2 + 16 + 1),
        ("produce", "t", 0, Outcome.DUPLICATE, 2, 16 + 2 + 16 + 1),
        ("append", "t", 0, True),
        ("produce", "t", 0, Outcome.ACCEPTED, 1, 17),
        ("append", "t", 0, True),
        ("snapshot", "t", 0, True),  # stored with this append, taken before it
        ("produce", "t", 0, Outcome.ACCEPTED, 1, 17),
        ("failed", "t", 0, "InvalidBatchError"),
        ("append", "t", 0, False),
        ("failed", "t", 0, "BackendUnavailableError"),
        ("recovered", "t", 0, 2),  # the batches after the snapshot, the one whose ack was lost included
        ("produce", "t", 0, Outcome.DUPLICATE, 1, 17),
        ("snapshot", "t", 0, True),  # at close
    ]


def test_eviction_events_and_removal() -> None:
    broker, _, rec = open_broker(producer_expiry=60.0)
    s = broker.init_producer()
    broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"])
    rec.events.clear()
    broker.maintain(now=broker.stats("t")[0].producers[0].last_timestamp + 61)
    assert rec.events == [("snapshot", "t", 0, True), ("evicted", "t", 0, 1)]
    broker.remove_observer(rec)
    broker.remove_observer(rec)  # no error
    broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
    assert rec.events == [("snapshot", "t", 0, True), ("evicted", "t", 0, 1)]
    broker.close()


def test_the_base_class_ignores_everything() -> None:
    broker = Broker(MemoryBackend(memory_harness().url), BrokerConfig(maintenance_interval=0))
    broker.add_observer(BrokerObserver())
    s = broker.init_producer()
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    broker.close()
