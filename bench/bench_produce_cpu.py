"""Kafka: the calling thread's CPU per ``produce()`` and ``send()`` call, beside confluent-kafka's.

What an application thread pays per record before the record is anyone else's: confluent-kafka
copies it into librdkafka's queue in C; the drop-in and ``Producer.send`` append it to the
producer's column buffers in Python, and the sender thread does the rest (batches, checks,
the write). This benchmark times only the calls, with ``time.thread_time()`` around each
chunk of ``--chunk`` calls (the flushes between chunks are not counted), so the other threads'
work and the broker's do not blur it.

Variants, each ``--records`` records of ``--size`` bytes, no key, no callback, into a fresh
topic of ``--partitions`` partitions on the shared (or a started) Kafka:

* ``native``: confluent-kafka, ``enable.idempotence=true``, ``linger.ms=5``, ``produce()``;
* ``drop-in``: ``idempotent.compat.confluent_kafka``, the same settings, anonymous;
* ``drop-in-named``: the same with a ``transactional.id`` (a named producer);
* ``send``: ``idempotent.Producer("kafka://...").send(topic, value)`` (a future per record).

Each variant runs in a fresh process, in rotating order, ``--repeats`` times; the table shows
the median µs of CPU per call, the difference to ``native`` and the ratio.

    python bench/bench_produce_cpu.py
    python bench/bench_produce_cpu.py --records 500000 --size 1000 --repeats 5

Results are printed as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

from _child import run_json
from _results import save_run

VARIANTS = ("native", "drop-in", "drop-in-named", "send")


def _child(variant: str, records: int, size: int, partitions: int, chunk: int) -> dict[str, Any]:
    import idempotent
    from idempotent.testing import services

    info = services.up("kafka")
    topic = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    with idempotent.connect(info.url) as broker:
        broker.create_topic(topic, partitions)
    value = b"x" * size
    cpu = 0.0
    if variant == "send":
        producer: Any = idempotent.Producer(info.url, linger_ms=5)
        producer.send(topic, value).result(60)
        send = producer.send
        for _ in range(0, records, chunk):
            c0 = time.thread_time()
            for _ in range(chunk):
                send(topic, value)
            cpu += time.thread_time() - c0
            producer.flush(300)
    else:
        if variant == "native":
            import confluent_kafka as client
        else:
            from idempotent.compat import confluent_kafka as client  # type: ignore[no-redef]
        config: dict[str, Any] = {"bootstrap.servers": info.bootstrap, "enable.idempotence": True, "linger.ms": 5}
        if variant == "drop-in-named":
            config["transactional.id"] = f"bench-cpu-{uuid.uuid4().hex[:8]}"
        producer = client.Producer(config)
        producer.produce(topic, value)
        producer.flush(60)
        produce, poll = producer.produce, producer.poll
        for _ in range(0, records, chunk):
            c0 = time.thread_time()
            for _ in range(chunk):
                try:
                    produce(topic, value)
                except BufferError:
                    poll(0.05)
                    produce(topic, value)
            cpu += time.thread_time() - c0
            producer.flush(300)
    if hasattr(producer, "close"):
        producer.close()
    with idempotent.connect(info.url) as broker:
        broker.delete_topic(topic)
    return {"cpu_us": cpu / records * 1e6}


def _run(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", variant, str(args.records), str(args.size)]
    command += [str(args.partitions), str(args.chunk)]
    return run_json(command, variant)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        variant, records, size, partitions, chunk = args.child
        print(json.dumps(_child(variant, int(records), int(size), int(partitions), int(chunk))))
        return 0
    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for repeat in range(args.repeats):
        shift = repeat % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            cpu = _run(variant, args)["cpu_us"]
            runs[variant].append(cpu)
            print(f"{variant:14} {cpu:.3f} µs CPU per call")
    native = statistics.median(runs["native"])
    table = {}
    print(f"\n{args.records:,} records of {args.size} B, {args.partitions} partitions, medians of {args.repeats}\n")
    print("| call | µs CPU per call (calling thread) | beyond native | of native |")
    print("|---|---|---|---|")
    for variant in VARIANTS:
        median = statistics.median(runs[variant])
        table[variant] = {"cpu_us": median, "beyond_native_us": median - native, "ratio": median / native}
        print(f"| {variant} | {median:.3f} | {median - native:+.3f} | {median / native:.2f}x |")
    save_run("produce-cpu", args, load_before, os.getloadavg(), runs=runs, table=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
