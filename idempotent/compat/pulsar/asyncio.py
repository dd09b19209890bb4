"""pulsar-client's ``pulsar.asyncio``, exactly-once: ``from idempotent.compat.pulsar.asyncio
import Client, Producer``.

:class:`Client` wraps the drop-in's :class:`~idempotent.compat.pulsar.Client` (same service
URLs, same arguments); ``await client.create_producer(...)`` takes pulsar-client's asyncio
arguments (batching on by default, as there) and returns a :class:`Producer` over the drop-in's
producer, so ``producer_name`` keeps the producer's identity across restarts as the synchronous
drop-in does. ``await producer.send(...)`` returns the message's id once it is stored (a
duplicate's: the original's), or raises :class:`PulsarException` (pulsar-client's asyncio
class when it is installed) with the message's ``Result``. As in pulsar-client, each send has
one future, settled on the loop through one ``call_soon_threadsafe`` from the producer's
sender thread; with ``block_if_queue_full`` a full queue waits on the loop, not in its thread.

``subscribe`` and ``create_reader`` go to pulsar-client's own asyncio client on a Pulsar
service URL (consumers and readers pass through); on other URLs they raise
``OperationNotSupported``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from .. import _shared
from ._client import Client as _Client
from ._consuming import shown, subscribed
from ._errors import OperationNotSupported, ProducerQueueIsFull, Result
from ._errors import PulsarException as _DropInException
from ._producer import LoopHooks
from ._producer import Producer as _Producer

_NATIVE = "pulsar.asyncio"


def _exception_class() -> type[Exception]:
    module = _shared.native(_NATIVE)
    if module is not None:
        native: type[Exception] = module.PulsarException
        return native
    return PulsarException


class PulsarException(Exception):
    """pulsar-client's asyncio ``PulsarException`` (used when pulsar-client is not installed;
    with it, pulsar-client's own class is raised): ``error()`` is the :class:`Result`."""

    def __init__(self, result: Any, msg: str | None = None) -> None:
        super().__init__(result, msg)
        self._result = result
        self._msg = msg

    def error(self) -> Any:
        return self._result

    def __str__(self) -> str:
        name = getattr(self._result, "name", str(self._result))
        value = getattr(self._result, "value", "")
        return f"{value} {name}: {self._msg}" if self._msg else f"{value} {name}"


if _shared.native(_NATIVE) is not None:  # what applications catch: pulsar-client's own class
    PulsarException = _shared.native(_NATIVE).PulsarException  # type: ignore[misc, union-attr]


def _async_error(exc: _DropInException) -> Exception:
    """The asyncio exception for a drop-in one (its ``Result``, message and cause kept)."""
    result = exc.result()
    native = _shared.native("pulsar")
    if native is not None and not isinstance(result, native.Result):
        result = native.Result(int(result))
    error = _exception_class()(result, str(exc))
    error.__cause__ = exc
    return error


def _settle(future: asyncio.Future[Any], result: Any, msg_id: Any) -> None:
    if future.done():
        return
    if result == Result.Ok or int(result) == 0:
        future.set_result(msg_id)
    else:
        native = _shared.native("pulsar")
        value = native.Result(int(result)) if native is not None else result
        future.set_exception(_exception_class()(value))


class Producer:
    """pulsar-client's asyncio ``Producer``, over the drop-in's (module docstring)."""

    def __init__(self, producer: _Producer, block_if_queue_full: bool) -> None:
        self._producer = producer
        self._hooks = LoopHooks(producer)
        self._block = block_if_queue_full

    @property
    def producer(self) -> _Producer:
        """Extension: the drop-in's synchronous producer underneath."""
        return self._producer

    async def send(
        self,
        content: Any,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        replication_clusters: list[str] | None = None,
        disable_replication: bool | None = None,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: Any = None,
    ) -> Any:
        """Publish a message; return its message id once stored (a duplicate's: the
        original's).

        Raises:
            PulsarException: the message failed (``error()`` is its ``Result``: ``Timeout``,
                ``ProducerQueueIsFull`` without ``block_if_queue_full``, ``ProducerFenced``...).
            OperationNotSupported: ``deliver_at``/``deliver_after`` (delayed delivery), as
                the synchronous drop-in refuses them; nothing is sent.
            ValueError, TypeError: a bad argument, as the synchronous drop-in's ``send``.
        """
        options: dict[str, Any] = {}
        for name, value in (
            ("ordering_key", ordering_key),
            ("replication_clusters", replication_clusters),
            ("disable_replication", disable_replication),
            ("event_timestamp", event_timestamp),
            ("deliver_at", deliver_at),
            ("deliver_after", deliver_after),
        ):
            if value is not None:
                options[name] = value
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        hooks = self._hooks

        def delivered(error: BaseException | None, metadata: Any) -> None:
            if error is None:
                loop.call_soon_threadsafe(_settle, future, Result.Ok, hooks.message_id(metadata))
            else:
                from ._errors import _exception_for

                loop.call_soon_threadsafe(_settle, future, _exception_for(error).result(), None)

        delay = 0.001
        while True:
            try:
                hooks.submit(content, properties, partition_key, sequence_id, options, delivered)
                break
            except ProducerQueueIsFull as exc:
                if not self._block:
                    raise _async_error(exc) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
            except (OperationNotSupported, ValueError, TypeError):
                raise
            except _DropInException as exc:
                raise _async_error(exc) from exc
        return await future

    async def flush(self) -> None:
        """Wait until every message sent so far is stored or has failed."""
        await self._blocking(self._producer.flush)

    async def close(self) -> None:
        """Flush, then close the producer."""
        await self._blocking(self._producer.close)

    async def _blocking(self, call: Any) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, call)
        except _DropInException as exc:
            raise _async_error(exc) from exc

    def topic(self) -> str:
        return self._producer.topic()

    def producer_name(self) -> str:
        return self._producer.producer_name()

    def last_sequence_id(self) -> int:
        return self._producer.last_sequence_id()

    def is_connected(self) -> bool:
        return self._producer.is_connected()


