"""A drop-in for confluent-kafka's ``Producer``: exactly-once publishing by changing one import.

::

    from idempotent.compat import confluent_kafka   # instead of: import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": "kafka:9092", "transactional.id": "orders"})
    producer.produce("orders", value=b"...", key=b"customer-7", on_delivery=report)
    producer.poll(0)
    producer.flush()

Records go to this project's broker (``idempotent.broker.url``, else the environment variable
``IDEMPOTENT_BROKER_URL``, else ``sqlite:///idempotent.db`` in the working directory) and
through its sequence checker; ``bootstrap.servers`` is accepted and not used. Use
``idempotent.broker.url=kafka://host:port`` to store into a Kafka cluster.

As with librdkafka, delivery reports (``on_delivery(err, msg)``) are served only from
:meth:`Producer.poll` and :meth:`Producer.flush`, in the calling thread; :meth:`Producer.produce`
raises ``BufferError`` when ``queue.buffering.max.messages`` messages (or
``queue.buffering.max.kbytes``) are waiting for their report. Errors are :class:`KafkaError`
objects with librdkafka's codes and names, plus the message's :class:`MessageStatus`
(persisted, not persisted, possibly persisted).

Every librdkafka configuration property is accepted: those that mean something here are
used, the others (Kafka connection tuning) have no effect and are logged once at DEBUG; only
``enable.idempotence=false``, which would give up exactly-once, and unknown keys are refused
(:class:`KafkaException` ``_INVALID_ARG``). Transactions, ``purge()`` and ``list_topics()``
raise ``_NOT_IMPLEMENTED``. ``produce_batch`` sends each partition's messages through
``idempotent.Producer.send_many``. Every other name of confluent-kafka (``Consumer``,
``AdminClient``, ``TopicPartition``, the submodules ...) is passed through from the installed
module; ``KafkaException`` is confluent-kafka's own class. See ``docs/migration.md``.
"""

from __future__ import annotations

import builtins
import collections
import enum
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ClassVar

from .._outcomes import DeliveryStatus, RecordMetadata
from .._records import Record
from ..api import BrokerAPI
from ..clientlogs import route_kafka_attribute
from ..errors import (
    DeliveryFailed,
    DeliveryTimeoutError,
    EntryTooLargeError,
    InvalidBatchError,
    InvalidTopicError,
    PartitionRecoveringError,
    ProducerClosedError,
    ProducerError,
    ProducerFencedError,
    QueueFullError,
    RequestTimeoutError,
    SequenceDesyncError,
    TransportError,
    UnknownProducerError,
    UsageError,
)
from ..producer import Producer as _Producer
from ..producer import SendManyFuture
from . import _shared
from ._partitioners import PARTITIONERS, consistent, fnv1a, librdkafka_partition, librdkafka_sticky, murmur2
from ._rdkafka import ERRORS, PROPERTIES

__all__ = [
    "DEFAULT_BROKER_URL",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "KafkaError",
    "KafkaException",
    "Message",
    "MessageStatus",
    "Producer",
    "SerializingProducer",
    "consistent",
    "fnv1a",
    "libversion",
    "murmur2",
    "version",
]

_LOG = logging.getLogger("idempotent.compat.confluent_kafka")

#: The broker URL used when neither ``idempotent.broker.url`` nor ``IDEMPOTENT_BROKER_URL`` is set.
DEFAULT_BROKER_URL = "sqlite:///idempotent.db"
ENV_BROKER_URL = "IDEMPOTENT_BROKER_URL"

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2
OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001

_NATIVE = "confluent_kafka"

# ``import idempotent.compat.confluent_kafka.admin`` (and every other submodule) is the native one
__path__: list[str] = []
_shared.pass_through_submodules(__name__, _NATIVE, route_kafka_attribute)


def __getattr__(name: str) -> Any:
    """The rest of confluent-kafka (``Consumer``, ``AdminClient``, ``TopicPartition``,
    ``admin``, ``serialization``, ...), passed through from the installed module. Its client
    classes log into Python logging unless given a ``logger`` (see
    :func:`idempotent.clientlogs.route_kafka_attribute`)."""
    return _shared.native_attribute(__name__, _NATIVE, name, route_kafka_attribute)


def version() -> str:
    """This drop-in's version string (confluent-kafka's ``version()`` is its own)."""
    from .. import __version__

    return __version__


def libversion() -> tuple[str, int]:
    """``(version string, version int)`` as librdkafka's ``rd_kafka_version()`` shapes them
    (``0xMMmmrrpp``); there is no librdkafka underneath, so these are this drop-in's."""
    text = version()
    major, minor, patch = (int(x) for x in text.split(".")[:3])
    return text, major << 24 | minor << 16 | patch << 8 | 0xFF


class MessageStatus(enum.IntEnum):
    """Where a message ended, with librdkafka's ``rd_kafka_msg_status_t`` values."""

    NOT_PERSISTED = 0
    POSSIBLY_PERSISTED = 1
    PERSISTED = 2


_NOT_STORED = MessageStatus.NOT_PERSISTED
_STATUS = {
    DeliveryStatus.PERSISTED: MessageStatus.PERSISTED,
    DeliveryStatus.NOT_PERSISTED: MessageStatus.NOT_PERSISTED,
    DeliveryStatus.POSSIBLY_PERSISTED: MessageStatus.POSSIBLY_PERSISTED,
}


if TYPE_CHECKING:

    class KafkaException(Exception):
        """Raised for errors outside delivery reports; ``args[0]`` is the :class:`KafkaError`."""

else:
    _native_module = _shared.native(_NATIVE)
    if _native_module is not None:
        # the very class confluent-kafka raises, so that ``except KafkaException`` catches the
        # errors of the passed-through Consumer and AdminClient as well as the producer's
        KafkaException = _native_module.KafkaException
    else:

        class KafkaException(Exception):
            """Raised for errors outside delivery reports; ``args[0]`` is the :class:`KafkaError`."""


