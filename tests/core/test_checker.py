"""Table-driven tests of the pure broker-side checker (idempotent/core/checker.py)."""

from __future__ import annotations

import pytest

from idempotent.core.checker import CheckerConfig, PartitionChecker, Policy, make_header
from idempotent.core.outcomes import Outcome
from idempotent.core.records import StoredBatch
from idempotent.core.types import MAX_SEQUENCE, Epoch, ProducerId, Sequence
from idempotent.errors import ConfigError, CorruptDataError, InvalidBatchError

P = 7


def stored(
    checker: PartitionChecker, base: int, count: int, epoch: int = 0, producer: int = P, offset: int | None = None
) -> int:
    """Push and commit a batch; return its base offset."""
    offset = checker.position if offset is None else offset
    ticket = checker.push(make_header(producer, epoch, base, count), now=1.0)
    checker.commit(ticket, offset)
    return offset


def check(
    checker: PartitionChecker, base: int, count: int = 1, epoch: int = 0, **kw: object
) -> tuple[Outcome, int | None, int | None]:
    r = checker.check(make_header(P, epoch, base, count), **kw)  # type: ignore[arg-type]
    return r.outcome, r.base_offset, r.expected_sequence


def test_new_producer_must_start_at_zero() -> None:
    c = PartitionChecker()
    assert check(c, 0) == (Outcome.ACCEPTED, None, None)
    assert check(c, 1) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, 0)
    assert check(c, 5, policy=Policy.MONOTONIC)[0] is Outcome.ACCEPTED
    assert check(c, 0, admitted=False)[0] is Outcome.UNKNOWN_PRODUCER


@pytest.mark.parametrize(
    ("base", "count", "expected"),
    [
        (10, 1, (Outcome.ACCEPTED, None, None)),
        (10, 5, (Outcome.ACCEPTED, None, None)),
        (11, 1, (Outcome.OUT_OF_ORDER_SEQUENCE, None, 10)),
        (0, 5, (Outcome.DUPLICATE, 100, None)),
        (5, 5, (Outcome.DUPLICATE, 105, None)),
        (7, 2, (Outcome.DUPLICATE, 107, None)),
        (9, 1, (Outcome.DUPLICATE, 109, None)),
        (3, 4, (Outcome.DUPLICATE, 103, None)),  # spans two adjacent stored batches
    ],
)
def test_rules_after_two_batches(base: int, count: int, expected: tuple[Outcome, int | None, int | None]) -> None:
    c = PartitionChecker()
    stored(c, 0, 5, offset=100)
    stored(c, 5, 5, offset=105)
    assert check(c, base, count) == expected


def test_duplicate_across_non_adjacent_batches_has_no_offset() -> None:
    c = PartitionChecker()
    stored(c, 0, 5, offset=100)
    stored(c, 5, 5, offset=120)  # other producers' records between the two batches
    assert check(c, 3, 4) == (Outcome.DUPLICATE, None, None)
    assert check(c, 6, 3) == (Outcome.DUPLICATE, 121, None)


def test_straddling_and_malformed_are_rejected_without_change() -> None:
    c = PartitionChecker()
    stored(c, 0, 5)
    before = c.state()
    for header in [
        make_header(P, 0, 3, 4),  # straddles H=4
        make_header(P, 0, -1, 1),
        make_header(P, 0, MAX_SEQUENCE + 1, 1),
        make_header(P, 0, 5, 0),
        make_header(P, 0, 5, 2_000_000),
        make_header(P, -1, 5, 1),
        make_header(P, 2**15, 5, 1),
        make_header(-3, 0, 5, 1),
    ]:
        with pytest.raises(InvalidBatchError):
            c.check(header)
    assert c.state() == before


def test_in_flight_between_persisted_and_pushed() -> None:
    c = PartitionChecker()
    stored(c, 0, 2)
    t1 = c.push(make_header(P, 0, 2, 3), now=2.0)
    assert check(c, 2, 3)[0] is Outcome.IN_FLIGHT
    assert check(c, 5, 1) == (Outcome.ACCEPTED, None, None)  # pipelining continues past pushed
    assert check(c, 0, 2) == (Outcome.DUPLICATE, 0, None)
    with pytest.raises(InvalidBatchError):
        c.check(make_header(P, 0, 4, 2))  # straddles the pushed sequence
    c.commit(t1, 2)
    assert check(c, 2, 3) == (Outcome.DUPLICATE, 2, None)


