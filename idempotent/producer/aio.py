"""asyncio producer with the same semantics as :class:`idempotent.Producer`.

``await producer.send(...)`` queues the record (waiting while the local buffer is full) and
returns an :class:`asyncio.Future` of its :class:`RecordMetadata`; ``await
producer.send_and_wait(...)`` waits for delivery. Blocking work runs in the default executor,
so the event loop is never blocked by the broker.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as SequenceOf
from typing import TypeVar, Unpack

from idempotent.api import BrokerAPI
from idempotent.connection import ProducerConnectOptions
from idempotent.core.outcomes import RecordMetadata
from idempotent.core.records import Record
from idempotent.errors import DeliveryFailed, QueueFullError, UsageError
from idempotent.producer.producer import Deliveries, Producer

_T = TypeVar("_T")


def _settle(
    future: asyncio.Future[RecordMetadata], error: DeliveryFailed | None, metadata: RecordMetadata | None
) -> None:
    """Complete ``future`` with a record's outcome (on its loop), unless it was cancelled."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(metadata)  # type: ignore[arg-type]


async def _while_full(enqueue: Callable[[], _T]) -> _T:
    """``enqueue()``'s result once the producer's buffer takes the records: while it raises
    QueueFullError (nothing queued), it is called again after a pause growing from 1 ms to
    100 ms, the event loop running meanwhile. Other errors are raised as they come."""
    delay = 0.001
    while True:
        try:
            return enqueue()
        except QueueFullError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)


class ProducerOptions(ProducerConnectOptions, total=False):
    """The keyword options of :class:`idempotent.Producer` (see there for what each means,
    and their defaults), with the options it passes to :func:`idempotent.connect` for a URL.
    ``tests/producer/test_aio.py`` checks that they are the producer's, name for name."""

    max_in_flight: int
    linger_ms: float
    batch_size: int
    max_batch_records: int
    request_timeout_ms: float
    delivery_timeout_ms: float
    max_buffered_records: int
    max_buffered_bytes: int | None
    init_timeout_ms: float
    metadata_max_age_ms: float
    max_block_ms: float


class AsyncProducer:
    """Exactly-once producer for asyncio. Use ``async with AsyncProducer(url) as p:``.

    Accepts the same arguments as :class:`idempotent.Producer` (``options``: see
    :class:`ProducerOptions`).
    """

    def __init__(
        self, url_or_broker: str | BrokerAPI, producer_name: str | None = None, **options: Unpack[ProducerOptions]
    ) -> None:
        self._args = (url_or_broker, producer_name)
        self._options = options
        self._producer: Producer | None = None

    async def start(self) -> None:
        """Initialise the producer (``init_producer`` runs in an executor thread)."""
        if self._producer is None:
            loop = asyncio.get_running_loop()
            self._producer = await loop.run_in_executor(None, functools.partial(Producer, *self._args, **self._options))

    @property
    def producer(self) -> Producer:
        """The underlying synchronous producer (after :meth:`start`)."""
        if self._producer is None:
            raise UsageError("call 'await start()' or use 'async with' first")
        return self._producer

    @property
    def producer_id(self) -> int:
        return self.producer.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.producer.producer_epoch

    def last_sequence(self, topic: str, partition: int) -> int:
        return self.producer.last_sequence(topic, partition)

    async def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        sequence: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; return a future of its metadata. Waits while the buffer is full.

        Raises:
            The same errors as :meth:`idempotent.Producer.send`, except QueueFullError.
        """
        producer = self.producer
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RecordMetadata] = loop.create_future()

        def delivered(error: DeliveryFailed | None, metadata: RecordMetadata | None) -> None:
            loop.call_soon_threadsafe(_settle, future, error, metadata)

        await _while_full(
            functools.partial(
                producer.send, topic, value, key, partition, headers, sequence=sequence, on_delivery=delivered
            )
        )
        return future

    async def send_many(
        self,
        topic: str,
        records: Iterable[Record | bytes | str | None],
        *,
        partition: int | None = None,
        sequence: int | SequenceOf[int] | None = None,
    ) -> asyncio.Future[Deliveries]:
        """Queue many records (see :meth:`idempotent.Producer.send_many`); return one future
        of their :class:`~idempotent.producer.producer.Deliveries`. Waits while the buffer is full.

        Raises:
            The same errors as :meth:`idempotent.Producer.send_many`, except QueueFullError.
        """
        producer = self.producer
        items = list(records)
        future = await _while_full(
            functools.partial(producer.send_many, topic, items, partition=partition, sequence=sequence)
        )
        return asyncio.wrap_future(future)

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        sequence: int | None = None,
    ) -> RecordMetadata:
        """Send one record and wait until it is delivered (or raise DeliveryFailed)."""
        return await (await self.send(topic, value, key, partition, headers, sequence=sequence))

    async def flush(self, timeout: float | None = None) -> int:
        """Wait until every queued message has ended; return how many are unfinished."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.producer.flush, timeout)

    async def aclose(self, timeout: float | None = None) -> None:
        """Flush and close."""
        if self._producer is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._producer.close, timeout)

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
