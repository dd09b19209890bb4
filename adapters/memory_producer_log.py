"""An in-memory :class:`~idempotent.backend.ProducerLog` with fault injection, for tests.

It writes into a :class:`~idempotent.adapters.memory.MemoryBackend`'s partitions (so readers
of the same store see the batches) and keeps each named producer's states beside them, as
Kafka's state topic does. What it promises is the contract's, nothing more:

* a group is stored whole (one atomic write), with the producer's states after it;
* opening a producer's log fences its earlier instances: their next write raises
  :class:`~idempotent.errors.OwnershipLostError`;
* a restart's states are the stored ones completed by a replay of the partition
  (:func:`idempotent.adapters.producer_state.recover_state`), or the restart is refused with
  :class:`~idempotent.errors.ProducerStateLostError`.

Faults (``log.faults``, consumed one per write; a store's are shared by the logs over it):

* ``fail``: nothing is stored and the write fails (outcome known: not stored);
* ``lose_ack``: the group is stored but its answer is lost (outcome unknown until
  :meth:`MemoryProducerLog.resolve`, which finds it stored);
* ``in_doubt``: nothing is stored and the outcome is unknown (``resolve`` finds nothing);
* ``keep_prefix``: a crash in the middle of the group keeps its first ``keep_prefix``
  batches (a log whose groups are not atomic, as Pulsar's); ``resolve`` answers per batch;
* ``resolve_unavailable``: ``resolve`` fails that many times before it answers;
* ``stale_states``: writes store their batches but not the producer's states (a state
  topic that lost its newest records); :meth:`MemoryProducerLog.lose_state` drops one.

Not durable, not thread-safe (the contract's single user is the producer's sender thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from idempotent.adapters.memory import MemoryBackend
from idempotent.adapters.producer_state import recover_state
from idempotent.backend import AppendBatch
from idempotent.broker.config import STATE_REBUILD_RECORDS
from idempotent.core.checker import CheckerConfig
from idempotent.core.records import Snapshot, StoredBatch
from idempotent.errors import BackendUnavailableError, ConfigError, InvalidTopicError, OwnershipLostError

#: the largest batch it takes (as ``Record.size`` counts) and its record count
MAX_BATCH_BYTES = 1 << 20
MAX_BATCH_RECORDS = 10_000


@attrs.define
class ProducerLogFaults:
    """Fault switches of the producer logs over one store; see the module docstring."""

    fail: int = 0
    lose_ack: int = 0
    in_doubt: int = 0
    keep_prefix: int | None = None
    resolve_unavailable: int = 0
    stale_states: bool = False
    writes: int = 0


class _Producers:
    """What the producer logs over one store share: the instances, the states, the faults."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: producer key -> the token of its newest instance
        self.instances: dict[str, int] = {}
        #: (producer key, topic, partition) -> its stored state
        self.states: dict[tuple[str, str, int], Snapshot] = {}
        #: producer key -> the partitions it wrote (Kafka's ``wrote:`` records)
        self.wrote: dict[str, set[tuple[str, int]]] = {}
        self.faults = ProducerLogFaults()


_PRODUCERS: dict[int, _Producers] = {}
_PRODUCERS_LOCK = threading.Lock()


def _producers(backend: MemoryBackend) -> _Producers:
    with _PRODUCERS_LOCK:
        key = id(backend._store)
        shared = _PRODUCERS.get(key)
        if shared is None:
            shared = _PRODUCERS[key] = _Producers()
        return shared