def test_commits_apply_in_push_order() -> None:
    c = PartitionChecker()
    t0 = c.push(make_header(P, 0, 0, 2), now=1.0)
    t1 = c.push(make_header(8, 0, 0, 1), now=1.0)
    t2 = c.push(make_header(P, 0, 2, 1), now=1.0)
    c.commit(t2, 3)
    c.commit(t1, 2)
    assert c.state() == {} and c.pending == 3
    c.commit(t0, 0)
    assert c.pending == 0 and c.position == 4
    assert c.last_sequence(P) == 2 and c.last_sequence(8) == 0


def test_discard_pending_ignores_stale_tickets() -> None:
    c = PartitionChecker()
    stored(c, 0, 1)
    t = c.push(make_header(P, 0, 1, 1), now=1.0)
    c.discard_pending()
    assert check(c, 1)[0] is Outcome.ACCEPTED
    c.commit(t, 1)
    assert c.last_sequence(P) == 0


def test_epochs() -> None:
    c = PartitionChecker()
    stored(c, 0, 3, epoch=2)
    assert check(c, 3, epoch=1)[0] is Outcome.FENCED
    assert c.check(make_header(P, 1, 3, 1)).producer_epoch == 2
    # a newer epoch continues the sequence; its resends are duplicates
    assert check(c, 0, 3, epoch=3) == (Outcome.DUPLICATE, 0, None)
    assert check(c, 3, 1, epoch=3)[0] is Outcome.ACCEPTED
    stored(c, 3, 1, epoch=3)
    assert check(c, 4, epoch=2)[0] is Outcome.FENCED


@pytest.mark.parametrize("start", [MAX_SEQUENCE - 4, MAX_SEQUENCE - 1, MAX_SEQUENCE])
def test_wrap_around(start: int) -> None:
    c2 = PartitionChecker()
    # start near the top of the ring under the monotonic policy, then continue strictly
    assert check(c2, start, 1, policy=Policy.MONOTONIC)[0] is Outcome.ACCEPTED
    stored(c2, start, 1)
    nxt = (start + 1) % 2**31
    assert check(c2, nxt, 10) == (Outcome.ACCEPTED, None, None)
    stored(c2, nxt, 10)
    after = (nxt + 10) % 2**31
    assert check(c2, after)[0] is Outcome.ACCEPTED
    assert check(c2, nxt, 10)[0] is Outcome.DUPLICATE
    assert check(c2, start)[0] is Outcome.DUPLICATE
    assert check(c2, (after + 1) % 2**31) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, after)


def test_window_bounds_original_offsets() -> None:
    c = PartitionChecker(CheckerConfig(window=5))
    for i in range(8):
        stored(c, i, 1, offset=i * 10)
    assert check(c, 7) == (Outcome.DUPLICATE, 70, None)
    assert check(c, 3) == (Outcome.DUPLICATE, 30, None)
    assert check(c, 2) == (Outcome.DUPLICATE, None, None)  # out of the window: still a duplicate
    with pytest.raises(ConfigError):
        CheckerConfig(window=4)


def test_disabled_accepts_everything_but_follows_state() -> None:
    c = PartitionChecker()
    stored(c, 0, 2)
    assert check(c, 0, 2, enabled=False)[0] is Outcome.ACCEPTED
    assert check(c, 9, enabled=False)[0] is Outcome.ACCEPTED
    stored(c, 2, 3)
    assert check(c, 5, enabled=True)[0] is Outcome.ACCEPTED


def test_capacity_eviction_is_lru_and_skips_in_flight_producers() -> None:
    c = PartitionChecker(CheckerConfig(max_producers=3))
    stored(c, 0, 1, producer=1)
    stored(c, 0, 1, producer=2)
    stored(c, 0, 1, producer=3)
    stored(c, 1, 1, producer=1)  # 1 becomes the most recently active
    stored(c, 0, 1, producer=4)  # applying never evicts (replay must equal live operation)
    assert set(c.producers()) == {1, 2, 3, 4}
    pending = c.push(make_header(2, 0, 1, 1), now=1.0)  # 2 is the oldest, but has a batch in flight
    assert c.evict_over_capacity() == [ProducerId(3)]
    assert c.evict_over_capacity(room_for=1) == [ProducerId(1)]
    c.commit(pending, c.position)
    assert set(c.producers()) == {2, 4}


