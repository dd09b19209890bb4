"""Table-driven tests of the pure broker-side checker (idempotent/_checker.py)."""

from __future__ import annotations

import pytest

from idempotent._checker import CheckerConfig, PartitionChecker, Policy, make_header
from idempotent._outcomes import Outcome
from idempotent._records import StoredBatch
from idempotent._types import MAX_SEQUENCE, Epoch, ProducerId, Sequence
from idempotent.errors import ConfigError, InvalidBatchError

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
    with pytest.raises(ValueError):
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
