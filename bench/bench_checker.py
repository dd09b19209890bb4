"""The broker-side checker's memory per tracked producer and its snapshot speed.

* memory: ``--producers`` producers (default 1,000,000) each write one batch to one
  partition's :class:`PartitionChecker` (a one-batch window each); the growth of the
  process's resident set, divided by the producer count, is the cost of one tracked
  (producer, partition).
* snapshots: a checker tracking ``--snapshot-producers`` producers (default 200,000) is
  snapshotted and restored ``--repeats`` times; the medians are printed.

    python bench/bench_checker.py
    python bench/bench_checker.py --producers 200000 --repeats 5

Targets (issue "a per-batch hot path"): at most 150 B per tracked producer, snapshot write
and restore of 200,000 producers under 0.5 s each.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

from idempotent._checker import CheckerConfig, PartitionChecker, make_header


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tracked(producers: int) -> PartitionChecker:
    checker = PartitionChecker(CheckerConfig(max_producers=producers + 1))
    for producer_id in range(producers):
        header = make_header(producer_id, 0, 0, 1)
        checker.check(header)
        checker.commit(checker.push(header, 0.0), producer_id)
    return checker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=1_000_000)
    parser.add_argument("--snapshot-producers", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    gc.collect()
    before = _rss()
    checker = tracked(args.producers)
    gc.collect()
    per_producer = (_rss() - before) / args.producers
    del checker
    gc.collect()
    checker = tracked(args.snapshot_producers)
    writes, restores = [], []
    size = 0
    for _ in range(args.repeats):
        started = time.perf_counter()
        snapshot = checker.snapshot(1.0)
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        PartitionChecker.restore(snapshot, checker.config)
        restores.append(time.perf_counter() - started)
        size = len(snapshot.data)
    print("| measure | value | target |\n|---|---|---|")
    print(f"| RSS per tracked (producer, partition), {args.producers:,} producers | {per_producer:,.0f} B | 150 B |")
    print(
        f"| snapshot write, {args.snapshot_producers:,} producers ({size:,} B) | "
        f"{statistics.median(writes):.2f} s | 0.5 s |"
    )
    print(f"| snapshot restore, {args.snapshot_producers:,} producers | {statistics.median(restores):.2f} s | 0.5 s |")
    result = {
        "bench": "checker",
        "producers": args.producers,
        "bytes_per_producer": per_producer,
        "snapshot_producers": args.snapshot_producers,
        "snapshot_bytes": size,
        "snapshot_write_s": statistics.median(writes),
        "snapshot_restore_s": statistics.median(restores),
        "repeats": args.repeats,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"checker-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
