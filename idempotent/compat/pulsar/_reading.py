"""pulsar-client's ``Reader`` and ``Message``, over :class:`idempotent.Reader`."""

from __future__ import annotations

from typing import Any

import idempotent.consumer.reader as _reader

from ... import errors
from ...errors import ProducerError
from ._errors import AlreadyClosed, OperationNotSupported, Timeout, _exception_for
from ._ids import MessageId
from ._options import _check_type


class Message:
    """A message as pulsar-client's reader returns it: ``data()``, ``value()``,
    ``properties()``, ``partition_key()``, ``ordering_key()``, ``message_id()``,
    ``topic_name()``, ``publish_timestamp()``, ``event_timestamp()``,
    ``redelivery_count()``, ``schema_version()``.

    Extension: ``sequence_id()``, the sequence the record was stored under.
    """

    def __init__(self, inner: _reader.Message, full_topic: str, schema: Any) -> None:
        self._inner = inner
        self._full_topic = full_topic
        self._schema = schema

    def data(self) -> bytes:
        """The payload (empty for a null value)."""
        return self._inner.value or b""

    def value(self) -> Any:
        """The payload decoded by the reader's schema (bytes without one; None for a null value)."""
        if self._inner.value is None:
            return None
        return self._inner.value if self._schema is None else self._schema.decode(self._inner.value)

    def properties(self) -> dict[str, str]:
        """The properties (record headers) as str."""
        return {k: v.decode("utf-8", "replace") for k, v in self._inner.headers}

    def partition_key(self) -> str:
        """The partition key (record key), "" when none."""
        return (self._inner.key or b"").decode("utf-8", "replace")

    def ordering_key(self) -> str:
        """Always "": ordering keys are not stored."""
        return ""

    def message_id(self) -> MessageId:
        """Where this message is stored; start a reader from it to read what follows."""
        return MessageId(self._inner.partition, self._inner.offset)

    def topic_name(self) -> str:
        """The full topic name."""
        return self._full_topic

    def publish_timestamp(self) -> int:
        """When the backend stored it, in milliseconds since the epoch."""
        return int(self._inner.timestamp * 1000)

    def event_timestamp(self) -> int:
        """Always 0: event timestamps are not stored."""
        return 0

    def redelivery_count(self) -> int:
        """Always 0: a reader has no redeliveries."""
        return 0

    def schema_version(self) -> str:
        """Always "": schemas are not versioned here."""
        return ""

    def sequence_id(self) -> int:
        """Extension: the sequence the record was stored under."""
        return self._inner.sequence

    def __repr__(self) -> str:
        return f"Message(topic={self._full_topic!r}, id={self.message_id()!r})"


class Reader:
    """pulsar-client's ``Reader`` over :class:`idempotent.Reader`: ``read_next``,
    ``has_message_available``, ``seek``, ``topic``, ``is_connected``, ``close``.

    Created by :meth:`Client.create_reader`.
    """

    def __init__(self, inner: _reader.Reader, full_topic: str, inclusive: bool, schema: Any) -> None:
        self._inner = inner
        self._full_topic = full_topic
        self._inclusive = inclusive
        self._schema = schema
        self._closed = False

    def topic(self) -> str:
        """The full topic name."""
        return self._full_topic

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message, waiting up to ``timeout_millis`` (None: forever).

        Raises:
            Timeout: no message in time (call again).
            AlreadyClosed: the reader is closed.
            PulsarException: a read failed (mapped error); the position is unchanged.
        """
        self._check_open()
        _check_type("read_next", "timeout_millis", timeout_millis, int, type(None))
        try:
            inner = self._inner.read_next(None if timeout_millis is None else timeout_millis / 1000)
        except errors.ReadTimeoutError as exc:
            raise Timeout(str(exc)) from exc
        except ProducerError as exc:
            raise _exception_for(exc) from exc
        return Message(inner, self._full_topic, self._schema)

    def has_message_available(self) -> bool:
        """True when a message can be read now.

        Raises:
            AlreadyClosed: the reader is closed.
            PulsarException: the backend failed (mapped error).
        """
        self._check_open()
        try:
            return self._inner.has_message_available()
        except ProducerError as exc:
            raise _exception_for(exc) from exc

    def seek(self, messageid: MessageId | int) -> None:
        """Move to ``messageid`` (the reader's ``start_message_id_inclusive`` applies), or to
        ``MessageId.earliest`` / ``MessageId.latest``.

        Raises:
            OperationNotSupported: a publish timestamp (records are found by offset only).
            InvalidConfiguration: an id of another topic's partition.
            AlreadyClosed: the reader is closed.
        """
        self._check_open()
        if not isinstance(messageid, MessageId):
            raise OperationNotSupported("Reader.seek(timestamp) is not supported: seek to a MessageId")
        try:
            if messageid._kind is not None:
                self._inner.seek(messageid._kind)  # type: ignore[arg-type]
            else:
                topic = self._inner.topic
                target = _reader.MessageId(topic, messageid.partition(), messageid.offset())
                self._inner.seek(target, inclusive=self._inclusive)
        except ProducerError as exc:
            raise _exception_for(exc) from exc

    def is_connected(self) -> bool:
        """True until the reader is closed."""
        return not self._closed

    def close(self) -> None:
        """Close the reader (closing again does nothing)."""
        if not self._closed:
            self._closed = True
            self._inner.close()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("reader is closed")
