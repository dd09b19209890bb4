"""What a drop-in may drive of a producer: :class:`DropInPort`.

The drop-ins (``idempotent.compat``: confluent-kafka's ``Producer`` and ``AIOProducer``,
pulsar-client's ``Producer`` and its asyncio twin) keep librdkafka's and pulsar-client's
promises on top of a :class:`~idempotent.producer.producer.Producer`. Beyond its public API
(``flush``, ``close``, ``partitions_for``, ``last_sequence``, the transactions, ``broker`` ...)
they need five things the public API does not offer, and take them from a :class:`DropInPort`
and nowhere else:

* **a per-record path without checks**: :attr:`DropInPort.add` appends a record the drop-in
  has already checked (types, partition, size) to its partition's buffer, with the drop-in's
  own callback kept beside it, without a future or a record object (:attr:`DropInPort.route`
  gives the buffers of a topic, :attr:`DropInPort.max_payload` the size limit);
* **delivery reports on the drop-in's terms**: a span listener (:meth:`DropInPort.listen`)
  hears each ended span of records; those it holds for its application count against the
  buffer limits until :meth:`DropInPort.served`;
* **librdkafka's purge** of what is not sent yet (:meth:`DropInPort.purge`);
* **flushing without waiting here** (:meth:`DropInPort.begin_flush` and
  :meth:`DropInPort.end_flush`: the drop-in waits on its own queue of reports);
* **a transaction whose reports are not held** (:meth:`DropInPort.begin_transaction`), and the
  counts librdkafka's ``len()`` and statistics show (:attr:`DropInPort.unfinished`,
  :attr:`DropInPort.buffered_bytes`), and the error that stopped the producer
  (:attr:`DropInPort.halted`).

One drop-in drives one producer, through one port. The per-record members are bound methods,
not wrappers (:attr:`DropInPort.add` is the producer's
:class:`~idempotent.producer.sender.Sender`'s, :attr:`DropInPort.route` the producer's own):
a record costs no call more than the producer's own path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, final

from idempotent.core.records import Headers
from idempotent.errors import ProducerError
from idempotent.producer.delivery import RecordBuffer, Segment
from idempotent.producer.sender import Route, SpanListener

if TYPE_CHECKING:
    from idempotent.producer.producer import Producer


class AddRecord(Protocol):
    """The signature of :attr:`DropInPort.add`."""

    def __call__(
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
        """Append one checked record to ``route``'s buffer of ``partition``."""
        ...


