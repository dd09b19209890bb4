"""The broker server under many small producers: latency, CPU per batch and memory over time.

Two loads against one ``idempotent broker`` process (started here, over ``--backend``,
``sqlite://`` in a fresh temporary file by default), each from a few client processes so
that the clients are not the bottleneck; the server's and the clients' CPU are measured
apart (``/proc/PID/stat``), and the server's RSS and thread count are sampled every second.

``fleet``: ``--producers`` producers (400), spread over ``--clients`` processes (4), each a
:class:`idempotent.Producer` on ``idem://`` with its own connection, each sending one record
of ``--size`` bytes every ``--interval-ms`` (100 ms: 4,000 records/s in 1-record batches),
at evenly spread phases. Reported: the send-to-acknowledgement latency (p50/p99/max) of every
record sent in the measured window, the time to open a producer (``Producer(...)``: connect,
handshake, ``init_producer``; every producer at the start, and one probe producer per client
every second while the load runs), batches/s acknowledged, the server's CPU per batch, and
the clients' CPU. With ``--raw`` each producer is a raw protocol connection instead (one
single-record ``produce`` per interval, waiting for its answer; a few microseconds of client
CPU per batch), so that on a small machine the clients leave the CPU to the server and the
latency measured is the server's; without it, the clients are this project's producers.

``saturate``: ``--connections`` raw protocol clients (no :class:`Producer`; pre-encoded
frames, so a client costs a few microseconds per batch) over ``--clients`` processes, each
an anonymous producer on its own partition keeping ``--window`` single-record ``produce``
requests in flight. Reported: batches/s the server acknowledged and its CPU per batch.
On a machine shared with other work, batches/s is what the server got; CPU per batch is what
carries over: a quiet machine gives the server ``1 / (CPU per batch)`` batches/s per core it
can use.

    python bench/bench_server_load.py fleet                      # 400 producers, 60 s
    python bench/bench_server_load.py fleet --seconds 200         # RSS over a long run
    python bench/bench_server_load.py saturate --seconds 20
    python bench/bench_server_load.py both --repeats 3            # alternated, medians

``--env NAME=VALUE`` (repeatable) sets variables of the server process only (for example
``MALLOC_ARENA_MAX=...`` to compare allocators); ``--server-cmd`` runs another server
command (``{backend}`` and ``{ready}`` are filled in), to measure an older version side by
side. Results are printed as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- process measurements ----------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def memory_and_threads(pid: int) -> tuple[float, float, int]:
    """Resident set size and its anonymous part (the heaps, not mapped files) in MB, and the
    number of threads of a process."""
    rss = anon = threads = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss / 1024, anon / 1024, threads


class ServerProcess:
    """An ``idempotent broker`` child process on a free local port, sampled every second."""

    def __init__(self, backend: str, workdir: str, env: dict[str, str], command: str | None) -> None:
        ready = Path(workdir) / f"ready-{uuid.uuid4().hex[:6]}"
        if command:
            argv = shlex.split(command.format(backend=backend, ready=ready))
        else:
            argv = [sys.executable, "-m", "idempotent", "broker", "--backend", backend, "--listen", "127.0.0.1:0",
                    "--ready-file", str(ready)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL, env={**os.environ, **env})
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().endswith("\n")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the broker server did not start")
            time.sleep(0.05)
        self.address = ready.read_text().strip()
        self.url = f"idem://{self.address}"
        self.samples: list[tuple[float, float, float, float, int]] = []  # (t, cpu, rss, anon MB, threads)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            try:
                rss, anon, threads = memory_and_threads(self.proc.pid)
                self.samples.append((time.monotonic(), cpu_seconds(self.proc.pid), rss, anon, threads))
            except (FileNotFoundError, ProcessLookupError):
                return

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def close(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- client processes --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fleet_client(spec: dict[str, Any]) -> dict[str, Any]:
    """One client process of ``fleet``: open its producers, send on schedule, report."""
    import idempotent

    url, topic, count = spec["url"], spec["topic"], spec["producers"]
    interval = spec["interval_ms"] / 1000
    payload = b"x" * spec["size"]
    start_at, measure_from, measure_to = spec["start_at"], spec["measure_from"], spec["measure_to"]
    opens: list[float] = []
    probe_opens: list[float] = []
    latencies: list[float] = []
    failed = [0]
    acked = [0]
    lock = threading.Lock()
    producers: list[idempotent.Producer | None] = [None] * count
    opened = threading.Event()

    def open_some(indexes: list[int]) -> None:
        for i in indexes:
            began = time.perf_counter()
            producers[i] = idempotent.Producer(url, linger_ms=spec["linger_ms"])
            with lock:
                opens.append(time.perf_counter() - began)

    openers = [
        threading.Thread(target=open_some, args=(list(range(k, count, spec["openers"])),), daemon=True)
        for k in range(spec["openers"])
    ]
    while time.time() < start_at:
        time.sleep(0.01)
    for thread in openers:
        thread.start()

    def wait_open() -> None:
        for thread in openers:
            thread.join()
        opened.set()

    threading.Thread(target=wait_open, daemon=True).start()

    def delivered(sent_at: float, measured: bool) -> Any:
        def callback(error: Any, metadata: Any) -> None:
            took = time.perf_counter() - sent_at
            with lock:
                if error is not None:
                    failed[0] += 1
                elif measured:
                    acked[0] += 1
                    latencies.append(took)

        return callback

    def probe() -> None:  # one producer opened (and used once) every second while the load runs
        while time.time() < measure_to:
            wake = time.time() + 1.0
            if time.time() >= measure_from:
                began = time.perf_counter()
                extra = idempotent.Producer(url, linger_ms=spec["linger_ms"])
                took = time.perf_counter() - began
                extra.send(topic, payload).result(30)
                extra.close()
                with lock:
                    probe_opens.append(took)
            time.sleep(max(0.0, wake - time.time()))

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    cpu_at_window = 0.0
    sent_in_window = 0
    base = time.perf_counter()
    phases = [interval * i / count for i in range(count)]
    ticks = [0] * count
    window_started = False
    while True:
        now_wall = time.time()
        if now_wall >= measure_to:
            break
        if not window_started and now_wall >= measure_from:
            window_started = True
            cpu_at_window = cpu_seconds(os.getpid())
        now = time.perf_counter() - base
        next_due = now + interval
        for i in range(count):
            producer = producers[i]
            if producer is None:
                continue
            due = phases[i] + ticks[i] * interval
            if due <= now:
                ticks[i] = int((now - phases[i]) / interval) + 1  # no catching up: a steady rate
                measured = window_started
                sent_in_window += measured
                producer.send(topic, payload, on_delivery=delivered(time.perf_counter(), measured))
                due = phases[i] + ticks[i] * interval
            next_due = min(next_due, due)
        time.sleep(max(0.0, min(0.05, next_due - (time.perf_counter() - base))))
    cpu_window = cpu_seconds(os.getpid()) - cpu_at_window
    prober.join(40)
    opened.wait(60)
    for producer in producers:
        if producer is not None:
            producer.flush(30)
    result = {
        "opens": opens,
        "probe_opens": probe_opens,
        "latencies": latencies,
        "sent": sent_in_window,
        "acked": acked[0],
        "failed": failed[0],
        "cpu": cpu_window,
    }
    for producer in producers:
        if producer is not None:
            producer.close(5)
    return result


def _raw_open(host: str, port: int) -> tuple[socket.socket, dict[str, Any]]:
    """Connect, ``hello`` and ``init_producer`` (anonymous), as a producer opens."""
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = _FrameReader()
    session: dict[str, Any] = {}
    for cid, op in ((1, "hello"), (2, "init_producer")):
        body = msgpack.packb([0, cid, op, {"version": 1} if op == "hello" else {}], use_bin_type=True)
        sock.sendall(len(body).to_bytes(4, "big") + body)
        frames: list[Any] = []
        while not frames:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("the server closed the connection")
            frames = reader.feed(data)
        if frames[0][0] != 1:
            raise RuntimeError(f"{op} refused: {frames[0]}")
        session = frames[0][2]
    return sock, session


def fleet_raw_client(spec: dict[str, Any]) -> dict[str, Any]:
    """One client process of ``fleet --raw``: each producer a raw connection that sends one
    single-record ``produce`` per interval and waits for its answer (a producer with
    ``max_in_flight`` 1 that never has two records at once), at a few microseconds of client
    CPU per batch, so that the latency measured is the server's."""
    host, port = spec["url"].split("://", 1)[1].rsplit(":", 1)
    count, interval, payload = spec["producers"], spec["interval_ms"] / 1000, b"x" * spec["size"]
    start_at, measure_from, measure_to = spec["start_at"], spec["measure_from"], spec["measure_to"]
    partitions = spec["partitions"]
    selector = selectors.DefaultSelector()
    opens: list[float] = []
    probe_opens: list[float] = []
    latencies: list[float] = []
    conns: list[dict[str, Any]] = []
    while time.time() < start_at:
        time.sleep(0.01)
    base = time.perf_counter()
    for i in range(count):
        began = time.perf_counter()
        sock, session = _raw_open(host, int(port))
        opens.append(time.perf_counter() - began)
        prefix = {"topic": spec["topic"], "partition": i % partitions, "producer_id": session["producer_id"],
                  "producer_epoch": session["producer_epoch"]}  # fmt: skip
        conn = {"sock": sock, "reader": _FrameReader(), "prefix": prefix, "next": 0, "sent_at": None,
                "due": base + interval * i / count, "cid": 3}  # fmt: skip
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, conn)
        conns.append(conn)
    acked = failed = 0
    next_probe = measure_from
    cpu_at = 0.0
    counting = False
    while True:
        now_wall = time.time()
        if now_wall >= measure_to:
            break
        if not counting and now_wall >= measure_from:
            counting, cpu_at = True, cpu_seconds(os.getpid())
        if counting and now_wall >= next_probe:  # a producer opened while the load runs
            next_probe += 1.0
            began = time.perf_counter()
            sock, _ = _raw_open(host, int(port))
            probe_opens.append(time.perf_counter() - began)
            sock.close()
        now = time.perf_counter()
        wait = 0.05
        for conn in conns:
            if conn["sent_at"] is None and conn["due"] <= now:
                args = dict(conn["prefix"], base_sequence=conn["next"], records=[payload])
                body = msgpack.packb([0, conn["cid"], "produce", args], use_bin_type=True)
                conn["sock"].sendall(len(body).to_bytes(4, "big") + body)
                conn["cid"] += 1
                conn["sent_at"] = now
                conn["due"] += interval * max(1, int((now - conn["due"]) / interval) + 1)  # no catching up
            if conn["sent_at"] is None:
                wait = min(wait, conn["due"] - now)
        for key, _ in selector.select(max(0.0, wait)):
            conn = key.data
            try:
                data = conn["sock"].recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("the server closed a connection")
            for frame in conn["reader"].feed(data):
                took = time.perf_counter() - conn["sent_at"]
                conn["sent_at"] = None
                if frame[0] == 1 and frame[2].get("outcome") == "accepted":
                    conn["next"] += 1
                    if counting:
                        acked += 1
                        latencies.append(took)
                else:
                    failed += 1
    cpu = cpu_seconds(os.getpid()) - cpu_at
    for conn in conns:
        conn["sock"].close()
    return {"opens": opens, "probe_opens": probe_opens, "latencies": latencies, "sent": acked, "acked": acked,
            "failed": failed, "cpu": cpu}  # fmt: skip


