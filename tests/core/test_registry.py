"""Producer ids, names and epochs (idempotent/core/registry.py)."""

from __future__ import annotations

import attrs
import pytest

from idempotent.core.registry import Admission, OwnProducer, ProducerRegistry
from idempotent.core.types import MAX_EPOCH
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
    from idempotent.core.registry import ProducerRecord

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
    from idempotent.core.registry import ProducerRecord

    r = registry()
    first = r.init("job", "alice")
    assert first.principal == "alice"
    assert r.init("job", "alice").principal == "alice"
    assert r.init(None, "bob").principal == "bob"
    r = ProducerRegistry([ProducerRecord(first.producer_id, MAX_EPOCH, "job", principal="alice")])  # type: ignore[arg-type]
    r.add_id_block(200, 5)
    moved = r.init("job", "alice")
    assert (moved.producer_id, moved.principal) == (200, "alice")


def test_sweep_expires_records_idle_for_longer_than_the_retention() -> None:
    r = registry()
    old = r.init("spark/job-1/0", now=1000.0)
    kept = r.init("spark/job-2/0", now=5000.0)
    writer = r.init("long-lived", now=1000.0)  # initialised long ago, still writing
    anonymous = r.init(None, now=1000.0)
    sweep = r.sweep(now=7000.0, retention=3000.0, activity={writer.producer_id: 6900.0})
    assert sweep.expired == sorted([old.producer_id, anonymous.producer_id])
    assert kept.producer_id not in sweep.expired and writer.producer_id not in sweep.expired
    # the writer's record lags its activity by over a quarter of the retention: stored again
    assert sweep.touched == [attrs.evolve(writer, last_used=6900.0)]
    assert r.lookup(old.producer_id) == old  # nothing changed until the caller drops them
    r.merge(sweep.touched)
    r.drop(sweep.expired)
    assert r.by_name("spark/job-1/0") is None and r.lookup(old.producer_id) is None
    assert r.lookup(writer.producer_id) == attrs.evolve(writer, last_used=6900.0)
    assert len(r) == 2
    again = r.init("spark/job-1/0", now=7100.0)  # a rerun after expiry: a fresh id, epoch 0
    assert again.producer_id not in (old.producer_id, anonymous.producer_id) and again.producer_epoch == 0
    with pytest.raises(ConfigError):
        r.sweep(now=1.0, retention=0.0, activity={})


def test_sweep_keeps_activity_within_a_quarter_of_the_retention_unwritten() -> None:
    r = registry()
    record = r.init("p", now=1000.0)
    assert r.sweep(now=1500.0, retention=4000.0, activity={record.producer_id: 1900.0}).touched == []
    assert r.sweep(now=1500.0, retention=4000.0, activity={record.producer_id: 2001.0}).touched != []
    # init bumps last_used: a record re-initialised within the retention never expires
    r.init("p", now=4000.0)
    assert r.sweep(now=7500.0, retention=4000.0, activity={}).expired == []
    assert r.sweep(now=8001.0, retention=4000.0, activity={}).expired == [record.producer_id]


def test_records_stored_before_last_used_count_from_the_first_sweep() -> None:
    from idempotent.core.registry import ProducerRecord
    from idempotent.core.types import Epoch, ProducerId

    legacy = ProducerRecord(ProducerId(5), Epoch(3), "old-job")  # last_used 0.0: not noted
    r = ProducerRegistry([legacy])
    first = r.sweep(now=10_000.0, retention=100.0, activity={})
    assert first.expired == [] and first.touched == []  # no write storm on the first sweep
    assert r.sweep(now=10_050.0, retention=100.0, activity={}).expired == []
    assert r.sweep(now=10_101.0, retention=100.0, activity={}).expired == [5]


def test_merge_keeps_the_latest_last_used() -> None:
    from idempotent.core.registry import ProducerRecord, merge_record
    from idempotent.core.types import Epoch, ProducerId

    a = ProducerRecord(ProducerId(1), Epoch(2), "p", last_used=50.0)
    b = attrs.evolve(a, last_used=80.0)
    assert merge_record(a, b) == b
    assert merge_record(b, a) is b
    assert merge_record(b, attrs.evolve(a, producer_epoch=Epoch(1), last_used=99.0)) is b  # older epoch ignored


def test_a_producers_own_broker_admits_its_producer_at_any_epoch_and_no_other() -> None:
    record = registry().init("job")
    own = OwnProducer(record)
    assert own.admit(record.producer_id, record.producer_epoch) is Admission.ADMITTED
    assert own.admit(record.producer_id, record.producer_epoch + 1) is Admission.ADMITTED
    assert own.admit(record.producer_id + 1, record.producer_epoch) is Admission.UNKNOWN
    assert own.lookup(record.producer_id) is record
    assert own.lookup(record.producer_id + 1) is None
