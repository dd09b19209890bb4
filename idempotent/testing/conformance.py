"""One conformance suite for every log backend (fsspec/trio style).

A backend opts in with a few lines::

    class TestSQLite(BackendConformance):
        @pytest.fixture
        def harness(self, tmp_path):
            return SQLiteHarness(tmp_path)

Every test below runs unchanged on memory, sqlite, kafka and pulsar: the checker's rules,
named-producer fencing and continuity, recovery after a crash of the process running the
checker (a real ``kill -9`` where the backend is durable), recovery after a restart of the
backend, and exactly-once delivery under injected request loss, acknowledgement loss and
duplication.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import pytest

from idempotent.broker.broker import Broker
from idempotent.core.checker import Policy
from idempotent.core.outcomes import Outcome
from idempotent.core.records import Record, RecordColumns
from idempotent.producer.producer import Producer

from ..errors import (
    AuthorizationError,
    ConfigError,
    InvalidBatchError,
    InvalidTopicError,
    NotOwnerError,
    ProducerError,
)
from .conformance_storage import StorageConformance
from .faults import FaultyBroker, LinkFaults
from .harness import Harness as Harness
from .harness import cluster_config as cluster_config
from .harness import small_config as small_config
from .harness import topic_name as topic_name

#: sequences at the edges of half the int32 ring, of the ring, and of int64
SEQUENCE_BOUNDARIES = (2**30 - 1, 2**30, 2**30 + 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1)


def produce_when_owner(broker: Broker, timeout: float, *args: Any) -> Any:
    """``broker.produce(*args)``, retried while another broker still owns the partition."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return broker.produce(*args)
        except NotOwnerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


#: the lease of the ownership tests on a networked backend: renewals are due at a third of it,
#: and a lease read plus a renewal are two round trips, which a loaded machine can stretch
#: past half a second (a 1 s lease then lapses under a live owner)
NETWORKED_LEASE = 4.0


def check_stale_owner_is_fenced(harness: Harness, lease: float = NETWORKED_LEASE) -> None:
    """A broker that stops renewing (a paused process) loses its partition to another one;
    afterwards it cannot write there, neither through the broker (its lease lapsed) nor
    straight to the backend (the new owner fenced its writer). Needs a backend that fences."""
    from ..backend import AppendBatch
    from ..errors import OwnershipLostError

    stale, fresh = harness.open(cluster_config("stale", lease)), harness.open(cluster_config("fresh", lease))
    try:
        topic = topic_name("stale")
        stale.create_topic(topic, 1)
        s = stale.init_producer()
        assert stale.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
        stale._stop.set()  # its heartbeat thread stops, as if the process were paused
        r = produce_when_owner(fresh, lease * 10, topic, 0, s.producer_id, s.producer_epoch, 1, [b"b"])
        assert r.outcome is Outcome.ACCEPTED
        with pytest.raises(NotOwnerError) as refused:
            stale.produce(topic, 0, s.producer_id, s.producer_epoch, 2, [b"stale"])
        assert refused.value.owner_id == "fresh"
        # below the lease: the old writer itself is fenced by the backend
        late = stale.backend.append(topic, 0, AppendBatch(None, [Record(b"late")], time.time()), None)
        with pytest.raises(OwnershipLostError):
            late.result(30)
        assert fresh.produce(topic, 0, s.producer_id, s.producer_epoch, 2, [b"c"]).outcome is Outcome.ACCEPTED
        assert [r.value for r in fresh.read(topic, 0, 0, 10)] == [b"a", b"b", b"c"]
    finally:
        stale.abandon()
        fresh.close()


def offset_of(value: int | None) -> int:
    """An offset that must be known (fails the test when it is None)."""
    assert value is not None, "expected an offset"
    return value


