"""The metadata log Kafka and Pulsar share (adapters/meta.py): encodings and the fold, pure."""

from __future__ import annotations

import attrs
import msgpack
import pytest

from idempotent.adapters.meta import (
    MetaLog,
    lease_key,
    pack_lease,
    pack_producer,
    pack_snapshot,
    unpack_lease,
    unpack_producer,
    unpack_snapshot,
)
from idempotent.core.ownership import Lease
from idempotent.core.records import Snapshot
from idempotent.core.registry import ProducerRecord, merge_record
from idempotent.core.types import Epoch, ProducerId


def lease(broker_id: str, epoch: int, *, renewed_at: float = 100.0, released: bool = False) -> Lease:
    return Lease("t", 0, broker_id, f"{broker_id}:9000", epoch, renewed_at, 10.0, released)


def test_meta_encoding_carries_the_owner_and_reads_older_records() -> None:
    record = ProducerRecord(7, 3, "job", True, (("t", 0), ("t", 2)), "alice")  # type: ignore[arg-type]
    assert unpack_producer(pack_producer(record)) == record
    older = msgpack.packb([7, 3, "job", False, [["t", 0]]])  # written before records had owners
    assert unpack_producer(older) == ProducerRecord(7, 3, "job", False, (("t", 0),), None)  # type: ignore[arg-type]
    newer = msgpack.packb([7, 3, "job", False, [], "alice", 1234.5, "a-later-field"])
    assert unpack_producer(newer).principal == "alice"
    assert unpack_producer(newer).last_used == 1234.5
    assert unpack_producer(pack_producer(attrs.evolve(record, last_used=99.0))).last_used == 99.0


def test_meta_log_folds_producer_records_with_the_merge_rule() -> None:
    """Kafka and Pulsar fold producer messages in log order: a stale copy written later does
    not undo a newer epoch, and copies at one epoch unite their partitions."""
    newer = ProducerRecord(ProducerId(7), Epoch(1), "p", False, (("t", 0),), "alice")
    log: MetaLog[int] = MetaLog()
    log.apply("producer:7", pack_producer(newer), 0)
    log.apply("producer:7", pack_producer(ProducerRecord(ProducerId(7), Epoch(0), "p", False, (("t", 2),))), 1)
    assert log.producers[7] == newer
    log.apply("producer:7", pack_producer(ProducerRecord(ProducerId(7), Epoch(1), "p", True, (("t", 1),), "bob")), 2)
    assert log.producers[7] == ProducerRecord(ProducerId(7), Epoch(1), "p", True, (("t", 0), ("t", 1)), "alice")
    assert merge_record(log.producers[7], newer) is log.producers[7]
    assert merge_record(None, newer) is newer


def test_snapshots_and_leases_round_trip() -> None:
    snapshot = Snapshot(42, 7, 1700000000.5, b"\x00\x01state")
    assert unpack_snapshot(pack_snapshot(snapshot)) == snapshot
    held = lease("b1", 3, released=True)
    assert unpack_lease(pack_lease(held)) == held
    assert lease_key("orders", 2) == "lease:2:orders"


def test_the_fold_keeps_topics_settings_and_deletions() -> None:
    log: MetaLog[int] = MetaLog()
    log.apply("topic:orders", b"4", 0)
    log.apply("topic:old", b"1", 1)
    log.apply("setting:dedup:topic:orders", b"0", 2)
    log.apply("producer:5", pack_producer(ProducerRecord(ProducerId(5), Epoch(0), "job")), 3)
    log.apply("producer:6", pack_producer(ProducerRecord(ProducerId(6), Epoch(0), "job")), 4)
    log.apply("topic:old", None, 5)  # a tombstone deletes the key
    log.apply("producer:5", None, 6)
    assert log.topics == {"orders": 4}
    assert log.settings == {"dedup:topic:orders": "0"}
    assert list(log.producers) == [6] and log.producers_named("job") == [6]
    log.apply("setting:dedup:topic:orders", None, 7)
    assert log.settings == {}
    log.apply("idblock:lost", None, 8)  # a deleted block request takes no ids
    assert log.blocks == []


@pytest.mark.parametrize("positions", [(10, 20, 30), ((1, 5), (1, 9), (2, 0))])
def test_id_blocks_start_after_the_blocks_before_them_in_log_order(positions: tuple[object, object, object]) -> None:
    """Brokers asking at the same time never overlap: a block's first id is the sum of the
    sizes of the blocks before it in log order (Kafka offsets or Pulsar (ledger, entry))."""
    log: MetaLog = MetaLog()  # type: ignore[type-arg]
    first, second, third = positions
    log.apply("idblock:b", b"100", second)  # arrives in any order, folds by position
    log.apply("idblock:a", b"1000", first)
    log.apply("idblock:c", b"10", third)
    assert [log.block_start(p) for p in positions] == [0, 1000, 1100]


def test_a_lease_proposal_wins_only_when_it_supersedes_the_held_one() -> None:
    log: MetaLog[int] = MetaLog()
    log.apply(lease_key("t", 0), pack_lease(lease("b1", 1)), 0)
    log.apply(lease_key("t", 0), pack_lease(lease("b2", 1)), 1)  # same epoch, another broker: loses
    assert log.leases[("t", 0)].broker_id == "b1"
    log.apply(lease_key("t", 0), pack_lease(lease("b2", 2)), 2)  # the next epoch takes it over
    assert log.leases[("t", 0)] == lease("b2", 2)
    log.apply(lease_key("t", 0), pack_lease(lease("b2", 2, renewed_at=200.0)), 3)  # its holder renews it
    assert log.leases[("t", 0)].renewed_at == 200.0


def test_an_unreadable_value_raises_for_the_caller_to_skip() -> None:
    log: MetaLog[int] = MetaLog()
    with pytest.raises((ValueError, TypeError)):
        log.apply("topic:orders", b"four", 0)
    with pytest.raises((ValueError, TypeError)):
        log.apply("producer:1", b"\xc1", 1)
    assert log.topics == {} and log.producers == {}
