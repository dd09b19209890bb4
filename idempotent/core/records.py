"""Record and batch value types shared by the client, the broker and the storage adapters."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Sequence as SequenceABC
from typing import Any, cast, overload

import attrs

from idempotent.core.types import (
    MAX_APPLICATION_SEQUENCE,
    MAX_BATCH_RECORDS,
    MAX_EPOCH,
    MAX_PRODUCER_ID,
    NO_SEQUENCE,
    Epoch,
    ProducerId,
    Sequence,
)
from idempotent.errors import InvalidBatchError, InvalidRecordError

Headers = tuple[tuple[str, bytes], ...]


def _headers(value: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None) -> Headers:
    if value is None:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    out = []
    for name, data in items:
        if not isinstance(name, str):
            raise InvalidRecordError(f"header names must be str, not {type(name).__name__}")
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidRecordError(f"header {name!r} must be bytes or str, not {type(data).__name__}")
        out.append((name, bytes(data)))
    return tuple(out)


def optional_bytes(
    value: object, what: str = "record keys and values", error: type[Exception] = InvalidRecordError
) -> bytes | None:
    """A record's key or value as stored: bytes (bytearray and memoryview copied), ``str``
    encoded as UTF-8, or None.

    Raises:
        error: any other type, as ``"{what} must be bytes, str or None, not {type}"``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise error(f"{what} must be bytes, str or None, not {type(value).__name__}")