_CRASH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import idempotent
    from idempotent.testing.conformance import small_config
    url, topic, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    broker = idempotent.connect(url, small_config())
    session = broker.init_producer(name)
    print(json.dumps({"producer_id": session.producer_id}), flush=True)
    for i in range(count):
        r = broker.produce(topic, 0, session.producer_id, session.producer_epoch, i * 2,
                           [f"{i}-a".encode(), f"{i}-b".encode()])
        print(json.dumps({"batch": i, "offset": r.base_offset, "outcome": r.outcome.value}), flush=True)
    print("DONE", flush=True)
    import time
    time.sleep(600)
    """
)


class BackendConformance(StorageConformance):
    """The shared suite. Subclasses provide a ``harness`` fixture returning a :class:`Harness`.

    It runs the storage contract's own suite too (:class:`StorageConformance`: the log and the
    metadata halves, called directly), then everything below through brokers.
    """

    #: the lease of the brokers that move partitions between them: short, so that an expiry
    #: is quick to wait for; a networked backend's suite sets :data:`NETWORKED_LEASE`
    lease = 1.0

    # -- helpers ---------------------------------------------------------------------------

    @pytest.fixture
    def broker(self, harness: Harness) -> Any:
        b = harness.open(small_config())
        yield b
        b.close()

    @staticmethod
    def _topic(broker: Broker, partitions: int = 1, prefix: str = "t") -> str:
        name = topic_name(prefix)
        broker.create_topic(name, partitions)
        return name

    # -- checker rules ---------------------------------------------------------------------

    def test_accept_and_read_back(self, broker: Broker) -> None:
        topic = self._topic(broker)
        s = broker.init_producer()
        r1 = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a", Record(b"b", b"k", {"h": b"v"})])
        r2 = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 2, [b"c"])
        assert (r1.outcome, r2.outcome) == (Outcome.ACCEPTED, Outcome.ACCEPTED)
        assert r1.base_offset is not None and r2.base_offset is not None and r2.base_offset > r1.base_offset
        records = broker.read(topic, 0, r1.base_offset, 10)
        assert [(r.value, r.key, r.headers, r.sequence) for r in records] == [
            (b"a", None, (), 0),
            (b"b", b"k", (("h", b"v"),), 1),
            (b"c", None, (), 2),
        ]
        assert [r.offset for r in records] == [r1.base_offset, r1.base_offset + 1, r2.base_offset]
        assert {(r.producer_id, r.producer_epoch) for r in records} == {(s.producer_id, s.producer_epoch)}

    def test_duplicates_answer_original_offsets(self, broker: Broker) -> None:
        topic = self._topic(broker)
        s = broker.init_producer()
        offsets = [
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, i * 3, [b"x", b"y", b"z"]).base_offset
            for i in range(4)
        ]
        for i, offset in enumerate(offsets):
            dup = broker.produce(topic, 0, s.producer_id, s.producer_epoch, i * 3, [b"x", b"y", b"z"])
            assert dup.outcome is Outcome.DUPLICATE and dup.base_offset == offset
        part = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 4, [b"y"])
        assert part.outcome is Outcome.DUPLICATE and part.base_offset == offset_of(offsets[1]) + 1
        assert len(broker.read(topic, 0, 0, 100)) == 12

    def test_record_columns_are_stored_as_records(self, broker: Broker) -> None:
        """A batch given as columns (values and keys, some None) is stored and read back as
        the same records would be, next to a batch of Record objects."""
        topic = self._topic(broker)
        s = broker.init_producer()
        values: list[bytes | None] = [b"v%d" % i for i in range(7)] + [None]
        keys: list[bytes | None] = [b"k%d" % i if i % 3 else None for i in range(8)]
        columns = RecordColumns(values, keys)
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, columns).outcome is Outcome.ACCEPTED
        plain = [Record(b"p", b"pk", [("h", b"1")])]
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 8, plain).outcome is Outcome.ACCEPTED
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, columns).outcome is Outcome.DUPLICATE
        stored = broker.read(topic, 0, 0, 100)
        assert [(r.value, r.key, r.headers, r.sequence) for r in stored] == [
            *((v, k, (), i) for i, (v, k) in enumerate(zip(values, keys, strict=True))),
            (b"p", b"pk", (("h", b"1"),), 8),
        ]
        assert {r.producer_id for r in stored} == {s.producer_id}

    def test_gap_refused_with_expected_sequence(self, broker: Broker) -> None:
        topic = self._topic(broker)
        s = broker.init_producer()
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
        gap = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 5, [b"f"])
        assert gap.outcome is Outcome.OUT_OF_ORDER_SEQUENCE and gap.expected_sequence == 1 and gap.base_offset is None
        first = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 3, [b"d"])
        assert first.expected_sequence == 1
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
        assert [r.value for r in broker.read(topic, 0, 0, 10)] == [b"a", b"b"]

    def test_first_batch_must_start_at_zero(self, broker: Broker) -> None:
        topic = self._topic(broker)
        s = broker.init_producer()
        r = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 7, [b"a"])
        assert r.outcome is Outcome.OUT_OF_ORDER_SEQUENCE and r.expected_sequence == 0
        assert broker.read(topic, 0, 0, 10) == []

    def test_unknown_producer_id(self, broker: Broker) -> None:
        topic = self._topic(broker)
        assert broker.produce(topic, 0, 987654321, 0, 0, [b"a"]).outcome is Outcome.UNKNOWN_PRODUCER
        s = broker.init_producer()
        never_issued_epoch = broker.produce(topic, 0, s.producer_id, s.producer_epoch + 1, 0, [b"a"])
        assert never_issued_epoch.outcome is Outcome.UNKNOWN_PRODUCER
        assert broker.read(topic, 0, 0, 10) == []

    def test_malformed_batches_leave_state_unchanged(self, broker: Broker) -> None:
        topic = self._topic(broker)
        s = broker.init_producer()
        broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b", b"c"])
        before = broker.checker_state(topic, 0)
        bad: list[tuple[Any, ...]] = [
            (s.producer_id, s.producer_epoch, -1, [b"x"]),
            (s.producer_id, s.producer_epoch, 2**31, [b"x"]),  # beyond the strict int32 sequences
            (s.producer_id, s.producer_epoch, 2**63, [b"x"]),
            (s.producer_id, -1, 3, [b"x"]),
            (-5, 0, 3, [b"x"]),
            (s.producer_id, s.producer_epoch, 3, []),
            (s.producer_id, s.producer_epoch, 2, [b"x", b"y"]),  # straddles H = 2
            (s.producer_id, s.producer_epoch, 3, [123]),
            (s.producer_id, s.producer_epoch, 3, b"not-a-list"),
            (s.producer_id, s.producer_epoch, "3", [b"x"]),
        ]
        for producer_id, epoch, seq, records in bad:
            with pytest.raises(InvalidBatchError):
                broker.produce(topic, 0, producer_id, epoch, seq, records)
        with pytest.raises(InvalidTopicError):
            broker.produce(topic, 5, s.producer_id, s.producer_epoch, 3, [b"x"])
        with pytest.raises(InvalidTopicError):
            broker.produce("bad topic name!", 0, s.producer_id, s.producer_epoch, 3, [b"x"])
        assert broker.checker_state(topic, 0) == before
        assert len(broker.read(topic, 0, 0, 10)) == 3
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 3, [b"d"]).outcome is Outcome.ACCEPTED

    def test_sequence_wraps_to_zero(self, broker: Broker) -> None:
        topic = self._topic(broker)
        s = broker.init_producer()
        # Reach the top of the sequence space through the monotonic policy, then go strict.
        broker.set_policy("monotonic", topic=topic)
        assert (
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 2**31 - 3, [b"a", b"b"]).outcome
            is Outcome.ACCEPTED
        )
        broker.set_policy(None, topic=topic)
        wrap = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 2**31 - 1, [b"c", b"d", b"e"])
        assert wrap.outcome is Outcome.ACCEPTED
        assert [r.sequence for r in broker.read(topic, 0, 0, 10)] == [2**31 - 3, 2**31 - 2, 2**31 - 1, 0, 1]
        assert (
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 2**31 - 1, [b"c", b"d", b"e"]).base_offset
            == wrap.base_offset
        )
        nxt = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 3, [b"g"])
        assert nxt.outcome is Outcome.OUT_OF_ORDER_SEQUENCE and nxt.expected_sequence == 2

    def test_sequence_boundaries_under_both_policies(self, harness: Harness) -> None:
        """``strict`` refuses a jump of any size (int32 only); ``monotonic`` stores 64-bit
        sequences compared without wrap-around, and they survive snapshot + replay."""
        b1 = harness.open(small_config())
        strict, mono = self._topic(b1, prefix="strict"), self._topic(b1, prefix="mono")
        b1.set_policy(Policy.MONOTONIC, topic=mono)
        s = b1.init_producer(f"bounds-{uuid.uuid4().hex[:8]}")
        pid, epoch = s.producer_id, s.producer_epoch
        assert b1.produce(strict, 0, pid, epoch, 0, [b"s0"]).outcome is Outcome.ACCEPTED
        for seq in SEQUENCE_BOUNDARIES:
            if seq <= 2**31 - 1:
                r = b1.produce(strict, 0, pid, epoch, seq, [b"jump"])
                assert (r.outcome, r.expected_sequence) == (Outcome.OUT_OF_ORDER_SEQUENCE, 1), seq
            else:
                with pytest.raises(InvalidBatchError):
                    b1.produce(strict, 0, pid, epoch, seq, [b"jump"])
        offsets = {}
        for seq in (0, *SEQUENCE_BOUNDARIES):
            r = b1.produce(mono, 0, pid, epoch, seq, [f"m{seq}".encode()])
            assert r.outcome is Outcome.ACCEPTED, seq
            offsets[seq] = r.base_offset
        for seq, offset in offsets.items():
            assert b1.produce(mono, 0, pid, epoch, seq, [b"again"]).base_offset == offset
        with pytest.raises(InvalidBatchError):  # a monotonic batch may not wrap
            b1.produce(mono, 0, b1.init_producer().producer_id, 0, 2**31 - 2, [b"a", b"b", b"c"])
        before = b1.checker_state(mono, 0)
        b1.abandon()
        b2 = harness.open(small_config())
        try:
            assert b2.checker_state(mono, 0) == before
            assert b2.init_producer(s.producer_name).last_sequences[(mono, 0)] == 2**63 - 1
            epoch += 1
            for seq in (2**31 + 1, 2**62, 2**63 - 1):  # a hole and two stored ones
                assert b2.produce(mono, 0, pid, epoch, seq, [b"again"]).outcome is Outcome.DUPLICATE
            assert b2.produce(strict, 0, pid, epoch, 1, [b"s1"]).outcome is Outcome.ACCEPTED
            assert [r.sequence for r in b2.read(strict, 0, 0, 10)] == [0, 1]
            assert [(r.sequence, r.value) for r in b2.read(mono, 0, 0, 20)] == [
                (seq, f"m{seq}".encode()) for seq in (0, *SEQUENCE_BOUNDARIES)
            ]
        finally:
            b2.close()

    def test_monotonic_policy_allows_holes(self, broker: Broker) -> None:
        topic = self._topic(broker, prefix="mono")
        broker.set_policy(Policy.MONOTONIC, topic=topic)
        s = broker.init_producer()
        for seq in (10, 11, 50):
            assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, seq, [b"x"]).outcome is Outcome.ACCEPTED
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 11, [b"x"]).outcome is Outcome.DUPLICATE
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 30, [b"x"]).outcome is Outcome.DUPLICATE
        assert [r.sequence for r in broker.read(topic, 0, 0, 10)] == [10, 11, 50]
        with pytest.raises(ConfigError):
            broker.set_policy("lenient", topic=topic)

    def test_deduplication_switches(self, broker: Broker) -> None:
        ns = f"tenant-{uuid.uuid4().hex[:6]}/ns"
        topic_a, topic_b = f"{ns}/a", f"{ns}/b"
        broker.create_topic(topic_a)
        broker.create_topic(topic_b)
        s = broker.init_producer()
        broker.set_deduplication(False, namespace=ns)
        broker.set_deduplication(True, topic=topic_b)
        assert not broker.deduplication_enabled(topic_a) and broker.deduplication_enabled(topic_b)
        for topic in (topic_a, topic_b):
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"x"])
            again = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"x"])
            assert again.outcome is (Outcome.ACCEPTED if topic == topic_a else Outcome.DUPLICATE)
        assert len(broker.read(topic_a, 0, 0, 10)) == 2 and len(broker.read(topic_b, 0, 0, 10)) == 1
        broker.set_deduplication(None, namespace=ns)
        assert broker.deduplication_enabled(topic_a)
        assert broker.produce(topic_a, 0, s.producer_id, s.producer_epoch, 0, [b"x"]).outcome is Outcome.DUPLICATE
        assert broker.produce(topic_a, 0, s.producer_id, s.producer_epoch, 1, [b"y"]).outcome is Outcome.ACCEPTED

    def test_create_topic_is_idempotent(self, broker: Broker) -> None:
        name = topic_name()
        broker.create_topic(name, 3)
        broker.create_topic(name, 3)
        with pytest.raises(InvalidTopicError):
            broker.create_topic(name, 4)
        assert broker.partitions_for(name) == 3
        auto = topic_name("auto")
        s = broker.init_producer()
        assert broker.produce(auto, 0, s.producer_id, s.producer_epoch, 0, [b"x"]).outcome is Outcome.ACCEPTED
        assert broker.partitions_for(auto) == broker.config.default_partitions

    def test_a_topic_another_broker_created_keeps_its_partition_count(self, harness: Harness) -> None:
        """A broker opened before another broker created a topic looks the topic up in the
        backend before creating anything, and uses the partition count it has."""
        early = harness.open(small_config())
        try:
            name = topic_name("elsewhere")
            other = harness.open(small_config())
            try:
                other.create_topic(name, 4)
            finally:
                other.close()
            assert early.partitions_for(name) == 4
            s = early.init_producer()
            assert early.produce(name, 3, s.producer_id, s.producer_epoch, 0, [b"x"]).outcome is Outcome.ACCEPTED
            with pytest.raises(InvalidTopicError, match="exists with 4 partitions, not 2"):
                early.create_topic(name, 2)
            assert early.backend.describe_topic(name) == 4
            assert early.backend.describe_topic(topic_name("absent")) is None
            assert early.backend.create_topic(name, 1) == 4  # exists: kept as it is
        finally:
            early.close()

    # -- named producers -------------------------------------------------------------------

    def test_named_producer_fences_and_continues(self, broker: Broker) -> None:
        topic = self._topic(broker, 2)
        name = f"job-{uuid.uuid4().hex[:8]}"
        old = broker.init_producer(name)
        assert old.last_sequences[(topic, 0)] == -1
        broker.produce(topic, 0, old.producer_id, old.producer_epoch, 0, [b"a", b"b"])
        broker.produce(topic, 1, old.producer_id, old.producer_epoch, 0, [b"c"])
        new = broker.init_producer(name)
        assert new.producer_id == old.producer_id and new.producer_epoch == old.producer_epoch + 1
        assert dict(new.last_sequences) == {(topic, 0): 1, (topic, 1): 0}
        fenced = broker.produce(topic, 0, old.producer_id, old.producer_epoch, 2, [b"zombie"])
        assert fenced.outcome is Outcome.FENCED and fenced.producer_epoch == new.producer_epoch
        # the restarted producer's resend of data the old instance stored is a duplicate
        dup = broker.produce(topic, 0, new.producer_id, new.producer_epoch, 0, [b"a", b"b"])
        assert dup.outcome is Outcome.DUPLICATE and dup.base_offset is not None
        assert broker.produce(topic, 0, new.producer_id, new.producer_epoch, 2, [b"d"]).outcome is Outcome.ACCEPTED
        assert [r.value for r in broker.read(topic, 0, 0, 10)] == [b"a", b"b", b"d"]
        anon = [broker.init_producer() for _ in range(3)]
        assert len({a.producer_id for a in anon} | {new.producer_id}) == 4

    def test_producer_continuity_survives_broker_restart(self, harness: Harness) -> None:
        name = f"job-{uuid.uuid4().hex[:8]}"
        b1 = harness.open(small_config())
        topic = self._topic(b1)
        s1 = b1.init_producer(name)
        for i in range(5):
            b1.produce(topic, 0, s1.producer_id, s1.producer_epoch, i, [f"r{i}".encode()])
        anonymous = b1.init_producer()
        b1.close()
        b2 = harness.open(small_config())
        try:
            s2 = b2.init_producer(name)
            assert (s2.producer_id, s2.producer_epoch) == (s1.producer_id, s1.producer_epoch + 1)
            assert s2.last_sequences[(topic, 0)] == 4
            assert b2.produce(topic, 0, s2.producer_id, s2.producer_epoch, 3, [b"r3"]).outcome is Outcome.DUPLICATE
            assert b2.init_producer().producer_id not in (s1.producer_id, anonymous.producer_id)
            assert b2.produce(topic, 0, anonymous.producer_id, 0, 0, [b"anon"]).outcome is Outcome.ACCEPTED
        finally:
            b2.close()

    # -- several brokers: partition ownership ----------------------------------------------

    def _second_writer_is_refused(self, harness: Harness) -> None:
        """A single-writer backend (one process per database) refuses a second writing broker
        with a clear error, and the first one keeps serving."""
        first = harness.open(cluster_config("a", 1.0))
        try:
            topic = self._topic(first, 2, "own")
            s = first.init_producer()
            assert first.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a0"]).outcome is Outcome.ACCEPTED
            second = harness.open(cluster_config("b", 1.0))
            try:
                with pytest.raises(ProducerError, match="another process"):
                    second.produce(topic, 1, s.producer_id, s.producer_epoch, 0, [b"b0"])
            finally:
                second.close()
            assert first.produce(topic, 1, s.producer_id, s.producer_epoch, 0, [b"b0"]).outcome is Outcome.ACCEPTED
        finally:
            first.close()

    def test_partitions_move_between_brokers(self, harness: Harness) -> None:
        if not self.several_writers:
            self._second_writer_is_refused(harness)
            return
        lease = self.lease
        first = harness.open(cluster_config("a", lease))
        topic = self._topic(first, 2, "own")
        s = first.init_producer()
        pid, epoch = s.producer_id, s.producer_epoch
        r0 = first.produce(topic, 0, pid, epoch, 0, [b"a0"])
        assert r0.outcome is Outcome.ACCEPTED
        owner = first.owner_of(topic, 0)
        assert owner is not None and (owner.broker_id, owner.address) == ("a", "a.example:9092")
        assert first.owner_of(topic, 1) is None
        second = harness.open(cluster_config("b", lease))
        try:
            with pytest.raises(NotOwnerError) as refused:
                second.produce(topic, 0, pid, epoch, 1, [b"a1"])
            assert (refused.value.owner_id, refused.value.owner) == ("a", "a.example:9092")
            # a free partition: the second broker claims it (and learns the producer)
            assert second.produce(topic, 1, pid, epoch, 0, [b"b0"]).outcome is Outcome.ACCEPTED
            assert second.owned() == [(topic, 1)]
            with pytest.raises(NotOwnerError):
                first.produce(topic, 1, pid, epoch, 1, [b"b1"])
            time.sleep(lease * 1.5)  # a live owner keeps renewing: nothing moves
            with pytest.raises(NotOwnerError):
                second.produce(topic, 0, pid, epoch, 1, [b"a1"])
            first.abandon()  # a crash: the lease is not released, it has to expire
            r1 = produce_when_owner(second, lease * 10, topic, 0, pid, epoch, 1, [b"a1"])
            assert r1.outcome is Outcome.ACCEPTED
            again = second.produce(topic, 0, pid, epoch, 0, [b"a0"])  # the dead owner's batch
            assert (again.outcome, again.base_offset) == (Outcome.DUPLICATE, r0.base_offset)
            owner = second.owner_of(topic, 0)
            assert owner is not None and owner.broker_id == "b" and owner.epoch == 2
        finally:
            second.close()  # releases its leases: the next broker needs no wait
        third = harness.open(cluster_config("c", lease))
        try:
            assert third.produce(topic, 0, pid, epoch, 2, [b"a2"]).outcome is Outcome.ACCEPTED
            assert third.produce(topic, 1, pid, epoch, 1, [b"b1"]).outcome is Outcome.ACCEPTED
            assert [r.value for r in third.read(topic, 0, 0, 10)] == [b"a0", b"a1", b"a2"]
            assert [r.value for r in third.read(topic, 1, 0, 10)] == [b"b0", b"b1"]
        finally:
            third.close()

    def test_named_producer_continues_across_owners(self, harness: Harness) -> None:
        if not self.several_writers:
            self._second_writer_is_refused(harness)
            return
        name = f"spread-{uuid.uuid4().hex[:8]}"
        first, second = harness.open(cluster_config("a", 5.0)), harness.open(cluster_config("b", 5.0))
        try:
            topic = self._topic(first, 2, "own")
            s1 = first.init_producer(name)
            assert (
                first.produce(topic, 0, s1.producer_id, s1.producer_epoch, 0, [b"x", b"y"]).outcome is Outcome.ACCEPTED
            )
            assert second.produce(topic, 1, s1.producer_id, s1.producer_epoch, 0, [b"z"]).outcome is Outcome.ACCEPTED
            s2 = first.init_producer(name)  # partition 1 is the second broker's
            assert s2.last_sequences[(topic, 0)] == 1 and s2.elsewhere == ((topic, 1),)
            assert second.last_sequence(topic, 1, s2.producer_id, s2.producer_epoch) == 0
            fenced = second.produce(topic, 1, s1.producer_id, s1.producer_epoch, 1, [b"old"])
            assert fenced.outcome is Outcome.FENCED
            with pytest.raises(NotOwnerError):
                first.last_sequence(topic, 1, s2.producer_id, s2.producer_epoch)
            assert second.produce(topic, 1, s2.producer_id, s2.producer_epoch, 1, [b"new"]).outcome is Outcome.ACCEPTED
        finally:
            first.close()
            second.close()

    def test_producer_owners_survive_broker_restart(self, harness: Harness) -> None:
        """The principal owning a producer is stored with its record and kept by every epoch."""
        name = f"owned-{uuid.uuid4().hex[:8]}"
        b1 = harness.open(small_config())
        topic = self._topic(b1)
        owned = b1.init_producer(name, claim=lambda previous: "alice")
        anonymous = b1.init_producer(claim=lambda previous: "bob")
        unowned = b1.init_producer(f"{name}-legacy")
        b1.produce(topic, 0, owned.producer_id, owned.producer_epoch, 0, [b"a"])  # notes a partition
        b1.close()
        b2 = harness.open(small_config())
        try:
            assert (r := b2.producer_record(owned.producer_id)) is not None and r.principal == "alice"
            assert r.partitions == ((topic, 0),)
            assert (r := b2.producer_record(anonymous.producer_id)) is not None and r.principal == "bob"
            assert (r := b2.producer_record(unowned.producer_id)) is not None and r.principal is None
            seen: list[str | None] = []

            def refuse(previous: Any) -> str | None:
                seen.append(previous.principal)
                raise AuthorizationError("not yours")

            with pytest.raises(AuthorizationError):
                b2.init_producer(name, claim=refuse)
            assert seen == ["alice"]
            assert (r := b2.producer_record(owned.producer_id)) is not None and r.producer_epoch == owned.producer_epoch
            again = b2.init_producer(name)  # without a claim the owner stays
            assert again.producer_epoch == owned.producer_epoch + 1
        finally:
            b2.close()
        b3 = harness.open(small_config())
        try:
            assert (r := b3.producer_record(owned.producer_id)) is not None
            assert (r.producer_epoch, r.principal) == (owned.producer_epoch + 1, "alice")
        finally:
            b3.close()

    # -- state bounds ----------------------------------------------------------------------

    def test_evicted_producer_gets_unknown_producer(self, harness: Harness) -> None:
        broker = harness.open(small_config(max_producers=2))
        try:
            topic = self._topic(broker)
            sessions = [broker.init_producer() for _ in range(3)]
            for s in sessions:
                broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"x"])
            first = sessions[0]
            assert (
                broker.produce(topic, 0, first.producer_id, first.producer_epoch, 1, [b"y"]).outcome
                is Outcome.UNKNOWN_PRODUCER
            )
            assert (
                broker.produce(topic, 0, first.producer_id, first.producer_epoch, 0, [b"x"]).outcome
                is Outcome.UNKNOWN_PRODUCER
            )
            assert len(broker.read(topic, 0, 0, 10)) == 3
        finally:
            broker.close()

    def test_idle_producers_expire(self, harness: Harness) -> None:
        broker = harness.open(small_config(producer_expiry=60.0))
        try:
            topic = self._topic(broker)
            s = broker.init_producer("idle-" + uuid.uuid4().hex[:6])
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"x"])
            broker.maintain(now=time.time() + 3600)
            assert broker.checker_state(topic, 0) == {}
            assert (
                broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"y"]).outcome is Outcome.UNKNOWN_PRODUCER
            )
            assert not s.state_lost
            again = broker.init_producer(s.producer_name)
            assert again.last_sequences[(topic, 0)] == -1 and again.state_lost
            assert (
                broker.produce(topic, 0, again.producer_id, again.producer_epoch, 0, [b"z"]).outcome is Outcome.ACCEPTED
            )
        finally:
            broker.close()

    def test_eviction_survives_crash(self, harness: Harness) -> None:
        """An expired producer that restarts at 0 must not be shadowed by its old state on
        recovery (the eviction is snapshotted before the producer may start again)."""
        b1 = harness.open(small_config(producer_expiry=60.0))
        topic = self._topic(b1)
        name = "evicted-" + uuid.uuid4().hex[:6]
        s = b1.init_producer(name)
        for i in range(5):
            b1.produce(topic, 0, s.producer_id, s.producer_epoch, i, [f"old{i}".encode()])
        b1.maintain(now=time.time() + 3600)
        again = b1.init_producer(name)
        assert again.last_sequences[(topic, 0)] == -1
        for i in range(2):
            assert (
                b1.produce(topic, 0, again.producer_id, again.producer_epoch, i, [f"new{i}".encode()]).outcome
                is Outcome.ACCEPTED
            )
        b1.abandon()
        b2 = harness.open(small_config(producer_expiry=60.0))
        try:
            resumed = b2.init_producer(name)
            assert resumed.last_sequences[(topic, 0)] == 1
            assert (
                b2.produce(topic, 0, resumed.producer_id, resumed.producer_epoch, 2, [b"new2"]).outcome
                is Outcome.ACCEPTED
            )
            values = [r.value for r in b2.read(topic, 0, 0, 100)]
            assert values == [b"old0", b"old1", b"old2", b"old3", b"old4", b"new0", b"new1", b"new2"]
        finally:
            b2.close()

    # -- recovery --------------------------------------------------------------------------

    def _fill(self, broker: Broker, topic: str, producers: int = 3, batches: int = 7) -> None:
        sessions = [broker.init_producer(f"p{i}-{topic}") for i in range(producers)]
        for b in range(batches):
            for s in sessions:
                broker.produce(topic, 0, s.producer_id, s.producer_epoch, b * 2, [b"x", b"y"])

    def test_recovery_after_crash_rebuilds_exact_state(self, harness: Harness) -> None:
        b1 = harness.open(small_config())
        topic = self._topic(b1)
        self._fill(b1, topic)
        before = b1.checker_state(topic, 0)
        position = b1.stats(topic)[0].position
        b1.abandon()
        b2 = harness.open(small_config())
        try:
            assert b2.checker_state(topic, 0) == before
            stats = b2.stats(topic)[0]
            assert stats.position == position
            assert 0 < stats.replayed_batches < 21, "recovery must start from a snapshot, not the log start"
        finally:
            b2.close()

    def test_recovery_without_snapshot_replays_whole_log(self, harness: Harness) -> None:
        config = small_config(snapshot_entries=10_000)
        b1 = harness.open(config)
        topic = self._topic(b1)
        self._fill(b1, topic, producers=2, batches=4)
        before = b1.checker_state(topic, 0)
        b1.abandon()
        b2 = harness.open(config)
        try:
            assert b2.checker_state(topic, 0) == before
            assert b2.stats(topic)[0].replayed_batches == 8
        finally:
            b2.close()

    def test_recovery_replays_at_most_the_records_since_the_snapshot(self, harness: Harness) -> None:
        # few batches, many records: the record bound takes the snapshot, so that a takeover
        # reads a bounded tail of the log (Kafka and Pulsar keep one message per record)
        config = small_config(snapshot_entries=10_000, snapshot_records=10)
        b1 = harness.open(config)
        topic = self._topic(b1)
        s = b1.init_producer()
        for i in range(8):
            b1.produce(topic, 0, s.producer_id, s.producer_epoch, 4 * i, [f"r{4 * i + j}".encode() for j in range(4)])
        before = b1.checker_state(topic, 0)
        b1.abandon()
        b2 = harness.open(config)
        try:
            assert b2.checker_state(topic, 0) == before
            assert b2.stats(topic)[0].replayed_batches <= 3, "a snapshot is due after 10 records"
            resend = b2.produce(topic, 0, s.producer_id, s.producer_epoch, 28, [b"r28", b"r29", b"r30", b"r31"])
            assert resend.outcome is Outcome.DUPLICATE
            assert b2.produce(topic, 0, s.producer_id, s.producer_epoch, 32, [b"r32"]).outcome is Outcome.ACCEPTED
        finally:
            b2.close()

    def test_recovery_after_kill9_of_checker_process(self, harness: Harness, tmp_path: Any) -> None:
        setup = harness.open(small_config())
        topic = self._topic(setup)
        setup.close()
        name = f"crash-{uuid.uuid4().hex[:8]}"
        if not harness.durable:
            # an in-process store dies with its process: crash the broker object instead
            b1 = harness.open(small_config())
            s = b1.init_producer(name)
            acked: dict[int, int] = {
                i: offset_of(
                    b1.produce(
                        topic, 0, s.producer_id, s.producer_epoch, i * 2, [f"{i}-a".encode(), f"{i}-b".encode()]
                    ).base_offset
                )
                for i in range(10)
            }
            b1.abandon()
        else:
            acked = self._run_and_kill(harness.url, topic, name, tmp_path)
        assert acked, "the crashing process acknowledged nothing"
        b2 = harness.open(small_config())
        try:
            records = b2.read(topic, 0, 0, 10_000)
            values = [r.value for r in records]
            assert len(values) == len(set(values)), "duplicates in the log"
            for i, offset in acked.items():
                assert b2.read(topic, 0, offset, 1)[0].value == f"{i}-a".encode(), "acknowledged batch lost"
            s2 = b2.init_producer(name)
            last = s2.last_sequences[(topic, 0)]
            assert last == records[-1].sequence and last >= 2 * max(acked) + 1
            n = (last + 1) // 2
            resend = b2.produce(
                topic, 0, s2.producer_id, s2.producer_epoch, (n - 1) * 2, [f"{n - 1}-a".encode(), f"{n - 1}-b".encode()]
            )
            assert resend.outcome is Outcome.DUPLICATE
            assert b2.produce(topic, 0, s2.producer_id, s2.producer_epoch, n * 2, [b"next"]).outcome is Outcome.ACCEPTED
        finally:
            b2.close()

    @staticmethod
    def _run_and_kill(url: str, topic: str, name: str, tmp_path: Any) -> dict[int, int]:
        script = tmp_path / "crash_producer.py"
        script.write_text(_CRASH_SCRIPT)
        proc = subprocess.Popen(
            [sys.executable, str(script), url, topic, name, "40"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        acked: dict[int, int] = {}
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 120
            for line in proc.stdout:
                if line.startswith("{") and "batch" in line:
                    event = json.loads(line)
                    acked[event["batch"]] = event["offset"]
                    if len(acked) >= 25:
                        break
                if time.monotonic() > deadline:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        return acked

    def test_recovery_after_backend_restart(self, harness: Harness) -> None:
        b1 = harness.open(small_config())
        topic = self._topic(b1)
        self._fill(b1, topic, producers=2, batches=5)
        before = b1.checker_state(topic, 0)
        b1.close()
        harness.restart_backend()
        b2 = harness.open(small_config())
        try:
            assert b2.checker_state(topic, 0) == before
            sessions = [b2.init_producer(f"p{i}-{topic}") for i in range(2)]
            for s in sessions:
                assert s.last_sequences[(topic, 0)] == 9
                assert (
                    b2.produce(topic, 0, s.producer_id, s.producer_epoch, 8, [b"x", b"y"]).outcome is Outcome.DUPLICATE
                )
                assert b2.produce(topic, 0, s.producer_id, s.producer_epoch, 10, [b"z"]).outcome is Outcome.ACCEPTED
        finally:
            b2.close()

    # -- the producer over a lossy link ----------------------------------------------------

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_exactly_once_under_injected_faults(self, harness: Harness, seed: int) -> None:
        faults = LinkFaults(drop_request=0.15, drop_response=0.15, duplicate=0.15, seed=seed)
        broker = harness.open(small_config(), faults)
        try:
            topic = self._topic(broker, 2)
            count = 400
            with Producer(
                broker, f"lossy-{topic}", linger_ms=1, max_batch_records=7, max_in_flight=5, request_timeout_ms=2000
            ) as producer:
                futures = [producer.send(topic, f"m{i}".encode(), partition=i % 2) for i in range(count)]
                assert producer.flush(120) == 0
                metadata = [f.result() for f in futures]
            injected = faults.injected if isinstance(broker, FaultyBroker) else {}
            assert sum(injected.values()) > 10, f"faults were not injected: {injected}"
            for p in (0, 1):
                log = broker.read(topic, p, 0, 10_000)
                expected = [f"m{i}".encode() for i in range(p, count, 2)]
                assert [r.value for r in log] == expected, "log must hold every message once, in send order"
                assert [r.sequence for r in log] == list(range(len(expected)))
            for i, meta in enumerate(metadata):
                assert broker.read(topic, meta.partition, offset_of(meta.offset), 1)[0].value == f"m{i}".encode()
        finally:
            broker.close()
