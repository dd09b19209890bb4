"""One produce request as a value: a batch for one partition, validated once, at the edge.

A :class:`ProduceRequest` is made where a batch enters the project and validated there, once:
by :meth:`ProduceRequest.build` for batches given as Python values (the producer, the
loose-argument conveniences of :class:`ProduceShortcuts`), which checks the topic spelling
(``_topics``), the partition, the header's types and ranges (``records.validate_header``)
and every record's type, and measures the batch, in one pass over the records; and by the
broker server's decoder (``_protocol.parse_request``) for a frame off the wire, which checks
the same while it decodes and then uses the trusted constructor. Everything behind the edge
(the broker, fault injectors, cluster routing) passes the value on and trusts it: no record
is coerced, measured or re-validated again. Only the limits that depend on the receiving
broker (``max_record_bytes``, ``max_batch_bytes``, the partition count) are compared there,
against :attr:`ProduceRequest.size` and :attr:`ProduceRequest.largest`.

:class:`ProduceShortcuts` gives a broker handle ``produce`` and ``submit_produce`` with the
batch as loose arguments, over its ``submit_request``; they are conveniences of the handles
that offer them, not part of :class:`~idempotent.api.BrokerAPI`.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from idempotent.core.records import BatchHeader, Record, RecordColumns, as_record, make_header, validate_header
from idempotent.core.topics import canonical_topic
from idempotent.errors import (
    InternalError,
    InvalidBatchError,
    InvalidRecordError,
    InvalidTopicError,
)

if TYPE_CHECKING:
    pass

__all__ = ["ProduceRequest", "measure"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@attrs.frozen
class ProduceRequest:
    """A batch of records for one partition, under one producer identity.

    Build it with :meth:`build`; the plain constructor trusts its arguments (fields already
    checked, ``size``/``largest`` already measured) and exists for code that holds such values.

    Attributes:
        topic: the stored name of the topic (``_topics.canonical_topic``).
        partition: the partition number (not yet compared with the topic's count).
        header: producer identity and sequences of the batch.
        records: the records, in order.
        size: the batch's size in bytes, as :attr:`Record.size` counts.
        largest: the size of its largest record.
    """

    topic: str
    partition: int
    header: BatchHeader
    records: Sequence[Record]
    size: int
    largest: int

    @classmethod
    def build(
        cls,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        records: Sequence[Record | bytes | str | None],
        previous_sequence: int | None = None,
        *,
        measured: tuple[int, int] | None = None,
    ) -> ProduceRequest:
        """Validate a batch given as loose arguments and return it as one value.

        Args:
            records: bytes/str/None values or :class:`Record` objects (at least one).
            previous_sequence: the last sequence of the producer's batch sent just before on
                this partition (-1: none), or None (see ``BatchHeader``).
            measured: ``(size, largest)`` of ``records`` when the caller has measured them
                already (the producer, whose records are all :class:`Record` objects); the
                records are then neither coerced nor measured again.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name, or a partition that is
                not a non-negative int.
            InvalidBatchError: bad producer id, epoch or sequences, no records, or a record
                that is not a record (:class:`~idempotent.errors.InvalidRecordError`).
        """
        topic = canonical_topic(topic)
        if not _is_int(partition) or partition < 0:
            raise InvalidTopicError(f"topic {topic!r} has no partition {partition!r}")
        for value in (producer_id, producer_epoch, base_sequence):
            if not _is_int(value):
                raise InvalidBatchError(f"producer_id, producer_epoch and base_sequence must be ints, got {value!r}")
        if previous_sequence is not None and not _is_int(previous_sequence):
            raise InvalidBatchError(f"previous_sequence must be an int or None, got {previous_sequence!r}")
        if isinstance(records, bytes | str) or not isinstance(records, Sequence):
            raise InvalidBatchError("records must be a list of bytes values or Record objects")
        if not records:
            raise InvalidBatchError("empty batch: a batch needs at least one record")
        header = make_header(producer_id, producer_epoch, base_sequence, len(records), previous_sequence)
        validate_header(header)
        if measured is None and type(records) is RecordColumns:
            try:
                RecordColumns.checked(records.values, records.keys)
            except InvalidRecordError as exc:
                raise InvalidBatchError(str(exc)) from None
        if measured is None:
            measured = _measure(records)
        if measured is None:  # not all Record objects: coerce once, then measure
            try:
                records = [as_record(r) for r in records]
            except TypeError as exc:
                raise InvalidBatchError(str(exc)) from None
            measured = _measure(records)
            assert measured is not None
        size, largest = measured
        return cls(topic, partition, header, records, size, largest)  # type: ignore[arg-type]


def measure(records: Sequence[Record]) -> tuple[int, int]:
    """``(total, largest)`` of the records' :attr:`Record.size`, in one pass, for records
    that are :class:`Record` objects or a :class:`RecordColumns` (a decoder's output).

    Raises:
        InternalError: an item that is not a :class:`Record` (a bug of the caller).
    """
    measured = _measure(records)
    if measured is None:
        raise InternalError("measure() takes Record objects or RecordColumns")
    return measured


def _measure(records: Sequence[object]) -> tuple[int, int] | None:
    """``(total, largest)`` of the records' :attr:`Record.size`, in one pass; None as soon as
    one is not a :class:`Record`. The size is
    computed inline, as :attr:`Record.size` computes it (tests compare the two)."""
    if type(records) is RecordColumns:
        sizes = records.sizes()
        return sum(sizes), max(sizes)
    total = largest = 0
    for item in records:
        if type(item) is not Record and not isinstance(item, Record):
            return None
        value, key, headers = item.value, item.key, item.headers
        n = 16 + (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        for name, data in headers:
            n += len(name) + len(data) + 4
        total += n
        if n > largest:
            largest = n
    return total, largest
