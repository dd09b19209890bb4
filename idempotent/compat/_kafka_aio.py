"""confluent-kafka's ``confluent_kafka.aio.AIOProducer``, exactly-once.

``idempotent.compat.confluent_kafka.aio`` is this module: :class:`AIOProducer` is the drop-in's,
built on the drop-in :class:`~idempotent.compat._kafka_producer.Producer` (so ``transactional.id``
names it and a restart keeps its identity, as the synchronous drop-in does); the rest of
confluent-kafka's ``aio`` (``AIOConsumer``, ``AsyncDeserializingConsumer``) is passed through.
``AsyncSerializingProducer`` is passed through too, with a WARNING once: it is confluent-kafka's
own producer and gives no exactly-once.

How records travel: ``await produce(...)`` appends the record to the drop-in's column buffer on
the event loop's thread (no executor hop, no closure: the record's future is its own delivery
callback) and returns an :class:`asyncio.Future` of its delivered message. The drop-in's sender
thread wakes the loop once per ended span of records (``Reports.wake``), and the loop serves
the span's reports itself, setting each future there: one thread hand-off per span, none per
record. Blocking calls (``flush``'s wait, ``list_topics``, the transactional calls) run in the
producer's executor, as upstream's do.

Transactions: the transactional methods are thin wrappers of the synchronous drop-in's
(``_call`` in the executor, after an ``await self.flush()`` where upstream flushes first), so
they give exactly what the drop-in's ``Producer`` gives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import idempotent.runtime.native_logs as clientlogs

from . import _shared
from ._kafka_errors import KafkaError, KafkaException
from ._kafka_producer import LoopHooks, Producer

_LOG = logging.getLogger("idempotent.compat.confluent_kafka")
_NATIVE = "confluent_kafka.aio"


class _Delivery(asyncio.Future):  # type: ignore[type-arg]
    """A record's future, and its delivery callback: ``self(err, msg)`` settles it (on the
    loop's thread directly, from any other thread through ``call_soon_threadsafe``)."""

    def __call__(self, error: KafkaError | None, message: Any) -> None:
        loop = self.get_loop()
        if loop._thread_id == threading.get_ident():  # type: ignore[attr-defined]
            self._settle(error, message)
        else:
            loop.call_soon_threadsafe(self._settle, error, message)

    def _settle(self, error: KafkaError | None, message: Any) -> None:
        if self.done():
            return
        if error is not None:
            self.set_exception(KafkaException(error))
        else:
            self.set_result(message)


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any]) -> Callable[..., Any]:
    """``error_cb``/``stats_cb``/``throttle_cb`` as upstream's AIOProducer takes them: a
    coroutine function runs as a task on the loop, a plain function is called."""

    def call(*args: Any) -> None:
        result = callback(*args)
        if inspect.isawaitable(result):
            if loop._thread_id == threading.get_ident():  # type: ignore[attr-defined]
                loop.create_task(result)  # type: ignore[arg-type]
            else:
                asyncio.run_coroutine_threadsafe(result, loop)  # type: ignore[arg-type]

    return call


