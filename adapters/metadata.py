"""The metadata half of the backends (:class:`idempotent.backend.MetadataStore`).

* :class:`CompactedMetadataStore`: the store Kafka and Pulsar share, written once. Their
  metadata is a log of keyed records in one compacted topic (``__idempotent_meta``; the keys
  and encodings are in :mod:`idempotent.adapters.meta`), folded in log order into the current view
  (:class:`idempotent.adapters.meta.MetaLog`). Each backend gives it only two things: *append keyed
  records* (durably, returning their positions) and *read the keyed records after a
  position* (up to the current end). Everything else (id blocks, the merge rule of producer
  records, tombstones, settings, the compare-and-set of leases, topic records and origins,
  waiting until a record written here shows up in the log) is decided here, the same way for
  both.
* :class:`MetadataDelegate`: the :class:`~idempotent.backend.MetadataStore` methods of a
  backend object, served by the store in its ``metadata`` attribute (Kafka, Pulsar, memory),
  so that a backend is still one :class:`~idempotent.backend.LogBackend`.

Locking: the store takes the lock it is given (its backend's, which also guards the
backend's reader of the metadata log) around every read of the log and every write with the
change of the folded view that follows it, so the view is never changed outside it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Generic

from idempotent.adapters.meta import (
    MetaLog,
    P,
    TopicOrigin,
    lease_key,
    origin_key,
    pack_lease,
    pack_origin,
    pack_producer,
    written_key,
)
from idempotent.backend import MetadataStore
from idempotent.core.ownership import Lease
from idempotent.core.registry import ProducerRecord, merge_record
from idempotent.errors import BackendUnavailableError

_LOG = logging.getLogger("idempotent.adapters.metadata")

#: One keyed record: the key, and its value (None: a tombstone, deleting the key).
KeyedRecord = tuple[str, bytes | None]
#: ``append(records) -> positions``: store keyed records durably, in order; their positions.
Append = Callable[[Sequence[KeyedRecord]], list[P]]
#: ``read_after(position) -> (key, value, position), ...``: the keyed records after
#: ``position`` (None: from the start), in log order, up to the log's current end.
ReadAfter = Callable[[P | None], Iterator[tuple[str, bytes | None, P]]]


class CompactedMetadataStore(Generic[P]):
    """A :class:`~idempotent.backend.MetadataStore` over a compacted log of keyed records.

    Args:
        system: the backend's name in messages (``kafka``, ``pulsar``).
        append: stores keyed records (see :data:`Append`); raises only errors of the tree.
        read_after: reads keyed records (see :data:`ReadAfter`); raises only errors of the
            tree. A backend whose reader keeps its own place may rely on being asked for
            the records after the last position it returned.
        lock: the backend's lock (re-entrant), held around every read and write here.
        timeout: seconds to wait for a record written here to show up when read back.
        writable: False for a backend opened read-only: a grown partition count is not
            noted in the records (see :meth:`note_count`).
    """

    def __init__(
        self,
        system: str,
        append: Append[P],
        read_after: ReadAfter[P],
        lock: threading.RLock,
        *,
        timeout: float,
        writable: bool = True,
    ) -> None:
        self._system = system
        self._append: Append[P] = append
        self._read_after: ReadAfter[P] = read_after
        self._lock = lock
        self._timeout = timeout
        self._writable = writable
        self._fold: MetaLog[P] = MetaLog()
        #: the position of the last record folded, None before the first
        self._last: P | None = None

    # -- the log -----------------------------------------------------------------------------

    def catch_up(self) -> None:
        """Fold every record stored since the last call. A record that cannot be decoded is
        logged and skipped (the others still count)."""
        with self._lock:
            for key, value, position in self._read_after(self._last):
                self._last = position
                try:
                    self._fold.apply(key, value, position)
                except (ValueError, TypeError) as exc:
                    _LOG.warning("ignoring unreadable meta record %r at %s: %r", key, position, exc)

    def _wait_for(self, position: P, what: str) -> None:
        """Catch up until the record at ``position`` (written here) is folded. Needs the lock.

        Raises:
            BackendUnavailableError: it did not show up within the timeout.
        """
        deadline = time.monotonic() + self._timeout
        while True:
            self.catch_up()
            if self._last is not None and self._last >= position:
                return
            if time.monotonic() > deadline:
                raise BackendUnavailableError(f"{self._system}: {what} did not show up in the metadata log")
            time.sleep(0.01)

    # -- producer ids and records ----------------------------------------------------------

    def allocate_producer_ids(self, count: int) -> int:
        """Request a block of ``count`` ids; its first id is the sum of the sizes of the
        blocks before it in log order, so brokers allocating at once never overlap."""
        (position,) = self._append([(f"idblock:{uuid.uuid4().hex}", str(count).encode())])
        with self._lock:
            self._wait_for(position, "the id block")
            return self._fold.block_start(position)

    def load_producers(self) -> list[ProducerRecord]:
        with self._lock:
            self.catch_up()
            return list(self._fold.producers.values())

    def save_producer(self, record: ProducerRecord) -> None:
        """Store a record; the records of other ids that carry its name get tombstones in the
        same write. Folded here as the log folds it (a stale copy does not undo a newer
        record)."""
        with self._lock:
            name, producers = record.producer_name, self._fold.producers
            renamed = [] if name is None else [p for p in self._fold.producers_named(name) if p != record.producer_id]
            records: list[KeyedRecord] = [(f"producer:{producer_id}", None) for producer_id in renamed]
            self._append([*records, (f"producer:{record.producer_id}", pack_producer(record))])
            for producer_id in renamed:
                producers.pop(producer_id, None)
            producers[record.producer_id] = merge_record(producers.get(record.producer_id), record)

    def delete_producers(self, producer_ids: Sequence[int]) -> None:
        """Tombstones for ``producer_ids``, in one write (compaction drops the keys)."""
        if not producer_ids:
            return
        with self._lock:
            self._append([(f"producer:{producer_id}", None) for producer_id in producer_ids])
            for producer_id in producer_ids:
                self._fold.producers.pop(producer_id, None)

    # -- settings --------------------------------------------------------------------------

    def load_settings(self) -> dict[str, str]:
        with self._lock:
            self.catch_up()
            return dict(self._fold.settings)

    def save_setting(self, key: str, value: str | None) -> None:
        with self._lock:
            self._append([(f"setting:{key}", None if value is None else value.encode())])
            if value is None:
                self._fold.settings.pop(key, None)
            else:
                self._fold.settings[key] = value

    # -- partitions a named producer wrote ---------------------------------------------------

    def written_by(self, producer_name: str) -> set[tuple[str, int]]:
        """The partitions the named producer ``producer_name`` is recorded to have written
        (read up to the log's end)."""
        with self._lock:
            self.catch_up()
            return set(self._fold.written.get(producer_name, ()))

    def record_written(self, producer_name: str, partitions: Sequence[tuple[str, int]]) -> None:
        """Record, durably and in one write, that ``producer_name`` writes ``partitions``
        (before its first batch on each), so that a restart knows its state there must exist
        even when the state itself is lost."""
        fresh = [tp for tp in partitions if tp not in self._fold.written.get(producer_name, ())]
        if not fresh:
            return
        with self._lock:
            self._append([(written_key(producer_name, topic, partition), b"1") for topic, partition in fresh])
            self._fold.written.setdefault(producer_name, set()).update(fresh)

    # -- leases ----------------------------------------------------------------------------

    def load_leases(self) -> list[Lease]:
        with self._lock:
            self.catch_up()
            return list(self._fold.leases.values())

    def propose_leases(self, proposals: Sequence[Lease]) -> list[Lease | None]:
        """Store the proposals, then read the log up to them: the log's order judges each
        (a compare-and-set, see :class:`idempotent.adapters.meta.MetaLog`)."""
        if not proposals:
            return []
        with self._lock:
            positions = self._append([(lease_key(p.topic, p.partition), pack_lease(p)) for p in proposals])
            self._wait_for(max(positions), "the lease proposals")
            return [self._fold.leases.get((p.topic, p.partition)) for p in proposals]

    def claim_writer(self) -> bool:
        return False  # writers are per partition (see MetadataStore.claim_writer)

    # -- topic records ---------------------------------------------------------------------

    def list_topics(self) -> dict[str, int]:
        with self._lock:
            self.catch_up()
            return dict(self._fold.topics)

    def partition_count(self, topic: str) -> int | None:
        """The recorded partition count of ``topic`` as last folded (no read), or None."""
        return self._fold.topics.get(topic)

    def recorded_topics(self) -> list[str]:
        """The recorded topics as last folded (no read)."""
        with self._lock:
            return list(self._fold.topics)

    def origin(self, topic: str) -> TopicOrigin | None:
        """How ``topic`` came into the records (its first origin record in log order), if known."""
        return self._fold.origins.get(topic)

    def record_topic(self, topic: str, partitions: int, origin: TopicOrigin) -> int:
        """Record a topic new to the records with its origin; returns its recorded count
        afterwards (another broker's record stored first wins, see :mod:`idempotent.adapters.meta`)."""
        with self._lock:
            self._append(
                [
                    (origin_key(topic, uuid.uuid4().hex), pack_origin(origin)),
                    (f"topic:{topic}", str(partitions).encode()),
                ]
            )
            self._fold.topics[topic] = partitions
            self.catch_up()
            return self._fold.topics.get(topic, partitions)

    def forget_topic(self, topic: str) -> None:
        """Tombstone the topic record of a deleted topic (its origin records stay, see
        :class:`idempotent.adapters.meta.MetaLog`)."""
        with self._lock:
            self._append([(f"topic:{topic}", None)])
            self._fold.topics.pop(topic, None)

    def note_count(self, topic: str, partitions: int) -> None:
        """Note a recorded topic's grown partition count: stored in the records unless the
        backend is read-only (then known to this backend only)."""
        with self._lock:
            if self._writable:
                self._append([(f"topic:{topic}", str(partitions).encode())])
            self._fold.topics[topic] = partitions


class MetadataDelegate:
    """The :class:`~idempotent.backend.MetadataStore` methods of a backend, each served by
    the store in ``self.metadata``."""

    metadata: MetadataStore

    def list_topics(self) -> dict[str, int]:
        return self.metadata.list_topics()

    def allocate_producer_ids(self, count: int) -> int:
        return self.metadata.allocate_producer_ids(count)

    def load_producers(self) -> list[ProducerRecord]:
        return self.metadata.load_producers()

    def save_producer(self, record: ProducerRecord) -> None:
        self.metadata.save_producer(record)

    def delete_producers(self, producer_ids: Sequence[int]) -> None:
        self.metadata.delete_producers(producer_ids)

    def load_settings(self) -> dict[str, str]:
        return self.metadata.load_settings()

    def save_setting(self, key: str, value: str | None) -> None:
        self.metadata.save_setting(key, value)

    def load_leases(self) -> list[Lease]:
        return self.metadata.load_leases()

    def propose_leases(self, proposals: Sequence[Lease]) -> list[Lease | None]:
        return self.metadata.propose_leases(proposals)

    def claim_writer(self) -> bool:
        return self.metadata.claim_writer()
