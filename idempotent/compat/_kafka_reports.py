"""The delivery reports of the confluent-kafka drop-in, waiting to be served.

librdkafka calls delivery callbacks (and ``error_cb``) only from ``poll()`` and ``flush()``, in
the application's thread. :class:`Reports` is that queue: the producer's sender thread (its span
listener) queues each ended span of records whole, records that never reached the producer
(timed out or purged while it connected) are queued one by one, and errors for ``error_cb``
go first. :meth:`Reports.serve` calls the callbacks, building a message only for records that
have one, and tells the producer when a span is served (its records stop counting against the
queue limits).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from idempotent.core.outcomes import DeliveryStatus
from idempotent.producer.dropin import DropInPort, RecordBuffer, Segment

from ._kafka_errors import KafkaError, MessageStatus, kafka_error_of
from ._kafka_message import DeliveredMessage, Message

_LOG = logging.getLogger("idempotent.compat.confluent_kafka")
_STATUS = {
    DeliveryStatus.PERSISTED: MessageStatus.PERSISTED,
    DeliveryStatus.NOT_PERSISTED: MessageStatus.NOT_PERSISTED,
    DeliveryStatus.POSSIBLY_PERSISTED: MessageStatus.POSSIBLY_PERSISTED,
}

#: a delivery callback, as confluent-kafka calls it
Report = Callable[[KafkaError | None, Message], Any]


_new = object.__new__


class _Span:
    """Records of one ended span whose reports are not served yet (``next`` is the first
    record still to serve)."""

    __slots__ = ("buffer", "error", "latency", "next", "port", "segment", "status")

    def __init__(
        self, port: DropInPort, buffer: RecordBuffer, segment: Segment, latency: float, error: KafkaError | None
    ) -> None:
        self.port = port
        self.buffer = buffer
        self.segment = segment
        self.latency = latency
        self.error = error
        self.status = _STATUS[segment[6]]
        self.next = segment[0]


class Reports:
    """Reports and errors waiting for ``poll``/``flush`` (see the module docstring).

    ``cond`` (on ``lock``) is the drop-in producer's one lock: it also guards the records
    queued while it connects. An RLock, so that a Ctrl-C in ``poll``/``flush`` leaves it held
    by its owner (see ``idempotent.producer.sender.Sender.lock``).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.spans: collections.deque[_Span] = collections.deque()
        self.ready: collections.deque[tuple[Report | None, KafkaError, Message]] = collections.deque()
        self.errors: collections.deque[KafkaError] = collections.deque()
        #: the error that stopped the producer (fenced, ...), once one did
        self.fatal: KafkaError | None = None
        #: called (without the lock, from the thread that queued it) after a report or error
        #: is queued: the asyncio producer serves them on its loop (``_kafka_aio``)
        self.wake: Callable[[], None] | None = None

    def pending(self) -> bool:
        """Whether anything waits to be served (the lock held)."""
        return bool(self.spans or self.ready or self.errors)

    def error(self, error: KafkaError) -> None:
        """Queue an error for ``error_cb``."""
        with self.cond:
            self.errors.append(error)
            self.cond.notify_all()
        if self.wake is not None:
            self.wake()

    def failed(self, report: Report | None, message: Message) -> None:
        """Queue the report of a record that never reached the producer (``message`` carries
        its error)."""
        with self.cond:
            self.ready.append((report, message._error, message))
            self.cond.notify_all()
        if self.wake is not None:
            self.wake()

    def ended(self, port: DropInPort, buffer: RecordBuffer, segment: Segment) -> int:
        """The span listener of ``port``'s producer: queue a span's reports (their records
        count against its buffer limits until served). Returns how many records it holds."""
        error = segment[5]
        stopped = error is not None and port.halted is error
        kafka_error = None if error is None else kafka_error_of(error, segment[6], stopped)
        span = _Span(port, buffer, segment, time.monotonic() - buffer.first_at, kafka_error)
        with self.cond:
            if kafka_error is not None and kafka_error.fatal() and self.fatal is None:
                self.fatal = kafka_error
                self.errors.append(kafka_error)
            self.spans.append(span)
            self.cond.notify_all()
        if self.wake is not None:
            self.wake()
        return segment[1]

    def serve(self, error_cb: Callable[[KafkaError], Any] | None, only_errors: bool) -> int:
        """Serve everything queued, errors first. Returns how many events were served.

        Raises:
            Whatever a callback raises (what it had not reached stays queued).
        """
        served = 0
        while True:
            error: KafkaError | None = None
            ready: tuple[Report | None, KafkaError, Message] | None = None
            span: _Span | None = None
            with self.cond:
                if self.errors:
                    error = self.errors.popleft()
                elif self.ready:
                    ready = self.ready.popleft()
                elif self.spans:
                    span = self.spans[0]
                else:
                    return served
            if error is not None:
                served += 1
                if error_cb is not None:
                    error_cb(error)
                else:
                    _LOG.error("producer error: %s (%s)", error.str(), error.name())
            elif ready is not None:
                served += 1
                report, err, message = ready
                if report is not None:
                    report(err, message)
            elif span is not None:
                served += self._serve_span(span, only_errors)

    def _serve_span(self, span: _Span, only_errors: bool) -> int:
        """Call the callbacks of a span's records, from where the last call stopped; the span
        leaves the queue once all are served. Returns how many records it served."""
        buffer, segment = span.buffer, span.segment
        start, count = segment[0], segment[1]
        end = start + count
        reports = cast(list[Report | None] | None, buffer.reports)
        error, status, latency = span.error, span.status, span.latency
        if reports is not None and not (only_errors and error is None):
            while span.next < end:  # re-read: a callback may serve the rest itself (poll inside it)
                index = span.next
                span.next = index + 1
                report = reports[index]
                if report is not None:
                    message = _new(DeliveredMessage)  # its fields are filled on first read
                    message.__dict__["_where"] = (buffer, index, segment, error, status, latency)
                    report(error, message)
        with self.cond:
            if self.spans and self.spans[0] is span:
                self.spans.popleft()
        values = buffer.values[start:end]
        keys = buffer.keys[start:end] if buffer.keys is not None else ()
        span.port.served(count, sum(map(len, filter(None, values))) + sum(map(len, filter(None, keys))))
        return count


__all__ = ["Report", "Reports"]
