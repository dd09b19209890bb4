"""What SQLite's integrity check costs when a ``sqlite://`` backend is opened with it.

Opens one database file (``--file``; made with ``idempotent produce`` when missing, records
of ``--size`` bytes until it is about ``--gigabytes`` large) in a fresh process per run,
three ways: without a check (``check=off``, the default), with ``check=quick``
(``PRAGMA quick_check``) and with ``check=full`` (``PRAGMA integrity_check``); variants are
alternated, ``--repeats`` runs each, medians. Each run is timed twice: with the file's pages
dropped from the page cache first (``posix_fadvise(DONTNEED)``: *cold*, as after a reboot)
and right after it was read (*warm*). Wall time and the process's CPU time are reported.

    python bench/bench_sqlite_check.py --file /tmp/big.db --gigabytes 1 --repeats 3

Results are printed as Markdown and saved as JSON under ``bench/results/``.
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
from pathlib import Path

_RUN = """
import json, os, sys, time
from idempotent.adapters.sqlite.backend import SQLiteBackend

path, mode, cold = sys.argv[1], sys.argv[2], sys.argv[3] == "cold"
if cold:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
wall, cpu = time.monotonic(), time.process_time()
SQLiteBackend("sqlite:///" + os.path.abspath(path), check=mode).close()
print(json.dumps({"wall": time.monotonic() - wall, "cpu": time.process_time() - cpu}))
"""

MODES = ("off", "quick", "full")


def _make(path: Path, gigabytes: float, size: int) -> None:
    # about 125 B of file per 100 B record (the row and its share of the b-tree)
    records = int(gigabytes * 1e9 / (size * 1.25))
    print(f"writing {records:,} records of {size} B to {path} ...", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "idempotent", "produce", f"sqlite:///{path.resolve()}", "t",
         "--generate", str(records), "--size", str(size), "--partitions", "4", "--no-progress"],
        check=True,
    )  # fmt: skip


def _once(path: Path, mode: str, cache: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _RUN, str(path), mode, cache], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, required=True)
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not args.file.exists():
        _make(args.file, args.gigabytes, args.size)
    runs: dict[tuple[str, str], list[dict[str, float]]] = {(m, c): [] for m in MODES for c in ("cold", "warm")}
    load = [os.getloadavg()[0]]
    for _ in range(args.repeats):
        for mode in MODES:
            runs[(mode, "cold")].append(_once(args.file, mode, "cold"))
            runs[(mode, "warm")].append(_once(args.file, mode, "warm"))
            load.append(os.getloadavg()[0])
    size = args.file.stat().st_size
    print(f"\n{args.file}: {size / 1e6:,.0f} MB; load average {min(load):.1f} to {max(load):.1f}; "
          f"medians of {args.repeats}\n")  # fmt: skip
    print("| check | page cache | open, wall | open, CPU |")
    print("|---|---|---|---|")
    table = []
    for (mode, cache), results in runs.items():
        wall = statistics.median(r["wall"] for r in results)
        cpu = statistics.median(r["cpu"] for r in results)
        table.append({"check": mode, "cache": cache, "wall": wall, "cpu": cpu, "runs": results})
        print(f"| {mode} | {cache} | {wall:.2f} s | {cpu:.2f} s |")
    out = Path(__file__).parent / "results" / f"sqlite-check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"file_bytes": size, "load": load, "machine": platform.platform(), "cpus": os.cpu_count(), "rows": table},
            indent=2,
        )
    )
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