class AIOProducer:
    """confluent-kafka's ``AIOProducer``, storing every record exactly once (module docstring).

    Args:
        producer_conf: the configuration dict, as for the drop-in ``Producer``
            (``transactional.id`` names the producer); ``error_cb``, ``stats_cb`` and
            ``throttle_cb`` may be coroutine functions, as upstream's.
        max_workers, executor: the executor for the blocking calls (a
            ``ThreadPoolExecutor(max_workers)`` of its own unless given).
        batch_size, buffer_timeout: accepted for upstream's signature; the records are
            batched by the producer's own ``linger.ms`` and ``batch.size`` instead.

    Raises:
        RuntimeError: no running event loop (as upstream).
        TypeError, KafkaException: as the drop-in ``Producer`` raises them.
    """

    def __init__(
        self,
        producer_conf: dict[str, Any],
        max_workers: int = 4,
        executor: concurrent.futures.Executor | None = None,
        batch_size: int = 1000,
        buffer_timeout: float = 1.0,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.executor = executor if executor is not None else concurrent.futures.ThreadPoolExecutor(max_workers)
        self._owns_executor = executor is None
        conf = dict(producer_conf)
        for name in ("error_cb", "stats_cb", "throttle_cb"):
            if callable(conf.get(name)):
                conf[name] = _on_loop(self._loop, conf[name])
        self._is_closed = False
        self._producer = Producer(conf)
        self._wake_pending = False
        self._woken: asyncio.Event | None = None
        self._hooks = LoopHooks(self._producer)
        self._hooks.wake_on_report(self._wake)

    # -- the loop's side of delivery reports -------------------------------------------------

    def _wake(self) -> None:
        """Called by the drop-in (any thread) when a report is queued: serve on the loop,
        once per burst."""
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._serve)
        except RuntimeError:  # the loop is closed: nothing waits any more
            self._wake_pending = False

    def _serve(self) -> None:
        self._wake_pending = False
        if self._is_closed:
            return
        self._producer.poll(0)
        if self._woken is not None:
            self._woken.set()

    async def _woken_or(self, remaining: float | None) -> None:
        """Wait until reports are served on the loop, ``remaining`` seconds or 0.2 s (so that
        records queued while connecting are expired by the next poll) at most."""
        self._woken = woken = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), 0.2 if remaining is None else min(remaining, 0.2))

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> AIOProducer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush, then close the producer and its executor (if its own).

        Raises:
            Whatever a delivery callback raises while flushing (the producer is closed anyway).
        """
        if self._is_closed:
            return
        try:
            await self.flush()
        finally:
            self._is_closed = True
            await self._call(self._producer.close, 0)
            if self._owns_executor:
                await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown, True)

    def __len__(self) -> int:
        """Messages produced whose delivery has not been reported yet (0 once closed)."""
        return 0 if self._is_closed else len(self._producer)

    @property
    def producer(self) -> Producer:
        """Extension: the drop-in ``Producer`` underneath."""
        return self._producer

    # -- producing ---------------------------------------------------------------------------

    async def produce(self, topic: str, value: Any = None, key: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Queue a message; return an :class:`asyncio.Future` that resolves to its delivered
        message, or raises ``KafkaException`` with its :class:`KafkaError` (and the message's
        ``MessageStatus``) when it failed. ``partition``, ``timestamp``, ``headers`` and the
        extension ``sequence`` are taken as the drop-in's ``produce`` takes them (headers
        work here, where upstream's AIOProducer refuses them).

        While the queue is full (``queue.buffering.max.messages``), waits for room up to
        ``message.timeout.ms``, then the future fails with ``_QUEUE_FULL``, as upstream's.

        Raises:
            RuntimeError: the producer is closed.
            TypeError, KafkaException: a bad argument, as the drop-in's ``produce``.
        """
        if self._is_closed:
            raise RuntimeError("Producer has been closed")
        for name in ("on_delivery", "callback"):
            if kwargs.get(name) is not None:
                raise TypeError(f"AIOProducer.produce() takes no {name}: await the future it returns")
        future = _Delivery(loop=self._loop)
        producer = self._producer
        deadline = None
        delay = 0.001
        while True:
            try:
                producer.produce(topic, value, key, *args, on_delivery=future, **kwargs)  # type: ignore[misc]
                return future
            except BufferError:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._hooks.message_timeout
                elif now >= deadline:
                    future.set_exception(KafkaException(KafkaError(KafkaError._QUEUE_FULL)))
                    return future
                self._serve()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)

    async def poll(self, timeout: float = 0, *args: Any, **kwargs: Any) -> int:
        """Serve delivery reports and events on the loop, waiting up to ``timeout`` seconds
        (negative: for ever) for the first. Returns how many were served."""
        served = int(self._producer.poll(0))
        if served or timeout == 0:
            return served
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return 0
            await self._woken_or(remaining)
            served = int(self._producer.poll(0))
            if served:
                return served

    async def flush(self, timeout: float = -1, *args: Any, **kwargs: Any) -> int:
        """Send everything queued and wait (on the loop) until every delivery is reported.

        Returns:
            How many messages are still waiting (0 unless ``timeout`` ran out).
        """
        producer = self._producer
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        flushing = self._hooks.flushing()
        try:
            while True:
                producer.poll(0)
                waiting = len(producer)
                if waiting == 0:
                    return 0
                flushing.follow()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return waiting
                await self._woken_or(remaining)
        finally:
            flushing.end()

    async def purge(self, *args: Any, **kwargs: Any) -> None:
        """Fail the messages not sent yet with ``_PURGE_QUEUE`` (their futures raise)."""
        self._producer.purge(*args, **kwargs)
        self._producer.poll(0)

    async def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._producer.list_topics, *args, **kwargs)

    async def cluster_id(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._producer.list_topics, None, *args, **kwargs)

    async def set_sasl_credentials(self, *args: Any, **kwargs: Any) -> None:
        self._producer.set_sasl_credentials(*args, **kwargs)

    # -- transactions: thin wrappers of the drop-in's -----------------------------------------

    async def init_transactions(self, *args: Any, **kwargs: Any) -> None:
        await self._call(self._producer.init_transactions, *args, **kwargs)

    async def begin_transaction(self, *args: Any, **kwargs: Any) -> None:
        await self.flush()
        await self._call(self._producer.begin_transaction, *args, **kwargs)

    async def send_offsets_to_transaction(self, *args: Any, **kwargs: Any) -> None:
        await self._call(self._producer.send_offsets_to_transaction, *args, **kwargs)

    async def commit_transaction(self, *args: Any, **kwargs: Any) -> None:
        await self.flush()
        await self._call(self._producer.commit_transaction, *args, **kwargs)

    async def abort_transaction(self, *args: Any, **kwargs: Any) -> None:
        await self.flush()
        await self._call(self._producer.abort_transaction, *args, **kwargs)

    async def _call(self, blocking: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``blocking(*args, **kwargs)`` in the executor (reports it serves there settle
        their futures on the loop, see :class:`_Delivery`)."""
        return await self._loop.run_in_executor(self.executor, lambda: blocking(*args, **kwargs))


def __getattr__(name: str) -> Any:
    """The rest of confluent-kafka's ``aio`` (``AIOConsumer``, ...), passed through."""
    value = _shared.passed_through(_NATIVE, name)
    if name == "AsyncSerializingProducer":
        _shared.warn_passed_through(_LOG.name, "confluent_kafka.aio.AsyncSerializingProducer", "confluent-kafka")
    return clientlogs.route_kafka_attribute(value)


__all__ = ["AIOProducer"]
