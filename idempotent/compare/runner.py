"""The engine: one workload and one seeded fault schedule on every system, and the check.

:func:`run_compare` runs every (system, fault, schedule) in turn. One run:

1. :class:`~idempotent.compare.systems.SystemRun` sets up the topic, proxies and broker
   server; the producing process (:mod:`idempotent.compare.worker`) starts and says ready;
2. a fault thread waits for each event's point in the schedule (records acknowledged) and
   injects it, recording the window from injection to recovery;
3. the producing process ends (every record answered), possibly after having been killed
   and restarted from its first unacknowledged record;
4. everything stored is read back and checked against the ledger (:mod:`~idempotent.compare.check`).
"""

from __future__ import annotations

import json
import pathlib
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import attrs

from .check import Ledger, check
from .schedule import FAULTS, FaultEvent, schedule
from .systems import SYSTEMS, Environment, SystemRun, is_ours, unsupported

READY_TIMEOUT = 120.0
RUN_TIMEOUT = 600.0
TIMELINE_BUCKETS = 60


@attrs.frozen
class CompareConfig:
    """What ``idempotent compare`` was asked to run."""

    systems: tuple[str, ...]
    faults: tuple[str, ...]
    records: int = 2000
    rate: float = 0.0
    schedules: int = 1
    seed: int = 1
    value_bytes: int = 100

    def __attrs_post_init__(self) -> None:
        for system in self.systems:
            if system not in SYSTEMS:
                raise ValueError(f"unknown system {system!r}; expected some of {', '.join(SYSTEMS)}")
        for fault in self.faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; expected some of {', '.join(FAULTS)}")
        if self.records < 10 or self.schedules < 1 or self.rate < 0:
            raise ValueError("records must be at least 10, schedules at least 1, rate not negative")


