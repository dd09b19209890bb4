"""The producing process: ``python -m idempotent.compare.worker SPEC_JSON``.

It replays the workload from ``start`` through one producer instance of one system, as fast
as allowed by ``rate`` (records/s, 0 = unlimited); in the ctp workload (:class:`CopyWorker`)
it is a copy job instead, which copies the input topic from its last committed position in
transactions (:mod:`~idempotent.compare.copying`). It reports on stdout, one line each::

    ready T                     the instance is initialised, at monotonic time T
    p ID                        paused before record ID, a fault point: waits for ``go``
    s HIGH                      records up to HIGH have been handed to a producer
    a ID LATENCY_US T           record ID acknowledged at monotonic time T
    f ID n|p                    record ID failed: not persisted / possibly persisted
    i FAULT                     a fault asked for on stdin has been carried out
    e MESSAGE                   something went wrong that the report should show
    k COUNT                     link faults that happened in this process (at the end)
    r ID                        (read-back) a stored record, in log order
    c POSITION                  (ctp) the records below POSITION are committed in the output
    done T                      every record has ended (or the flush timed out), at time T

Commands on stdin, one per line: ``go`` ends a pause (the parent has injected the fault
scheduled there); and for faults that happen inside this process:
``lost-ack`` and ``duplicate-request`` (between our producer and an in-process broker),
``restart-producer`` and ``crash-broker`` (in process, for ``memory``, whose store dies with
the process), and ``zombie`` (a second instance starts from the first unacknowledged record
while the first one keeps sending). When stdin ends, the comparison that started the process
has died (kill -9): it exits at once instead of sending on for nobody.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from typing import Any

import attrs

from ..api import BrokerAPI
from .copying import COPY_TXN_RECORDS, CopyJob, fill_input, input_ids, open_copy_job
from .faults import LinkInjector
from .producers import Instance, OursInstance, Target, client_errors, open_instance
from .workload import Workload, copied_id, transform
from .workload import record_id as produced_id

FLUSH_TIMEOUT = 180.0
PAUSE_TIMEOUT = 300.0
#: Exit code when stdin ends before the run does: the comparison that started it is gone.
PARENT_GONE = 3


@attrs.define(eq=False)
class _Driver:
    instance: Instance
    link: LinkInjector | None
    alive: bool = True
    outstanding: dict[int, float] = attrs.field(factory=dict)


class Worker:
    """One producing process (see the module docstring)."""

    #: Reads a record id from a value the process wrote (its read-back).
    identify = staticmethod(produced_id)

    def __init__(self, spec: dict[str, Any]) -> None:
        self.target = Target(**spec["target"])
        self.workload = Workload(int(spec["records"]), int(spec["value_bytes"]))
        self.start = int(spec["start"])
        self.rate = float(spec["rate"])
        self.in_process = bool(spec["in_process"])
        self.readback = bool(spec["readback"])
        self.broker: BrokerAPI | None = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._lines: list[str] = []
        self._high = -1
        self._reported_high = -1
        self._acked = bytearray(self.workload.records)
        self._requests: queue.Queue[str] = queue.Queue()
        self._zombie: threading.Thread | None = None
        self.driver: _Driver | None = None
        self._stop = threading.Event()
        self._pauses = sorted(int(p) for p in spec.get("pauses", ()))
        self._go = threading.Event()
        self._links: list[LinkInjector] = []

    # -- output ----------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def _flush_output(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
            if self._high > self._reported_high:
                lines.insert(0, f"s {self._high}")
                self._reported_high = self._high
        if lines:
            with self._write_lock:
                sys.stdout.write("\n".join(lines) + "\n")
                sys.stdout.flush()

    def _flusher(self) -> None:
        while not self._stop.wait(0.02):
            self._flush_output()

    # -- instances -------------------------------------------------------------------------

    def _open(self) -> _Driver:
        if not self.in_process:
            return _Driver(open_instance(self.target), None)
        if self.broker is None:
            from .. import connect

            self.broker = connect(self.target.url)
        link = LinkInjector(self.broker)
        self._links.append(link)
        return _Driver(OursInstance(self.target, link), link)

    def _kill(self, driver: _Driver) -> None:
        """The instance dies: its unanswered records are possibly persisted."""
        with self._lock:
            driver.alive = False
            pending = sorted(driver.outstanding)
            driver.outstanding.clear()
        if driver.link is not None:
            driver.link.sever()
        for record_id in pending:
            self.emit(f"f {record_id} p")

    def _resume_point(self) -> int:
        with self._lock:
            for record_id in range(self.workload.records):
                if not self._acked[record_id]:
                    return record_id
        return self.workload.records

    def _send(self, driver: _Driver, record_id: int, value: bytes) -> None:
        started = time.monotonic()
        with self._lock:
            driver.outstanding[record_id] = started
            self._high = max(self._high, record_id)

        def done(status: str) -> None:
            now = time.monotonic()
            with self._lock:
                if not driver.alive or driver.outstanding.pop(record_id, None) is None:
                    return
                if status == "a":
                    self._acked[record_id] = 1
                    self._lines.append(f"a {record_id} {int((now - started) * 1e6)} {now:.6f}")
                else:
                    self._lines.append(f"f {record_id} {status}")

        driver.instance.send(record_id, value, done)

    def _drive(self, driver: _Driver, position: int, main: bool) -> None:
        """Send from ``position`` to the end, then wait for every answer."""
        records = self.workload.records
        began = time.monotonic()
        count = 0
        deadline: float | None = None
        while True:
            if main and not self._requests.empty():
                driver, position = self._carry_out(driver, self._requests.get(), position)
            if not driver.alive:
                return
            if position < records:
                if main and self._pauses and position >= self._pauses[0]:
                    self._pause(self._pauses.pop(0))
                    continue
                if self.rate > 0:
                    ahead = began + count / self.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                self._send(driver, position, self.workload.value(position))
                position += 1
                count += 1
                continue
            if deadline is None:
                deadline = time.monotonic() + FLUSH_TIMEOUT
            driver.instance.flush(0.2)
            with self._lock:
                pending = len(driver.outstanding)
            if not pending and (not main or self._requests.empty()):
                return
            if time.monotonic() > deadline:
                self.emit(f"e {pending} records still unanswered after {FLUSH_TIMEOUT:.0f} s")
                return
            if pending:
                time.sleep(0.01)

    def _pause(self, at: int) -> None:
        self.emit(f"p {at}")
        self._flush_output()
        if not self._go.wait(PAUSE_TIMEOUT):
            self.emit(f"e no go after the pause at {at} within {PAUSE_TIMEOUT:.0f} s")
        self._go.clear()

    def _carry_out(self, driver: _Driver, command: str, position: int) -> tuple[_Driver, int]:
        """In-process restarts (the main sending loop runs them between two sends)."""
        self._kill(driver)
        driver.instance.close()
        if command == "crash-broker":
            self.broker = None  # abandoned without closing, as a crash would; reopened from the store
        fresh = self._open()
        self.driver = fresh
        self.emit(f"i {command}")
        return fresh, min(position, self._resume_point())

    def _start_zombie(self) -> None:
        """A new instance starts from the first unacknowledged record; the old one goes on."""
        try:
            driver = self._open()
        except client_errors() as exc:  # the client refused the second instance: a result to report
            self.emit(f"e zombie: new instance refused: {type(exc).__name__}: {exc}".replace("\n", " "))
            self.emit("i zombie")
            return
        self.emit("i zombie")
        self._drive(driver, self._resume_point(), main=False)

    def _commands(self) -> None:
        for raw in sys.stdin:
            command = raw.strip()
            driver = self.driver
            if command == "go":
                self._go.set()
            elif command in ("lost-ack", "duplicate-request"):
                if driver is None or driver.link is None:
                    self.emit(f"e {command}: no in-process link to inject on")
                    continue
                if command == "lost-ack":
                    driver.link.arm_lost_ack()
                else:
                    driver.link.arm_duplicate()
                self.emit(f"i {command}")
            elif command in ("restart-producer", "crash-broker"):
                self._requests.put(command)
            elif command == "zombie" and self._zombie is None:
                self._zombie = threading.Thread(target=self._start_zombie, name="zombie", daemon=True)
                self._zombie.start()
        os._exit(PARENT_GONE)  # stdin ended: the comparison died (kill -9); nobody reads this run

    def run(self) -> None:
        threading.Thread(target=self._flusher, name="emit", daemon=True).start()
        self.driver = self._open()
        self.emit(f"ready {time.monotonic():.6f}")
        threading.Thread(target=self._commands, name="commands", daemon=True).start()
        self._drive(self.driver, self.start, main=True)
        if self._zombie is not None:
            self._zombie.join(FLUSH_TIMEOUT + 60)
        self.emit(f"k {sum(sum(link.injected.values()) for link in self._links)}")
        self.emit(f"done {time.monotonic():.6f}")
        if self.readback and self.broker is not None:
            self._read_back(self.broker)
        self._stop.set()
        self._flush_output()

    def _read_back(self, broker: BrokerAPI) -> None:
        offset = 0
        identify = self.identify
        while True:
            stored = broker.read(self.target.topic, 0, offset, 1000)
            if not stored:
                return
            ids = (identify(r.value) for r in stored)
            self.emit("\n".join(f"r {-1 if i is None else i}" for i in ids))
            offset = stored[-1].offset + 1


class CopyWorker(Worker):
    """The ctp workload's copy job (see the module docstring): it fills the input first when
    the spec says ``fill``, then copies it, :data:`~.copying.COPY_TXN_RECORDS` records per transaction, pausing
    at the fault points (input record ids) inside the open transaction. A transaction whose
    commit fails is given up with its records possibly persisted, and a new instance of the
    job resumes from its committed position, as an application restarts its copy job."""

    identify = staticmethod(copied_id)

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.fill = bool(spec.get("fill"))
        self.job: CopyJob | None = None
        self._copied = 0  # records copied by this process (the rate limit counts them)
        self._began = 0.0

    def _instance(self) -> tuple[CopyJob, int]:
        """A new instance of the job (the previous one closed) and its committed input offset."""
        deadline = time.monotonic() + FLUSH_TIMEOUT
        while True:
            if self.job is not None:
                self.job.close()
                self.job = None
            try:
                self.job = open_copy_job(self.target)
                return self.job, self.job.resume()
            except client_errors() as exc:  # the broker is away (a fault): try again
                if time.monotonic() > deadline:
                    raise
                self.emit(f"e copy job not started: {type(exc).__name__}: {exc}".replace("\n", " "))
                time.sleep(0.5)

    def _throttle(self) -> None:
        if self.rate > 0:
            ahead = self._began + self._copied / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        self._copied += 1

    def _transaction(self, job: CopyJob, batch: list[tuple[int, bytes]]) -> bool:
        """Copy one batch in one transaction; False when the job must be replaced (a fault
        was carried out in the process, or the client failed: the records are then possibly
        persisted)."""
        ids = input_ids(batch)
        started: dict[int, float] = {}
        try:
            job.begin()
            for record_id, (_, value) in zip(ids, batch, strict=True):
                if self._pauses and record_id >= self._pauses[0]:
                    self._pause(self._pauses.pop(0))
                if not self._requests.empty():  # memory: the instance dies in the open transaction
                    self.emit(f"i {self._requests.get()}")
                    for done in started:
                        self.emit(f"f {done} p")
                    return False
                self._throttle()
                started[record_id] = time.monotonic()
                with self._lock:
                    self._high = max(self._high, record_id)
                job.send(record_id, transform(value))
            job.commit(batch[-1][0] + 1)
        except client_errors() as exc:
            self.emit(f"e transaction given up: {type(exc).__name__}: {exc}".replace("\n", " "))
            for record_id in started:
                self.emit(f"f {record_id} p")
            return False
        now = time.monotonic()
        for record_id, at in started.items():
            self.emit(f"a {record_id} {int((now - at) * 1e6)} {now:.6f}")
        self.emit(f"c {ids[-1] + 1}")
        return True

    def _copy(self) -> None:
        """Copy until the last input record is committed, or until no transaction has
        committed for :data:`FLUSH_TIMEOUT` s (a note says so)."""
        job, _ = self._instance()
        last = self.workload.records - 1
        deadline = time.monotonic() + FLUSH_TIMEOUT
        done = False
        while not done:
            if time.monotonic() > deadline:
                self.emit(f"e no transaction committed for {FLUSH_TIMEOUT:.0f} s: the copy job stops")
                return
            batch = job.read(COPY_TXN_RECORDS)
            if not batch:
                time.sleep(0.01)
            elif self._transaction(job, batch):
                deadline = time.monotonic() + FLUSH_TIMEOUT
                done = input_ids(batch)[-1] >= last
            else:
                job, _ = self._instance()

    def run(self) -> None:
        threading.Thread(target=self._flusher, name="emit", daemon=True).start()
        if self.fill:
            fill_input(self.target, self.workload)
        self.emit(f"ready {time.monotonic():.6f}")
        threading.Thread(target=self._commands, name="commands", daemon=True).start()
        self._began = time.monotonic()
        self._copy()
        if self.job is not None:
            self.job.close()
        self.emit("k 0")
        self.emit(f"done {time.monotonic():.6f}")
        if self.readback:
            from .. import connect

            self._read_back(connect(self.target.url))
        self._stop.set()
        self._flush_output()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(args[0])
    worker = CopyWorker(spec) if spec.get("workload") == "ctp" else Worker(spec)
    worker.run()
    sys.stdout.flush()
    os._exit(0)  # client threads (librdkafka, pulsar) must not hold the exit up


if __name__ == "__main__":
    sys.exit(main())
