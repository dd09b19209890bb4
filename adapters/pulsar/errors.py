"""Pulsar's errors in the project's tree: the one translation of pulsar-client's exceptions,
a failed send's ``pulsar.Result`` and the admin REST API's failures, at the adapter edge
(every ``adapters/_pulsar_*`` module and :mod:`idempotent.adapters.pulsar.backend` use it)."""

from __future__ import annotations

import contextlib
import logging
import urllib.error
from collections.abc import Iterator
from typing import Any

from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    EntryTooLargeError,
    InvalidTopicError,
    OwnershipLostError,
    ProducerError,
    internal_error,
)

try:
    import pulsar
    from pulsar import exceptions as pulsar_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")


class _HttpError(Exception):
    def __init__(self, status: int, reason: str, url: str) -> None:
        super().__init__(f"HTTP {status} from {url}: {reason}")
        self.status = status
        self.reason = reason


@contextlib.contextmanager
def map_errors(what: str) -> Iterator[None]:
    """Translate pulsar-client and admin REST errors into the project's tree, once, here."""
    try:
        yield
    except ProducerError:
        raise
    except Exception as exc:
        raise translate(exc, what) from exc


#: pulsar-client exceptions that are transient: the connection, a lookup, the broker's
#: metadata store or BookKeeper failed or timed out, the topic is moving between brokers
#: (ServiceUnitNotReady), the client's queue or memory is full, a backlog quota holds the
#: producer, another producer still holds the exclusive partition (during a takeover), or
#: the client is closing. Retrying later may succeed.
_TRANSIENT = (
    pulsar_errors.Timeout,
    pulsar_errors.ConnectError,
    pulsar_errors.NotConnected,
    pulsar_errors.ReadError,
    pulsar_errors.LookupError,
    pulsar_errors.TooManyLookupRequestException,
    pulsar_errors.ServiceUnitNotReady,
    pulsar_errors.BrokerMetadataError,
    pulsar_errors.BrokerPersistenceError,
    pulsar_errors.ProducerQueueIsFull,
    pulsar_errors.MemoryBufferIsFull,
    pulsar_errors.ProducerBlockedQuotaExceededError,
    pulsar_errors.ProducerBlockedQuotaExceededException,
    pulsar_errors.AlreadyClosed,
)
#: The broker's credentials, the client's settings or the cluster refuse the request for good.
_CONFIG = (
    pulsar_errors.AuthenticationError,
    pulsar_errors.AuthorizationError,
    pulsar_errors.ErrorGettingAuthenticationData,
    pulsar_errors.InvalidConfiguration,
    pulsar_errors.InvalidUrl,
    pulsar_errors.OperationNotSupported,
    pulsar_errors.NotAllowedError,
    pulsar_errors.UnsupportedVersionError,
    pulsar_errors.IncompatibleSchema,
    pulsar_errors.CryptoError,
)


def translate(exc: BaseException | Any, what: str) -> ProducerError:
    """The project error for a pulsar-client exception, a failed send's ``pulsar.Result``, an
    admin REST failure, or anything else.

    Fenced -> :class:`OwnershipLostError`; MessageTooBig -> :class:`EntryTooLargeError`; a
    missing, invalid or terminated topic -> :class:`InvalidTopicError`; credentials, settings
    or a refused operation -> :class:`ConfigError`; the transient failures of
    :data:`_TRANSIENT`, ProducerBusy and ConsumerBusy, admin HTTP 408/429/5xx and network errors ->
    :class:`BackendUnavailableError` (RETRY). Anything else (``UnknownError``, another HTTP
    status, an exception Pulsar does not document) is a logged FATAL :class:`InternalError`.
    """
    if isinstance(exc, pulsar.Result):  # a send callback's result: raise what send() would
        error_class = getattr(pulsar_errors, exc.name, None)
        if isinstance(error_class, type) and issubclass(error_class, pulsar_errors.PulsarException):
            return translate(error_class(f"Pulsar error: {exc.name}"), what)
        return internal_error(f"pulsar: {what}", pulsar_errors.PulsarException(f"unknown result {exc.name}"), _LOG)
    if isinstance(exc, pulsar_errors.ProducerFenced):
        return OwnershipLostError(f"pulsar: {what}: fenced by a newer owner ({exc})")
    if isinstance(exc, pulsar_errors.MessageTooBig):
        return EntryTooLargeError(f"pulsar: {what}: the batch is larger than the broker's maxMessageSize ({exc})")
    if isinstance(exc, pulsar_errors.InvalidTopicName | pulsar_errors.TopicNotFound | pulsar_errors.TopicTerminated):
        return InvalidTopicError(f"pulsar: {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, _CONFIG):
        return ConfigError(f"pulsar: {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, pulsar_errors.ProducerBusy):
        return BackendUnavailableError(f"pulsar: {what}: the partition is still owned by another producer ({exc})")
    if isinstance(exc, pulsar_errors.ConsumerBusy):
        return BackendUnavailableError(
            f"pulsar: {what}: the subscription still has a consumer ({exc}); for a reader of this "
            "project, its own earlier attempt, which the broker has not let go of yet"
        )
    if isinstance(exc, _TRANSIENT):
        return BackendUnavailableError(f"pulsar: {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, _HttpError):
        if exc.status in (401, 403):
            return ConfigError(f"pulsar admin: {what}: not authorized ({exc}); check admin_headers")
        if exc.status in (400, 404, 412):
            return InvalidTopicError(f"pulsar admin: {what}: {exc.reason}")
        if exc.status in (408, 429) or exc.status >= 500:
            return BackendUnavailableError(f"pulsar admin: {what}: {exc}")
    if isinstance(exc, urllib.error.URLError | OSError) and not isinstance(exc, urllib.error.HTTPError):
        return BackendUnavailableError(f"pulsar admin: {what}: {exc}")
    return internal_error(f"pulsar: {what}", exc, _LOG)  # nothing Pulsar documents as transient
