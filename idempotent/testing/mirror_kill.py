"""Kill -9 proof of ``idempotent mirror``: copy while the source grows, kill the copy at seeded
random moments, resume, and check the destination equals the source exactly.

A :class:`Pair` is a source the harness writes to (it knows every record it wrote, per
partition, in order) and a destination. :func:`kill_rounds` runs the real command
(``python -m idempotent mirror``) round after round: the source grows, the command starts,
and after a seeded random delay it is killed with SIGKILL (a round that finishes first is not
a kill). A final run copies to the end, then :meth:`Pair.check` compares the destination with
what was written: per partition, the same keys and values in the same order, no duplicates,
and the ``idem.src.offset`` headers strictly increasing.

The tests (``tests/mirror/test_mirror_kill9.py``) run at least 20 kills per pair; a longer mode, for
hundreds of kills, is the command line::

    python -m idempotent.testing.mirror_kill --kills 300 [--pairs file-sqlite,sqlite-sqlite,...]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

import idempotent

#: The count of a progress line: ``mirror JOB: N records, ...``.
_DONE = re.compile(r"^mirror [^:]*: (\d+) records", re.MULTILINE)
#: Records the source grows by before each round.
PER_ROUND = 3000
#: Share of the kills at a uniformly random moment from the start of the run (start-up
#: included); the others come within 50 ms after the run's first stored records.
ANY_MOMENT = 0.25


@attrs.define
class Pair:
    """A source written by the harness and a destination, for one copy job."""

    name: str
    source: str
    destination: str
    topic: str | None
    to_topic: str
    partitions: int
    grow: Callable[[int, int], None]  # (first index, count): write records first .. first+count-1
    close_source: Callable[[], None] = lambda: None
    written: dict[int, list[tuple[bytes | None, bytes]]] = attrs.field(factory=dict)
    count: int = 0

    def add(self, count: int) -> None:
        """Write ``count`` more records to the source (record ``i`` goes to partition
        ``i % partitions``, key ``k{i}`` except for files, value ``v{i}``)."""
        self.grow(self.count, count)
        for i in range(self.count, self.count + count):
            key = None if self.source.startswith("file:") else b"k%d" % i
            self.written.setdefault(i % self.partitions, []).append((key, b"v%d" % i))
        self.count += count

    def argv(self, job: str) -> list[str]:
        """The ``idempotent mirror`` command line of this pair."""
        out = ["mirror", "--from", self.source, "--to", self.destination, "--job", job, "--to-topic", self.to_topic]
        if self.topic is not None:
            out += ["--topic", self.topic]
        return out

    def check(self) -> None:
        """Raise AssertionError unless the destination holds exactly what was written."""
        from idempotent.adapters.read_only import open_read_only_broker

        if self.destination.startswith(("idem://", "idems://")):
            broker: idempotent.BrokerAPI = idempotent.connect(self.destination)
        else:
            broker = open_read_only_broker(self.destination)
        try:
            for p in range(self.partitions):
                records: list[idempotent.StoredRecord] = []
                offset = 0
                while batch := broker.read(self.to_topic, p, offset, 5000):
                    records.extend(batch)
                    offset = batch[-1].offset + 1
                got = [(r.key, r.value) for r in records]
                want = self.written.get(p, [])
                if got != want:
                    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
                    raise AssertionError(
                        f"{self.name}: partition {p} holds {len(got)} records, {len(want)} were written; "
                        f"first difference at {first}: {got[first] if first is not None else None!r} vs "
                        f"{want[first] if first is not None else None!r}"
                    )
                offsets = [int(dict(r.headers)["idem.src.offset"]) for r in records]
                assert all(a < b for a, b in itertools.pairwise(offsets)), f"{self.name}: offsets"
        finally:
            broker.close()


@attrs.frozen
class KillReport:
    """What :func:`kill_rounds` did."""

    pair: str
    kills: int
    #: kills that came after the round had stored records and before it was done
    mid_copy: int
    #: rounds that finished before their kill
    finished: int
    records: int
    seconds: float


def _mirror(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "idempotent", *argv, "--progress-interval", "0.01"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _stored_progress(log: Path) -> bool:
    """True when the round's progress lines show records stored by this run."""
    return any(int(done) > 0 for done in _DONE.findall(log.read_text(errors="replace")))


def kill_rounds(
    pair: Pair,
    *,
    kills: int,
    seed: int,
    max_delay: float,
    workdir: Path,
    per_round: int = PER_ROUND,
    job: str = "job",
) -> KillReport:
    """Grow the source, start the copy, kill -9 it after a seeded random delay, ``kills``
    times; then copy to the end and check the destination.

    Raises:
        AssertionError: the destination is not exactly the source, or a run failed.
    """
    rng = random.Random(seed)
    started = time.monotonic()
    argv = pair.argv(job)
    done_kills = mid = finished = rounds = 0
    while done_kills < kills:
        rounds += 1
        if rounds > kills * 3:
            raise AssertionError(f"{pair.name}: {finished} of {rounds} rounds finished before their kill")
        pair.add(per_round)
        log = workdir / f"{pair.name}-{rounds}.log"
        process = _mirror(argv, log)
        if rng.random() < ANY_MOMENT:
            deadline = time.monotonic() + rng.uniform(0.0, max_delay)  # from the start on
        else:  # while copying: once this run has stored records, within a seeded instant
            deadline = time.monotonic() + 120
            while process.poll() is None and not _stored_progress(log) and time.monotonic() < deadline:
                time.sleep(0.005)
            deadline = time.monotonic() + rng.uniform(0.0, 0.05)
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            done_kills += 1
            mid += _stored_progress(log)
            continue
        if process.returncode != 0:
            raise AssertionError(f"{pair.name}: mirror failed (rc={process.returncode}): {log.read_text()[-2000:]}")
        finished += 1
    final = subprocess.run(
        [sys.executable, "-m", "idempotent", *argv, "--no-progress"], capture_output=True, text=True, timeout=600
    )
    if final.returncode != 0:
        raise AssertionError(f"{pair.name}: final run failed: {final.stderr[-2000:]}")
    pair.check()
    return KillReport(pair.name, done_kills, mid, finished, pair.count, time.monotonic() - started)


