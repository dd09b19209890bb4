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

Every configuration key, argument value and method outside the supported surface
(``docs/migration.md``) raises :class:`KafkaException` with ``_INVALID_ARG`` or
``_NOT_IMPLEMENTED`` naming it; unknown keyword arguments raise ``TypeError``.
"""

from __future__ import annotations

import builtins
import collections
import enum
import logging
import os
import random
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, ClassVar

from .._outcomes import DeliveryStatus, RecordMetadata
from ..api import BrokerAPI
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
from . import _shared

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
    "TopicPartition",
    "libversion",
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


def version() -> tuple[str, int]:
    """``(version string, version int)`` of this drop-in (confluent-kafka's ``version()``)."""
    from .. import __version__

    major, minor, patch = (int(x) for x in __version__.split(".")[:3])
    return __version__, major << 24 | minor << 16 | patch << 8


def libversion() -> tuple[str, int]:
    """The same as :func:`version`: there is no librdkafka underneath."""
    return version()


class MessageStatus(enum.IntEnum):
    """Where a message ended, with librdkafka's ``rd_kafka_msg_status_t`` values."""

    NOT_PERSISTED = 0
    POSSIBLY_PERSISTED = 1
    PERSISTED = 2


_STATUS = {
    DeliveryStatus.PERSISTED: MessageStatus.PERSISTED,
    DeliveryStatus.NOT_PERSISTED: MessageStatus.NOT_PERSISTED,
    DeliveryStatus.POSSIBLY_PERSISTED: MessageStatus.POSSIBLY_PERSISTED,
}

# librdkafka's codes (rdkafka.h) and descriptions (rd_kafka_err2str) for the errors this
# module raises or reports, plus the ones applications commonly compare against.
_ERRORS: dict[int, tuple[str, str]] = {
    -199: ("_BAD_MSG", "Local: Bad message format"),
    -197: ("_DESTROY", "Local: Broker handle destroyed for termination"),
    -196: ("_FAIL", "Local: Communication failure with broker"),
    -195: ("_TRANSPORT", "Local: Broker transport failure"),
    -192: ("_MSG_TIMED_OUT", "Local: Message timed out"),
    -190: ("_UNKNOWN_PARTITION", "Local: Unknown partition"),
    -188: ("_UNKNOWN_TOPIC", "Local: Unknown topic"),
    -187: ("_ALL_BROKERS_DOWN", "Local: All broker connections are down"),
    -186: ("_INVALID_ARG", "Local: Invalid argument or configuration"),
    -185: ("_TIMED_OUT", "Local: Timed out"),
    -184: ("_QUEUE_FULL", "Local: Queue full"),
    -172: ("_STATE", "Local: Erroneous state"),
    -170: ("_NOT_IMPLEMENTED", "Local: Not implemented"),
    -152: ("_PURGE_QUEUE", "Local: Purged in queue"),
    -151: ("_PURGE_INFLIGHT", "Local: Purged in flight"),
    -150: ("_FATAL", "Local: Fatal error"),
    -149: ("_INCONSISTENT", "Local: Inconsistent state"),
    -148: ("_GAPLESS_GUARANTEE", "Local: Gap-less ordering would not be guaranteed if proceeding"),
    -144: ("_FENCED", "Local: This instance has been fenced by a newer instance"),
    -1: ("UNKNOWN", "Unknown broker error"),
    0: ("NO_ERROR", "Success"),
    3: ("UNKNOWN_TOPIC_OR_PART", "Broker: Unknown topic or partition"),
    7: ("REQUEST_TIMED_OUT", "Broker: Request timed out"),
    10: ("MSG_SIZE_TOO_LARGE", "Broker: Message size too large"),
    17: ("TOPIC_EXCEPTION", "Broker: Invalid topic"),
    19: ("NOT_ENOUGH_REPLICAS", "Broker: Not enough in-sync replicas"),
    40: ("INVALID_CONFIG", "Broker: Configuration is invalid"),
    45: ("OUT_OF_ORDER_SEQUENCE_NUMBER", "Broker: Broker received an out of order sequence number"),
    46: ("DUPLICATE_SEQUENCE_NUMBER", "Broker: Broker received a duplicate sequence number"),
    47: ("INVALID_PRODUCER_EPOCH", "Broker: Producer attempted an operation with an old epoch"),
    48: ("INVALID_TXN_STATE", "Broker: Producer attempted a transactional operation in an invalid state"),
    56: ("KAFKA_STORAGE_ERROR", "Broker: Disk error when trying to access log file on disk"),
    59: ("UNKNOWN_PRODUCER_ID", "Broker: Unknown Producer Id"),
    87: ("INVALID_RECORD", "Broker: Broker failed to validate record"),
    90: (
        "PRODUCER_FENCED",
        "Broker: There is a newer producer with the same transactionalId which fences the current one",
    ),
}


class KafkaError:
    """An error or event, as confluent-kafka's ``KafkaError``: ``code()``, ``name()``,
    ``str()``, ``fatal()``, ``retriable()``, ``txn_requires_abort()``; constants such as
    ``KafkaError._MSG_TIMED_OUT`` carry librdkafka's values.

    Extension: ``status()`` is the :class:`MessageStatus` of the message the error is about
    (None for errors that are not about one message), and ``cause`` the idempotent error.
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
        self._code = int(error)
        name, text = _ERRORS.get(self._code, (f"ERR_{self._code}?", f"Err-{self._code}?"))
        self._name = name
        self._str = reason if reason is not None else text
        self._fatal = fatal
        self._retriable = retriable
        self._txn_requires_abort = txn_requires_abort
        self._status = status
        self.cause = cause

    def code(self) -> int:
        """The error code (librdkafka's value)."""
        return self._code

    def name(self) -> str:
        """The code's name, e.g. ``_MSG_TIMED_OUT``."""
        return self._name

    def str(self) -> str:
        """A description of this error."""
        return self._str

    def fatal(self) -> bool:
        """True when the producer can no longer be used (create a new one)."""
        return self._fatal

    def retriable(self) -> bool:
        """True when the operation may be retried."""
        return self._retriable

    def txn_requires_abort(self) -> bool:
        """Always False: there are no transactions here."""
        return self._txn_requires_abort

    def status(self) -> MessageStatus | None:
        """Extension: the status of the message this error is about, if any."""
        return self._status

    def __str__(self) -> builtins.str:
        return self._str

    def __repr__(self) -> builtins.str:
        return f'KafkaError{{code={self._name},val={self._code},str="{self._str}"}}'

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)


class KafkaException(Exception):
    """Raised for errors outside delivery reports; ``args[0]`` is the :class:`KafkaError`."""

    def __init__(self, error: KafkaError | int, reason: str | None = None) -> None:
        if not isinstance(error, KafkaError):
            error = KafkaError(error, reason)
        super().__init__(error)

    def __str__(self) -> str:
        return str(self.args[0])


def _invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, message))


