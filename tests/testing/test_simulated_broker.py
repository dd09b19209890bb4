"""SimulatedBroker: the real core over lists, driven by hand (no link, no channel faults).

Each test plays the link: it hands requests to :meth:`SimulatedBroker.receive`, completes the
appends with :meth:`SimulatedBroker.complete_writes` at chosen times, and crashes and restarts
the broker over its :class:`SimulatedStorage`.
"""

from __future__ import annotations

import random

import pytest

from idempotent.core.checker import CheckerConfig
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.records import BatchHeader, Snapshot
from idempotent.core.registry import ProducerRecord
from idempotent.core.types import Epoch, Sequence, TopicPartition
from idempotent.errors import BackendUnavailableError, ConfigError, PartitionRecoveringError, ProducerError
from idempotent.testing.simulated_broker import SimulatedBroker, SimulatedStorage, StorageFaults

TP = TopicPartition("t", 0)


def header(record: ProducerRecord, base_sequence: int, count: int = 1, epoch: int | None = None) -> BatchHeader:
    producer_epoch = record.producer_epoch if epoch is None else Epoch(epoch)
    return BatchHeader(record.producer_id, producer_epoch, Sequence(base_sequence), count)


def values(prefix: str, count: int) -> list[bytes | None]:
    return [f"{prefix}{i}".encode() for i in range(count)]


def produce(
    broker: SimulatedBroker[str], token: str, h: BatchHeader, now: float
) -> ProduceResult | ProducerError | None:
    """Receive a batch and complete every append due at ``now``; the batch's answer."""
    answer = broker.receive(token, TP, h, values(token, h.record_count), now, now)
    for done, result in broker.complete_writes(now):
        if done == token:
            return result
    return answer


def test_storage_keeps_the_last_snapshot_written_at_the_highest_position() -> None:
    storage = SimulatedStorage()
    assert storage.latest_snapshot(TP) is None
    first, same, older = Snapshot(5, 1, 1.0, b"a"), Snapshot(5, 1, 2.0, b"b"), Snapshot(3, 1, 3.0, b"c")
    for snapshot in (first, same, older):
        storage.write_snapshot(TP, snapshot)
    assert storage.latest_snapshot(TP) is same


def test_the_broker_admits_fences_and_forgets_through_the_registry() -> None:
    broker: SimulatedBroker[str] = SimulatedBroker()
    record, last = broker.init_producer("a", 0.0)
    assert (record.producer_id, record.producer_epoch, last) == (1000, 0, {})
    assert produce(broker, "a0", header(record, 0), 0.0) == ProduceResult(Outcome.ACCEPTED, base_offset=0)
    newer, last = broker.init_producer("a", 1.0)
    assert newer.producer_epoch == 1 and last == {TP: 0}  # read through the partition's core
    assert produce(broker, "old", header(record, 1), 1.0) == ProduceResult(Outcome.FENCED, producer_epoch=1)
    broker.forget(newer.producer_id)
    assert produce(broker, "gone", header(newer, 1), 2.0) == ProduceResult(Outcome.UNKNOWN_PRODUCER)
    assert newer.producer_id not in broker.storage.producers


def test_a_crash_lands_a_prefix_of_the_appends_under_way() -> None:
    """Of the appends under way at a crash a prefix is in the log, unanswered; the restarted
    broker recovers the partition from the log: the landed batches are duplicates with their
    offsets, the lost ones are stored again."""
    storage = SimulatedStorage()
    broker: SimulatedBroker[str] = SimulatedBroker(storage, rng=random.Random(3))
    record, _ = broker.init_producer("a", 0.0)
    for i in range(6):
        assert broker.receive(f"b{i}", TP, header(record, i), [f"v{i}".encode()], 0.0, 1.0) is None
    broker.crash()
    landed = len(storage.log(TP))
    assert broker.stats.landed == landed and broker.stats.lost == 6 - landed and 0 < landed < 6
    restarted: SimulatedBroker[str] = SimulatedBroker(storage, stats=broker.stats)
    for i in range(6):
        answer = produce(restarted, f"again{i}", header(record, i), 2.0)
        expected = Outcome.DUPLICATE if i < landed else Outcome.ACCEPTED
        assert answer == ProduceResult(expected, base_offset=i), i
    assert [e.sequence for e in storage.log(TP)] == list(range(6))
    assert broker.stats.recoveries == 2 and restarted.recovery_mismatches() == []


@pytest.mark.parametrize("stored", [False, True])
def test_a_failed_append_fails_every_later_one_and_stores_none_of_them(stored: bool) -> None:
    """The ordering contract of LogBackend.append: once an append fails (stored or not), no
    later append of the partition is stored; the partition is rebuilt from its log."""
    faults = StorageFaults(append_error=1.0, stored_on_error=1.0 if stored else 0.0)
    broker: SimulatedBroker[str] = SimulatedBroker(faults=faults)
    record, _ = broker.init_producer("a", 0.0)
    for i in range(3):
        assert broker.receive(f"b{i}", TP, header(record, i), [b"x"], 0.0, 1.0) is None
    answers = broker.complete_writes(1.0)
    assert [token for token, _ in answers] == ["b0", "b1", "b2"]
    assert all(isinstance(answer, BackendUnavailableError) for _, answer in answers)
    assert [e.sequence for e in broker.storage.log(TP)] == ([0] if stored else [])
    broker.faults = StorageFaults()
    first = produce(broker, "again0", header(record, 0), 2.0)
    assert first == ProduceResult(Outcome.DUPLICATE if stored else Outcome.ACCEPTED, base_offset=0)
    assert produce(broker, "again1", header(record, 1), 2.0) == ProduceResult(Outcome.ACCEPTED, base_offset=1)
    assert broker.stats.recoveries == 2 and broker.stats.append_errors == 1


