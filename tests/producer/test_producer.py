"""The threaded Producer shell (the asyncio producer: test_aio.py)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import idempotent
from idempotent import Deliveries, DeliveryFailed, DeliveryStatus, Producer, Recovery, SendManyFuture
from idempotent.adapters.memory import MemoryBackend
from idempotent.core.outcomes import RecordMetadata
from idempotent.core.records import Record
from idempotent.core.request import ProduceRequest
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    PartitionRecoveringError,
    ProducerClosedError,
    ProducerFencedError,
    QueueFullError,
    UsageError,
)
from idempotent.net.server import BrokerServer
from idempotent.producer.producer import default_partition

from ..conftest import memory_harness


def test_send_flush_and_metadata(tmp_path: Path) -> None:
    with Producer(f"sqlite:///{tmp_path / 'p.db'}", linger_ms=1) as producer:
        futures = [producer.send("events", f"v{i}", key=f"k{i % 3}") for i in range(50)]
        assert producer.flush(10) == 0
        metas = [f.result() for f in futures]
        assert all(not m.duplicate for m in metas)
        by_partition: dict[int, list[int]] = {}
        for m in metas:
            by_partition.setdefault(m.partition, []).append(m.sequence)
        for seqs in by_partition.values():
            assert seqs == list(range(len(seqs)))
        assert producer.last_sequence("events", 0) == 49
        record = producer.broker.read("events", 0, metas[7].offset, 1)[0]
        assert record.value == b"v7" and record.key == b"k1"


def test_close_asks_no_more_partition_counts_of_a_cluster_that_does_not_answer() -> None:
    """The sender refreshes stale partition counts one topic at a time, each question
    waiting up to the backend's timeout when the cluster is away: once the producer is
    closing it asks no more, so close() waits for one question at most, not one per topic."""
    broker = memory_harness().open()
    topics = [f"t{i}" for i in range(6)]
    for topic in topics:
        broker.create_topic(topic, 1)
    producer = Producer(broker, metadata_max_age_ms=0)
    for topic in topics:
        producer.send(topic, b"x").result(10)
    asked: list[str] = []
    answered = broker.partitions_for

    def slow(topic: str, **options: Any) -> int:
        asked.append(topic)
        time.sleep(0.5)  # a cluster that answers late
        return answered(topic, **options)

    broker.partitions_for = slow  # type: ignore[method-assign]
    deadline = time.monotonic() + 10
    while not asked:  # the sender is asking
        assert time.monotonic() < deadline
        time.sleep(0.01)
    producer.close()
    during = len(asked)
    assert during <= 2, asked  # the question under way, and at most one begun meanwhile
    time.sleep(1.0)
    assert len(asked) == during  # and none after close() returned


def test_a_first_send_waits_for_a_partition_count_the_broker_cannot_give_yet() -> None:
    """``send()`` to a topic the producer has not sent to asks the broker for its partition
    count: while the broker answers with a retriable error (an outage; Kafka refusing to
    create a topic while a broker shuts down), it asks again for up to ``max_block_ms`` and
    then queues the record; past that it raises the retriable error and queues nothing."""
    broker = memory_harness().open()
    broker.create_topic("late", 2)
    answered = broker.partitions_for
    refusals = {"late": 3, "never": 10**9}
    asked: list[str] = []

    def unavailable_at_first(topic: str, **options: Any) -> int:
        asked.append(topic)
        if refusals.get(topic, 0) > 0:
            refusals[topic] -= 1
            raise BackendUnavailableError(f"{topic}: no answer yet")
        return answered(topic, **options)

    broker.partitions_for = unavailable_at_first  # type: ignore[method-assign]
    with Producer(broker, max_block_ms=5_000) as producer:
        metadata = producer.send("late", b"x", partition=1).result(10)
        assert (metadata.topic, metadata.partition) == ("late", 1)
        assert asked.count("late") == 4  # three refusals, then the answer
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            producer.send("never", b"y")
        waited = time.monotonic() - started
        assert 4.0 <= waited < 15.0, waited
        assert asked.count("never") >= 3
        assert producer.flush(5) == 0  # nothing of the refused send was queued
    with Producer(broker, max_block_ms=0) as at_once:
        before = asked.count("never")
        with pytest.raises(BackendUnavailableError):
            at_once.send("never", b"z")
        assert asked.count("never") == before + 1
    with pytest.raises(ConfigError):
        Producer(broker, max_block_ms=-1)


def test_key_hash_partitioning_is_stable() -> None:
    broker = memory_harness().open()
    broker.create_topic("t", 4)
    with Producer(broker) as producer:
        parts = {producer.send("t", b"x", key=b"user-1").result().partition for _ in range(10)}
        assert len(parts) == 1
        spread = {producer.send("t", b"x").result().partition for _ in range(8)}
        assert spread == {0, 1, 2, 3}
        with pytest.raises(UsageError):
            producer.send("t", b"x", partition=4)
        with pytest.raises(UsageError):
            producer.send("t", 12345)  # type: ignore[arg-type]


def test_named_producer_resumes_sequences(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    with Producer(url, "copy-job") as first:
        for i in range(10):
            first.send("t", f"{i}")
    with Producer(url, "copy-job") as second:
        assert second.producer_epoch == 1 and second.last_sequence("t", 0) == 9
        assert second.send("t", "10").result().sequence == 10


def test_fenced_producer_fails_with_clear_error() -> None:
    broker = memory_harness().open()
    old = Producer(broker, "job")
    old.send("t", b"a").result()
    new = Producer(broker, "job")
    future = old.send("t", b"zombie")
    with pytest.raises(DeliveryFailed) as info:
        future.result(5)
    failure = info.value
    # FENCED stores nothing: the zombie's record is reported NOT_PERSISTED
    assert failure.status is DeliveryStatus.NOT_PERSISTED and failure.recovery is Recovery.FATAL
    assert isinstance(failure.__cause__, ProducerFencedError)
    with pytest.raises(ProducerFencedError):
        old.send("t", b"more")
    assert new.send("t", b"b").result().offset == 1
    old.close()
    new.close()


def test_a_bug_in_the_sender_ends_every_pending_record_with_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotent.errors import InternalError

    broker = memory_harness().open()
    producer = Producer(broker, linger_ms=60_000)
    futures = [producer.send("t", f"{i}".encode()) for i in range(5)]  # buffered (long linger)

    def broken(now: float) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(producer._seq, "handle_timeout", broken)
    with producer._cond:
        producer._cond.notify_all()
    for future in futures:
        with pytest.raises(DeliveryFailed) as info:
            future.result(10)
        assert info.value.status is DeliveryStatus.NOT_PERSISTED
        assert isinstance(info.value.__cause__, InternalError)
    assert producer.flush(5) == 0
    with pytest.raises(InternalError):
        producer.send("t", b"more")
    producer.close()  # does not raise


def test_queue_full_and_closed() -> None:
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    backend.faults.delay = 0.5
    producer = Producer(broker, max_buffered_records=3, linger_ms=0)
    for _ in range(3):
        producer.send("t", b"x")
    with pytest.raises(QueueFullError):
        producer.send("t", b"x")
    backend.faults.delay = 0.0
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send("t", b"x")


def test_retries_through_backend_outage() -> None:
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    with Producer(broker, linger_ms=0) as producer:
        producer.send("t", b"a").result()
        backend.faults.lose_ack = 2
        backend.faults.drop = 2
        futures = [producer.send("t", f"{i}".encode()) for i in range(20)]
        metas = [f.result(10) for f in futures]
    values = [r.value for r in broker.read("t", 0, 0, 100)]
    assert values == [b"a"] + [f"{i}".encode() for i in range(20)]
    assert [m.offset for m in metas] == list(range(1, 21))


# -- application-chosen sequences ----------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_explicit_sequences_with_gaps_under_monotonic(backend: str, tmp_path: Path) -> None:
    url = memory_harness().url if backend == "memory" else f"sqlite:///{tmp_path / 'm.db'}"
    broker = idempotent.connect(url)
    broker.create_topic("ids", 1)
    broker.set_policy("monotonic", topic="ids")
    with Producer(broker, "replayer", linger_ms=1) as producer:
        metas = [producer.send("ids", f"r{s}", partition=0, sequence=s) for s in (0, 1, 2, 7, 100, 101)]
        assert producer.flush(10) == 0
        assert [m.result().sequence for m in metas] == [0, 1, 2, 7, 100, 101]
        assert not any(m.result().duplicate for m in metas)
        assert producer.last_sequence("ids", 0) == 101
        again = producer.send("ids", "r7", partition=0, sequence=7).result(10)
        assert again.duplicate
    # the restarted producer continues after the highest stored sequence
    with Producer(broker, "replayer", linger_ms=1) as producer:
        assert producer.last_sequence("ids", 0) == 101
        assert producer.send("ids", "r100", partition=0, sequence=100).result(10).duplicate
        assert not producer.send("ids", "r500", partition=0, sequence=500).result(10).duplicate
    values = [r.value for r in broker.read("ids", 0, 0, 100)]
    assert values == [b"r0", b"r1", b"r2", b"r7", b"r100", b"r101", b"r500"]
    broker.close()


def test_explicit_consecutive_sequences_work_under_strict_and_a_jump_is_refused() -> None:
    broker = memory_harness().open()
    broker.create_topic("ids", 1)
    with Producer(broker, linger_ms=1) as producer:
        for s in range(5):
            producer.send("ids", f"r{s}", partition=0, sequence=s)
        assert producer.flush(10) == 0
        jump = producer.send("ids", "r9", partition=0, sequence=9)
        with pytest.raises(DeliveryFailed) as info:
            jump.result(10)
        assert isinstance(info.value.__cause__, idempotent.SequenceDesyncError)
    assert [r.sequence for r in broker.read("ids", 0, 0, 100)] == [0, 1, 2, 3, 4]


def test_explicit_resend_overlapping_records_still_in_flight_resolves_as_duplicates() -> None:
    broker = memory_harness().open()
    broker.create_topic("ids", 1)
    with Producer(broker, linger_ms=0, max_in_flight=1) as producer:
        first = [producer.send("ids", f"v{s}", partition=0, sequence=s) for s in range(5)]
        again = [producer.send("ids", f"w{s}", partition=0, sequence=s) for s in range(3, 7)]
        assert producer.flush(10) == 0
        assert [f.result().duplicate for f in first] == [False] * 5
        assert [(m.result().sequence, m.result().duplicate) for m in again] == [
            (3, True),
            (4, True),
            (5, False),
            (6, False),
        ]
    assert [r.value for r in broker.read("ids", 0, 0, 100)] == [b"v0", b"v1", b"v2", b"v3", b"v4", b"w5", b"w6"]


# -- send_many ------------------------------------------------------------------------------------


def test_send_many_spans_batches_and_reports_each_record_in_order(tmp_path: Path) -> None:
    records = [Record(f"v{i}", key=None, headers={"n": f"{i}".encode()}) for i in range(25)]
    with Producer(f"sqlite:///{tmp_path / 'p.db'}", linger_ms=1, max_batch_records=7) as producer:
        before = producer.send("t", b"single", partition=0)  # shares the open batch with the call
        future = producer.send_many("t", records, partition=0)
        after = producer.send("t", b"after", partition=0)
        deliveries = future.result(10)
        assert before.result().offset == 0 and after.result().offset == 26
    assert isinstance(future, SendManyFuture) and isinstance(deliveries, Deliveries)
    assert len(deliveries) == 25 and deliveries.failed == 0 and deliveries.failures() == []
    assert [m.offset for m in deliveries] == list(range(1, 26))  # type: ignore[union-attr]
    assert [m.sequence for m in deliveries[::5]] == [1, 6, 11, 16, 21]  # type: ignore[union-attr]
    last = deliveries[-1]
    assert isinstance(last, RecordMetadata) and (last.topic, last.partition, last.duplicate) == ("t", 0, False)
    assert future.deliveries() is deliveries and not future.cancel()
    stored = idempotent.connect(f"sqlite:///{tmp_path / 'p.db'}").read("t", 0, 0, 100)
    assert [r.value for r in stored] == [b"single"] + [f"v{i}".encode() for i in range(25)] + [b"after"]
    assert stored[3].headers == (("n", b"2"),)


def test_send_many_by_key_maps_each_record_back_to_its_partition() -> None:
    broker = memory_harness().open()
    broker.create_topic("t", 4)
    records = [Record(f"v{i}", key=f"user-{i % 9}") for i in range(60)]
    with Producer(broker, linger_ms=1, max_batch_records=5) as producer:
        deliveries = producer.send_many("t", records).result(10)
        keyless = producer.send_many("t", [b"a", b"b", b"c"]).result(10)
    for i, meta in enumerate(deliveries):
        assert isinstance(meta, RecordMetadata)
        assert meta.partition == default_partition(f"user-{i % 9}".encode(), 4, 0)
        assert meta.offset is not None
        [stored] = broker.read("t", meta.partition, meta.offset, 1)
        assert stored.value == f"v{i}".encode() and stored.sequence == meta.sequence
    assert len({m.partition for m in keyless}) == 1  # type: ignore[union-attr]  # keyless: one partition
    assert len({m.partition for m in deliveries}) > 1  # type: ignore[union-attr]


def test_send_many_refuses_record_columns_of_the_wrong_types_and_queues_nothing() -> None:
    from idempotent.core.records import RecordColumns

    broker = memory_harness().open()
    broker.create_topic("t", 1)
    with Producer(broker, linger_ms=1) as producer:
        with pytest.raises(UsageError, match="keys must be bytes or None, not str"):
            producer.send_many("t", RecordColumns([b"v"], ["k"]), partition=0)  # type: ignore[list-item]
        with pytest.raises(UsageError, match="2 keys for 1 values"):
            producer.send_many("t", RecordColumns([b"v"], [b"a", b"b"]), partition=0)
        good = producer.send_many("t", RecordColumns([b"v", b"w"], [b"k", None]), partition=0).result(10)
    assert [(r.value, r.key, r.sequence) for r in broker.read("t", 0, 0, 10)] == [(b"v", b"k", 0), (b"w", None, 1)]
    assert len(good) == 2


def test_send_many_explicit_sequences_replay_as_duplicates() -> None:
    broker = memory_harness().open()
    broker.create_topic("ids", 2)
    broker.set_policy("monotonic", topic="ids")
    values = [f"r{i}".encode() for i in range(10)]
    with Producer(broker, "copy", linger_ms=1, max_batch_records=4) as producer:
        first = producer.send_many("ids", values, partition=0, sequence=100).result(10)
        gaps = producer.send_many("ids", [b"x", b"y", b"z"], partition=1, sequence=[5, 6, 40]).result(10)
    with Producer(broker, "copy", linger_ms=1) as producer:  # a restarted copy job replays
        again = producer.send_many("ids", values, partition=0, sequence=100).result(10)
        more = producer.send_many("ids", [Record(b"w", key=b"k")], partition=0, sequence=[110]).result(10)
    assert [(m.sequence, m.offset, m.duplicate) for m in first] == [(100 + i, i, False) for i in range(10)]  # type: ignore[union-attr]
    assert [(m.sequence, m.offset, m.duplicate) for m in again] == [(100 + i, i, True) for i in range(10)]  # type: ignore[union-attr]
    assert [m.sequence for m in gaps] == [5, 6, 40] and more[0].offset == 10  # type: ignore[union-attr]
    assert (first.duplicates, again.duplicates, again.failed) == (0, 10, 0)
    assert [r.sequence for r in broker.read("ids", 0, 0, 100)] == list(range(100, 111))


def test_send_many_partial_failure_reports_each_record() -> None:
    broker = memory_harness().open()
    broker.create_topic("ids", 1)
    with Producer(broker, linger_ms=1) as producer:  # strict policy: the jump to 9 is refused
        future = producer.send_many("ids", [b"a", b"b", b"c", b"j", b"k"], partition=0, sequence=[0, 1, 2, 9, 10])
        with pytest.raises(DeliveryFailed) as info:
            future.result(10)
        deliveries = future.deliveries()
    assert "2 of 5 records failed; the first, record 3" in str(info.value)
    assert isinstance(info.value.__cause__, idempotent.SequenceDesyncError) and info.value.sequence == 9
    assert [m.offset for m in deliveries[:3]] == [0, 1, 2]  # type: ignore[union-attr]
    assert deliveries.failed == 2 and [i for i, _ in deliveries.failures()] == [3, 4]
    failed = deliveries[4]
    assert isinstance(failed, DeliveryFailed) and failed.sequence == 10
    assert failed.status is DeliveryStatus.POSSIBLY_PERSISTED
    assert isinstance(failed.__cause__, idempotent.SequenceDesyncError)


def test_send_many_rejects_bad_input_and_queues_nothing() -> None:
    broker = memory_harness().open()
    broker.create_topic("t", 2)
    with Producer(broker, linger_ms=1) as producer:
        with pytest.raises(UsageError):
            producer.send_many("t", [b"a", 12345])  # type: ignore[list-item]
        with pytest.raises(UsageError):
            producer.send_many("t", [b"a", b"b"], partition=0, sequence=[1])
        with pytest.raises(UsageError):
            producer.send_many("t", [b"a"], partition=2)
        with pytest.raises(UsageError):  # the second partition's sequence is bad: neither is queued
            producer.send_many("t", [Record(b"a", key=b"0"), Record(b"b", key=b"1")], sequence=[1, -1])
        with pytest.raises(UsageError):
            producer.send_many("t", [b"a", b"b"], partition=0, sequence=2**63 - 1)  # runs past int64
        assert producer.flush(5) == 0
        assert len(producer.send_many("t", []).result(1)) == 0
    assert broker.end_offset("t", 0) == broker.end_offset("t", 1) == 0


def test_send_many_queue_full_and_closed() -> None:
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    backend.faults.delay = 0.5
    producer = Producer(broker, max_buffered_records=3, linger_ms=0)
    producer.send_many("t", [b"x"] * 5)  # one call may take the buffer past the limit
    with pytest.raises(QueueFullError):
        producer.send_many("t", [b"x"])
    backend.faults.delay = 0.0
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send_many("t", [b"x"])


# -- the future of send ----------------------------------------------------------------------------


def test_send_futures_wake_waiters_callbacks_and_wait_whenever_they_arrive() -> None:
    """send's future makes its lock only when someone waits: waiters that come before, during
    or after the sender completes it all see the result, exactly once for callbacks; its
    concurrent() twin works with concurrent.futures.wait and as_completed."""
    broker = memory_harness().open()
    called: list[int] = []
    with Producer(broker, linger_ms=0) as producer:
        for round_ in range(200):
            futures = [producer.send("t", b"%d" % i, partition=0) for i in range(5)]
            futures[0].add_done_callback(lambda f: called.append(f.result().offset or 0))
            waiter = threading.Thread(target=futures[1].result, args=(10,))
            waiter.start()
            done, _ = concurrent.futures.wait([f.concurrent() for f in futures[2:4]], timeout=10)
            assert len(done) == 2
            real = [f.concurrent() for f in futures]
            assert [f.result().offset for f in concurrent.futures.as_completed(real, timeout=10)]
            waiter.join(10)
            assert not waiter.is_alive() and all(f.done() and not f.cancel() for f in futures)
            assert futures[4].result().offset == round_ * 5 + 4
    late: list[int] = []
    futures[4].add_done_callback(lambda f: late.append(1))  # already done: called at once
    assert len(called) == 200 and late == [1]


def test_send_future_carries_a_failure_to_waiters() -> None:
    broker = memory_harness().open()
    old = Producer(broker, "job", linger_ms=0)
    old.send("t", b"a").result()
    Producer(broker, "job").close()  # fences the old instance
    future = old.send("t", b"zombie")
    seen: list[BaseException | None] = []
    future.add_done_callback(lambda f: seen.append(f.exception()))
    with pytest.raises(DeliveryFailed):
        future.result(10)
    assert isinstance(seen[0], DeliveryFailed) and future.done()
    old.close()


# -- 64-bit sequences, through the producer and through the broker server ---------------------

BOUNDARIES = (2**30 - 1, 2**30, 2**30 + 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1)


@pytest.fixture(params=["broker", "server"])
def target(request: pytest.FixtureRequest) -> Iterator[tuple[idempotent.Broker, Any]]:
    """(the broker, what a Producer connects to): the broker itself, or a broker server."""
    broker = memory_harness().open()
    if request.param == "broker":
        yield broker, broker
        broker.close()
        return
    with BrokerServer(broker) as server:
        yield broker, server.url


def test_strict_refuses_jumps_of_any_size_and_sequences_beyond_int32(target: tuple[idempotent.Broker, Any]) -> None:
    broker, url = target
    broker.create_topic("ids", 1)
    for jump in BOUNDARIES:
        with Producer(url, linger_ms=0) as producer:
            assert producer.send("ids", "r0", partition=0, sequence=0).result(10).sequence == 0
            future = producer.send("ids", f"r{jump}", partition=0, sequence=jump)
            with pytest.raises(DeliveryFailed) as info:
                future.result(10)
            cause = idempotent.SequenceDesyncError if jump <= 2**31 - 1 else idempotent.InvalidBatchError
            assert isinstance(info.value.__cause__, cause), (jump, info.value.__cause__)
    assert {r.value for r in broker.read("ids", 0, 0, 100)} == {b"r0"}  # nothing else stored


def test_monotonic_takes_64_bit_application_sequences(target: tuple[idempotent.Broker, Any]) -> None:
    broker, url = target
    broker.create_topic("ids", 1)
    broker.set_policy("monotonic", topic="ids")
    sent = (0, *BOUNDARIES)
    with Producer(url, "copier", linger_ms=0) as producer:
        metas = [producer.send("ids", f"r{s}", partition=0, sequence=s) for s in sent]
        assert producer.flush(10) == 0
        assert [(m.result().sequence, m.result().duplicate) for m in metas] == [(s, False) for s in sent]
        assert producer.last_sequence("ids", 0) == 2**63 - 1
    with Producer(url, "copier", linger_ms=0) as producer:  # restarted: resends are duplicates
        assert producer.last_sequence("ids", 0) == 2**63 - 1
        again = [producer.send("ids", "again", partition=0, sequence=s) for s in (*sent, 2**31 + 3)]
        assert all(m.result(10).duplicate for m in again)
    # consecutive sequences across 2**31-1: split into two batches there, nothing wraps
    crossing = range(2**31 - 2, 2**31 + 2)
    with Producer(url, "crossing", linger_ms=50) as producer:
        metas = [producer.send("ids", "c", partition=0, sequence=s) for s in crossing]
        assert producer.flush(10) == 0
        assert [(m.result().sequence, m.result().duplicate) for m in metas] == [(s, False) for s in crossing]
    assert [r.sequence for r in broker.read("ids", 0, 0, 100)] == [*sent, *crossing]


def test_monotonic_a_record_without_sequence_after_a_large_jump_is_stored(tmp_path: Path) -> None:
    """Regression: after a jump of 2**30 or more (below 2**31) under ``monotonic``, a record
    sent without a sequence was numbered 0 on the int32 ring, answered DUPLICATE with offset
    None, and never stored."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    broker = idempotent.connect(url)
    broker.set_policy("monotonic", topic="m")
    broker.close()
    with Producer(url) as producer:
        producer.send("m", b"first", partition=0, sequence=1_500_000_000).result(10)
        second = producer.send("m", b"second", partition=0).result(10)
        assert (second.sequence, second.duplicate, second.offset) == (1_500_000_001, False, 1)
        assert [r.value for r in producer.broker.read("m", 0)] == [b"first", b"second"]


