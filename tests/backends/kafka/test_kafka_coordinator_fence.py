"""A producer's own Kafka writer fenced by Kafka's transaction coordinator, which aborts a
transaction left open longer than ``transaction.timeout.ms`` (a long outage) and reports
``_FENCED`` exactly as for a takeover (docs/semantics.md, section 3.3): retried, never fatal,
for a named and an anonymous producer; a real takeover still stops the older instance."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import confluent_kafka
import pytest

import idempotent
from idempotent import Outcome
from idempotent.adapters.kafka import producer_log as kafka_direct
from idempotent.broker.direct import DirectBroker
from idempotent.compat import confluent_kafka as compat
from idempotent.errors import (
    BackendUnavailableError,
    DeliveryFailed,
    OwnershipLostError,
    ProducerFencedError,
    Recovery,
)

pytestmark = pytest.mark.kafka

#: short enough for a test, allowed by the broker's transaction.max.timeout.ms
TXN_TIMEOUT_MS = 5000


def _topic(kafka_service: Any) -> str:
    name = f"cfence-{uuid.uuid4().hex[:10]}"
    with idempotent.connect(kafka_service.url) as broker:
        broker.create_topic(name, 1)
    return name


def _committed(kafka_service: Any, topic: str) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        tp = confluent_kafka.TopicPartition(topic, 0, 0)
        _, end = consumer.get_watermark_offsets(tp, timeout=30, cached=False)  # the stable end (LSO)
        consumer.assign([tp])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            position = consumer.position([confluent_kafka.TopicPartition(topic, 0)])[0].offset
            if position >= end:
                return values
        raise AssertionError(f"{topic}: not read to its end {end} within 60 s")
    finally:
        consumer.close()


def _stable_end(kafka_service: Any, topic: str) -> int:
    """The partition's last stable offset: stuck at the first record of a transaction still open."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka_service.bootstrap, "group.id": "x", "isolation.level": "read_committed"}
    )
    try:
        return int(consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), 30, cached=False)[1])
    finally:
        consumer.close()


