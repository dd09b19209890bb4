"""PartitionCore: the partition's decisions, driven with plain values and a fake clock.

No broker, backend, thread or clock: the test plays the shell, carrying out the actions the
core returns (or deciding not to, to model a failed write).
"""

from __future__ import annotations

import pytest

from idempotent.core.checker import CheckerConfig, PartitionChecker, Policy, make_header
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.partition import (
    Accept,
    Append,
    Fail,
    NotStored,
    PartitionCore,
    Recover,
    RefreshProducers,
    Reply,
    WriteSnapshot,
)
from idempotent.core.records import BatchHeader, StoredBatch
from idempotent.core.registry import Admission
from idempotent.core.types import TopicPartition
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    EntryTooLargeError,
    InvalidBatchError,
    PartitionRecoveringError,
)

TP = TopicPartition("t", 0)
T0 = 1_000.0


def header(producer_id: int, base_sequence: int, count: int = 1, epoch: int = 0) -> BatchHeader:
    return make_header(producer_id, epoch, base_sequence, count)


def ready_core(**config: float) -> PartitionCore:
    """A core recovered from an empty log at T0."""
    core = PartitionCore(TP, CheckerConfig(**config))  # type: ignore[arg-type]
    assert core.ensure_ready() == Recover()
    assert core.recovered(PartitionChecker.restore(None, core.config, now=T0), 0, 0.0, T0) is None
    return core


def offer(core: PartitionCore, h: BatchHeader, now: float = T0, admission: str = Admission.ADMITTED, **kw: object):  # type: ignore[no-untyped-def]
    return core.offer(h, now, admission=admission, **kw)  # type: ignore[arg-type]


def start(core: PartitionCore, h: BatchHeader, now: float = T0) -> Append:
    """Offer a batch that must be accepted and start its append."""
    assert isinstance(offer(core, h, now), Accept)
    return core.append(h, now)


def store(core: PartitionCore, h: BatchHeader, offset: int, now: float = T0) -> list[object]:
    """Offer, append and complete one batch at ``offset``; returns the completion's actions."""
    return list(core.completed(start(core, h, now), offset, now))


# -- readiness and recovery ---------------------------------------------------------------------


def test_a_new_core_asks_to_be_recovered_and_decides_nothing_before() -> None:
    core = PartitionCore(TP, CheckerConfig())
    assert not core.ready
    assert core.ensure_ready() == Recover()
    with pytest.raises(PartitionRecoveringError):
        offer(core, header(1, 0))


def test_recovered_sweeps_expired_producers_into_an_eviction_snapshot() -> None:
    core = PartitionCore(TP, CheckerConfig(producer_expiry=60))
    checker = PartitionChecker.restore(None, core.config, now=T0)
    checker.apply(StoredBatch(0, 1, 0, 0, 1, T0))  # type: ignore[arg-type]
    checker.apply(StoredBatch(1, 2, 0, 0, 1, T0 + 100))  # type: ignore[arg-type]
    swept = core.recovered(checker, 2, 0.5, T0 + 120)
    assert isinstance(swept, WriteSnapshot)
    assert swept.evicted == (1,)
    assert (core.replayed, core.recovery_seconds) == (2, 0.5)
    assert core.snapshot_written(swept, True) == (1,)
    assert core.ready


# -- admission ----------------------------------------------------------------------------------


def test_unknown_producer_is_answered_or_refreshed_once() -> None:
    core = ready_core()
    assert offer(core, header(1, 0), admission=Admission.UNKNOWN) == Reply(ProduceResult(Outcome.UNKNOWN_PRODUCER))
    assert offer(core, header(1, 0), admission=Admission.UNKNOWN, refreshable=True) == RefreshProducers()


def test_fenced_producer_learns_the_registered_epoch() -> None:
    core = ready_core()
    decision = offer(core, header(1, 0), admission=Admission.FENCED, registered_epoch=3)
    assert decision == Reply(ProduceResult(Outcome.FENCED, producer_epoch=3))


def test_a_producer_whose_state_was_lost_may_not_start_anew() -> None:
    core = ready_core()
    decision = offer(core, header(1, 5), admission=Admission.STATE_LOST)
    assert decision == Reply(ProduceResult(Outcome.UNKNOWN_PRODUCER))


# -- produce, duplicates, gaps ------------------------------------------------------------------


