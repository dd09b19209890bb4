"""A drop-in for pulsar-client's ``Client`` and ``Producer``: exactly-once publishing by
changing one import.

::

    from idempotent.compat import pulsar   # instead of: import pulsar

    client = pulsar.Client("pulsar://localhost:6650")
    producer = client.create_producer("orders", producer_name="orders-feed")
    msg_id = producer.send(b"...", sequence_id=42)

The service URL is any broker URL of this project: pulsar-client's own (``pulsar://host:port``,
``pulsar+ssl://host:port`` over TLS, ``http(s)://host:port`` for lookups over the web
service) store into that Pulsar cluster (through this project's broker and checker; give the
admin REST URL as ``?admin_url=...`` when it is not the default of
:mod:`adapters._pulsar_url`; the client's TLS arguments and ``authentication`` apply),
``sqlite:///file.db`` the embedded log, ``memory://`` an in-process one, ``kafka://`` Kafka.
An open broker handle (:class:`idempotent.BrokerAPI`) is accepted as well.

Topics follow Pulsar's naming, which is the project's (:mod:`idempotent._topics`): ``orders``
and ``persistent://public/default/orders`` are the same topic, stored as ``orders``; Pulsar's
default namespace ``public/default`` is the project's root namespace. So
``idempotent.Reader(url, "persistent://public/default/orders")`` reads what was sent here.

Application-chosen sequence ids (``send(..., sequence_id=n)``, PIP-6) are the records'
sequences in the broker. A topic this module is the first to use gets Pulsar's rule (the
``monotonic`` policy: any increase, holes allowed), so ``initial_sequence_id`` and gapped
sequence ids work on a broker with default settings. A topic that already existed keeps the
policy in force on it (the broker's default is ``strict``: consecutive sequence ids, starting
after the producer's last stored one, at 0 for a new producer). A sequence id at or below the
last stored one is a duplicate: it is not stored again and ``send`` returns the original
message id (or ``-1:-1`` when it is out of the checker's window, as Pulsar does).

Every argument of pulsar-client's Client, ``create_producer`` and ``send`` is accepted and
type-checked as upstream (a wrong type raises a ValueError); connection tuning has no effect
(logged once at DEBUG); what cannot work here (encryption, custom routers, delayed delivery)
raises :class:`OperationNotSupported` saying so. ``create_reader`` works on every URL through
:class:`idempotent.Reader`; ``subscribe`` and ``create_table_view`` go to a real
``pulsar.Client`` on a Pulsar service URL. Every other name of pulsar-client (schemas,
``ConsumerType``, authentication classes, ...) is passed through from the installed module.
See ``docs/migration.md``.
"""

from __future__ import annotations

import enum
import logging
import struct
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, ClassVar

from .. import errors
from .. import reader as _reader
from .._outcomes import DeliveryStatus, RecordMetadata
from .._topics import canonical_topic
from ..api import BrokerAPI
from ..clientlogs import open_pulsar_client, route_pulsar_attribute
from ..errors import (
    BackendUnavailableError,
    ConfigError,
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
    TransportError,
    UnknownProducerError,
    UsageError,
)
from ..producer import Producer as _Producer
from . import _shared
from ._partitioners import pulsar_partition

_LOG = logging.getLogger("idempotent.compat.pulsar")

_NATIVE = "pulsar"
#: sequence ids are 0 .. 2**63-1, as pulsar-client's (compared without wrap-around by the
#: monotonic policy; the strict policy refuses any jump)
_MAX_SEQUENCE_ID = 2**63 - 1

# ``import idempotent.compat.pulsar.schema`` (and every other submodule) is the native one
__path__: list[str] = []
_shared.pass_through_submodules(__name__, _NATIVE, route_pulsar_attribute)

_NO_TIMEOUT_MS = float(2**31 - 1)


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


class PulsarException(Exception):
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


class UnknownError(PulsarException):
    result_value = Result.UnknownError


class InvalidConfiguration(PulsarException, ValueError):  # a ValueError, as upstream's argument checks
    result_value = Result.InvalidConfiguration


class Timeout(PulsarException):
    result_value = Result.Timeout


class LookupError(PulsarException):  # pulsar-client's name (shadows the builtin here only)
    result_value = Result.LookupError


class ConnectError(PulsarException):
    result_value = Result.ConnectError


class ReadError(PulsarException):
    result_value = Result.ReadError


class AuthenticationError(PulsarException):
    result_value = Result.AuthenticationError


class AuthorizationError(PulsarException):
    result_value = Result.AuthorizationError


class BrokerMetadataError(PulsarException):
    result_value = Result.BrokerMetadataError


class BrokerPersistenceError(PulsarException):
    result_value = Result.BrokerPersistenceError


class NotConnected(PulsarException):
    result_value = Result.NotConnected


class AlreadyClosed(PulsarException):
    result_value = Result.AlreadyClosed


class InvalidMessage(PulsarException):
    result_value = Result.InvalidMessage


class ProducerNotInitialized(PulsarException):
    result_value = Result.ProducerNotInitialized


class ProducerBusy(PulsarException):
    result_value = Result.ProducerBusy


class InvalidTopicName(PulsarException, ValueError):  # a ValueError, as upstream's argument checks
    result_value = Result.InvalidTopicName


class InvalidUrl(PulsarException, ValueError):  # a ValueError, as upstream's argument checks
    result_value = Result.InvalidUrl


