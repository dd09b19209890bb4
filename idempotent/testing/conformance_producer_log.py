"""One conformance suite for every :class:`~idempotent.backend.ProducerLog` (a producer's own
writer, driven by :class:`~idempotent.broker.direct.DirectBroker`).

A log opts in with a harness::

    class TestMemoryProducerLog(ProducerLogConformance):
        @pytest.fixture
        def harness(self):
            return MemoryProducerLogHarness()

Every test runs unchanged on the in-memory log (CPU only), Kafka and Pulsar: a named
producer's state recovered at its restart (resends answered as duplicates with their original
offsets), fencing of an older instance, producers sharing a partition, and groups written
whole. The fault tests (lost acknowledgements, failed writes, in-doubt commits, a crash that
keeps a prefix, lost or stale states) are in :class:`ProducerLogFaultConformance`, for a
harness whose ``faults`` inject them; the placement of a group written at once is in
:class:`GroupWriteConformance`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from idempotent.backend import AppendBatch
from idempotent.broker.config import BrokerConfig
from idempotent.broker.direct import DirectBroker
from idempotent.core.outcomes import Outcome
from idempotent.core.request import ProduceRequest
from idempotent.errors import BackendUnavailableError, ProducerFencedError, ProducerStateLostError


class ProducerLogHarness:
    """How the suite reaches one log: override :meth:`open_broker` (and :meth:`faults` for a
    log with fault injection)."""

    #: whether a newer instance's opening waits for the older one to let go of its
    #: partitions (Pulsar: a producer name is held per topic until its connection closes),
    #: rather than fencing it at once (Kafka, memory)
    open_waits_for_older = False
    #: whether a partition's offsets count records from 0 (Kafka, memory), so a batch's base
    #: offset can be told in advance; else (Pulsar) only read back
    dense_offsets = True

    def open_broker(self, config: BrokerConfig | None = None) -> DirectBroker:
        """A fresh :class:`DirectBroker` over the harness's store (every call the same store)."""
        raise NotImplementedError

    def faults(self, broker: DirectBroker) -> Any:
        """The fault switches of ``broker``'s log (``ProducerLogFaults``), or None."""
        return None

    def close(self) -> None:
        """Release what the harness opened."""


def _topic(h: ProducerLogHarness, partitions: int = 1) -> str:
    name = f"plog-{uuid.uuid4().hex[:10]}"
    broker = h.open_broker()
    try:
        broker.create_topic(name, partitions)
    finally:
        broker.close()
    return name


def _read_all(h: ProducerLogHarness, topic: str, partition: int = 0) -> list[Any]:
    broker = h.open_broker()
    try:
        out: list[Any] = []
        while True:
            chunk = broker.read(topic, partition, len(out) and out[-1].offset + 1, 5000)
            if not chunk:
                return out
            out.extend(chunk)
    finally:
        broker.close()


def _values(base: int, count: int) -> list[bytes]:
    return [b"%d" % j for j in range(base, base + count)]


