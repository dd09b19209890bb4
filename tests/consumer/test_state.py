"""SqliteCheckpoint: state and position commit together, also across a real SIGKILL."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import idempotent
from idempotent import MessageId, Producer, SqliteCheckpoint
from idempotent.errors import ConfigError, ProducerClosedError, UsageError

ROOT = Path(__file__).resolve().parents[2]


def _log(tmp_path: Path, topic: str, count: int, partitions: int = 1) -> str:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.connect(url) as broker:
        broker.create_topic(topic, partitions)
        with Producer(broker, producer_name="writer") as producer:
            for i in range(1, count + 1):
                producer.send(topic, str(i).encode(), partition=i % partitions)
            producer.flush()
    return url


def _schema(checkpoint: SqliteCheckpoint) -> None:
    checkpoint.db.execute("CREATE TABLE IF NOT EXISTS sums (id INTEGER PRIMARY KEY, total INTEGER, n INTEGER)")
    checkpoint.db.execute("INSERT OR IGNORE INTO sums VALUES (1, 0, 0)")


def _sums(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        total, n = db.execute("SELECT total, n FROM sums").fetchone()
    return int(total), int(n)


def test_commit_stores_state_and_position_together(tmp_path: Path) -> None:
    url = _log(tmp_path, "events", 5)
    with SqliteCheckpoint(tmp_path / "state.db") as checkpoint:
        _schema(checkpoint)
        assert checkpoint.positions("events") == [] and checkpoint.position("events") is None
        with checkpoint.reader(url, "events") as reader:
            for message in [reader.read_next(10), reader.read_next(10)]:
                with checkpoint.commit(message.message_id) as db:
                    db.execute("UPDATE sums SET total = total + ?, n = n + 1", (int(message.value or b"0"),))
        assert checkpoint.position("events") == message.message_id
        with pytest.raises(RuntimeError), checkpoint.commit(MessageId("events", 0, 99)) as db:
            db.execute("UPDATE sums SET total = total + 1000")
            raise RuntimeError("processing failed")
        assert checkpoint.position("events") == message.message_id  # rolled back with the state
        with checkpoint.reader(url, "events") as reader:
            assert [m.value for m in reader] == [b"3", b"4", b"5"]
    assert _sums(tmp_path / "state.db") == (3, 2)


def test_positions_per_partition_and_per_name(tmp_path: Path) -> None:
    url = _log(tmp_path, "multi", 6, partitions=2)
    path = tmp_path / "state.db"
    with SqliteCheckpoint(path) as checkpoint, checkpoint.reader(url, "multi") as reader:
        messages = [reader.read_next(10) for _ in range(3)]  # partitions 0, 1, 0
        with checkpoint.commit(*(m.message_id for m in messages)):
            pass
        assert checkpoint.positions("multi") == [messages[2].message_id, messages[1].message_id]
    with SqliteCheckpoint(path, name="other") as other:
        assert other.positions("multi") == []
    with SqliteCheckpoint(path) as checkpoint:
        with checkpoint.reader(url, "multi") as reader:
            assert sorted(m.value or b"" for m in reader) == [b"3", b"5", b"6"]
        with checkpoint.reader(url, "multi", partition=1) as reader:
            assert [m.value for m in reader] == [b"3", b"5"]


def test_misuse(tmp_path: Path) -> None:
    checkpoint = SqliteCheckpoint(tmp_path / "state.db")
    with pytest.raises(ConfigError), checkpoint.commit("not an id"):  # type: ignore[arg-type]
        pass
    with pytest.raises(UsageError), checkpoint.commit(), checkpoint.commit():
        pass
    assert not checkpoint.db.in_transaction
    checkpoint.close()
    checkpoint.close()
    with pytest.raises(ProducerClosedError):
        checkpoint.positions("t")
    with pytest.raises(ConfigError):
        SqliteCheckpoint(tmp_path / "state.db", name="")
    with pytest.raises(ConfigError):
        SqliteCheckpoint(tmp_path)  # a directory


_CONSUMER = textwrap.dedent(
    """
    import os, signal, sys, time
    from idempotent import SqliteCheckpoint
    url, state, die_at, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    checkpoint = SqliteCheckpoint(state)
    checkpoint.db.execute("CREATE TABLE IF NOT EXISTS sums (id INTEGER PRIMARY KEY, total INTEGER, n INTEGER)")
    checkpoint.db.execute("INSERT OR IGNORE INTO sums VALUES (1, 0, 0)")
    with checkpoint.reader(url, "events") as reader:
        for message in reader:
            value = int(message.value)
            with checkpoint.commit(message.message_id) as db:
                db.execute("UPDATE sums SET total = total + ?, n = n + 1", (value,))
                if value == die_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # dies inside the transaction
            print(value, flush=True)
            time.sleep(pause)
    print("end", flush=True)
    """
)


def _consumer(url: str, state: Path, die_at: int = 0, pause: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CONSUMER, url, str(state), str(die_at), str(pause)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_sigkill_mid_stream_leaves_exact_state(tmp_path: Path) -> None:
    count = 300
    url = _log(tmp_path, "events", count)
    state = tmp_path / "state.db"
    # 1: killed inside the transaction of message 100, after its update ran
    child = _consumer(url, state, die_at=100)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert _sums(state) == (sum(range(1, 100)), 99)
    # 2: killed from outside at an arbitrary point
    child = _consumer(url, state, pause=0.005)
    assert child.stdout is not None
    for _ in range(20):
        assert child.stdout.readline().strip() != "end"
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    total, n = _sums(state)
    assert 119 <= n < count and total == sum(range(1, n + 1))
    # 3: resumes after the stored position and finishes with every message applied once
    child = _consumer(url, state)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and out.split()[-1] == "end"
    assert out.split()[0] == str(n + 1)
    assert _sums(state) == (sum(range(1, count + 1)), count)