def test_expiry() -> None:
    c = PartitionChecker(CheckerConfig(producer_expiry=10.0))
    stored(c, 0, 1, producer=1)
    assert c.expire(5.0) == []
    assert c.expire(100.0) == [ProducerId(1)] and c.state() == {}


def test_snapshot_round_trip_and_replay_equals_live_state() -> None:
    live = PartitionChecker(CheckerConfig(window=5))
    log: list[StoredBatch] = []
    snap = None
    for i in range(30):
        producer = i % 3
        base = (i // 3) * 2
        offset = stored(live, base, 2, producer=producer)
        log.append(StoredBatch(offset, ProducerId(producer), Epoch(0), Sequence(base), 2, 1.0))
        if i == 17:
            snap = live.snapshot(5.0)
    assert snap is not None and snap.position == 36
    rebuilt, replayed = PartitionChecker.recover(snap, log, CheckerConfig(window=5))
    assert replayed == 12 and rebuilt.state() == live.state() and rebuilt.position == live.position
    full, replayed_all = PartitionChecker.recover(None, log, CheckerConfig(window=5))
    assert replayed_all == 30 and full.state() == live.state()
    with pytest.raises(CorruptDataError):
        PartitionChecker.restore(type(snap)(0, 0, 0.0, b"\x00garbage"))


def test_snapshot_due() -> None:
    c = PartitionChecker.restore(None, CheckerConfig(snapshot_entries=3, snapshot_seconds=60.0), now=100.0)
    assert not c.snapshot_due(100.0)
    stored(c, 0, 1)
    assert not c.snapshot_due(150.0) and c.snapshot_due(160.0)
    stored(c, 1, 1)
    stored(c, 2, 1)
    assert c.snapshot_due(101.0)
    c.snapshot(101.0)
    assert not c.snapshot_due(200.0)


# -- 64-bit sequences and jumps (boundaries of the int32 ring and of int64) -----------------

#: the boundaries every layer is tested at: around half the ring, the ring's end, and int64
BOUNDARIES = (2**30 - 1, 2**30, 2**30 + 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1)


@pytest.mark.parametrize("jump", BOUNDARIES)
def test_strict_refuses_a_jump_of_any_size_and_never_reads_it_as_a_duplicate(jump: int) -> None:
    c = PartitionChecker()
    stored(c, 0, 1)
    if jump <= MAX_SEQUENCE:
        assert check(c, jump) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, 1)
        assert check(c, jump, 3) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, 1)
    else:  # beyond the strict policy's int32 sequences: malformed there
        with pytest.raises(InvalidBatchError, match="needs monotonic"):
            check(c, jump)
    assert check(c, 1)[0] is Outcome.ACCEPTED


@pytest.mark.parametrize("jump", BOUNDARIES)
def test_strict_refuses_a_jump_with_batches_in_flight_and_after_a_wrap(jump: int) -> None:
    c = PartitionChecker()
    stored(c, MAX_SEQUENCE - 1, 4)  # ends at 1 after wrapping (reached by a resumed producer)
    c.push(make_header(P, 0, 2, 3), now=1.0)  # 2..4 in flight
    if jump > MAX_SEQUENCE:
        with pytest.raises(InvalidBatchError):
            check(c, jump)
        return
    outcome = check(c, jump)
    assert outcome[0] is not Outcome.ACCEPTED and outcome[0] is not Outcome.IN_FLIGHT
    # 2**31-1 is still in the window (a real resend); any other value is a refused jump
    if jump == MAX_SEQUENCE:
        assert outcome[0] is Outcome.DUPLICATE
    else:
        assert outcome == (Outcome.OUT_OF_ORDER_SEQUENCE, None, 5)


def test_monotonic_takes_64_bit_sequences_without_wrap_around() -> None:
    c = PartitionChecker()
    mono = {"policy": Policy.MONOTONIC}
    offsets = {}
    for seq in (0, *BOUNDARIES):
        assert check(c, seq, **mono)[0] is Outcome.ACCEPTED, seq
        offsets[seq] = stored(c, seq, 1)
    for seq, offset in offsets.items():
        assert check(c, seq, **mono) == (Outcome.DUPLICATE, offset, None)
    assert check(c, 2**31 + 7, **mono) == (Outcome.DUPLICATE, None, None)  # a hole behind H: dropped
    assert c.last_sequence(P) == 2**63 - 1
    with pytest.raises(InvalidBatchError):
        check(c, 2**63 - 1, 2, **mono)  # runs past int64


