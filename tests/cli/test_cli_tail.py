"""``idempotent tail``: text and JSON output, --follow, never writing."""

from __future__ import annotations

import datetime
import json
import sqlite3
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent import cli

from ..cli_helpers import run


def test_tail_text_escapes_and_truncates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.Producer(url) as producer:
        producer.send("raw", b"a\nb\xff" + b"x" * 300, key=b"k").result()
    code, out, err = run(capsys, "tail", url, "raw")
    assert code == 0, err
    (line,) = out.splitlines()
    value = line.split(" value=", 1)[1]
    assert value.startswith("a\\nb\ufffdxxx") and value.endswith("…")
    assert len(value) == 200 + 2  # 200 characters (one escape adds one) and the marker
    assert " key=k " in line


def test_tail_and_stats_never_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    broker = idempotent.connect(url)
    with idempotent.Producer(broker, "w") as producer:
        for i in range(50):
            producer.send("t", b"%d" % i)
    broker.abandon()  # no snapshot at close: a reader's recovery has entries to snapshot
    broker.backend.close()

    def snapshot_rows() -> list[tuple[object, ...]]:
        with sqlite3.connect(tmp_path / "log.db") as db:
            return db.execute("SELECT topic, partition, position FROM snapshots").fetchall()

    before = snapshot_rows()
    # A writer in this process holds the database's write lock meanwhile.
    writer = idempotent.connect(url)
    writer.create_topic("other", 1)
    try:
        code, out, err = run(capsys, "stats", url, "t", "--json")
        assert code == 0, err
        assert json.loads(out)[0]["entries_since_snapshot"] > 0
        assert run(capsys, "stats", url)[0] == 0
        assert run(capsys, "tail", url, "t", "--from-beginning")[0] == 0
    finally:
        writer.close()
    assert snapshot_rows() == before


def test_tail_follow_stops_on_ctrl_c(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert run(capsys, "produce", url, "t", "--generate", "3")[0] == 0
    sleeps = []
    sleep = time.sleep

    def interrupt(seconds: float) -> None:
        if threading.current_thread() is not threading.main_thread():
            return sleep(seconds)  # time.sleep is patched for every thread; only tail's is meant
        sleeps.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.tail.time, "sleep", interrupt)
    code, out, err = run(capsys, "tail", url, "t", "--follow")
    assert code == 0, err
    assert len(out.splitlines()) == 3
    assert sleeps == [cli.tail.FOLLOW_INTERVAL]


# -- kcat's everyday options ------------------------------------------------------------------


def _filled(tmp_path: Path) -> str:
    """A sqlite topic of 2 partitions: record i ('v<i>', key 'k<i>', header h=<i>) in
    partition i % 2, stored at times 1000 + i seconds."""
    url = f"sqlite:///{tmp_path / 'log.db'}"
    broker = idempotent.connect(url)
    broker.create_topic("t", 2)
    with idempotent.Producer(broker) as producer:
        for i in range(10):
            producer.send("t", b"v%d" % i, key=b"k%d" % i, partition=i % 2, headers=[("h", b"%d" % i)]).result()
    broker.close()
    return url


def test_tail_format_string_key_delimiter_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _filled(tmp_path)
    code, out, err = run(
        capsys, "tail", url, "t", "-p", "1", "--from", "beginning", "--format", r"%t|%p|%o|%k|%s|%h|%S\n"
    )
    assert code == 0, err
    assert out.splitlines() == [f"t|1|{o}|k{2 * o + 1}|v{2 * o + 1}|h={2 * o + 1}|2" for o in range(5)]
    code, out, _ = run(capsys, "tail", url, "t", "-p", "0", "--from", "beginning", "-K", "\t", "--count", "2")
    assert out == "k0\tv0\nk2\tv2\n"
    code, out, _ = run(capsys, "tail", url, "t", "-p", "0", "--from", "beginning", "--json")
    lines = [json.loads(line) for line in out.splitlines()]  # one object per line
    assert [(d["offset"], d["key"], d["value"], d["headers"]) for d in lines] == [
        (o, f"k{2 * o}", f"v{2 * o}", [["h", str(2 * o)]]) for o in range(5)
    ]
    assert all(d["sequence"] == d["offset"] and d["timestamp"] > 0 for d in lines)
    code, out, _ = run(capsys, "tail", url, "t", "-p", "0", "--count", "1", "--format", r"%T %I %P %Q\n")
    millis, iso, producer, sequence = out.split()  # the first of the last 10: offset 0
    assert abs(int(millis) / 1000 - lines[0]["timestamp"]) < 0.002 and iso.startswith("20")
    assert (producer, sequence) == (str(lines[0]["producer_id"]), "0")
    code, _, err = run(capsys, "tail", url, "t", "--format", "%z")
    assert code == 2 and "unknown field '%z'" in err


