"""The ``idempotent`` PySpark data source, on a real local SparkSession (marker ``spark``).

One session serves the whole module (JVM start-up costs seconds); only the kill tests, and
drivers that need a working directory of their own, run Spark in subprocesses. The tests
marked with ``LOCAL_AND_CLUSTER`` run again on a standalone cluster (a master and 2 workers,
executors in their own JVMs and working directories). Tasks reach the backend through the broker server the data source
starts per URL (idempotent/spark/_host.py), in a hosts directory private to this run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import idempotent
import idempotent.spark
from idempotent.core.records import StoredRecord
from idempotent.spark._host import hosts_dir, stop_host

if TYPE_CHECKING:
    from tests.spark_session import StandaloneCluster

pytest_plugins = ["tests.spark_session"]  # the fixtures spark, spark_cluster and spark_hosts

#: run the test in local mode and on the standalone cluster (tests.spark_session)
LOCAL_AND_CLUSTER = pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # a Spark JVM starts slowly on a busy machine

ROWS_PER_PARTITION = 30_000  # large enough that a late failure comes after rows were stored


def _url(tmp_path: Path, name: str = "log") -> str:
    return f"sqlite:///{tmp_path / name}.db"


def _stored(url: str, topic: str) -> list[StoredRecord]:
    """Every record of ``topic``, through the broker server the data source uses."""
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        out = []
        for partition in range(broker.partitions_for(topic, create=False)):
            position = 0
            while records := broker.read(topic, partition, position, 5000):
                out.extend(records)
                position = records[-1].offset + 1
        return out


def _write(df: Any, url: str, topic: str, job: str, **options: str) -> None:
    writer = df.write.format("idempotent").option("url", url).option("topic", topic).option("job", job)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.mode("append").save()


@LOCAL_AND_CLUSTER
def test_batch_write_then_read_back(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    url = _url(tmp_path)
    df = spark.range(0, 1000, numPartitions=3).select(
        F.col("id").cast("string").alias("value"),
        (F.col("id") % 5).cast("string").alias("key"),
        F.array(F.struct(F.lit("h").alias("key"), F.col("id").cast("string").cast("binary").alias("value"))).alias(
            "headers"
        ),
    )
    _write(df, url, "events", "load-1", partitions="2")
    rows = spark.read.format("idempotent").option("url", url).option("topic", "events").load().collect()
    assert sorted(int(r.value) for r in rows) == list(range(1000))
    assert (
        spark.read.format("idempotent").option("url", url).option("topic", "events").load().rdd.getNumPartitions() == 2
    )
    for row in rows:
        assert row.topic == "events"
        assert int(row.key) == int(row.value) % 5
        assert [(h.key, bytes(h.value)) for h in row.headers] == [("h", bytes(row.value))]
        assert row.sequence >= 0 and row.producer_id >= 0 and row.timestamp is not None
    # one key always lands on one partition
    assert all(len({r.partition for r in rows if r.key == key}) == 1 for key in {r.key for r in rows})


@LOCAL_AND_CLUSTER
def test_same_job_writes_nothing_new_and_another_job_writes_again(spark: Any, tmp_path: Path) -> None:
    url = _url(tmp_path)
    df = spark.range(0, 500, numPartitions=2).selectExpr("cast(id as string) as value")
    _write(df, url, "t", "daily")
    _write(df, url, "t", "daily")
    assert Counter(Counter(r.value for r in _stored(url, "t")).values()) == {1: 500}
    _write(df, url, "t", "daily-again")
    assert Counter(Counter(r.value for r in _stored(url, "t")).values()) == {2: 500}


def test_explicit_partition_column(spark: Any, tmp_path: Path) -> None:
    url = _url(tmp_path)
    df = spark.range(0, 60, numPartitions=2).selectExpr(
        "cast(id as string) as value", "cast(id % 3 as int) as partition"
    )
    _write(df, url, "p", "parts", partitions="3")
    records = _stored(url, "p")
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        by_partition = {p: broker.read("p", p, 0, 100) for p in range(3)}
    assert len(records) == 60
    for partition, stored in by_partition.items():
        assert sorted(int(r.value) for r in stored) == list(range(partition, 60, 3))


@LOCAL_AND_CLUSTER
def test_read_between_offsets(spark: Any, tmp_path: Path) -> None:
    url = _url(tmp_path)
    df = spark.range(0, 100, numPartitions=1).selectExpr("cast(id as string) as value", "0 as partition")
    _write(df, url, "o", "offsets")
    reader = spark.read.format("idempotent").option("url", url).option("topic", "o")
    rows = reader.option("startingOffsets", '{"o": {"0": 10}}').option("endingOffsets", '{"o": {"0": 20}}').load()
    assert sorted(int(r.value) for r in rows.collect()) == list(range(10, 20))
    assert reader.option("startingOffsets", "latest").option("endingOffsets", "latest").load().count() == 0


@LOCAL_AND_CLUSTER
def test_task_retries_store_every_row_once(spark: Any, tmp_path: Path) -> None:
    """The first attempt of every task fails late, after most of its rows were stored; the
    retries store the rest, and every row is stored exactly once."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    def fail_first_attempt_late(i: int) -> str:
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0 and i % ROWS_PER_PARTITION == 25_000:
            raise RuntimeError("the first attempt fails late")
        return str(i)

    url = _url(tmp_path)
    total = 2 * ROWS_PER_PARTITION
    df = spark.range(0, total, numPartitions=2).select(F.udf(fail_first_attempt_late, "string")("id").alias("value"))
    _write(df, url, "retried", "retry-job")
    records = _stored(url, "retried")
    assert sorted(int(r.value) for r in records) == list(range(total))
    # proof that the first attempts did store rows before failing (epoch 0) and that the
    # retries, which fenced them (epoch 1), only added the rest
    epochs = Counter(r.producer_epoch for r in records)
    assert set(epochs) == {0, 1}, epochs
    assert epochs[0] >= 2 * 10_000, epochs


