"""Replicas of one service writing one topic at once: does throughput grow with replicas?

Each round starts ``R`` replica processes (1, 2 and 4 by default) that write into one
existing topic of ``--partitions`` partitions, made beforehand with the backend's own tools
(Kafka's ``AdminClient``, Pulsar's admin REST API), as a deployment's topic would be. Every
replica is its own process with its own producer and no broker server in between:

* ``drop-in``: the confluent-kafka drop-in (``produce()`` with a delivery callback per record
  and ``poll(0)``, ``transactional.id`` per replica) or the pulsar-client drop-in
  (``send_async()`` with a callback per record, ``producer_name`` per replica);
* ``producer``: ``idempotent.Producer(url, producer_name=...)``, ``send(..., on_delivery=...)``;
* ``native``: for scale, the native client used as the drop-in is (confluent-kafka with
  ``enable.idempotence=true``; pulsar-client with a ``producer_name``, on a namespace without
  deduplication): how far this machine lets any producer grow with replicas.

The replicas are started, open their producers, send one warm-up record each (so that every
producer has connected), and report ready; then all are told to go at
once and each sends ``--records`` keyed records of ``--size`` bytes and flushes. The table
shows the aggregate rate (all records over the time from the first start to the last flush),
the median replica's own rate, and the aggregate's ratio to one replica's. Every delivery
report is counted: a failed record is shown in the table. (That every record is stored once,
with replicas killed and restarted, is what the deploy tests check, not this benchmark.)
Rounds alternate the replica counts; the table shows medians.

    python bench/bench_replicas.py                            # kafka and pulsar, both ways
    python bench/bench_replicas.py --backends kafka --ways drop-in --records 50000 --repeats 3

Brokers are started with ``idempotent.testing.services`` unless running. Results are printed
as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from idempotent.compare.baselines import pulsar_admin
from idempotent.testing import services


def _url(info: services.ServiceInfo, backend: str) -> str:
    if backend == "pulsar":
        return f"{info.url}?{urllib.parse.urlencode({'admin_url': info.admin_url or ''})}"
    return info.url


def make_topic(backend: str, info: services.ServiceInfo, partitions: int) -> str:
    """A fresh topic made by the backend's own tools."""
    name = f"replicas-{uuid.uuid4().hex[:8]}"
    if backend == "kafka":
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": info.bootstrap})
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)
    else:
        pulsar_admin(info.admin_url or "", "PUT", f"/admin/v2/persistent/public/default/{name}/partitions", partitions)
    return name


# -- one replica (a child process) ----------------------------------------------------------


def replica(backend: str, way: str, url: str, bootstrap: str, topic: str, name: str, records: int, size: int) -> int:
    """Open the producer, say ready, wait for ``go`` on stdin, send, flush, print the result."""
    failed = 0

    def counted(error: Any, *_: Any) -> None:
        nonlocal failed
        if error is not None:
            failed += 1

    payload = b"x" * size
    keys = [f"{name}-{i}".encode() for i in range(records)]
    if way in ("drop-in", "native") and backend == "kafka":
        if way == "native":
            import confluent_kafka
        else:
            from idempotent.compat import confluent_kafka  # type: ignore[no-redef]

        settings = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
        settings.update({"enable.idempotence": True} if way == "native" else {"transactional.id": name})
        kafka = confluent_kafka.Producer(settings)

        def send(key: bytes) -> None:
            while True:
                try:
                    kafka.produce(topic, payload, key, on_delivery=counted)
                    break
                except BufferError:
                    kafka.poll(0.05)
            kafka.poll(0)

        def flush() -> None:
            if kafka.flush(300):
                raise SystemExit("flush timed out")

    elif way in ("drop-in", "native"):
        if way == "native":
            import pulsar as drop_in

            url = bootstrap
        else:
            from idempotent.compat import pulsar as drop_in  # type: ignore[no-redef]

        ok = drop_in.Result.Ok
        quiet = {"logger": drop_in.ConsoleLogger(drop_in.LoggerLevel.Error)} if way == "native" else {}
        client = drop_in.Client(url, **quiet)
        pulsar_producer = client.create_producer(
            topic,
            producer_name=name,
            batching_enabled=True,
            batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
            send_timeout_millis=0,
        )

        def delivered(result: Any, message_id: Any) -> None:
            counted(None if result == ok else result)

        def send(key: bytes) -> None:
            pulsar_producer.send_async(payload, delivered, partition_key=key.decode())

        def flush() -> None:
            pulsar_producer.flush()

    else:
        from idempotent import Producer

        producer = Producer(url, producer_name=name, linger_ms=5)

        def send(key: bytes) -> None:
            producer.send(topic, payload, key, on_delivery=counted)

        def flush() -> None:
            if producer.flush(300):
                raise SystemExit("flush timed out")

    send(b"warm-up")  # connected, with the topic's metadata, before the clock starts
    flush()
    failed = 0
    print("ready", flush=True)
    sys.stdin.readline()
    cpu, started = time.process_time(), time.time()
    for key in keys:
        send(key)
    flush()
    ended = time.time()
    result = {"started": started, "ended": ended, "failed": failed, "cpu_s": time.process_time() - cpu}
    print(json.dumps(result), flush=True)
    os._exit(0)  # the result is out; do not wait for clients' background threads