class ServiceUnitNotReady(PulsarException):
    result_value = Result.ServiceUnitNotReady


class OperationNotSupported(PulsarException):
    result_value = Result.OperationNotSupported


class ProducerQueueIsFull(PulsarException):
    result_value = Result.ProducerQueueIsFull


class MessageTooBig(PulsarException):
    result_value = Result.MessageTooBig


class TopicNotFound(PulsarException):
    result_value = Result.TopicNotFound


class TopicTerminated(PulsarException):
    result_value = Result.TopicTerminated


class NotAllowedError(PulsarException):
    result_value = Result.NotAllowedError


class ProducerFenced(PulsarException):
    result_value = Result.ProducerFenced


class Interrupted(PulsarException):
    result_value = Result.Interrupted


def _exception_for(error: BaseException) -> PulsarException:
    """The pulsar-style exception for an idempotent error (a DeliveryFailed through its cause)."""
    status = None
    cause: BaseException = error
    if isinstance(error, DeliveryFailed):
        status = error.status
        if error.__cause__ is not None:
            cause = error.__cause__
    kind: type[PulsarException]
    if isinstance(cause, errors.AuthenticationError):
        kind = AuthenticationError
    elif isinstance(cause, errors.AuthorizationError):
        kind = AuthorizationError
    elif isinstance(cause, ProducerFencedError):
        kind = ProducerFenced
    elif isinstance(cause, UnknownProducerError):
        kind = ProducerNotInitialized
    elif isinstance(cause, DeliveryTimeoutError | RequestTimeoutError):
        kind = Timeout
    elif isinstance(cause, PartitionRecoveringError):
        kind = ServiceUnitNotReady
    elif isinstance(cause, EntryTooLargeError):
        kind = MessageTooBig
    elif isinstance(cause, BackendUnavailableError):
        kind = BrokerPersistenceError
    elif isinstance(cause, TransportError):
        kind = ConnectError
    elif isinstance(cause, QueueFullError):
        kind = ProducerQueueIsFull
    elif isinstance(cause, ProducerClosedError):
        kind = AlreadyClosed
    elif isinstance(cause, InvalidTopicError):
        kind = InvalidTopicName
    elif isinstance(cause, InvalidBatchError):
        kind = InvalidMessage
    elif isinstance(cause, ConfigError | UsageError):
        kind = InvalidConfiguration
    else:
        kind = UnknownError  # SequenceDesyncError and anything else: the message says what
    out = kind(str(error), status)
    out.__cause__ = error
    return out


class MessageId:
    """Where a message is stored: its partition and offset.

    Pulsar's accessors are kept: ``ledger_id()`` is 0, ``entry_id()`` the offset,
    ``batch_index()`` -1; a duplicate whose original offset is no longer known is
    ``(-1,-1,-1,-1)`` as in Pulsar. Ids order by partition, then offset, and
    ``serialize()`` / ``MessageId.deserialize()`` round-trip. Extension: ``offset()``.
    """

    _FORMAT = ">qq"
    _KINDS: ClassVar[dict[int, str]] = {-2: "earliest", -3: "latest"}

    #: the first message of a topic, as a reader's start (pulsar-client's ``MessageId.earliest``)
    earliest: ClassVar[MessageId]
    #: the next message stored after the reader opened (``MessageId.latest``)
    latest: ClassVar[MessageId]

    def __init__(self, partition: int = -1, offset: int = -1) -> None:
        self._partition = partition
        self._offset = offset
        self._kind: str | None = None

    @staticmethod
    def wrap(message_id: Any) -> MessageId:
        """The drop-in id for ``message_id``: an id of this module (returned as is) or an
        :class:`idempotent.MessageId` (from :class:`idempotent.Reader`).

        Raises:
            TypeError: another kind of id (pulsar-client's own ids name ledgers, not offsets).
        """
        if isinstance(message_id, MessageId):
            return message_id
        if isinstance(message_id, _reader.MessageId):
            return MessageId(message_id.partition, message_id.offset)
        raise TypeError(f"MessageId.wrap: expected a MessageId, not {type(message_id).__name__}")

    def ledger_id(self) -> int:
        """0, or -1 for an unknown position."""
        return -1 if self._offset < 0 else 0

    def entry_id(self) -> int:
        """The offset in the partition (-1 when unknown)."""
        return self._offset

    def batch_index(self) -> int:
        """Always -1."""
        return -1

    def partition(self) -> int:
        """The partition (-1 when unknown)."""
        return self._partition

    def offset(self) -> int:
        """Extension: the offset in the partition (-1 when unknown)."""
        return self._offset

    def serialize(self) -> bytes:
        """Sixteen bytes: partition and offset, big-endian (earliest and latest have their own)."""
        if self._kind is not None:
            partition = next(code for code, kind in self._KINDS.items() if kind == self._kind)
            return struct.pack(self._FORMAT, partition, -1)
        return struct.pack(self._FORMAT, self._partition, self._offset)

    @staticmethod
    def deserialize(data: bytes) -> MessageId:
        """The id :meth:`serialize` produced.

        Raises:
            InvalidMessage: not a serialized id.
        """
        try:
            partition, offset = struct.unpack(MessageId._FORMAT, data)
        except (struct.error, TypeError) as exc:
            raise InvalidMessage(f"not a serialized MessageId: {data!r}") from exc
        kind = MessageId._KINDS.get(partition)
        if kind is not None:
            return MessageId.earliest if kind == "earliest" else MessageId.latest
        return MessageId(partition, offset)

    def _key(self) -> tuple[int, int]:
        if self._kind is not None:  # earliest before every id, latest after
            return (-(2**63), 0) if self._kind == "earliest" else (2**63, 0)
        return self._partition, self._offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageId) and self._key() == other._key()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() >= other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return f"({self.ledger_id()},{self._offset},{self._partition},-1)"

    def __repr__(self) -> str:
        if self._kind is not None:
            return f"MessageId.{self._kind}"
        return f"MessageId(partition={self._partition}, offset={self._offset})"


