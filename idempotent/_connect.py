"""Opening a broker handle for a URL: which class serves which scheme.

``connect`` opens the shared broker surface every tool uses (an in-process
:class:`~idempotent.broker.Broker` over a backend, or a client of a broker server);
``open_for_producer`` opens what a :class:`~idempotent.producer.Producer` writes through: for
``kafka://`` a :class:`~idempotent.direct.DirectBroker` of its own (producer-scoped
ownership, docs/architecture.md), else the same as ``connect``. Backends and clients are
imported only when a URL needs them: nothing here imports ``adapters`` at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .api import BrokerAPI
    from .broker import BrokerConfig

#: schemes served by a broker server, through the network client
REMOTE_SCHEMES = ("idem", "idems")


def connect(url: str, config: BrokerConfig | None = None, **options: Any) -> BrokerAPI:
    """Open a broker over the backend a URL names.

    URLs: ``memory://[name]`` (in-process, with fault injection), ``sqlite:///file.db`` (the
    embedded durable default), ``kafka://host:port`` and ``pulsar://host:port``: an in-process
    broker over that backend, ``options`` go to the backend adapter. ``idem://host:port``
    (``idems://`` over TLS): a broker server (``idempotent broker``), through a
    :class:`~idempotent.client.RemoteBroker`; ``options`` are its options (``token``,
    ``timeout``, ``cafile``, ...) and ``config`` must be None. ``idem://h1:p1,h2:p2``:
    several brokers over one backend, through a :class:`~idempotent.client.ClusterBroker`
    that routes each partition to its owner.

    Raises:
        ConfigError: unknown scheme, bad URL, or the backend's client library is missing.
        BackendUnavailableError: the backend could not be opened.
        BrokerConnectionError: the broker server could not be reached.
        AuthenticationError: the broker server refused the token.
    """
    if url.split("://", 1)[0] in REMOTE_SCHEMES:
        from .client import ClusterBroker, RemoteBroker

        if config is not None:
            raise ConfigError("a BrokerConfig applies to in-process brokers; configure the broker server instead")
        if "," in url:  # a list of brokers sharing one backend (docs/clustering.md)
            return ClusterBroker(url, **options)
        return RemoteBroker(url, **options)
    from adapters import open_backend

    from .broker import Broker

    return Broker(open_backend(url, **options), config)


def open_for_producer(url: str, config: BrokerConfig | None = None, **options: Any) -> BrokerAPI:
    """What a producer opened on ``url`` writes through: its own
    :class:`~idempotent.direct.DirectBroker` for a backend with producer-scoped writers
    (``kafka://``), else :func:`connect`'s broker.

    Raises:
        What :func:`connect` raises.
    """
    from .direct import DirectBroker, direct_scheme

    if direct_scheme(url):
        return DirectBroker(url, config, **options)
    return connect(url, config, **options)


__all__ = ["REMOTE_SCHEMES", "connect", "open_for_producer"]
