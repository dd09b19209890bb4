"""Encoding of a partition checker's persisted view as snapshot bytes. Pure: no I/O.

Format 2 (written since the checker keeps its state in columns)::

    magic b"IDCK", format byte 2, then zlib (level 1) of:
      header  <q position, <I producers n, <I producers with older window entries k,
              <I older entries m
      columns n x <q producer_id, n x <h producer_epoch, n x <q last_sequence,
              n x <d last_timestamp, then the newest window entry of each producer:
              n x <q first_sequence, n x <q base_offset, n x <i record_count
      older   k x <q producer_id, k x <I entries, m x 3 x <q (first_sequence,
              last_sequence, base_offset), oldest first, producer by producer

Producers appear least recently active first (the checker's eviction order). Every column is
fixed width and little-endian, so encoding and decoding are one ``array`` copy per column,
not one Python object per producer. zlib's checksum catches flipped bytes; lengths and value
ranges are checked too, and anything that does not fit raises
:class:`~idempotent.errors.CorruptDataError` (the broker then rebuilds the partition from
its log alone).

Format 1 (msgpack ``[1, position, [[pid, epoch, last_sequence, last_offset, timestamp,
[[first, last, base_offset], ...]], ...]]``) is still read, so snapshots written by earlier
versions restore; its first byte (0x93) can never start format 2.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from typing import Any

import attrs
import msgpack

from idempotent.core.types import MAX_BATCH_RECORDS, MAX_EPOCH, MAX_PRODUCER_ID, SEQUENCE_SPACE
from idempotent.errors import CorruptDataError

MAGIC = b"IDCK"
FORMAT = 2
_LEGACY_FORMAT = 1
_HEAD = struct.Struct("<qIII")
_BIG_ENDIAN = sys.byteorder == "big"


@attrs.define(eq=False)
class Columns:
    """The persisted view of a partition, one array per field, producers in eviction order.

    ``older`` holds, for the producers with more than one stored batch in their window, the
    entries before the newest as flat ``(first_sequence, last_sequence, base_offset)``
    triples, oldest first.
    """

    position: int = 0
    producer_id: array[int] = attrs.field(factory=lambda: array("q"))
    producer_epoch: array[int] = attrs.field(factory=lambda: array("h"))
    last_sequence: array[int] = attrs.field(factory=lambda: array("q"))
    last_timestamp: array[float] = attrs.field(factory=lambda: array("d"))
    first_sequence: array[int] = attrs.field(factory=lambda: array("q"))
    base_offset: array[int] = attrs.field(factory=lambda: array("q"))
    record_count: array[int] = attrs.field(factory=lambda: array("i"))
    older: dict[int, array[int]] = attrs.field(factory=dict)

    def fixed(self) -> tuple[array[int], array[int], array[int], array[float], array[int], array[int], array[int]]:
        """The fixed-width columns, in encoding order."""
        return (
            self.producer_id,
            self.producer_epoch,
            self.last_sequence,
            self.last_timestamp,
            self.first_sequence,
            self.base_offset,
            self.record_count,
        )


def _bytes_of(column: array[int] | array[float]) -> bytes:
    if _BIG_ENDIAN:  # pragma: no cover - the CI machines are little-endian
        column = array(column.typecode, column)
        column.byteswap()
    return column.tobytes()


def encode(columns: Columns) -> bytes:
    """Format-2 bytes of ``columns``."""
    older_ids = array("q", columns.older)
    older_lengths = array("I", (len(entries) // 3 for entries in columns.older.values()))
    older_entries = array("q")
    for entries in columns.older.values():
        older_entries.extend(entries)
    parts = [
        _HEAD.pack(columns.position, len(columns.producer_id), len(older_ids), len(older_entries) // 3),
        *(_bytes_of(column) for column in columns.fixed()),
        _bytes_of(older_ids),
        _bytes_of(older_lengths),
        _bytes_of(older_entries),
    ]
    return MAGIC + bytes([FORMAT]) + zlib.compress(b"".join(parts), 1)


def decode(data: bytes) -> Columns:
    """The columns stored in snapshot bytes of format 2 or 1.

    Raises:
        CorruptDataError: the bytes are not a whole snapshot of a known format, or hold values
            no checker can have written (nothing is returned then).
    """
    if data[:4] == MAGIC:
        if data[4:5] != bytes([FORMAT]):
            raise CorruptDataError(f"unknown checker snapshot format {data[4:5]!r}")
        try:
            body = zlib.decompress(data[5:])
        except zlib.error as exc:
            raise CorruptDataError(f"corrupt checker snapshot: {exc}") from exc
        columns = _decode_body(body)
    else:
        columns = _decode_legacy(data)
    _validate(columns)
    return columns


def _take(body: memoryview, at: int, typecode: str, count: int) -> tuple[array[Any], int]:
    column: array[Any] = array(typecode)
    end = at + column.itemsize * count
    if end > len(body):
        raise CorruptDataError(f"corrupt checker snapshot: {len(body)} bytes, a column ends at {end}")
    column.frombytes(body[at:end])
    if _BIG_ENDIAN:  # pragma: no cover
        column.byteswap()
    return column, end


def _decode_body(raw: bytes) -> Columns:
    body = memoryview(raw)
    if len(body) < _HEAD.size:
        raise CorruptDataError(f"corrupt checker snapshot: a {len(body)}-byte body has no header")
    position, producers, with_older, older_count = _HEAD.unpack_from(body)
    at = _HEAD.size
    columns = Columns(position)
    fixed: list[array[Any]] = []
    for template in columns.fixed():
        column, at = _take(body, at, template.typecode, producers)
        fixed.append(column)
    (
        columns.producer_id,
        columns.producer_epoch,
        columns.last_sequence,
        columns.last_timestamp,
        columns.first_sequence,
        columns.base_offset,
        columns.record_count,
    ) = fixed
    older_ids, at = _take(body, at, "q", with_older)
    older_lengths, at = _take(body, at, "I", with_older)
    entries, at = _take(body, at, "q", 3 * older_count)
    if at != len(body):
        raise CorruptDataError(f"corrupt checker snapshot: {len(body) - at} bytes after the last column")
    if sum(older_lengths) != older_count:
        raise CorruptDataError("corrupt checker snapshot: older window entries do not add up")
    start = 0
    for producer_id, length in zip(older_ids, older_lengths, strict=True):
        columns.older[producer_id] = entries[start : start + 3 * length]
        start += 3 * length
    return columns


def _decode_legacy(data: bytes) -> Columns:
    try:
        fmt, position, producers = msgpack.unpackb(data)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # garbage, or not 3 values
        raise CorruptDataError(f"corrupt checker snapshot: {exc!r}") from exc
    if fmt != _LEGACY_FORMAT:
        raise CorruptDataError(f"unknown checker snapshot format {fmt!r}")
    columns = Columns(position)
    try:
        for pid, epoch, last_sequence, _last_offset, timestamp, window in producers:
            # the last offset is the newest entry's last record: it is not stored twice
            *older, (first, last, base_offset) = window
            columns.producer_id.append(pid)
            columns.producer_epoch.append(epoch)
            columns.last_sequence.append(last_sequence)
            columns.last_timestamp.append(timestamp)
            columns.first_sequence.append(first)
            columns.base_offset.append(base_offset)
            columns.record_count.append(_span(first, last))
            if older:
                columns.older[pid] = array("q", [value for entry in older for value in entry])
    except (ValueError, TypeError, OverflowError) as exc:
        raise CorruptDataError(f"corrupt checker snapshot (format 1): {exc!r}") from exc
    return columns


def _span(first: int, last: int) -> int:
    """Records in a stored batch from ``first`` to ``last`` (wrapping on the int32 ring)."""
    return ((last - first) % SEQUENCE_SPACE if last < first else last - first) + 1


def _validate(columns: Columns) -> None:
    """Range checks that catch a snapshot misread as another (cheap: C-level min/max)."""
    if columns.position < 0:
        raise CorruptDataError(f"corrupt checker snapshot: position {columns.position}")
    if not columns.producer_id:
        return
    checks = (
        ("producer_id", columns.producer_id, 0, MAX_PRODUCER_ID),
        ("producer_epoch", columns.producer_epoch, 0, MAX_EPOCH),
        ("last_sequence", columns.last_sequence, 0, None),
        ("first_sequence", columns.first_sequence, 0, None),
        ("base_offset", columns.base_offset, 0, columns.position),
        ("record_count", columns.record_count, 1, MAX_BATCH_RECORDS),
    )
    for name, column, low, high in checks:
        if min(column) < low or (high is not None and max(column) > high):
            raise CorruptDataError(f"corrupt checker snapshot: {name} out of range")
    if len(set(columns.producer_id)) != len(columns.producer_id):
        raise CorruptDataError("corrupt checker snapshot: a producer appears twice")
