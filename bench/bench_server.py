"""Throughput and latency through the broker server, next to the in-process broker, in one run.

For each backend (``sqlite://``, Kafka, Pulsar) and record size, this project's producer
publishes ``--records`` records to a fresh topic two ways:

* ``in-process``: ``Producer("sqlite:///...")`` etc., the checker running in the producer's
  process (the numbers of ``bench_backends.py``);
* ``server``: ``Producer("idem://127.0.0.1:PORT")`` through an ``idempotent broker`` process
  (started here with ``--backend`` the same URL), over TCP on the loopback interface.

Each variant runs ``--repeats`` times in rotating order; the table shows medians of records/s
and of the p50/p99 send-to-acknowledgement latency (sampled on one message in 16), and the
ratio of server to in-process throughput.

    python bench/bench_server.py                          # sqlite, kafka, pulsar; 100 B and 1 KB
    python bench/bench_server.py --backends sqlite --records 20000

For many small producers on one server (400 producers, a record each every 100 ms) and the
server's CPU per batch and memory over time, see ``bench_server_load.py``.

Kafka and Pulsar are started with ``idempotent.testing.services`` unless already running.
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
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_backends import measure
from tqdm import tqdm

from idempotent.compare.baselines import IdempotentBaseline
from idempotent.testing import services

VARIANTS = ("in-process", "server")


class BrokerProcess:
    """An ``idempotent broker`` child process serving ``backend`` on a free local port."""

    def __init__(self, backend: str, workdir: str) -> None:
        ready = Path(workdir) / f"ready-{uuid.uuid4().hex[:6]}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "idempotent", "broker", "--backend", backend, "--listen", "127.0.0.1:0",
             "--ready-file", str(ready)],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not (ready.exists() and ready.read_text().endswith("\n")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker server for {backend} did not start")
            time.sleep(0.05)
        self.url = f"idem://{ready.read_text().strip()}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_once(url: str, size: int, records: int, options: dict[str, Any]) -> dict[str, float]:
    return measure(IdempotentBaseline(url, f"bench-{uuid.uuid4().hex[:8]}", **options), size, records)


def backend_url(backend: str, workdir: str, variant: str) -> str:
    if backend == "sqlite":  # one writer per database file: one file each
        return f"sqlite:///{workdir}/{variant}.db"
    info = services.up(backend)
    if backend == "pulsar":
        return f"{info.url}?admin_url={info.admin_url}"
    return info.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,kafka,pulsar")
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results: list[dict[str, Any]] = []
    started_here = []
    workdir = tempfile.mkdtemp(prefix="bench-server-")
    try:
        for backend in backends:
            if backend != "sqlite" and services.status(backend) is None:
                started_here.append(backend)
            url = backend_url(backend, workdir, "in-process")
            server = BrokerProcess(backend_url(backend, workdir, "server"), workdir)
            try:
                rounds = [(size, repeat) for size in sizes for repeat in range(args.repeats)]
                for size, repeat in tqdm(rounds, desc=backend, unit="round", file=sys.stderr):
                    order = list(VARIANTS) if repeat % 2 == 0 else list(reversed(VARIANTS))
                    for variant in order:
                        target = url if variant == "in-process" else server.url
                        result = run_once(target, size, args.records, {})
                        results.append(
                            {"backend": backend, "variant": variant, "size": size, "repeat": repeat, **result}
                        )
            finally:
                server.close()
    finally:
        for backend in started_here:
            services.down(backend)
    table = summarize(results, backends, sizes)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    meta = {
        "records": args.records,
        "repeats": args.repeats,
        "python": platform.python_version(),
        "host_cpus": os.cpu_count() or 0,
    }
    (out / f"server-{stamp}.json").write_text(json.dumps({"meta": meta, "runs": results, "table": table}, indent=1))
    return 0


def summarize(results: list[dict[str, Any]], backends: list[str], sizes: list[int]) -> str:
    lines = [
        "| backend | size | variant | records/s (median) | p50 ms | p99 ms | failed | server / in-process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend in backends:
        for size in sizes:
            medians: dict[str, dict[str, float]] = {}
            for variant in VARIANTS:
                runs = [r for r in results if r["backend"] == backend and r["size"] == size and r["variant"] == variant]
                if not runs:
                    continue
                medians[variant] = {
                    k: statistics.median(r[k] for r in runs) for k in ("records_per_s", "p50_ms", "p99_ms")
                }
                medians[variant]["failed"] = sum(r["failed"] for r in runs)
            base = medians.get("in-process", {}).get("records_per_s", 0.0)
            for variant, m in medians.items():
                ratio = m["records_per_s"] / base if base else float("nan")
                lines.append(
                    f"| {backend} | {size} B | {variant} | {m['records_per_s']:,.0f} | {m['p50_ms']:.1f} | "
                    f"{m['p99_ms']:.1f} | {m['failed']:.0f} | {ratio:.2f}x |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