def _optional_millis(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRecordError(f"a record timestamp must be milliseconds as an int >= 0, not {value!r}")
    return value


@attrs.frozen
class Record:
    """One record as a producer sends it: optional key, value and ordered headers.

    ``str`` keys, values and header values are encoded as UTF-8. ``timestamp`` is the
    record's own time in milliseconds since the epoch (an application's event time, as
    Kafka's ``CreateTime``), or None to take the time its batch is stored; backends that
    store a time per record (Kafka, Pulsar's event time) keep it.
    """

    value: bytes | None = attrs.field(converter=optional_bytes)
    key: bytes | None = attrs.field(default=None, converter=optional_bytes)
    headers: Headers = attrs.field(default=(), converter=_headers)
    timestamp: int | None = attrs.field(default=None, converter=_optional_millis)

    @property
    def size(self) -> int:
        """Approximate encoded size in bytes, used for batching decisions."""
        total = 16 + len(self.value or b"") + len(self.key or b"")
        for name, data in self.headers:
            total += len(name) + len(data) + 4
        return total


_new = object.__new__
# the slot descriptors of the frozen class: setting through them skips the converters
_set_value = Record.__dict__["value"].__set__
_set_key = Record.__dict__["key"].__set__
_set_headers = Record.__dict__["headers"].__set__
_set_timestamp = Record.__dict__["timestamp"].__set__


def value_record(value: bytes) -> Record:
    """``Record(value)`` for a ``bytes`` value, without the converters (the hot path of a
    producer: no key, no headers). The caller guarantees ``type(value) is bytes``."""
    record: Record = _new(Record)
    _set_value(record, value)
    _set_key(record, None)
    _set_headers(record, ())
    _set_timestamp(record, None)
    return record


def trusted_record(value: bytes | None, key: bytes | None, headers: Headers, timestamp: int | None = None) -> Record:
    """``Record(value, key, headers, timestamp)`` without the converters, for fields that
    already have their final types (``bytes`` or None, a tuple of ``(str, bytes)`` pairs,
    milliseconds or None): records read from a log and copied on (a mirror). The caller
    guarantees the types."""
    record: Record = _new(Record)
    _set_value(record, value)
    _set_key(record, key)
    _set_headers(record, headers)
    _set_timestamp(record, timestamp)
    return record


class RecordColumns(SequenceABC[Record]):
    """Records without headers, held as a column of values, a column of keys and, when any
    record has its own time, a column of timestamps.

    A bulk writer (a Spark task) hands these to :meth:`Producer.send_many`; they go through
    the producer's batches, the wire (``records`` plus ``keys``, docs/protocol.md) and the
    broker server to the backend's writer without a :class:`Record` object per record. Read
    as a sequence, it gives :class:`Record` objects made on access.

    Args:
        values: each record's value (bytes or None).
        keys: each record's key (bytes or None), as many as ``values``; None: no keys.
        timestamps: each record's time in milliseconds or None (see :attr:`Record.timestamp`),
            as many as ``values``; None: no record has its own.

    The caller guarantees the types (``bytes`` or None) and the lengths: build it from data
    that has them, or check first with :meth:`checked`.
    """

    __slots__ = ("keys", "timestamps", "values")

    def __init__(
        self,
        values: list[bytes | None],
        keys: list[bytes | None] | None = None,
        timestamps: list[int | None] | None = None,
    ) -> None:
        self.values = values
        self.keys = keys
        self.timestamps = timestamps

    @classmethod
    def checked(cls, values: list[Any], keys: list[Any] | None = None) -> RecordColumns:
        """Columns of untrusted lists.

        Raises:
            InvalidRecordError: a value or key that is not bytes or None, or not as many keys
                as values.
        """
        for name, column in (("value", values), ("key", keys)):
            if column is not None and not _ONLY_BYTES.issuperset(map(type, column)):
                bad = next(item for item in column if type(item) not in _ONLY_BYTES)
                raise InvalidRecordError(f"record {name}s must be bytes or None, not {type(bad).__name__}")
        if keys is not None and len(keys) != len(values):
            raise InvalidRecordError(f"{len(keys)} keys for {len(values)} values")
        return cls(values, keys)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def timed(self) -> bool:
        """Whether any record has a time of its own."""
        timestamps = self.timestamps
        return timestamps is not None and timestamps.count(None) != len(timestamps)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...

    def __getitem__(self, index: int | slice) -> Record | RecordColumns:
        keys, timestamps = self.keys, self.timestamps
        if isinstance(index, slice):
            return RecordColumns(
                self.values[index],
                None if keys is None else keys[index],
                None if timestamps is None else timestamps[index],
            )
        return trusted_record(
            self.values[index],
            None if keys is None else keys[index],
            (),
            None if timestamps is None else timestamps[index],
        )

    def __iter__(self) -> Iterator[Record]:
        keys = self.keys if self.keys is not None else itertools.repeat(None)
        timestamps = self.timestamps if self.timestamps is not None else itertools.repeat(None)
        return map(trusted_record, self.values, keys, itertools.repeat(()), timestamps)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordColumns):
            return (
                self.values == other.values
                and (self.keys or [None] * len(self)) == (other.keys or [None] * len(other))
                and (self.timestamps or [None] * len(self)) == (other.timestamps or [None] * len(other))
            )
        if isinstance(other, SequenceABC) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RecordColumns({len(self)} records, keys={self.keys is not None})"

    def __add__(self, other: RecordColumns) -> RecordColumns:
        """Both sets of records in one, in order."""
        keys: list[bytes | None] | None = None
        if self.keys is not None or other.keys is not None:
            keys = (self.keys or [None] * len(self)) + (other.keys or [None] * len(other))
        timestamps: list[int | None] | None = None
        if self.timestamps is not None or other.timestamps is not None:
            timestamps = (self.timestamps or [None] * len(self)) + (other.timestamps or [None] * len(other))
        return RecordColumns(self.values + other.values, keys, timestamps)

    def sizes(self) -> list[int]:
        """Each record's :attr:`Record.size`, computed per column."""
        values, keys = self.values, self.keys
        if None in values:
            lengths = [16 + len(v) if v is not None else 16 for v in values]
        else:
            lengths = list(map(_PLUS_16, map(len, cast(list[bytes], values))))
        if keys is None:
            return lengths
        if None in keys:
            return [n + len(k) if k is not None else n for n, k in zip(lengths, keys, strict=True)]
        return list(map(operator.add, lengths, map(len, cast(list[bytes], keys))))


_ONLY_BYTES = frozenset({bytes, type(None)})
_PLUS_16 = functools.partial(operator.add, 16)


