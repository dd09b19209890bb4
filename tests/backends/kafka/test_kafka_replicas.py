"""How many copies the Kafka backend keeps of the topics it creates (the brokers' defaults
unless told), the WARNING for an internal topic with too few, and ``topics describe``'s
replicas; see adapters/kafka/replicas.py."""

from __future__ import annotations

import json
import logging
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent.adapters.kafka import replicas as _kafka_replicas
from idempotent.adapters.kafka.replicas import (
    BROKER_DEFAULT,
    ReplicaCheck,
    new_topic,
    replica_options,
    shortfall_message,
)
from idempotent.errors import ConfigError

from ...cli_helpers import run

INTERNAL = ("__idempotent_meta", "__idempotent_snapshots")


# -- options -------------------------------------------------------------------------------


def test_the_defaults_are_the_brokers() -> None:
    assert replica_options(None, None, {}, "u") == (None, None)
    assert replica_options(-1, "-1", {}, "u") == (None, None)  # Kafka's own "the brokers' default"
    assert replica_options(3, 2, {}, "u") == (3, 2)
    assert replica_options("3", " 2", {"min.insync.replicas": "2"}, "u") == (3, 2)  # URL values are text
    assert replica_options(None, 2, {}, "u") == (None, 2)  # against whatever factor the brokers give


@pytest.mark.parametrize(
    ("factor", "insync", "config", "message"),
    [
        (0, None, {}, "replication_factor must be from 1"),
        (-2, None, {}, "replication_factor must be from 1"),
        (40_000, None, {}, "replication_factor must be from 1"),
        ("three", None, {}, "replication_factor must be a whole number"),
        (True, None, {}, "replication_factor must be a whole number"),
        (2.0, None, {}, "replication_factor must be a whole number"),
        (None, 0, {}, "min_insync_replicas must be from 1"),
        (None, "x", {}, "min_insync_replicas must be a whole number"),
        (2, 3, {}, "more than replication_factor=2"),
        (3, 2, {"min.insync.replicas": "1"}, "differ"),
    ],
)
def test_bad_values_are_a_config_error(factor: object, insync: object, config: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        replica_options(factor, insync, config, "'kafka://k:9092'")
    assert "'kafka://k:9092'" in str(raised.value)


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("kafka://127.0.0.1:9?replication_factor=0", {}),
        ("kafka://127.0.0.1:9?replication_factor=x", {}),
        ("kafka://127.0.0.1:9?min_insync_replicas=0", {}),
        ("kafka://127.0.0.1:9?min_insync_replicas=4&replication_factor=3", {}),
        ("kafka://127.0.0.1:9", {"replication_factor": 2, "min_insync_replicas": 3}),
        (
            "kafka://127.0.0.1:9?replication_factor=3",
            {"min_insync_replicas": 2, "topic_config": {"min.insync.replicas": "1"}},
        ),
    ],
)
def test_the_url_and_keywords_are_checked_before_connecting(url: str, options: dict[str, Any]) -> None:
    from idempotent.adapters.kafka.backend import KafkaBackend

    # nothing listens on port 9: a value that passed would fail with BackendUnavailableError
    with pytest.raises(ConfigError, match=r"replication_factor|min_insync_replicas"):
        KafkaBackend(url, connect_timeout=0.1, **options)


def test_a_created_topic_asks_for_the_brokers_defaults_unless_told() -> None:
    default = new_topic("t", 4, {"cleanup.policy": "compact"}, None, None)
    assert (default.num_partitions, default.replication_factor) == (4, BROKER_DEFAULT)
    assert default.config == {"cleanup.policy": "compact"}  # no min.insync.replicas: the brokers' applies
    told = new_topic("t", 1, {}, 3, 2)
    assert (told.replication_factor, told.config) == (3, {"min.insync.replicas": "2"})


# -- the check -----------------------------------------------------------------------------


def _metadata(*replicas: tuple[int, ...]) -> Any:
    partitions = {i: types.SimpleNamespace(id=i, replicas=list(r)) for i, r in enumerate(replicas)}
    return types.SimpleNamespace(partitions=partitions)


