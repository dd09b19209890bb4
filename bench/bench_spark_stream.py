"""Write time of a streaming micro-batch against the same rows written by a batch job.

    python bench/bench_spark_stream.py                          # 50,000 rows per write, sqlite://
    python bench/bench_spark_stream.py --rows 50000 --rounds 7 --backend kafka

The input is ``4`` Parquet files of ``--rows / 2`` rows each (a 6-byte key and a ``--size``-byte
value), written once with pyarrow. Every round starts one **fresh Python process per
variant** (a new SparkSession, ``local[2]``), in alternating order, and each process writes
the same rows twice into fresh topics of 2 partitions:

* ``batch``: ``spark.read.parquet(files 1-2).write.format("idempotent")...save()``, then the
  same for files 3-4; the time is that of ``save()``;
* ``stream``: ``spark.readStream.parquet(all four)`` with ``maxFilesPerTrigger=2`` and an
  ``availableNow`` trigger into ``writeStream.format("idempotent")``: two micro-batches of the
  same rows; the time is Spark's ``addBatch`` duration of each micro-batch (the write job and
  the sink's commit).

The first write of a process is **cold** (Spark's JVM, its Python workers and the sink's
modules start in it), the second **warm**. The broker server the data source uses for the URL
is started before the rounds, so neither variant pays for it. With ``--compare CHECKOUT`` the
same rounds also run another checkout of the project (first on its processes' ``PYTHONPATH``,
with its own broker server and database), the four processes of a round in rotating order.
The table gives medians per checkout and variant and the ratio stream/batch; results go to
``bench/results/spark-stream-*.json`` with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _results import save_run

FILES = 4


def write_input(directory: Path, rows: int, size: int) -> list[Path]:
    """Four Parquet files of ``rows // 2`` rows each, oldest first (the file source reads
    files in modification order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    per_file = rows // 2
    paths = []
    for number in range(FILES):
        first = number * per_file
        keys = [b"k%05d" % (i % 100_000) for i in range(first, first + per_file)]
        values = [b"%0*d" % (size, i) for i in range(first, first + per_file)]
        path = directory / f"part-{number}.parquet"
        pq.write_table(pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())}), path)
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))
        paths.append(path)
    return paths


def child(variant: str, url: str, directory: Path) -> dict[str, Any]:
    """One fresh process: two writes of the same rows, cold then warm (seconds each)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import idempotent
    import idempotent.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    idempotent.spark.register(spark)
    files = sorted(str(p) for p in (directory / "input").glob("part-*.parquet"))
    topics = [f"bench-{variant}-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        for topic in topics:
            broker.create_topic(topic, 2)
    seconds = []
    if variant == "batch":
        for topic, pair in zip(topics, (files[:2], files[2:]), strict=True):
            df = spark.read.parquet(*pair)
            started = time.perf_counter()
            df.write.format("idempotent").option("url", url).option("topic", topic).option("job", topic).mode(
                "append"
            ).save()
            seconds.append(time.perf_counter() - started)
    else:
        schema = spark.read.parquet(files[0]).schema
        query = (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 2)
            .parquet(str(directory / "input"))
            .writeStream.format("idempotent")
            .option("url", url)
            .option("topic", topics[0])
            .option("checkpointLocation", str(directory / f"checkpoint-{uuid.uuid4().hex}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        seconds = [p["durationMs"]["addBatch"] / 1000 for p in progress]
        import pyarrow.parquet as pq

        per_batch = sum(pq.ParquetFile(f).metadata.num_rows for f in files[:2])
        if [p["numInputRows"] for p in progress] != [per_batch, per_batch]:
            raise SystemExit(f"expected two micro-batches of {per_batch} rows, got {progress}")
    spark.stop()
    return {"variant": variant, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=50_000, help="rows per write")
    parser.add_argument("--size", type=int, default=100, help="value bytes per row")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "kafka", "pulsar"])
    parser.add_argument("--compare", type=Path, help="another checkout, measured in the same rounds")
    parser.add_argument("--child", choices=["batch", "stream"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--input", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.url, args.input)), flush=True)
        return

    from idempotent.testing import services

    checkouts = {"this": Path(__file__).resolve().parent.parent}
    if args.compare:
        checkouts["compare"] = args.compare.resolve()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-spark-stream-") as tmp:
        workdir = Path(tmp)
        urls, envs = {}, {}
        for name, root in checkouts.items():
            if args.backend == "sqlite":
                urls[name] = f"sqlite:///{workdir / f'{name}.db'}"
            elif args.backend == "kafka":
                urls[name] = services.up("kafka").url
            else:
                pulsar = services.up("pulsar")
                urls[name] = f"{pulsar.url}?admin_url={pulsar.admin_url}"
            (workdir / f"hosts-{name}").mkdir()
            envs[name] = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
                "IDEMPOTENT_SPARK_HOSTS": str(workdir / f"hosts-{name}"),
            }
            start = "import sys, idempotent.spark as s; s.broker_url(sys.argv[1])"  # outside the timings
            subprocess.run([sys.executable, "-c", start, urls[name]], env=envs[name], check=True)
        (workdir / "input").mkdir()
        write_input(workdir / "input", args.rows, args.size)
        variants = [(name, kind) for name in checkouts for kind in ("batch", "stream")]
        seconds: dict[str, dict[str, list[list[float]]]] = {n: {"batch": [], "stream": []} for n in checkouts}
        for round_number in range(args.rounds):
            shift = round_number % len(variants)
            for name, kind in variants[shift:] + variants[:shift]:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", kind, "--url", urls[name], "--input", str(workdir)],
                    capture_output=True,
                    text=True,
                    env=envs[name],
                    check=False,
                )
                lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
                if out.returncode != 0 or not lines:
                    raise SystemExit(f"{name} {kind} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
                result = json.loads(lines[-1].removeprefix("RESULT "))
                seconds[name][kind].append(result["seconds"])
                cold, warm = result["seconds"]
                print(f"round {round_number + 1} {name} {kind}: cold {cold:.2f} s, warm {warm:.2f} s", flush=True)
        for name in checkouts:
            stop = "import sys, idempotent.spark as s; s.stop_host(sys.argv[1])"
            subprocess.run([sys.executable, "-c", stop, urls[name]], env=envs[name], check=False)
    load_after = os.getloadavg()
    medians = {
        name: {
            kind: {phase: statistics.median(s[i] for s in runs) for i, phase in enumerate(("cold", "warm"))}
            for kind, runs in by_kind.items()
        }
        for name, by_kind in seconds.items()
    }
    print(f"\n{args.rows:,} rows of {args.size} B per write, {args.backend}, local[2], medians of {args.rounds}")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}\n")
    print("| checkout | write | batch job (s) | micro-batch (s) | micro-batch / batch |")
    print("|---|---|---|---|---|")
    for name in checkouts:
        for phase in ("cold", "warm"):
            batch, stream = medians[name]["batch"][phase], medians[name]["stream"][phase]
            print(f"| {name} | {phase} | {batch:.2f} | {stream:.2f} | {stream / batch:.2f}x |")
    save_run("spark-stream", args, load_before, load_after, seconds=seconds, medians=medians)


if __name__ == "__main__":
    main()