def _special(kind: str) -> MessageId:
    message_id = MessageId()
    message_id._kind = kind
    return message_id


MessageId.earliest = _special("earliest")
MessageId.latest = _special("latest")


def _message_id(meta: RecordMetadata) -> MessageId:
    if meta.offset is None:
        return MessageId(-1, -1)
    return MessageId(meta.partition, meta.offset)


def topic_name(topic: str) -> tuple[str, str]:
    """``(full Pulsar name, idempotent topic)`` for a Pulsar topic name.

    Raises:
        InvalidTopicName: not a persistent topic name this module can map.
        OperationNotSupported: a ``non-persistent://`` topic or a single partition of a
            partitioned topic.
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicName(f"invalid topic name {topic!r}")
    rest = topic
    if "://" in topic:
        scheme, _, rest = topic.partition("://")
        if scheme == "non-persistent":
            raise OperationNotSupported(f"{topic!r}: non-persistent topics are not supported (records are stored)")
        if scheme != "persistent":
            raise InvalidTopicName(f"invalid topic name {topic!r}")
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    if len(parts) != 3 or not all(parts):
        raise InvalidTopicName(f"invalid topic name {topic!r}: use name, tenant/namespace/name or persistent://...")
    if "-partition-" in parts[2]:
        raise OperationNotSupported(
            f"{topic!r}: producing to one partition of a partitioned topic is not supported; use the topic name"
        )
    full = "persistent://" + "/".join(parts)
    try:
        return full, canonical_topic(full)  # the project's one naming rule
    except InvalidTopicError as exc:
        raise InvalidTopicName(f"invalid topic name {topic!r}: {exc.message}") from None


def _check_type(where: str, name: str, value: Any, *kinds: type) -> None:
    """pulsar-client's argument check: a value of the wrong type raises a ValueError.

    Raises:
        InvalidConfiguration: (a ValueError) naming the argument.
    """
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        expected = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
        raise InvalidConfiguration(f"{where}: {name} must be {expected}, not {value!r}")


# accepted without effect (logged once at DEBUG): they configure a Pulsar client's connections
_LOGGED: set[str] = set()


def _accept_without_effect(where: str, name: str, why: str) -> None:
    if name not in _LOGGED:
        _LOGGED.add(name)
        _LOG.debug("%s: %s is accepted without effect: %s", where, name, why)


_CONNECTION = "records go through this project's broker; the backend's connection is set on the broker URL"
#: pulsar-client's service URL schemes: the backend is that Pulsar (see adapters/_pulsar_url.py)
_PULSAR_SCHEMES = ("pulsar", "pulsar+ssl", "http", "https")
#: Client arguments that, on such a URL, configure the backend's own Pulsar client as well
_BACKEND_OPTIONS = (
    "authentication",
    "use_tls",
    "tls_trust_certs_file_path",
    "tls_allow_insecure_connection",
    "tls_validate_hostname",
    "tls_private_key_file_path",
    "tls_certificate_file_path",
)

_CLIENT_DEFAULTS: dict[str, Any] = {
    "authentication": None,
    "operation_timeout_seconds": 30,
    "io_threads": 1,
    "message_listener_threads": 1,
    "concurrent_lookup_requests": 50000,
    "log_conf_file_path": None,
    "stats_interval_in_seconds": 600,
    "use_tls": False,
    "tls_trust_certs_file_path": None,
    "tls_allow_insecure_connection": False,
    "tls_validate_hostname": False,
    "logger": None,
    "connection_timeout_ms": 10000,
    "listener_name": None,
    "tls_private_key_file_path": None,
    "tls_certificate_file_path": None,
}
_AUTHENTICATIONS = (
    "Authentication",
    "AuthenticationTLS",
    "AuthenticationToken",
    "AuthenticationAthenz",
    "AuthenticationOauth2",
    "AuthenticationBasic",
)


class Client:
    """pulsar-client's ``Client``, over this project's broker.

    Every argument of pulsar-client's ``Client`` is accepted and type-checked as upstream
    checks it (a wrong type raises a ValueError). On a Pulsar service URL the TLS arguments
    and ``authentication`` configure the backend's own Pulsar client (and TLS its admin calls
    over ``https``); the others that tune a Pulsar connection have no effect on producers and
    readers (records go through this project's broker; each is logged once at DEBUG). On a
    Pulsar service URL all of them configure the real ``pulsar.Client`` that :meth:`subscribe`
    and :meth:`create_table_view` use.

    Args:
        service_url: a broker URL (pulsar-client's ``pulsar://host:port``,
            ``pulsar+ssl://host:port``, ``http(s)://host:port``, each optionally with
            ``?admin_url=...``; ``sqlite:///f.db``, ``memory://``, ``kafka://host:port``) or an
            open broker handle (not closed by :meth:`close`).
        operation_timeout_seconds: how long creating a producer may take.
        logger: a :class:`logging.Logger` for errors raised by ``send_async`` callbacks
            (pulsar-client's ``ConsoleLogger``/``FileLogger`` go to the real client only).

    Raises:
        InvalidUrl, InvalidConfiguration: (ValueErrors) a bad URL or argument.
        ConnectError: the backend could not be opened.
    """

    def __init__(
        self,
        service_url: str | BrokerAPI,
        authentication: Any = None,
        operation_timeout_seconds: int = 30,
        io_threads: int = 1,
        message_listener_threads: int = 1,
        concurrent_lookup_requests: int = 50000,
        log_conf_file_path: str | None = None,
        stats_interval_in_seconds: int = 600,
        use_tls: bool = False,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        tls_validate_hostname: bool = False,
        logger: Any = None,
        connection_timeout_ms: int = 10000,
        listener_name: str | None = None,
        tls_private_key_file_path: str | None = None,
        tls_certificate_file_path: str | None = None,
    ) -> None:
        where = "Client"
        if not isinstance(service_url, str | BrokerAPI):
            raise InvalidUrl(f"service_url must be a URL or a broker, not {type(service_url).__name__}")
        if authentication is not None and type(authentication).__name__ not in _AUTHENTICATIONS:
            raise InvalidConfiguration(
                f"{where}: authentication must be a pulsar Authentication, not {authentication!r}"
            )
        for name, value in (
            ("operation_timeout_seconds", operation_timeout_seconds),
            ("io_threads", io_threads),
            ("message_listener_threads", message_listener_threads),
            ("concurrent_lookup_requests", concurrent_lookup_requests),
            ("stats_interval_in_seconds", stats_interval_in_seconds),
            ("connection_timeout_ms", connection_timeout_ms),
        ):
            _check_type(where, name, value, int)
        flags: tuple[tuple[str, Any], ...] = (
            ("use_tls", use_tls),
            ("tls_allow_insecure_connection", tls_allow_insecure_connection),
            ("tls_validate_hostname", tls_validate_hostname),
        )
        for name, value in flags:
            _check_type(where, name, value, bool)
        paths: tuple[tuple[str, Any], ...] = (
            ("log_conf_file_path", log_conf_file_path),
            ("tls_trust_certs_file_path", tls_trust_certs_file_path),
            ("listener_name", listener_name),
            ("tls_private_key_file_path", tls_private_key_file_path),
            ("tls_certificate_file_path", tls_certificate_file_path),
        )
        for name, value in paths:
            _check_type(where, name, value, str, type(None))
        native_logger = logger is not None and type(logger).__name__ in ("ConsoleLogger", "FileLogger")
        if logger is not None and not native_logger and not isinstance(logger, logging.Logger):
            raise InvalidConfiguration(f"{where}: logger must be a logging.Logger, ConsoleLogger or FileLogger")
        #: what the real pulsar.Client gets, for subscribe() and create_table_view() on a Pulsar service URL
        self._native_options: dict[str, Any] = {
            "authentication": authentication,
            "operation_timeout_seconds": operation_timeout_seconds,
            "io_threads": io_threads,
            "message_listener_threads": message_listener_threads,
            "concurrent_lookup_requests": concurrent_lookup_requests,
            "log_conf_file_path": log_conf_file_path,
            "stats_interval_in_seconds": stats_interval_in_seconds,
            "use_tls": use_tls,
            "tls_trust_certs_file_path": tls_trust_certs_file_path,
            "tls_allow_insecure_connection": tls_allow_insecure_connection,
            "tls_validate_hostname": tls_validate_hostname,
            "logger": logger,
            "connection_timeout_ms": connection_timeout_ms,
            "listener_name": listener_name,
            "tls_private_key_file_path": tls_private_key_file_path,
            "tls_certificate_file_path": tls_certificate_file_path,
        }
        pulsar_url = isinstance(service_url, str) and urllib.parse.urlsplit(service_url).scheme in _PULSAR_SCHEMES
        #: on a Pulsar service URL, TLS and authentication reach the backend's Pulsar client too
        passed = {
            name: value
            for name, value in self._native_options.items()
            if pulsar_url and name in _BACKEND_OPTIONS and value != _CLIENT_DEFAULTS[name]
        }
        self._backend_options: dict[str, Any] | None = {"client_options": passed} if passed else None
        for name, value in self._native_options.items():
            if name not in ("operation_timeout_seconds", "logger", *passed) and value != _CLIENT_DEFAULTS[name]:
                _accept_without_effect(where, name, _CONNECTION)
        self._logger = logger if isinstance(logger, logging.Logger) else _LOG
        self._timeout = float(operation_timeout_seconds)
        self._url: str | None = None
        self._native: Any = None
        #: gives the shared broker back once, on close() or when the client is garbage collected
        self._release: weakref.finalize[Any, Any] | None = None
        if isinstance(service_url, str):
            try:
                self._broker = _shared.acquire(service_url, self._backend_options)
            except ProducerError as exc:
                raise _exception_for(exc) from exc
            self._url = service_url
            self._release = weakref.finalize(self, _shared.release, service_url, self._backend_options)
        else:
            self._broker = service_url
        self._producers: list[Producer] = []
        self._readers: list[Reader] = []
        self._closed = False
        self._lock = threading.Lock()

    @property
    def broker(self) -> BrokerAPI:
        """Extension: the broker this client publishes through."""
        return self._broker

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        *,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        max_pending_messages: int = 1000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = False,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 131072,
        batching_max_publish_delay_ms: int = 10,
        **options: Any,
    ) -> Producer:
        """Create a producer on ``topic``.

        A named producer keeps its identity across restarts: it continues the sequences the
        previous instance with that name stored, and fences it (the older instance's next
        send fails with :class:`ProducerFenced`). Pulsar instead refuses a second live
        producer with the same name (``ProducerBusy``).

        Args:
            send_timeout_millis: a message not stored within this long fails with
                :class:`Timeout` (0: no timeout). A message that was already sent when it
                times out also stops the producer; create it again to continue.
            batching_*: ``batching_enabled`` False sends each message as soon as the sender
                is free (linger 0); True waits up to ``batching_max_publish_delay_ms`` and
                seals a batch at ``batching_max_messages`` or
                ``batching_max_allowed_size_in_bytes``.
            max_pending_messages, block_if_queue_full: the local queue; when full,
                ``send``/``send_async`` fail with :class:`ProducerQueueIsFull` or block.
            max_pending_messages_across_partitions, lazy_start_partitioned_producers,
            compression_type (NONE), schema (bytes), message_routing_mode (round robin),
            batching_type (default), access_mode (Shared): accepted at their defaults.

        Raises:
            InvalidConfiguration: an unsupported option or value (named).
            InvalidTopicName, OperationNotSupported: the topic cannot be mapped.
            AlreadyClosed: the client is closed.
            PulsarException: the producer could not be initialised (mapped error).
        """
        if self._closed:
            raise AlreadyClosed("client is closed")
        where = "create_producer"
        schema = _check_producer_options(options)
        if not isinstance(topic, str):
            raise InvalidTopicName(f"{where}: topic must be a str, not {topic!r}")
        full, name = topic_name(topic)
        _check_type(where, "producer_name", producer_name, str, type(None))
        _check_type(where, "initial_sequence_id", initial_sequence_id, int, type(None))
        _check_type(where, "block_if_queue_full", block_if_queue_full, bool)
        _check_type(where, "batching_enabled", batching_enabled, bool)
        for option, value in (
            ("send_timeout_millis", send_timeout_millis),
            ("max_pending_messages", max_pending_messages),
            ("batching_max_messages", batching_max_messages),
            ("batching_max_allowed_size_in_bytes", batching_max_allowed_size_in_bytes),
            ("batching_max_publish_delay_ms", batching_max_publish_delay_ms),
        ):
            _check_type(where, option, value, int)
            if value < 0:
                raise InvalidConfiguration(f"{where}: {option} must be a non-negative int, not {value!r}")
        if max_pending_messages == 0:
            raise InvalidConfiguration(f"{where}: max_pending_messages must be positive")
        if initial_sequence_id is not None and not -1 <= initial_sequence_id < _MAX_SEQUENCE_ID:
            raise InvalidConfiguration(
                f"{where}: initial_sequence_id must be an int in -1..2**63-2, not {initial_sequence_id!r}"
            )
        if producer_name == "":
            raise InvalidConfiguration(f"{where}: producer_name must be a non-empty str")
        self._adopt_pulsar_rule(name)
        if batching_enabled:
            linger_ms: float = batching_max_publish_delay_ms
            batch_records = max(1, batching_max_messages)
            batch_bytes = max(1, batching_max_allowed_size_in_bytes)
        else:
            linger_ms, batch_records, batch_bytes = 0.0, 10_000, 1024 * 1024
        try:
            inner = _Producer(
                self._broker,
                producer_name,
                linger_ms=linger_ms,
                max_batch_records=batch_records,
                batch_size=batch_bytes,
                delivery_timeout_ms=float(send_timeout_millis) if send_timeout_millis > 0 else _NO_TIMEOUT_MS,
                max_buffered_records=max_pending_messages,
                init_timeout_ms=self._timeout * 1000,
            )
        except ProducerError as exc:
            raise _exception_for(exc) from exc
        producer = Producer(
            inner,
            full,
            name,
            initial_sequence_id,
            max_pending_messages,
            block_if_queue_full,
            self._logger,
            schema,
            self,
        )
        with self._lock:
            self._producers.append(producer)
        return producer

    def _adopt_pulsar_rule(self, topic: str) -> None:
        """Give a topic that does not exist yet Pulsar's sequence rule (``monotonic``).

        pulsar-client applications set ``initial_sequence_id`` and send ``sequence_id`` values
        with holes; Pulsar accepts any increase. A topic this drop-in is the first to use is
        therefore created with the ``monotonic`` policy, so that both work on a broker with
        default settings. A topic that already exists keeps the policy in force on it.

        Raises:
            PulsarException: the broker could not be asked (mapped error).
        """
        try:
            if topic in self._broker.topics():
                return
            self._broker.set_policy("monotonic", topic=topic)
        except errors.AuthorizationError:
            _LOG.warning("not allowed to set the monotonic policy on new topic %s: the policy in force applies", topic)
        except ProducerError as exc:
            raise _exception_for(exc) from exc

    def _native_client(self, what: str) -> Any:
        """The real ``pulsar.Client`` on this client's Pulsar service URL (created on first use).

        Raises:
            OperationNotSupported: the service URL is not a Pulsar one (an embedded or Kafka
                backend has no Pulsar to consume from), or pulsar-client is not installed.
        """
        url = self._url or ""
        if urllib.parse.urlsplit(url).scheme not in _PULSAR_SCHEMES:
            raise OperationNotSupported(
                f"Client.{what}() needs a Pulsar broker, and the service URL is {url or 'a broker handle'!r}: "
                "subscriptions live in Pulsar. Read with create_reader() or idempotent.Reader "
                "(docs/consuming.md), which work on every URL"
            )
        module = _shared.native(_NATIVE)
        if module is None:
            raise OperationNotSupported(f"Client.{what}() needs pulsar-client: pip install idempotent[pulsar]")
        with self._lock:
            if self._native is None:
                # without a logger of the user's, the C++ client's lines go to Python logging
                self._native = open_pulsar_client(module.Client, url.split("?", 1)[0], **self._native_options)
            return self._native

    def subscribe(self, topic: Any, subscription_name: Any, *args: Any, **kwargs: Any) -> Any:
        """On a Pulsar service URL, pulsar-client's ``Client.subscribe`` on a real client (its
        Consumer, messages and errors are pulsar-client's own).

        Raises:
            OperationNotSupported: the service URL is not a Pulsar one.
            AlreadyClosed: the client is closed.
        """
        self._check_open()
        return self._native_client("subscribe").subscribe(topic, subscription_name, *args, **kwargs)

    def create_table_view(self, topic: Any, *args: Any, **kwargs: Any) -> Any:
        """On a Pulsar service URL, pulsar-client's ``Client.create_table_view`` on a real client.

        Raises:
            OperationNotSupported: the service URL is not a Pulsar one.
            AlreadyClosed: the client is closed.
        """
        self._check_open()
        return self._native_client("create_table_view").create_table_view(topic, *args, **kwargs)

    def create_reader(
        self,
        topic: str,
        start_message_id: Any,
        reader_listener: Any = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: Any = None,
        start_message_id_inclusive: bool = False,
        schema: Any = None,
    ) -> Reader:
        """A reader of ``topic`` from ``start_message_id`` (``MessageId.earliest``,
        ``MessageId.latest`` or the id of a message: the reader starts after it, or at it
        with ``start_message_id_inclusive``), on every URL, through :class:`idempotent.Reader`.

        Store the id of the last message you processed with your state and start the next
        reader from it: the consuming half of effectively-once (PIP-6).

        Raises:
            InvalidTopicName, InvalidConfiguration: (ValueErrors) a bad topic or argument.
            OperationNotSupported: ``reader_listener``, ``is_read_compacted`` or
                ``crypto_key_reader`` (they cannot work here).
            AlreadyClosed: the client is closed.
            PulsarException: the topic could not be opened (mapped error).
        """
        self._check_open()
        where = "create_reader"
        if not isinstance(topic, str):
            raise InvalidTopicName(f"{where}: topic must be a str, not {topic!r}")
        if not isinstance(start_message_id, MessageId):
            raise InvalidConfiguration(f"{where}: start_message_id must be a MessageId, not {start_message_id!r}")
        _check_type(where, "receiver_queue_size", receiver_queue_size, int)
        _check_type(where, "reader_name", reader_name, str, type(None))
        _check_type(where, "subscription_role_prefix", subscription_role_prefix, str, type(None))
        _check_type(where, "is_read_compacted", is_read_compacted, bool)
        _check_type(where, "start_message_id_inclusive", start_message_id_inclusive, bool)
        for name, value in (
            ("reader_listener", reader_listener),
            ("crypto_key_reader", crypto_key_reader),
            ("is_read_compacted", is_read_compacted or None),
        ):
            if value is not None:
                raise OperationNotSupported(f"{where}: {name} is not supported by the drop-in's reader")
        full, name = topic_name(topic)
        start: Any
        if start_message_id._kind is not None:
            start = start_message_id._kind
        else:
            start = _reader.MessageId(name, start_message_id.partition(), start_message_id.offset())
        try:
            inner = _reader.Reader(
                self._broker,
                name,
                start,
                inclusive=start_message_id_inclusive,
                max_records=max(1, receiver_queue_size),
                create=True,
            )
        except ProducerError as exc:
            raise _exception_for(exc) from exc
        reader = Reader(inner, full, start_message_id_inclusive, schema)
        with self._lock:
            self._readers.append(reader)
        return reader

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("client is closed")

    def get_topic_partitions(self, topic: str) -> list[str]:
        """The partition topic names of ``topic`` (``[topic]`` for one partition, as Pulsar).

        Raises:
            InvalidTopicName: the name cannot be mapped.
        """
        full, name = topic_name(topic)
        try:
            count = self._broker.partitions_for(name)
        except ProducerError as exc:
            raise _exception_for(exc) from exc
        return [full] if count == 1 else [f"{full}-partition-{p}" for p in range(count)]

    def close(self) -> None:
        """Close every producer (flushing what they hold) and release the broker."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            producers, self._producers = self._producers, []
            readers, self._readers = self._readers, []
            native, self._native = self._native, None
        try:
            for producer in producers:
                producer.close()
            for reader in readers:
                reader.close()
            if native is not None:
                native.close()
        finally:
            if self._release is not None:
                self._release()

    def shutdown(self) -> None:
        """Like :meth:`close`."""
        self.close()


_PRODUCER_OPTIONS = (
    "schema",
    "compression_type",
    "max_pending_messages_across_partitions",
    "chunking_enabled",
    "message_routing_mode",
    "lazy_start_partitioned_producers",
    "properties",
    "batching_type",
    "encryption_key",
    "crypto_key_reader",
    "access_mode",
    "message_router",
)
_ENUMS = {
    "compression_type": "CompressionType",
    "message_routing_mode": "PartitionsRoutingMode",
    "batching_type": "BatchingType",
    "access_mode": "ProducerAccessMode",
}
_NO_EFFECT_HINTS = {
    "compression_type": "the backend stores records as the broker writes them",
    "max_pending_messages_across_partitions": "max_pending_messages bounds the whole producer",
    "chunking_enabled": "a record is stored whole, up to the broker's largest entry",
    "message_routing_mode": "messages are routed by partition_key hash, round robin without one",
    "lazy_start_partitioned_producers": "partitions are written through one producer",
    "properties": "producer properties are not stored",
    "batching_type": "batches are formed per partition",
    "access_mode": "a named producer fences its older instances; exclusivity between names is not enforced",
}


def _check_producer_options(options: Mapping[str, Any]) -> Any:
    """Check create_producer's other options as pulsar-client does; return the schema.

    Raises:
        InvalidConfiguration: (a ValueError) an unknown option or a value of the wrong type.
        OperationNotSupported: encryption or a custom message router (they cannot work here).
    """
    where = "create_producer"
    for name, value in options.items():
        if name not in _PRODUCER_OPTIONS:
            raise InvalidConfiguration(f"{where}: unknown option {name!r}")
        if name in _ENUMS:
            if type(value).__name__ != _ENUMS[name]:
                raise InvalidConfiguration(f"{where}: {name} must be a pulsar.{_ENUMS[name]}, not {value!r}")
        elif name in ("chunking_enabled", "lazy_start_partitioned_producers"):
            _check_type(where, name, value, bool)
        elif name == "max_pending_messages_across_partitions":
            _check_type(where, name, value, int)
        elif name == "properties":
            _check_type(where, name, value, dict, type(None))
        elif name == "schema":
            if value is not None and not callable(getattr(value, "encode", None)):
                raise InvalidConfiguration(f"{where}: schema must be a pulsar schema, not {value!r}")
            continue
        elif value is not None:  # encryption_key, crypto_key_reader, message_router
            raise OperationNotSupported(
                f"{where}: {name} is not supported: "
                + ("custom routers are not supported" if name == "message_router" else "encryption is not supported")
            )
        if name in _NO_EFFECT_HINTS:
            _accept_without_effect(where, name, _NO_EFFECT_HINTS[name])
    schema = options.get("schema")
    return None if schema is None or type(schema).__name__ == "BytesSchema" else schema


_SEND_OPTIONS = (
    "ordering_key",
    "replication_clusters",
    "disable_replication",
    "event_timestamp",
    "deliver_at",
    "deliver_after",
)


def _check_send_options(options: Mapping[str, Any]) -> None:
    """Check send's other options as pulsar-client does.

    Raises:
        InvalidConfiguration: (a ValueError) an unknown option or a value of the wrong type.
        OperationNotSupported: delayed delivery (deliver_at, deliver_after), which cannot work here.
    """
    where = "send"
    for name, value in options.items():
        if name not in _SEND_OPTIONS:
            raise InvalidConfiguration(f"{where}: unknown option {name!r}")
        if value is None:
            continue
        if name == "ordering_key":
            _check_type(where, name, value, str)
            _accept_without_effect(where, name, "records are ordered per partition; use partition_key")
        elif name == "replication_clusters":
            _check_type(where, name, value, list)
            _accept_without_effect(where, name, "there is no geo-replication here")
        elif name == "disable_replication":
            _check_type(where, name, value, bool)
            _accept_without_effect(where, name, "there is no geo-replication here")
        elif name == "event_timestamp":
            _check_type(where, name, value, int)
            _accept_without_effect(where, name, "records carry the time the backend stored them")
        else:
            if name == "deliver_at":
                _check_type(where, name, value, int)
            elif not hasattr(value, "total_seconds"):
                raise InvalidConfiguration(f"{where}: deliver_after must be a timedelta, not {value!r}")
            raise OperationNotSupported(f"{where}: {name} is not supported: delayed delivery is not available")


class Producer:
    """pulsar-client's ``Producer``: ``send``, ``send_async``, ``flush``, ``close``,
    ``topic()``, ``producer_name()``, ``last_sequence_id()``, ``is_connected()``.

    Created by :meth:`Client.create_producer`.
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
        client: Client | None = None,
    ) -> None:
        self._inner = inner
        self._schema = schema
        # as pulsar-client's producer, keep the client (and so its broker) alive while in use
        self._client = client
        self._full_topic = full_topic
        self._topic = topic
        self._logger = logger
        self._max_pending = max_pending
        self._block = block_if_full
        self._cond = threading.Condition()
        self._pending = 0
        self._closed = False
        partitions = inner.partitions_for(topic)
        self._counter = 0  # messages without a key go round robin, as pulsar-client's
        # Pulsar numbers messages from initial_sequence_id + 1 when it is given; otherwise the
        # broker's numbering (continuing a named producer's stored sequences) applies.
        self._next: dict[int, int] | None = None
        self._first = 0 if initial_sequence_id is None else initial_sequence_id + 1
        if initial_sequence_id is not None:
            self._next = dict.fromkeys(range(partitions), self._first)
            self._last = initial_sequence_id
        else:
            self._last = max(inner.last_sequence(topic, p) for p in range(partitions))

    @property
    def producer(self) -> _Producer:
        """Extension: the underlying :class:`idempotent.Producer`."""
        return self._inner

    def topic(self) -> str:
        """The full topic name (``persistent://tenant/namespace/name``)."""
        return self._full_topic

    def producer_name(self) -> str:
        """The producer name, or ``idempotent-<producer id>`` for an anonymous producer."""
        return self._inner.producer_name or f"idempotent-{self._inner.producer_id}"

    def last_sequence_id(self) -> int:
        """The highest sequence id stored for this producer: acknowledged by this instance,
        or (for a named producer) stored by an earlier one; ``initial_sequence_id`` until a
        message is acknowledged when that was given; -1 when none."""
        with self._cond:
            return self._last

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
    ) -> MessageId:
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
        future = self._submit(content, properties, partition_key, sequence_id, options)
        try:
            return _message_id(future.result())
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
        if callback is not None and not callable(callback):
            raise InvalidConfiguration("send_async: callback must be callable or None")
        try:
            future = self._submit(content, properties, partition_key, sequence_id, options)
        except (InvalidConfiguration, OperationNotSupported):
            raise
        except PulsarException as exc:
            self._call(callback, exc.result(), MessageId())
            return

        def done(f: Future[RecordMetadata]) -> None:
            exc = f.exception()
            if exc is None:
                self._call(callback, Result.Ok, _message_id(f.result()))
            else:
                self._call(callback, _exception_for(exc).result(), MessageId())

        future.add_done_callback(done)

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
    ) -> Future[RecordMetadata]:
        _check_send_options(options)
        if self._closed:
            raise AlreadyClosed("producer is closed")
        if self._schema is not None and content is not None:
            content = self._schema.encode(content)
        if content is not None and not isinstance(content, bytes | bytearray | memoryview):
            raise TypeError(f"send: content must be bytes or None, not {type(content).__name__}")
        if partition_key is not None and not isinstance(partition_key, str):
            raise InvalidConfiguration("send: partition_key must be a str")
        headers = None
        if properties is not None:
            if not isinstance(properties, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
            ):
                raise InvalidConfiguration("send: properties must be a dict of str to str")
            headers = {k: v.encode() for k, v in properties.items()}
        if sequence_id is not None and (
            not isinstance(sequence_id, int)
            or isinstance(sequence_id, bool)
            or not 0 <= sequence_id <= _MAX_SEQUENCE_ID
        ):
            raise InvalidConfiguration(
                f"send: sequence_id must be an int in 0..{_MAX_SEQUENCE_ID}, not {sequence_id!r}"
            )
        key = partition_key.encode() if partition_key else None  # an empty key is none, as pulsar-client's
        with self._cond:
            while self._pending >= self._max_pending:
                if not self._block:
                    raise ProducerQueueIsFull(f"{self._pending} messages are pending (max_pending_messages)")
                self._cond.wait(0.5)
                if self._closed:
                    raise AlreadyClosed("producer is closed")
            try:  # (partitions added to the topic are learnt here)
                count = self._inner.partitions_for(self._topic)
            except ProducerError as exc:
                raise _exception_for(exc) from exc
            partition = pulsar_partition(partition_key, count)
            if partition is None:
                partition = self._counter % count
                self._counter += 1
            sequence = sequence_id
            if sequence is None and self._next is not None:
                sequence = self._next.get(partition, self._first)  # (a partition added since: from the start)
                self._next[partition] = sequence + 1
            try:
                future = self._inner.send(
                    self._topic, None if content is None else bytes(content), key, partition, headers, sequence=sequence
                ).concurrent()
            except ProducerError as exc:
                raise _exception_for(exc) from exc
            self._pending += 1

        def settle(f: Future[RecordMetadata]) -> None:
            with self._cond:
                self._pending -= 1
                if f.exception() is None:
                    self._last = max(self._last, f.result().sequence)
                self._cond.notify_all()

        future.add_done_callback(settle)
        return future

    def flush(self) -> None:
        """Wait until every message sent so far is stored or has failed.

        Raises:
            AlreadyClosed: the producer is closed.
        """
        if self._closed:
            raise AlreadyClosed("producer is closed")
        self._inner.flush()
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    def close(self) -> None:
        """Flush, then close the producer (messages still pending after 30 s fail)."""
        if self._closed:
            return
        self._closed = True
        self._inner.close(30)
        with self._cond:
            self._cond.notify_all()


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


__all__ = [
    "AlreadyClosed",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "Client",
    "ConnectError",
    "Interrupted",
    "InvalidConfiguration",
    "InvalidMessage",
    "InvalidTopicName",
    "InvalidUrl",
    "LookupError",
    "Message",
    "MessageId",
    "MessageTooBig",
    "NotAllowedError",
    "NotConnected",
    "OperationNotSupported",
    "Producer",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerNotInitialized",
    "ProducerQueueIsFull",
    "PulsarException",
    "ReadError",
    "Reader",
    "Result",
    "ServiceUnitNotReady",
    "Timeout",
    "TopicNotFound",
    "TopicTerminated",
    "UnknownError",
    "topic_name",
]


def __getattr__(name: str) -> Any:
    """The rest of pulsar-client (schemas, ``ConsumerType``, ``AuthenticationToken``,
    ``ConsoleLogger``, ...), passed through from the installed module."""
    return _shared.native_attribute(__name__, _NATIVE, name, route_pulsar_attribute)
