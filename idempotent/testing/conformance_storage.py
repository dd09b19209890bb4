"""The storage contract's own conformance suite: both halves of every backend, called directly.

:class:`StorageConformance` runs on memory, SQLite, Kafka and Pulsar as part of
:class:`~idempotent.testing.conformance.BackendConformance` (a backend opts in once, with its
harness). The log half (:class:`~idempotent.backend.PartitionLog`): appends keep their order
and consecutive offsets, reads and replays give them back, the newest snapshot wins, topics
are created, adopted and described, a released partition is written again. The metadata half
(:class:`~idempotent.backend.MetadataStore`): id blocks never overlap, producer records fold
with the merge rule (a stale copy never undoes a newer epoch) and are deleted for good,
settings are shared and deleted, lease proposals are a compare-and-set, the writer claim is a
bool, topic records are listed. Brokers over the same store stand for other processes.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs

from idempotent.core.checker import PartitionChecker
from idempotent.core.outcomes import Outcome
from idempotent.core.ownership import Lease
from idempotent.core.records import BatchHeader, Record, Snapshot
from idempotent.core.registry import ProducerRecord
from idempotent.core.types import Epoch, ProducerId, Sequence

from ..backend import AppendBatch, MetadataStore, PartitionLog
from .harness import Harness, cluster_config, small_config, topic_name


def _halves(broker: Any) -> tuple[PartitionLog, MetadataStore]:
    """The two halves of a broker's backend (one object: a LogBackend)."""
    return broker.backend, broker.backend