class ProducerLogConformance:
    """The suite; a subclass provides the ``harness`` fixture."""

    @pytest.fixture
    def harness(self) -> Any:
        raise NotImplementedError("a subclass provides the harness fixture")

    @pytest.fixture
    def h(self, harness: ProducerLogHarness) -> Any:
        yield harness
        harness.close()

    # -- recovery and duplicates -------------------------------------------------------------

    def test_a_restarted_named_producer_answers_resends_with_their_original_offsets(self, h: Any) -> None:
        topic = _topic(h)
        name = f"named-{uuid.uuid4().hex[:6]}"
        first = h.open_broker()
        session = first.init_producer(name)
        stored = [
            first.produce(topic, 0, session.producer_id, session.producer_epoch, 5 * i, _values(5 * i, 5))
            for i in range(3)
        ]
        assert [r.outcome for r in stored] == [Outcome.ACCEPTED] * 3
        first.close()  # as if killed after the commits: the state went with them

        again = h.open_broker()
        restarted = again.init_producer(name)
        assert restarted.producer_id == session.producer_id and restarted.producer_epoch > session.producer_epoch
        assert again.last_sequence(topic, 0) == 14
        for i in range(3):  # every stored batch sent again by the new instance
            resend = again.produce(topic, 0, restarted.producer_id, restarted.producer_epoch, 5 * i, _values(5 * i, 5))
            assert resend.outcome is Outcome.DUPLICATE and resend.base_offset == stored[i].base_offset
        nxt = again.produce(topic, 0, restarted.producer_id, restarted.producer_epoch, 15, [b"15"])
        assert nxt.outcome is Outcome.ACCEPTED
        again.close()
        assert [m.value for m in _read_all(h, topic)] == _values(0, 16)

    def test_an_older_instance_is_fenced_at_its_next_write(self, h: Any) -> None:
        topic = _topic(h)
        name = f"zombie-{uuid.uuid4().hex[:6]}"
        old = h.open_broker()
        s_old = old.init_producer(name)
        assert old.produce(topic, 0, s_old.producer_id, s_old.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
        new = h.open_broker()
        landed: list[bytes] = []
        if not h.open_waits_for_older:
            s_new = new.init_producer(name)
            began = time.monotonic()
            with pytest.raises(ProducerFencedError):
                old.produce(topic, 0, s_old.producer_id, s_old.producer_epoch, 1, [b"zombie"])
            assert time.monotonic() - began < 30  # at once, not after a delivery timeout
            sequence = 1
        else:
            # the newer instance fences the older's state first and waits for the older to let
            # go of its partitions, which it does at its next write (at most the write under
            # way lands, and the newer reads it)
            opened: list[Any] = []
            thread = threading.Thread(target=lambda: opened.append(new.init_producer(name)))
            thread.start()
            sequence = 1
            with pytest.raises(ProducerFencedError):
                for _ in range(300):
                    began = time.monotonic()
                    try:
                        old.produce(topic, 0, s_old.producer_id, s_old.producer_epoch, sequence, [b"x%d" % sequence])
                    except BackendUnavailableError:  # retriable: sent again, as a producer would
                        pass
                    else:
                        sequence += 1
                    assert time.monotonic() - began < 30
                    thread.join(0.1)
            thread.join(120)
            assert opened, "the newer instance did not get the partition"
            s_new = opened[0]
            # everything the older stored is known to the newer, each record once and in order
            # (a write answered retriable may have landed: the newer's state says)
            sequence = new.last_sequence(topic, 0) + 1
            assert sequence >= 1
            landed = [b"x%d" % i for i in range(1, sequence)]
        assert (
            new.produce(topic, 0, s_new.producer_id, s_new.producer_epoch, sequence, [b"b"]).outcome is Outcome.ACCEPTED
        )
        old.close()
        new.close()
        assert [m.value for m in _read_all(h, topic)] == [b"a", *landed, b"b"]

    def test_producers_writing_one_partition_at_once_each_store_whole_batches_once(self, h: Any) -> None:
        """Three producers (one named) write one partition concurrently: no fencing between
        them, every record once, and every batch read back whole with its producer's identity."""
        topic = _topic(h)
        results: dict[int, list[Any]] = {}

        def write(index: int) -> None:
            broker = h.open_broker()
            session = broker.init_producer(f"writer-{uuid.uuid4().hex[:6]}" if index == 0 else None)
            out = []
            for b in range(20):
                values = [b"%d-%d-%d" % (index, b, i) for i in range(50)]
                out.append(broker.produce(topic, 0, session.producer_id, session.producer_epoch, 50 * b, values))
            results[index] = [session.producer_id, out]
            broker.close()

        threads = [threading.Thread(target=write, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert sorted(results) == [0, 1, 2]
        assert all(r.outcome is Outcome.ACCEPTED for _, out in results.values() for r in out)
        stored = _read_all(h, topic)
        assert len(stored) == 3 * 20 * 50 and all(n == 1 for n in Counter(m.value for m in stored).values())
        by_offset = {m.offset: m for m in stored}
        for producer_id, out in results.values():
            for b, result in enumerate(out):  # the batch's records are consecutive, with its identity
                batch = [by_offset[result.base_offset + i] for i in range(50)]
                assert [(m.producer_id, m.sequence) for m in batch] == [(producer_id, 50 * b + i) for i in range(50)]

    # -- groups --------------------------------------------------------------------------------

    def test_a_group_with_several_batches_of_a_partition_is_written_whole_and_restarts_from_all_of_them(
        self, h: Any
    ) -> None:
        """A group may hold several batches of a partition: all are stored whole and in order,
        and the named producer's stored state covers every one of them, so a restart answers a
        resend of any as a duplicate."""
        topic = _topic(h, partitions=2)
        name = f"rounds-{uuid.uuid4().hex[:6]}"
        first = h.open_broker()
        session = first.init_producer(name)
        assert session.max_in_flight is not None and session.max_in_flight >= 3
        pid, epoch = session.producer_id, session.producer_epoch

        def batch(partition: int, base: int, count: int) -> ProduceRequest:
            values = [b"%d-%d" % (partition, j) for j in range(base, base + count)]
            return ProduceRequest.build(topic, partition, pid, epoch, base, values)

        group = [batch(0, 0, 4), batch(1, 0, 2), batch(0, 4, 3), batch(0, 7, 5), batch(1, 2, 1)]
        answers = [future.result(30) for future in first.submit_requests(group)]
        assert [a.outcome for a in answers] == [Outcome.ACCEPTED] * 5
        if h.dense_offsets:
            assert [a.base_offset for a in answers] == [0, 0, 4, 7, 2]
        first.close()

        assert [m.value for m in _read_all(h, topic, 0)] == [b"0-%d" % j for j in range(12)]
        assert [m.value for m in _read_all(h, topic, 1)] == [b"1-%d" % j for j in range(3)]
        by_offset = {(p, m.offset): m.value for p in (0, 1) for m in _read_all(h, topic, p)}
        for request, answer in zip(group, answers, strict=True):  # each base offset is its first record's
            assert by_offset[(request.partition, answer.base_offset)] == request.records[0].value
        again = h.open_broker()
        restarted = again.init_producer(name)
        assert again.last_sequence(topic, 0) == 11 and again.last_sequence(topic, 1) == 2
        for request, answer in zip(group, answers, strict=True):
            resend = again.produce(
                topic,
                request.partition,
                restarted.producer_id,
                restarted.producer_epoch,
                request.header.base_sequence,
                [r.value for r in request.records],
            )
            assert resend.outcome is Outcome.DUPLICATE and resend.base_offset == answer.base_offset
        again.close()


class GroupWriteConformance:
    """The placement of a group written at once through ``write``, for the logs written that
    way (memory, Kafka; Pulsar's pipelined log is written through ``submit``). Mixed into a
    :class:`ProducerLogConformance` subclass."""

    @pytest.mark.parametrize("measured", [True, False])
    def test_the_producer_log_places_every_batch_of_a_group(self, h: Any, measured: bool) -> None:
        """Batches with a measured size or without: each batch's base offset is where its
        records are (Kafka packs measured ones into one message set, else writes rounds)."""
        topic = _topic(h, partitions=2)
        broker = h.open_broker()
        session = broker.init_producer()
        pid, epoch = session.producer_id, session.producer_epoch
        log: Any = broker._log
        counts = [(0, 3), (1, 1), (0, 1), (0, 4), (1, 2)]
        bases = {0: 0, 1: 0}
        group = []
        for partition, count in counts:
            values = [b"%d-%d" % (partition, bases[partition] + j) for j in range(count)]
            request = ProduceRequest.build(topic, partition, pid, epoch, bases[partition], values)
            bases[partition] += count
            size = request.size if measured else None
            group.append((topic, partition, AppendBatch(request.header, request.records, time.time(), size)))
        assert log.write(group) == [0, 0, 3, 4, 1]
        broker.close()
        assert [m.value for m in _read_all(h, topic, 0)] == [b"0-%d" % j for j in range(8)]
        assert [m.value for m in _read_all(h, topic, 1)] == [b"1-%d" % j for j in range(3)]


class ProducerLogFaultConformance(ProducerLogConformance):
    """The suite plus its fault tests, for a log whose harness injects faults (the memory
    log; Kafka's and Pulsar's own faults are injected by their outage and fault tests)."""

    def _faults(self, h: ProducerLogHarness, broker: DirectBroker) -> Any:
        faults = h.faults(broker)
        assert faults is not None, "the fault tests need a harness whose faults inject them"
        return faults

    # -- unknown outcomes, settled before the next write -----------------------------------------

    def _one(self, h: Any, name: str | None = None) -> tuple[str, DirectBroker, Any, Any]:
        topic = _topic(h)
        broker = h.open_broker()
        session = broker.init_producer(name)
        return topic, broker, session, self._faults(h, broker)

    def test_a_lost_acknowledgement_is_settled_and_the_resend_is_a_duplicate(self, h: Any) -> None:
        topic, broker, s, faults = self._one(h)
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
        faults.lose_ack = 1
        with pytest.raises(BackendUnavailableError):
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"b", b"c"])
        resend = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"b", b"c"])
        assert resend.outcome is Outcome.DUPLICATE and resend.base_offset == 1
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 3, [b"d"]).base_offset == 3
        broker.close()
        assert [m.value for m in _read_all(h, topic)] == [b"a", b"b", b"c", b"d"]

    def test_a_failed_write_stores_nothing_and_the_resend_is_new(self, h: Any) -> None:
        topic, broker, s, faults = self._one(h)
        faults.fail = 1
        with pytest.raises(BackendUnavailableError):
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        resend = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        assert resend.outcome is Outcome.ACCEPTED and resend.base_offset == 0
        broker.close()
        assert [m.value for m in _read_all(h, topic)] == [b"a"]

    def test_an_in_doubt_commit_that_did_not_store_is_resent_as_new(self, h: Any) -> None:
        topic, broker, s, faults = self._one(h)
        faults.in_doubt = 1
        faults.resolve_unavailable = 1  # the log cannot say at once: the next write waits
        with pytest.raises(BackendUnavailableError):
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        assert broker._unsettled  # still in doubt: the next write settles it first
        resend = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        assert resend.outcome is Outcome.ACCEPTED and resend.base_offset == 0
        broker.close()
        assert [m.value for m in _read_all(h, topic)] == [b"a"]

    def test_an_unsettled_write_blocks_the_next_until_the_log_can_say(self, h: Any) -> None:
        topic, broker, s, faults = self._one(h)
        faults.lose_ack = 1
        faults.resolve_unavailable = 2
        with pytest.raises(BackendUnavailableError):
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        writes = faults.writes
        with pytest.raises(BackendUnavailableError):  # settling fails: nothing else is written
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"b"])
        assert faults.writes == writes
        resend = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        assert resend.outcome is Outcome.DUPLICATE and resend.base_offset == 0
        broker.close()
        assert [m.value for m in _read_all(h, topic)] == [b"a"]

    def test_a_crash_that_keeps_a_prefix_of_a_group_commits_the_prefix_only(self, h: Any) -> None:
        topic = _topic(h, partitions=3)
        broker = h.open_broker()
        s = broker.init_producer()
        faults = self._faults(h, broker)
        group = [ProduceRequest.build(topic, p, s.producer_id, s.producer_epoch, 0, [b"%d" % p]) for p in range(3)]
        faults.keep_prefix = 1
        failed = broker.submit_requests(group)
        assert all(isinstance(f.exception(30), BackendUnavailableError) for f in failed)
        answers = [f.result(30) for f in broker.submit_requests(group)]
        assert [a.outcome for a in answers] == [Outcome.DUPLICATE, Outcome.ACCEPTED, Outcome.ACCEPTED]
        assert [a.base_offset for a in answers] == [0, 0, 0]
        broker.close()
        assert [[m.value for m in _read_all(h, topic, p)] for p in range(3)] == [[b"0"], [b"1"], [b"2"]]

    # -- lost or stale states --------------------------------------------------------------------

    def _named_with_data(self, h: Any, config: BrokerConfig | None = None) -> tuple[str, str, Any, Any]:
        topic = _topic(h)
        name = f"state-{uuid.uuid4().hex[:6]}"
        broker = h.open_broker(config)
        s = broker.init_producer(name)
        faults = self._faults(h, broker)
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, _values(0, 3)).outcome is Outcome.ACCEPTED
        return topic, name, broker, faults

    def test_a_stale_state_is_completed_by_a_replay(self, h: Any) -> None:
        topic, name, broker, faults = self._named_with_data(h)
        s = broker._session
        faults.stale_states = True  # the newest states are lost, the data is not
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 3, _values(3, 2)).base_offset == 3
        broker.close()
        faults.stale_states = False
        again = h.open_broker()
        r = again.init_producer(name)
        assert again.last_sequence(topic, 0) == 4
        resend = again.produce(topic, 0, r.producer_id, r.producer_epoch, 3, _values(3, 2))
        assert resend.outcome is Outcome.DUPLICATE and resend.base_offset == 3
        again.close()

    def test_a_lost_state_is_rebuilt_from_the_window(self, h: Any) -> None:
        topic, name, broker, _ = self._named_with_data(h)
        broker._log.lose_state(topic, 0)
        broker.close()
        again = h.open_broker()
        r = again.init_producer(name)
        assert again.last_sequence(topic, 0) == 2
        resend = again.produce(topic, 0, r.producer_id, r.producer_epoch, 0, _values(0, 3))
        assert resend.outcome is Outcome.DUPLICATE and resend.base_offset == 0
        again.close()

    def test_a_lost_state_the_window_cannot_rebuild_refuses_the_restart(self, h: Any) -> None:
        config = BrokerConfig(state_rebuild_records=2)
        topic, name, broker, _ = self._named_with_data(h, config)
        broker._log.lose_state(topic, 0)
        broker.close()
        other = h.open_broker(config)  # another producer's records fill the window
        o = other.init_producer()
        assert other.produce(topic, 0, o.producer_id, o.producer_epoch, 0, _values(0, 5)).outcome is Outcome.ACCEPTED
        other.close()
        again = h.open_broker(config)
        with pytest.raises(ProducerStateLostError):
            again.init_producer(name)
        again.close()
        wider = h.open_broker(BrokerConfig(state_rebuild_records=100))
        assert wider.init_producer(name).producer_name == name and wider.last_sequence(topic, 0) == 2
        wider.close()


