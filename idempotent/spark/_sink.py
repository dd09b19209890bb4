"""The ``idempotent`` sink: batch and streaming writes from Spark tasks (docs/spark.md).

Planning (:func:`batch_writer`, :func:`stream_writer`) runs on the driver, ``write`` in
executor tasks, ``commit`` and ``abort`` on the driver again; all reach the backend through
the broker server :mod:`idempotent.spark._host` keeps per URL. A batch job's ledger and the
driver's plan are in :mod:`idempotent.spark._ledger`.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from idempotent.core.records import Record, RecordColumns
from idempotent.producer.producer import Deliveries, Producer, SendManyFuture
from idempotent.runtime.collector import fewer_collections

from ..errors import ConfigError
from ._columns import Identity, UnitRun, binary_column, identity_of, unit_runs
from ._failures import reported
from ._host import ensure_host, executor_url, machine
from ._identity import RowRouter, batch_producer_name, stream_producer_name, stream_sequence_base
from ._ledger import LEDGER_SEGMENTS, BatchPlan, ledger_topic, plan_batch, prepare_topic, superseded
from ._options import Options
from ._rerun import (
    COMPLETE,
    MAX_SEGMENTS,
    SEGMENT_BITS,
    FileSplit,
    Mode,
    RunPlan,
    Segment,
    SegmentCheck,
    commit_record,
    done_record,
    encode,
    progress_record,
    row_digest,
    segment_record,
    unit_hash,
)

#: records a task may have queued before it waits for the oldest to be stored
MAX_UNFINISHED = 200_000

#: local properties Spark's micro-batch engine sets on the tasks of a batch
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class Written(WriterCommitMessage):
    """What one task attempt did: records sent and acknowledged as new, answered as
    duplicates, and skipped because the partition already stored them; for a batch job also
    how many segments it wrote and the last ordinal of the last one (the driver records a
    task that Spark counts as succeeded as ``done`` in the ledger: a task cannot tell by
    itself, since its input ends early, without an error, when Spark fails the task)."""

    producer_name: str
    attempt: int
    written: int
    duplicates: int
    skipped: int
    segments: int = 0
    last_ordinal: int | None = None


# -- a task --------------------------------------------------------------------------------


class _Open:
    """The segment a task writes now."""

    def __init__(self, segment: Segment, check: SegmentCheck | None, router: RowRouter, offset: int) -> None:
        self.segment = segment
        self.check = check
        self.router = router
        #: round robin offset of the unit (rows go to ``(offset + ordinal) % partitions``)
        self.offset = offset
        #: the ordinal the next row continues from (split and partition modes), or the last seen
        self.next_ordinal = segment.first
        self.last_ordinal = segment.first - 1
        #: position mode: the ordinal up to which a progress record allows sending
        self.reached = segment.first - 1


class TaskWriter:
    """Writes one task's rows: routes them, numbers them per segment, skips what earlier
    attempts and runs stored, and sends the rest.

    Args:
        producer: the task's named producer, initialised (it fenced earlier attempts).
        topic: the output topic.
        plan: the run's plan (batch writes); None for a stream (one segment, no ledger).
        base: the first sequence of a stream's micro-batch.
        runs_start: where the job's records start in the ledger's runs partition.
    """

    def __init__(
        self,
        producer: Producer,
        topic: str,
        *,
        plan: RunPlan | None = None,
        base: int = 0,
        runs_start: int = 0,
        ledger: Producer | None = None,
    ) -> None:
        self.producer = producer
        self.ledger = ledger
        self.topic = topic
        self.plan = plan
        self.base = base
        self.runs_start = runs_start
        self.partitions = producer.partitions_for(topic)
        self.own = [producer.last_sequence(topic, p) for p in range(self.partitions)]
        self.open: _Open | None = None
        self.segments = 0
        self.unit_ends: dict[str, int] = {}
        self.skipped = 0
        self.pending: deque[tuple[SendManyFuture, int]] = deque()
        self.unfinished = 0
        self.done: list[Deliveries] = []

    # -- segments --------------------------------------------------------------------------

    def _start(self, unit: str, first: int, split: FileSplit | None, digest: int | None) -> _Open:
        self._close()
        if self.segments >= MAX_SEGMENTS:
            raise ConfigError(f"a task wrote over {MAX_SEGMENTS} units (files, splits): use more Spark partitions")
        if unit in self.unit_ends and first <= self.unit_ends[unit]:
            raise ConfigError(
                f"positions of {unit} go back within one Spark partition (to {first} after {self.unit_ends[unit]}): "
                "each partition must read a unit's rows in increasing order (sortWithinPartitions)"
            )
        name = self.producer.producer_name or ""
        plan = self.plan
        segment = Segment(plan.run if plan else "", name, self.segments, unit, first, digest=digest, split=split)
        if plan is not None:
            self._record(segment_record(plan.job, segment, self._previous_end))
            if self.segments == 0 and superseded(self.producer.broker, self.topic, plan, self.runs_start):
                raise ConfigError(
                    f"job {plan.job!r}: a later run of the job started while this one ran; this run stops (the later "
                    "one completes the job)"
                )
        check = (
            SegmentCheck(plan, unit, first, split=split, digest=digest, partitions=self.partitions) if plan else None
        )
        partition_mode = plan is None or plan.mode is Mode.PARTITION
        router = RowRouter(self.partitions, self.base + (self.segments << SEGMENT_BITS))
        offset = 0 if partition_mode else unit_hash(unit)
        router.index = offset + first
        self.segments += 1
        self.open = _Open(segment, check, router, offset)
        return self.open

    def _record(self, record: dict[str, Any]) -> None:
        """Store a ledger record before the rows it announces are sent."""
        writer = self.ledger or self.producer
        writer.send(ledger_topic(self.topic), encode(record), partition=LEDGER_SEGMENTS).result()

    @property
    def _previous_end(self) -> int | None:
        return None if self.open is None else self.open.last_ordinal

    def _close(self) -> None:
        if self.open is not None:
            self.unit_ends[self.open.segment.unit] = self.open.last_ordinal

    # -- rows ------------------------------------------------------------------------------

    def add(
        self,
        run: UnitRun,
        values: list[bytes | None],
        keys: list[bytes | None] | None,
        parts: list[int | None] | None,
        headers: list[Any] | None,
    ) -> None:
        """Write rows of one unit (lists already cut to ``run``).

        Raises:
            ConfigError: bad values, positions that do not increase, or a segment refused
                by :class:`SegmentCheck`; what earlier calls queued may be stored.
        """
        count = len(values)
        current = self.open
        first, last = run.first, run.last
        if current is None or current.segment.unit != run.unit or current.segment.split != run.split:
            # a segment per unit, and per file split: a rerun's tasks start where splits start
            digest = row_digest(values[0], keys[0] if keys else None) if self.plan and self.segments == 0 else None
            current = self._start(run.unit, first if first is not None else 0, run.split, digest)
        if first is not None and last is not None:
            if first <= current.last_ordinal or not run.increasing:
                raise ConfigError(
                    f"positions of {run.unit} do not increase within a Spark partition: each partition must read "
                    "a unit's rows in increasing order of the ordinal column (sortWithinPartitions)"
                )
            current.last_ordinal = last
            contiguous = last - first == count - 1
            current.router.index = current.offset + first
        else:
            current.last_ordinal = current.next_ordinal + count - 1
            current.next_ordinal += count
            contiguous = True
        check = current.check
        if check is not None and check.skip_all:
            self.skipped += count
            return
        plan = self.plan
        if plan is not None and last is not None and last > current.reached:
            segment = current.segment
            self._record(progress_record(plan.job, plan.run, segment.producer, segment.index, last))
            current.reached = last
        if not contiguous and (parts is None or None in parts) and (keys is None or None in keys):
            parts = self._round_robin(current, run.ordinals(), keys, parts)
        if check is not None and check.row_by_row:  # position mode only
            self._add_row_by_row(current, check, run.ordinals(), values, keys, parts, headers)
            return
        prefix = check.prefix if check is not None else None
        base = current.router.base
        for partition, first, items in _routed(values, keys, parts, headers, current.router):
            threshold = self.own[partition]
            if prefix is not None:
                threshold = max(threshold, base + min(prefix[partition], COMPLETE) - 1)
            self._send(partition, first, items, threshold)

    def _round_robin(
        self, current: _Open, ordinals: list[int], keys: list[bytes | None] | None, parts: list[int | None] | None
    ) -> list[int | None]:
        """The ``partition`` of rows whose positions jump: round robin by ordinal where the
        row has neither a ``partition`` value nor a key."""
        n, offset = self.partitions, current.offset
        out: list[int | None] = []
        for i, ordinal in enumerate(ordinals):
            given = parts[i] if parts is not None else None
            if given is None and (keys is None or keys[i] is None):
                given = (offset + ordinal) % n
            out.append(given)
        return out

    def _add_row_by_row(
        self,
        current: _Open,
        check: SegmentCheck,
        ordinals: list[int],
        values: list[bytes | None],
        keys: list[bytes | None] | None,
        parts: list[int | None] | None,
        headers: list[Any] | None,
    ) -> None:
        """Rows of a segment that earlier segments of other splits overlap: ask for each."""
        routed, firsts = current.router.route_many(len(values), keys, parts)
        records = _records(values, keys, headers)
        chosen: list[list[int]] = [[] for _ in range(self.partitions)]
        sequences: list[list[int]] = [[] for _ in range(self.partitions)]
        numbered = list(firsts)
        for row, partition in enumerate(routed):
            sequence = numbered[partition]
            numbered[partition] += 1
            if check.stored(ordinals[row], partition) or sequence <= self.own[partition]:
                self.skipped += 1
                continue
            chosen[partition].append(row)
            sequences[partition].append(sequence)
        for partition, rows in enumerate(chosen):
            if rows:
                items = [records[row] for row in rows]
                future = self.producer.send_many(self.topic, items, partition=partition, sequence=sequences[partition])
                self._queued(future, len(items))

    def _send(self, partition: int, first: int, items: Sequence[Record | bytes | None], threshold: int) -> None:
        skip = min(len(items), max(0, threshold - first + 1))  # stored by an earlier attempt or run
        self.skipped += skip
        if skip < len(items):
            future = self.producer.send_many(self.topic, items[skip:], partition=partition, sequence=first + skip)
            self._queued(future, len(items) - skip)

    def _queued(self, future: SendManyFuture, count: int) -> None:
        self.pending.append((future, count))
        self.unfinished += count
        while self.unfinished > MAX_UNFINISHED:  # back-pressure: wait for the oldest calls
            oldest, oldest_count = self.pending.popleft()
            self.done.append(oldest.result())
            self.unfinished -= oldest_count

    def finish(self) -> tuple[int, int, int]:
        """Wait until every record is stored or answered as a duplicate. Returns
        ``(written, duplicates, skipped)``.

        Raises:
            DeliveryFailed: a record was not stored (fenced by a later attempt, broker gone...).
        """
        self._close()
        self.producer.flush()
        self.done.extend(future.result() for future, _ in self.pending)
        self.pending.clear()
        duplicates = sum(deliveries.duplicates for deliveries in self.done)
        return sum(len(d) for d in self.done) - duplicates, duplicates, self.skipped

    @property
    def last_ordinal(self) -> int | None:
        """The last ordinal of the last segment, None before the first."""
        return None if self.open is None else self.open.last_ordinal


def _records(
    values: list[bytes | None], keys: list[bytes | None] | None, headers: list[Any] | None
) -> Sequence[Record | bytes | None]:
    """The rows as records (one object per row: the slow path's)."""
    if headers is None:
        return [Record(v, k) for v, k in zip(values, keys or itertools.repeat(None), strict=False)]
    return [
        Record(value, key, [(h["key"], h["value"] if h["value"] is not None else b"") for h in row or ()])
        for value, key, row in zip(values, keys or itertools.repeat(None), headers, strict=False)
    ]


def _routed(
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    parts: list[int | None] | None,
    headers: list[Any] | None,
    router: RowRouter,
) -> list[tuple[int, int, Sequence[Record | bytes | None]]]:
    """``(partition, first sequence, records)`` per topic partition that gets rows, the
    records in row order: a :class:`RecordColumns` (no Python object per row) unless the rows
    have headers.

    Raises:
        ConfigError: a ``partition`` value out of range.
    """
    count = len(values)
    if keys is None and parts is None and headers is None:  # round robin, by slices
        partitions = router.partitions
        return [(p, first, RecordColumns(values[offset::partitions])) for p, offset, first in router.spread(count)]
    routed, firsts = router.route_many(count, keys, parts)
    if headers is None:
        if router.partitions == 1:
            return [(0, firsts[0], RecordColumns(values, keys))] if values else []
        rows: list[list[int]] = [[] for _ in range(router.partitions)]
        for row, partition in enumerate(routed):
            rows[partition].append(row)
        return [
            (p, firsts[p], RecordColumns(_take(values, chosen), None if keys is None else _take(keys, chosen)))
            for p, chosen in enumerate(rows)
            if chosen
        ]
    records = _records(values, keys, headers)
    shares: list[list[Record | bytes | None]] = [[] for _ in range(router.partitions)]
    for record, partition in zip(records, routed, strict=True):
        shares[partition].append(record)
    return [(p, firsts[p], share) for p, share in enumerate(shares) if share]


def _take(column: list[bytes | None], rows: list[int]) -> list[bytes | None]:
    """The items of ``column`` at ``rows``, in that order."""
    if len(rows) == 1:
        return [column[rows[0]]]
    return list(operator.itemgetter(*rows)(column))


def _columns(
    batch: Any,
) -> tuple[list[bytes | None], list[bytes | None] | None, list[int | None] | None, list[Any] | None]:
    names = set(batch.schema.names)
    values = binary_column(batch, "value")
    keys = binary_column(batch, "key") if "key" in names else None
    parts = batch.column("partition").to_pylist() if "partition" in names else None
    headers = batch.column("headers").to_pylist() if "headers" in names else None
    return values, keys, parts, headers


def write_task(
    url: str,
    topic: str,
    producer_name: str,
    batches: Iterator[Any],
    linger_ms: float,
    *,
    batch_plan: BatchPlan | None = None,
    base: int = 0,
    spark_partition: int = 0,
    origin: str | None = None,
) -> Written:
    """Write one task's record batches under ``producer_name``; block until every record is
    stored or answered as a duplicate. ``url`` is the driver's resolved URL and ``origin``
    its machine (see :func:`~idempotent.spark._host.executor_url`; None: this machine).

    A batch write (``batch_plan``) numbers each unit's rows as a segment and keeps the
    job's ledger; a stream's micro-batch numbers each topic partition's rows from ``base``.

    Raises:
        DeliveryFailed: a record was not stored (fenced by a later attempt, broker gone...).
        ConfigError: bad column values or a refused segment; records of earlier units or
            Arrow batches may be stored (a rerun completes them). Also, before anything is
            written, a URL this machine cannot serve as the driver's does (a SQLite file on
            the driver's machine, from another machine).
    """
    attempt = _attempt()
    plan = batch_plan.rerun if batch_plan is not None else None
    identity = batch_plan.identity if batch_plan is not None else Identity(Mode.PARTITION)
    if plan is not None and plan.finished:
        return Written(producer_name, attempt, 0, 0, sum(batch.num_rows for batch in batches))
    with fewer_collections(), contextlib.ExitStack() as stack:
        host = executor_url(url, origin or machine())
        producer = stack.enter_context(Producer(host, producer_name=producer_name, linger_ms=linger_ms))
        ledger = None
        if batch_plan is not None and batch_plan.identity.mode is Mode.POSITION:
            # a progress record precedes every Arrow batch: send it at once, not after a linger
            ledger = stack.enter_context(Producer(producer.broker, linger_ms=0))  # anonymous: nothing to store
        runs_start = batch_plan.runs_start if batch_plan else 0
        writer = TaskWriter(producer, topic, plan=plan, base=base, runs_start=runs_start, ledger=ledger)
        for batch in batches:
            values, keys, parts, headers = _columns(batch)
            runs = unit_runs(batch, identity, spark_partition)
            if len(runs) == 1:
                writer.add(runs[0], values, keys, parts, headers)
                continue
            for run in runs:
                a, b = run.start, run.stop
                writer.add(
                    run,
                    values[a:b],
                    None if keys is None else keys[a:b],
                    None if parts is None else parts[a:b],
                    None if headers is None else headers[a:b],
                )
        written, duplicates, skipped = writer.finish()
    return Written(producer_name, attempt, written, duplicates, skipped, writer.segments, writer.last_ordinal)


def _attempt() -> int:
    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


def _spark_partition() -> int:
    context = TaskContext.get()
    if context is None:
        raise ConfigError("the idempotent sink writes from Spark tasks only")
    return int(context.partitionId())


# -- the writers ---------------------------------------------------------------------------


class BatchWriter(DataSourceArrowWriter):
    """Writes a batch job: Spark partition ``i`` of run ``r`` under ``spark/<job>/<r>/<i>``
    (``spark/<job>/<i>`` when rows carry no position)."""

    def __init__(self, options: Options, plan: BatchPlan) -> None:
        self.options = options
        self.plan = plan

    @reported
    def write(self, iterator: Iterator[Any]) -> Written:
        opts, plan = self.options, self.plan
        spark_partition = _spark_partition()
        job = opts.job or ""
        if plan.identity.mode is Mode.PARTITION:
            name = batch_producer_name(job, spark_partition)
        else:
            name = batch_producer_name(f"{job}/{plan.rerun.run}", spark_partition)
        return write_task(
            opts.url,
            opts.topic,
            name,
            iterator,
            opts.linger_ms,
            batch_plan=plan,
            spark_partition=spark_partition,
            origin=opts.machine,
        )

    @reported
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Record in the ledger that the job is complete: running it again stores nothing."""
        plan = self.plan.rerun
        if not plan.finished:
            self._record([commit_record(plan.job, plan.run, len(messages))])

    @reported
    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Record the tasks that succeeded as done; what was stored stays, and a rerun of the
        job completes the rest."""
        plan = self.plan.rerun
        if plan.finished:
            return
        done = [
            done_record(plan.job, plan.run, m.producer_name, m.segments, m.last_ordinal)
            for m in messages
            if isinstance(m, Written) and m.segments
        ]
        if done:
            self._record(done)

    def _record(self, records: list[dict[str, Any]]) -> None:
        with Producer(ensure_host(self.options.url), linger_ms=0) as producer:  # anonymous: no record to store
            values = [encode(record) for record in records]
            producer.send_many(ledger_topic(self.options.topic), values, partition=LEDGER_SEGMENTS).result()


def batch_writer(options: Options, schema: StructType) -> BatchWriter:
    """The writer of a batch job (driver): see :func:`plan_batch`.

    Raises:
        ConfigError: bad columns or options, ``overwrite`` mode, or a refused rerun.
    """
    return BatchWriter(options, plan_batch(options, schema))


class StreamWriter(DataSourceStreamArrowWriter):
    """Writes each Spark partition under ``spark/<query id>/<partition>``, the rows of
    micro-batch B from sequence ``B << 32`` on."""

    def __init__(self, options: Options) -> None:
        self.options = options

    @reported
    def write(self, iterator: Iterator[Any]) -> Written:
        opts = self.options
        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        query_id = opts.job or (context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None)
        if batch_id is None or not query_id:
            raise ConfigError("the idempotent stream sink runs inside a micro-batch streaming query only")
        spark_partition = _spark_partition()
        name = stream_producer_name(query_id, spark_partition)
        base = stream_sequence_base(int(batch_id))
        return write_task(
            opts.url,
            opts.topic,
            name,
            iterator,
            opts.linger_ms,
            base=base,
            spark_partition=spark_partition,
            origin=opts.machine,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do, so calling it again for the same batch is harmless."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a replay of the batch writes under the same names and sequences."""


def stream_writer(options: Options, schema: StructType) -> StreamWriter:
    """The writer of a streaming query (driver): checks the columns, creates the topic and
    sets its ``monotonic`` policy.

    Raises:
        ConfigError: bad columns or options.
    """
    identity = identity_of(schema, options)
    if identity.mode is not Mode.PARTITION:
        raise ConfigError("a stream is identified by its query and micro-batch: drop '_metadata' and 'positionColumns'")
    prepare_topic(options.url, options.topic, options.partitions, monotonic=True)
    return StreamWriter(options)


__all__ = ["BatchWriter", "StreamWriter", "Written", "batch_writer", "stream_writer"]
