"""The writer of one Kafka partition: the transactional producer that owns it (a
:class:`~idempotent.adapters.kafka.txn.TransactionalProducer`, which resolves failed commits), with a
group-commit thread that stores every queued append in one transaction.

The first record of a batch (its head) carries the batch's identity headers; the others go to
Kafka in bulk (see :mod:`idempotent.adapters.kafka.heads`). Snapshots go into the same transaction as the
batch they accompany.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from idempotent.adapters.kafka.bulk import BulkWriter, bulk_columns, writer_for
from idempotent.adapters.kafka.heads import BatchHead, identity_headers, records_timed
from idempotent.adapters.work_queue import GroupQueue
from idempotent.backend import AppendBatch
from idempotent.core.records import Record, Snapshot
from idempotent.core.types import NO_PRODUCER_ID
from idempotent.errors import BackendUnavailableError, ProducerError, internal_error
from idempotent.runtime.future import LightFuture

try:
    from confluent_kafka import KafkaError, KafkaException

    from idempotent.adapters.kafka.errors import map_errors, refused_record, translate
    from idempotent.adapters.kafka.txn import TransactionalProducer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the kafka backend needs confluent-kafka: pip install 'idempotent[kafka]'") from exc

_LOG = logging.getLogger("idempotent.adapters.kafka")
#: records per ``produce_batch`` call of a partition writer
_BULK = 5000


class WriterHost(Protocol):
    """What a partition writer needs from its backend (:class:`idempotent.adapters.kafka.backend.KafkaBackend`)."""

    prefix: str
    client_config: dict[str, Any]
    timeout: float

    def note_written(self, kafka_topic: str, partition: int, end: int) -> None: ...

    def note_heads(self, kafka_topic: str, partition: int, heads: Iterable[BatchHead]) -> None: ...

    def produce_snapshot(self, producer: Any, topic: str, partition: int, snapshot: Snapshot) -> None: ...


class PartitionWriter(GroupQueue[tuple[AppendBatch | None, Snapshot | None, Future[int]]]):
    """The transactional producer that owns one partition (a :class:`TransactionalProducer`,
    which resolves failed commits), with a group-commit thread."""

    def __init__(self, backend: WriterHost, topic: str, partition: int, kafka_topic: str) -> None:
        super().__init__()
        self.backend = backend
        self.topic = topic
        self.partition = partition
        self.kafka_topic = kafka_topic
        # Kafka's coordinator aborts (and fences) a transaction still open after this; a
        # client_config may choose another
        config: dict[str, Any] = {"transaction.timeout.ms": 60_000, **backend.client_config}
        config.update(
            {
                "transactional.id": f"{backend.prefix}idempotent-{self.kafka_topic}-{partition}",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
                # a group commit may queue many batches before commit_transaction flushes them
                "queue.buffering.max.messages": 1_000_000,
                "queue.buffering.max.kbytes": 1_048_576,
            }
        )
        self._bulk_writer: BulkWriter | None = None
        self._txn = TransactionalProducer(config, backend.timeout, f"{topic}[{partition}]")
        self._thread = threading.Thread(target=self._run, name=f"idempotent-kafka-{topic}-{partition}", daemon=True)
        self._thread.start()

    def submit(self, batch: AppendBatch | None, snapshot: Snapshot | None) -> Future[int]:
        future: Future[int] = LightFuture()
        with self._cond:
            if self.lost is not None:
                future.set_exception(self.lost)
            elif self._closed:
                future.set_exception(BackendUnavailableError("kafka backend is closed"))
            else:
                self._queue.append((batch, snapshot, future))
                self._cond.notify()
        return future

    @property
    def lost(self) -> ProducerError | None:
        """Set once a newer owner fenced this partition's producer: every later use raises it."""
        return self._txn.fenced

    def settle(self) -> None:
        """Make every earlier transaction's outcome final and readable before the partition
        is read for a rebuild (see :meth:`TransactionalProducer.settle`).

        Raises:
            OwnershipLostError: fenced by a newer owner.
            BackendUnavailableError: a commit is still in doubt or the producer could not be
                replaced yet; retry later.
        """
        self._txn.settle()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(self.backend.timeout)
        self._txn.close()

    def _run(self) -> None:
        while (items := self._take_group()) is not None:
            refused: list[Any] = [None] * len(items)  # a refusal of an item's head, from its report
            try:
                offsets = self._commit(items, refused)
            except ProducerError as exc:
                self._fail(items, exc, refused)
                continue
            except KafkaException as exc:  # mapped here, at the edge
                self._fail(
                    items,
                    translate(exc.args[0] if exc.args else exc, f"append to {self.topic}[{self.partition}]"),
                    refused,
                )
                continue
            except Exception as exc:  # a bug: logged, FATAL; the writer thread lives on
                self._fail(items, internal_error(f"kafka: committing to {self.topic}[{self.partition}]", exc, _LOG))
                continue
            self._note_committed(items, offsets)
            for (_, _, future), offset in zip(items, offsets, strict=True):
                future.set_result(offset)

    def _note_committed(
        self, items: list[tuple[AppendBatch | None, Snapshot | None, Future[int]]], offsets: list[int]
    ) -> None:
        """Tell the backend what a committed transaction wrote: reads wait for its end (its
        commit markers follow the commit's acknowledgement), and its batch heads are known."""
        end = max(
            (offset + len(batch.records) for (batch, _, _), offset in zip(items, offsets, strict=True) if batch),
            default=-1,
        )
        if end >= 0:
            self.backend.note_written(self.kafka_topic, self.partition, end)
        self.backend.note_heads(
            self.kafka_topic,
            self.partition,
            [
                BatchHead(
                    offset,
                    len(batch.records),
                    batch.header.producer_id if batch.header else NO_PRODUCER_ID,
                    batch.header.producer_epoch if batch.header else -1,
                    batch.header.base_sequence if batch.header else -1,
                    int(batch.timestamp * 1000) / 1000,
                    records_timed(batch.records),
                )
                for (batch, _, _), offset in zip(items, offsets, strict=True)
                if batch is not None and offset >= 0
            ],
        )

    def _commit(
        self, items: list[tuple[AppendBatch | None, Snapshot | None, Future[int]]], refused: list[Any]
    ) -> list[int]:
        """Store a group in one transaction; the first offset of each item's batch (-1 for a
        snapshot alone). A commit in doubt raises; if it turns out committed later, the
        group is noted as written then (``on_late_commit``), so reads wait for it. The
        report of an item whose head the broker refused is left in ``refused``."""
        first_offsets: list[list[int]] = [[] for _ in items]
        errors: list[KafkaError] = []

        def delivered(index: int) -> Callable[[Any, Any], None]:
            slot = first_offsets[index]

            def callback(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(err)
                    if refused_record(err):
                        refused[index] = err
                else:
                    slot.append(msg.offset())

            return callback

        def offsets() -> list[int]:
            return [min(slot) if slot else -1 for slot in first_offsets]

        def late() -> None:
            self._note_committed(items, offsets())

        with map_errors(f"append to {self.topic}[{self.partition}]"), self._txn.transaction(late) as producer:
            for index, (batch, snapshot, _) in enumerate(items):
                if snapshot is not None:
                    self.backend.produce_snapshot(producer, self.topic, self.partition, snapshot)
                if batch is None:
                    continue
                self._produce(producer, batch, delivered(index))
        if errors:
            raise translate(errors[0], f"deliver to {self.topic}[{self.partition}]", delivery=True)
        return offsets()

    def _produce(self, producer: Any, batch: AppendBatch, delivered: Callable[[Any, Any], None]) -> None:
        """Hand a batch's records to the open transaction, in order.

        The first record carries the batch's identity headers (``idem.pid``, ``idem.epoch``,
        ``idem.seq``, ``idem.count``; only ``idem.count`` for a batch without a producer,
        deduplication off) and the only delivery callback: the batch's offsets are
        consecutive, and a failure of any record fails ``commit_transaction``. The others
        carry only their own headers; runs of records without any go to Kafka with one
        ``produce_batch`` call per :data:`_BULK` records (see :mod:`idempotent.adapters.kafka.heads`).

        Raises:
            BackendUnavailableError: librdkafka refused part of a bulk call other than at its
                end (nothing of the transaction may be committed then).
        """
        records = batch.records
        header = batch.header
        first = records[0]
        timestamp = int(batch.timestamp * 1000)
        timed = records_timed(records)
        identity = identity_headers(header, len(records), timed)
        self._produce_one(
            producer,
            first,
            [*first.headers, *identity] if first.headers else identity,
            timestamp if first.timestamp is None else first.timestamp,
            delivered,
        )
        for start in range(1, len(records), _BULK):
            chunk = records[start : start + _BULK]
            columns = None if timed else bulk_columns(chunk)  # the bulk calls take no time or headers
            if columns is None:
                self._produce_each(producer, chunk, timestamp)
            else:
                self._produce_bulk(producer, *columns)
            producer.poll(0)  # serve queued delivery reports and log lines

    def _produce_each(self, producer: Any, records: Sequence[Record], timestamp: int) -> None:
        """``produce`` records one by one (a time or headers of their own: the bulk call
        takes neither), the record's time or else ``timestamp``; waits while librdkafka's
        local queue is full."""
        produce, topic, partition = producer.produce, self.kafka_topic, self.partition
        for record in records:
            own = timestamp if record.timestamp is None else record.timestamp
            headers = list(record.headers) or None
            try:
                # by position (topic, value, key, partition, on_delivery, callback, timestamp,
                # headers): 0.96 against 1.35 µs a call by keyword, in a copy's hot loop
                produce(topic, record.value, record.key, partition, None, None, own, headers)
            except BufferError:  # the client's local queue is full: wait for room there
                self._produce_one(producer, record, headers, own, None)

    def _produce_one(
        self, producer: Any, record: Record, headers: list[tuple[str, bytes]] | None, timestamp: int, delivered: Any
    ) -> None:
        """``produce`` one record; waits while librdkafka's local queue is full."""
        while True:
            try:
                producer.produce(
                    self.kafka_topic,
                    value=record.value,
                    key=record.key,
                    partition=self.partition,
                    headers=headers,
                    timestamp=timestamp,
                    on_delivery=delivered,
                )
                return
            except BufferError:  # the client's local queue is full: let it drain, then go on
                producer.poll(0.05)

    def _produce_bulk(self, producer: Any, values: list[Any], keys: list[Any] | None) -> None:
        """Queue values and keys in bulk (no headers, and no timestamp, which the bulk call
        cannot set: they are read back with their head's; see :mod:`idempotent.adapters.kafka.bulk`).
        librdkafka queues a prefix of them when its local queue fills up; the rest are queued
        again once it has drained."""
        bulk = self._bulk_writer = writer_for(self._bulk_writer, producer)
        while values:
            queued, refused = bulk.produce(self.kafka_topic, self.partition, values, keys)
            if not refused:
                return
            if refused != "_QUEUE_FULL":  # not just a full queue at the end: the records may be out of order
                raise BackendUnavailableError(
                    f"kafka: the client refused {len(values) - queued} of {len(values)} records for "
                    f"{self.topic}[{self.partition}]: {refused}"
                )
            values = values[queued:]
            keys = None if keys is None else keys[queued:]
            producer.poll(0.05)

    def _fail(
        self,
        items: list[tuple[AppendBatch | None, Snapshot | None, Future[int]]],
        error: ProducerError,
        refused: Sequence[Any] = (),
    ) -> None:
        # Fail the failed transaction's appends first: their callbacks mark the partition
        # failed in the broker. Then fail everything queued behind them (the ordering
        # contract of LogBackend.append): nothing after a failed append may be stored. A
        # batch whose head the broker refused fails for good (InvalidBatchError: its resend
        # would be refused alike), the others with ``error``.
        where = f"append to {self.topic}[{self.partition}]"
        for index, (_, _, future) in enumerate(items):
            own = refused[index] if index < len(refused) else None
            future.set_exception(error if own is None else translate(own, where, delivery=True))
        with self._cond:
            queued, self._queue = self._queue, []
        for _, _, future in queued:
            future.set_exception(error)
