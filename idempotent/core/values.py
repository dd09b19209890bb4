"""Values of the broker surface: what ``init_producer`` and ``stats`` return.

They live apart from the threaded shell (``broker.py``) so that the wire codec, the network
client and the producer use them without importing a broker. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs

from idempotent.core.types import TopicPartition

#: the most partitions a topic may have
MAX_PARTITIONS = 10_000


class LastSequences(Mapping[TopicPartition, int]):
    """Read-only mapping ``(topic, partition) -> last persisted sequence``; -1 when none."""

    def __init__(self, values: Mapping[TopicPartition, int]) -> None:
        self._values = dict(values)

    def __getitem__(self, key: tuple[str, int]) -> int:
        return self._values.get(TopicPartition(*key), -1)

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __repr__(self) -> str:
        return f"LastSequences({self._values!r})"


@attrs.frozen
class ProducerSession:
    """What ``init_producer`` returns: the identity to stamp on batches."""

    producer_id: int
    producer_epoch: int
    producer_name: str | None
    last_sequences: LastSequences
    #: True when the broker had evicted this named producer's state on some partition
    #: before this init: ``last_sequences`` no longer covers data stored there earlier.
    state_lost: bool = False
    #: partitions (several brokers) that the named producer wrote to but another broker
    #: owns: ``last_sequences`` does not cover them; ask each owner with
    #: :meth:`Broker.last_sequence` before writing there.
    elsewhere: tuple[tuple[str, int], ...] = ()
    #: the largest record and batch the broker takes (its own limits and its backend's,
    #: :meth:`Broker.limits`), counted as ``Record.size`` counts; None when not told (an
    #: older server). The producer refuses larger ones at ``send``.
    max_record_bytes: int | None = None
    max_batch_bytes: int | None = None
    #: a producer's own broker (:class:`~idempotent.broker.direct.DirectBroker`) writes each group
    #: of batches as one transaction with at most one batch per partition: it asks for at
    #: most this many batches in flight per partition, and this many records per batch
    #: (None: the producer's own settings)
    max_in_flight: int | None = None
    max_batch_records: int | None = None


@attrs.frozen
class ProducerStats:
    """One producer's state on one partition, as ``stats`` reports it."""

    producer_id: int
    producer_epoch: int
    producer_name: str | None
    last_sequence: int
    last_offset: int
    last_timestamp: float


@attrs.frozen
class PartitionStats:
    """State of one partition's checker."""

    topic: str
    partition: int
    status: str
    deduplication: bool
    policy: str
    position: int
    pending: int
    snapshot_position: int
    snapshot_age: float | None
    entries_since_snapshot: int
    recovery_seconds: float
    replayed_batches: int
    producers: tuple[ProducerStats, ...]


__all__ = ["MAX_PARTITIONS", "LastSequences", "PartitionStats", "ProducerSession", "ProducerStats"]