def test_first_write_then_duplicate_with_its_offset_then_gap() -> None:
    core = ready_core()
    assert offer(core, header(1, 0, 2)) == Accept(first_write=True)
    append = core.append(header(1, 0, 2), T0)
    assert append.snapshot is None
    assert core.outstanding == 1
    # while in flight, a copy is IN_FLIGHT, not accepted twice
    assert offer(core, header(1, 0, 2)) == Reply(ProduceResult(Outcome.IN_FLIGHT))
    assert core.completed(append, 40, T0) == [Reply(ProduceResult(Outcome.ACCEPTED, base_offset=40))]
    assert core.outstanding == 0
    assert offer(core, header(1, 0, 2)) == Reply(ProduceResult(Outcome.DUPLICATE, base_offset=40))
    assert offer(core, header(1, 2)) == Accept(first_write=False)
    assert offer(core, header(1, 5)) == Reply(ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=2))


def test_a_batch_that_does_not_fit_the_policy_is_refused_with_nothing_changed() -> None:
    core = ready_core()
    with pytest.raises(InvalidBatchError):
        offer(core, header(1, 2**31, 1), policy=Policy.STRICT)
    assert core.outstanding == 0


def test_deduplication_off_accepts_gaps() -> None:
    core = ready_core()
    assert offer(core, header(1, 7), enabled=False) == Accept(first_write=True)


def test_commits_apply_in_append_order_whatever_order_they_complete_in() -> None:
    core = ready_core()
    first, second = start(core, header(1, 0)), start(core, header(1, 1))
    assert core.completed(second, 1, T0) == [Reply(ProduceResult(Outcome.ACCEPTED, base_offset=1))]
    assert core.checker is not None and core.checker.last_sequence(1) == -1  # waits for its predecessor
    core.completed(first, 0, T0)
    assert core.checker.last_sequence(1) == 1


# -- eviction on first write --------------------------------------------------------------------


def test_a_new_producer_at_capacity_evicts_the_idle_one_durably_first() -> None:
    core = ready_core(max_producers=2)
    store(core, header(1, 0), 0, T0)
    store(core, header(2, 0), 1, T0 + 1)
    decision = offer(core, header(3, 0), T0 + 2)
    assert isinstance(decision, WriteSnapshot)
    assert decision.evicted == (1,)  # the least recently active
    assert decision.snapshot.position == 2
    assert core.snapshot_written(decision, True) == (1,)
    assert offer(core, header(3, 0), T0 + 2) == Accept(first_write=True)  # room now
    assert offer(core, header(1, 1), T0 + 2, admission=Admission.STATE_LOST) == Reply(
        ProduceResult(Outcome.UNKNOWN_PRODUCER)
    )


def test_a_full_partition_makes_room_for_a_margin_of_new_producers_with_one_snapshot() -> None:
    """Regression: a full partition evicted one producer per new producer, each time with a
    snapshot of the whole partition (new producers per second fell 10 to 30 times). With the
    default margin (2 % of max_producers) one snapshot makes room for 20 of 1,000."""
    core = ready_core(max_producers=1000)
    for producer_id in range(1000):
        store(core, header(producer_id, 0), producer_id, T0 + producer_id)
    snapshots: list[WriteSnapshot] = []
    for producer_id in range(1000, 1100):
        decision = offer(core, header(producer_id, 0), T0 + producer_id)
        if isinstance(decision, WriteSnapshot):
            snapshots.append(decision)
            assert core.snapshot_written(decision, True) == decision.evicted
            decision = offer(core, header(producer_id, 0), T0 + producer_id)
        assert decision == Accept(first_write=True)
        core.completed(core.append(header(producer_id, 0), T0 + producer_id), producer_id, T0 + producer_id)
    assert len(snapshots) == 5  # not 100
    evicted = [p for s in snapshots for p in s.evicted]
    assert evicted == list(range(100))  # the least recently active, in that order
    assert core.checker is not None and core.checker.producer_count == 1000


@pytest.mark.parametrize(
    ("max_producers", "margin", "room"), [(10_000, 0.02, 200), (1000, 0.0, 1), (2, 0.02, 1), (1, 0.5, 1)]
)
def test_the_room_made_at_once_is_a_share_of_max_producers_and_at_least_one(
    max_producers: int, margin: float, room: int
) -> None:
    assert CheckerConfig(max_producers=max_producers, eviction_margin=margin).room_made == room


@pytest.mark.parametrize("margin", [-0.01, 1.0, 2.0])
def test_an_eviction_margin_outside_0_to_1_is_a_config_error(margin: float) -> None:
    with pytest.raises(ConfigError, match="eviction_margin"):
        CheckerConfig(eviction_margin=margin)


