"""HeadIndex: the batch heads a Kafka backend remembers (adapters/kafka/heads.py), pure."""

from __future__ import annotations

import pytest

from idempotent.adapters.kafka.heads import BatchHead, HeadIndex
from idempotent.core.types import MAX_SEQUENCE
from idempotent.errors import ConfigError


def head(first: int, count: int, base: int = 0) -> BatchHead:
    return BatchHead(first, count, 7, 1, base, 12.5)


def test_a_head_covers_its_records_only() -> None:
    h = head(10, 3, base=100)
    assert [h.covers(o) for o in (9, 10, 12, 13)] == [False, True, True, False]
    assert [h.sequence_of(o) for o in (10, 11, 12)] == [100, 101, 102]


def test_sequences_wrap_at_the_int32_ring_end_as_the_checker_counts_them() -> None:
    assert head(0, 3, base=MAX_SEQUENCE).sequence_of(1) == 0


def test_covering_finds_the_nearest_head_before_an_offset_when_its_count_reaches_it() -> None:
    index = HeadIndex()
    for h in (head(20, 5), head(0, 10), head(11, 2)):  # out of order
        index.add(h)
    assert index.covering(0) == head(0, 10)
    assert index.covering(9) == head(0, 10)
    assert index.covering(10) is None  # a gap: a transaction marker, or a foreign record
    assert index.covering(12) == head(11, 2)
    assert index.covering(24) == head(20, 5)
    assert index.covering(25) is None
    index.add(head(0, 10))  # again: no change
    assert len(index) == 3


def test_the_lowest_heads_are_forgotten_beyond_capacity() -> None:
    index = HeadIndex(capacity=2)
    index.add(head(10, 1))
    index.add(head(20, 1))
    index.add(head(30, 1))
    assert len(index) == 2 and index.covering(10) is None and index.covering(30) == head(30, 1)
    index.add(head(0, 1))  # lower than everything kept: not kept
    assert index.covering(0) is None and len(index) == 2


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        HeadIndex(capacity=0)


def test_a_batch_without_a_producer_has_no_sequences() -> None:
    h = BatchHead(5, 3, -1, -1, -1, 1.0)
    assert h.covers(7) and h.sequence_of(7) == -1


def test_runs_of_foreign_records_are_remembered_and_extended_by_the_next_one() -> None:
    index = HeadIndex()
    index.note_foreign(10, 20)
    index.note_foreign(21, 30)  # touches: one run
    index.note_foreign(50, 60)
    assert index.foreign(10) and index.foreign(30) and not index.foreign(9) and not index.foreign(40)
    assert index.foreign(31)  # right after a run: no batch can hold it
    assert index.foreign(32)  # the run grew by the one before
    assert not index.foreign(49) and index.foreign(61)
