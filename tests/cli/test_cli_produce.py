"""``idempotent produce``: resumable publishing, exactly once through kill -9."""

from __future__ import annotations

import functools
import json
import time
import uuid
from pathlib import Path

import pytest

import idempotent
from idempotent import cli
from idempotent.adapters.memory import MemoryBackend, reset_store
from idempotent.producer.producer import Producer

from ..cli_helpers import (
    assert_exactly_once,
    finish,
    generated,
    kill_when_stored,
    read_all,
    run,
    spawn_produce,
    summary,
)


def test_produce_then_tail_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    code, out, err = run(capsys, "produce", url, "t", "--generate", "1000", "--partitions", "2")
    assert code == 0, err
    assert summary(out) == {"sent": 1000, "skipped": 0, "duplicates": 0}
    assert "records/s" in out
    assert_exactly_once(url, "t", [generated(i) for i in range(1000)], 2)

    code, out, err = run(capsys, "tail", url, "t")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 20  # the last 10 of each partition
    assert lines[0].startswith("t[0] offset=490 producer=0 epoch=0 seq=490 key=null value=record-")
    assert f"value={generated(999).decode()}" in lines[-1]
    assert lines[-1].startswith("t[1] offset=499 ")

    code, out, err = run(
        capsys, "tail", url, "t", "--partition", "1", "--from-beginning", "--max", "3", "--format", "json"
    )
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["partition"], r["offset"], r["sequence"]) for r in rows] == [(1, 0, 0), (1, 1, 1), (1, 2, 2)]
    assert rows[0]["value"] == generated(1).decode()
    assert rows[0]["key"] is None

    code, out, err = run(capsys, "tail", url, "t", "--partition", "0", "--offset", "499")
    assert code == 0, err
    assert out.splitlines() == [f"t[0] offset=499 producer=0 epoch=0 seq=499 key=null value={generated(998).decode()}"]

    code, out, err = run(capsys, "stats", url, "t")
    assert code == 0, err
    assert "t[0]: ready, dedup on, policy strict" in out
    assert "t[1]: ready" in out
    assert "cli:t:generate:1000:100" in out
    assert "last_seq" in out and "499" in out

    code, out, err = run(capsys, "stats", url, "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert [(s["topic"], s["partition"], s["position"]) for s in stats] == [("t", 0, 500), ("t", 1, 500)]
    assert stats[0]["producers"][0]["last_sequence"] == 499
    assert stats[0]["producers"][0]["producer_name"] == "cli:t:generate:1000:100"


def test_produce_again_skips_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert run(capsys, "produce", url, "t", "--generate", "500", "--partitions", "3")[0] == 0
    code, out, err = run(capsys, "produce", url, "t", "--generate", "500")
    assert code == 0, err
    assert summary(out) == {"sent": 0, "skipped": 500, "duplicates": 0}
    assert_exactly_once(url, "t", [generated(i) for i in range(500)], 3)


def test_blocks_that_start_mid_round_land_in_their_partitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records are read in blocks of CHUNK (5,000, not a multiple of 3): each block is dealt
    to the partitions from where the previous one stopped, first fresh, then resumed after a
    run that stored only part of the input."""
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert (
        run(capsys, "produce", url, "t", "--generate", "7001", "--partitions", "3", "--producer-name", "grow")[0] == 0
    )
    assert_exactly_once(url, "t", [generated(i) for i in range(7001)], 3)
    code, out, err = run(capsys, "produce", url, "t", "--generate", "16003", "--producer-name", "grow")
    assert code == 0, err
    assert summary(out) == {"sent": 9002, "skipped": 7001, "duplicates": 0}
    assert_exactly_once(url, "t", [generated(i) for i in range(16003)], 3)


def test_file_lines_and_a_grown_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    data = tmp_path / "in.txt"
    lines = [b"first", b"", "ünïcode \u2603".encode(), b"tab\there", b"last without newline"]
    data.write_bytes(b"\n".join(lines))
    code, out, err = run(capsys, "produce", url, "lines", "--file", str(data), "--quiet")
    assert code == 0, err
    assert out == "" and err == ""
    assert_exactly_once(url, "lines", lines, 1)
    # Appending to the file and running again publishes only the new lines.
    more = [b"appended 1", b"appended 2"]
    data.write_bytes(b"\n".join(lines + more) + b"\n")
    code, out, err = run(capsys, "produce", url, "lines", "--file", str(data))
    assert code == 0, err
    assert summary(out) == {"sent": 2, "skipped": 5, "duplicates": 0}
    assert_exactly_once(url, "lines", lines + more, 1)


def test_partition_count_cannot_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert run(capsys, "produce", url, "t", "--generate", "100", "--partitions", "2")[0] == 0
    code, _, err = run(capsys, "produce", url, "t", "--generate", "100", "--partitions", "3")
    assert code == 2
    assert "already has 2 partition(s), not 3" in err
    assert sum(len(r) for r in read_all(url, "t").values()) == 100


def test_changed_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    data = tmp_path / "in.txt"
    data.write_text("".join(f"line {i}\n" for i in range(10)))
    assert run(capsys, "produce", url, "t", "--file", str(data))[0] == 0
    # Fewer lines than already stored.
    data.write_text("".join(f"line {i}\n" for i in range(5)))
    code, _, err = run(capsys, "produce", url, "t", "--file", str(data))
    assert code == 2
    assert "already holds 10 records" in err
    # Same length, other content at the last stored position.
    data.write_text("".join(f"LINE {i}\n" for i in range(10)))
    code, _, err = run(capsys, "produce", url, "t", "--file", str(data))
    assert code == 2
    assert "is not record 9 of this input" in err
    # The same producer name with other generated records.
    code, _, err = run(capsys, "produce", url, "t", "--generate", "10", "--producer-name", "cli-g")
    assert code == 0, err
    code, _, err = run(capsys, "produce", url, "t", "--generate", "10", "--producer-name", "cli-g", "--size", "50")
    assert code == 2
    assert "is not record 9" in err
    assert sum(len(r) for r in read_all(url, "t").values()) == 20


def test_lost_producer_state_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert run(capsys, "produce", url, "t", "--generate", "100", "--partitions", "2")[0] == 0
    # The producer's state expires on the broker (a sweep long after its last write).
    config = idempotent.BrokerConfig(checker=idempotent.CheckerConfig(producer_expiry=60.0), maintenance_interval=0)
    with idempotent.connect(url, config) as broker:
        broker.stats("t")
        broker.maintain(now=time.time() + 3600)
        assert all(not s.producers for s in broker.stats("t"))
    code, _, err = run(capsys, "produce", url, "t", "--generate", "100")
    assert code == 2
    assert "no longer has its sequence state" in err
    assert sum(len(r) for r in read_all(url, "t").values()) == 100


def test_delivery_failure_exits_1_and_a_rerun_completes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = uuid.uuid4().hex
    url = f"memory://{name}"
    reset_store(name)
    try:
        faults = MemoryBackend(url).faults
        faults.drop = 10**9  # every append fails (retriable) until the delivery timeout
        monkeypatch.setattr(
            cli.produce, "Producer", functools.partial(Producer, delivery_timeout_ms=300, request_timeout_ms=100)
        )
        code, out, err = run(capsys, "produce", url, "t", "--generate", "2000")
        assert code == 1
        assert out == ""
        assert err.startswith("error: delivery failed (")
        assert "run the same command again to resume" in err
        assert "Traceback" not in err
        faults.drop = 0
        code, out, err = run(capsys, "produce", url, "t", "--generate", "2000")
        assert code == 0, err
        assert summary(out)["sent"] == 2000
        with idempotent.connect(url) as broker:
            values = [r.value for r in broker.read("t", 0, 0, 5000)]
        assert values == [generated(i) for i in range(2000)]
    finally:
        reset_store(name)


def test_generate_resumes_after_kill_9(tmp_path: Path) -> None:
    total = 200_000
    url = "sqlite:///log.db"  # relative to the subprocess's cwd
    abs_url = f"sqlite:///{tmp_path / 'log.db'}"
    argv = [url, "t", "--generate", str(total)]

    proc = spawn_produce(*argv, cwd=tmp_path)
    stored = kill_when_stored(proc, abs_url, "t", 20_000, total)

    again, _ = finish(argv, tmp_path)
    assert again["skipped"] >= stored
    assert again["sent"] + again["skipped"] == total
    assert again["duplicates"] == 0
    logs = assert_exactly_once(abs_url, "t", [generated(i) for i in range(total)], 1)
    epochs = [r.producer_epoch for r in logs[0]]
    assert epochs[0] == 0 and epochs[-1] == 1 and epochs == sorted(epochs)

    third, out = finish(argv, tmp_path)
    assert third == {"sent": 0, "skipped": total, "duplicates": 0}, out
    assert_exactly_once(abs_url, "t", [generated(i) for i in range(total)], 1)


def test_file_with_3_partitions_resumes_after_two_kills(tmp_path: Path) -> None:
    total = 150_000
    data = tmp_path / "input.txt"
    lines = [f"line {i} {'x' * (i % 37)}".encode() for i in range(total)]
    data.write_bytes(b"\n".join(lines) + b"\n")
    url = f"sqlite:///{tmp_path / 'log.db'}"
    argv = [url, "events", "--file", "input.txt", "--partitions", "3"]

    proc = spawn_produce(*argv, cwd=tmp_path)
    first = kill_when_stored(proc, url, "events", 10_000, total)
    proc = spawn_produce(*argv, cwd=tmp_path)
    second = kill_when_stored(proc, url, "events", first + 20_000, total)
    assert second > first

    again, _ = finish(argv, tmp_path)
    assert again["skipped"] >= second
    assert again["sent"] + again["skipped"] == total
    logs = assert_exactly_once(url, "events", lines, 3)
    assert {r.producer_epoch for r in logs[0]} <= {0, 1, 2}

    third, _ = finish(argv, tmp_path)
    assert third == {"sent": 0, "skipped": total, "duplicates": 0}
    assert_exactly_once(url, "events", lines, 3)
    # The same file named by an absolute path is the same input (the same producer).
    fourth, _ = finish([url, "events", "--file", str(data)], Path("/"))
    assert fourth["sent"] == 0
