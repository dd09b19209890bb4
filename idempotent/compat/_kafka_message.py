"""The ``Message`` of the confluent-kafka drop-in.

:class:`Message` is confluent-kafka's: handed to delivery callbacks, and constructible by
applications (for tests) as upstream's is, with the same accessors and setters, each of which
refuses to be called on anything but a Message (as upstream's C methods do). The accessors are
made by two small factories instead of being written out one by one.

:class:`DeliveredMessage` is what the producer hands a delivery callback: a Message that keeps
only where its record is (its producer's buffer, position and ended span) and fills its fields
the first time one is read, so a report whose callback reads nothing costs one small object.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from idempotent.core.sequence import sequence_at

from ._kafka_errors import KafkaError, MessageStatus

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2
OFFSET_INVALID = -1001

#: the fields of a message, in the order of upstream's constructor
FIELDS = (
    "_topic",
    "_partition",
    "_offset",
    "_key",
    "_value",
    "_headers",
    "_error",
    "_timestamp",
    "_latency",
    "_leader_epoch",
    "_delivery_count",
)
#: this drop-in's own fields (extensions)
EXTENSIONS = ("_status", "_sequence", "_duplicate")


def _check_message(self: object) -> None:
    if not isinstance(self, Message):
        raise TypeError(f"expected a Message, not {type(self).__name__}")


def _getter(field: str, doc: str, unset_below: int | None = None) -> Callable[[Message], Any]:
    """An accessor of ``field``; with ``unset_below``, values below it read as None."""

    def get(self: Message) -> Any:
        _check_message(self)
        value = getattr(self, field)
        if unset_below is not None and value < unset_below:
            return None
        return value

    get.__doc__ = doc
    return get


def _setter(field: str, doc: str) -> Callable[[Message, Any], None]:
    def put(self: Message, value: Any) -> None:
        _check_message(self)
        setattr(self, field, value)

    put.__doc__ = doc
    return put


class Message:
    """A message, as confluent-kafka's ``Message``: ``Message(topic, partition, offset, key,
    value, headers, error, timestamp, latency, leader_epoch, delivery_count)``, every
    argument optional, with accessors of the same names and ``set_topic()``, ``set_value()``,
    ``set_key()``, ``set_headers()`` and ``set_error()``.

    ``offset()`` is the record's offset in the partition: for a resend the broker recognised
    as a duplicate it is the original record's offset (None when that fell out of the
    checker's window). Extensions: ``status()``, ``sequence()``, ``duplicate()``.

    Raises:
        TypeError: a method called on something that is not a Message.
        OverflowError: a ``delivery_count`` outside a 16-bit count.
    """

    _topic: Any
    _partition: int
    _offset: int
    _key: Any
    _value: Any
    _headers: Any
    _error: Any
    _timestamp: tuple[int, int]
    _latency: float
    _leader_epoch: int
    _delivery_count: int
    _status: MessageStatus
    _sequence: int
    _duplicate: bool

    def __new__(cls, *args: Any, **kwargs: Any) -> Message:
        if not isinstance(cls, type) or not issubclass(cls, Message):
            raise TypeError(f"Message.__new__({cls!r}): not a subtype of Message")
        self = super().__new__(cls)
        # what upstream's zero-filled C struct holds when __init__ is skipped
        self._topic = self._key = self._value = self._headers = self._error = None
        self._partition = self._offset = self._leader_epoch = self._delivery_count = 0
        self._timestamp = (TIMESTAMP_NOT_AVAILABLE, 0)
        self._latency = 0.0
        self._status = MessageStatus.PERSISTED
        self._sequence = -1
        self._duplicate = False
        return self

    def __init__(
        self,
        topic: Any = None,
        partition: int = -1,
        offset: int = OFFSET_INVALID,
        key: Any = None,
        value: Any = None,
        headers: Any = None,
        error: Any = None,
        timestamp: tuple[int, int] | None = None,
        latency: float = -1.0,
        leader_epoch: int = -1,
        delivery_count: int = -1,
    ) -> None:
        _check_message(self)
        self._topic = topic
        self._partition = partition if partition >= 0 else -1
        self._offset = offset if offset >= 0 else OFFSET_INVALID
        self._key = key
        self._value = value
        self._headers = headers
        self._error = error
        self._timestamp = (TIMESTAMP_NOT_AVAILABLE, 0) if timestamp is None else timestamp
        self._latency = latency if latency >= 0 else -1.0
        self._leader_epoch = leader_epoch if leader_epoch >= 0 else -1
        if not -(2**15) <= delivery_count < 2**15:
            raise OverflowError(f"delivery_count {delivery_count} is out of range for a 16-bit count")
        self._delivery_count = delivery_count if delivery_count > 0 else -1

    topic = _getter("_topic", "The topic.")
    partition = _getter("_partition", "The partition (None when unknown).", 0)
    offset = _getter("_offset", "The offset (None when unknown).", 0)
    key = _getter("_key", "The key (None when none).")
    value = _getter("_value", "The value (None when none).")
    headers = _getter("_headers", "The headers as a list of ``(name, bytes)`` (None when none).")
    error = _getter("_error", "The :class:`KafkaError` of a failed message, else None.")
    timestamp = _getter("_timestamp", "``(timestamp type, milliseconds)``: the record's create time.")
    latency = _getter("_latency", "Seconds from ``produce`` to the delivery report (None when unknown).", 0)
    leader_epoch = _getter("_leader_epoch", "None: there is no partition leader epoch here.", 0)
    delivery_count = _getter("_delivery_count", "None: a consumer-side count.", 1)
    status = _getter("_status", "Extension: persisted, not persisted or possibly persisted.")
    sequence = _getter("_sequence", "Extension: the record's sequence in its partition (-1: it never got one).")
    duplicate = _getter("_duplicate", "Extension: True when the broker recognised the record as already stored.")
    set_topic = _setter("_topic", "Replace the topic.")
    set_value = _setter("_value", "Replace the value.")
    set_key = _setter("_key", "Replace the key.")
    set_headers = _setter("_headers", "Replace the headers.")
    set_error = _setter("_error", "Replace the error.")

    def __len__(self) -> int:
        value = self._value
        return 0 if value is None else len(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return bool(self.__reduce__()[1] == other.__reduce__()[1])

    __hash__ = None  # type: ignore[assignment]  # mutable (set_*), like upstream's

    def __reduce__(self) -> tuple[Any, ...]:
        args = tuple(getattr(self, field) for field in FIELDS)
        extensions = {field: getattr(self, field) for field in EXTENSIONS}
        if (extensions["_status"], extensions["_sequence"], extensions["_duplicate"]) == (
            MessageStatus.PERSISTED,
            -1,
            False,
        ):
            return (Message, args)
        return (Message, args, extensions)

    def __repr__(self) -> str:
        status = self._status
        name = status.name if isinstance(status, enum.Enum) else status
        return (
            f"Message(topic={self._topic!r}, partition={self._partition}, offset={self._offset}, "
            f"status={name}, error={self._error!r})"
        )


class DeliveredMessage(Message):
    """The message of one delivery report: where its record is, with its fields filled on the
    first read (see the module docstring). A ``set_*`` call or pickling fills them too.

    ``segment`` is how the record's span ended (``idempotent.producer.delivery.Segment``); ``error``
    the report's :class:`KafkaError` (None when persisted) with its ``status``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> DeliveredMessage:
        return object.__new__(cls)

    def __init__(  # the producer's hot path: keep it to plain stores
        self, buffer: Any, index: int, segment: Any, error: KafkaError | None, status: MessageStatus, latency: float
    ) -> None:
        self.__dict__["_where"] = (buffer, index, segment, error, status, latency)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_where" not in self.__dict__:
            raise AttributeError(name)
        self._fill()
        return self.__dict__[name] if name in self.__dict__ else object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_where" in self.__dict__:
            self._fill()
        object.__setattr__(self, name, value)

    def _fill(self) -> None:
        buffer, index, segment, error, status, latency = self.__dict__.pop("_where")
        start, _, base_offset, base_sequence, duplicate, _, _ = segment
        k = index - start
        headers = None if buffer.headers is None else buffer.headers[index]
        own = None if buffer.timestamps is None else buffer.timestamps[index]
        fields = self.__dict__
        fields["_topic"] = buffer.topic
        fields["_partition"] = buffer.partition
        fields["_offset"] = OFFSET_INVALID if error is not None or base_offset is None else base_offset + k
        fields["_key"] = None if buffer.keys is None else buffer.keys[index]
        fields["_value"] = buffer.values[index]
        fields["_headers"] = None if not headers else list(headers)
        fields["_error"] = error
        fields["_timestamp"] = (TIMESTAMP_CREATE_TIME, buffer.created_ms if own is None else own)
        fields["_latency"] = latency
        fields["_leader_epoch"] = -1
        fields["_delivery_count"] = -1
        fields["_status"] = status
        fields["_sequence"] = sequence_at(base_sequence, k) if base_sequence >= 0 else -1
        fields["_duplicate"] = bool(duplicate) and error is None


__all__ = [
    "OFFSET_INVALID",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "DeliveredMessage",
    "Message",
]
