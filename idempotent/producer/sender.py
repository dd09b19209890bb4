"""The records a producer holds and its sender thread: :class:`Sender`.

A :class:`~idempotent.producer.producer.Producer` owns one :class:`Sender`. It holds what
``send`` and the sender thread share: each partition's :class:`RecordBuffer` (through the
topics' :class:`Route`), the counts of unfinished records, the lock. On its thread
(``idempotent-sender``) each round it hands every due buffer whole to the sequencer
(:meth:`Sender._take`), sends the round's batches to the broker in one call
(:meth:`Sender._submit`), feeds the answers back (:meth:`Sender._answered`), and records each
ended batch once per span of a buffer (:meth:`Sender.complete`). It also refreshes partition
counts and serves what the drop-ins drive through their port
(:class:`~idempotent.producer.dropin.DropInPort`): the checked per-record path
(:meth:`Sender.add`), a span listener (delivery reports served on the application's thread),
a purge of records not sent yet, and flushing without waiting here.

Every change of its state happens under its lock, and nothing is called out while it is held.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from concurrent.futures import Future
from typing import cast

from idempotent.api import BrokerAPI
from idempotent.core.outcomes import DeliveryStatus, Outcome, ProduceResult
from idempotent.core.records import Headers, Record, RecordColumns, trusted_record
from idempotent.core.request import ProduceRequest
from idempotent.core.sequence import sequence_at
from idempotent.core.sequencer import BatchDelivered, BatchFailed, Event, OutgoingBatch, ProducerSequencer
from idempotent.core.values import ProducerSession
from idempotent.errors import ProducerError, QueueFullError, internal_error
from idempotent.producer.delivery import Part, RecordBuffer, Segment

_LOG = logging.getLogger("idempotent.producer.producer")

#: the longest a ``send`` waits for the sender's write when it yields to it (see
#: :meth:`Sender._submit`); after that it goes on regardless
YIELD_WAIT = 0.1
#: the fewest records, or bytes (as ``Record.size`` counts), of a group written on the
#: sender's thread for sends to wait for it (smaller groups are a producer well below its
#: capacity: its sends never wait)
YIELD_MIN_RECORDS = 1000
YIELD_MIN_BYTES = 256 * 1024


class Route:
    """A topic as callers spell it: its stored name, the current buffer of each partition,
    and the partition that records without a key and without a partition go to (``sticky``:
    moved on to the next partition each time the sender takes its buffer, as Kafka's sticky
    partitioner moves on with each batch)."""

    __slots__ = ("buffers", "checked_at", "sticky", "topic")

    def __init__(self, topic: str, partitions: int, checked_at: float) -> None:
        self.topic = topic
        self.buffers = [RecordBuffer(topic, p) for p in range(partitions)]
        self.sticky = random.randrange(partitions)
        #: when the broker last gave the partition count (the producer's clock)
        self.checked_at = checked_at

    def grow(self, partitions: int, now: float) -> None:
        """Take a partition count the broker gave at ``now``: partitions added to the topic
        get buffers (a topic never loses partitions). The producer's lock is held."""
        self.checked_at = now
        for partition in range(len(self.buffers), partitions):
            self.buffers.append(RecordBuffer(self.topic, partition))


#: Called by the sender for every span of a buffer that ended (the drop-ins serve delivery
#: reports from it), after the buffer has recorded it. Returns how many of the span's records
#: it holds for its owner to serve later (they count against the buffer limits until
#: :meth:`Sender.served`); 0 when it served them already.
SpanListener = Callable[[RecordBuffer, Segment], int]


