"""Where the native clients' own log lines go: Python :mod:`logging`, never stderr directly.

librdkafka (under confluent-kafka) prints lines such as ``%4|1700000000.123|FAIL|...`` and
the Pulsar C++ client (under pulsar-client) lines such as ``2024-01-01 12:00:00.000 INFO
[139...] ClientConnection:...`` straight to the process's stderr or stdout, unless the client
is given a logger. Every client the project opens gets one from here: the Kafka and Pulsar
adapters, the mirror's sources, and the clients the drop-in modules pass through
(``confluent_kafka.Consumer``, ``AdminClient``, ``pulsar.Client.subscribe``), unless the
user gave a logger of their own.

* ``idempotent.clients.librdkafka`` (:data:`LIBRDKAFKA_LOGGER`): librdkafka's lines, at the
  level confluent-kafka maps them to (``%3`` ERROR, ``%4`` WARNING, ``%6`` INFO, ``%7``
  DEBUG), as ``FACILITY [client] text``. They are handed over when the client is polled
  (``poll``, ``consume``, ``flush``); a client never polled drops them.
* ``idempotent.clients.pulsar`` (:data:`PULSAR_LOGGER`): the Pulsar C++ client's lines, at
  their level.

``idempotent.clients`` carries a :class:`logging.NullHandler`, so a program that configures
no logging prints none of these (Python's last-resort handler would print warnings to
stderr); one that configures logging (``logging.basicConfig``, or the command line's ``-v``)
sees them like any other library's. Each client's lines go to these loggers from the thread
that polls it (librdkafka) or from the client's own threads (Pulsar).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

#: The parent of the client loggers; a NullHandler keeps them off stderr when nothing is configured.
CLIENTS_LOGGER = "idempotent.clients"
#: librdkafka's lines (confluent-kafka clients).
LIBRDKAFKA_LOGGER = "idempotent.clients.librdkafka"
#: the Pulsar C++ client's lines (pulsar-client).
PULSAR_LOGGER = "idempotent.clients.pulsar"

logging.getLogger(CLIENTS_LOGGER).addHandler(logging.NullHandler())
_LIBRDKAFKA = logging.getLogger(LIBRDKAFKA_LOGGER)


class LibrdkafkaLog:
    """What confluent-kafka's ``logger`` setting takes: an object with
    ``log(level, msg, *args)``. Lines go to :data:`LIBRDKAFKA_LOGGER` at the level
    confluent-kafka gives them, except one expected retry.

    While a transactional producer's ``init_transactions`` fences a previous owner that died
    inside a transaction, the coordinator aborts that transaction and answers "concurrent
    transactions"; librdkafka logs ``GETPID ... retrying`` as a warning and asks again. That
    is the normal course of taking a partition over, so it is logged at INFO; a takeover that
    never completes still fails ``init_transactions``.
    """

    def log(self, level: int, msg: str, *args: object) -> None:
        """Called by confluent-kafka as ``log(level, "%s [%s] %s", facility, client, text)``."""
        if level > logging.INFO and args and args[0] == "GETPID" and str(args[-1]).endswith("retrying"):
            level = logging.INFO
        _LIBRDKAFKA.log(level, msg, *args)


#: The one router every confluent-kafka client of the project gets as its ``logger``.
LIBRDKAFKA_LOG = LibrdkafkaLog()


def kafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a confluent-kafka configuration with ``logger`` set to :data:`LIBRDKAFKA_LOG`,
    unless it names a logger already."""
    routed = dict(config)
    routed.setdefault("logger", LIBRDKAFKA_LOG)
    return routed


def pulsar_logger() -> logging.Logger:
    """The Python logger to give ``pulsar.Client(logger=...)``: :data:`PULSAR_LOGGER`.

    pulsar-client then hands every line of the C++ client to it, debug lines included (it
    lets the Python logger filter them), at some CPU cost per line; measured in the Pulsar
    adapter, within the noise of a bulk produce (see ``docs/operations.md``).
    """
    return logging.getLogger(PULSAR_LOGGER)


