"""The engine: one workload and one seeded fault schedule on every system, and the check.

:func:`run_compare` runs every (system, fault, schedule) in turn. One run:

1. :class:`~idempotent.compare.systems.SystemRun` sets up the topic, proxies and broker
   server; the producing process (:mod:`idempotent.compare.worker`) starts and says ready;
2. a fault thread waits for each event's point in the schedule (records acknowledged) and
   injects it, recording the window from injection to recovery;
3. the producing process ends (every record answered), possibly after having been killed
   and restarted from its first unacknowledged record;
4. everything stored is read back and checked against the ledger (:mod:`~idempotent.compare.check`).

In the ctp workload the process is a copy job (:class:`~idempotent.compare.worker.CopyWorker`):
its first start fills the input topic, a restarted one resumes from its committed input
position, and the output is read back and checked, the records below the highest committed
position reported counting as lost when they are missing.
"""

from __future__ import annotations

import json
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import attrs

from ..errors import TransportError
from .catalogue import is_ours, unsupported
from .check import Ledger, check
from .config import CompareConfig, PlannedRun
from .report import write_report
from .results import Results
from .schedule import FaultEvent, schedule
from .systems import Environment, SystemRun
from .workload import copied_id, record_id

#: What makes one run fail without ending the comparison: a broker, server or producing process
#: that did not start, and a broker still unreachable after its fault (the project's transport
#: errors: a private Pulsar not back from a restart when the run reads its records back). The
#: run is reported with status ``error`` and carried out again on resume; anything else (a bug:
#: InternalError and every other exception) ends the comparison.
RUN_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, OSError, TimeoutError, TransportError)

READY_TIMEOUT = 120.0
RUN_TIMEOUT = 600.0
TIMELINE_BUCKETS = 60


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
            elif kind == "c":
                self.sink.committed = max(self.sink.committed, int(parts[1]))
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
    committed: int = 0


