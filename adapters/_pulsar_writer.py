"""The writer of one Pulsar partition: the exclusive producer that owns it (and its snapshot
topic), with a thread that writes queued batches in order, several at a time as one entry."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Protocol

import attrs

from adapters._meta import pack_snapshot
from adapters._pulsar_errors import map_errors, translate
from adapters._pulsar_messages import Message, build_message, encode_record, message_size
from adapters._pulsar_names import PulsarName, encode_offset, pulsar_topic_name
from adapters._writer import GroupQueue
from idempotent._records import Snapshot
from idempotent._sequence import sequence_at
from idempotent.backend import AppendBatch
from idempotent.errors import (
    BackendUnavailableError,
    EntryTooLargeError,
    InvalidBatchError,
    OwnershipLostError,
    ProducerError,
    internal_error,
)

try:
    import pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")
OWNER_PREFIX = "idempotent-owner-"
MAX_GROUP_RECORDS = 100_000  # records of several queued batches sent as one entry


class WriterHost(Protocol):
    """What a partition writer needs from its backend (:class:`adapters.pulsar.PulsarBackend`)."""

    timeout: float
    max_entry_bytes: int

    def data_topic(self, topic: str, partition: int) -> str: ...

    def ensure_deduplication(self, name: PulsarName, data_topic: str) -> None: ...

    def ensure_topic(self, name: PulsarName) -> str: ...

    def open_owner(self, topic: str, name: str, *, batching: bool) -> Any: ...


@attrs.define
class _Item:
    batch: AppendBatch | None
    snapshot: Snapshot | None
    future: Future[int]
    messages: list[Message] = attrs.field(factory=list)
    size: int = 0


class PartitionWriter(GroupQueue[_Item]):
    """The exclusive producer that owns one partition (and its snapshot topic), with a thread
    that writes queued batches in order, several at a time as one entry."""

    def __init__(self, backend: WriterHost, topic: str, partition: int) -> None:
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
            except BaseException:
                self._close_producers()
                raise
            # the broker remembers the first id of the last entry: continue above it; the
            # sync API treats 0 as "unset", so never send 0
            self._next_sequence = max(int(self._producer.last_sequence_id()) + 1, 1)
        self._thread = threading.Thread(target=self._run, name=f"idempotent-pulsar-{topic}-{partition}", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> ProducerError | None:
        return self.lost or self.broken

    def submit(self, batch: AppendBatch | None, snapshot: Snapshot | None) -> Future[int]:
        future: Future[int] = Future()
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
        count = len(batch.records)
        event_time = round(batch.timestamp * 1000)
        for i, record in enumerate(batch.records):
            idem: dict[str, str] = {}
            if header is not None:
                idem = {
                    "idem.pid": str(header.producer_id),
                    "idem.epoch": str(header.producer_epoch),
                    "idem.seq": str(sequence_at(header.base_sequence, i)),
                }
                if i == 0:
                    idem["idem.count"] = str(count)
            item.messages.append(encode_record(record, idem, event_time))
        item.size = sum(message_size(m) for m in item.messages) + 256

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

    def _run(self) -> None:
        while (items := self._take_group()) is not None:
            start = 0
            while start < len(items):
                end = self._group_end(items, start)
                group = items[start:end]
                try:
                    offsets = self._write(group)
                except InvalidBatchError as exc:  # refused for good, nothing of it stored:
                    for item in group:  # it fails alone, the ones after it go on
                        item.future.set_exception(exc)
                    start = end
                    continue
                except ProducerError as exc:
                    self._fail(items[start:], exc)
                    return
                except Exception as exc:  # a bug: logged, FATAL (never retried)
                    self._fail(items[start:], internal_error(f"pulsar: appending to {self.where}", exc, _LOG))
                    return
                for item, offset in zip(group, offsets, strict=True):
                    item.future.set_result(offset)
                start = end

    def _group_end(self, items: list[_Item], start: int) -> int:
        """Queued batches from ``start`` on that fit into one entry together."""
        size = records = 0
        end = start
        while end < len(items):
            item = items[end]
            if end > start and (
                size + item.size > self.backend.max_entry_bytes or records + len(item.messages) > MAX_GROUP_RECORDS
            ):
                break
            size += item.size
            records += len(item.messages)
            end += 1
        return end

    def _write(self, group: list[_Item]) -> list[int]:
        """Send a group of batches as one entry, then its newest snapshot. Offsets per item."""
        messages = [m for item in group for m in item.messages]
        offsets = [-1] * len(group)
        if messages:
            size = sum(item.size for item in group)
            if size > self.backend.max_entry_bytes:
                raise EntryTooLargeError(
                    f"pulsar: a batch of {self.where} needs about {size} bytes, more than one Pulsar entry holds "
                    f"(max_entry_bytes={self.backend.max_entry_bytes}, the broker's maxMessageSize)"
                )
            ids = self._send_entry(messages)
            position = 0
            for index, item in enumerate(group):
                if item.messages:
                    offsets[index] = encode_offset(*ids[position])
                    position += len(item.messages)
        snapshots = [item.snapshot for item in group if item.snapshot is not None]
        if snapshots:
            self.put_snapshot(snapshots[-1])
        return offsets

    def _send_entry(self, messages: list[Message]) -> list[tuple[int, int, int]]:
        """Send ``messages`` as one entry and wait for it: each message's ``(ledger, entry,
        batch index)``. Only the first and the last message get a callback: a message between
        them gets None, so the client runs no Python for it (a callback per message took the
        interpreter lock once per record); one entry is stored or fails whole, and its first
        and last positions say whether its batch indexes are consecutive.

        Raises:
            BackendUnavailableError: not acknowledged in time, not stored as one entry with
                consecutive batch indexes, or stored by an earlier attempt (position unknown).
            ProducerError: Pulsar refused it (translated).
        """
        count = len(messages)
        answers: list[tuple[Any, Any] | None] = [None, None]
        done = threading.Condition()

        def answer(*slots: int) -> Any:
            def callback(result: Any, message_id: Any) -> None:
                try:  # an exception escaping a pulsar callback terminates the process
                    with done:
                        for slot in slots:
                            answers[slot] = (result, message_id)
                        done.notify_all()
                except BaseException:  # pragma: no cover - defensive
                    _LOG.exception("pulsar send callback failed")

            return callback

        first, last = (answer(0, 1), None) if count == 1 else (answer(0), answer(1))
        what = f"append to {self.where}"
        send = self._producer._producer.send_async  # the extension's producer: no checks per call
        with map_errors(what):
            for index, message in enumerate(messages):
                # a sequence id of 0 is left to the client, as pulsar-client's send_async does
                built = build_message(message, self._next_sequence or None)
                send(built, first if index == 0 else last if index == count - 1 else None)
                self._next_sequence += 1
            self._producer.flush()
        deadline = time.monotonic() + self.backend.timeout
        with done:
            while None in answers and done.wait(max(0.0, deadline - time.monotonic())):
                pass
            head, tail = answers
        if head is None or tail is None:
            raise BackendUnavailableError(f"pulsar: {what}: no acknowledgement within {self.backend.timeout} s")
        for result, _ in (head, tail):
            if result != pulsar.Result.Ok:
                raise translate(result, what)
        first_id, last_id = head[1], tail[1]
        if first_id.ledger_id() < 0:  # Pulsar's dedup: stored before, position unknown
            raise BackendUnavailableError(f"pulsar: {what}: the entry was stored by an earlier attempt")
        ledger, entry, base = first_id.ledger_id(), first_id.entry_id(), max(first_id.batch_index(), 0)
        end = (last_id.ledger_id(), last_id.entry_id(), max(last_id.batch_index(), 0))
        if end != (ledger, entry, base + count - 1):
            raise BackendUnavailableError(
                f"pulsar: the batch of {self.where} was not stored as one entry with consecutive batch indexes: "
                f"{(ledger, entry, base)} .. {end}; check the producer's batching settings"
            )
        return [(ledger, entry, base + i) for i in range(count)]

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
        self._close_producers()
        for item in [*items, *queued]:
            item.future.set_exception(error)

    def is_writer_thread(self) -> bool:
        return threading.current_thread() is self._thread