class Sender:
    """The records a producer holds and its sender thread (see the module docstring).

    A :class:`~idempotent.producer.producer.Producer` makes one and owns it. Its attributes
    are the state ``send`` and the sender thread share; each is changed only under ``lock``
    (``cond`` is on it), and nothing is called out while it is held.

    Args:
        seq: the producer's sequencer (driven here under ``lock``).
        broker: where the batches go (``submit_requests``, ``partitions_for``).
        session: the producer's identity, stamped on every request.
        linger: seconds a buffer waits for more records after its first.
        max_batch_records: a buffer with this many records is due at once.
        metadata_max_age: seconds a topic's partition count is trusted.
        max_buffered: :meth:`add` refuses records beyond this many unfinished.
        max_buffered_bytes: :meth:`add` refuses records beyond this many bytes unfinished
            (None: no bound).
    """

    __slots__ = (
        "broker",
        "closing",
        "cond",
        "filled",
        "flushing",
        "gate",
        "halted",
        "held",
        "linger",
        "lock",
        "max_batch_records",
        "max_buffered",
        "max_buffered_bytes",
        "metadata_due",
        "metadata_max_age",
        "outstanding",
        "outstanding_bytes",
        "routes",
        "seq",
        "session",
        "span_listener",
        "thread",
        "txn_events",
        "wake_at",
        "yielding",
    )

    def __init__(
        self,
        seq: ProducerSequencer,
        broker: BrokerAPI,
        session: ProducerSession,
        *,
        linger: float,
        max_batch_records: int,
        metadata_max_age: float,
        max_buffered: int,
        max_buffered_bytes: int | None,
    ) -> None:
        self.seq = seq
        self.broker = broker
        self.session = session
        self.linger = linger
        self.max_batch_records = max_batch_records
        self.metadata_max_age = metadata_max_age
        self.metadata_due = time.monotonic() + metadata_max_age
        self.max_buffered = max_buffered
        self.max_buffered_bytes = max_buffered_bytes
        #: guards the buffers, the routes and the sequencer; the sender waits on ``cond``.
        #: An RLock: a Condition on it takes it back even when a signal handler raises in
        #: ``wait`` (Ctrl-C in ``flush``); on a Lock the interrupted re-acquire would leave
        #: the caller's ``with`` to release a lock another thread holds.
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.routes: dict[str, Route] = {}
        #: (route, partition) of the buffers that got their first record since the sender
        #: last took them
        self.filled: list[tuple[Route, int]] = []
        #: records accepted by send and send_many whose outcome is not recorded yet (or, with a
        #: span listener, not served yet), and the bytes of those a drop-in added
        self.outstanding = 0
        #: records that ended and were handed to a span listener, not served by its owner yet
        self.held = 0
        self.outstanding_bytes = 0
        #: why send refuses records (closed, or the error that failed the producer), or None
        self.halted: ProducerError | None = None
        #: when the sender wakes up next (it is woken earlier only when that is too late)
        self.wake_at = 0.0
        self.flushing = 0
        self.closing = False
        self.span_listener: SpanListener | None = None
        #: the ended batches of the open transaction, completed at its commit or abort (None:
        #: no transaction open)
        self.txn_events: list[Event] | None = None
        #: open (set) except while the sender writes a large group on its own thread: then
        #: send() waits for it, at most YIELD_WAIT (see :meth:`_submit`)
        self.gate = threading.Event()
        self.gate.set()
        self.yielding = False
        self.thread = threading.Thread(target=self.run, name="idempotent-sender", daemon=True)

    def first(self, route: Route, partition: int, buffer: RecordBuffer) -> None:
        """A buffer got its first record (the lock held): note when, and wake the sender
        when it would otherwise sleep past this buffer's linger."""
        now = buffer.first_at = time.monotonic()
        buffer.created_ms = int(time.time() * 1000)
        self.filled.append((route, partition))
        if self.wake_at > now + self.linger:
            self.wake_at = now + self.linger
            self.cond.notify()

    def add(
        self,
        route: Route,
        partition: int,
        value: bytes | None,
        key: bytes | None,
        report: object,
        timestamp: int | None,
        headers: Headers | None,
        sequence: int | None,
        size: int = 0,
    ) -> RecordBuffer:
        """Append one record whose arguments a drop-in has checked already (types, the
        partition, the size against the broker's limit): ``report`` is kept in the buffer's
        ``reports`` column for the drop-in's span listener, never called by the producer;
        ``size`` (its key and value bytes) counts against ``max_buffered_bytes`` until
        :meth:`served`. Returns the buffer the record went into (the lock held only inside).
        The drop-ins call it as :attr:`~idempotent.producer.dropin.DropInPort.add`.

        Raises:
            ProducerError: the producer failed earlier, or is closed.
            QueueFullError: ``max_buffered_records`` unfinished records.
        """
        if self.yielding:
            self.gate.wait(YIELD_WAIT)
        with self.lock:
            if self.halted is not None:
                raise self.halted
            if self.outstanding + self.held >= self.max_buffered or (
                self.max_buffered_bytes is not None
                and self.outstanding + self.held
                and self.outstanding_bytes + size > self.max_buffered_bytes
            ):
                raise QueueFullError(f"{self.outstanding} records ({self.outstanding_bytes} bytes) are waiting")
            self.outstanding += 1
            self.outstanding_bytes += size
            buffer = route.buffers[partition]
            if (
                buffer.plain
                and key is None
                and report is None
                and timestamp is None
                and headers is None
                and sequence is None
            ):
                values = buffer.values  # a value only, into a buffer of values only
                index = len(values)
                values.append(value)
            else:
                index = buffer.append(value, key, None, report, timestamp, headers, sequence)
            if index == 0:
                self.first(route, partition, buffer)
            return buffer

    def hand_over(self, route: Route, partition: int) -> None:
        """Give a partition's buffer to the sequencer whole (lock held) and start a new one.

        Runs of records with application sequences and runs without are added separately;
        the batches report their records as spans of the buffer."""
        buffer = route.buffers[partition]
        route.buffers[partition] = RecordBuffer(route.topic, partition)
        if route.sticky == partition:
            route.sticky = (partition + 1) % len(route.buffers)
        records: SequenceOf[Record]
        keys = buffer.keys
        if buffer.headers is None:
            records = RecordColumns(buffer.values, keys, buffer.timestamps)
        else:
            records = list(
                map(
                    trusted_record,
                    buffer.values,
                    keys if keys is not None else itertools.repeat(None),
                    [() if h is None else h for h in buffer.headers],
                    buffer.timestamps if buffer.timestamps is not None else itertools.repeat(None),
                )
            )
        sequences = buffer.sequences
        if sequences is None:
            self.seq.add_many(route.topic, partition, records, buffer.first_at, None, buffer)
            return
        start = 0
        for explicit, run in itertools.groupby(sequences, key=lambda s: s is not None):
            length = sum(1 for _ in run)
            chosen = cast(list[int], sequences[start : start + length]) if explicit else None
            self.seq.add_many(
                route.topic, partition, records[start : start + length], buffer.first_at, chosen, buffer, origin=start
            )
            start += length

    def _take(self, now: float) -> float | None:
        """Hand every due buffer whose partition can take a batch to the sequencer (lock
        held); return when the next one that is not due yet will be, or None. Nothing once
        the sequencer has failed: the buffers are purged with its error (:meth:`_loop`)."""
        if not self.filled or self.seq.failure is not None:
            return None
        keep: list[tuple[Route, int]] = []
        due_at: float | None = None
        for route, partition in self.filled:
            buffer = route.buffers[partition]
            if not buffer.values:
                continue  # taken by send_many or close
            ready = buffer.first_at + self.linger
            due = self.flushing or self.closing or now >= ready or len(buffer.values) >= self.max_batch_records
            if due and self.seq.has_room(route.topic, partition):
                self.hand_over(route, partition)
                continue
            keep.append((route, partition))
            if not due and (due_at is None or ready < due_at):
                due_at = ready
        self.filled = keep
        return due_at

    def _refresh_metadata(self, now: float) -> None:
        """Ask the broker again for the partition count of every topic whose count is older
        than ``metadata_max_age_ms`` (the sender thread, no lock held while asking); none once
        the producer is closing, so that a cluster that does not answer (each question waits
        up to the backend's timeout) does not hold up :meth:`close`."""
        age = self.metadata_max_age
        if now < self.metadata_due:
            return
        self.metadata_due = now + max(age, 0.1)
        stale = {id(r): r for r in list(self.routes.values()) if now - r.checked_at >= age}
        for route in stale.values():
            if self.closing:  # a closing producer sends to the partitions it knows
                return
            try:
                count = self.broker.partitions_for(route.topic)
            except ProducerError as exc:  # keep the count in force; ask again next time
                _LOG.debug("could not refresh the partitions of %s: %s", route.topic, exc)
                continue
            with self.lock:
                route.grow(count, now)

    def run(self) -> None:
        """The sender thread. It never ends with a record left without an outcome: an
        exception escaping the loop is a bug (logged, FATAL :class:`InternalError`), and every
        record still pending fails with it (:meth:`_stop`)."""
        try:
            self._loop()
        except Exception as exc:  # a bug: logged, FATAL; every pending record gets its status
            self._stop(exc if isinstance(exc, ProducerError) else internal_error("the sender thread", exc, _LOG))

    def _stop(self, error: ProducerError) -> None:
        """End the producer on ``error``: new records are refused with it, every batch of
        the sequencer fails with it (POSSIBLY_PERSISTED where an attempt may be stored,
        NOT_PERSISTED otherwise) and every buffered record NOT_PERSISTED."""
        with self.cond:
            if self.halted is None:
                self.halted = error
            self.seq.fail(error)
            events = self._drain_events()
        held = 0
        try:
            held = self.complete(events)
        finally:
            with self.cond:
                self.outstanding -= sum(len(event.batch.records) for event in events)
                self.held += held
                self.cond.notify_all()
            self.purge(self.seq.failure or error)

    def _loop(self) -> None:
        while True:
            self._refresh_metadata(time.monotonic())
            with self.cond:
                now = time.monotonic()
                due_at = self._take(now)
                self.seq.handle_timeout(now)
                self._note_failure()
                batches = self.seq.batches_to_send(now)
                events = self._drain_events()
                # the sequencer failed: what is buffered will never be sent (after the events)
                stranded = self.seq.failure if self.filled and self.seq.failure is not None else None
                if not batches and not events and stranded is None:
                    if self.closing and not self.outstanding:
                        return
                    deadline = self.seq.next_deadline()
                    if due_at is not None and (deadline is None or due_at < deadline):
                        deadline = due_at
                    wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
                    if wait > 0:
                        self.wake_at = now + wait
                        self.cond.wait(wait)
                        self.wake_at = 0.0
                    continue
                self.wake_at = 0.0
            if events:
                held = self.complete(events)
                with self.cond:
                    self.outstanding -= sum(len(event.batch.records) for event in events)
                    self.held += held
                    self.cond.notify_all()
            if batches:
                self._submit(batches)
            if stranded is not None:
                self.purge(stranded)

    def _drain_events(self) -> list[Event]:
        out = []
        while (event := self.seq.next_event()) is not None:
            out.append(event)
        return out

    def _note_failure(self) -> None:
        """Refuse new records once the sequencer has failed (lock held)."""
        if self.halted is None and self.seq.failure is not None:
            self.halted = self.seq.failure

    def complete(self, events: list[Event]) -> int:
        """Record how ended batches ended: one entry per span of each batch. Returns how many
        records were handed to a span listener: they count against ``max_buffered_records``
        until its owner has served them (:meth:`served`)."""
        stash = self.txn_events
        if stash is not None:  # an open transaction's: completed at its commit or abort
            stash.extend(events)
            return 0
        listener = self.span_listener
        held = 0
        for event in events:
            batch = event.batch
            topic, partition, base_sequence = batch.topic, batch.partition, batch.base_sequence
            position = 0
            if isinstance(event, BatchDelivered):
                base_offset: int | None = event.base_offset
                duplicate = event.duplicate
                error: ProducerError | None = None
                status = DeliveryStatus.PERSISTED
            else:
                assert isinstance(event, BatchFailed)
                base_offset, duplicate, error, status = None, False, event.error, event.status
            for owner, start, count in batch.spans:
                offset = None if base_offset is None else base_offset + position
                sequence = sequence_at(base_sequence, position) if base_sequence >= 0 else -1
                if type(owner) is RecordBuffer:
                    segment: Segment = (start, count, offset, sequence, duplicate, error, status)
                    owner.ended(segment)
                    if listener is not None:
                        held += listener(owner, segment)
                elif type(owner) is Part:
                    failure = None if error is None else (error, status)
                    owner.future.ended((owner, start, count, topic, partition, offset, sequence, duplicate, failure))
                position += count
        return held

    # -- hooks of the drop-ins -------------------------------------------------------------

    def served(self, count: int, size: int = 0) -> None:
        """A span listener's owner served the reports of ``count`` records of ``size``
        bytes (see :meth:`add`): they no longer count against the buffer limits."""
        with self.cond:
            self.held -= count
            self.outstanding_bytes -= size
            self.cond.notify_all()

    def purge(self, error: ProducerError) -> int:
        """End every record not handed to the sequencer yet with ``error`` (NOT_PERSISTED), as
        librdkafka's ``purge(in_queue=True)`` does; batches already sent are not recalled.
        Returns how many records were purged."""
        with self.cond:
            taken: list[RecordBuffer] = []
            for route, partition in self.filled:
                buffer = route.buffers[partition]
                if buffer.values:
                    route.buffers[partition] = RecordBuffer(route.topic, partition)
                    taken.append(buffer)
            self.filled = []
        listener = self.span_listener
        held = 0
        for buffer in taken:
            segment: Segment = (0, len(buffer), None, -1, False, error, DeliveryStatus.NOT_PERSISTED)
            buffer.ended(segment)
            if listener is not None:
                held += listener(buffer, segment)
        purged = sum(len(buffer) for buffer in taken)
        with self.cond:
            self.outstanding -= purged
            self.held += held
            self.cond.notify_all()
        return purged

    def begin_flush(self) -> None:
        """Send everything buffered now, and keep doing so until :meth:`end_flush`."""
        with self.cond:
            self.flushing += 1
            self.seq.flush()
            self.wake_at = 0.0
            self.cond.notify_all()

    def end_flush(self) -> None:
        with self.cond:
            self.flushing -= 1
            if not self.flushing:
                self.seq.end_flush()

    def _submit(self, batches: list[OutgoingBatch]) -> None:
        """Hand one round's batches to the broker at once (``submit_requests``); their answers
        come back through :meth:`_answered`, at once or later."""
        session = self.session
        requests: list[ProduceRequest] = []
        sent: list[OutgoingBatch] = []
        for batch in batches:
            try:
                requests.append(
                    ProduceRequest.build(
                        batch.topic,
                        batch.partition,
                        session.producer_id,
                        session.producer_epoch,
                        batch.base_sequence,
                        batch.records,
                        batch.previous_sequence,
                        measured=(batch.size, batch.largest),
                    )
                )
                sent.append(batch)
            except ProducerError as exc:
                self._answered(batch.batch_id, batch.attempt, None, exc)
            except Exception as exc:  # a bug: logged, FATAL (never retried); the sender thread lives on
                self._answered(batch.batch_id, batch.attempt, None, internal_error("building a request", exc, _LOG))
        if not requests:
            return
        # A broker that writes the group on this thread before it returns (a Kafka producer's
        # own transactions) needs the interpreter lock often while it waits: the client runs
        # Python once per record to report its delivery. An application thread that sends as
        # fast as it can holds the lock most of the time and so stretches every write, and
        # its backlog grows. When the group is large (the application is producing near the
        # producer's capacity), its sends wait for the write instead (at most YIELD_WAIT).
        # A write that runs without the interpreter lock (the compiled Kafka write path,
        # ``writes_without_lock``) overlaps the sends of the next group: they never wait.
        yielding = (
            (
                sum(len(batch.records) for batch in sent) >= YIELD_MIN_RECORDS
                or sum(batch.size for batch in sent) >= YIELD_MIN_BYTES
            )
            and getattr(self.broker, "writes_on_submit", False)
            and not getattr(self.broker, "writes_without_lock", False)
        )
        if yielding:
            self.gate.clear()
            self.yielding = True
        try:
            answers = self.broker.submit_requests(requests)
        except ProducerError as exc:
            for batch in sent:
                self._answered(batch.batch_id, batch.attempt, None, exc)
            return
        except Exception as exc:  # a bug: logged, FATAL (never retried); the sender thread lives on
            error = internal_error("submitting a batch", exc, _LOG)
            for batch in sent:
                self._answered(batch.batch_id, batch.attempt, None, error)
            return
        finally:
            if yielding:
                self.yielding = False
                self.gate.set()
        for batch, answer in zip(sent, answers, strict=True):
            answer.add_done_callback(self._answer_of(batch.batch_id, batch.attempt))

    def _answer_of(self, batch_id: int, attempt: int) -> Callable[[Future[ProduceResult]], None]:
        """The done-callback that feeds one transmission's answer back."""
        return lambda answer: self._answered(batch_id, attempt, answer, None)

    @staticmethod
    def _backoff(attempt: int) -> float:
        """Seconds before a retriable answer to attempt ``attempt`` is resent: 5 ms doubling
        per attempt up to 1 s, plus up to 5 ms of jitter."""
        return min(1.0, 0.005 * 2.0 ** min(attempt - 1, 16)) + random.uniform(0.0, 0.005)

    def _answered(
        self, batch_id: int, attempt: int, answer: Future[ProduceResult] | None, error: ProducerError | None
    ) -> None:
        result: ProduceResult | None = None
        if answer is not None:
            exc = answer.exception()
            if exc is not None:
                error = exc if isinstance(exc, ProducerError) else internal_error("producing a batch", exc, _LOG)
            else:
                result = answer.result()
        now = time.monotonic()
        # a backoff only for answers that will be resent after one
        retried = (error is not None and error.retriable) or (
            result is not None and result.outcome is Outcome.IN_FLIGHT
        )
        retry_at = now + self._backoff(attempt) if retried else now
        with self.cond:
            if error is not None:
                self.seq.handle_error(batch_id, attempt, error, now, retry_at)
            else:
                assert result is not None
                self.seq.handle_result(batch_id, attempt, result, now, retry_at)
            self._note_failure()
            self.wake_at = 0.0
            self.cond.notify_all()
