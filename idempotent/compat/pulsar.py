"""A drop-in for pulsar-client's ``Client`` and ``Producer``: exactly-once publishing by
changing one import.

::

    from idempotent.compat import pulsar   # instead of: import pulsar

    client = pulsar.Client("pulsar://localhost:6650")
    producer = client.create_producer("orders", producer_name="orders-feed")
    msg_id = producer.send(b"...", sequence_id=42)

The service URL is any broker URL of this project: ``pulsar://host:port`` stores into that
Pulsar cluster (through this project's broker and checker; give the admin REST URL as
``?admin_url=http://host:8080`` when it is not on port 8080 of the first host),
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

Everything outside the supported surface (``docs/migration.md``) raises
:class:`InvalidConfiguration` or :class:`OperationNotSupported` naming the option.
"""

from __future__ import annotations

import enum
import logging
import struct
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from .. import errors
from .._outcomes import DeliveryStatus, RecordMetadata
from .._topics import canonical_topic
from ..api import BrokerAPI
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
from ..producer import default_partition
from . import _shared

_LOG = logging.getLogger("idempotent.compat.pulsar")

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


class InvalidConfiguration(PulsarException):
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


class InvalidTopicName(PulsarException):
    result_value = Result.InvalidTopicName


class InvalidUrl(PulsarException):
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

    def __init__(self, partition: int = -1, offset: int = -1) -> None:
        self._partition = partition
        self._offset = offset

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
        """Sixteen bytes: partition and offset, big-endian."""
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
        return MessageId(partition, offset)

    def _key(self) -> tuple[int, int]:
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
        return f"MessageId(partition={self._partition}, offset={self._offset})"


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


def _check_defaults(
    where: str, given: Mapping[str, Any], defaults: Mapping[str, Any], hints: Mapping[str, str]
) -> None:
    """Refuse every option in ``given`` that differs from its default (naming it)."""
    for name, value in given.items():
        if name not in defaults:
            raise InvalidConfiguration(f"{where}: unknown option {name!r}")
        default = defaults[name]
        if value is not default and value != default:
            raise InvalidConfiguration(f"{where}: option {name}={value!r} is not supported: {hints[name]}")


_CLIENT_NO_EFFECT = (
    "io_threads",
    "message_listener_threads",
    "concurrent_lookup_requests",
    "stats_interval_in_seconds",
    "connection_timeout_ms",
)
_CLIENT_REFUSED: dict[str, Any] = {
    "authentication": None,
    "log_conf_file_path": None,
    "use_tls": False,
    "tls_trust_certs_file_path": None,
    "tls_allow_insecure_connection": False,
    "tls_validate_hostname": False,
    "listener_name": None,
    "tls_private_key_file_path": None,
    "tls_certificate_file_path": None,
}
_CLIENT_HINTS = {
    name: "security and listener settings belong to the backend (idempotent.connect options)"
    for name in _CLIENT_REFUSED
}