class StorageConformance:
    """Both halves of the storage contract. Subclasses provide a ``harness`` fixture."""

    #: False for a backend where only one process may write at a time (SQLite): the tests
    #: of several brokers writing at once are skipped there
    several_writers = True

    # -- the log half ------------------------------------------------------------------------

    def test_log_appends_keep_their_order_and_offsets(self, harness: Harness) -> None:
        broker = harness.open(small_config())
        try:
            log, meta = _halves(broker)
            topic = topic_name("log")
            assert log.create_topic(topic, 1) == 1
            meta.claim_writer()  # (what the broker does before a write)
            producer_id = ProducerId(meta.allocate_producer_ids(1))
            first_header = BatchHeader(producer_id, Epoch(0), Sequence(0), 2)
            second_header = BatchHeader(producer_id, Epoch(0), Sequence(2), 1)
            records = [Record(b"a"), Record(b"b", b"k")]
            first = log.append(topic, 0, AppendBatch(first_header, records, 1000.5), None)
            with_header = [Record(b"c", None, (("h", b"v"),))]
            second = log.append(topic, 0, AppendBatch(second_header, with_header, 1001.0), None)
            a, c = first.result(60), second.result(60)
            assert c >= a + 2
            stored = log.read(topic, 0, a, 10)
            assert [(r.offset, r.value, r.key, r.headers) for r in stored] == [
                (a, b"a", None, ()),
                (a + 1, b"b", b"k", ()),
                (c, b"c", None, (("h", b"v"),)),
            ]
            identities = [(r.producer_id, r.producer_epoch, r.sequence) for r in stored]
            assert identities == [(producer_id, 0, 0), (producer_id, 0, 1), (producer_id, 0, 2)]
            batches = list(log.replay(topic, 0, a))
            assert [(b.base_offset, b.producer_id, b.base_sequence, b.record_count) for b in batches] == [
                (a, producer_id, 0, 2),
                (c, producer_id, 2, 1),
            ]
            assert [b.base_offset for b in log.replay(topic, 0, c)] == [c]
            assert log.end_offset(topic, 0) > c
        finally:
            broker.close()

    def test_the_newest_snapshot_is_read_back(self, harness: Harness) -> None:
        broker = harness.open(small_config())
        try:
            log, meta = _halves(broker)
            topic = topic_name("snap")
            log.create_topic(topic, 2)
            meta.claim_writer()
            assert log.latest_snapshot(topic, 0) is None
            older, newer = Snapshot(0, 1, 1000.0, b"older"), Snapshot(0, 2, 1001.0, b"newer")
            log.write_snapshot(topic, 0, older)
            log.write_snapshot(topic, 0, newer)
            assert log.latest_snapshot(topic, 0) == newer
            assert log.latest_snapshot(topic, 1) is None  # per partition
        finally:
            broker.close()

    def test_snapshots_take_effect_in_the_order_handed_over(self, harness: Harness) -> None:
        """The snapshot-order rule of ``LogBackend.write_snapshot``: a snapshot written while
        appends are still waiting to be stored, the last of them carrying an older snapshot at
        the same position (as an eviction's snapshot written during a pipelined append), is
        the one a recovery starts from, whenever the older one is stored."""
        broker = harness.open(small_config())
        topic = topic_name()
        broker.create_topic(topic, 1)
        backend = broker.backend
        data = PartitionChecker().snapshot(0.0).data
        older, newer = Snapshot(1000, 1, 1000.0, data), Snapshot(1000, 2, 2000.0, data)
        now = time.time()
        appended = [backend.append(topic, 0, AppendBatch(None, [Record(b"x")], now), None) for _ in range(20)]
        appended.append(backend.append(topic, 0, AppendBatch(None, [Record(b"y")], now), older))
        try:
            backend.write_snapshot(topic, 0, newer)
            for future in appended:
                future.result(60)
            assert backend.latest_snapshot(topic, 0) == newer
        finally:
            broker.close()
        reopened = harness.open(small_config())
        try:
            assert reopened.backend.latest_snapshot(topic, 0) == newer
        finally:
            reopened.close()

    def test_topics_are_created_described_and_recorded(self, harness: Harness) -> None:
        one, other = harness.open(small_config()), harness.open(small_config())
        try:
            log, meta = _halves(one)
            topic = topic_name("topics")
            assert log.describe_topic(topic) is None
            assert topic not in meta.list_topics()
            assert log.create_topic(topic, 2) == 2
            assert log.create_topic(topic, 3) == 2  # exists: keeps its count; the caller compares
            assert log.describe_topic(topic) == 2
            assert meta.list_topics()[topic] == 2
            assert _halves(other)[1].list_topics()[topic] == 2  # the records are shared
        finally:
            one.close()
            other.close()

    def test_a_released_partition_is_written_again(self, harness: Harness) -> None:
        broker = harness.open(small_config())
        try:
            log, meta = _halves(broker)
            topic = topic_name("release")
            log.create_topic(topic, 1)
            meta.claim_writer()
            first = log.append(topic, 0, AppendBatch(None, [Record(b"a")], 1000.0), None).result(60)
            log.release(topic, 0)
            log.release(topic, 0)  # nothing to release: harmless
            second = log.append(topic, 0, AppendBatch(None, [Record(b"b")], 1000.0), None).result(60)
            assert second > first
            assert [r.value for r in log.read(topic, 0, first, 10)] == [b"a", b"b"]
        finally:
            broker.close()

    # -- the metadata half -------------------------------------------------------------------

    def test_id_blocks_never_overlap(self, harness: Harness) -> None:
        one = harness.open(small_config())
        other = harness.open(small_config()) if self.several_writers else one
        try:
            blocks = [
                (_halves(one)[1].allocate_producer_ids(10), 10),
                (_halves(other)[1].allocate_producer_ids(7), 7),
                (_halves(one)[1].allocate_producer_ids(3), 3),
            ]
            ids = [i for start, size in blocks for i in range(start, start + size)]
            assert len(set(ids)) == len(ids) == 20
        finally:
            one.close()
            if other is not one:
                other.close()

    def test_settings_are_shared_and_deleted(self, harness: Harness) -> None:
        key = f"conformance:{uuid.uuid4().hex[:8]}"
        one = harness.open(small_config())
        try:
            meta = _halves(one)[1]
            meta.save_setting(key, "1")
            meta.save_setting(key, "0")
            assert meta.load_settings()[key] == "0"
        finally:
            one.close()
        again = harness.open(small_config())  # a later broker (process) over the same store
        try:
            meta = _halves(again)[1]
            assert meta.load_settings()[key] == "0"
            meta.save_setting(key, None)
            assert key not in meta.load_settings()
        finally:
            again.close()

    def test_the_writer_claim_is_a_bool_and_answers_true_at_most_once(self, harness: Harness) -> None:
        broker = harness.open(small_config())
        try:
            meta = _halves(broker)[1]
            assert isinstance(meta.claim_writer(), bool)
            assert meta.claim_writer() is False  # nobody else wrote since
        finally:
            broker.close()

    def test_producer_records_of_a_renamed_id_are_replaced(self, harness: Harness) -> None:
        """A name that moves to a fresh id (past the largest epoch) keeps one record: the
        new id's."""
        broker = harness.open(small_config())
        try:
            meta = _halves(broker)[1]
            start = ProducerId(meta.allocate_producer_ids(2))
            name = f"renamed-{uuid.uuid4().hex[:8]}"
            meta.save_producer(ProducerRecord(start, Epoch(7), name))
            meta.save_producer(ProducerRecord(ProducerId(start + 1), Epoch(0), name))
            mine = [r for r in meta.load_producers() if r.producer_name == name]
            assert mine == [ProducerRecord(ProducerId(start + 1), Epoch(0), name)]
        finally:
            broker.close()

    def test_lease_records_compare_and_set(self, harness: Harness) -> None:
        one, other = harness.open(small_config()), harness.open(small_config())
        try:
            topic = topic_name("lease")
            one.create_topic(topic, 2)
            now = time.time()

            def lease(broker_id: str, epoch: int, partition: int = 0, released: bool = False) -> Lease:
                return Lease(topic, partition, broker_id, f"{broker_id}:1", epoch, now, 5.0, released)

            a1, b1 = lease("a", 1), lease("b", 1)
            assert one.backend.propose_leases([a1]) == [a1]
            assert other.backend.propose_leases([b1]) == [a1]  # same epoch: the first one stays
            renewed = attrs.evolve(a1, renewed_at=a1.renewed_at + 1)
            assert one.backend.propose_leases([renewed, lease("a", 1, 1)]) == [renewed, lease("a", 1, 1)]
            assert other.backend.propose_leases([lease("b", 0)]) == [renewed]  # an older epoch
            mine = {(x.topic, x.partition): x for x in other.backend.load_leases() if x.topic == topic}
            assert mine == {(topic, 0): renewed, (topic, 1): lease("a", 1, 1)}
            b2 = lease("b", 2)
            assert other.backend.propose_leases([b2]) == [b2]  # a takeover
            assert one.backend.propose_leases([renewed]) == [b2]  # the old owner cannot renew
            released = lease("b", 2, released=True)
            assert other.backend.propose_leases([released]) == [released]
            assert other.backend.propose_leases([b2]) == [released]  # no renewal after a release
            assert one.backend.propose_leases([lease("a", 3)]) == [lease("a", 3)]
        finally:
            one.close()
            other.close()

    def test_stale_producer_record_does_not_undo_newer_epoch(self, harness: Harness) -> None:
        """Brokers store their own copies of a producer record; a copy at an older epoch must
        not replace the stored newer one (else the real producer would be unknown and the
        fenced instance admitted again)."""
        broker = harness.open(small_config())
        try:
            pid = ProducerId(broker.backend.allocate_producer_ids(1))
            name = f"stale-{uuid.uuid4().hex[:8]}"
            broker.backend.save_producer(ProducerRecord(pid, Epoch(1), name, False, (("t", 0),), "alice"))
            broker.backend.save_producer(ProducerRecord(pid, Epoch(0), name, False, (("t", 0), ("t", 1)), "alice"))
            stored = [r for r in broker.backend.load_producers() if r.producer_id == pid]
            assert stored == [ProducerRecord(pid, Epoch(1), name, False, (("t", 0),), "alice")]
        finally:
            broker.close()
        if not self.several_writers:
            return
        a, b = harness.open(cluster_config("a", 60.0)), harness.open(cluster_config("b", 60.0))
        c = None
        try:
            topic = topic_name("stale")
            a.create_topic(topic, 3)
            s0 = a.init_producer(name)
            assert a.produce(topic, 0, s0.producer_id, s0.producer_epoch, 0, [b"x"]).outcome is Outcome.ACCEPTED
            s1 = b.init_producer(name)
            assert (s1.producer_id, s1.producer_epoch) == (s0.producer_id, s0.producer_epoch + 1)
            # the older instance writes through a broker that has not seen the new epoch yet:
            # that broker stores its own, older copy of the record
            a.produce(topic, 1, s0.producer_id, s0.producer_epoch, 0, [b"zombie"])
            c = harness.open(cluster_config("c", 60.0))
            assert c.produce(topic, 2, s1.producer_id, s1.producer_epoch, 0, [b"new"]).outcome is Outcome.ACCEPTED
            assert c.produce(topic, 2, s0.producer_id, s0.producer_epoch, 1, [b"z2"]).outcome is Outcome.FENCED
        finally:
            for opened in (a, b, c):
                if opened is not None:
                    opened.close()

    def test_producer_records_keep_last_used_and_can_be_deleted(self, harness: Harness) -> None:
        """The store keeps a record's ``last_used`` (the latest one wins at one epoch) and
        deletes expired records for good, also across a restart of the broker."""
        name = f"expiring-{uuid.uuid4().hex[:8]}"
        broker = harness.open(small_config())
        try:
            pid = ProducerId(broker.backend.allocate_producer_ids(2))
            kept = ProducerRecord(ProducerId(pid + 1), Epoch(0), name + "-kept", last_used=2000.0)
            broker.backend.save_producer(ProducerRecord(pid, Epoch(4), name, last_used=1000.0))
            broker.backend.save_producer(ProducerRecord(pid, Epoch(4), name, last_used=1500.0))
            broker.backend.save_producer(ProducerRecord(pid, Epoch(4), name, last_used=1200.0))
            broker.backend.save_producer(kept)
            stored = {r.producer_id: r for r in broker.backend.load_producers()}
            assert stored[pid] == ProducerRecord(pid, Epoch(4), name, last_used=1500.0)
            broker.backend.delete_producers([pid, ProducerId(pid + 2)])  # an unknown id is ignored
            stored = {r.producer_id: r for r in broker.backend.load_producers()}
            assert pid not in stored and stored[kept.producer_id] == kept
        finally:
            broker.close()
        if not harness.durable:
            return
        again = harness.open(small_config())
        try:
            stored = {r.producer_id: r for r in again.backend.load_producers()}
            assert pid not in stored and stored[kept.producer_id] == kept
        finally:
            again.close()

    def test_partitions_noted_by_two_brokers_are_united(self, harness: Harness) -> None:
        """Two brokers each note a partition of one producer at the same epoch: both stay noted,
        so re-initialising the producer looks at both."""
        broker = harness.open(small_config())
        try:
            pid = ProducerId(broker.backend.allocate_producer_ids(1))
            name = f"parts-{uuid.uuid4().hex[:8]}"
            broker.backend.save_producer(ProducerRecord(pid, Epoch(2), name, False, (("t", 1),), "alice"))
            broker.backend.save_producer(ProducerRecord(pid, Epoch(2), name, True, (("t", 0),), "bob"))
            broker.backend.save_producer(ProducerRecord(pid, Epoch(2), name, False, (), "bob"))
            stored = [r for r in broker.backend.load_producers() if r.producer_id == pid]
            assert stored == [ProducerRecord(pid, Epoch(2), name, True, (("t", 0), ("t", 1)), "alice")]
        finally:
            broker.close()
        if not self.several_writers:
            return
        a, b = harness.open(cluster_config("a", 60.0)), harness.open(cluster_config("b", 60.0))
        c = None
        try:
            topic = topic_name("parts")
            a.create_topic(topic, 2)
            s = a.init_producer(name)
            assert b.produce(topic, 1, s.producer_id, s.producer_epoch, 0, [b"b0", b"b1"]).outcome is Outcome.ACCEPTED
            assert a.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a0"]).outcome is Outcome.ACCEPTED
            c = harness.open(cluster_config("c", 60.0))
            again = c.init_producer(name)
            assert set(again.elsewhere) == {(topic, 0), (topic, 1)}
        finally:
            for opened in (a, b, c):
                if opened is not None:
                    opened.close()