def record_sizes(records: Iterable[Record]) -> list[int]:
    """Each record's :attr:`Record.size`, computed inline in one pass (the producer's bulk
    path; tests compare it with the property). The caller guarantees :class:`Record` items."""
    if type(records) is RecordColumns:
        return records.sizes()
    out: list[int] = []
    append = out.append
    for record in records:
        value, key, headers = record.value, record.key, record.headers
        n = 16 + (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        for name, data in headers:
            n += len(name) + len(data) + 4
        append(n)
    return out


def as_record(item: Record | bytes | str | None) -> Record:
    """Coerce a bytes/str/None value or a :class:`Record` to a :class:`Record`."""
    if type(item) is Record:
        return item
    if type(item) is bytes:
        return value_record(item)
    if isinstance(item, Record):
        return item
    return Record(item)


@attrs.frozen
class BatchHeader:
    """What the checker needs to know about a batch: who sent it and which sequences it holds.

    ``previous_sequence`` is the last sequence of the batch the producer sent just before on
    this partition (-1: none), or None when the producer does not say (older clients, and
    batches replayed from a log). Under the ``monotonic`` policy a batch above the producer's
    pushed sequence is accepted only when it names that sequence as its predecessor, so a
    batch cannot overtake a refused one (docs/semantics.md). Stores do not keep it.
    """

    producer_id: ProducerId
    producer_epoch: Epoch
    base_sequence: Sequence
    record_count: int
    previous_sequence: int | None = None


@attrs.frozen
class StoredRecord:
    """A record as read back from a partition, with the producer identity it was written under.

    ``producer_id`` is -1 and ``sequence`` -1 for records written with deduplication disabled
    and no producer identity.
    """

    offset: int
    producer_id: int
    producer_epoch: int
    sequence: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: float = 0.0


@attrs.frozen
class StoredBatch:
    """A batch boundary as replayed from a partition's log during recovery."""

    base_offset: int
    producer_id: ProducerId
    producer_epoch: Epoch
    base_sequence: Sequence
    record_count: int
    timestamp: float

    @property
    def end_offset(self) -> int:
        """The offset right after the batch's last record."""
        return self.base_offset + self.record_count


@attrs.frozen
class Snapshot:
    """Serialized checker state of one partition, valid for every batch below ``position``.

    Recovery loads it and replays the log from ``position`` on.
    """

    position: int
    entries: int
    taken_at: float
    data: bytes


def validate_header(header: BatchHeader) -> None:
    """Raise :class:`InvalidBatchError` unless every field of ``header`` is in range."""
    if not 0 <= header.producer_id <= MAX_PRODUCER_ID:
        raise InvalidBatchError(f"producer_id {header.producer_id} out of range")
    if not 0 <= header.producer_epoch <= MAX_EPOCH:
        raise InvalidBatchError(f"producer_epoch {header.producer_epoch} out of range")
    if not 0 <= header.base_sequence <= MAX_APPLICATION_SEQUENCE - header.record_count + 1:
        raise InvalidBatchError(
            f"batch at base_sequence {header.base_sequence} out of range (0..{MAX_APPLICATION_SEQUENCE})"
        )
    if not 1 <= header.record_count <= MAX_BATCH_RECORDS:
        raise InvalidBatchError(f"record_count {header.record_count} out of range (1..{MAX_BATCH_RECORDS})")
    previous = header.previous_sequence
    if previous is not None and not NO_SEQUENCE <= previous <= MAX_APPLICATION_SEQUENCE:
        raise InvalidBatchError(f"previous_sequence {previous} out of range (-1..{MAX_APPLICATION_SEQUENCE})")


def make_header(
    producer_id: int, producer_epoch: int, base_sequence: int, record_count: int, previous_sequence: int | None = None
) -> BatchHeader:
    """Build a :class:`BatchHeader` from plain ints."""
    return BatchHeader(
        ProducerId(producer_id), Epoch(producer_epoch), Sequence(base_sequence), record_count, previous_sequence
    )
