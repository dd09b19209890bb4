"""The checker snapshot encoding (idempotent/core/snapshot.py): round trips, old format, corrupt bytes."""

from __future__ import annotations

import gc
import zlib
from array import array

import pytest

from idempotent.core.checker import CheckerConfig, PartitionChecker, Policy, make_header
from idempotent.core.records import Snapshot, StoredBatch
from idempotent.core.snapshot import FORMAT, MAGIC, Columns, decode, encode
from idempotent.core.types import (
    MAX_APPLICATION_SEQUENCE,
    MAX_EPOCH,
    MAX_PRODUCER_ID,
    MAX_SEQUENCE,
    Epoch,
    ProducerId,
    Sequence,
)
from idempotent.errors import CorruptDataError


def _fed(window: int = 5) -> PartitionChecker:
    """A checker with extreme values: 64-bit ids and sequences, the highest epoch, a wrap on
    the int32 ring, several window entries, one producer with nothing stored yet."""
    c = PartitionChecker(CheckerConfig(window=window))
    offset = 0

    def store(pid: int, epoch: int, base: int, count: int, now: float, policy: Policy = Policy.STRICT) -> None:
        nonlocal offset
        header = make_header(pid, epoch, base, count)
        assert c.check(header, policy=policy).outcome.name == "ACCEPTED"
        c.commit(c.push(header, now), offset)
        offset += count

    big = MAX_APPLICATION_SEQUENCE - 1_000
    for i in range(7):  # more batches than the window holds
        store(MAX_PRODUCER_ID, MAX_EPOCH, big + 10 * i, 10, 1e9 + i, Policy.MONOTONIC)
    c.apply(StoredBatch(offset, ProducerId(3), Epoch(0), Sequence(MAX_SEQUENCE - 5), 4, 2.5))  # from the log
    offset += 4
    store(3, 0, MAX_SEQUENCE - 1, 4, 3.25)  # wraps: MAX_SEQUENCE - 1 .. 1
    store(2**40, 17, 0, 1, -5.0)  # a timestamp before the epoch still round-trips
    c.push(make_header(99, 1, 0, 1), 4.0)  # in flight, nothing stored: not in the snapshot
    return c


def test_round_trip_keeps_64_bit_values_windows_and_eviction_order() -> None:
    live = _fed()
    snap = live.snapshot(10.0)
    assert snap.data[:5] == MAGIC + bytes([FORMAT])
    restored = PartitionChecker.restore(snap, live.config)
    assert restored.state() == live.state() and 99 not in restored.state()
    assert list(restored.producers()) == [MAX_PRODUCER_ID, 3, 2**40]  # least recently active first
    top = restored.producer(MAX_PRODUCER_ID)
    assert top is not None and top.producer_epoch == MAX_EPOCH and len(top.window) == 5
    assert top.last_sequence == MAX_APPLICATION_SEQUENCE - 1_000 + 69
    assert restored.last_sequence(3) == 1 and restored.position == live.position
    # duplicates are still answered with their original offsets, and the next batches fit
    assert restored.check(make_header(3, 0, MAX_SEQUENCE - 1, 4)).base_offset == 74
    assert restored.check(make_header(3, 0, 2, 1)).outcome.name == "ACCEPTED"
    header = make_header(MAX_PRODUCER_ID, MAX_EPOCH, MAX_APPLICATION_SEQUENCE - 1_000 + 60, 10)
    assert restored.check(header, policy=Policy.MONOTONIC).base_offset == 60
    # and a snapshot of the restored checker is the same bytes
    assert restored.snapshot(10.0).data == snap.data


def test_restore_then_replay_equals_the_live_state_across_evictions() -> None:
    live = PartitionChecker(CheckerConfig(max_producers=50))
    log = []
    offset = 0
    snap = None
    for lap in range(4):
        for pid in range(lap * 20, lap * 20 + 40):
            header = make_header(pid, 0, lap, 1) if lap and pid < lap * 20 + 20 else make_header(pid, 0, 0, 1)
            if live.check(header).outcome.name != "ACCEPTED":
                continue
            live.commit(live.push(header, float(lap)), offset)
            log.append(StoredBatch(offset, header.producer_id, header.producer_epoch, header.base_sequence, 1, lap))
            offset += 1
        live.evict_over_capacity()
        if lap == 1:
            snap = live.snapshot(1.0)  # freed slots are reused after this
    assert snap is not None
    rebuilt, replayed = PartitionChecker.recover(snap, log, live.config)
    rebuilt.evict_over_capacity()
    assert replayed > 0 and list(rebuilt.state()) == list(live.state())
    assert rebuilt.state() == live.state()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d[:5] + bytes([d[5] ^ 0xFF]) + d[6:], "corrupt checker snapshot"),  # zlib header
        (lambda d: d[:-6] + bytes([d[-6] ^ 0x01]) + d[-5:], "corrupt checker snapshot"),  # checksum
        (lambda d: d[: len(d) // 2], "corrupt checker snapshot"),  # truncated
        (lambda d: MAGIC + bytes([FORMAT + 1]) + d[5:], "unknown checker snapshot format"),
        (lambda d: b"", "corrupt checker snapshot"),
        (lambda d: b"\x00garbage", "corrupt checker snapshot"),
    ],
)
def test_damaged_bytes_raise_a_clear_error(damage: object, message: str) -> None:
    data = _fed().snapshot(1.0).data
    with pytest.raises(CorruptDataError, match=message):
        PartitionChecker.restore(Snapshot(1, 0, 1.0, damage(data)))  # type: ignore[operator]


