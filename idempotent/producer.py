"""The producer: a thin threaded shell around the pure :class:`ProducerSequencer`.

``send`` queues a record and returns a :class:`concurrent.futures.Future`; a sender thread
drains batches from the sequencer, submits them to the broker (pipelined, up to
``max_in_flight`` per partition), feeds the answers back, and resolves the futures.
"""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

import tenacity

from ._outcomes import DeliveryStatus, ProduceResult, RecordMetadata
from ._records import Record
from ._sequencer import BatchDelivered, BatchFailed, Event, OutgoingBatch, ProducerSequencer
from ._types import DEFAULT_MAX_IN_FLIGHT
from .api import BrokerAPI
from .broker import ProducerSession
from .errors import (
    BackendUnavailableError,
    ConfigError,
    DeliveryFailed,
    ProducerClosedError,
    ProducerError,
    QueueFullError,
    UsageError,
)


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, ProducerError) and exc.retriable


def default_partition(key: bytes | None, partitions: int, counter: int) -> int:
    """Kafka-style default partitioning: CRC32 of the key, or round robin without a key."""
    if key is None:
        return counter % partitions
    return zlib.crc32(key) % partitions


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
        **connect_options: Any,
    ) -> None:
        from . import connect

        if max_buffered_records < 1:
            raise ConfigError("max_buffered_records must be positive")
        self._owns_broker = isinstance(url_or_broker, str)
        self._broker = connect(url_or_broker, **connect_options) if isinstance(url_or_broker, str) else url_or_broker
        if not isinstance(self._broker, BrokerAPI):
            raise ConfigError(f"expected a URL or a broker, got {type(url_or_broker).__name__}")
        try:
            self._session = self._init(producer_name, init_timeout_ms / 1000)
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
        self._futures: dict[int, Future[RecordMetadata]] = {}
        self._partitions: dict[str, int] = {}
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
        raise AssertionError("unreachable")  # pragma: no cover

    # -- identity --------------------------------------------------------------------------

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
        """Highest sequence known persisted on the partition (from init or acks), or -1."""
        with self._cond:
            return self._seq.last_acknowledged(topic, partition)

    def partitions_for(self, topic: str) -> int:
        """Partition count of ``topic`` (created with the broker's default if unknown)."""
        count = self._partitions.get(topic)
        if count is None:
            count = self._partitions[topic] = self._broker.partitions_for(topic)
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
            sequence: an application-chosen sequence for the record (for example its offset
                in a replayable source), ``0 .. 2**31-1``. Consecutive sequences share a
                batch. Under the broker's ``monotonic`` policy any increase is accepted; under
                ``strict`` a jump fails the producer with SequenceDesyncError. A sequence at or
                below the partition's stored one resolves as a duplicate
                (``RecordMetadata.duplicate``). None numbers the record after the previous one.

        Returns:
            A future resolving to :class:`RecordMetadata`, or failing with
            :class:`~idempotent.errors.DeliveryFailed` (whose ``status`` says whether the
            record may have been persisted).

        Raises:
            UsageError: bad argument types, unknown partition, invalid ``sequence`` (nothing
                queued).
            QueueFullError: ``max_buffered_records`` unfinished records; flush first.
            ProducerClosedError: the producer is closed.
            ProducerError: the producer failed earlier (fenced, unknown producer, ...).
        """
        try:
            record = Record(value, key, headers)
        except TypeError as exc:
            raise UsageError(str(exc)) from None
        count = self.partitions_for(topic)
        if partition is None:
            partition = default_partition(record.key, count, next(self._counter))
        elif not isinstance(partition, int) or not 0 <= partition < count:
            raise UsageError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition!r}")
        future: Future[RecordMetadata] = Future()
        with self._cond:
            if self._closing:
                raise ProducerClosedError("producer is closed")
            if self._seq.unfinished >= self._max_buffered:
                raise QueueFullError(f"{self._seq.unfinished} records are waiting; flush() or slow down")
            handle = self._seq.add(topic, partition, record, time.monotonic(), sequence)
            self._futures[handle] = future
            if self._seq.wakeup:  # only a new or sealed batch moves the sender's next deadline
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
                while self._seq.unfinished or self._futures:
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
                    if self._closing and not self._futures:
                        return
                    deadline = self._seq.next_deadline()
                    wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
                    if wait > 0:
                        self._cond.wait(wait)
                    continue
            self._complete(events)
            for batch in batches:
                self._submit(batch)

    def _drain_events(self) -> list[tuple[Event, list[Future[RecordMetadata]]]]:
        out = []
        while (event := self._seq.next_event()) is not None:
            out.append((event, [self._futures.pop(h) for h in event.batch.handles if h in self._futures]))
        if out:
            self._cond.notify_all()
        return out

    @staticmethod
    def _complete(events: list[tuple[Event, list[Future[RecordMetadata]]]]) -> None:
        for event, futures in events:
            batch = event.batch
            if isinstance(event, BatchDelivered):
                for i, future in enumerate(futures):
                    future.set_result(
                        RecordMetadata(
                            batch.topic,
                            batch.partition,
                            None if event.base_offset is None else event.base_offset + i,
                            (batch.base_sequence + i) % 2**31,
                            event.duplicate,
                        )
                    )
            else:
                assert isinstance(event, BatchFailed)
                for i, future in enumerate(futures):
                    sequence = (batch.base_sequence + i) % 2**31 if batch.base_sequence >= 0 else -1
                    failure = DeliveryFailed(
                        f"{batch.topic}[{batch.partition}]: {event.status.value}: {event.error}",
                        event.status,
                        event.error.recovery,
                        batch.topic,
                        batch.partition,
                        sequence,
                    )
                    failure.__cause__ = event.error
                    future.set_exception(failure)

    def _submit(self, batch: OutgoingBatch) -> None:
        batch_id, attempt = batch.batch_id, batch.attempt
        try:
            answer = self._broker.submit_produce(
                batch.topic,
                batch.partition,
                self._session.producer_id,
                self._session.producer_epoch,
                batch.base_sequence,
                batch.records,
            )
        except ProducerError as exc:
            self._answered(batch_id, attempt, None, exc)
            return
        except Exception as exc:  # never let the sender thread die on an unexpected error
            self._answered(batch_id, attempt, None, BackendUnavailableError(f"produce failed: {exc!r}"))
            return
        answer.add_done_callback(lambda f: self._answered(batch_id, attempt, f, None))

    def _answered(
        self, batch_id: int, attempt: int, answer: Future[ProduceResult] | None, error: ProducerError | None
    ) -> None:
        if answer is not None:
            exc = answer.exception()
            if exc is not None:
                error = exc if isinstance(exc, ProducerError) else BackendUnavailableError(repr(exc))
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


__all__ = ["DeliveryStatus", "Producer", "default_partition"]
