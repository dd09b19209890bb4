"""The producer records one broker serves with, kept in its backend's metadata.

:class:`ProducerRecords` holds the broker's :class:`~idempotent.core.registry.ProducerRegistry`
(pure: ids, names, epochs, owners) and carries out what it decides on the backend's metadata
half (:class:`~idempotent.backend.MetadataStore`): id blocks, records stored before a change
is used, records reloaded from other brokers, records of idle producers deleted. A change
that cannot be stored is undone here, so the registry never runs ahead of the store.

Lock: the broker's lock (``Broker._lock``), given in, is held around every change and the
backend call that stores it. ``registry`` may be read without it (the broker's produce path
reads ``admit`` and ``lookup`` under the partition lock only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from idempotent.backend import MetadataStore
from idempotent.core.registry import ProducerRecord, ProducerRegistry
from idempotent.core.types import TopicPartition


class ProducerRecords:
    """The registry of one broker and its persistence; see the module docstring.

    Args:
        store: the backend's metadata half.
        lock: the broker's lock.
        id_block_size: producer ids reserved from the store at a time.

    Raises:
        BackendUnavailableError: the records could not be read.
    """

    def __init__(self, store: MetadataStore, lock: threading.RLock, id_block_size: int) -> None:
        self._store = store
        self._lock = lock
        self._id_block_size = id_block_size
        self.registry = ProducerRegistry(store.load_producers())

    def initialise(
        self, name: str | None, claim: Callable[[ProducerRecord | None], str | None] | None, now: float
    ) -> tuple[ProducerRecord, ProducerRecord | None]:
        """Initialise a producer (``name`` None: anonymous, a fresh id) and store its record.

        ``claim`` is called with the name's current record before anything changes and
        returns the owner to record (without it, an existing record keeps its owner).

        Returns:
            The new record, and the name's record before (None for a new name).

        Raises:
            AuthorizationError: (from ``claim``); nothing changed.
            BackendUnavailableError: an id block or the record could not be stored; nothing
                changed here (an id block taken stays unused).
        """
        with self._lock:
            registry = self.registry
            previous = registry.by_name(name) if name is not None else None
            keep = previous.principal if previous is not None else None
            principal = claim(previous) if claim is not None else keep
            if registry.will_need_id(name) and registry.needs_id_block():
                start = self._store.allocate_producer_ids(self._id_block_size)
                registry.add_id_block(start, self._id_block_size)
            record = registry.init(name, principal, now)
            try:
                self._store.save_producer(record)
            except BaseException:
                self.registry = ProducerRegistry(
                    [r for r in registry.records() if r.producer_id != record.producer_id]
                    + ([previous] if previous is not None else [])
                )
                raise
        return record, previous

    def note_partition(self, producer_id: int, tp: TopicPartition) -> None:
        """Store that a named producer writes to ``tp`` (before its first batch there is
        appended), so that a later ``init`` finds every partition holding its sequences.

        Raises:
            BackendUnavailableError: it could not be stored; the registry is as before.
        """
        with self._lock:
            record = self.registry.lookup(producer_id)
            changed = self.registry.add_partition(producer_id, tp.topic, tp.partition)
            if changed is None:
                return
            try:
                self._store.save_producer(changed)
            except BaseException:
                if record is not None:
                    self.registry = ProducerRegistry(
                        [r for r in self.registry.records() if r.producer_id != producer_id] + [record]
                    )
                raise

    def mark_evicted(self, producer_ids: Sequence[int]) -> None:
        """Flag producers whose state a partition evicted (``state_lost``) and store them.

        Raises:
            BackendUnavailableError: a record could not be stored.
        """
        if not producer_ids:
            return
        with self._lock:
            for producer_id in producer_ids:
                record = self.registry.mark_state_lost(producer_id)
                if record is not None:
                    self._store.save_producer(record)

    def refresh(self) -> None:
        """Adopt producer records that other brokers stored (new producers, higher epochs).

        Raises:
            BackendUnavailableError: the records could not be read.
        """
        records = self._store.load_producers()
        with self._lock:
            self.registry.merge(records)

    def lookup(self, producer_id: int) -> ProducerRecord | None:
        """The record of ``producer_id``, or None."""
        with self._lock:
            return self.registry.lookup(producer_id)

    def replace(self, records: list[ProducerRecord]) -> None:
        """Use ``records``, read from the store just now (the broker became its writer)."""
        registry = ProducerRegistry(records)
        with self._lock:
            self.registry = registry

    def expire(self, now: float, retention: float, activity: Mapping[int, float]) -> int:
        """Carry out :meth:`ProducerRegistry.sweep`: store the touched records, delete the
        expired ones. Returns how many were deleted.

        Raises:
            BackendUnavailableError: the store failed; what was done before stays done.
        """
        with self._lock:
            sweep = self.registry.sweep(now, retention, activity)
            for record in sweep.touched:
                self._store.save_producer(record)
            self.registry.merge(sweep.touched)
            if sweep.expired:
                self._store.delete_producers(sweep.expired)
                self.registry.drop(sweep.expired)
        return len(sweep.expired)
