"""The broker-side checker: memory per tracked producer, snapshot speed, decision rate.

* memory: ``--producers`` producers (default 1,000,000) each write one batch to one
  partition's :class:`PartitionChecker` (a one-batch window each); the growth of the
  process's resident set, divided by the producer count, is the cost of one tracked
  (producer, partition). The same with ``--window-producers`` producers (default 250,000)
  that each wrote 16 batches, a full default window. Each is measured in a fresh process.
* snapshots: a checker tracking ``--snapshot-producers`` producers (default 200,000) is
  snapshotted and restored ``--repeats`` times: the pure encode (``snapshot()``) and decode
  (``restore()``), then end to end on ``sqlite://``: encode + ``write_snapshot`` (one
  transaction, synchronous=FULL) and ``latest_snapshot`` + decode, the path a broker's
  recovery takes before it replays the log.
* decisions: 1,000 producers take turns sending batches of 100 records through
  ``check`` + ``push`` + ``commit``; batches and records decided per second.

Medians of ``--repeats`` runs; the load average is printed with the results.

    python bench/bench_checker.py
    python bench/bench_checker.py --producers 200000 --repeats 5

Targets (issue "a per-batch hot path"): at most 150 B per tracked producer with a one-batch
window, snapshot write and restore of 200,000 producers under 0.5 s each.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from idempotent.core.checker import CheckerConfig, PartitionChecker, make_header


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _load() -> str:
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def tracked(producers: int, batches: int = 1) -> PartitionChecker:
    """A checker where each of ``producers`` producers stored ``batches`` batches of one record."""
    checker = PartitionChecker(CheckerConfig(max_producers=producers + 1))
    offset = 0
    for sequence in range(batches):
        for producer_id in range(producers):
            header = make_header(producer_id, 0, sequence, 1)
            checker.check(header)
            checker.commit(checker.push(header, 0.0), offset)
            offset += 1
    return checker


def bytes_per_producer(producers: int, batches: int) -> float:
    """RSS growth per tracked producer, measured in a fresh interpreter."""
    code = (
        "import gc, sys; sys.path.insert(0, sys.argv[3]); import bench_checker as b; gc.collect(); "
        "before = b._rss(); c = b.tracked(int(sys.argv[1]), int(sys.argv[2])); gc.collect(); "
        "print((b._rss() - before) / int(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(producers), str(batches), str(Path(__file__).parent)],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,  # not the caller's directory: import what this process imports
    )
    return float(out.stdout.strip())


def decisions_per_second(producers: int = 1000, laps: int = 200, records: int = 100) -> float:
    """Batches per second through check + push + commit (headers built beforehand)."""
    checker = PartitionChecker(CheckerConfig(max_producers=producers + 1))
    headers = [make_header(p, 0, lap * records, records) for lap in range(laps) for p in range(producers)]
    gc.collect()
    offset = 0
    started = time.perf_counter()
    for header in headers:
        checker.check(header)
        checker.commit(checker.push(header, 0.0), offset)
        offset += records
    return len(headers) / (time.perf_counter() - started)


def snapshot_times(producers: int, repeats: int) -> dict[str, float]:
    """Median seconds of the pure encode/decode and of the sqlite:// store/load around them."""
    from idempotent.adapters.sqlite.backend import SQLiteBackend

    checker = tracked(producers)
    encode, decode, write, read, size = [], [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        backend = SQLiteBackend(f"sqlite:///{tmp}/snapshots.db")
        backend.create_topic("t", 1)
        try:
            for _ in range(repeats):
                gc.collect()
                started = time.perf_counter()
                snapshot = checker.snapshot(1.0)
                encoded = time.perf_counter()
                backend.write_snapshot("t", 0, snapshot)
                stored = time.perf_counter()
                encode.append(encoded - started)
                write.append(stored - started)
                size = len(snapshot.data)
                gc.collect()
                started = time.perf_counter()
                loaded = backend.latest_snapshot("t", 0)
                fetched = time.perf_counter()
                restored = PartitionChecker.restore(loaded, checker.config)
                finished = time.perf_counter()
                decode.append(finished - fetched)
                read.append(finished - started)
                assert len(restored.producers()) == producers
                del restored
        finally:
            backend.close()
    return {
        "snapshot_bytes": size,
        "snapshot_encode_s": statistics.median(encode),
        "snapshot_decode_s": statistics.median(decode),
        "snapshot_write_s": statistics.median(write),
        "snapshot_restore_s": statistics.median(read),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=1_000_000)
    parser.add_argument("--window-producers", type=int, default=250_000)
    parser.add_argument("--snapshot-producers", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    load_before = _load()
    one = statistics.median(bytes_per_producer(args.producers, 1) for _ in range(args.repeats))
    sixteen = statistics.median(bytes_per_producer(args.window_producers, 16) for _ in range(args.repeats))
    snaps = snapshot_times(args.snapshot_producers, args.repeats)
    rate = statistics.median(decisions_per_second() for _ in range(args.repeats))
    load_after = _load()
    count = args.snapshot_producers
    print(f"load average before {load_before}, after {load_after}; medians of {args.repeats} runs")
    rss = "RSS per tracked (producer, partition)"
    size = int(snaps["snapshot_bytes"])
    sqlite = f"on sqlite://, {count:,} producers"
    rows = [
        (f"{rss}, one batch each, {args.producers:,} producers", f"{one:,.0f} B", "150 B"),
        (f"{rss}, 16 batches each, {args.window_producers:,} producers", f"{sixteen:,.0f} B", ""),
        (f"snapshot encode, {count:,} producers ({size:,} B)", f"{snaps['snapshot_encode_s']:.3f} s", ""),
        (f"snapshot decode, {count:,} producers", f"{snaps['snapshot_decode_s']:.3f} s", ""),
        (f"snapshot write (encode + store) {sqlite}", f"{snaps['snapshot_write_s']:.3f} s", "0.5 s"),
        (f"snapshot restore (load + decode) {sqlite}", f"{snaps['snapshot_restore_s']:.3f} s", "0.5 s"),
        ("decisions (check + push + commit), batches of 100 records", f"{rate:,.0f} batches/s", ""),
    ]
    print("| measure | value | target |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    result = {
        "bench": "checker",
        "producers": args.producers,
        "bytes_per_producer": one,
        "window_producers": args.window_producers,
        "bytes_per_producer_16_batches": sixteen,
        "snapshot_producers": count,
        **snaps,
        "batches_per_s": rate,
        "repeats": args.repeats,
        "load": [load_before, load_after],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"checker-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
