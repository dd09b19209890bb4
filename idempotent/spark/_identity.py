"""Replay-stable identity of the rows a Spark task writes, and offset options (pure).

A Spark task that is retried, copied speculatively, or replayed after a restart sees the
same rows in the same order (the input contract in docs/spark.md). So the identity of each
record is computed from where the row sits, never from when or by whom it is written:

* producer name: ``spark/<job>/<spark partition>`` for a batch job,
  ``spark/<query id>/<spark partition>`` for a stream;
* destination partition: the row's ``partition`` column, else the CRC32 of its key, else
  round robin by the row's index in the task;
* sequence: the row's index among the task's rows bound for the same topic partition, so
  every topic partition gets 0, 1, 2, ... (the ``strict`` policy holds); in a stream, plus
  ``batch id << 32``, so that the micro-batches of one query continue one producer's
  sequences (the sink's topic takes the ``monotonic`` policy, with 64-bit sequences) and a
  stream leaves one producer per Spark partition, however many batches it runs.

Every attempt initialises the same named producer, which bumps its epoch and fences the
attempts before it; rows at or below the partition's stored sequence are skipped (they are
stored), and anything resent anyway is answered DUPLICATE.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import cast

from ..errors import ConfigError

#: Kafka's sentinels in ``startingOffsets``/``endingOffsets`` JSON
EARLIEST = -2
LATEST = -1


def batch_producer_name(job: str, spark_partition: int) -> str:
    """The producer name of one Spark partition of a batch job."""
    if not isinstance(job, str) or not job:
        raise ConfigError("option 'job' is required: it names the write, so that a rerun writes nothing new")
    return f"spark/{job}/{spark_partition}"


#: rows of one task per topic partition in one micro-batch are numbered below this
BATCH_SEQUENCE_BITS = 32


def stream_producer_name(query_id: str, spark_partition: int) -> str:
    """The producer name of one Spark partition of a streaming query (for every batch)."""
    return f"spark/{query_id}/{spark_partition}"


def stream_sequence_base(batch_id: int) -> int:
    """The sequence of a micro-batch's first row on each topic partition.

    Raises:
        ConfigError: a batch id outside ``0 .. 2**31 - 1`` (the sequences would pass 2**63).
    """
    if not 0 <= batch_id < 2**31:
        raise ConfigError(f"batch id {batch_id} is outside 0..2**31-1")
    return batch_id << BATCH_SEQUENCE_BITS


class RowRouter:
    """Assigns each row of one task its topic partition and its sequence there.

    Args:
        partitions: the topic's partition count.
        base: the first sequence on every topic partition (0 for a batch job).

    Raises:
        ConfigError: (from :meth:`route`) a ``partition`` column value out of range, or more
            than 2**32 rows for one topic partition in a micro-batch.
    """

    def __init__(self, partitions: int, base: int = 0) -> None:
        self.partitions = partitions
        self.index = 0
        self.base = base
        self.next_sequence = [base] * partitions

    def route(self, key: bytes | None, partition: int | None) -> tuple[int, int]:
        """``(partition, sequence)`` of the next row, given its key and ``partition`` column."""
        if partition is None:
            partition = self.index % self.partitions if key is None else zlib.crc32(key) % self.partitions
        elif not 0 <= partition < self.partitions:
            raise ConfigError(_outside(partition, self.partitions))
        self.index += 1
        sequence = self.next_sequence[partition]
        if self.base and sequence - self.base >= 1 << BATCH_SEQUENCE_BITS:
            raise ConfigError(f"over 2**{BATCH_SEQUENCE_BITS} rows for one partition in one micro-batch")
        self.next_sequence[partition] = sequence + 1
        return partition, sequence

    def route_many(
        self, count: int, keys: list[bytes | None] | None = None, parts: list[int | None] | None = None
    ) -> tuple[list[int], list[int]]:
        """Route the next ``count`` rows at once, as :meth:`route` would one by one.

        Args:
            keys: each row's key (None: no key column).
            parts: each row's ``partition`` column (None: no such column).

        Returns:
            ``(partition of each row, first sequence per topic partition)``: the rows bound
            for partition ``p`` are numbered ``first[p], first[p] + 1, ...`` in row order.

        Raises:
            ConfigError: a ``partition`` value out of range, or over 2**32 rows for one
                partition in a micro-batch; nothing is routed then.
        """
        n, index = self.partitions, self.index
        if parts is None and keys is None:
            routed = [(index + i) % n for i in range(count)]
        elif parts is None and keys is not None and None not in keys:
            crc32 = zlib.crc32
            routed = [crc32(key) % n for key in cast(list[bytes], keys)]
        else:
            routed = []
            for i in range(count):
                partition = parts[i] if parts is not None else None
                if partition is None:
                    key = keys[i] if keys is not None else None
                    partition = (index + i) % n if key is None else zlib.crc32(key) % n
                elif not 0 <= partition < n:
                    raise ConfigError(_outside(partition, n))
                routed.append(partition)
        first = list(self.next_sequence)
        following = [first[p] + routed.count(p) for p in range(n)] if n > 1 else [first[0] + count]
        if self.base and any(f - self.base > 1 << BATCH_SEQUENCE_BITS for f in following):
            raise ConfigError(f"over 2**{BATCH_SEQUENCE_BITS} rows for one partition in one micro-batch")
        self.next_sequence = following
        self.index += count
        return routed, first

    def spread(self, count: int) -> list[tuple[int, int, int]]:
        """Route the next ``count`` rows, none with a key or partition, round robin at once.

        Returns:
            ``(partition, first row, first sequence)`` per partition that gets rows: the
            partition's rows are rows ``first row``, ``first row + partitions``, ... of the
            ``count``, numbered consecutively from ``first sequence``.
        """
        out = []
        for offset in range(min(count, self.partitions)):
            partition = (self.index + offset) % self.partitions
            rows = len(range(offset, count, self.partitions))
            first = self.next_sequence[partition]
            if self.base and first + rows - self.base > 1 << BATCH_SEQUENCE_BITS:
                raise ConfigError(f"over 2**{BATCH_SEQUENCE_BITS} rows for one partition in one micro-batch")
            self.next_sequence[partition] = first + rows
            out.append((partition, offset, first))
        self.index += count
        return out


def _outside(partition: object, partitions: int) -> str:
    return (
        f"the 'partition' column holds {partition!r}, but the topic has partitions 0..{partitions - 1}: fix the "
        "column, or write to a topic with more partitions (option 'partitions' creates a new topic with that many)"
    )


def parse_offsets(text: str | None, topic: str, partitions: int, default: int) -> dict[int, int]:
    """Per partition, the offset named by a ``startingOffsets``/``endingOffsets`` option.

    The option is ``"earliest"``, ``"latest"``, or JSON like Spark's Kafka source:
    ``{"topic": {"0": 23, "1": -2}}`` with -2 for earliest and -1 for latest. Partitions the
    JSON leaves out get ``default``.

    Raises:
        ConfigError: malformed JSON, another topic, an unknown partition or a bad offset.
    """
    if text is None:
        return dict.fromkeys(range(partitions), default)
    text = text.strip()
    if text in ("earliest", "latest"):
        return dict.fromkeys(range(partitions), EARLIEST if text == "earliest" else LATEST)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"offsets must be 'earliest', 'latest' or JSON, not {text!r}: {exc}") from None
    if not isinstance(parsed, Mapping) or set(parsed) - {topic}:
        raise ConfigError(f'offsets JSON must look like {{"{topic}": {{"0": 42}}}}, got {text!r}')
    out = dict.fromkeys(range(partitions), default)
    per_partition = parsed.get(topic, {})
    if not isinstance(per_partition, Mapping):
        raise ConfigError(f"offsets of {topic!r} must map partitions to offsets, got {per_partition!r}")
    for name, offset in per_partition.items():
        try:
            partition = int(name)
        except ValueError:
            raise ConfigError(f"{name!r} is not a partition number") from None
        if partition not in out:
            raise ConfigError(f"{topic!r} has partitions 0..{partitions - 1}, not {partition}")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
            raise ConfigError(f"offset {offset!r} of partition {partition}: use -2 (earliest), -1 (latest) or >= 0")
        out[partition] = offset
    return out


def resolve_offset(offset: int, end: int) -> int:
    """A concrete offset for ``offset`` (EARLIEST is 0, LATEST is the partition's ``end``)."""
    if offset == EARLIEST:
        return 0
    if offset == LATEST:
        return end
    return offset
