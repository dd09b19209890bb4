"""On the 3-node cluster (``kafka_cluster_service``: ``default.replication.factor=3``,
``min.insync.replicas=2``): the topics the backend creates, its internal ones too, are
replicated as the cluster says unless told otherwise, ``topics describe`` shows the
replicas and the ISR, and internal topics with one replica are a WARNING."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import idempotent

from ...cli_helpers import run

#: every topic a named producer's first send makes the backend create, with its partitions
CREATED = {"__idempotent_meta": 1, "__idempotent_snapshots": 1, "__idempotent_producer_state": 16, "orders": 3}
QUIET = {"log_level": 0}


@pytest.fixture
def cluster(kafka_cluster_service: Any) -> Iterator[Any]:
    """The session's cluster, whole again after the test."""
    from idempotent.testing.services import kafka_cluster

    yield kafka_cluster_service
    kafka_cluster.heal()


def _admin(cluster: Any) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})


def _layout(admin: Any, name: str) -> list[tuple[int, ...]]:
    """The replicas of each partition of ``name``, in partition order."""
    found = admin.list_topics(topic=name, timeout=30).topics[name]
    return [tuple(found.partitions[p].replicas) for p in sorted(found.partitions)]


def _min_insync(admin: Any, name: str) -> tuple[str, bool]:
    """``min.insync.replicas`` of ``name`` and whether it is set on the topic itself."""
    from confluent_kafka.admin import ConfigResource, ConfigSource

    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    entry = admin.describe_configs([resource], request_timeout=30)[resource].result(30)["min.insync.replicas"]
    return str(entry.value), entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def _produce(url: str, prefix: str, name: str, **options: Any) -> None:
    """Create ``orders`` (3 partitions) and send to each partition as the named producer."""
    with idempotent.connect(url, prefix=prefix, **options) as broker:
        broker.create_topic("orders", 3)
    with idempotent.Producer(url, name, prefix=prefix, **options) as producer:
        for partition in range(3):
            producer.send("orders", b"v", partition=partition).result(120)