def test_monotonic_records_with_and_without_sequence_mix_at_the_boundaries(
    target: tuple[idempotent.Broker, Any],
) -> None:
    """Each answered before the next is sent: 0, a jump to the boundary, a record without a
    sequence, a resend of 0, another record without a sequence. After 2**31-1 the producer's
    own numbering would wrap to 0, which the broker refuses (SequenceDesyncError); after
    2**63-1 there is no sequence left (InvalidBatchError, that record alone)."""
    broker, url = target
    broker.create_topic("mix", len(BOUNDARIES))
    broker.set_policy("monotonic", topic="mix")
    for partition, jump in enumerate(BOUNDARIES):
        with Producer(url, linger_ms=0) as producer:
            sent = [producer.send("mix", f"{jump}", partition=partition, sequence=s).result(10) for s in (0, jump)]
            assert [(m.sequence, m.duplicate) for m in sent] == [(0, False), (jump, False)]
            after = producer.send("mix", "a", partition=partition)
            if jump == 2**31 - 1:
                with pytest.raises(DeliveryFailed) as info:
                    after.result(10)
                assert isinstance(info.value.__cause__, idempotent.SequenceDesyncError)
                continue
            if jump == 2**63 - 1:
                with pytest.raises(DeliveryFailed) as info:
                    after.result(10)
                assert isinstance(info.value.__cause__, idempotent.InvalidBatchError)
                assert producer.send("mix", "0", partition=partition, sequence=0).result(10).duplicate
                continue
            assert (after.result(10).sequence, after.result(10).duplicate) == (jump + 1, False)
            assert producer.send("mix", "0", partition=partition, sequence=0).result(10).duplicate
            again = producer.send("mix", "b", partition=partition).result(10)
            assert (again.sequence, again.duplicate) == (jump + 2, False)
            assert producer.last_sequence("mix", partition) == jump + 2
    for partition, jump in enumerate(BOUNDARIES):
        stored = [r.sequence for r in broker.read("mix", partition)]
        assert stored == ([0, jump] if jump in (2**31 - 1, 2**63 - 1) else [0, jump, jump + 1, jump + 2])