def test_an_eviction_whose_snapshot_cannot_be_stored_is_undone() -> None:
    """With room for one producer, a second one's first batch evicts the first; when that
    eviction's snapshot cannot be stored the partition is rebuilt (bringing the evicted
    producer back) and the request is answered PARTITION_RECOVERING; nobody is flagged."""
    broker: SimulatedBroker[str] = SimulatedBroker(
        checker_config=CheckerConfig(max_producers=1), faults=StorageFaults(snapshot_error=1.0)
    )
    first, _ = broker.init_producer("a", 0.0)
    second, _ = broker.init_producer("b", 0.0)
    assert produce(broker, "a0", header(first, 0), 0.0) == ProduceResult(Outcome.ACCEPTED, base_offset=0)
    assert isinstance(produce(broker, "b0", header(second, 0), 1.0), PartitionRecoveringError)
    assert broker.stats.snapshot_errors == 4 and broker.stats.evicted == 0 and broker.stats.recovering == 1
    assert not broker.storage.producers[first.producer_id].state_lost
    broker.faults = StorageFaults()
    assert produce(broker, "b0", header(second, 0), 2.0) == ProduceResult(Outcome.ACCEPTED, base_offset=1)
    assert broker.storage.producers[first.producer_id].state_lost and broker.stats.evicted == 1
    assert produce(broker, "a1", header(first, 1), 3.0) == ProduceResult(Outcome.UNKNOWN_PRODUCER)


def test_maintenance_expires_idle_producers_with_a_snapshot() -> None:
    broker: SimulatedBroker[str] = SimulatedBroker(checker_config=CheckerConfig(producer_expiry=1.0))
    record, _ = broker.init_producer("a", 0.0)
    assert produce(broker, "a0", header(record, 0), 0.0) == ProduceResult(Outcome.ACCEPTED, base_offset=0)
    broker.maintain(0.5)
    assert broker.stats.evicted == 0
    broker.maintain(2.0)
    assert broker.stats.evicted == 1 and broker.stats.snapshots == 1
    assert broker.storage.producers[record.producer_id].state_lost
    assert broker.recovery_mismatches() == []


def test_a_preloaded_producer_continues_after_its_stored_sequence() -> None:
    broker: SimulatedBroker[str] = SimulatedBroker()
    broker.preload("a", 2, {TP: 41}, 0.0)
    record, last = broker.init_producer("a", 1.0)
    assert record.producer_epoch == 3 and last == {TP: 41}
    assert broker.stats.recoveries == 1 and broker.stats.replayed == 1
    assert produce(broker, "a42", header(record, 42), 1.0) == ProduceResult(Outcome.ACCEPTED, base_offset=1)
    with pytest.raises(ConfigError, match="before it is used"):
        broker.preload("b", 0, {TP: 1}, 2.0)


def test_recovery_mismatches_report_a_log_that_lost_a_batch() -> None:
    broker: SimulatedBroker[str] = SimulatedBroker()
    record, _ = broker.init_producer("a", 0.0)
    for i in range(2):
        produce(broker, f"a{i}", header(record, i), 0.0)
    assert broker.recovery_mismatches() == []
    del broker.storage.batches[TP][1]
    [problem] = broker.recovery_mismatches()
    assert problem.startswith("t[0]: a recovery would rebuild another state for producers [1000]")


def test_an_eviction_survives_an_older_snapshot_stored_after_it() -> None:
    config = CheckerConfig(producer_expiry=1.0, snapshot_seconds=2.0)
    storage = SimulatedStorage()
    broker: SimulatedBroker[str] = SimulatedBroker(storage, config)
    a, _ = broker.init_producer("a", 0.0)
    b, _ = broker.init_producer("b", 0.0)
    assert produce(broker, "b0", header(b, 0, 5), 0.0) == ProduceResult(Outcome.ACCEPTED, base_offset=0)
    assert produce(broker, "a0", header(a, 0), 0.0) == ProduceResult(Outcome.ACCEPTED, base_offset=5)
    assert broker.receive("a1", TP, header(a, 1), [b"a1"], 5.0, 6.0) is None  # a due snapshot rides along
    broker.maintain(5.5)  # b idle for longer than producer_expiry: evicted, its snapshot stored at once
    assert broker.stats.evicted == 1
    assert broker.complete_writes(6.0) == [("a1", ProduceResult(Outcome.ACCEPTED, base_offset=6))]
    b_again, last = broker.init_producer("b", 7.0)  # a new instance of b: no state left on t[0]
    assert last == {}
    assert produce(broker, "new0", header(b_again, 0), 7.0) == ProduceResult(Outcome.ACCEPTED, base_offset=7)
    broker.crash()
    restarted: SimulatedBroker[str] = SimulatedBroker(storage, config)
    # (stored before the eviction's snapshot, a1's older one would have replaced it: new1
    # answered DUPLICATE at offset 1, one of b's records of epoch 0, and lost)
    assert produce(restarted, "new1", header(b_again, 1), 8.0) == ProduceResult(Outcome.ACCEPTED, base_offset=8)
