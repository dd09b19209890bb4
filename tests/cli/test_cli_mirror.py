"""``idempotent mirror``: the command line of copy jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import idempotent
from idempotent.cli import CliError

from ..cli_helpers import read_all, run


def _values(url: str, topic: str) -> list[bytes | None]:
    try:
        return [r.value for r in read_all(url, topic)[0]]
    except (idempotent.ProducerError, CliError):  # not created yet
        return []


def test_mirror_copies_a_file_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(b"r%d\n" % i for i in range(500)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    argv = ["mirror", "--from", f"file://{source}", "--to", dest, "--to-topic", "lines", "--job", "j"]
    code, out, err = run(capsys, *argv, "--progress-interval", "0.001")
    assert code == 0, err
    assert "copied=500 " in out and "duplicates=0" in out
    assert "mirror j: " in err and "lag (partition:offsets) 0:" in err  # lines: stderr is no terminal
    assert [r.value for r in read_all(dest, "lines")[0]] == [b"r%d" % i for i in range(500)]
    code, out, err = run(capsys, *argv, "--quiet")
    assert (code, out, err) == (0, "", "")
    code, out, err = run(capsys, *argv)
    assert code == 0 and "copied=0 " in out and "{0@" in out


def test_mirror_refuses_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    code, _, err = run(capsys, "mirror", "--from", f"file://{tmp_path}", "--to", dest, "--job", "j")
    assert code == 2 and "destination topic" in err
    code, _, err = run(capsys, "mirror", "--from", "nope://x", "--to", dest, "--topic", "t", "--job", "j")
    assert code == 2 and "unknown source URL scheme" in err
    code, _, err = run(capsys, "mirror", "--from", f"file://{tmp_path}", "--to", dest, "--to-topic", "t")
    assert code == 2 and "--job" in err


def test_follow_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"a\nb\n")
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    argv = ["mirror", "--from", f"file://{source}", "--to", dest, "--to-topic", "t", "--job", "j", "--follow"]
    process = subprocess.Popen(
        [sys.executable, "-m", "idempotent", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (tmp_path / "d.db").exists() and len(_values(dest, "t")) == 2:
                break
            time.sleep(0.1)
        with source.open("ab") as handle:
            handle.write(b"c\n")
        while len(_values(dest, "t")) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert b"copied=3 " in out
    assert [r.value for r in read_all(dest, "t")[0]] == [b"a", b"b", b"c"]


def test_reusing_a_job_name_for_another_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (the issue's reproduction): the second command exited 0 having copied only
    b's lines 1000-1999."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"".join(b"a%d\n" % i for i in range(1000)))
    b.write_bytes(b"".join(b"b%d\n" % i for i in range(2000)))
    dest = f"sqlite:///{tmp_path / 'dst.db'}"
    argv = ["--to", dest, "--to-topic", "all", "--job", "daily-import", "--no-progress"]
    code, out, err = run(capsys, "mirror", "--from", f"file://{a}", *argv)
    assert code == 0 and "copied=1000 " in out, err
    code, out, err = run(capsys, "mirror", "--from", f"file://{b}", *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: job 'daily-import' copied ") and str(a) in err and str(b) in err
    assert "another --job name" in err
    assert _values(dest, "all") == [b"a%d" % i for i in range(1000)]


def _status(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    code, out, err = run(capsys, "mirror", "status", *argv, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert isinstance(rows, list)
    return rows


def test_status_while_the_job_runs_and_after_it_died(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(b"r%d\n" % i for i in range(100)))
    size = source.stat().st_size
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    argv = ["mirror", "--from", f"file://{source}", "--to", dest, "--to-topic", "t", "--job", "live", "--follow"]
    process = subprocess.Popen(
        [sys.executable, "-m", "idempotent", *argv, "--progress-interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    started = time.monotonic()
    try:
        deadline = started + 30
        while len(_values(dest, "t")) < 100:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        status = ["--job", "live", "--to", dest, "--from", f"file://{source}"]
        (row,) = _status(capsys, *status)
        last = size - len(b"r99\n")
        assert (row["topic"], row["partition"], row["to_topic"], row["to_partition"]) == (str(source), 0, "t", 0)
        assert (row["producer_name"], row["last_offset"], row["end"], row["lag"]) == ("live/0", last, size, 0)
        assert 0 <= float(row["last_write_age_seconds"]) < 30  # type: ignore[arg-type]
        code, out, err = run(capsys, "mirror", "status", *status)
        assert code == 0, err
        assert out.splitlines()[1].split() == [
            "source",
            "topic",
            "partition",
            "destination",
            "copied",
            "up",
            "to",
            "source",
            "end",
            "lag",
            "last",
            "write",
        ]
        assert re.search(rf"t\[0\] +{last} +{size} +0 +\S+ \(\d+ s ago\)\n1 partition, total lag 0 bytes\n$", out), out
        # the job is killed (after it has had time for a few progress lines); the source
        # grows: the lag shows it, the resume point stays
        time.sleep(max(0.0, started + 1.5 - time.monotonic()))
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        with source.open("ab") as handle:
            handle.write(b"more\n")
        (after,) = _status(capsys, *status)
        assert (after["last_offset"], after["end"], after["lag"]) == (last, size + 5, 5)
        assert _status(capsys, "--job", "live", "--to", dest)[0]["lag"] is None  # without --from: no end
    finally:
        if process.poll() is None:
            process.kill()
        _, progress = process.communicate(timeout=30)
    # the progress lines show the rate of the last seconds, not the average since the start
    assert re.search(rb"mirror live: \d+ records, \d+ records/s \(last \d+ s\), \d+ s elapsed", progress), progress


def test_status_of_an_unknown_job_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"x\n")
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    assert run(capsys, "mirror", "--from", f"file://{source}", "--to", dest, "--to-topic", "t", "--job", "j")[0] == 0
    code, _, err = run(capsys, "mirror", "status", "--job", "nope", "--to", dest)
    assert code == 1 and "job 'nope' has stored nothing in" in err
    code, _, err = run(capsys, "mirror", "status", "--to", dest)
    assert code == 2 and "--job" in err
    code, _, err = run(capsys, "mirror", "status", "--job", "j", "--to", f"sqlite:///{tmp_path / 'none.db'}")
    assert code == 2 and "no database file" in err


def test_mirror_copies_topics_by_pattern(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    with idempotent.Producer(src, producer_name="writer") as producer:
        for topic in ("eu-orders", "us-orders", "audit"):
            producer.broker.create_topic(topic, 2)
            for i in range(10):
                producer.send(topic, b"%s-%d" % (topic.encode(), i), partition=i % 2)
    argv = ["mirror", "--from", src, "--to", dest, "--topics", ".*-orders", "--to-prefix", "copy.", "--job", "j"]
    code, out, err = run(capsys, *argv, "--no-progress")
    assert code == 0, err
    assert "2 topics (.*-orders)" in out and "copied=20 " in out
    assert sorted(_values(dest, "copy.eu-orders")) == sorted(b"eu-orders-%d" % i for i in range(0, 10, 2))
    code, out, err = run(capsys, "mirror", "status", "--job", "j", "--to", dest, "--from", src)
    assert code == 0 and "eu-orders" in out and "us-orders" in out and "audit" not in out, err
    assert "4 partitions, total lag 0\n" in out
    code, _, err = run(capsys, "mirror", "--from", src, "--to", dest, "--topic", "a", "--topics", "b", "--job", "j")
    assert code == 2 and "not both" in err
