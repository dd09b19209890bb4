"""The storage contract: what a backend (``adapters/``) provides to the broker, in two halves.

* :class:`PartitionLog`, **the log**: a durable, ordered log per topic-partition (``append``,
  ``read``, ``replay``, ``end_offset``), the checker's snapshots, the storage of topics
  (``describe_topic``, ``create_topic``), ``release`` and ``close``.
* :class:`MetadataStore`, **the metadata**: producer-id blocks, producer records, settings,
  partition leases, the writer claim and the topic records (``list_topics``).

:class:`LogBackend` is both in one object, which is what ``adapters.open_backend`` returns and
what the broker takes. Each half is implemented on its own: Kafka and Pulsar keep the
metadata in a compacted log of their own, folded by the one store both share
(``adapters/metadata.py``: each gives it only "append a keyed record" and "read keyed records
from a position"); memory keeps it in its store and SQLite in its file (in the same
transactions as the log). ``idempotent.testing.conformance`` checks both halves on every
backend.

A backend does no sequence checking: the broker's own checker decides what is written, and
the backend only stores it, keeps each partition in append order and assigns offsets.
Adapters translate their client's errors into :mod:`idempotent.errors` in one place, at their
edge.

Offsets are integers that grow with every append; the records of one batch get consecutive
offsets ``base_offset .. base_offset + len(records) - 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Protocol, runtime_checkable

import attrs

from idempotent.core.checker import CheckerConfig
from idempotent.core.ownership import Lease
from idempotent.core.records import BatchHeader, Record, Snapshot, StoredBatch, StoredRecord
from idempotent.core.registry import ProducerRecord


@attrs.frozen
class AppendBatch:
    """A batch the checker accepted, ready to be stored.

    ``header`` is None for records written without producer identity. ``size`` is the
    batch's size as :attr:`Record.size` counts it, when the caller measured it (a writer that
    packs several batches into one request uses it; None: not measured).
    """

    header: BatchHeader | None
    records: Sequence[Record]
    timestamp: float
    size: int | None = None


class PartitionLog(Protocol):
    """The log half of a backend: the records of every topic-partition, in append order,
    their batch boundaries, the checker's snapshots and the storage of topics.

    Every method may raise :class:`~idempotent.errors.BackendUnavailableError` (the backend
    failed; for ``append`` the batch may or may not be stored) and nothing else from the
    backend's own client library.
    """

    #: The URL this backend was opened with.
    url: str
    #: True when an acknowledged append survives a crash of this process.
    durable: bool

    @property
    def max_record_bytes(self) -> int | None:
        """The largest record the backend stores, counted as ``Record.size`` counts it (Kafka:
        the client's ``message.max.bytes`` less room for the ``idem.*`` headers), or None."""
        ...

    @property
    def max_batch_bytes(self) -> int | None:
        """The largest batch the backend stores in one piece, counted as the broker's
        ``max_batch_bytes`` counts it (Pulsar: one entry, ``maxMessageSize``), or None."""
        ...

    def describe_topic(self, topic: str) -> int | None:
        """The partition count ``topic`` has now, or None when there is no such topic.

        Read from the topic records again, and on Kafka and Pulsar from the system's own
        metadata as well: a topic created there by its own tools (and not yet in the records)
        is counted, and so are partitions added to a topic since it was recorded. Never
        creates or adopts a topic; it may note a grown partition count in the records.
        """
        ...

    def create_topic(self, topic: str, partitions: int) -> int:
        """Create a topic with ``partitions`` partitions, or take over the one that exists.

        A topic already in the records keeps its count. On Kafka and Pulsar a topic that
        exists in the system but not in the records (made by their own tools, or by a plain
        client) is *adopted*: recorded with the partition count it really has, and used as it
        is. Nothing is refused for having another count; the caller compares.

        Returns:
            The topic's partition count after the call.

        Raises:
            InvalidTopicError: the name cannot be stored here (for example it would share a
                Kafka or Pulsar topic with another project topic); nothing recorded.
        """
        ...

    def delete_topic(self, topic: str) -> None:
        """Delete a topic: its records, batch boundaries, checker snapshots and its topic
        record; stop writing to its partitions. Unknown topics are ignored (the caller
        checks). Producer records and settings are the caller's to keep or remove."""
        ...

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        """Store a batch after everything appended to the partition before it.

        ``snapshot``, when given, is the checker state as of just before this batch; a
        backend that can store it atomically with the batch does so, others store it after.
        Either way it takes its turn as a snapshot handed over now (see :meth:`write_snapshot`).

        Returns:
            A future of the batch's base offset. Futures of one partition complete in append
            order. A failed future means the batch may or may not be stored.

        Ordering contract: once an append of a partition fails, no append of that partition
        submitted after it may be stored until the broker has rebuilt the partition (the
        broker stops appending to it at the first failure it sees). Otherwise a later batch
        could land behind a hole, and a resend of the missing batch would wrongly look like
        a duplicate.
        """
        ...

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        """Up to ``max_records`` records with offsets at or after ``offset``, in order."""
        ...

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        """Batch boundaries of every batch whose base offset is at or after ``from_offset``."""
        ...

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next append will get (or higher)."""
        ...

    def latest_snapshot(self, topic: str, partition: int) -> Snapshot | None:
        """The newest snapshot stored for the partition (the highest position; at one
        position, the one handed over last: see :meth:`write_snapshot`), or None."""
        ...

    def write_snapshot(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        """Store a snapshot of the checker state; return once it is stored.

        Snapshot order: a partition's snapshots take effect in the order they are handed
        over, by this method or riding with :meth:`append`. A snapshot handed over here is
        stored after every append of the partition handed over before it (or fails), and is
        never replaced by a snapshot handed over earlier, even one at the same position that
        an append still waiting to be stored carries: :meth:`latest_snapshot` returns, among
        the snapshots at the highest position, the one handed over last. (The broker writes
        evictions this way; were an older snapshot to win, a recovery would bring evicted
        producers back.)

        Raises:
            BackendUnavailableError: not stored (for example an earlier append of the
                partition failed); the previous snapshots are kept.
        """
        ...

    def release(self, topic: str, partition: int) -> None:
        """Stop writing to a partition: drop this backend's writer of it, if any. A later
        append, replay or latest_snapshot opens a new one, taking the partition over again
        (fencing whichever writer holds it then). Acknowledged appends stay stored."""
        ...

    def close(self) -> None:
        """Release resources. Appends already acknowledged stay stored."""
        ...


class MetadataStore(Protocol):
    """The metadata half of a backend: what the brokers over one store share besides the log.

    Producer-id blocks never overlap (also between brokers allocating at once); producer
    records fold with :func:`idempotent.core.registry.merge_record` (a stale copy never undoes a
    newer epoch); a lease proposal is a compare-and-set (:func:`idempotent.core.ownership.supersedes`);
    every read sees what other brokers and processes stored before it (``load_*`` and
    ``list_topics`` read the store again). Writes are durable before they return.

    Every method may raise :class:`~idempotent.errors.BackendUnavailableError` (for a write:
    it may or may not be stored; storing it again is harmless) and nothing else from the
    backend's own client library.
    """

    def list_topics(self) -> dict[str, int]:
        """Every topic in the topic records and its partition count, read again (topics other
        brokers and processes created since are included). The records are written by
        :meth:`PartitionLog.create_topic` (and a grown count by ``describe_topic``)."""
        ...

    def allocate_producer_ids(self, count: int) -> int:
        """Atomically reserve ``count`` producer ids and return the first one."""
        ...

    def load_producers(self) -> list[ProducerRecord]:
        """Every stored producer record."""
        ...

    def save_producer(self, record: ProducerRecord) -> None:
        """Store (insert or replace) a producer record, durably before returning."""
        ...

    def delete_producers(self, producer_ids: Sequence[int]) -> None:
        """Delete the records of ``producer_ids`` (expired; unknown ids are ignored),
        durably before returning."""
        ...

    def load_settings(self) -> dict[str, str]:
        """Stored broker settings (deduplication switches and policies)."""
        ...

    def save_setting(self, key: str, value: str | None) -> None:
        """Store a setting; None deletes it."""
        ...

    def load_leases(self) -> list[Lease]:
        """Every stored partition ownership record (see :mod:`idempotent.core.ownership`), as of
        now: records stored by other brokers since the last call are included."""
        ...

    def propose_leases(self, proposals: Sequence[Lease]) -> list[Lease | None]:
        """Store ownership proposals, atomically each: a proposal replaces the partition's
        record only when :func:`idempotent.core.ownership.supersedes` says so, judged against the
        record stored just before it in the backend's own order (a compare-and-set).

        Returns:
            For each proposal, the partition's record right after it was judged: the
            proposal itself when it won, else the record that beat it.
        """
        ...

    def claim_writer(self) -> bool:
        """Called by the broker before it decides on a write (a produce, a producer init).

        A backend with one writer per store (SQLite: one process per database file) becomes
        that writer here; the others have a writer per partition, opened by ``append``,
        ``replay`` or ``latest_snapshot`` (fencing the previous one), and return False.

        Returns:
            True when this backend became the store's writer since the previous call: what
            the broker read before (checker states, producer records, settings) may have been
            changed by the previous writer, so it rebuilds all of it from what is stored now.

        Raises:
            ConfigError: another live process is the writer (SQLite); nothing changed.
            BackendUnavailableError: the backend failed.
        """
        ...


class LogBackend(PartitionLog, MetadataStore, Protocol):
    """A backend: the log and the metadata in one object (see the module docstring). One
    small interface per half; ``idempotent.testing.conformance`` checks both."""


class ProducerLog(Protocol):
    """One producer's own writer into a shared log (producer-scoped ownership; see
    :class:`idempotent.broker.direct.DirectBroker`): Kafka (``idempotent.adapters.kafka.producer_log``) and Pulsar
    (``idempotent.adapters.pulsar.producer_log``), and in memory with fault injection for tests
    (``idempotent.adapters.memory_producer_log``); ``idempotent.testing.conformance_producer_log``
    checks them all. Opening it fences the producer's earlier instances (Kafka, memory: at
    once; Pulsar: the newer instance's partitions wait for the older to let go, which it does
    at its next write). Not thread-safe: the producer's sender thread is its only user."""

    #: the largest batch (as ``Record.size`` counts) and record count it takes
    max_batch_bytes: int
    max_batch_records: int

    def load_states(
        self, producer_id: int = -1, *, window: int = ..., config: CheckerConfig | None = None
    ) -> dict[tuple[str, int], Snapshot]:
        """The producer's checker state on every partition it wrote, as committed (named
        producers; empty for anonymous ones): the stored state completed by a replay of the
        partition after it, applying the batches of ``producer_id``; a stored state that is
        missing, older than the data or unreadable is rebuilt from the partition's last
        ``window`` offsets, never taken as empty (``config``: the checker's bounds).

        Raises:
            BackendUnavailableError: the states could not be read.
            ProducerStateLostError: a state the window cannot rebuild; nothing changed.
        """
        ...

    def write(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        states: Callable[[list[int]], Sequence[tuple[str, int, Snapshot]]] | None = None,
    ) -> list[int]:
        """Store ``batches`` (at most one per partition), with the producer's states after
        them (``states(base offsets)``); return the base offsets. Kafka stores a group
        atomically (one transaction); Pulsar stores each batch atomically (one entry), and
        settles a group whose outcome is unknown batch by batch (:meth:`resolve`).

        Raises:
            BackendUnavailableError: nothing was stored, or (when :meth:`unresolved` is
                true) the outcome is unknown until :meth:`resolve`.
            OwnershipLostError: a newer instance of the producer fenced this one.
            EntryTooLargeError, InvalidTopicError, ConfigError: refused; nothing stored.
        """
        ...

    @property
    def unresolved(self) -> object | None:
        """Not None while the outcome of the last write is unknown."""
        ...

    def resolve(self) -> Sequence[int | None] | None:
        """Settle the last write whose outcome is unknown: its base offsets when it was
        stored, None when it was not. A log whose groups are not atomic (Pulsar) answers per
        batch: a base offset, or None for a batch that was not stored. Once it answers,
        :attr:`unresolved` is None and the next :meth:`write` may go.

        Raises:
            BackendUnavailableError: the log could not be reached; still unresolved.
        """
        ...

    def close(self) -> None:
        """Stop writing. Stored batches stay stored; an unresolved write stays unknown to
        this instance (the next instance's :meth:`load_states` reads what was stored)."""
        ...


