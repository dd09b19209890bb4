"""Prometheus metrics for a broker, and an HTTP endpoint that serves them.

:class:`BrokerMetrics` observes a :class:`~idempotent.broker.broker.Broker` (it is a
:class:`~idempotent.broker.observer.BrokerObserver`) and keeps counters and histograms of what
happens: produce requests by outcome, records and bytes appended, backend append latency,
recoveries, snapshots, evictions, producer initialisations. Gauges (in-flight batches,
tracked producers, snapshot position and age, recovering partitions) are read from the
broker when Prometheus scrapes, from the partitions already in memory: a scrape never
recovers a partition or reads the backend.

    >>> import idempotent
    >>> from idempotent.broker.metrics import start_metrics_server
    >>> broker = idempotent.connect("memory://")
    >>> server = start_metrics_server(broker, "127.0.0.1", 0)  # GET http://127.0.0.1:<server.port>/metrics
    >>> server.close(); broker.close()

Every metric is listed, with its type, labels and meaning, in ``docs/operations.md``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from idempotent import __version__
from idempotent.broker.observer import BrokerObserver
from idempotent.core.outcomes import Outcome
from idempotent.errors import ConfigError, InvalidTopicError, ProducerError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from idempotent.broker.broker import Broker
    from idempotent.core.outcomes import ProduceResult
    from idempotent.core.values import PartitionStats

#: Label value of ``outcome`` for a produce request that ended with an exception.
ERROR = "ERROR"
#: Buckets (seconds) of the produce request and backend append latency histograms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Buckets (seconds) of the partition recovery time histogram.
RECOVERY_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Default port of the metrics endpoint.
DEFAULT_PORT = 9464


class BrokerMetrics(BrokerObserver):
    """The Prometheus metrics of one broker, registered in ``registry``.

    Creating it adds it to the broker's observers and registers every metric; :meth:`close`
    undoes both. Use a fresh :class:`~prometheus_client.CollectorRegistry` per broker (the
    default) unless the process serves one broker only.

    Raises:
        ValueError: the registry already holds metrics with these names.
    """

    def __init__(self, broker: Broker, registry: CollectorRegistry | None = None) -> None:
        self.broker = broker
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.produce_requests = Counter(
            "idempotent_produce_requests",
            "Produce requests answered, by topic and outcome (ACCEPTED, DUPLICATE, OUT_OF_ORDER_SEQUENCE, "
            "IN_FLIGHT, FENCED, UNKNOWN_PRODUCER, or ERROR for a request that raised).",
            ["topic", "outcome"],
            registry=r,
        )
        self.produce_errors = Counter(
            "idempotent_produce_errors",
            "Produce requests that ended with an exception, by topic and error class.",
            ["topic", "error"],
            registry=r,
        )
        self.produce_seconds = Histogram(
            "idempotent_produce_request_seconds",
            "Time from a produce request's arrival at the broker to its answer.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.records_appended = Counter(
            "idempotent_records_appended", "Records of accepted batches stored in the log.", ["topic"], registry=r
        )
        self.bytes_appended = Counter(
            "idempotent_bytes_appended",
            "Size of accepted batches stored in the log, as max_batch_bytes counts it "
            "(keys, values and headers, plus 16 bytes per record and 4 per header).",
            ["topic"],
            registry=r,
        )
        self.append_seconds = Histogram(
            "idempotent_backend_append_seconds",
            "Time the backend took to acknowledge one append.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.append_failures = Counter(
            "idempotent_backend_append_failures",
            "Appends the backend failed (their outcome is unknown; the partition recovers from the log).",
            ["topic"],
            registry=r,
        )
        self.recoveries = Counter(
            "idempotent_partition_recoveries",
            "Partition checkers rebuilt from a snapshot plus a log replay.",
            ["topic"],
            registry=r,
        )
        self.recovery_seconds = Histogram(
            "idempotent_partition_recovery_seconds",
            "Time to rebuild one partition's checker (snapshot read plus log replay).",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.replayed_batches = Counter(
            "idempotent_replayed_batches",
            "Log batches replayed while recovering partitions.",
            ["topic"],
            registry=r,
        )
        self.snapshots = Counter(
            "idempotent_snapshots",
            "Checker snapshots stored (result ok) or that failed to store (result failed).",
            ["topic", "result"],
            registry=r,
        )
        self.evictions = Counter(
            "idempotent_producers_evicted",
            "Producer states dropped from partitions (idle past the expiry, or over max_producers).",
            ["topic"],
            registry=r,
        )
        self.producer_inits = Counter(
            "idempotent_producer_inits",
            "init_producer calls, by kind (new: anonymous id; named: a named producer's new epoch) and result.",
            ["kind", "result"],
            registry=r,
        )
        self._series: dict[str, _TopicSeries] = {}
        self._state = _StateCollector(broker)
        r.register(self._state)
        self._closed = False
        self._lock = threading.Lock()
        broker.add_observer(self)

    def close(self) -> None:
        """Stop observing the broker and unregister every metric from the registry."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.broker.remove_observer(self)
        for collector in (
            self.produce_requests,
            self.produce_errors,
            self.produce_seconds,
            self.records_appended,
            self.bytes_appended,
            self.append_seconds,
            self.append_failures,
            self.recoveries,
            self.recovery_seconds,
            self.replayed_batches,
            self.snapshots,
            self.evictions,
            self.producer_inits,
            self._state,
        ):
            self.registry.unregister(collector)

    def _topic(self, topic: str) -> _TopicSeries:
        """The per-topic series of the produce path, created once per topic (``labels`` is slow)."""
        series = self._series.get(topic)
        if series is None:
            series = self._series[topic] = _TopicSeries(
                {o: self.produce_requests.labels(topic, o) for o in (*(o.name for o in Outcome), ERROR)},
                self.records_appended.labels(topic),
                self.bytes_appended.labels(topic),
            )
        return series

    # -- events (BrokerObserver) --------------------------------------------------------------

    def produce_completed(
        self, topic: str, partition: int, result: ProduceResult, record_count: int, byte_count: int, seconds: float
    ) -> None:
        series = self._topic(topic)
        outcome = result.outcome
        series.requests[outcome.name].inc()
        self.produce_seconds.observe(seconds)
        if outcome is Outcome.ACCEPTED:
            series.records.inc(record_count)
            series.bytes.inc(byte_count)

    def produce_failed(self, topic: str, partition: int, error: BaseException, seconds: float) -> None:
        # A request for a topic the broker does not have must not create a label value per
        # name a client sends: such requests are counted under topic="".
        if isinstance(error, InvalidTopicError) or topic not in self.broker.topics():
            topic = ""
        self._topic(topic).requests[ERROR].inc()
        self.produce_errors.labels(topic, type(error).__name__).inc()
        self.produce_seconds.observe(seconds)

    def append_completed(self, topic: str, partition: int, seconds: float, ok: bool) -> None:
        self.append_seconds.observe(seconds)
        if not ok:
            self.append_failures.labels(topic).inc()

    def partition_recovered(self, topic: str, partition: int, seconds: float, replayed_batches: int) -> None:
        self.recoveries.labels(topic).inc()
        self.recovery_seconds.observe(seconds)
        self.replayed_batches.labels(topic).inc(replayed_batches)

    def snapshot_written(self, topic: str, partition: int, ok: bool) -> None:
        self.snapshots.labels(topic, "ok" if ok else "failed").inc()

    def producers_evicted(self, topic: str, partition: int, count: int) -> None:
        self.evictions.labels(topic).inc(count)

    def producer_initialised(self, named: bool, ok: bool) -> None:
        self.producer_inits.labels("named" if named else "new", "ok" if ok else "failed").inc()


