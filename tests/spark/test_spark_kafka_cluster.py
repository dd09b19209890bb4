"""The Spark sink on a Spark standalone cluster, writing a topic of a 3-node Kafka cluster
(RF 3, min ISR 2) through broker faults (markers ``spark`` and ``kafka``).

A driver subprocess (tests/spark_jobs.py ``batch``) writes numbered rows on the standalone
cluster of tests.spark_session (an executor on each of two workers) to a ``kafka://`` URL
of the cluster service (idempotent.testing.services.kafka_cluster). While its tasks write, one fault
hits the Kafka cluster: a rolling restart of the three nodes (controlled shutdown), kill -9
of a partition leader, kill -9 of the active controller, or SIGSTOP of a partition leader
for longer than the request timeout. Spark may retry tasks; the job must complete, with
every row stored exactly once as a ``read_committed`` consumer counts them, and nothing
logged as a bug by the broker server that serves the URL on the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from idempotent.spark._host import _key, absolute_url, hosts_dir, stop_host
from idempotent.testing.services import kafka_cluster

if TYPE_CHECKING:
    from tests.spark_session import StandaloneCluster

pytest_plugins = ["tests.spark_session"]  # the fixtures spark_cluster and spark_hosts

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(1500)]

JOBS = Path(__file__).resolve().parents[1] / "spark_jobs.py"
ROOT = Path(__file__).resolve().parents[2]
ROWS = 60_000
PARTITIONS = 6
#: longer than librdkafka's request.timeout.ms (30 s) and the adapter's timeout (30 s)
PAUSE_SECONDS = 40.0
QUIET = {"log_level": 0}


@pytest.fixture
def cluster(kafka_cluster_service: Any) -> Iterator[kafka_cluster.ClusterInfo]:
    """The session's Kafka cluster, whole before the test (its transaction coordinators
    loaded: a node that an earlier test restarted may still be loading them) and after it."""
    kafka_cluster.heal()
    _wait_for_transactions(kafka_cluster_service.bootstrap, timeout=180)
    yield kafka_cluster_service
    kafka_cluster.heal()


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (Kafka maps a transactional id to a coordinator with it)."""
    h = 0
    for char in text:
        h = (31 * h + ord(char)) & 0xFFFFFFFF
    return h


def _wait_for_transactions(bootstrap: str, timeout: float) -> None:
    """Wait until a transactional producer initialises with every transaction coordinator
    (one transactional id per partition of ``__transaction_state``)."""
    from confluent_kafka import KafkaException, Producer

    count = len(kafka_cluster.partitions("__transaction_state"))
    ids: dict[int, str] = {}
    n = 0
    while len(ids) < count:
        name = f"spark-probe-{n}"
        ids.setdefault((_java_hash(name) & 0x7FFFFFFF) % count, name)
        n += 1
    deadline = time.monotonic() + timeout
    for name in ids.values():
        while True:
            producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": name, **QUIET})
            try:
                producer.init_transactions(30)
                break
            except KafkaException as exc:
                assert time.monotonic() < deadline, f"{name} did not initialise in {timeout} s: {exc}"
                time.sleep(1)
            finally:
                producer.flush(5)


def _driver(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(JOBS), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**environment, **env},
        start_new_session=True,
    )


def _ends(bootstrap: str, topic: str) -> int:
    """The sum of the topic's high watermarks (records and transaction markers)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-watch", **QUIET})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


def _wait_for_progress(bootstrap: str, topic: str, beyond: int, child: subprocess.Popen[str], timeout: float) -> int:
    """Wait until the topic's ends passed ``beyond`` while the job runs; returns them."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        if child.poll() is not None:
            out = child.stdout.read() if child.stdout else ""
            raise AssertionError(f"the job ended (status {child.returncode}) before the fault:\n{out[-6000:]}")
        try:
            ends = _ends(bootstrap, topic)
        except KafkaException:  # a node restarting: ask again
            ends = beyond
        if ends > beyond:
            return ends
        assert time.monotonic() < deadline, f"the job stored nothing beyond {beyond} in {timeout} s"
        time.sleep(0.5)


