"""The ``idempotent`` Python data source: batch and streaming reads and writes.

This module imports pyspark; :func:`idempotent.spark.register` imports it on first use.
Planning (``writer``, ``reader``, ``streamWriter`` ...) runs on the driver, ``write`` and
``read`` in executor tasks; every process reaches the backend through the one broker server
:mod:`idempotent.spark._host` keeps per URL on the machine. See docs/spark.md.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import operator
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

import idempotent

from .._gc import fewer_collections
from .._records import Record, RecordColumns
from ..api import BrokerAPI
from ..errors import ConfigError
from ..producer import Deliveries, Producer, SendManyFuture
from ._host import ensure_host
from ._identity import (
    EARLIEST,
    LATEST,
    RowRouter,
    batch_producer_name,
    parse_offsets,
    resolve_offset,
    stream_producer_name,
    stream_sequence_base,
)

READ_SCHEMA = (
    "topic string, partition int, offset long, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>, producer_id long, sequence long, timestamp timestamp"
)
WRITE_COLUMNS = {"value", "key", "partition", "headers", "topic"}
READ_CHUNK = 2000
#: records a task may have queued before it waits for the oldest to be stored
MAX_UNFINISHED = 200_000

#: local properties Spark's micro-batch engine sets on the tasks of a batch
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class Written(WriterCommitMessage):
    """What one task attempt did: records sent and acknowledged as new, answered as
    duplicates, and skipped because the partition already stored them."""

    producer_name: str
    attempt: int
    written: int
    duplicates: int
    skipped: int


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name)
    if not value:
        raise ConfigError(f"option {name!r} is required")
    return value


def _connect(url: str) -> BrokerAPI:
    return idempotent.connect(ensure_host(url))


def _check_write_schema(schema: StructType) -> None:
    names = {field.name for field in schema.fields}
    if "value" not in names:
        raise ConfigError("the DataFrame needs a 'value' column (binary or string)")
    unknown = names - WRITE_COLUMNS
    if unknown:
        raise ConfigError(f"unexpected columns {sorted(unknown)}: use value, key, partition, headers")


def _prepare_topic(url: str, topic: str, partitions: str | None, *, monotonic: bool = False) -> None:
    """Create the topic on the driver (before tasks race to), with ``partitions`` if given;
    with ``monotonic``, set the topic's policy so that sequences may jump (streams)."""
    with contextlib.closing(_connect(url)) as broker:
        if topic not in broker.topics():
            if partitions is None:
                broker.partitions_for(topic)
            else:
                broker.create_topic(topic, int(partitions))
        if monotonic:
            broker.set_policy("monotonic", topic=topic)


def _binary(batch: Any, name: str) -> list[bytes | None]:
    """Column ``name`` of an Arrow record batch as bytes (strings are taken as UTF-8 bytes
    by a cast in Arrow, without a Python object per row).

    Raises:
        ConfigError: the column is neither binary nor string.
    """
    column = batch.column(name)
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        column = column.cast(pa.large_binary() if pa.types.is_large_string(kind) else pa.binary())
    elif not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)):
        raise ConfigError(f"column {name!r} must be binary or string, not {kind}")
    values: list[bytes | None] = column.to_pylist()
    return values


def write_task(
    url: str, topic: str, producer_name: str, batches: Iterator[Any], linger_ms: float, base: int = 0
) -> Written:
    """Write one task's record batches under ``producer_name``, numbering each topic
    partition's rows from ``base``; block until every record is stored or answered as a
    duplicate.

    Each Arrow batch is routed as a whole (:meth:`RowRouter.route_many`) and sent with one
    :meth:`Producer.send_many` call per topic partition; the results are counted per call.

    Raises:
        DeliveryFailed: a record was not stored (fenced by a later attempt, broker gone...).
        ConfigError: bad column values; records of earlier Arrow batches may be stored (a
            rerun completes them).
    """
    attempt = _attempt()
    skipped = 0
    pending: deque[tuple[SendManyFuture, int]] = deque()
    unfinished = 0
    done: list[Deliveries] = []
    with fewer_collections(), Producer(ensure_host(url), producer_name=producer_name, linger_ms=linger_ms) as producer:
        router = RowRouter(producer.partitions_for(topic), base)
        stored = [producer.last_sequence(topic, p) for p in range(router.partitions)]
        for batch in batches:
            for partition, first, items in _routed(batch, router):
                skip = min(len(items), max(0, stored[partition] - first + 1))  # stored by an earlier attempt
                skipped += skip
                if skip < len(items):
                    future = producer.send_many(topic, items[skip:], partition=partition, sequence=first + skip)
                    pending.append((future, len(items) - skip))
                    unfinished += len(items) - skip
            while unfinished > MAX_UNFINISHED:  # back-pressure: wait for the oldest calls
                future, count = pending.popleft()
                done.append(future.result())
                unfinished -= count
        producer.flush()
        done.extend(future.result() for future, _ in pending)
    duplicates = sum(deliveries.duplicates for deliveries in done)
    written = sum(len(deliveries) for deliveries in done) - duplicates
    return Written(producer_name, attempt, written, duplicates, skipped)