def test_strict_records_with_and_without_sequence_mix_at_the_boundaries(
    target: tuple[idempotent.Broker, Any],
) -> None:
    """A named producer resumed at each boundary of the int32 ring (its last sequence placed
    there while deduplication was off): a record without a sequence, the next sequence given
    explicitly, a resend, another record without a sequence; across 2**31-1 all wrap to 0."""
    broker, url = target
    ring = [b for b in BOUNDARIES if b <= 2**31 - 1]
    broker.create_topic("ring", len(ring))
    for partition, boundary in enumerate(ring):
        session = broker.init_producer(f"ring-{boundary}")
        broker.set_deduplication(False, topic="ring")
        broker.produce("ring", partition, session.producer_id, session.producer_epoch, boundary - 1, [b"x"])
        broker.set_deduplication(True, topic="ring")
        with Producer(url, f"ring-{boundary}", linger_ms=0) as producer:
            assert producer.last_sequence("ring", partition) == boundary - 1
            expected = [boundary, (boundary + 1) % 2**31, boundary, (boundary + 2) % 2**31]
            metas = [
                producer.send("ring", f"{s}", partition=partition, sequence=s).result(10)
                for s in (None, expected[1], expected[2], None)
            ]
            assert [(m.sequence, m.duplicate) for m in metas] == list(
                zip(expected, [False, False, True, False], strict=True)
            )
        stored = [r.sequence for r in broker.read("ring", partition)]
        assert stored == [boundary - 1, boundary, expected[1], expected[3]]


