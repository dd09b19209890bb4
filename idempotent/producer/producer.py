"""The producer: a thin threaded shell around the pure :class:`ProducerSequencer`.

``send`` appends a record to its partition's :class:`~idempotent.producer.delivery.RecordBuffer`
(columns of values, keys and, when given, headers, sequences and callbacks) under one lock and
returns a light :class:`~idempotent.producer.delivery.DeliveryFuture`, or nothing with ``on_delivery``;
no record object, future or metadata is made per record on the way. ``send_many`` queues many
records with one :class:`~idempotent.producer.delivery.SendManyFuture`. One sender thread takes each
partition's buffer whole when it is due (full, or ``linger`` after its first record, or on
``flush``) and its partition can take a batch, hands it to the sequencer, which cuts and
numbers batches, submits them to the broker (pipelined, up to ``max_in_flight`` per
partition), feeds the answers back, and records each batch's end once per span of a buffer
(``delivery.py``): outcomes are built per record only when a callback or a waiter asks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Sequence as SequenceOf
from typing import Any, cast, overload

from idempotent.api import BrokerAPI
from idempotent.core.batches import BatchDelivered, BatchFailed, Event
from idempotent.core.outcomes import DeliveryStatus
from idempotent.core.records import Headers, Record, RecordColumns, _headers, as_record, optional_bytes, record_sizes
from idempotent.core.sequencer import ProducerSequencer, sequences_for
from idempotent.core.topics import canonical_topic
from idempotent.core.types import DEFAULT_MAX_IN_FLIGHT
from idempotent.core.values import ProducerSession
from idempotent.errors import (
    ConfigError,
    InternalError,
    InvalidBatchError,
    InvalidRecordError,
    ProducerClosedError,
    ProducerError,
    QueueFullError,
    TransactionAbortableError,
    TransactionStateError,
    TransactionTimedOutError,
    UsageError,
)
from idempotent.producer.delivery import (
    Deliveries,
    DeliveryCallback,
    DeliveryFuture,
    Part,
    SendManyFuture,
)
from idempotent.producer.sender import YIELD_WAIT, Route, Sender

_LOG = logging.getLogger("idempotent.producer.producer")


#: no answers: the commit's broker answered every batch when it was written
_NONE: Mapping[tuple[str, int, int], tuple[int | None, bool]] = {}


def _answered(event: Event, answers: Mapping[tuple[str, int, int], tuple[int | None, bool]]) -> Event:
    """``event`` with the offset (and the duplicate flag) its batch got at the commit."""
    if not isinstance(event, BatchDelivered):
        return event
    batch = event.batch
    answer = answers.get((batch.topic, batch.partition, batch.base_sequence))
    return event if answer is None else BatchDelivered(batch, answer[0], answer[1])


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
            :class:`~idempotent.broker.broker.Broker`. A broker opened from a URL is closed with
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
        max_buffered_bytes: with a drop-in's ``DropInPort.add``, QueueFullError beyond this many bytes
            of keys and values unfinished (None: no bound).
        init_timeout_ms: how long to retry ``init_producer`` on retriable errors.
        metadata_max_age_ms: how long a topic's partition count is trusted before the broker
            is asked again (partitions added to a topic are used after at most this long).
        max_block_ms: how long ``send()`` to a topic this producer has not sent to yet waits
            for its partition count while the broker cannot answer (an outage, or a topic
            Kafka cannot create while a broker shuts down), asking again with a growing
            pause, as Kafka's ``max.block.ms``; then the retriable error is raised and nothing
            is queued. 0 raises it at once.

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
        max_buffered_bytes: int | None = None,
        init_timeout_ms: float = 30_000,
        metadata_max_age_ms: float = 30_000,
        max_block_ms: float = 60_000,
        **connect_options: Any,
    ) -> None:
        from idempotent.connection import open_for_producer

        if max_buffered_records < 1:
            raise ConfigError("max_buffered_records must be positive")
        if not metadata_max_age_ms >= 0:
            raise ConfigError("metadata_max_age_ms must be 0 or more")
        if not max_block_ms >= 0:
            raise ConfigError("max_block_ms must be 0 or more")
        self._max_block = max_block_ms / 1000
        self._metadata_max_age = metadata_max_age_ms / 1000
        self._owns_broker = isinstance(url_or_broker, str)
        self._broker = (
            open_for_producer(url_or_broker, **connect_options) if isinstance(url_or_broker, str) else url_or_broker
        )
        if not isinstance(self._broker, BrokerAPI):
            raise ConfigError(f"expected a URL or a broker, got {type(url_or_broker).__name__}")
        try:
            self._session = self._init(producer_name, init_timeout_ms / 1000)
            #: the broker's limits, learnt at init: larger records are refused at send()
            self._max_record_bytes = self._session.max_record_bytes
            if self._session.max_batch_bytes is not None:
                batch_size = min(batch_size, self._session.max_batch_bytes)
            if self._session.max_batch_records is not None:
                max_batch_records = min(max_batch_records, self._session.max_batch_records)
            if self._session.max_in_flight is not None:
                max_in_flight = min(max_in_flight, self._session.max_in_flight)
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
                in_order=bool(getattr(self._broker, "attempts_in_order", False)),
            )
        except BaseException:
            if self._owns_broker:
                self._broker.close()
            raise
        self._batch_size = batch_size
        self._max_batch_records = max_batch_records
        self._linger = linger_ms / 1000
        self._max_buffered = max_buffered_records
        #: the largest key + value + headers a record may have (Record.size counts 16 more)
        self._max_payload = sys.maxsize if self._max_record_bytes is None else self._max_record_bytes - 16
        #: the records held and the sender thread; what it shares with ``send`` is its own
        self._sender = sender = Sender(
            self._seq,
            self._broker,
            self._session,
            linger=self._linger,
            max_batch_records=max_batch_records,
            metadata_max_age=self._metadata_max_age,
            max_buffered=max_buffered_records,
            max_buffered_bytes=max_buffered_bytes,
        )
        # the sender's objects that are never replaced, under short names for the hot paths
        self._lock = sender.lock
        self._cond = sender.cond
        self._routes = sender.routes
        self._gate = sender.gate
        self._counter = itertools.count()
        self._closed = False
        #: whether a transaction is open; and the error send() raises while a commit or abort
        #: runs (the ended batches of the open transaction are the sender's ``txn_events``)
        self._txn_open = False
        self._txn_ending: ProducerError | None = None
        sender.thread.start()

    def _init(self, producer_name: str | None, timeout: float) -> ProducerSession:
        import tenacity  # only when opening needs a retry loop: not at import

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
        with self._lock:
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
        with self._lock:
            return self._seq.last_acknowledged(topic, partition)

    def last_sequences(self, topic: str) -> dict[int, int]:
        """:meth:`last_sequence` of every partition of ``topic``, ``{partition: sequence}``.

        A partition stores a prefix of the records sent to it, in order (a batch is stored
        only after its predecessor), so every record a partition got with a sequence at or
        below its entry is stored there.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        count = self.partitions_for(topic)
        name = canonical_topic(topic)
        with self._lock:
            return {p: self._seq.last_acknowledged(name, p) for p in range(count)}

    def resume_sequence(self, topic: str) -> int:
        """Where a restarted named producer that numbers its records itself (one sequence
        per record across the whole topic, ``send(..., sequence=n)``) resends from: the lowest
        of :meth:`last_sequences` plus one, 0 when a partition has none.

        Every record before it is stored. Of those resent from it, the ones a partition
        already stored are answered as duplicates and not stored again, so nothing is skipped
        and nothing stored twice, however the records spread over the partitions. The
        highest of the partitions' sequences is not such a point: records of a partition
        that stopped lower would be skipped.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        return min(self.last_sequences(topic).values()) + 1

    def partitions_for(self, topic: str) -> int:
        """Partition count of ``topic`` (created with the broker's default if unknown), as the
        broker said at most ``metadata_max_age_ms`` ago (the sender asks again in the
        background; partitions added meanwhile are used from then on).

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        return len(self._route(topic).buffers)

    def _route(self, topic: str) -> Route:
        route = self._routes.get(topic)
        if route is None:
            name = canonical_topic(topic)
            route = self._routes.get(name)
            if route is None:
                route = Route(name, self._partition_count(name), time.monotonic())
            with self._lock:  # one route per stored name, whatever the spelling
                route = self._routes.setdefault(name, route)
                self._routes[topic] = route
        return route

    def _partition_count(self, topic: str) -> int:
        """The broker's partition count of ``topic``, asked again while the broker cannot
        answer, for up to ``max_block_ms`` (see the constructor).

        Raises:
            BackendUnavailableError (or another retriable error): still no answer at the end
                of the wait, or the producer was closed meanwhile.
            ProducerError: what the broker answered otherwise (InvalidTopicError, ...).
        """
        deadline = time.monotonic() + self._max_block
        pause = 0.05
        while True:
            try:
                return self._broker.partitions_for(topic)
            except ProducerError as exc:
                if not exc.retriable or self._sender.closing or time.monotonic() + pause > deadline:
                    raise
                _LOG.info("the partition count of %r is not known yet (%s); asking again", topic, exc)
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    # -- sending ---------------------------------------------------------------------------

    @overload
    def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        sequence: int | None = None,
        on_delivery: None = None,
    ) -> DeliveryFuture: ...

    @overload
    def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        sequence: int | None = None,
        on_delivery: DeliveryCallback,
    ) -> None: ...

    def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        sequence: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> DeliveryFuture | None:
        """Queue a record for exactly-once delivery.

        Args:
            topic: any spelling of the topic :func:`idempotent.core.topics.canonical_topic` accepts
                (``orders``, ``persistent://public/default/orders``, ...); the record's
                metadata carries the stored name.
            partition: None picks it from the key (CRC32), round robin without a key.
            sequence: an application-chosen sequence for the record (for example its offset
                in a replayable source), ``0 .. 2**63-1``. Consecutive sequences share a
                batch. Under the broker's ``monotonic`` policy any increase is accepted and
                sequences are compared as 64-bit integers, without wrap-around; under
                ``strict`` sequences are Kafka's int32 (``0 .. 2**31-1``, wrapping to 0), a
                jump of any size fails the producer with SequenceDesyncError (unless the
                broker asks for sequences of a batch that expired: then that record's batch
                fails alone, NOT_PERSISTED, and the application sends them again) and a sequence
                above ``2**31-1`` fails its batch with InvalidBatchError. A sequence at or
                below the partition's stored one resolves as a duplicate
                (``RecordMetadata.duplicate``). None numbers the record after the previous one.
            on_delivery: ``on_delivery(error, metadata)``, called once when the record has
                ended, on the producer's sender thread (keep it short): ``error`` is None and
                ``metadata`` the :class:`RecordMetadata` when it was persisted (or found a
                duplicate), else ``error`` is its :class:`DeliveryFailed`. With it, ``send``
                returns None and makes no future. An exception it raises is logged.

        Returns:
            A :class:`~idempotent.producer.delivery.DeliveryFuture` resolving to :class:`RecordMetadata`
            or failing with :class:`~idempotent.errors.DeliveryFailed` (whose ``status`` says
            whether the record may have been persisted); None when ``on_delivery`` is given.

        Raises:
            UsageError: bad argument types, unknown partition, invalid ``sequence`` (nothing
                queued).
            InvalidBatchError: the record is larger than the broker takes (its
                ``max_record_bytes``, learnt at init, named in the message); nothing queued.
            QueueFullError: ``max_buffered_records`` unfinished records; flush first.
            ProducerClosedError: the producer is closed.
            ProducerError: the producer failed earlier (fenced, unknown producer, ...).
        """
        sender = self._sender
        if sender.yielding:
            self._gate.wait(YIELD_WAIT)
        route = self._routes.get(topic)
        if route is None:
            route = self._route(topic)
        if type(value) is not bytes:
            value = optional_bytes(value, "record values", UsageError)
        buffers = route.buffers
        if partition is not None and (type(partition) is not int or not 0 <= partition < len(buffers)):
            raise UsageError(f"topic {route.topic!r} has partitions 0..{len(buffers) - 1}, not {partition!r}")
        if key is None:
            if partition is None:
                partition = route.sticky
            length = 0 if value is None else len(value)
        else:
            if type(key) is not bytes:
                key = cast(bytes, optional_bytes(key, "record keys", UsageError))
            if partition is None:
                partition = zlib.crc32(key) % len(buffers)
            length = len(key) if value is None else len(key) + len(value)
        header_tuple: Headers | None = None
        if headers is not None:
            try:
                header_tuple = _headers(headers)
            except (InvalidRecordError, TypeError, ValueError) as exc:
                raise UsageError(str(exc)) from None
            for name, data in header_tuple:
                length += len(name) + len(data) + 4
        if length > self._max_payload:
            raise self._too_large(length + 16)
        if sequence is not None:
            sequences_for(1, sequence)  # validates: UsageError
        with self._lock:
            if sender.halted is not None:
                raise sender.halted
            sender.outstanding += 1
            if sender.outstanding > self._max_buffered:
                sender.outstanding -= 1
                raise QueueFullError(f"{sender.outstanding} records are waiting; flush() or slow down")
            buffer = buffers[partition]
            if buffer.plain and key is None and on_delivery is None and header_tuple is None and sequence is None:
                values = buffer.values  # a value only, into a buffer of values only
                index = len(values)
                values.append(value)
            else:
                index = buffer.append(value, key, on_delivery, None, None, header_tuple, sequence)
            if index == 0:
                sender.first(route, partition, buffer)
        return None if on_delivery is not None else DeliveryFuture(buffer, index)

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
        route = self._route(topic)
        topic = route.topic
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
            raise self._too_large(max(sizes))
        count = len(route.buffers)
        future = SendManyFuture(len(items))
        if not items:
            future.finish()
            return future
        shares: list[tuple[int, SequenceOf[Record], int | SequenceOf[int] | None, Part, list[int]]]
        if partition is not None:
            if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < count:
                raise UsageError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition!r}")
            shares = [(partition, items, sequence, Part(future, None), sizes)]
        else:
            sticky = next(self._counter) % count
            chosen = [sticky if r.key is None else zlib.crc32(r.key) % count for r in items]
            if all(p == chosen[0] for p in chosen):
                shares = [(chosen[0], items, sequence, Part(future, None), sizes)]
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
                        Part(future, indices),
                        [sizes[i] for i in indices],
                    )
                    for p, indices in by_partition.items()
                ]
        with self._lock:
            if self._sender.halted is not None:
                raise self._sender.halted
            if self._sender.outstanding >= self._max_buffered:
                raise QueueFullError(f"{self._sender.outstanding} records are waiting; flush() or slow down")
            now = time.monotonic()
            for share_partition, share, share_sequence, part, share_sizes in shares:
                # the records sent before this call go first: hand them over ahead of it
                if route.buffers[share_partition].values:
                    self._sender.hand_over(route, share_partition)
                self._seq.add_many(topic, share_partition, share, now, share_sequence, part, share_sizes)
                self._sender.outstanding += len(share)
            if self._seq.wakeup:
                self._seq.wakeup = False
                self._sender.wake_at = 0.0
                self._cond.notify()
        return future

    def flush(self, timeout: float | None = None) -> int:
        """Send everything queued and wait until every message has ended.

        Returns:
            How many messages are still unfinished (0 unless ``timeout`` ran out).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._sender.begin_flush()
        try:
            with self._cond:
                while self._sender.outstanding:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._cond.wait(remaining if remaining is not None else 0.5)
                return self._sender.outstanding
        finally:
            self._sender.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout``), fail whatever is left as closed, stop, and close the
        broker if this producer opened it."""
        if self._closed:
            return
        if self._txn_open:  # an open transaction is aborted, as Kafka's close does
            with contextlib.suppress(ProducerError):
                self.abort_transaction()
        try:
            self.flush(timeout)
        finally:
            with self._cond:
                self._sender.closing = True
                if self._sender.halted is None:
                    self._sender.halted = ProducerClosedError("producer is closed")
                if self._seq.failure is None:  # what is still buffered fails with the rest
                    for route, partition in self._sender.filled:
                        if route.buffers[partition].values:
                            self._sender.hand_over(route, partition)
                    self._sender.filled = []
                # (after a failure the sender purges the buffers with its error)
                self._seq.close()
                self._sender.wake_at = 0.0
                self._cond.notify_all()
            self._sender.thread.join(10)
            self._closed = True
            if self._owns_broker:
                self._broker.close()

    # -- transactions ----------------------------------------------------------------------

    def begin_transaction(self) -> None:
        """Open a transaction (docs/semantics.md, "Application transactions"): every record
        sent from now until :meth:`commit_transaction` or :meth:`abort_transaction`, on any
        topic and partition, is stored with it or not at all, and their delivery futures and
        callbacks end only then. What was sent before is flushed first: it belongs to no
        transaction. One transaction at a time, for the whole producer.

        Raises:
            TransactionStateError: one is open already, or the backend has no transactions
                (``pulsar://``: the message says what to use instead); nothing changed.
            ProducerFencedError: a newer instance of the producer took over.
            BackendUnavailableError: the backend could not be reached; no transaction open.
        """
        self._begin_transaction(defer=True)

    def _begin_transaction(self, defer: bool) -> None:
        """:meth:`begin_transaction`; ``defer``: hold the delivery reports until the end (the
        confluent-kafka drop-in does not: librdkafka reports each message once Kafka
        acknowledged it, inside the transaction)."""
        begin = getattr(self._broker, "begin_transaction", None)
        if not callable(begin):
            raise TransactionStateError(
                f"{type(self._broker).__name__} has no transactions: open the producer on kafka://, "
                "sqlite:// or memory:// for them"
            )
        with self._cond:
            if self._txn_open:
                raise TransactionStateError("a transaction is open already: commit or abort it first")
            if self._sender.halted is not None:
                raise self._sender.halted
        self.flush()
        begin(self.producer_id, self.producer_epoch)
        with self._cond:
            self._txn_open = True
            self._sender.txn_events = [] if defer else None

    def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any, timeout: float = 30.0) -> None:
        """Extension (``kafka://``): commit a Kafka consumer group's ``offsets`` (a list of
        confluent-kafka ``TopicPartition``) with the open transaction, through the producer's
        own transactional client, so the group sees them exactly when the transaction commits
        (``group_metadata``: the native consumer's ``consumer_group_metadata()``).

        Raises:
            TransactionStateError: no transaction open, or the backend has no consumer groups.
            TransactionAbortableError: Kafka refused them: abort the transaction.
            TransactionTimedOutError: no answer within ``timeout``: call again.
            ProducerFencedError: a newer instance took over.
        """
        send = getattr(self._broker, "send_offsets_to_transaction", None)
        if not callable(send):
            raise TransactionStateError(f"{type(self._broker).__name__} has no consumer groups to commit offsets to")
        with self._cond:
            if not self._txn_open:
                raise TransactionStateError("no transaction open to send offsets to")
        send(offsets, group_metadata, timeout)

    def commit_transaction(self, positions: object = None, timeout: float | None = None) -> None:
        """Send what the transaction holds, then commit it with ``positions`` (any value
        msgpack encodes: a dict of consumer offsets, a file's byte offset, a Pulsar
        ``MessageId.serialize()``; None keeps the last committed) in the same backend
        transaction. Once it returns, every record of it is stored and its futures are
        resolved, and :meth:`committed_positions` reads ``positions`` back, after a restart too.

        Raises:
            TransactionStateError: no transaction open; ``positions`` on an anonymous producer.
            TransactionTimedOutError: its records were not all written within ``timeout``,
                or the commit's outcome is not known yet: call again (still open).
            TransactionAbortableError: a record or the commit failed: nothing of it is
                stored; call :meth:`abort_transaction`.
            ProducerFencedError: a newer instance took over; nothing of it is stored, and
                its records fail NOT_PERSISTED.
        """
        import msgpack

        with self._cond:
            if not self._txn_open:
                raise TransactionStateError("no transaction open to commit")
            self._block_sends("a commit is running")
        try:
            if self.flush(timeout):
                raise TransactionTimedOutError(
                    f"the transaction's records were not all written within {timeout} s; call commit again"
                )
            with self._cond:
                events = list(self._sender.txn_events or ())
            failed = next((e for e in events if isinstance(e, BatchFailed)), None)
            if failed is not None:
                raise TransactionAbortableError(f"a batch of the transaction failed, abort it: {failed.error}")
            encoded = None if positions is None else msgpack.packb(positions, use_bin_type=True)
            try:
                answers = self._broker.commit_transaction(  # type: ignore[attr-defined]
                    self.producer_id, self.producer_epoch, encoded
                )
            except (TransactionAbortableError, TransactionTimedOutError, TransactionStateError):
                raise
            except ProducerError as exc:
                self._end_transaction(exc)
                raise
            self._end_transaction(None, answers)
        finally:
            self._unblock_sends()

    def abort_transaction(self) -> None:
        """Abort the open transaction: nothing of it is stored, and each of its records fails
        NOT_PERSISTED (:class:`~idempotent.errors.TransactionAbortableError` as the cause).

        Raises:
            TransactionStateError: no transaction open.
            ProducerFencedError: a newer instance took over (nothing of it is stored either).
        """
        with self._cond:
            if not self._txn_open:
                raise TransactionStateError("no transaction open to abort")
            self._block_sends("an abort is running")
        try:
            self.flush()
            error = TransactionAbortableError("the transaction was aborted: nothing of it is stored")
            try:
                rewound = self._broker.abort_transaction(  # type: ignore[attr-defined]
                    self.producer_id, self.producer_epoch
                )
            except (TransactionStateError, TransactionTimedOutError):
                raise  # still open (a broker that could not yet learn an earlier commit's outcome)
            except BaseException:
                self._end_transaction(error)
                raise
            with self._cond:  # the aborted records' sequences are free again
                self._seq.rewind(rewound or {})
            self._end_transaction(error)
        finally:
            self._unblock_sends()

    @contextlib.contextmanager
    def transaction(self, positions: object = None, timeout: float | None = None) -> Iterator[Transaction]:
        """``with producer.transaction() as txn:``: :meth:`begin_transaction`, then
        :meth:`commit_transaction` with ``txn.positions`` (set inside the block, or
        ``positions``) when the block ends, :meth:`abort_transaction` when it raises (the
        block's exception is raised again).

        Raises:
            What :meth:`begin_transaction` and :meth:`commit_transaction` raise; a commit
            that fails with :class:`~idempotent.errors.TransactionAbortableError` is aborted
            before the error is raised.
        """
        self.begin_transaction()
        txn = Transaction(positions)
        try:
            yield txn
        except BaseException:
            with contextlib.suppress(ProducerError):
                self.abort_transaction()
            raise
        try:
            self.commit_transaction(txn.positions, timeout)
        except TransactionAbortableError:
            self.abort_transaction()
            raise

    def committed_positions(self) -> object:
        """What the last committed transaction of this named producer recorded as its
        positions (read from the backend, so after a restart too), or None.

        Raises:
            TransactionStateError: the backend has no transactions.
            BackendUnavailableError: the backend could not be read.
        """
        import msgpack

        read = getattr(self._broker, "committed_positions", None)
        if not callable(read):
            raise TransactionStateError(f"{type(self._broker).__name__} has no transactions")
        encoded = read(self.producer_id)
        return None if encoded is None else msgpack.unpackb(encoded, raw=False)

    def _block_sends(self, why: str) -> None:
        """Refuse send() while a commit or abort runs (lock held)."""
        if self._sender.halted is None:
            self._txn_ending = self._sender.halted = TransactionStateError(f"{why}: send after it returns")

    def _unblock_sends(self) -> None:
        with self._cond:
            if self._txn_ending is not None and self._sender.halted is self._txn_ending:
                self._sender.halted = self._seq.failure
            self._txn_ending = None

    def _end_transaction(
        self, error: ProducerError | None, answers: Mapping[tuple[str, int, int], tuple[int | None, bool]] = _NONE
    ) -> None:
        """End the transaction: complete its batches as delivered (``error`` None), with the
        offsets the commit gave (``answers``: a broker that held the batches until then), or
        fail the delivered ones NOT_PERSISTED with ``error``."""
        with self._cond:
            events, self._sender.txn_events = self._sender.txn_events or [], None
            self._txn_open = False
        if answers:
            events = [_answered(e, answers) for e in events]
        if error is not None:
            events = [
                BatchFailed(e.batch, error, DeliveryStatus.NOT_PERSISTED) if isinstance(e, BatchDelivered) else e
                for e in events
            ]
        held = self._sender.complete(events)
        with self._cond:
            self._sender.held += held
            self._cond.notify_all()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _too_large(self, size: int) -> InvalidBatchError:
        return InvalidBatchError(
            f"a record of {size} bytes (key, value and headers) exceeds the broker's "
            f"max_record_bytes={self._max_record_bytes}; nothing was queued"
        )


class Transaction:
    """The open transaction of ``with producer.transaction() as txn``: set ``txn.positions``
    to what the commit records with it (see :meth:`Producer.commit_transaction`)."""

    __slots__ = ("positions",)

    def __init__(self, positions: object = None) -> None:
        self.positions = positions


__all__ = [
    "Deliveries",
    "DeliveryFuture",
    "DeliveryStatus",
    "Producer",
    "SendManyFuture",
    "Transaction",
    "default_partition",
]
