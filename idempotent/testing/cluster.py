"""Several broker processes over one backend, driven from a test: real processes that can be
killed with SIGKILL, paused with SIGSTOP and restarted.

Each :class:`Node` is a child Python process running one :class:`~idempotent.broker.broker.Broker`
with a ``broker_id`` (``python -m idempotent.testing.cluster URL BROKER_ID LEASE``). It
answers one JSON request per line on stdin with one JSON answer per line on stdout, so the
test process plays the client: it routes each batch to the owner it believes in, follows
``NotOwnerError``, and resends a batch whose answer was lost to another broker.

:class:`Ledger` keeps what the client was told (acknowledged batches and their offsets) and
:func:`verify` checks the stored partitions against it: no record stored twice, every
acknowledged record present at its offset, each producer's sequences without holes.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["Dead", "Ledger", "Node", "main", "verify"]


class Dead(Exception):
    """The node did not answer: it died, or is paused, or the answer was lost."""


class Node:
    """One broker process. Not thread-safe: one request at a time."""

    def __init__(self, url: str, broker_id: str, lease: float, *, wait: bool = True) -> None:
        self.url = url
        self.broker_id = broker_id
        self.lease = lease
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._next = 0
        self.proc = self._spawn()
        if wait:
            self.ready()

    def _spawn(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "idempotent.testing.cluster", self.url, self.broker_id, str(self.lease)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(proc, self._lines), daemon=True).start()
        return proc

    def ready(self, timeout: float = 120.0) -> None:
        """Wait until the process has opened its broker.

        Raises:
            RuntimeError: it exited or did not get ready in time.
        """
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None or line.strip() != "READY":
            self.proc.kill()
            raise RuntimeError(f"broker {self.broker_id} did not start: {line!r}")

    @staticmethod
    def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, op: str, **args: Any) -> int:
        """Send a request without waiting for its answer; returns its id."""
        self._next += 1
        line = json.dumps({"id": self._next, "op": op, **args}) + "\n"
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise Dead(f"{self.broker_id}: {exc!r} (exit status {self.proc.poll()})") from None
        return self._next

    def answer(self, request_id: int, timeout: float) -> dict[str, Any]:
        """The answer to a request sent with :meth:`send` (answers of older requests are skipped).

        Raises:
            Dead: no answer within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise Dead(f"{self.broker_id}: no answer within {timeout} s") from None
            if line is None:
                self._lines.put(None)
                raise Dead(f"{self.broker_id}: exited with {self.proc.wait()}")
            message: dict[str, Any] = json.loads(line)
            if message.get("id") == request_id:
                return message

    def call(self, op: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
        return self.answer(self.send(op, **args), timeout)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start a new process with the same broker id (after a kill or close)."""
        if self.alive():
            self.kill9()
        self.proc = self._spawn()
        self.ready()

    def close(self) -> None:
        """A clean shutdown: the broker snapshots and releases its leases."""
        if self.alive():
            with contextlib.suppress(Dead):
                self.call("close", timeout=60)
            self.proc.wait(60)

    def stop(self) -> None:
        """End the process however it is (test teardown)."""
        if self.alive():
            self.resume()
            self.proc.kill()
            self.proc.wait()


@attrs.define
class Ledger:
    """What the client knows: per partition, the acknowledged batches (values, base offset)."""

    acked: dict[int, list[tuple[list[str], int | None]]] = attrs.field(factory=dict)
    duplicates: int = 0

    def ack(self, partition: int, values: list[str], answer: dict[str, Any]) -> None:
        """Note an acknowledged batch; its offset is None for a duplicate older than the
        checker's window (stored, at an offset the broker no longer knows)."""
        if answer["outcome"] == "DUPLICATE":
            self.duplicates += 1
        offset = answer["offset"]
        self.acked.setdefault(partition, []).append((values, None if offset is None else int(offset)))


def verify(read: Any, topic: str, partitions: int, ledger: Ledger) -> dict[int, int]:
    """Check the stored partitions against the ledger; returns records stored per partition.

    ``read(topic, partition, offset, max_records)`` reads the backend directly.
    """
    counts = {}
    for partition in range(partitions):
        stored = []
        offset = 0
        while True:
            chunk = read(topic, partition, offset, 1000)
            if not chunk:
                break
            stored.extend(chunk)
            offset = chunk[-1].offset + 1
        values = [r.value.decode() for r in stored]
        assert len(values) == len(set(values)), f"partition {partition}: a record was stored twice"
        by_producer: dict[int, list[int]] = {}
        for r in stored:
            by_producer.setdefault(r.producer_id, []).append(r.sequence)
        for producer_id, sequences in by_producer.items():
            assert sequences == list(range(len(sequences))), f"{partition}: producer {producer_id}: {sequences}"
        at = {r.offset: r.value.decode() for r in stored}
        present = set(values)
        for batch, base in ledger.acked.get(partition, []):
            for i, value in enumerate(batch):
                if base is None:
                    assert value in present, f"partition {partition}: acknowledged {value} missing"
                else:
                    assert at.get(base + i) == value, f"partition {partition}: acknowledged {value} not at {base + i}"
        counts[partition] = len(values)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """The broker process: ``URL BROKER_ID LEASE``; JSON requests on stdin."""
    from idempotent.adapters import open_backend
    from idempotent.broker.broker import Broker
    from idempotent.errors import NotOwnerError, ProducerError
    from idempotent.testing.conformance import cluster_config

    url, broker_id, lease = (argv if argv is not None else sys.argv[1:])[:3]
    broker = Broker(open_backend(url), cluster_config(broker_id, float(lease)))
    print("READY", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        answer: dict[str, Any] = {"id": request["id"]}
        try:
            if op == "produce":
                result = broker.produce(
                    request["topic"],
                    request["partition"],
                    request["producer_id"],
                    request["producer_epoch"],
                    request["base_sequence"],
                    [v.encode() for v in request["values"]],
                )
                answer.update(outcome=result.outcome.name, offset=result.base_offset)
            elif op == "init":
                session = broker.init_producer(request.get("name"))
                answer.update(producer_id=session.producer_id, producer_epoch=session.producer_epoch)
            elif op == "create":
                broker.create_topic(request["topic"], request["partitions"])
            elif op == "owned":
                answer.update(owned=[list(tp) for tp in broker.owned()])
            elif op == "close":
                broker.close()
                print(json.dumps(answer), flush=True)
                return 0
            else:
                answer.update(error="UsageError", message=f"unknown op {op!r}")
        except NotOwnerError as exc:
            answer.update(error="NotOwnerError", owner_id=exc.owner_id, message=str(exc))
        except ProducerError as exc:
            answer.update(error=type(exc).__name__, message=str(exc))
        print(json.dumps(answer), flush=True)
    broker.abandon()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