class Client:
    """pulsar-client's asyncio ``Client``: ``Client(service_url, **kwargs)`` takes what the
    drop-in's ``Client`` takes.

    Raises:
        As the drop-in's ``Client``.
    """

    def __init__(self, service_url: Any, **kwargs: Any) -> None:
        self._client = _Client(service_url, **kwargs)
        self._kwargs = kwargs
        self._service_url = service_url
        self._native: Any = None

    @property
    def client(self) -> _Client:
        """Extension: the drop-in's synchronous client underneath."""
        return self._client

    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: Any = None,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: Any = None,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = True,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: Any = None,
        lazy_start_partitioned_producers: bool = False,
        properties: dict[str, str] | None = None,
        batching_type: Any = None,
        encryption_key: str | None = None,
        crypto_key_reader: Any = None,
        access_mode: Any = None,
        message_router: Any = None,
    ) -> Producer:
        """Create an exactly-once producer (the drop-in's ``create_producer``, run in an
        executor as it may wait for the backend).

        Raises:
            ValueError: batching and chunking both enabled, as upstream; a bad argument.
            PulsarException: the producer could not be created (``error()`` says why).
        """
        if batching_enabled and chunking_enabled:
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        options: dict[str, Any] = {}
        for name, value in (
            ("schema", schema),
            ("compression_type", compression_type),
            ("message_routing_mode", message_routing_mode),
            ("batching_type", batching_type),
            ("encryption_key", encryption_key),
            ("crypto_key_reader", crypto_key_reader),
            ("access_mode", access_mode),
            ("message_router", message_router),
            ("properties", properties),
        ):
            if value is not None:
                options[name] = value
        if max_pending_messages_across_partitions != 50000:
            options["max_pending_messages_across_partitions"] = max_pending_messages_across_partitions
        if lazy_start_partitioned_producers:
            options["lazy_start_partitioned_producers"] = True
        if chunking_enabled:
            options["chunking_enabled"] = True
        create = functools.partial(
            self._client.create_producer,
            topic,
            producer_name,
            initial_sequence_id=initial_sequence_id,
            send_timeout_millis=send_timeout_millis,
            max_pending_messages=max_pending_messages,
            block_if_queue_full=False,  # a full queue waits on the loop (Producer.send)
            batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
            **options,
        )
        try:
            inner = await asyncio.get_running_loop().run_in_executor(None, create)
        except _DropInException as exc:
            if isinstance(exc, ValueError):
                raise
            raise _async_error(exc) from exc
        if not isinstance(inner, _Producer):  # a non-persistent topic: pulsar-client's own (warned)
            raise OperationNotSupported(
                "pulsar.asyncio: non-persistent topics are not supported by the asyncio drop-in; "
                "use pulsar-client's pulsar.asyncio directly"
            )
        return Producer(inner, block_if_queue_full)

    def _native_async(self, what: str) -> Any:
        self._client._native_client(what)  # refuses a URL that is not Pulsar's, says why
        module = _shared.native(_NATIVE)
        if module is None:
            raise OperationNotSupported(f"Client.{what}() needs pulsar-client: pip install idempotent[pulsar]")
        if self._native is None:
            from idempotent.runtime.native_logs import routed_pulsar_class

            url = self._service_url.split("?", 1)[0] if isinstance(self._service_url, str) else self._service_url
            self._native = routed_pulsar_class(module.Client)(url, **self._kwargs)
        return self._native

    async def subscribe(self, topic: Any, subscription_name: Any, *args: Any, **kwargs: Any) -> Any:
        """pulsar-client's own asyncio ``subscribe`` (a Pulsar service URL only); the messages'
        ``properties()`` are the ones their application set (see
        :mod:`idempotent.compat.pulsar._consuming`).

        Raises:
            OperationNotSupported: the service URL is not a Pulsar one.
        """
        native = self._native_async("subscribe")
        return shown(await subscribed(native.subscribe, topic, subscription_name, *args, **kwargs))

    async def create_reader(self, topic: Any, start_message_id: Any, *args: Any, **kwargs: Any) -> Any:
        """pulsar-client's own asyncio ``create_reader`` (a Pulsar service URL only); the
        messages' ``properties()`` are the ones their application set.

        Raises:
            OperationNotSupported: the service URL is not a Pulsar one.
        """
        return shown(await self._native_async("create_reader").create_reader(topic, start_message_id, *args, **kwargs))

    async def get_topic_partitions(self, topic: str) -> list[str]:
        return self._client.get_topic_partitions(topic)

    def shutdown(self) -> None:
        self._client.shutdown()
        if self._native is not None:
            self._native.shutdown()

    async def close(self) -> None:
        """Close every producer (flushing it) and the native client, if one was opened."""
        await asyncio.get_running_loop().run_in_executor(None, self._client.close)
        native, self._native = self._native, None
        if native is not None:
            await native.close()


def __getattr__(name: str) -> Any:
    """The rest of pulsar-client's ``pulsar.asyncio`` (``Consumer``, ``Reader``, ...)."""
    return _shared.passed_through(_NATIVE, name)


__all__ = ["Client", "Producer", "PulsarException"]
