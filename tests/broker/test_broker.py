"""The broker shell: pipelining, failed appends and recovery, settings, stats."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent import DeliveryFailed, DeliveryStatus, Outcome, Producer, Recovery
from idempotent.adapters.memory import MemoryBackend
from idempotent.backend import AppendBatch
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core.records import Snapshot
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    EntryTooLargeError,
    InternalError,
    ProducerClosedError,
)

from ..conftest import memory_harness, sqlite_harness


def test_pipelined_batches_and_in_flight_resend() -> None:
    harness = memory_harness()
    broker = harness.open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    s = broker.init_producer()
    backend.faults.delay = 0.3
    first = broker.submit_produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"])
    second = broker.submit_produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
    # the first copy is still unacknowledged: a resend is IN_FLIGHT, not a duplicate
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.IN_FLIGHT
    backend.faults.delay = 0.0
    assert first.result(5).base_offset == 0 and second.result(5).base_offset == 1
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).base_offset == 0
    broker.close()


def test_lost_ack_triggers_recovery_and_resend_is_duplicate() -> None:
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    s = broker.init_producer()
    backend.faults.lose_ack = 1
    with pytest.raises(BackendUnavailableError):
        broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"])
    assert broker.stats("t")[0].replayed_batches == 1  # rebuilt from the log after the failed append
    again = broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"])
    assert again.outcome is Outcome.DUPLICATE and again.base_offset == 0
    backend.faults.drop = 1
    with pytest.raises(BackendUnavailableError):
        broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    assert [r.value for r in broker.read("t", 0)] == [b"a", b"b"]
    broker.close()


def test_backend_down_then_up() -> None:
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    s = broker.init_producer()
    broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"])
    backend.faults.crash = True
    with pytest.raises(BackendUnavailableError):
        broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
    with pytest.raises(BackendUnavailableError):
        broker.init_producer("named")
    backend.faults.crash = False
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    assert broker.init_producer("named").producer_epoch == 0
    broker.close()


def test_init_waits_for_old_instance_in_flight_batches() -> None:
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    old = broker.init_producer("job")
    backend.faults.delay = 0.4
    pending = broker.submit_produce("t", 0, old.producer_id, old.producer_epoch, 0, [b"a", b"b"])
    started = time.monotonic()
    new = broker.init_producer("job")
    assert time.monotonic() - started >= 0.2, "init must wait for the old instance's batch"
    assert pending.result(5).outcome is Outcome.ACCEPTED
    assert new.last_sequences[("t", 0)] == 1
    backend.faults.delay = 0.0
    broker.close()


def test_concurrent_producers_keep_per_partition_order() -> None:
    broker = memory_harness().open()
    broker.create_topic("t", 2)
    sessions = [broker.init_producer() for _ in range(4)]

    def run(s: idempotent.ProducerSession) -> None:
        for i in range(200):
            r = broker.produce("t", i % 2, s.producer_id, s.producer_epoch, i // 2, [f"{s.producer_id}:{i}".encode()])
            assert r.outcome is Outcome.ACCEPTED

    threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in (0, 1):
        log = broker.read("t", p, 0, 10_000)
        assert [r.offset for r in log] == list(range(400))
        for s in sessions:
            mine = [r.sequence for r in log if r.producer_id == s.producer_id]
            assert mine == list(range(100))
    broker.close()


def test_closed_broker_refuses() -> None:
    broker = memory_harness().open()
    broker.close()
    with pytest.raises(ProducerClosedError):
        broker.init_producer()


def test_settings_persist_and_bad_values() -> None:
    harness = memory_harness()
    b1 = harness.open()
    b1.set_policy("monotonic", namespace="tenant/ns")
    b1.set_deduplication(False)
    b1.close()
    b2 = harness.open()
    assert b2.policy_for("tenant/ns/x").value == "monotonic" and b2.policy_for("other").value == "strict"
    assert not b2.deduplication_enabled("anything")
    with pytest.raises(ConfigError):
        b2.set_deduplication(True, topic="a", namespace="b")
    b2.close()


def test_stats_report_producers_and_snapshots() -> None:
    broker = memory_harness().open()
    s = broker.init_producer("named")
    for i in range(3):
        broker.produce("t", 0, s.producer_id, s.producer_epoch, i, [b"x"])
    (stats,) = broker.stats("t")
    assert stats.position == 3 and stats.status == "ready" and stats.deduplication
    (producer,) = stats.producers
    assert (producer.producer_id, producer.producer_name, producer.last_sequence, producer.last_offset) == (
        s.producer_id,
        "named",
        2,
        2,
    )


def test_unknown_scheme_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="scheme"):
        idempotent.connect("redis://localhost")
    with pytest.raises(ConfigError):
        idempotent.connect("sqlite://")


def test_refresh_settings_follows_the_backend_and_keeps_newer_local_changes() -> None:
    url = memory_harness().url

    class Racing(MemoryBackend):
        race: Broker | None = None

        def load_settings(self) -> dict[str, str]:
            stale = super().load_settings()
            if self.race is not None:  # a change through this broker lands while the load is under way
                broker, self.race = self.race, None
                broker.set_deduplication(False, topic="t")
            return stale

    backend = Racing(url)
    broker = Broker(backend, BrokerConfig(maintenance_interval=0))
    other = idempotent.connect(url)  # another broker over the same store
    other.set_policy("monotonic", namespace="")
    assert broker.policy_for("t").value == "strict"
    assert broker.refresh_settings()
    assert broker.policy_for("t").value == "monotonic"
    backend.race = broker
    assert broker.refresh_settings()
    assert not broker.deduplication_enabled("t")  # the stale load did not undo it
    backend.faults.crash = True
    assert not broker.refresh_settings()  # unreadable: the settings in force stay
    assert broker.policy_for("t").value == "monotonic" and not broker.deduplication_enabled("t")
    backend.faults.crash = False
    other.close()
    broker.close()


def test_lease_heartbeat_reload_keeps_newer_local_settings() -> None:
    """The lease heartbeat of a clustered broker also reloads the settings; a change made
    through the broker while that load is under way is newer and stays."""
    from idempotent.testing.conformance import cluster_config

    url = memory_harness().url

    class Racing(MemoryBackend):
        race: Broker | None = None

        def load_settings(self) -> dict[str, str]:
            stale = super().load_settings()
            if self.race is not None:
                broker, self.race = self.race, None
                broker.set_deduplication(False, topic="t")
            return stale

    backend = Racing(url)
    broker = Broker(backend, cluster_config("a", 30.0))
    try:
        backend.race = broker
        broker.renew_leases()
        assert backend.race is None and not broker.deduplication_enabled("t")
    finally:
        broker.close()


# -- backend refusals that store nothing, and bugs ---------------------------------------------


class _RefusingBackend(MemoryBackend):
    """Memory, but a batch over ``limit`` bytes is refused as one Pulsar entry too large (it
    is not stored), and ``bug`` makes the next append raise an exception nobody expects."""

    limit = 1000
    bug: BaseException | None = None

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        if self.bug is not None:
            bug, self.bug = self.bug, None
            raise bug
        if sum(r.size for r in batch.records) > self.limit:
            future: Future[int] = Future()
            future.set_exception(EntryTooLargeError("larger than one entry (test)"))
            return future
        return super().append(topic, partition, batch, snapshot)


def test_a_definite_backend_refusal_fails_the_batch_alone_without_a_rebuild() -> None:
    backend = _RefusingBackend(memory_harness().url)
    broker = Broker(backend, BrokerConfig(maintenance_interval=0))
    s = broker.init_producer()
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    recovered = broker.stats("t")[0].recovery_seconds, broker.stats("t")[0].replayed_batches
    with pytest.raises(EntryTooLargeError) as refused:
        broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"x" * 2000])
    assert refused.value.recovery is Recovery.FATAL and not refused.value.retriable
    # no rebuild: the next batch takes the refused one's sequence at once
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    stats = broker.stats("t")[0]
    assert stats.status == "ready" and (stats.recovery_seconds, stats.replayed_batches) == recovered
    assert [r.value for r in broker.read("t", 0)] == [b"a", b"b"]
    with Producer(broker, linger_ms=0) as producer:  # through the producer: fails alone
        big = producer.send("t", b"y" * 2000, partition=0)
        with pytest.raises(DeliveryFailed) as failed:
            big.result(10)
        assert failed.value.status is DeliveryStatus.NOT_PERSISTED
        assert isinstance(failed.value.__cause__, EntryTooLargeError)
        assert producer.send("t", b"c", partition=0).result(10).sequence == 0
    broker.close()


def test_a_bug_is_a_logged_fatal_internal_error_not_a_retry(caplog: pytest.LogCaptureFixture) -> None:
    backend = _RefusingBackend(memory_harness().url)
    broker = Broker(backend, BrokerConfig(maintenance_interval=0))
    backend.bug = KeyError("a bug in an adapter")
    with Producer(broker, linger_ms=0, delivery_timeout_ms=60_000) as producer:
        started = time.monotonic()
        with pytest.raises(DeliveryFailed) as failed:
            producer.send("t", b"a", partition=0).result(30)
        assert time.monotonic() - started < 10  # not retried until the delivery timeout
        cause = failed.value.__cause__
        assert isinstance(cause, InternalError) and cause.recovery is Recovery.FATAL
        assert "KeyError" in str(cause)
    assert any(
        r.levelname == "ERROR" and r.exc_info and "a bug in an adapter" in r.getMessage() for r in caplog.records
    )
    broker.close()


def test_background_loops_log_a_bug_and_fail_the_broker(caplog: pytest.LogCaptureFixture) -> None:
    broker = memory_harness().open(BrokerConfig(maintenance_interval=0.05))
    broker.create_topic("t", 1)
    original = broker.maintain
    calls = []

    def maintain(now: float | None = None) -> None:
        calls.append(now)
        if len(calls) == 1:
            raise BackendUnavailableError("backend down (test)")  # expected: retried
        raise ZeroDivisionError("a bug in maintenance")

    broker.maintain = maintain  # type: ignore[method-assign]
    deadline = time.monotonic() + 10
    while broker._failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(calls) == 2, "a retriable error is retried next interval, a bug stops the loop"
    with pytest.raises(InternalError, match="ZeroDivisionError"):
        broker.init_producer()
    assert any("a bug in maintenance" in r.getMessage() and r.exc_info for r in caplog.records)
    assert any("backend down (test)" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    broker.maintain = original  # type: ignore[method-assign]
    broker.close()


def test_a_corrupt_snapshot_is_ignored_and_the_partition_rebuilt_from_the_log() -> None:
    harness = memory_harness()
    broker = harness.open()
    s = broker.init_producer()
    for i in range(3):
        broker.produce("t", 0, s.producer_id, s.producer_epoch, i, [b"x"])
    broker.close()  # leaves a snapshot at position 3
    backend = MemoryBackend(harness.url)
    snapshot = backend.latest_snapshot("t", 0)
    assert snapshot is not None and snapshot.position == 3
    flipped = snapshot.data[:-6] + bytes([snapshot.data[-6] ^ 0x01]) + snapshot.data[-5:]
    backend.write_snapshot("t", 0, Snapshot(snapshot.position, snapshot.entries, snapshot.taken_at, flipped))
    again = harness.open()
    resend = again.produce("t", 0, s.producer_id, s.producer_epoch, 2, [b"x"])
    assert resend.outcome is Outcome.DUPLICATE and resend.base_offset == 2
    assert again.stats("t")[0].replayed_batches == 3  # the whole log, not the snapshot
    assert again.produce("t", 0, s.producer_id, s.producer_epoch, 3, [b"x"]).outcome is Outcome.ACCEPTED
    again.close()


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_producer_records_idle_past_the_retention_are_deleted(backend: str, tmp_path: Path) -> None:
    """Named producers of finished jobs (one per job and Spark partition) leave records that
    the maintenance sweep deletes once idle for longer than ``producer_record_retention``;
    within it, re-initialising a name continues its producer."""
    harness = memory_harness() if backend == "memory" else sqlite_harness(tmp_path)
    config = BrokerConfig(producer_record_retention=3600.0, maintenance_interval=0)
    broker = harness.open(config)
    try:
        broker.create_topic("t", 2)
        started = time.time()
        jobs = {}
        for job in range(3):
            for part in range(2):
                s = broker.init_producer(f"spark/job-{job}/{part}")
                assert broker.produce("t", part, s.producer_id, s.producer_epoch, 0, [b"x", b"y"]).outcome is (
                    Outcome.ACCEPTED
                )
                jobs[s.producer_name] = s
        assert len(broker.backend.load_producers()) == 6
        broker.maintain(now=started + 1800)  # within the retention: every record kept
        assert len(broker.backend.load_producers()) == 6
        rerun = broker.init_producer("spark/job-0/0")  # the same job again: same producer
        assert (rerun.producer_id, rerun.last_sequences[("t", 0)]) == (jobs["spark/job-0/0"].producer_id, 1)
        broker.maintain(now=time.time() + 3601)  # past it: every record deleted
        assert broker.backend.load_producers() == []
        assert broker.producer_record(rerun.producer_id) is None
        old = jobs["spark/job-1/1"]
        assert broker.produce("t", 1, old.producer_id, old.producer_epoch, 2, [b"z"]).outcome is (
            Outcome.UNKNOWN_PRODUCER
        )
    finally:
        broker.close()
    broker = harness.open(config)  # stays deleted across a restart
    try:
        assert broker.backend.load_producers() == []
        fresh = broker.init_producer("spark/job-1/1")  # a rerun after the retention: a new producer
        assert fresh.producer_id not in {s.producer_id for s in jobs.values()} and fresh.producer_epoch == 0
        assert fresh.last_sequences[("t", 1)] == -1
        assert [r.producer_name for r in broker.backend.load_producers()] == ["spark/job-1/1"]
    finally:
        broker.close()


@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
def test_delete_topic_removes_records_state_and_topic_settings(scheme: str, tmp_path: Path) -> None:
    url = "memory://" if scheme == "memory" else f"sqlite:///{tmp_path / 'log.db'}"
    broker = idempotent.connect(url, BrokerConfig(maintenance_interval=0))
    try:
        broker.create_topic("gone", 2)
        broker.create_topic("kept", 1)
        broker.set_policy("monotonic", topic="gone")
        session = broker.init_producer("p")
        assert broker.produce("gone", 1, session.producer_id, session.producer_epoch, 0, [b"a", b"b"]).base_offset == 0
        broker.produce("kept", 0, session.producer_id, session.producer_epoch, 0, [b"k"])
        broker.delete_topic("gone")
        assert broker.topics() == {"kept": 1}
        with pytest.raises(idempotent.InvalidTopicError, match="unknown topic 'gone'"):
            broker.delete_topic("gone")
        broker.create_topic("gone", 3)
        assert broker.end_offset("gone", 1) == 0 and broker.read("gone", 1) == []
        assert broker.policy_for("gone").value == "strict"  # the topic's setting went with it
        again = broker.init_producer("p")
        assert dict(again.last_sequences) == {("kept", 0): 0}  # nothing known of the old topic
        result = broker.produce("gone", 1, again.producer_id, again.producer_epoch, 0, [b"new"])
        assert (result.outcome, result.base_offset) == (idempotent.Outcome.ACCEPTED, 0)
        assert [r.value for r in broker.read("kept", 0)] == [b"k"]
    finally:
        broker.close()
    if scheme == "sqlite":  # and so it is stored
        with idempotent.connect(url) as reopened:
            assert reopened.topics() == {"kept": 1, "gone": 3}
            assert [r.value for r in reopened.read("gone", 1)] == [b"new"]


@pytest.mark.kafka
def test_a_producers_own_kafka_broker_deletes_topics_too(kafka_service: Any) -> None:
    import uuid

    from idempotent.broker.direct import DirectBroker

    topic = f"direct-gone-{uuid.uuid4().hex[:6]}"
    broker = DirectBroker(kafka_service.url)
    try:
        broker.create_topic(topic, 2)
        broker.set_policy("monotonic", topic=topic)
        assert topic in broker.topics()
        broker.delete_topic(topic)
        assert topic not in broker.topics()
        assert f"policy:topic:{topic}" not in broker.backend.load_settings()  # its setting went with it
        with pytest.raises(idempotent.InvalidTopicError, match="unknown topic"):
            broker.delete_topic(topic)
        broker.create_topic(topic, 3)  # the old partition count is gone with it
        assert broker.topics()[topic] == 3
    finally:
        broker.close()


def test_a_batch_appended_later_leaves_no_reference_cycle(tmp_path: Path) -> None:
    """An append the backend completes on its own thread (SQLite's writer) is freed by
    reference counting when it ends: no cycle per batch waits for the cyclic collector, which
    let a busy broker server's memory grow for minutes and spent its CPU walking the garbage."""
    import gc

    broker = idempotent.connect(f"sqlite:///{tmp_path}/cycles.db")
    s = broker.init_producer()
    broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"warm-up"])
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for sequence in range(1, 21):
            assert broker.produce("t", 0, s.producer_id, s.producer_epoch, sequence, [b"x"]).outcome is Outcome.ACCEPTED
        gc.collect()
        left = [
            type(o).__name__ for o in gc.garbage if isinstance(o, Future) or type(o).__module__.startswith("idempotent")
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        broker.close()
    assert left == []