class _Run:
    def __init__(self, env: Environment, config: CompareConfig, system: str, fault: str, seed: int, kind: str) -> None:
        self.config = config
        self.kind = kind
        self.system = system
        self.fault = fault
        self.seed = seed
        self.run_id = f"{int(time.time() * 1000) % 10**10}-{system.replace('+', '-')}-{fault}-{seed}"
        self.sys = SystemRun(env, system, self.run_id)
        self.ledger = Ledger(config.records)
        self.windows: list[dict[str, Any]] = []
        self.pending = list(schedule(fault, seed, config.records))
        self._lock = threading.Lock()
        self._processes_lock = threading.Lock()
        self._processes: list[subprocess.Popen[bytes]] = []
        self._closing = False
        self._t0 = time.monotonic()
        self.sink = _Sink(env.log(self.run_id, "producer").open("ab"))
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
            "workload": self.config.workload,
            "fill": self.producing is None,
        }
        with self._processes_lock:
            if self._closing:
                raise RuntimeError(f"{self.system}: the run is ending")
            producing = _Producing(spec, self.ledger, self.sink)
            self._processes.append(producing.process)
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
            except RUN_ERRORS as exc:
                self.sink.notes.append(f"{event.fault}: {exc}")
                go = True
            if go and self.producing is not None:
                self.producing.command("go")
            self.windows.append(
                {"fault": event.fault, "at": event.at, "applied": True, "start_s": started, "end_s": self.now()}
            )

    def execute(self) -> dict[str, Any]:
        faults = threading.Thread(target=self._faults, name="compare-faults", daemon=True)
        try:
            self.target = self.sys.open()
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
            with self._processes_lock:  # interrupted: no producing process may outlive the run
                self._closing = True
                for process in self._processes:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
            self.sys.close()
            self.sink.stderr.close()
        identify = copied_id if self.config.workload == "ctp" else record_id
        stored = self.sink.stored if self.sys.worker_reads_back else self.sys.read_back(identify=identify)
        return self._result(stored, produce_seconds)

    def _injected(self) -> int:
        """Faults that demonstrably happened: link faults counted where they were injected
        (proxies, the in-process link, cuts), the others once per applied window."""
        if self.fault in ("lost-ack", "cut", "duplicate-request"):
            return self.sink.injected + self.sys.injected()
        return sum(1 for window in self.windows if window["applied"])

    def _result(self, stored: list[int | None], produce_seconds: float) -> dict[str, Any]:
        verdict = check(self.ledger.states(), stored, self.sink.committed)
        acks = sorted((at - self._t0, latency) for at, latency in self.ledger.acks)
        latencies = sorted(latency for _, latency in acks)
        last_ack = acks[-1][0] if acks else produce_seconds
        bucket = max(last_ack, produce_seconds, 0.001) / TIMELINE_BUCKETS
        timeline = [0] * TIMELINE_BUCKETS
        for at, _ in acks:
            timeline[min(TIMELINE_BUCKETS - 1, int(at / bucket))] += 1
        result = _head(self.kind, self.system, self.fault, self.seed, "ok", self.config.workload)
        result.update(attrs.asdict(verdict))
        result.update(
            {
                "records": self.config.records,
                "rate": self.config.rate,
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


def _head(kind: str, system: str, fault: str, seed: int, status: str, workload: str) -> dict[str, Any]:
    return {
        "kind": kind, "workload": workload, "system": system, "fault": fault, "seed": seed, "status": status,
        "ours": is_ours(system),
    }  # fmt: skip


def not_applicable(
    system: str, fault: str, seed: int, reason: str, kind: str = "fault", workload: str = "produce"
) -> dict[str, Any]:
    """The report entry of a (system, fault) pair that cannot happen in ``workload``."""
    return {**_head(kind, system, fault, seed, "n/a", workload), "notes": [reason]}


def error_entry(
    system: str, fault: str, seed: int, exc: BaseException, kind: str = "fault", workload: str = "produce"
) -> dict[str, Any]:
    """The report entry of a run that could not be carried out (retried when resumed)."""
    notes = [f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", ())]
    return {**_head(kind, system, fault, seed, "error", workload), "notes": notes}


def _logs_note(paths: list[pathlib.Path]) -> str:
    return "logs: " + ", ".join(str(path) for path in paths) if paths else "no logs"


def run_one(
    env: Environment, config: CompareConfig, system: str, fault: str, seed: int, kind: str = "fault"
) -> dict[str, Any]:
    """Run one (system, fault, seed) and return its report entry.

    ``kind="capacity"`` runs ``config.capacity_records`` records without a rate limit
    (``fault`` should then be ``none``). The run's files are removed afterwards; its logs
    are kept (see :meth:`Environment.discard`) when it failed or has notes, and a note (or
    the exception's note) says where.

    Raises:
        RuntimeError: a broker, broker server or producing process did not start.
        TransportError: a broker was unreachable when the run needed it (see RUN_ERRORS).
    """
    started = time.monotonic()
    reason = unsupported(system, fault, config.workload)
    if reason is not None:
        return not_applicable(system, fault, seed, reason, kind, config.workload)
    if kind == "capacity":
        config = attrs.evolve(config, records=config.capacity_records, rate=0.0)
    run = _Run(env, config, system, fault, seed, kind)
    try:
        result = run.execute()
    except RUN_ERRORS as exc:
        exc.add_note(_logs_note(env.discard(run.run_id, keep_logs=True)))
        raise
    except BaseException:  # interrupted: the next invocation carries the run out again
        env.discard(run.run_id, keep_logs=False)
        raise
    kept = env.discard(run.run_id, keep_logs=bool(result["notes"]))
    if kept:
        result["notes"].append(_logs_note(kept))
    result["wall_s"] = round(time.monotonic() - started, 2)
    return result


#: Seconds between two rewrites of the report while a comparison runs (and once at the end).
REPORT_EVERY = 30.0
#: In ``out`` while a comparison runs: where its private brokers and scratch files are, so
#: the next comparison there can stop and remove them if this one was killed (kill -9).
SCRATCH_MARKER = ".compare-scratch"


class _Clock:
    """Progress: runs done out of the plan, and the time left, estimated from the wall time
    of the runs of the same (kind, system, fault) so far (in this invocation or earlier)."""

    def __init__(self, plan: list[PlannedRun], done: list[dict[str, Any]], workload: str) -> None:
        self.plan = plan
        self.workload = workload
        self.started = time.monotonic()
        self.finished = {(e["kind"], e["system"], e["fault"], e["seed"]) for e in done if e["status"] != "error"}
        self._walls: dict[tuple[str, str, str], list[float]] = {}
        for entry in done:
            self._took(entry)

    def _took(self, entry: dict[str, Any]) -> None:
        if entry.get("wall_s") is not None:
            self._walls.setdefault((entry["kind"], entry["system"], entry["fault"]), []).append(entry["wall_s"])

    def add(self, entry: dict[str, Any]) -> None:
        self.finished.add((entry["kind"], entry["system"], entry["fault"], entry["seed"]))
        self._took(entry)

    def left(self) -> float | None:
        """Estimated seconds for the runs not finished yet (None before any run took time)."""
        every = [wall for walls in self._walls.values() for wall in walls]
        if not every:
            return None
        overall = sum(every) / len(every)
        total = 0.0
        for run in self.plan:
            if run.key in self.finished or unsupported(run.system, run.fault, self.workload) is not None:
                continue
            walls = self._walls.get((run.kind, run.system, run.fault))
            total += sum(walls) / len(walls) if walls else overall
        return total

    def line(self) -> str:
        done = sum(1 for run in self.plan if run.key in self.finished)
        left = self.left()
        eta = "" if left is None else f", about {_duration(left)} left"
        return f"[{done}/{len(self.plan)}] {_duration(time.monotonic() - self.started)} elapsed{eta}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{max(0, int(seconds))}s"
    minutes = int(seconds / 60 + 0.5)
    return f"{minutes}m" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def run_compare(
    config: CompareConfig,
    out: pathlib.Path,
    progress: Callable[[str], None] | None = None,
    env: Environment | None = None,
    resume: bool = False,
) -> list[dict[str, Any]]:
    """Carry out every run of ``config.plan()``; write the results file and the report into ``out``.

    Every finished run is appended to ``out/runs.jsonl`` at once (:class:`~.results.Results`);
    with ``resume`` the runs that file already holds are not carried out again, so an
    interrupted comparison continues where it stopped. The report (``report.json``,
    ``report.md``, ``report.html``) is rewritten every :data:`REPORT_EVERY` s and at the end,
    also when interrupted. A run that cannot start, or whose broker is unreachable after its
    fault (:data:`RUN_ERRORS`), is reported with status ``error`` (and carried out again on
    resume) and the comparison goes on. ``env`` reuses private brokers
    (tests); otherwise they are started in a scratch directory outside ``out``, stopped at
    the end and removed with it (also by the next comparison in ``out`` when this one is
    killed: see :data:`SCRATCH_MARKER`). Logs of failed runs are kept in ``out/logs/``.

    Returns:
        The report entries of the plan's runs (capacity runs included), in plan order.

    Raises:
        ValueError: another comparison is writing into ``out``; or ``resume`` and the
            results file was made with another workload, records, rate, value size or
            capacity records.
        KeyboardInterrupt: interrupted; the finished runs are in the results file and report.
    """
    say = progress or (lambda _line: None)
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out, config, resume)
    plan = config.plan()
    earlier = results.entries(plan)
    todo = [run for run in plan if results.done(run) is None]
    say(f"{len(plan)} runs planned, {len(plan) - len(todo)} already in {results.path}; {len(todo)} to go")
    clock = _Clock(plan, earlier, config.workload)
    marker = out / SCRATCH_MARKER
    scratch: pathlib.Path | None = None
    last_report = time.monotonic()
    try:
        if env is None:
            if marker.exists():  # an earlier comparison here was killed before it could clean up
                Environment.reap(pathlib.Path(marker.read_text().strip()))
            scratch = pathlib.Path(tempfile.mkdtemp(prefix="idempotent-compare-"))
            marker.write_text(f"{scratch}\n")
            env = Environment(scratch, kept_logs=out / "logs")
        for run in todo:
            try:
                result = run_one(env, config, run.system, run.fault, run.seed, run.kind)
            except RUN_ERRORS as exc:
                result = error_entry(run.system, run.fault, run.seed, exc, run.kind, config.workload)
            results.add(result)
            clock.add(result)
            say(f"{_line(result)}  {clock.line()}")
            if time.monotonic() - last_report > REPORT_EVERY:
                write_report(out, config, results.entries(plan), env.timings)
                last_report = time.monotonic()
    finally:
        if scratch is not None and env is not None:
            env.close()
            shutil.rmtree(scratch, ignore_errors=True)
            marker.unlink(missing_ok=True)
        entries = results.entries(plan)
        results.close()
        write_report(out, config, entries, env.timings if env is not None else ())
    return entries


def _line(result: dict[str, Any]) -> str:
    kind = " capacity" if result["kind"] == "capacity" else ""
    head = f"{result['system']:27} {result['fault']:18} seed {result['seed']:<4}{kind}"
    if result["status"] != "ok":
        return f"{head} {result['status']}: {'; '.join(result.get('notes', []))}"
    return (
        f"{head} acked {result['acknowledged']:>6} ambiguous {result['ambiguous']:>4} failed {result['failed']:>4} "
        f"dup {result['duplicates']:>4} lost {result['lost']:>4} reord {result['reordered']:>4} "
        f"{result['records_per_s']:>9} rec/s p99 {result['p99_ms']} ms"
    )


__all__ = ["REPORT_EVERY", "CompareConfig", "error_entry", "not_applicable", "run_compare", "run_one"]