def _not_implemented(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._NOT_IMPLEMENTED, message))


class TopicPartition:
    """A topic, a partition and an offset (confluent-kafka's ``TopicPartition``)."""

    def __init__(self, topic: str, partition: int = -1, offset: int = OFFSET_INVALID) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error: KafkaError | None = None

    def __repr__(self) -> str:
        fields = f"topic={self.topic},partition={self.partition},offset={self.offset},error={self.error}"
        return f"TopicPartition{{{fields}}}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return (self.topic, self.partition) == (other.topic, other.partition)

    def __lt__(self, other: TopicPartition) -> bool:
        return (self.topic, self.partition) < (other.topic, other.partition)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))


class Message:
    """A delivered (or failed) message, as handed to a delivery callback.

    ``offset()`` is the record's offset in the partition: for a resend the broker recognised
    as a duplicate it is the original record's offset (None when that fell out of the
    checker's window). Extensions: ``status()``, ``sequence()``, ``duplicate()``.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        timestamp_ms: int,
        error: KafkaError | None = None,
        *,
        status: MessageStatus = MessageStatus.PERSISTED,
        sequence: int = -1,
        duplicate: bool = False,
        latency: float | None = None,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp_ms = timestamp_ms
        self._error = error
        self._status = status
        self._sequence = sequence
        self._duplicate = duplicate
        self._latency = latency

    def topic(self) -> str:
        """The topic."""
        return self._topic

    def partition(self) -> int:
        """The partition."""
        return self._partition

    def offset(self) -> int | None:
        """The offset of the stored record (see the class docstring for duplicates)."""
        return self._offset

    def key(self) -> bytes | None:
        """The key as produced."""
        return self._key

    def value(self) -> bytes | None:
        """The value as produced."""
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        """The headers as ``(name, value)`` pairs, or None."""
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        """``(TIMESTAMP_CREATE_TIME, milliseconds)``: the time ``produce`` was called."""
        return TIMESTAMP_CREATE_TIME, self._timestamp_ms

    def error(self) -> KafkaError | None:
        """The delivery error, or None when the message is stored."""
        return self._error

    def latency(self) -> float | None:
        """Seconds from ``produce`` to the delivery report."""
        return self._latency

    def status(self) -> MessageStatus:
        """Extension: persisted, not persisted or possibly persisted."""
        return self._status

    def sequence(self) -> int:
        """Extension: the record's sequence in its partition (-1 if it never got one)."""
        return self._sequence

    def duplicate(self) -> bool:
        """Extension: True when the broker recognised the record as already stored."""
        return self._duplicate

    def __len__(self) -> int:
        return len(self._value or b"")

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

