"""Prometheus metrics: a live endpoint scraped after real produces, and the observer hook."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import idempotent
from idempotent import Outcome
from idempotent.adapters import open_backend
from idempotent.adapters.memory import MemoryBackend
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.broker.metrics import BrokerMetrics, MetricsServer, start_metrics_server
from idempotent.broker.observer import BrokerObserver
from idempotent.core.checker import CheckerConfig
from idempotent.errors import BackendUnavailableError, ConfigError, InvalidTopicError

from ..conftest import memory_harness, sqlite_harness

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: MetricsServer) -> Samples:
    with urllib.request.urlopen(server.url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist (yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def test_endpoint_counts_every_outcome_after_real_produces(tmp_path: Path) -> None:
    broker = Broker(open_backend(sqlite_harness(tmp_path).url), BrokerConfig(maintenance_interval=0))
    server = start_metrics_server(broker, "127.0.0.1", 0)
    try:
        before = scrape(server)
        assert value(before, "idempotent_produce_requests_total", topic="t", outcome="ACCEPTED") == 0
        assert value(before, "idempotent_broker_info", backend="sqlite", version=idempotent.__version__) == 1
        broker.create_topic("t", 2)
        s = broker.init_producer("app")
        pid, epoch = s.producer_id, s.producer_epoch
        assert broker.produce("t", 0, pid, epoch, 0, [b"ab", b"cd"]).outcome is Outcome.ACCEPTED
        assert broker.produce("t", 0, pid, epoch, 0, [b"ab", b"cd"]).outcome is Outcome.DUPLICATE
        assert broker.produce("t", 0, pid, epoch, 5, [b"ef"]).outcome is Outcome.OUT_OF_ORDER_SEQUENCE
        assert broker.produce("t", 0, 987_654, 0, 0, [b"x"]).outcome is Outcome.UNKNOWN_PRODUCER
        newer = broker.init_producer("app")
        assert newer.producer_epoch == epoch + 1
        assert broker.produce("t", 1, pid, epoch, 0, [b"x"]).outcome is Outcome.FENCED
        with pytest.raises(InvalidTopicError):
            broker.produce("t", 9, pid, newer.producer_epoch, 0, [b"x"])
        with idempotent.Producer(broker, "real") as producer:
            for i in range(10):
                producer.send("t", b"v%d" % i, partition=i % 2)
        after = scrape(server)
    finally:
        server.close()
        broker.close()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "idempotent_produce_requests_total"
    assert delta(requests, topic="t", outcome="DUPLICATE") == 1
    assert delta(requests, topic="t", outcome="OUT_OF_ORDER_SEQUENCE") == 1
    assert delta(requests, topic="t", outcome="UNKNOWN_PRODUCER") == 1
    assert delta(requests, topic="t", outcome="FENCED") == 1
    assert delta(requests, topic="", outcome="ERROR") == 1  # a partition the topic lacks: no label per name
    assert delta("idempotent_produce_errors_total", topic="", error="InvalidTopicError") == 1
    accepted = delta(requests, topic="t", outcome="ACCEPTED")
    assert 2 <= accepted <= 11  # one batch above, the Producer's ten records in at least one batch per partition
    assert delta("idempotent_records_appended_total", topic="t") == 2 + 10
    # the size max_batch_bytes limits: key + value + headers, plus 16 bytes per record
    assert delta("idempotent_bytes_appended_total", topic="t") == (2 + 10) * 16 + 4 + 10 * 2
    assert delta("idempotent_backend_append_seconds_count") == accepted
    assert delta("idempotent_produce_request_seconds_count") == accepted + 5
    assert delta("idempotent_producer_inits_total", kind="named", result="ok") == 3
    assert delta("idempotent_partition_recoveries_total", topic="t") == 2  # each partition loaded once
    # gauges, read at scrape time
    for p in ("0", "1"):
        assert value(after, "idempotent_partition_in_flight_batches", topic="t", partition=p) == 0
        assert value(after, "idempotent_partition_recovering", topic="t", partition=p) == 0
    assert value(after, "idempotent_partition_position", topic="t", partition="0") == 2 + 5
    assert value(after, "idempotent_partition_position", topic="t", partition="1") == 5
    assert value(after, "idempotent_partition_producers", topic="t", partition="0") == 2  # app and real
    assert value(after, "idempotent_partition_producers", topic="t", partition="1") == 1  # real (app was fenced)
    assert value(after, "idempotent_topic_deduplication_enabled", topic="t", policy="strict") == 1
    assert value(after, "idempotent_partitions_loaded") == 2


def test_in_flight_batches_gauge_and_in_flight_outcome() -> None:
    broker = Broker(open_backend(memory_harness().url), BrokerConfig(maintenance_interval=0))
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    server = start_metrics_server(broker, "127.0.0.1", 0)
    try:
        s = broker.init_producer()
        broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        backend.faults.delay = 0.3
        pending = broker.submit_produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
        during = scrape(server)
        resend = broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
        backend.faults.delay = 0.0
        assert pending.result(5).outcome is Outcome.ACCEPTED
        after = scrape(server)
    finally:
        server.close()
        broker.close()
    assert resend.outcome is Outcome.IN_FLIGHT
    assert value(during, "idempotent_partition_in_flight_batches", topic="t", partition="0") == 1
    assert value(after, "idempotent_partition_in_flight_batches", topic="t", partition="0") == 0
    assert value(after, "idempotent_produce_requests_total", topic="t", outcome="IN_FLIGHT") == 1
    assert value(after, "idempotent_produce_requests_total", topic="t", outcome="ACCEPTED") == 2
    assert value(after, "idempotent_producer_inits_total", kind="new", result="ok") == 1


def test_failed_append_recovery_snapshot_and_eviction_metrics() -> None:
    expiry = 3600.0
    config = BrokerConfig(checker=CheckerConfig(producer_expiry=expiry), maintenance_interval=0)
    broker = Broker(open_backend(memory_harness().url), config)
    backend = broker.backend
    assert isinstance(backend, MemoryBackend)
    server = start_metrics_server(broker, "127.0.0.1", 0)
    try:
        s = broker.init_producer()
        broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        backend.faults.lose_ack = 1
        with pytest.raises(BackendUnavailableError):
            broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
        failed = scrape(server)
        # the next request recovers the partition from the log: the lost ack's batch is there
        assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"]).outcome is Outcome.DUPLICATE
        recovered = scrape(server)
        broker.maintain(now=broker.stats("t")[0].producers[0].last_timestamp + expiry + 1)
        maintained = scrape(server)
    finally:
        server.close()
        broker.close()
    assert value(failed, "idempotent_backend_append_failures_total", topic="t") == 1
    assert value(failed, "idempotent_produce_errors_total", topic="t", error="BackendUnavailableError") == 1
    assert value(failed, "idempotent_partition_recovering", topic="t", partition="0") == 1
    assert value(recovered, "idempotent_partition_recovering", topic="t", partition="0") == 0
    assert value(recovered, "idempotent_partition_recoveries_total", topic="t") == 2
    assert value(recovered, "idempotent_replayed_batches_total", topic="t") == 2
    assert value(recovered, "idempotent_partition_recovery_seconds_count") == 2
    assert ("idempotent_partition_snapshot_age_seconds", frozenset({("topic", "t"), ("partition", "0")})) not in (
        recovered
    )
    # the expiry sweep evicts the idle producer and stores a snapshot to make it durable
    assert value(maintained, "idempotent_producers_evicted_total", topic="t") == 1
    assert value(maintained, "idempotent_snapshots_total", topic="t", result="ok") == 1
    assert value(maintained, "idempotent_partition_producers", topic="t", partition="0") == 0
    assert value(maintained, "idempotent_partition_snapshot_position", topic="t", partition="0") == 2
    # the sweep ran with a clock an hour ahead, so the age is negative here; what matters is that it is reported
    assert ("idempotent_partition_snapshot_age_seconds", frozenset({("topic", "t"), ("partition", "0")})) in maintained


def test_a_scrape_recovers_nothing(tmp_path: Path) -> None:
    url = sqlite_harness(tmp_path).url
    with idempotent.Producer(url, "p") as producer:
        producer.send("t", b"a").result()
    broker = Broker(open_backend(url), BrokerConfig(maintenance_interval=0))
    server = start_metrics_server(broker, "127.0.0.1", 0)
    try:
        cold = scrape(server)
        assert broker.stats(recover=False) == []
        assert len(broker.stats()) == 1  # loads the partition
        warm = scrape(server)
    finally:
        server.close()
        broker.close()
    assert value(cold, "idempotent_partitions_loaded") == 0
    assert "idempotent_partition_producers" not in names(cold)
    assert value(cold, "idempotent_partition_recoveries_total", topic="t") == 0
    assert value(cold, "idempotent_topic_deduplication_enabled", topic="t", policy="strict") == 1
    assert value(warm, "idempotent_partitions_loaded") == 1
    assert value(warm, "idempotent_partition_producers", topic="t", partition="0") == 1
    assert value(warm, "idempotent_partition_recoveries_total", topic="t") == 1


def test_deduplication_gauge_follows_settings() -> None:
    broker = Broker(open_backend(memory_harness().url), BrokerConfig(maintenance_interval=0))
    server = start_metrics_server(broker, "127.0.0.1", 0)
    try:
        broker.create_topic("a/b/t")
        broker.set_deduplication(False, namespace="a/b")
        broker.set_policy("monotonic", topic="a/b/t")
        samples = scrape(server)
    finally:
        server.close()
        broker.close()
    assert value(samples, "idempotent_topic_deduplication_enabled", topic="a/b/t", policy="monotonic") == 0
    assert ("idempotent_topic_deduplication_enabled", frozenset({("topic", "a/b/t"), ("policy", "strict")})) not in (
        samples
    )


class _Failing(BrokerObserver):
    def __init__(self) -> None:
        self.calls = 0

    def produce_completed(self, *args: object) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")


def test_observer_failures_never_reach_the_producer_and_close_detaches() -> None:
    broker = Broker(open_backend(memory_harness().url), BrokerConfig(maintenance_interval=0))
    failing = _Failing()
    broker.add_observer(failing)
    broker.add_observer(failing)  # added once
    metrics = BrokerMetrics(broker)
    s = broker.init_producer()
    assert broker.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    assert failing.calls == 1
    assert metrics.registry.get_sample_value("idempotent_produce_requests_total", {"topic": "t", "outcome": "ACCEPTED"})
    metrics.close()
    metrics.close()  # idempotent
    broker.remove_observer(failing)
    broker.produce("t", 0, s.producer_id, s.producer_epoch, 1, [b"b"])
    assert failing.calls == 1
    assert list(metrics.registry.collect()) == []
    # the same registry can host a new set after close; a second live set is refused
    again = BrokerMetrics(broker, metrics.registry)
    with pytest.raises(ValueError):
        BrokerMetrics(broker, metrics.registry)
    again.close()
    broker.close()


def test_metrics_server_refuses_a_busy_port_and_leaves_nothing_running() -> None:
    broker = Broker(open_backend(memory_harness().url), BrokerConfig(maintenance_interval=0))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="cannot serve metrics"):
            start_metrics_server(broker, "127.0.0.1", busy.getsockname()[1])
    assert broker._observers == ()
    broker.close()


# -- the Grafana dashboard (docs/grafana/idempotent-broker.json) --------------------------------


def test_every_metric_the_grafana_dashboard_queries_is_exported() -> None:
    """Names read from a real registry after traffic (accepted, duplicate, refused, a failed
    append and its recovery, snapshots, a producer init, partition ownership), never from a
    list written by hand."""
    import json
    import re

    from prometheus_client import generate_latest

    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana" / "idempotent-broker.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(idempotent_[a-z_]+)", target["expr"])
    }
    queried |= set(re.findall(r"\b(idempotent_[a-z_]+)", json.dumps(dashboard["templating"])))
    assert len(queried) >= 20

    broker = idempotent.connect(
        "memory://",
        BrokerConfig(
            broker_id="b1", maintenance_interval=0, checker=CheckerConfig(snapshot_entries=2, max_producers=1)
        ),
    )
    metrics = BrokerMetrics(broker)
    try:
        broker.create_topic("t", 2)
        session = broker.init_producer()
        for base in range(0, 12, 3):
            broker.produce("t", 0, session.producer_id, session.producer_epoch, base, [b"a", b"b", b"c"])
        broker.produce("t", 0, session.producer_id, session.producer_epoch, 0, [b"a"])  # DUPLICATE
        with pytest.raises(idempotent.InvalidBatchError):
            broker.produce("t", 0, session.producer_id, session.producer_epoch, -5, [b"a"])
        other = broker.init_producer()  # a second producer on t[0]: the first is evicted
        broker.produce("t", 0, other.producer_id, other.producer_epoch, 0, [b"z"])
        broker.backend.faults.lose_ack = 1  # type: ignore[attr-defined]
        with pytest.raises(idempotent.BackendUnavailableError):  # the ack is lost: the partition recovers
            broker.produce("t", 0, other.producer_id, other.producer_epoch, 1, [b"y"])
        broker.produce("t", 0, other.producer_id, other.producer_epoch, 1, [b"y"])  # DUPLICATE, after recovery
        text = generate_latest(metrics.registry).decode()
    finally:
        metrics.close()
        broker.close()
    exported = set(re.findall(r"^(idempotent_[a-z_]+)", text, re.MULTILINE))
    missing = sorted(queried - exported)
    assert not missing, f"the dashboard queries metrics the broker does not export: {missing}"
