"""Which batch a Kafka record belongs to, when only the first record of a batch says it.

The Kafka adapter stores a batch as consecutive messages of one transaction. The first carries
the batch's identity in headers (producer id, epoch, base sequence, record count); the others
carry only their own (user) headers, so they can go to Kafka in bulk (without a timestamp of
their own, which librdkafka's bulk call cannot set). A record's producer id, sequence and
timestamp are therefore those of the nearest batch head before it, when that head's count
reaches it; any other record without identity headers was written without the checker. A
batch whose records have times of their own (``Record.timestamp``) is written record by record
with them, and its head says so (``idem.timed``): its records are read with their own times.

:class:`HeadIndex` remembers the heads one process has seen (written, replayed or read), so
that a read starting inside a batch finds its head without reading back. Pure: no I/O, no
locks (the adapter locks).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

from idempotent.core.records import BatchHeader, Record, RecordColumns
from idempotent.core.sequence import sequence_at
from idempotent.errors import ConfigError


class BatchHead(NamedTuple):
    """The identity of one stored batch, from its first message."""

    first_offset: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    #: the batch's timestamp (seconds): its records are read back with it, unless ``timed``
    timestamp: float = 0.0
    #: the records carry times of their own (``idem.timed`` on the head), read back as stored
    timed: bool = False

    def record_time(self, stored: float) -> float:
        """The timestamp a record of this batch is read back with, from its message's."""
        return stored if self.timed else self.timestamp

    def covers(self, offset: int) -> bool:
        """Whether the message at ``offset`` is one of this batch's records."""
        return self.first_offset <= offset < self.first_offset + self.record_count

    def sequence_of(self, offset: int) -> int:
        """The sequence of this batch's record at ``offset`` (which it covers); -1 for a batch
        without a producer."""
        if self.base_sequence < 0:
            return -1
        return sequence_at(self.base_sequence, offset - self.first_offset)


class HeadIndex:
    """The batch heads of one partition known to this process; the ``capacity`` highest kept.

    Args:
        capacity: how many heads to keep; adding beyond it forgets the lowest offsets first
            (a read there finds its head again by reading back).

    Raises:
        ConfigError: ``capacity`` below 1.
    """

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ConfigError(f"a head index keeps at least 1 head, not {capacity}")
        self.capacity = capacity
        self._firsts: list[int] = []
        self._heads: dict[int, BatchHead] = {}
        #: ``(lo, hi)``: the records without identity from ``lo`` to ``hi`` belong to no batch
        self._foreign: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._firsts)

    def add(self, head: BatchHead) -> None:
        """Remember ``head`` (again: no change)."""
        first = head.first_offset
        if first in self._heads:
            return
        if len(self._firsts) >= self.capacity and first < self._firsts[0]:
            return  # older than everything kept: it would be the first forgotten
        bisect.insort(self._firsts, first)
        self._heads[first] = head
        while len(self._firsts) > self.capacity:
            del self._heads[self._firsts.pop(0)]

    def covering(self, offset: int) -> BatchHead | None:
        """The known head whose batch holds the record at ``offset``; None when no known
        head does (the head may be unknown here, or the record has none)."""
        index = bisect.bisect_right(self._firsts, offset) - 1
        if index < 0:
            return None
        head = self._heads[self._firsts[index]]
        return head if head.covers(offset) else None

    def note_foreign(self, lo: int, hi: int) -> None:
        """Remember that the records without identity headers from ``lo`` to ``hi`` belong to
        no batch (none of the heads before them reaches them)."""
        for index, (start, end) in enumerate(self._foreign):
            if start <= hi + 1 and lo <= end + 1:  # overlaps or touches: one interval
                self._foreign[index] = (min(start, lo), max(end, hi))
                return
        self._foreign.append((lo, hi))
        if len(self._foreign) > 64:
            del self._foreign[0]

    def foreign(self, offset: int) -> bool:
        """Whether a record without identity headers at ``offset`` belongs to no batch, as far
        as this index knows. The one right after a known run belongs to none either: a batch
        that held it would have its head at ``offset`` itself."""
        for start, end in self._foreign:
            if start <= offset <= end + 1:
                if offset == end + 1:
                    self.note_foreign(offset, offset)
                return True
        return False


#: The headers this adapter adds to a batch's first record (and that records of the earlier
#: layout carry each), after the record's own; other headers (``idem.src.*`` of a mirror among
#: them) are the user's and are read back unchanged.
IDENTITY_HEADERS = frozenset({"idem.pid", "idem.epoch", "idem.seq", "idem.count", "idem.timed"})


def identity_headers(header: BatchHeader | None, record_count: int, timed: bool) -> list[tuple[str, bytes]]:
    """The headers of a batch's head: ``idem.pid``, ``idem.epoch``, ``idem.seq`` (none for a
    batch without a producer), ``idem.count``, and ``idem.timed`` when its records carry
    times of their own."""
    if header is None:
        identity = [("idem.count", b"%d" % record_count)]
    else:
        identity = [
            ("idem.pid", b"%d" % header.producer_id),
            ("idem.epoch", b"%d" % header.producer_epoch),
            ("idem.seq", b"%d" % header.base_sequence),
            ("idem.count", b"%d" % record_count),
        ]
    if timed:
        identity.append(("idem.timed", b"1"))
    return identity


def records_timed(records: Sequence[Record]) -> bool:
    """Whether any record of a batch has a time of its own."""
    if type(records) is RecordColumns:
        return records.timed
    return any(record.timestamp is not None for record in records)
