"""The workload every system publishes: records with unique ids from a replayable source.

Record ``i`` (``0 <= i < records``) has the value ``b"%010d" % i`` followed by a fixed
padding up to ``value_bytes``. Its id is therefore readable from the stored value alone, so
a read-back of any system (ours, native Kafka, native Pulsar) can be checked against what was
sent. ``source(start)`` replays the records from ``start`` on, the way an application replays
its input after a restart.

Two workloads use these records (``WORKLOADS``): ``produce`` publishes them, ``ctp``
(consume-transform-produce) first fills an input topic with them, then a copy job writes
each one, transformed by :func:`transform`, to the output topic, whose values
:func:`copied_id` reads the ids from.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

ID_DIGITS = 10
#: What the ctp copy job puts between a record's id and its padding.
COPIED = b"<copied>"
#: ``produce``: publish the records; ``ctp``: copy them from an input topic, transformed.
WORKLOADS = ("produce", "ctp")


@attrs.frozen
class Workload:
    """``records`` records of ``value_bytes`` bytes each (at least the 10-digit id)."""

    records: int
    value_bytes: int = 100

    def __attrs_post_init__(self) -> None:
        if self.records < 1:
            raise ValueError(f"records must be positive, got {self.records}")
        if self.value_bytes < ID_DIGITS:
            raise ValueError(f"value_bytes must be at least {ID_DIGITS}, got {self.value_bytes}")

    def value(self, record_id: int) -> bytes:
        """The stored value of record ``record_id``."""
        return b"%010d" % record_id + b"." * (self.value_bytes - ID_DIGITS)

    def source(self, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """Replay ``(record_id, value)`` from ``start`` to the end."""
        for record_id in range(start, self.records):
            yield record_id, self.value(record_id)


def record_id(value: bytes | None) -> int | None:
    """The id of a stored value, or None for a value this workload did not write."""
    if value is None or len(value) < ID_DIGITS or not value[:ID_DIGITS].isdigit():
        return None
    return int(value[:ID_DIGITS])


def transform(value: bytes) -> bytes:
    """The ctp copy job's output for an input value: the id, :data:`COPIED`, the rest."""
    return value[:ID_DIGITS] + COPIED + value[ID_DIGITS:]


def copied_id(value: bytes | None) -> int | None:
    """The id of an output value of the copy job, or None for a value it did not write
    (an input value stored untransformed among them included)."""
    if value is None or value[ID_DIGITS : ID_DIGITS + len(COPIED)] != COPIED:
        return None
    return record_id(value)


__all__ = ["COPIED", "WORKLOADS", "Workload", "copied_id", "record_id", "transform"]
