"""Every example runs against the embedded default."""

from __future__ import annotations

import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import idempotent

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path / "q.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "resend of sequences 3..4: DUPLICATE at original offset 3" in out
    assert "the log holds 5 records" in out
    assert "epoch 1" in out


def _example(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start an example with this checkout's package first on the path (and ``env`` added)."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / name), *args], stdout=subprocess.PIPE, text=True, env=env
    )


def _finish(child: subprocess.Popen[str]) -> str:
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    return out


def _kill_after(child: subprocess.Popen[str], marker: str, times: int) -> None:
    """SIGKILL the child once it printed ``times`` lines containing ``marker``."""
    assert child.stdout is not None
    seen = 0
    while seen < times:
        line = child.stdout.readline()
        assert line, "the example ended before it could be killed"
        seen += marker in line
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL


def test_file_replay_producer_killed_and_resumed(tmp_path: Path) -> None:
    lines = [f"record {i}".encode() for i in range(3000)]
    source = tmp_path / "input.txt"
    source.write_bytes(b"\n".join(lines) + b"\n")
    log = tmp_path / "log.db"
    _kill_after(_example("file_replay_producer.py", str(source), str(log), "--rate", "3000"), "acknowledged", 3)
    with idempotent.Reader(f"sqlite:///{log}", "lines") as reader:
        stored = len(list(reader))
    assert 300 <= stored < len(lines)  # killed mid-file
    out = _finish(_example("file_replay_producer.py", str(source), str(log)))
    assert f"last stored line {stored - 1}, sending lines {stored}..2999" in out
    assert "the topic holds 3000 records; each line of the file exactly once, in order: True" in out
    with idempotent.Reader(f"sqlite:///{log}", "lines") as reader:
        assert [(m.sequence, m.value) for m in reader] == list(enumerate(lines))
    out = _finish(_example("file_replay_producer.py", str(source), str(log), "--from-start"))
    assert "sent 0 new lines, 3000 duplicates" in out


def test_effectively_once_consumer_killed_and_resumed(tmp_path: Path) -> None:
    log, state = tmp_path / "log.db", tmp_path / "state.db"
    args = [str(log), str(state), "--commit-every", "7"]
    _kill_after(_example("effectively_once_consumer.py", *args, "--seed", "600", "--pause", "0.003"), "committed", 10)
    with sqlite3.connect(state) as db:
        counted = db.execute("SELECT SUM(n) FROM counts").fetchone()[0]
    assert counted % 7 == 0 and 70 <= counted < 600  # whole transactions only, killed mid-stream
    with idempotent.SqliteCheckpoint(state, name="event-counter") as checkpoint:
        assert checkpoint.position("events") == idempotent.MessageId("events", 0, counted - 1)
    out = _finish(_example("effectively_once_consumer.py", *args))
    assert f"resuming after events[0]@{counted - 1}" in out
    assert "counted 600 events: {'key-0': 120, 'key-1': 120, 'key-2': 120, 'key-3': 120, 'key-4': 120}" in out
    with sqlite3.connect(state) as db:
        assert db.execute("SELECT key, n FROM counts ORDER BY key").fetchall() == [(f"key-{k}", 120) for k in range(5)]


def test_effectively_once_consumer_standalone() -> None:
    out = _finish(_example("effectively_once_consumer.py"))
    assert "published 1000 events" in out and "counted 1000 events" in out


def _run(script: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "IDEMPOTENT_BROKER_URL"}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=cwd,
        env=environment,
    ).stdout


def _native(example: str, module: str, tmp_path: Path) -> Path:
    """The example with its one drop-in line replaced by the native import."""
    source = (ROOT / "examples" / example).read_text()
    drop_in = f"from idempotent.compat import {module}\n"
    assert source.count(drop_in) == 1
    native = tmp_path / f"native_{example}"
    native.write_text(source.replace(drop_in, f"import {module}\n"))
    imports = [line for line in native.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in imports if "idempotent" in line]
    return native


