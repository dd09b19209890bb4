"""pulsar-client's ``Client``."""

from __future__ import annotations

import logging
import threading
import urllib.parse
import weakref
from typing import Any

import idempotent.consumer.reader as _reader
from idempotent.broker.direct import DirectBroker, direct_scheme
from idempotent.producer.producer import Producer as _Producer
from idempotent.runtime.native_logs import open_pulsar_client

from ... import errors
from ...api import BrokerAPI
from ...errors import ProducerError
from .. import _shared
from ._consuming import listening, shown, subscribed
from ._errors import (
    AlreadyClosed,
    InvalidConfiguration,
    InvalidTopicName,
    InvalidUrl,
    OperationNotSupported,
    _exception_for,
)
from ._ids import MessageId, _native_message_id, topic_name
from ._options import (
    _AUTHENTICATIONS,
    _BACKEND_OPTIONS,
    _CLIENT_DEFAULTS,
    _CONNECTION,
    _MAX_SEQUENCE_ID,
    _NATIVE,
    _NO_TIMEOUT_MS,
    _PULSAR_SCHEMES,
    _accept_without_effect,
    _check_producer_options,
    _check_type,
)
from ._producer import Producer
from ._reading import Reader

_LOG = logging.getLogger("idempotent.compat.pulsar")
_WARNED: set[str] = set()


def _is_service_info_provider(value: Any) -> bool:
    """Whether ``value`` is what pulsar-client takes instead of a URL: a ServiceInfoProvider
    (the application's own subclass) or an AutoClusterFailover."""
    try:
        import pulsar
    except ImportError:  # pragma: no cover - without the extra
        return False
    kinds = tuple(
        kind
        for kind in (getattr(pulsar, "ServiceInfoProvider", None), getattr(pulsar, "AutoClusterFailover", None))
        if isinstance(kind, type)
    )
    return bool(kinds) and isinstance(value, kinds)


