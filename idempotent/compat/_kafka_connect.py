"""How the confluent-kafka drop-in connects: in the background, as librdkafka does.

librdkafka's ``Producer()`` never waits for its cluster: it connects in the background,
``produce()`` queues meanwhile, ``error_cb`` hears about the brokers it cannot reach, and
messages that wait longer than ``message.timeout.ms`` fail with ``_MSG_TIMED_OUT``. The drop-in
does the same: a connector thread asks the cluster for its metadata through a plain client
(whose errors go to ``error_cb`` as librdkafka's own), then opens this project's producer and
hands it the records queued meanwhile, in order. :class:`Connecting` is that part of the
drop-in's :class:`~idempotent.compat._kafka_producer.Producer`.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from typing import Any, NamedTuple

from idempotent.core.records import Headers
from idempotent.producer.dropin import DropInPort, Route
from idempotent.producer.producer import Producer as _Producer
from idempotent.runtime.native_logs import LIBRDKAFKA_LOG

from ..errors import ProducerError, QueueFullError
from . import _shared
from ._kafka_config import Config
from ._kafka_errors import KafkaError, KafkaException, MessageStatus, kafka_error_of
from ._kafka_message import TIMESTAMP_CREATE_TIME, Message
from ._kafka_reports import Report, Reports

_NATIVE = "confluent_kafka"
#: early records a ``produce`` call hands over while the producer opens (see Connecting._open)
HAND_OVER_SHARE = 1000
#: seconds the connector waits when the opened producer's buffer is full, before trying again
HAND_OVER_RETRY = 0.01


class _Early(NamedTuple):
    """A record produced before the producer was connected."""

    topic: str
    value: bytes | None
    key: bytes | None
    partition: int
    report: Report | None
    timestamp: int
    headers: Headers | None
    sequence: int | None
    size: int
    created: float


class _Clients:
    """What a producer must release when it is closed or collected: its connector's stop
    flag, this project's producer and the plain client that probes the cluster."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.inner: DropInPort | None = None
        self.probe: Any = None
        #: the URL of the process's shared broker this producer holds a reference to
        self.shared: str | None = None

    def release(self) -> None:
        self.stop.set()
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.producer.close(0)
        shared, self.shared = self.shared, None
        if shared is not None:
            _shared.release(shared)
        probe, self.probe = self.probe, None
        if probe is not None:
            probe.flush(0)