# accepted and without effect: there is no Kafka client underneath to tune
_NO_EFFECT = {"bootstrap.servers", "client.id", "retry.backoff.ms", "retry.backoff.max.ms", "enable.gapless.guarantee"}

_LIBRDKAFKA_DEFAULTS: dict[str, Any] = {
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "message.timeout.ms": 300_000,
    "request.timeout.ms": 30_000,
    "max.in.flight": 5,
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 1_048_576,
}

_UNSUPPORTED_HINTS = {
    "transaction.timeout.ms": "transactions are not supported; transactional.id only names the producer",
    "partitioner_cb": "custom partitioners are not supported; pass partition= to produce()",
    "stats_cb": "statistics are not supported; use the broker's stats() or `idempotent stats`",
    "statistics.interval.ms": "statistics are not supported; use the broker's stats() or `idempotent stats`",
    "throttle_cb": "there is no broker throttling here",
    "oauth_cb": "authentication belongs to the backend (idempotent.broker.url options)",
    "security.protocol": "security settings belong to the backend (pass them to idempotent.connect)",
}


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


class _Config:
    """The producer configuration, validated; every key is either used, accepted without
    effect (listed in ``docs/migration.md``), or refused naming the key."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        if not isinstance(conf, Mapping):
            raise TypeError(f"expected configuration dict, got {type(conf).__name__}")
        values: dict[str, Any] = {}
        for raw_key, value in conf.items():
            if not isinstance(raw_key, str):
                raise TypeError(f"configuration keys must be str, got {raw_key!r}")
            key = _ALIASES.get(raw_key, raw_key)
            if key in values:
                raise _invalid(f"Configuration property {raw_key!r} given twice (also as an alias)")
            values[key] = value
        self.broker: BrokerAPI | None = None
        self.url = os.environ.get(ENV_BROKER_URL) or DEFAULT_BROKER_URL
        self.producer_name: str | None = None
        self.on_delivery: Callable[[KafkaError | None, Message], Any] | None = None
        self.error_cb: Callable[[KafkaError], Any] | None = None
        self.only_errors = False
        self.partitioner = "consistent_random"
        numbers = dict(_LIBRDKAFKA_DEFAULTS)
        for key, value in values.items():
            if key in _NO_EFFECT:
                continue
            if key in numbers:
                limit = 5 if key == "max.in.flight" else 2**31 - 1
                low = 0 if key in ("linger.ms", "message.timeout.ms") else 1
                numbers[key] = _as_int(key, value, low, limit)
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
                        "Configuration property 'enable.idempotence'=false is not supported: "
                        "every record goes through the broker's sequence checker"
                    )
            elif key == "acks":
                if str(value).strip().lower() not in ("all", "-1"):
                    raise _invalid(
                        f"Configuration property 'acks'={value!r} is not supported: a record is acknowledged "
                        "only once the backend has stored it durably (acks=all)"
                    )
            elif key == "retries":
                if _as_int(key, value, 0, 2**31 - 1) == 0:
                    raise _invalid(
                        "Configuration property 'retries'=0 is not supported: the producer always resends "
                        "until message.timeout.ms, which is safe because the broker deduplicates"
                    )
            elif key == "compression.type":
                if str(value).strip().lower() != "none":
                    raise _invalid(f"Configuration property 'compression.type'={value!r} is not supported (use none)")
            elif key == "partitioner":
                if value not in ("consistent_random", "consistent", "random"):
                    raise _invalid(
                        f"Configuration property 'partitioner'={value!r} is not supported: "
                        "use consistent_random, consistent or random"
                    )
                self.partitioner = value
            elif key == "on_delivery":
                if not callable(value):
                    raise _invalid("Configuration property 'on_delivery' must be callable")
                self.on_delivery = value
            elif key == "error_cb":
                if not callable(value):
                    raise _invalid("Configuration property 'error_cb' must be callable")
                self.error_cb = value
            elif key == "delivery.report.only.error":
                self.only_errors = _as_bool(key, value)
            elif key in _UNSUPPORTED_HINTS:
                raise _invalid(f"Configuration property {key!r} is not supported: {_UNSUPPORTED_HINTS[key]}")
            else:
                raise _invalid(
                    f"Configuration property {key!r} is not supported by idempotent.compat.confluent_kafka "
                    "(see docs/migration.md)"
                )
        self.linger_ms = float(numbers["linger.ms"])
        self.batch_size = int(numbers["batch.size"])
        self.max_batch_records = int(numbers["batch.num.messages"])
        timeout = int(numbers["message.timeout.ms"])
        self.delivery_timeout_ms = float(timeout) if timeout > 0 else float(2**31 - 1)  # 0 = infinite
        self.request_timeout_ms = float(numbers["request.timeout.ms"])
        self.max_in_flight = int(numbers["max.in.flight"])
        self.max_messages = int(numbers["queue.buffering.max.messages"])
        self.max_bytes = int(numbers["queue.buffering.max.kbytes"]) * 1024


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
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, data in items:
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


class Producer:
    """confluent-kafka's ``Producer``, exactly-once through this project's broker.

    Args:
        conf: the configuration dict (see the module docstring and ``docs/migration.md``).
        **kwargs: configuration given as keyword arguments, as confluent-kafka allows
            (``logger`` is refused).

    Raises:
        KafkaException: ``_INVALID_ARG`` for an unknown or unsupported configuration key or
            value (named in the message), or the broker could not be opened.
    """

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        merged = dict(conf or {})
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
        self._closed = False
        self._finalizer = weakref.finalize(self, _close, self._producer, self._url, 0.0)

    # -- identity (extensions) ---------------------------------------------------------------

    @property
    def producer(self) -> _Producer:
        """Extension: the underlying :class:`idempotent.Producer`."""
        return self._producer

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

        Raises:
            BufferError: ``queue.buffering.max.messages`` or ``.kbytes`` reached; call
                ``poll()`` and produce again.
            KafkaException: ``_UNKNOWN_PARTITION`` (no such partition), ``TOPIC_EXCEPTION``
                (bad topic name), ``_NOT_IMPLEMENTED`` (``timestamp`` given), ``_FATAL`` (the
                producer failed earlier: fenced, timed out, ...), ``_DESTROY`` (closed).
            TypeError: a value, key or header of an unsupported type.
        """
        if self._closed:
            raise KafkaException(KafkaError(KafkaError._DESTROY, "Producer has been closed"))
        if timestamp:
            raise _not_implemented(
                "produce(timestamp=...) is not supported: records carry the time the backend stored them"
            )
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if on_delivery is not None and callback is not None and on_delivery is not callback:
            raise TypeError("give on_delivery or callback, not both")
        report = on_delivery or callback or self._config.on_delivery
        if report is not None and not callable(report):
            raise TypeError("on_delivery must be callable")
        value_bytes = _payload("value", value)
        key_bytes = _payload("key", key)
        header_list = _header_list(headers)
        size = len(value_bytes or b"") + len(key_bytes or b"")
        reports = self._reports
        target = self._partition(topic, partition, key_bytes)
        with reports.cond:  # check and reserve in one step, so concurrent produce() calls cannot overfill
            if reports.fatal is not None:
                raise KafkaException(self._fatal_error())
            if reports.outstanding >= self._config.max_messages or (
                reports.outstanding and reports.outstanding_bytes + size > self._config.max_bytes
            ):
                raise BufferError(KafkaError(KafkaError._QUEUE_FULL).str())
            reports.outstanding += 1
            reports.outstanding_bytes += size
        created = time.time()
        started = time.monotonic()
        try:
            future = self._producer.send(topic, value_bytes, key_bytes, target, header_list)
        except BaseException as exc:
            with reports.cond:
                reports.outstanding -= 1
                reports.outstanding_bytes -= size
            if isinstance(exc, QueueFullError):
                raise BufferError(KafkaError(KafkaError._QUEUE_FULL).str()) from None
            if isinstance(exc, ProducerClosedError):
                raise KafkaException(KafkaError(KafkaError._DESTROY, str(exc))) from exc
            if isinstance(exc, UsageError):
                raise KafkaException(kafka_error_for(exc)) from exc
            if isinstance(exc, ProducerError):
                raise KafkaException(
                    KafkaError(KafkaError._FATAL, f"producer failed: {exc}", fatal=True, cause=exc)
                ) from exc
            raise
        only_errors = self._config.only_errors
        inner = self._producer

        def done(f: Future[RecordMetadata]) -> None:
            exc = f.exception()
            latency = time.monotonic() - started
            if exc is None:
                meta = f.result()
                err = None
                msg = Message(
                    topic,
                    meta.partition,
                    meta.offset,
                    key_bytes,
                    value_bytes,
                    header_list,
                    int(created * 1000),
                    sequence=meta.sequence,
                    duplicate=meta.duplicate,
                    latency=latency,
                )
            else:
                failure = inner.failure
                stopped = failure is not None and (exc is failure or exc.__cause__ is failure)
                err = kafka_error_for(exc, stopped)
                sequence = exc.sequence if isinstance(exc, DeliveryFailed) else -1
                msg = Message(
                    topic,
                    target,
                    None,
                    key_bytes,
                    value_bytes,
                    header_list,
                    int(created * 1000),
                    err,
                    status=err.status() or MessageStatus.NOT_PERSISTED,
                    sequence=sequence,
                    latency=latency,
                )
            with reports.cond:
                if err is not None and err.fatal() and reports.fatal is None:
                    reports.fatal = err
                    reports.errors.append(err)
                cb = report if report is not None and (err is not None or not only_errors) else None
                reports.ready.append((cb, err, msg))
                reports.outstanding_bytes -= size
                reports.cond.notify_all()

        future.add_done_callback(done)

    def _partition(self, topic: str, partition: int, key: bytes | None) -> int:
        try:
            count = self._producer.partitions_for(topic)
        except InvalidTopicError as exc:
            raise KafkaException(KafkaError(KafkaError.TOPIC_EXCEPTION, str(exc), cause=exc)) from exc
        except ProducerError as exc:
            raise KafkaException(kafka_error_for(exc)) from exc
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise TypeError(f"partition must be int, not {type(partition).__name__}")
        if partition == -1:
            if self._config.partitioner == "random" or (key is None and self._config.partitioner != "consistent"):
                return self._random.randrange(count)
            return zlib.crc32(key or b"") % count
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
        """Serve delivery reports (and ``error_cb`` events), waiting up to ``timeout`` seconds
        for the first one (None or negative: wait indefinitely).

        Returns:
            How many events were served.

        Raises:
            Whatever a callback raises (the remaining reports stay queued).
        """
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        reports = self._reports
        with reports.cond:
            while not reports.ready and not reports.errors:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return 0
                reports.cond.wait(remaining)
        return self._serve()

    def _serve(self) -> int:
        reports = self._reports
        served = 0
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
            Whatever a callback raises.
        """
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
        """Messages produced whose delivery report has not been served yet."""
        with self._reports.cond:
            return self._reports.outstanding

    def close(self, timeout: float | None = -1) -> bool:
        """Flush (up to ``timeout``), then release the producer and, when the last user of
        it, the broker. Reports not served by then are dropped; messages not yet delivered
        fail as purged.

        Returns:
            True.
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

    # -- refused -----------------------------------------------------------------------------

    def _transactions(self, name: str) -> KafkaException:
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
        raise _not_implemented("purge() is not supported: use flush(), or close() to drop what is left")

    def produce_batch(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise _not_implemented("produce_batch() is not supported: call produce() per message")

    def list_topics(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise _not_implemented("list_topics() is not supported: use the broker's topics()")

    def set_sasl_credentials(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises KafkaException ``_NOT_IMPLEMENTED``."""
        raise _not_implemented("set_sasl_credentials() is not supported: credentials belong to the backend")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"confluent_kafka.{name} is not provided by idempotent.compat.confluent_kafka, which covers the "
        "Producer only (see docs/migration.md)"
    )
