"""What the log adapters share: the metadata log and the encoding of stored values.

Kafka and Pulsar keep topics, producer records, settings, producer-id blocks and partition
leases as keyed messages in one metadata topic (``topic:<name>``, ``origin:<name>:<request>``,
``producer:<id>``, ``setting:<key>``, ``idblock:<request>``, ``lease:<partition>:<topic>``).
:class:`MetaLog` folds those messages, in log order, into the current view. A producer-id
block's first id is the sum of the sizes of the blocks before it in log order, so brokers
allocating at the same time never overlap. A lease proposal replaces the partition's lease
only when :func:`idempotent.core.ownership.supersedes` says so, judged in log order: the log is
the compare-and-set.

A topic's *origin* says how it came into the records (:class:`TopicOrigin`): created by a
broker, or adopted (it existed in Kafka or Pulsar already, made by their tools or by plain
clients), with the end of each partition when it was adopted: nothing this project wrote can
be before it, so recovery replays from there. Every broker that records a topic writes one
under a key of its own; the first in log order wins. That is safe with brokers racing to
record the same topic: a broker writes its origin before any of its batches, so an origin
whose ends cover another broker's batch was written after that broker's origin.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs
import msgpack

from idempotent.core.ownership import Lease, supersedes
from idempotent.core.records import Snapshot
from idempotent.core.registry import ProducerRecord, merge_record
from idempotent.core.types import Epoch, ProducerId

#: a log position: a Kafka offset, or a Pulsar (ledger, entry) pair
P = TypeVar("P", int, tuple[int, int])


def pack_producer(record: ProducerRecord) -> bytes:
    """Encode every field of a producer record (also fields added later)."""
    packed: bytes = msgpack.packb(list(attrs.astuple(record, recurse=False)))
    return packed


def unpack_producer(value: bytes) -> ProducerRecord:
    """Decode :func:`pack_producer`'s output (older, shorter encodings too)."""
    fields = msgpack.unpackb(value)
    record = ProducerRecord(*fields[: len(attrs.fields(ProducerRecord))])
    return attrs.evolve(
        record,
        producer_id=ProducerId(int(record.producer_id)),
        producer_epoch=Epoch(int(record.producer_epoch)),
        state_lost=bool(record.state_lost),
        partitions=tuple((str(t), int(p)) for t, p in record.partitions),
        principal=None if record.principal is None else str(record.principal),
        last_used=float(record.last_used),
    )


def pack_snapshot(snapshot: Snapshot) -> bytes:
    """Encode a checker snapshot."""
    packed: bytes = msgpack.packb(list(attrs.astuple(snapshot, recurse=False)))
    return packed


def unpack_snapshot(value: bytes) -> Snapshot:
    """Decode :func:`pack_snapshot`'s output."""
    fields = msgpack.unpackb(value)
    return Snapshot(*fields[: len(attrs.fields(Snapshot))])


@attrs.frozen
class TopicOrigin:
    """How a topic came into the topic records.

    Attributes:
        adopted: it existed in the storage system before (made by its tools or clients).
        starts: per partition, where this project's records can begin: the partitions' ends
            when the topic was adopted (empty for a created topic: everything is ours;
            partitions beyond it, added later, start at 0).
        partitioned: False for a Pulsar topic that is not partitioned (its one partition is
            the topic itself, not ``...-partition-0``).
    """

    adopted: bool
    starts: tuple[int, ...] = ()
    partitioned: bool = True

    def start(self, partition: int) -> int:
        """Where the records of ``partition`` that this project may have written begin."""
        return self.starts[partition] if partition < len(self.starts) else 0


def origin_key(topic: str, request: str) -> str:
    """The metadata key of one broker's origin record of ``topic``."""
    return f"origin:{topic}:{request}"


def pack_origin(origin: TopicOrigin) -> bytes:
    """Encode a topic's origin."""
    packed: bytes = msgpack.packb([origin.adopted, list(origin.starts), origin.partitioned])
    return packed


def unpack_origin(value: bytes) -> TopicOrigin:
    """Decode :func:`pack_origin`'s output."""
    fields = msgpack.unpackb(value)
    return TopicOrigin(bool(fields[0]), tuple(int(s) for s in fields[1]), bool(fields[2]))


def written_key(producer_name: str, topic: str, partition: int) -> str:
    """The metadata key saying that the named producer ``producer_name`` wrote a partition
    (written once, before its first batch there; see :mod:`idempotent.adapters.producer_state`)."""
    return f"wrote:{producer_name}\0{topic}\0{partition}"


def lease_key(topic: str, partition: int) -> str:
    """The metadata key of a partition's lease."""
    return f"lease:{partition}:{topic}"


def pack_lease(lease: Lease) -> bytes:
    """Encode a lease record."""
    packed: bytes = msgpack.packb(list(attrs.astuple(lease, recurse=False)))
    return packed


def unpack_lease(value: bytes) -> Lease:
    """Decode :func:`pack_lease`'s output."""
    fields = msgpack.unpackb(value)
    topic, partition, broker_id, address, epoch, renewed_at, duration, released = fields[:8]
    return Lease(
        str(topic),
        int(partition),
        str(broker_id),
        str(address),
        int(epoch),
        float(renewed_at),
        float(duration),
        bool(released),
    )


class MetaLog(Generic[P]):
    """The folded state of a metadata topic; ``P`` is the backend's log position type."""

    def __init__(self) -> None:
        self.topics: dict[str, int] = {}
        self.producers: dict[int, ProducerRecord] = {}
        self.settings: dict[str, str] = {}
        self.blocks: list[tuple[P, int]] = []
        self.leases: dict[tuple[str, int], Lease] = {}
        #: topic -> its first origin record in log order
        self.origins: dict[str, TopicOrigin] = {}
        #: producer name -> the partitions it wrote (``wrote:`` records)
        self.written: dict[str, set[tuple[str, int]]] = {}

    def apply(self, key: str, value: bytes | None, position: P) -> None:
        """Fold one message (``value`` None deletes the key).

        Raises:
            ValueError, TypeError: an unreadable value (the caller decides to skip it).
        """
        kind, _, name = key.partition(":")
        if kind == "topic":
            if value is None:
                self.topics.pop(name, None)
            else:
                self.topics[name] = int(value)
        elif kind == "producer":
            if value is None:
                self.producers.pop(int(name), None)
            else:
                record = unpack_producer(value)
                self.producers[record.producer_id] = merge_record(self.producers.get(record.producer_id), record)
        elif kind == "setting":
            if value is None:
                self.settings.pop(name, None)
            else:
                self.settings[name] = value.decode()
        elif kind == "origin" and value is not None:
            topic = name.rpartition(":")[0]
            if topic not in self.origins:
                self.origins[topic] = unpack_origin(value)
        elif kind == "wrote":
            producer, topic, partition = name.rsplit("\0", 2)
            tp = (topic, int(partition))
            if value is None:
                self.written.get(producer, set()).discard(tp)
            else:
                self.written.setdefault(producer, set()).add(tp)
        elif kind == "idblock" and value is not None:
            self.blocks.append((position, int(value)))
        elif kind == "lease" and value is not None:
            proposal = unpack_lease(value)
            tp = (proposal.topic, proposal.partition)
            current = self.leases.get(tp)
            if supersedes(current, proposal):
                self.leases[tp] = proposal

    def block_start(self, position: P) -> int:
        """The first id of the block requested by the message at ``position``."""
        return sum(size for at, size in self.blocks if at < position)

    def producers_named(self, name: str) -> list[int]:
        """Ids of the stored records that carry ``name``."""
        return [pid for pid, r in self.producers.items() if r.producer_name == name]
