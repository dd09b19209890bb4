"""The producer: a thin threaded shell around the pure :class:`ProducerSequencer`.

``send`` queues a record and returns a :class:`concurrent.futures.Future`; ``send_many``
queues many and returns one :class:`SendManyFuture` for all of them. A sender thread drains
batches from the sequencer, submits them to the broker (pipelined, up to ``max_in_flight`` per
partition), feeds the answers back, and resolves the futures, one batch at a time: a batch
knows whose records it holds as spans ``(owner, start, count)``, not record by record.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as SequenceOf
from concurrent.futures import Future
from concurrent.futures._base import FINISHED as _FINISHED
from concurrent.futures._base import PENDING as _PENDING
from typing import Any, overload

import tenacity

from ._outcomes import DeliveryStatus, ProduceResult, RecordMetadata
from ._records import Record, RecordColumns, as_record, record_sizes, value_record
from ._request import ProduceRequest
from ._sequence import sequence_at
from ._sequencer import BatchDelivered, BatchFailed, Event, OutgoingBatch, ProducerSequencer, sequences_for
from ._topics import canonical_topic
from ._types import DEFAULT_MAX_IN_FLIGHT
from .api import BrokerAPI
from .broker import ProducerSession
from .errors import (
    ConfigError,
    DeliveryFailed,
    InternalError,
    InvalidBatchError,
    ProducerClosedError,
    ProducerError,
    QueueFullError,
    UsageError,
    internal_error,
)

_LOGGER = logging.getLogger("concurrent.futures")
_LOG = logging.getLogger("idempotent.producer")


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, ProducerError) and exc.retriable


def default_partition(key: bytes | None, partitions: int, counter: int) -> int:
    """Kafka-style default partitioning: CRC32 of the key, or round robin without a key."""
    if key is None:
        return counter % partitions
    return zlib.crc32(key) % partitions


#: One run of consecutive records of a ``send_many`` call that ended the same way:
#: ``(part, start, count, topic, partition, base_offset, base_sequence, duplicate, failure)``
#: where ``part`` maps positions to the call's indices (None: the call itself), ``base_offset``
#: and ``base_sequence`` belong to the record at ``start``, and ``failure`` is
#: ``(error, status)`` for records that failed, else None.
_Segment = tuple["_Part", int, int, str, int, "int | None", int, bool, "tuple[ProducerError, DeliveryStatus] | None"]


class Deliveries(SequenceOf["RecordMetadata | DeliveryFailed"]):
    """How every record of one :meth:`Producer.send_many` call ended, in the call's order.

    Item ``i`` is the :class:`RecordMetadata` of record ``i`` when it was persisted (or found
    a duplicate), or the :class:`~idempotent.errors.DeliveryFailed` it ended with. Items are
    built when read: the producer keeps one entry per batch, not per record.
    """

    def __init__(self, count: int, segments: list[_Segment]) -> None:
        self._count = count
        self._segments = segments
        self._segment_of: array[int] | None = None
        self._position: array[int] | None = None
        #: how many records failed
        self.failed = sum(seg[2] for seg in segments if seg[8] is not None)
        #: how many records the broker recognised as already stored
        self.duplicates = sum(seg[2] for seg in segments if seg[7] and seg[8] is None)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> RecordMetadata | DeliveryFailed: ...
    @overload
    def __getitem__(self, index: slice) -> list[RecordMetadata | DeliveryFailed]: ...
    def __getitem__(
        self, index: int | slice
    ) -> RecordMetadata | DeliveryFailed | list[RecordMetadata | DeliveryFailed]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("Deliveries index out of range")
        if self._segment_of is None:
            self._index()
        assert self._segment_of is not None and self._position is not None
        _, start, _, topic, partition, base_offset, base_sequence, duplicate, failure = self._segments[
            self._segment_of[index]
        ]
        k = self._position[index] - start
        if failure is None:
            offset = None if base_offset is None else base_offset + k
            return RecordMetadata(topic, partition, offset, sequence_at(base_sequence, k), duplicate)
        error, status = failure
        sequence = sequence_at(base_sequence, k) if base_sequence >= 0 else -1
        return _failed(error, status, topic, partition, sequence)

    def _index(self) -> None:
        segment_of = array("q", bytes(8 * self._count))
        position = array("q", bytes(8 * self._count))
        for number, (part, start, count, *_) in enumerate(self._segments):
            indices = part.indices
            if indices is None:
                segment_of[start : start + count] = array("q", [number]) * count
                position[start : start + count] = array("q", range(start, start + count))
            else:
                for p in range(start, start + count):
                    segment_of[indices[p]] = number
                    position[indices[p]] = p
        self._segment_of, self._position = segment_of, position

    def failures(self) -> list[tuple[int, DeliveryFailed]]:
        """``(index, failure)`` for every record that failed, in the call's order."""
        out = [(i, item) for i, item in enumerate(self) if isinstance(item, DeliveryFailed)] if self.failed else []
        return out


