"""Spark driver programs that tests/test_spark_kill.py runs, kills with SIGKILL and reruns.

    python tests/spark_jobs.py batch URL TOPIC JOB ROWS PARTITIONS [--slow] [--positions] [--duration S]
        (on $SPARK_JOB_MASTER, default local[2])
    python tests/spark_jobs.py files MASTER URL TOPIC JOB FORMAT PATH [--metadata] [--poison V,...]
        [--same-partitioning]
    python tests/spark_jobs.py stream SOURCE SOURCE_TOPIC SINK SINK_TOPIC CHECKPOINT [--kill-at-commit B]
    python tests/spark_jobs.py speculate MASTER URL TOPIC ROWS MARKERS

``speculate`` runs on a standalone cluster (MASTER) with speculation on: the first attempt
of Spark partition 0 stalls after most of its rows reached the sink, so Spark starts a
speculative copy on the other worker; every attempt leaves a file ``<partition>-<attempt>``
in MARKERS. ``batch`` writes ROWS rows (``value`` = the row number) under JOB; with ``--positions`` the
rows carry their number as a position (``positionColumns``); with ``--duration`` each task
spreads its rows over about S seconds (the sink gets them in Arrow batches of 1000) and may
fail 7 times. ``files`` writes a CSV or
Parquet input (``value`` = column 0, ``key`` = column 1) on MASTER with
``spark.sql.files.openCostInBytes`` at 64 KiB, so that the core count sets the split size;
``--metadata`` adds Spark's ``_metadata`` column, ``--poison`` fails every attempt of the
task that meets one of the listed values (after it stored the rows before it), and the
exit status is 3 when the write failed with the sink's error (its first line printed). ``stream`` copies a topic
into SINK_TOPIC, upper-casing values, in one availableNow run; SOURCE is an idempotent URL,
or ``kafka+native://host:port`` for a plain Kafka topic read with Spark's own Kafka source.
With ``--kill-at-commit B`` the sink's driver-side commit of micro-batch B kills this whole
process group (JVM and Python workers) with SIGKILL: after every task stored its rows, before
Spark records the batch as done, so the restart replays it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import idempotent.spark
from idempotent.spark._source import IdempotentDataSource, StreamWriter


class KillingStreamWriter(StreamWriter):
    def commit(self, messages: Any, batchId: int) -> None:
        if batchId == int(os.environ.get("KILL_AT_COMMIT", "-1")):
            print(f"KILLING at the commit of batch {batchId}", flush=True)
            os.killpg(int(os.environ["JOB_PROCESS_GROUP"]), signal.SIGKILL)
        super().commit(messages, batchId)


class KillingDataSource(IdempotentDataSource):
    @classmethod
    def name(cls) -> str:
        return "idempotent_killing"

    def streamWriter(self, schema: Any, overwrite: bool) -> StreamWriter:
        writer = super().streamWriter(schema, overwrite)
        return KillingStreamWriter(writer.options)


def session(jars: str | None = None, master: str = "local[2]", **conf: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["JOB_PROCESS_GROUP"] = str(os.getpgrp())
    builder = SparkSession.builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    builder = (
        builder.config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if jars:
        builder = builder.config("spark.jars", jars)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    idempotent.spark.register(spark)
    spark.dataSource.register(KillingDataSource)
    return spark


#: per application on a standalone cluster: one one-core executor on each of its two workers
CLUSTER_APP_CONF = {"spark.cores.max": "2", "spark.executor.cores": "1", "spark.executor.memory": "512m"}


def batch(
    url: str, topic: str, job: str, rows: int, partitions: int, slow: bool, positions: bool, duration: float = 0.0
) -> None:
    from pyspark.sql import functions as F

    master = os.environ.get("SPARK_JOB_MASTER", "local[2]")
    conf = dict(CLUSTER_APP_CONF) if master.startswith("spark://") else {}
    if duration:
        conf["spark.sql.execution.arrow.maxRecordsPerBatch"] = "1000"  # the sink gets rows as they come
        conf["spark.task.maxFailures"] = "8"
    spark = session(None, master, **conf)
    pause = duration * 100 / max(1, rows // partitions)  # per 100 rows, so that each task takes ``duration``

    def value(i: int) -> str:
        if slow and i % 500 == 0:
            time.sleep(0.05)
        if pause and i % 100 == 0:
            time.sleep(pause)
        return str(i)

    df = spark.range(0, rows, numPartitions=partitions).select(
        F.udf(value, "string")("id").alias("value"), F.col("id").alias("row")
    )
    if not positions:
        df = df.drop("row")
    writer = df.write.format("idempotent").option("url", url).option("topic", topic).option("job", job)
    if positions:
        writer = writer.option("positionColumns", "row")
    print(f"APPLICATION {spark.sparkContext.applicationId}", flush=True)
    print("WRITING", flush=True)
    writer.mode("append").save()
    print("DONE", flush=True)


def files(master: str, url: str, topic: str, job: str, kind: str, path: str, flags: list[str]) -> int:
    """Write a CSV or Parquet input; 3 when the sink refused or failed the write."""
    from pyspark.sql import functions as F

    spark = session(None, master, **{"spark.sql.files.openCostInBytes": str(64 << 10)})
    poison = set(flags[flags.index("--poison") + 1].split(",")) if "--poison" in flags else set()

    def value(v: str) -> str:
        if v in poison:
            raise RuntimeError(f"poisoned row {v}")
        return v

    df = spark.read.csv(path) if kind == "csv" else spark.read.parquet(path)
    first, second = df.columns[:2]
    columns = [F.udf(value, "string")(F.col(first)).alias("value"), F.col(second).cast("string").alias("key")]
    if "--metadata" in flags:
        columns.append(F.col("_metadata"))
    writer = df.select(*columns).write.format("idempotent").option("url", url).option("topic", topic)
    writer = writer.option("job", job)
    if "--same-partitioning" in flags:
        writer = writer.option("samePartitioning", "true")
    print(f"PARTITIONS {df.rdd.getNumPartitions()}", flush=True)
    try:
        writer.mode("append").save()
    except Exception as exc:
        lines = str(exc).splitlines()
        framed = lines[0].startswith("An exception was thrown from the Python worker") and len(lines) > 1
        print("FAILED " + lines[1 if framed else 0], flush=True)
        print(str(exc), flush=True)
        return 3
    print("DONE", flush=True)
    return 0


def speculate(master: str, url: str, topic: str, rows: int, markers: str) -> None:
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    spark = session(
        None,
        master,
        **{
            **CLUSTER_APP_CONF,
            "spark.speculation": "true",
            "spark.speculation.interval": "200ms",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.minTaskRuntime": "500ms",
            "spark.task.maxFailures": "4",
        },
    )
    per_partition = rows // 2

    def value(i: int) -> str:
        context = TaskContext.get()
        assert context is not None
        if i % per_partition == 0:
            open(os.path.join(markers, f"{context.partitionId()}-{context.attemptNumber()}"), "w").close()
        if context.partitionId() == 0 and context.attemptNumber() == 0 and i == per_partition * 4 // 5:
            # the slow task: its rows before this one are in the sink already; it stalls until
            # Spark kills it once the speculative copy (started on the other worker) succeeded
            time.sleep(300)
        return str(i)

    df = spark.range(0, rows, numPartitions=2).select(F.udf(value, "string")("id").alias("value"))
    df.write.format("idempotent").option("url", url).option("topic", topic).option("job", "speculated").mode(
        "append"
    ).save()
    print("DONE", flush=True)


def stream(source: str, source_topic: str, sink: str, sink_topic: str, checkpoint: str, kill_at: int) -> None:
    from pyspark.sql import functions as F

    os.environ["KILL_AT_COMMIT"] = str(kill_at)
    if source.startswith("kafka+native://"):
        spark = session(os.environ["SPARK_KAFKA_JARS"])
        df = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", source.removeprefix("kafka+native://"))
            .option("subscribe", source_topic)
            .option("startingOffsets", "earliest")
            .load()
        )
    else:
        spark = session()
        df = (
            spark.readStream.format("idempotent")
            .option("url", source)
            .option("topic", source_topic)
            .option("startingOffsets", "earliest")
            .load()
        )
    out = df.select("key", F.upper(F.col("value").cast("string")).alias("value"))
    query = (
        out.writeStream.format("idempotent_killing")
        .option("url", sink)
        .option("topic", sink_topic)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print(f"DONE batches={query.lastProgress and query.lastProgress['batchId']}", flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "batch":
        duration = float(args[args.index("--duration") + 1]) if "--duration" in args else 0.0
        batch(args[0], args[1], args[2], int(args[3]), int(args[4]), "--slow" in args, "--positions" in args, duration)
    elif command == "files":
        sys.exit(files(args[0], args[1], args[2], args[3], args[4], args[5], args[6:]))
    elif command == "speculate":
        speculate(args[0], args[1], args[2], int(args[3]), args[4])
    elif command == "stream":
        kill = int(args[args.index("--kill-at-commit") + 1]) if "--kill-at-commit" in args else -1
        stream(args[0], args[1], args[2], args[3], args[4], kill)
    else:
        raise SystemExit(f"unknown command {command!r}")