# -- records the broker cannot take -----------------------------------------------------------


def test_an_oversized_record_is_refused_at_send_naming_the_limit(target: tuple[idempotent.Broker, Any]) -> None:
    broker, url = target
    with Producer(url, linger_ms=0) as producer:
        with pytest.raises(idempotent.InvalidBatchError, match="max_record_bytes=8388608"):
            producer.send("t", b"x" * 9 * 2**20)
        with pytest.raises(idempotent.InvalidBatchError, match="max_record_bytes"):
            producer.send_many("t", [b"small", b"x" * 9 * 2**20])
        assert producer.send("t", b"after", partition=0).result(10).sequence == 0  # still working
    assert [r.value for r in broker.read("t", 0)] == [b"after"]


def test_the_producer_learns_the_backends_own_limit_at_init() -> None:
    backend = MemoryBackend(memory_harness().url)
    backend.max_batch_bytes = 4096  # as Pulsar's entry size limits its batches
    broker = idempotent.Broker(backend)
    assert broker.limits() == (4096, 4096)
    with Producer(broker, linger_ms=0) as producer:
        assert producer.session_limits == (4096, 4096)
        with pytest.raises(idempotent.InvalidBatchError, match="max_record_bytes=4096"):
            producer.send("t", b"x" * 5000)
        futures = [producer.send("t", b"y" * 1000, partition=0) for _ in range(10)]  # batches fit
        assert producer.flush(10) == 0 and all(not f.result().duplicate for f in futures)
    broker.close()


