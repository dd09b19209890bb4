"""The leases one broker holds over a backend shared with other brokers: the I/O shell of the
pure :class:`~idempotent.core.ownership.OwnershipTable`.

:class:`PartitionLeases` reads and proposes lease records through the backend's metadata
half (:class:`~idempotent.backend.MetadataStore`: ``load_leases``, ``propose_leases``) and
owns the clock: ``time.monotonic()`` for its own decisions, ``time.time()`` only written
into the records. The table decides; see :mod:`idempotent.core.ownership` and
``docs/clustering.md``. A :class:`~idempotent.broker.broker.Broker` with a ``broker_id`` has one.

Lock: ``PartitionLeases`` has its own (a leaf but for the backend calls made under it, in
:meth:`PartitionLeases.own` and :meth:`PartitionLeases.release_all`); produce requests check
their lease under it, with their partition lock held.
"""

from __future__ import annotations

import threading
import time

from idempotent.backend import MetadataStore
from idempotent.core.ownership import Action, Lease, OwnershipTable
from idempotent.core.types import TopicPartition
from idempotent.errors import NotOwnerError, ProducerError


class PartitionLeases:
    """This broker's view of who owns which partition, and the leases it holds.

    Args:
        store: the backend's metadata half, where the lease records are.
        broker_id, address, duration: this broker (``BrokerConfig.broker_id``,
            ``advertised_address``, ``lease_duration``).

    Raises:
        BackendUnavailableError: the lease records could not be read.
    """

    def __init__(self, store: MetadataStore, broker_id: str, address: str, duration: float) -> None:
        self._store = store
        self._table = OwnershipTable(broker_id, address, duration)
        self._lock = threading.Lock()
        with self._lock:
            self._table.observe(store.load_leases(), time.monotonic())

    def holds(self, tp: TopicPartition) -> bool:
        """Whether this broker holds the partition's lease now (it may touch its log)."""
        with self._lock:
            return self._table.holds(tp, time.monotonic())

    def own(self, tp: TopicPartition) -> bool:
        """Make sure this broker holds the partition's lease, claiming it when it is free,
        released or expired.

        Returns:
            True when the partition was just acquired: whatever the broker knew about it may
            be stale, so the caller drops its state (and its backend writer of it).

        Raises:
            NotOwnerError: another broker holds a live lease (or won the claim).
            BackendUnavailableError: the records could not be read or stored.
        """
        table = self._table
        with self._lock:
            now = time.monotonic()
            if table.holds(tp, now):
                return False
            table.observe(self._store.load_leases(), now)
            action = table.decide(tp, now)
            if action is Action.REDIRECT:
                raise not_owner(tp, table.lease(tp))
            wall = time.time()
            proposal = table.renewal(tp, wall) if action is Action.HOLD else None
            proposal = proposal or table.claim(tp, wall)
            stored = self._store.propose_leases([proposal])[0]
            if not table.settle(proposal, stored, now):
                raise not_owner(tp, stored)
        return action is Action.ACQUIRE

    def owner_of(self, tp: TopicPartition, *, refresh: bool = True) -> Lease | None:
        """The partition's lease, None when nobody holds it (never claimed, released).
        ``refresh`` reads the records first; else the view of the last heartbeat is used.

        Raises:
            BackendUnavailableError: the records could not be read.
        """
        with self._lock:
            if refresh:
                self._table.observe(self._store.load_leases(), time.monotonic())
            lease = self._table.lease(tp)
        return None if lease is None or lease.released else lease

    def owners(self, tps: list[TopicPartition]) -> list[Lease | None]:
        """:meth:`owner_of` for every partition of ``tps``, from one read of the records.

        Raises:
            BackendUnavailableError: the records could not be read.
        """
        with self._lock:
            self._table.observe(self._store.load_leases(), time.monotonic())
            leases = [self._table.lease(tp) for tp in tps]
        return [None if lease is None or lease.released else lease for lease in leases]

    def advertise(self, address: str) -> None:
        """Write ``address`` into the leases claimed or renewed from now on."""
        with self._lock:
            self._table.address = address

    def owned(self) -> list[TopicPartition]:
        """The partitions whose lease this broker holds now."""
        now = time.monotonic()
        with self._lock:
            return [tp for tp in self._table.held() if self._table.holds(tp, now)]

    def renew(self) -> None:
        """Read every lease record and renew the leases this broker holds that are due (the
        heartbeat). The backend is read and written outside the lock.

        Raises:
            BackendUnavailableError: the backend failed; leases not renewed in time lapse.
        """
        now = time.monotonic()
        leases = self._store.load_leases()
        with self._lock:
            self._table.observe(leases, now)
            due = self._table.renewals_due(now, time.time())
        if due:
            stored = self._store.propose_leases(due)
            with self._lock:
                for proposal, record in zip(due, stored, strict=True):
                    self._table.settle(proposal, record, now)

    def release_all(self) -> None:
        """Release every lease this broker holds (a clean close: others may claim them at
        once). A failure is ignored: the leases then lapse on their own."""
        with self._lock:
            releases = self._table.releases(time.time())
            if not releases:
                return
            try:
                stored = self._store.propose_leases(releases)
            except ProducerError:
                return
            for proposal, record in zip(releases, stored, strict=True):
                self._table.settle(proposal, record, time.monotonic())


def not_owner(tp: TopicPartition, lease: Lease | None) -> NotOwnerError:
    """The error that sends a client of ``tp`` to the owner ``lease`` names (retry later when
    there is none)."""
    if lease is None:
        return NotOwnerError(f"{tp.topic}[{tp.partition}] has no owner yet; retry", tp.topic, tp.partition)
    where = f" at {lease.address}" if lease.address else ""
    return NotOwnerError(
        f"{tp.topic}[{tp.partition}] is owned by broker {lease.broker_id!r}{where}",
        tp.topic,
        tp.partition,
        lease.address,
        lease.broker_id,
    )
