"""pulsar-client's ``Result`` and exception classes, and how the project's errors map onto them."""

from __future__ import annotations

import enum
from typing import Any

from idempotent.core.outcomes import DeliveryStatus

from ... import errors
from ...errors import (
    BackendUnavailableError,
    ConfigError,
    DeliveryTimeoutError,
    EntryTooLargeError,
    InvalidBatchError,
    InvalidTopicError,
    PartitionRecoveringError,
    ProducerClosedError,
    ProducerFencedError,
    QueueFullError,
    RequestTimeoutError,
    TransportError,
    UnknownProducerError,
    UsageError,
)
from .._causes import unwrap


class _Absent:
    """Stands for a class of pulsar-client's when pulsar-client is not installed: adds nothing,
    so the drop-in's exceptions keep their own bases (``ValueError`` among them) in order."""


def _native(name: str) -> Any:
    """pulsar-client's exception class ``name``: the drop-in's exceptions subclass
    pulsar-client's, so that an ``except`` of either catches them, and the module exports
    pulsar-client's own classes (which then catch what pulsar-client's consumers and readers
    raise too). Without pulsar-client: ``Exception`` for the root, :class:`_Absent` for the
    others (an ``Exception`` base before ``ValueError`` would have no consistent order)."""
    try:
        from pulsar import exceptions
    except ImportError:  # without the extra (tests/compat/test_compat_no_native.py)
        return Exception if name == "PulsarException" else _Absent
    return getattr(exceptions, name, Exception if name == "PulsarException" else _Absent)


class Result(enum.IntEnum):
    """pulsar-client's ``Result`` values (same names and numbers)."""

    Ok = 0
    UnknownError = 1
    InvalidConfiguration = 2
    Timeout = 3
    LookupError = 4
    ConnectError = 5
    ReadError = 6
    AuthenticationError = 7
    AuthorizationError = 8
    ErrorGettingAuthenticationData = 9
    BrokerMetadataError = 10
    BrokerPersistenceError = 11
    ChecksumError = 12
    ConsumerBusy = 13
    NotConnected = 14
    AlreadyClosed = 15
    InvalidMessage = 16
    ConsumerNotInitialized = 17
    ProducerNotInitialized = 18
    ProducerBusy = 19
    TooManyLookupRequestException = 20
    InvalidTopicName = 21
    InvalidUrl = 22
    ServiceUnitNotReady = 23
    OperationNotSupported = 24
    ProducerBlockedQuotaExceededError = 25
    ProducerBlockedQuotaExceededException = 26
    ProducerQueueIsFull = 27
    MessageTooBig = 28
    TopicNotFound = 29
    SubscriptionNotFound = 30
    ConsumerNotFound = 31
    UnsupportedVersionError = 32
    TopicTerminated = 33
    CryptoError = 34
    IncompatibleSchema = 35
    ConsumerAssignError = 36
    CumulativeAcknowledgementNotAllowedError = 37
    TransactionCoordinatorNotFoundError = 38
    InvalidTxnStatusError = 39
    NotAllowedError = 40
    TransactionConflict = 41
    TransactionNotFound = 42
    ProducerFenced = 43
    MemoryBufferIsFull = 44
    Interrupted = 45


class PulsarException(_native("PulsarException")):  # type: ignore[misc]
    """Root of the exceptions, as in pulsar-client. ``result()`` is the :class:`Result`.

    Extensions: ``status`` is the message's :class:`~idempotent.DeliveryStatus` when the
    exception is about one message (else None); ``__cause__`` is the idempotent error.
    """

    result_value: Result = Result.UnknownError

    def __init__(self, message: str = "", status: DeliveryStatus | None = None) -> None:
        super().__init__(message)
        self.status = status

    def result(self) -> Result:
        """The :class:`Result` this exception stands for."""
        return self.result_value


class UnknownError(PulsarException, _native("UnknownError")):  # type: ignore[misc]
    result_value = Result.UnknownError


class InvalidConfiguration(PulsarException, _native("InvalidConfiguration"), ValueError):  # type: ignore[misc]
    result_value = Result.InvalidConfiguration


class Timeout(PulsarException, _native("Timeout")):  # type: ignore[misc]
    result_value = Result.Timeout


class LookupError(PulsarException, _native("LookupError")):  # type: ignore[misc]
    result_value = Result.LookupError


class ConnectError(PulsarException, _native("ConnectError")):  # type: ignore[misc]
    result_value = Result.ConnectError


class ReadError(PulsarException, _native("ReadError")):  # type: ignore[misc]
    result_value = Result.ReadError


class AuthenticationError(PulsarException, _native("AuthenticationError")):  # type: ignore[misc]
    result_value = Result.AuthenticationError