def test_drop_in_kafka(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    out = _run(ROOT / "examples" / "drop_in_kafka.py", cwd=tmp_path, env={"IDEMPOTENT_BROKER_URL": url})
    assert "order 5 stored in orders [0] at offset 4" in out
    assert "5 orders delivered, 0 failed, 0 pending" in out
    assert (tmp_path / "orders.db").exists()  # the URL the environment names, not bootstrap.servers


def test_drop_in_pulsar(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'payments.db'}"
    out = _run(ROOT / "examples" / "drop_in_pulsar.py", url, cwd=tmp_path)
    assert "payment 4 stored at (0,4,0,-1)" in out
    assert "resent payment 3: (0,3,0,-1) (already stored)" in out
    assert "resent payment 4: (0,4,0,-1) (already stored)" in out
    assert "stored a second time" not in out
    again = _run(ROOT / "examples" / "drop_in_pulsar.py", url, cwd=tmp_path)
    assert "resuming at position 5" in again and "last sequence id 4" in again


def _importer_killed_and_run_again(tmp_path: Path, url: str, bootstrap: str, topic: str) -> None:
    """The restartable importer, killed with -9 mid-file and run again from the start: the
    topic holds every line once, and what the killed run stored came back as duplicates."""
    lines = [f"k{i % 7} line {i}" for i in range(3000)]
    source = tmp_path / "input.txt"
    source.write_text("\n".join(lines) + "\n")
    env = {"IDEMPOTENT_BROKER_URL": url if url.startswith("sqlite") else ""}
    args = [str(source), bootstrap, "--topic", topic]
    _kill_after(_example("drop_in_kafka_restart.py", *args, "--rate", "3000", env=env), "acknowledged", 2)
    out = _finish(_example("drop_in_kafka_restart.py", *args, env=env))
    ended = re.findall(r"stored (\d+) new lines, (\d+) duplicates, 0 failed, 0 pending", out)
    new, duplicates = (int(n) for n in ended[0])
    assert new + duplicates == len(lines) and duplicates >= 1000, out
    with idempotent.Reader(url, topic) as reader:
        stored = Counter(m.value for m in reader)
    assert stored == Counter(line.encode() for line in lines)


def test_drop_in_kafka_restart(tmp_path: Path) -> None:
    _importer_killed_and_run_again(tmp_path, f"sqlite:///{tmp_path / 'import.db'}", "localhost:9092", "imported")


@pytest.mark.kafka
def test_drop_in_kafka_restart_into_kafka(kafka_service: Any, tmp_path: Path) -> None:
    topic = f"imported-{uuid.uuid4().hex[:8]}"
    _importer_killed_and_run_again(tmp_path, kafka_service.url, kafka_service.bootstrap, topic)


@pytest.mark.kafka
def test_drop_in_kafka_example_is_native_confluent_kafka_code(kafka_service: Any, tmp_path: Path) -> None:
    out = _run(_native("drop_in_kafka.py", "confluent_kafka", tmp_path), kafka_service.bootstrap, cwd=tmp_path)
    assert "5 orders delivered, 0 failed, 0 pending" in out


@pytest.mark.kafka
def test_drop_in_kafka_example_writes_into_the_kafka_bootstrap_servers_names(
    kafka_service: Any, tmp_path: Path
) -> None:
    out = _run(ROOT / "examples" / "drop_in_kafka.py", kafka_service.bootstrap, cwd=tmp_path)
    assert "5 orders delivered, 0 failed, 0 pending" in out
    assert not (tmp_path / "idempotent.db").exists()  # no SQLite file: the records went into Kafka


@pytest.mark.pulsar
def test_drop_in_pulsar_example_is_native_pulsar_code(pulsar_service: Any, tmp_path: Path) -> None:
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    native = _native("drop_in_pulsar.py", "pulsar", tmp_path)
    native.write_text(native.read_text().replace("public/default/payments", f"public/default/{topic}"))
    out = _run(native, pulsar_service.bootstrap, cwd=tmp_path)
    assert "payment 4 stored at" in out
    # without deduplication on the namespace (Pulsar's default) the resends are stored again
    assert "resent payment 4:" in out and "(stored a second time)" in out


def _partitioned_importer_killed_three_times(tmp_path: Path, url: str, topic: str, seed: int) -> None:
    """The partitioned importer at full speed, killed with -9 at seeded random points three
    times and resumed each time by the documented recipe (``resume_sequence_id()``), then run
    to the end: every line stored exactly once, counted by sequence over all partitions."""
    rng = random.Random(seed)
    # runs of 20 lines share a key: keyed batches of consecutive sequences, with gaps between
    lines = [f"k{i // 20 % 11} line {i}".encode() for i in range(20_000)]
    source = tmp_path / "input.txt"
    source.write_bytes(b"\n".join(lines) + b"\n")
    args = [str(source), url, "--topic", topic, "--partitions", "4"]
    skipped_by_highest, previous_lowest = [], -1
    for kill in range(3):
        child = _example("drop_in_pulsar_restart.py", *args)
        assert child.stdout is not None
        resumed = child.stdout.readline()
        acknowledged = 0
        wanted = rng.randint(1, 6)  # at a random point: after 500 to 3,000 acknowledgements
        while acknowledged < wanted:
            line = child.stdout.readline()
            assert line, f"the importer ended before kill {kill + 1}"
            acknowledged += line.startswith("acknowledged")
        time.sleep(rng.uniform(0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL
        last = _last_per_partition(url, topic)
        assert sum(len(stored) for stored in last.values()) < len(lines)  # killed mid-file
        highest, lowest = max(max(s, default=-1) for s in last.values()), min(max(s, default=-1) for s in last.values())
        stored = {s for seqs in last.values() for s in seqs}
        skipped_by_highest.append(sum(1 for s in range(lowest + 1, highest + 1) if s not in stored))
        # the recipe resumed after the lowest partition the previous kill left
        assert resumed.startswith(f"resuming at line {previous_lowest + 1} "), resumed
        previous_lowest = lowest
    out = _finish(_example("drop_in_pulsar_restart.py", *args))
    assert out.startswith(f"resuming at line {previous_lowest + 1} "), out
    assert f"sent lines {previous_lowest + 1}..19999: {20_000 - previous_lowest - 1} acknowledged, 0 failed" in out
    print(f"lines last_sequence_id() + 1 would have skipped after each kill: {skipped_by_highest}")
    with idempotent.Reader(url, topic) as reader:
        stored_by_sequence = Counter((m.sequence, m.value) for m in reader)
    assert stored_by_sequence == Counter(enumerate(lines))  # every line once, with its own sequence


def _last_per_partition(url: str, topic: str) -> dict[int, list[int]]:
    """The sequences stored on each partition (checked to be increasing: a prefix, in order)."""
    stored: dict[int, list[int]] = {p: [] for p in range(4)}
    with idempotent.Reader(url, topic) as reader:
        for message in reader:
            stored[message.partition].append(message.sequence)
    for sequences in stored.values():
        assert sequences == sorted(set(sequences))
    return stored


def test_drop_in_pulsar_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'import.db'}"
    _partitioned_importer_killed_three_times(tmp_path, url, "persistent://public/default/imported", 5)


@pytest.mark.pulsar
def test_drop_in_pulsar_restart_into_pulsar(pulsar_service: Any, tmp_path: Path) -> None:
    url = f"{pulsar_service.url}?admin_url={pulsar_service.admin_url}"
    topic = f"persistent://public/default/imported-{uuid.uuid4().hex[:8]}"
    _partitioned_importer_killed_three_times(tmp_path, url, topic, 6)
