"""Rows/s of the ``idempotent`` Spark sink against Spark's own Kafka sink, same data, same broker.

    python bench/bench_spark.py                         # 400,000 rows of 100 B, 5 rounds
    python bench/bench_spark.py --rows 1000000 --repeats 7 --backends kafka sqlite

One local SparkSession (``local[2]``, driver memory 1g) writes one cached DataFrame
(``--partitions`` Spark partitions, a 6-byte key and a ``--size``-byte value per row) with:

* ``spark-kafka``: ``format("kafka")`` (spark-sql-kafka-0-10, at-least-once) into a plain
  Kafka topic;
* ``idempotent-kafka``: ``format("idempotent")`` with a ``kafka://`` URL on the same Kafka
  broker (through the broker server the data source starts), a fresh job per round;
* ``idempotent-sqlite`` (with ``--backends ... sqlite``): the same into the embedded backend.

Each variant writes into one topic of its own, created and written once (1,000 rows) before
the rounds, as a job writes a topic that exists (its partitions' writers, and for this sink
its jobs' ledger topic, are set up then); ``--fresh-topics`` gives every write a new topic
instead, so that the set-up is timed. Variants alternate within each round; the table shows
medians of rows/s and the ratio to Spark's Kafka sink. Kafka is started with
``idempotent.testing.services`` unless it runs. Results go to ``bench/results/`` (or
``--out``) as JSON.

A second table says where the CPU went: the CPU seconds (user + system, from ``/proc``, with
reaped children) that each kind of process used during a write, per million rows, as
medians: the Kafka broker, Spark's JVM, Spark's Python workers (the data source runs there)
and the broker server the data source starts per URL (``idempotent.spark._host``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from idempotent.testing import services
from idempotent.testing.spark import kafka_connector_jars


def session(jars: list[Path]) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import idempotent.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.jars", ",".join(str(j) for j in jars))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    idempotent.spark.register(spark)
    return spark


#: process kinds of the CPU table
PROCESS_KINDS = ("kafka broker", "spark jvm", "python workers", "idempotent host")


def cpu_by_kind(kafka_pid: int) -> dict[int, tuple[str, float]]:
    """``pid -> (kind, CPU seconds)`` of this benchmark's processes (Linux ``/proc``): the
    Kafka broker, Spark's JVM and Python workers (descendants of this process) and the
    broker servers of ``idempotent.spark._host``. Seconds include reaped children's."""
    from idempotent.spark._host import hosts_dir

    tick = os.sysconf("SC_CLK_TCK")
    hosts = set()
    for pid_file in hosts_dir().glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            hosts.add(int(pid_file.read_text()))
    stats: dict[int, tuple[int, str, float]] = {}  # pid -> (parent, command, seconds)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        stats[int(entry.name)] = (int(fields[1]), command, sum(int(f) for f in fields[11:15]) / tick)

    def mine(pid: int) -> bool:
        while pid > 1 and pid in stats:
            if pid == os.getpid():
                return True
            pid = stats[pid][0]
        return False

    out = {}
    for pid, (_, command, seconds) in stats.items():
        if pid == kafka_pid:
            out[pid] = ("kafka broker", seconds)
        elif pid in hosts:
            out[pid] = ("idempotent host", seconds)
        elif pid != os.getpid() and mine(pid):
            out[pid] = ("python workers" if "pyspark" in command and "java" not in command else "spark jvm", seconds)
    return out


