"""Reruns of a Spark batch job: the ledger's decisions (pure; no Spark needed)."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent.errors import ConfigError
from idempotent.spark._rerun import (
    COMPLETE,
    SEGMENT_BITS,
    FileSplit,
    JobHistory,
    Mode,
    Segment,
    SegmentCheck,
    commit_record,
    decode,
    done_record,
    encode,
    job_record,
    plan_run,
    progress_record,
    row_digest,
    run_record,
    segment_record,
    stored_counts,
)

JOB = "nightly"


def _history(*records: dict[str, Any]) -> JobHistory:
    return JobHistory.from_records(JOB, [decode(encode(r)) or {} for r in records])


def _segment(run: str, producer: str, index: int, unit: str, first: int, **extra: Any) -> dict[str, Any]:
    previous = extra.pop("previous_end", None)
    return segment_record(JOB, Segment(run, producer, index, unit, first, **extra), previous)


def test_records_round_trip_and_fold_into_a_history() -> None:
    split = FileSplit("/in/a.csv", 0, 100, 250, 7)
    history = _history(
        job_record(JOB, Mode.SPLIT, 0),
        run_record(JOB, "r1"),
        run_record("other-job", "x"),
        _segment("r1", "p0", 0, split.key, 0, split=split),
        _segment("r1", "p0", 1, "/in/b.csv@0+50", 0, previous_end=41),
        done_record(JOB, "r1", "p0", 2, 17),
        commit_record(JOB, "r1", 1),
    )
    assert history.mode is Mode.SPLIT and history.runs == ["r1"] and history.committed
    first, second = history.segments
    assert (first.split, first.end, second.end) == (split, 41, 17)
    assert history.finished == {"p0"}
    assert decode(b"not json") is None and decode(b"[1]") is None
    with pytest.raises(ConfigError, match="new job name"):
        JobHistory.from_records(JOB, [{"kind": "segment", "job": JOB}])


def test_stored_counts_follow_the_producers_last_sequence() -> None:
    segment = Segment("r1", "p", 2, "u", 0)
    base = 2 << SEGMENT_BITS
    last = {0: base + 9, 1: base - 1, 2: (3 << SEGMENT_BITS) + 4}  # partition 3: nothing
    assert stored_counts(segment, last, 4, finished=False) == (10, 0, COMPLETE, 0)
    assert stored_counts(segment, {}, 2, finished=True) == (COMPLETE, COMPLETE)


def _partial_run(mode: Mode, *segments: dict[str, Any], done: tuple[str, ...] = ()) -> JobHistory:
    return _history(
        job_record(JOB, mode, 0),
        run_record(JOB, "r1"),
        *segments,
        *(done_record(JOB, "r1", name, 1, None) for name in done),
        run_record(JOB, "r2"),
    )


def test_a_committed_job_is_finished_whatever_this_run_looks_like() -> None:
    history = _history(job_record(JOB, Mode.PARTITION, 0), run_record(JOB, "r1"), commit_record(JOB, "r1", 3))
    for mode in Mode:
        assert plan_run(JOB, "r2", mode, history, {}, 2).finished


def test_a_partial_job_without_positions_is_refused_unless_the_partitioning_is_asserted() -> None:
    history = _partial_run(Mode.PARTITION, _segment("r1", "spark/nightly/0", 0, "partition:0", 0, digest=5))
    stored = {"spark/nightly/0": {0: 99}}
    with pytest.raises(ConfigError) as refused:
        plan_run(JOB, "r2", Mode.PARTITION, history, stored, 2)
    first_line = str(refused.value).splitlines()[0]
    assert "stopped part way" in first_line and "samePartitioning" in first_line and "_metadata" in first_line
    plan = plan_run(JOB, "r2", Mode.PARTITION, history, stored, 2, same_partitioning=True)
    assert plan.resuming and plan.digests == {"partition:0": 5}
    # an earlier run that stored nothing leaves nothing to refuse
    assert not plan_run(JOB, "r2", Mode.PARTITION, history, {}, 2).resuming


def test_same_partitioning_still_checks_each_partitions_first_row() -> None:
    digest = row_digest(b"row 0", None)
    history = _partial_run(Mode.PARTITION, _segment("r1", "spark/nightly/0", 0, "partition:0", 0, digest=digest))
    plan = plan_run(JOB, "r2", Mode.PARTITION, history, {"spark/nightly/0": {0: 5}}, 1, same_partitioning=True)
    SegmentCheck(plan, "partition:0", 0, digest=digest, partitions=1)  # the same first row: fine
    with pytest.raises(ConfigError, match="starts with another row"):
        SegmentCheck(plan, "partition:0", 0, digest=row_digest(b"row 4000", None), partitions=1)
    assert row_digest(b"a", None) != row_digest(b"a", b"")


def test_another_identity_mode_than_the_partial_run_is_refused() -> None:
    history = _partial_run(Mode.SPLIT, _segment("r1", "p", 0, "/a@0+10", 0, split=FileSplit("/a", 0, 10, 10, 1)))
    with pytest.raises(ConfigError, match="identified by their file splits"):
        plan_run(JOB, "r2", Mode.PARTITION, history, {"p": {0: 3}}, 1)


def _split_plan(*entries: tuple[str, FileSplit, int], done: tuple[str, ...] = (), partitions: int = 2) -> Any:
    """A partial split-mode run: ``(producer, split, last sequence on every partition)``."""
    segments = [_segment("r1", name, 0, split.key, 0, split=split) for name, split, _ in entries]
    history = _partial_run(Mode.SPLIT, *segments, done=done)
    stored = {name: dict.fromkeys(range(partitions), last) for name, _, last in entries}
    return plan_run(JOB, "r2", Mode.SPLIT, history, stored, partitions)


def test_split_mode_continues_identical_splits_and_refuses_other_splits_of_a_partly_stored_file() -> None:
    size = 1000
    a0, a1 = FileSplit("/a", 0, 400, size, 1), FileSplit("/a", 400, 400, size, 1)
    plan = _split_plan(("p0", a0, 99), ("p1", a1, -1))  # a0 partly stored, a1 nothing
    assert plan.resuming and plan.split_size == 400
    same = SegmentCheck(plan, a0.key, 0, split=a0, partitions=2)
    assert same.prefix == [100, 100] and not same.skip_all
    with pytest.raises(ConfigError) as refused:  # a smaller split inside the partly stored one
        SegmentCheck(plan, "x", 0, split=FileSplit("/a", 0, 100, size, 1), partitions=2)
    first_line = str(refused.value).splitlines()[0]
    assert "partitioning changed" in first_line and "maxPartitionBytes" in first_line and "400" in first_line
    # a split the earlier run never stored, cut like the earlier run's: fresh
    fresh = SegmentCheck(plan, "y", 0, split=FileSplit("/a", 800, 200, size, 1), partitions=2)
    assert fresh.prefix is None and not fresh.skip_all and not fresh.row_by_row
    # ... but cut another way: refused, although nothing of it is stored, so that a later
    # rerun with the earlier split size does not meet splits it cannot match
    with pytest.raises(ConfigError, match="split files into 400 bytes"):
        SegmentCheck(plan, "z", 0, split=FileSplit("/a", 900, 100, size, 1), partitions=2)
    with pytest.raises(ConfigError, match="changed since"):
        SegmentCheck(plan, a0.key, 0, split=FileSplit("/a", 0, 400, size + 1, 1), partitions=2)


def test_split_mode_skips_a_split_that_completely_stored_splits_cover() -> None:
    size = 1000
    a0, a1 = FileSplit("/a", 0, 500, size, 1), FileSplit("/a", 500, 500, size, 1)
    plan = _split_plan(("p0", a0, 7), ("p1", a1, 3), done=("p0",))
    covered = SegmentCheck(plan, "small", 0, split=FileSplit("/a", 100, 300, size, 1), partitions=2)
    assert covered.skip_all
    with pytest.raises(ConfigError, match="partitioning changed"):  # reaches into a1, stored in part
        SegmentCheck(plan, "across", 0, split=FileSplit("/a", 400, 300, size, 1), partitions=2)


def _position_plan(*segments: dict[str, Any], stored: dict[str, dict[int, int]], done: tuple[str, ...] = ()) -> Any:
    history = _partial_run(Mode.POSITION, *segments, done=done)
    return plan_run(JOB, "r2", Mode.POSITION, history, stored, 2)


def test_position_mode_counts_rows_of_earlier_segments_that_start_inside_this_one() -> None:
    # run 1: producer A wrote unit u from 0 (3 rows stored on partition 0, 1 on 1), producer B
    # from 100 to 190 (its task finished: every row), producer C from 200 (nothing stored)
    plan = _position_plan(
        _segment("r1", "A", 0, "u", 0),
        _segment("r1", "B", 0, "u", 100),
        _segment("r1", "C", 0, "u", 200),
        done_record(JOB, "r1", "B", 1, 190),
        stored={"A": {0: 2, 1: 0}, "B": {0: 5, 1: 5}},
    )
    check = SegmentCheck(plan, "u", 0, partitions=2)  # this run reads u whole
    assert check.row_by_row
    rows = [(o, (o // 10) % 2) for o in range(0, 300, 10)]  # ordinal, partition
    stored = [o for o, p in rows if check.stored(o, p)]
    # A: its first 3 rows on partition 0 (0, 20, 40) and its first on partition 1 (10); B: all
    assert stored == [0, 10, 20, 40, *range(100, 200, 10)]
    # starting inside B (finished) is fine: its rows are stored, whatever the split
    check = SegmentCheck(plan, "u", 150, partitions=2)
    assert [o for o in range(150, 300, 10) if check.stored(o, 0)] == list(range(150, 200, 10))


def test_position_mode_refuses_a_finished_segment_whose_end_is_unknown() -> None:
    plan = _position_plan(_segment("r1", "B", 0, "u", 100), stored={}, done=("B",))
    with pytest.raises(ConfigError, match="end"):
        SegmentCheck(plan, "u", 0, partitions=2)


def test_position_mode_refuses_to_start_inside_a_partly_stored_segment() -> None:
    plan = _position_plan(_segment("r1", "A", 0, "u", 0), stored={"A": {0: 2}})
    with pytest.raises(ConfigError) as refused:
        SegmentCheck(plan, "u", 60, partitions=2)
    assert "position 60" in str(refused.value).splitlines()[0]
    same_start = SegmentCheck(plan, "u", 0, partitions=2)
    assert same_start.prefix == [3, 0]
    assert not SegmentCheck(plan, "v", 60, partitions=2).row_by_row  # another unit: fresh


def test_fits_says_which_splits_a_split_size_makes() -> None:
    assert FileSplit("/a", 0, 100, 100, 1).fits(10)  # a whole file, whatever the size
    assert FileSplit("/a", 20, 10, 100, 1).fits(10)
    assert FileSplit("/a", 90, 10, 100, 1).fits(10)
    assert not FileSplit("/a", 90, 10, 100, 1).fits(20)
    assert not FileSplit("/a", 5, 10, 100, 1).fits(10)


def test_position_mode_knows_where_a_cut_off_segment_may_have_stored_rows() -> None:
    """A killed task's segment has no end; its progress records bound what it stored, so a
    rerun with the same splits may start the next range right after it."""
    plan = _position_plan(
        _segment("r1", "A", 0, "u", 0),
        progress_record(JOB, "r1", "A", 0, 9_999),
        progress_record(JOB, "r1", "A", 0, 19_999),
        stored={"A": {0: 3_000}},
    )
    assert plan.earlier["u"][0].segment.reached == 19_999
    assert not SegmentCheck(plan, "u", 20_000, partitions=2).row_by_row  # after it: fresh
    with pytest.raises(ConfigError, match="inside that part"):
        SegmentCheck(plan, "u", 10_000, partitions=2)
