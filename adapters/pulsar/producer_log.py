"""A producer's own writer into Pulsar (producer-scoped ownership).

A :class:`~idempotent.broker.direct.DirectBroker` writes one producer's batches straight into the
topic's partitions, next to any number of other producers (replicas of a service, workers of
one server) writing the same partitions at the same time. Nobody owns a partition; each
producer owns its own records. The design, and why (docs/backends.md, "Pulsar"):

* **One Pulsar producer per partition topic, named after our producer** (its name for a
  named producer, or the ``pulsar_producer_name`` setting: the pulsar-client drop-in keeps the
  application's name there while its producer's own name also says the topic;
  ``idempotent-p-<id>`` for an anonymous one), in Pulsar's
  default ``Shared`` access mode, with Pulsar's deduplication enabled on the topic. Producers
  of different names never disturb each other. Pulsar refuses a second live producer of the
  same name on a topic (``ProducerBusy``) and removes a closed or disconnected one only after
  its pending writes are settled, so while an instance holds a partition topic, no other
  instance of the same producer can store anything there, and once it holds it, everything
  an earlier instance stored there is readable. ``ProducerBusy`` is retried (a killed
  process's connection lingers until the broker notices) and reported as another instance
  of the producer still running.
* **One batch, one entry.** The records of a batch go into the client's batch container with
  batching limits no batch reaches, and the flush closes the entry, so a batch is stored
  atomically with consecutive batch indexes (offsets ``ledger<<40 | entry<<20 | index``, as
  the shared backend). Each entry carries one Pulsar sequence id (per producer name and
  partition topic: the one after ``last_sequence_id()``); the broker records an entry's first
  id, which is the one we choose, so Pulsar's deduplication makes the client's own resends
  (after a reconnect) harmless, and a resend by an older instance of an entry number the newer
  one used is dropped. The first record of a batch carries the identity properties
  (``idem.pid``, ``idem.epoch``, ``idem.seq``, ``idem.count``), the others only their own.
* **Failure order.** Sends have no client timeout (``send_timeout_millis=0``): the client
  resends pending entries in order after a reconnect, so an entry never fails while a later
  one of the same producer is stored. A group is written synchronously (every partition's
  entry in flight at once, one wait); when an entry fails or gets no answer in time, its
  Pulsar producer is closed (what it still had queued is never sent) and the write's outcome
  is unknown (:attr:`PulsarProducerLog.unresolved`) until :meth:`PulsarProducerLog.resolve`
  reopens it: once Pulsar lets the name in again, the old producer's writes are settled, and
  ``last_sequence_id()`` says whether the entry is stored; a bounded read finds its offset.
* **State (named producers).** Pulsar alone cannot give the exact last sequence and the
  offsets of the latest batches: ``last_sequence_id()`` is an entry number, and a message
  cannot be looked up by it. So the producer's checker state on every partition it writes is
  written, as one message, to its own topic ``__idempotent_producer.<name>`` (in the metadata
  namespace) with an ``ExclusiveWithFencing`` producer: opening it fences every earlier
  instance (whose next state write fails, and which then closes its partition producers), so
  it is the first thing a new instance does. The state is written at most every
  :data:`STATE_INTERVAL` seconds (asynchronously), when a partition is written for the first
  time (synchronously, before its first entry, so the state names every partition the
  producer ever wrote, with the offset to read it from), and on close. A restart takes the
  newest state message and, holding each of its partition topics, reads each from the state's
  position to its end, applying the entries of its Pulsar name: the checker continues from
  exactly what is stored, with the original offsets of its latest batches. The read is
  bounded by what all producers stored on that partition since the state was written.

This module is the writer itself (:class:`PulsarProducerLog`: group writes, pipelined
writes, settling, the state's timing and fencing); its parts live by concern in
``adapters/pulsar/entries.py`` (a partition's writer, a batch as one entry and what its
answers say), ``adapters/pulsar/producer_state.py`` (the state topic: its name, its
encoding, its fencing producer, the newest state) and ``adapters/pulsar/recovery.py``
(taking a partition topic, reading back what the producer stored there, finding an entry's
offset). Errors are translated once, by ``adapters/pulsar/errors.py``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from idempotent.adapters.pulsar.backend import PulsarBackend
from idempotent.adapters.pulsar.entries import (
    BATCHING,
    EVENT_TIME_HEADER,
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    EntryWriter,
    GroupWait,
    close_entry,
    entry_offset,
    noop_flush,
    pulsar_producer_name,
    send_entry,
)
from idempotent.adapters.pulsar.entries import ORDERING_KEY_HEADER as ORDERING_KEY_HEADER
from idempotent.adapters.pulsar.errors import map_errors, translate
from idempotent.adapters.pulsar.producer_state import STATE_PREFIX as STATE_PREFIX
from idempotent.adapters.pulsar.producer_state import (
    open_state_producer,
    pack_states,
    read_states,
    state_topic,
)
from idempotent.adapters.pulsar.producer_state import unpack_states as unpack_states
from idempotent.adapters.pulsar.recovery import locate, open_partition
from idempotent.backend import AppendBatch
from idempotent.broker.config import STATE_REBUILD_RECORDS
from idempotent.core.checker import CheckerConfig
from idempotent.core.records import BatchHeader, Snapshot
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    CorruptDataError,
    OwnershipLostError,
    ProducerError,
)

try:
    import pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")

#: seconds between two asynchronous state writes of a named producer (a restart reads at
#: most about this much of every producer's traffic on each partition it wrote)
STATE_INTERVAL = 0.5
#: pulsar-client producer settings a user may choose (the drop-in passes them)
TUNABLE = frozenset({"compression_type", "pulsar_producer_name", "access_mode", "encryption_key", "crypto_key_reader"})


class _Unresolved:
    """A batch of a write whose outcome was not known when ``write`` returned."""

    __slots__ = ("count", "entry_id", "floor", "header", "offset", "partition", "topic")

    def __init__(
        self, topic: str, partition: int, header: BatchHeader | None, count: int, entry_id: int, floor: int
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.header = header
        self.count = count
        self.entry_id = entry_id
        self.floor = floor
        #: the base offset once known to be stored
        self.offset: int | None = None


class _Entry:
    """One batch handed to :meth:`PulsarProducerLog.submit`: where it goes, what it is, and
    (once answered) how it ended. Its identity is the token the broker settles it by."""

    __slots__ = ("answered", "count", "done", "entry_id", "first", "floor", "header", "index", "writer")

    def __init__(
        self,
        writer: EntryWriter,
        header: BatchHeader | None,
        count: int,
        entry_id: int,
        index: int,
        done: Callable[[int, int | None, ProducerError | None, Any], None],
    ) -> None:
        self.writer = writer
        self.header = header
        self.count = count
        self.entry_id = entry_id
        self.floor = writer.end
        self.index = index
        self.done = done
        self.first: tuple[Any, Any] | None = None
        #: set once reported (a refused entry is answered here, and again by the client when
        #: its writer is closed: only the first answer counts)
        self.answered = False


class PulsarProducerLog:
    """One producer's writers into Pulsar (see the module docstring). Not thread-safe: its
    producer's sender thread is its only user.

    Args:
        backend: the process's shared Pulsar backend (client, admin, metadata, reads).
        producer_key: the producer's name, or its id for an anonymous producer.
        named: whether the producer is named (it keeps states and fences older instances).
        settings: pulsar-client producer settings of :data:`TUNABLE`.

    Raises:
        ConfigError: a setting not in :data:`TUNABLE`, or one Pulsar refuses.
        BackendUnavailableError: Pulsar did not answer within the backend's timeout.
    """

    max_batch_bytes = MAX_BATCH_BYTES
    max_batch_records = MAX_BATCH_RECORDS
    #: batches of one partition in flight at once through :meth:`submit` (pipelining)
    max_in_flight = 5

    def __init__(
        self, backend: PulsarBackend, producer_key: str, named: bool, settings: dict[str, Any] | None = None
    ) -> None:
        unknown = set(settings or {}) - TUNABLE
        if unknown:
            raise ConfigError(f"pulsar: producer settings {sorted(unknown)} cannot be chosen; use {sorted(TUNABLE)}")
        self.backend = backend
        self.producer_key = producer_key
        self.named = named
        options = dict(settings or {})
        self.name = str(options.pop("pulsar_producer_name", None) or pulsar_producer_name(producer_key, named))
        self._options = {**BATCHING, **options}
        self._writers: dict[tuple[str, int], EntryWriter] = {}
        #: the batches of the last write whose outcome is unknown; :meth:`resolve` settles them
        self._unresolved: list[_Unresolved] | None = None
        #: the newest state of every partition written (named producers)
        self._states: dict[tuple[str, int], Snapshot] = {}
        self._states_dirty = False
        self._state_at = 0.0
        self._state_producer: Any = None
        self._state_topic = state_topic(backend, producer_key) if named else ""
        #: an error a state write reported asynchronously (fenced: sticky)
        self._state_error: ProducerError | None = None
        self._lost: OwnershipLostError | None = None
        #: pipelining (:meth:`submit`): guards what the client's callbacks change
        self._mutex = threading.Condition()
        #: entries submitted and not answered yet, per writer
        self._inflight: dict[EntryWriter, int] = {}
        #: writers of which an entry failed (their later entries must not be stored)
        self._failed: dict[EntryWriter, ProducerError] = {}
        #: entries that failed, settled by :meth:`resolve_entries`
        self._failures: list[_Entry] = []
        if named:
            self._open_state()

    # -- opening ---------------------------------------------------------------------------

    def _open_state(self) -> None:
        """Open the state producer with ExclusiveWithFencing: fences every earlier instance."""
        self._state_producer = open_state_producer(self.backend, self._state_topic, self.name, self.producer_key)

    def _open(
        self, topic: str, partition: int, base: Snapshot | None, rebuild: tuple[int, str] | None = None
    ) -> tuple[EntryWriter, Snapshot]:
        """Take this producer's writer of a partition (:func:`~idempotent.adapters.pulsar.recovery.open_partition`:
        from ``base``, its newest state there, or None when it never wrote it, or when its
        state there is lost: then ``rebuild`` is ``(window, why)``) and keep it.

        Returns:
            The writer and the producer's complete state on the partition.
        """
        writer, state = open_partition(
            self.backend, self.name, self.producer_key, self.named, self._options, topic, partition, base, rebuild
        )
        self._writers[(topic, partition)] = writer
        return writer, state

    # -- ProducerLog -------------------------------------------------------------------------

    def load_states(
        self,
        producer_id: int = -1,
        *,
        window: int = STATE_REBUILD_RECORDS,
        config: CheckerConfig | None = None,
    ) -> dict[tuple[str, int], Snapshot]:
        """The producer's complete state on every partition it wrote (none when anonymous):
        the newest stored state, completed by reading each partition from its position on
        (holding the partition topic, so no earlier instance can add to it meanwhile). A
        partition the metadata records it wrote (``wrote:`` records) whose state is missing
        from the newest state message, or all of them when that message is unreadable, is
        rebuilt from the whole partition when it holds at most ``window`` messages, never
        taken as empty; the repaired state is stored at once. The entries replayed are the
        ones of this producer's Pulsar name (``producer_id`` and ``config`` are not needed).

        Raises:
            BackendUnavailableError: Pulsar could not be read, or another instance of the
                producer still holds a partition topic.
            ProducerStateLostError: a lost state that cannot be rebuilt (the message names the
                partition and what to do).
        """
        if not self.named:
            return {}
        why = "missing"
        try:
            stored = read_states(self.backend, self._state_topic, self.producer_key)
        except CorruptDataError as exc:
            stored, why = {}, f"unreadable ({exc})"
        metadata = self.backend.metadata
        recorded = metadata.written_by(self.producer_key)
        metadata.record_written(self.producer_key, sorted(set(stored) - recorded))
        topics = self.backend.list_topics()
        rebuilt = False
        for topic, partition in sorted(recorded | set(stored)):
            if (topic, partition) in self._writers:
                continue
            snapshot = stored.get((topic, partition))
            if snapshot is None and partition >= topics.get(topic, 0):
                continue  # the topic is gone: nothing there to resend against
            rebuild = None if snapshot is not None else (window, why)
            _, self._states[(topic, partition)] = self._open(topic, partition, snapshot, rebuild)
            rebuilt = rebuilt or rebuild is not None
        if rebuilt:
            self._write_state(wait=True)
        return dict(self._states)

    @property
    def unresolved(self) -> object | None:
        """Not None while the outcome of the last write is unknown."""
        return self._unresolved

    def write(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        states: Callable[[list[int]], Sequence[tuple[str, int, Snapshot]]] | None = None,
    ) -> list[int]:
        """Store ``batches`` (at most one per partition), each as one entry, all in flight at
        once; note the producer's states after them (``states(base offsets)``), which are
        written to its state topic when due.

        Returns:
            Each batch's base offset, in order.

        Raises:
            BackendUnavailableError: nothing was stored, or (when :attr:`unresolved` is set)
                some entries' outcome is unknown until :meth:`resolve`.
            OwnershipLostError: a newer instance of this producer fenced this one.
            EntryTooLargeError, InvalidTopicError, ConfigError: refused; nothing stored.
        """
        if self._unresolved is not None:
            raise BackendUnavailableError(f"pulsar: {self.name!r}: a write in doubt is not settled yet")
        self._check_fenced()
        if self.named and not self._state_producer.is_connected():
            # disconnected, or closed by the broker because a newer instance fenced it:
            # a state write tells which before anything else is stored
            self._write_state(wait=True)
        fresh = [(t, p) for t, p, _ in batches if (t, p) not in self._writers]
        for topic, partition in fresh:
            _, self._states[(topic, partition)] = self._open(topic, partition, None)
        if fresh and self.named:  # the state names every partition before its first entry
            self._write_state(wait=True)
        writers = [self._writers[(t, p)] for t, p, _ in batches]
        wait = GroupWait(2 * len(batches))
        entry_ids = []
        for index, ((_, _, batch), writer) in enumerate(zip(batches, writers, strict=True)):
            entry_id = writer.next_id
            writer.next_id += 1
            entry_ids.append(entry_id)
            try:
                send_entry(writer, batch, entry_id, wait.slot(2 * index), wait.slot(2 * index + 1))
            except ProducerError as exc:
                self._abandon(writers[: index + 1], exc)
                self._unresolved = [
                    _Unresolved(t, p, b.header, len(b.records), e, w.end)
                    for (t, p, b), w, e in zip(batches[:index], writers, entry_ids, strict=False)
                ]
                if not self._unresolved:
                    self._unresolved = None
                raise
        for writer in writers:
            self._flush(writer)
        complete = wait.wait(self.backend.timeout)
        offsets, error = self._outcome(batches, writers, wait, complete)
        if error is not None:
            failed = [w for w, o in zip(writers, offsets, strict=True) if o is None]
            self._abandon(failed, error)
            if all(o is None for o in offsets) and not isinstance(error, BackendUnavailableError):
                raise error  # refused for good, nothing stored
            self._unresolved = [
                _Unresolved(t, p, b.header, len(b.records), e, w.end)
                for (t, p, b), w, e in zip(batches, writers, entry_ids, strict=True)
            ]
            for item, offset in zip(self._unresolved, offsets, strict=True):
                item.offset = offset
            raise error if isinstance(error, BackendUnavailableError) else BackendUnavailableError(str(error))
        done = [o for o in offsets if o is not None]
        for (_, _, batch), writer, offset in zip(batches, writers, done, strict=True):
            writer.end = offset + len(batch.records)
        if states is not None and self.named:
            for topic, partition, snapshot in states(done):
                self._states[(topic, partition)] = snapshot
            self._states_dirty = True
            if time.monotonic() - self._state_at >= STATE_INTERVAL:
                self._write_state(wait=False)
        return done

    def _flush(self, writer: EntryWriter) -> None:
        """Close the writer's entry without waiting (:func:`~idempotent.adapters.pulsar.entries.close_entry`;
        the blocking ``flush`` where the client lacks ``flush_async``)."""
        with map_errors(f"append to {writer.where}"):
            close_entry(writer.producer)

    def _outcome(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        writers: list[EntryWriter],
        wait: GroupWait,
        complete: bool,
    ) -> tuple[list[int | None], ProducerError | None]:
        """Each batch's base offset (None: failed or unknown), and the first error."""
        offsets: list[int | None] = []
        error: ProducerError | None = None
        with wait.cond:
            answers = dict(wait.answers)
        for index, ((_, _, batch), writer) in enumerate(zip(batches, writers, strict=True)):
            first, last = answers.get(2 * index), answers.get(2 * index + 1)
            what = f"append to {writer.where}"
            if first is None or last is None:
                offsets.append(None)
                error = error or BackendUnavailableError(
                    f"pulsar: {what}: no acknowledgement within {self.backend.timeout} s"
                )
                continue
            offset, refused = entry_offset(first, last, len(batch.records), what)
            offsets.append(offset)
            error = error or refused
        if not complete and error is None:  # pragma: no cover - the wait ended early
            error = BackendUnavailableError(f"pulsar: {self.name!r}: a write was not acknowledged")
        return offsets, error

    def _abandon(self, writers: Iterable[EntryWriter], error: ProducerError) -> None:
        """Close the writers of failed entries: nothing they still hold may be sent later,
        and reopening one (:meth:`resolve`) waits until Pulsar settled its writes."""
        for writer in writers:
            if self._writers.get((writer.topic, writer.partition)) is writer:
                del self._writers[(writer.topic, writer.partition)]
            with contextlib.suppress(Exception):
                writer.producer._producer.close_async(noop_flush)
        _LOG.warning("pulsar: a write of %r failed; its writers are reopened before the next: %s", self.name, error)

    def resolve(self) -> list[int | None] | None:
        """Settle the last write whose outcome was unknown: reopen the writer of each entry
        in doubt (Pulsar lets the name in once the old writer's sends are settled) and ask
        ``last_sequence_id()`` whether it is stored; a read from where it could start finds
        its offset.

        Returns:
            Each batch's base offset when stored, None for one that was not (and never will
            be), in the order of the write.

        Raises:
            BackendUnavailableError: Pulsar could not be reached; still unresolved.
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        items = self._unresolved
        if items is None:
            return None
        self._check_fenced()
        for item in items:
            if item.offset is not None:
                continue
            key = (item.topic, item.partition)
            writer = self._writers.get(key)
            if writer is None:
                base = self._states.get(key)
                writer, _ = self._open(item.topic, item.partition, None if base is None else base)
            with map_errors(f"resolve a write to {writer.where}"):
                stored = int(writer.producer.last_sequence_id()) >= item.entry_id
                if stored:
                    item.offset = self._locate(writer, item)
            writer.next_id = max(writer.next_id, item.entry_id + 1)
            if item.offset is None:
                item.entry_id = -1  # settled: not stored
        self._unresolved = None
        out = [item.offset for item in items]
        for item in items:
            if item.offset is not None:
                writer = self._writers[(item.topic, item.partition)]
                writer.end = max(writer.end, item.offset + item.count)
        return out

    def _locate(self, writer: EntryWriter, item: _Unresolved) -> int:
        """The base offset of an entry of ours known to be stored after ``item.floor``
        (:func:`~idempotent.adapters.pulsar.recovery.locate`).

        Raises:
            CorruptDataError: it is not there (the log lost it).
        """
        return locate(self.backend, self.name, writer, item.header, item.entry_id, item.floor)

    # -- pipelined writes ------------------------------------------------------------------

    def prepare(self, partitions: Sequence[tuple[str, int]]) -> None:
        """Get ready to :meth:`submit` to ``partitions``: settled, not fenced, a writer open
        on each (a partition written for the first time is named in the stored state first),
        and the state written when it is due.

        Raises:
            BackendUnavailableError: a writer could not be opened, or an earlier entry's
                failure is not settled yet.
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        self._check_fenced()
        with self._mutex:
            if self._failed:
                raise BackendUnavailableError(f"pulsar: {self.name!r}: a failed write is not settled yet")
        if self.named and not self._state_producer.is_connected():
            self._write_state(wait=True)
        fresh = [(t, p) for t, p in partitions if (t, p) not in self._writers]
        if fresh and self.named:  # recorded before the state names them and before their first entry
            self.backend.metadata.record_written(self.producer_key, fresh)
        for topic, partition in fresh:
            _, state = self._open(topic, partition, None)
            with self._mutex:
                self._states[(topic, partition)] = state
        if fresh and self.named:
            self._write_state(wait=True)
        elif self.named and self._states_dirty and time.monotonic() - self._state_at >= STATE_INTERVAL:
            self._write_state(wait=False)

    def submit(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        done: Callable[[int, int | None, ProducerError | None, Any], None],
    ) -> list[_Entry]:
        """Hand ``batches`` (to partitions :meth:`prepare` readied) to their writers without
        waiting: each becomes one entry, sent after everything submitted to its partition
        before. ``done(i, base offset, None, entry)`` reports batch ``i`` stored,
        ``done(i, None, error, entry)`` failed with its outcome unknown (settle it with
        :meth:`resolve_entries`); it is called on the client's thread (keep it short, and
        take no lock that a caller of this method holds) or, for a batch the client refused
        before it left, here. Raises nothing: every batch is answered through ``done``.

        Returns:
            The entries (the tokens :meth:`resolve_entries` answers by), in order.
        """
        entries: list[_Entry] = []
        for index, (topic, partition, batch) in enumerate(batches):
            writer = self._writers.get((topic, partition))
            if writer is None:  # not prepared: a bug of the caller
                raise ConfigError(f"pulsar: submit to {topic}[{partition}] without prepare()")
            entry = _Entry(writer, batch.header, len(batch.records), writer.next_id, index, done)
            writer.next_id += 1
            with self._mutex:
                self._inflight[writer] = self._inflight.get(writer, 0) + 1
            try:
                send_entry(writer, batch, entry.entry_id, partial(self._first, entry), partial(self._last, entry))
                self._flush(writer)
            except ProducerError as exc:  # the client refused it: whatever it holds is in doubt
                self._answer(entry, None, exc)
            entries.append(entry)
        return entries

    def _first(self, entry: _Entry, result: Any, message_id: Any) -> None:
        entry.first = (result, message_id)

    def _last(self, entry: _Entry, result: Any, message_id: Any) -> None:
        """The last message of an entry was answered (after its first: same entry)."""
        try:
            first = entry.first
            writer = entry.writer
            offset: int | None = None
            error: ProducerError | None = None
            what = f"append to {writer.where}"
            if first is None:
                error = BackendUnavailableError(f"pulsar: {what}: the entry's first message was not answered")
            else:
                offset, error = entry_offset(first, (result, message_id), entry.count, what)
            self._answer(entry, offset, error)
        except BaseException:  # pragma: no cover - an exception escaping a callback ends the process
            _LOG.exception("pulsar: answering an entry failed")

    def _answer(self, entry: _Entry, offset: int | None, error: ProducerError | None) -> None:
        """Report an entry's end to the broker, then count it out of its writer."""
        writer = entry.writer
        with self._mutex:
            if entry.answered:
                return
            entry.answered = True
            if error is not None:
                self._failed.setdefault(writer, error)
                self._failures.append(entry)
            elif offset is not None:
                writer.end = max(writer.end, offset + entry.count)
        try:
            entry.done(entry.index, offset, error, entry)
        finally:
            with self._mutex:
                self._inflight[writer] -= 1
                self._mutex.notify_all()

    def note_state(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        """The producer's state on a partition after a stored batch (named producers; written
        with the next state message). Thread-safe."""
        if self.named:
            with self._mutex:
                self._states[(topic, partition)] = snapshot
                self._states_dirty = True

    def resolve_entries(self) -> dict[_Entry, int | None]:
        """Settle every entry that failed: close the writers they went through (nothing they
        still hold is sent; their other entries fail too), wait until all of them are
        answered, reopen each (Pulsar lets the name in once the old writer's sends are
        settled) and ask ``last_sequence_id()`` which entries are stored: the stored ones
        (a prefix, in order) get their offsets from a bounded read.

        Returns:
            Each failed entry's base offset when stored, None when not (and never will be).

        Raises:
            BackendUnavailableError: Pulsar could not be reached; still unsettled.
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        with self._mutex:
            failed = list(self._failed)
        if not failed:
            return {}
        for writer in failed:
            if self._writers.get((writer.topic, writer.partition)) is writer:
                del self._writers[(writer.topic, writer.partition)]
                with contextlib.suppress(Exception):
                    writer.producer.close()
        deadline = time.monotonic() + self.backend.timeout
        with self._mutex:
            while any(self._inflight.get(w, 0) for w in failed):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendUnavailableError(f"pulsar: {self.name!r}: failed writers are still answering")
                self._mutex.wait(left)
            entries = [e for e in self._failures if e.writer in failed]
        out: dict[_Entry, int | None] = {}
        for writer in failed:
            key = (writer.topic, writer.partition)
            reopened = self._writers.get(key)
            if reopened is None:
                with self._mutex:
                    base = self._states.get(key)
                reopened, _ = self._open(writer.topic, writer.partition, base)
                reopened.end = max(reopened.end, writer.end)
            with map_errors(f"settle the writes to {writer.where}"):
                last_id = int(reopened.producer.last_sequence_id())
            for entry in sorted((e for e in entries if e.writer is writer), key=lambda e: e.entry_id):
                unresolved = _Unresolved(
                    writer.topic, writer.partition, entry.header, entry.count, entry.entry_id, entry.floor
                )
                out[entry] = self._locate(reopened, unresolved) if entry.entry_id <= last_id else None
            reopened.next_id = max(reopened.next_id, last_id + 1)
        with self._mutex:
            for writer in failed:
                self._failed.pop(writer, None)
                self._inflight.pop(writer, None)
            self._failures = [e for e in self._failures if e.writer not in failed]
        return out

    # -- state -------------------------------------------------------------------------------

    def _check_fenced(self) -> None:
        if self._lost is not None:
            raise self._lost
        error, self._state_error = self._state_error, None
        if isinstance(error, OwnershipLostError):
            self._fence(error)
        if error is not None:
            _LOG.warning("pulsar: a state write of %r failed (written again with the next): %s", self.name, error)
            self._states_dirty = True

    def _fence(self, error: OwnershipLostError) -> None:
        """A newer instance took over: close every writer so that it can take them."""
        self._lost = OwnershipLostError(
            f"pulsar: a newer instance of producer {self.producer_key!r} opened its state topic ({error})"
        )
        self._close_writers()
        raise self._lost

    def _write_state(self, *, wait: bool) -> None:
        """Write the producer's states as one message (``wait``: and wait for it)."""
        with self._mutex:
            data = pack_states(self._states)
            self._states_dirty = False
        self._state_at = time.monotonic()
        producer = self._state_producer
        if wait:
            try:
                with map_errors(f"store the state of producer {self.producer_key!r}"):
                    producer.send(data)
            except OwnershipLostError as exc:
                self._fence(exc)
            return

        def stored(result: Any, message_id: Any) -> None:
            if result != pulsar.Result.Ok:
                with contextlib.suppress(BaseException):
                    self._state_error = translate(result, f"store the state of producer {self.producer_key!r}")

        with map_errors(f"store the state of producer {self.producer_key!r}"):
            producer.send_async(data, stored)

    def close(self) -> None:
        """Write the newest state (named producers), then close every writer. Stored
        batches stay stored."""
        if self._state_producer is not None and self._lost is None:
            try:
                if self._states_dirty and self._unresolved is None:
                    self._write_state(wait=True)
            except ProducerError as exc:
                _LOG.warning("pulsar: the last state of %r was not written: %s", self.name, exc)
            with contextlib.suppress(Exception):
                self._state_producer.close()
        self._state_producer = None
        self._close_writers()

    def _close_writers(self) -> None:
        writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            with contextlib.suppress(Exception):
                writer.producer.close()


def open_producer_log(
    backend: Any,
    producer_key: str,
    named: bool,
    settings: dict[str, Any] | None = None,
    takeover: Callable[[], bool] | None = None,
) -> PulsarProducerLog:
    """The writer of one producer over the process's shared :class:`PulsarBackend`; see
    :class:`PulsarProducerLog` (what it raises). ``takeover`` is not used: Pulsar fences
    only on a takeover."""
    if not isinstance(backend, PulsarBackend):
        raise ConfigError(f"a Pulsar producer log needs a PulsarBackend, not {type(backend).__name__}")
    return PulsarProducerLog(backend, producer_key, named, settings)


__all__ = [
    "EVENT_TIME_HEADER",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "STATE_INTERVAL",
    "PulsarProducerLog",
    "open_producer_log",
    "pulsar_producer_name",
    "state_topic",
]