def saturate_client(spec: dict[str, Any]) -> dict[str, Any]:
    """One client process of ``saturate``: raw connections, pipelined 1-record batches."""
    host, port = spec["address"].rsplit(":", 1)
    window, partitions = spec["window"], spec["partitions"]
    payload = b"x" * spec["size"]
    selector = selectors.DefaultSelector()
    conns = []

    def call(sock: socket.socket, unpacker: _FrameReader, cid: int, op: str, args: dict[str, Any]) -> Any:
        body = msgpack.packb([0, cid, op, args], use_bin_type=True)
        sock.sendall(len(body).to_bytes(4, "big") + body)
        while True:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("the server closed the connection")
            for frame in unpacker.feed(data):
                if frame[0] != 1:
                    raise RuntimeError(f"{op} refused: {frame}")
                return frame[2]

    for index in spec["indexes"]:
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        unpacker = _FrameReader()
        call(sock, unpacker, 1, "hello", {"version": 1})
        session = call(sock, unpacker, 2, "init_producer", {})
        prefix = {
            "topic": spec["topic"],
            "partition": index % partitions,
            "producer_id": session["producer_id"],
            "producer_epoch": session["producer_epoch"],
        }
        conn = {"sock": sock, "reader": _FrameReader(), "prefix": prefix, "next": 0, "in_flight": 0, "cid": 3}
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, conn)
        conns.append(conn)
    start_at, measure_from, measure_to = spec["start_at"], spec["measure_from"], spec["measure_to"]
    while time.time() < start_at:
        time.sleep(0.01)

    def top_up(conn: dict[str, Any]) -> None:
        out = []
        while conn["in_flight"] < window:
            args = dict(conn["prefix"], base_sequence=conn["next"], records=[payload])
            body = msgpack.packb([0, conn["cid"], "produce", args], use_bin_type=True)
            out.append(len(body).to_bytes(4, "big") + body)
            conn["cid"] += 1
            conn["next"] += 1
            conn["in_flight"] += 1
        if out:
            conn["sock"].setblocking(True)
            conn["sock"].sendall(b"".join(out))
            conn["sock"].setblocking(False)

    for conn in conns:
        top_up(conn)
    acked = refused = 0
    counted = False
    cpu_at = 0.0
    while True:
        now = time.time()
        if now >= measure_to:
            break
        if not counted and now >= measure_from:
            counted, acked, refused = True, 0, 0
            cpu_at = cpu_seconds(os.getpid())
        for key, _ in selector.select(0.1):
            conn = key.data
            try:
                data = conn["sock"].recv(1 << 18)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("the server closed a connection")
            for frame in conn["reader"].feed(data):
                conn["in_flight"] -= 1
                if frame[0] == 1 and frame[2].get("outcome") == "accepted":
                    acked += 1
                else:
                    refused += 1
            top_up(conn)
    cpu = cpu_seconds(os.getpid()) - cpu_at
    for conn in conns:
        conn["sock"].close()
    return {"acked": acked, "refused": refused, "cpu": cpu}