def _wait_for_writes_after(
    bootstrap: str, topic: str, before: int, child: subprocess.Popen[str], timeout: float
) -> None:
    """After a fault: wait until the topic grew beyond ``before`` (the job writes again), or
    until the job ended, whose rows the caller then counts."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while child.poll() is None:
        try:
            if _ends(bootstrap, topic) > before:
                return
        except KafkaException:  # a node still restarting: ask again
            pass
        assert time.monotonic() < deadline, f"the job wrote nothing in {timeout} s after the fault"
        time.sleep(0.5)


def _committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """Every value of the topic as a plain ``read_committed`` consumer reads them, up to each
    partition's end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"spark-count-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            **QUIET,
        }
    )
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 300
        while len(done) < PARTITIONS:
            assert time.monotonic() < deadline, f"read only {len(values)} values; partitions at their end: {done}"
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and message.offset() >= ends[message.partition()]:
                    done.add(message.partition())
                continue
            values.append(message.value())
        return values
    finally:
        consumer.close()


def _rolling_restart(topic: str) -> None:
    kafka_cluster.rolling_restart()


def _kill_leader(topic: str) -> None:
    node = kafka_cluster.leader_of(topic, 0)
    kafka_cluster.kill9(node)
    time.sleep(10)  # the cluster runs without it while the tasks write
    kafka_cluster.start(node)


def _kill_controller(topic: str) -> None:
    node = kafka_cluster.active_controller()
    kafka_cluster.kill9(node)
    time.sleep(10)
    kafka_cluster.start(node)


def _pause_leader(topic: str) -> None:
    node = kafka_cluster.leader_of(topic, 1)
    kafka_cluster.pause(node)
    time.sleep(PAUSE_SECONDS)
    kafka_cluster.resume(node)


FAULTS: dict[str, tuple[Callable[[str], None], float]] = {
    # fault, and how long each task spreads its rows over (the fault must come mid-write)
    "rolling-restart": (_rolling_restart, 150.0),
    "leader-kill9": (_kill_leader, 60.0),
    "controller-kill9": (_kill_controller, 60.0),
    "leader-sigstop": (_pause_leader, 80.0),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_spark_sink_on_a_kafka_cluster_stores_every_row_once_through_a_fault(
    fault: str, cluster: kafka_cluster.ClusterInfo, spark_cluster: StandaloneCluster, spark_hosts: Path
) -> None:
    inject, duration = FAULTS[fault]
    topic = f"spark-{fault}-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, PARTITIONS)  # RF 3, min ISR 2
    url = f"{cluster.url}?replication_factor=3"  # the ledger and the project's own topics too
    log = hosts_dir() / f"{_key(absolute_url(url))}.log"
    logged_before = log.stat().st_size if log.exists() else 0
    args = ("batch", url, topic, f"job-{fault}", str(ROWS), "2", "--duration", str(duration))
    child = _driver(*args, env={"SPARK_JOB_MASTER": spark_cluster.master})
    try:
        before = _wait_for_progress(cluster.bootstrap, topic, 0, child, timeout=400)
        assert child.poll() is None, "the job ended before the fault"
        inject(topic)
        _wait_for_writes_after(cluster.bootstrap, topic, before, child, timeout=180)
        out, _ = child.communicate(timeout=900)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate(timeout=60)
        logged = log.read_bytes()[logged_before:].decode(errors="replace") if log.exists() else ""
        stop_host(url)
    assert child.returncode == 0 and "DONE" in out, f"the job failed under {fault}:\n{out[-6000:]}\n{logged[-3000:]}"
    assert "InternalError" not in out, f"a task failed with a bug under {fault}:\n{out[-6000:]}"
    for bug in ("(a bug", "internal error"):
        assert bug not in logged, f"the broker server logged a bug under {fault}:\n{logged[-6000:]}"
    counts = Counter(_committed_values(cluster.bootstrap, topic))
    duplicates = {value: n for value, n in counts.items() if n > 1}
    missing = set(range(ROWS)) - {int(value) for value in counts}
    assert not duplicates, f"{len(duplicates)} rows stored more than once, e.g. {list(duplicates.items())[:5]}"
    assert not missing, f"{len(missing)} rows not stored, e.g. {sorted(missing)[:5]}"
    assert sum(counts.values()) == ROWS
