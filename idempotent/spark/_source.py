"""The ``idempotent`` Python data source: batch and streaming reads and writes.

This module imports pyspark; :func:`idempotent.spark.register` imports it on first use.
Planning (``writer``, ``reader``, ``streamWriter`` ...) runs on the driver, ``write`` and
``read`` in executor tasks; every process reaches the backend through the one broker server
:mod:`idempotent.spark._host` keeps per URL on the machine. The writers are in
:mod:`idempotent.spark._sink`. See docs/spark.md.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

import idempotent

from ..api import BrokerAPI
from ..errors import ConfigError
from ._failures import reported, reported_rows
from ._host import ensure_host, executor_url, machine
from ._identity import EARLIEST, LATEST, parse_offsets, resolve_offset
from ._options import Options
from ._sink import BatchWriter, StreamWriter, batch_writer, stream_writer

READ_SCHEMA = (
    "topic string, partition int, offset long, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>, producer_id long, sequence long, timestamp timestamp"
)
READ_CHUNK = 2000


def _connect(url: str) -> BrokerAPI:
    return idempotent.connect(ensure_host(url))


class IdempotentDataSource(DataSource):
    """``format("idempotent")``: see docs/spark.md for options and columns."""

    @classmethod
    def name(cls) -> str:
        return "idempotent"

    def schema(self) -> str:
        return READ_SCHEMA

    @reported
    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        if overwrite:
            raise ConfigError("idempotent topics are append-only: use mode('append')")
        return batch_writer(Options(self.options), schema)

    @reported
    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        return stream_writer(Options(self.options), schema)

    @reported
    def reader(self, schema: StructType) -> BatchReader:
        return BatchReader(Options(self.options))

    @reported
    def streamReader(self, schema: StructType) -> StreamReader:
        return StreamReader(Options(self.options))


@dataclass
class TopicRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition."""

    partition: int
    start: int
    end: int


def read_range(url: str, topic: str, part: TopicRange, origin: str | None = None) -> Iterator[tuple[Any, ...]]:
    """The records of ``part`` as rows of :data:`READ_SCHEMA` (in a task: ``url`` is the
    driver's resolved URL and ``origin`` its machine, see
    :func:`~idempotent.spark._host.executor_url`; None: this machine).

    Raises:
        ConfigError: a URL this machine cannot serve as the driver's does; nothing was read.
    """
    utc = datetime.UTC
    with contextlib.closing(idempotent.connect(executor_url(url, origin or machine()))) as broker:
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
    """The end offset of each partition of ``topic``.

    Raises:
        ConfigError: the topic does not exist (a read never creates it).
    """
    if topic not in broker.topics():
        raise ConfigError(
            f"topic {topic!r} does not exist on the broker of option 'url': check option 'topic', or write to "
            "the topic first (a read does not create it)"
        )
    count = broker.partitions_for(topic, create=False)
    return {p: broker.end_offset(topic, p) for p in range(count)}


class BatchReader(DataSourceReader):
    """One Spark partition per topic partition, between offsets fixed when the query is planned."""

    def __init__(self, options: Options) -> None:
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

    @reported
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        opts = self.options
        return reported_rows(read_range(opts.url, opts.topic, _range(partition), opts.machine))


class StreamReader(DataSourceStreamReader):
    """Offsets are ``{"<partition>": <next offset>}``, kept in Spark's checkpoint."""

    def __init__(self, options: Options) -> None:
        self.options = options

    def _ends(self) -> dict[int, int]:
        with contextlib.closing(_connect(self.options.url)) as broker:
            return _end_offsets(broker, self.options.topic)

    @reported
    def initialOffset(self) -> dict[str, int]:
        ends = self._ends()
        starts = parse_offsets(self.options.starting, self.options.topic, len(ends), LATEST)
        return {str(p): resolve_offset(starts[p], ends[p]) for p in ends}

    @reported
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

    @reported
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        opts = self.options
        return reported_rows(read_range(opts.url, opts.topic, _range(partition), opts.machine))

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the broker keeps no reader state."""
