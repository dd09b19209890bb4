"""The one loop that carries out a :class:`~idempotent.core.partition.PartitionCore`'s actions.

A partition's core decides and returns actions (``Recover``, ``Reply``, ``RefreshProducers``,
``WriteSnapshot``, ``Accept``, ``Append``, ``Fail``); a shell does the I/O they ask for. The
order in which the actions are met and answered is the same for every shell, so it is
written once, here, and every shell calls it:

* :class:`~idempotent.broker.broker.Broker` (through
  :class:`~idempotent.broker.partitions.PartitionShell` and
  :class:`~idempotent.broker.appends.AppendCompletions`) over a
  :class:`~idempotent.backend.LogBackend`;
* :class:`~idempotent.broker.direct.DirectBroker`, a producer's own broker (one
  producer-scoped core per partition), over a :class:`~idempotent.backend.ProducerLog`;
* :class:`~idempotent.testing.simulated_broker.SimulatedBroker` over its lists, so that a
  seeded simulation runs the loop that ships.

What differs between shells is only the I/O, which a shell gives as :class:`PartitionEffects`:
the producers' admission (the registry, or a producer's own), rebuild a checker from the
storage, store a snapshot, flag evicted producers, reload the producer records, note a
partition in a producer's record. Handing a batch to the storage stays with the shell (what
it needs differs: records, futures, a simulated delay, one transaction per group):
:func:`offer` returns the core's :class:`~idempotent.core.partition.Append`, and the shell
reports its outcome to :func:`completed`: an offset, an error, or
:class:`~idempotent.core.partition.NotStored` when it knows nothing was stored.

Hot path: :func:`offer` and :func:`completed` run once per batch and build nothing the core
does not (the core's actions are the values passed through); no object per record.
Every function needs the partition's lock held (the shell's; a DirectBroker's checker lock).
"""

from __future__ import annotations

from typing import Protocol

from idempotent.core.checker import PartitionChecker, Policy
from idempotent.core.outcomes import ProduceResult
from idempotent.core.partition import (
    Append,
    Fail,
    NotStored,
    PartitionCore,
    RefreshProducers,
    Reply,
    WriteSnapshot,
)
from idempotent.core.records import BatchHeader, Snapshot
from idempotent.core.registry import Admission, Admissions
from idempotent.core.types import ProducerId
from idempotent.errors import PartitionRecoveringError

__all__ = ["MAX_OFFERS", "PartitionEffects", "completed", "offer", "ready", "write_snapshot"]

#: decisions one produce request may go through (admission refresh, evictions) before the
#: partition is reported recovering: bounds the retries while snapshots cannot be stored
MAX_OFFERS = 4


class PartitionEffects(Protocol):
    """The I/O of one partition's shell, as the loop asks for it (under the partition lock)."""

    @property
    def registry(self) -> Admissions:
        """The admission of the partition's batches (read at each offer): the producer
        registry, or a producer's own broker's :class:`~idempotent.core.registry.OwnProducer`."""
        ...

    def rebuild(self, now: float) -> tuple[PartitionChecker, int, float]:
        """Carry out :class:`~idempotent.core.partition.Recover`: build the checker from the
        newest snapshot and the log written after it.

        Returns:
            The checker, the batches replayed, the seconds it took.

        Raises:
            BackendUnavailableError: the storage could not be read; nothing changed.
        """
        ...

    def store_snapshot(self, snapshot: Snapshot) -> bool:
        """Store a snapshot of the partition; whether it was stored (a failure is an answer,
        not an exception)."""
        ...

    def evicted(self, producer_ids: tuple[ProducerId, ...]) -> None:
        """Flag producers whose eviction a stored snapshot made durable (their state is lost)."""
        ...

    def refresh_producers(self) -> None:
        """Carry out :class:`~idempotent.core.partition.RefreshProducers`: reload the producer
        records (another broker may have initialised the producer)."""
        ...

    def note_partition(self, producer_id: int) -> None:
        """Carry out ``Accept(first_write=True)``: store that the producer writes to this
        partition before its first batch here is appended."""
        ...


