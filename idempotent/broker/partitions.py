"""One partition inside a broker: its lock, its core, and the backend calls that carry out the
core's recovery and snapshot actions.

:class:`PartitionShell` is the shell of one :class:`~idempotent.core.partition.PartitionCore`
(which decides) in a :class:`~idempotent.broker.broker.Broker`: it is the
:class:`~idempotent.broker.decisions.PartitionEffects` that the one decision loop
(:mod:`idempotent.broker.decisions`) asks for I/O: it rebuilds the checker from the newest
snapshot and a replay of the log when the core asks (:meth:`PartitionShell.ready`), stores
the snapshots the core decides on (:meth:`PartitionShell.write_snapshot`), and waits
for a producer's batches in flight to drain (:meth:`PartitionShell.last_sequence`). The
broker's produce path uses its ``lock``, ``cond`` and ``core`` directly. Every method needs
``lock`` held (an ``RLock``; ``cond`` is on it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from idempotent.backend import PartitionLog
from idempotent.broker import decisions
from idempotent.broker.observer import BrokerObserver, notify
from idempotent.broker.producers import ProducerRecords
from idempotent.core.checker import CheckerConfig, PartitionChecker
from idempotent.core.partition import PartitionCore, WriteSnapshot
from idempotent.core.records import Snapshot
from idempotent.core.registry import ProducerRegistry
from idempotent.core.types import ProducerId, TopicPartition
from idempotent.errors import CorruptDataError, PartitionRecoveringError, ProducerError, RequestTimeoutError


class PartitionShell:
    """A partition's lock, its core and its recovery; see the module docstring.

    Args:
        tp: the partition.
        config: the checker's config.
        log: the broker's backend (its log half).
        observers: the broker's observers now (they change as observers are added).
        producers: the broker's producer records (admission, evictions, noted partitions).
    """

    __slots__ = ("_log", "_observers", "_producers", "cond", "config", "core", "lock", "tp")

    def __init__(
        self,
        tp: TopicPartition,
        config: CheckerConfig,
        log: PartitionLog,
        observers: Callable[[], tuple[BrokerObserver, ...]],
        producers: ProducerRecords,
    ) -> None:
        self.tp = tp
        self.config = config
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.core = PartitionCore(tp, config)
        self._log = log
        self._observers = observers
        self._producers = producers

    def ready(self) -> PartitionChecker:
        """Return the partition's checker, recovering it first if the core asks for it
        (:func:`idempotent.broker.decisions.ready`).

        Raises:
            PartitionRecoveringError: appends are still outstanding, or the snapshot after
                the evictions of the recovery could not be stored.
            BackendUnavailableError: the snapshot or the log could not be read.
        """
        core = self.core
        if core.ready:  # (the produce path's case: no clock read)
            checker = core.checker
            assert checker is not None
            return checker
        return decisions.ready(core, self, time.time())

    def write_snapshot(self, action: WriteSnapshot) -> bool:
        """Carry out a :class:`~idempotent.core.partition.WriteSnapshot` of the core
        (:func:`idempotent.broker.decisions.write_snapshot`); whether it was stored."""
        return decisions.write_snapshot(self.core, self, action)

    # -- the effects the decision loop asks for (decisions.PartitionEffects) -----------------

    @property
    def registry(self) -> ProducerRegistry:
        """The broker's producer registry (read without a lock on the produce path)."""
        return self._producers.registry

    def rebuild(self, now: float) -> tuple[PartitionChecker, int, float]:
        """Rebuild the checker from the newest snapshot and a replay of the log after it (of
        the whole log when the snapshot is corrupt); observers hear of it."""
        started = time.monotonic()
        topic, partition = self.tp
        snapshot = self._log.latest_snapshot(topic, partition)
        try:
            checker, replayed = PartitionChecker.recover(
                snapshot,
                self._log.replay(topic, partition, snapshot.position if snapshot is not None else 0),
                self.config,
                now=now,
            )
        except CorruptDataError:  # a corrupt snapshot: the log alone still has every batch boundary
            replay = self._log.replay(topic, partition, 0)
            checker, replayed = PartitionChecker.recover(None, replay, self.config, now=now)
        seconds = time.monotonic() - started
        notify(self._observers(), "partition_recovered", topic, partition, seconds, replayed)
        return checker, replayed, seconds

    def store_snapshot(self, snapshot: Snapshot) -> bool:
        """Store a snapshot in the backend; whether it was (observers hear of it)."""
        topic, partition = self.tp
        try:
            self._log.write_snapshot(topic, partition, snapshot)
        except ProducerError:
            notify(self._observers(), "snapshot_written", topic, partition, False)
            return False
        notify(self._observers(), "snapshot_written", topic, partition, True)
        return True

    def evicted(self, producer_ids: tuple[ProducerId, ...]) -> None:
        """Flag producers whose eviction is durable in the registry (observers hear of it)."""
        self._producers.mark_evicted(producer_ids)
        notify(self._observers(), "producers_evicted", self.tp.topic, self.tp.partition, len(producer_ids))

    def refresh_producers(self) -> None:
        """Adopt producer records that other brokers stored."""
        self._producers.refresh()

    def note_partition(self, producer_id: int) -> None:
        """Store that a named producer writes here before its first batch here is appended."""
        self._producers.note_partition(producer_id, self.tp)

    def last_sequence(self, producer_id: int, timeout: float, who: str) -> int:
        """The last stored sequence of ``producer_id`` here (-1: none), once its batches in
        flight (of older epochs) have drained. ``who`` names the producer in the error.

        Raises:
            RequestTimeoutError: they did not drain within ``timeout`` seconds.
            PartitionRecoveringError, BackendUnavailableError: as :meth:`ready`.
        """
        self.ready()
        if not self.cond.wait_for(lambda: self.core.drained(producer_id), max(0.0, timeout)):
            raise RequestTimeoutError(f"in-flight batches of {who} on {self.tp} did not drain")
        return self.ready().last_sequence(producer_id)

    def checker(self, *, recover: bool) -> PartitionChecker | None:
        """The checker to report on: with ``recover``, :meth:`ready`'s (or, while a failed
        partition cannot be rebuilt yet, the one it had); else the one in memory, None when
        the partition was never loaded or was dropped.

        Raises:
            PartitionRecoveringError: with ``recover``, a partition never loaded cannot be
                recovered yet.
            BackendUnavailableError: with ``recover``, recovering it failed.
        """
        if not recover:
            return self.core.checker
        try:
            return self.ready()
        except PartitionRecoveringError:
            if self.core.checker is None:
                raise
            return self.core.checker


