"""``idempotent tail``: text and JSON output, --follow, never writing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import idempotent
from idempotent import cli

from .cli_helpers import run


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

    def interrupt(seconds: float) -> None:
        sleeps.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.tail.time, "sleep", interrupt)
    code, out, err = run(capsys, "tail", url, "t", "--follow")
    assert code == 0, err
    assert len(out.splitlines()) == 3
    assert sleeps == [cli.tail.FOLLOW_INTERVAL]