def _failed(error: ProducerError, status: DeliveryStatus, topic: str, partition: int, sequence: int) -> DeliveryFailed:
    failure = DeliveryFailed(
        f"{topic}[{partition}]: {status.value}: {error}", status, error.recovery, topic, partition, sequence
    )
    failure.__cause__ = error
    return failure


#: Guards the state and the callback list of every :class:`_RecordFuture` (a few
#: instructions each time): one lock for all of them instead of one Condition per record.
_RECORD_FUTURES = threading.Lock()


class _RecordFuture(Future[RecordMetadata]):
    """The future ``send`` returns: a :class:`concurrent.futures.Future` that allocates its
    Condition and waiter list only when someone blocks on it (``result`` or ``exception``
    before it is done, ``wait``, ``as_completed``).

    The sender completes most futures before anyone waits on them (a loop of ``send`` calls
    followed by ``flush``, or a callback per record); those never build a
    ``threading.Condition``, which was the largest cost per record. The state and the
    callback list change under one module-wide lock; ``set_result`` takes the future's own
    Condition only when a waiter has made one, and a waiter makes it before it reads the
    state, so either it sees the result or the setter sees its Condition and notifies it.

    It cannot be cancelled: the record is on its way, and a cancelled future could not take
    the record's outcome.
    """

    def __init__(self) -> None:  # no super().__init__(): that makes the Condition and lists
        self._state = _PENDING
        self._result: RecordMetadata | None = None
        self._exception: BaseException | None = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        lock: threading.Condition | None = self.__dict__.get("_lock")
        if lock is None:  # two threads may race here: setdefault keeps one Condition
            lock = self.__dict__.setdefault("_lock", threading.Condition())
        return lock

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        waiters: list[Any] = self.__dict__.setdefault("_waiter_list", [])
        return waiters

    @property
    def _done_callbacks(self) -> list[Any]:
        callbacks: list[Any] = self.__dict__.setdefault("_callback_list", [])
        return callbacks

    def cancel(self) -> bool:
        return False

    def done(self) -> bool:
        return self._state == _FINISHED

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if self._state == _FINISHED and self._exception is None:
            return self._result  # type: ignore[return-value]
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == _FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[RecordMetadata]], object]) -> None:
        with _RECORD_FUTURES:
            if self._state != _FINISHED:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:  # as concurrent.futures does: a callback's error is logged, not raised
            _LOGGER.exception("exception calling callback for %r", self)

    def set_result(self, result: RecordMetadata) -> None:
        """Called once, by the sender thread."""
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        """Called once, by the sender thread."""
        self._finish(None, exception)

    def _finish(self, result: RecordMetadata | None, exception: BaseException | None) -> None:
        attributes = self.__dict__
        if "_lock" not in attributes:
            with _RECORD_FUTURES:
                self._result, self._exception, self._state = result, exception, _FINISHED
            if "_lock" not in attributes:  # nobody blocks, and a later waiter sees the state
                if "_callback_list" in attributes:
                    self._invoke_callbacks()  # type: ignore[attr-defined]
                return
        with self._condition:
            with _RECORD_FUTURES:
                self._result, self._exception, self._state = result, exception, _FINISHED
            for waiter in self._waiters:
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            self._condition.notify_all()
        self._invoke_callbacks()  # type: ignore[attr-defined]