def test_an_eviction_whose_snapshot_fails_is_undone_by_a_rebuild() -> None:
    core = ready_core(max_producers=1)
    store(core, header(1, 0), 0)
    decision = offer(core, header(2, 0))
    assert isinstance(decision, WriteSnapshot) and decision.evicted == (1,)
    assert core.snapshot_written(decision, False) == ()  # nobody is flagged
    assert core.checker is None  # rebuilt from the log, which brings producer 1 back
    assert core.ensure_ready() == Recover()


def test_producers_with_batches_in_flight_are_never_evicted() -> None:
    core = ready_core(max_producers=1)
    start(core, header(1, 0))
    assert offer(core, header(2, 0)) == Accept(first_write=True)  # over capacity, for now


# -- snapshots ----------------------------------------------------------------------------------


def test_a_due_snapshot_rides_with_the_next_append_that_finds_nothing_in_flight() -> None:
    core = ready_core(snapshot_entries=2, snapshot_seconds=60)
    store(core, header(1, 0), 0)
    store(core, header(1, 1), 1)
    idle = start(core, header(1, 2))  # due, and nothing in flight: it rides along
    assert idle.snapshot is not None and idle.snapshot.position == 2 and idle.with_snapshot
    core.completed(idle, 2, T0)
    first = start(core, header(1, 3))  # one entry since: not due
    assert first.snapshot is None and not first.with_snapshot
    behind = start(core, header(1, 4), T0 + 100)  # due by age, but another append is in flight
    assert behind.snapshot is None
    core.completed(first, 3, T0 + 100)
    core.completed(behind, 4, T0 + 100)
    later = start(core, header(1, 5), T0 + 100)
    assert later.snapshot is not None and later.snapshot.position == 5


def test_the_snapshot_threshold_counts_records_too() -> None:
    core = ready_core(snapshot_records=10)
    store(core, header(1, 0, 10), 0)
    assert start(core, header(1, 10)).snapshot is not None


def test_an_overdue_snapshot_is_written_on_its_own_after_a_commit() -> None:
    core = ready_core(snapshot_entries=2)
    store(core, header(1, 0), 0)
    pending = [start(core, header(1, seq)) for seq in (1, 2, 3)]  # never idle
    assert pending[0].snapshot is None
    actions = [core.completed(a, seq, T0) for seq, a in enumerate(pending, 1)]
    assert [len(a) for a in actions] == [1, 1, 2]  # 4 entries = twice snapshot_entries
    overdue = actions[2][1]
    assert isinstance(overdue, WriteSnapshot) and overdue.snapshot.position == 4 and not overdue.evicted


def test_snapshot_when_idle_by_age_and_expiry_in_maintenance() -> None:
    core = ready_core(snapshot_seconds=60, producer_expiry=3600)
    assert core.maintain(T0 + 30) is None  # nothing stored since the last snapshot
    store(core, header(1, 0), 0, T0 + 1)
    assert core.maintain(T0 + 30) is None  # not old enough
    aged = core.maintain(T0 + 61)
    assert isinstance(aged, WriteSnapshot) and aged.evicted == ()
    core.snapshot_written(aged, True)
    assert core.maintain(T0 + 62) is None
    expired = core.maintain(T0 + 1 + 3601)
    assert isinstance(expired, WriteSnapshot) and expired.evicted == (1,)


def test_a_failed_snapshot_is_due_again() -> None:
    core = ready_core(snapshot_seconds=60)
    store(core, header(1, 0), 0)
    aged = core.maintain(T0 + 61)
    assert isinstance(aged, WriteSnapshot)
    assert core.maintain(T0 + 62) is None  # taken: the counters were reset ...
    core.snapshot_written(aged, False)
    assert core.maintain(T0 + 122) is not None  # ... and set again when it was not stored
    assert core.ready


def test_final_snapshot_only_when_idle_and_changed() -> None:
    core = ready_core()
    assert core.final_snapshot(T0) is None
    in_flight = start(core, header(1, 0))
    assert core.final_snapshot(T0) is None
    core.completed(in_flight, 0, T0)
    final = core.final_snapshot(T0)
    assert isinstance(final, WriteSnapshot) and final.snapshot.position == 1


# -- failures -----------------------------------------------------------------------------------


def test_a_failed_append_fails_the_partition_until_everything_behind_it_drained() -> None:
    core = ready_core()
    appends = [start(core, header(1, seq)) for seq in range(3)]
    error = BackendUnavailableError("lost")
    assert core.completed(appends[0], error, T0) == [Fail(error)]
    assert core.failed and not core.ready
    with pytest.raises(PartitionRecoveringError):
        core.ensure_ready()  # two appends still outstanding
    later = BackendUnavailableError("after the failure")
    assert core.completed(appends[1], later, T0) == [Fail(later)]
    # a stale ticket changes nothing, whatever the backend answered
    assert core.completed(appends[2], 7, T0) == [Reply(ProduceResult(Outcome.ACCEPTED, base_offset=7))]
    assert core.checker is not None and core.checker.last_sequence(1) == -1
    assert core.outstanding == 0 and core.drained(1)
    assert core.ensure_ready() == Recover()