def test_monotonic_batch_may_not_cross_the_end_of_the_ring_nor_wrap_to_zero() -> None:
    c = PartitionChecker()
    mono = {"policy": Policy.MONOTONIC}
    with pytest.raises(InvalidBatchError, match="crosses"):
        check(c, MAX_SEQUENCE - 1, 3, **mono)
    stored(c, MAX_SEQUENCE - 1, 2)
    # a producer numbering its own records wraps to 0 here; under monotonic that is refused,
    # not read as a resend of sequence 0
    assert check(c, 0, **mono) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, MAX_SEQUENCE + 1)
    assert check(c, MAX_SEQUENCE + 1, 5, **mono)[0] is Outcome.ACCEPTED
    stored(c, MAX_SEQUENCE + 1, 5)
    assert check(c, MAX_SEQUENCE + 3, 2, **mono)[0] is Outcome.DUPLICATE
    assert check(c, MAX_SEQUENCE - 1, **mono)[0] is Outcome.DUPLICATE


def test_64_bit_state_survives_snapshot_and_replay() -> None:
    live = PartitionChecker(CheckerConfig(window=5))
    log: list[StoredBatch] = []
    snap = None
    for i, seq in enumerate((0, *BOUNDARIES)):
        offset = stored(live, seq, 1)
        log.append(StoredBatch(offset, ProducerId(P), Epoch(0), Sequence(seq), 1, 1.0))
        if i == 4:
            snap = live.snapshot(2.0)
    assert snap is not None
    rebuilt, replayed = PartitionChecker.recover(snap, log, CheckerConfig(window=5))
    assert replayed == 4 and rebuilt.state() == live.state() and rebuilt.last_sequence(P) == 2**63 - 1
    full, _ = PartitionChecker.recover(None, log, CheckerConfig(window=5))
    assert full.state() == live.state()


#: a snapshot written before 64-bit sequences (snapshot format 1): producer 7 at epoch 1 with
#: H = 4 in two batches, producer 9 with one batch that wrapped (2**31-2 .. 1) at offset 5
_OLD_SNAPSHOT = bytes.fromhex(
    "930109929607010404cb40000000000000009293000200930304039609000108cb40080000000000009193ce7ffffffe0105"
)


def test_snapshot_and_log_written_before_64_bit_sequences_still_load() -> None:
    from idempotent.core.records import Snapshot

    checker, replayed = PartitionChecker.recover(
        Snapshot(9, 3, 4.0, _OLD_SNAPSHOT),
        # batches written after the snapshot, as the old format stored them (one wraps)
        [
            StoredBatch(9, ProducerId(9), Epoch(0), Sequence(2), 3, 5.0),
            StoredBatch(12, ProducerId(11), Epoch(0), Sequence(MAX_SEQUENCE - 1), 3, 5.0),
        ],
    )
    assert replayed == 2 and checker.position == 15
    assert checker.state()[7] == (1, 4, 4, 2.0, ((0, 2, 0), (3, 4, 3)))
    assert checker.last_sequence(9) == 4 and checker.last_sequence(11) == 0
    assert checker.check(make_header(9, 0, MAX_SEQUENCE - 1, 2)).base_offset == 5
    assert checker.check(make_header(9, 0, 2, 3)).base_offset == 9
    assert checker.check(make_header(11, 0, MAX_SEQUENCE, 2)).base_offset == 13
    for producer_id, epoch, following in ((7, 1, 5), (9, 0, 5), (11, 0, 1)):
        assert checker.check(make_header(producer_id, epoch, following, 1)).outcome is Outcome.ACCEPTED


def test_snapshot_due_after_many_records_in_few_batches() -> None:
    # replay reads every record after the snapshot: large batches must not postpone it
    config = CheckerConfig(snapshot_entries=1000, snapshot_records=100, snapshot_seconds=3600.0)
    c = PartitionChecker.restore(None, config, now=0.0)
    stored(c, 0, 60)
    assert not c.snapshot_due(1.0) and not c.snapshot_overdue()
    stored(c, 60, 60)
    assert c.snapshot_due(1.0) and not c.snapshot_overdue()
    stored(c, 120, 80)
    assert c.snapshot_overdue()  # 200 records in 3 batches: written even with batches in flight
    c.snapshot(2.0)
    assert c.records_since_snapshot == 0 and not c.snapshot_due(3.0)
    # recovery counts what it replayed, so a crash right before the snapshot still triggers it
    snap = c.snapshot(3.0)
    again = PartitionChecker.recover(snap, iter([StoredBatch(200, P, Epoch(0), Sequence(200), 150, 1.0)]), config)[0]
    assert again.records_since_snapshot == 150 and again.snapshot_due(4.0)


