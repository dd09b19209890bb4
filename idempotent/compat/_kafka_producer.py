"""The ``Producer`` of the confluent-kafka drop-in.

It behaves as librdkafka's producer does toward its application, and stores every record
exactly once through this project's producer:

* **Construction never waits.** The producer connects in the background (a connector
  thread): until the cluster answers, ``produce()`` queues records, ``error_cb`` hears what
  librdkafka's own clients report (``_TRANSPORT``, ``_ALL_BROKERS_DOWN``...), and records
  older than ``message.timeout.ms`` fail with ``_MSG_TIMED_OUT``.
* **Where records go** is the configuration's (``_kafka_config.py``): the Kafka cluster of
  ``bootstrap.servers`` by default, through a producer of its own (producer-scoped writes:
  any number of processes write one topic at once), or any broker URL.
* **One record, no objects.** Once connected, ``produce()`` checks its arguments, picks the
  partition with the configured partitioner, and appends value, key, callback and time to the
  producer's column buffer (``DropInPort.add``, ``idempotent/producer/dropin.py``): no record,
  future or message object is made.
* **Delivery reports** are served only by :meth:`Producer.poll` and :meth:`Producer.flush`,
  in the calling thread, as librdkafka's are: the producer's sender hands each ended span of
  records over (its span listener), and ``poll`` builds a :class:`DeliveredMessage` only for
  records that have a callback. A record counts against ``queue.buffering.max.messages`` and
  ``.kbytes`` until its report is served.

Extensions: ``produce(..., sequence=N)`` (the application's own sequence for the record, so
that a restarted named producer's resends are recognised as duplicates) and
:meth:`Producer.last_sequence`, as PIP-6's ``getLastSequenceId()``.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from time import monotonic
from typing import Any, final

from idempotent.core.records import Headers, optional_bytes
from idempotent.producer.dropin import DropInPort, Route
from idempotent.producer.producer import Producer as _Producer

from ..errors import (
    InvalidTopicError,
    ProducerClosedError,
    ProducerError,
    ProducerFencedError,
    QueueFullError,
    TransactionAbortableError,
    TransactionStateError,
    UsageError,
)
from . import _shared
from ._kafka_config import Config
from ._kafka_connect import HAND_OVER_SHARE, Connecting, _Clients, _Early
from ._kafka_errors import KafkaError, KafkaException, kafka_error_of
from ._kafka_reports import Report, Reports
from ._partitioners import librdkafka_partition, librdkafka_sticky

_LOG = logging.getLogger("idempotent.compat.confluent_kafka")
_NATIVE = "confluent_kafka"


def _closed_error() -> RuntimeError:
    return RuntimeError("Producer has been closed")


def _header_tuple(headers: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Headers:
    """Headers as stored: ``(name, bytes)`` pairs; a None value is stored as empty bytes."""
    if not isinstance(headers, Mapping | list):
        raise TypeError(f"headers must be a dict or a list of (key, value) tuples, not {type(headers).__name__}")
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"headers: expected a (key, value) tuple, not {item!r}")
        name, data = item
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, not {type(name).__name__}")
        value = optional_bytes(data, f"header {name!r}: value", TypeError)
        out.append((name, b"" if value is None else value))
    return tuple(out)


class Producer(Connecting):
    """confluent-kafka's ``Producer``, storing every record exactly once (module docstring).

    As upstream's, it is a context manager (``with Producer(conf) as p:`` closes it) and
    always true; once closed (or when a subclass never called ``__init__``) every method
    raises ``RuntimeError("Producer has been closed")``.

    Args:
        conf: the configuration dict (see ``_kafka_config.py`` and docs/migration.md).
        **kwargs: configuration given as keyword arguments, as confluent-kafka allows.

    Raises:
        TypeError: no configuration at all, or a callback that is not callable.
        KafkaException: ``_INVALID_ARG`` for an unknown key or an invalid value (named in
            the message), or for ``enable.idempotence=false``.
        ImportError: records go to a Kafka cluster (``bootstrap.servers``, or a ``kafka://``
            ``idempotent.broker.url``) and confluent-kafka is not installed (the message
            names the extra); other targets (``sqlite://``, ...) need no native client.
    """

    _closed = True  # until __init__ has run: a subclass that skips it gets RuntimeError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > 1:
            raise TypeError(f"Producer() takes one configuration dict, {len(args)} given")
        if not args and not kwargs:
            raise TypeError("expected configuration dict")
        if args and not isinstance(args[0], Mapping):
            raise TypeError(f"expected configuration dict, got {type(args[0]).__name__}")
        merged = dict(args[0]) if args else {}
        merged.update(kwargs)
        config = Config(merged)
        if config.kafka and _shared.native(_NATIVE) is None:
            raise _shared.missing_native(_NATIVE, f"a producer writing to the Kafka cluster {config.cluster!r}")
        self._config = config
        self._default_report = config.on_delivery
        self._reports = Reports()
        self._cond = self._reports.cond
        self._early: collections.deque[_Early] = collections.deque()
        self._early_bytes = 0
        self._inner: DropInPort | None = None
        self._opening: DropInPort | None = None
        self._moving = 0
        self._hand_over_lock = threading.Lock()
        self._routes: dict[str, Route] = {}
        self._random = random.Random()
        self._sticky: dict[str, tuple[int, float]] = {}
        #: whether a message without a key goes to its topic's sticky partition (decided once:
        #: the partitioner and linger do not change)
        self._keyless_sticky = librdkafka_partition(self._config.partitioner, None, 1) is None and librdkafka_sticky(
            self._config.partitioner, None, self._config.sticky_linger
        )
        self._clients = _Clients()
        self._stop = self._clients.stop
        self._txn_ready = False
        self._txn_open = False
        self._created = time.monotonic()
        stats_on = config.stats_interval > 0 and config.stats_cb is not None
        self._stats_due = self._created + config.stats_interval if stats_on else None
        self._connector: threading.Thread | None = None
        self._closed = False
        if config.broker is not None:
            self._open(self._connect_inner())
        elif config.target is not None:
            self._connector = threading.Thread(target=self._connect_loop, name="idempotent-connect", daemon=True)
            self._connector.start()
        self._finalizer = weakref.finalize(self, self._clients.release)

    # -- produce -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise _closed_error()

    def _route(self, inner: DropInPort, topic: str) -> Route:
        route = self._routes.get(topic)
        if route is None:
            try:
                route = inner.route(topic)
            except InvalidTopicError as exc:
                raise KafkaException(KafkaError(KafkaError.TOPIC_EXCEPTION, str(exc), cause=exc)) from exc
            except ProducerError as exc:
                raise KafkaException(kafka_error_of(exc, None, False)) from exc
            self._routes[topic] = route
        return route

    def _place(self, route: Route, partition: int, key: bytes | None) -> int:
        """The partition a record goes to: its own, or the configured partitioner's choice.

        Raises:
            KafkaException: ``_UNKNOWN_PARTITION``, a partition the topic does not have.
        """
        count = len(route.buffers)
        if partition == -1:
            return self._choose(route.topic, count, key)
        if not 0 <= partition < count:
            raise KafkaException(
                KafkaError(KafkaError._UNKNOWN_PARTITION, f"topic {route.topic!r} has partitions 0..{count - 1}")
            )
        return partition

    def _choose(self, topic: str, count: int, key: bytes | None) -> int:
        """The partition the configured partitioner picks for ``key``, by librdkafka's rules;
        where librdkafka picks at random, so does this: the topic's sticky partition for
        ``sticky.partitioning.linger.ms`` or a random one per message."""
        if key is not None or not self._keyless_sticky:
            name = self._config.partitioner
            chosen = librdkafka_partition(name, key, count)
            if chosen is not None:
                return chosen
            if not librdkafka_sticky(name, key, self._config.sticky_linger):
                return self._random.randrange(count)
        now = time.monotonic()
        sticky = self._sticky.get(topic)
        if sticky is None or now >= sticky[1] or sticky[0] >= count:
            sticky = self._sticky[topic] = (self._random.randrange(count), now + self._config.sticky_linger)
        return sticky[0]

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: Report | None = None,
        callback: Report | None = None,
        timestamp: int = 0,
        headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
        *,
        sequence: int | None = None,
    ) -> None:
        """Queue a message; its delivery report is served by a later :meth:`poll` or :meth:`flush`.

        ``timestamp`` (milliseconds, 0: now) is stored as the record's own time. Extension:
        ``sequence`` is the application's sequence for the record in its partition (0 ..
        2**63-1, see ``idempotent.Producer.send``): a restarted named producer's resend of a
        stored record is reported as persisted, with the original offset and
        ``msg.duplicate()`` true, and stored once.

        Raises:
            BufferError: ``queue.buffering.max.messages`` or ``.kbytes`` reached; call
                ``poll()`` and produce again.
            KafkaException: ``MSG_SIZE_TOO_LARGE`` (over ``message.max.bytes``),
                ``_UNKNOWN_PARTITION`` (no such partition), ``TOPIC_EXCEPTION`` (bad topic
                name), ``_INVALID_ARG`` (a bad ``sequence``), ``_FATAL`` (the producer failed
                earlier: fenced, ...).
            RuntimeError: the producer is closed.
            TypeError: a value, key, partition, timestamp or header of an unsupported type.
        """
        if self._closed:
            raise _closed_error()
        if type(topic) is not str:
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if type(value) is not bytes:
            value = optional_bytes(value, "value", TypeError)
        if key is not None and type(key) is not bytes:
            key = optional_bytes(key, "key", TypeError)
        if type(partition) is not int or type(timestamp) is not int:
            what = "partition" if type(partition) is not int else "timestamp"
            raise TypeError(f"{what} must be int, not {type(partition if what == 'partition' else timestamp).__name__}")
        report = on_delivery
        if callback is not None:
            if on_delivery is not None and on_delivery is not callback:
                raise TypeError("give on_delivery or callback, not both")
            report = callback
        if report is None:
            report = self._default_report
        elif not callable(report):
            raise TypeError("on_delivery must be callable")
        header_tuple = None if headers is None else _header_tuple(headers)
        size = (0 if value is None else len(value)) + (0 if key is None else len(key))
        if size > self._config.max_message_bytes:
            raise KafkaException(
                KafkaError(
                    KafkaError.MSG_SIZE_TOO_LARGE,
                    f"Message size {size} exceeds message.max.bytes={self._config.max_message_bytes}",
                )
            )
        if self._reports.fatal is not None:
            raise KafkaException(self._fatal_error())
        inner = self._inner
        if inner is None:
            self._produce_early(topic, value, key, partition, report, timestamp, header_tuple, sequence, size)
            return
        route = self._routes.get(topic)
        if route is None:
            route = self._route(inner, topic)
        sticky = self._sticky.get(route.topic) if partition == -1 and key is None and self._keyless_sticky else None
        if sticky is not None and sticky[0] < len(route.buffers) and monotonic() < sticky[1]:
            partition = sticky[0]  # (what _choose answers, without the calls)
        else:
            partition = self._place(route, partition, key)
        try:
            inner.add(
                route,
                partition,
                value,
                key,
                report,
                timestamp or None,
                header_tuple,
                sequence,
                size,
            )
        except QueueFullError:
            raise BufferError(KafkaError(KafkaError._QUEUE_FULL).str()) from None
        except ProducerClosedError:
            raise _closed_error() from None
        except UsageError as exc:
            raise KafkaException(kafka_error_of(exc, None, False)) from exc
        except ProducerError as exc:
            raise KafkaException(
                KafkaError(KafkaError._FATAL, f"producer failed: {exc}", fatal=True, cause=exc)
            ) from exc

    def produce_batch(
        self,
        topic: str,
        messages: list[dict[str, Any]],
        partition: int = -1,
        on_delivery: Report | None = None,
        callback: Report | None = None,
    ) -> int:
        """Queue many messages at once, as confluent-kafka's ``produce_batch``: each a dict
        with ``value``, and optionally ``key``, ``partition``, ``headers`` and ``callback``
        (or ``on_delivery``); other keys are ignored. Each is produced as :meth:`produce`
        would, and gets its own delivery report.

        A message that cannot be queued (full queue, unknown partition, over
        ``message.max.bytes``) is left out and gets its :class:`KafkaError` as
        ``message["_error"]``; the others are queued.

        Returns:
            How many messages were queued.

        Raises:
            TypeError: ``messages`` is not a list of dicts, or a value, key, partition or
                header of the wrong type (nothing queued).
            NotImplementedError: a message with a ``timestamp`` (nothing queued), as upstream.
            KafkaException: ``_FATAL``, the producer failed earlier.
            RuntimeError: the producer is closed.
        """
        self._check_open()
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, not {type(topic).__name__}")
        if not isinstance(messages, list):
            raise TypeError("messages must be a list of dicts")
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise TypeError(f"partition must be int, not {type(partition).__name__}")
        if on_delivery is not None and callback is not None and on_delivery is not callback:
            raise TypeError("give on_delivery or callback, not both")
        default = on_delivery or callback
        checked = []
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise TypeError(f"Message at index {index} must be a dict, not {type(message).__name__}")
            if message.get("timestamp"):
                raise NotImplementedError("Message timestamps are not currently supported in produce_batch")
            value, key = message.get("value"), message.get("key")
            if value is not None and not isinstance(value, bytes | str):
                raise TypeError(f"Message value at index {index} must be bytes or str")
            if key is not None and not isinstance(key, bytes | str):
                raise TypeError(f"Message key at index {index} must be bytes or str")
            target = message.get("partition", partition)
            if not isinstance(target, int) or isinstance(target, bool):
                raise TypeError(f"Message partition at index {index} must be int")
            report = message.get("callback") or message.get("on_delivery") or default
            if report is not None and not callable(report):
                raise TypeError(f"Message callback at index {index} must be callable")
            headers = message.get("headers")
            if headers is not None:
                _header_tuple(headers)  # refused before any message of the batch is queued
            checked.append((message, value, key, target, report, headers))
        queued = 0
        for message, value, key, target, report, headers in checked:
            try:
                self.produce(topic, value, key, target, report, headers=headers)
            except BufferError:
                message["_error"] = KafkaError(KafkaError._QUEUE_FULL)
            except KafkaException as exc:
                if exc.args[0].fatal():
                    raise
                message["_error"] = exc.args[0]
            else:
                queued += 1
        return queued

    def _produce_early(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int,
        report: Report | None,
        timestamp: int,
        headers: Headers | None,
        sequence: int | None,
        size: int,
    ) -> None:
        """Queue a record while the producer connects (see the module docstring); once it
        is open, hand a share of the queued records over first (see ``Connecting._open``)."""
        config = self._config
        opening = self._opening
        if opening is not None and self._hand_over(opening, HAND_OVER_SHARE):
            self.produce(topic, value, key, partition, report, None, timestamp, headers, sequence=sequence)
            return
        with self._cond:
            inner = self._inner
            if inner is None:
                queued = len(self._early) + len(self._reports.ready)
                opening = self._opening
                if opening is not None:  # records handed over wait there
                    queued += opening.unfinished
                if queued >= config.max_messages or (queued and self._early_bytes + size > config.max_bytes):
                    raise BufferError(KafkaError(KafkaError._QUEUE_FULL).str())
                self._early.append(
                    _Early(topic, value, key, partition, report, timestamp, headers, sequence, size, time.monotonic())
                )
                self._early_bytes += size
                return
        # connected meanwhile: the regular path
        self.produce(topic, value, key, partition, report, None, timestamp, headers, sequence=sequence)

    def _fatal_error(self) -> KafkaError:
        fatal = self._reports.fatal
        assert fatal is not None
        return KafkaError(KafkaError._FATAL, f"{fatal.name()}: {fatal.str()}", fatal=True, cause=fatal.cause)

    # -- reports -----------------------------------------------------------------------------

    def poll(self, timeout: float | None = -1) -> int:
        """Serve delivery reports (and ``error_cb`` and ``stats_cb`` events), waiting up to
        ``timeout`` seconds for the first one (None or negative: wait indefinitely).

        Returns:
            How many events were served.

        Raises:
            RuntimeError: the producer is closed.
            Whatever a callback raises (the remaining reports stay queued).
        """
        self._check_open()
        if self._early:
            self._expire_early()
        reports = self._reports
        if (
            timeout == 0
            and not (reports.spans or reports.ready or reports.errors)
            and (self._stats_due is None or time.monotonic() < self._stats_due)
        ):
            # the poll(0) after every produce(): nothing to serve (a report queued meanwhile
            # is served by the next poll, as librdkafka's would be)
            return 0
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        with self._cond:
            while not self._reports.pending():
                now = time.monotonic()
                if self._stats_due is not None and now >= self._stats_due:
                    break
                remaining = None if deadline is None else deadline - now
                if remaining is not None and remaining <= 0:
                    return 0
                if self._stats_due is not None:
                    remaining = self._stats_due - now if remaining is None else min(remaining, self._stats_due - now)
                # short waits, so that a signal (Ctrl-C) interrupts a long poll at once
                self._cond.wait(0.2 if remaining is None else min(remaining, 0.2))
                if self._early:
                    break
        return self._serve()

    def _serve(self) -> int:
        config = self._config
        return self._stats() + self._reports.serve(config.error_cb, config.only_errors)

    def _stats(self) -> int:
        """Call ``stats_cb`` with librdkafka-shaped statistics when they are due."""
        due = self._stats_due
        stats_cb = self._config.stats_cb
        now = time.monotonic()
        if due is None or now < due:
            return 0
        self._stats_due = now + self._config.stats_interval
        if stats_cb is None:
            return 0
        inner = self._inner
        document = {
            "name": f"{self._config.client_id}#producer-{id(self):x}",
            "client_id": self._config.client_id,
            "type": "producer",
            "ts": int(now * 1_000_000),
            "time": int(time.time()),
            "age": int((now - self._created) * 1_000_000),
            "msg_cnt": len(self),
            "msg_size": 0 if inner is None else inner.buffered_bytes,
            "msg_max": self._config.max_messages,
            "msg_size_max": self._config.max_bytes,
            "brokers": {},
            "topics": {},
        }
        stats_cb(json.dumps(document))
        return 1

    def flush(self, timeout: float | None = -1) -> int:
        """Send everything queued, wait for every delivery and serve every report.

        Returns:
            How many messages are still waiting (0 unless ``timeout`` ran out).

        Raises:
            RuntimeError: the producer is closed.
            Whatever a callback raises.
        """
        self._check_open()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        flushing = Flushing(self)
        try:
            while True:
                self._expire_early()
                self._serve()
                with self._cond:
                    waiting = len(self)
                    if waiting == 0:
                        return 0
                    flushing.follow()
                    if not self._reports.pending():
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            return waiting
                        self._cond.wait(0.2 if remaining is None else min(remaining, 0.2))
        finally:
            flushing.end()

    def __len__(self) -> int:
        """Messages produced whose delivery report has not been served yet (0 once closed)."""
        if self._closed:
            return 0
        # while the early records move to the producer being opened, count those it holds
        inner = self._inner if self._inner is not None else self._opening
        early = len(self._early) + self._moving
        return early + len(self._reports.ready) + (0 if inner is None else inner.unfinished)

    def close(self, timeout: float | None = -1) -> bool:
        """Flush (up to ``timeout``), then release the producer. Reports not served by then
        are dropped; messages not yet delivered fail as purged. Closing again does nothing.

        Returns:
            True.

        Raises:
            Whatever a callback raises while flushing (the producer is closed anyway).
        """
        if self._closed:
            return True
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            self._finalizer.detach()
            self._inner = None
            self._clients.release()
        return True

    # -- extensions and the rest of the API --------------------------------------------------

    @property
    def producer(self) -> _Producer:
        """Extension: the underlying :class:`idempotent.Producer` (waits until connected).

        Raises:
            KafkaException: ``_TIMED_OUT``, not connected within ``message.timeout.ms``.
        """
        self._check_open()
        return self._connected(self._config.delivery_timeout_ms / 1000).producer

    def _connected(self, timeout: float) -> DropInPort:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._inner is None:
                if self._reports.fatal is not None:
                    raise KafkaException(self._fatal_error())
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "not connected yet", retriable=True))
                self._cond.wait(min(remaining, 0.2))
            return self._inner

    def last_sequence(self, topic: str, partition: int, timeout: float = 30.0) -> int:
        """Extension: the highest sequence known stored on a partition by this producer (a
        named producer learns it from what earlier instances stored), or -1; waits up to
        ``timeout`` seconds for the connection.

        Raises:
            KafkaException: ``_TIMED_OUT`` (not connected), ``TOPIC_EXCEPTION`` (bad name).
        """
        self._check_open()
        try:
            return self._connected(timeout).producer.last_sequence(topic, partition)
        except InvalidTopicError as exc:
            raise KafkaException(KafkaError(KafkaError.TOPIC_EXCEPTION, str(exc), cause=exc)) from exc

    def __bool__(self) -> bool:
        return True

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._closed:
            self.close()

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Fail the messages not sent yet with ``_PURGE_QUEUE`` (their reports are served by
        the next ``poll``/``flush``), as librdkafka does. ``in_flight``: messages already
        on their way are not recalled here; they end as they end. ``blocking`` has no effect.

        Raises:
            RuntimeError: the producer is closed.
            TypeError: a flag that is not a bool.
        """
        self._check_open()
        for name, flag in (("in_queue", in_queue), ("in_flight", in_flight), ("blocking", blocking)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool")
        if not in_queue:
            return
        self._fail_early(KafkaError(KafkaError._PURGE_QUEUE))
        inner = self._inner
        if inner is not None:
            inner.purge(ProducerClosedError("purged before it was sent"))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """The cluster's metadata, as confluent-kafka returns it (a Kafka target only).

        Raises:
            KafkaException: ``_TRANSPORT``/``_TIMED_OUT`` (no answer), ``_NOT_IMPLEMENTED``
                (records go to another kind of broker).
        """
        self._check_open()
        native = _shared.native(_NATIVE)
        if native is None or not (self._config.kafka or (self._config.target is None and self._config.broker is None)):
            raise KafkaException(
                KafkaError(
                    KafkaError._NOT_IMPLEMENTED, "list_topics() is for a Kafka cluster; use the broker's topics()"
                )
            )
        return self._probe(native).list_topics(topic, timeout)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Accepted without effect: the producer's clients keep the credentials they were
        opened with.

        Raises:
            TypeError: username or password is not a str.
            RuntimeError: the producer is closed.
        """
        self._check_open()
        if not isinstance(username, str) or not isinstance(password, str):
            raise TypeError("set_sasl_credentials: username and password must be str")
        _LOG.info("set_sasl_credentials() is accepted without effect: the clients keep their credentials")

    # -- transactions ------------------------------------------------------------------------

    def init_transactions(self, timeout: float = -1) -> None:
        """Wait until the producer is connected (its older instances fenced), as librdkafka's
        ``init_transactions`` does; records are stored exactly once without transactions.

        Raises:
            KafkaException: ``_TIMED_OUT`` (retriable) when not connected within ``timeout``.
        """
        self._check_open()
        self._connected(timeout if timeout is not None and timeout >= 0 else 2**31)
        self._txn_ready = True

    def _transactional(self, name: str) -> DropInPort:
        """The port of the inner producer for a transactional call, once ``init_transactions`` succeeded.

        Raises:
            KafkaException: ``_CONFLICT`` (retriable) before ``init_transactions``, as
                librdkafka; ``_FATAL`` after a fatal error.
        """
        self._check_open()
        if not self._txn_ready:  # as librdkafka answers before init_transactions
            raise KafkaException(
                KafkaError(
                    KafkaError._CONFLICT,  # type: ignore[attr-defined]
                    f"{name}() needs init_transactions() to succeed first",
                    retriable=True,
                )
            )
        if self._reports.fatal is not None:
            raise KafkaException(self._fatal_error())
        inner = self._inner
        assert inner is not None  # connected by init_transactions
        return inner

    def _txn_failed(self, name: str, exc: ProducerError) -> KafkaException:
        """librdkafka's error for a transactional call that failed with ``exc`` (KIP-1050's
        classes: retriable, abortable, fatal, or an application error)."""
        if isinstance(exc, TransactionStateError):
            return KafkaException(KafkaError(KafkaError._STATE, f"{name}: {exc}", cause=exc))
        if isinstance(exc, TransactionAbortableError):
            return KafkaException(
                KafkaError(KafkaError._TRANSPORT, f"{name}: {exc}", txn_requires_abort=True, cause=exc)
            )
        if isinstance(exc, ProducerFencedError):
            self._txn_open = False
            return KafkaException(KafkaError(KafkaError._FENCED, f"{name}: {exc}", fatal=True, cause=exc))
        if exc.retriable:
            return KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{name}: {exc}", retriable=True, cause=exc))
        return KafkaException(KafkaError(KafkaError._FATAL, f"{name}: {exc}", fatal=True, cause=exc))

    def _txn_timeout(self, timeout: float | None) -> float | None:
        return None if timeout is None or timeout < 0 else timeout

    def begin_transaction(self) -> None:
        """Begin a transaction (docs/migration.md, "Transactions"): every message produced
        until ``commit_transaction`` or ``abort_transaction`` is stored with it or not at all.
        Delivery reports come as librdkafka's do: once each message is acknowledged (inside
        the transaction), served by ``poll``/``flush``.

        Raises:
            KafkaException: ``_STATE`` before ``init_transactions`` or while one is open;
                ``_FENCED`` (fatal) when a newer instance took the ``transactional.id`` over.
        """
        inner = self._transactional("begin_transaction")
        if self._txn_open:
            raise KafkaException(
                KafkaError(KafkaError._STATE, "begin_transaction: Operation not valid in state InTransaction")
            )
        if not callable(getattr(inner.producer.broker, "begin_transaction", None)):
            raise KafkaException(
                KafkaError(
                    KafkaError._NOT_IMPLEMENTED,
                    "begin_transaction() needs a Kafka cluster (bootstrap.servers, or a kafka://, sqlite:// "
                    "or memory:// idempotent.broker.url): this target has no transactions yet; every record "
                    "is still stored exactly once without them",
                )
            )
        try:
            # a broker that holds the transaction's messages until the commit reports them
            # then (their offsets are not known before); Kafka reports each once acknowledged
            inner.begin_transaction(hold_reports=bool(getattr(inner.producer.broker, "holds_transactions", False)))
        except ProducerError as exc:
            raise self._txn_failed("begin_transaction", exc) from exc
        self._txn_open = True

    def send_offsets_to_transaction(self, positions: Any, group_metadata: Any, timeout: float = -1) -> None:
        """Commit the consumer group's ``positions`` (``consumer.position(...)``) with the
        open transaction, through the producer's own transactional Kafka client, so the
        group's committed offsets move exactly when the output commits.

        Raises:
            KafkaException: ``_STATE`` (no transaction open), abortable
                (``txn_requires_abort()``), retriable ``_TIMED_OUT``, ``_FENCED`` (fatal).
        """
        inner = self._transactional("send_offsets_to_transaction")
        if not self._txn_open:
            raise KafkaException(
                KafkaError(KafkaError._STATE, "send_offsets_to_transaction: Operation not valid in state Ready")
            )
        wait = self._txn_timeout(timeout)
        try:
            inner.producer.send_offsets_to_transaction(positions, group_metadata, 60.0 if wait is None else wait)
        except ProducerError as exc:
            raise self._txn_failed("send_offsets_to_transaction", exc) from exc

    def commit_transaction(self, timeout: float = -1) -> None:
        """Flush (serving the delivery reports), then commit the open transaction.

        Raises:
            KafkaException: ``_STATE`` (no transaction open); retriable ``_TIMED_OUT`` (call
                again: it resumes); abortable (``txn_requires_abort()``: call
                ``abort_transaction``); ``_FENCED`` (fatal).
        """
        inner = self._transactional("commit_transaction")
        if not self._txn_open:
            raise KafkaException(
                KafkaError(KafkaError._STATE, "commit_transaction: Operation not valid in state Ready")
            )
        wait = self._txn_timeout(timeout)
        if self.flush(-1 if wait is None else wait):
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    "commit_transaction: messages not delivered within the timeout",
                    retriable=True,
                )
            )
        try:
            inner.producer.commit_transaction(None, wait)
        except ProducerError as exc:
            raise self._txn_failed("commit_transaction", exc) from exc
        self._txn_open = False

    def abort_transaction(self, timeout: float = -1) -> None:
        """Abort the open transaction: messages not sent yet fail with ``_PURGE_QUEUE``, and
        nothing of it is visible to ``read_committed`` consumers.

        Raises:
            KafkaException: ``_STATE`` (no transaction open), ``_FENCED`` (fatal).
        """
        inner = self._transactional("abort_transaction")
        if not self._txn_open:
            raise KafkaException(KafkaError(KafkaError._STATE, "abort_transaction: Operation not valid in state Ready"))
        self.purge(in_queue=True)
        try:
            inner.producer.abort_transaction()
        except ProducerError as exc:
            raise self._txn_failed("abort_transaction", exc) from exc
        finally:
            self._serve()
        self._txn_open = False


@final
class Flushing:
    """One flush of a drop-in :class:`Producer`: the producer it owns sends everything at once
    (:meth:`DropInPort.begin_flush <idempotent.producer.dropin.DropInPort.begin_flush>`) from
    now, or, while it is still connecting, from the moment :meth:`follow` finds it connected,
    until :meth:`end`. The caller waits for the reports itself (``Producer.flush`` in its
    thread, ``AIOProducer.flush`` on its loop). Raises nothing.
    """

    __slots__ = ("_owner", "_port")

    def __init__(self, owner: Producer) -> None:
        self._owner = owner
        self._port = owner._inner
        if self._port is not None:
            self._port.begin_flush()

    def follow(self) -> None:
        """Flush the owner's producer too if it connected since this flush began."""
        if self._port is None:
            port = self._owner._inner
            if port is not None:
                self._port = port
                port.begin_flush()

    def end(self) -> None:
        """End the flush: the producer's buffers linger again (unless another flush runs)."""
        port, self._port = self._port, None
        if port is not None:
            port.end_flush()