@final
class DropInPort:
    """What a drop-in may drive of ``producer`` beyond its public API (module docstring).

    Args:
        producer: the producer the drop-in owns; it is the drop-in's to flush and close.
    """

    __slots__ = ("_sender", "add", "max_payload", "producer", "route")

    producer: Producer
    """The producer driven; its public API is the drop-in's as anyone's."""

    add: AddRecord
    """``add(route, partition, value, key, report, timestamp, headers, sequence, size=0)``:
    append one record to ``route``'s buffer of ``partition``, and return that buffer.

    The drop-in has checked the arguments already: ``value`` and ``key`` are bytes or None,
    ``partition`` is one of ``route``'s, ``headers`` are stored pairs, the key, value and
    headers fit :attr:`max_payload`, ``sequence`` is valid. Nothing of that is checked again.
    ``report`` is kept in the buffer's ``reports`` column for the span listener and never
    called by the producer; ``timestamp`` (ms, None: when stored) is the record's own time;
    ``size`` (the key and value bytes) counts against ``max_buffered_bytes`` until
    :meth:`served`. The record counts against ``max_buffered_records`` until it ended and, when
    the listener held it, until :meth:`served`.

    Raises:
        QueueFullError: ``max_buffered_records`` (or ``max_buffered_bytes``) reached; nothing
            queued, the producer unchanged.
        ProducerClosedError: the producer is closed; nothing queued.
        ProducerError: the producer failed earlier (:attr:`halted`); nothing queued.
    """

    route: Callable[[str], Route]
    """``route(topic)``: the :class:`Route` (stored name, one buffer per partition) of any
    spelling of ``topic``, asking the broker for its partition count the first time (waiting up
    to ``max_block_ms`` while it cannot answer). A route is the same object for the producer's
    life; partitions added to the topic are appended to its ``buffers`` in place.

    Raises:
        InvalidTopicError: not a valid spelling of a topic name; nothing changed.
        ProducerError: the broker's answer (retriable ones after ``max_block_ms``).
    """

    max_payload: int
    """The largest key + value + headers a record may have (the broker's ``max_record_bytes``,
    learnt at init, less the record's fixed overhead); ``sys.maxsize`` when the broker set none.
    A larger record must not be given to :attr:`add`."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._sender = sender = producer._sender
        self.add = sender.add
        self.route = producer._route
        self.max_payload = producer._max_payload

    def listen(self, listener: SpanListener | None) -> None:
        """Have ``listener(buffer, segment)`` called on the sender thread for every span of
        records that ended (delivered, failed, or purged), after the buffer recorded it, in
        place of any listener before (None: none). It returns how many of the span's records
        it holds for its application; they count against the buffer limits until
        :meth:`served`. It must not raise (what it raises stops the sender: a FATAL
        :class:`~idempotent.errors.InternalError` for every record). Set it before the first
        record: spans that end before are not heard."""
        self._sender.span_listener = listener

    def served(self, count: int, size: int = 0) -> None:
        """The application was served the reports of ``count`` records the listener held, of
        ``size`` key and value bytes (their ``size`` at :attr:`add`): they no longer count
        against the buffer limits, and a :attr:`add` waiting for room may succeed. Raises
        nothing."""
        self._sender.served(count, size)

    def purge(self, error: ProducerError) -> int:
        """End every record not handed to the sequencer yet with ``error`` (NOT_PERSISTED),
        as librdkafka's ``purge(in_queue=True)``: the listener hears them as any ended span.
        Batches already cut are not recalled; they end as they end. The producer stays
        usable. Raises nothing.

        Returns:
            How many records were purged.
        """
        return self._sender.purge(error)

    def begin_flush(self) -> None:
        """Send everything buffered now, lingering for nothing, until :meth:`end_flush`, without
        waiting here (the drop-in waits on its reports). Calls nest: each needs its
        :meth:`end_flush`. Raises nothing."""
        self._sender.begin_flush()

    def end_flush(self) -> None:
        """End one :meth:`begin_flush`: after the last, buffers linger again. Raises nothing."""
        self._sender.end_flush()

    def begin_transaction(self, hold_reports: bool) -> None:
        """:meth:`Producer.begin_transaction`, with the delivery reports of the transaction's
        records held until it ends (``hold_reports``: a broker that holds the records until
        the commit, so their offsets are not known before) or heard by the listener once each
        batch is acknowledged, inside the transaction (librdkafka's way).

        Raises:
            As :meth:`Producer.begin_transaction` (``TransactionStateError``,
            ``ProducerFencedError``, ``BackendUnavailableError``); no transaction open then.
        """
        self.producer._begin_transaction(defer=hold_reports)

    @property
    def unfinished(self) -> int:
        """Records given to the producer that have not ended, plus those the listener holds
        and the application was not served yet (librdkafka's ``len()``, without what the
        drop-in itself queues)."""
        sender = self._sender
        return sender.outstanding + sender.held

    @property
    def buffered_bytes(self) -> int:
        """The key and value bytes (``size`` at :attr:`add`) of the records counted against
        ``max_buffered_bytes``: not ended, or held and not served (``msg_size`` of
        librdkafka's statistics)."""
        return self._sender.outstanding_bytes

    @property
    def halted(self) -> ProducerError | None:
        """Why the producer refuses records: the error that failed it (fenced, timed out,
        ...), ``ProducerClosedError`` once closed, a ``TransactionStateError`` while a commit
        or abort runs; None while it takes them. A span that failed with this very error
        failed because the producer stopped."""
        return self._sender.halted


__all__ = ["AddRecord", "DropInPort", "RecordBuffer", "Route", "Segment", "SpanListener"]