@pytest.mark.kafka
def test_internal_topics_are_replicated_as_the_cluster_says(cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"rf-{uuid.uuid4().hex[:8]}-"
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        _produce(cluster.url, prefix, "replicated")
    admin = _admin(cluster)
    for name, partitions in CREATED.items():
        layout = _layout(admin, prefix + name)
        assert len(layout) == partitions, name
        assert all(len(set(replicas)) == 3 for replicas in layout), (name, layout)  # default.replication.factor
        assert _min_insync(admin, prefix + name) == ("2", False), name  # the brokers' min.insync.replicas
    assert not [r for r in caplog.records if "internal topic" in r.getMessage()]


@pytest.mark.kafka
def test_explicit_values_win_over_the_cluster(cluster: Any) -> None:
    prefix = f"rf-{uuid.uuid4().hex[:8]}-"
    _produce(f"{cluster.url}?replication_factor=2", prefix, "told", min_insync_replicas=1)
    admin = _admin(cluster)
    for name in CREATED:
        assert all(len(set(replicas)) == 2 for replicas in _layout(admin, prefix + name)), name
        assert _min_insync(admin, prefix + name) == ("1", True), name


@pytest.mark.kafka
def test_describe_shows_three_replicas_and_the_isr(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from idempotent.testing.services import kafka_cluster

    topic = f"described-{uuid.uuid4().hex[:6]}"
    assert run(capsys, "topics", "create", cluster.url, topic, "--partitions", "3")[0] == 0
    kafka_cluster.wait_in_sync([topic], timeout=120)
    code, out, err = run(capsys, "topics", "describe", cluster.url, topic, "--json")
    assert code == 0, err
    described = json.loads(out)
    details = described["partition_details"]
    assert [p["partition"] for p in details] == [0, 1, 2]
    for p in details:
        assert sorted(p["replicas"]) == [1, 2, 3] and sorted(p["isr"]) == [1, 2, 3], p
        assert p["leader"] in p["isr"]
    assert described["replication"] == {
        "note": None,
        "min_insync_replicas": 2,
        "min_insync_source": "broker",
        "under_replicated": [],
    }
    code, out, err = run(capsys, "topics", "describe", cluster.url, topic)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()[2:5]]
    assert [row[0] for row in rows] == ["0", "1", "2"]
    for row, p in zip(rows, details, strict=True):
        assert row[-3:] == [str(p["leader"]), ",".join(map(str, p["replicas"])), ",".join(map(str, p["isr"]))]
    assert "min.insync.replicas: 2 (the brokers' default)" in out


@pytest.mark.kafka
def test_internal_topics_with_one_replica_are_a_warning(cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Internal topics made with one replica (as earlier versions made them) are found at start."""
    from confluent_kafka.admin import NewTopic

    from idempotent.adapters.kafka.backend import KafkaBackend

    prefix = f"rf-{uuid.uuid4().hex[:8]}-"
    admin = _admin(cluster)
    names = [prefix + "__idempotent_meta", prefix + "__idempotent_snapshots"]
    made = admin.create_topics([NewTopic(n, 1, 1, config={"cleanup.policy": "compact"}) for n in names])
    for future in made.values():
        future.result(60)
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        backend = KafkaBackend(cluster.url, prefix=prefix)
        try:
            backend.create_topic("orders", 2)
            assert backend.describe_topic("orders") == 2
        finally:
            backend.close()
    warned = sorted(r.getMessage() for r in caplog.records if "internal topic" in r.getMessage())
    assert len(warned) == 2, warned  # once each, also after the data topic was seen
    for name, text in zip(names, warned, strict=True):
        assert f"'{name}' has 1 replica(s) per partition" in text
        assert "fewer than the brokers' default.replication.factor (3)" in text
        assert "kafka-reassign-partitions" in text and "listing 3 broker ids" in text
    assert all(r.levelno == logging.WARNING for r in caplog.records if "internal topic" in r.getMessage())


@pytest.mark.kafka
def test_a_topic_made_during_a_controlled_shutdown_is_retriable(cluster: Any) -> None:
    """Kafka places a new topic's replicas only on the brokers it can use now, which leaves
    out one in controlled shutdown: while node 3 shuts down, the brokers' default of 3 is
    refused (INVALID_REPLICATION_FACTOR) though the metadata still lists all three. That is
    the broker's absence, an outage: retriable, never a ConfigError, and the same creation
    succeeds at 3 replicas once the node is back. With every broker up, a factor above the
    cluster's size stays a setting error."""
    import threading

    from idempotent.adapters.kafka.backend import KafkaBackend
    from idempotent.errors import BackendUnavailableError, ConfigError, ProducerError
    from idempotent.testing.services import kafka_cluster

    prefix = f"rf-{uuid.uuid4().hex[:8]}-"
    backend = KafkaBackend(cluster.url, prefix=prefix, client_config=QUIET)
    outcomes: dict[str, ProducerError | None] = {}
    try:
        restarted = threading.Event()

        def bounce() -> None:
            try:
                kafka_cluster.restart(3)
            finally:
                restarted.set()

        threading.Thread(target=bounce, daemon=True).start()
        while not restarted.is_set():  # back to back, to meet the shutdown's few seconds
            name = f"t{len(outcomes)}"
            try:
                backend.create_topic(name, 3)
                outcomes[name] = None
            except ProducerError as exc:
                outcomes[name] = exc
        refused = {name: exc for name, exc in outcomes.items() if exc is not None}
        # (a restart also moves the leaders of the project's own topics: other outages)
        assert any("away or shutting down" in str(exc) for exc in refused.values()), (len(outcomes), refused)
        for name, exc in refused.items():
            assert isinstance(exc, BackendUnavailableError) and exc.retriable, (name, exc)
            assert backend.create_topic(name, 3) == 3  # the retry, once the node is back
        admin = _admin(cluster)
        for name in outcomes:
            assert all(len(set(replicas)) == 3 for replicas in _layout(admin, prefix + name)), name
    finally:
        backend.close()
    with pytest.raises(ConfigError, match="INVALID_REPLICATION_FACTOR"):
        KafkaBackend(cluster.url, prefix=f"rf-{uuid.uuid4().hex[:8]}-", replication_factor=4, client_config=QUIET)
