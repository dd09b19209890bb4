"""The client-side sequencer: a pure state machine that batches, numbers and retries.

Theory of operation
-------------------
Records are added per topic-partition into an *open* batch. A batch is sealed when it is
full (``batch_size`` bytes or ``max_batch_records``), or when ``linger`` has passed since its
first record (at once after :meth:`ProducerSequencer.flush`) and it can be sent at once: while
the partition's window is full, the open batch keeps taking records, as Kafka's accumulator
closes a batch only when it drains it. Sealed batches wait in a queue without a sequence. A
batch gets its ``base_sequence`` when it is first sent (*drain time*) and keeps it across
every retry, so a resend is always recognisable by the broker.

Per partition at most ``max_in_flight`` stamped batches are in flight, kept in sequence
order. Each is either AWAITING an answer or waiting to be RESENT. A batch changes state only
through the one table of :mod:`idempotent.core.transitions` (OPEN, QUEUED, AWAITING, RESEND,
DONE); a move it lacks raises :class:`~idempotent.errors.IllegalStateTransition`. The answers:

==========================  ===============================================================
ACCEPTED / DUPLICATE        the batch is done (persisted, with its offset when known)
OUT_OF_ORDER_SEQUENCE       an earlier batch has not arrived yet: resend in order; if the
                            expected sequence is none of ours, fail: SequenceDesyncError
                            (unless it was acknowledged after the attempt was sent: the
                            answer is older than that acknowledgement, so resend); if it is
                            the base of a batch refused for good, number the batches behind
                            it again from there and resend them; if it is the base of a
                            batch that expired unacknowledged, number the batches behind it
                            again when the broker checks attempts in order (``in_order``),
                            else fail: SequenceDesyncError (a late copy of an expired attempt
                            could land in that hole; only a new epoch fences it); if it
                            lies in a batch of application sequences that expired, this
                            batch fails alone (the application sends the missing ones again)
IN_FLIGHT, RETRY errors     resend the same batch after the backoff the shell chose (the
                            attempt's outcome stays unknown: the batch is *doubtful*)
InvalidBatchError           that batch alone fails, NOT_PERSISTED unless doubtful; its
                            sequences are given back (it numbered itself)
FENCED, UNKNOWN_PRODUCER,   the producer fails: every unfinished message ends NOT_PERSISTED
other fatal errors          (never sent, or every attempt refused) or POSSIBLY_PERSISTED (an
                            attempt awaited, timed out, failed in transport or IN_FLIGHT)
==========================  ===============================================================

While any batch of a partition waits to be resent, the partition sends nothing new and
resends only once no answer is outstanding, then all pending resends in sequence order
(followed by new batches once every resend is out).
Every message ends in exactly one event: :class:`BatchDelivered` or :class:`BatchFailed`.

Every batch names its predecessor at drain time (``previous_sequence``: the last sequence of the
batch sent before it on the partition), kept across retries: under the ``monotonic`` policy the
broker refuses a batch whose predecessor has not arrived, so a batch refused with nothing stored
is never overtaken by the one behind it. An OUT_OF_ORDER_SEQUENCE for a batch whose predecessor
is still in flight resends in order (under ``monotonic`` the expected sequence may lie in a gap
the producer declared). A batch refused for good hands its predecessor on to the batch after it
(none when a copy of it may be stored).

Application-chosen sequences (PIP-6 style): :meth:`ProducerSequencer.add` takes an optional
``sequence``. Records with consecutive explicit sequences share a batch, a jump seals the open
batch and starts a new one at that sequence; a record without a sequence never joins such a
batch (it is numbered at drain time, after everything sent before). When it is sent, an explicit batch is cut where it
crosses the acknowledged sequence or the end of a batch in flight, so it never mixes stored (or
in-flight) sequences with new ones. It keeps its sequences at drain time; the partition's next
implicit sequence moves past it unless it lies entirely behind. Under the
broker's ``monotonic`` policy a jump is accepted; under ``strict`` the broker answers
OUT_OF_ORDER_SEQUENCE with a sequence that is none of ours, so the producer fails with
SequenceDesyncError. A batch at or below the stored sequence comes back as DUPLICATE.
Explicit sequences run up to 2**63-1 (``monotonic``; ``strict`` refuses any above 2**31-1); a
batch of them never crosses 2**31-1 (the next record after it starts a batch at 2**31, see
``_sequence.py``).

The sequencer does not know the broker's policy, and the two read sequences differently: the
int32 ring (``strict``, wrapping to 0) and the 64-bit line (``monotonic``). They agree unless two
ring values are at least 2**30 apart or on either side of 2**31-1
(``order_depends_on_policy``). Sequences the producer numbers itself stay within that distance
of each other, so they are compared on the ring (their wrap is real only under ``strict``; a
``monotonic`` broker refuses it). A batch of application sequences whose place relative to the
partition's next or acknowledged sequence depends on the policy is *undecided*: it is sent
alone, after every batch before it is answered and before any batch after it is numbered, and
the answer places it. ACCEPTED: it lies ahead (acknowledged, and the next sequence follows
it). DUPLICATE: it lies behind (nothing moves), unless an earlier attempt of it went
unanswered, which leaves both readings open and fails the producer with SequenceDesyncError.

The sequencer reads no clock and does no I/O; the shell (``producer.py``) passes ``now``,
sends what :meth:`batches_to_send` returns, feeds answers back and sleeps until
:meth:`next_deadline`.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Mapping
from collections.abc import Sequence as SequenceOf

from idempotent.core.batches import BatchDelivered as BatchDelivered
from idempotent.core.batches import BatchFailed as BatchFailed
from idempotent.core.batches import Event as Event
from idempotent.core.batches import OutgoingBatch as OutgoingBatch
from idempotent.core.batches import Spans as Spans
from idempotent.core.batches import check_sequence
from idempotent.core.batches import sequences_for as sequences_for
from idempotent.core.outcomes import DeliveryStatus, Outcome, ProduceResult
from idempotent.core.records import Record, RecordColumns, record_sizes
from idempotent.core.send_window import (
    SendWindow,
    abandon,
    abandoned_at,
    continues,
    cut_at_frontier,
    link,
    seal,
    settle_abandoned,
    undecided,
)
from idempotent.core.sequence import (
    at_or_before,
    crosses_ring_end,
    last_sequence_of,
    next_sequence,
    order_depends_on_policy,
)
from idempotent.core.transitions import BatchState, BatchTrigger, transition
from idempotent.core.types import DEFAULT_MAX_IN_FLIGHT, NO_SEQUENCE, TopicPartition
from idempotent.errors import (
    ConfigError,
    DeliveryTimeoutError,
    IllegalStateTransition,
    InvalidBatchError,
    ProducerClosedError,
    ProducerError,
    ProducerFencedError,
    Recovery,
    SequenceDesyncError,
    TransactionAbortableError,
    UnknownProducerError,
)

#: the triggers of :mod:`idempotent.core.transitions`, bound once: on this per-batch path a global
#: is several times cheaper to read than an enum member
_SEAL, _SEND, _RETRY = BatchTrigger.SEAL, BatchTrigger.SEND, BatchTrigger.RETRY
_REFUSE, _DELIVER, _FAIL = BatchTrigger.REFUSE, BatchTrigger.DELIVER, BatchTrigger.FAIL


class ProducerSequencer:
    """Client-side batching, sequencing and retry logic. See the module docstring.

    Args:
        producer_id, producer_epoch: the identity from ``init_producer``.
        last_sequences: last persisted sequence per partition (a resumed named producer).
        max_in_flight: pipelined batches per partition.
        batch_size: seal a batch at this many bytes.
        max_batch_records: seal a batch at this many records.
        linger: seconds a non-full batch waits for more records.
        request_timeout: seconds without an answer before a batch is resent.
        delivery_timeout: seconds after which an unfinished message fails.
        in_order: the shell's broker checks a partition's attempts in the order they were
            sent (an in-process broker): no copy of an earlier attempt arrives after a later
            one. Only then is a hole left by batches that expired unanswered filled under
            this epoch (the batches behind it numbered again); otherwise it fails the
            producer with SequenceDesyncError.

    Raises:
        ConfigError: an option is out of range.
    """

    def __init__(
        self,
        producer_id: int,
        producer_epoch: int,
        last_sequences: Mapping[TopicPartition, int] | None = None,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        batch_size: int = 1024 * 1024,
        max_batch_records: int = 10_000,
        linger: float = 0.005,
        request_timeout: float = 30.0,
        delivery_timeout: float = 120.0,
        in_order: bool = False,
    ) -> None:
        if not 1 <= max_in_flight <= 1000:
            raise ConfigError(f"max_in_flight must be 1..1000, got {max_in_flight}")
        if batch_size < 1 or not 1 <= max_batch_records <= 1_000_000:
            raise ConfigError("batch_size and max_batch_records must be positive (records at most 1,000,000)")
        if linger < 0 or request_timeout <= 0 or delivery_timeout <= 0:
            raise ConfigError("linger must be >= 0 and the timeouts positive")
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.max_in_flight = max_in_flight
        self.batch_size = batch_size
        self.max_batch_records = max_batch_records
        self.linger = linger
        self.request_timeout = request_timeout
        self.delivery_timeout = delivery_timeout
        self.in_order = in_order
        self._last = {TopicPartition(*k): v for k, v in (last_sequences or {}).items()}
        self._partitions: dict[TopicPartition, SendWindow] = {}
        self._batches: dict[int, OutgoingBatch] = {}
        self._events: deque[Event] = deque()
        self._next_batch_id = 0
        self._next_handle = 0
        self._flushing = False
        self._acked: dict[TopicPartition, int] = dict(self._last)
        #: set by :meth:`add` when it opened or sealed a batch (the next deadline moved); a
        #: shell may wake its sender only then, and clears the flag itself
        self.wakeup = False
        self.failure: ProducerError | None = None
        self.unfinished = 0

    # -- queries ---------------------------------------------------------------------------

    def next_sequence(self, topic: str, partition: int) -> int:
        """The sequence the next new batch of the partition will start at."""
        ps = self._partitions.get(TopicPartition(topic, partition))
        if ps is not None:
            return ps.next_sequence
        return next_sequence(self._last.get(TopicPartition(topic, partition), NO_SEQUENCE))

    def last_acknowledged(self, topic: str, partition: int) -> int:
        """Highest sequence known persisted on the partition (from init or answers), or -1."""
        return self._acked.get(TopicPartition(topic, partition), NO_SEQUENCE)

    def has_room(self, topic: str, partition: int) -> bool:
        """Whether a batch of the partition sealed now could be sent at once: no batch is
        queued, fewer than ``max_in_flight`` are in flight and none waits to be resent. A
        shell that buffers records itself hands them over only then, so a partition whose
        window is full sends fuller batches (as Kafka's accumulator does)."""
        ps = self._partitions.get(TopicPartition(topic, partition))
        return ps is None or self._has_room(ps)

    def in_flight(self, topic: str, partition: int) -> int:
        """Stamped batches of the partition not yet answered for good."""
        ps = self._partitions.get(TopicPartition(topic, partition))
        return 0 if ps is None else len(ps.inflight)

    # -- input -----------------------------------------------------------------------------

    def add(self, topic: str, partition: int, record: Record, now: float, sequence: int | None = None) -> int:
        """Queue a record and return its handle (reported back in the batch's ``handles``).

        Args:
            sequence: the record's sequence chosen by the application (``0 .. 2**63-1``; the
                broker's ``strict`` policy takes ``0 .. 2**31-1`` only), or None to number it
                after the partition's previous record.

        Raises:
            UsageError: ``sequence`` is not a valid sequence; nothing queued.
            ProducerError: the producer has failed (the error that failed it).
        """
        handle = self._next_handle
        self.add_one(topic, partition, record, now, sequence, handle)
        self._next_handle += 1
        return handle

    def add_one(
        self, topic: str, partition: int, record: Record, now: float, sequence: int | None, owner: object
    ) -> None:
        """:meth:`add_many` for one record (the span ``(owner, 0, 1)``), on a shorter path.

        Raises:
            UsageError: ``sequence`` is not a valid sequence; nothing queued.
            ProducerError: the producer has failed (the error that failed it).
        """
        if self.failure is not None:
            raise self.failure
        if sequence is not None:
            check_sequence(sequence)
        tp = TopicPartition(topic, partition)
        ps = self._partitions.get(tp)
        if ps is None:
            ps = self._partitions[tp] = self._new_partition(tp)
        size = record.size
        batch = self._batch_for(ps, topic, partition, size, sequence, now)
        if type(batch.records) is not list:
            batch.records = list(batch.records)
        batch.records.append(record)
        spans = batch.spans
        spans.owners.append(owner)
        spans.starts.append(0)
        spans.counts.append(1)
        batch.size += size
        if size > batch.largest:
            batch.largest = size
        self.unfinished += 1
        if len(batch.records) >= self.max_batch_records or batch.size >= self.batch_size:
            seal(ps)  # full: do not wait for linger
            self.wakeup = True

    def add_many(
        self,
        topic: str,
        partition: int,
        records: SequenceOf[Record],
        now: float,
        sequence: int | SequenceOf[int] | None,
        owner: object,
        sizes: SequenceOf[int] | None = None,
        origin: int = 0,
    ) -> None:
        """Queue ``records`` for one partition, all for ``owner``; batches report them as
        spans ``(owner, start, count)`` where ``start`` is the position in ``records`` plus
        ``origin`` (the position of ``records[0]`` in whatever the owner numbers).

        Args:
            sequence: None to number the records after the partition's previous record; an
                int: the first record's sequence, the others following it; or one sequence per
                record (a jump starts a new batch).
            sizes: each record's :attr:`Record.size`, when the caller has them already.

        Raises:
            UsageError: a sequence is invalid, or their count differs from the records';
                nothing queued.
            ProducerError: the producer has failed (the error that failed it); nothing queued.
        """
        if self.failure is not None:
            raise self.failure
        count = len(records)
        sequences = sequences_for(count, sequence)
        tp = TopicPartition(topic, partition)
        ps = self._partitions.get(tp)
        if ps is None:
            ps = self._partitions[tp] = self._new_partition(tp)
        if sizes is None:
            sizes = record_sizes(records)
        max_records, max_bytes = self.max_batch_records, self.batch_size
        # sums[i]: the bytes of records[:i]. Where no sequence jumps (none given, or a range
        # that stays on one side of the int32 ring's end), batches are cut by bisection.
        contiguous = sequences is None or (type(sequences) is range and not crosses_ring_end(sequences.start, count))
        sums = [0, *itertools.accumulate(sizes)] if contiguous else None
        position = 0
        while position < count:
            first = None if sequences is None else sequences[position]
            batch = self._batch_for(ps, topic, partition, sizes[position], first, now)
            # take every following record that fits: room, bytes, and (explicit) no jump
            room = max_records - len(batch.records)
            size = batch.size
            if sums is not None:
                limit = max_bytes - size + sums[position]
                end = bisect.bisect_right(sums, limit, position + 1, min(count, position + room) + 1) - 1
                end = max(end, position + 1)  # a batch takes at least one record
                size += sums[end] - sums[position]
            else:
                end = position
                while end < count and end - position < room:
                    record_size = sizes[end]
                    if end > position and size + record_size > max_bytes:
                        break
                    if sequences is not None and end > position and sequences[end] != next_sequence(sequences[end - 1]):
                        break
                    size += record_size
                    end += 1
                    if size >= max_bytes:
                        break
            taken = records[position:end]
            held = batch.records
            if isinstance(taken, RecordColumns) and not held:
                batch.records = taken  # kept as columns while only such calls fill the batch
            elif isinstance(taken, RecordColumns) and isinstance(held, RecordColumns):
                batch.records = held + taken
            elif isinstance(held, list):
                held.extend(taken)
            else:
                batch.records = [*held, *taken]
            batch.spans.add(owner, origin + position, end - position)
            batch.size = size
            largest = max(sizes[position:end])
            if largest > batch.largest:
                batch.largest = largest
            self.unfinished += end - position
            position = end
            if len(batch.records) >= max_records or batch.size >= max_bytes:
                seal(ps)  # full: do not wait for linger
                self.wakeup = True

    def _new_partition(self, tp: TopicPartition) -> SendWindow:
        last = self._last.get(tp, NO_SEQUENCE)
        return SendWindow(next_sequence(last), last)

    def _batch_for(
        self, ps: SendWindow, topic: str, partition: int, size: int, sequence: int | None, now: float
    ) -> OutgoingBatch:
        """The open batch that takes a record of ``size`` bytes (with explicit ``sequence``):
        the current one, or a new one after sealing the current one when it is full or the
        sequence does not continue it. A record without a sequence never joins a batch of the
        application's sequences: that one may lie behind the partition's next sequence (a
        resend), and the record would get a stored sequence and be dropped as a duplicate."""
        batch = ps.open
        if batch is not None and (
            len(batch.records) >= self.max_batch_records
            or batch.size + size > self.batch_size
            or (not continues(batch, sequence) if sequence is not None else batch.explicit)
        ):
            seal(ps)
            batch = None
        if batch is None:
            self.wakeup = True
            batch = OutgoingBatch(self._next_batch_id, topic, partition, [], Spans(), now)
            if sequence is not None:
                batch.base_sequence, batch.explicit = sequence, True
            self._next_batch_id += 1
            self._batches[batch.batch_id] = batch
            ps.open = batch
        return batch

    def _split_at_frontier(self, ps: SendWindow, batch: OutgoingBatch) -> None:
        """Cut an explicit batch where it crosses the acknowledged sequence or the end of a
        batch in flight (see :func:`cut_at_frontier`); the tail goes back to the front of the
        queue, so it is examined next."""
        tail = cut_at_frontier(ps, batch, self._acked.get(batch.topic_partition, NO_SEQUENCE), self._next_batch_id)
        if tail is not None:
            self._next_batch_id += 1
            self._batches[tail.batch_id] = tail
            ps.queued.appendleft(tail)

    def rewind(self, last_sequences: Mapping[TopicPartition, int]) -> None:
        """Continue each partition after its ``last_sequences`` entry, giving back the
        sequences numbered after it (an aborted transaction's: its broker forgot them).

        Raises:
            IllegalStateTransition: a partition still has batches open, queued or in flight.
        """
        for key, last in last_sequences.items():
            tp = TopicPartition(*key)
            ps = self._partitions.get(tp)
            if ps is not None and (ps.open is not None or ps.queued or ps.inflight):
                raise IllegalStateTransition(f"{tp.topic}[{tp.partition}]: rewound with batches in flight")
            self._partitions.pop(tp, None)
            self._last[tp] = last
            self._acked[tp] = last

    def flush(self) -> None:
        """Seal every open batch now, and keep sealing at once until :meth:`end_flush`."""
        self._flushing = True

    def end_flush(self) -> None:
        """Return to lingering."""
        self._flushing = False

    # -- output ----------------------------------------------------------------------------

    def batches_to_send(self, now: float) -> list[OutgoingBatch]:
        """Batches to transmit now, in order; each is marked AWAITING under a new attempt."""
        if self.failure is not None:
            return []
        out: list[OutgoingBatch] = []
        for ps in self._partitions.values():
            if any(b.state is BatchState.RESEND for b in ps.inflight):
                if any(b.state is BatchState.AWAITING for b in ps.inflight):
                    continue
                for batch in ps.inflight:
                    if batch.not_before > now:
                        break
                    out.append(self._transmit(batch, now))
                if any(b.state is BatchState.RESEND for b in ps.inflight):
                    continue  # new batches follow once every resend is out
            while len(ps.inflight) < self.max_in_flight and ps.undecided is None:
                if not ps.queued:
                    # the open batch is sealed when it is due and can leave at once
                    if ps.open is None or not (self._flushing or now >= ps.open.created_at + self.linger):
                        break
                    seal(ps)
                batch = ps.queued.popleft()
                if batch.explicit:
                    self._split_at_frontier(ps, batch)
                    if undecided(ps, batch, self._acked.get(batch.topic_partition, NO_SEQUENCE)):
                        if ps.inflight:  # it goes alone, once every batch before it is answered
                            ps.queued.appendleft(batch)
                            break
                        ps.undecided = batch
                if not batch.explicit:
                    batch.base_sequence = ps.next_sequence
                    ps.next_sequence = next_sequence(ps.next_sequence, len(batch.records))
                else:
                    last = last_sequence_of(batch.base_sequence, len(batch.records))
                    if not order_depends_on_policy(ps.next_sequence, last) and at_or_before(ps.next_sequence, last):
                        ps.next_sequence = next_sequence(batch.base_sequence, len(batch.records))
                link(ps, batch)
                ps.inflight.append(batch)
                out.append(self._transmit(batch, now))
        return out

    def _has_room(self, ps: SendWindow) -> bool:
        """Whether a batch sealed now could be sent at once. Until then the open batch keeps
        taking records (as Kafka's accumulator closes a batch only when it drains it), so a
        partition whose window is full sends fuller batches instead of many small ones."""
        return (
            not ps.queued
            and ps.undecided is None
            and len(ps.inflight) < self.max_in_flight
            and not any(b.state is BatchState.RESEND for b in ps.inflight)
        )

    def _transmit(self, batch: OutgoingBatch, now: float) -> OutgoingBatch:
        batch.state = transition(batch.state, _SEND)
        batch.attempt += 1
        batch.sent_at = now
        batch.acked_at_send = self._acked.get(batch.topic_partition, NO_SEQUENCE)
        batch.previous_at_send = batch.previous_sequence
        return batch

    def next_event(self) -> Event | None:
        """The next delivery or failure event, or None."""
        return self._events.popleft() if self._events else None

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timeout` or :meth:`batches_to_send` next has work, or None."""
        deadlines: list[float] = []
        for ps in self._partitions.values():
            if ps.open is not None:
                if self._has_room(ps):  # else the answer that makes room wakes the shell
                    deadlines.append(ps.open.created_at + (0.0 if self._flushing else self.linger))
                deadlines.append(ps.open.created_at + self.delivery_timeout)
            if ps.queued:
                deadlines.append(ps.queued[0].created_at + self.delivery_timeout)
            awaiting = False
            for b in ps.inflight:
                if b.state is BatchState.AWAITING:
                    awaiting = True
                    deadlines.append(b.sent_at + self.request_timeout)
                deadlines.append(b.created_at + self.delivery_timeout)
            if ps.inflight and not awaiting:
                # resends wait for every answer, then go out in order from the first one
                deadlines.append(ps.inflight[0].not_before)
        return min(deadlines) if deadlines else None

    # -- answers ---------------------------------------------------------------------------

    def _current(self, batch_id: int, attempt: int, stored: bool = False) -> OutgoingBatch | None:
        batch = self._batches.get(batch_id)
        if batch is None or attempt > batch.attempt:
            return None
        if batch.attempt == attempt and batch.state is BatchState.AWAITING:
            return batch
        # An answer to an older attempt that says the batch is stored is still true: take it,
        # or a request timeout shorter than the round trip would resend forever.
        if stored and batch.state in (BatchState.AWAITING, BatchState.RESEND):
            return batch
        return None

    def handle_result(self, batch_id: int, attempt: int, result: ProduceResult, now: float, retry_at: float) -> None:
        """Feed the broker's answer to one transmission. Stale answers are ignored.

        ``retry_at`` is when a retriable outcome (IN_FLIGHT) may be resent (the shell's backoff).
        """
        batch = self._current(batch_id, attempt, result.outcome.stored)
        if batch is None:
            return
        outcome = result.outcome
        if outcome.stored:
            tp = batch.topic_partition
            last = last_sequence_of(batch.base_sequence, len(batch.records))
            previous = self._acked.get(tp, NO_SEQUENCE)
            ps = self._partitions[tp]
            undecided = ps.undecided is batch
            if undecided and order_depends_on_policy(last, previous):
                if outcome is Outcome.ACCEPTED:  # a broker stores only what follows its last sequence
                    self._acked[tp] = last
            elif previous == NO_SEQUENCE or not at_or_before(last, previous):
                self._acked[tp] = last
            failure = self._place(ps, batch, outcome) if undecided else None
            if ps.expired:  # the expired batches before a stored one are settled: no hole there
                ps.expired = {b for b in ps.expired if not at_or_before(b, batch.base_sequence)}
            if ps.abandoned:
                settle_abandoned(ps, last)
            self._finish(batch, _DELIVER)
            self._events.append(BatchDelivered(batch, result.base_offset, outcome is Outcome.DUPLICATE))
            if failure is not None:
                self._fail_all(failure)
        elif outcome is Outcome.OUT_OF_ORDER_SEQUENCE:
            tp = batch.topic_partition
            ps = self._partitions[tp]
            earlier = {b.base_sequence for b in ps.inflight if b is not batch}
            expected = result.expected_sequence
            # an answer overtaken by the acknowledgement of the sequence it asks for (it was
            # acknowledged after this attempt was sent): the gap is filled, just resend
            stale = (
                expected is not None
                and at_or_before(expected, self._acked.get(tp, NO_SEQUENCE))
                and not at_or_before(expected, batch.acked_at_send)
            )
            if expected in earlier or stale:
                batch.state, batch.not_before = transition(batch.state, _RETRY), now
            elif expected is not None and expected == ps.given_back and self._renumber(ps, batch, expected):
                pass  # refused behind a batch that was refused for good: numbered again
            elif (
                expected is not None
                and expected in ps.expired
                and self.in_order
                and self._renumber(ps, batch, expected, expired=True)
            ):
                pass  # behind batches that expired and are not stored: numbered again
            elif self._predecessor_pending(ps, batch, expected):
                batch.state, batch.not_before = transition(batch.state, _RETRY), now
            elif expected is not None and expected in ps.expired:
                # the broker lacks the sequences of batches that expired unanswered, and its
                # link may reorder attempts: numbering later records into that hole is unsafe
                # without a new epoch, as a late copy of an expired attempt could still be
                # stored there and a renumbered batch answered DUPLICATE of it (its records
                # lost), or the other way round
                batch.state = transition(batch.state, _REFUSE)  # answered: this attempt was refused
                self._fail_all(
                    SequenceDesyncError(
                        f"{tp}: broker expects sequence {expected}, of a batch that expired unacknowledged "
                        f"after {self.delivery_timeout} s (POSSIBLY_PERSISTED); the records after it cannot be "
                        "numbered again under this epoch: start a new producer instance (a named producer "
                        "continues from the broker's last sequence under a new epoch)",
                        expected,
                    )
                )
            elif batch.explicit and expected is not None and abandoned_at(ps, expected):
                # the broker wants application sequences whose batch failed alone (expired):
                # nothing of this one is stored; it fails alone and the producer goes on, for
                # the application to send the missing sequences again
                abandon(ps, batch)
                self._refuse(
                    batch,
                    SequenceDesyncError(
                        f"{tp}: broker expects sequence {expected} (it holds up to {expected - 1}); "
                        f"sequences {batch.base_sequence}.. not stored: send the records from {expected} "
                        "again, with their sequences",
                        expected,
                    ),
                )
            else:
                self._fail_all(
                    SequenceDesyncError(
                        f"{batch.topic_partition}: broker expects sequence {result.expected_sequence}, "
                        f"which this producer never sent or already saw acknowledged",
                        result.expected_sequence if result.expected_sequence is not None else -1,
                    )
                )
        elif outcome is Outcome.IN_FLIGHT:
            batch.state, batch.not_before = transition(batch.state, _RETRY), retry_at
            batch.doubtful = True
        elif outcome is Outcome.FENCED:
            batch.state = transition(batch.state, _REFUSE)  # answered: this attempt was refused
            self._fail_all(
                ProducerFencedError(
                    f"producer {self.producer_id} epoch {self.producer_epoch} "
                    f"was fenced by epoch {result.producer_epoch}",
                    self.producer_id,
                    self.producer_epoch,
                )
            )
        else:
            batch.state = transition(batch.state, _REFUSE)  # answered: this attempt was refused
            self._fail_all(
                UnknownProducerError(
                    f"broker has no state for producer {self.producer_id} on {batch.topic_partition}; "
                    "initialise a new producer",
                    self.producer_id,
                )
            )

    @staticmethod
    def _place(ps: SendWindow, batch: OutgoingBatch, outcome: Outcome) -> SequenceDesyncError | None:
        """Move the partition's next sequence past a batch sent alone (``ps.undecided``) when
        its answer says it lies ahead: ACCEPTED (a broker stores only what follows its last
        sequence). DUPLICATE says it lies behind, unless an earlier attempt of it went
        unanswered: then the copy the broker holds may be that attempt's (a jump the
        ``monotonic`` policy accepted) or older data (behind, ``strict``), and a record
        without a sequence cannot be numbered safely. Returns the error that then fails the
        producer (a new instance continues from the broker's last sequence)."""
        last = last_sequence_of(batch.base_sequence, len(batch.records))
        if not order_depends_on_policy(ps.next_sequence, last):
            return None  # placed when it was sent
        if outcome is Outcome.ACCEPTED:
            ps.next_sequence = next_sequence(batch.base_sequence, len(batch.records))
            return None
        if batch.doubtful and ps.next_sequence <= last:
            return SequenceDesyncError(
                f"{batch.topic_partition}: sequences {batch.base_sequence}..{last} are stored, maybe by an "
                f"unanswered attempt of this batch; whether they lie after this producer's next sequence "
                f"{ps.next_sequence} (monotonic policy) or before it (strict) decides where records without "
                "a sequence go: start a new producer instance, which continues from the broker's last sequence"
            )
        return None

    def _predecessor_pending(self, ps: SendWindow, batch: OutgoingBatch, expected: int | None) -> bool:
        """Whether a ``monotonic`` broker refused ``batch`` because the batch it names as its
        predecessor had not arrived: the broker ``expected`` a sequence at or before that
        one's (with the application's sequences it may lie in a declared gap), and that batch
        is still in flight, was acknowledged after the attempt was sent, or was refused for
        good so that ``batch`` now names another one."""
        previous = batch.previous_at_send
        if previous is None or expected is None:
            return False
        if batch.previous_sequence != previous:
            return True
        for b in ps.inflight:
            if b is not batch and last_sequence_of(b.base_sequence, len(b.records)) == previous:
                return expected <= b.base_sequence  # the monotonic policy does not wrap
        acked = self._acked.get(batch.topic_partition, NO_SEQUENCE)
        return (
            previous != NO_SEQUENCE
            and acked != NO_SEQUENCE
            and expected <= previous
            and at_or_before(previous, acked)
            and (batch.acked_at_send == NO_SEQUENCE or not at_or_before(previous, batch.acked_at_send))
        )

    def handle_error(self, batch_id: int, attempt: int, error: ProducerError, now: float, retry_at: float) -> None:
        """Feed a failed transmission: retriable errors resend at ``retry_at``; a batch the broker
        refused for good (:class:`InvalidBatchError`: nothing of it was stored) fails alone and
        gives its sequences back; other errors fail the producer."""
        batch = self._current(batch_id, attempt)
        if batch is None:
            return
        if error.recovery is Recovery.RETRY:
            batch.state, batch.not_before = transition(batch.state, _RETRY), retry_at
            batch.doubtful = True
        elif isinstance(error, (InvalidBatchError, TransactionAbortableError)):
            # refused for good, or its application transaction failed: nothing of it is stored
            self._refuse(batch, error)
        else:
            batch.state = transition(batch.state, _REFUSE)  # answered: this attempt was refused
            self._fail_all(error)

    def _refuse(self, batch: OutgoingBatch, error: ProducerError) -> None:
        """End one batch the broker will never store; the producer keeps working.

        Its sequences are given back when nothing of it can be stored (no doubtful attempt)
        and it numbered itself: the partition's next batch starts at its base sequence, or, when
        later batches are already in flight, the OUT_OF_ORDER_SEQUENCE answers they get for that
        base renumber them (:meth:`_renumber`)."""
        ps = self._partitions[batch.topic_partition]
        later = ps.inflight[ps.inflight.index(batch) + 1 :]
        doubtful = batch.doubtful
        self._finish(batch, _FAIL)
        status = DeliveryStatus.POSSIBLY_PERSISTED if doubtful else DeliveryStatus.NOT_PERSISTED
        self._events.append(BatchFailed(batch, error, status))
        if batch.previous_sequence is not None or doubtful:
            # the batch after it names the one before it (nothing of it is stored), or no
            # predecessor at all when a copy of it may be stored
            link = None if doubtful else batch.previous_sequence
            last = last_sequence_of(batch.base_sequence, len(batch.records))
            following = [b for b in later if b.previous_sequence == last]
            if following:
                following[0].previous_sequence = link
            elif ps.sent == last:
                ps.sent = link
        if doubtful or batch.explicit:
            return
        if later:
            ps.given_back = batch.base_sequence
        elif ps.next_sequence == next_sequence(batch.base_sequence, len(batch.records)):
            ps.next_sequence = batch.base_sequence

    def _renumber(self, ps: SendWindow, batch: OutgoingBatch, start: int, *, expired: bool = False) -> bool:
        """``batch`` was refused OUT_OF_ORDER_SEQUENCE behind the hole a batch refused for good
        left at ``start``. Once every batch in flight behind the hole has been refused like
        this, number them again from ``start`` and resend them. False (the producer fails)
        when one of them cannot be numbered again: it carries the application's sequences, or
        an attempt of it went unanswered: a late copy of that attempt may still reach the
        broker under its old sequence after the renumbered resend is stored, and be taken as
        the next sequence. Nothing changes then.

        ``expired``: the hole is where a batch that expired unacknowledged began
        (:attr:`SendWindow.expired`) and the broker checks attempts in the order they were
        sent (``in_order``). Its answer then shows that nothing from ``start`` on is stored
        and that no earlier attempt is still on its way (and a broker that writes a group
        before it answers settles a write in doubt before the next one), so batches sent
        behind the hole are numbered again even when an attempt of theirs went unanswered."""
        tail = [b for b in ps.inflight if at_or_before(start, b.base_sequence)]
        if any(b.explicit or (b.doubtful and not expired) for b in tail):
            return False
        batch.state, batch.not_before = transition(batch.state, _RETRY), 0.0
        if any(b.state is BatchState.AWAITING for b in tail):
            return True  # wait for their answers: an attempt in transit could still be stored
        sequence, previous = start, tail[0].previous_sequence if tail else ps.sent
        for b in tail:
            b.base_sequence, b.previous_sequence = sequence, previous
            previous = last_sequence_of(sequence, len(b.records))
            sequence = next_sequence(sequence, len(b.records))
        ps.next_sequence, ps.sent = sequence, previous
        ps.given_back = None
        ps.expired.clear()
        return True

    def handle_timeout(self, now: float) -> None:
        """Resend transmissions unanswered for ``request_timeout``; fail messages past
        ``delivery_timeout``, each batch alone: one never sent is NOT_PERSISTED (it used no
        sequence), one sent is POSSIBLY_PERSISTED (an attempt of it may be stored) and the
        batch after it names no predecessor (see :meth:`_refuse`). The producer keeps working:
        once the broker answers again, the batches after them are sent (and stored when the
        broker holds the expired ones; a broker that asks for an expired batch's sequence
        fails the producer, see :meth:`handle_result`)."""
        if self.failure is not None:
            return
        for ps in self._partitions.values():
            for b in [b for b in ps.inflight if b.created_at + self.delivery_timeout <= now]:
                b.doubtful = True  # sent at least once, without a definite answer
                if not b.explicit:
                    ps.expired.add(b.base_sequence)
                else:
                    abandon(ps, b)
                self._refuse(
                    b,
                    DeliveryTimeoutError(
                        f"{b.topic_partition}: batch at sequence {b.base_sequence} not acknowledged "
                        f"within {self.delivery_timeout} s"
                    ),
                )
            for b in ps.inflight:
                if b.state is BatchState.AWAITING and b.sent_at + self.request_timeout <= now:
                    b.state, b.not_before = transition(b.state, _RETRY), now
                    b.doubtful = True
            expired = [b for b in ps.queued if b.created_at + self.delivery_timeout <= now]
            if ps.open is not None and ps.open.created_at + self.delivery_timeout <= now:
                expired.append(ps.open)
                ps.open = None
            for b in expired:
                if b in ps.queued:
                    ps.queued.remove(b)
                self._finish(b, _FAIL)
                self._events.append(
                    BatchFailed(
                        b,
                        DeliveryTimeoutError(f"{b.topic_partition}: not sent within {self.delivery_timeout} s"),
                        DeliveryStatus.NOT_PERSISTED,
                    )
                )

    def fail(self, error: ProducerError) -> None:
        """Fail every unfinished message with ``error`` (unless the sequencer failed already)
        and refuse new ones: the producer cannot go on (its sender ended on a bug)."""
        if self.failure is None:
            self._fail_all(error)

    def close(self) -> None:
        """Fail every unfinished message (closing without flush)."""
        if self.failure is None:
            self._fail_all(ProducerClosedError("producer closed before the message was delivered"))

    # -- internals -------------------------------------------------------------------------

    def _finish(self, batch: OutgoingBatch, trigger: BatchTrigger) -> None:
        """End a batch (``trigger``: DELIVER or FAIL) and forget it."""
        batch.state = transition(batch.state, trigger)
        self._batches.pop(batch.batch_id, None)
        ps = self._partitions.get(batch.topic_partition)
        if ps is not None:
            if batch in ps.inflight:
                ps.inflight.remove(batch)
            if ps.undecided is batch:
                ps.undecided = None
        self.unfinished -= len(batch.records)

    def _fail_all(self, error: ProducerError) -> None:
        self.failure = error
        for ps in self._partitions.values():
            batches = [*ps.inflight, *ps.queued] + ([ps.open] if ps.open is not None else [])
            ps.inflight, ps.queued, ps.open = [], deque(), None
            for b in batches:
                # NOT_PERSISTED only when nothing of it can be stored: never sent, or every
                # attempt answered with a refusal. An attempt without a definite answer (one
                # still awaited, timed out, failed in transport, or IN_FLIGHT) may be stored.
                unknown = b.doubtful or b.state is BatchState.AWAITING
                status = DeliveryStatus.POSSIBLY_PERSISTED if unknown else DeliveryStatus.NOT_PERSISTED
                self._finish(b, _FAIL)
                self._events.append(BatchFailed(b, error, status))