def test_bad_input_is_refused_before_anything_is_written(spark: Any, tmp_path: Path) -> None:
    url = _url(tmp_path)
    df = spark.range(0, 10).selectExpr("cast(id as string) as v")
    with pytest.raises(Exception, match="value"):
        _write(df, url, "bad", "no-value-column")
    df = spark.range(0, 10).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match="job"):
        df.write.format("idempotent").option("url", url).option("topic", "bad").mode("append").save()


def _first_reason(exc: BaseException) -> str:
    """The first line of a Spark error after Spark's own framing line, if any."""
    lines = str(exc).splitlines()
    return lines[1] if lines[0].startswith("An exception was thrown from the Python worker") else lines[0]


def test_read_errors_say_what_is_wrong_on_their_first_line(spark: Any, tmp_path: Path) -> None:
    """A bad read is refused with its reason right after Spark's prefix, not after a page of
    traceback."""
    url = _url(tmp_path)
    _write(spark.range(0, 3).selectExpr("cast(id as string) as value"), url, "t", "read-errors")
    reads = {
        "offsets must be 'earliest', 'latest' or JSON": {"topic": "t", "startingOffsets": "first"},
        "topic 'absent' does not exist": {"topic": "absent"},
    }
    for expected, options in reads.items():
        reader = spark.read.format("idempotent").option("url", url)
        for name, value in options.items():
            reader = reader.option(name, value)
        with pytest.raises(Exception) as failed:
            reader.load().collect()
        reason = _first_reason(failed.value)
        assert expected in reason, reason
        assert "Traceback" not in str(failed.value)


def test_host_directory_is_private_to_the_run(spark_hosts: Path) -> None:
    assert hosts_dir() == spark_hosts
    assert stop_host(f"sqlite:///{spark_hosts}/never-used-{uuid.uuid4().hex}.db") is False


# -- kill -9 of the driver: Spark runs in a subprocess whose process group is killed --------

JOBS = Path(__file__).resolve().parents[1] / "spark_jobs.py"
ROOT = Path(__file__).resolve().parents[2]


