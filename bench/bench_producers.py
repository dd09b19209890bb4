"""New producers per second on one partition, below ``max_producers`` and at it.

A new producer is one ``init_producer()`` (an anonymous producer: a fresh id, its record
stored) and its first batch (one record of ``--size`` bytes) on partition 0 of one topic, the
path every short-lived producer, anonymous client and Spark task takes. Below capacity the
partition tracks ``max_producers / 2`` producers, so none is evicted; at capacity it tracks
``max_producers`` (10,000 by default), so every new producer first needs room: least recently
active producers are evicted and a snapshot of the partition makes that durable before the
batch is accepted (docs/semantics.md, section 2.5).

Two ways, on ``sqlite://``:

* ``in-process``: ``idempotent.connect("sqlite:///...")``, the broker in the measuring process;
* ``server``: ``idempotent.connect("idem://...")`` to an ``idempotent broker`` process on the
  same file, over TCP on the loopback interface.

Each (way, state) runs in a fresh process: the partition is filled in-process (not timed),
then ``--new`` new producers are timed one after the other. The table also shows the broker's
CPU time per new producer (the measuring process for ``in-process``, the broker server's
process for ``server``), which a busy machine disturbs less than the rate. Variants are
alternated, ``--repeats`` times; the table shows medians and the ratio of the rate at
capacity to the rate below it (target: at least a third, issue "a partition full of
producers slows down 10 to 30 times").

    python bench/bench_producers.py
    python bench/bench_producers.py --new 500 --repeats 5

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

import idempotent
from idempotent import BrokerConfig, CheckerConfig

WAYS = ("in-process", "server")
STATES = ("below", "at")
TOPIC = "new-producers"


def _load() -> str:
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def add_producers(broker: Any, count: int, value: bytes) -> None:
    """``count`` new producers, each with one batch of one record on partition 0."""
    for _ in range(count):
        session = broker.init_producer()
        broker.produce(TOPIC, 0, session.producer_id, session.producer_epoch, 0, [value])


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


def run_one(way: str, state: str, new: int, size: int) -> dict[str, Any]:
    """Fill a fresh partition, then time ``new`` new producers (in this process)."""
    max_producers = CheckerConfig().max_producers  # the broker server runs with the default
    value = b"x" * size
    with tempfile.TemporaryDirectory(prefix="bench-producers-") as workdir:
        url = f"sqlite:///{workdir}/producers.db"
        broker = idempotent.connect(url, BrokerConfig(maintenance_interval=0))
        broker.create_topic(TOPIC, 1)
        add_producers(broker, max_producers if state == "at" else max_producers // 2, value)
        broker.close()
        server = BrokerProcess(url, workdir) if way == "server" else None
        target = url if server is None else server.url
        broker = idempotent.connect(target) if server is not None else idempotent.connect(url, BrokerConfig())
        try:
            add_producers(broker, 1, value)  # the partition is loaded (snapshot + replay) before timing
            served = process_cpu(server.proc.pid) if server is not None else 0.0
            wall, cpu = time.perf_counter(), time.process_time()
            add_producers(broker, new, value)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if server is not None:  # the broker's work is the server's CPU; the client's is its own
                served = process_cpu(server.proc.pid) - served
            tracked = broker.stats(TOPIC)[0] if server is None else None
        finally:
            broker.close()
            if server is not None:
                server.close()
    return {
        "way": way,
        "state": state,
        "new": new,
        "producers_per_s": new / wall,
        "cpu_ms_per_producer": 1000 * cpu / new,
        "server_cpu_ms_per_producer": 1000 * served / new if server is not None else None,
        "tracked_after": None if tracked is None else len(tracked.producers),
        "max_producers": max_producers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new", type=int, default=1000, help="new producers timed per run")
    parser.add_argument("--size", type=int, default=100, help="bytes of the one record each sends")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--child", nargs=2, metavar=("WAY", "STATE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.child[0], args.child[1], args.new, args.size)))
        return 0
    ways = [w for w in args.ways.split(",") if w]
    load_before = _load()
    runs: list[dict[str, Any]] = []
    cells = [(way, state) for way in ways for state in STATES]
    for repeat in range(args.repeats):
        for way, state in cells if repeat % 2 == 0 else list(reversed(cells)):
            out = subprocess.run(
                [sys.executable, __file__, "--child", way, state, "--new", str(args.new), "--size", str(args.size)],
                check=True,
                capture_output=True,
                text=True,
            )
            runs.append({"repeat": repeat, **json.loads(out.stdout)})
            print(f"{way:10} {state:5} {runs[-1]['producers_per_s']:8.0f} new producers/s", file=sys.stderr)
    load_after = _load()
    rows, medians = [], {}
    for way, state in cells:
        mine = [r for r in runs if (r["way"], r["state"]) == (way, state)]
        rate = statistics.median(r["producers_per_s"] for r in mine)
        broker_cpu = "server_cpu_ms_per_producer" if way == "server" else "cpu_ms_per_producer"
        cpu = [r[broker_cpu] for r in mine]
        medians[(way, state)] = rate
        ratio = f"{rate / medians[(way, 'below')]:.2f}x" if state == "at" else ""
        target = "at least 0.33x" if state == "at" else ""
        cpu_text = f"{statistics.median(cpu):.2f}" if cpu else ""
        rows.append(f"| {way} | {state} capacity | {rate:,.0f} | {cpu_text} | {ratio} | {target} |")
    table = "\n".join(
        [
            f"load average before {load_before}, after {load_after}; medians of {args.repeats} fresh processes each; "
            f"{args.new:,} new producers timed per run, max_producers={runs[0]['max_producers']:,}",
            "| way | partition | new producers/s | broker CPU ms per new producer | at / below | target |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "bench": "producers",
        "new": args.new,
        "size": args.size,
        "repeats": args.repeats,
        "load": [load_before, load_after],
        "python": platform.python_version(),
        "host_cpus": os.cpu_count() or 0,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    (out / f"producers-{stamp}.json").write_text(json.dumps({"meta": meta, "runs": runs, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