def test_tail_from_offset_end_minus_n_time_and_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _filled(tmp_path)

    def values(*argv: str) -> list[str]:
        code, out, err = run(capsys, "tail", url, "t", "--format", r"%s\n", *argv)
        assert code == 0, err
        return out.split()

    assert values("--from", "3") == ["v6", "v8", "v7", "v9"]  # offsets 3 and 4 of each partition
    assert values("--from", "3", "-p", "0") == ["v6", "v8"]
    assert values("--from", "end-2", "-p", "1") == ["v7", "v9"]
    assert values("--from", "end") == []
    assert values("--from", "beginning", "--count", "3") == ["v0", "v2", "v4"]
    broker = cli.open_read_only(url)
    stamps = [r.timestamp for r in broker.read("t", 1, 0, 10)]
    broker.close()
    at = stamps[3]  # partition 1's record at offset 3 (v7)
    assert values("-p", "1", "--from", f"@{int(at * 1000)}") == ["v7", "v9"] or values(
        "-p", "1", "--from", f"@{int(at * 1000) + 1}"
    ) == ["v9"]
    iso = datetime.datetime.fromtimestamp(stamps[2] - 0.0005, datetime.UTC).isoformat()
    assert values("-p", "1", "--from", iso) == ["v5", "v7", "v9"]
    assert values("-p", "1", "--from", "2999-01-01T00:00:00Z") == []
    code, _, err = run(capsys, "tail", url, "t", "--from", "yesterday")
    assert code == 2 and "not a start" in err


#: record timestamps of the plain topics: recent, for Kafka deletes records older than its
#: retention (7 days) at its next check, whatever their offsets
BASE_MS = (int(time.time()) - 3600) * 1000


def _kafka_plain_topic(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from idempotent.runtime.native_logs import kafka_config

    admin = AdminClient(kafka_config({"bootstrap.servers": bootstrap}))
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    producer = Producer(kafka_config({"bootstrap.servers": bootstrap}))
    for i in range(count):
        producer.produce(topic, b"v%d" % i, key=b"k%d" % i, headers=[("h", b"%d" % i)], timestamp=BASE_MS + i)
    assert producer.flush(30) == 0


@pytest.mark.kafka
def test_tail_reads_a_plain_kafka_topic(kafka_service: Any, capsys: pytest.CaptureFixture[str]) -> None:
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    _kafka_plain_topic(kafka_service.bootstrap, topic, 20)
    url = f"kafka+native://{kafka_service.bootstrap}"
    code, out, err = run(capsys, "tail", url, topic, "--from", "beginning", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d["offset"], d["key"], d["value"], d["headers"]) for d in lines] == [
        (i, f"k{i}", f"v{i}", [["h", str(i)]]) for i in range(20)
    ]
    assert lines[5]["timestamp"] == (BASE_MS + 5) / 1000
    code, out, err = run(capsys, "tail", url, topic)  # the last 10
    assert out.splitlines()[0] == f"{topic}[0] offset=10 key=k10 value=v10" and len(out.splitlines()) == 10
    assert run(capsys, "tail", url, topic, "--from", "end-3", "--format", r"%o %k=%s %T\n")[1].splitlines() == [
        f"{i} k{i}=v{i} {BASE_MS + i}" for i in (17, 18, 19)
    ]
    assert (
        run(capsys, "tail", url, topic, "--from", f"@{BASE_MS + 15}", "-c", "2", "-K", ":")[1] == "k15:v15\nk16:v16\n"
    )
    assert run(capsys, "tail", url, topic, "--from", "4", "--count", "1", "--format", r"%s\n")[1] == "v4\n"
    code, _, err = run(capsys, "tail", url, "no-such-topic")
    assert code == 2 and "unknown topic" in err, err


@pytest.mark.pulsar
def test_tail_reads_a_plain_pulsar_topic(pulsar_service: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import pulsar

    from idempotent.runtime.native_logs import pulsar_logger

    topic = f"plain-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(pulsar_service.bootstrap, logger=pulsar_logger())
    producer = client.create_producer(f"persistent://public/default/{topic}", batching_enabled=False)
    for i in range(15):
        producer.send(b"v%d" % i, partition_key=f"k{i}", properties={"h": str(i)}, event_timestamp=BASE_MS + i)
    client.close()
    query = urllib.parse.urlencode({"admin_url": pulsar_service.admin_url})
    url = f"pulsar+native://{pulsar_service.bootstrap.removeprefix('pulsar://')}?{query}"
    code, out, err = run(capsys, "tail", url, topic, "--from", "beginning", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d["key"], d["value"], d["headers"], d["timestamp"]) for d in lines] == [
        (f"k{i}", f"v{i}", [["h", str(i)]], (BASE_MS + i) / 1000) for i in range(15)
    ]
    assert run(capsys, "tail", url, topic, "--from", "end-4", "--format", r"%k=%s\n")[1].split() == [
        f"k{i}=v{i}" for i in range(11, 15)
    ]
    assert run(capsys, "tail", url, topic, "--format", r"%s\n")[1].split() == [f"v{i}" for i in range(5, 15)]
    assert run(capsys, "tail", url, topic, "--from", f"@{BASE_MS + 12}", "-K", " ")[1] == "k12 v12\nk13 v13\nk14 v14\n"
