"""The drop-ins' asyncio producers: confluent-kafka's ``aio.AIOProducer`` and pulsar-client's
``pulsar.asyncio``, exactly once (on the embedded log, and on the suite's Kafka and Pulsar)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from idempotent.compat.confluent_kafka.aio import AIOProducer

import idempotent
from idempotent.compat import _shared
from idempotent.compat.confluent_kafka import KafkaException
from idempotent.compat.pulsar.asyncio import Client, PulsarException

from ..test_examples import _example, _finish


def _records(url: str, topic: str) -> list[idempotent.Message]:
    with idempotent.Reader(url, topic) as reader:
        return list(reader)


def test_aio_producer_futures_resolve_without_flush_and_carry_the_identity(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"

    async def run() -> tuple[list[Any], int]:
        producer = AIOProducer({"idempotent.broker.url": url, "transactional.id": "a1", "linger.ms": 5})
        futures = [await producer.produce("t", value=f"v{i}", key="k", headers={"h": b"1"}) for i in range(500)]
        # no flush: the sender wakes the loop, which serves the reports
        messages = await asyncio.wait_for(asyncio.gather(*futures), 60)
        pid = producer.producer.producer.producer_id
        await producer.close()
        return messages, pid

    messages, pid = asyncio.run(run())
    assert [m.offset() for m in messages] == list(range(500))
    assert messages[0].headers() == [("h", b"1")]
    stored = _records(url, "t")
    assert len(stored) == 500 and {m.producer_id for m in stored} == {pid}


def test_aio_producer_named_restart_keeps_its_identity(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"

    async def run(first: int) -> tuple[int, int, list[Any]]:
        async with AIOProducer({"idempotent.broker.url": url, "transactional.id": "named"}) as producer:
            futures = [await producer.produce("t", value=b"x", sequence=first + i) for i in range(10)]
            assert await producer.flush(30) == 0
            inner = producer.producer.producer
            return inner.producer_id, inner.producer_epoch, [f.result() for f in futures]

    pid, epoch, _ = asyncio.run(run(0))
    pid2, epoch2, again = asyncio.run(run(5))  # 5..9 resent, 10..14 new
    assert pid2 == pid and epoch2 > epoch
    assert [m.duplicate() for m in again] == [True] * 5 + [False] * 5
    assert len(_records(url, "t")) == 15


def test_aio_producer_errors_and_closed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"

    async def run() -> None:
        producer = AIOProducer({"idempotent.broker.url": url})
        with pytest.raises(KafkaException):  # no such partition: at produce() or in its future
            await (await producer.produce("t", value=b"x", partition=7))
        with pytest.raises(TypeError):
            await producer.produce("t", value=b"x", on_delivery=print)
        await producer.close()
        with pytest.raises(RuntimeError):
            await producer.produce("t", value=b"x")

    asyncio.run(run())
    with pytest.raises(RuntimeError):  # as upstream: needs a running loop
        AIOProducer({"idempotent.broker.url": url})


def test_aio_poll_serves_reports_on_the_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"

    async def run() -> int:
        producer = AIOProducer({"idempotent.broker.url": url})
        future = await producer.produce("t", value=b"x")
        served = 0
        for _ in range(100):
            served += await producer.poll(0.2)
            if future.done():
                break
        assert future.done() and future.result().offset() == 0
        await producer.close()
        return served

    assert asyncio.run(run()) >= 0


def test_passed_through_async_serializing_producer_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    _shared._WARNED.discard("confluent_kafka.aio.AsyncSerializingProducer")
    from idempotent.compat.confluent_kafka import aio

    with caplog.at_level(logging.WARNING, "idempotent.compat.confluent_kafka"):
        aio.AsyncSerializingProducer  # noqa: B018
        aio.AsyncSerializingProducer  # noqa: B018
        assert aio.AIOConsumer is not None  # consumers pass through silently
    warned = [r for r in caplog.records if "not stored exactly once" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING


def test_native_producers_reached_through_submodules_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    _shared._WARNED.discard("confluent_kafka.serializing_producer.SerializingProducer")
    with caplog.at_level(logging.WARNING, "idempotent.compat.confluent_kafka"):
        from idempotent.compat.confluent_kafka.serializing_producer import SerializingProducer

        assert SerializingProducer is not None
        from idempotent.compat.confluent_kafka import Producer

        assert Producer.__module__.startswith("idempotent")  # the drop-in's own: no warning
    warned = [r for r in caplog.records if "not stored exactly once" in r.getMessage()]
    assert len(warned) == 1 and "serializing_producer.SerializingProducer" in warned[0].getMessage()


def test_pulsar_asyncio_send_identity_and_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"

    async def run() -> tuple[int, list[Any]]:
        client = Client(url)
        producer = await client.create_producer("t", producer_name="pa", batching_max_publish_delay_ms=5)
        ids = await asyncio.gather(*[producer.send(f"m{i}".encode(), None) for i in range(300)])
        full = await client.create_producer("u", max_pending_messages=1)
        with pytest.raises(PulsarException) as caught:
            await asyncio.gather(*[full.send(b"x") for _ in range(50)])
        assert caught.value.error().name == "ProducerQueueIsFull"
        with pytest.raises(Exception, match=r"(?i)delay"):
            await producer.send(b"x", deliver_after=datetime.timedelta(seconds=1))
        pid = producer.producer.producer.producer_id
        await producer.close()
        await client.close()
        return pid, ids

    pid, ids = asyncio.run(run())
    assert sorted(i.entry_id() for i in ids) == list(range(300))
    stored = _records(url, "t")
    assert len(stored) == 300 and {m.producer_id for m in stored} == {pid}


# -- the two examples, killed with -9 and run again ------------------------------------------


def _killed_and_restarted(start: Any, url: str, topic: str, marker: str, sent: str) -> None:
    """Run an example, SIGKILL it after its third batch, run it again for 3 batches: every
    record read back carries the named producer's id (one id, a higher epoch after the
    restart), is stored once, and every record an instance was told is stored is there."""
    acknowledged: list[str] = []
    child = start("r1", "1000")
    assert child.stdout is not None
    batches = 0
    while batches < 3:
        line = child.stdout.readline()
        assert line, "the example ended before it could be killed"
        acknowledged += re.findall(sent, line)
        batches += marker in line
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    out = _finish(start("r2", "3"))
    acknowledged += re.findall(sent, out)
    stored = _records(url, topic)
    values = Counter(m.value.decode() for m in stored if m.value is not None)
    assert values and max(values.values()) == 1, [v for v, n in values.items() if n > 1][:5]
    assert set(acknowledged) <= set(values)
    assert sum(v.startswith("r2-") for v in values) == 300
    assert len({m.producer_id for m in stored}) == 1 and min(m.producer_id for m in stored) >= 0
    epochs = {m.value.decode()[:2]: m.producer_epoch for m in stored if m.value is not None}
    assert epochs["r2"] > epochs["r1"]


def _kafka_example(url: str, bootstrap: str, topic: str) -> None:
    env = {"IDEMPOTENT_BROKER_URL": url if url.startswith("sqlite") else ""}
    _killed_and_restarted(
        lambda run, n: _example("drop_in_kafka_asyncio.py", bootstrap, topic, run, n, env=env),
        url,
        topic,
        "delivered",
        r"Produced (\S+) to",
    )


def test_kafka_asyncio_example_killed_and_restarted(tmp_path: Path) -> None:
    _kafka_example(f"sqlite:///{tmp_path / 'k.db'}", "localhost:9", "orders")


@pytest.mark.kafka
def test_kafka_asyncio_example_killed_and_restarted_on_kafka(kafka_service: Any) -> None:
    _kafka_example(kafka_service.url, kafka_service.bootstrap, f"aio-{uuid.uuid4().hex[:8]}")


def _pulsar_example(service_url: str, read_url: str, topic: str) -> None:
    _killed_and_restarted(
        lambda run, n: _example("drop_in_pulsar_asyncio.py", service_url, topic, run, n),
        read_url,
        topic,
        "stored",
        r"sent (\S+) as",
    )


def test_pulsar_asyncio_example_killed_and_restarted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _pulsar_example(url, url, "payments")


@pytest.mark.pulsar
def test_pulsar_asyncio_example_killed_and_restarted_on_pulsar(pulsar_service: Any) -> None:
    url = f"{pulsar_service.url}?admin_url={pulsar_service.admin_url}"
    _pulsar_example(url, url, f"persistent://public/default/aio-{uuid.uuid4().hex[:8]}")
