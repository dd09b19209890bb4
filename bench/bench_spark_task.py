"""CPU per row of one Spark sink task, outside Spark: the sink's own cost, without the JVM.

    python bench/bench_spark_task.py                              # this checkout, 5 rounds
    python bench/bench_spark_task.py --compare /path/to/other/checkout --rounds 7

Each round runs, in a **fresh Python process per variant** (alternating order), what a Spark
task of a batch write runs: the sink's ``write_task`` over ``--rows`` rows in Arrow record
batches of 10,000 (a 6-byte key and a ``--size``-byte value per row, Spark's default Arrow
batch size), into a fresh topic of 2 partitions, through the broker server the data source
starts for the URL (``sqlite://`` by default). The variants are this checkout and, with
``--compare``, another checkout of the project (put first on ``PYTHONPATH`` of its process
and of the broker server it starts; each variant gets its own hosts directory). A batch plan
is made as the driver makes it when the checkout has one (``idempotent.spark._ledger``); an
older checkout's ``write_task`` is called as it was.

With ``--positions`` the rows carry an ordinal column named by ``positionColumns`` (only
checkouts whose sink takes positions). The table gives, per variant, medians of the task
process's CPU time (user + system, from ``os.times``) and of the broker server's (from
``/proc``), both per row, and rows/s of the task. The Arrow batches are built before the clock starts. Results go to
``bench/results/spark-task-*.json`` with the load average.
"""

from __future__ import annotations

import argparse
import inspect
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

HERE = Path(__file__).resolve().parent.parent
BATCH = 10_000


def _host_cpu(hosts: Path) -> float:
    """CPU seconds of the broker servers in ``hosts`` so far."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid_file in hosts.glob("*.pid"):
        try:
            fields = Path(f"/proc/{int(pid_file.read_text())}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        total += sum(int(f) for f in fields[11:15]) / tick
    return total


def child(url: str, rows: int, size: int, positions: bool) -> dict[str, Any]:
    """One task's write, timed in this process."""
    import pyarrow as pa

    import idempotent
    import idempotent.spark

    try:
        from idempotent.spark import _sink
    except ImportError:  # a checkout from before the sink had its own module
        from idempotent.spark import _source as _sink  # type: ignore[no-redef]

    batches = []
    for first in range(0, rows, BATCH):
        count = min(BATCH, rows - first)
        keys = pa.array([b"k%05d" % (i % 100_000) for i in range(first, first + count)], pa.binary())
        values = pa.array([b"%0*d" % (size, i) for i in range(first, first + count)], pa.binary())
        columns, names = [keys, values], ["key", "value"]
        if positions:
            columns.append(pa.array(range(first, first + count), pa.int64()))
            names.append("n")
        batches.append(pa.record_batch(columns, names=names))
    topic = f"bench-task-{uuid.uuid4().hex[:10]}"
    hosts = Path(os.environ["IDEMPOTENT_SPARK_HOSTS"])
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        broker.create_topic(topic, 2)
    kwargs: dict[str, Any] = {}
    if "batch_plan" in inspect.signature(_sink.write_task).parameters:
        from pyspark.sql.types import BinaryType, LongType, StructField, StructType

        from idempotent.spark._ledger import plan_batch
        from idempotent.spark._options import Options

        fields = [StructField("key", BinaryType()), StructField("value", BinaryType())]
        options = {"url": url, "topic": topic, "job": topic}
        if positions:
            fields.append(StructField("n", LongType()))
            options["positionColumns"] = "n"
        kwargs["batch_plan"] = plan_batch(Options(options), StructType(fields))
    elif positions:
        raise SystemExit("--positions needs a checkout whose sink takes positions")
    name = f"spark/{topic}/0"
    host_before = _host_cpu(hosts)
    cpu_before = os.times()
    started = time.perf_counter()
    written = _sink.write_task(url, topic, name, iter(batches), 5.0, **kwargs)
    seconds = time.perf_counter() - started
    cpu_after = os.times()
    host_after = _host_cpu(hosts)
    if written.written != rows:
        raise SystemExit(f"wrote {written.written} of {rows} rows: {written}")
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {"seconds": seconds, "task_cpu": cpu, "host_cpu": host_after - host_before, "code": idempotent.__file__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes per row")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--positions", action="store_true", help="rows carry a position column (positionColumns)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.url, args.rows, args.size, args.positions)), flush=True)
        return
    checkouts = {"this": HERE, **({"compare": args.compare.resolve()} if args.compare else {})}
    load_before = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory(prefix="bench-spark-task-") as tmp:
        for round_number in range(args.rounds):
            order = list(checkouts) if round_number % 2 == 0 else list(checkouts)[::-1]
            for name in order:
                root = checkouts[name]
                hosts = Path(tmp) / f"hosts-{name}"
                hosts.mkdir(exist_ok=True)
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
                    "IDEMPOTENT_SPARK_HOSTS": str(hosts),
                }
                url = f"sqlite:///{Path(tmp) / f'{name}.db'}"
                command = [sys.executable, __file__, "--child", "--url", url]
                command += ["--rows", str(args.rows), "--size", str(args.size)] + ["--positions"] * args.positions
                out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
                lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
                if out.returncode != 0 or not lines:
                    raise SystemExit(f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
                result = json.loads(lines[-1].removeprefix("RESULT "))
                results[name].append(result)
                task_us, host_us = (result[k] * 1e6 / args.rows for k in ("task_cpu", "host_cpu"))
                print(
                    f"round {round_number + 1} {name}: {args.rows / result['seconds']:,.0f} rows/s, task "
                    f"{task_us:.2f} us/row, server {host_us:.2f} us/row ({result['code']})",
                    flush=True,
                )
        for name in checkouts:
            stop = "import sys, idempotent.spark as s; s.stop_host(sys.argv[1])"
            subprocess.run(
                [sys.executable, "-c", stop, f"sqlite:///{Path(tmp) / f'{name}.db'}"],
                env={**os.environ, "IDEMPOTENT_SPARK_HOSTS": str(Path(tmp) / f"hosts-{name}")},
                check=False,
            )
    load_after = os.getloadavg()
    print(f"\n{args.rows:,} rows of {args.size} B in one task, sqlite://, medians of {args.rounds} fresh processes")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}\n")
    print("| checkout | task CPU (us/row) | broker server CPU (us/row) | task rows/s |")
    print("|---|---|---|---|")
    summary = {}
    for name, runs in results.items():
        task = statistics.median(r["task_cpu"] for r in runs) * 1e6 / args.rows
        host = statistics.median(r["host_cpu"] for r in runs) * 1e6 / args.rows
        rate = statistics.median(args.rows / r["seconds"] for r in runs)
        summary[name] = {"task_us_per_row": task, "server_us_per_row": host, "rows_per_s": rate}
        print(f"| {name} ({checkouts[name]}) | {task:.2f} | {host:.2f} | {rate:,.0f} |")
    save_run("spark-task", args, load_before, load_after, runs=results, medians=summary)


if __name__ == "__main__":
    main()