def test_snapshot_records_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        CheckerConfig(snapshot_records=0)


def test_a_dropped_batch_is_never_applied_and_gives_its_sequences_back() -> None:
    """drop(): the backend refused a pushed batch and stored nothing of it, for certain."""
    c = PartitionChecker()
    stored(c, 0, 2)
    refused = c.push(make_header(P, 0, 2, 3), now=1.0)
    assert check(c, 2, 3)[0] is Outcome.IN_FLIGHT
    c.drop(refused)
    assert c.pending == 0 and c.producer(P).pushed_sequence == 1  # type: ignore[union-attr]
    assert check(c, 2, 1)[0] is Outcome.ACCEPTED  # its sequences may be sent again
    # with a later batch of the producer pushed behind it, that one still applies
    refused = c.push(make_header(P, 0, 2, 1), now=1.0)
    behind = c.push(make_header(P, 0, 3, 1), now=1.0)
    c.drop(refused)
    c.commit(behind, c.position)
    assert c.last_sequence(P) == 3 and c.pending == 0
    # a producer whose only batch was dropped is as if never seen: it must start at 0 again
    first = c.push(make_header(9, 0, 0, 1), now=1.0)
    c.drop(first)
    assert c.producer(9) is None


def _chained(
    checker: PartitionChecker, base: int, count: int, previous: int | None, **kw: object
) -> tuple[object, ...]:
    r = checker.check(make_header(P, 0, base, count, previous), policy=Policy.MONOTONIC, **kw)  # type: ignore[arg-type]
    return r.outcome, r.base_offset, r.expected_sequence


def test_monotonic_batch_naming_a_predecessor_that_never_arrived_is_refused() -> None:
    """Regression: a batch refused with nothing stored (the partition was recovering) was
    overtaken by the next one, and its resend was then answered DUPLICATE: lost."""
    c = PartitionChecker()
    # the first batch (0..9, predecessor -1) was refused; the next one names it
    assert _chained(c, 10, 10, 9) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, 0)
    assert _chained(c, 0, 10, -1)[0] is Outcome.ACCEPTED
    stored(c, 0, 10)
    assert _chained(c, 10, 10, 9)[0] is Outcome.ACCEPTED
    stored(c, 10, 10)
    # later: batch 30.. (predecessor 29) arrives while 20..29 was refused
    assert _chained(c, 30, 5, 29) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, 20)
    # and one in flight: the pushed sequence counts, not the stored one
    c.push(make_header(P, 0, 20, 10, 19), now=1.0)
    assert _chained(c, 30, 5, 29)[0] is Outcome.ACCEPTED
    assert _chained(c, 30, 5, 24) == (Outcome.OUT_OF_ORDER_SEQUENCE, None, 30)


def test_monotonic_declared_gap_is_accepted_and_classification_is_unchanged() -> None:
    c = PartitionChecker()
    assert _chained(c, 100, 1, -1)[0] is Outcome.ACCEPTED  # a first batch may start anywhere
    stored(c, 100, 1)
    assert _chained(c, 500, 3, 100)[0] is Outcome.ACCEPTED  # a gap the producer declares
    stored(c, 500, 3)
    # a resend of stored or in-flight sequences is classified as before, whatever it names
    assert _chained(c, 500, 3, 100) == (Outcome.DUPLICATE, 1, None)
    assert _chained(c, 100, 1, 42)[0] is Outcome.DUPLICATE
    c.push(make_header(P, 0, 600, 1, 502), now=1.0)
    assert _chained(c, 600, 1, 502)[0] is Outcome.IN_FLIGHT
    # without previous_sequence (old clients, replays) the gap rule of Pulsar applies
    assert _chained(c, 900, 1, None)[0] is Outcome.ACCEPTED
    assert _chained(c, 900, 1, 502)[0] is Outcome.OUT_OF_ORDER_SEQUENCE
    assert _chained(c, 900, 1, 600)[0] is Outcome.ACCEPTED
    assert _chained(PartitionChecker(), 7, 1, 3, enabled=False)[0] is Outcome.ACCEPTED  # dedup off