class KafkaError(KafkaException):
    """An error or event, as confluent-kafka's ``KafkaError``: ``code()``, ``name()``,
    ``str()``, ``fatal()``, ``retriable()``, ``txn_requires_abort()``; constants for every
    code of librdkafka (``KafkaError._MSG_TIMED_OUT``, ``KafkaError.REBALANCE_IN_PROGRESS``...).

    It can be raised: it is a :class:`KafkaException` whose ``args[0]`` is itself.

    Extension: ``status()`` is the :class:`MessageStatus` of the message the error is about
    (None for errors that are not about one message), and ``cause`` the idempotent error.

    Raises:
        TypeError: ``error`` is not an int.
    """

    _BAD_MSG: ClassVar[int] = -199
    _DESTROY: ClassVar[int] = -197
    _FAIL: ClassVar[int] = -196
    _TRANSPORT: ClassVar[int] = -195
    _MSG_TIMED_OUT: ClassVar[int] = -192
    _UNKNOWN_PARTITION: ClassVar[int] = -190
    _UNKNOWN_TOPIC: ClassVar[int] = -188
    _ALL_BROKERS_DOWN: ClassVar[int] = -187
    _INVALID_ARG: ClassVar[int] = -186
    _TIMED_OUT: ClassVar[int] = -185
    _QUEUE_FULL: ClassVar[int] = -184
    _STATE: ClassVar[int] = -172
    _NOT_IMPLEMENTED: ClassVar[int] = -170
    _PURGE_QUEUE: ClassVar[int] = -152
    _PURGE_INFLIGHT: ClassVar[int] = -151
    _FATAL: ClassVar[int] = -150
    _INCONSISTENT: ClassVar[int] = -149
    _GAPLESS_GUARANTEE: ClassVar[int] = -148
    _FENCED: ClassVar[int] = -144
    UNKNOWN: ClassVar[int] = -1
    NO_ERROR: ClassVar[int] = 0
    UNKNOWN_TOPIC_OR_PART: ClassVar[int] = 3
    REQUEST_TIMED_OUT: ClassVar[int] = 7
    MSG_SIZE_TOO_LARGE: ClassVar[int] = 10
    TOPIC_EXCEPTION: ClassVar[int] = 17
    NOT_ENOUGH_REPLICAS: ClassVar[int] = 19
    INVALID_CONFIG: ClassVar[int] = 40
    OUT_OF_ORDER_SEQUENCE_NUMBER: ClassVar[int] = 45
    DUPLICATE_SEQUENCE_NUMBER: ClassVar[int] = 46
    INVALID_PRODUCER_EPOCH: ClassVar[int] = 47
    INVALID_TXN_STATE: ClassVar[int] = 48
    KAFKA_STORAGE_ERROR: ClassVar[int] = 56
    UNKNOWN_PRODUCER_ID: ClassVar[int] = 59
    INVALID_RECORD: ClassVar[int] = 87
    PRODUCER_FENCED: ClassVar[int] = 90

    def __init__(
        self,
        error: int,
        reason: str | None = None,
        fatal: bool = False,
        retriable: bool = False,
        txn_requires_abort: bool = False,
        *,
        status: MessageStatus | None = None,
        cause: BaseException | None = None,
    ) -> None:
        if not isinstance(error, int) or isinstance(error, bool):
            raise TypeError(f"KafkaError: the error code must be an int, not {type(error).__name__}")
        super().__init__(self)
        self._code = int(error)
        name, text = ERRORS.get(self._code, (f"ERR_{self._code}?", f"Err-{self._code}?"))
        self._name = name
        self._reason = reason
        self._str = reason if reason is not None else text
        self._fatal = bool(fatal)
        self._retriable = bool(retriable)
        self._txn_requires_abort = bool(txn_requires_abort)
        self._status = status
        self.cause = cause

    def code(self) -> int:
        """The error code (librdkafka's value)."""
        return self._code

    def name(self) -> builtins.str:
        """The code's name, e.g. ``_MSG_TIMED_OUT``."""
        return self._name

    def str(self) -> builtins.str:
        """A description of this error."""
        return self._str

    def fatal(self) -> bool:
        """True when the producer can no longer be used (create a new one)."""
        return self._fatal

    def retriable(self) -> bool:
        """True when the operation may be retried."""
        return self._retriable

    def txn_requires_abort(self) -> bool:
        """As given (there are no transactions here, so False for the producer's errors)."""
        return self._txn_requires_abort

    def status(self) -> MessageStatus | None:
        """Extension: the status of the message this error is about, if any."""
        return self._status

    def __str__(self) -> builtins.str:
        return f'KafkaError{{code={self._name},val={self._code},str="{self._str}"}}'

    def __repr__(self) -> builtins.str:
        return self.__str__()

    def __reduce__(self) -> tuple[Any, ...]:
        state = {"_status": self._status, "cause": self.cause}
        return (KafkaError, (self._code, self._reason, self._fatal, self._retriable, self._txn_requires_abort), state)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)


for _code, (_name, _text) in ERRORS.items():
    setattr(KafkaError, _name, _code)


def _invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, message))


def _not_implemented(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._NOT_IMPLEMENTED, message))


def _closed_error() -> RuntimeError:
    return RuntimeError("Producer has been closed")


def _check_message(self: object) -> None:
    if not isinstance(self, Message):
        raise TypeError(f"expected a Message, not {type(self).__name__}")