@pytest.mark.parametrize("max_in_flight", [1, 5])
def test_a_record_only_the_broker_refuses_fails_alone_and_the_producer_keeps_working(
    target: tuple[idempotent.Broker, Any], max_in_flight: int
) -> None:
    broker, url = target
    with Producer(url, linger_ms=0, max_batch_records=1, max_in_flight=max_in_flight) as producer:
        # the broker lowers its limit after the producer learnt it: only the broker can tell
        broker.config = attrs.evolve(broker.config, max_record_bytes=1000)
        big = producer.send("t", b"x" * 2000, partition=0)
        small = [producer.send("t", f"s{i}", partition=0) for i in range(4)]
        with pytest.raises(DeliveryFailed) as info:
            big.result(10)
        assert info.value.status is DeliveryStatus.NOT_PERSISTED
        assert isinstance(info.value.__cause__, idempotent.InvalidBatchError)
        assert "max_record_bytes=1000" in str(info.value)
        assert [f.result(10).sequence for f in small] == [0, 1, 2, 3]
        assert producer.send("t", b"later", partition=0).result(10).sequence == 4
    assert [r.value for r in broker.read("t", 0)] == [b"s0", b"s1", b"s2", b"s3", b"later"]


# -- a batch refused for a passing reason is not overtaken (monotonic) --------------------------


