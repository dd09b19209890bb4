"""Every hot-path target in one run: each benchmark in turn, then one table of ratio against target.

Runs, one after the other in child processes (so that one's memory and threads do not skew
the next), with their results written to one folder:

* ``bench_embedded.py``: ``idempotent produce sqlite://`` against plain ``executemany``;
* ``bench_backends.py``: throughput on Kafka and Pulsar against the native client with
  idempotence or dedup, at 100 B and 1 KB, and latency at a fixed offered rate (half of the
  native client's median throughput from the same run);
* ``bench_server.py``: ``idem://`` against the in-process broker, on SQLite, Kafka and Pulsar;
* ``bench_checker.py``: bytes per tracked (producer, partition) and snapshot times.

Then prints one Markdown table: each target, what this run measured, and whether it is met.
Each benchmark alternates its own variants and reports medians; see their docstrings.

    python bench/bench_targets.py                   # the defaults below, about 6-10 minutes
    python bench/bench_targets.py --quick           # smaller runs, for a smoke test

The table and every benchmark's JSON go to ``bench/results/targets-<time>/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: (name, script, arguments, quick arguments)
STEPS: list[tuple[str, str, list[str], list[str]]] = [
    (
        "embedded",
        "bench_embedded.py",
        ["--records", "300000", "--repeats", "3"],
        ["--records", "50000", "--repeats", "1"],
    ),
    (
        "backends",
        "bench_backends.py",
        ["--records", "50000", "--repeats", "3", "--latency-seconds", "3"],
        ["--records", "5000", "--repeats", "1", "--latency-seconds", "1"],
    ),
    (
        "server",
        "bench_server.py",
        ["--backends", "sqlite,kafka,pulsar", "--records", "50000", "--repeats", "3"],
        ["--backends", "sqlite", "--records", "5000", "--repeats", "1"],
    ),
    ("checker", "bench_checker.py", ["--repeats", "3"], ["--producers", "100000", "--repeats", "1"]),
]

NATIVE = {"kafka": "kafka-idempotent", "pulsar": "pulsar-dedup"}


def _newest(folder: Path, prefix: str) -> dict[str, Any]:
    found = sorted(folder.glob(f"{prefix}-*.json"))
    if not found:
        raise SystemExit(f"{prefix}: the benchmark wrote no {prefix}-*.json into {folder}")
    data: dict[str, Any] = json.loads(found[-1].read_text())
    return data


def _median(runs: list[dict[str, Any]], key: str, **where: object) -> float | None:
    values = [r[key] for r in runs if all(r.get(k) == v for k, v in where.items())]
    return statistics.median(values) if values else None


Row = tuple[str, str, str, bool | None]


def embedded_rows(data: dict[str, Any]) -> list[Row]:
    medians = data["medians"]
    cli, base = medians.get("cli"), medians.get("executemany")
    if cli is None or not base:
        return [("embedded: `idempotent produce sqlite://`", "not measured", "200k/s or 0.75x executemany", None)]
    ratio = cli / base
    return [
        (
            f"embedded: `idempotent produce sqlite://`, {data['size']} B",
            f"{cli:,.0f}/s = {ratio:.2f}x of executemany ({base:,.0f}/s)",
            "≥ 200,000/s or ≥ 0.75x",
            cli >= 200_000 or ratio >= 0.75,
        )
    ]


#: this project's per-record variants, each measured against the native client
OURS = {
    "kafka": ("idempotent", "idempotent-cb", "kafka-drop-in"),
    "pulsar": ("idempotent", "idempotent-cb", "pulsar-drop-in"),
}
#: how far over the native client's fixed-rate latency ours may be: (p50, p99) in ms
LATENCY_MARGIN = {"kafka": (5.0, 20.0), "pulsar": (None, 5.0)}


def backend_rows(data: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    runs, latency = data["runs"], data.get("latency_runs", [])
    for backend in ("kafka", "pulsar"):
        native = NATIVE[backend]
        for size in sorted({r["size"] for r in runs if r["backend"] == backend}):
            theirs = _median(runs, "records_per_s", backend=backend, size=size, variant=native)
            for variant in OURS[backend]:
                ours = _median(runs, "records_per_s", backend=backend, size=size, variant=variant)
                if ours is not None and theirs:
                    rows.append(
                        (
                            f"{backend}, {size} B: `{variant}` throughput",
                            f"{ours:,.0f}/s vs {theirs:,.0f}/s = {ours / theirs:.2f}x",
                            "≥ 0.9x",
                            ours / theirs >= 0.9,
                        )
                    )
            where = {"backend": backend, "size": size}
            offered = _median(latency, "offered_per_s", variant=native, **where)
            if offered is None:
                continue
            margin50, margin99 = LATENCY_MARGIN[backend]
            wanted = ", ".join(
                f"{name} ≤ +{margin:g} ms"
                for name, margin in (("p50", margin50), ("p99", margin99))
                if margin is not None
            )
            for variant in OURS[backend]:
                achieved = _median(latency, "achieved_per_s", variant=variant, **where)
                p50 = [_median(latency, "p50_ms", variant=v, **where) for v in (variant, native)]
                p99 = [_median(latency, "p99_ms", variant=v, **where) for v in (variant, native)]
                if achieved is None or None in p50 or None in p99:
                    continue
                d50, d99 = p50[0] - p50[1], p99[0] - p99[1]  # type: ignore[operator]
                sustained = achieved >= 0.95 * offered
                note = "" if sustained else f" (offered {offered:,.0f}/s, ours reached {achieved:,.0f}/s)"
                met = sustained and (margin50 is None or d50 <= margin50) and (margin99 is None or d99 <= margin99)
                rows.append(
                    (
                        f"{backend}, {size} B: `{variant}` latency at a fixed rate",
                        f"p50 {d50:+.1f} ms, p99 {d99:+.1f} ms over native{note}",
                        wanted,
                        met,
                    )
                )
    return rows


def server_rows(data: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    runs = data["runs"]
    for backend in sorted({r["backend"] for r in runs}):
        for size in sorted({r["size"] for r in runs if r["backend"] == backend}):
            server = _median(runs, "records_per_s", backend=backend, size=size, variant="server")
            local = _median(runs, "records_per_s", backend=backend, size=size, variant="in-process")
            if server is None or not local:
                continue
            rows.append(
                (
                    f"`idem://` over {backend}, {size} B",
                    f"{server:,.0f}/s vs {local:,.0f}/s in-process = {server / local:.2f}x",
                    "≥ 0.8x",
                    server / local >= 0.8,
                )
            )
    return rows


def checker_rows(data: dict[str, Any]) -> list[Row]:
    per = data["bytes_per_producer"]
    write, restore = data["snapshot_write_s"], data["snapshot_restore_s"]
    count = data["snapshot_producers"]
    return [
        (
            f"memory per tracked (producer, partition), {data['producers']:,} producers",
            f"{per:,.0f} B",
            "≤ 150 B",
            per <= 150,
        ),
        (f"snapshot write, {count:,} producers", f"{write:.2f} s", "< 0.5 s", write < 0.5),
        (f"snapshot restore, {count:,} producers", f"{restore:.2f} s", "< 0.5 s", restore < 0.5),
    ]


SUMMARIES: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "embedded": embedded_rows,
    "backends": backend_rows,
    "server": server_rows,
    "checker": checker_rows,
}


def _load() -> str:
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small runs: checks the plumbing, not the targets")
    parser.add_argument("--only", default=",".join(name for name, *_ in STEPS), help="comma-separated steps")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    wanted = [name for name in args.only.split(",") if name]
    unknown = set(wanted) - set(SUMMARIES)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {sorted(SUMMARIES)}")
    folder = Path(args.out) / f"targets-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    loads: list[str] = []
    for name, script, full, quick in STEPS:
        if name not in wanted:
            continue
        command = [sys.executable, str(HERE / script), *(quick if args.quick else full), "--out", str(folder)]
        print(f"== {name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        loads.append(f"{name} {_load()}")
        started = time.monotonic()
        subprocess.run(command, check=True)
        print(f"== {name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        rows.extend(SUMMARIES[name](_newest(folder, name)))
    lines = [
        f"Targets, one run{' (--quick: not a measurement of the targets)' if args.quick else ''}; "
        f"load average (1, 5, 15 min) at each step's start: {'; '.join(loads)}",
        "",
        "| target | measured | wanted | met |",
        "|---|---|---|---|",
    ]
    for what, measured, wanted_value, met in rows:
        verdict = "-" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {what} | {measured} | {wanted_value} | {verdict} |")
    table = "\n".join(lines)
    print(table)
    (folder / "targets.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