# -- sources the harness writes --------------------------------------------------------------


def file_pair(workdir: Path, destination: str) -> Pair:
    """Lines appended to a file, copied to partition 0 of ``destination``."""
    path = workdir / f"source-{uuid.uuid4().hex[:6]}.txt"
    path.touch()

    def grow(first: int, count: int) -> None:
        with path.open("ab") as handle:
            handle.write(b"".join(b"v%d\n" % i for i in range(first, first + count)))

    return Pair("file", f"file://{path}", destination, None, "lines", 1, grow)


def topic_pair(name: str, source_url: str, destination: str, partitions: int, **options: Any) -> Pair:
    """An idempotent topic on ``source_url``, written by a producer of this process."""
    topic = f"src-{uuid.uuid4().hex[:8]}"
    broker = idempotent.connect(source_url, **options)
    broker.create_topic(topic, partitions)
    producer = idempotent.Producer(broker, producer_name=f"writer-{topic}")

    def grow(first: int, count: int) -> None:
        for p in range(partitions):
            records = [
                idempotent.Record(b"v%d" % i, b"k%d" % i) for i in range(first, first + count) if i % partitions == p
            ]
            producer.send_many(topic, records, partition=p)
        assert producer.flush(120) == 0

    def close() -> None:
        producer.close()
        broker.close()

    return Pair(name, source_url, destination, topic, f"copy-{topic}", partitions, grow, close)


def kafka_native_pair(bootstrap: str, destination: str, partitions: int) -> Pair:
    """A plain Kafka topic written with confluent-kafka."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"plain-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def grow(first: int, count: int) -> None:
        for i in range(first, first + count):
            producer.produce(topic, b"v%d" % i, key=b"k%d" % i, partition=i % partitions)
        assert producer.flush(60) == 0

    return Pair("kafka-native", f"kafka+native://{bootstrap}", destination, topic, f"copy-{topic}", partitions, grow)


def pulsar_native_pair(service_url: str, admin_url: str, destination: str, partitions: int) -> Pair:
    """A plain partitioned Pulsar topic written with pulsar-client, batching on (so message
    ids carry batch indexes)."""
    import urllib.request

    import pulsar

    topic = f"plain-{uuid.uuid4().hex[:8]}"
    request = urllib.request.Request(
        f"{admin_url}/admin/v2/persistent/public/default/{topic}/partitions", data=b"%d" % partitions, method="PUT"
    )
    request.add_header("Content-Type", "application/json")
    urllib.request.urlopen(request, timeout=30).read()
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producers = [
        client.create_producer(
            f"persistent://public/default/{topic}-partition-{p}", batching_enabled=True, batching_max_messages=50
        )
        for p in range(partitions)
    ]

    def grow(first: int, count: int) -> None:
        for i in range(first, first + count):
            producers[i % partitions].send_async(b"v%d" % i, None, partition_key=f"k{i}")
        for producer in producers:
            producer.flush()

    host = service_url.split("://", 1)[1]
    return Pair(
        "pulsar-native",
        f"pulsar+native://{host}?admin_url={admin_url}",
        destination,
        topic,
        f"copy-{topic}",
        partitions,
        grow,
        client.close,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The long mode: hundreds of kills per pair against the running Kafka and Pulsar."""
    from idempotent.testing import services

    parser = argparse.ArgumentParser(prog="python -m idempotent.testing.mirror_kill")
    parser.add_argument("--kills", type=int, default=300)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--pairs", default="file-sqlite,sqlite-sqlite,kafka-native,pulsar-native,kafka-pulsar,pulsar-kafka"
    )
    parser.add_argument("--max-delay", type=float, default=3.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name in args.pairs.split(","):
            pair = make_pair(name, workdir, services)
            try:
                report = kill_rounds(pair, kills=args.kills, seed=args.seed, max_delay=args.max_delay, workdir=workdir)
            finally:
                pair.close_source()
            print(report, flush=True)
    return 0


def make_pair(name: str, workdir: Path, services: Any) -> Pair:
    """One of the pairs of the proof, by name, against the running Kafka and Pulsar."""
    sqlite = f"sqlite:///{workdir / f'dest-{uuid.uuid4().hex[:6]}.db'}"
    if name == "file-sqlite":
        return file_pair(workdir, sqlite)
    if name == "sqlite-sqlite":
        return topic_pair(name, f"sqlite:///{workdir / f'src-{uuid.uuid4().hex[:6]}.db'}", sqlite, 3)
    kafka = services.up("kafka")
    pulsar = services.up("pulsar")
    pulsar_url = f"{pulsar.url}?admin_url={pulsar.admin_url}"
    if name == "kafka-native":
        return kafka_native_pair(kafka.bootstrap, kafka.url, 3)
    if name == "pulsar-native":
        return pulsar_native_pair(pulsar.bootstrap, pulsar.admin_url, pulsar_url, 3)
    if name == "kafka-pulsar":
        return topic_pair(name, kafka.url, pulsar_url, 2)
    if name == "pulsar-kafka":
        return topic_pair(name, pulsar_url, kafka.url, 2)
    raise ValueError(f"unknown pair {name!r}")


if __name__ == "__main__":
    sys.exit(main())
