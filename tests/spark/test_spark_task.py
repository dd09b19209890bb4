"""The sink's tasks without Spark: ``write_task`` over Arrow batches, runs planned as the
driver plans them (``plan_batch``), through the broker server the data source starts.

Spark's splits are made up here, so that tasks read several files or splits each (several
segments per producer), reruns group them differently, and a cut-off task stops where a test
says: what the Spark tests cannot arrange on one small machine.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

import idempotent
import idempotent.spark
from idempotent.errors import ConfigError
from idempotent.spark._ledger import plan_batch
from idempotent.spark._options import Options
from idempotent.spark._sink import BatchWriter, Written, write_task

SIZE = 1_000  # bytes of every made-up file; splits of 250 bytes
MODIFIED = 1_700_000_000_000_000


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    previous = os.environ.get("IDEMPOTENT_SPARK_HOSTS")
    os.environ["IDEMPOTENT_SPARK_HOSTS"] = str(tmp_path / "hosts")
    address = f"sqlite:///{tmp_path / 'out.db'}"
    yield address
    idempotent.spark.stop_host(address)
    if previous is None:
        os.environ.pop("IDEMPOTENT_SPARK_HOSTS")
    else:
        os.environ["IDEMPOTENT_SPARK_HOSTS"] = previous


def _schema(row_index: bool) -> StructType:
    fields = [
        StructField("file_path", StringType()),
        StructField("file_size", LongType()),
        StructField("file_block_start", LongType()),
        StructField("file_block_length", LongType()),
        StructField("file_modification_time", TimestampType()),
    ]
    if row_index:
        fields.append(StructField("row_index", LongType()))
    return StructType(
        [
            StructField("value", BinaryType()),
            StructField("key", BinaryType()),
            StructField("_metadata", StructType(fields)),
        ]
    )


def _split_rows(path: str, start: int, length: int, rows_per_split: int) -> list[tuple[str, int, int, int]]:
    """``(path, block start, block length, row index)`` of the rows of one split."""
    first = start // 250 * rows_per_split
    return [(path, start, length, first + i) for i in range(rows_per_split)]


def _batches(rows: list[tuple[str, int, int, int]], keyed: bool, per_batch: int = 7) -> list[pa.RecordBatch]:
    out = []
    for begin in range(0, len(rows), per_batch):
        chunk = rows[begin : begin + per_batch]
        meta = pa.StructArray.from_arrays(
            [
                pa.array([r[0] for r in chunk]),
                pa.array([SIZE] * len(chunk), pa.int64()),
                pa.array([r[1] for r in chunk], pa.int64()),
                pa.array([r[2] for r in chunk], pa.int64()),
                pa.array([MODIFIED] * len(chunk), pa.timestamp("us")),
                pa.array([r[3] for r in chunk], pa.int64()),
            ],
            names=[
                "file_path",
                "file_size",
                "file_block_start",
                "file_block_length",
                "file_modification_time",
                "row_index",
            ],
        )
        values = pa.array([f"{r[0]}#{r[3]}".encode() for r in chunk], pa.binary())
        keys = pa.array([f"k{r[3] % 5}".encode() if keyed else None for r in chunk], pa.binary())
        out.append(pa.record_batch([values, keys, meta], names=["value", "key", "_metadata"]))
    return out


def _cut(batches: list[pa.RecordBatch], after: int) -> Iterator[pa.RecordBatch]:
    """The first ``after`` batches, then the task dies."""
    for number, batch in enumerate(batches):
        if number == after:
            raise RuntimeError("the task was killed")
        yield batch


class _Run:
    """One run of a job: a plan, tasks, then commit or abort."""

    def __init__(self, url: str, topic: str, job: str, row_index: bool) -> None:
        self.options = Options({"url": url, "topic": topic, "job": job, "partitions": "3"})
        self.plan = plan_batch(self.options, _schema(row_index))
        self.messages: list[Written | None] = []

    def task(self, spark_partition: int, batches: Iterator[pa.RecordBatch] | list[pa.RecordBatch]) -> None:
        rerun = self.plan.rerun
        name = f"spark/{rerun.job}/{rerun.run}/{spark_partition}"
        try:
            self.messages.append(
                write_task(self.options.url, self.options.topic, name, iter(batches), 1.0, batch_plan=self.plan)
            )
        except RuntimeError:
            self.messages.append(None)

    def end(self) -> None:
        writer = BatchWriter(self.options, self.plan)
        if all(self.messages):
            writer.commit(list(self.messages))
        else:
            writer.abort(list(self.messages))


def _stored(url: str, topic: str) -> Counter[bytes]:
    counts: Counter[bytes] = Counter()
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        for partition in range(broker.partitions_for(topic, create=False)):
            position = 0
            while records := broker.read(topic, partition, position, 1000):
                counts.update(r.value for r in records if r.value is not None)
                position = records[-1].offset + 1
    return counts


def _every(files: list[str], rows_per_split: int) -> Counter[bytes]:
    return Counter(f"{f}#{i}".encode() for f in files for i in range(4 * rows_per_split))


@pytest.mark.parametrize("keyed", [False, True], ids=["round-robin", "keyed"])
@pytest.mark.parametrize("row_index", [False, True], ids=["splits", "positions"])
def test_tasks_of_several_files_resumed_with_another_grouping_store_every_row_once(
    url: str, keyed: bool, row_index: bool
) -> None:
    """Run 1: two tasks read files a, b, c (4 splits each) in other groupings than run 2,
    and are killed part way; run 2 (the same splits, grouped the other way) completes the job."""
    topic, job, per = f"t{uuid.uuid4().hex[:6]}", "several-files", 9
    splits = [(f, s) for f in ("/in/a", "/in/b", "/in/c") for s in (0, 250, 500, 750)]
    rows = {split: _split_rows(split[0], split[1], 250, per) for split in splits}

    def task_rows(chosen: list[tuple[str, int]]) -> list[tuple[str, int, int, int]]:
        return [row for split in chosen for row in rows[split]]

    first = _Run(url, topic, job, row_index)
    first.task(0, _cut(_batches(task_rows(splits[:7]), keyed), after=5))  # 35 rows into the 4th split
    first.task(1, _cut(_batches(task_rows(splits[7:]), keyed), after=2))
    first.end()
    partial = _stored(url, topic)
    assert 0 < sum(partial.values()) < 12 * per and max(partial.values()) == 1
    second = _Run(url, topic, job, row_index)
    assert second.plan.rerun.resuming
    second.task(0, _batches(task_rows(splits[::2]), keyed))  # every other split: another grouping
    second.task(1, _batches(task_rows(splits[1::2]), keyed))
    second.end()
    assert _stored(url, topic) == _every(["/in/a", "/in/b", "/in/c"], per)
    third = _Run(url, topic, job, row_index)
    assert third.plan.rerun.finished
    third.task(0, _batches(task_rows(splits), keyed))
    assert _stored(url, topic) == _every(["/in/a", "/in/b", "/in/c"], per)


def test_positions_resume_with_larger_splits_across_several_cut_off_tasks(url: str) -> None:
    """Run 1 read file a in 4 splits (4 tasks, each cut off part way); run 2 reads it whole
    in one task: each earlier segment is counted from its start, row by row."""
    topic, job, per = f"t{uuid.uuid4().hex[:6]}", "coarser", 12
    rows = [_split_rows("/in/a", start, 250, per) for start in (0, 250, 500, 750)]
    first = _Run(url, topic, job, row_index=True)
    for number, split_rows in enumerate(rows):
        first.task(number, _cut(_batches(split_rows, keyed=True, per_batch=5), after=number % 3))
    first.end()
    assert 0 < sum(_stored(url, topic).values()) < 4 * per
    second = _Run(url, topic, job, row_index=True)
    second.task(0, _batches([row for split_rows in rows for row in split_rows], keyed=True, per_batch=5))
    second.end()
    assert _stored(url, topic) == _every(["/in/a"], per)


def test_positions_refuse_a_smaller_split_inside_a_part_stored_one_before_sending(url: str) -> None:
    """Run 1 read file a as one split and stopped after 25 of its 48 rows; run 2 splits it in
    4: the task that starts at row 12, inside what run 1 stored in part, is refused before it
    sends anything; the one that starts where run 1 started completes its share."""
    topic, job = f"t{uuid.uuid4().hex[:6]}", "finer"
    first = _Run(url, topic, job, row_index=True)
    first.task(0, _cut(_batches(_split_rows("/in/a", 0, 1000, 48), keyed=False, per_batch=5), after=5))
    first.end()
    stored = sum(_stored(url, topic).values())
    second = _Run(url, topic, job, row_index=True)
    quarter = [(path, start, 250, index) for path, start, _, index in _split_rows("/in/a", 0, 1000, 48)]
    inside = [(path, 250, length, index) for path, _, length, index in quarter[12:24]]
    with pytest.raises(ConfigError, match="inside that part"):
        name = f"spark/{job}/{second.plan.rerun.run}/1"
        write_task(url, topic, name, iter(_batches(inside, keyed=False)), 1.0, batch_plan=second.plan)
    assert sum(_stored(url, topic).values()) == stored
    second.task(0, _batches(quarter[:12], keyed=False))  # starts where run 1 started: fine
    counts = _stored(url, topic)
    assert max(counts.values()) == 1 and set(counts) >= {f"/in/a#{i}".encode() for i in range(12)}


def test_positions_with_gaps_route_and_resume_by_ordinal(url: str) -> None:
    """Filtered rows leave gaps in the ordinals: round robin follows the ordinal, so a rerun
    sends every row to the partition the first run chose."""
    topic, job = f"t{uuid.uuid4().hex[:6]}", "gaps"
    rows = [row for row in _split_rows("/in/a", 0, 1000, 60) if row[3] % 4 != 1]
    first = _Run(url, topic, job, row_index=True)
    first.task(0, _cut(_batches(rows, keyed=False, per_batch=6), after=3))
    first.end()
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        before = {p: [r.value for r in broker.read(topic, p, 0, 1000)] for p in range(3)}
    second = _Run(url, topic, job, row_index=True)
    second.task(0, _batches(rows, keyed=False, per_batch=4))
    second.end()
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        after = {p: [r.value for r in broker.read(topic, p, 0, 1000)] for p in range(3)}
    assert all(after[p][: len(before[p])] == before[p] for p in range(3))
    assert Counter(v for values in after.values() for v in values) == Counter(f"/in/a#{r[3]}".encode() for r in rows)
    assert all(after[p] for p in range(3))


def test_positions_that_go_back_are_refused(url: str) -> None:
    topic = f"t{uuid.uuid4().hex[:6]}"
    run = _Run(url, topic, "backwards", row_index=True)
    rows = _split_rows("/in/a", 0, 1000, 10)
    with pytest.raises(ConfigError, match="do not increase"):
        write_task(
            url,
            topic,
            "spark/backwards/x/0",
            iter(_batches(rows[5:] + rows[:5], keyed=False, per_batch=10)),
            1.0,
            batch_plan=run.plan,
        )