class Connecting:
    """The connector of the drop-in producer (see the module docstring)."""

    _config: Config
    _reports: Reports
    _cond: threading.Condition
    _early: collections.deque[_Early]
    _early_bytes: int  # the sizes of the records in ``_early``, kept as they come and go
    #: the port of the producer records go to, once it is open (and the early records are in it)
    _inner: DropInPort | None
    #: the port of the producer being opened: the early records are being handed to it
    _opening: DropInPort | None
    #: early records taken from ``_early`` and not yet in ``_opening`` (nor failed), so that
    #: ``len()`` (and so ``flush()``) counts a record while it moves
    _moving: int
    _hand_over_lock: threading.Lock
    _clients: _Clients
    _stop: threading.Event

    def _route(self, inner: DropInPort, topic: str) -> Route:
        raise NotImplementedError

    def _place(self, route: Route, partition: int, key: bytes | None) -> int:
        raise NotImplementedError

    def _connect_inner(self) -> DropInPort:
        """Open this project's producer on the configured target (blocking), with the
        drop-in's span listener, and return its port.

        Raises:
            ProducerError: it could not be opened (retriable ones are retried by the caller).
        """
        from idempotent.broker.direct import (
            direct_scheme,  # with the checker and the log's client: on the connecting thread
        )

        config = self._config
        target: Any = config.broker
        shared: str | None = None
        if target is None:
            assert config.target is not None
            if direct_scheme(config.target):
                target = config.target  # a producer of its own, writing into the cluster itself
            else:  # one broker per URL in this process, as every producer on it must share
                target = shared = config.target
                target = _shared.acquire(config.target)
        try:
            inner = self._open_inner(target)
        except BaseException:
            if shared is not None:
                _shared.release(shared)
            raise
        self._clients.shared = shared
        port = DropInPort(inner)
        port.listen(functools.partial(self._reports.ended, port))
        return port

    def _open_inner(self, target: Any) -> _Producer:
        config = self._config
        return _Producer(
            target,
            config.producer_name,
            max_in_flight=config.max_in_flight,
            linger_ms=config.linger_ms,
            batch_size=config.batch_size,
            max_batch_records=config.max_batch_records,
            request_timeout_ms=config.request_timeout_ms,
            delivery_timeout_ms=config.delivery_timeout_ms,
            max_buffered_records=config.max_messages,
            max_buffered_bytes=config.max_bytes,
            **config.connect_options(),
        )

    def _connect_loop(self) -> None:
        """The connector thread: wait until the cluster answers (reporting what librdkafka
        reports meanwhile), open the producer, hand the early records over."""
        delay = 0.1
        while not self._stop.is_set():
            self._expire_early()
            if self._config.kafka and not self._cluster_answers():
                continue
            try:
                inner = self._connect_inner()
            except ProducerError as exc:
                error = kafka_error_of(exc, None, None)
                if not exc.retriable:  # the producer cannot start: fatal, whatever the error's kind
                    error = KafkaError(error.code(), error.str(), fatal=True, retriable=False, cause=exc)
                self._reports.error(error)
                if not exc.retriable:
                    self._fail_early(error)
                    with self._cond:
                        self._reports.fatal = self._reports.fatal or error
                    return
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            if self._stop.is_set():
                inner.producer.close(0)
                return
            self._open(inner)
            return

    def _cluster_answers(self) -> bool:
        """Ask the cluster for its metadata through a plain client, whose errors go to
        ``error_cb`` as librdkafka's do; False (after about a second) while it does not answer."""
        native = _shared.native(_NATIVE)
        if native is None:
            return True  # the backend reports what is wrong
        probe = self._probe(native)
        try:
            probe.list_topics(timeout=1.0)
        except native.KafkaException:
            probe.poll(0)
            self._stop.wait(0.1)
            return False
        return True

    def _probe(self, native: Any) -> Any:
        """The plain client that asks the cluster for metadata, made on first use; it stays
        usable by the caller even if the producer is closed meanwhile."""
        with self._cond:
            probe = self._clients.probe
            if probe is None:
                settings = {
                    **self._config.connection,
                    "bootstrap.servers": self._config.cluster or self._config.bootstrap or "",
                }
                settings["error_cb"] = self._probe_error
                settings["logger"] = self._config.logger or LIBRDKAFKA_LOG
                probe = self._clients.probe = native.Producer(settings)
            return probe

    def _probe_error(self, error: Any) -> None:
        self._reports.error(KafkaError(error.code(), error.str(), error.fatal(), error.retriable()))

    def _open(self, inner: DropInPort) -> None:
        """Hand the early records to ``inner`` in order, then let ``produce`` use it. While
        this runs, ``produce`` hands over up to ``HAND_OVER_SHARE`` of them on each call,
        so an application that produces without pause still reaches ``inner``; when
        ``inner``'s buffer is full, the rest waits (in order) until it has room."""
        with self._cond:
            self._opening = inner
        while not self._hand_over(inner, None):
            if self._stop.wait(HAND_OVER_RETRY):
                break
        if self._stop.is_set():  # closed meanwhile, perhaps before ``inner`` was known to it
            inner.producer.close(0)

    def _hand_over(self, inner: DropInPort, limit: int | None) -> bool:
        """Move up to ``limit`` early records (None: all) to ``inner``, oldest first, one
        mover at a time; when none is left, ``inner`` takes every later record. Returns
        whether it does. A record ``inner`` refuses for lack of room goes back first in line,
        and the move stops there (False); one refused for another reason fails alone."""
        with self._hand_over_lock:
            moved = 0
            while True:
                with self._cond:
                    if self._inner is not None:
                        return True
                    if not self._early:
                        self._inner = self._clients.inner = inner
                        self._opening = None
                        self._cond.notify_all()
                        return True
                    if limit is not None and moved >= limit:
                        return False
                    early = self._early.popleft()
                    self._early_bytes -= early.size
                    self._moving += 1
                try:
                    route = self._route(inner, early.topic)
                    partition = self._place(route, early.partition, early.key)
                    inner.add(
                        route,
                        partition,
                        early.value,
                        early.key,
                        early.report,
                        early.timestamp or None,
                        early.headers,
                        early.sequence,
                        early.size,
                    )
                except QueueFullError:
                    with self._cond:
                        self._early.appendleft(early)
                        self._early_bytes += early.size
                        self._moving -= 1
                    return False
                except (ProducerError, KafkaException) as exc:
                    error = exc.args[0] if isinstance(exc, KafkaException) else kafka_error_of(exc, None, False)
                    self._report_early(early, error, MessageStatus.NOT_PERSISTED)
                with self._cond:
                    self._moving -= 1
                moved += 1

    def _expire_early(self) -> None:
        """Fail early records older than ``message.timeout.ms`` with ``_MSG_TIMED_OUT``."""
        limit = time.monotonic() - self._config.delivery_timeout_ms / 1000
        expired: list[_Early] = []
        with self._cond:
            while self._early and self._early[0].created <= limit:
                expired.append(self._early.popleft())
                self._early_bytes -= expired[-1].size
        for early in expired:
            self._report_early(early, KafkaError(KafkaError._MSG_TIMED_OUT), MessageStatus.NOT_PERSISTED)

    def _fail_early(self, error: KafkaError) -> None:
        with self._cond:
            early, self._early = list(self._early), collections.deque()
            self._early_bytes = 0
        for item in early:
            self._report_early(item, error, MessageStatus.NOT_PERSISTED)

    def _report_early(self, early: _Early, error: KafkaError, status: MessageStatus) -> None:
        """Queue the failure report of a record that never reached the producer."""
        message = Message(
            early.topic,
            early.partition,
            -1,
            early.key,
            early.value,
            None if early.headers is None else list(early.headers),
            error,
            (TIMESTAMP_CREATE_TIME, early.timestamp or int(time.time() * 1000)),
            time.monotonic() - early.created,
        )
        message._status = status
        self._reports.failed(early.report, message)


__all__ = ["Connecting"]