def _body(columns: Columns) -> bytes:
    return zlib.decompress(encode(columns)[5:])


def _columns(**changes: array[int]) -> Columns:
    columns = Columns(
        10,
        array("q", [1, 2]),
        array("h", [0, 0]),
        array("q", [0, 4]),
        array("d", [1.0, 2.0]),
        array("q", [0, 0]),
        array("q", [0, 1]),
        array("i", [1, 5]),
    )
    for name, value in changes.items():
        setattr(columns, name, value)
    return columns


@pytest.mark.parametrize(
    "changes",
    [
        {"producer_epoch": array("h", [0, -1])},
        {"record_count": array("i", [1, 0])},
        {"base_offset": array("q", [0, 11])},
        {"producer_id": array("q", [2, 2])},
        {"last_sequence": array("q", [0, -7])},
    ],
)
def test_values_no_checker_writes_are_refused(changes: dict[str, array[int]]) -> None:
    assert decode(encode(_columns())).producer_id == array("q", [1, 2])
    with pytest.raises(CorruptDataError, match=r"out of range|twice"):
        decode(encode(_columns(**changes)))


def test_extra_bytes_after_the_columns_are_refused() -> None:
    body = _body(_columns()) + b"\x00" * 8
    with pytest.raises(CorruptDataError, match="after the last column"):
        decode(MAGIC + bytes([FORMAT]) + zlib.compress(body))


def test_tracked_producers_are_not_python_objects_each() -> None:
    # the persisted view is columns: tracking more producers adds no container objects
    c = PartitionChecker(CheckerConfig(max_producers=20_000))
    gc.collect()
    before = len(gc.get_objects())
    for pid in range(10_000):
        header = make_header(pid, 0, 0, 1)
        c.commit(c.push(header, 0.0), pid)
    gc.collect()
    # (a bounded number of settled pushed views stays: at most 1024, not one per producer)
    assert len(gc.get_objects()) - before < 1_100
    assert c.producer_count == 10_000 and c.last_sequence(9_999) == 0


def test_a_replayed_batch_behind_the_stored_sequence_round_trips() -> None:
    # a new epoch that starts over from 0 (after an eviction) replaces what was stored before
    c = PartitionChecker()
    c.apply(StoredBatch(0, ProducerId(5), Epoch(0), Sequence(0), 10, 1.0))
    c.apply(StoredBatch(10, ProducerId(5), Epoch(1), Sequence(0), 2, 2.0))  # a new epoch from 0
    assert c.last_sequence(5) == 1 and c.state()[5][4] == ((0, 1, 10),)
    restored = PartitionChecker.restore(c.snapshot(3.0))
    assert restored.state() == c.state()
    assert restored.check(make_header(5, 1, 0, 2)) == c.check(make_header(5, 1, 0, 2))


@pytest.mark.parametrize(("epoch", "count"), [(MAX_EPOCH + 1, 1), (-1, 1), (0, 1_000_001), (0, 0)])
def test_a_replayed_batch_out_of_range_is_corrupt_data(epoch: int, count: int) -> None:
    c = PartitionChecker()
    with pytest.raises(CorruptDataError, match="out of range"):
        c.apply(StoredBatch(0, ProducerId(5), Epoch(epoch), Sequence(0), count, 1.0))
    assert c.state() == {} and c.position == 0


def test_a_producer_with_nothing_stored_is_left_out_after_discard_pending() -> None:
    c = PartitionChecker()
    c.commit(c.push(make_header(1, 0, 0, 1), 1.0), 0)
    c.push(make_header(2, 0, 0, 1), 1.0)  # its outcome becomes unknown: nothing stored for it
    c.discard_pending()
    restored = PartitionChecker.restore(c.snapshot(2.0))
    assert restored.state() == c.state() and list(restored.producers()) == [1]
