"""The errors of the confluent-kafka drop-in: ``KafkaError`` values with librdkafka's codes,
``KafkaException`` (confluent-kafka's own class when it is installed), each message's
:class:`MessageStatus`, and the one mapping from this project's errors to them
(:func:`kafka_error_for`).
"""

from __future__ import annotations

import builtins
import enum
from typing import TYPE_CHECKING, Any, ClassVar

from idempotent.core.outcomes import DeliveryStatus

from ..errors import (
    DeliveryTimeoutError,
    EntryTooLargeError,
    InvalidBatchError,
    InvalidTopicError,
    PartitionRecoveringError,
    ProducerClosedError,
    ProducerFencedError,
    ProducerStateLostError,
    QueueFullError,
    RequestTimeoutError,
    SequenceDesyncError,
    TransportError,
    UnknownProducerError,
    UsageError,
)
from . import _shared
from ._causes import unwrap
from ._rdkafka import ERRORS

_NATIVE = "confluent_kafka"


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


def kafka_error_for(error: BaseException, stopped: bool | None = None) -> KafkaError:
    """The :class:`KafkaError` a confluent-kafka application sees for an idempotent error.

    A :class:`~idempotent.errors.DeliveryFailed` is mapped through its cause and carries the
    message's status. ``fatal()`` is ``stopped`` when given (whether the error stopped the
    producer), else true for the errors that stop a producer when they end a sent batch (a
    message past ``message.timeout.ms`` is not one: it fails alone and the producer goes on).
    """
    cause, status = unwrap(error)
    return _kafka_error(cause, None if status is None else _STATUS[status], stopped, error)


def kafka_error_of(cause: BaseException, status: DeliveryStatus | None, stopped: bool | None) -> KafkaError:
    """The :class:`KafkaError` of records that ended with ``cause`` (their ``status``, None
    for an error that is not about records); see :func:`kafka_error_for`."""
    return _kafka_error(cause, None if status is None else _STATUS[status], stopped, cause)


def _kafka_error(
    cause: BaseException, status: MessageStatus | None, stopped: bool | None, error: BaseException
) -> KafkaError:
    """The :class:`KafkaError` whose code, retriability and fatality ``cause`` decides (see
    :func:`kafka_error_for`), with ``error``'s text and ``error`` as its cause."""
    code, retriable = _code_for(cause, status)
    if isinstance(cause, ProducerClosedError | UsageError):
        fatal = False
    elif stopped is not None:
        fatal = stopped
    else:
        fatal = isinstance(
            cause, ProducerFencedError | UnknownProducerError | SequenceDesyncError | ProducerStateLostError
        )
    return KafkaError(code, str(error), fatal=fatal, retriable=retriable and not fatal, status=status, cause=error)


#: ``(error class, code, retriable)`` of the errors whose code does not depend on the
#: message's status, in the order they are tried (a subclass before its base)
_CODES: tuple[tuple[type[BaseException], int, bool], ...] = (
    (ProducerFencedError, KafkaError._FENCED, False),
    (ProducerStateLostError, KafkaError._STATE, False),  # the restart was refused: the operator acts
    (UnknownProducerError, KafkaError.UNKNOWN_PRODUCER_ID, False),
    (DeliveryTimeoutError, KafkaError._MSG_TIMED_OUT, False),
    (EntryTooLargeError, KafkaError.MSG_SIZE_TOO_LARGE, False),
    (RequestTimeoutError, KafkaError._TIMED_OUT, True),
    (PartitionRecoveringError, KafkaError.NOT_ENOUGH_REPLICAS, True),
    (TransportError, KafkaError._TRANSPORT, True),
    (InvalidTopicError, KafkaError.TOPIC_EXCEPTION, False),
    (InvalidBatchError, KafkaError.INVALID_RECORD, False),
    (QueueFullError, KafkaError._QUEUE_FULL, True),
    (UsageError, KafkaError._INVALID_ARG, False),
)


def _code_for(cause: BaseException, status: MessageStatus | None) -> tuple[int, bool]:
    """``(code, retriable)`` for an idempotent error."""
    if isinstance(cause, SequenceDesyncError):
        # retriable when the records are certainly not stored and the producer goes on (a
        # batch refused behind expired ones: send them again with their sequences); a desync
        # that stopped the producer is fatal, which clears retriable
        return KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, status is MessageStatus.NOT_PERSISTED
    if isinstance(cause, ProducerClosedError):
        inflight = status is MessageStatus.POSSIBLY_PERSISTED
        return (KafkaError._PURGE_INFLIGHT if inflight else KafkaError._PURGE_QUEUE), False
    for kind, code, retriable in _CODES:
        if isinstance(cause, kind):
            return code, retriable
    return KafkaError._FAIL, False


__all__ = ["KafkaError", "KafkaException", "MessageStatus", "kafka_error_for", "kafka_error_of"]
