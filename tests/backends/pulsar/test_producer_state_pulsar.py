"""A named producer's restart on Pulsar after its state topic (``__idempotent_producer.<name>``)
was lost, went back to an older state, or holds an unreadable one: rebuilt from the partition's
entries within the window, or the restart refused; never silent duplicates."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pulsar
import pytest

from idempotent import Producer
from idempotent.adapters.pulsar.backend import PulsarBackend
from idempotent.adapters.pulsar.names import split_topic
from idempotent.adapters.pulsar.producer_state import state_topic
from idempotent.broker.config import BrokerConfig
from idempotent.errors import ProducerStateLostError
from idempotent.testing.conformance import topic_name

pytestmark = pytest.mark.pulsar


def _url(service: Any) -> str:
    return f"{service.url}?{urllib.parse.urlencode({'admin_url': service.admin_url})}"


def _client(service: Any) -> Any:
    return pulsar.Client(service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _read_all(service: Any, pulsar_topic: str) -> list[Any]:
    client = _client(service)
    try:
        reader = client.create_reader(pulsar_topic, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(20_000))
        return out
    finally:
        client.close()


def _state_topic(service: Any, name: str) -> str:
    backend = PulsarBackend(service.url, admin_url=service.admin_url, timeout=10)
    try:
        return state_topic(backend, name)
    finally:
        backend.close()


def _lose_state(service: Any, name: str) -> None:
    """The producer's state topic is deleted with every state it held."""
    backend = PulsarBackend(service.url, admin_url=service.admin_url, timeout=10)
    try:
        parts = split_topic(state_topic(backend, name))
        status, _ = backend._admin.call(
            "DELETE", f"/admin/v2/persistent/{parts.tenant}/{parts.namespace}/{parts.local}?force=true"
        )
        assert status in (200, 204)
    finally:
        backend.close()


def _put_state(service: Any, name: str, value: bytes) -> None:
    """``value`` becomes the newest message of the producer's state topic."""
    client = _client(service)
    try:
        producer = client.create_producer(_state_topic(service, name))
        producer.send(value)
        producer.close()
    finally:
        client.close()


def _producer_run(
    service: Any, name: str, topic: str, lines: range, config: BrokerConfig | None = None
) -> tuple[int, int, int]:
    """``Producer`` named ``name`` sends ``lines`` (sequence = line) to partition 0:
    ``(last sequence at start, new, duplicates)``."""
    options: dict[str, Any] = {} if config is None else {"config": config}
    with Producer(_url(service), producer_name=name, linger_ms=1, **options) as producer:
        last = producer.last_sequence(topic, 0)
        futures = [producer.send(topic, b"%d" % i, partition=0, sequence=i) for i in lines]
        producer.flush()
        results = [f.result(60) for f in futures if f is not None]
    duplicates = sum(1 for r in results if r.duplicate)
    return last, len(results) - duplicates, duplicates


def _stored(service: Any, topic: str) -> list[bytes]:
    return [m.data() for m in _read_all(service, f"persistent://public/default/{topic}-partition-0")]


def test_a_restart_after_its_state_topic_was_lost_answers_every_resend_as_a_duplicate(pulsar_service: Any) -> None:
    topic, name, count = topic_name("lost"), topic_name("named"), 500
    assert _producer_run(pulsar_service, name, topic, range(count)) == (-1, count, 0)
    _lose_state(pulsar_service, name)
    assert _producer_run(pulsar_service, name, topic, range(count)) == (count - 1, 0, count)
    assert _producer_run(pulsar_service, name, topic, range(count, count + 5)) == (count - 1, 5, 0)
    assert _stored(pulsar_service, topic) == [b"%d" % i for i in range(count + 5)]


def test_an_unreadable_or_older_state_is_not_taken_as_empty(pulsar_service: Any) -> None:
    topic, name, other = topic_name("garbled"), topic_name("named"), topic_name("later")
    assert _producer_run(pulsar_service, name, topic, range(200))[1:] == (200, 0)
    older = _read_all(pulsar_service, _state_topic(pulsar_service, name))[-1].data()  # names only `topic`
    assert _producer_run(pulsar_service, name, other, range(100))[1:] == (100, 0)

    _put_state(pulsar_service, name, older)  # the state went back to one that does not name `other`
    assert _producer_run(pulsar_service, name, other, range(100)) == (99, 0, 100)

    _put_state(pulsar_service, name, b"\xc1 not a state")
    assert _producer_run(pulsar_service, name, topic, range(200)) == (199, 0, 200)
    assert _producer_run(pulsar_service, name, other, range(100)) == (99, 0, 100)
    assert _stored(pulsar_service, topic) == [b"%d" % i for i in range(200)]
    assert _stored(pulsar_service, other) == [b"%d" % i for i in range(100)]


def test_a_lost_state_the_window_cannot_rebuild_refuses_the_restart(pulsar_service: Any) -> None:
    topic, name = topic_name("refused"), topic_name("named")
    assert _producer_run(pulsar_service, name, topic, range(50))[1:] == (50, 0)
    _lose_state(pulsar_service, name)
    with pytest.raises(ProducerStateLostError) as refused:
        _producer_run(pulsar_service, name, topic, range(50), BrokerConfig(state_rebuild_records=10))
    error = refused.value
    assert (error.producer_name, error.topic, error.partition) == (name, topic, 0)
    assert "more than 10 messages" in str(error) and "state_rebuild_records" in str(error)
    assert len(_stored(pulsar_service, topic)) == 50  # nothing was written
    assert _producer_run(pulsar_service, name, topic, range(50)) == (49, 0, 50)  # the default window holds it
