"""Embedded SQLite throughput: this project's producer next to plain ``sqlite3``, in one run.

Each variant writes ``--records`` records of ``--size`` bytes into a fresh database file with
the same durability (WAL, ``synchronous=NORMAL``, the ``sqlite://`` default), in a fresh
Python process of its own:

* ``executemany``: plain Python ``sqlite3``, ``executemany`` of the rows the SQLite adapter
  stores for those records (its ``entries`` table: one row id for partition and offset, key,
  value, headers) plus the one ``batches`` row per transaction, one transaction per 1000 rows. No
  checker, no producer. The baseline of every ratio.
* ``executemany_wide``: the same, into the ten-column ``records`` rows of databases written by
  earlier versions (the baseline of the numbers published before the log table).
* ``send``: ``Producer("sqlite:///...").send(topic, value, partition=0)`` per record, the
  path applications call, then ``flush()``.
* ``send_many``: ``Producer.send_many`` of 1000 records per call, then ``flush()``.
* ``cli``: ``idempotent produce sqlite:///... TOPIC --generate N --size S``, run through the
  command line's ``main`` in the child (its own reported rate: from start to the last
  acknowledgement; its CPU is counted around ``main``, the interpreter's start excluded).

Besides records/s (wall clock) every run reports the CPU its process spent per record (user +
system, every thread), which a loaded machine disturbs much less. Variants run ``--repeats``
times in rotating order; the table shows medians and the ratio of each to ``executemany``.

    python bench/bench_embedded.py                       # 200,000 records of 100 B, 5 repeats
    python bench/bench_embedded.py --records 50000 --size 1000 --repeats 3

Results are printed as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("executemany", "send", "send_many", "cli")
ALL_VARIANTS = (*VARIANTS, "executemany_wide")
CHUNK = 1000


def cpu_seconds() -> float:
    """User + system CPU of this process (every thread) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_executemany(path: str, size: int, records: int, wide: bool) -> tuple[float, float]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    if wide:
        db.execute(
            "CREATE TABLE records (topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL, "
            "producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL, sequence INTEGER NOT NULL, "
            "key BLOB, value BLOB, headers BLOB, timestamp REAL NOT NULL, "
            "PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID"
        )
    else:
        from idempotent.adapters.sqlite.backend import _SCHEMA
        from idempotent.adapters.sqlite.rows import ENTRIES_SCHEMA, OFFSET_BITS

        db.executescript(_SCHEMA)
        db.execute(ENTRIES_SCHEMA)
        db.execute("INSERT INTO partition_ids (topic, partition) VALUES ('t', 0)")
        first = 1 << OFFSET_BITS
    payload = b"x" * size
    started, cpu = time.perf_counter(), cpu_seconds()
    for base in range(0, records, CHUNK):
        now = time.time()
        end = min(records, base + CHUNK)
        db.execute("BEGIN")
        if wide:
            rows = [("t", 0, i, 1, 0, i, None, payload, None, now) for i in range(base, end)]
            db.executemany("INSERT INTO records VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        else:
            rows = [(first + i, None, payload, None) for i in range(base, end)]
            db.executemany("INSERT INTO entries VALUES (?,?,?,?)", rows)
            db.execute("INSERT INTO batches VALUES (?,?,?,?,?,?,?,?)", ("t", 0, base, 1, 0, base, end - base, now))
        db.execute("COMMIT")
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    db.close()
    return records / elapsed, cpu / records


def run_producer(path: str, size: int, records: int, many: bool) -> tuple[float, float]:
    from idempotent import Producer

    payload = b"x" * size
    with Producer(f"sqlite:///{path}") as producer:
        producer.send("t", payload, partition=0).result()  # topic, producer state, warm path
        started, cpu = time.perf_counter(), cpu_seconds()
        if many:
            chunk = [payload] * CHUNK
            for base in range(0, records, CHUNK):
                producer.send_many("t", chunk[: min(CHUNK, records - base)], partition=0)
        else:
            send = producer.send
            for _ in range(records):
                send("t", payload, partition=0)
        unfinished = producer.flush()
        elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    if unfinished:
        raise RuntimeError(f"{unfinished} records unfinished")
    return records / elapsed, cpu / records


def run_cli(path: str, size: int, records: int) -> tuple[float, float]:
    from idempotent.cli import main

    argv = ["produce", f"sqlite:///{path}", "t", "--generate", str(records), "--size", str(size), "--no-progress"]
    out = io.StringIO()
    cpu = cpu_seconds()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    cpu = cpu_seconds() - cpu
    match = re.search(r"rate=(\d+) records/s", out.getvalue())
    if code != 0 or match is None:
        raise RuntimeError(f"exit {code}, no rate in {out.getvalue()!r}")
    return float(match.group(1)), cpu / records


def run_here(variant: str, size: int, records: int) -> tuple[float, float]:
    """One run of one variant in this process: (records/s, CPU seconds per record)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        if variant.startswith("executemany"):
            return run_executemany(path, size, records, wide=variant == "executemany_wide")
        if variant == "cli":
            return run_cli(path, size, records)
        return run_producer(path, size, records, many=variant == "send_many")


def run_once(variant: str, size: int, records: int) -> tuple[float, float]:
    """One run of one variant in a fresh process."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, __file__, "--one", variant, "--size", str(size), "--records", str(records)],
        check=True, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    rate, cpu = json.loads(out.strip().splitlines()[-1])
    return float(rate), float(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"any of {', '.join(ALL_VARIANTS)}")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--one", choices=ALL_VARIANTS, help=argparse.SUPPRESS)  # a child's single run
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_here(args.one, args.size, args.records)))
        return 0
    variants = args.variants.split(",")
    unknown = set(variants) - set(ALL_VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(ALL_VARIANTS)}")
    runs: dict[str, list[float]] = {v: [] for v in variants}
    cpus: dict[str, list[float]] = {v: [] for v in variants}
    load = os.getloadavg()[0]
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for variant in order:
            rate, cpu = run_once(variant, args.size, args.records)
            runs[variant].append(rate)
            cpus[variant].append(cpu)
            print(
                f"  {variant:16} run {repeat + 1}: {rate:,.0f} records/s, {cpu * 1e6:.2f} µs CPU/record",
                file=sys.stderr,
            )
    load = max(load, os.getloadavg()[0])
    medians = {v: statistics.median(r) for v, r in runs.items()}
    cpu_medians = {v: statistics.median(c) for v, c in cpus.items()}
    base = medians.get("executemany")
    base_cpu = cpu_medians.get("executemany")
    lines = [
        f"{args.records:,} records of {args.size} B, median of {args.repeats}, variants alternated in fresh "
        f"processes, one run (load average up to {load:.1f} on {os.cpu_count()} cores):",
        "",
        "| variant | records/s | / executemany | µs CPU per record | executemany's CPU / this |",
        "|---|---|---|---|---|",
    ]
    for v in variants:
        ratio = f"{medians[v] / base:.2f}x" if base else "-"
        cpu_ratio = f"{base_cpu / cpu_medians[v]:.2f}x" if base_cpu else "-"
        lines.append(f"| {v} | {medians[v]:,.0f} | {ratio} | {cpu_medians[v] * 1e6:.2f} | {cpu_ratio} |")
    print("\n".join(lines))
    result: dict[str, Any] = {
        "bench": "embedded",
        "records": args.records,
        "size": args.size,
        "repeats": args.repeats,
        "runs": runs,
        "cpu_per_record": cpus,
        "medians": medians,
        "cpu_medians": cpu_medians,
        "load": load,
        "python": platform.python_version(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"embedded-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