class MemoryProducerLog:
    """One producer's own writer into a :class:`MemoryBackend` (see the module docstring).

    Opening it fences the producer's earlier instances over the same store.
    """

    max_batch_bytes = MAX_BATCH_BYTES
    max_batch_records = MAX_BATCH_RECORDS
    max_in_flight = 5

    def __init__(self, backend: MemoryBackend, producer_key: str, named: bool) -> None:
        self.backend = backend
        self.producer_key = producer_key
        self.named = named
        self._shared = _producers(backend)
        with self._shared.lock:
            self._token = self._shared.instances.get(producer_key, 0) + 1
            self._shared.instances[producer_key] = self._token
        #: the last write whose outcome is unknown: its batches and, per batch, the base
        #: offset it was stored at (None: not stored)
        self._unresolved: tuple[list[Any], list[int | None]] | None = None
        self._closed = False

    @property
    def faults(self) -> ProducerLogFaults:
        """The fault switches (shared by every producer log over this store)."""
        return self._shared.faults

    def lose_state(self, topic: str, partition: int) -> None:
        """Drop this producer's stored state on a partition (a state topic that lost it)."""
        with self._shared.lock:
            self._shared.states.pop((self.producer_key, topic, partition), None)

    def load_states(
        self, producer_id: int = -1, *, window: int = STATE_REBUILD_RECORDS, config: CheckerConfig | None = None
    ) -> dict[tuple[str, int], Snapshot]:
        """See :meth:`idempotent.backend.ProducerLog.load_states`.

        Raises:
            BackendUnavailableError: the store is down (an injected crash).
            ProducerStateLostError: a state the window cannot rebuild; nothing changed.
        """
        if not self.named:
            return {}
        out: dict[tuple[str, int], Snapshot] = {}
        store = self.backend._up()
        with store.lock, self._shared.lock:
            for topic, partition in sorted(self._shared.wrote.get(self.producer_key, ())):
                if store.topics.get(topic) is None:
                    continue
                stored = self._shared.states.get((self.producer_key, topic, partition))
                end = self.backend.end_offset(topic, partition)
                state = recover_state(
                    self.producer_key,
                    producer_id,
                    topic,
                    partition,
                    stored,
                    None if stored is not None else "missing",
                    (0, end),
                    window,
                    partial(self._replay, topic, partition),
                    config=config,
                )
                if state is not None:
                    out[(topic, partition)] = state
        return out

    def _replay(self, topic: str, partition: int, start: int) -> Iterator[StoredBatch]:
        return self.backend.replay(topic, partition, start)

    def write(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        states: Callable[[list[int]], Sequence[tuple[str, int, Snapshot]]] | None = None,
    ) -> list[int]:
        """See :meth:`idempotent.backend.ProducerLog.write`: the group is stored atomically
        (unless ``faults.keep_prefix`` crashes it part-way).

        Raises:
            BackendUnavailableError: nothing was stored (``fail``), or the outcome is unknown
                until :meth:`resolve` (``lose_ack``, ``in_doubt``, ``keep_prefix``; then
                :attr:`unresolved` is not None).
            OwnershipLostError: a newer instance of the producer fenced this one; nothing stored.
            InvalidTopicError: no such partition; nothing stored.
            ConfigError: this log is closed, or a write while another's outcome is unknown.
        """
        if self._closed:
            raise ConfigError(f"the producer log of {self.producer_key!r} is closed")
        if self._unresolved is not None:
            raise ConfigError("a write while the previous one's outcome is unknown: resolve() it first")
        store = self.backend._up()
        shared = self._shared
        with store.lock, shared.lock:
            if shared.instances.get(self.producer_key) != self._token:
                raise OwnershipLostError(f"producer {self.producer_key!r} was fenced by a newer instance")
            for topic, partition, _ in batches:
                if not 0 <= partition < store.topics.get(topic, 0):
                    raise InvalidTopicError(f"no partition {topic}[{partition}]")
            faults = shared.faults
            faults.writes += 1
            if faults.fail > 0:
                faults.fail -= 1
                raise BackendUnavailableError("the producer log's write failed (injected); nothing stored")
            keep = len(batches)
            if faults.in_doubt > 0:
                faults.in_doubt -= 1
                keep = 0
            elif faults.keep_prefix is not None:
                keep = min(faults.keep_prefix, len(batches))
                faults.keep_prefix = None
            offsets: list[int | None] = [None] * len(batches)
            for i, (topic, partition, batch) in enumerate(batches[:keep]):
                offsets[i] = self.backend.append(topic, partition, batch, None).result()
            stored = [o for o in offsets if o is not None]
            if self.named and keep:
                self._store_states(batches[:keep], states, stored)
            lost = faults.lose_ack > 0 and keep == len(batches)
            if lost:
                faults.lose_ack -= 1
            if lost or keep < len(batches):
                self._unresolved = (list(batches), offsets)
                raise BackendUnavailableError("the producer log's write has no answer (injected); outcome unknown")
            return stored

    def _store_states(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        states: Callable[[list[int]], Sequence[tuple[str, int, Snapshot]]] | None,
        offsets: list[int],
    ) -> None:
        shared = self._shared
        wrote = shared.wrote.setdefault(self.producer_key, set())
        wrote.update((topic, partition) for topic, partition, _ in batches)
        if states is None or shared.faults.stale_states:
            return
        for topic, partition, snapshot in states(offsets):
            shared.states[(self.producer_key, topic, partition)] = snapshot

    @property
    def unresolved(self) -> object | None:
        """Not None while the outcome of the last write is unknown."""
        return self._unresolved

    def resolve(self) -> Sequence[int | None] | None:
        """See :meth:`idempotent.backend.ProducerLog.resolve`: the base offsets of a group
        stored whole, None for one not stored at all, else (a crash that kept a prefix) one
        answer per batch. Nothing to settle: None.

        Raises:
            BackendUnavailableError: ``faults.resolve_unavailable``; still unresolved.
        """
        if self._unresolved is None:
            return None
        faults = self._shared.faults
        if faults.resolve_unavailable > 0:
            faults.resolve_unavailable -= 1
            raise BackendUnavailableError("the producer log cannot be asked (injected); still unresolved")
        _, offsets = self._unresolved
        self._unresolved = None
        if all(o is None for o in offsets):
            return None
        return offsets

    def close(self) -> None:
        """Stop writing. Stored batches stay stored."""
        self._closed = True


def open_producer_log(
    backend: Any,
    producer_key: str,
    named: bool,
    settings: dict[str, Any] | None = None,
    takeover: Callable[[], bool] | None = None,
) -> MemoryProducerLog:
    """The writer of one producer over a :class:`MemoryBackend` (the signature of the Kafka
    and Pulsar openers; ``settings`` and ``takeover`` are not used: fencing is immediate).

    Raises:
        ConfigError: ``backend`` is not a MemoryBackend.
    """
    if not isinstance(backend, MemoryBackend):
        raise ConfigError(f"a memory producer log needs a MemoryBackend, not {type(backend).__name__}")
    return MemoryProducerLog(backend, producer_key, named)


if TYPE_CHECKING:  # it keeps the contract's shape (checked by mypy)
    from idempotent.backend import ProducerLog

    _CONTRACT: type[ProducerLog] = MemoryProducerLog


__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_RECORDS", "MemoryProducerLog", "ProducerLogFaults", "open_producer_log"]
