"""The broker of the deterministic link: the real core over lists, with crashes and storage faults.

:class:`SimulatedBroker` composes exactly what :class:`idempotent.broker.broker.Broker` composes, a
:class:`~idempotent.core.registry.ProducerRegistry` for admission and one
:class:`~idempotent.core.partition.PartitionCore` per partition, and carries out the core's actions
(``Recover``, ``WriteSnapshot``, ``Accept``, ``Append``, ``Reply``, ``Fail``) on the lists of a
:class:`SimulatedStorage` through the same loop as ``Broker``
(:mod:`idempotent.broker.decisions`: only the I/O it asks for is the simulator's, one
``PartitionEffects`` per partition), as ``Broker`` carries them out on a
:class:`~idempotent.backend.LogBackend`. It decides nothing itself: admission, sequence checks,
eviction, policies, the deduplication switch and snapshots are the core's, so a simulation
through it tests the code that ships (as h11's ``ConnectionPair`` joins two real connections).

:class:`SimulatedStorage` is the durable part: per partition the log (one :class:`LogEntry`
per record), the batch boundaries (replayed by a recovery), every snapshot written; the
producer records, the next free producer id and the topic settings. :meth:`SimulatedBroker.crash`
loses everything else: the registry, the cores and the appends under way, of which a prefix per
partition lands in the log unanswered and the rest is lost (a log is written in order). A new
:class:`SimulatedBroker` over the same storage then rebuilds each partition from its newest
snapshot and the log written after it, at the partition's first use, as a restarted broker does.

:class:`StorageFaults` makes the storage fail: an append fails with its outcome unknown (stored or
not; every later append of the partition fails with it, the ordering contract of
``LogBackend.append``), or a snapshot write fails (nothing stored).

Time is the caller's simulated time (``now``); the broker reads no clock and draws its faults
from the caller's seeded :class:`random.Random`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs

from idempotent.broker import decisions
from idempotent.core.checker import CheckerConfig, PartitionChecker, Policy
from idempotent.core.outcomes import ProduceResult
from idempotent.core.partition import Append, Fail, PartitionCore, Reply
from idempotent.core.records import BatchHeader, Snapshot, StoredBatch
from idempotent.core.registry import ProducerRecord, ProducerRegistry, merge_record
from idempotent.core.sequence import sequence_at
from idempotent.core.types import Epoch, ProducerId, TopicPartition
from idempotent.core.types import Sequence as SequenceNumber

from ..errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidBatchError,
    PartitionRecoveringError,
    ProducerError,
)

__all__ = [
    "BrokerStats",
    "LogEntry",
    "SimulatedBroker",
    "SimulatedStorage",
    "StorageFaults",
]

_Token = TypeVar("_Token")


@attrs.frozen
class LogEntry:
    """One record in a partition's log; ``value`` identifies the record the test sent."""

    offset: int
    producer_id: int
    producer_epoch: int
    sequence: int
    value: bytes | None
    preloaded: bool = False


