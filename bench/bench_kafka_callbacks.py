"""Kafka, a delivery callback per record in the two shapes applications write it, in one run.

Each variant sends ``--records`` records of ``--size`` bytes, one call per record, into a fresh
topic of ``--partitions`` partitions on the shared (or a started) Kafka, then flushes; every
record gets a delivery callback, which counts the outcomes:

* ``native``: confluent-kafka with ``enable.idempotence=true``, ``acks=all``, ``linger.ms=5``,
  ``produce(topic, value, on_delivery=cb)`` then ``poll(0)`` per record (the baseline);
* ``drop-in``: the same code on ``idempotent.compat.confluent_kafka`` (the same settings);
* ``send-cb``: ``idempotent.Producer("kafka://...").send(topic, value, on_delivery=cb)``.

Two shapes of callback, each run for every variant:

* ``shared``: one function for every record, as confluent-kafka's own examples write it;
* ``closure``: a new closure per record (what ``bench/bench_backends.py`` does, to time one
  record in 16): every record in flight then holds two objects the garbage collector walks,
  on every side.

Every (shape, variant) runs in a fresh process, in rotating order, ``--repeats`` times; the
table shows the median records/s (first call to the end of ``flush``), the process's CPU per
record (every thread), the Kafka broker's CPU per record in the same window (its JVM, read
from ``/proc``; the broker runs on the same machine), the collector's time in the measured
window, and each variant's ratio to ``native`` in the same shape.

    python bench/bench_kafka_callbacks.py
    python bench/bench_kafka_callbacks.py --records 500000 --size 1000 --repeats 5

Results are printed as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

from _child import run_json
from _results import save_run

VARIANTS = ("native", "drop-in", "send-cb")
TICK = os.sysconf("SC_CLK_TCK")
SHAPES = ("shared", "closure")


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _child(variant: str, shape: str, records: int, size: int, partitions: int) -> dict[str, Any]:
    import idempotent
    from idempotent.testing import services

    info = services.up("kafka")
    topic = f"bench-cb-{uuid.uuid4().hex[:8]}"
    with idempotent.connect(info.url) as broker:
        broker.create_topic(topic, partitions)
    outcomes = [0, 0]

    def counted(err: Any, _msg: Any) -> None:
        outcomes[0 if err is None else 1] += 1

    def callback() -> Any:
        if shape == "shared":
            return counted

        def one(err: Any, msg: Any) -> None:  # a closure per record
            counted(err, msg)

        return one

    collected = [0.0]
    started: list[float] = []

    def timed(phase: str, _info: Any) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            collected[0] += time.perf_counter() - started.pop()

    value = b"x" * size
    if variant == "send-cb":
        producer: Any = idempotent.Producer(info.url, linger_ms=5)
        producer.send(topic, value, on_delivery=counted)
        producer.flush(60)
        send = producer.send
        gc.callbacks.append(timed)
        t0, c0, b0 = time.perf_counter(), time.process_time(), _cpu_of(info.pid)
        for _ in range(records):
            send(topic, value, on_delivery=callback())
        producer.flush(300)
    else:
        if variant == "native":
            import confluent_kafka as client
        else:
            from idempotent.compat import confluent_kafka as client  # type: ignore[no-redef]
        config = {"bootstrap.servers": info.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
        producer = client.Producer(config)
        producer.produce(topic, value, on_delivery=counted)
        producer.flush(60)
        produce, poll = producer.produce, producer.poll
        gc.callbacks.append(timed)
        t0, c0, b0 = time.perf_counter(), time.process_time(), _cpu_of(info.pid)
        for _ in range(records):
            while True:
                try:
                    produce(topic, value, on_delivery=callback())
                    break
                except BufferError:
                    poll(0.05)
            poll(0)
        producer.flush(300)
    seconds, cpu, broker_cpu = time.perf_counter() - t0, time.process_time() - c0, _cpu_of(info.pid) - b0
    gc.callbacks.remove(timed)
    if hasattr(producer, "close"):
        producer.close()
    with idempotent.connect(info.url) as broker:
        broker.delete_topic(topic)
    return {
        "records_per_s": records / seconds,
        "cpu_us": cpu / records * 1e6,
        "broker_cpu_us": broker_cpu / records * 1e6,
        "gc_ms": collected[0] * 1e3,
        "delivered": outcomes[0] - 1,
        "failed": outcomes[1],
    }


def _run(variant: str, shape: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", variant, shape, str(args.records), str(args.size)]
    command.append(str(args.partitions))
    result = run_json(command, f"{variant}/{shape}")
    if result["delivered"] != args.records or result["failed"]:
        raise RuntimeError(f"{variant}/{shape}: {result['delivered']} delivered, {result['failed']} failed")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        variant, shape, records, size, partitions = args.child
        print(json.dumps(_child(variant, shape, int(records), int(size), int(partitions))))
        return 0
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {f"{s}/{v}": [] for s in SHAPES for v in VARIANTS}
    order = [(s, v) for s in SHAPES for v in VARIANTS]
    for repeat in range(args.repeats):
        shift = repeat % len(order)
        for shape, variant in order[shift:] + order[:shift]:
            result = _run(variant, shape, args)
            runs[f"{shape}/{variant}"].append(result)
            print(
                f"{shape:8} {variant:8} {result['records_per_s']:>10,.0f} records/s  {result['cpu_us']:.2f} µs CPU"
                f"  broker {result['broker_cpu_us']:.2f} µs"
            )
    table = {}
    for shape in SHAPES:
        native = statistics.median(r["records_per_s"] for r in runs[f"{shape}/native"])
        for variant in VARIANTS:
            got = runs[f"{shape}/{variant}"]
            rate = statistics.median(r["records_per_s"] for r in got)
            table[f"{shape}/{variant}"] = {
                "records_per_s": rate,
                "ratio": rate / native,
                "cpu_us": statistics.median(r["cpu_us"] for r in got),
                "broker_cpu_us": statistics.median(r["broker_cpu_us"] for r in got),
                "gc_ms": statistics.median(r["gc_ms"] for r in got),
            }
    print(f"\n{args.records:,} records of {args.size} B, {args.partitions} partition(s), medians of {args.repeats}\n")
    print("| callback | producer | records/s | of native | µs CPU per record | broker µs CPU | collector ms |")
    print("|---|---|---|---|---|---|---|")
    for key, row in table.items():
        shape, variant = key.split("/")
        print(
            f"| {shape} | {variant} | {row['records_per_s']:,.0f} | {row['ratio']:.2f}x | "
            f"{row['cpu_us']:.2f} | {row['broker_cpu_us']:.2f} | {row['gc_ms']:,.0f} |"
        )
    save_run("kafka-callbacks", args, load_before, os.getloadavg(), runs=runs, table=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