class SendManyFuture(Future[Deliveries]):
    """The future of one :meth:`Producer.send_many` call. It ends once every record has.

    :meth:`result` returns the :class:`Deliveries` when every record was persisted (or is a
    duplicate), and raises the first record's :class:`~idempotent.errors.DeliveryFailed`
    otherwise; :meth:`deliveries` returns them in both cases. It cannot be cancelled.
    """

    def cancel(self) -> bool:
        return False

    def __init__(self, count: int) -> None:
        super().__init__()
        self._remaining = count
        self._segments: list[_Segment] = []
        self._deliveries: Deliveries | None = None

    def deliveries(self, timeout: float | None = None) -> Deliveries:
        """Wait until every record has ended and say how each did.

        Raises:
            TimeoutError: ``timeout`` passed first (the records keep going).
        """
        self.exception(timeout)
        assert self._deliveries is not None
        return self._deliveries

    def _ended(self, segment: _Segment) -> None:
        """Called by the sender thread only: ``segment``'s records ended."""
        self._segments.append(segment)
        self._remaining -= segment[2]
        if self._remaining == 0:
            self._finish()

    def _finish(self) -> None:
        deliveries = self._deliveries = Deliveries(sum(seg[2] for seg in self._segments), self._segments)
        if not deliveries.failed:
            self.set_result(deliveries)
            return
        index, first = deliveries.failures()[0]
        failure = DeliveryFailed(
            f"{deliveries.failed} of {len(deliveries)} records failed; the first, record {index}: {first}",
            first.status,
            first.cause_recovery,
            first.topic,
            first.partition,
            first.sequence,
        )
        failure.__cause__ = first.__cause__
        self.set_exception(failure)


class _Part:
    """The owner of one partition's share of a ``send_many`` call in the sequencer's spans:
    ``indices[p]`` is the call's index of the share's record ``p`` (None: the same)."""

    __slots__ = ("future", "indices")

    def __init__(self, future: SendManyFuture, indices: list[int] | None) -> None:
        self.future = future
        self.indices = indices