class AuthorizationError(PulsarException, _native("AuthorizationError")):  # type: ignore[misc]
    result_value = Result.AuthorizationError


class BrokerMetadataError(PulsarException, _native("BrokerMetadataError")):  # type: ignore[misc]
    result_value = Result.BrokerMetadataError


class BrokerPersistenceError(PulsarException, _native("BrokerPersistenceError")):  # type: ignore[misc]
    result_value = Result.BrokerPersistenceError


class NotConnected(PulsarException, _native("NotConnected")):  # type: ignore[misc]
    result_value = Result.NotConnected


class AlreadyClosed(PulsarException, _native("AlreadyClosed")):  # type: ignore[misc]
    result_value = Result.AlreadyClosed


class InvalidMessage(PulsarException, _native("InvalidMessage")):  # type: ignore[misc]
    result_value = Result.InvalidMessage


class ProducerNotInitialized(PulsarException, _native("ProducerNotInitialized")):  # type: ignore[misc]
    result_value = Result.ProducerNotInitialized


class ProducerBusy(PulsarException, _native("ProducerBusy")):  # type: ignore[misc]
    result_value = Result.ProducerBusy


class InvalidTopicName(PulsarException, _native("InvalidTopicName"), ValueError):  # type: ignore[misc]
    result_value = Result.InvalidTopicName


class InvalidUrl(PulsarException, _native("InvalidUrl"), ValueError):  # type: ignore[misc]
    result_value = Result.InvalidUrl


class ServiceUnitNotReady(PulsarException, _native("ServiceUnitNotReady")):  # type: ignore[misc]
    result_value = Result.ServiceUnitNotReady


class OperationNotSupported(PulsarException, _native("OperationNotSupported")):  # type: ignore[misc]
    result_value = Result.OperationNotSupported


class ProducerQueueIsFull(PulsarException, _native("ProducerQueueIsFull")):  # type: ignore[misc]
    result_value = Result.ProducerQueueIsFull


class MessageTooBig(PulsarException, _native("MessageTooBig")):  # type: ignore[misc]
    result_value = Result.MessageTooBig


class TopicNotFound(PulsarException, _native("TopicNotFound")):  # type: ignore[misc]
    result_value = Result.TopicNotFound


class TopicTerminated(PulsarException, _native("TopicTerminated")):  # type: ignore[misc]
    result_value = Result.TopicTerminated


class NotAllowedError(PulsarException, _native("NotAllowedError")):  # type: ignore[misc]
    result_value = Result.NotAllowedError


class ProducerFenced(PulsarException, _native("ProducerFenced")):  # type: ignore[misc]
    result_value = Result.ProducerFenced


class Interrupted(PulsarException, _native("Interrupted")):  # type: ignore[misc]
    result_value = Result.Interrupted


#: the words of idempotent.adapters.reach's error when nothing answers at an address in time
_UNREACHABLE = "cannot connect to"


#: the pulsar-style exception of each idempotent error but BackendUnavailableError (whose
#: text decides), in the order they are tried (a subclass before its base)
_EXCEPTIONS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], type[PulsarException]], ...] = (
    (errors.AuthenticationError, AuthenticationError),
    (errors.AuthorizationError, AuthorizationError),
    (ProducerFencedError, ProducerFenced),
    (UnknownProducerError, ProducerNotInitialized),
    ((DeliveryTimeoutError, RequestTimeoutError), Timeout),
    (PartitionRecoveringError, ServiceUnitNotReady),
    (EntryTooLargeError, MessageTooBig),
    (TransportError, ConnectError),
    (QueueFullError, ProducerQueueIsFull),
    (ProducerClosedError, AlreadyClosed),
    (InvalidTopicError, InvalidTopicName),
    (InvalidBatchError, InvalidMessage),
    ((ConfigError, UsageError), InvalidConfiguration),
)


def _exception_for(error: BaseException) -> PulsarException:
    """The pulsar-style exception for an idempotent error (a DeliveryFailed through its cause)."""
    cause, status = unwrap(error)
    kind: type[PulsarException]
    if isinstance(cause, BackendUnavailableError):
        # nothing answered at the service's address within the connect timeout
        # (idempotent.adapters.reach): pulsar-client's ConnectError; other outages are the broker's
        kind = ConnectError if _UNREACHABLE in str(cause) else BrokerPersistenceError
    else:
        # SequenceDesyncError and anything else: UnknownError, the message says what
        kind = next((exception for base, exception in _EXCEPTIONS if isinstance(cause, base)), UnknownError)
    out = kind(str(error), status)
    out.__cause__ = error
    return out