def write_snapshot(core: PartitionCore, effects: PartitionEffects, action: WriteSnapshot) -> bool:
    """Carry out a :class:`~idempotent.core.partition.WriteSnapshot`; whether it was stored.

    Evicted producers are flagged only once the snapshot is stored; if it cannot be, the core
    drops the checker, to be rebuilt from the log, which brings them back: an eviction is
    never half done.
    """
    if not effects.store_snapshot(action.snapshot):
        core.snapshot_written(action, False)
        return False
    evicted = core.snapshot_written(action, True)
    if evicted:
        effects.evicted(evicted)
    return True


def ready(core: PartitionCore, effects: PartitionEffects, now: float) -> PartitionChecker:
    """The partition's checker, rebuilt first when the core asks (``Recover``), with the
    snapshot of the recovery's evictions written.

    Raises:
        PartitionRecoveringError: appends are still outstanding, or the snapshot after the
            evictions of the recovery could not be stored.
        BackendUnavailableError: the snapshot or the log could not be read.
    """
    if core.ensure_ready() is None:
        checker = core.checker
        assert checker is not None
        return checker
    checker, replayed, seconds = effects.rebuild(now)
    swept = core.recovered(checker, replayed, seconds, now)
    if swept is not None and not write_snapshot(core, effects, swept):
        raise PartitionRecoveringError(f"{core.tp}: could not store the snapshot after evictions; retry")
    return checker


def offer(
    core: PartitionCore,
    effects: PartitionEffects,
    header: BatchHeader,
    now: float,
    *,
    policy: Policy,
    enabled: bool,
    refreshable: bool,
) -> ProduceResult | Append:
    """Decide on a batch and carry out the decisions up to its append (call :func:`ready`
    first): admission by ``effects.registry``, ``RefreshProducers`` (at most once), the snapshot of
    evictions on a first write, ``Accept`` (the partition noted on a first write) and
    :meth:`PartitionCore.append`.

    Returns:
        The answer when nothing is written (``Reply``), else the core's ``Append``: hand the
        batch to the storage, then report its outcome to :func:`completed`.

    Raises:
        PartitionRecoveringError: the checker is not ready, or ``MAX_OFFERS`` decisions went
            by (snapshots after evictions could not be stored); nothing was appended.
        InvalidBatchError: the header does not fit the policy; nothing changed.
        BackendUnavailableError: (from the effects) the producer records could not be read
            or stored; nothing was appended.
    """
    producer_id = header.producer_id
    for _ in range(MAX_OFFERS):
        registry = effects.registry  # (a refresh may replace it)
        admission = registry.admit(producer_id, header.producer_epoch)
        record = registry.lookup(producer_id) if admission is Admission.FENCED else None
        decision = core.offer(
            header,
            now,
            admission=admission,
            registered_epoch=record.producer_epoch if record is not None else None,
            policy=policy,
            enabled=enabled,
            refreshable=refreshable,
        )
        if isinstance(decision, Reply):
            return decision.result
        if isinstance(decision, RefreshProducers):
            effects.refresh_producers()
            refreshable = False
        elif isinstance(decision, WriteSnapshot):  # evictions, made durable first
            write_snapshot(core, effects, decision)
            ready(core, effects, now)
        else:
            if decision.first_write:
                effects.note_partition(producer_id)
            return core.append(header, now)
    raise PartitionRecoveringError(f"{core.tp}: could not store the snapshot after evictions; retry")


def completed(
    core: PartitionCore,
    effects: PartitionEffects,
    append: Append,
    outcome: int | BaseException | NotStored,
    now: float,
) -> Reply | Fail:
    """Report an append's outcome (its base offset, the error it failed with, or
    :class:`~idempotent.core.partition.NotStored`) to the core, once per append, in the order
    the storage completes the appends, and write the snapshot that became overdue, if any.

    Returns:
        The request's answer: ``Reply`` (ACCEPTED at the offset) or ``Fail``.
    """
    actions = core.completed(append, outcome, now)
    for action in actions[1:]:  # an overdue snapshot
        assert isinstance(action, WriteSnapshot)
        write_snapshot(core, effects, action)
    answer = actions[0]
    assert not isinstance(answer, WriteSnapshot)
    return answer