@pytest.mark.parametrize("named", [True, False], ids=["named", "anonymous"])
def test_a_transaction_the_coordinator_aborted_is_resent_not_fatal(
    kafka_service: Any, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    """The writer's transaction is held open (its records acknowledged) until Kafka's
    coordinator aborted it for outliving transaction.timeout.ms: its commit is fenced."""
    topic = _topic(kafka_service)
    broker = DirectBroker(kafka_service.url, log_settings={"transaction.timeout.ms": TXN_TIMEOUT_MS})
    session = broker.init_producer(f"cf-{uuid.uuid4().hex[:6]}" if named else None)
    assert broker.produce(topic, 0, session.producer_id, session.producer_epoch, 0, [b"0"]).outcome is Outcome.ACCEPTED
    place = kafka_direct.KafkaProducerLog._place
    held: list[int] = []

    def hold_open(self: Any, batches: Any, ends: Any, errors: Any, offsets: Any) -> None:
        place(self, batches, ends, errors, offsets)
        if held:
            return
        held.append(offsets[0])
        deadline = time.monotonic() + 90  # the coordinator looks every 10 s by default
        while _stable_end(kafka_service, topic) <= offsets[0]:
            assert time.monotonic() < deadline, "the coordinator did not abort the open transaction"
            time.sleep(0.5)

    monkeypatch.setattr(kafka_direct.KafkaProducerLog, "_place", hold_open)
    values = [b"1", b"2"]
    with pytest.raises(BackendUnavailableError) as failed:
        broker.produce(topic, 0, session.producer_id, session.producer_epoch, 1, values)
    assert not isinstance(failed.value, OwnershipLostError), failed.value
    assert "coordinator" in str(failed.value) or "in doubt" in str(failed.value), failed.value
    # resent: stored once, and the producer goes on
    assert broker.produce(topic, 0, session.producer_id, session.producer_epoch, 1, values).outcome in (
        Outcome.ACCEPTED,
        Outcome.DUPLICATE,
    )
    assert broker.produce(topic, 0, session.producer_id, session.producer_epoch, 3, [b"3"]).outcome is Outcome.ACCEPTED
    broker.close()
    assert held and _committed(kafka_service, topic) == [b"0", b"1", b"2", b"3"]


def _pid() -> int:
    from idempotent.testing import services

    running = services.status("kafka")
    assert running is not None
    return running.pid


def test_a_pause_past_the_transaction_timeout_under_a_named_and_an_anonymous_producer(kafka_service: Any) -> None:
    """The broker paused twice as long as transaction.timeout.ms while both write: no fatal
    error, every record stored once, and both go on writing afterwards. (Here the writers'
    records mostly time out in the client first, which aborts and recovers on its own; the
    coordinator's fence itself is forced by the test above.)"""
    topic = _topic(kafka_service)
    settings = {"transaction.timeout.ms": 10_000}
    producers = {
        "named": idempotent.Producer(kafka_service.url, f"pf-{uuid.uuid4().hex[:6]}", log_settings=settings),
        "anonymous": idempotent.Producer(kafka_service.url, log_settings=settings),
    }
    stop = threading.Event()
    sent: dict[str, list[tuple[bytes, Any]]] = {kind: [] for kind in producers}

    def write(kind: str) -> None:
        producer, i = producers[kind], 0
        while not stop.is_set():
            value = b"%s-%d" % (kind.encode(), i)
            sent[kind].append((value, producer.send(topic, value, partition=0)))
            i += 1
            time.sleep(0.005)

    threads = [threading.Thread(target=write, args=(kind,)) for kind in producers]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while not all(any(f.done() for _, f in s) for s in sent.values()):
            assert time.monotonic() < deadline, "the producers did not start writing"
            time.sleep(0.2)
        pid = _pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(20)  # the fault itself lasts this long
        finally:
            os.kill(pid, signal.SIGCONT)
        before = {kind: len(s) for kind, s in sent.items()}
        deadline = time.monotonic() + 120
        while not all(  # producing resumed: records sent after the pause are acknowledged
            any(f.done() and f.exception() is None for _, f in s[before[kind] :]) for kind, s in sent.items()
        ):
            assert time.monotonic() < deadline, "producing did not resume"
            time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    for producer in producers.values():
        producer.flush(120)
        producer.close()
    errors = {kind: Counter(repr(f.exception())[:200] for _, f in s if f.exception()) for kind, s in sent.items()}
    assert errors == {"named": Counter(), "anonymous": Counter()}, errors
    stored = Counter(_committed(kafka_service, topic))
    assert all(count == 1 for count in stored.values())
    assert set(stored) == {value for s in sent.values() for value, _ in s}


def test_a_drop_in_taken_over_by_a_newer_instance_stops_with_a_fatal_fence(kafka_service: Any) -> None:
    topic, name = _topic(kafka_service), f"tk-{uuid.uuid4().hex[:6]}"
    errors: list[Any] = []
    old = compat.Producer(
        {"bootstrap.servers": kafka_service.bootstrap, "transactional.id": name, "error_cb": errors.append}
    )
    old.produce(topic, b"a", partition=0)
    assert old.flush(30) == 0
    new = compat.Producer({"bootstrap.servers": kafka_service.bootstrap, "transactional.id": name})
    new.init_transactions(30)
    reports: list[Any] = []
    old.produce(topic, b"zombie", partition=0, on_delivery=lambda err, msg: reports.append(err))
    old.flush(30)
    assert [e.code() for e in reports] == [compat.KafkaError._FENCED] and reports[0].fatal()
    assert any(e.code() == compat.KafkaError._FENCED and e.fatal() for e in errors)
    new.produce(topic, b"b", partition=0)
    assert new.flush(30) == 0
    old.close()
    new.close()
    assert _committed(kafka_service, topic) == [b"a", b"b"]


def test_a_named_producer_taken_over_by_a_newer_instance_stops(kafka_service: Any) -> None:
    topic, name = _topic(kafka_service), f"tk-{uuid.uuid4().hex[:6]}"
    old = idempotent.Producer(kafka_service.url, name)
    old.send(topic, b"a", partition=0).result(60)
    new = idempotent.Producer(kafka_service.url, name)
    zombie = old.send(topic, b"zombie", partition=0)
    with pytest.raises(DeliveryFailed) as failed:
        zombie.result(60)
    assert isinstance(failed.value.__cause__, ProducerFencedError) and failed.value.recovery is Recovery.FATAL
    new.send(topic, b"b", partition=0).result(60)
    new.close()
    with contextlib.suppress(ProducerFencedError):
        old.close()
    assert _committed(kafka_service, topic) == [b"a", b"b"]


def test_a_named_producer_saves_its_epoch_before_it_fences_and_its_check_sees_a_newer_one(
    kafka_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    checks: list[Any] = []
    opened = kafka_direct.open_producer_log

    def open_log(backend: Any, key: str, named: bool, settings: Any = None, takeover: Any = None) -> Any:
        events.append("fence")
        checks.append(takeover)
        return opened(backend, key, named, settings, takeover)

    monkeypatch.setattr(kafka_direct, "open_producer_log", open_log)
    name = f"order-{uuid.uuid4().hex[:6]}"
    first = DirectBroker(kafka_service.url)
    save = first.backend.save_producer

    def saved(record: Any) -> None:
        save(record)
        events.append(f"save {record.producer_name} {record.producer_epoch}")

    monkeypatch.setattr(first.backend, "save_producer", saved)
    session = first.init_producer(name)
    assert events == [f"save {name} {session.producer_epoch}", "fence"]
    assert checks[0] is not None and checks[0]() is False  # no newer instance: a fence is the coordinator's
    second = DirectBroker(kafka_service.url)  # the same process's registry, or another's: read afresh
    newer = second.init_producer(name)
    assert newer.producer_epoch > session.producer_epoch
    assert checks[0]() is True and checks[1]() is False  # the older one sees the takeover, the newer one none
    anonymous = DirectBroker(kafka_service.url)
    anonymous.init_producer()
    assert checks[2] is None  # an anonymous producer's every fence is the coordinator's (kafka_direct._never)
    for broker in (anonymous, second, first):
        broker.close()
