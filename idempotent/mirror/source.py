"""What the mirror reads: the source contract, as values and protocols (no I/O here).

A *source* is a set of topics split into partitions; each record of a partition has an
**offset**: an integer, ``0 .. 2**63-1``, that grows strictly along the partition and never
changes once the record is readable. Offsets may have holes (a compacted Kafka topic, Kafka
transaction markers, Pulsar message ids, byte positions in a file). The mirror uses the offset
as the record's application sequence in the destination, which is what makes a resumed copy
exact: the destination's last stored sequence is the source offset to resume after.

One module per source kind implements the contract, and :func:`idempotent.mirror.schemes.open_source`
picks one by the URL's scheme:

========================================  =================================================
``file:///path`` (a file or a directory)  :mod:`idempotent.mirror.file`
``sqlite://``, ``memory://``,             :mod:`idempotent.mirror.topic`: an idempotent
``idem://``, ``idems://``, ``kafka://``,  topic, read through a broker
``pulsar://``
``kafka+native://host:port[,host:port]``  :mod:`idempotent.adapters.kafka.source`: a plain
                                          Kafka topic (confluent-kafka)
``pulsar+native://host:port?admin_url=``  :mod:`idempotent.adapters.pulsar.source`: a plain
                                          Pulsar topic (pulsar-client Reader)
========================================  =================================================

The source modules import this one and nothing of the mirror above it, so the mirror's
modules import each other in one direction only.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import attrs

from idempotent.core.records import Headers

#: Largest offset a source may hand out (the destination's sequences are 63-bit).
MAX_OFFSET = 2**63 - 1


class SourceRecord(NamedTuple):
    """One record read from a source partition.

    ``key`` and ``value`` are ``bytes`` or None and ``headers`` a tuple of ``(str, bytes)``
    pairs, exactly (they are copied on without conversion); ``timestamp`` is in seconds
    since the epoch, or None when the source has none. A named tuple: a copy makes one per
    record, and a tuple is made in a fraction of a frozen class's time.
    """

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: float | None = None


@attrs.frozen
class Polled:
    """What one :meth:`PartitionReader.poll` returns.

    Attributes:
        records: records in offset order, all above the position the reader was opened at.
        caught_up: True when, after these records, the partition held nothing more at the
            moment of the poll (the reader has seen the partition's current end).
    """

    records: list[SourceRecord]
    caught_up: bool


class PartitionReader(Protocol):
    """Reads one source partition forward from a position. Not thread-safe."""

    def poll(self, max_records: int, timeout: float) -> Polled:
        """Up to ``max_records`` next records, waiting at most ``timeout`` seconds for one.

        Raises:
            BackendUnavailableError: the source failed; the position is unchanged.
        """
        ...

    def close(self) -> None:
        """Release the reader's connections. Idempotent."""
        ...


class Source(Protocol):
    """A source of topics, opened from a URL. Thread-safe: one reader per thread."""

    @property
    def url(self) -> str:
        """The URL the source was opened with."""
        ...

    def topics(self) -> list[str]:
        """The names of the topics a job may copy, as :meth:`partitions` takes them (a
        source's internal topics are left out). Used to match ``--topics`` patterns.

        Raises:
            ConfigError: the source has no topics (a file).
            BackendUnavailableError: the source could not be asked.
        """
        ...

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has.

        Raises:
            InvalidTopicError: the topic does not exist.
            BackendUnavailableError: the source could not be asked.
        """
        ...

    def end(self, topic: str, partition: int) -> int:
        """An exclusive upper bound of the offsets stored now: every record readable now has
        a lower offset, and every record written later has this offset or a higher one.

        Raises:
            BackendUnavailableError: the source could not be asked.
        """
        ...

    def open_partition(self, topic: str, partition: int, after: int, end: int | None) -> PartitionReader:
        """A reader of ``topic[partition]`` that returns the records with offsets above
        ``after`` (-1: from the first record the source still holds). ``end`` is the
        :meth:`end` the job stops at, or None for a job that follows the source; a reader
        may stop fetching at it.

        Raises:
            InvalidTopicError: no such topic or partition.
            BackendUnavailableError: the source could not be opened.
        """
        ...

    def lag(self, topic: str, partition: int, after: int, end: int) -> int | None:
        """How far a copy that stored everything up to offset ``after`` (-1: nothing) is
        behind ``end`` (an :meth:`end`): 0 when every record below ``end`` is at or below
        ``after``. In the source's own units: records and transaction markers (Kafka),
        bytes (files), entries (Pulsar; a batch is one entry). None when the source cannot
        tell.
        """
        ...

    def source_topic(self, topic: str, partition: int) -> str:
        """What the ``idem.src.topic`` header of a record of this partition says."""
        ...

    def close(self) -> None:
        """Release the source. Idempotent."""
        ...


__all__ = ["MAX_OFFSET", "PartitionReader", "Polled", "Source", "SourceRecord"]