class MemoryProducerLogHarness(ProducerLogHarness):
    """The in-memory log (:mod:`idempotent.adapters.memory_producer_log`) over a private store."""

    def __init__(self) -> None:
        self.url = f"memory://plog-{uuid.uuid4().hex}"

    def open_broker(self, config: BrokerConfig | None = None) -> DirectBroker:
        from idempotent.adapters import memory_producer_log

        return DirectBroker(self.url, config, log_module=memory_producer_log)

    def faults(self, broker: DirectBroker) -> Any:
        return getattr(broker._log, "faults", None)

    def close(self) -> None:
        from idempotent.adapters.memory import reset_store

        reset_store(self.url.split("://", 1)[1])


class UrlProducerLogHarness(ProducerLogHarness):
    """A live log at ``url`` (``kafka://...``, ``pulsar://...``): no fault injection."""

    def __init__(
        self, url: str, *, open_waits_for_older: bool = False, dense_offsets: bool = True, **options: Any
    ) -> None:
        self.url = url
        self.open_waits_for_older = open_waits_for_older
        self.dense_offsets = dense_offsets
        self.options = options

    def open_broker(self, config: BrokerConfig | None = None) -> DirectBroker:
        return DirectBroker(self.url, config, **self.options)


__all__ = ["MemoryProducerLogHarness", "ProducerLogConformance", "ProducerLogHarness", "UrlProducerLogHarness"]
