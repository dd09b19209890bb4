"""Producer ids, names and epochs (idempotent/_registry.py)."""

from __future__ import annotations

import pytest

from idempotent._registry import Admission, ProducerRegistry
from idempotent._types import MAX_EPOCH
from idempotent.errors import ConfigError, InternalError


def registry() -> ProducerRegistry:
    r = ProducerRegistry()
    r.add_id_block(100, 10)
    return r


def test_anonymous_ids_are_unique_and_blocks_run_out() -> None:
    r = registry()
    ids = [r.init(None).producer_id for _ in range(10)]
    assert ids == list(range(100, 110))
    assert r.needs_id_block()
    with pytest.raises(InternalError):
        r.init(None)


def test_named_producer_bumps_epoch_and_fences() -> None:
    r = registry()
    a = r.init("job")
    b = r.init("job")
    assert (b.producer_id, b.producer_epoch) == (a.producer_id, a.producer_epoch + 1)
    assert r.admit(a.producer_id, a.producer_epoch) == Admission.FENCED
    assert r.admit(b.producer_id, b.producer_epoch) == Admission.ADMITTED
    assert r.admit(b.producer_id, b.producer_epoch + 1) == Admission.UNKNOWN
    assert r.admit(999, 0) == Admission.UNKNOWN


def test_epoch_exhaustion_moves_the_name_to_a_new_id() -> None:
    r = registry()
    first = r.init("job")
    from idempotent._registry import ProducerRecord

    r = ProducerRegistry([ProducerRecord(first.producer_id, MAX_EPOCH, "job")])  # type: ignore[arg-type]
    r.add_id_block(200, 5)
    assert r.will_need_id("job")
    moved = r.init("job")
    assert moved.producer_id == 200 and moved.producer_epoch == 0
    assert r.admit(first.producer_id, MAX_EPOCH) == Admission.UNKNOWN


def test_state_lost_until_reinit() -> None:
    r = registry()
    a = r.init("job")
    lost = r.mark_state_lost(a.producer_id)
    assert lost is not None and lost.state_lost
    assert r.mark_state_lost(a.producer_id) is None
    assert r.admit(a.producer_id, a.producer_epoch) == Admission.STATE_LOST
    b = r.init("job")
    assert r.admit(b.producer_id, b.producer_epoch) == Admission.ADMITTED


@pytest.mark.parametrize("name", ["", "x" * 1025, "bad\nname"])
def test_bad_names(name: str) -> None:
    with pytest.raises(ConfigError):
        registry().init(name)


def test_owner_is_kept_by_every_epoch_and_by_a_moved_name() -> None:
    from idempotent._registry import ProducerRecord

    r = registry()
    first = r.init("job", "alice")
    assert first.principal == "alice"
    assert r.init("job", "alice").principal == "alice"
    assert r.init(None, "bob").principal == "bob"
    r = ProducerRegistry([ProducerRecord(first.producer_id, MAX_EPOCH, "job", principal="alice")])  # type: ignore[arg-type]
    r.add_id_block(200, 5)
    moved = r.init("job", "alice")
    assert (moved.producer_id, moved.principal) == (200, "alice")


def test_meta_encoding_carries_the_owner_and_reads_older_records() -> None:
    import msgpack

    from adapters._meta import pack_producer, unpack_producer
    from idempotent._registry import ProducerRecord

    record = ProducerRecord(7, 3, "job", True, (("t", 0), ("t", 2)), "alice")  # type: ignore[arg-type]
    assert unpack_producer(pack_producer(record)) == record
    older = msgpack.packb([7, 3, "job", False, [["t", 0]]])  # written before records had owners
    assert unpack_producer(older) == ProducerRecord(7, 3, "job", False, (("t", 0),), None)  # type: ignore[arg-type]
    newer = msgpack.packb([7, 3, "job", False, [], "alice", "a-later-field"])
    assert unpack_producer(newer).principal == "alice"


def test_meta_log_folds_producer_records_with_the_merge_rule() -> None:
    """Kafka and Pulsar fold producer messages in log order: a stale copy written later does
    not undo a newer epoch, and copies at one epoch unite their partitions."""
    from adapters._meta import MetaLog, pack_producer
    from idempotent._registry import ProducerRecord, merge_record
    from idempotent._types import Epoch, ProducerId

    newer = ProducerRecord(ProducerId(7), Epoch(1), "p", False, (("t", 0),), "alice")
    log: MetaLog[int] = MetaLog()
    log.apply("producer:7", pack_producer(newer), 0)
    log.apply("producer:7", pack_producer(ProducerRecord(ProducerId(7), Epoch(0), "p", False, (("t", 2),))), 1)
    assert log.producers[7] == newer
    log.apply("producer:7", pack_producer(ProducerRecord(ProducerId(7), Epoch(1), "p", True, (("t", 1),), "bob")), 2)
    assert log.producers[7] == ProducerRecord(ProducerId(7), Epoch(1), "p", True, (("t", 0), ("t", 1)), "alice")
    assert merge_record(log.producers[7], newer) is log.producers[7]
    assert merge_record(None, newer) is newer