class Client:
    """pulsar-client's ``Client``, over this project's broker.

    Args:
        service_url: a broker URL (``pulsar://host:port[?admin_url=...]``, ``sqlite:///f.db``,
            ``memory://``, ``kafka://host:port``) or an open broker handle (not closed by
            :meth:`close`).
        operation_timeout_seconds: how long creating a producer may take.
        logger: a :class:`logging.Logger` for errors raised by ``send_async`` callbacks.
        io_threads, message_listener_threads, concurrent_lookup_requests,
        stats_interval_in_seconds, connection_timeout_ms: accepted, without effect.

    Raises:
        InvalidConfiguration: an unsupported option (named), or a bad URL.
        ConnectError: the backend could not be opened.
    """

    def __init__(
        self,
        service_url: str | BrokerAPI,
        *,
        operation_timeout_seconds: float = 30,
        logger: logging.Logger | None = None,
        **options: Any,
    ) -> None:
        for name in _CLIENT_NO_EFFECT:
            options.pop(name, None)
        _check_defaults("Client", options, _CLIENT_REFUSED, _CLIENT_HINTS)
        if logger is not None and not isinstance(logger, logging.Logger):
            raise InvalidConfiguration("Client: logger must be a logging.Logger")
        self._logger = logger or _LOG
        self._timeout = float(operation_timeout_seconds)
        self._url: str | None = None
        #: gives the shared broker back once, on close() or when the client is garbage collected
        self._release: weakref.finalize[Any, Any] | None = None
        if isinstance(service_url, str):
            try:
                self._broker = _shared.acquire(service_url)
            except ProducerError as exc:
                raise _exception_for(exc) from exc
            self._url = service_url
            self._release = weakref.finalize(self, _shared.release, service_url)
        elif isinstance(service_url, BrokerAPI):
            self._broker = service_url
        else:
            raise InvalidUrl(f"service_url must be a URL or a broker, not {type(service_url).__name__}")
        self._producers: list[Producer] = []
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
        _check_producer_options(options)
        full, name = topic_name(topic)
        for option, value in (
            ("send_timeout_millis", send_timeout_millis),
            ("max_pending_messages", max_pending_messages),
            ("batching_max_messages", batching_max_messages),
            ("batching_max_allowed_size_in_bytes", batching_max_allowed_size_in_bytes),
            ("batching_max_publish_delay_ms", batching_max_publish_delay_ms),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidConfiguration(f"create_producer: {option} must be a non-negative int, not {value!r}")
        if max_pending_messages == 0:
            raise InvalidConfiguration("create_producer: max_pending_messages must be positive")
        if initial_sequence_id is not None and (
            not isinstance(initial_sequence_id, int) or not -1 <= initial_sequence_id < 2**31 - 1
        ):
            raise InvalidConfiguration(
                f"create_producer: initial_sequence_id must be an int in -1..2147483646, not {initial_sequence_id!r}"
            )
        if producer_name is not None and (not isinstance(producer_name, str) or not producer_name):
            raise InvalidConfiguration("create_producer: producer_name must be a non-empty str")
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

    def _refused(self, what: str) -> OperationNotSupported:
        return OperationNotSupported(
            f"Client.{what}() is not supported by idempotent.compat.pulsar: it publishes only; "
            "read with idempotent.Reader (docs/consuming.md)"
        )

    def subscribe(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises :class:`OperationNotSupported`."""
        raise self._refused("subscribe")

    def create_reader(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises :class:`OperationNotSupported`."""
        raise self._refused("create_reader")

    def create_table_view(self, *args: Any, **kwargs: Any) -> None:
        """Refused: raises :class:`OperationNotSupported`."""
        raise self._refused("create_table_view")

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
        try:
            for producer in producers:
                producer.close()
        finally:
            if self._release is not None:
                self._release()

    def shutdown(self) -> None:
        """Like :meth:`close`."""
        self.close()


_PRODUCER_DEFAULTS: dict[str, Any] = {
    "schema": None,
    "compression_type": None,
    "max_pending_messages_across_partitions": 50000,
    "chunking_enabled": False,
    "message_routing_mode": None,
    "lazy_start_partitioned_producers": False,
    "properties": None,
    "batching_type": None,
    "encryption_key": None,
    "crypto_key_reader": None,
    "access_mode": None,
    "message_router": None,
}
_PRODUCER_HINTS = {
    "schema": "only bytes payloads are supported",
    "compression_type": "compression is not supported",
    "max_pending_messages_across_partitions": "the limit is max_pending_messages for the whole producer",
    "chunking_enabled": "chunking is not supported",
    "message_routing_mode": "messages are routed by partition_key hash, round robin without one",
    "lazy_start_partitioned_producers": "not applicable",
    "properties": "producer properties are not supported",
    "batching_type": "key-based batching is not supported",
    "encryption_key": "encryption is not supported",
    "crypto_key_reader": "encryption is not supported",
    "access_mode": "a named producer always fences its older instances (like ExclusiveWithFencing)",
    "message_router": "custom routers are not supported",
}
# enum members of pulsar-client that mean "the default"; matched by name so that passing
# pulsar's own enums (when both modules are imported) is accepted
_DEFAULT_ENUM_NAMES = {
    "compression_type": "NONE",
    "message_routing_mode": "RoundRobinDistribution",
    "batching_type": "Default",
    "access_mode": "Shared",
}


def _check_producer_options(options: Mapping[str, Any]) -> None:
    given = dict(options)
    for name, default_name in _DEFAULT_ENUM_NAMES.items():
        value = given.get(name)
        if value is not None and getattr(value, "name", None) == default_name:
            del given[name]
    schema = given.get("schema")
    if schema is not None and type(schema).__name__ == "BytesSchema":
        del given["schema"]
    _check_defaults("create_producer", given, _PRODUCER_DEFAULTS, _PRODUCER_HINTS)


_SEND_DEFAULTS: dict[str, Any] = {
    "ordering_key": None,
    "replication_clusters": None,
    "disable_replication": False,
    "event_timestamp": None,
    "deliver_at": None,
    "deliver_after": None,
}
_SEND_HINTS = {
    "ordering_key": "use partition_key",
    "replication_clusters": "geo-replication is not supported",
    "disable_replication": "geo-replication is not supported",
    "event_timestamp": "records carry the time the backend stored them",
    "deliver_at": "delayed delivery is not supported",
    "deliver_after": "delayed delivery is not supported",
}


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
    ) -> None:
        self._inner = inner
        self._full_topic = full_topic
        self._topic = topic
        self._logger = logger
        self._max_pending = max_pending
        self._block = block_if_full
        self._cond = threading.Condition()
        self._pending = 0
        self._closed = False
        self._partitions = inner.partitions_for(topic)
        self._counter = 0
        # Pulsar numbers messages from initial_sequence_id + 1 when it is given; otherwise the
        # broker's numbering (continuing a named producer's stored sequences) applies.
        self._next: dict[int, int] | None = None
        if initial_sequence_id is not None:
            self._next = dict.fromkeys(range(self._partitions), initial_sequence_id + 1)
            self._last = initial_sequence_id
        else:
            self._last = max(inner.last_sequence(topic, p) for p in range(self._partitions))

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
        callback: Callable[[Result, MessageId], Any],
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
        if not callable(callback):
            raise InvalidConfiguration("send_async: callback must be callable")
        try:
            future = self._submit(content, properties, partition_key, sequence_id, options)
        except InvalidConfiguration:
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

    def _call(self, callback: Callable[[Result, MessageId], Any], result: Result, msg_id: MessageId) -> None:
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
        _check_defaults("send", options, _SEND_DEFAULTS, _SEND_HINTS)
        if self._closed:
            raise AlreadyClosed("producer is closed")
        if content is not None and not isinstance(content, bytes | bytearray | memoryview):
            raise InvalidConfiguration(f"send: content must be bytes or None, not {type(content).__name__}")
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
            not isinstance(sequence_id, int) or isinstance(sequence_id, bool) or not 0 <= sequence_id < 2**31
        ):
            raise InvalidConfiguration(f"send: sequence_id must be an int in 0..2147483647, not {sequence_id!r}")
        key = partition_key.encode() if partition_key is not None else None
        with self._cond:
            while self._pending >= self._max_pending:
                if not self._block:
                    raise ProducerQueueIsFull(f"{self._pending} messages are pending (max_pending_messages)")
                self._cond.wait(0.5)
                if self._closed:
                    raise AlreadyClosed("producer is closed")
            partition = default_partition(key, self._partitions, self._counter)
            self._counter += 1
            sequence = sequence_id
            if sequence is None and self._next is not None:
                sequence = self._next[partition] % 2**31
                self._next[partition] = sequence + 1
            try:
                future = self._inner.send(
                    self._topic, None if content is None else bytes(content), key, partition, headers, sequence=sequence
                )
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
    "Result",
    "ServiceUnitNotReady",
    "Timeout",
    "TopicNotFound",
    "TopicTerminated",
    "UnknownError",
    "topic_name",
]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"pulsar.{name} is not provided by idempotent.compat.pulsar, which covers Client, Producer, "
        "MessageId, Result and the exceptions (see docs/migration.md)"
    )