class Message:
    """A message, as confluent-kafka's ``Message``: handed to delivery callbacks, and
    constructible by applications (for tests) as upstream's is:
    ``Message(topic, partition, offset, key, value, headers, error, timestamp, latency,
    leader_epoch, delivery_count)``, every argument optional, with ``set_topic()``,
    ``set_value()``, ``set_key()``, ``set_headers()`` and ``set_error()``.

    ``offset()`` is the record's offset in the partition: for a resend the broker recognised
    as a duplicate it is the original record's offset (None when that fell out of the
    checker's window). Extensions: ``status()``, ``sequence()``, ``duplicate()``.

    Raises:
        TypeError: a method called on something that is not a Message.
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

    @classmethod
    def _report(
        cls,
        topic: str,
        partition: int,
        offset: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        error: KafkaError | None,
        timestamp_ms: int,
        latency: float,
        *,
        status: MessageStatus,
        sequence: int,
        duplicate: bool = False,
    ) -> Message:
        message = cls(
            topic,
            partition,
            OFFSET_INVALID if offset is None else offset,
            key,
            value,
            headers,
            error,
            (TIMESTAMP_CREATE_TIME, timestamp_ms),
            latency,
        )
        message._status = status
        message._sequence = sequence
        message._duplicate = duplicate
        return message

    def topic(self) -> Any:
        """The topic."""
        _check_message(self)
        return self._topic

    def partition(self) -> int | None:
        """The partition (None when unknown)."""
        _check_message(self)
        return None if self._partition < 0 else self._partition

    def offset(self) -> int | None:
        """The offset (None when unknown)."""
        _check_message(self)
        return None if self._offset < 0 else self._offset

    def key(self) -> Any:
        """The key (None when none)."""
        _check_message(self)
        return self._key

    def value(self) -> Any:
        """The value (None when none)."""
        _check_message(self)
        return self._value

    def headers(self) -> Any:
        """The headers as a list of ``(name, bytes)`` (None when none)."""
        _check_message(self)
        return self._headers

    def error(self) -> Any:
        """The :class:`KafkaError` of a failed message, else None."""
        _check_message(self)
        return self._error

    def timestamp(self) -> tuple[int, int]:
        """``(timestamp type, milliseconds)``: the time ``produce()`` was called."""
        _check_message(self)
        return self._timestamp

    def latency(self) -> float | None:
        """Seconds from ``produce`` to the delivery report (None when unknown)."""
        _check_message(self)
        return None if self._latency < 0 else self._latency

    def leader_epoch(self) -> int | None:
        """None: there is no partition leader epoch here."""
        _check_message(self)
        return None if self._leader_epoch < 0 else self._leader_epoch

    def delivery_count(self) -> int | None:
        """None: a consumer-side count."""
        _check_message(self)
        return None if self._delivery_count <= 0 else self._delivery_count

    def set_topic(self, topic: Any) -> None:
        """Replace the topic."""
        _check_message(self)
        self._topic = topic

    def set_value(self, value: Any) -> None:
        """Replace the value."""
        _check_message(self)
        self._value = value

    def set_key(self, key: Any) -> None:
        """Replace the key."""
        _check_message(self)
        self._key = key

    def set_headers(self, headers: Any) -> None:
        """Replace the headers."""
        _check_message(self)
        self._headers = headers

    def set_error(self, error: Any) -> None:
        """Replace the error."""
        _check_message(self)
        self._error = error

    def status(self) -> MessageStatus:
        """Extension: persisted, not persisted or possibly persisted."""
        _check_message(self)
        return self._status

    def sequence(self) -> int:
        """Extension: the record's sequence in its partition (-1 if it never got one)."""
        _check_message(self)
        return self._sequence

    def duplicate(self) -> bool:
        """Extension: True when the broker recognised the record as already stored."""
        _check_message(self)
        return self._duplicate

    def __len__(self) -> int:
        return 0 if self._value is None else len(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return bool(self.__reduce__()[1] == other.__reduce__()[1])

    __hash__ = None  # type: ignore[assignment]  # mutable (set_*), like upstream's

    def __reduce__(self) -> tuple[Any, ...]:
        args = (
            self._topic,
            self._partition,
            self._offset,
            self._key,
            self._value,
            self._headers,
            self._error,
            self._timestamp,
            self._latency,
            self._leader_epoch,
            self._delivery_count,
        )
        if (self._status, self._sequence, self._duplicate) == (MessageStatus.PERSISTED, -1, False):
            return (Message, args)
        return (Message, args, {"_status": self._status, "_sequence": self._sequence, "_duplicate": self._duplicate})

    def __repr__(self) -> str:
        return (
            f"Message(topic={self._topic!r}, partition={self._partition}, offset={self._offset}, "
            f"status={self._status.name}, error={self._error!r})"
        )


def kafka_error_for(error: BaseException, stopped: bool | None = None) -> KafkaError:
    """The :class:`KafkaError` a confluent-kafka application sees for an idempotent error.

    A :class:`~idempotent.errors.DeliveryFailed` is mapped through its cause and carries the
    message's status. ``fatal()`` is ``stopped`` when given (whether the error stopped the
    producer), else true for the errors that stop a producer when they end a sent batch.
    """
    status = None
    cause: BaseException = error
    if isinstance(error, DeliveryFailed):
        status = _STATUS[error.status]
        if error.__cause__ is not None:
            cause = error.__cause__
    code, retriable = _code_for(cause, status)
    if isinstance(cause, ProducerClosedError | UsageError):
        fatal = False
    elif stopped is not None:
        fatal = stopped
    else:
        fatal = isinstance(
            cause, ProducerFencedError | UnknownProducerError | SequenceDesyncError | DeliveryTimeoutError
        )
    return KafkaError(code, str(error), fatal=fatal, retriable=retriable and not fatal, status=status, cause=error)


def _code_for(cause: BaseException, status: MessageStatus | None) -> tuple[int, bool]:
    """``(code, retriable)`` for an idempotent error."""
    if isinstance(cause, ProducerFencedError):
        return KafkaError._FENCED, False
    if isinstance(cause, UnknownProducerError):
        return KafkaError.UNKNOWN_PRODUCER_ID, False
    if isinstance(cause, SequenceDesyncError):
        return KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, False
    if isinstance(cause, DeliveryTimeoutError):
        return KafkaError._MSG_TIMED_OUT, False
    if isinstance(cause, ProducerClosedError):
        inflight = status is MessageStatus.POSSIBLY_PERSISTED
        return (KafkaError._PURGE_INFLIGHT if inflight else KafkaError._PURGE_QUEUE), False
    if isinstance(cause, EntryTooLargeError):
        return KafkaError.MSG_SIZE_TOO_LARGE, False
    if isinstance(cause, RequestTimeoutError):
        return KafkaError._TIMED_OUT, True
    if isinstance(cause, PartitionRecoveringError):
        return KafkaError.NOT_ENOUGH_REPLICAS, True
    if isinstance(cause, TransportError):
        return KafkaError._TRANSPORT, True
    if isinstance(cause, InvalidTopicError):
        return KafkaError.TOPIC_EXCEPTION, False
    if isinstance(cause, InvalidBatchError):
        return KafkaError.INVALID_RECORD, False
    if isinstance(cause, QueueFullError):
        return KafkaError._QUEUE_FULL, True
    if isinstance(cause, UsageError):
        return KafkaError._INVALID_ARG, False
    return KafkaError._FAIL, False


# -- configuration ---------------------------------------------------------------------------

_ALIASES = {
    "metadata.broker.list": "bootstrap.servers",
    "queue.buffering.max.ms": "linger.ms",
    "delivery.timeout.ms": "message.timeout.ms",
    "max.in.flight.requests.per.connection": "max.in.flight",
    "message.send.max.retries": "retries",
    "request.required.acks": "acks",
    "compression.codec": "compression.type",
    "callback": "on_delivery",
}

_LIBRDKAFKA_DEFAULTS: dict[str, int] = {
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "message.timeout.ms": 300_000,
    "request.timeout.ms": 30_000,
    "max.in.flight": 5,
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "message.max.bytes": 1_000_000,
    "statistics.interval.ms": 0,
    "sticky.partitioning.linger.ms": 10,
}
_LIMITS: dict[str, tuple[int, int]] = {
    "linger.ms": (0, 900_000),
    "message.timeout.ms": (0, 2**31 - 1),
    "max.in.flight": (1, 1_000_000),
    "message.max.bytes": (1000, 1_000_000_000),
    "statistics.interval.ms": (0, 86_400_000),
    "sticky.partitioning.linger.ms": (0, 900_000),
}

# confluent-kafka's own keys (callbacks and the Python logger), next to librdkafka's properties
_CALLBACKS = ("on_delivery", "error_cb", "stats_cb", "throttle_cb", "oauth_cb")

# keys logged (once each) as accepted without effect
_IGNORED_LOGGED: set[str] = set()


def _accept_without_effect(key: str, why: str) -> None:
    if key not in _IGNORED_LOGGED:
        _IGNORED_LOGGED.add(key)
        _LOG.debug("configuration property %r is accepted without effect: %s", key, why)


def _as_int(key: str, value: Any, minimum: int, maximum: int) -> int:
    try:
        number = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not minimum <= number <= maximum:
        raise _invalid(f"Configuration property {key!r}: {value!r} is not an integer in {minimum}..{maximum}")
    return number


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "t"):
        return True
    if text in ("false", "0", "f"):
        return False
    raise _invalid(f"Configuration property {key!r}: {value!r} is not a boolean")