class PartitionMap:
    """The partitions a broker has opened, created on first use and never removed, and the
    sweeps over all of them (maintenance, close, a new writer's start-over).

    ``parts`` may be read without a lock (a dict read; entries are removed only when their
    topic is deleted); it is changed under the broker's lock, given in. Partition locks are taken one at a time, never
    under the broker's lock.
    """

    def __init__(
        self,
        lock: threading.RLock,
        config: CheckerConfig,
        log: PartitionLog,
        observers: Callable[[], tuple[BrokerObserver, ...]],
        producers: ProducerRecords,
    ) -> None:
        self.parts: dict[TopicPartition, PartitionShell] = {}
        self._lock = lock
        self._config = config
        self._log = log
        self._observers = observers
        self._producers = producers

    def open(self, tp: TopicPartition) -> PartitionShell:
        """The shell of ``tp`` (an existing partition), created on first use."""
        with self._lock:
            part = self.parts.get(tp)
            if part is None:
                part = self.parts[tp] = PartitionShell(tp, self._config, self._log, self._observers, self._producers)
            return part

    def drop_topic(self, topic: str) -> None:
        """Forget the partitions of a deleted topic (created again, its partitions start
        afresh)."""
        with self._lock:
            for tp in [tp for tp in self.parts if tp.topic == topic]:
                del self.parts[tp]

    def loaded(self) -> list[PartitionShell]:
        """Every partition opened so far."""
        with self._lock:
            return list(self.parts.values())

    def maintain(self, now: float, serving: Callable[[PartitionShell], bool]) -> dict[int, float]:
        """Expire idle producers and write due snapshots on every ready partition this broker
        serves (:meth:`PartitionCore.maintain`); returns each producer's latest write seen."""
        activity: dict[int, float] = {}
        for part in self.loaded():
            with part.lock:
                checker = part.core.checker
                if checker is None or not part.core.ready or not serving(part):
                    continue
                action = part.core.maintain(now)
                if action is not None:
                    part.write_snapshot(action)
                for producer_id, seen in checker.activity(now).items():
                    activity[producer_id] = max(activity.get(producer_id, 0.0), seen)
        return activity

    def close(self, now: float, serving: Callable[[PartitionShell], bool], wait: float = 5.0) -> None:
        """Wait up to ``wait`` seconds per partition for its outstanding appends, then write a
        snapshot of every partition served with new entries and nothing in flight."""
        for part in self.loaded():
            with part.lock:
                part.cond.wait_for(lambda p=part: p.core.outstanding == 0, wait)  # type: ignore[misc]
                if serving(part) and (action := part.core.final_snapshot(now)) is not None:
                    part.write_snapshot(action)

    def forget_all(self) -> None:
        """Drop every partition's state: each is rebuilt from the backend at its next use."""
        for part in self.loaded():
            with part.lock:
                part.core.forget()
