"""The confluent-kafka drop-in in the shapes of real deployments, against the suite's Kafka:
applications with only the import line changed (``tests/drop_in_apps.py``), several processes
on one existing topic, replicas killed with -9 and restarted, and plain consumers reading back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

import idempotent

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.kafka


def _app(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.drop_in_apps", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _result(process: subprocess.Popen[str], timeout: float = 240) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _plain_topic(bootstrap: str, partitions: int) -> str:
    """A topic made by Kafka's own tools, as an existing application's topic is."""
    name = f"legacy-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _read_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """``(partition, key, value)`` of every record, read by a plain read_committed consumer."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)]
    )
    out: list[tuple[int, bytes | None, bytes | None]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(ended) < partitions:
            assert time.monotonic() < deadline, f"read {len(out)} records; ended {sorted(ended)}"
            message = consumer.poll(1)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, message.error()
                ended.add(message.partition())
                continue
            out.append((message.partition(), message.key(), message.value()))
    finally:
        consumer.close()
    return out


def test_two_processes_into_an_existing_six_partition_topic(kafka_service: Any) -> None:
    """Only the import changed, ``bootstrap.servers`` as before: two processes produce keyed
    records into a plain 6-partition topic at once; a plain read_committed consumer reads
    every record exactly once, each key in the partition librdkafka's partitioner picks."""
    info = kafka_service
    topic = _plain_topic(info.bootstrap, 6)
    count = 3000
    apps = [_app("keyed", info.bootstrap, topic, name, str(count)) for name in ("a", "b")]
    results = [_result(app) for app in apps]
    assert all(r["left"] == 0 and r["failed"] == [] for r in results), results
    stored = _read_all(info.bootstrap, topic, 6)
    values = Counter(value for _, _, value in stored)
    assert len(stored) == 2 * count and all(n == 1 for n in values.values())
    assert set(values) == {f"{name}-{i}".encode() for name in ("a", "b") for i in range(count)}
    placed: dict[bytes | None, set[int]] = {}
    for partition, key, _ in stored:
        placed.setdefault(key, set()).add(partition)
    assert all(len(parts) == 1 for parts in placed.values())
    # librdkafka's default partitioner (consistent_random) for a key: CRC32 of it
    assert {key: parts.pop() for key, parts in placed.items()} == {
        key: zlib.crc32(key) % 6 for key in placed if key is not None
    }


def test_replicas_one_killed_and_restarted_store_every_record_once(kafka_service: Any, tmp_path: Path) -> None:
    """Three named replicas write one topic at once, each with the application's own
    sequences; one is killed with -9 mid-run and restarted, resending what its checkpoint does
    not cover. No replica stalls the others, and every record is stored exactly once."""
    info = kafka_service
    topic = _plain_topic(info.bootstrap, 4)
    admin = idempotent.connect(info.url)
    admin.set_policy("monotonic", topic=topic)  # the application's own sequences may have gaps per partition
    admin.close()
    count = 4000
    names = [f"replica-{uuid.uuid4().hex[:6]}-{r}" for r in range(3)]
    checkpoints = [str(tmp_path / f"{name}.checkpoint") for name in names]

    def start(index: int) -> subprocess.Popen[str]:
        return _app("replica", info.bootstrap, topic, names[index], str(count), checkpoints[index])

    apps = [start(r) for r in range(3)]
    deadline = time.monotonic() + 60
    while not (os.path.exists(checkpoints[0]) and int(Path(checkpoints[0]).read_text() or 0) > 500):
        assert time.monotonic() < deadline and apps[0].poll() is None, "replica 0 made no progress"
        time.sleep(0.05)
    apps[0].send_signal(signal.SIGKILL)
    apps[0].wait(30)
    restarted_at = time.monotonic()
    apps[0] = start(0)
    results = [_result(app) for app in apps]
    assert all(r["left"] == 0 and r["failed"] == [] for r in results), results
    assert results[0]["started_at"] > 0  # it resumed from its checkpoint ...
    first = results[0]["first_report_seconds"]
    assert first is not None and first < 30, results[0]  # ... and was writing again within the takeover bound
    assert time.monotonic() - restarted_at < 200
    stored = _read_all(info.bootstrap, topic, 4)
    values = Counter(value for _, _, value in stored)
    duplicated = {v: n for v, n in values.items() if n > 1}
    assert not duplicated, list(duplicated.items())[:5]
    assert set(values) == {f"{name}-{i}".encode() for name in names for i in range(count)}