def validate_probability(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    """An attrs validator: ``value`` is a probability."""
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{attribute.name} must be a probability in 0..1, got {value}")


@attrs.frozen
class StorageFaults:
    """How often the simulated storage fails.

    Attributes:
        append_error: an append fails; the broker cannot tell whether it was stored. Every
            later append of the partition still under way fails with it, unstored.
        stored_on_error: the share of failed appends that were stored all the same.
        snapshot_error: a snapshot write (eviction, overdue, maintenance) fails; nothing is
            stored. A snapshot riding with an append shares the append's fate.
    """

    append_error: float = attrs.field(default=0.0, validator=validate_probability)
    stored_on_error: float = attrs.field(default=0.5, validator=validate_probability)
    snapshot_error: float = attrs.field(default=0.0, validator=validate_probability)


@attrs.define
class BrokerStats:
    """What the simulated broker did, over all its lives."""

    #: partitions rebuilt from a snapshot and the log (first use, after a failure or a crash)
    recoveries: int = 0
    #: batches replayed by those recoveries
    replayed: int = 0
    #: recoveries that started from a snapshot
    from_snapshot: int = 0
    snapshots: int = 0
    snapshot_errors: int = 0
    append_errors: int = 0
    #: producers whose eviction became durable (capacity or expiry)
    evicted: int = 0
    #: requests answered PartitionRecoveringError
    recovering: int = 0
    crashes: int = 0
    #: appends under way at a crash that landed in the log unanswered
    landed: int = 0
    #: appends under way at a crash that were lost
    lost: int = 0


class SimulatedStorage:
    """The durable state of a simulated broker: what survives :meth:`SimulatedBroker.crash`.

    Args:
        first_producer_id: the first producer id handed out.
        policy, deduplication: the broker-wide defaults of the topic settings.
    """

    def __init__(
        self, *, first_producer_id: int = 1000, policy: Policy = Policy.STRICT, deduplication: bool = True
    ) -> None:
        self.logs: dict[TopicPartition, list[LogEntry]] = {}
        self.batches: dict[TopicPartition, list[StoredBatch]] = {}
        #: every snapshot stored per partition, in the order stored, each with its turn: when it
        #: was handed over (see :meth:`hand_over`)
        self.snapshots: dict[TopicPartition, list[tuple[int, Snapshot]]] = {}
        self._turns = 0
        self.producers: dict[int, ProducerRecord] = {}
        self.next_producer_id = first_producer_id
        self.policy = policy
        self.deduplication = deduplication
        #: per-topic overrides of ``policy`` and ``deduplication``
        self.topic_policies: dict[str, Policy] = {}
        self.topic_deduplication: dict[str, bool] = {}

    def log(self, tp: TopicPartition) -> list[LogEntry]:
        """The log of a partition (empty if never written)."""
        return self.logs.setdefault(tp, [])

    def append(
        self,
        tp: TopicPartition,
        header: BatchHeader,
        values: Sequence[bytes | None],
        timestamp: float,
        snapshot: Snapshot | None = None,
        *,
        preloaded: bool = False,
        turn: int | None = None,
    ) -> int:
        """Store a batch (and the snapshot riding with it, handed over at ``turn``: now when
        None) at the end of the log; return its base offset."""
        log = self.log(tp)
        base = len(log)
        if snapshot is not None:
            self.write_snapshot(tp, snapshot, turn)
        for i, value in enumerate(values):
            sequence = sequence_at(header.base_sequence, i)
            log.append(LogEntry(base + i, header.producer_id, header.producer_epoch, sequence, value, preloaded))
        self.batches.setdefault(tp, []).append(
            StoredBatch(base, header.producer_id, header.producer_epoch, header.base_sequence, len(values), timestamp)
        )
        return base

    def replay(self, tp: TopicPartition, from_offset: int) -> list[StoredBatch]:
        """Batch boundaries of every batch at or after ``from_offset``."""
        return [b for b in self.batches.get(tp, ()) if b.base_offset >= from_offset]

    def hand_over(self) -> int:
        """The turn of a snapshot handed over now (one riding with an append is handed over
        when the append is, and may be stored much later)."""
        self._turns += 1
        return self._turns

    def write_snapshot(self, tp: TopicPartition, snapshot: Snapshot, turn: int | None = None) -> None:
        """Store a snapshot of a partition, handed over at ``turn`` (now when None)."""
        self.snapshots.setdefault(tp, []).append((self.hand_over() if turn is None else turn, snapshot))

    def latest_snapshot(self, tp: TopicPartition) -> Snapshot | None:
        """The snapshot a recovery starts from: of those at the highest position, the one
        handed over last, whenever it was stored (the snapshot-order rule of
        ``LogBackend.write_snapshot``)."""
        stored = self.snapshots.get(tp)
        if not stored:
            return None
        return max(stored, key=lambda item: (item[1].position, item[0]))[1]

    def allocate_producer_ids(self, count: int) -> int:
        """Reserve ``count`` producer ids; return the first."""
        start = self.next_producer_id
        self.next_producer_id += count
        return start

    def save_producer(self, record: ProducerRecord) -> None:
        """Store a producer record, folded with the stored one as the backends fold them."""
        self.producers[record.producer_id] = merge_record(self.producers.get(record.producer_id), record)

    def delete_producers(self, producer_ids: Iterable[int]) -> None:
        """Delete producer records."""
        for producer_id in producer_ids:
            self.producers.pop(producer_id, None)

    def policy_for(self, topic: str) -> Policy:
        """The sequence policy in force on ``topic``."""
        return self.topic_policies.get(topic, self.policy)

    def deduplication_for(self, topic: str) -> bool:
        """Whether deduplication is on for ``topic``."""
        return self.topic_deduplication.get(topic, self.deduplication)


@attrs.define(eq=False)
class _Write(Generic[_Token]):
    """An append under way: the core's ticket and what the storage needs to carry it out."""

    token: _Token
    header: BatchHeader
    values: tuple[bytes | None, ...]
    timestamp: float
    append: Append
    ready_at: float
    #: when the snapshot riding with it was handed over (SimulatedStorage.hand_over)
    turn: int


class SimulatedBroker(Generic[_Token]):
    """A broker's shell over a :class:`SimulatedStorage` (see the module docstring).

    Appends complete in order per partition, each at its ``ready_at``; the caller asks for the
    due ones with :meth:`complete_writes`. ``_Token`` is whatever the caller uses to match an
    answer to its request.

    Args:
        storage: the durable state (a fresh one when None); pass the storage of a crashed
            broker to restart it.
        checker_config: bounds and snapshot cadence of every partition.
        faults: how often the storage fails.
        rng: draws the storage faults and what a crash keeps (needed when faults are set or
            the broker may crash).
        stats: counters to add to (shared by the lives of one storage).
        id_block_size: producer ids reserved from the storage at a time.
    """

    def __init__(
        self,
        storage: SimulatedStorage | None = None,
        checker_config: CheckerConfig | None = None,
        *,
        faults: StorageFaults | None = None,
        rng: random.Random | None = None,
        stats: BrokerStats | None = None,
        id_block_size: int = 1000,
    ) -> None:
        self.storage = storage if storage is not None else SimulatedStorage()
        self.config = checker_config if checker_config is not None else CheckerConfig()
        self.faults = faults if faults is not None else StorageFaults()
        self.rng = rng if rng is not None else random.Random(0)
        self.stats = stats if stats is not None else BrokerStats()
        self.id_block_size = id_block_size
        self.registry = ProducerRegistry(list(self.storage.producers.values()))
        self.cores: dict[TopicPartition, PartitionCore] = {}
        #: the I/O of each partition's decisions, on the storage (decisions.PartitionEffects)
        self._effects: dict[TopicPartition, _SimulatedPartition] = {}
        self._writes: dict[TopicPartition, deque[_Write[_Token]]] = {}

    def core(self, tp: TopicPartition) -> PartitionCore:
        """The core of a partition (created on first use, not yet recovered)."""
        core = self.cores.get(tp)
        if core is None:
            core = self.cores[tp] = PartitionCore(tp, self.config)
            self._effects[tp] = _SimulatedPartition(self, tp)
        return core

    def _fails(self, probability: float) -> bool:
        return probability > 0.0 and self.rng.random() < probability

    # -- producers ---------------------------------------------------------------------------

    def init_producer(
        self, producer_name: str | None, now: float, *, read_sequences: bool = True
    ) -> tuple[ProducerRecord, dict[TopicPartition, int]]:
        """Allocate a producer id or re-initialise (and so fence) a named producer, as
        ``Broker.init_producer`` does.

        Returns:
            The stored record, and (``read_sequences``) the producer's last stored sequence
            on every partition its previous instances noted.

        Raises:
            PartitionRecoveringError: a noted partition has appends of the producer under way
                (the simulation cannot wait for them), or cannot be recovered now.
        """
        registry = self.registry
        previous = registry.by_name(producer_name) if producer_name is not None else None
        if registry.will_need_id(producer_name) and registry.needs_id_block():
            registry.add_id_block(self.storage.allocate_producer_ids(self.id_block_size), self.id_block_size)
        record = registry.init(producer_name, None, now)
        self.storage.save_producer(record)
        last: dict[TopicPartition, int] = {}
        if read_sequences and previous is not None and previous.producer_id == record.producer_id:
            for topic, partition in previous.partitions:
                tp = TopicPartition(topic, partition)
                checker = self._ready(tp, now)
                if not self.core(tp).drained(record.producer_id):
                    raise PartitionRecoveringError(f"{tp}: appends of producer {record.producer_id} under way")
                sequence = checker.last_sequence(record.producer_id)
                if sequence >= 0:
                    last[tp] = sequence
        return record, last

    def preload(
        self, producer_name: str, producer_epoch: int, last_sequences: Mapping[TopicPartition, int], now: float
    ) -> None:
        """Store what an earlier life of the broker left of a named producer: its record at
        ``producer_epoch`` (noting the partitions) and one record per partition at the given
        sequence, written by that epoch. Call it before the partitions are used."""
        tps = sorted(TopicPartition(*tp) for tp in last_sequences)
        if any(tp in self.cores for tp in tps):
            raise ConfigError("preload a partition before it is used")
        record, _ = self.init_producer(producer_name, now, read_sequences=False)
        record = attrs.evolve(
            record, producer_epoch=Epoch(producer_epoch), partitions=tuple((tp.topic, tp.partition) for tp in tps)
        )
        self.registry.merge([record])
        self.storage.save_producer(record)
        for tp in tps:
            header = BatchHeader(record.producer_id, record.producer_epoch, SequenceNumber(last_sequences[tp]), 1)
            self.storage.append(tp, header, [None], now, preloaded=True)

    def forget(self, producer_id: int) -> None:
        """Delete a producer's record, as the retention sweep does: its requests get
        UNKNOWN_PRODUCER from then on."""
        self.storage.delete_producers([producer_id])
        self.registry.drop([producer_id])

    # -- produce -----------------------------------------------------------------------------

    def receive(
        self,
        token: _Token,
        tp: TopicPartition,
        header: BatchHeader,
        values: Sequence[bytes | None],
        now: float,
        ready_at: float,
    ) -> ProduceResult | ProducerError | None:
        """Take a produce request, as ``Broker.submit_request`` does.

        Returns:
            The answer (a result, or the error the request fails with), or None when the
            batch is being appended: its answer comes from :meth:`complete_writes` once
            ``ready_at`` has come (after every append of the partition before it).
        """
        try:
            return self._submit(token, tp, header, tuple(values), now, ready_at)
        except PartitionRecoveringError as exc:
            self.stats.recovering += 1
            return exc
        except InvalidBatchError as exc:
            return exc

    def _submit(
        self,
        token: _Token,
        tp: TopicPartition,
        header: BatchHeader,
        values: tuple[bytes | None, ...],
        now: float,
        ready_at: float,
    ) -> ProduceResult | None:
        core, effects = self.core(tp), self._effects[tp]
        decisions.ready(core, effects, now)
        decision = decisions.offer(
            core,
            effects,
            header,
            now,
            policy=self.storage.policy_for(tp.topic),
            enabled=self.storage.deduplication_for(tp.topic),
            refreshable=False,  # one broker: its registry is never stale
        )
        if not isinstance(decision, Append):
            return decision
        append = decision
        queue = self._writes.setdefault(tp, deque())
        if queue:
            ready_at = max(ready_at, queue[-1].ready_at)
        queue.append(_Write(token, header, values, now, append, ready_at, self.storage.hand_over()))
        return None

    def next_write_at(self) -> float | None:
        """When the next append under way completes, or None."""
        heads = [q[0].ready_at for q in self._writes.values() if q]
        return min(heads) if heads else None

    def pending_writes(self) -> int:
        """Appends under way."""
        return sum(len(q) for q in self._writes.values())

    def complete_writes(self, now: float) -> list[tuple[_Token, ProduceResult | ProducerError]]:
        """Carry out every append due at ``now`` (in order per partition) and return the
        answers of their requests, as the broker's completion of ``LogBackend.append`` does."""
        out: list[tuple[_Token, ProduceResult | ProducerError]] = []
        for tp, queue in self._writes.items():
            core, effects = self.core(tp), self._effects[tp]
            while queue and queue[0].ready_at <= now:
                write = queue.popleft()
                if self._fails(self.faults.append_error):
                    self.stats.append_errors += 1
                    if self.rng.random() < self.faults.stored_on_error:
                        self._store(tp, write)
                    failed = [write, *queue]
                    queue.clear()  # the ordering contract: nothing after it is stored
                    for w in failed:
                        error = BackendUnavailableError(f"append to {tp} failed (injected)")
                        answer = decisions.completed(core, effects, w.append, error, now)
                        assert isinstance(answer, Fail)
                        out.append((w.token, error))
                    break
                answer = decisions.completed(core, effects, write.append, self._store(tp, write), now)
                assert isinstance(answer, Reply)
                out.append((write.token, answer.result))
        return out

    def _store(self, tp: TopicPartition, write: _Write[_Token]) -> int:
        return self.storage.append(
            tp, write.header, write.values, write.timestamp, write.append.snapshot, turn=write.turn
        )

    # -- snapshots, recovery, maintenance ---------------------------------------------------------

    def _ready(self, tp: TopicPartition, now: float) -> PartitionChecker:
        """The partition's checker, rebuilt from the newest snapshot and the log first when
        the core asks for it (:func:`idempotent.broker.decisions.ready`).

        Raises:
            PartitionRecoveringError: appends are still under way after a failure, or the
                snapshot after the recovery's evictions could not be stored.
        """
        return decisions.ready(self.core(tp), self._effects[tp], now)

    def maintain(self, now: float) -> None:
        """The periodic step of every ready partition: expiry, capacity and due snapshots."""
        for tp, core in self.cores.items():
            if core.ready:
                action = core.maintain(now)
                if action is not None:
                    decisions.write_snapshot(core, self._effects[tp], action)

    def crash(self) -> None:
        """Die: of the appends under way a random prefix per partition lands in the storage,
        unanswered, the rest is lost; every other in-memory state is gone. Restart with a new
        :class:`SimulatedBroker` over :attr:`storage`."""
        self.stats.crashes += 1
        for tp, queue in self._writes.items():
            landed = self.rng.randint(0, len(queue))
            for write in list(queue)[:landed]:
                self._store(tp, write)
            self.stats.landed += landed
            self.stats.lost += len(queue) - landed
        self._writes.clear()
        self.cores.clear()
        self._effects.clear()

    def recovery_mismatches(self) -> list[str]:
        """Partitions whose live checker state differs from what a recovery from the stored
        snapshot and log would build (checked where nothing is under way), in words."""
        problems: list[str] = []
        for tp, core in sorted(self.cores.items()):
            checker = core.checker
            if checker is None or not core.ready or core.outstanding or self._writes.get(tp):
                continue
            snapshot = self.storage.latest_snapshot(tp)
            start = snapshot.position if snapshot is not None else 0
            rebuilt, _ = PartitionChecker.recover(snapshot, self.storage.replay(tp, start), self.config)
            live, stored = checker.state(), rebuilt.state()
            if live != stored:
                differ = sorted(p for p in live.keys() | stored.keys() if live.get(p) != stored.get(p))
                problems.append(
                    f"{tp}: a recovery would rebuild another state for producers {differ}: "
                    f"live {[live.get(p) for p in differ]}, recovered {[stored.get(p) for p in differ]}"
                )
        return problems


class _SimulatedPartition:
    """The I/O of one partition's decisions over a :class:`SimulatedStorage`, with its faults:
    the :class:`~idempotent.broker.decisions.PartitionEffects` of a :class:`SimulatedBroker`
    (one per partition, made with its core)."""

    __slots__ = ("_broker", "_tp")

    def __init__(self, broker: SimulatedBroker[Any], tp: TopicPartition) -> None:
        self._broker, self._tp = broker, tp

    @property
    def registry(self) -> ProducerRegistry:
        return self._broker.registry

    def rebuild(self, now: float) -> tuple[PartitionChecker, int, float]:
        broker, tp = self._broker, self._tp
        snapshot = broker.storage.latest_snapshot(tp)
        start = snapshot.position if snapshot is not None else 0
        checker, replayed = PartitionChecker.recover(snapshot, broker.storage.replay(tp, start), broker.config, now=now)
        broker.stats.recoveries += 1
        broker.stats.replayed += replayed
        broker.stats.from_snapshot += snapshot is not None
        return checker, replayed, 0.0

    def store_snapshot(self, snapshot: Snapshot) -> bool:
        broker = self._broker
        if broker._fails(broker.faults.snapshot_error):
            broker.stats.snapshot_errors += 1
            return False
        broker.storage.write_snapshot(self._tp, snapshot)
        broker.stats.snapshots += 1
        return True

    def evicted(self, producer_ids: tuple[ProducerId, ...]) -> None:
        broker = self._broker
        broker.stats.evicted += len(producer_ids)
        for producer_id in producer_ids:
            record = broker.registry.mark_state_lost(producer_id)
            if record is not None:
                broker.storage.save_producer(record)

    def refresh_producers(self) -> None:
        broker = self._broker
        broker.registry.merge(list(broker.storage.producers.values()))

    def note_partition(self, producer_id: int) -> None:
        broker, tp = self._broker, self._tp
        changed = broker.registry.add_partition(producer_id, tp.topic, tp.partition)
        if changed is not None:
            broker.storage.save_producer(changed)