def _refuse_first_batch(broker: idempotent.Broker, topic: str) -> list[int]:
    """Make the broker refuse the first batch for ``topic`` with PartitionRecoveringError
    (nothing stored), answered only after the batches behind it reached the broker; returns
    the list of base sequences it refused."""
    submit = broker.submit_request
    refused: list[int] = []

    def submit_request(request: ProduceRequest) -> concurrent.futures.Future[idempotent.ProduceResult]:
        if request.topic != topic or refused:
            return submit(request)
        refused.append(request.header.base_sequence)
        answer: concurrent.futures.Future[idempotent.ProduceResult] = concurrent.futures.Future()
        threading.Timer(0.3, answer.set_exception, [PartitionRecoveringError("recovering (injected)")]).start()
        return answer

    broker.submit_request = submit_request  # type: ignore[method-assign]
    return refused


@pytest.mark.parametrize("explicit", [False, True], ids=["numbered", "application-sequences-with-gaps"])
def test_a_refused_batch_is_not_overtaken_by_the_pipelined_ones_behind_it(
    target: tuple[idempotent.Broker, Any], explicit: bool
) -> None:
    """Regression: under the monotonic policy the batch behind one refused with nothing stored
    was accepted (gaps are allowed), so the refused batch's resend was answered DUPLICATE and
    reported delivered (offset None, duplicate) although nothing of it was stored."""
    broker, url = target
    broker.create_topic("ids", 1)
    broker.set_policy("monotonic", topic="ids")
    refused = _refuse_first_batch(broker, "ids")
    values = [f"r{i}".encode() for i in range(300)]
    sequences = [(i // 10) * 100 + i % 10 for i in range(300)] if explicit else None
    with Producer(url, linger_ms=5, max_batch_records=10, max_in_flight=5) as producer:
        result = producer.send_many("ids", values, partition=0, sequence=sequences).result(30)
    assert refused == [0]
    assert [(m.offset, m.duplicate) for m in result] == [(i, False) for i in range(300)]  # type: ignore[union-attr]
    assert [m.sequence for m in result] == (sequences or list(range(300)))  # type: ignore[union-attr]
    stored = broker.read("ids", 0, 0, 1000)
    assert [r.value for r in stored] == values
    assert [r.sequence for r in stored] == (sequences or list(range(300)))


def test_a_refused_batch_is_not_overtaken_with_single_sends(target: tuple[idempotent.Broker, Any]) -> None:
    broker, url = target
    broker.create_topic("ids", 1)
    broker.set_policy("monotonic", topic="ids")
    refused = _refuse_first_batch(broker, "ids")
    with Producer(url, linger_ms=1, max_batch_records=7) as producer:
        futures = [producer.send("ids", f"v{i}", partition=0) for i in range(100)]
        metas = [f.result(30) for f in futures]
    assert refused == [0]
    assert [(m.offset, m.duplicate) for m in metas] == [(i, False) for i in range(100)]
    assert [r.value for r in broker.read("ids", 0, 0, 1000)] == [f"v{i}".encode() for i in range(100)]


def test_a_batch_lost_by_the_backend_is_not_overtaken_under_monotonic() -> None:
    """A failed append (nothing stored) makes the broker recover the partition while the
    batches behind it are in flight: every record ends stored once, in order, and truthfully
    reported."""
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    broker.create_topic("ids", 1)
    broker.set_policy("monotonic", topic="ids")
    values = [f"r{i}".encode() for i in range(200)]
    with Producer(broker, linger_ms=5, max_batch_records=10, max_in_flight=5) as producer:
        producer.send("ids", b"first", partition=0).result(10)
        backend.faults.delay = 0.02
        backend.faults.drop = 1
        result = producer.send_many("ids", values, partition=0).result(30)
    assert [(m.offset, m.duplicate) for m in result] == [(i + 1, False) for i in range(200)]  # type: ignore[union-attr]
    assert [r.value for r in broker.read("ids", 0, 0, 1000)] == [b"first", *values]
    broker.close()


def test_ctrl_c_in_flush_leaves_the_lock_with_its_owner() -> None:
    """A Ctrl-C that lands while ``flush()``'s wait takes the producer's lock back must not
    make the caller release the lock the sender (or another caller) holds."""
    from ..conftest import ctrl_c_while_retaking

    with Producer("memory://") as producer:
        assert ctrl_c_while_retaking(producer._cond) == []
        assert producer.send("t", b"after").result(10).offset == 0  # and the producer works on


# -- sends yield to a write on the sender's thread ------------------------------------------------


class _HeldWrites:
    """A broker whose ``submit_requests`` holds each group until released, as a slow write on
    the caller's thread; ``writes_on_submit`` as given (a Kafka producer's own transactions say
    True)."""

    def __init__(self, inner: idempotent.Broker, writes_on_submit: bool, without_lock: bool = False) -> None:
        self._inner = inner
        self.writes_on_submit = writes_on_submit
        self.writes_without_lock = without_lock
        self.writing = threading.Event()
        self.release = threading.Event()
        self.groups: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit_requests(self, requests: list[ProduceRequest]) -> Any:
        self.groups.append(sum(len(request.records) for request in requests))
        self.writing.set()
        self.release.wait(10)
        return self._inner.submit_requests(requests)


def _send_during_a_held_write(
    records: int, writes_on_submit: bool, monkeypatch: pytest.MonkeyPatch, without_lock: bool = False
) -> float:
    """Seconds a ``send`` took while the sender's first group (``records`` records) was held
    for 0.6 s; sends may wait for a write up to 10 s here."""
    import idempotent.producer.producer as producer_module

    monkeypatch.setattr(producer_module, "YIELD_WAIT", 10.0)
    broker = _HeldWrites(memory_harness().open(), writes_on_submit, without_lock)
    producer = Producer(broker, linger_ms=300)  # type: ignore[arg-type]
    try:
        for _ in range(records):
            producer.send("t", b"x" * 300, partition=0)
        assert broker.writing.wait(10)
        threading.Timer(0.6, broker.release.set).start()
        started = time.monotonic()
        producer.send("t", b"late", partition=0)
        took = time.monotonic() - started
        broker.release.set()
        producer.flush(10)
    finally:
        broker.release.set()
        producer.close()
    assert broker.groups[0] == records  # the first group held every record sent before it
    return took


def test_a_send_waits_for_a_large_group_written_on_the_senders_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,000 records: the application is producing near the producer's capacity
    assert _send_during_a_held_write(1000, True, monkeypatch) >= 0.5


def test_a_send_does_not_wait_for_a_small_group_or_a_broker_that_writes_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _send_during_a_held_write(10, True, monkeypatch) < 0.3
    assert _send_during_a_held_write(1000, False, monkeypatch) < 0.3


def test_a_send_does_not_wait_for_a_write_that_runs_without_the_interpreter_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compiled Kafka write path (``writes_without_lock``): a group's write overlaps the
    next group's sends, however large the group."""
    assert _send_during_a_held_write(1000, True, monkeypatch, without_lock=True) < 0.3
