"""In-memory log backend with fault injection, for tests and demos.

``memory://NAME`` opens a store shared by every broker of this process that uses the same
name, so a test can drop a broker (``Broker.abandon()``, a simulated crash) and open a new
one over the same log to exercise recovery. ``memory://`` alone gets a fresh private store.

Faults (``backend.faults``) act on appends, the only write that carries client data:

* ``drop``: the batch is not stored and the append fails (a lost request);
* ``lose_ack``: the batch is stored but the append fails (a lost acknowledgement);
* ``delay``: the batch is stored at once, its acknowledgement arrives ``delay`` seconds later;
* ``crash``: the store refuses everything until ``faults.crash = False`` (the backend is down).

Not durable: everything is gone when the process exits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from concurrent.futures import Future
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs

from idempotent.adapters.metadata import MetadataDelegate
from idempotent.backend import AppendBatch
from idempotent.core.ownership import Lease, supersedes
from idempotent.core.records import Snapshot, StoredBatch, StoredRecord
from idempotent.core.registry import ProducerRecord, merge_record
from idempotent.core.sequence import sequence_at
from idempotent.core.types import NO_PRODUCER_ID, Epoch, Sequence
from idempotent.errors import BackendUnavailableError, InvalidTopicError
from idempotent.runtime.future import LightFuture


@attrs.define
class Faults:
    """Fault-injection switches. Counters are consumed one per append."""

    drop: int = 0
    lose_ack: int = 0
    delay: float = 0.0
    crash: bool = False
    appends: int = 0


class _Store:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.topics: dict[str, int] = {}
        self.logs: dict[tuple[str, int], list[StoredRecord]] = {}
        self.batches: dict[tuple[str, int], list[StoredBatch]] = {}
        self.snapshots: dict[tuple[str, int], Snapshot] = {}
        self.producers: dict[int, ProducerRecord] = {}
        self.settings: dict[str, str] = {}
        self.leases: dict[tuple[str, int], Lease] = {}
        #: producer name -> the positions its last committed transaction stored
        self.positions: dict[str, bytes] = {}
        self.next_id = 0
        self.faults = Faults()


T = TypeVar("T")

_STORES: dict[str, _Store] = {}
_STORES_LOCK = threading.Lock()


def reset_store(name: str) -> None:
    """Forget a named in-memory store (tests)."""
    with _STORES_LOCK:
        _STORES.pop(name, None)


class MemoryMetadataStore:
    """The metadata half of a memory backend (:class:`idempotent.backend.MetadataStore`), in
    the same store as its log."""

    def __init__(self, url: str, store: _Store) -> None:
        self.url = url
        self._store = store

    def _up(self) -> _Store:
        if self._store.faults.crash:
            raise BackendUnavailableError(f"{self.url} is down (injected crash)")
        return self._store

    def list_topics(self) -> dict[str, int]:
        store = self._up()
        with store.lock:
            return dict(store.topics)

    def allocate_producer_ids(self, count: int) -> int:
        store = self._up()
        with store.lock:
            start = store.next_id
            store.next_id += count
            return start

    def load_producers(self) -> list[ProducerRecord]:
        store = self._up()
        with store.lock:
            return list(store.producers.values())

    def save_producer(self, record: ProducerRecord) -> None:
        store = self._up()
        with store.lock:
            known = store.producers.get(record.producer_id)
            record = merge_record(known, record)  # a stale copy must not undo a newer record
            if record is known:
                return
            if record.producer_name is not None:
                for pid, old in list(store.producers.items()):
                    if old.producer_name == record.producer_name and pid != record.producer_id:
                        del store.producers[pid]
            store.producers[record.producer_id] = record

    def delete_producers(self, producer_ids: Seq[int]) -> None:
        store = self._up()
        with store.lock:
            for producer_id in producer_ids:
                store.producers.pop(producer_id, None)

    def load_settings(self) -> dict[str, str]:
        store = self._up()
        with store.lock:
            return dict(store.settings)

    def save_setting(self, key: str, value: str | None) -> None:
        store = self._up()
        with store.lock:
            if value is None:
                store.settings.pop(key, None)
            else:
                store.settings[key] = value

    def load_leases(self) -> list[Lease]:
        store = self._up()
        with store.lock:
            return list(store.leases.values())

    def propose_leases(self, proposals: Seq[Lease]) -> list[Lease | None]:
        store = self._up()
        out: list[Lease | None] = []
        with store.lock:
            for proposal in proposals:
                tp = (proposal.topic, proposal.partition)
                if supersedes(store.leases.get(tp), proposal):
                    store.leases[tp] = proposal
                out.append(store.leases.get(tp))
        return out

    def claim_writer(self) -> bool:
        return False  # writers are per partition (see MetadataStore.claim_writer)


def _ack_lost(faults: Faults, future: Future[Any], message: str) -> bool:
    """Consume an injected ``lose_ack``: fail ``future`` with ``message`` (what was stored
    stays stored)."""
    if faults.lose_ack <= 0:
        return False
    faults.lose_ack -= 1
    future.set_exception(BackendUnavailableError(message))
    return True


def _answer(future: Future[T], value: T, delay: float) -> None:
    """Resolve ``future`` with ``value``, ``delay`` s from now (an injected delay) or at once."""
    if delay > 0:
        timer = threading.Timer(delay, future.set_result, (value,))
        timer.daemon = True
        timer.start()
    else:
        future.set_result(value)


class MemoryBackend(MetadataDelegate):
    """A process-local log; see the module docstring. Its metadata half is a
    :class:`MemoryMetadataStore` over the same store."""

    durable = False

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        name = urlsplit(url).netloc + urlsplit(url).path
        with _STORES_LOCK:
            if not name:
                self._store = _Store()
            else:
                self._store = _STORES.setdefault(name, _Store())
        self.metadata = MemoryMetadataStore(url, self._store)

    @property
    def faults(self) -> Faults:
        """The fault switches of this store (shared by every backend over it)."""
        return self._store.faults

    def _up(self) -> _Store:
        if self._store.faults.crash:
            raise BackendUnavailableError(f"{self.url} is down (injected crash)")
        return self._store

    def describe_topic(self, topic: str) -> int | None:
        store = self._up()
        with store.lock:
            return store.topics.get(topic)

    def create_topic(self, topic: str, partitions: int) -> int:
        store = self._up()
        with store.lock:
            return store.topics.setdefault(topic, partitions)

    def delete_topic(self, topic: str) -> None:
        store = self._up()
        with store.lock:
            store.topics.pop(topic, None)
            for table in (store.logs, store.batches, store.snapshots, store.leases):
                for key in [k for k in table if k[0] == topic]:
                    del table[key]

    def _log(self, store: _Store, topic: str, partition: int) -> list[StoredRecord]:
        if not 0 <= partition < store.topics.get(topic, 0):
            raise InvalidTopicError(f"no partition {topic}[{partition}]")
        return store.logs.setdefault((topic, partition), [])

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        store = self._up()
        future: Future[int] = LightFuture()
        with store.lock:
            faults = store.faults
            faults.appends += 1
            if faults.drop > 0:
                faults.drop -= 1
                future.set_exception(BackendUnavailableError(f"append to {topic}[{partition}] dropped (injected)"))
                return future
            log = self._log(store, topic, partition)
            base = len(log)
            if snapshot is not None:
                store.snapshots[(topic, partition)] = snapshot
            header = batch.header
            for i, record in enumerate(batch.records):
                log.append(
                    StoredRecord(
                        base + i,
                        header.producer_id if header else NO_PRODUCER_ID,
                        header.producer_epoch if header else -1,
                        sequence_at(header.base_sequence, i) if header else -1,
                        record.key,
                        record.value,
                        record.headers,
                        batch.timestamp,
                    )
                )
            store.batches.setdefault((topic, partition), []).append(
                StoredBatch(
                    base,
                    header.producer_id if header else NO_PRODUCER_ID,
                    header.producer_epoch if header else Epoch(-1),
                    header.base_sequence if header else Sequence(-1),
                    len(batch.records),
                    batch.timestamp,
                )
            )
            delay = faults.delay
            if _ack_lost(faults, future, f"acknowledgement of {topic}[{partition}] lost (injected)"):
                return future
        _answer(future, base, delay)
        return future

    def append_atomic(
        self, appends: Seq[tuple[str, int, AppendBatch, Snapshot | None]], positions: tuple[str, bytes] | None
    ) -> Future[list[int]]:
        """Store the batches and the positions in one hold of the store's lock
        (:class:`~idempotent.backend.AtomicAppends`): a reader sees all of them or none. An
        injected ``drop`` fails the whole group unstored; ``lose_ack`` and ``delay`` apply to
        its answer as a whole."""
        done: Future[list[int]] = LightFuture()
        try:
            store = self._up()
        except BackendUnavailableError as exc:
            done.set_exception(exc)
            return done
        with store.lock:
            faults = store.faults
            for topic, partition, _, _ in appends:
                if not 0 <= partition < store.topics.get(topic, 0):
                    done.set_exception(InvalidTopicError(f"no partition {topic}[{partition}]"))
                    return done
            if faults.drop > 0:
                faults.drop -= 1
                done.set_exception(BackendUnavailableError("a transaction's group was dropped (injected)"))
                return done
            lost, delay = faults.lose_ack, faults.delay
            faults.lose_ack = faults.delay = 0
            try:
                offsets = [self.append(t, p, batch, snap).result() for t, p, batch, snap in appends]
            finally:
                faults.lose_ack, faults.delay = lost, delay
            if positions is not None:
                store.positions[positions[0]] = positions[1]
            if _ack_lost(faults, done, "a transaction's acknowledgement was lost (injected)"):
                return done
        _answer(done, offsets, delay)
        return done

    def committed_positions(self, producer_name: str) -> bytes | None:
        store = self._up()
        with store.lock:
            return store.positions.get(producer_name)

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        store = self._up()
        with store.lock:
            return list(self._log(store, topic, partition)[offset : offset + max_records])

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        store = self._up()
        with store.lock:
            batches = [b for b in store.batches.get((topic, partition), []) if b.base_offset >= from_offset]
        return iter(batches)

    def end_offset(self, topic: str, partition: int) -> int:
        store = self._up()
        with store.lock:
            return len(self._log(store, topic, partition))

    def latest_snapshot(self, topic: str, partition: int) -> Snapshot | None:
        store = self._up()
        with store.lock:
            return store.snapshots.get((topic, partition))

    def write_snapshot(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        store = self._up()
        with store.lock:
            current = store.snapshots.get((topic, partition))
            if current is None or current.position <= snapshot.position:
                store.snapshots[(topic, partition)] = snapshot

    #: no limit of its own below the broker's (LogBackend.max_record_bytes)
    max_record_bytes: int | None = None
    max_batch_bytes: int | None = None

    def release(self, topic: str, partition: int) -> None:
        return None

    def close(self) -> None:
        return None