@final
class LoopHooks:
    """What the asyncio producer (``_kafka_aio.AIOProducer``) drives of the drop-in
    :class:`Producer` it wraps beyond its confluent-kafka API: it serves the reports on its
    event loop, and waits there, instead of in a thread.

    Args:
        producer: the drop-in producer the asyncio one owns.
    """

    __slots__ = ("_producer",)

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def wake_on_report(self, wake: Callable[[], None] | None) -> None:
        """Have ``wake()`` called after each delivery report or error is queued, from the
        thread that queued it, without the producer's lock (None: nothing is called). It must
        return at once and not raise (the loop's ``call_soon_threadsafe``). Raises nothing."""
        self._producer._reports.wake = wake

    @property
    def message_timeout(self) -> float:
        """``message.timeout.ms``, in seconds: how long a record may wait for room in a full
        queue before it fails with ``_QUEUE_FULL``."""
        return self._producer._config.delivery_timeout_ms / 1000

    def flushing(self) -> Flushing:
        """Start one flush (see :class:`Flushing`); the caller ends it. Raises nothing."""
        return Flushing(self._producer)


#: a confluent-kafka serializer: ``serializer(obj, ctx) -> bytes``
Serializer = Callable[[Any, Any], Any]


def _serialized(
    serializer: Serializer,
    data: Any,
    topic: str,
    headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
    field: str,
) -> Any:
    """A message's key or value (``field`` is ``KEY`` or ``VALUE``) through its serializer,
    with confluent-kafka's ``SerializationContext`` when it is installed (else None).

    Raises:
        KeySerializationError, ValueSerializationError: the serializer failed (confluent-kafka's
            classes when it is installed, else :class:`KafkaException` with the code
            ``_KEY_SERIALIZATION`` or ``_VALUE_SERIALIZATION``).
    """
    serialization = _shared.native(_NATIVE + ".serialization")
    ctx = (
        None
        if serialization is None
        else serialization.SerializationContext(topic, getattr(serialization.MessageField, field), headers)
    )
    try:
        return serializer(data, ctx)
    except Exception as exc:  # the application's serializer failed (not ours): confluent-kafka
        # wraps whatever it raised in its serialization error, which is terminal, never retriable
        native_errors = _shared.native(_NATIVE + ".error")
        if native_errors is None:
            code = getattr(KafkaError, f"_{field}_SERIALIZATION")
            raise KafkaException(KafkaError(code, str(exc))) from exc
        raise getattr(native_errors, f"{field.title()}SerializationError")(exception=exc) from exc


