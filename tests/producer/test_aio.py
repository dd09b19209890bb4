"""AsyncProducer (idempotent/producer/aio.py): the asyncio producer, through its public behaviour only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import idempotent
from idempotent import DeliveryFailed, DeliveryStatus
from idempotent.adapters.memory import MemoryBackend
from idempotent.errors import ProducerClosedError, ProducerFencedError, UsageError

from ..conftest import memory_harness


async def ticking(ticks: list[float], period: float = 0.005) -> None:
    """Count loop turns until cancelled: proof that the event loop is not blocked."""
    loop = asyncio.get_running_loop()
    while True:
        ticks.append(loop.time())
        await asyncio.sleep(period)


def test_asyncio_producer(tmp_path: Path) -> None:
    async def main() -> list[int | None]:
        async with idempotent.AsyncProducer(f"sqlite:///{tmp_path / 'a.db'}", "async-job") as producer:
            futures = [await producer.send("t", f"{i}".encode()) for i in range(100)]
            one = await producer.send_and_wait("t", b"last")
            results = await asyncio.gather(*futures)
            assert one.offset == 100 and producer.last_sequence("t", 0) == 100
            return [r.offset for r in results]

    assert asyncio.run(main()) == list(range(100))


def test_asyncio_send_many(tmp_path: Path) -> None:
    async def main() -> list[int | None]:
        async with idempotent.AsyncProducer(f"sqlite:///{tmp_path / 'a.db'}") as producer:
            future = await producer.send_many("t", [f"{i}".encode() for i in range(50)], partition=0)
            deliveries = await future
            return [m.offset for m in deliveries]  # type: ignore[union-attr]

    assert asyncio.run(main()) == list(range(50))


def test_using_it_before_start_is_a_usage_error_and_aclose_without_start_is_a_no_op() -> None:
    producer = idempotent.AsyncProducer(memory_harness().open())

    async def main() -> None:
        with pytest.raises(UsageError, match="start"):
            await producer.send("t", b"x")
        with pytest.raises(UsageError, match="start"):
            _ = producer.producer_id
        await producer.aclose()  # nothing started: nothing to close

    asyncio.run(main())


def test_start_initialises_the_producer_once_and_exposes_its_identity() -> None:
    broker = memory_harness().open()

    async def main() -> tuple[int, int, int, int]:
        producer = idempotent.AsyncProducer(broker, "named")
        await producer.start()
        first = producer.producer
        await producer.start()  # a second start keeps the same producer
        assert producer.producer is first
        identity = (producer.producer_id, producer.producer_epoch)
        await producer.aclose()
        async with idempotent.AsyncProducer(broker, "named") as again:
            return (*identity, again.producer_id, again.producer_epoch)

    producer_id, epoch, again_id, again_epoch = asyncio.run(main())
    assert again_id == producer_id and again_epoch == epoch + 1  # the name resumes with a new epoch


def test_a_full_buffer_makes_send_wait_without_blocking_the_loop() -> None:
    """With room for two records and slow appends, send waits (it never raises
    QueueFullError) while the event loop keeps running; every record arrives in order."""
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    backend.faults.delay = 0.05

    async def main() -> tuple[list[int | None], int]:
        ticks: list[float] = []
        ticker = asyncio.create_task(ticking(ticks))
        async with idempotent.AsyncProducer(broker, max_buffered_records=2, linger_ms=0) as producer:
            futures = [await producer.send("t", f"{i}".encode(), partition=0) for i in range(8)]
            metas = await asyncio.gather(*futures)
        ticker.cancel()
        return [m.offset for m in metas], len(ticks)

    offsets, ticks = asyncio.run(main())
    assert offsets == list(range(8))
    assert ticks > 3  # the loop turned while send waited for room
    assert [r.value for r in broker.read("t", 0, 0, 100)] == [f"{i}".encode() for i in range(8)]


def test_flush_and_aclose_run_off_the_loop() -> None:
    """flush waits for slow appends in an executor: the loop keeps turning, and it returns
    how many messages are unfinished (none). After aclose the producer refuses to send."""
    broker = memory_harness().open()
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)

    async def main() -> tuple[int, int]:
        ticks: list[float] = []
        async with idempotent.AsyncProducer(broker, linger_ms=0) as producer:
            backend.faults.delay = 0.2
            futures = [await producer.send("t", b"%d" % i, partition=0) for i in range(3)]
            ticker = asyncio.create_task(ticking(ticks))
            unfinished = await producer.flush(10)
            ticker.cancel()
            assert all(f.done() for f in futures)
        with pytest.raises(ProducerClosedError):
            await producer.send("t", b"late")
        return unfinished, len(ticks)

    unfinished, ticks = asyncio.run(main())
    assert unfinished == 0 and ticks > 5


def test_a_fenced_producer_fails_its_sends_with_delivery_failed() -> None:
    broker = memory_harness().open()

    async def main() -> DeliveryFailed:
        async with idempotent.AsyncProducer(broker, "job", linger_ms=0) as old:
            await old.send_and_wait("t", b"a")
            async with idempotent.AsyncProducer(broker, "job"):
                with pytest.raises(DeliveryFailed) as info:
                    await old.send_and_wait("t", b"zombie")
                with pytest.raises(ProducerFencedError):  # the producer has failed for good
                    await old.send("t", b"more")
        return info.value

    failure = asyncio.run(main())
    assert failure.status is DeliveryStatus.NOT_PERSISTED
    assert isinstance(failure.__cause__, ProducerFencedError)
    assert [r.value for r in broker.read("t", 0, 0, 10)] == [b"a"]


def test_the_typed_options_are_the_producers() -> None:
    """AsyncProducer passes its options to Producer: their names and types are declared in
    ProducerOptions, which must stay the producer's own keyword options plus connect's."""
    import inspect

    from idempotent.connection import ProducerConnectOptions
    from idempotent.producer.aio import ProducerOptions

    producer = {
        name
        for name, parameter in inspect.signature(idempotent.Producer.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(ProducerOptions.__annotations__) == producer | set(ProducerConnectOptions.__annotations__)


def test_options_reach_the_producer_and_its_backend(tmp_path: Path) -> None:
    broker = memory_harness().open()
    counts: list[int] = []
    submit_request = broker.submit_request

    def recording(request: idempotent.ProduceRequest) -> object:
        counts.append(request.header.record_count)
        return submit_request(request)

    broker.submit_request = recording  # type: ignore[method-assign]

    async def main() -> None:
        async with idempotent.AsyncProducer(broker, max_batch_records=2, linger_ms=0) as producer:
            await (await producer.send_many("t", [b"a", b"b", b"c"], partition=0))

    asyncio.run(main())
    assert counts == [2, 1]  # three records in batches of at most two

    async def refused() -> None:
        await idempotent.AsyncProducer(f"sqlite:///{tmp_path / 'p.db'}", check="nope").start()

    with pytest.raises(idempotent.errors.ConfigError, match="check must be"):  # a backend's option
        asyncio.run(refused())