def _warn_once(what: str, message: str, *args: Any) -> None:
    """A WARNING, once per process for ``what``: something weaker than exactly-once."""
    if what not in _WARNED:
        _WARNED.add(what)
        _LOG.warning(message, *args)


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
        ImportError: a Pulsar service URL and pulsar-client is not installed (the message
            names the extra); other URLs (``sqlite://``, ...) need no native client.
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
        #: a pulsar-client ServiceInfoProvider or AutoClusterFailover given as the service URL:
        #: a real pulsar.Client follows it, and producers write to the URL it names at the time
        self._provider: Any = None
        if _is_service_info_provider(service_url):
            self._provider, service_url = service_url, ""
        elif not isinstance(service_url, str | BrokerAPI):
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
        if pulsar_url and _shared.native(_NATIVE) is None:
            raise _shared.missing_native(_NATIVE, f"a client of the Pulsar service {service_url!r}")
        #: on a Pulsar service URL, TLS and authentication reach the backend's Pulsar client too
        passed = {
            name: value
            for name, value in self._native_options.items()
            if pulsar_url and name in _BACKEND_OPTIONS and value != _CLIENT_DEFAULTS[name]
        }
        self._backend_options: dict[str, Any] | None = {"client_options": passed} if passed else None
        honoured = ["operation_timeout_seconds", "logger", *passed]
        if pulsar_url and connection_timeout_ms != _CLIENT_DEFAULTS["connection_timeout_ms"]:
            # how long the backend tries to reach the service (and its Pulsar client's own)
            self._backend_options = {**(self._backend_options or {}), "connect_timeout": connection_timeout_ms / 1000}
            honoured.append("connection_timeout_ms")
        for name, value in self._native_options.items():
            if name not in honoured and value != _CLIENT_DEFAULTS[name]:
                _accept_without_effect(where, name, _CONNECTION)
        self._logger = logger if isinstance(logger, logging.Logger) else _LOG
        self._timeout = float(operation_timeout_seconds)
        self._url: str | None = None
        self._native: Any = None
        #: gives the shared broker back once, on close() or when the client is garbage collected
        self._release: weakref.finalize[Any, Any] | None = None
        #: on a Pulsar service URL every producer writes through its own DirectBroker
        #: (producer-scoped ownership: many processes write one topic at once, no server)
        self._direct = self._provider is not None or (isinstance(service_url, str) and direct_scheme(service_url))
        self._handle: BrokerAPI | None = None
        self._lock = threading.Lock()
        if isinstance(service_url, str):
            self._url = service_url
            if not self._direct:
                try:
                    self._handle = _shared.acquire(service_url, self._backend_options)
                except ProducerError as exc:
                    raise _exception_for(exc) from exc
                self._release = weakref.finalize(self, _shared.release, service_url, self._backend_options)
            # on a Pulsar URL, as pulsar-client, nothing connects before it is needed
        else:
            self._handle = service_url
        self._producers: list[Producer] = []
        self._readers: list[Reader] = []
        self._closed = False
        if self._provider is not None:  # pulsar-client checks a provider and its arguments now
            self._native_client("Client")

    @property
    def _broker(self) -> BrokerAPI:
        """The broker handle; on a Pulsar URL a DirectBroker without a producer (reads,
        topics, policies), opened on first use.

        Raises:
            PulsarException: it could not be opened (mapped error).
        """
        handle = self._handle
        if handle is not None:
            return handle
        url = self._service_url()  # (may ask the real client, which takes the lock)
        with self._lock:
            if self._handle is None:
                try:
                    direct = DirectBroker(url, **(self._backend_options or {}))
                except ProducerError as exc:
                    raise _exception_for(exc) from exc
                self._handle = direct
                self._release = weakref.finalize(self, direct.close)
            return self._handle

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
    ) -> Producer | Any:
        """Create a producer on ``topic``.

        A named producer keeps its identity across restarts: it continues the sequences the
        previous instance with that name stored, and fences it (the older instance's next
        send fails with :class:`ProducerFenced`). On a Pulsar service URL it writes through a
        broker of its own straight into Pulsar (``idempotent.broker.direct``; the name is Pulsar's
        producer name on the topic, one producer per name and topic as in Pulsar: a second
        live instance is refused until the first is gone, saying so); a missing topic is
        created not partitioned, as Pulsar does; ``compression_type``, ``access_mode``,
        ``encryption_key`` and ``crypto_key_reader`` apply to its Pulsar writers, and a
        ``non-persistent://`` topic gets a plain pulsar-client producer (with a warning).

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
            message_router: ``message_router(message, partitions)`` picks each partition.
            max_pending_messages_across_partitions, lazy_start_partitioned_producers,
            message_routing_mode (round robin), batching_type (default): accepted without
            effect (logged once at INFO).

        Raises:
            InvalidConfiguration: an unsupported option or value (named).
            InvalidTopicName, OperationNotSupported: the topic cannot be mapped.
            AlreadyClosed: the client is closed.
            PulsarException: the producer could not be initialised (mapped error).
        """
        if self._closed:
            raise AlreadyClosed("client is closed")
        where = "create_producer"
        schema = _check_producer_options(options, self._direct)
        if not isinstance(topic, str):
            raise InvalidTopicName(f"{where}: topic must be a str, not {topic!r}")
        if self._direct and topic.startswith("non-persistent://"):
            # nothing is stored, so there is nothing to store once: pulsar-client's own producer
            _warn_once(
                "non-persistent",
                "non-persistent topics keep nothing to deduplicate against: %s is written by a plain "
                "pulsar-client producer, without exactly-once",
                topic,
            )
            return self._native_client("create_producer").create_producer(
                topic,
                producer_name,
                initial_sequence_id=initial_sequence_id,
                send_timeout_millis=send_timeout_millis,
                max_pending_messages=max_pending_messages,
                block_if_queue_full=block_if_queue_full,
                batching_enabled=batching_enabled,
                batching_max_messages=batching_max_messages,
                batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
                batching_max_publish_delay_ms=batching_max_publish_delay_ms,
                **options,
            )
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
        if options.get("chunking_enabled") and batching_enabled:
            raise InvalidConfiguration(f"{where}: chunking_enabled and batching_enabled cannot both be set")
        if self._direct:
            self._create_as_pulsar_does(name)
        self._adopt_pulsar_rule(name)
        if batching_enabled:
            linger_ms: float = batching_max_publish_delay_ms
            batch_records = max(1, batching_max_messages)
            batch_bytes = max(1, batching_max_allowed_size_in_bytes)
        else:
            linger_ms, batch_records, batch_bytes = 0.0, 10_000, 1024 * 1024
        target: Any = None if self._direct else self._broker
        connect: dict[str, Any] = {}
        identity = producer_name
        if self._direct:  # its own broker, writing straight into Pulsar
            target = self._service_url()
            connect = dict(self._backend_options or {})
            settings: dict[str, Any] = {
                name: options[name]
                for name in ("compression_type", "access_mode", "encryption_key", "crypto_key_reader")
                if options.get(name) is not None
            }
            if producer_name is not None:
                # Pulsar's producer identity is the name on one topic: the same name on two
                # topics is two producers. Consumers see the name as it was given.
                settings["pulsar_producer_name"] = producer_name
                identity = f"{producer_name}@{full}"
            connect["log_settings"] = settings
        try:
            inner = _Producer(
                target,
                identity,
                linger_ms=linger_ms,
                max_batch_records=batch_records,
                batch_size=batch_bytes,
                delivery_timeout_ms=float(send_timeout_millis) if send_timeout_millis > 0 else _NO_TIMEOUT_MS,
                max_buffered_records=max_pending_messages,
                init_timeout_ms=self._timeout * 1000,
                **connect,
            )
        except ProducerError as exc:
            raise _exception_for(exc) from exc
        access = options.get("access_mode")
        if self._direct and access is not None and access.name != "Shared":
            # exclusive access is decided when the writers open: open them now, as Pulsar does
            try:
                inner.broker.open_partitions(name)  # type: ignore[attr-defined]
            except ProducerError as exc:
                inner.close(0)
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
            self._direct,
            producer_name,
            options.get("message_router"),
        )
        with self._lock:
            self._producers.append(producer)
        return producer

    def _create_as_pulsar_does(self, topic: str) -> None:
        """On a Pulsar URL, create a missing topic as Pulsar creates one for a producer: not
        partitioned (a topic that exists, partitioned or not, is used as it is).

        Raises:
            PulsarException: Pulsar could not be asked (mapped error).
        """
        backend: Any = getattr(self._broker, "backend", None)
        if backend is None or not hasattr(backend, "ensure_topic"):
            return
        from idempotent.adapters.pulsar.backend import _map_errors, pulsar_topic_name

        try:
            if backend.describe_topic(topic) is None:
                with _map_errors(f"create topic {topic}"):
                    backend.ensure_topic(pulsar_topic_name(topic))
        except ProducerError as exc:
            raise _exception_for(exc) from exc

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
        if self._provider is None and urllib.parse.urlsplit(url).scheme not in _PULSAR_SCHEMES:
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
                target = self._provider if self._provider is not None else url.split("?", 1)[0]
                # without a logger of the user's, the C++ client's lines go to Python logging
                self._native = open_pulsar_client(module.Client, target, **self._native_options)
            return self._native

    def subscribe(self, topic: Any, subscription_name: Any, *args: Any, **kwargs: Any) -> Any:
        """On a Pulsar service URL, pulsar-client's ``Client.subscribe`` on a real client (its
        Consumer, messages and errors are pulsar-client's own; the messages' ``properties()``
        are the ones their application set, see :mod:`._consuming`).

        Raises:
            OperationNotSupported: the service URL is not a Pulsar one.
            AlreadyClosed: the client is closed.
        """
        self._check_open()
        native = self._native_client("subscribe")
        return shown(subscribed(native.subscribe, topic, subscription_name, *args, **kwargs))

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
    ) -> Reader | Any:
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
        if self._direct:  # a Pulsar URL: pulsar-client's own reader, with pulsar-client's ids
            if isinstance(start_message_id, MessageId):
                if start_message_id._kind is None:
                    raise InvalidConfiguration(
                        f"{where}: on a Pulsar URL start from MessageId.earliest, MessageId.latest or a "
                        f"message id of this topic, not {start_message_id!r}"
                    )
                native = _native_message_id()
                start_message_id = native.earliest if start_message_id._kind == "earliest" else native.latest
            reader = self._native_client("create_reader").create_reader(
                topic,
                start_message_id,
                reader_listener=listening(reader_listener),
                receiver_queue_size=receiver_queue_size,
                reader_name=reader_name,
                subscription_role_prefix=subscription_role_prefix,
                is_read_compacted=is_read_compacted,
                crypto_key_reader=crypto_key_reader,
                start_message_id_inclusive=start_message_id_inclusive,
                **({} if schema is None else {"schema": schema}),
            )
            return shown(reader)
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

    def _service_url(self) -> str:
        """The URL producers write to: the one given, or what the ServiceInfoProvider or
        AutoClusterFailover names now."""
        if self._provider is not None:
            return str(self._native_client("create_producer").get_service_info().service_url)
        return self._url or ""

    def get_service_info(self) -> Any:
        """pulsar-client's ``Client.get_service_info()``: the service URL (and TLS settings)
        the client uses now; a ServiceInfoProvider's or AutoClusterFailover's current one.

        Raises:
            OperationNotSupported: the service URL is not a Pulsar one.
        """
        self._check_open()
        return self._native_client("get_service_info").get_service_info()

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
