"""Copy a plain Kafka topic into Kafka: idempotent mirror vs a consume -> produce loop vs MirrorMaker 2.

On the shared (or a started) Kafka, in one run:

* ``command``: ``idempotent mirror --from kafka+native://... --to kafka://...`` in a process of
  its own, as MirrorMaker 2 runs (timed from its progress lines, every 50 ms);
* ``idempotent``: ``Mirror("kafka+native://...", "kafka://...").run()`` in this process (the
  API; the command also runs with the collector's thresholds raised, see ``idempotent.runtime.collector``);
* ``loop``: a plain confluent-kafka consume -> produce loop (assigned partitions, acks=all,
  no idempotence): the at-least-once baseline;
* ``mm2``: MirrorMaker 2 (``org.apache.kafka.connect.mirror.MirrorMaker``, dedicated mode,
  source and target cluster = the same broker, topics renamed with the ``src.`` prefix),
  resolved from Maven Central (``bench/mirrormaker2.xml``) into the same cache as the
  brokers and started as a plain JVM the way ``idempotent.testing.services`` starts them.

Each repeat writes a fresh source topic and copies it with every variant, in rotating order.
Throughput is measured between 10 % and 90 % of the records arriving, from the counts seen
at those marks (start-up excluded for all; MirrorMaker takes seconds to start its tasks),
and the table shows medians.
Then each variant copies a fresh topic once more, is killed with SIGKILL once at about 40 %,
is restarted and runs to the end: the duplicates are the records the target holds beyond
the source's (losses would show as fewer).

    python bench/bench_mirror.py --records 100000 --size 100 --partitions 3 --repeats 3

The table is printed as Markdown; the runs are saved as JSON under ``bench/results/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from idempotent.testing import services

VARIANTS = ("command", "idempotent", "loop", "mm2")
_POM = Path(__file__).resolve().parent / "mirrormaker2.xml"
_MM2_MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"


# -- Kafka helpers --------------------------------------------------------------------------


def create_topic(bootstrap: str, partitions: int, name: str | None = None) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = name or f"bench-src-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result()
    return name


def fill(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    filler = b"x" * max(0, size - 12)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, b"%012d" % i + filler, key=b"%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def count(bootstrap: str, topic: str, timeout: float = 60.0) -> int:
    """Records of ``topic`` (read_committed), reading every partition to its end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    metadata = consumer.list_topics(topic, timeout=30).topics[topic]
    consumer.assign([TopicPartition(topic, p, -2) for p in metadata.partitions])
    remaining = set(metadata.partitions)
    total = 0
    deadline = time.monotonic() + timeout
    while remaining and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 1.0):
            error = message.error()
            if error is None:
                total += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                remaining.discard(message.partition())
    consumer.close()
    return total


def high_watermarks(consumer: Any, topic: str, partitions: int) -> int:
    from confluent_kafka import KafkaException, TopicPartition

    total = 0
    for p in range(partitions):
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)
        except KafkaException:  # the topic may not exist yet
            return 0
        total += max(0, high)
    return total