# -- the driver ---------------------------------------------------------------------------


def run_round(
    backend: str, way: str, info: services.ServiceInfo, replicas: int, partitions: int, records: int, size: int
) -> dict[str, Any]:
    topic = make_topic(backend, info, partitions)
    tag = uuid.uuid4().hex[:6]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--replica",
                backend,
                way,
                _url(info, backend),
                info.bootstrap or "",
                topic,
                f"svc-{tag}-{index}",
                str(records),
                str(size),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(replicas)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a replica did not start ({way} on {backend}): {line!r}")
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        results = []
        for process in processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"a replica died ({way} on {backend}), exit {process.wait(30)}")
            results.append(json.loads(line))
            process.wait(60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    elapsed = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {
        "backend": backend,
        "way": way,
        "replicas": replicas,
        "records_per_s": replicas * records / elapsed,
        "replica_records_per_s": statistics.median(records / (r["ended"] - r["started"]) for r in results),
        "cpu_us_per_record": statistics.median(1e6 * r["cpu_s"] / records for r in results),
        "failed": sum(r["failed"] for r in results),
        "seconds": elapsed,
    }


def summarize(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | way | replicas | records/s, all replicas (median) | one replica's own rate | "
        "CPU µs/record in a replica | failed | vs 1 replica |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["backend"], r["way"]) for r in runs})
    for backend, way in keys:
        medians: dict[int, dict[str, float]] = {}
        for count in sorted({r["replicas"] for r in runs if (r["backend"], r["way"]) == (backend, way)}):
            mine = [r for r in runs if (r["backend"], r["way"], r["replicas"]) == (backend, way, count)]
            medians[count] = {
                k: statistics.median(r[k] for r in mine)
                for k in ("records_per_s", "replica_records_per_s", "cpu_us_per_record")
            }
            medians[count]["failed"] = sum(r["failed"] for r in mine)
        one = medians.get(1, {}).get("records_per_s")
        for count, m in medians.items():
            ratio = f"{m['records_per_s'] / one:.2f}x" if one else "-"
            lines.append(
                f"| {backend} | {way} | {count} | {m['records_per_s']:,.0f} | {m['replica_records_per_s']:,.0f} | "
                f"{m['cpu_us_per_record']:.1f} | {m['failed']:.0f} | {ratio} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--replica"]:
        backend, way, url, bootstrap, topic, name, records, size = argv[1:]
        return replica(backend, way, url, bootstrap, topic, name, int(records), int(size))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="kafka,pulsar")
    parser.add_argument("--ways", default="native,drop-in,producer")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--records", type=int, default=50_000, help="records per replica")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.replicas.split(",") if c]
    runs: list[dict[str, Any]] = []
    started_here = []
    try:
        for backend in [b for b in args.backends.split(",") if b]:
            if services.status(backend) is None:
                started_here.append(backend)
            info = services.up(backend)
            for repeat in range(args.repeats):
                for way in [w for w in args.ways.split(",") if w]:
                    order = counts[repeat % len(counts) :] + counts[: repeat % len(counts)]
                    for count in order:
                        run = run_round(backend, way, info, count, args.partitions, args.records, args.size)
                        runs.append({**run, "repeat": repeat})
                        print(
                            f"{backend} {way} x{count}: {run['records_per_s']:,.0f}/s, failed {run['failed']}",
                            file=sys.stderr,
                        )
    finally:
        for backend in started_here:
            services.down(backend)
    table = summarize(runs)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        **{k: v for k, v in vars(args).items() if k != "out"},
        "python": platform.python_version(),
        "host_cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"replicas-{stamp}.json").write_text(json.dumps({"meta": meta, "runs": runs, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
