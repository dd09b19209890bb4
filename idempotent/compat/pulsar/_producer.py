"""pulsar-client's ``Producer``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, final

from idempotent.producer.delivery import DeliveryFuture
from idempotent.producer.dropin import DropInPort, RecordBuffer, Segment
from idempotent.producer.producer import Producer as _Producer

from ...errors import ProducerError, QueueFullError
from .._partitioners import pulsar_partition
from ._errors import (
    AlreadyClosed,
    InvalidConfiguration,
    OperationNotSupported,
    ProducerQueueIsFull,
    PulsarException,
    Result,
    _exception_for,
)
from ._ids import MessageId, _message_id, native_message_ids
from ._options import _MAX_SEQUENCE_ID, EVENT_TIME_HEADER, ORDERING_KEY_HEADER, _check_send_options


class Producer:
    """pulsar-client's ``Producer``: ``send``, ``send_async``, ``flush``, ``close``,
    ``topic()``, ``producer_name()``, ``last_sequence_id()``, ``is_connected()``.

    Created by :meth:`Client.create_producer`. ``send_async`` appends the message to its
    partition's buffer with the callback (no future, no ``partial`` per message); the
    :class:`MessageId` is built only for the callback, straight from the stored offsets.
    """

    def __init__(
        self,
        inner: _Producer,
        full_topic: str,
        topic: str,
        initial_sequence_id: int | None,
        max_pending: int,
        block_if_full: bool,
        logger: logging.Logger,
        schema: Any = None,
        client: object | None = None,
        direct: bool = False,
        name: str | None = None,
        router: Callable[[Any, int], int] | None = None,
    ) -> None:
        self._inner = inner
        #: what ``send_async``'s short path drives of ``inner`` (idempotent/producer/dropin.py)
        self._port = port = DropInPort(inner)
        #: the name as the application gave it (on a Pulsar URL the producer's own name also
        #: says the topic)
        self._name = name
        self._schema = schema
        # as pulsar-client's producer, keep the client (and so its broker) alive while in use; held,
        # never called, so typed as any object (the client module imports this one)
        self._client = client
        self._full_topic = full_topic
        self._topic = topic
        self._logger = logger
        self._max_pending = max_pending
        self._block = block_if_full
        #: a Pulsar service URL: event_timestamp is stored as the message's event time
        self._direct = direct
        self._lock = threading.Lock()
        self._closed = False
        partitions = inner.partitions_for(topic)
        self._counter = 0  # messages without a key go round robin, as pulsar-client's
        # Pulsar numbers messages from initial_sequence_id + 1 when it is given; otherwise the
        # broker's numbering (continuing a named producer's stored sequences) applies.
        self._next: dict[int, int] | None = None
        self._first = 0 if initial_sequence_id is None else initial_sequence_id + 1
        self._initial = -1 if initial_sequence_id is None else initial_sequence_id
        if initial_sequence_id is not None:
            self._next = dict.fromkeys(range(partitions), self._first)
        #: send_async's short path applies: no schema to encode, no sequence ids to number
        #: ``message_router(message, partition count)``, as pulsar-client calls it
        self._router = router
        self._plain = schema is None and initial_sequence_id is None and router is None
        #: (partition, offset) -> the message id a caller gets (made on first use: see
        #: :meth:`_id_maker`)
        self._ids: Callable[[int, int | None], Any] | None = None
        #: the partition count the last message was routed with
        self._partitions: int | None = partitions
        port.listen(self._span_ended)

    @property
    def producer(self) -> _Producer:
        """Extension: the underlying :class:`idempotent.Producer`."""
        return self._inner

    def topic(self) -> str:
        """The full topic name (``persistent://tenant/namespace/name``)."""
        return self._full_topic

    def producer_name(self) -> str:
        """The producer name, or ``idempotent-<producer id>`` for an anonymous producer."""
        return self._name or self._inner.producer_name or f"idempotent-{self._inner.producer_id}"

    def last_sequence_id(self) -> int:
        """The highest sequence id stored for this producer on any partition of the topic:
        acknowledged by this instance, or (for a named producer) stored by an earlier one;
        ``initial_sequence_id`` until a higher one is acknowledged when that was given; -1
        when none. This is PIP-6's ``getLastSequenceId()`` as pulsar-client returns it, the
        highest over the partitions on a partitioned topic.

        On one partition a restarted application resends from the message after it (with
        ``sequence_id``) and loses nothing. On a partitioned topic it does not do for a
        resume: the partitions' last sequences differ, and the messages between a lower
        one and this one that a partition never stored would be skipped, for good (a later,
        higher sequence on that partition makes them duplicates). Resume from
        :meth:`resume_sequence_id` instead."""
        return max(self.last_sequence_ids().values())

    def last_sequence_ids(self) -> dict[int, int]:
        """Extension: each partition's last sequence id, ``{partition: sequence id}``, by the
        rule of :meth:`last_sequence_id` (``initial_sequence_id`` or -1 for a partition
        that stored none of this producer's messages).

        Each partition stores a prefix of the messages routed to it, in order (a message is
        stored only after its predecessor on the partition), so every message of a
        partition with a sequence id at or below its entry here is stored."""
        inner = self._inner
        count = inner.partitions_for(self._topic)
        initial = self._initial
        return {p: max(initial, inner.last_sequence(self._topic, p)) for p in range(count)}

    def resume_sequence_id(self) -> int:
        """Extension: where a restarted application resends from, on any topic: the lowest of
        :meth:`last_sequence_ids` plus one (on one partition, ``last_sequence_id() + 1``).

        Every message before it is stored on its partition. Of the messages resent from it,
        those a partition already stored (at or below its own last sequence id) are answered
        as duplicates with their original message ids and not stored again; the others are
        stored. Nothing is skipped, whatever partitions the messages go to."""
        return min(self.last_sequence_ids().values()) + 1

    def is_connected(self) -> bool:
        """True until the producer is closed."""
        return not self._closed

    def send(
        self,
        content: bytes | None,
        properties: Mapping[str, str] | None = None,
        partition_key: str | None = None,
        *,
        sequence_id: int | None = None,
        **options: Any,
    ) -> MessageId | Any:
        """Publish a message and wait until it is stored (or recognised as a duplicate).

        Returns:
            The message's :class:`MessageId`; for a duplicate, the original one (or
            ``(-1,-1,-1,-1)`` when no longer known).

        Raises:
            Timeout: not stored within ``send_timeout_millis``.
            ProducerQueueIsFull: ``max_pending_messages`` reached (``block_if_queue_full`` off).
            ProducerFenced: a newer instance with the same name took over.
            AlreadyClosed: the producer is closed.
            InvalidConfiguration: an unsupported option (named) or a bad argument.
            PulsarException: another mapped failure; ``status`` says whether the message may
                have been stored.
        """
        future = self._submit(content, properties, partition_key, sequence_id, options, None)
        assert future is not None
        try:
            return self._id_of(future.result())
        except ProducerError as exc:
            raise _exception_for(exc) from exc

    def send_async(
        self,
        content: bytes | None,
        callback: Callable[[Result, MessageId], Any] | None,
        properties: Mapping[str, str] | None = None,
        partition_key: str | None = None,
        *,
        sequence_id: int | None = None,
        **options: Any,
    ) -> None:
        """Publish a message; ``callback(result, msg_id)`` is called from the producer's
        thread once it is stored (``Result.Ok``) or has failed (another :class:`Result`).
        An exception raised by the callback is logged.

        Raises:
            InvalidConfiguration: an unsupported option (named) or a bad argument (nothing sent).
        """
        if (  # the common case first: bytes, no options, nothing to number or encode
            type(content) is bytes
            and properties is None
            and sequence_id is None
            and not options
            and self._plain
            and not self._closed
            and (callback is None or callable(callback))
        ):
            key = partition_key.encode() if partition_key and type(partition_key) is str else None
            if key is not None or partition_key is None:
                count = self._partitions  # the partition count the last message was routed with
                port = self._port
                try:
                    route = port.route(self._topic)
                    if (
                        count is not None
                        and count == len(route.buffers)
                        and len(content) + (0 if key is None else len(key)) <= port.max_payload
                    ):
                        partition = 0 if count == 1 else self._route(partition_key, count)
                        # the callback goes to the buffer's reports column; _span_ended calls it
                        port.add(route, partition, content, key, callback, None, None, None)
                        return
                except QueueFullError:
                    pass  # the general path waits or refuses, as configured
                except ProducerError as exc:
                    self._call(callback, _exception_for(exc).result(), MessageId())
                    return
        if callback is not None and not callable(callback):
            raise InvalidConfiguration("send_async: callback must be callable or None")
        try:
            self._submit(
                content,
                properties,
                partition_key,
                sequence_id,
                options,
                _ignore if callback is None else partial(self._delivered, callback),
            )
        except (InvalidConfiguration, OperationNotSupported):
            raise
        except PulsarException as exc:
            self._call(callback, exc.result(), MessageId())

    def _delivered(
        self, callback: Callable[[Result, MessageId], Any], error: BaseException | None, metadata: Any
    ) -> None:
        """The producer's ``on_delivery`` for one ``send_async``: the MessageId is made here.
        It runs on the producer's sender thread once per record, so it does no more than
        make the id and call (an exception of the callback is logged)."""
        if error is None:
            result, message_id = Result.Ok, self._id_of(metadata)
        else:
            result, message_id = _exception_for(error).result(), MessageId()
        try:
            callback(result, message_id)
        except Exception:
            self._logger.exception("send_async callback raised")

    def _call(self, callback: Callable[[Result, MessageId], Any] | None, result: Result, msg_id: MessageId) -> None:
        if callback is None:
            return
        try:
            callback(result, msg_id)
        except Exception:
            self._logger.exception("send_async callback raised")

    def _submit(
        self,
        content: bytes | None,
        properties: Mapping[str, str] | None,
        partition_key: str | None,
        sequence_id: int | None,
        options: Mapping[str, Any],
        on_delivery: Callable[[BaseException | None, Any], None] | None,
    ) -> DeliveryFuture | None:
        if options:
            _check_send_options(options, self._direct)
        if self._closed:
            raise AlreadyClosed("producer is closed")
        if self._schema is not None and content is not None:
            content = self._schema.encode(content)
        if content is not None and type(content) is not bytes:
            if not isinstance(content, bytearray | memoryview):
                raise TypeError(f"send: content must be bytes or None, not {type(content).__name__}")
            content = bytes(content)
        if partition_key is not None and not isinstance(partition_key, str):
            raise InvalidConfiguration("send: partition_key must be a str")
        headers: dict[str, bytes] | None = None
        if properties is not None:
            if not isinstance(properties, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
            ):
                raise InvalidConfiguration("send: properties must be a dict of str to str")
            headers = {k: v.encode() for k, v in properties.items()}
        if options and self._direct:  # stored in the message's own fields, not as properties
            event_time, ordering_key = options.get("event_timestamp"), options.get("ordering_key")
            if event_time is not None:
                headers = headers or {}
                headers[EVENT_TIME_HEADER] = b"%d" % event_time
            if ordering_key:
                headers = headers or {}
                headers[ORDERING_KEY_HEADER] = ordering_key.encode()
        if sequence_id is not None and (type(sequence_id) is not int or not 0 <= sequence_id <= _MAX_SEQUENCE_ID):
            raise InvalidConfiguration(
                f"send: sequence_id must be an int in 0..{_MAX_SEQUENCE_ID}, not {sequence_id!r}"
            )
        key = partition_key.encode() if partition_key else None  # an empty key is none, as pulsar-client's
        inner = self._inner
        try:  # (partitions added to the topic are learnt here)
            count = inner.partitions_for(self._topic)
        except ProducerError as exc:
            raise _exception_for(exc) from exc
        self._partitions = count
        if self._router is not None:
            partition = self._routed(content, properties, partition_key, count)
        else:
            partition = 0 if count == 1 else self._route(partition_key, count)
        with self._lock:
            sequence = sequence_id
            if sequence is None and self._next is not None:
                sequence = self._next.get(partition, self._first)  # (a partition added since: from the start)
                self._next[partition] = sequence + 1
        while True:
            try:
                if on_delivery is None:
                    return inner.send(self._topic, content, key, partition, headers, sequence=sequence)
                inner.send(self._topic, content, key, partition, headers, sequence=sequence, on_delivery=on_delivery)
                return None
            except QueueFullError as exc:
                if not self._block:
                    raise ProducerQueueIsFull(
                        f"{self._max_pending} messages are pending (max_pending_messages)"
                    ) from exc
                time.sleep(0.001)  # block_if_queue_full: wait for room
                if self._closed:
                    raise AlreadyClosed("producer is closed") from None
            except ProducerError as exc:
                raise _exception_for(exc) from exc

    def _id_of(self, metadata: Any) -> Any:
        """The message id for a stored message: on a Pulsar URL pulsar-client's own (as its
        consumers and readers see it: ledger, entry, batch index), else the drop-in's."""
        return (self._ids or self._id_maker())(metadata.partition, metadata.offset)

    def _id_maker(self) -> Callable[[int, int | None], Any]:
        """Make (once) the function from a stored message's partition and offset to its id:
        on a Pulsar URL whether the topic is partitioned (its ids name the partition) is
        settled here."""
        if not self._direct:
            ids: Callable[[int, int | None], Any] = _message_id
        else:
            backend = getattr(self._inner.broker, "backend", None)
            data_topic = getattr(backend, "data_topic", None)
            ids = native_message_ids(data_topic is None or data_topic(self._topic, 0) != self._full_topic)
        self._ids = ids
        return ids

    def _span_ended(self, buffer: RecordBuffer, segment: Segment) -> int:
        """The producer's span listener: call the ``send_async`` callbacks of a span's
        records (kept in the buffer's ``reports`` column) on the producer's sender thread,
        each with its result and message id, made straight from the span's offsets. An
        exception of a callback is logged. Returns 0: nothing is held."""
        reports = buffer.reports
        if reports is None:
            return 0
        start, count, base_offset, _, _, error, _ = segment
        call = self._call  # logs an exception of the callback
        if error is None:
            ids = self._ids or self._id_maker()
            partition, ok = buffer.partition, Result.Ok
            for index in range(start, start + count):
                callback = reports[index]
                if callback is not None:
                    offset = None if base_offset is None else base_offset + index - start
                    call(callback, ok, ids(partition, offset))  # type: ignore[arg-type]
            return 0
        result = _exception_for(error).result()
        for index in range(start, start + count):
            call(reports[index], result, MessageId())  # type: ignore[arg-type]
        return 0

    def _routed(
        self, content: bytes | None, properties: Mapping[str, str] | None, partition_key: str | None, count: int
    ) -> int:
        """The partition the application's ``message_router`` picks.

        Raises:
            InvalidConfiguration: it returned something other than a partition of the topic.
        """
        assert self._router is not None
        chosen = self._router(_Routed(content, properties, partition_key), count)
        if type(chosen) is not int or not 0 <= chosen < count:
            raise InvalidConfiguration(f"send: message_router returned {chosen!r}, not a partition in 0..{count - 1}")
        return chosen

    def _route(self, partition_key: str | None, count: int) -> int:
        """The partition of a message: pulsar-client's hash of the key, else round robin."""
        chosen = pulsar_partition(partition_key, count)
        if chosen is None:
            with self._lock:
                chosen = self._counter % count
                self._counter += 1
        return chosen

    def flush(self) -> None:
        """Wait until every message sent so far is stored or has failed.

        Raises:
            AlreadyClosed: the producer is closed.
        """
        if self._closed:
            raise AlreadyClosed("producer is closed")
        self._inner.flush()

    def close(self) -> None:
        """Flush, then close the producer (messages still pending after 30 s fail)."""
        if self._closed:
            return
        self._closed = True
        self._inner.close(30)


@final
class LoopHooks:
    """What the asyncio producer (``pulsar.asyncio.Producer``) drives of the drop-in
    :class:`Producer` it wraps beyond pulsar-client's API: it queues each message with a
    callback of its own and waits on its event loop, never in the producer.

    Args:
        producer: the drop-in producer the asyncio one owns (made with
            ``block_if_queue_full=False``: a full queue waits on the loop).
    """

    __slots__ = ("_producer",)

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def submit(
        self,
        content: bytes | None,
        properties: Mapping[str, str] | None,
        partition_key: str | None,
        sequence_id: int | None,
        options: Mapping[str, Any],
        on_delivery: Callable[[BaseException | None, Any], None],
    ) -> None:
        """Check and queue one message as :meth:`Producer.send_async` does; once it is stored
        or has failed, ``on_delivery(error, metadata)`` is called on the producer's sender
        thread (``error`` None and ``metadata`` its record's metadata when stored, for
        :meth:`message_id`). It must not raise.

        Raises:
            ProducerQueueIsFull: ``max_pending_messages`` reached; nothing queued, call again.
            AlreadyClosed: the producer is closed.
            InvalidConfiguration, OperationNotSupported, TypeError: a bad argument or an
                unsupported option (named); nothing queued.
            PulsarException: another mapped failure (the producer failed earlier, ...).
        """
        self._producer._submit(content, properties, partition_key, sequence_id, options, on_delivery)

    def message_id(self, metadata: Any) -> Any:
        """The message id of a stored message from its ``metadata`` (as :meth:`submit`'s
        ``on_delivery`` got it), as :meth:`Producer.send` returns it. Raises nothing."""
        return self._producer._id_of(metadata)


class _Routed:
    """The message as a ``message_router`` sees it (pulsar-client's ``Message`` accessors)."""

    __slots__ = ("_content", "_key", "_properties")

    def __init__(self, content: bytes | None, properties: Mapping[str, str] | None, key: str | None) -> None:
        self._content = content
        self._properties = dict(properties or {})
        self._key = key

    def data(self) -> bytes:
        return self._content or b""

    def value(self) -> bytes:
        return self._content or b""

    def properties(self) -> dict[str, str]:
        return self._properties

    def partition_key(self) -> str:
        return self._key or ""

    def ordering_key(self) -> str:
        return ""


def _ignore(error: BaseException | None, metadata: Any) -> None:
    """``on_delivery`` of a ``send_async`` without a callback."""