def _routed(batch: Any, router: RowRouter) -> list[tuple[int, int, Sequence[Record | bytes | None]]]:
    """``(partition, first sequence, records)`` per topic partition that gets rows of one
    Arrow record batch, the records in row order: a :class:`RecordColumns` (no Python
    object per row) unless the rows have headers.

    Raises:
        ConfigError: a column of the wrong type or a ``partition`` value out of range.
    """
    columns = set(batch.schema.names)
    values = _binary(batch, "value")
    count = len(values)
    if columns == {"value"}:  # no key, partition or headers: round robin, by slices
        partitions = router.partitions
        return [(p, first, RecordColumns(values[offset::partitions])) for p, offset, first in router.spread(count)]
    keys = _binary(batch, "key") if "key" in columns else None
    parts = batch.column("partition").to_pylist() if "partition" in columns else None
    headers = batch.column("headers").to_pylist() if "headers" in columns else None
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
    records = [
        Record(value, key, [(h["key"], h["value"] if h["value"] is not None else b"") for h in row or ()])
        for value, key, row in zip(values, keys or itertools.repeat(None), headers, strict=False)
    ]
    shares: list[list[Record | bytes | None]] = [[] for _ in range(router.partitions)]
    for record, partition in zip(records, routed, strict=True):
        shares[partition].append(record)
    return [(p, firsts[p], share) for p, share in enumerate(shares) if share]


def _take(column: list[bytes | None], rows: list[int]) -> list[bytes | None]:
    """The items of ``column`` at ``rows``, in that order."""
    if len(rows) == 1:
        return [column[rows[0]]]
    return list(operator.itemgetter(*rows)(column))


def _attempt() -> int:
    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


def _spark_partition() -> int:
    context = TaskContext.get()
    if context is None:
        raise ConfigError("the idempotent sink writes from Spark tasks only")
    return int(context.partitionId())


class _Options:
    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = _required(options, "url")
        self.topic = _required(options, "topic")
        self.job = options.get("job")
        self.partitions = options.get("partitions")
        self.linger_ms = float(options.get("lingerMs", "5"))
        self.starting = options.get("startingOffsets")
        self.ending = options.get("endingOffsets")


class IdempotentDataSource(DataSource):
    """``format("idempotent")``: see docs/spark.md for options and columns."""

    @classmethod
    def name(cls) -> str:
        return "idempotent"

    def schema(self) -> str:
        return READ_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        _check_write_schema(schema)
        opts = _Options(self.options)
        if overwrite:
            raise ConfigError("idempotent topics are append-only: use mode('append')")
        batch_producer_name(opts.job or "", 0)  # validates the job option on the driver
        _prepare_topic(opts.url, opts.topic, opts.partitions)
        return BatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        _check_write_schema(schema)
        opts = _Options(self.options)
        _prepare_topic(opts.url, opts.topic, opts.partitions, monotonic=True)
        return StreamWriter(opts)

    def reader(self, schema: StructType) -> BatchReader:
        return BatchReader(_Options(self.options))

    def streamReader(self, schema: StructType) -> StreamReader:
        return StreamReader(_Options(self.options))