@attrs.frozen
class PartitionReplicas:
    """Where one partition's copies are: the broker ids of its replicas, of those in sync
    (the ISR) and of its leader (-1: none now)."""

    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@attrs.frozen
class TopicReplicas:
    """A topic's replication, as its backend reports it (``idempotent topics describe``).

    ``min_insync_replicas`` is the topic's ``min.insync.replicas`` in force (None: not known)
    and ``min_insync_source`` where it comes from (``"topic"``: set on the topic, ``"broker"``:
    the broker's default); ``note`` says what the numbers mean where they need it."""

    partitions: tuple[PartitionReplicas, ...]
    min_insync_replicas: int | None = None
    min_insync_source: str | None = None
    note: str | None = None


@runtime_checkable
class AtomicAppends(Protocol):
    """A log that stores batches of several partitions, and a named producer's positions, in
    one atomic step: SQLite (one transaction of its file) and memory (one hold of its store).
    The broker commits an application's transaction through it (docs/semantics.md,
    "Application transactions"); a backend without it has no transactions on a
    :class:`~idempotent.broker.broker.Broker`."""

    def append_atomic(
        self, appends: Sequence[tuple[str, int, AppendBatch, Snapshot | None]], positions: tuple[str, bytes] | None
    ) -> Future[list[int]]:
        """Store every batch of ``appends`` after what each partition holds (with its
        snapshot, when not None) and ``positions`` (the producer's name and its encoded
        positions; None: leave them), all or nothing. Appends of the same partitions handed
        over earlier are stored before them.

        Returns:
            The future of the batches' base offsets, in order. It fails with
            BackendUnavailableError when nothing was stored (the partitions' later appends
            fail too, until they are replayed, as after a failed ``append``).
        """
        ...

    def committed_positions(self, producer_name: str) -> bytes | None:
        """The positions the last committed transaction of ``producer_name`` stored, or None.

        Raises:
            BackendUnavailableError: the backend could not be read.
        """
        ...


@runtime_checkable
class DescribesReplicas(Protocol):
    """A backend that keeps copies of each partition on several servers (Kafka) and can say
    where they are."""

    def describe_replicas(self, topic: str) -> TopicReplicas | None:
        """The replicas of ``topic`` now; None when the backend has no such topic.

        Raises:
            BackendUnavailableError: the backend could not be asked.
        """
        ...