def test_an_internal_topic_with_fewer_replicas_than_the_brokers_default_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = ReplicaCheck(None)
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        check.note_internal("__idempotent_meta", _metadata((1,)))
        check.note_internal("__idempotent_snapshots", _metadata((1, 2, 3)))
        assert not caplog.records  # nothing to compare with yet
        check.note_broker_default(3)
        check.note_internal("__idempotent_meta", _metadata((1,)))  # seen again: warned once
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING
    text = warning.getMessage()
    assert "'__idempotent_meta' has 1 replica(s)" in text and "default.replication.factor (3)" in text
    assert "kafka-reassign-partitions" in text and "topics, producer ids and settings" in text


def test_an_internal_topic_with_fewer_replicas_than_its_data_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    check = ReplicaCheck(None)
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        check.note_broker_default(None)  # the principal may not describe the brokers
        check.note_internal("p-__idempotent_producer_state", _metadata((1, 2), (2, 3), (3,)))
        check.note_data("orders", _metadata((1, 2, 3), (2, 3, 1)))
        check.note_data("orders", _metadata((1, 2, 3)))
    (warning,) = caplog.records
    text = warning.getMessage()
    assert "'p-__idempotent_producer_state' has 1 replica(s)" in text
    assert "the data topic 'orders' it serves has (3)" in text and "named producers' states" in text
    assert "3 partition(s)" in text


def test_enough_replicas_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    check = ReplicaCheck(2)
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        check.note_broker_default(1)
        check.note_internal("__idempotent_meta", _metadata((1, 2)))
        check.note_data("orders", _metadata((1, 2)))
        check.note_data("empty", _metadata())
    assert not caplog.records
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        check.note_internal("__idempotent_snapshots", _metadata((1,)))  # below replication_factor=2
    assert "fewer than replication_factor (2)" in caplog.records[0].getMessage()


def test_the_fix_names_the_topic_and_what_it_holds() -> None:
    text = shortfall_message("x-__idempotent_snapshots", 1, 1, 3, "the brokers' default.replication.factor")
    assert "'x-__idempotent_snapshots'" in text and "snapshots" in text and "listing 3 broker ids" in text


# -- on the suite's Kafka (one broker: default.replication.factor=1, min.insync.replicas=1) ---


def _topic_config(admin: Any, name: str) -> Any:
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    return admin.describe_configs([resource])[resource].result(30)["min.insync.replicas"]


def _replicas(admin: Any, name: str) -> list[int]:
    found = admin.list_topics(topic=name, timeout=30).topics[name]
    return [len(p.replicas) for p in found.partitions.values()]


@pytest.mark.kafka
def test_topics_created_with_the_defaults_get_the_brokers(kafka_service: Any) -> None:
    from confluent_kafka.admin import AdminClient, ConfigSource

    from idempotent.adapters.kafka.backend import KafkaBackend

    prefix = f"rf-{uuid.uuid4().hex[:8]}-"
    admin = AdminClient({"bootstrap.servers": kafka_service.bootstrap})
    with idempotent.Producer(kafka_service.url, "replicated", prefix=prefix) as producer:
        producer.send("orders", b"v", partition=0).result(60)
    backend = KafkaBackend(kafka_service.url, prefix=prefix)
    try:
        assert (backend.replication_factor, backend.min_insync_replicas) == (None, None)
        described = backend.describe_replicas("orders")
    finally:
        backend.close()
    for name in (*INTERNAL, "__idempotent_producer_state", "orders"):
        assert set(_replicas(admin, prefix + name)) == {1}, name  # the broker's default.replication.factor
        entry = _topic_config(admin, prefix + name)
        assert entry.source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value, name  # not set: the broker's applies
        assert entry.value == "1"
    assert described is not None
    assert [(p.partition, p.replicas, p.isr) for p in described.partitions] == [(0, (1,), (1,))]
    assert (described.min_insync_replicas, described.min_insync_source) == (1, "broker")


