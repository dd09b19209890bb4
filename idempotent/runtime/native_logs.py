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
  their level (WARN is WARNING), as ``File:line | text``. The client writes those at or above
  the level this logger has when the client is opened.

The Pulsar client's lines take a detour through a file (:class:`_PulsarRelay` says why):
open clients with :func:`open_pulsar_client` (or :func:`routed_pulsar_class`); they reach the
logger a fraction of a second after they are written, and at exit the clients still open are
closed first.

``idempotent.clients`` carries a :class:`logging.NullHandler`, so a program that configures
no logging prints none of these (Python's last-resort handler would print warnings to
stderr); one that configures logging (``logging.basicConfig``, or the command line's ``-v``)
sees them like any other library's. librdkafka's lines are logged from the thread that polls
the client, the Pulsar client's from one relay thread.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import re
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
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
    """The Python logger the Pulsar C++ client's lines go to: :data:`PULSAR_LOGGER`."""
    return logging.getLogger(PULSAR_LOGGER)


#: the C++ client's level names, as its console and file loggers write them
_PULSAR_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR}
#: ``2024-01-01 12:00:00.000 INFO  [140...] ClientConnection:485 | text``
_PULSAR_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARN|ERROR)\s+\[\d+\] (.*)$")
#: seconds between two reads of the clients' log files
RELAY_INTERVAL = 0.2


class _PulsarRelay:
    """Carries the Pulsar C++ client's lines into :data:`PULSAR_LOGGER`.

    pulsar-client can hand its lines to a Python logger itself, but then its C++ threads take
    the GIL for every line, debug ones included (it lets the Python logger filter them: 5 calls
    per message sent, measured), and a line logged while the interpreter shuts down kills its
    thread inside the C++ client ("terminate called without an active exception", measured:
    2 of 12 runs of ``idempotent tail pulsar://...`` aborted at exit). So each client writes
    with pulsar-client's ``FileLogger`` (plain C++, filtered at the level the Python logger
    has when the client is opened) into a file of its own, unlinked once open, and one daemon
    thread reads the files every :data:`RELAY_INTERVAL` seconds and logs each complete line.
    At exit the clients still open are closed and the files read a last time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (file opened for reading, [partial line], the logger its lines go to, its path)
        self._files: list[tuple[Any, list[str], logging.Logger, str]] = []
        self._thread: threading.Thread | None = None
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()

    def logger_for_new_client(self, target: logging.Logger) -> tuple[Any, str | None]:
        """A ``logger`` for ``pulsar.Client`` whose lines go to ``target``, and the path to
        :meth:`opened` after it; ``target`` itself (and no path) when no file can be made."""
        import pulsar

        level = target.getEffectiveLevel()
        native = (
            pulsar.LoggerLevel.Debug
            if level <= logging.DEBUG
            else pulsar.LoggerLevel.Info
            if level <= logging.INFO
            else pulsar.LoggerLevel.Warn
            if level <= logging.WARNING
            else pulsar.LoggerLevel.Error
        )
        try:
            descriptor, path = tempfile.mkstemp(prefix="idempotent-pulsar-", suffix=".log")
        except OSError:
            return target, None
        reader = os.fdopen(descriptor, "r", encoding="utf-8", errors="replace")
        with self._lock:
            self._files.append((reader, [""], target, path))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idempotent-pulsar-logs", daemon=True)
                self._thread.start()
        return pulsar.FileLogger(native, path), path

    def opened(self, client: Any, path: str | None) -> None:
        """The client opened its log file: unlink the name (both ends stay open), and
        remember the client, to close it at exit."""
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        with self._lock:
            self._clients.add(client)

    def failed(self, path: str | None) -> None:
        """The client could not be opened: remove its log file (what it wrote is logged)."""
        if path is None:
            return
        self.drain()
        with contextlib.suppress(OSError):
            os.unlink(path)
        with self._lock:
            for entry in [e for e in self._files if e[3] == path]:
                self._files.remove(entry)
                entry[0].close()

    def drain(self) -> None:
        """Log the complete lines written since the last call."""
        with self._lock:
            files = list(self._files)
        for reader, partial, target, _ in files:
            text = reader.read()
            if not text:
                continue
            lines = (partial[0] + text).split("\n")
            partial[0] = lines.pop()
            for line in lines:
                if line:
                    self._emit(target, line)

    @staticmethod
    def _emit(target: logging.Logger, line: str) -> None:
        match = _PULSAR_LINE.match(line)
        if match is None:
            target.info("%s", line)
        else:
            target.log(_PULSAR_LEVELS[match.group(1)], "%s", match.group(2))

    def _run(self) -> None:
        while True:
            time.sleep(RELAY_INTERVAL)
            with contextlib.suppress(Exception):  # never let a log line end the relay
                self.drain()

    def close_all(self) -> None:
        """At exit: close the clients still open, then log what they wrote."""
        with self._lock:
            clients = list(self._clients)
            self._clients.clear()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
        with contextlib.suppress(Exception):
            self.drain()


_RELAY = _PulsarRelay()
atexit.register(_RELAY.close_all)


def drain_pulsar_logs() -> None:
    """Log the Pulsar clients' lines written so far now, rather than at the relay's next
    read (the command line calls it before it stops showing log lines)."""
    _RELAY.drain()


def open_pulsar_client(
    factory: Callable[..., Any], service_url: str, *, log_to: logging.Logger | None = None, **options: Any
) -> Any:
    """``factory(service_url, **options)`` (``pulsar.Client`` or a subclass), its lines
    relayed into ``log_to`` (default :data:`PULSAR_LOGGER`) unless ``options`` name a
    ``logger``, and closed at exit if still open (see :class:`_PulsarRelay`)."""
    path = None
    if options.get("logger") is None:
        options["logger"], path = _RELAY.logger_for_new_client(log_to or pulsar_logger())
    try:
        client = factory(service_url, **options)
    except BaseException:
        _RELAY.failed(path)
        raise
    _RELAY.opened(client, path)
    return client


def named_as(subclass: type, native: Any) -> type:
    """``subclass`` under the name, module and qualified name of the class ``native`` it
    extends, so that reprs and messages show the native class's name."""
    subclass.__name__ = native.__name__
    subclass.__module__ = native.__module__
    subclass.__qualname__ = native.__qualname__
    return subclass


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

    return named_as(Routed, native)


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
    ``pulsar.asyncio.Client``) whose constructor relays the client's lines into
    :data:`PULSAR_LOGGER` unless given a ``logger`` (see :func:`open_pulsar_client`)."""

    class Routed(native):  # type: ignore[misc]
        __doc__ = native.__doc__

        def __init__(self, service_url: Any, *args: Any, **kwargs: Any) -> None:
            path = None
            if kwargs.get("logger") is None:
                kwargs["logger"], path = _RELAY.logger_for_new_client(pulsar_logger())
            try:
                super().__init__(service_url, *args, **kwargs)
            except BaseException:
                _RELAY.failed(path)
                raise
            _RELAY.opened(self, path)

    return named_as(Routed, native)


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
    "drain_pulsar_logs",
    "kafka_config",
    "named_as",
    "open_pulsar_client",
    "pulsar_logger",
    "route_kafka_attribute",
    "route_pulsar_attribute",
    "routed_kafka_class",
    "routed_pulsar_class",
]
