"""Embedded SQLite throughput: this project's producer next to plain ``sqlite3``, in one run.

Each variant writes ``--records`` records of ``--size`` bytes into a fresh database file with
the same durability (WAL, ``synchronous=NORMAL``, the ``sqlite://`` default):

* ``executemany``: plain Python ``sqlite3``, ``executemany`` of the rows the SQLite adapter
  stores (its ``records`` table), one transaction per 1000 rows. No checker, no producer.
* ``send``: ``Producer("sqlite:///...").send(...)`` per record, then ``flush()``.
* ``send_many``: ``Producer.send_many`` of 1000 records per call, then ``flush()``.
* ``cli``: ``idempotent produce sqlite:///... TOPIC --generate N --size S`` in a child
  process; its own reported rate (it times from start to the last acknowledgement).

Variants run ``--repeats`` times in rotating order; the table shows medians of records/s and
the ratio of each to ``executemany``.

    python bench/bench_embedded.py                       # 200,000 records of 100 B, 5 repeats
    python bench/bench_embedded.py --records 50000 --size 1000 --repeats 3

Results are printed as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from idempotent import Producer

VARIANTS = ("executemany", "send", "send_many", "cli")
CHUNK = 1000


def run_executemany(path: str, size: int, records: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE records (topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL, "
        "producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL, sequence INTEGER NOT NULL, "
        "key BLOB, value BLOB, headers BLOB, timestamp REAL NOT NULL, "
        "PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID"
    )
    payload = b"x" * size
    started = time.perf_counter()
    for base in range(0, records, CHUNK):
        now = time.time()
        rows = [("t", 0, i, 1, 0, i, None, payload, None, now) for i in range(base, min(records, base + CHUNK))]
        db.execute("BEGIN")
        db.executemany("INSERT INTO records VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    db.close()
    return records / elapsed


def run_producer(path: str, size: int, records: int, many: bool) -> float:
    payload = b"x" * size
    with Producer(f"sqlite:///{path}") as producer:
        producer.send("t", payload, partition=0).result()  # topic, producer state, warm path
        started = time.perf_counter()
        if many:
            chunk = [payload] * CHUNK
            for base in range(0, records, CHUNK):
                producer.send_many("t", chunk[: min(CHUNK, records - base)], partition=0)
        else:
            for _ in range(records):
                producer.send("t", payload, partition=0)
        unfinished = producer.flush()
        elapsed = time.perf_counter() - started
    if unfinished:
        raise RuntimeError(f"{unfinished} records unfinished")
    return records / elapsed


def run_cli(path: str, size: int, records: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "idempotent", "produce", f"sqlite:///{path}", "t",
         "--generate", str(records), "--size", str(size), "--no-progress"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    match = re.search(r"rate=(\d+) records/s", out)
    if match is None:
        raise RuntimeError(f"no rate in {out!r}")
    return float(match.group(1))


def run_once(variant: str, size: int, records: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        if variant == "executemany":
            return run_executemany(path, size, records)
        if variant == "cli":
            return run_cli(path, size, records)
        return run_producer(path, size, records, many=variant == "send_many")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    runs: dict[str, list[float]] = {v: [] for v in variants}
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for variant in order:
            rate = run_once(variant, args.size, args.records)
            runs[variant].append(rate)
            print(f"  {variant:12} run {repeat + 1}: {rate:,.0f} records/s", file=sys.stderr)
    medians = {v: statistics.median(r) for v, r in runs.items()}
    base = medians.get("executemany")
    lines = [
        f"{args.records:,} records of {args.size} B, median of {args.repeats}, variants alternated, one run:",
        "",
        "| variant | records/s | / executemany |",
        "|---|---|---|",
    ]
    for v in variants:
        ratio = f"{medians[v] / base:.2f}x" if base else "-"
        lines.append(f"| {v} | {medians[v]:,.0f} | {ratio} |")
    print("\n".join(lines))
    result: dict[str, Any] = {
        "bench": "embedded",
        "records": args.records,
        "size": args.size,
        "repeats": args.repeats,
        "runs": runs,
        "medians": medians,
        "python": platform.python_version(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"embedded-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