def _job(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen[str]:
    """Start a driver program of tests/spark_jobs.py in its own process group."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(JOBS), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**environment, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )


def _finish(child: subprocess.Popen[str], timeout: float = 600) -> str:
    out, _ = child.communicate(timeout=timeout)
    assert child.returncode == 0, out[-4000:]
    return out


def _produce(url: str, topic: str, partitions: int, per_partition: int) -> Counter[bytes]:
    """Fill an idempotent topic; returns the values the pipeline must output (upper-cased)."""
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        broker.create_topic(topic, partitions)
    with idempotent.Producer(idempotent.spark.broker_url(url)) as producer:
        for p in range(partitions):
            producer.send_many(topic, [f"p{p}-r{i}" for i in range(per_partition)], partition=p).result()
    return Counter(f"P{p}-R{i}".encode() for p in range(partitions) for i in range(per_partition))


def _count(url: str, topic: str) -> int:
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        if topic not in broker.topics():
            return 0
        return sum(broker.end_offset(topic, p) for p in range(broker.partitions_for(topic, create=False)))


def test_driver_kill_mid_job_then_rerun_is_exact(spark_hosts: Path, tmp_path: Path) -> None:
    url = _url(tmp_path)
    total = 60_000
    child = _job("batch", url, "nightly", "job-1", str(total), "3", "--slow", "--positions")
    deadline = time.monotonic() + 480  # a Spark JVM starts slowly on a busy machine
    while (stored := _count(url, "nightly")) < 3_000:
        if child.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate(timeout=60)
            raise AssertionError(f"the job stored {stored} rows, then ended or stalled:\n{out[-6000:]}")
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.communicate(timeout=60)
    partial = _count(url, "nightly")
    assert stored <= partial < total, "the kill came before the job stored part of its output"
    _finish(_job("batch", url, "nightly", "job-1", str(total), "3", "--positions"))
    assert sorted(int(r.value) for r in _stored(url, "nightly")) == list(range(total))


def test_streaming_kill_between_sink_write_and_commit_then_restart(spark_hosts: Path, tmp_path: Path) -> None:
    """SQLite pipeline: idempotent topic -> upper-case -> idempotent topic, killed after the
    sink stored micro-batch 0 and before Spark committed it; the restart replays the batch."""
    url = _url(tmp_path)
    expected = _produce(url, "raw", 2, 3_000)
    checkpoint = tmp_path / "checkpoint"
    killed = _job("stream", url, "raw", url, "clean", str(checkpoint), "--kill-at-commit", "0")
    out, _ = killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, out[-4000:]
    assert (checkpoint / "offsets" / "0").exists() and not (checkpoint / "commits" / "0").exists()
    assert Counter(r.value for r in _stored(url, "clean")) == expected  # stored before the commit
    _finish(_job("stream", url, "raw", url, "clean", str(checkpoint)))
    assert (checkpoint / "commits" / "0").exists()  # the restart ran batch 0 again, and finished it
    assert Counter(r.value for r in _stored(url, "clean")) == expected


@pytest.mark.kafka
@pytest.mark.pulsar
def test_kafka_to_pulsar_pipeline_killed_and_restarted(
    kafka_service: Any, pulsar_service: Any, spark_hosts: Path, tmp_path: Path
) -> None:
    """A plain Kafka topic (written by confluent-kafka), read with Spark's own Kafka source,
    upper-cased into a Pulsar-backed idempotent topic; killed at the sink's commit, restarted."""
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka.admin import AdminClient, NewTopic

    from idempotent.testing.spark import kafka_connector_jars

    jars = ",".join(str(j) for j in kafka_connector_jars())
    source = f"spark-plain-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_service.bootstrap})
    admin.create_topics([NewTopic(source, 2, 1)])[source].result(30)
    plain = KafkaProducer({"bootstrap.servers": kafka_service.bootstrap})
    expected: Counter[bytes] = Counter()
    for p in range(2):
        for i in range(1_500):
            plain.produce(source, f"p{p}-r{i}".encode(), key=f"k{i % 7}".encode(), partition=p)
            expected[f"P{p}-R{i}".encode()] += 1
    assert plain.flush(30) == 0
    sink = f"{pulsar_service.url}?admin_url={pulsar_service.admin_url}"  # the Pulsar adapter takes options in the URL
    sink_topic = f"spark-out-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"
    args = ("stream", f"kafka+native://{kafka_service.bootstrap}", source, sink, sink_topic, str(checkpoint))
    killed = _job(*args, "--kill-at-commit", "0", env={"SPARK_KAFKA_JARS": jars})
    out, _ = killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, out[-4000:]
    assert Counter(r.value for r in _stored(sink, sink_topic)) == expected
    _finish(_job(*args, env={"SPARK_KAFKA_JARS": jars}))
    records = _stored(sink, sink_topic)
    assert Counter(r.value for r in records) == expected
    assert {r.key for r in records} == {f"k{i}".encode() for i in range(7)}


@LOCAL_AND_CLUSTER
def test_mirror_on_spark_copies_each_partition_once(spark: Any, tmp_path: Path) -> None:
    source, destination = _url(tmp_path, "source"), _url(tmp_path, "copy")
    _produce(source, "orders", 3, 400)
    summary = idempotent.spark.mirror(spark, source, destination, topic="orders", job="orders-copy")
    assert (summary.copied, summary.completed) == (1200, True)
    assert [s.partition for s in summary.partitions] == [0, 1, 2]
    again = idempotent.spark.mirror(spark, source, destination, topic="orders", job="orders-copy")
    assert (again.copied, again.duplicates) == (0, 0)
    with idempotent.connect(idempotent.spark.broker_url(destination)) as broker:
        for p in range(3):
            assert [r.value for r in broker.read("orders", p, 0, 1000)] == [f"p{p}-r{i}".encode() for i in range(400)]


def test_mirror_cli_refuses_follow_on_spark(capsys: pytest.CaptureFixture[str]) -> None:
    from idempotent.cli import main

    argv = ["mirror", "--from", "sqlite:///a.db", "--to", "sqlite:///b.db", "--topic", "t", "--job", "j"]
    assert main([*argv, "--engine", "spark", "--follow"]) != 0
    assert "--follow needs --engine threads" in capsys.readouterr().err


def test_example_spark_pipeline(spark_hosts: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "spark_pipeline.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=800,
        check=True,
    ).stdout
    assert "orders-clean holds 3000 records, 3000 distinct" in out
    assert "daily-summary holds 3 records after two runs of one job" in out


def test_speculative_copy_of_a_slow_task_stores_no_duplicates(spark_cluster: StandaloneCluster, tmp_path: Path) -> None:
    url = _url(tmp_path)
    markers = tmp_path / "attempts"
    markers.mkdir()
    rows = 2 * 25_000
    _finish(_job("speculate", spark_cluster.master, url, "speculated", str(rows), str(markers)), timeout=600)
    attempts = sorted(p.name for p in markers.iterdir())
    assert "0-1" in attempts, f"Spark started no second attempt of the slow task: {attempts}"
    records = _stored(url, "speculated")
    assert sorted(int(r.value) for r in records) == list(range(rows))
    # the slow attempt stored rows (epoch 0) before the speculative copy fenced it (epoch 1)
    assert {r.producer_epoch for r in records if int(r.value) < rows // 2} == {0, 1}


def test_relative_sqlite_url_on_a_cluster_means_the_drivers_file(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """A driver in its own working directory writes to ``sqlite:///rel.db`` on the standalone
    cluster: the executors (working in their workers' application directories) write the
    driver's file, and no other file appears."""
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    rows = 6_000
    env = {"SPARK_JOB_MASTER": spark_cluster.master}
    out = _finish(_job("batch", "sqlite:///rel.db", "r1", "rel-job", str(rows), "4", env=env, cwd=driver_dir))
    assert "DONE" in out
    url = f"sqlite:///{driver_dir / 'rel.db'}"
    records = _stored(url, "r1")
    assert Counter(Counter(int(r.value) for r in records).values()) == {1: rows}
    assert sorted(int(r.value) for r in records) == list(range(rows))
    strays = list(spark_cluster.work.rglob("rel.db*"))
    assert strays == [], f"executors opened files of their own: {strays}"
    # the job ran on an executor of each worker, each in its own working directory
    app = next(line.split()[1] for line in out.splitlines() if line.startswith("APPLICATION "))
    assert len([p for p in (spark_cluster.work / app).iterdir() if p.is_dir()]) == 2
