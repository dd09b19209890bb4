"""The asyncio producers against the native ones, in the same run.

Run: python bench/bench_aio.py BOOTSTRAP [--records N] [--rounds R]

Produces N records of 100 B into a fresh topic of the Kafka cluster at BOOTSTRAP, the
application's way (``futures = [await p.produce(...)]``, ``await p.flush()``, then gathering the
futures), with confluent-kafka's ``aio.AIOProducer`` and with the drop-in's, alternated for R
rounds, and prints records/s of each and their ratio (medians). The result is saved under
``bench/results/`` (``aio-<time>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import save_run


async def _one(factory: Any, bootstrap: str, records: int) -> float:
    topic = f"bench-aio-{uuid.uuid4().hex[:8]}"
    producer = factory({"bootstrap.servers": bootstrap, "linger.ms": 5})
    value = b"x" * 100
    start = time.perf_counter()
    futures = [await producer.produce(topic, value=value) for _ in range(records)]
    await producer.flush()
    delivered = await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    assert len(delivered) == records
    await producer.close()
    return records / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from confluent_kafka.aio import AIOProducer as Native
    from idempotent.compat.confluent_kafka.aio import AIOProducer as DropIn

    load_before = os.getloadavg()
    rates: dict[str, list[float]] = {"native": [], "drop_in": []}
    for _ in range(args.rounds):
        for name, factory in (("native", Native), ("drop_in", DropIn)):
            rate = asyncio.run(_one(factory, args.bootstrap, args.records))
            rates[name].append(rate)
            print(f"{name}: {rate:,.0f} records/s", flush=True)
    native, drop_in = statistics.median(rates["native"]), statistics.median(rates["drop_in"])
    print(f"median: native {native:,.0f}, drop-in {drop_in:,.0f} records/s, ratio {drop_in / native:.2f}x")
    save_run("aio", args, load_before, os.getloadavg(), rates=rates, ratio=drop_in / native)


if __name__ == "__main__":
    main()
