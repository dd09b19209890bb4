"""Producer processes for the broker-outage tests (``python -m tests.outage_apps MODE ...``),
each writing ``NAME-i`` records (keys ``k0`` .. ``k49``, ``i`` its sequence of the whole run)
at a steady rate while the test stops, pauses or restarts Kafka under it.

Each prints one JSON line when it is done: how every record ended (``persisted``,
``not_persisted``, ``possibly_persisted``, by index), the errors sends raised, the records
``flush`` left pending, and whether the producer wrote again after the fault (``resumed``: a
record acknowledged after the first failure or the longest gap).

* ``producer URL TOPIC NAME COUNT RATE DELIVERY_MS``: :class:`idempotent.Producer` named NAME
  over ``URL`` (``kafka://...``), ``delivery_timeout_ms=DELIVERY_MS``, COUNT records at RATE
  a second, flushed; when a record failed, rounds of 100 more until one persists whole
  (``resumed_after``: the producer resumes by itself).
* ``dropin BOOTSTRAP TOPIC NAME COUNT RATE DELIVERY_MS [numbered]``: the confluent-kafka
  drop-in with ``transactional.id`` NAME and ``message.timeout.ms=DELIVERY_MS``, the same way,
  through ``produce(..., partition=i % 3, sequence=i // 3)`` (or, with ``numbered``, keyed and
  numbered by the producer).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_FLUSH_TIMEOUT = 240.0
#: how long the records after a failed one are sent in rounds until a round persists whole
_RESUME_WITHIN = 150.0
#: the partitions of the tests' topics (the drop-in numbers its records per partition)
PARTITIONS = 3


class Tally:
    """How each record ended, fed from delivery callbacks (any thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended: dict[int, str] = {}
        self.errors: dict[str, int] = {}
        self.duplicates = 0
        self.acked_at: list[float] = []
        #: seconds from the end of the first run to the first round of records that all persisted
        self.resumed_after: float | None = None

    def end(self, index: int, outcome: str, error: str | None = None, duplicate: bool = False) -> None:
        ready = os.environ.get("OUTAGE_READY_FILE")
        if ready is not None and outcome == "persisted" and not self.acked_at:
            with open(ready, "w"):  # the first record acknowledged: this process writes
                pass
        with self.lock:
            assert index not in self.ended, f"record {index} ended twice"
            self.ended[index] = outcome
            if error is not None:
                self.errors[error] = self.errors.get(error, 0) + 1
            if outcome == "persisted":
                self.duplicates += duplicate
                self.acked_at.append(time.monotonic())

    def all_persisted(self, start: int, stop: int) -> bool:
        with self.lock:
            return all(self.ended.get(i) == "persisted" for i in range(start, stop))

    def failed(self) -> bool:
        with self.lock:
            return any(outcome != "persisted" for outcome in self.ended.values())

    def result(self, sent: int, left: int, send_errors: dict[str, int], began: float) -> dict[str, Any]:
        with self.lock:
            by: dict[str, list[int]] = {"persisted": [], "not_persisted": [], "possibly_persisted": []}
            for index, outcome in sorted(self.ended.items()):
                by[outcome].append(index)
            acked = sorted(self.acked_at)
            gaps = [b - a for a, b in itertools.pairwise(acked)]
            return {
                "sent": sent,
                "left": left,
                "unended": sent - len(self.ended),
                "send_errors": send_errors,
                "errors": self.errors,
                "duplicates": self.duplicates,
                "longest_gap": max(gaps, default=0.0),
                "resumed_after": self.resumed_after,
                # (the system's monotonic clock: comparable with the test's time.monotonic())
                "last_acked_at": acked[-1] if acked else None,
                "seconds": time.monotonic() - began,
                **by,
            }


def _stopped(index: int) -> bool:
    """Whether the test asked this process to stop sending (``OUTAGE_STOP_FILE`` exists)."""
    stop_file = os.environ.get("OUTAGE_STOP_FILE")
    return stop_file is not None and index % 50 == 0 and os.path.exists(stop_file)


def _paced(index: int, began: float, rate: float) -> None:
    pause = began + index / rate - time.monotonic()
    if pause > 0:
        time.sleep(pause)


def producer(url: str, topic: str, name: str, count: int, rate: float, delivery_ms: float) -> dict[str, Any]:
    import idempotent
    from idempotent.errors import DeliveryFailed, ProducerError

    tally = Tally()
    send_errors: dict[str, int] = {}
    began = time.monotonic()
    with idempotent.Producer(url, name, delivery_timeout_ms=delivery_ms, linger_ms=5) as p:

        def report_of(index: int) -> Any:
            def report(error: Any, metadata: Any) -> None:
                if error is None:
                    tally.end(index, "persisted", duplicate=metadata.duplicate)
                elif isinstance(error, DeliveryFailed):
                    tally.end(index, error.status.value, type(error.__cause__ or error).__name__)
                else:
                    tally.end(index, "possibly_persisted", f"unexpected {type(error).__name__}")

            return report

        index = 0

        def send_up_to(count: int) -> bool:
            nonlocal index
            while index < count:
                try:
                    p.send(topic, f"{name}-{index}".encode(), key=f"k{index % 50}".encode(),
                           on_delivery=report_of(index))  # fmt: skip
                except ProducerError as exc:  # a refused send: noted, and tried again unless fatal
                    kind = type(exc).__name__
                    send_errors[kind] = send_errors.get(kind, 0) + 1
                    if not exc.retriable:
                        return False
                    time.sleep(0.05)
                    continue
                index += 1
                if _stopped(index):
                    return True
                _paced(index, began, rate)
            return True

        if send_up_to(count) and p.flush(_FLUSH_TIMEOUT) == 0 and tally.failed():
            # records after the failed ones must persist: rounds of 100 until one persists whole
            resuming = time.monotonic()
            while time.monotonic() - resuming < _RESUME_WITHIN:
                first = index
                began = time.monotonic() - index / rate
                if not send_up_to(index + 100) or p.flush(_FLUSH_TIMEOUT) != 0:
                    break
                if tally.all_persisted(first, index):
                    tally.resumed_after = time.monotonic() - resuming
                    break
        left = p.flush(_FLUSH_TIMEOUT)
        return tally.result(index, left, send_errors, began)


def dropin(
    bootstrap: str, topic: str, name: str, count: int, rate: float, delivery_ms: float, numbered: bool = False
) -> dict[str, Any]:
    from idempotent.compat import confluent_kafka

    tally = Tally()
    send_errors: dict[str, int] = {}
    began = time.monotonic()
    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": name,
            "linger.ms": 5,
            "message.timeout.ms": int(delivery_ms),
            "request.timeout.ms": 5000,
        }
    )

    def report_of(index: int) -> Any:
        def report(err: Any, msg: Any) -> None:
            if err is None:
                tally.end(index, "persisted", duplicate=msg.duplicate())
            else:
                # the drop-in's report: retriable() when nothing was stored (safe to resend)
                outcome = "not_persisted" if err.retriable() and not err.txn_requires_abort() else "possibly_persisted"
                tally.end(index, outcome, err.name())

        return report

    index = 0

    def produce_up_to(count: int) -> bool:
        nonlocal index
        while index < count:
            value, key = f"{name}-{index}".encode(), f"k{index % 50}".encode()
            try:
                if numbered:
                    p.produce(topic, value, key=key, on_delivery=report_of(index))
                else:  # the application's sequence: the record's place in its partition (strict: no gaps)
                    p.produce(topic, value, key=key, on_delivery=report_of(index),
                              partition=index % PARTITIONS, sequence=index // PARTITIONS)  # fmt: skip
            except BufferError:
                p.poll(0.05)
                continue
            except confluent_kafka.KafkaException as exc:
                error = exc.args[0]
                send_errors[error.name()] = send_errors.get(error.name(), 0) + 1
                if error.fatal() or not error.retriable():
                    return False
                p.poll(0.05)
                continue
            index += 1
            if index % 50 == 0:
                p.poll(0)
            if _stopped(index):
                return True
            _paced(index, began, rate)
        return True

    if produce_up_to(count) and p.flush(_FLUSH_TIMEOUT) == 0 and tally.failed():
        # records after the failed ones must persist: rounds of 100 until one persists whole
        resuming = time.monotonic()
        while time.monotonic() - resuming < _RESUME_WITHIN:
            first = index
            began = time.monotonic() - index / rate
            if not produce_up_to(index + 100) or p.flush(_FLUSH_TIMEOUT) != 0:
                break
            if tally.all_persisted(first, index):
                tally.resumed_after = time.monotonic() - resuming
                break
    left = p.flush(_FLUSH_TIMEOUT)
    p.close()
    return tally.result(index, left, send_errors, began)


# -- for the tests: start the processes, read the topic back, check every outcome -------------


def start(*args: object, stop_file: str | None = None, ready_file: str | None = None) -> subprocess.Popen[str]:
    """Start one producer process (``args``: the mode and its arguments, see the module
    docstring); with ``stop_file`` it stops sending once that file exists; with
    ``ready_file`` it creates that file when its first record is acknowledged."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if stop_file is not None:
        env["OUTAGE_STOP_FILE"] = stop_file
    if ready_file is not None:
        env["OUTAGE_READY_FILE"] = ready_file
    return subprocess.Popen(
        [sys.executable, "-m", "tests.outage_apps", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def result_of(process: subprocess.Popen[str], timeout: float = 400) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["log"] = err
    return result


def plain_topic(bootstrap: str) -> str:
    """A new topic of :data:`PARTITIONS` partitions made by Kafka's own tools (one replica)."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = f"outage-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


def read_all(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> list[tuple[int, bytes]]:
    """``(partition, value)`` of every record, in each partition's order, read by a plain
    ``read_committed`` consumer once no transaction is open on the topic (its reads end at
    the high watermark: a transaction an outage left open ends by Kafka's
    ``transaction.timeout.ms`` at the latest)."""
    deadline = time.monotonic() + 180
    while True:
        out, settled = read_once(bootstrap, topic, partitions)
        if settled:
            return out
        assert time.monotonic() < deadline, f"a transaction stayed open on {topic} for 180 s"
        time.sleep(2)


def read_once(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> tuple[list[tuple[int, bytes]], bool]:
    """One read of every record (see :func:`read_all`), and whether it reached every
    partition's high watermark (no transaction open)."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    assigned = [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)]
    consumer.assign(assigned)
    out: list[tuple[int, bytes]] = []
    ended: dict[int, int] = {}
    deadline = time.monotonic() + 300
    try:
        while len(ended) < partitions:
            assert time.monotonic() < deadline, f"read {len(out)} records; ended {sorted(ended)}"
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is not None:
                    assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF, error
                    ended[message.partition()] = message.offset()
                    continue
                out.append((message.partition(), message.value()))
        highs = {p: consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1] for p, tp in enumerate(assigned)}
    finally:
        consumer.close()
    return out, all(ended[p] >= highs[p] for p in range(partitions))


def check(
    results: dict[str, dict[str, Any]], stored: list[tuple[int, bytes]], partitions: int = PARTITIONS
) -> dict[str, Any]:
    """Every record's outcome against the log, per producer; the counts (all must be 0 but
    ``persisted``)."""
    counts: Counter[str] = Counter()
    for name, result in results.items():
        assert result["unended"] == 0 and result["left"] == 0, (name, result)
        indexes = [(p, int(v.decode().rsplit("-", 1)[1])) for p, v in stored if v.decode().rsplit("-", 1)[0] == name]
        copies = Counter(i for _, i in indexes)
        counts["duplicates"] += sum(n - 1 for n in copies.values())
        counts["lost"] += sum(1 for i in result["persisted"] if i not in copies)
        counts["stored though not persisted"] += sum(1 for i in result["not_persisted"] if i in copies)
        reported = {*result["persisted"], *result["possibly_persisted"]}
        counts["stored without an outcome"] += sum(1 for i in copies if i not in reported)
        for partition in range(partitions):
            order = [i for p, i in indexes if p == partition]
            counts["reordered"] += sum(1 for a, b in itertools.pairwise(order) if b <= a)
        counts["reported duplicates"] += result["duplicates"]
        counts["fatal send errors"] += sum(result["send_errors"].values())
        counts["persisted"] += len(result["persisted"])
    return dict(counts)


def main(argv: list[str]) -> int:
    mode, target, topic, name, count, rate, delivery_ms, *flags = argv
    if mode == "producer":
        result = producer(target, topic, name, int(count), float(rate), float(delivery_ms))
    elif mode == "dropin":
        result = dropin(target, topic, name, int(count), float(rate), float(delivery_ms), "numbered" in flags)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