@pytest.mark.kafka
def test_explicit_values_are_honoured(kafka_service: Any) -> None:
    from confluent_kafka.admin import AdminClient, ConfigSource

    from idempotent.adapters.kafka.backend import KafkaBackend

    prefix = f"rf-{uuid.uuid4().hex[:8]}-"
    admin = AdminClient({"bootstrap.servers": kafka_service.bootstrap})
    url = f"{kafka_service.url}?replication_factor=1&min_insync_replicas=1"
    with idempotent.Producer(url, "told", prefix=prefix) as producer:
        producer.send("orders", b"v", partition=0).result(60)
    for name in (*INTERNAL, "__idempotent_producer_state", "orders"):
        assert set(_replicas(admin, prefix + name)) == {1}, name
        entry = _topic_config(admin, prefix + name)
        assert (entry.value, entry.source) == ("1", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), name
    # a factor the cluster cannot give is asked for as it is, and refused as a bad setting
    with pytest.raises(ConfigError, match=r"INVALID_REPLICATION_FACTOR|replication"):
        KafkaBackend(kafka_service.url, prefix=f"rf-{uuid.uuid4().hex[:8]}-", replication_factor=2)


@pytest.mark.kafka
def test_internal_topics_below_the_brokers_default_are_a_warning_at_start(
    kafka_service: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One broker cannot have a default above 1: here it says 3 (the rest of the start is real)."""
    from idempotent.adapters.kafka import backend as kafka

    asked: list[dict[int, Any]] = []

    def three(admin: Any, brokers: dict[int, Any], timeout: float) -> int:
        asked.append(brokers)
        return 3

    monkeypatch.setattr(kafka, "broker_default_replicas", three)
    prefix = f"rf-{uuid.uuid4().hex[:8]}-"
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        backend = kafka.KafkaBackend(kafka_service.url, prefix=prefix)
        backend.close()
    assert len(asked) == 1 and len(asked[0]) == 1  # asked once, of the one broker
    warned = sorted(r.getMessage() for r in caplog.records if "internal topic" in r.getMessage())
    assert len(warned) == 2, warned
    for name, text in zip(INTERNAL, warned, strict=True):
        assert f"'{prefix}{name}' has 1 replica(s)" in text and "kafka-reassign-partitions" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "idempotent.adapters.kafka"):
        with idempotent.Producer(kafka_service.url, "checked", prefix=prefix) as producer:
            producer.send("orders", b"v", partition=0).result(60)  # made the state topic: the next start checks it
        with idempotent.Producer(kafka_service.url, "checked", prefix=prefix) as producer:
            producer.send("orders", b"w", partition=0).result(60)
    warned = [r.getMessage() for r in caplog.records if "__idempotent_producer_state" in r.getMessage()]
    assert len(warned) == 1 and "has 1 replica(s) per partition" in warned[0] and "16 partition(s)" in warned[0]


@pytest.mark.kafka
def test_the_brokers_default_replication_factor_is_read(kafka_service: Any) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_service.bootstrap})
    brokers = dict(admin.list_topics(timeout=30).brokers)
    assert _kafka_replicas.broker_default_replicas(admin, brokers, 30) == 1
    assert _kafka_replicas.broker_default_replicas(admin, {}, 30) is None


def test_a_configuration_the_cluster_does_not_answer_in_time_is_not_known() -> None:
    """A recovering cluster (its controller killed) may leave describe_configs unanswered:
    the future's TimeoutError is "not known", as a refusal is, not an exception that stopped
    the mirror's destination from opening (a bug with its traceback)."""
    from concurrent.futures import Future

    class Silent:
        def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future[Any]]:
            return {resource: Future() for resource in resources}

    assert _kafka_replicas.broker_default_replicas(Silent(), {1: None}, 0.01) is None
    metadata = types.SimpleNamespace(partitions={0: types.SimpleNamespace(id=0, leader=1, replicas=[1], isrs=[1])})
    described = _kafka_replicas.describe_replicas(Silent(), metadata, "orders", 0.01)
    assert described.min_insync_replicas is None and [p.replicas for p in described.partitions] == [(1,)]


