"""How the records a producer was handed end: per-batch outcomes and light futures.

A :class:`~idempotent.producer.producer.Producer` keeps the records it is given for one partition in a
:class:`RecordBuffer`: parallel columns (values, keys, and headers, sequences and callbacks
when a record has them), one entry per record and no object per record. The producer's sender
takes the whole buffer at once and hands it to the sequencer, which cuts it into batches and
reports each batch's end as a *span* of the buffer (``start``, ``count``). The buffer keeps one
*segment* per ended span: the batch's base offset and sequence, whether it was a duplicate, or
how it failed. A record's outcome is found from its position; nothing is done per record when
a batch ends, unless the record has a callback or someone waits on its future.

:class:`DeliveryFuture` is the future :meth:`Producer.send` returns: two references (the buffer
and the position). It builds the record's :class:`RecordMetadata` when asked, and waits on a
condition the buffer makes only when someone blocks. It offers the methods of
:class:`concurrent.futures.Future` that concern a result (``result``, ``exception``, ``done``,
``add_done_callback``) and :meth:`DeliveryFuture.concurrent` for code that needs a real one
(``concurrent.futures.wait``, ``asyncio.wrap_future``).

:class:`SendManyFuture` and :class:`Deliveries` are the same idea for :meth:`Producer.send_many`:
one future for many records, outcomes built when read.

Threads: a buffer's columns are filled by callers under the producer's lock and read by the
sender after it took the buffer; segments are added by the sender thread only. Readers of
outcomes (futures) take no lock: a segment is complete before it is appended, and appending
to a list is atomic.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from itertools import repeat
from typing import Any, cast, overload

from idempotent.core.outcomes import DeliveryStatus, RecordMetadata
from idempotent.core.records import Headers
from idempotent.core.sequence import sequence_at
from idempotent.core.types import MAX_SEQUENCE
from idempotent.errors import DeliveryFailed, ProducerError

#: a RecordMetadata from its fields' tuple, without a Python-level call per record
_new_metadata = partial(tuple.__new__, RecordMetadata)
_LOG = logging.getLogger("idempotent.producer.producer")

#: A callback per record of :meth:`Producer.send`: ``on_delivery(error, metadata)``, exactly
#: one of which is None.
DeliveryCallback = Callable[[DeliveryFailed | None, RecordMetadata | None], object]

#: How a span of records ended: ``(start, count, base_offset, base_sequence, duplicate,
#: error, status)``; ``error`` is None for records persisted (or found duplicates), and then
#: ``base_offset`` is the offset of the record at ``start`` (None: a duplicate outside the
#: checker's window); ``base_sequence`` is -1 when the records never got sequences.
Segment = tuple[int, int, "int | None", int, bool, "ProducerError | None", DeliveryStatus]

#: Guards the waiter conditions and the callback lists of every buffer: held for a few
#: instructions, never while calling out.
_WAITERS = threading.Lock()


def failed(error: ProducerError, status: DeliveryStatus, topic: str, partition: int, sequence: int) -> DeliveryFailed:
    """The :class:`DeliveryFailed` of one record of a batch that ended with ``error``."""
    failure = DeliveryFailed(
        f"{topic}[{partition}]: {status.value}: {error}", status, error.recovery, topic, partition, sequence
    )
    failure.__cause__ = error
    return failure


class RecordBuffer:
    """The records a producer was given for one partition between two takes of its sender.

    Columns (one entry per record, in the order given): ``values``; ``keys``, ``headers``,
    ``sequences``, ``timestamps``, ``callbacks`` and ``reports`` are None until a record has
    one (then the earlier records' entries are None). ``first_at`` is the producer's clock
    when the first record arrived, ``created_ms`` the wall clock then.
    Outcomes are recorded per span by :meth:`ended`.

    Records go in through :meth:`append`, or, while ``plain`` is true, a record with a value
    only may be appended to ``values`` alone (the producers' per-record path); nothing else
    starts a column.
    """

    __slots__ = (
        "_cond",
        "_waiting",
        "callbacks",
        "created_ms",
        "extra",
        "first_at",
        "headers",
        "keys",
        "partition",
        "plain",
        "reports",
        "segments",
        "sequences",
        "timestamps",
        "topic",
        "values",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[Headers | None] | None = None
        self.sequences: list[int | None] | None = None
        self.callbacks: list[DeliveryCallback | None] | None = None
        #: per record: what a drop-in serves the record's report with (its own callback), kept
        #: for it and never called here (see ``DropInPort.listen``)
        self.reports: list[object] | None = None
        #: per record: its own time in milliseconds (None: the time its batch is stored)
        self.timestamps: list[int | None] | None = None
        #: whether headers or sequences are kept
        self.extra = False
        #: whether every record so far has a value only (no optional column started): the
        #: next such record may then go to ``values`` alone (the drop-ins' per-record path)
        self.plain = True
        self.first_at = 0.0
        #: the wall clock when the first record arrived, in milliseconds
        self.created_ms = 0
        self.segments: list[Segment] = []
        self._cond: threading.Condition | None = None
        #: position -> (its future, a callback added to it) for each callback added before it ended
        self._waiting: dict[int, list[tuple[DeliveryFuture, Callable[[DeliveryFuture], object]]]] | None = None

    def __len__(self) -> int:
        return len(self.values)

    def append(
        self,
        value: bytes | None,
        key: bytes | None,
        callback: DeliveryCallback | None,
        report: object,
        timestamp: int | None,
        headers: Headers | None,
        sequence: int | None,
    ) -> int:
        """Append one record to every column (the producer's lock held), starting an optional
        column, filled with None for the earlier records, when a record first has one.
        Returns the record's index in the buffer."""
        values = self.values
        index = len(values)
        values.append(value)
        if key is not None or self.keys is not None:
            if self.keys is None:
                self.keys = [None] * index
                self.plain = False
            self.keys.append(key)
        if callback is not None or self.callbacks is not None:
            if self.callbacks is None:
                self.callbacks = [None] * index
                self.plain = False
            self.callbacks.append(callback)
        if report is not None or self.reports is not None:
            if self.reports is None:
                self.reports = [None] * index
                self.plain = False
            self.reports.append(report)
        if timestamp is not None or self.timestamps is not None:
            if self.timestamps is None:
                self.timestamps = [None] * index
                self.plain = False
            self.timestamps.append(timestamp)
        if headers is not None or sequence is not None or self.extra:
            self.extra = True
            self.plain = False
            if headers is not None or self.headers is not None:
                if self.headers is None:
                    self.headers = [None] * index
                self.headers.append(headers)
            if sequence is not None or self.sequences is not None:
                if self.sequences is None:
                    self.sequences = [None] * index
                self.sequences.append(sequence)
        return index

    # -- outcomes ----------------------------------------------------------------------------

    def segment_of(self, index: int) -> Segment | None:
        """How the record at ``index`` ended, or None while it has not."""
        for segment in self.segments:
            start = segment[0]
            if start <= index < start + segment[1]:
                return segment
        return None

    def outcome(self, index: int) -> RecordMetadata | DeliveryFailed | None:
        """The record's metadata or failure, built now; None while it has not ended."""
        segment = self.segment_of(index)
        if segment is None:
            return None
        return self._outcome(segment, index)

    def _outcome(self, segment: Segment, index: int) -> RecordMetadata | DeliveryFailed:
        start, _, base_offset, base_sequence, duplicate, error, status = segment
        k = index - start
        if error is None:
            offset = None if base_offset is None else base_offset + k
            return RecordMetadata(self.topic, self.partition, offset, sequence_at(base_sequence, k), duplicate)
        sequence = sequence_at(base_sequence, k) if base_sequence >= 0 else -1
        return failed(error, status, self.topic, self.partition, sequence)

    def _metadata(self, segment: Segment) -> Iterator[RecordMetadata]:
        """The :class:`RecordMetadata` of each record of a stored span, in order (as
        :meth:`_outcome` builds one)."""
        _, count, base_offset, base_sequence, duplicate, _, _ = segment
        offsets: Iterable[int | None] = repeat(None) if base_offset is None else range(base_offset, base_offset + count)
        if base_sequence <= MAX_SEQUENCE < base_sequence + count - 1:  # wraps within the span
            sequences: Iterable[int] = [sequence_at(base_sequence, k) for k in range(count)]
        else:
            sequences = range(base_sequence, base_sequence + count)
        fields = zip(repeat(self.topic), repeat(self.partition), offsets, sequences, repeat(duplicate))
        return map(_new_metadata, fields)

    def ended(self, segment: Segment) -> None:
        """Record how a span ended (the sender thread), then call the callbacks of its
        records and wake whoever waits on one. A callback's exception is logged; it does not
        stop the producer."""
        self.segments.append(segment)
        start, count = segment[0], segment[1]
        callbacks = self.callbacks
        if callbacks is not None:
            outcomes: Iterable[tuple[DeliveryCallback | None, DeliveryFailed | None, RecordMetadata | None]]
            if segment[5] is None:  # stored: the metadata of the whole span, built in C loops
                outcomes = zip(callbacks[start : start + count], repeat(None), self._metadata(segment), strict=False)
            else:
                outcomes = (
                    (callbacks[i], cast(DeliveryFailed, self._outcome(segment, i)), None)
                    for i in range(start, start + count)
                    if callbacks[i] is not None
                )
            for callback, failure, metadata in outcomes:
                if callback is not None:
                    try:
                        callback(failure, metadata)
                    except Exception:
                        _LOG.exception("on_delivery callback of %s[%d] raised", self.topic, self.partition)
        if self._cond is None and self._waiting is None:
            return
        with _WAITERS:
            cond, waiting = self._cond, self._waiting
            due: list[list[tuple[DeliveryFuture, Callable[[DeliveryFuture], object]]]] = []
            if waiting:  # whichever is shorter: the waiting records, or the span
                if len(waiting) <= count:
                    indexes = [i for i in waiting if start <= i < start + count]
                else:
                    indexes = [i for i in range(start, start + count) if i in waiting]
                due = [waiting.pop(i) for i in indexes]
        if cond is not None:
            with cond:
                cond.notify_all()
        for entries in due:
            for future, function in entries:
                future._segment = segment
                _call(function, future)

    def wait(self, index: int, timeout: float | None) -> Segment | None:
        """Block until the record at ``index`` has ended (or ``timeout`` passed)."""
        with _WAITERS:
            if self._cond is None:
                self._cond = threading.Condition()
            cond = self._cond
        with cond:
            cond.wait_for(lambda: self.segment_of(index) is not None, timeout)
        return self.segment_of(index)

    def when_ended(self, future: DeliveryFuture, function: Callable[[DeliveryFuture], object]) -> bool:
        """Register ``function`` to be called with ``future`` once its record has ended;
        False when it has already (the caller calls it)."""
        index = future._index
        with _WAITERS:
            if self.segments and self.segment_of(index) is not None:
                return False
            if self._waiting is None:
                self._waiting = {}
            entries = self._waiting.get(index)
            if entries is None:
                self._waiting[index] = [(future, function)]
            else:
                entries.append((future, function))
            return True


def _call(function: Callable[[Any], object], argument: object) -> None:
    try:
        function(argument)
    except Exception:  # as concurrent.futures does: a callback's error is logged, not raised
        _LOG.exception("exception calling callback for %r", argument)


class DeliveryFuture:
    """The future of one :meth:`Producer.send`: where the record landed, or how it failed.

    ``result()`` returns its :class:`RecordMetadata` (built when asked) or raises its
    :class:`~idempotent.errors.DeliveryFailed`; ``exception()``, ``done()`` and
    ``add_done_callback()`` behave as :class:`concurrent.futures.Future`'s. It cannot be
    cancelled: the record is on its way. It holds a reference to its buffer, not a lock:
    waiting makes one condition per buffer, shared by every record of it.
    """

    __slots__ = ("_buffer", "_index", "_segment")

    def __init__(self, buffer: RecordBuffer, index: int) -> None:
        self._buffer = buffer
        self._index = index
        #: how the record's span ended, once known here (it never changes after)
        self._segment: Segment | None = None

    def done(self) -> bool:
        """Whether the record has ended (persisted, duplicate, or failed)."""
        return self._segment is not None or self._buffer.segment_of(self._index) is not None

    def running(self) -> bool:
        """Whether the record is still on its way."""
        return not self.done()

    def cancelled(self) -> bool:
        """Always False: a record on its way cannot be cancelled."""
        return False

    def cancel(self) -> bool:
        """Refused (returns False): the record is on its way."""
        return False

    def _ended(self, timeout: float | None) -> Segment:
        segment = self._segment
        if segment is None:
            buffer, index = self._buffer, self._index
            segment = buffer.segment_of(index)
            if segment is None:
                segment = buffer.wait(index, timeout)
                if segment is None:
                    raise TimeoutError(f"record {index} of {buffer.topic}[{buffer.partition}] has not ended yet")
            self._segment = segment
        return segment

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Where the record landed.

        Raises:
            DeliveryFailed: the record failed (``status`` says whether it may be stored).
            TimeoutError: ``timeout`` passed first (the record keeps going).
        """
        outcome = self._buffer._outcome(self._ended(timeout), self._index)
        if isinstance(outcome, RecordMetadata):
            return outcome
        raise outcome

    def exception(self, timeout: float | None = None) -> DeliveryFailed | None:
        """The record's failure, or None when it was persisted (waits as :meth:`result`).

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        segment = self._ended(timeout)
        if segment[5] is None:  # stored: no metadata needs building
            return None
        return cast(DeliveryFailed, self._buffer._outcome(segment, self._index))

    def add_done_callback(self, function: Callable[[DeliveryFuture], object]) -> None:
        """Call ``function(self)`` once the record has ended (at once when it has). It runs
        on the producer's sender thread; an exception it raises is logged."""
        if not self._buffer.when_ended(self, function):
            _call(function, self)

    def concurrent(self) -> Future[RecordMetadata]:
        """A :class:`concurrent.futures.Future` that completes with this one, for
        ``concurrent.futures.wait``, ``as_completed`` or ``asyncio.wrap_future``."""
        future: Future[RecordMetadata] = Future()
        future.set_running_or_notify_cancel()

        def settle(done: DeliveryFuture) -> None:
            error = done.exception()
            if error is None:
                future.set_result(done.result())
            else:
                future.set_exception(error)

        self.add_done_callback(settle)
        return future

    def __repr__(self) -> str:
        state = "finished" if self.done() else "pending"
        return f"<DeliveryFuture {self._buffer.topic}[{self._buffer.partition}] #{self._index} {state}>"


# -- send_many -------------------------------------------------------------------------------

#: One run of consecutive records of a ``send_many`` call that ended the same way:
#: ``(part, start, count, topic, partition, base_offset, base_sequence, duplicate, failure)``
#: where ``part`` maps positions to the call's indices (None: the call itself), ``base_offset``
#: and ``base_sequence`` belong to the record at ``start``, and ``failure`` is
#: ``(error, status)`` for records that failed, else None.
ManySegment = tuple["Part", int, int, str, int, "int | None", int, bool, "tuple[ProducerError, DeliveryStatus] | None"]


class Deliveries(Sequence["RecordMetadata | DeliveryFailed"]):
    """How every record of one :meth:`Producer.send_many` call ended, in the call's order.

    Item ``i`` is the :class:`RecordMetadata` of record ``i`` when it was persisted (or found
    a duplicate), or the :class:`~idempotent.errors.DeliveryFailed` it ended with. Items are
    built when read: the producer keeps one entry per batch, not per record.
    """

    def __init__(self, count: int, segments: list[ManySegment]) -> None:
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
        return failed(error, status, topic, partition, sequence)

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
        self._segments: list[ManySegment] = []
        self._deliveries: Deliveries | None = None

    def deliveries(self, timeout: float | None = None) -> Deliveries:
        """Wait until every record has ended and say how each did.

        Raises:
            TimeoutError: ``timeout`` passed first (the records keep going).
        """
        self.exception(timeout)
        assert self._deliveries is not None
        return self._deliveries

    def ended(self, segment: ManySegment) -> None:
        """Called by the sender thread only: ``segment``'s records ended."""
        self._segments.append(segment)
        self._remaining -= segment[2]
        if self._remaining == 0:
            self.finish()

    def finish(self) -> None:
        """Resolve the future from the segments gathered (every record has ended)."""
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


class Part:
    """The owner of one partition's share of a ``send_many`` call in the sequencer's spans:
    ``indices[p]`` is the call's index of the share's record ``p`` (None: the same)."""

    __slots__ = ("future", "indices")

    def __init__(self, future: SendManyFuture, indices: list[int] | None) -> None:
        self.future = future
        self.indices = indices


__all__ = ["Deliveries", "DeliveryCallback", "DeliveryFuture", "Part", "RecordBuffer", "SendManyFuture", "failed"]
