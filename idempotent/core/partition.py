"""The decisions of one partition, as a sans-I/O state machine the broker's shell drives.

Theory of operation
-------------------
A :class:`PartitionCore` holds one partition's :class:`~idempotent.core.checker.PartitionChecker`
and the bookkeeping around it: how many appends are in flight, whether one of them failed
(the partition must then be rebuilt from its log), and the numbers ``stats`` reports. It
decides; the shell takes the partition's lock, does the I/O the core asks for and reports
back, through the one loop that carries out these actions for every shell
(``idempotent/broker/decisions.py``, called by ``Broker``, ``DirectBroker`` and the
simulator). No threads, locks, clock or I/O here: every method that needs the time takes
``now`` (wall-clock seconds, as stored with batches and snapshots).

The shell's side of one produce request, under the partition's lock::

    ensure_ready()            -> Recover?  (load snapshot + replay the log, then recovered())
    offer(header, ..., now)   -> Reply            answer now (duplicate, gap, fenced, unknown)
                              |  RefreshProducers reload the registry, offer again
                              |  WriteSnapshot    evictions to make durable first, then offer again
                              |  Accept           note the partition (first write), then:
    append(header, now)       -> Append           store the batch (with the snapshot, if any)
    ... later, in append order ...
    completed(append, base_offset | error | NotStored, now)
                              -> [Reply | Fail, WriteSnapshot?]

Decisions made here:

* **Admission.** An unknown producer gets UNKNOWN_PRODUCER, unless the registry may be stale
  (several brokers share the backend) and has not been reloaded for this request: then
  :class:`RefreshProducers`. A fenced one gets FENCED with the registered epoch. The others
  go to the checker.
* **Eviction on first write.** A producer new to the partition when ``max_producers`` are
  tracked makes room by evicting the least recently active idle producers: a margin of them
  (``CheckerConfig.eviction_margin``, 2 % of ``max_producers`` by default), so that the
  next new producers find room without evicting again. An eviction is durable only with a
  snapshot written after it (of the whole partition), so the core takes one and returns
  :class:`WriteSnapshot` with the evicted ids; one snapshot thus serves a margin of new
  producers, not each one. If it cannot be written, the checker is dropped and rebuilt from
  the log, which brings the evicted producers back (an eviction is never half done).
* **Snapshots.** A due snapshot (``snapshot_due``: batch count, record count or age) rides
  with the next append that finds nothing else in flight (:attr:`Append.snapshot`). Under a
  load that never leaves a quiet moment, a snapshot is written on its own once it is
  overdue (``snapshot_overdue``), after a commit. :meth:`maintain` expires idle producers
  and writes a due snapshot when the partition is idle; :meth:`final_snapshot` is the one
  ``close`` writes.
* **Completions.** A commit is applied in append order by the checker. A batch the backend
  refused for certain (:class:`~idempotent.errors.InvalidBatchError`) fails alone. Any other
  failure means its outcome is unknown: every batch in flight is discarded, the partition is
  marked failed, requests get :class:`~idempotent.errors.PartitionRecoveringError` until the
  outstanding appends have drained, and then it is rebuilt from the log (:class:`Recover`).
  Appends completing after a failure no longer change the state (their tickets are stale),
  whatever the backend answers them. An outcome the shell knows for certain to be "nothing
  stored" (:class:`NotStored`: a producer's own log whose write failed or whose transaction
  aborted) forgets the partition's pending batches and leaves the stored state in force: no
  rebuild.
* **Producer scope.** A producer's own broker
  (:class:`~idempotent.broker.direct.DirectBroker`) holds a core per partition for its one
  producer (``producer_scoped=True``). It stores the producer's state with each of its writes
  (:meth:`state_after`), so the core schedules no snapshot, and it never expires or evicts
  the producer's state (no sweep, no eviction on a first write): that state is the only one
  it tracks. The shell asks for the state it stores (:meth:`stored_state`,
  :meth:`state_after`) and rewinds an aborted transaction by installing a new core.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

import attrs

from idempotent.core.checker import CheckerConfig, PartitionChecker, Policy, Ticket
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.records import BatchHeader, Snapshot, StoredBatch
from idempotent.core.registry import Admission
from idempotent.core.types import ProducerId, TopicPartition
from idempotent.errors import InvalidBatchError, PartitionRecoveringError

__all__ = [
    "Accept",
    "Append",
    "Fail",
    "NotStored",
    "PartitionCore",
    "Recover",
    "RefreshProducers",
    "Reply",
    "WriteSnapshot",
]


# -- actions: what the core asks the shell to do ------------------------------------------------


@final
@attrs.frozen
class Reply:
    """Answer the request with ``result``; nothing is written."""

    result: ProduceResult


@final
@attrs.frozen
class Fail:
    """Fail the request with ``error`` (the append's own error)."""

    error: BaseException


@final
@attrs.frozen
class Recover:
    """Rebuild the checker from the newest snapshot and the log, then call
    :meth:`PartitionCore.recovered`."""


@final
@attrs.frozen
class RefreshProducers:
    """The producer is unknown here but may have been initialised through another broker:
    reload the producer records, then offer the request again with the new admission."""


@final
@attrs.frozen
class WriteSnapshot:
    """Store ``snapshot``, then call :meth:`PartitionCore.snapshot_written`.

    ``evicted`` are the producers evicted just before it was taken: once it is stored their
    state is lost for good (the shell flags them in the registry).
    """

    snapshot: Snapshot
    evicted: tuple[ProducerId, ...] = ()


@final
@attrs.frozen
class Accept:
    """The checker accepts the batch. ``first_write``: the producer has no state on the
    partition yet, so the shell notes the partition in the producer's record before the
    append (``init_producer`` finds every partition holding its sequences); then it calls
    :meth:`PartitionCore.append`."""

    first_write: bool


@final
@attrs.frozen
class Append:
    """Store the batch after everything appended before it, with ``snapshot`` when not
    None, then report its outcome with :meth:`PartitionCore.completed` (this value is the
    append's ticket). ``push`` is the checker's ticket."""

    push: Ticket
    snapshot: Snapshot | None

    @property
    def with_snapshot(self) -> bool:
        """Whether a snapshot rides along with the batch."""
        return self.snapshot is not None


@final
@attrs.frozen
class NotStored:
    """An append's outcome, known for certain: the backend stored nothing of it (a producer's
    own log whose write failed before anything was stored, or whose transaction aborted).
    Every batch still pending on the partition is forgotten with it (the shell reports this
    only when the storage kept nothing after it either), and the stored state stays in force:
    the partition needs no rebuild. ``error`` is what the request fails with."""

    error: BaseException


Offered = Reply | RefreshProducers | WriteSnapshot | Accept
Completed = Reply | Fail | WriteSnapshot

#: the two answers of an accepted offer (values, built once: offer runs once per batch)
_FIRST_WRITE = Accept(first_write=True)
_NEXT_WRITE = Accept(first_write=False)


class PartitionCore:
    """One partition's checker and the decisions around it (see the module docstring).

    Args:
        tp: the partition.
        config: the checker's config.
        producer_scoped: the core of a producer's own broker (see "Producer scope" in the
            module docstring): no snapshot scheduled, no expiry, no eviction.

    Not thread-safe: the shell calls it under the partition's lock.
    """

    def __init__(self, tp: TopicPartition, config: CheckerConfig, *, producer_scoped: bool = False) -> None:
        self.tp = tp
        self.config = config
        #: a producer's own broker's core: it stores the state itself, and never sweeps
        self.producer_scoped = producer_scoped
        #: the checker, or None until recovered (and after it was dropped)
        self.checker: PartitionChecker | None = None
        #: an append failed: the state is rebuilt once ``outstanding`` drops to 0
        self.failed = False
        #: appends handed to the shell and not completed yet
        self.outstanding = 0
        #: the last recovery's duration and replayed batch count (for ``stats``)
        self.recovery_seconds = 0.0
        self.replayed = 0

    # -- readiness --------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether the checker may decide now (recovered and not failed)."""
        return self.checker is not None and not self.failed

    def ensure_ready(self) -> Recover | None:
        """None when the checker is ready, else :class:`Recover`.

        Raises:
            PartitionRecoveringError: it must be rebuilt but appends are still outstanding;
                nothing changed, retry shortly.
        """
        if self.ready:
            return None
        if self.outstanding:
            raise PartitionRecoveringError(f"{self.tp} is recovering: {self.outstanding} appends still outstanding")
        return Recover()

    def recovered(self, checker: PartitionChecker, replayed: int, seconds: float, now: float) -> WriteSnapshot | None:
        """Install the checker the shell rebuilt, and sweep it (:meth:`maintain`'s expiry
        and capacity rule; not for a producer-scoped core). Returns the eviction snapshot to
        write, if any."""
        self.checker, self.failed = checker, False
        self.recovery_seconds, self.replayed = seconds, replayed
        return None if self.producer_scoped else self._sweep(checker, now)

    def forget(self) -> None:
        """Drop the checker: what this broker knew may be stale (it just became the writer or
        the lease holder); it is rebuilt at its next use."""
        self.checker = None

    def _ready_checker(self) -> PartitionChecker:
        checker = self.checker
        if checker is None or self.failed:
            raise PartitionRecoveringError(f"{self.tp} is not recovered yet")
        return checker

    # -- produce ----------------------------------------------------------------------------

    def offer(
        self,
        header: BatchHeader,
        now: float,
        *,
        admission: Admission,
        registered_epoch: int | None = None,
        policy: Policy = Policy.STRICT,
        enabled: bool = True,
        refreshable: bool = False,
    ) -> Offered:
        """Decide on a batch (call :meth:`ensure_ready` first).

        Args:
            header: the batch, validated (``ProduceRequest``).
            admission: what the producer registry says of its producer id and epoch .
            registered_epoch: the registered epoch of the producer (told with FENCED).
            policy, enabled: the topic's sequence policy and deduplication switch.
            refreshable: the registry may be stale and was not reloaded for this request.

        Returns:
            :class:`Reply`, :class:`RefreshProducers`, :class:`WriteSnapshot` (evictions
            first; then offer again) or :class:`Accept` (then :meth:`append`).

        Raises:
            PartitionRecoveringError: the checker is not ready; nothing changed.
            InvalidBatchError: the header does not fit the policy; nothing changed.
        """
        checker = self._ready_checker()
        if admission is Admission.UNKNOWN:
            return RefreshProducers() if refreshable else Reply(ProduceResult(Outcome.UNKNOWN_PRODUCER))
        if admission is Admission.FENCED:
            return Reply(ProduceResult(Outcome.FENCED, producer_epoch=registered_epoch))
        result = checker.check(header, admitted=admission is Admission.ADMITTED, policy=policy, enabled=enabled)
        if result.outcome is not Outcome.ACCEPTED:
            return Reply(result)
        if checker.tracks(header.producer_id):
            return _NEXT_WRITE
        if checker.producer_count >= self.config.max_producers and not self.producer_scoped:
            # room for a margin of new producers at once: one snapshot covers all of them
            evicted = checker.evict_over_capacity(room_for=self.config.room_made)
            if evicted:
                return WriteSnapshot(checker.snapshot(now), tuple(evicted))
        return _FIRST_WRITE

    def append(self, header: BatchHeader, now: float) -> Append:
        """Start the append of a batch :meth:`offer` accepted: the checker records it as
        pushed, and a due snapshot rides along when nothing else is in flight (never for a
        producer-scoped core).

        Raises:
            PartitionRecoveringError: the checker is not ready; nothing changed.
        """
        checker = self._ready_checker()
        snapshot = (
            checker.snapshot(now)
            if checker.pending == 0 and not self.producer_scoped and checker.snapshot_due(now)
            else None
        )
        append = Append(checker.push(header, now), snapshot)
        self.outstanding += 1
        return append

    def completed(self, append: Append, outcome: int | BaseException | NotStored, now: float) -> list[Completed]:
        """Take an append's outcome: its base offset, the error it failed with (its outcome
        unknown, unless it is an InvalidBatchError), or :class:`NotStored`. Call it once for
        every :class:`Append`, in the order the backend completes them.

        Returns:
            :class:`Reply` (ACCEPTED at the offset) or :class:`Fail` for the request, then a
            :class:`WriteSnapshot` when one is overdue (never for a producer-scoped core).
        """
        self.outstanding -= 1
        checker = self.checker
        if isinstance(outcome, NotStored):
            # nothing stored of it nor after it, for certain: every pending batch is
            # forgotten (their tickets become stale), the stored state stays
            if checker is not None:
                checker.discard_pending()
            return [Fail(outcome.error)]
        if isinstance(outcome, BaseException):
            if isinstance(outcome, InvalidBatchError):
                # the backend refused it and stored nothing, for certain (EntryTooLargeError):
                # the batch fails alone; the partition needs no rebuild
                if checker is not None:
                    checker.drop(append.push)
            else:
                if checker is not None and checker.generation == append.push.generation:
                    checker.discard_pending()
                self.failed = True
            return [Fail(outcome)]
        actions: list[Completed] = [Reply(ProduceResult(Outcome.ACCEPTED, base_offset=outcome))]
        if checker is not None:
            checker.commit(append.push, outcome)
            if not self.producer_scoped and checker.snapshot_overdue():
                actions.append(WriteSnapshot(checker.snapshot(now)))
        return actions

    def drained(self, producer_id: int) -> bool:
        """Whether nothing of ``producer_id`` is in flight (or the partition failed and
        nothing at all is): what ``init_producer`` waits for before reading its sequences."""
        if self.failed and self.outstanding == 0:
            return True
        checker = self.checker
        return checker is None or checker.pending_batches(producer_id) == 0

    # -- the state a producer-scoped shell stores -----------------------------------------------

    def stored_state(self, now: float) -> Snapshot:
        """A snapshot of the stored state (the batches pending are not in it): what a
        producer's own broker keeps to rewind an aborted transaction, or stores with a
        transaction's commit.

        Raises:
            PartitionRecoveringError: the checker is not ready; nothing changed.
        """
        return self._ready_checker().snapshot(now)

    def state_after(self, batches: Iterable[StoredBatch], now: float) -> Snapshot:
        """A snapshot of the stored state with ``batches`` applied after it, in order, as a
        replay of the log would apply them: the state to store with the write of those
        batches. The core's own state is not changed (the batches stay pending until their
        completion).

        Raises:
            PartitionRecoveringError: the checker is not ready; nothing changed.
            CorruptDataError: a batch is not one a producer can send (see
                :meth:`PartitionChecker.apply`); nothing changed.
        """
        after = PartitionChecker.restore(self.stored_state(now), self.config, now=now)
        for batch in batches:
            after.apply(batch)
        return after.snapshot(now)

    # -- snapshots and maintenance ------------------------------------------------------------

    def snapshot_written(self, action: WriteSnapshot, ok: bool) -> tuple[ProducerId, ...]:
        """Take the outcome of a :class:`WriteSnapshot`.

        Returns:
            The producers whose eviction is now durable (flag them in the registry); empty
            when the write failed: then a snapshot is due again at the next chance, and
            after evictions the checker is dropped, to be rebuilt from the log.
        """
        checker = self.checker
        if ok:
            return action.evicted
        if checker is not None:
            checker.entries_since_snapshot = max(checker.entries_since_snapshot, 1)
        if action.evicted:
            self.checker = None
        return ()

    def maintain(self, now: float) -> WriteSnapshot | None:
        """The periodic step of a ready partition: expire idle producers, enforce
        ``max_producers``, and write a due snapshot (with the evictions, if any). Nothing for
        a producer-scoped core."""
        checker = self.checker
        if checker is None or self.failed or self.producer_scoped:
            return None
        swept = self._sweep(checker, now)
        if swept is not None:
            return swept
        return WriteSnapshot(checker.snapshot(now)) if checker.snapshot_due(now) else None

    def final_snapshot(self, now: float) -> WriteSnapshot | None:
        """The snapshot ``close`` writes: when the partition is ready, idle, and has
        entries since its last snapshot (never for a producer-scoped core)."""
        checker = self.checker
        if checker is None or self.failed or self.producer_scoped:
            return None
        if checker.pending or not checker.entries_since_snapshot:
            return None
        return WriteSnapshot(checker.snapshot(now))

    def _sweep(self, checker: PartitionChecker, now: float) -> WriteSnapshot | None:
        evicted = checker.expire(now) + checker.evict_over_capacity()
        return WriteSnapshot(checker.snapshot(now), tuple(evicted)) if evicted else None
