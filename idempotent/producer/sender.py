"""The producer's sender thread: takes due buffers, sends batches, records how they ended.

:class:`SenderLoop` is the part of :class:`~idempotent.producer.producer.Producer` that runs on its
sender thread (``idempotent-sender``): each round it hands every due buffer whole to the
sequencer (:meth:`_take`), sends the round's batches to the broker in one call
(:meth:`_submit`), feeds the answers back (:meth:`_answered`), and records each ended batch once
per span of a buffer (:meth:`_complete`). It also refreshes partition counts and serves the
drop-ins' hooks: a span listener (delivery reports served on the application's thread), a
purge of records not sent yet, and flushing without waiting here.

The state it works on belongs to the producer (declared below for the type checker); every
change happens under the producer's lock, and nothing is called out while it is held.
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
from idempotent.core.records import Record, RecordColumns, trusted_record
from idempotent.core.request import ProduceRequest
from idempotent.core.sequence import sequence_at
from idempotent.core.sequencer import BatchDelivered, BatchFailed, Event, OutgoingBatch, ProducerSequencer
from idempotent.core.values import ProducerSession
from idempotent.errors import ProducerError, internal_error
from idempotent.producer.delivery import Part, RecordBuffer, Segment

_LOG = logging.getLogger("idempotent.producer.producer")

#: the longest a ``send`` waits for the sender's write when it yields to it (see
#: :meth:`SenderLoop._submit`); after that it goes on regardless
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
#: :meth:`SenderLoop._served`); 0 when it served them already.
SpanListener = Callable[[RecordBuffer, Segment], int]


class SenderLoop:
    """The producer's sender thread and the hooks around it (see the module docstring)."""

    _lock: threading.RLock
    _cond: threading.Condition
    _seq: ProducerSequencer
    _broker: BrokerAPI
    _session: ProducerSession
    _routes: dict[str, Route]
    _filled: list[tuple[Route, int]]
    _outstanding: int
    _held: int
    _outstanding_bytes: int
    _halted: ProducerError | None
    _wake_at: float
    _flushing: int
    _closing: bool
    _linger: float
    _max_batch_records: int
    _metadata_max_age: float
    _metadata_due: float
    _span_listener: SpanListener | None
    _txn_events: list[Event] | None
    _gate: threading.Event
    _yielding: bool

    def _hand_over(self, route: Route, partition: int) -> None:
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
            self._seq.add_many(route.topic, partition, records, buffer.first_at, None, buffer)
            return
        start = 0
        for explicit, run in itertools.groupby(sequences, key=lambda s: s is not None):
            length = sum(1 for _ in run)
            chosen = cast(list[int], sequences[start : start + length]) if explicit else None
            self._seq.add_many(
                route.topic, partition, records[start : start + length], buffer.first_at, chosen, buffer, origin=start
            )
            start += length

    def _take(self, now: float) -> float | None:
        """Hand every due buffer whose partition can take a batch to the sequencer (lock
        held); return when the next one that is not due yet will be, or None. Nothing once
        the sequencer has failed: the buffers are purged with its error (:meth:`_loop`)."""
        if not self._filled or self._seq.failure is not None:
            return None
        keep: list[tuple[Route, int]] = []
        due_at: float | None = None
        for route, partition in self._filled:
            buffer = route.buffers[partition]
            if not buffer.values:
                continue  # taken by send_many or close
            ready = buffer.first_at + self._linger
            due = self._flushing or self._closing or now >= ready or len(buffer.values) >= self._max_batch_records
            if due and self._seq.has_room(route.topic, partition):
                self._hand_over(route, partition)
                continue
            keep.append((route, partition))
            if not due and (due_at is None or ready < due_at):
                due_at = ready
        self._filled = keep
        return due_at

    def _refresh_metadata(self, now: float) -> None:
        """Ask the broker again for the partition count of every topic whose count is older
        than ``metadata_max_age_ms`` (the sender thread, no lock held while asking); none once
        the producer is closing, so that a cluster that does not answer (each question waits
        up to the backend's timeout) does not hold up :meth:`close`."""
        age = self._metadata_max_age
        if now < self._metadata_due:
            return
        self._metadata_due = now + max(age, 0.1)
        stale = {id(r): r for r in list(self._routes.values()) if now - r.checked_at >= age}
        for route in stale.values():
            if self._closing:  # a closing producer sends to the partitions it knows
                return
            try:
                count = self._broker.partitions_for(route.topic)
            except ProducerError as exc:  # keep the count in force; ask again next time
                _LOG.debug("could not refresh the partitions of %s: %s", route.topic, exc)
                continue
            with self._lock:
                route.grow(count, now)

    def _run(self) -> None:
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
        with self._cond:
            if self._halted is None:
                self._halted = error
            self._seq.fail(error)
            events = self._drain_events()
        held = 0
        try:
            held = self._complete(events)
        finally:
            with self._cond:
                self._outstanding -= sum(len(event.batch.records) for event in events)
                self._held += held
                self._cond.notify_all()
            self._purge(self._seq.failure or error)

    def _loop(self) -> None:
        while True:
            self._refresh_metadata(time.monotonic())
            with self._cond:
                now = time.monotonic()
                due_at = self._take(now)
                self._seq.handle_timeout(now)
                self._note_failure()
                batches = self._seq.batches_to_send(now)
                events = self._drain_events()
                # the sequencer failed: what is buffered will never be sent (after the events)
                stranded = self._seq.failure if self._filled and self._seq.failure is not None else None
                if not batches and not events and stranded is None:
                    if self._closing and not self._outstanding:
                        return
                    deadline = self._seq.next_deadline()
                    if due_at is not None and (deadline is None or due_at < deadline):
                        deadline = due_at
                    wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - now))
                    if wait > 0:
                        self._wake_at = now + wait
                        self._cond.wait(wait)
                        self._wake_at = 0.0
                    continue
                self._wake_at = 0.0
            if events:
                held = self._complete(events)
                with self._cond:
                    self._outstanding -= sum(len(event.batch.records) for event in events)
                    self._held += held
                    self._cond.notify_all()
            if batches:
                self._submit(batches)
            if stranded is not None:
                self._purge(stranded)

    def _drain_events(self) -> list[Event]:
        out = []
        while (event := self._seq.next_event()) is not None:
            out.append(event)
        return out

    def _note_failure(self) -> None:
        """Refuse new records once the sequencer has failed (lock held)."""
        if self._halted is None and self._seq.failure is not None:
            self._halted = self._seq.failure

    def _complete(self, events: list[Event]) -> int:
        """Record how ended batches ended: one entry per span of each batch. Returns how many
        records were handed to a span listener: they count against ``max_buffered_records``
        until its owner has served them (:meth:`_served`)."""
        stash = self._txn_events
        if stash is not None:  # an open transaction's: completed at its commit or abort
            stash.extend(events)
            return 0
        listener = self._span_listener
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

    def _served(self, count: int, size: int = 0) -> None:
        """A span listener's owner served the reports of ``count`` records of ``size``
        bytes (see :meth:`Producer._add`): they no longer count against the buffer limits."""
        with self._cond:
            self._held -= count
            self._outstanding_bytes -= size
            self._cond.notify_all()

    def _purge(self, error: ProducerError) -> int:
        """End every record not handed to the sequencer yet with ``error`` (NOT_PERSISTED), as
        librdkafka's ``purge(in_queue=True)`` does; batches already sent are not recalled.
        Returns how many records were purged."""
        with self._cond:
            taken: list[RecordBuffer] = []
            for route, partition in self._filled:
                buffer = route.buffers[partition]
                if buffer.values:
                    route.buffers[partition] = RecordBuffer(route.topic, partition)
                    taken.append(buffer)
            self._filled = []
        listener = self._span_listener
        held = 0
        for buffer in taken:
            segment: Segment = (0, len(buffer), None, -1, False, error, DeliveryStatus.NOT_PERSISTED)
            buffer.ended(segment)
            if listener is not None:
                held += listener(buffer, segment)
        purged = sum(len(buffer) for buffer in taken)
        with self._cond:
            self._outstanding -= purged
            self._held += held
            self._cond.notify_all()
        return purged

    def _begin_flush(self) -> None:
        """Send everything buffered now, and keep doing so until :meth:`_end_flush`."""
        with self._cond:
            self._flushing += 1
            self._seq.flush()
            self._wake_at = 0.0
            self._cond.notify_all()

    def _end_flush(self) -> None:
        with self._cond:
            self._flushing -= 1
            if not self._flushing:
                self._seq.end_flush()

    def _submit(self, batches: list[OutgoingBatch]) -> None:
        """Hand one round's batches to the broker at once (``submit_requests``); their answers
        come back through :meth:`_answered`, at once or later."""
        session = self._session
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
            and getattr(self._broker, "writes_on_submit", False)
            and not getattr(self._broker, "writes_without_lock", False)
        )
        if yielding:
            self._gate.clear()
            self._yielding = True
        try:
            answers = self._broker.submit_requests(requests)
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
                self._yielding = False
                self._gate.set()
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
        with self._cond:
            if error is not None:
                self._seq.handle_error(batch_id, attempt, error, now, retry_at)
            else:
                assert result is not None
                self._seq.handle_result(batch_id, attempt, result, now, retry_at)
            self._note_failure()
            self._wake_at = 0.0
            self._cond.notify_all()