def _flatten(conf: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The configuration as ``(key, value)`` pairs in the order librdkafka applies them: the
    keys in order (an alias sets the same property, so the later one wins), then the
    deprecated ``default.topic.config`` dict."""
    pairs: list[tuple[str, Any]] = []
    topic_conf: Any = None
    for key, value in conf.items():
        if not isinstance(key, str):
            raise TypeError(f"configuration keys must be str, got {key!r}")
        if key == "default.topic.config":
            topic_conf = value
        else:
            pairs.append((key, value))
    if topic_conf is not None:
        if not isinstance(topic_conf, Mapping):
            raise TypeError("default.topic.config must be a dict")
        pairs.extend(_flatten(topic_conf))
    return pairs


class _Config:
    """The producer configuration, validated. Every key librdkafka or confluent-kafka
    accepts is accepted: used when it means something here, else accepted without effect
    (logged once at DEBUG, listed in ``docs/migration.md``); only an option that would
    weaken the exactly-once guarantee is refused, saying why. An unknown key is refused as
    librdkafka refuses it."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        if not isinstance(conf, Mapping):
            raise TypeError(f"expected configuration dict, got {type(conf).__name__}")
        self.broker: BrokerAPI | None = None
        self.url = os.environ.get(ENV_BROKER_URL) or DEFAULT_BROKER_URL
        self.producer_name: str | None = None
        self.on_delivery: Callable[[KafkaError | None, Message], Any] | None = None
        self.error_cb: Callable[[KafkaError], Any] | None = None
        self.stats_cb: Callable[[str], Any] | None = None
        self.client_id = "rdkafka"
        self.only_errors = False
        self.partitioner = "consistent_random"
        numbers = dict(_LIBRDKAFKA_DEFAULTS)
        for raw_key, value in _flatten(conf):
            key = _ALIASES.get(raw_key, raw_key)
            if key in numbers:
                low, high = _LIMITS.get(key, (1, 2**31 - 1))
                numbers[key] = _as_int(raw_key, value, low, high)
            elif key == "idempotent.broker.url":
                if not isinstance(value, str):
                    raise _invalid(f"Configuration property 'idempotent.broker.url' must be a URL str, not {value!r}")
                self.url = value
            elif key == "idempotent.broker":
                if not isinstance(value, BrokerAPI):
                    raise _invalid(f"Configuration property 'idempotent.broker' must be a broker handle, not {value!r}")
                self.broker = value
            elif key in ("idempotent.producer.name", "transactional.id"):
                if not isinstance(value, str) or not value:
                    raise _invalid(f"Configuration property {key!r} must be a non-empty str")
                if self.producer_name is not None and self.producer_name != value:
                    raise _invalid("'transactional.id' and 'idempotent.producer.name' name different producers")
                self.producer_name = value
            elif key == "enable.idempotence":
                if not _as_bool(key, value):
                    raise _invalid(
                        "Configuration property 'enable.idempotence'=false is not supported: it would give up "
                        "the exactly-once guarantee; every record goes through the broker's sequence checker"
                    )
            elif key == "partitioner":
                if value not in PARTITIONERS:
                    raise _invalid(f'Invalid value for configuration property "partitioner": {value}')
                self.partitioner = value
            elif key in _CALLBACKS:
                if value is not None and not callable(value):
                    raise TypeError(f"expected {key} property as a callable function")
                if key == "on_delivery":
                    self.on_delivery = value
                elif key == "error_cb":
                    self.error_cb = value
                elif key == "stats_cb":
                    self.stats_cb = value
                else:
                    _accept_without_effect(key, "there is no Kafka broker to throttle or authenticate to")
            elif key == "logger":
                if value is not None and not isinstance(value, logging.Logger | logging.LoggerAdapter):
                    raise TypeError("logger must be a logging.Logger")
                _accept_without_effect(key, "the drop-in logs to the idempotent.compat.confluent_kafka logger")
            elif key == "delivery.report.only.error":
                self.only_errors = _as_bool(key, value)
            elif key == "client.id":
                self.client_id = str(value)
            elif key in PROPERTIES:
                _accept_without_effect(key, _NO_EFFECT_REASON)
            else:
                raise _invalid(f'No such configuration property: "{raw_key}"')
        self.linger_ms = float(numbers["linger.ms"])
        self.batch_size = int(numbers["batch.size"])
        self.max_batch_records = int(numbers["batch.num.messages"])
        timeout = int(numbers["message.timeout.ms"])
        self.delivery_timeout_ms = float(timeout) if timeout > 0 else float(2**31 - 1)  # 0 = infinite
        self.request_timeout_ms = float(numbers["request.timeout.ms"])
        # more in flight than the checker's window would let a resend go unrecognised: at most 5
        self.max_in_flight = min(int(numbers["max.in.flight"]), 5)
        self.max_messages = int(numbers["queue.buffering.max.messages"])
        self.max_bytes = int(numbers["queue.buffering.max.kbytes"]) * 1024
        self.max_message_bytes = int(numbers["message.max.bytes"])
        self.stats_interval = int(numbers["statistics.interval.ms"]) / 1000.0
        self.sticky_linger = int(numbers["sticky.partitioning.linger.ms"]) / 1000.0


_NO_EFFECT_REASON = (
    "it tunes a Kafka client or broker connection, and records go to the idempotent broker "
    "(idempotent.broker.url) through its sequence checker; see docs/migration.md"
)


# -- the producer ----------------------------------------------------------------------------


class _Reports:
    """Delivery reports waiting to be served by poll/flush (shared with the sender thread)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.ready: collections.deque[tuple[Callable[..., Any] | None, KafkaError | None, Message]] = (
            collections.deque()
        )
        self.errors: collections.deque[KafkaError] = collections.deque()
        self.outstanding = 0  # produced, report not yet served
        self.outstanding_bytes = 0
        self.fatal: KafkaError | None = None


def _header_list(
    headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
) -> list[tuple[str, bytes]] | None:
    if headers is None:
        return None
    if not isinstance(headers, Mapping | list):
        raise TypeError(f"headers must be a dict or a list of (key, value) tuples, not {type(headers).__name__}")
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"headers: expected a (key, value) tuple, not {item!r}")
        name, data = item
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, not {type(name).__name__}")
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"header {name!r}: value must be bytes or str, not {type(data).__name__}")
        out.append((name, bytes(data)))
    return out


def _payload(what: str, value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, str or None, not {type(value).__name__}")


def _close(producer: _Producer, url: str | None, timeout: float) -> None:
    try:
        producer.close(timeout)
    finally:
        if url is not None:
            _shared.release(url)


#: one pending delivery report: (callback, error, message)
_Report = tuple[Callable[..., Any] | None, KafkaError | None, Message]


class Producer:
    """confluent-kafka's ``Producer``, exactly-once through this project's broker.

    As upstream's, it is a context manager (``with Producer(conf) as p:`` closes it) and
    always true; once closed (or when a subclass never called ``__init__``) every method
    raises ``RuntimeError("Producer has been closed")``.

    Args:
        conf: the configuration dict (see the module docstring and ``docs/migration.md``).
        **kwargs: configuration given as keyword arguments, as confluent-kafka allows.

    Raises:
        TypeError: no configuration at all, or a callback that is not callable.
        KafkaException: ``_INVALID_ARG`` for an unknown key or an invalid value (named in
            the message), or for ``enable.idempotence=false``; or the broker could not be
            opened.
    """

    _closed = True  # until __init__ has run: a subclass that skips it gets RuntimeError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > 1:
            raise TypeError(f"Producer() takes one configuration dict, {len(args)} given")
        if not args and not kwargs:
            raise TypeError("expected configuration dict")
        if args and not isinstance(args[0], Mapping):
            raise TypeError(f"expected configuration dict, got {type(args[0]).__name__}")
        merged = dict(args[0]) if args else {}
        merged.update(kwargs)
        config = _Config(merged)
        self._config = config
        self._reports = _Reports()
        self._url: str | None = None
        if config.broker is not None:
            broker: BrokerAPI = config.broker
        else:
            try:
                broker = _shared.acquire(config.url)
            except ProducerError as exc:
                raise KafkaException(kafka_error_for(exc)) from exc
            self._url = config.url
        try:
            self._producer = _Producer(
                broker,
                config.producer_name,
                max_in_flight=config.max_in_flight,
                linger_ms=config.linger_ms,
                batch_size=config.batch_size,
                max_batch_records=config.max_batch_records,
                request_timeout_ms=config.request_timeout_ms,
                delivery_timeout_ms=config.delivery_timeout_ms,
                max_buffered_records=config.max_messages,
            )
        except ProducerError as exc:
            if self._url is not None:
                _shared.release(self._url)
            raise KafkaException(kafka_error_for(exc)) from exc
        self._random = random.Random()
        #: topic -> (the partition messages without a key go to, until when): librdkafka's sticky partitioning
        self._sticky: dict[str, tuple[int, float]] = {}
        self._created = time.monotonic()
        # statistics are due every statistics.interval.ms, and only when there is a stats_cb to get them
        stats_on = config.stats_interval > 0 and config.stats_cb is not None
        self._stats_due = self._created + config.stats_interval if stats_on else None
        self._closed = False
        self._finalizer = weakref.finalize(self, _close, self._producer, self._url, 0.0)

    def _check_open(self) -> None:
        if self._closed:
            raise _closed_error()

    # -- identity (extensions) ---------------------------------------------------------------

    @property
    def producer(self) -> _Producer:
        """Extension: the underlying :class:`idempotent.Producer`."""
        self._check_open()
        return self._producer

    def __bool__(self) -> bool:
        return True

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._closed:
            self.close()

    # -- produce -----------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: Callable[[KafkaError | None, Message], Any] | None = None,
        callback: Callable[[KafkaError | None, Message], Any] | None = None,
        timestamp: int = 0,
        headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    ) -> None:
        """Queue a message; its delivery report is served by a later :meth:`poll` or :meth:`flush`.

        ``timestamp`` (milliseconds) is the message's create time in its delivery report;
        the stored record carries the time the backend stored it.

        Raises:
            BufferError: ``queue.buffering.max.messages`` or ``.kbytes`` reached; call
                ``poll()`` and produce again.
            KafkaException: ``MSG_SIZE_TOO_LARGE`` (over ``message.max.bytes``),
                ``_UNKNOWN_PARTITION`` (no such partition), ``TOPIC_EXCEPTION`` (bad topic
                name), ``_FATAL`` (the producer failed earlier: fenced, timed out, ...).
            RuntimeError: the producer is closed.
            TypeError: a value, key or header of an unsupported type.
        """
        self._check_open()
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise TypeError(f"timestamp must be int, not {type(timestamp).__name__}")
        if on_delivery is not None and callback is not None and on_delivery is not callback:
            raise TypeError("give on_delivery or callback, not both")
        report = on_delivery or callback or self._config.on_delivery
        if report is not None and not callable(report):
            raise TypeError("on_delivery must be callable")
        value_bytes = _payload("value", value)
        key_bytes = _payload("key", key)
        header_list = _header_list(headers)
        size = len(value_bytes or b"") + len(key_bytes or b"")
        if size > self._config.max_message_bytes:
            raise KafkaException(
                KafkaError(
                    KafkaError.MSG_SIZE_TOO_LARGE,
                    f"Message size {size} exceeds message.max.bytes={self._config.max_message_bytes}",
                )
            )
        target = self._partition(topic, partition, key_bytes)
        self._reserve(1, size)
        created_ms = timestamp or int(time.time() * 1000)
        started = time.monotonic()
        try:
            future = self._producer.send(topic, value_bytes, key_bytes, target, header_list).concurrent()
        except BaseException as exc:
            self._unreserve(1, size)
            raise self._send_refused(exc) from exc
        entry = (topic, target, key_bytes, value_bytes, header_list, created_ms, report, size)

        def done(f: Future[RecordMetadata]) -> None:
            outcome: RecordMetadata | BaseException | None = f.exception()
            if outcome is None:
                outcome = f.result()
            self._deliver([(entry, outcome)], time.monotonic() - started)

        future.add_done_callback(done)

    def _reserve(self, count: int, size: int) -> None:
        """Take ``count`` report slots (check and take in one step, so that concurrent
        produce() calls cannot overfill the queue).

        Raises:
            KafkaException: ``_FATAL``, the producer failed earlier.
            BufferError: the local queue is full.
        """
        reports = self._reports
        with reports.cond:
            if reports.fatal is not None:
                raise KafkaException(self._fatal_error())
            if reports.outstanding + count > self._config.max_messages or (
                reports.outstanding and reports.outstanding_bytes + size > self._config.max_bytes
            ):
                raise BufferError(KafkaError(KafkaError._QUEUE_FULL).str())
            reports.outstanding += count
            reports.outstanding_bytes += size

    def _reserve_upto(self, sizes: list[int]) -> int:
        """Take report slots for as many of the leading messages (of ``sizes`` bytes) as the
        queue holds, in one step.

        Returns:
            How many were taken (the rest do not fit).

        Raises:
            KafkaException: ``_FATAL``, the producer failed earlier.
        """
        reports = self._reports
        with reports.cond:
            if reports.fatal is not None:
                raise KafkaException(self._fatal_error())
            room = max(0, self._config.max_messages - reports.outstanding)
            taken = total = 0
            for size in sizes[:room]:
                if (reports.outstanding or taken) and reports.outstanding_bytes + total + size > self._config.max_bytes:
                    break
                taken += 1
                total += size
            reports.outstanding += taken
            reports.outstanding_bytes += total
            return taken

    def _unreserve(self, count: int, size: int) -> None:
        with self._reports.cond:
            self._reports.outstanding -= count
            self._reports.outstanding_bytes -= size

    def _send_refused(self, exc: BaseException) -> BaseException:
        """What produce() raises when the producer refused a message it was handed."""
        if isinstance(exc, QueueFullError):
            return BufferError(KafkaError(KafkaError._QUEUE_FULL).str())
        if isinstance(exc, ProducerClosedError):
            return _closed_error()
        if isinstance(exc, UsageError):
            return KafkaException(kafka_error_for(exc))
        if isinstance(exc, ProducerError):
            return KafkaException(KafkaError(KafkaError._FATAL, f"producer failed: {exc}", fatal=True, cause=exc))
        return exc

    def _deliver(
        self,
        ended: list[tuple[tuple[Any, ...], RecordMetadata | BaseException]],
        latency: float,
    ) -> None:
        """Queue the delivery reports of messages that ended (called on the sender thread)."""
        inner = self._producer
        only_errors = self._config.only_errors
        out: list[_Report] = []
        fatal: KafkaError | None = None
        for (topic, target, key, value, headers, created_ms, report, _size), outcome in ended:
            if isinstance(outcome, RecordMetadata):
                err = None
                msg = Message._report(
                    topic,
                    outcome.partition,
                    outcome.offset,
                    key,
                    value,
                    headers,
                    None,
                    created_ms,
                    latency,
                    status=MessageStatus.PERSISTED,
                    sequence=outcome.sequence,
                    duplicate=outcome.duplicate,
                )
            else:
                if isinstance(outcome, KafkaError):
                    err = outcome
                else:
                    failure = inner.failure
                    stopped = failure is not None and (outcome is failure or outcome.__cause__ is failure)
                    err = kafka_error_for(outcome, stopped)
                if err.fatal() and fatal is None:
                    fatal = err
                msg = Message._report(
                    topic,
                    target,
                    None,
                    key,
                    value,
                    headers,
                    err,
                    created_ms,
                    latency,
                    status=err.status() or MessageStatus.NOT_PERSISTED,
                    sequence=outcome.sequence if isinstance(outcome, DeliveryFailed) else -1,
                )
            cb = report if report is not None and (err is not None or not only_errors) else None
            out.append((cb, err, msg))
        size = sum(entry[-1] for entry, _ in ended)
        reports = self._reports
        with reports.cond:
            if fatal is not None and reports.fatal is None:
                reports.fatal = fatal
                reports.errors.append(fatal)
            reports.ready.extend(out)
            reports.outstanding_bytes -= size
            reports.cond.notify_all()

    def produce_batch(
        self,
        topic: str,
        messages: list[dict[str, Any]],
        partition: int = -1,
        on_delivery: Callable[[KafkaError | None, Message], Any] | None = None,
        callback: Callable[[KafkaError | None, Message], Any] | None = None,
    ) -> int:
        """Queue many messages at once, as confluent-kafka's ``produce_batch``: each a dict
        with ``value``, and optionally ``key``, ``partition``, ``headers`` and ``callback``
        (or ``on_delivery``); other keys are ignored. The messages of one partition go to
        the producer together (``idempotent.Producer.send_many``), one future per
        partition, and each gets its own delivery report from :meth:`poll`/:meth:`flush`.

        A message that cannot be queued (full queue, unknown partition, over
        ``message.max.bytes``) is left out and gets its :class:`KafkaError` as
        ``message["_error"]``; the others are queued.

        Returns:
            How many messages were queued.

        Raises:
            TypeError, ValueError: ``messages`` is not a list of dicts, or a value, key,
                partition or header of the wrong type (nothing queued).
            NotImplementedError: a message with a ``timestamp`` (nothing queued), as upstream.
            KafkaException: ``_FATAL``, the producer failed earlier.
            RuntimeError: the producer is closed.
        """
        self._check_open()
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if not isinstance(messages, list):
            raise TypeError("messages must be a list of dicts")
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise TypeError(f"partition must be int, not {type(partition).__name__}")
        if on_delivery is not None and callback is not None and on_delivery is not callback:
            raise TypeError("give on_delivery or callback, not both")
        default_report = on_delivery or callback or self._config.on_delivery
        if default_report is not None and not callable(default_report):
            raise TypeError("on_delivery must be callable")
        prepared = []
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise TypeError(f"Message at index {index} must be a dict, not {type(message).__name__}")
            if message.get("timestamp"):
                raise NotImplementedError("Message timestamps are not currently supported in produce_batch")
            value, key = message.get("value"), message.get("key")
            if value is not None and not isinstance(value, bytes | str):
                raise TypeError(f"Message value at index {index} must be bytes or str")
            if key is not None and not isinstance(key, bytes | str):
                raise TypeError(f"Message key at index {index} must be bytes or str")
            target = message.get("partition", partition)
            if not isinstance(target, int) or isinstance(target, bool):
                raise TypeError(f"Message partition at index {index} must be int")
            report = message.get("callback") or message.get("on_delivery") or default_report
            if report is not None and not callable(report):
                raise TypeError(f"Message callback at index {index} must be callable")
            value_bytes, key_bytes = _payload("value", value), _payload("key", key)
            prepared.append((index, target, value_bytes, key_bytes, _header_list(message.get("headers")), report))
        count = self._partition_count(topic) if prepared else 1
        fitting: list[tuple[int, int, bytes | None, bytes | None, Any, Any, int]] = []
        for index, target, value_bytes, key_bytes, header_list, report in prepared:
            size = len(value_bytes or b"") + len(key_bytes or b"")
            if size > self._config.max_message_bytes:
                messages[index]["_error"] = KafkaError(
                    KafkaError.MSG_SIZE_TOO_LARGE,
                    f"Message size {size} exceeds message.max.bytes={self._config.max_message_bytes}",
                )
            else:
                fitting.append((index, target, value_bytes, key_bytes, header_list, report, size))
        taken = self._reserve_upto([entry[-1] for entry in fitting])  # one lock for the whole batch
        for index, *_ in fitting[taken:]:
            messages[index]["_error"] = KafkaError(KafkaError._QUEUE_FULL)
        created_ms = int(time.time() * 1000)
        groups: dict[int, list[tuple[Any, ...]]] = {}
        unknown: list[tuple[Any, ...]] = []
        for index, target, value_bytes, key_bytes, header_list, report, size in fitting[:taken]:
            if target == -1:
                target = self._choose(topic, count, key_bytes)
            entry = (topic, target, key_bytes, value_bytes, header_list, created_ms, report, size)
            if not 0 <= target < count:  # queued, and failed in its delivery report (as librdkafka)
                unknown.append(entry)
            else:
                groups.setdefault(target, []).append((index, entry))
        queued = len(unknown)
        if unknown:
            error = KafkaError(
                KafkaError._UNKNOWN_PARTITION, f"topic {topic!r} has partitions 0..{count - 1}", status=_NOT_STORED
            )
            self._deliver([(entry, error) for entry in unknown], 0.0)
        for target, group in groups.items():
            records = [Record(entry[3], entry[2], entry[4] or ()) for _, entry in group]
            started = time.monotonic()
            try:
                future = self._producer.send_many(topic, records, partition=target)
            except BaseException as exc:
                self._unreserve(len(group), sum(entry[-1] for _, entry in group))
                refused = self._send_refused(exc)
                if not isinstance(refused, BufferError | KafkaException):
                    raise refused from exc
                for index, _ in group:
                    messages[index]["_error"] = (
                        refused.args[0] if isinstance(refused, KafkaException) else KafkaError(KafkaError._QUEUE_FULL)
                    )
                continue
            queued += len(group)
            entries = [entry for _, entry in group]

            def done(f: SendManyFuture, entries: list[tuple[Any, ...]] = entries, started: float = started) -> None:
                deliveries = f.deliveries()
                self._deliver(list(zip(entries, deliveries, strict=True)), time.monotonic() - started)

            future.add_done_callback(done)  # type: ignore[arg-type]
        return queued

    def _choose(self, topic: str, count: int, key: bytes | None) -> int:
        """The partition the configured partitioner picks for ``key``, by librdkafka's rules
        (:mod:`._partitioners`); where librdkafka picks at random, so does this: the topic's
        sticky partition for ``sticky.partitioning.linger.ms`` or a random one per message."""
        name = self._config.partitioner
        chosen = librdkafka_partition(name, key, count)
        if chosen is not None:
            return chosen
        if not librdkafka_sticky(name, key, self._config.sticky_linger):
            return self._random.randrange(count)
        now = time.monotonic()
        sticky = self._sticky.get(topic)
        if sticky is None or now >= sticky[1] or sticky[0] >= count:
            sticky = self._sticky[topic] = (self._random.randrange(count), now + self._config.sticky_linger)
        return sticky[0]

    def _partition_count(self, topic: str) -> int:
        try:
            return self._producer.partitions_for(topic)
        except InvalidTopicError as exc:
            raise KafkaException(KafkaError(KafkaError.TOPIC_EXCEPTION, str(exc), cause=exc)) from exc
        except ProducerError as exc:
            raise KafkaException(kafka_error_for(exc)) from exc

    def _partition(self, topic: str, partition: int, key: bytes | None) -> int:
        count = self._partition_count(topic)
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise TypeError(f"partition must be int, not {type(partition).__name__}")
        if partition == -1:
            return self._choose(topic, count, key)
        if not 0 <= partition < count:
            raise KafkaException(
                KafkaError(KafkaError._UNKNOWN_PARTITION, f"topic {topic!r} has partitions 0..{count - 1}")
            )
        return partition

    def _fatal_error(self) -> KafkaError:
        fatal = self._reports.fatal
        assert fatal is not None
        return KafkaError(KafkaError._FATAL, f"{fatal.name()}: {fatal.str()}", fatal=True, cause=fatal.cause)

    # -- reports -----------------------------------------------------------------------------

    def poll(self, timeout: float | None = -1) -> int:
        """Serve delivery reports (and ``error_cb`` and ``stats_cb`` events), waiting up to
        ``timeout`` seconds for the first one (None or negative: wait indefinitely).

        Returns:
            How many events were served.

        Raises:
            RuntimeError: the producer is closed.
            Whatever a callback raises (the remaining reports stay queued).
        """
        self._check_open()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        reports = self._reports
        with reports.cond:
            while not reports.ready and not reports.errors:
                now = time.monotonic()
                if self._stats_due is not None and now >= self._stats_due:
                    break
                remaining = None if deadline is None else deadline - now
                if remaining is not None and remaining <= 0:
                    return 0
                if self._stats_due is not None:
                    remaining = self._stats_due - now if remaining is None else min(remaining, self._stats_due - now)
                reports.cond.wait(remaining)
        return self._serve()

    def _stats(self) -> int:
        """Call ``stats_cb`` with librdkafka-shaped statistics when they are due."""
        due = self._stats_due
        stats_cb = self._config.stats_cb
        now = time.monotonic()
        if due is None or now < due:
            return 0
        self._stats_due = now + self._config.stats_interval
        if stats_cb is None:
            return 0
        reports = self._reports
        with reports.cond:
            outstanding, outstanding_bytes = reports.outstanding, reports.outstanding_bytes
        document = {
            "name": f"{self._config.client_id}#producer-{id(self):x}",
            "client_id": self._config.client_id,
            "type": "producer",
            "ts": int(now * 1_000_000),
            "time": int(time.time()),
            "age": int((now - self._created) * 1_000_000),
            "msg_cnt": outstanding,
            "msg_size": outstanding_bytes,
            "msg_max": self._config.max_messages,
            "msg_size_max": self._config.max_bytes,
            "brokers": {},
            "topics": {},
        }
        stats_cb(json.dumps(document))
        return 1

    def _serve(self) -> int:
        reports = self._reports
        served = self._stats()
        while True:
            with reports.cond:
                if reports.errors:
                    error: KafkaError | None = reports.errors.popleft()
                    item = None
                elif reports.ready:
                    error = None
                    item = reports.ready.popleft()
                    reports.outstanding -= 1
                else:
                    return served
            served += 1
            if error is not None:
                if self._config.error_cb is not None:
                    self._config.error_cb(error)
                else:
                    _LOG.error("producer failed: %s (%s)", error.str(), error.name())
                continue
            assert item is not None
            cb, err, msg = item
            if cb is not None:
                cb(err, msg)

    def flush(self, timeout: float | None = -1) -> int:
        """Send everything queued, wait for every delivery and serve every report.

        Returns:
            How many messages are still waiting (0 unless ``timeout`` ran out).

        Raises:
            RuntimeError: the producer is closed.
            Whatever a callback raises.
        """
        self._check_open()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        self._producer.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))
        reports = self._reports
        while True:
            self._serve()
            with reports.cond:
                if reports.outstanding == 0:
                    return 0
                if not reports.ready and not reports.errors:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return reports.outstanding
                    reports.cond.wait(remaining)

    def __len__(self) -> int:
        """Messages produced whose delivery report has not been served yet (0 once closed)."""
        if self._closed:
            return 0
        with self._reports.cond:
            return self._reports.outstanding

    def close(self, timeout: float | None = -1) -> bool:
        """Flush (up to ``timeout``), then release the producer and, when the last user of
        it, the broker. Reports not served by then are dropped; messages not yet delivered
        fail as purged. Closing again does nothing.

        Returns:
            True.

        Raises:
            Whatever a callback raises while flushing (the producer is closed anyway).
        """
        if self._closed:
            return True
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            self._finalizer.detach()
            _close(self._producer, self._url, 0.0)
        return True

    # -- accepted without effect ---------------------------------------------------------

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Accepted without effect: credentials belong to the backend (``idempotent.broker.url``).

        Raises:
            TypeError: username or password is not a str.
            RuntimeError: the producer is closed.
        """
        self._check_open()
        if not isinstance(username, str) or not isinstance(password, str):
            raise TypeError("set_sasl_credentials: username and password must be str")
        _accept_without_effect("set_sasl_credentials()", "credentials belong to the backend")

    # -- refused -----------------------------------------------------------------------------

    def _transactions(self, name: str) -> KafkaException:
        self._check_open()
        return _not_implemented(
            f"{name}() is not supported: transactions are not available; every record is "
            "stored exactly once without them (transactional.id only names the producer)"
        )

    def init_transactions(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise self._transactions("init_transactions")

    def begin_transaction(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise self._transactions("begin_transaction")

    def commit_transaction(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise self._transactions("commit_transaction")

    def abort_transaction(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise self._transactions("abort_transaction")

    def send_offsets_to_transaction(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise self._transactions("send_offsets_to_transaction")

    def purge(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        self._check_open()
        raise _not_implemented("purge() is not supported: use flush(), or close() to drop what is left")

    def list_topics(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        self._check_open()
        raise _not_implemented("list_topics() is not supported: use the broker's topics()")


class SerializingProducer(Producer):
    """confluent-kafka's ``SerializingProducer``, exactly-once: ``key.serializer`` and
    ``value.serializer`` in the configuration (confluent-kafka's serializers, or any
    ``callable(obj, ctx) -> bytes``) turn keys and values into bytes before
    :meth:`Producer.produce`.

    Raises:
        TypeError, KafkaException: as :class:`Producer`.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        if not isinstance(conf, Mapping):
            raise TypeError(f"expected configuration dict, got {type(conf).__name__}")
        rest = dict(conf)
        self._key_serializer: Callable[[Any, Any], Any] | None = rest.pop("key.serializer", None)
        self._value_serializer: Callable[[Any, Any], Any] | None = rest.pop("value.serializer", None)
        super().__init__(rest)

    def produce(  # type: ignore[override]
        self,
        topic: str,
        key: Any = None,
        value: Any = None,
        partition: int = -1,
        on_delivery: Callable[[KafkaError | None, Message], Any] | None = None,
        timestamp: int = 0,
        headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    ) -> None:
        """Serialize ``key`` and ``value``, then produce as :meth:`Producer.produce` does.

        Raises:
            KeySerializationError, ValueSerializationError: a serializer failed (confluent-kafka's
                classes when it is installed, else :class:`KafkaException`); nothing queued.
            As :meth:`Producer.produce` otherwise.
        """
        self._check_open()
        serialization = _shared.native(_NATIVE + ".serialization")
        native_errors = _shared.native(_NATIVE + ".error")
        if self._key_serializer is not None:
            ctx = (
                None
                if serialization is None
                else serialization.SerializationContext(topic, serialization.MessageField.KEY, headers)
            )
            try:
                key = self._key_serializer(key, ctx)
            except Exception as exc:
                if native_errors is None:
                    raise KafkaException(KafkaError(KafkaError._KEY_SERIALIZATION, str(exc))) from exc  # type: ignore[attr-defined]
                raise native_errors.KeySerializationError(exception=exc) from exc
        if self._value_serializer is not None:
            ctx = (
                None
                if serialization is None
                else serialization.SerializationContext(topic, serialization.MessageField.VALUE, headers)
            )
            try:
                value = self._value_serializer(value, ctx)
            except Exception as exc:
                if native_errors is None:
                    raise KafkaException(KafkaError(KafkaError._VALUE_SERIALIZATION, str(exc))) from exc  # type: ignore[attr-defined]
                raise native_errors.ValueSerializationError(exception=exc) from exc
        super().produce(topic, value, key, partition, on_delivery=on_delivery, timestamp=timestamp, headers=headers)
