"""The 3-node Kafka cluster service (idempotent.testing.services.kafka_cluster): it comes up replicated
as in production, and its faults (kill -9, a controlled restart, a rolling restart, SIGSTOP)
do what a fault test expects of them. One cluster for the session; each test heals it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotent.testing import services
from idempotent.testing.services import kafka_cluster

QUIET = {"log_level": 0}


@pytest.fixture
def cluster(kafka_cluster_service: Any) -> Iterator[kafka_cluster.ClusterInfo]:
    """The session's cluster, whole again after the test."""
    yield kafka_cluster_service
    kafka_cluster.heal()


def _topic(cluster: kafka_cluster.ClusterInfo, partitions: int = 6) -> str:
    """A topic created with the broker's defaults (no replication factor given)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"cluster-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    admin.create_topics([NewTopic(name, partitions)], operation_timeout=30)[name].result()
    kafka_cluster.wait_in_sync([name], timeout=60)
    return name


def _topic_config(cluster: kafka_cluster.ClusterInfo, topic: str, key: str) -> str:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource], request_timeout=30)[resource].result()
    return str(configs[key].value)


def _produce(cluster: kafka_cluster.ClusterInfo, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, **QUIET})
    errors: list[Any] = []
    for i in range(count):
        producer.produce(topic, str(i).encode(), on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(60) == 0
    assert errors == []


@pytest.mark.kafka
def test_the_cluster_is_three_replicating_nodes(cluster: kafka_cluster.ClusterInfo) -> None:
    assert [n.node_id for n in cluster.nodes] == [1, 2, 3]
    assert all(pid is not None for pid in kafka_cluster.node_pids().values())
    assert len(set(kafka_cluster.node_pids().values())) == 3
    assert cluster.url == "kafka://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)
    assert len({n.port for n in cluster.nodes} | {n.controller_port for n in cluster.nodes}) == 6
    found = kafka_cluster.status()
    assert found is not None and found.url == cluster.url
    assert kafka_cluster.active_controller() in kafka_cluster.NODES
    topic = _topic(cluster)
    states = kafka_cluster.partitions(topic)
    assert sorted(states) == list(range(6))
    for p in states.values():
        assert sorted(p.replicas) == [1, 2, 3] and sorted(p.isr) == [1, 2, 3]
    assert {kafka_cluster.leader_of(topic, p) for p in range(6)} == {1, 2, 3}  # leaders spread
    assert _topic_config(cluster, topic, "min.insync.replicas") == "2"
    for internal in ("__consumer_offsets", "__transaction_state"):  # made by up()'s probe
        assert all(len(p.replicas) == 3 and p.in_sync for p in kafka_cluster.partitions(internal).values())
        assert _topic_config(cluster, internal, "min.insync.replicas") == "2"
    _produce(cluster, topic, 10)


@pytest.mark.kafka
def test_kill9_of_a_leader_moves_its_leadership_and_the_node_rejoins(cluster: kafka_cluster.ClusterInfo) -> None:
    topic = _topic(cluster)
    leader = kafka_cluster.leader_of(topic, 0)
    kafka_cluster.kill9(leader)
    assert kafka_cluster.node_pids()[leader] is None
    moved = kafka_cluster.leader_of(topic, 0, timeout=60)  # the dead one is fenced after 5 s
    assert moved != leader
    _produce(cluster, topic, 10)  # 2 replicas left: min.insync.replicas is met
    kafka_cluster.start(leader)
    assert kafka_cluster.node_pids()[leader] is not None
    assert all(leader in p.isr for p in kafka_cluster.partitions(topic).values())


@pytest.mark.kafka
def test_kill9_of_the_active_controller_elects_another(cluster: kafka_cluster.ClusterInfo) -> None:
    controller = kafka_cluster.active_controller()
    kafka_cluster.kill9(controller)
    elected = kafka_cluster.active_controller(timeout=60)
    assert elected != controller
    topic = _topic(cluster)  # the new controller creates topics
    kafka_cluster.start(controller)
    assert all(controller in p.isr for p in kafka_cluster.partitions(topic).values())


@pytest.mark.kafka
def test_a_paused_node_leaves_the_isr_and_comes_back_when_resumed(cluster: kafka_cluster.ClusterInfo) -> None:
    topic = _topic(cluster)
    node = kafka_cluster.leader_of(topic, 0)
    kafka_cluster.pause(node)
    deadline = time.monotonic() + 60
    while any(node in p.isr for p in kafka_cluster.partitions(topic).values()):
        assert time.monotonic() < deadline, "the paused node was never fenced"
        time.sleep(0.25)
    assert kafka_cluster.leader_of(topic, 0) != node
    kafka_cluster.resume(node)
    assert all(node in p.isr and p.in_sync for p in kafka_cluster.partitions(topic).values())
    _produce(cluster, topic, 10)


@pytest.mark.kafka
def test_a_rolling_restart_keeps_an_idempotent_producer_delivering(cluster: kafka_cluster.ClusterInfo) -> None:
    """A native idempotent producer, at ~500 records/s through a rolling restart of all three
    nodes: every record delivered, stored once and in order."""
    from confluent_kafka import Consumer, Producer

    topic = _topic(cluster, partitions=3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5, **QUIET})
    delivered: list[int] = []
    failed: list[Any] = []
    restarted: list[int] = []
    done = threading.Event()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            delivered.append(int(msg.value()))

    def restart_all() -> None:
        try:
            kafka_cluster.rolling_restart(on_restarted=restarted.append)
        finally:
            done.set()

    roller = threading.Thread(target=restart_all)
    sent = 0
    roller.start()
    try:
        while not done.is_set():
            for _ in range(50):
                producer.produce(topic, str(sent).encode(), key=str(sent % 3).encode(), on_delivery=on_delivery)
                sent += 1
            producer.poll(0.1)
    finally:
        roller.join(600)
    assert restarted == [1, 2, 3]
    assert producer.flush(120) == 0
    assert failed == []
    assert sorted(delivered) == list(range(sent))
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            **QUIET,
        }
    )
    stored: dict[bytes, list[int]] = {}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 120
        while sum(map(len, stored.values())) < sent and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                stored.setdefault(message.key(), []).append(int(message.value()))
    finally:
        consumer.close()
    assert sorted(v for values in stored.values() for v in values) == list(range(sent))  # each once
    for values in stored.values():
        assert values == sorted(values)  # one key, one partition: in the order sent


def test_the_command_line_needs_a_node_to_kill_and_ports_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["kill9", "kafka-cluster"],
        ["up", "kafka-cluster", "--port", "9092"],
        ["kill9", "kafka", "--node", "1"],
    ):
        with pytest.raises(SystemExit) as exc:
            services.main(argv)
        assert exc.value.code == 2
    assert "kill9 kafka-cluster needs --node N" in capsys.readouterr().err


def test_an_unknown_node_is_refused() -> None:
    for call in (kafka_cluster.kill9, kafka_cluster.pause, kafka_cluster.start):
        with pytest.raises(ValueError, match="no node 4"):
            call(4)
