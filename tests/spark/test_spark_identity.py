"""Replay-stable identity of rows written from Spark (pure; no Spark needed)."""

from __future__ import annotations

import pytest

from idempotent.errors import ConfigError
from idempotent.spark._identity import (
    EARLIEST,
    LATEST,
    RowRouter,
    batch_producer_name,
    parse_offsets,
    resolve_offset,
    stream_producer_name,
    stream_sequence_base,
)


def test_names_depend_on_job_partition_and_batch_only() -> None:
    assert batch_producer_name("daily", 3) == "spark/daily/3"
    assert stream_producer_name("q-1", 3) == "spark/q-1/3"
    with pytest.raises(ConfigError, match="job"):
        batch_producer_name("", 0)


def test_sequences_count_rows_per_topic_partition() -> None:
    router = RowRouter(2)
    routed = [router.route(None, None) for _ in range(5)]  # round robin by row index
    assert routed == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    again = RowRouter(2)
    assert [again.route(None, None) for _ in range(5)] == routed  # a replay numbers alike


def test_micro_batches_continue_one_producers_sequences() -> None:
    assert stream_sequence_base(0) == 0
    assert stream_sequence_base(7) == 7 << 32
    later = RowRouter(2, stream_sequence_base(8))
    assert later.route(None, None) == (0, 8 << 32)
    # every row of batch 7 sorts below every row of batch 8, however many rows batch 7 had
    assert RowRouter(1, stream_sequence_base(7)).route(None, None)[1] + 2**32 - 1 < 8 << 32
    for bad in (-1, 2**31):
        with pytest.raises(ConfigError):
            stream_sequence_base(bad)


def test_keys_and_explicit_partitions() -> None:
    router = RowRouter(4)
    first = router.route(b"k", None)
    assert router.route(b"k", None) == (first[0], 1)
    assert router.route(None, 3) == (3, 0 if first[0] != 3 else 2)
    with pytest.raises(ConfigError, match="has partitions 0"):
        router.route(None, 4)


def test_offsets_options() -> None:
    assert parse_offsets(None, "t", 2, EARLIEST) == {0: EARLIEST, 1: EARLIEST}
    assert parse_offsets("latest", "t", 2, EARLIEST) == {0: LATEST, 1: LATEST}
    assert parse_offsets('{"t": {"1": 5}}', "t", 2, LATEST) == {0: LATEST, 1: 5}
    for bad in ("nope", '{"u": {"0": 1}}', '{"t": {"2": 1}}', '{"t": {"0": -3}}', '{"t": {"x": 1}}', '{"t": 1}'):
        with pytest.raises(ConfigError):
            parse_offsets(bad, "t", 2, LATEST)
    assert resolve_offset(EARLIEST, 9) == 0
    assert resolve_offset(LATEST, 9) == 9
    assert resolve_offset(4, 9) == 4


def test_spread_routes_like_one_row_at_a_time() -> None:
    for partitions, counts in ((3, [7, 1, 5]), (4, [2, 9]), (1, [3, 3])):
        one, many = RowRouter(partitions, 10), RowRouter(partitions, 10)
        for count in counts:
            rows = [one.route(None, None) for _ in range(count)]
            for partition, offset, first in many.spread(count):
                mine = [(partition, first + k) for k in range(len(range(offset, count, partitions)))]
                assert mine == rows[offset::partitions]
        assert (one.index, one.next_sequence) == (many.index, many.next_sequence)


def test_route_many_routes_like_one_row_at_a_time() -> None:
    keys = [b"a", None, b"b", b"c", None, b"a", b"zz"]
    parts: list[int | None] = [None, 2, None, 0, None, None, 1]
    for partitions, row_keys, row_parts in ((3, keys, None), (3, keys, parts), (3, None, parts), (4, None, None)):
        for base in (0, 5 << 32):
            one, many = RowRouter(partitions, base), RowRouter(partitions, base)
            for _ in range(2):  # a second batch continues the first one's numbering
                rows = [
                    one.route(row_keys[i] if row_keys else None, row_parts[i] if row_parts else None)
                    for i in range(len(keys))
                ]
                routed, first = many.route_many(len(keys), row_keys, row_parts)
                numbered = list(first)
                mine = []
                for partition in routed:
                    mine.append((partition, numbered[partition]))
                    numbered[partition] += 1
                assert mine == rows
            assert (one.index, one.next_sequence) == (many.index, many.next_sequence)
    router = RowRouter(2)
    with pytest.raises(ConfigError, match="has partitions 0"):
        router.route_many(2, None, [0, 2])
    assert (router.index, router.next_sequence) == (0, [0, 0])  # nothing routed
    full = RowRouter(1, 7 << 32)
    full.next_sequence = [(8 << 32) - 1]
    with pytest.raises(ConfigError, match="2\\*\\*32"):
        full.route_many(2)