class SerializingProducer(Producer):
    """confluent-kafka's ``SerializingProducer``, exactly-once: ``key.serializer`` and
    ``value.serializer`` in the configuration (confluent-kafka's serializers, or any
    ``callable(obj, ctx) -> bytes``) turn keys and values into bytes before
    :meth:`Producer.produce`.

    Raises:
        TypeError, KafkaException: as :class:`Producer`.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        if not isinstance(conf, Mapping):
            raise TypeError(f"expected configuration dict, got {type(conf).__name__}")
        rest = dict(conf)
        self._key_serializer: Serializer | None = rest.pop("key.serializer", None)
        self._value_serializer: Serializer | None = rest.pop("value.serializer", None)
        super().__init__(rest)

    def produce(  # type: ignore[override]
        self,
        topic: str,
        key: Any = None,
        value: Any = None,
        partition: int = -1,
        on_delivery: Report | None = None,
        timestamp: int = 0,
        headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    ) -> None:
        """Serialize ``key`` and ``value``, then produce as :meth:`Producer.produce` does.

        Raises:
            KeySerializationError, ValueSerializationError: a serializer failed (confluent-kafka's
                classes when it is installed, else :class:`KafkaException`); nothing queued.
            As :meth:`Producer.produce` otherwise.
        """
        self._check_open()
        if self._key_serializer is not None:
            key = _serialized(self._key_serializer, key, topic, headers, "KEY")
        if self._value_serializer is not None:
            value = _serialized(self._value_serializer, value, topic, headers, "VALUE")
        super().produce(topic, value, key, partition, on_delivery=on_delivery, timestamp=timestamp, headers=headers)


__all__ = ["Producer", "Report", "SerializingProducer"]