class BatchWriter(DataSourceArrowWriter):
    """Writes each Spark partition under ``spark/<job>/<partition>``."""

    def __init__(self, options: _Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        opts = self.options
        name = batch_producer_name(opts.job or "", _spark_partition())
        return write_task(opts.url, opts.topic, name, iterator, opts.linger_ms)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: every record is stored when its task ends."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: what was stored stays, and a rerun of the job completes it."""


class StreamWriter(DataSourceStreamArrowWriter):
    """Writes each Spark partition under ``spark/<query id>/<partition>``, the rows of
    micro-batch B from sequence ``B << 32`` on."""

    def __init__(self, options: _Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        opts = self.options
        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        query_id = opts.job or (context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None)
        if batch_id is None or not query_id:
            raise ConfigError("the idempotent stream sink runs inside a micro-batch streaming query only")
        name = stream_producer_name(query_id, _spark_partition())
        base = stream_sequence_base(int(batch_id))
        return write_task(opts.url, opts.topic, name, iterator, opts.linger_ms, base)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do, so calling it again for the same batch is harmless."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a replay of the batch writes under the same names and sequences."""


@dataclass
class TopicRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition."""

    partition: int
    start: int
    end: int


def read_range(url: str, topic: str, part: TopicRange) -> Iterator[tuple[Any, ...]]:
    """The records of ``part`` as rows of :data:`READ_SCHEMA`."""
    utc = datetime.UTC
    with contextlib.closing(_connect(url)) as broker:
        position = part.start
        while position < part.end:
            records = broker.read(topic, part.partition, position, READ_CHUNK)
            if not records:
                return  # the range ends in offsets that hold no record (Kafka markers)
            for record in records:
                if record.offset < position:
                    continue
                if record.offset >= part.end:
                    return
                yield (
                    topic,
                    part.partition,
                    record.offset,
                    record.key,
                    record.value,
                    [{"key": k, "value": v} for k, v in record.headers],
                    record.producer_id,
                    record.sequence,
                    datetime.datetime.fromtimestamp(record.timestamp, utc),
                )
            position = records[-1].offset + 1


def _range(partition: InputPartition) -> TopicRange:
    if not isinstance(partition, TopicRange):
        raise ConfigError(f"not a partition of an idempotent topic: {partition!r}")
    return partition


def _end_offsets(broker: BrokerAPI, topic: str) -> dict[int, int]:
    count = broker.partitions_for(topic, create=False)
    return {p: broker.end_offset(topic, p) for p in range(count)}


class BatchReader(DataSourceReader):
    """One Spark partition per topic partition, between offsets fixed when the query is planned."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        with contextlib.closing(_connect(options.url)) as broker:
            ends = _end_offsets(broker, options.topic)
        count = len(ends)
        starts = parse_offsets(options.starting, options.topic, count, EARLIEST)
        stops = parse_offsets(options.ending, options.topic, count, LATEST)
        self.ranges = [
            TopicRange(p, resolve_offset(starts[p], ends[p]), resolve_offset(stops[p], ends[p])) for p in range(count)
        ]

    def partitions(self) -> Sequence[TopicRange]:
        return self.ranges

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_range(self.options.url, self.options.topic, _range(partition))


class StreamReader(DataSourceStreamReader):
    """Offsets are ``{"<partition>": <next offset>}``, kept in Spark's checkpoint."""

    def __init__(self, options: _Options) -> None:
        self.options = options

    def _ends(self) -> dict[int, int]:
        with contextlib.closing(_connect(self.options.url)) as broker:
            return _end_offsets(broker, self.options.topic)

    def initialOffset(self) -> dict[str, int]:
        ends = self._ends()
        starts = parse_offsets(self.options.starting, self.options.topic, len(ends), LATEST)
        return {str(p): resolve_offset(starts[p], ends[p]) for p in ends}

    def latestOffset(self, start: dict[str, int], limit: object) -> dict[str, int]:
        ends = self._ends()
        return {str(p): max(ends[p], int(start.get(str(p), 0))) for p in ends}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[TopicRange]:
        ranges = []
        for name, stop in end.items():
            first = int(start.get(name, 0))
            if stop > first:
                ranges.append(TopicRange(int(name), first, int(stop)))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_range(self.options.url, self.options.topic, _range(partition))

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the broker keeps no reader state."""