@attrs.frozen
class _TopicSeries:
    requests: dict[str, Counter]
    records: Counter
    bytes: Counter


#: (name, help) of every gauge the state collector reports per partition.
_PARTITION_GAUGES = (
    ("idempotent_partition_recovering", "1 while the partition rebuilds its checker after a failed append, else 0."),
    ("idempotent_partition_in_flight_batches", "Batches accepted by the checker whose append is not acknowledged."),
    ("idempotent_partition_producers", "Producers whose sequence state the partition's checker tracks."),
    ("idempotent_partition_position", "Offset below which the checker has applied every stored batch."),
    ("idempotent_partition_snapshot_position", "Log position of the partition's newest snapshot (-1: none)."),
    ("idempotent_partition_snapshot_age_seconds", "Seconds since the newest snapshot was taken (absent: none yet)."),
    ("idempotent_partition_entries_since_snapshot", "Batches applied since the newest snapshot."),
    ("idempotent_partition_last_recovery_seconds", "Duration of the partition's last checker recovery."),
)


class _StateCollector(Collector):
    """Gauges read from the broker at scrape time (partitions already in memory only)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def describe(self) -> Iterable[GaugeMetricFamily | InfoMetricFamily]:
        yield InfoMetricFamily("idempotent_broker", "The broker's version and backend type.")
        yield GaugeMetricFamily("idempotent_topic_deduplication_enabled", "", labels=["topic", "policy"])
        yield GaugeMetricFamily("idempotent_partitions_loaded", "")
        yield GaugeMetricFamily("idempotent_partitions_owned", "")
        for name, text in _PARTITION_GAUGES:
            yield GaugeMetricFamily(name, text, labels=["topic", "partition"])

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        broker = self.broker
        info = InfoMetricFamily("idempotent_broker", "The broker's version and backend type.")
        info.add_metric([], {"version": __version__, "backend": broker.url.split(":", 1)[0]})
        yield info
        try:
            topics = broker.topics()
            stats = broker.stats(recover=False)
            dedup = [(t, broker.deduplication_enabled(t), broker.policy_for(t).value) for t in sorted(topics)]
        except ProducerError:  # closed, or a topic vanished mid-scrape: report nothing this time
            return
        enabled = GaugeMetricFamily(
            "idempotent_topic_deduplication_enabled",
            "1 when the checker rejects duplicates and gaps on the topic, else 0; policy is the sequence policy.",
            labels=["topic", "policy"],
        )
        for topic, on, policy in dedup:
            enabled.add_metric([topic, policy], 1.0 if on else 0.0)
        yield enabled
        yield GaugeMetricFamily(
            "idempotent_partitions_loaded", "Partitions whose checker is in memory.", value=float(len(stats))
        )
        if broker.config.broker_id is not None:  # partitions are owned only by brokers that share a backend
            yield GaugeMetricFamily(
                "idempotent_partitions_owned",
                "Partitions whose lease this broker holds (it changes as partitions move between brokers).",
                value=float(len(broker.owned())),
            )
        families = {
            name: GaugeMetricFamily(name, text, labels=["topic", "partition"]) for name, text in _PARTITION_GAUGES
        }
        for s in stats:
            labels = [s.topic, str(s.partition)]
            for name, value in _partition_values(s):
                if value is not None:
                    families[name].add_metric(labels, value)
        yield from families.values()


def _partition_values(s: PartitionStats) -> Iterator[tuple[str, float | None]]:
    yield "idempotent_partition_recovering", 1.0 if s.status == "recovering" else 0.0
    yield "idempotent_partition_in_flight_batches", float(s.pending)
    yield "idempotent_partition_producers", float(len(s.producers))
    yield "idempotent_partition_position", float(s.position)
    yield "idempotent_partition_snapshot_position", float(s.snapshot_position)
    yield "idempotent_partition_snapshot_age_seconds", s.snapshot_age
    yield "idempotent_partition_entries_since_snapshot", float(s.entries_since_snapshot)
    yield "idempotent_partition_last_recovery_seconds", s.recovery_seconds


class MetricsServer:
    """A running metrics endpoint (``GET /metrics``); see :func:`start_metrics_server`."""

    def __init__(self, metrics: BrokerMetrics, httpd: WSGIServer, thread: threading.Thread) -> None:
        self.metrics = metrics
        self._httpd = httpd
        self._thread = thread
        self.host: str = str(httpd.server_address[0])
        self.port: int = httpd.server_address[1]

    @property
    def url(self) -> str:
        """The address to scrape."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and stop observing the broker. The broker itself stays open."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)
        self.metrics.close()


def start_metrics_server(broker: Broker, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> MetricsServer:
    """Serve ``broker``'s metrics over HTTP at ``http://host:port/metrics`` from a daemon thread.

    ``port`` 0 picks a free port (read it from the result's ``port``).

    Raises:
        ConfigError: the address cannot be bound (in use, or not an address of this host);
            nothing is left running.
    """
    metrics = BrokerMetrics(broker)
    try:
        httpd, thread = start_http_server(port, host, registry=metrics.registry)
    except OSError as exc:
        metrics.close()
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    return MetricsServer(metrics, httpd, thread)


__all__ = ["DEFAULT_PORT", "ERROR", "BrokerMetrics", "MetricsServer", "start_metrics_server"]