def test_strict_ignores_previous_sequence() -> None:
    c = PartitionChecker()
    assert c.check(make_header(P, 0, 0, 1, 55)).outcome is Outcome.ACCEPTED
    stored(c, 0, 1)
    assert c.check(make_header(P, 0, 1, 1, 77)).outcome is Outcome.ACCEPTED
    assert c.check(make_header(P, 0, 3, 1, 0)).outcome is Outcome.OUT_OF_ORDER_SEQUENCE


def test_previous_sequence_out_of_range_is_refused() -> None:
    with pytest.raises(InvalidBatchError, match="previous_sequence"):
        PartitionChecker().check(make_header(P, 0, 0, 1, -2))


def test_activity_is_the_last_stored_timestamp_or_now_while_in_flight() -> None:
    c = PartitionChecker()
    c.commit(c.push(make_header(1, 0, 0, 1), 5.0), 0)
    c.commit(c.push(make_header(2, 0, 0, 1), 6.0), 1)
    c.push(make_header(2, 0, 1, 1), 7.0)
    assert c.activity(9.0) == {1: 5.0, 2: 9.0}
    assert {pid: s.last_timestamp for pid, s in c.producers().items()} == {1: 5.0, 2: 6.0}


def _replayed(*batches: tuple[int, int, int, int]) -> PartitionChecker:
    """A checker rebuilt from no snapshot and these (epoch, base_sequence, count, offset)
    batches of producer P."""
    checker, _ = PartitionChecker.recover(
        None, [StoredBatch(o, ProducerId(P), Epoch(e), Sequence(s), n, 1.0) for e, s, n, o in batches]
    )
    return checker


@pytest.mark.parametrize(("policy", "restart"), [(Policy.STRICT, 0), (Policy.MONOTONIC, 0), (Policy.MONOTONIC, 2)])
def test_replay_starts_a_producer_over_when_a_higher_epoch_restarts_its_sequences(policy: Policy, restart: int) -> None:
    """A producer evicted after storing 0..4, then re-initialised (epoch 1), starts again
    where it has no state (0 under strict; anywhere under monotonic). A replay that still
    holds the old state (a snapshot from before the eviction, or the whole log) must start it
    over at that batch, as live operation did: not answer its next records DUPLICATE."""
    replayed = _replayed((0, 0, 5, 0), (1, restart, 1, 7))
    live = PartitionChecker()
    stored(live, restart, 1, epoch=1, offset=7)
    assert replayed.state() == live.state()
    assert check(replayed, restart + 1, epoch=1, policy=policy) == (Outcome.ACCEPTED, None, None)
    assert check(replayed, restart, epoch=1, policy=policy) == (Outcome.DUPLICATE, 7, None)


def test_a_higher_epoch_that_continues_the_sequences_keeps_the_window() -> None:
    """The named-producer rule: a new epoch continuing at H(P) + 1 (or across the wrap of the
    ring) is a continuation, not a restart; resends of the old epoch's records stay
    duplicates with their offsets."""
    c = _replayed((0, 0, 5, 0), (1, 5, 1, 7))
    assert check(c, 3, epoch=1) == (Outcome.DUPLICATE, 3, None)
    assert check(c, 6, epoch=1) == (Outcome.ACCEPTED, None, None)
    wrapped = _replayed((0, MAX_SEQUENCE - 4, 5, 0), (1, 0, 2, 5))
    assert check(wrapped, MAX_SEQUENCE - 1, epoch=1) == (Outcome.DUPLICATE, 3, None)
    assert check(wrapped, 2, epoch=1) == (Outcome.ACCEPTED, None, None)


def test_a_restart_stored_with_deduplication_off_builds_the_state_a_replay_builds() -> None:
    """With deduplication off a higher epoch may be stored at sequence 0 over existing state;
    the live commit starts the producer over as the replay does, so switching deduplication
    on again finds the same state either way."""
    live = PartitionChecker()
    stored(live, 0, 5, offset=0)
    assert check(live, 0, 2, epoch=1, enabled=False)[0] is Outcome.ACCEPTED
    stored(live, 0, 2, epoch=1, offset=5)
    assert live.state() == _replayed((0, 0, 5, 0), (1, 0, 2, 5)).state()
    assert check(live, 2, epoch=1) == (Outcome.ACCEPTED, None, None)