class Timeline:
    """When the copied count first reached 10 % and 90 % of ``records``, and the counts seen
    then (progress comes in steps of a batch, so a step may pass a mark by much)."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.low: float | None = None
        self.high: float | None = None
        self.low_count = 0
        self.high_count = 0

    def update(self, copied: int) -> None:
        now = time.perf_counter()
        if self.low is None and copied >= self.records * 0.1:
            self.low, self.low_count = now, copied
        if self.high is None and copied >= self.records * 0.9:
            self.high, self.high_count = now, copied

    def rate(self) -> float:
        """Records per second between the two marks, from the counts seen there."""
        assert self.low is not None and self.high is not None, "the copy did not finish"
        return (self.high_count - self.low_count) / max(1e-9, self.high - self.low)


# -- variants -------------------------------------------------------------------------------


def run_idempotent(info: services.ServiceInfo, source: str, records: int) -> float:
    from idempotent.mirror import Mirror, PartitionProgress

    timeline = Timeline(records)
    copied: dict[int, int] = {}
    lock = threading.Lock()

    def progress(report: PartitionProgress) -> None:
        with lock:
            copied[report.partition] = report.copied
            timeline.update(sum(copied.values()))

    job = uuid.uuid4().hex[:8]
    summary = Mirror(
        f"kafka+native://{info.bootstrap}", info.url, topic=source, to_topic=f"ours-{job}", job=job, progress=progress
    ).run()
    assert summary.copied == records, summary
    return timeline.rate()


def mirror_argv(info: services.ServiceInfo, source: str, job: str, target: str) -> list[str]:
    """``idempotent mirror`` copying ``source`` into ``target`` on the same Kafka as job ``job``."""
    argv = [sys.executable, "-m", "idempotent", "mirror", "--from", f"kafka+native://{info.bootstrap}"]
    return [*argv, "--to", info.url, "--topic", source, "--to-topic", target, "--job", job]


def run_command(info: services.ServiceInfo, source: str, records: int) -> float:
    """The command in a process of its own (as MirrorMaker 2 runs), timed from its progress
    lines (every 50 ms)."""
    timeline = Timeline(records)
    job = uuid.uuid4().hex[:8]
    with tempfile.NamedTemporaryFile() as log:
        argv = [*mirror_argv(info, source, job, f"cmd-{job}"), "--progress-interval", "0.05"]
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        # read only what the command wrote since the last look (every 20 ms, as little of this
        # process's CPU as the watermark polls of the other variants take)
        with open(log.name, errors="replace") as reader:
            pending = ""
            try:
                while True:
                    running = process.poll() is None
                    pending += reader.read()
                    complete, _, pending = pending.rpartition("\n")
                    for count in _PROGRESS.findall(complete):
                        timeline.update(int(count))
                    if not running:
                        break
                    time.sleep(0.02)
            finally:
                if process.poll() is None:
                    process.kill()
                process.wait(30)
        if process.returncode != 0:
            tail = Path(log.name).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"idempotent mirror exited with {process.returncode}: {tail}")
    if timeline.high is None or timeline.low == timeline.high:
        # the marks passed between two progress lines, or after the last: the whole run,
        # start-up included
        return records / (time.perf_counter() - started)
    return timeline.rate()


def loop_copy(bootstrap: str, source: str, target: str, group: str, on_delivered: Any = None) -> int:
    """The at-least-once baseline: consume (committing after each flush) -> produce, to the
    source's end. Returns the records produced."""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20, "acks": "all"})
    partitions = list(consumer.list_topics(source, timeout=30).topics[source].partitions)
    if target not in consumer.list_topics(timeout=30).topics:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(target, len(partitions), 1)])
        futures[target].result()
    committed = consumer.committed([TopicPartition(source, p) for p in partitions], timeout=30)
    consumer.assign([TopicPartition(source, tp.partition, tp.offset if tp.offset >= 0 else -2) for tp in committed])
    ends = {p: consumer.get_watermark_offsets(TopicPartition(source, p), timeout=30)[1] for p in partitions}
    remaining = {p for p in partitions if ends[p] > 0}
    produced = 0
    since_commit = 0

    def delivered(err: Any, msg: Any) -> None:
        if err is None and on_delivered is not None:
            on_delivered()

    while remaining:
        for message in consumer.consume(5000, 0.5):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if message.offset() >= ends[message.partition()]:
                        remaining.discard(message.partition())
                    continue
                raise RuntimeError(error.str())
            while True:
                try:
                    producer.produce(
                        target,
                        message.value(),
                        key=message.key(),
                        headers=message.headers(),
                        partition=message.partition(),
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            produced += 1
            since_commit += 1
        producer.poll(0)
        if since_commit >= 20_000:  # at least once: flush, then commit what was read
            producer.flush(60)
            _commit(consumer)
            since_commit = 0
    producer.flush(60)
    _commit(consumer)
    consumer.close()
    return produced


def _commit(consumer: Any) -> None:
    from confluent_kafka import KafkaError, KafkaException

    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:  # nothing read since the last commit
            raise


def run_loop(info: services.ServiceInfo, source: str, records: int) -> float:
    timeline = Timeline(records)
    state = {"n": 0}

    def delivered() -> None:
        state["n"] += 1
        timeline.update(state["n"])

    target = f"loop-{uuid.uuid4().hex[:8]}"
    loop_copy(info.bootstrap, source, target, uuid.uuid4().hex, delivered)
    return timeline.rate()


def mm2_lib() -> Path:
    """MirrorMaker 2's classpath, resolved once from Maven Central like the brokers'."""
    pom = _POM.read_bytes()
    digest = hashlib.sha256(pom).hexdigest()
    home = services.cache_dir() / "mirrormaker2-4.3.1"
    lib = home / "lib"
    marker = home / ".installed"
    if marker.exists() and json.loads(marker.read_text()).get("pom_sha256") == digest and lib.is_dir():
        return lib
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_bytes(pom)
    staging = home / "lib.partial"
    with (home / "maven.log").open("wb") as log:
        subprocess.run(
            [
                "mvn",
                "-B",
                "-f",
                str(home / "pom.xml"),
                "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    if lib.exists():
        for old in lib.iterdir():
            old.unlink()
        lib.rmdir()
    staging.rename(lib)
    marker.write_text(json.dumps({"pom_sha256": digest}) + "\n")
    return lib


class MirrorMaker:
    """A MirrorMaker 2 JVM copying ``topic`` from the broker to itself as ``src.<topic>``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.target = f"src.{topic}"
        self.config = workdir / f"mm2-{topic}.properties"
        self.log = workdir / f"mm2-{topic}.log"
        settings = {
            "clusters": "src, dst",
            "src.bootstrap.servers": bootstrap,
            "dst.bootstrap.servers": bootstrap,
            "src->dst.enabled": "true",
            "src->dst.topics": topic,
            "dst->src.enabled": "false",
            "tasks.max": str(partitions),
            "replication.factor": "1",
            "offset-syncs.topic.replication.factor": "1",
            "checkpoints.topic.replication.factor": "1",
            "heartbeats.topic.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "config.storage.replication.factor": "1",
            "emit.heartbeats.enabled": "false",
            "emit.checkpoints.enabled": "false",
            "sync.group.offsets.enabled": "false",
            "sync.topic.acls.enabled": "false",
            "refresh.topics.interval.seconds": "2",
            "offset.flush.interval.ms": "5000",
        }
        self.config.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        lib = mm2_lib()
        log4j = services._CONF_DIR / "log4j2.properties"  # the brokers' logging set-up
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    services._java(),
                    "-Xms256m",
                    "-Xmx512m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Djava.awt.headless=true",
                    f"-Dlog4j2.configurationFile={log4j}",
                    "-cp",
                    f"{lib}/*",
                    _MM2_MAIN,
                    str(self.config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()


def watch(bootstrap: str, topic: str, partitions: int, records: int, timeline: Timeline | None, timeout: float) -> int:
    """Poll the target's high watermarks until they reach ``records`` and stay still for 5 s
    (or ``timeout``); return the last total."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    deadline = time.monotonic() + timeout
    last, still_since = -1, time.monotonic()
    try:
        while time.monotonic() < deadline:
            total = high_watermarks(consumer, topic, partitions)
            if timeline is not None:
                timeline.update(total)
            if total != last:
                last, still_since = total, time.monotonic()
            elif total >= records and time.monotonic() - still_since > 5:
                return total
            time.sleep(0.05)
        return last
    finally:
        consumer.close()


def run_mm2(info: services.ServiceInfo, source: str, records: int, partitions: int, workdir: Path) -> float:
    mm2 = MirrorMaker(info.bootstrap, source, partitions, workdir)
    timeline = Timeline(records)
    mm2.start()
    try:
        watch(info.bootstrap, mm2.target, partitions, records, timeline, timeout=600)
    finally:
        mm2.stop()
    return timeline.rate()


# -- one kill -9 each -----------------------------------------------------------------------


def kill_idempotent(info: services.ServiceInfo, source: str, records: int, partitions: int) -> int:
    job = uuid.uuid4().hex[:8]
    target = f"ours-kill-{job}"
    argv = mirror_argv(info, source, job, target)
    with tempfile.NamedTemporaryFile() as log:
        process = subprocess.Popen([*argv, "--progress-interval", "0.05"], stdout=subprocess.DEVNULL, stderr=log)
        _kill_at(process, lambda: _copied_in(Path(log.name)), records * 0.4)
    subprocess.run([*argv, "--quiet"], check=True, timeout=600)
    return count(info.bootstrap, target) - records


#: the count of one of the command's progress lines (``mirror JOB: N records, ...``)
_PROGRESS = re.compile(r"^mirror [^:]*: (\d+) records", re.MULTILINE)


def _copied_in(log: Path) -> int:
    """The last count of the command's progress lines."""
    counts = _PROGRESS.findall(log.read_text(errors="replace"))
    return int(counts[-1]) if counts else 0


def _kill_at(process: subprocess.Popen[bytes], progress: Any, at: float) -> None:
    deadline = time.monotonic() + 300
    while process.poll() is None and progress() < at and time.monotonic() < deadline:
        time.sleep(0.01)
    if process.poll() is not None:
        raise RuntimeError("the copy ended before the kill")
    os.kill(process.pid, signal.SIGKILL)
    process.wait(30)


def kill_loop(info: services.ServiceInfo, source: str, records: int) -> int:
    target = f"loop-kill-{uuid.uuid4().hex[:8]}"
    group = uuid.uuid4().hex
    argv = [sys.executable, __file__, "--loop-child", info.bootstrap, source, target, group]
    from confluent_kafka import Consumer

    watcher = Consumer({"bootstrap.servers": info.bootstrap, "group.id": uuid.uuid4().hex})
    partitions = len(watcher.list_topics(source, timeout=30).topics[source].partitions)
    create_topic(info.bootstrap, partitions, target)  # so that the watcher sees it from the start
    process = subprocess.Popen(argv)
    try:
        _kill_at(process, lambda: high_watermarks(watcher, target, partitions), records * 0.4)
    finally:
        watcher.close()
    subprocess.run(argv, check=True, timeout=600)
    return count(info.bootstrap, target) - records


def kill_mm2(info: services.ServiceInfo, source: str, records: int, partitions: int, workdir: Path) -> int:
    mm2 = MirrorMaker(info.bootstrap, source, partitions, workdir)
    from confluent_kafka import Consumer

    watcher = Consumer({"bootstrap.servers": info.bootstrap, "group.id": uuid.uuid4().hex})
    mm2.start()
    try:
        deadline = time.monotonic() + 300
        while high_watermarks(watcher, mm2.target, partitions) < records * 0.4 and time.monotonic() < deadline:
            time.sleep(0.01)
        mm2.kill9()
        mm2.start()
        watch(info.bootstrap, mm2.target, partitions, records, None, timeout=600)
    finally:
        mm2.stop()
        watcher.close()
    return count(info.bootstrap, mm2.target) - records


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 runs")
    parser.add_argument("--kill-only", action="store_true", help="only the kill -9 runs")
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results"), help="folder of the JSON results"
    )
    parser.add_argument(
        "--loop-child", nargs=4, metavar=("BOOTSTRAP", "SOURCE", "TARGET", "GROUP"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.loop_child:
        loop_copy(*args.loop_child)
        return 0
    variants = args.variants.split(",")
    info = services.up("kafka")
    results: dict[str, list[float]] = {v: [] for v in variants}
    duplicates: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for repeat in range(0 if args.kill_only else args.repeats):
            source = create_topic(info.bootstrap, args.partitions)
            fill(info.bootstrap, source, args.partitions, args.records, args.size)
            order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
            for variant in order:
                if variant == "command":
                    rate = run_command(info, source, args.records)
                elif variant == "idempotent":
                    rate = run_idempotent(info, source, args.records)
                elif variant == "loop":
                    rate = run_loop(info, source, args.records)
                else:
                    rate = run_mm2(info, source, args.records, args.partitions, workdir)
                results[variant].append(rate)
                print(f"repeat {repeat}: {variant}: {rate:,.0f} records/s", flush=True)
        if not args.no_kill:
            # the in-process API runs the same copy as the command: the command is the one killed
            for variant in [v for v in variants if v != "idempotent" or "command" not in variants]:
                source = create_topic(info.bootstrap, args.partitions)
                fill(info.bootstrap, source, args.partitions, args.records, args.size)
                if variant in ("command", "idempotent"):
                    duplicates[variant] = kill_idempotent(info, source, args.records, args.partitions)
                elif variant == "loop":
                    duplicates[variant] = kill_loop(info, source, args.records)
                else:
                    duplicates[variant] = kill_mm2(info, source, args.records, args.partitions, workdir)
                print(f"kill -9: {variant}: {duplicates[variant]} duplicates", flush=True)
    medians = {v: statistics.median(r) for v, r in results.items() if r}
    lines = [
        f"Kafka -> Kafka, {args.records} records of {args.size} B, {args.partitions} partitions, "
        f"median of {args.repeats} (rate between 10 % and 90 % of the records), {os.cpu_count()} CPUs",
        "",
        "| variant | records/s (median) | runs | duplicates after one kill -9 |",
        "|---|---|---|---|",
    ]
    for v in variants:
        runs = ", ".join(f"{r:,.0f}" for r in results[v])
        median = f"{medians[v]:,.0f}" if v in medians else "-"
        lines.append(f"| {v} | {median} | {runs} | {duplicates.get(v, '-')} |")
    for ours in ("command", "idempotent"):
        for other in ("loop", "mm2"):
            if ours in medians and other in medians:
                lines.append(f"\n{ours} / {other} = {medians[ours] / medians[other]:.2f}x")
    print("\n".join(lines))
    out = Path(args.out) / f"mirror-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "runs": results,
                "medians": medians,
                "duplicates": duplicates,
                "host": platform.node(),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
