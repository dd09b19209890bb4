"""Takeover after kill -9 on real Kafka and Pulsar: how long until the next broker stores a batch.

A writer publishes continuously to one partition (records of ``--size`` bytes, the producer's
default batching) for ``--seconds``; then the process holding the partition is killed with
SIGKILL, and a new broker takes it over. Three ways of holding the partition:

* ``producer``: an in-process broker inside the writer (``Producer("kafka://...")``); the
  new broker is opened in this process;
* ``server``: a broker server (``idem://``) that the writer talks to; both are killed and a
  new server is started on the same backend (its start-up, Python imports included, is not
  counted: the clock starts when it listens);
* ``cluster``: two broker servers with ``--lease`` second leases; the writer uses the one that
  owns the partition, which is killed; the clock starts at the kill, and the other broker can
  claim the partition only once the lease has lapsed.

The time to the first accepted send is split into what the new broker does to recover the
partition, measured inside it: the **fencing** wait (opening the partition's exclusive writer:
Kafka ``init_transactions``, which aborts the dead writer's open transaction; Pulsar's
``ExclusiveWithFencing`` producer), the **snapshot** load, the **replay** of the log after the
snapshot, and the checker's **apply** of the replayed batches. ``lease wait`` is the time from
the kill until the surviving broker started to recover the partition (cluster only).
Medians over ``--kills`` kills per cell, default snapshot cadence.

    python bench/bench_recovery.py                        # both backends, every scenario
    python bench/bench_recovery.py --backends kafka --scenarios producer --kills 5

Brokers come from ``idempotent.testing.services`` (started unless running). Killing a client
or broker-server process never disturbs them. Results are printed as Markdown and saved as
JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import idempotent
from idempotent import Broker, BrokerConfig
from idempotent.broker.observer import BrokerObserver
from idempotent.testing import services

PHASES = ("lease_wait", "fencing", "snapshot", "replay", "apply")


# -- a backend that times what a recovery asks of it ---------------------------------------------


class TimedBackend:
    """Delegates to a Kafka or Pulsar backend and times the three steps of a recovery."""

    def __init__(self, inner: Any, report: Any) -> None:
        self._inner = inner
        self._report = report
        self._current: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def latest_snapshot(self, topic: str, partition: int) -> Any:
        started = time.time()
        self._inner._writer(topic, partition)  # what latest_snapshot does first: take ownership
        fenced = time.time()
        snapshot = self._inner.latest_snapshot(topic, partition)
        self._current = {"started": started, "fencing": fenced - started, "snapshot": time.time() - fenced}
        return snapshot

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[Any]:
        started = time.perf_counter()
        batches = list(self._inner.replay(topic, partition, from_offset))
        self._current["replay"] = time.perf_counter() - started
        self._current["records"] = float(sum(b.record_count for b in batches))
        return iter(batches)

    def recovered(self, seconds: float, replayed: int) -> None:
        phases = self._current
        phases["apply"] = max(0.0, seconds - phases["fencing"] - phases["snapshot"] - phases["replay"])
        phases["batches"] = float(replayed)
        self._report(phases)


class _Recovered(BrokerObserver):
    def __init__(self, backend: TimedBackend) -> None:
        self.backend = backend

    def partition_recovered(self, topic: str, partition: int, seconds: float, replayed_batches: int) -> None:
        self.backend.recovered(seconds, replayed_batches)


def timed_broker(url: str, report: Any, config: BrokerConfig | None = None) -> Broker:
    from idempotent.adapters import open_backend

    backend = TimedBackend(open_backend(url), report)
    broker = Broker(backend, config)
    broker.add_observer(_Recovered(backend))
    return broker


# -- child processes ---------------------------------------------------------------------------------


def child_writer(url: str, topic: str, name: str, size: int) -> None:
    """Publish to partition 0 until killed, printing the count now and then."""
    producer = idempotent.Producer(url, name, delivery_timeout_ms=600_000)
    payload = b"x" * size
    sent = 0
    while True:
        producer.send(topic, payload, partition=0)
        sent += 1
        if sent % 10_000 == 0:
            producer.flush()
            print(sent, flush=True)


def child_server(url: str, port: int, broker_id: str | None, lease: float) -> None:
    """A broker server whose recoveries are reported as JSON lines on stdout."""
    from idempotent.net.server import BrokerServer

    def report(phases: dict[str, float]) -> None:
        print(json.dumps(phases), flush=True)

    config = BrokerConfig(broker_id=broker_id, lease_duration=lease) if broker_id else None
    broker = timed_broker(url, report, config)
    server = BrokerServer(broker, "127.0.0.1", port)

    def ready(served: BrokerServer) -> None:
        if broker_id:
            broker.advertise(served.advertised_address)
        print("READY", flush=True)

    server.run(on_ready=ready)


_CHILDREN: list[subprocess.Popen[str]] = []


def _kill_children() -> None:
    for proc in _CHILDREN:
        if proc.poll() is None:
            proc.kill()


class Child:
    """A child process of this script; its stdout lines are collected. Killed at exit."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, stderr=subprocess.DEVNULL
        )
        _CHILDREN.append(self.proc)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.strip())
                self._cond.notify_all()

    def wait_for(self, predicate: Any, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if predicate(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(f"child {self.args} did not report in time: {self.lines[-3:]}")
                self._cond.wait(left)

    def kill9(self) -> float:
        self.proc.send_signal(signal.SIGKILL)
        killed = time.time()
        self.proc.wait()
        return killed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _recovery(child: Child, timeout: float = 60.0) -> dict[str, float]:
    return dict(json.loads(child.wait_for(lambda line: line.startswith("{"), timeout)))


# -- one kill --------------------------------------------------------------------------------------


def _write_then_kill(writer: Child, holder: Child | None, seconds: float) -> tuple[float, int]:
    writer.wait_for(lambda line: line.isdigit(), 120)
    time.sleep(seconds)
    written = int([line for line in writer.lines if line.isdigit()][-1])
    killed = (holder or writer).kill9()
    if holder is not None:
        writer.kill9()
    return killed, written


def _first_send(url: str, topic: str, name: str) -> float:
    started = time.perf_counter()
    with idempotent.Producer(url, name, delivery_timeout_ms=120_000) as producer:
        producer.send(topic, b"after the kill", partition=0).result(120)
    return time.perf_counter() - started


def run_producer(url: str, topic: str, name: str, size: int, seconds: float) -> dict[str, float]:
    _, written = _write_then_kill(Child("--writer", url, topic, name, str(size)), None, seconds)
    phases: dict[str, float] = {}
    started = time.perf_counter()
    broker = timed_broker(url, phases.update)
    try:
        with idempotent.Producer(broker, name) as producer:
            producer.send(topic, b"after the kill", partition=0).result(120)
        first = time.perf_counter() - started
    finally:
        broker.close()
    return {**phases, "lease_wait": 0.0, "first_send": first, "written": float(written)}


def run_server(url: str, topic: str, name: str, size: int, seconds: float) -> dict[str, float]:
    port = _free_port()
    old = Child("--server", url, str(port))
    new: Child | None = None
    try:
        old.wait_for(lambda line: line == "READY", 120)
        writer = Child("--writer", f"idem://127.0.0.1:{port}", topic, name, str(size))
        _, written = _write_then_kill(writer, old, seconds)
        port = _free_port()
        new = Child("--server", url, str(port))
        new.wait_for(lambda line: line == "READY", 120)
        first = _first_send(f"idem://127.0.0.1:{port}", topic, name)
        return {**_recovery(new), "lease_wait": 0.0, "first_send": first, "written": float(written)}
    finally:
        for child in (old, new):
            if child is not None and child.proc.poll() is None:
                child.kill9()


def run_cluster(url: str, topic: str, name: str, size: int, seconds: float, lease: float) -> dict[str, float]:
    ports = [_free_port(), _free_port()]
    tag = uuid.uuid4().hex[:6]
    nodes = [Child("--server", url, str(port), f"bench-{tag}-{i}", str(lease)) for i, port in enumerate(ports)]
    try:
        for node in nodes:
            node.wait_for(lambda line: line == "READY", 120)
        # the writer talks to the first broker only, so that one claims and holds the partition
        writer = Child("--writer", f"idem://127.0.0.1:{ports[0]}", topic, name, str(size))
        killed, written = _write_then_kill(writer, nodes[0], seconds)
        cluster = ",".join(f"127.0.0.1:{port}" for port in ports)
        _first_send(f"idem://{cluster}", topic, name)
        first = time.time() - killed
        phases = _recovery(nodes[1])
        return {**phases, "lease_wait": phases["started"] - killed, "first_send": first, "written": float(written)}
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.kill9()


# -- the driver ------------------------------------------------------------------------------------


def backend_url(info: services.ServiceInfo) -> str:
    return info.connect_url


def summarize(backend: str, scenario: str, runs: list[dict[str, float]]) -> dict[str, Any]:
    """Medians (and the worst case) over the kills of one cell."""
    for run in runs:  # what the new owner took once it could take over, and what is not split
        run["takeover"] = run["first_send"] - run["lease_wait"]
        run["other"] = run["takeover"] - sum(run.get(p, 0.0) for p in PHASES if p != "lease_wait")
    row: dict[str, Any] = {"backend": backend, "scenario": scenario, "kills": len(runs), "runs": runs}
    for key in (*PHASES, "other", "first_send", "takeover", "batches", "records", "written"):
        row[key] = statistics.median(run.get(key, 0.0) for run in runs)
    row["max_first_send"] = max(run["first_send"] for run in runs)
    row["max_takeover"] = max(run["takeover"] for run in runs)
    return row


def print_table(rows: list[dict[str, Any]], args: dict[str, Any]) -> None:
    print(f"\nmedians over {args['kills']} kills; {args['seconds']:.0f} s of {args['size']} B records before each kill")
    print(
        "| backend | previous writer | lease wait | fencing | snapshot load | replay (batches / records) | apply "
        "| other | takeover (median / max) | first accepted send after the kill (median / max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        who = {
            "producer": "in-process producer",
            "server": "`idem://` server",
            "cluster": f"cluster, {args['lease']:.0f} s lease",
        }[row["scenario"]]
        print(
            f"| {row['backend']} | {who} | {row['lease_wait']:.2f} s | {row['fencing']:.3f} s "
            f"| {row['snapshot']:.3f} s "
            f"| {row['replay']:.3f} s ({row['batches']:.0f} / {row['records']:.0f}) | {row['apply']:.3f} s "
            f"| {row['other']:.3f} s | **{row['takeover']:.2f} s** / {row['max_takeover']:.2f} s "
            f"| {row['first_send']:.2f} s / {row['max_first_send']:.2f} s |"
        )


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--writer"]:
        child_writer(args_list[1], args_list[2], args_list[3], int(args_list[4]))
        return 0
    if args_list[:1] == ["--server"]:
        rest = args_list[1:]
        child_server(rest[0], int(rest[1]), rest[2] if len(rest) > 2 else None, float(rest[3]) if len(rest) > 3 else 10)
        return 0
    atexit.register(_kill_children)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["kafka", "pulsar"], choices=["kafka", "pulsar"])
    parser.add_argument("--scenarios", nargs="+", default=["producer", "server", "cluster"])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="writing time before each kill")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--lease", type=float, default=3.0, help="cluster lease duration (s)")
    parser.add_argument("--table", metavar="JSON", help="print the table of a saved run and exit")
    args = parser.parse_args(args_list)
    if args.table:
        saved = json.loads(Path(args.table).read_text())
        print_table([summarize(r["backend"], r["scenario"], r["runs"]) for r in saved["rows"]], saved["args"])
        return 0
    rows: list[dict[str, Any]] = []
    for backend in args.backends:
        url = backend_url(services.up(backend))
        for scenario in args.scenarios:
            runs: list[dict[str, float]] = []
            for kill in range(args.kills):
                topic = f"bench-recovery-{uuid.uuid4().hex[:10]}"
                name = f"{topic}-writer"
                if scenario == "producer":
                    run = run_producer(url, topic, name, args.size, args.seconds)
                elif scenario == "server":
                    run = run_server(url, topic, name, args.size, args.seconds)
                else:
                    run = run_cluster(url, topic, name, args.size, args.seconds, args.lease)
                runs.append(run)
                print(
                    f"{backend} {scenario} kill {kill + 1}: first send {run['first_send']:.3f} s, "
                    + ", ".join(f"{p} {run.get(p, 0.0):.3f}" for p in PHASES)
                    + f", replayed {run.get('batches', 0):.0f} batches / {run.get('records', 0):.0f} records",
                    file=sys.stderr,
                    flush=True,
                )
            rows.append(summarize(backend, scenario, runs))
    print_table(rows, vars(args))
    out = Path(__file__).parent / "results" / f"recovery-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"args": vars(args), "python": platform.python_version(), "cpus": os.cpu_count(), "rows": rows}, indent=2
        )
    )
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