def cpu_used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per process kind between two :func:`cpu_by_kind` readings."""
    used = dict.fromkeys(PROCESS_KINDS, 0.0)
    for pid, (kind, seconds) in after.items():
        used[kind] += seconds - (before[pid][1] if pid in before else 0.0)
    return used


def create_topic(variant: str, kafka: services.ServiceInfo, workdir: Path, partitions: int) -> str:
    """A fresh topic for ``variant`` (outside any timing)."""
    topic = f"bench-spark-{uuid.uuid4().hex[:10]}"
    if variant == "spark-kafka":
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
        return topic
    import idempotent
    import idempotent.spark

    with idempotent.connect(idempotent.spark.broker_url(variant_url(variant, kafka, workdir))) as broker:
        broker.create_topic(topic, partitions)
    return topic


def variant_url(variant: str, kafka: services.ServiceInfo, workdir: Path) -> str:
    return kafka.url if variant == "idempotent-kafka" else f"sqlite:///{workdir / 'bench.db'}"


def write_once(spark: Any, df: Any, variant: str, kafka: services.ServiceInfo, workdir: Path, topic: str) -> float:
    """Seconds one write of ``df`` takes with ``variant`` into ``topic`` (a fresh job each time)."""
    if variant == "spark-kafka":
        started = time.perf_counter()
        df.write.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", topic).save()
        return time.perf_counter() - started
    url = variant_url(variant, kafka, workdir)
    job = f"bench-{uuid.uuid4().hex[:10]}"
    started = time.perf_counter()
    df.write.format("idempotent").option("url", url).option("topic", topic).option("job", job).mode("append").save()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes per row")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions and topic partitions")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=["kafka"], choices=["kafka", "sqlite"])
    parser.add_argument(
        "--fresh-topics", action="store_true", help="a fresh topic per write (set-up of its partitions timed)"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder of the JSON results")
    args = parser.parse_args(argv)

    kafka = services.up("kafka")
    spark = session(kafka_connector_jars())
    from pyspark.sql import functions as F

    df = (
        spark.range(0, args.rows, numPartitions=args.partitions)
        .select(
            F.format_string("k%05d", F.col("id") % 100_000).alias("key"),
            F.format_string(f"%0{args.size}d", F.col("id")).alias("value"),
        )
        .cache()
    )
    df.count()
    variants = ["spark-kafka", *(f"idempotent-{b}" for b in args.backends)]
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        topics = {variant: create_topic(variant, kafka, Path(tmp), args.partitions) for variant in variants}
        for variant in variants:  # warm-up, and the topics' first writes (writer set-up) before the rounds
            write_once(spark, df.limit(1000), variant, kafka, Path(tmp), topics[variant])
        for round_number in range(args.repeats):
            order = variants[round_number % len(variants) :] + variants[: round_number % len(variants)]
            for variant in order:
                topic = (
                    topics[variant]
                    if not args.fresh_topics
                    else create_topic(variant, kafka, Path(tmp), args.partitions)
                )
                before = cpu_by_kind(kafka.pid)
                took = write_once(spark, df, variant, kafka, Path(tmp), topic)
                cpu[variant].append(cpu_used(before, cpu_by_kind(kafka.pid)))
                seconds[variant].append(took)
                print(f"round {round_number + 1} {variant}: {args.rows / took:,.0f} rows/s", flush=True)
    spark.stop()

    baseline = statistics.median(args.rows / s for s in seconds["spark-kafka"])
    results = []
    print(f"\n{args.rows:,} rows of {args.size} B, {args.partitions} partitions, local[2], medians of {args.repeats}\n")
    print("| sink | rows/s (median) | ratio to Spark's Kafka sink |")
    print("|---|---|---|")
    for variant in variants:
        rate = statistics.median(args.rows / s for s in seconds[variant])
        cpu_per_million = {
            kind: statistics.median(c[kind] for c in cpu[variant]) * 1e6 / args.rows for kind in PROCESS_KINDS
        }
        results.append(
            {
                "variant": variant,
                "rows_per_s": rate,
                "ratio": rate / baseline,
                "seconds": seconds[variant],
                "cpu_seconds_per_million_rows": cpu_per_million,
                "cpu_seconds": cpu[variant],
            }
        )
        print(f"| {variant} | {rate:,.0f} | {rate / baseline:.2f}x |")
    print("\nCPU seconds per million rows (medians), by process\n")
    print("| sink | " + " | ".join(PROCESS_KINDS) + " | total |")
    print("|---|" + "---|" * (len(PROCESS_KINDS) + 1))
    for result in results:
        per_kind = result["cpu_seconds_per_million_rows"]
        cells = " | ".join(f"{per_kind[kind]:.2f}" for kind in PROCESS_KINDS)
        print(f"| {result['variant']} | {cells} | {sum(per_kind.values()):.2f} |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / f"spark-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
