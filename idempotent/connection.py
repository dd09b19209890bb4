"""Opening a broker handle for a URL: which class serves which scheme.

``connect`` opens the shared broker surface every tool uses (an in-process
:class:`~idempotent.broker.broker.Broker` over a backend, or a client of a broker server);
``open_for_producer`` opens what a :class:`~idempotent.producer.producer.Producer` writes through: for
``kafka://`` a :class:`~idempotent.broker.direct.DirectBroker` of its own (producer-scoped
ownership, docs/architecture.md), else the same as ``connect``. Backends and clients are
imported only when a URL needs them: nothing here imports ``adapters`` at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

from idempotent.errors import ConfigError
from idempotent.net.options import ClientOptions

if TYPE_CHECKING:
    from idempotent.api import BrokerAPI
    from idempotent.broker.broker import BrokerConfig

#: schemes served by a broker server, through the network client
REMOTE_SCHEMES = ("idem", "idems")


class ConnectOptions(ClientOptions, total=False):
    """The options :func:`connect` passes on, each to the backend or client that takes it.

    One set for every URL, because which options apply depends on the URL's scheme, which a
    type cannot see; the names and the types are checked, and the handle a URL opens refuses
    an option that is not its own (TypeError). What each means is documented where it is
    taken: :class:`~idempotent.adapters.sqlite.backend.SQLiteBackend`,
    :class:`~idempotent.adapters.kafka.backend.KafkaBackend`,
    :class:`~idempotent.adapters.pulsar.backend.PulsarBackend`, :class:`~idempotent.net.client.RemoteBroker`,
    :class:`~idempotent.net.client.ClusterBroker`.
    """

    # sqlite://
    check: str | None
    # kafka://
    client_config: dict[str, Any] | None
    replication_factor: int | None
    min_insync_replicas: int | None
    topic_config: dict[str, str] | None
    prefix: str | None
    # pulsar:// (and pulsar+ssl://, http(s)://)
    admin_url: str | None
    admin_headers: dict[str, str] | None
    client_options: dict[str, Any] | None
    service_url: str | None
    meta_topic: str | None
    max_entry_bytes: int | None
    # kafka:// and pulsar://; ``timeout`` and ``connect_timeout`` also idem:// (not None there)
    timeout: float | None
    connect_timeout: float | None
    read_only: bool | None
    # idem:// and idems://: retries, and ClientOptions' credentials and TLS settings
    retries: int
    # idem://host:port,host:port (several brokers)
    attempt_timeout: float


class ProducerConnectOptions(ConnectOptions, total=False):
    """:class:`ConnectOptions`, and what a producer's own broker takes
    (:class:`~idempotent.broker.direct.DirectBroker`, ``kafka://``)."""

    log_settings: Mapping[str, Any] | None
    #: a module that implements the ProducerLog contract in place of the scheme's own
    #: (``idempotent.adapters.memory_producer_log`` runs a producer with no external log)
    log_module: Any


def connect(url: str, config: BrokerConfig | None = None, **options: Unpack[ConnectOptions]) -> BrokerAPI:
    """Open a broker over the backend a URL names.

    URLs: ``memory://[name]`` (in-process, with fault injection), ``sqlite:///file.db`` (the
    embedded durable default), ``kafka://host:port`` and ``pulsar://host:port``: an in-process
    broker over that backend, ``options`` go to the backend adapter. ``idem://host:port``
    (``idems://`` over TLS): a broker server (``idempotent broker``), through a
    :class:`~idempotent.net.client.RemoteBroker`; ``options`` are its options (``token``,
    ``timeout``, ``cafile``, ...) and ``config`` must be None. ``idem://h1:p1,h2:p2``:
    several brokers over one backend, through a :class:`~idempotent.net.client.ClusterBroker`
    that routes each partition to its owner. The options of every scheme are listed, with
    their types, in :class:`ConnectOptions`.

    Raises:
        ConfigError: unknown scheme, bad URL, or the backend's client library is missing.
        TypeError: an option the handle of this URL does not take.
        BackendUnavailableError: the backend could not be opened.
        BrokerConnectionError: the broker server could not be reached.
        AuthenticationError: the broker server refused the token.
    """
    given: dict[str, Any] = dict(options)  # each handle checks the options of its own scheme
    if url.split("://", 1)[0] in REMOTE_SCHEMES:
        from idempotent.net.client import ClusterBroker, RemoteBroker

        if config is not None:
            raise ConfigError("a BrokerConfig applies to in-process brokers; configure the broker server instead")
        if "," in url:  # a list of brokers sharing one backend (docs/clustering.md)
            return ClusterBroker(url, **given)
        return RemoteBroker(url, **given)
    from idempotent.adapters import open_backend
    from idempotent.broker.broker import Broker

    return Broker(open_backend(url, **given), config)


def open_for_producer(
    url: str, config: BrokerConfig | None = None, **options: Unpack[ProducerConnectOptions]
) -> BrokerAPI:
    """What a producer opened on ``url`` writes through: its own
    :class:`~idempotent.broker.direct.DirectBroker` for a backend with producer-scoped writers
    (``kafka://``), else :func:`connect`'s broker.

    Raises:
        What :func:`connect` raises.
    """
    from idempotent.broker.direct import DirectBroker, direct_scheme

    given: dict[str, Any] = dict(options)
    if direct_scheme(url):
        return DirectBroker(url, config, **given)
    return connect(url, config, **given)


__all__ = ["REMOTE_SCHEMES", "ConnectOptions", "ProducerConnectOptions", "connect", "open_for_producer"]