def pulsar_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``pulsar.Client`` keyword arguments with ``logger`` set to
    :func:`pulsar_logger`, unless a logger (a ``logging.Logger``, ``ConsoleLogger`` or
    ``FileLogger``) is given."""
    routed = dict(options)
    if routed.get("logger") is None:
        routed["logger"] = pulsar_logger()
    return routed


@functools.cache
def routed_kafka_class(native: Any) -> type:
    """A subclass of a confluent-kafka client class (``Consumer``, ``AdminClient``,
    ``DeserializingConsumer``, ...) whose constructor adds ``logger`` (see
    :func:`kafka_config`) to the configuration it is given, unless it names one. Instances
    are instances of ``native``; the same class is returned for the same ``native``."""

    class Routed(native):  # type: ignore[misc]
        __doc__ = native.__doc__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if args and isinstance(args[0], Mapping):
                if "logger" not in kwargs:
                    args = (kafka_config(args[0]), *args[1:])
            elif "logger" not in kwargs:
                kwargs["logger"] = LIBRDKAFKA_LOG
            super().__init__(*args, **kwargs)

    routed: type = Routed
    routed.__name__ = native.__name__
    routed.__module__ = native.__module__
    routed.__qualname__ = native.__qualname__
    return routed


@functools.cache
def _kafka_client_bases() -> tuple[type, ...]:
    """The confluent-kafka classes whose instances open a librdkafka client."""
    try:
        from confluent_kafka import cimpl
    except ImportError:
        return ()
    bases: list[type] = [cimpl.Consumer, cimpl.Producer, cimpl._AdminClientImpl]
    try:
        from confluent_kafka import aio
    except ImportError:
        pass
    else:
        bases += [aio.AIOConsumer, aio.AIOProducer]
    return tuple(bases)


def route_kafka_attribute(value: Any) -> Any:
    """What the confluent-kafka drop-in passes through for a native name: a client class
    (``Consumer``, ``AdminClient``, ``DeserializingConsumer``, ``aio.AIOConsumer``, ...) as
    its :func:`routed_kafka_class`, anything else as it is."""
    bases = _kafka_client_bases()
    if isinstance(value, type) and bases and issubclass(value, bases):
        native: Any = value
        return routed_kafka_class(native)
    return value


@functools.cache
def routed_pulsar_class(native: Any) -> type:
    """A subclass of a pulsar-client client class (``pulsar.Client``,
    ``pulsar.asyncio.Client``) whose constructor adds ``logger=`` :func:`pulsar_logger`
    unless one is given."""

    class Routed(native):  # type: ignore[misc]
        __doc__ = native.__doc__

        def __init__(self, service_url: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("logger") is None:
                kwargs["logger"] = pulsar_logger()
            super().__init__(service_url, *args, **kwargs)

    routed: type = Routed
    routed.__name__ = native.__name__
    routed.__module__ = native.__module__
    routed.__qualname__ = native.__qualname__
    return routed


def route_pulsar_attribute(value: Any) -> Any:
    """What the Pulsar drop-in passes through for a native name: a client class
    (``pulsar.asyncio.Client``) as its :func:`routed_pulsar_class`, anything else as it is."""
    if isinstance(value, type) and value.__name__ == "Client" and value.__module__.startswith("pulsar"):
        native: Any = value
        return routed_pulsar_class(native)
    return value


__all__ = [
    "CLIENTS_LOGGER",
    "LIBRDKAFKA_LOG",
    "LIBRDKAFKA_LOGGER",
    "PULSAR_LOGGER",
    "LibrdkafkaLog",
    "kafka_config",
    "pulsar_logger",
    "pulsar_options",
    "route_kafka_attribute",
    "route_pulsar_attribute",
    "routed_kafka_class",
    "routed_pulsar_class",
]