class _FrameReader:
    """Length-prefixed MessagePack frames out of a byte stream."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self.buffer += data
        out = []
        while len(self.buffer) >= 4:
            length = int.from_bytes(self.buffer[:4], "big")
            if len(self.buffer) < 4 + length:
                break
            out.append(msgpack.unpackb(bytes(self.buffer[4 : 4 + length]), raw=False))
            del self.buffer[: 4 + length]
        return out


def _run_clients(kind: str, specs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[subprocess.Popen[bytes]]]:
    procs = []
    for spec in specs:
        proc = subprocess.Popen(
            [sys.executable, __file__, "_client", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        procs.append(proc)
    return [], procs


def _collect(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[dict[str, Any]]:
    out = []
    for proc in procs:
        assert proc.stdout is not None
        data = proc.stdout.read()
        proc.wait(timeout)
        if proc.returncode != 0 or not data:
            raise RuntimeError(f"a client process failed (exit {proc.returncode})")
        out.append(json.loads(data))
    return out


# -- the two loads -----------------------------------------------------------------------------


def run_fleet(args: argparse.Namespace, server: ServerProcess, topic: str) -> dict[str, Any]:
    per = [
        args.producers // args.clients + (1 if i < args.producers % args.clients else 0) for i in range(args.clients)
    ]
    start_at = time.time() + 1.0
    measure_from = start_at + args.warmup
    measure_to = measure_from + args.seconds
    specs = [
        {
            "url": server.url,
            "topic": topic,
            "producers": n,
            "interval_ms": args.interval_ms,
            "size": args.size,
            "linger_ms": args.linger_ms,
            "openers": args.openers,
            "partitions": args.partitions,
            "start_at": start_at,
            "measure_from": measure_from,
            "measure_to": measure_to,
        }
        for n in per
    ]
    _, procs = _run_clients("fleet-raw" if args.raw else "fleet", specs)
    while time.time() < measure_from:
        time.sleep(0.05)
    cpu0, t0 = server.cpu(), time.monotonic()
    while time.time() < measure_to:
        time.sleep(0.05)
    cpu1, t1 = server.cpu(), time.monotonic()
    results = _collect(procs, 120)
    latencies = [x for r in results for x in r["latencies"]]
    opens = [x for r in results for x in r["opens"]]
    probes = [x for r in results for x in r["probe_opens"]]
    acked = sum(r["acked"] for r in results)
    sent = sum(r["sent"] for r in results)
    elapsed = t1 - t0
    return {
        "load": "fleet",
        "clients_kind": "raw" if args.raw else "Producer",
        "producers": args.producers,
        "interval_ms": args.interval_ms,
        "clients": args.clients,
        "offered_per_s": sent / elapsed,
        "batches_per_s": acked / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies, default=float("nan")) * 1000,
        "open_p50_ms": percentile(opens, 0.50) * 1000,
        "open_p99_ms": percentile(opens, 0.99) * 1000,
        "probe_open_p50_ms": percentile(probes, 0.50) * 1000,
        "probe_open_max_ms": max(probes, default=float("nan")) * 1000,
        "failed": sum(r["failed"] for r in results),
        "server_cpu_per_batch_us": (cpu1 - cpu0) / max(acked, 1) * 1e6,
        "server_cpu_share": (cpu1 - cpu0) / elapsed,
        "clients_cpu_per_batch_us": sum(r["cpu"] for r in results) / max(acked, 1) * 1e6,
        "seconds": elapsed,
    }


def run_saturate(args: argparse.Namespace, server: ServerProcess, topic: str) -> dict[str, Any]:
    start_at = time.time() + 1.0 + args.connections * 0.01
    measure_from = start_at + args.warmup
    measure_to = measure_from + args.seconds
    specs = [
        {
            "address": server.address,
            "topic": topic,
            "indexes": list(range(k, args.connections, args.clients)),
            "partitions": args.partitions,
            "window": args.window,
            "size": args.size,
            "start_at": start_at,
            "measure_from": measure_from,
            "measure_to": measure_to,
        }
        for k in range(args.clients)
    ]
    _, procs = _run_clients("saturate", specs)
    while time.time() < measure_from:
        time.sleep(0.05)
    cpu0, t0 = server.cpu(), time.monotonic()
    while time.time() < measure_to:
        time.sleep(0.05)
    cpu1, t1 = server.cpu(), time.monotonic()
    results = _collect(procs, 120)
    acked = sum(r["acked"] for r in results)
    elapsed = t1 - t0
    return {
        "load": "saturate",
        "connections": args.connections,
        "clients": args.clients,
        "batches_per_s": acked / elapsed,
        "refused": sum(r["refused"] for r in results),
        "server_cpu_per_batch_us": (cpu1 - cpu0) / max(acked, 1) * 1e6,
        "server_cpu_share": (cpu1 - cpu0) / elapsed,
        "clients_cpu_per_batch_us": sum(r["cpu"] for r in results) / max(acked, 1) * 1e6,
        "seconds": elapsed,
    }


def one_run(args: argparse.Namespace, load: str, env: dict[str, str], workdir: str) -> dict[str, Any]:
    backend = args.backend or f"sqlite:///{workdir}/{uuid.uuid4().hex[:8]}.db"
    server = ServerProcess(backend, workdir, env, args.server_cmd)
    try:
        topic = f"load-{uuid.uuid4().hex[:8]}"
        _create_topic(server.address, topic, args.partitions)
        result = run_fleet(args, server, topic) if load == "fleet" else run_saturate(args, server, topic)
        time.sleep(1.1)
        result["rss_mb"] = [round(s[2], 1) for s in server.samples]
        result["anon_mb"] = [round(s[3], 1) for s in server.samples]
        result["threads"] = max((s[4] for s in server.samples), default=0)
        result["load_average"] = os.getloadavg()[0]
        return result
    finally:
        server.close()


def _create_topic(address: str, topic: str, partitions: int) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        reader = _FrameReader()
        for cid, op, op_args in (
            (1, "hello", {"version": 1}),
            (2, "create_topic", {"name": topic, "partitions": partitions}),
        ):
            body = msgpack.packb([0, cid, op, op_args], use_bin_type=True)
            sock.sendall(len(body).to_bytes(4, "big") + body)
            frames: list[Any] = []
            while not frames:
                frames = reader.feed(sock.recv(65536))
            if frames[0][0] != 1:
                raise RuntimeError(f"{op} refused: {frames[0]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_client"]:
        spec = json.loads(sys.stdin.read())
        client = {"fleet": fleet_client, "fleet-raw": fleet_raw_client, "saturate": saturate_client}[argv[1]]
        result = client(spec)
        sys.stdout.write(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("load", choices=("fleet", "saturate", "both"))
    parser.add_argument("--backend", help="the server's backend URL (default: a fresh sqlite file per run)")
    parser.add_argument("--producers", type=int, default=400)
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--openers", type=int, default=4, help="threads per client opening its producers")
    parser.add_argument(
        "--raw", action="store_true", help="fleet: raw protocol clients instead of Producers (the server's latency)"
    )
    parser.add_argument("--connections", type=int, default=32, help="saturate: raw connections")
    parser.add_argument("--window", type=int, default=32, help="saturate: requests in flight per connection")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the measured window")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server process")
    parser.add_argument("--server-cmd", help="another server command line ({backend}, {ready} filled in)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    loads = ["fleet", "saturate"] if args.load == "both" else [args.load]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-server-load-") as workdir:
        for repeat in range(args.repeats):
            for load in loads if repeat % 2 == 0 else list(reversed(loads)):
                result = one_run(args, load, env, workdir)
                result["repeat"] = repeat
                runs.append(result)
                print(_line(result), file=sys.stderr, flush=True)
    table = summarize(runs)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"argv": argv, "env": env, "python": platform.python_version(), "host_cpus": os.cpu_count() or 0}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"server-load-{stamp}.json").write_text(json.dumps({"meta": meta, "runs": runs, "table": table}, indent=1))
    return 0


def _line(result: dict[str, Any]) -> str:
    shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in result.items() if not k.endswith("_mb")}
    rss, anon = result["rss_mb"], result["anon_mb"]
    return f"{shown} rss {rss[:1]}..{rss[-1:]} MB (max {max(rss, default=0)}), anonymous {anon[:1]}..{anon[-1:]} MB"


def summarize(runs: list[dict[str, Any]]) -> str:
    lines = []
    fleet = [r for r in runs if r["load"] == "fleet"]
    if fleet:
        keys = ("batches_per_s", "p50_ms", "p99_ms", "max_ms", "open_p99_ms", "probe_open_max_ms",
                "server_cpu_per_batch_us", "server_cpu_share", "clients_cpu_per_batch_us")  # fmt: skip
        lines += [
            "| fleet (medians) | " + " | ".join(keys) + " | server RSS MB first..last (max) | load avg |",
            "|---" * (len(keys) + 3) + "|",
        ]
        med = {k: statistics.median(r[k] for r in fleet) for k in keys}
        rss = fleet[-1]["rss_mb"]
        lines.append(
            f"| {fleet[0]['producers']} producers x 1 per {fleet[0]['interval_ms']:g} ms | "
            + " | ".join(f"{med[k]:,.2f}" for k in keys)
            + f" | {rss[:1]}..{rss[-1:]} ({max(rss, default=0)})"
            + f" | {statistics.median(r['load_average'] for r in fleet):.1f} |"
        )
    sat = [r for r in runs if r["load"] == "saturate"]
    if sat:
        keys = ("batches_per_s", "server_cpu_per_batch_us", "server_cpu_share", "clients_cpu_per_batch_us")
        lines += ["", "| saturate (medians) | " + " | ".join(keys) + " | load avg |", "|---" * (len(keys) + 2) + "|"]
        med = {k: statistics.median(r[k] for r in sat) for k in keys}
        lines.append(
            f"| {sat[0]['connections']} connections | "
            + " | ".join(f"{med[k]:,.2f}" for k in keys)
            + f" | {statistics.median(r['load_average'] for r in sat):.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
