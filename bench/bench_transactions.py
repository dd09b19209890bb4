"""Kafka transactions: the confluent-kafka drop-in against confluent-kafka's own
transactional producer, in one run.

Each variant runs ``--transactions`` transactions of N records of ``--size`` bytes (N in
``--per-transaction``, default 100, 1,000 and 10,000) into a fresh topic of ``--partitions``
partitions on the shared (or a started) Kafka: ``begin_transaction``, N ``produce`` calls
(``poll(0)`` every 1,000), ``send_offsets_to_transaction`` of a consumer group's offsets, then
``commit_transaction``:

* ``native``: ``confluent_kafka.Producer`` with a ``transactional.id`` (the baseline);
* ``drop-in``: the same code on ``idempotent.compat.confluent_kafka``.

Every (N, variant) runs in a fresh process, in rotating order, ``--repeats`` times; the
table shows the median transactions/s and records/s (first ``begin_transaction`` to the last
commit), the p50 of ``send_offsets_to_transaction`` plus ``commit_transaction``, and the
drop-in's ratio to ``native`` for the same N. The load average before and after is saved with
the numbers: compare runs only on an idle machine.

    python bench/bench_transactions.py
    python bench/bench_transactions.py --per-transaction 1000 --transactions 50 --repeats 5

Results are printed as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from _results import save_run

VARIANTS = ("native", "drop-in")


def _child(variant: str, per_txn: int, transactions: int, size: int, partitions: int) -> dict[str, Any]:
    import confluent_kafka

    import idempotent
    from idempotent.testing import services

    info = services.up("kafka")
    module: Any = confluent_kafka
    if variant == "drop-in":
        from idempotent.compat import confluent_kafka as module
    topic = f"bench-txn-{uuid.uuid4().hex[:8]}"
    with idempotent.connect(info.url) as broker:
        broker.create_topic(topic, partitions)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    consumer = confluent_kafka.Consumer({"bootstrap.servers": info.bootstrap, "group.id": group})
    metadata = consumer.consumer_group_metadata()
    producer = module.Producer(
        {"bootstrap.servers": info.bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}", "linger.ms": 5}
    )
    producer.init_transactions(60)
    value = b"x" * size
    commits: list[float] = []
    started = time.perf_counter()
    for t in range(transactions):
        producer.begin_transaction()
        for i in range(per_txn):
            producer.produce(topic, value, partition=i % partitions)
            if i % 1000 == 999:
                producer.poll(0)
        offsets = [confluent_kafka.TopicPartition(topic, p, (t + 1) * per_txn) for p in range(partitions)]
        before = time.perf_counter()
        producer.send_offsets_to_transaction(offsets, metadata)
        producer.commit_transaction()
        commits.append(time.perf_counter() - before)
    elapsed = time.perf_counter() - started
    producer.flush(30)
    consumer.close()
    return {
        "variant": variant,
        "per_transaction": per_txn,
        "transactions_per_s": transactions / elapsed,
        "records_per_s": transactions * per_txn / elapsed,
        "commit_p50_ms": statistics.median(commits) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-transaction", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--transactions", type=int, default=0, help="per run (default: 100,000 records a run)")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, per_txn, transactions, size, partitions = args.child
        print(json.dumps(_child(variant, int(per_txn), int(transactions), int(size), int(partitions))))
        return
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for per_txn in args.per_transaction:
        transactions = args.transactions or max(10, 100_000 // per_txn)
        for repeat in range(args.repeats):
            order = VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                child = [str(v) for v in (variant, per_txn, transactions, args.size, args.partitions)]
                out = subprocess.run(
                    [sys.executable, __file__, "--child", *child], capture_output=True, text=True, check=True
                ).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
    load_after = os.getloadavg()
    print("| records/txn | variant | txn/s | records/s | send_offsets+commit p50 ms | ratio txn/s | ratio records/s |")
    print("|---|---|---|---|---|---|---|")
    table: list[dict[str, Any]] = []
    for per_txn in args.per_transaction:
        medians: dict[str, dict[str, float]] = {}
        for variant in VARIANTS:
            mine = [r for r in runs if r["variant"] == variant and r["per_transaction"] == per_txn]
            medians[variant] = {
                key: statistics.median(r[key] for r in mine)
                for key in ("transactions_per_s", "records_per_s", "commit_p50_ms")
            }
        for variant in VARIANTS:
            m, n = medians[variant], medians["native"]
            row = {"per_transaction": per_txn, "variant": variant, **m}
            row["ratio_txn"] = m["transactions_per_s"] / n["transactions_per_s"]
            row["ratio_records"] = m["records_per_s"] / n["records_per_s"]
            table.append(row)
            print(
                f"| {per_txn} | {variant} | {m['transactions_per_s']:.1f} | {m['records_per_s']:.0f} | "
                f"{m['commit_p50_ms']:.1f} | {row['ratio_txn']:.2f}x | {row['ratio_records']:.2f}x |"
            )
    save_run("transactions", args, load_before, load_after, runs=runs, table=table)


if __name__ == "__main__":
    main()