def test_a_batch_the_backend_refused_for_certain_fails_alone() -> None:
    core = ready_core()
    store(core, header(1, 0), 0)
    refused = start(core, header(1, 1, 2))
    error = EntryTooLargeError("too large")
    assert core.completed(refused, error, T0) == [Fail(error)]
    assert core.ready and not core.failed
    assert offer(core, header(1, 1, 2)) == Accept(first_write=False)  # its sequences are free again


def test_drained_waits_for_the_producers_own_batches() -> None:
    core = ready_core()
    first = start(core, header(1, 0))
    assert not core.drained(1) and core.drained(2)
    core.completed(first, 0, T0)
    assert core.drained(1)


def test_forget_drops_the_state_for_a_rebuild() -> None:
    core = ready_core()
    store(core, header(1, 0), 0)
    core.forget()
    assert core.ensure_ready() == Recover()


def test_an_append_known_not_stored_forgets_the_pending_batches_and_needs_no_rebuild() -> None:
    core = ready_core()
    store(core, header(1, 0), 0)
    appends = [start(core, header(1, seq)) for seq in (1, 2)]
    error = BackendUnavailableError("the write failed; nothing stored")
    assert core.completed(appends[0], NotStored(error), T0) == [Fail(error)]
    # the later one was not stored either: its completion is stale
    assert core.completed(appends[1], NotStored(error), T0) == [Fail(error)]
    assert core.ready and not core.failed and core.outstanding == 0
    assert core.checker is not None and core.checker.last_sequence(1) == 0 and core.checker.pending == 0
    assert offer(core, header(1, 1)) == Accept(first_write=False)  # resent as new


# -- producer scope (a producer's own broker) ----------------------------------------------------


def producer_core(**config: float) -> PartitionCore:
    """A producer-scoped core recovered from an empty state at T0."""
    core = PartitionCore(TP, CheckerConfig(**config), producer_scoped=True)  # type: ignore[arg-type]
    assert core.ensure_ready() == Recover()
    assert core.recovered(PartitionChecker(core.config), 0, 0.0, T0) is None
    return core


def test_a_producer_scoped_core_schedules_no_snapshot() -> None:
    core = producer_core(snapshot_entries=1, snapshot_seconds=1)
    for seq in range(4):
        append = start(core, header(1, seq), T0 + seq * 10)
        assert append.snapshot is None
        assert core.completed(append, seq, T0 + seq * 10) == [Reply(ProduceResult(Outcome.ACCEPTED, base_offset=seq))]
    assert core.maintain(T0 + 100) is None
    assert core.final_snapshot(T0 + 100) is None


def test_a_producer_scoped_core_never_expires_nor_evicts_its_producer() -> None:
    core = PartitionCore(TP, CheckerConfig(producer_expiry=60, max_producers=1), producer_scoped=True)
    checker = PartitionChecker.restore(None, core.config, now=T0)
    checker.apply(StoredBatch(0, 1, 0, 0, 1, T0))  # type: ignore[arg-type]
    assert core.recovered(checker, 1, 0.0, T0 + 3600) is None  # no sweep
    assert core.maintain(T0 + 3600) is None
    assert core.checker is not None and core.checker.last_sequence(1) == 0
    # a producer new to the full partition is not made room for by an eviction
    assert offer(core, header(2, 0)) == Accept(first_write=True)


def test_state_after_applies_batches_to_the_stored_state_and_changes_nothing() -> None:
    core = producer_core()
    store(core, header(1, 0, 2), 0)
    pending = start(core, header(1, 2, 3))
    after = core.state_after([StoredBatch(2, 1, 0, 2, 3, T0)], T0)  # type: ignore[arg-type]
    restored = PartitionChecker.restore(after, core.config)
    assert restored.last_sequence(1) == 4 and restored.position == 5
    assert core.checker is not None and core.checker.last_sequence(1) == 1 and core.checker.pending == 1
    assert PartitionChecker.restore(core.stored_state(T0), core.config).last_sequence(1) == 1
    core.completed(pending, 2, T0)
    assert core.checker.last_sequence(1) == 4


def test_the_stored_state_of_a_core_not_ready_is_refused() -> None:
    core = PartitionCore(TP, CheckerConfig(), producer_scoped=True)
    with pytest.raises(PartitionRecoveringError):
        core.stored_state(T0)
