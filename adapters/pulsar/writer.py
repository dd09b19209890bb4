"""The writer of one Pulsar partition: the exclusive producer that owns it (and its snapshot
topic), with a thread that writes queued batches in order, several at a time as one entry,
up to :data:`MAX_IN_FLIGHT` entries in flight, and that leaves what a failure put in doubt
for the writer replacing it to check (:class:`Unsettled`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, Protocol

import attrs

from idempotent.adapters.meta import pack_snapshot
from idempotent.adapters.pulsar.entries import close_entry
from idempotent.adapters.pulsar.errors import map_errors, translate
from idempotent.adapters.pulsar.messages import Message, build_message, encode_record, message_size
from idempotent.adapters.pulsar.names import PulsarName, encode_offset, pulsar_topic_name, start_id
from idempotent.adapters.work_queue import GroupQueue
from idempotent.backend import AppendBatch
from idempotent.core.records import Snapshot
from idempotent.core.sequence import sequence_at
from idempotent.errors import (
    BackendUnavailableError,
    CorruptDataError,
    EntryTooLargeError,
    InvalidBatchError,
    OwnershipLostError,
    ProducerError,
    internal_error,
)
from idempotent.runtime.future import LightFuture

try:
    import pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")
OWNER_PREFIX = "idempotent-owner-"
MAX_GROUP_RECORDS = 100_000  # records of several queued batches sent as one entry
#: entries of one partition sent and not answered yet, at most (pipelining)
MAX_IN_FLIGHT = 5


class WriterHost(Protocol):
    """What a partition writer needs from its backend (:class:`idempotent.adapters.pulsar.backend.PulsarBackend`)."""

    timeout: float
    max_entry_bytes: int

    def data_topic(self, topic: str, partition: int) -> str: ...

    def ensure_deduplication(self, name: PulsarName, data_topic: str) -> None: ...

    def ensure_topic(self, name: PulsarName) -> str: ...

    def open_owner(self, topic: str, name: str, *, batching: bool) -> Any: ...

    def _end(self, data_topic: str) -> int: ...

    def _read(self, topic: str, start: Any, limit: int | None = None) -> Iterator[Any]: ...


@attrs.frozen
class Unsettled:
    """The entries a failed writer had sent and not seen answered (their Pulsar sequence
    ids and message counts, in order), and an offset at or before the first of them: the
    writer that replaces it checks that what Pulsar stored of them is a prefix (see
    :meth:`PartitionWriter._settle`)."""

    floor: int
    entries: tuple[tuple[int, int], ...]


@attrs.define
class _Item:
    batch: AppendBatch | None
    snapshot: Snapshot | None
    future: Future[int]
    messages: list[Message] = attrs.field(factory=list)
    size: int = 0


class _Sent:
    """An entry sent and not answered yet: its batches, and the answers of its first and
    last message (``(result, message id)``, set on the client's thread)."""

    __slots__ = ("answers", "count", "deadline", "first_id", "items", "refused")

    def __init__(self, items: list[_Item], count: int, deadline: float, first_id: int) -> None:
        self.items = items
        self.count = count
        self.deadline = deadline
        #: the Pulsar sequence id of its first message (the others follow it)
        self.first_id = first_id
        self.answers: list[tuple[Any, Any] | None] = [None, None]
        #: refused for good before anything of it was sent: its batches fail alone, in turn
        self.refused: InvalidBatchError | None = None

    @property
    def answered(self) -> bool:
        return None not in self.answers

    def answer(self, cond: threading.Condition, *slots: int) -> Any:
        """The client's callback that records the answer in ``slots`` and wakes the writer."""

        def callback(result: Any, message_id: Any) -> None:
            # nothing here can raise (an exception escaping a pulsar callback would end the
            # process): two assignments and a notify under the writer's lock
            with cond:
                for slot in slots:
                    self.answers[slot] = (result, message_id)
                cond.notify_all()

        return callback


class PartitionWriter(GroupQueue[_Item]):
    """The exclusive producer that owns one partition (and its snapshot topic), with a thread
    that writes queued batches in order, several at a time as one entry."""

    def __init__(self, backend: WriterHost, topic: str, partition: int, unsettled: Unsettled | None = None) -> None:
        """Take ownership of the partition (fencing any other owner) and start the writer.
        ``unsettled``: what the writer this one replaces left in doubt (checked first).

        Raises:
            CorruptDataError: a later entry of ``unsettled`` is stored while an earlier one
                is not (nothing opened is left behind).
            ProducerError: the partition could not be taken (translated).
        """
        super().__init__()
        self.backend = backend
        self.topic = topic
        self.partition = partition
        self.name = pulsar_topic_name(topic)
        self.where = f"{topic}[{partition}]"
        #: set once another owner fenced ours: sticky, this backend never takes it back
        self.lost: ProducerError | None = None
        #: set after any other failure: appends fail until the broker rebuilds the partition,
        #: which opens a new writer (and so waits until Pulsar has settled this one's writes)
        self.broken: ProducerError | None = None
        #: True while :meth:`_fail` answers the appends it failed: an append made meanwhile
        #: waits, so that the appends fail in the order they were made
        self._failing = False
        self._producer: Any = None
        self._snapshots: Any = None
        owner = f"{OWNER_PREFIX}{self.name.local}-{partition}"
        with map_errors(f"take ownership of {self.where}"):
            data_topic = backend.data_topic(topic, partition)
            backend.ensure_deduplication(self.name, data_topic)
            snapshot_topic = backend.ensure_topic(self.name._replace(local=self.name.snapshot_local(partition)))
            try:
                self._producer = backend.open_owner(data_topic, owner, batching=True)
                self._snapshots = backend.open_owner(snapshot_topic, owner, batching=False)
                # the broker remembers the first id of the last entry: continue above it; the
                # sync API treats 0 as "unset", so never send 0
                last = int(self._producer.last_sequence_id())
                self._next_sequence = max(last + 1, 1)
                if unsettled is not None:
                    self._settle(unsettled, last, data_topic, owner)
                #: an offset at or before the next entry: after the last one answered
                self._floor = backend._end(data_topic)
            except BaseException:
                self._close_producers()
                raise
        #: what this writer left in doubt when it failed (see Unsettled)
        self.unsettled: Unsettled | None = None
        self._thread = threading.Thread(target=self._run, name=f"idempotent-pulsar-{topic}-{partition}", daemon=True)
        self._thread.start()

    def _settle(self, unsettled: Unsettled, last: int, data_topic: str, owner: str) -> None:
        """Check what Pulsar stored of the entries a failed writer left in doubt. Holding the
        partition (the failed writer's sends are settled), ``last`` (``last_sequence_id()``)
        says which of them are stored, if the stored ones are a prefix: every entry up to the
        last stored one. A later entry stored while an earlier one is not (Pulsar refused
        one entry and stored the next) would let the replay answer the missing batches'
        resends as duplicates: the owner's messages after ``unsettled.floor`` are counted
        instead of trusted.

        Raises:
            CorruptDataError: the stored ones are not a prefix.
            ProducerError: Pulsar could not be read (translated).
        """
        expected = sum(count for first_id, count in unsettled.entries if first_id <= last)
        if not expected:
            return
        found = sum(
            1
            for message in self.backend._read(data_topic, start_id(unsettled.floor))
            if message.producer_name() == owner
        )
        if found != expected:
            raise CorruptDataError(
                f"pulsar: {self.where}: of the entries a failed writer left in doubt, Pulsar stored a later one "
                f"while an earlier one is missing ({found} of the {expected} messages up to sequence id {last} "
                f"found after offset {unsettled.floor}); the missing batches would be taken for duplicates"
            )

    @property
    def failed(self) -> ProducerError | None:
        return self.lost or self.broken

    def submit(self, batch: AppendBatch | None, snapshot: Snapshot | None) -> Future[int]:
        future: Future[int] = LightFuture()
        item = _Item(batch, snapshot, future)
        if batch is not None:
            try:
                self._encode(item)
            except Exception as exc:  # records are bytes and str: a failure here is a bug
                failure = internal_error(f"pulsar: encoding a batch of {self.where}", exc, _LOG)
                with self._cond:  # and nothing submitted after it may be
                    self.broken = self.broken or failure
                future.set_exception(failure)
                return future
        with self._cond:
            error = self.failed
            if error is not None and not self.is_writer_thread():
                while self._failing:  # the earlier appends are answered first
                    self._cond.wait()
            if error is None and self._closed:
                error = BackendUnavailableError("pulsar backend is closed")
            if error is None:
                self._queue.append(item)
                self._cond.notify()
        if error is not None:
            future.set_exception(error)
        return future

    def _encode(self, item: _Item) -> None:
        batch = item.batch
        assert batch is not None
        header = batch.header
        records = batch.records
        count = len(records)
        event_time = round(batch.timestamp * 1000)
        messages = item.messages
        pid = epoch = ""
        base = 0
        if header is not None:  # per batch, not per record
            pid, epoch, base = str(header.producer_id), str(header.producer_epoch), header.base_sequence
        for i, record in enumerate(records):
            idem: dict[str, str] = {}
            if header is not None:
                idem = {"idem.pid": pid, "idem.epoch": epoch, "idem.seq": str(sequence_at(base, i))}
                if i == 0:
                    idem["idem.count"] = str(count)
            if record.key is None and not record.headers:  # what encode_record makes of it, directly
                messages.append(Message(record.value, idem, None, event_time))
            else:
                messages.append(encode_record(record, idem, event_time))
        item.size = sum(map(message_size, messages)) + 256

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.backend.timeout + 5)
        self._close_producers()

    def _close_producers(self) -> None:
        producers, self._producer, self._snapshots = (self._producer, self._snapshots), None, None
        if self.lost is not None:
            return  # fenced: the client has closed them already
        for producer in producers:
            if producer is not None:
                with contextlib.suppress(Exception):
                    producer.close()

    # -- the writer thread -----------------------------------------------------------------
    #
    # Entries are pipelined: up to MAX_IN_FLIGHT of them are sent (each closed with a flush
    # that does not wait) before the oldest is waited for, and they are answered in the
    # order sent. Failure order: the owner's sends go out on one connection in order, and
    # Pulsar stores a producer's entries in that order (the client resends its pending ones
    # in order after a reconnect). When one fails, the producers are closed (nothing the
    # client still holds is sent) and every entry after it fails too, sent or not (see
    # _fail). Pulsar may still have refused one entry and stored the next (a checksum
    # error refuses a single message): what was in flight is left as Unsettled, and the
    # writer replacing this one checks that a prefix of it was stored (see _settle).

    def _run(self) -> None:
        sent: deque[_Sent] = deque()
        taken: deque[_Item] = deque()  # taken from the queue, not sent yet
        group: list[_Item] = []  # being sent
        try:
            while True:
                with self._cond:
                    while not (
                        (sent and sent[0].answered)
                        or ((taken or self._queue) and len(sent) < MAX_IN_FLIGHT)
                        or (self._closed and not self._queue and not taken and not sent)
                    ):
                        if sent:  # the oldest entry's deadline
                            if not self._cond.wait(max(0.0, sent[0].deadline - time.monotonic())):
                                break  # no answer in time: _finish says so
                        else:
                            self._cond.wait()
                    if not sent and not taken and not self._queue:
                        return  # closed and drained
                    taken.extend(self._queue)
                    self._queue = []
                oldest = sent[0] if sent else None
                if oldest is not None and (
                    oldest.answered or len(sent) >= MAX_IN_FLIGHT or not taken or oldest.deadline <= time.monotonic()
                ):
                    self._finish(oldest)  # raises when it failed: still in ``sent``, failed below
                    sent.popleft()
                    continue
                group = self._take_entry(taken)
                sent.append(self._start(group))
                group = []
        except ProducerError as exc:
            self._fail_sent(sent, [*group, *taken], exc)
        except Exception as exc:  # a bug: logged, FATAL (never retried)
            self._fail_sent(sent, [*group, *taken], internal_error(f"pulsar: appending to {self.where}", exc, _LOG))

    def _fail_sent(self, sent: deque[_Sent], taken: list[_Item], error: ProducerError) -> None:
        """Fail the entries sent and not answered, and the batches taken after them, keeping
        what the sent ones left in doubt for the writer that replaces this one."""
        doubtful = tuple((entry.first_id, entry.count) for entry in sent if entry.count and entry.refused is None)
        if doubtful:
            self.unsettled = Unsettled(self._floor, doubtful)
        self._fail([item for entry in sent for item in entry.items] + taken, error)

    def _take_entry(self, taken: deque[_Item]) -> list[_Item]:
        """The batches at the head of ``taken`` that fit into one entry together (at least one)."""
        size = records = 0
        group: list[_Item] = []
        while taken:
            item = taken[0]
            if group and (
                size + item.size > self.backend.max_entry_bytes or records + len(item.messages) > MAX_GROUP_RECORDS
            ):
                break
            size += item.size
            records += len(item.messages)
            group.append(taken.popleft())
        return group

    def _start(self, group: list[_Item]) -> _Sent:
        """Send a group of batches as one entry, without waiting for its answer. A group too
        large for one entry is not sent: it is answered, in its turn, with EntryTooLargeError
        (refused for good, nothing of it stored: it fails alone, the ones after it go on).

        Raises:
            ProducerError: the client refused a message (translated).
        """
        messages = [m for item in group for m in item.messages]
        entry = _Sent(group, len(messages), time.monotonic() + self.backend.timeout, self._next_sequence)
        size = sum(item.size for item in group)
        if not messages or size > self.backend.max_entry_bytes:  # snapshots only, or refused
            entry.answers = [(pulsar.Result.Ok, None), (pulsar.Result.Ok, None)]
            if messages:
                entry.refused = EntryTooLargeError(
                    f"pulsar: a batch of {self.where} needs about {size} bytes, more than one Pulsar entry holds "
                    f"(max_entry_bytes={self.backend.max_entry_bytes}, the broker's maxMessageSize)"
                )
            return entry
        count = len(messages)
        first, last = (
            (entry.answer(self._cond, 0, 1), None)
            if count == 1
            else (entry.answer(self._cond, 0), entry.answer(self._cond, 1))
        )
        send = self._producer._producer.send_async  # the extension's producer: no checks per call
        with map_errors(f"append to {self.where}"):
            for index, message in enumerate(messages):
                # A message between the entry's first and last gets no callback: the client
                # then runs no Python for it (a callback per message took the interpreter
                # lock once per record); one entry is stored or fails whole, and its first
                # and last positions say whether its batch indexes are consecutive. A
                # sequence id of 0 is left to the client, as pulsar-client's send_async does.
                built = build_message(message, self._next_sequence or None)
                send(built, first if index == 0 else last if index == count - 1 else None)
                self._next_sequence += 1
            close_entry(self._producer)
        return entry

    def _finish(self, entry: _Sent) -> None:
        """Wait for an entry's answer (until its deadline), write the newest snapshot of its
        group, and answer its batches with their offsets.

        Raises:
            BackendUnavailableError: not acknowledged in time, not stored as one entry with
                consecutive batch indexes, or stored by an earlier attempt (position unknown).
            ProducerError: Pulsar refused it (translated).
        """
        if entry.refused is not None:
            for item in entry.items:
                item.future.set_exception(entry.refused)
            return
        what = f"append to {self.where}"
        with self._cond:
            while not entry.answered and self._cond.wait(max(0.0, entry.deadline - time.monotonic())):
                pass
            head, tail = entry.answers
        if head is None or tail is None:
            raise BackendUnavailableError(f"pulsar: {what}: no acknowledgement within {self.backend.timeout} s")
        offsets = [-1] * len(entry.items)
        if entry.count:
            offsets = self._offsets(entry, head, tail, what)
        snapshots = [item.snapshot for item in entry.items if item.snapshot is not None]
        if snapshots:
            self.put_snapshot(snapshots[-1])
        for item, offset in zip(entry.items, offsets, strict=True):
            item.future.set_result(offset)

    def _offsets(self, entry: _Sent, head: tuple[Any, Any], tail: tuple[Any, Any], what: str) -> list[int]:
        """Each batch's base offset from the answers of its entry's first and last message."""
        for result, _ in (head, tail):
            if result != pulsar.Result.Ok:
                raise translate(result, what)
        first_id, last_id = head[1], tail[1]
        if first_id.ledger_id() < 0:  # Pulsar's dedup: stored before, position unknown
            raise BackendUnavailableError(f"pulsar: {what}: the entry was stored by an earlier attempt")
        ledger, number, base = first_id.ledger_id(), first_id.entry_id(), max(first_id.batch_index(), 0)
        end = (last_id.ledger_id(), last_id.entry_id(), max(last_id.batch_index(), 0))
        if end != (ledger, number, base + entry.count - 1):
            raise BackendUnavailableError(
                f"pulsar: the batch of {self.where} was not stored as one entry with consecutive batch indexes: "
                f"{(ledger, number, base)} .. {end}; check the producer's batching settings"
            )
        offsets = [-1] * len(entry.items)
        position = base
        for index, item in enumerate(entry.items):
            if item.messages:
                offsets[index] = encode_offset(ledger, number, position)
                position += len(item.messages)
        self._floor = encode_offset(ledger, number, position)
        return offsets

    def put_snapshot(self, snapshot: Snapshot) -> None:
        """Write a snapshot now (on the writer thread, or from a callback running on it)."""
        with map_errors(f"store the snapshot of {self.where}"):
            self._snapshots.send(
                pack_snapshot(snapshot),
                properties={"idem.topic": self.topic, "idem.partition": str(self.partition)},
            )

    def _fail(self, items: list[_Item], error: ProducerError) -> None:
        # Refuse new appends first, then stop the producers (nothing queued in the client may
        # be sent after a failure; Pulsar settles their pending writes before a new owner is
        # registered), then fail the failed group and everything queued behind it: nothing
        # after a failed append may be stored (the ordering contract of LogBackend.append).
        with self._cond:
            if isinstance(error, OwnershipLostError):
                self.lost = error
            else:
                self.broken = error
            queued, self._queue = self._queue, []
            self._failing = True
        try:
            self._close_producers()
            for item in [*items, *queued]:
                item.future.set_exception(error)
        finally:
            with self._cond:
                self._failing = False
                self._cond.notify_all()

    def is_writer_thread(self) -> bool:
        return threading.current_thread() is self._thread