class _Producing:
    """One producing process and the thread that reads its report lines."""

    def __init__(self, spec: dict[str, Any], ledger: Ledger, sink: _Sink) -> None:
        self.start = int(spec["start"])
        self.ledger = ledger
        self.sink = sink
        self.high = self.start - 1
        self.ready = threading.Event()
        self.started_at = 0.0
        self.done_at: float | None = None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "idempotent.compare.worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sink.stderr,
        )
        self._reader = threading.Thread(target=self._read, name="compare-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        ledger = self.ledger
        for raw in self.process.stdout:
            parts = raw.decode().split()
            if not parts:
                continue
            kind = parts[0]
            if kind == "a":
                ledger.acknowledged_at(int(parts[1]), float(parts[3]), int(parts[2]) / 1e6)
            elif kind == "s":
                high = int(parts[1])
                for record_id in range(self.high + 1, high + 1):
                    ledger.sent(record_id)
                self.high = max(self.high, high)
            elif kind == "f":
                ledger.failed(int(parts[1]), parts[2] == "p")
            elif kind == "r":
                self.sink.stored.append(None if parts[1] == "-1" else int(parts[1]))
            elif kind == "i":
                self.sink.carried_out.set()
            elif kind == "k":
                self.sink.injected += int(parts[1])
            elif kind == "e":
                self.sink.notes.append(" ".join(parts[1:]))
            elif kind == "p":
                self.sink.paused.put(int(parts[1]))
            elif kind == "ready":
                self.started_at = float(parts[1])
                self.ready.set()
            elif kind == "done":
                self.done_at = float(parts[1])

    def command(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
        except OSError:  # it has just exited
            pass

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._reader.join(10)
        self.ledger.in_flight_lost(self.start, self.high + 1)

    def wait(self, timeout: float) -> bool:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self._reader.join(10)
        return True


@attrs.define
class _Sink:
    stderr: IO[bytes]
    stored: list[int | None] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)
    carried_out: threading.Event = attrs.field(factory=threading.Event)
    paused: queue.Queue[int] = attrs.field(factory=queue.Queue)
    injected: int = 0


class _Run:
    def __init__(self, env: Environment, config: CompareConfig, system: str, fault: str, seed: int) -> None:
        self.config = config
        self.system = system
        self.fault = fault
        self.seed = seed
        self.run_id = f"{int(time.time() * 1000) % 10**10}-{system.replace('+', '-')}-{fault}-{seed}"
        self.sys = SystemRun(env, system, self.run_id)
        self.ledger = Ledger(config.records)
        self.windows: list[dict[str, Any]] = []
        self.pending = list(schedule(fault, seed, config.records))
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self.sink = _Sink((env.workdir / f"{self.run_id}-producer.log").open("ab"))
        self.producing: _Producing | None = None
        self.target: Any = None

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _spawn(self, start: int) -> _Producing:
        spec = {
            "target": attrs.asdict(self.target),
            "records": self.config.records,
            "value_bytes": self.config.value_bytes,
            "start": start,
            "rate": self.config.rate,
            "in_process": self.sys.in_process,
            "readback": self.sys.worker_reads_back,
            "pauses": [event.at for event in self.pending],
        }
        producing = _Producing(spec, self.ledger, self.sink)
        if not producing.ready.wait(READY_TIMEOUT):
            producing.kill9()
            raise RuntimeError(f"{self.system}: producer not ready within {READY_TIMEOUT:.0f} s")
        return producing

    def _restart_producer(self) -> None:
        with self._lock:
            assert self.producing is not None
            self.producing.kill9()
            self.producing = self._spawn(self.ledger.first_unacknowledged())

    def _in_worker(self, command: str) -> None:
        """Ask the producing process (paused at the fault point) to inject, let it go on, and
        wait until it says the fault happened."""
        producing = self.producing
        assert producing is not None
        self.sink.carried_out.clear()
        producing.command(command)
        producing.command("go")
        deadline = time.monotonic() + 60
        while not self.sink.carried_out.wait(0.05):
            if producing.process.poll() is not None or time.monotonic() > deadline:
                self.sink.notes.append(f"{command}: not confirmed by the producing process")
                return

    def _inject(self, event: FaultEvent) -> bool:
        """Inject one fault; True when the paused producing process still needs its ``go``."""
        fault = event.fault
        if fault in ("lost-ack", "cut", "duplicate-request"):
            before = self.sys.injected()
            command = self.sys.link_fault(fault)
            if command is not None:
                self._in_worker(command)
                return False
            assert self.producing is not None
            self.producing.command("go")  # the armed fault needs traffic to happen on
            if fault == "cut":
                self.sink.injected += 1
            deadline = time.monotonic() + 5
            while self.sys.injected() == before and fault != "cut" and time.monotonic() < deadline:
                time.sleep(0.005)
            return False
        if fault in ("broker-kill", "broker-restart"):
            command = self.sys.broker_fault(kill=fault == "broker-kill")
            if command == "producer-restart":
                self._restart_producer()
                return False
            if command is not None:
                self._in_worker(command)
                return False
            return True
        if fault == "producer-restart":
            if self.system == "memory":
                self._in_worker("restart-producer")
            else:
                self._restart_producer()
            return False
        self._in_worker("zombie")
        return False

    def _faults(self) -> None:
        """Inject each scheduled fault when the producing process pauses at its point."""
        while self.pending:
            event = self.pending[0]
            try:
                at = self.sink.paused.get(timeout=0.05)
            except queue.Empty:
                producing = self.producing
                if producing is not None and producing.process.poll() is not None:
                    with self._lock:
                        if producing is self.producing:  # it ended before reaching the point
                            self.windows += [{"fault": e.fault, "at": e.at, "applied": False} for e in self.pending]
                            return
                continue
            if at != event.at:
                continue
            self.pending.pop(0)
            started = self.now()
            go = False
            try:
                go = self._inject(event)
            except (RuntimeError, OSError, TimeoutError) as exc:
                self.sink.notes.append(f"{event.fault}: {exc}")
                go = True
            if go and self.producing is not None:
                self.producing.command("go")
            self.windows.append(
                {"fault": event.fault, "at": event.at, "applied": True, "start_s": started, "end_s": self.now()}
            )

    def execute(self) -> dict[str, Any]:
        self.target = self.sys.open()
        faults = threading.Thread(target=self._faults, name="compare-faults", daemon=True)
        try:
            self._t0 = time.monotonic()
            self.producing = self._spawn(0)
            self._t0 = self.producing.started_at
            faults.start()
            deadline = time.monotonic() + RUN_TIMEOUT
            while True:
                producing = self.producing
                finished = producing.wait(1.0)
                with self._lock:
                    if finished and producing is self.producing:
                        break
                if time.monotonic() > deadline:
                    self.sink.notes.append(f"run stopped after {RUN_TIMEOUT:.0f} s")
                    producing.kill9()
                    break
            done_at = self.producing.done_at
            produce_seconds = (done_at - self._t0) if done_at is not None else self.now()
            faults.join(RUN_TIMEOUT)
        finally:
            self.sys.close()
            self.sink.stderr.close()
        stored = self.sink.stored if self.sys.worker_reads_back else self.sys.read_back()
        return self._result(stored, produce_seconds)

    def _injected(self) -> int:
        """Faults that demonstrably happened: link faults counted where they were injected
        (proxies, the in-process link, cuts), the others once per applied window."""
        if self.fault in ("lost-ack", "cut", "duplicate-request"):
            return self.sink.injected + self.sys.injected()
        return sum(1 for window in self.windows if window["applied"])

    def _result(self, stored: list[int | None], produce_seconds: float) -> dict[str, Any]:
        verdict = check(self.ledger.states(), stored)
        acks = sorted((at - self._t0, latency) for at, latency in self.ledger.acks)
        latencies = sorted(latency for _, latency in acks)
        last_ack = acks[-1][0] if acks else produce_seconds
        bucket = max(last_ack, produce_seconds, 0.001) / TIMELINE_BUCKETS
        timeline = [0] * TIMELINE_BUCKETS
        for at, _ in acks:
            timeline[min(TIMELINE_BUCKETS - 1, int(at / bucket))] += 1
        result: dict[str, Any] = {"system": self.system, "fault": self.fault, "seed": self.seed, "status": "ok"}
        result.update(attrs.asdict(verdict))
        result.update(
            {
                "ours": is_ours(self.system),
                "records": self.config.records,
                "records_per_s": round(verdict.acknowledged / last_ack, 1) if last_ack > 0 else 0.0,
                "p50_ms": _quantile(latencies, 0.5),
                "p99_ms": _quantile(latencies, 0.99),
                "p999_ms": _quantile(latencies, 0.999),
                "seconds": round(produce_seconds, 3),
                "faults": self.windows,
                "injected": self._injected(),
                "timeline": {"bucket_s": round(bucket, 4), "acks": timeline},
                "notes": self.sink.notes[:20],
            }
        )
        return result


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return round(sorted_values[index] * 1000, 3)


def not_applicable(system: str, fault: str, seed: int, reason: str) -> dict[str, Any]:
    """The report entry of a (system, fault) pair that cannot happen."""
    return {"system": system, "fault": fault, "seed": seed, "status": "n/a", "ours": is_ours(system), "notes": [reason]}


def run_one(env: Environment, config: CompareConfig, system: str, fault: str, seed: int) -> dict[str, Any]:
    """Run one (system, fault, seed) and return its report entry.

    Raises:
        RuntimeError: a broker, broker server or producing process did not start.
    """
    reason = unsupported(system, fault)
    if reason is not None:
        return not_applicable(system, fault, seed, reason)
    return _Run(env, config, system, fault, seed).execute()


def run_compare(
    config: CompareConfig,
    out: pathlib.Path,
    progress: Callable[[str], None] | None = None,
    env: Environment | None = None,
) -> list[dict[str, Any]]:
    """Run every (system, fault, schedule) of ``config``; write the report into ``out``.

    The report (``report.json``, ``report.md``, ``report.html``) is rewritten after every
    run, so a long comparison can be watched. A run that cannot start is reported with
    status ``error`` and the comparison goes on. ``env`` reuses private brokers (tests);
    otherwise they are started under ``out`` and stopped at the end.

    Returns:
        The runs' report entries.
    """
    from .report import write_report

    out.mkdir(parents=True, exist_ok=True)
    own_env = env is None
    if env is None:
        env = Environment(pathlib.Path(tempfile.mkdtemp(prefix="compare-", dir=out)))
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        for index in range(config.schedules):
            seed = config.seed + index
            for fault in config.faults:
                for system in config.systems:
                    try:
                        result = run_one(env, config, system, fault, seed)
                    except (RuntimeError, OSError, TimeoutError) as exc:
                        result = {"system": system, "fault": fault, "seed": seed, "status": "error",
                                  "ours": is_ours(system), "notes": [f"{type(exc).__name__}: {exc}"]}  # fmt: skip
                    runs.append(result)
                    if progress is not None:
                        progress(_line(result))
                    write_report(out, config, runs, env.timings, time.monotonic() - started)
    finally:
        if own_env:
            env.close()
    return runs


def _line(result: dict[str, Any]) -> str:
    head = f"{result['system']:27} {result['fault']:18} seed {result['seed']:<4}"
    if result["status"] != "ok":
        return f"{head} {result['status']}: {'; '.join(result.get('notes', []))}"
    return (
        f"{head} acked {result['acknowledged']:>6} ambiguous {result['ambiguous']:>4} failed {result['failed']:>4} "
        f"dup {result['duplicates']:>4} lost {result['lost']:>4} reord {result['reordered']:>4} "
        f"{result['records_per_s']:>9} rec/s p99 {result['p99_ms']} ms"
    )


__all__ = ["CompareConfig", "not_applicable", "run_compare", "run_one"]
