"""Cost of the Prometheus metrics on the produce path: records/s with and without them.

The same workload (one Producer, N records of 100 bytes, default batching) runs against a
fresh broker with and without :class:`idempotent.broker.metrics.BrokerMetrics` observing it, in
rotating order, ``--repeats`` times per variant; the table shows medians.

    python bench/bench_metrics.py                       # memory:// and sqlite://, 200 000 records
    python bench/bench_metrics.py --backends sqlite --records 500000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import idempotent
from idempotent.adapters import open_backend
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.broker.metrics import BrokerMetrics


def run_once(url: str, records: int, with_metrics: bool) -> float:
    broker = Broker(open_backend(url), BrokerConfig())
    metrics = BrokerMetrics(broker) if with_metrics else None
    value = b"x" * 100
    started = time.perf_counter()
    with idempotent.Producer(broker) as producer:
        for _ in range(records):
            producer.send("bench", value)
        producer.flush()
    elapsed = time.perf_counter() - started
    if metrics is not None:
        counted = metrics.registry.get_sample_value("idempotent_records_appended_total", {"topic": "bench"})
        assert counted == records, counted
        metrics.close()
    broker.close()
    return records / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["memory", "sqlite"], choices=["memory", "sqlite"])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| backend | without metrics (records/s) | with metrics (records/s) | ratio |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            rates: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.repeats * 2):
                with_metrics = bool(i % 2)
                url = (
                    f"memory://{uuid.uuid4().hex}" if backend == "memory" else f"sqlite:///{tmp}/{uuid.uuid4().hex}.db"
                )
                rates[with_metrics].append(run_once(url, args.records, with_metrics))
            off, on = statistics.median(rates[False]), statistics.median(rates[True])
            print(f"| {backend} | {off:,.0f} | {on:,.0f} | {on / off:.2f} |")


if __name__ == "__main__":
    main()