class Producer:
    """Exactly-once producer. Thread-safe.

    Args:
        url_or_broker: a broker URL (``sqlite:///file.db``, ``memory://``, ...) or a
            :class:`~idempotent.broker.Broker`. A broker opened from a URL is closed with
            the producer.
        producer_name: stable name; a restarted producer with the same name fences the old
            instance and continues its sequences. None gives an anonymous producer.
        max_in_flight: pipelined batches per partition.
        linger_ms: how long a non-full batch waits for more records.
        batch_size: seal a batch at this many bytes.
        max_batch_records: seal a batch at this many records.
        request_timeout_ms: resend a batch that got no answer for this long.
        delivery_timeout_ms: fail a message not delivered within this long.
        max_buffered_records: ``send`` raises QueueFullError beyond this many unfinished.
        init_timeout_ms: how long to retry ``init_producer`` on retriable errors.
        metadata_max_age_ms: how long a topic's partition count is trusted before the broker
            is asked again (partitions added to a topic are used after at most this long).

    Raises:
        ConfigError: bad option or URL.
        ProducerError: initialisation failed (after retries for retriable errors).
    """

    def __init__(
        self,
        url_or_broker: str | BrokerAPI,
        producer_name: str | None = None,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        linger_ms: float = 5,
        batch_size: int = 1024 * 1024,
        max_batch_records: int = 10_000,
        request_timeout_ms: float = 30_000,
        delivery_timeout_ms: float = 120_000,
        max_buffered_records: int = 1_000_000,
        init_timeout_ms: float = 30_000,
        metadata_max_age_ms: float = 30_000,
        **connect_options: Any,
    ) -> None:
        from . import connect

        if max_buffered_records < 1:
            raise ConfigError("max_buffered_records must be positive")
        if not metadata_max_age_ms >= 0:
            raise ConfigError("metadata_max_age_ms must be 0 or more")
        self._metadata_max_age = metadata_max_age_ms / 1000
        self._owns_broker = isinstance(url_or_broker, str)
        self._broker = connect(url_or_broker, **connect_options) if isinstance(url_or_broker, str) else url_or_broker
        if not isinstance(self._broker, BrokerAPI):
            raise ConfigError(f"expected a URL or a broker, got {type(url_or_broker).__name__}")
        try:
            self._session = self._init(producer_name, init_timeout_ms / 1000)
            #: the broker's limits, learnt at init: larger records are refused at send()
            self._max_record_bytes = self._session.max_record_bytes
            if self._session.max_batch_bytes is not None:
                batch_size = min(batch_size, self._session.max_batch_bytes)
            self._seq = ProducerSequencer(
                self._session.producer_id,
                self._session.producer_epoch,
                self._session.last_sequences,
                max_in_flight=max_in_flight,
                batch_size=batch_size,
                max_batch_records=max_batch_records,
                linger=linger_ms / 1000,
                request_timeout=request_timeout_ms / 1000,
                delivery_timeout=delivery_timeout_ms / 1000,
            )
        except BaseException:
            if self._owns_broker:
                self._broker.close()
            raise
        self._max_buffered = max_buffered_records
        self._cond = threading.Condition()
        #: records whose batch ended but whose futures the sender has not resolved yet
        self._completing = 0
        #: topic -> (partition count, time.monotonic() when the broker said so)
        self._partitions: dict[str, tuple[int, float]] = {}
        self._counter = itertools.count()
        self._closing = False
        self._closed = False
        self._retrying = tenacity.Retrying()
        self._wait = tenacity.wait_exponential_jitter(multiplier=0.005, max=1.0, jitter=0.005)
        self._thread = threading.Thread(target=self._run, name="idempotent-sender", daemon=True)
        self._thread.start()

    def _init(self, producer_name: str | None, timeout: float) -> ProducerSession:
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retriable),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            stop=tenacity.stop_after_delay(timeout),
            reraise=True,
        ):
            with attempt:
                session = self._broker.init_producer(producer_name)
                if session.elsewhere:
                    tp = session.elsewhere[0]
                    raise ConfigError(
                        f"{producer_name!r} wrote to {tp[0]}[{tp[1]}], which another broker owns: "
                        "this broker cannot tell where its sequences continue; connect to every broker"
                    )
                return session
        raise InternalError("unreachable: the retry loop ended without a result")  # pragma: no cover

    # -- identity --------------------------------------------------------------------------

    @property
    def session_limits(self) -> tuple[int | None, int | None]:
        """The largest record and batch the broker takes, as it said at init (None: not told)."""
        return self._session.max_record_bytes, self._session.max_batch_bytes

    @property
    def producer_id(self) -> int:
        """The broker-assigned id."""
        return self._session.producer_id

    @property
    def producer_epoch(self) -> int:
        """The epoch of this instance (bumped on each start of a named producer)."""
        return self._session.producer_epoch

    @property
    def producer_name(self) -> str | None:
        """The stable name, or None for an anonymous producer."""
        return self._session.producer_name

    @property
    def failure(self) -> ProducerError | None:
        """The error that stopped this producer (fenced, timed out, closed, ...), or None
        while it can send."""
        with self._cond:
            return self._seq.failure

    @property
    def broker(self) -> BrokerAPI:
        """The broker this producer sends to."""
        return self._broker

    def last_sequence(self, topic: str, partition: int) -> int:
        """Highest sequence known persisted on the partition (from init or acks), or -1.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        topic = canonical_topic(topic)
        with self._cond:
            return self._seq.last_acknowledged(topic, partition)

    def partitions_for(self, topic: str) -> int:
        """Partition count of ``topic`` (created with the broker's default if unknown), as the
        broker said at most ``metadata_max_age_ms`` ago."""
        topic = canonical_topic(topic)
        known = self._partitions.get(topic)
        now = time.monotonic()
        if known is not None and now - known[1] < self._metadata_max_age:
            return known[0]
        count = self._broker.partitions_for(topic)
        self._partitions[topic] = (count, now)
        return count

    # -- sending ---------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        sequence: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queue a record for exactly-once delivery.

        Args:
            topic: any spelling of the topic :func:`idempotent._topics.canonical_topic` accepts
                (``orders``, ``persistent://public/default/orders``, ...); the record's
                metadata carries the stored name.
            sequence: an application-chosen sequence for the record (for example its offset
                in a replayable source), ``0 .. 2**63-1``. Consecutive sequences share a
                batch. Under the broker's ``monotonic`` policy any increase is accepted and
                sequences are compared as 64-bit integers, without wrap-around; under
                ``strict`` sequences are Kafka's int32 (``0 .. 2**31-1``, wrapping to 0), a
                jump of any size fails the producer with SequenceDesyncError and a sequence
                above ``2**31-1`` fails its batch with InvalidBatchError. A sequence at or
                below the partition's stored one resolves as a duplicate
                (``RecordMetadata.duplicate``). None numbers the record after the previous one.

        Returns:
            A future resolving to :class:`RecordMetadata`, or failing with
            :class:`~idempotent.errors.DeliveryFailed` (whose ``status`` says whether the
            record may have been persisted).

        Raises:
            UsageError: bad argument types, unknown partition, invalid ``sequence`` (nothing
                queued).
            InvalidBatchError: the record is larger than the broker takes (its
                ``max_record_bytes``, learnt at init, named in the message); nothing queued.
            QueueFullError: ``max_buffered_records`` unfinished records; flush first.
            ProducerClosedError: the producer is closed.
            ProducerError: the producer failed earlier (fenced, unknown producer, ...).
        """
        topic = canonical_topic(topic)
        try:
            if type(value) is bytes and key is None and headers is None:
                record = value_record(value)
            else:
                record = Record(value, key, headers)
        except TypeError as exc:
            raise UsageError(str(exc)) from None
        if self._max_record_bytes is not None and record.size > self._max_record_bytes:
            raise self._too_large(record)
        count = self.partitions_for(topic)
        if partition is None:
            partition = default_partition(record.key, count, next(self._counter))
        elif not isinstance(partition, int) or not 0 <= partition < count:
            raise UsageError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition!r}")
        future: Future[RecordMetadata] = _RecordFuture()
        with self._cond:
            if self._closing:
                raise ProducerClosedError("producer is closed")
            if self._seq.unfinished >= self._max_buffered:
                raise QueueFullError(f"{self._seq.unfinished} records are waiting; flush() or slow down")
            self._seq.add_one(topic, partition, record, time.monotonic(), sequence, future)
            if self._seq.wakeup:  # only a new or sealed batch moves the sender's next deadline
                self._seq.wakeup = False
                self._cond.notify_all()
        return future

    def send_many(
        self,
        topic: str,
        records: Iterable[Record | bytes | str | None],
        *,
        partition: int | None = None,
        sequence: int | SequenceOf[int] | None = None,
    ) -> SendManyFuture:
        """Queue many records for exactly-once delivery, with one future for all of them.

        The records are queued together (all or none) and batched as ``send`` would batch
        them, but the producer keeps track of them per batch, so this is the fast way to
        copy many records (a mirror, a Spark task, a file replay).

        Args:
            records: values (bytes, str or None) or :class:`Record` objects, which carry a
                key and headers; or a :class:`RecordColumns` (values and keys, no headers),
                which goes to the broker without a :class:`Record` object per record.
            partition: the partition of every record. None partitions each record by its
                key (as ``send``); the records without a key all go to one partition, picked
                round robin per call.
            sequence: None numbers the records after the previous ones of their partition. An
                int is the first record's sequence, the others following it. A sequence of
                ints gives one per record (as ``send(sequence=...)``: ``0 .. 2**63-1``,
                consecutive ones share a batch, a jump starts a new one).

        Returns:
            A :class:`SendManyFuture`: ``result()`` is the :class:`Deliveries` (each record's
            :class:`RecordMetadata`, in order) once all were persisted, or raises the first
            :class:`~idempotent.errors.DeliveryFailed`; ``deliveries()`` says how each
            record ended either way.

        Raises:
            UsageError: a record of the wrong type, an unknown partition, invalid sequences
                or as many sequences as records (nothing queued).
            InvalidBatchError: a record is larger than the broker takes (nothing queued).
            QueueFullError: ``max_buffered_records`` unfinished records; flush first (nothing
                queued). A call may take the buffer past the limit once.
            ProducerClosedError: the producer is closed.
            ProducerError: the producer failed earlier (fenced, unknown producer, ...).
        """
        topic = canonical_topic(topic)
        items: list[Record] | RecordColumns
        try:
            if type(records) is RecordColumns and (partition is not None or records.keys is None):
                items = RecordColumns.checked(records.values, records.keys)  # no Record per record
            else:
                items = [as_record(item) for item in records]
        except TypeError as exc:  # InvalidRecordError among them
            raise UsageError(str(exc)) from None
        sizes = record_sizes(items)
        limit = self._max_record_bytes
        if limit is not None and items and max(sizes) > limit:
            raise self._too_large(next(item for item, size in zip(items, sizes, strict=True) if size > limit))
        count = self.partitions_for(topic)
        future = SendManyFuture(len(items))
        if not items:
            future._finish()
            return future
        shares: list[tuple[int, SequenceOf[Record], int | SequenceOf[int] | None, _Part, list[int]]]
        if partition is not None:
            if not isinstance(partition, int) or not 0 <= partition < count:
                raise UsageError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition!r}")
            shares = [(partition, items, sequence, _Part(future, None), sizes)]
        else:
            sticky = next(self._counter) % count
            chosen = [sticky if r.key is None else zlib.crc32(r.key) % count for r in items]
            if all(p == chosen[0] for p in chosen):
                shares = [(chosen[0], items, sequence, _Part(future, None), sizes)]
            else:
                by_partition: dict[int, list[int]] = {}
                for i, p in enumerate(chosen):
                    by_partition.setdefault(p, []).append(i)
                sequences = sequences_for(len(items), sequence)
                shares = [
                    (
                        p,
                        [items[i] for i in indices],
                        None if sequences is None else [sequences[i] for i in indices],
                        _Part(future, indices),
                        [sizes[i] for i in indices],
                    )
                    for p, indices in by_partition.items()
                ]
        with self._cond:
            if self._closing:
                raise ProducerClosedError("producer is closed")
            if self._seq.unfinished >= self._max_buffered:
                raise QueueFullError(f"{self._seq.unfinished} records are waiting; flush() or slow down")
            now = time.monotonic()
            for share_partition, share, share_sequence, part, share_sizes in shares:
                self._seq.add_many(topic, share_partition, share, now, share_sequence, part, share_sizes)
            if self._seq.wakeup:
                self._seq.wakeup = False
                self._cond.notify_all()
        return future

    def flush(self, timeout: float | None = None) -> int:
        """Send everything queued and wait until every message has ended.

        Returns:
            How many messages are still unfinished (0 unless ``timeout`` ran out).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._seq.flush()
            self._cond.notify_all()
            try:
                while self._seq.unfinished or self._completing:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._cond.wait(remaining if remaining is not None else 0.5)
            finally:
                self._seq.end_flush()
            return self._seq.unfinished

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout``), fail whatever is left as closed, stop, and close the
        broker if this producer opened it."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._closing = True
                self._seq.close()
                self._cond.notify_all()
            self._thread.join(10)
            self._closed = True
            if self._owns_broker:
                self._broker.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sender thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                self._seq.handle_timeout(now)
                batches = self._seq.batches_to_send(now)
                events = self._drain_events()
                if not batches and not events:
                    if self._closing and not self._completing and not self._seq.unfinished:
                        return
                    deadline = self._seq.next_deadline()
                    wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
                    if wait > 0:
                        self._cond.wait(wait)
                    continue
            if events:
                self._complete(events)
                with self._cond:
                    self._completing -= sum(len(event.batch.records) for event in events)
                    self._cond.notify_all()
            for batch in batches:
                self._submit(batch)

    def _drain_events(self) -> list[Event]:
        out = []
        while (event := self._seq.next_event()) is not None:
            out.append(event)
            self._completing += len(event.batch.records)
        return out

    def _too_large(self, record: Record) -> InvalidBatchError:
        return InvalidBatchError(
            f"a record of {record.size} bytes (key, value and headers) exceeds the broker's "
            f"max_record_bytes={self._max_record_bytes}; nothing was queued"
        )

    @staticmethod
    def _complete(events: list[Event]) -> None:
        """Resolve the futures of ended batches: one pass over each batch's spans."""
        for event in events:
            batch = event.batch
            topic, partition, base_sequence = batch.topic, batch.partition, batch.base_sequence
            position = 0
            if isinstance(event, BatchDelivered):
                base_offset, duplicate = event.base_offset, event.duplicate
                for owner, start, count in batch.spans:
                    if type(owner) is _Part:
                        owner.future._ended(
                            (
                                owner,
                                start,
                                count,
                                topic,
                                partition,
                                None if base_offset is None else base_offset + position,
                                sequence_at(base_sequence, position),
                                duplicate,
                                None,
                            )
                        )
                    elif isinstance(owner, Future):
                        owner.set_result(
                            RecordMetadata(
                                topic,
                                partition,
                                None if base_offset is None else base_offset + position,
                                sequence_at(base_sequence, position),
                                duplicate,
                            )
                        )
                    position += count
            else:
                assert isinstance(event, BatchFailed)
                failure = (event.error, event.status)
                for owner, start, count in batch.spans:
                    sequence = sequence_at(base_sequence, position) if base_sequence >= 0 else -1
                    if type(owner) is _Part:
                        owner.future._ended((owner, start, count, topic, partition, None, sequence, False, failure))
                    elif isinstance(owner, Future):
                        owner.set_exception(_failed(event.error, event.status, topic, partition, sequence))
                    position += count

    def _submit(self, batch: OutgoingBatch) -> None:
        batch_id, attempt = batch.batch_id, batch.attempt
        try:
            request = ProduceRequest.build(
                batch.topic,
                batch.partition,
                self._session.producer_id,
                self._session.producer_epoch,
                batch.base_sequence,
                batch.records,
                batch.previous_sequence,
                measured=(batch.size, batch.largest),
            )
            answer = self._broker.submit_request(request)
        except ProducerError as exc:
            self._answered(batch_id, attempt, None, exc)
            return
        except Exception as exc:  # a bug: logged, FATAL (never retried); the sender thread lives on
            self._answered(batch_id, attempt, None, internal_error("submitting a batch", exc, _LOG))
            return
        answer.add_done_callback(lambda f: self._answered(batch_id, attempt, f, None))

    def _answered(
        self, batch_id: int, attempt: int, answer: Future[ProduceResult] | None, error: ProducerError | None
    ) -> None:
        if answer is not None:
            exc = answer.exception()
            if exc is not None:
                error = exc if isinstance(exc, ProducerError) else internal_error("producing a batch", exc, _LOG)
        now = time.monotonic()
        state = tenacity.RetryCallState(self._retrying, None, (), {})
        state.attempt_number = attempt
        retry_at = now + self._wait(state)
        with self._cond:
            if error is not None:
                self._seq.handle_error(batch_id, attempt, error, now, retry_at)
            else:
                assert answer is not None
                self._seq.handle_result(batch_id, attempt, answer.result(), now, retry_at)
            self._cond.notify_all()


__all__ = ["Deliveries", "DeliveryStatus", "Producer", "SendManyFuture", "default_partition"]
