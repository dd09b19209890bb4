"""The metadata store Kafka and Pulsar share (adapters/metadata.py), over an in-memory keyed
log: what each backend gives it is only "append keyed records" and "read them after a
position", so the whole store is tested here once. The real logs run it in the conformance
suite (tests/backends/kafka/test_adapter_kafka.py, tests/backends/pulsar/test_adapter_pulsar.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

import pytest

from idempotent.adapters.meta import TopicOrigin, pack_producer
from idempotent.adapters.metadata import CompactedMetadataStore, KeyedRecord, MetadataDelegate
from idempotent.backend import MetadataStore
from idempotent.core.ownership import Lease
from idempotent.core.registry import ProducerRecord
from idempotent.core.types import Epoch, ProducerId
from idempotent.errors import BackendUnavailableError


class KeyedLog:
    """A log of keyed records shared by several stores (several brokers); positions are
    indexes. ``after_append`` runs after a write is stored, before it returns."""

    def __init__(self) -> None:
        self.records: list[KeyedRecord] = []
        self._lock = threading.Lock()
        self.after_append: Callable[[Sequence[KeyedRecord]], None] = lambda items: None
        self.hidden = 0  # the newest records a reader does not see yet (replication lag)

    def append(self, items: Sequence[KeyedRecord]) -> list[int]:
        with self._lock:
            start = len(self.records)
            self.records.extend(items)
        self.after_append(items)
        return list(range(start, start + len(items)))

    def read_after(self, after: int | None) -> Iterator[tuple[str, bytes | None, int]]:
        start = 0 if after is None else after + 1
        with self._lock:
            visible = self.records[: len(self.records) - self.hidden]
        for position in range(start, len(visible)):
            yield visible[position][0], visible[position][1], position

    def store(self, *, writable: bool = True, timeout: float = 5.0) -> CompactedMetadataStore[int]:
        return CompactedMetadataStore(
            "test", self.append, self.read_after, threading.RLock(), timeout=timeout, writable=writable
        )


def record(producer_id: int, epoch: int, name: str | None = None, **kw: object) -> ProducerRecord:
    return ProducerRecord(ProducerId(producer_id), Epoch(epoch), name, **kw)  # type: ignore[arg-type]


def test_id_blocks_of_two_brokers_never_overlap() -> None:
    log = KeyedLog()
    one, other = log.store(), log.store()
    blocks = [
        (one.allocate_producer_ids(10), 10),
        (other.allocate_producer_ids(5), 5),
        (one.allocate_producer_ids(3), 3),
    ]
    assert blocks == [(0, 10), (10, 5), (15, 3)]


def test_an_id_block_that_does_not_show_up_is_an_error_to_retry() -> None:
    log = KeyedLog()
    log.hidden = 1
    with pytest.raises(BackendUnavailableError, match="test: the id block did not show up"):
        log.store(timeout=0.05).allocate_producer_ids(10)


def test_producer_records_merge_rename_and_delete() -> None:
    log = KeyedLog()
    one, other = log.store(), log.store()
    one.save_producer(record(1, 1, "job", partitions=(("t", 0),)))
    other.save_producer(record(1, 0, "job", partitions=(("t", 1),)))  # a stale copy: ignored
    assert one.load_producers() == [record(1, 1, "job", partitions=(("t", 0),))]
    assert other.load_producers() == [record(1, 1, "job", partitions=(("t", 0),))]
    other.save_producer(record(2, 0, "job"))  # the name moved to a fresh id: the old one goes
    assert log.records[-2:] == [("producer:1", None), ("producer:2", pack_producer(record(2, 0, "job")))]
    assert one.load_producers() == [record(2, 0, "job")]
    one.delete_producers([2, 99])
    one.delete_producers([])
    assert one.load_producers() == [] and other.load_producers() == []


def test_settings_are_shared_and_deleted() -> None:
    log = KeyedLog()
    one, other = log.store(), log.store()
    one.save_setting("dedup:broker", "0")
    assert other.load_settings() == {"dedup:broker": "0"}
    other.save_setting("dedup:broker", None)
    assert one.load_settings() == {}


def test_a_setting_written_while_another_write_of_it_is_under_way_is_folded_in_log_order() -> None:
    """Regression: Kafka's copy of the store changed the cached settings after its write,
    outside the backend lock (Pulsar's inside it). A second writer of the same key that wrote
    after it, and a read that folded both meanwhile, left the cache with the first value for
    good: the log says "0", the broker went on with "1"."""
    log = KeyedLog()
    store = log.store()
    second_done = threading.Event()
    first = threading.Event()

    def pause_the_first_write(items: Sequence[KeyedRecord]) -> None:
        if items == [("setting:k", b"1")]:
            first.set()
            second_done.wait(0.5)  # the second writer goes first, if the lock lets it

    log.after_append = pause_the_first_write
    writer = threading.Thread(target=store.save_setting, args=("k", "1"))
    writer.start()
    assert first.wait(5)
    store.save_setting("k", "0")
    store.load_settings()  # a read (the maintenance thread's) folds the log meanwhile
    second_done.set()
    writer.join(5)
    assert [value for key, value in log.records if key == "setting:k"] == [b"1", b"0"]
    assert store.load_settings() == {"k": "0"} == log.store().load_settings()


def _lease(broker_id: str, epoch: int, partition: int = 0, released: bool = False) -> Lease:
    return Lease("t", partition, broker_id, f"{broker_id}:1", epoch, 100.0, 5.0, released)


def test_lease_proposals_are_judged_in_log_order() -> None:
    log = KeyedLog()
    one, other = log.store(), log.store()
    assert one.propose_leases([_lease("a", 1)]) == [_lease("a", 1)]
    assert other.propose_leases([_lease("b", 1), _lease("b", 1, 1)]) == [_lease("a", 1), _lease("b", 1, 1)]
    assert other.propose_leases([_lease("b", 2)]) == [_lease("b", 2)]  # a takeover
    assert one.propose_leases([]) == []
    assert sorted(one.load_leases(), key=lambda x: x.partition) == [_lease("b", 2), _lease("b", 1, 1)]


def test_topic_records_first_origin_wins_and_grown_counts() -> None:
    log = KeyedLog()
    one, other = log.store(), log.store()
    assert one.record_topic("t", 2, TopicOrigin(adopted=False)) == 2
    assert other.record_topic("t", 3, TopicOrigin(adopted=True, starts=(5, 5, 5))) == 3
    assert one.list_topics() == {"t": 3} and one.origin("t") == TopicOrigin(adopted=False)
    assert other.origin("t") == TopicOrigin(adopted=False)
    one.note_count("t", 4)
    assert other.list_topics() == {"t": 4} and other.partition_count("t") == 4
    assert one.recorded_topics() == ["t"] and one.partition_count("u") is None


def test_a_read_only_store_notes_a_grown_count_for_itself_only() -> None:
    log = KeyedLog()
    log.store().record_topic("t", 1, TopicOrigin(adopted=False))
    reader = log.store(writable=False)
    reader.catch_up()
    written = len(log.records)
    reader.note_count("t", 2)
    assert reader.partition_count("t") == 2 and len(log.records) == written


def test_an_unreadable_record_is_skipped_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    log = KeyedLog()
    log.append([("producer:1", b"\xc1 not msgpack"), ("setting:k", b"v")])
    assert log.store().load_settings() == {"k": "v"}
    assert "ignoring unreadable meta record 'producer:1'" in caplog.text


def test_a_delegate_serves_the_store_half_of_a_backend() -> None:
    class Backend(MetadataDelegate):
        def __init__(self, store: MetadataStore) -> None:
            self.metadata = store

    log = KeyedLog()
    backend = Backend(log.store())
    half: MetadataStore = backend
    half.save_setting("k", "v")
    start = half.allocate_producer_ids(3)
    half.save_producer(record(start, 0))
    assert half.load_settings() == {"k": "v"} and half.load_producers() == [record(start, 0)]
    assert half.propose_leases([_lease("a", 1)]) == half.load_leases() == [_lease("a", 1)]
    half.delete_producers([start])
    assert half.load_producers() == [] and half.list_topics() == {} and half.claim_writer() is False


def test_a_deleted_topic_leaves_the_records() -> None:
    log = KeyedLog()
    one, other = log.store(), log.store()
    one.record_topic("t", 2, TopicOrigin(adopted=False))
    one.record_topic("u", 1, TopicOrigin(adopted=False))
    assert other.list_topics() == {"t": 2, "u": 1}
    one.forget_topic("t")
    assert log.records[-1] == ("topic:t", None)
    assert one.partition_count("t") is None and one.list_topics() == {"u": 1}
    assert other.list_topics() == {"u": 1}


def test_the_partitions_a_named_producer_wrote_are_recorded_once_and_seen_by_every_store() -> None:
    log = KeyedLog()
    one, other = log.store(), log.store()
    assert one.written_by("feed") == set()
    one.record_written("feed", [("orders", 0), ("orders:eu", 2)])
    one.record_written("feed", [("orders", 0)])  # known: nothing written
    assert len(log.records) == 2 and all(key.startswith("wrote:feed\0") for key, _ in log.records)
    one.record_written("other", [("orders", 0)])
    assert other.written_by("feed") == {("orders", 0), ("orders:eu", 2)}
    assert other.written_by("other") == {("orders", 0)} and other.written_by("nobody") == set()
    log.append([("wrote:feed\0orders\x000", None)])  # a tombstone forgets it
    assert other.written_by("feed") == {("orders:eu", 2)}