def test_the_clusters_brokers_are_those_up_and_those_holding_replicas() -> None:
    def partition(*replicas: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(replicas=list(replicas))

    topics = {
        "orders": types.SimpleNamespace(partitions={0: partition(1, 2, 3), 1: partition(2, 3, 1)}),
        "audit": types.SimpleNamespace(partitions={0: partition(4)}),
        "new": types.SimpleNamespace(partitions={}),
    }
    cluster = types.SimpleNamespace(brokers={1: None, 2: None, 3: None}, topics=topics)
    assert _kafka_replicas.cluster_brokers(cluster) == {1, 2, 3, 4}  # 4: away, holding a replica
    cluster.brokers = {1: None, 2: None, 5: None}  # 3 restarting, 5 new
    assert _kafka_replicas.cluster_brokers(cluster) == {1, 2, 3, 4, 5}
    assert _kafka_replicas.cluster_brokers(types.SimpleNamespace(brokers={1: None}, topics={})) == {1}


# -- idempotent topics describe ------------------------------------------------------------


@pytest.mark.kafka
def test_describe_shows_the_replicas_on_kafka(kafka_service: Any, capsys: pytest.CaptureFixture[str]) -> None:
    topic = f"described-{uuid.uuid4().hex[:6]}"
    assert run(capsys, "topics", "create", kafka_service.url, topic, "--partitions", "2")[0] == 0
    code, out, err = run(capsys, "topics", "describe", kafka_service.url, topic)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == [
        "PARTITION",
        "END_OFFSET",
        "STATUS",
        "SNAPSHOT_AT",
        "PRODUCERS",
        "LEADER",
        "REPLICAS",
        "ISR",
    ]
    assert [line.split()[-3:] for line in lines[2:4]] == [["1", "1", "1"], ["1", "1", "1"]]
    assert "min.insync.replicas: 1 (the brokers' default)" in out
    code, out, err = run(capsys, "topics", "describe", kafka_service.url, topic, "--json")
    described = json.loads(out)
    assert [(p["leader"], p["replicas"], p["isr"]) for p in described["partition_details"]] == [(1, [1], [1])] * 2
    assert described["replication"] == {
        "note": None,
        "min_insync_replicas": 1,
        "min_insync_source": "broker",
        "under_replicated": [],
    }


def test_describe_says_what_keeps_the_copies_elsewhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert run(capsys, "topics", "create", url, "t")[0] == 0
    code, out, err = run(capsys, "topics", "describe", url, "t")
    assert code == 0, err
    assert out.splitlines()[1].split() == ["PARTITION", "END_OFFSET", "STATUS", "SNAPSHOT_AT", "PRODUCERS"]
    assert "replicas: one copy, in the SQLite file" in out
    code, out, err = run(capsys, "topics", "describe", url, "t", "--json")
    assert json.loads(out)["replication"] == {"note": "one copy, in the SQLite file"}


@pytest.mark.pulsar
def test_describe_says_how_bookkeeper_keeps_a_pulsar_topic(
    pulsar_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import urllib.parse
    import urllib.request

    url = f"{pulsar_service.url}?{urllib.parse.urlencode({'admin_url': pulsar_service.admin_url})}"
    plain = f"described-{uuid.uuid4().hex[:6]}"
    assert run(capsys, "topics", "create", url, plain, "--partitions", "2")[0] == 0
    code, out, err = run(capsys, "topics", "describe", url, plain)
    assert code == 0, err
    assert out.splitlines()[1].split() == ["PARTITION", "END_OFFSET", "STATUS", "SNAPSHOT_AT", "PRODUCERS"]
    (line,) = [line for line in out.splitlines() if line.startswith("replicas: ")]
    # the standalone broker's defaults: one bookie
    assert "each write on 1 bookie(s) of an ensemble of 1, acknowledged by 1, for every partition" in line
    assert "from the brokers' defaults: the namespace public/default has no persistence policy" in line

    namespace = f"public/replicas-{uuid.uuid4().hex[:6]}"
    topic = f"{namespace}/t"
    assert run(capsys, "topics", "create", url, topic)[0] == 0  # (creates the namespace)
    policy = {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1}
    request = urllib.request.Request(
        f"{pulsar_service.admin_url}/admin/v2/namespaces/{namespace}/persistence",
        data=json.dumps({**policy, "managedLedgerMaxMarkDeleteRate": 0}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status in (200, 204)
    code, out, err = run(capsys, "topics", "describe", url, topic, "--json")
    assert code == 0, err
    note = json.loads(out)["replication"]["note"]
    assert f"(from the namespace {namespace}'s persistence policy)" in note and "ensemble of 1" in note
