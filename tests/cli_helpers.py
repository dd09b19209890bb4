"""What the CLI tests share: running the command, reading what it stored, killing it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import idempotent
from idempotent import cli
from idempotent.cli.produce import GENERATED_PREFIX, _filler

FILLER = _filler(100 - GENERATED_PREFIX)


def generated(i: int) -> bytes:
    return b"record-%012d%s" % (i, FILLER)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def summary(out: str) -> dict[str, int]:
    """The sent/skipped/duplicates counts of produce's summary line."""
    line = out.strip().splitlines()[-1]
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return {k: int(fields[k]) for k in ("sent", "skipped", "duplicates")}


def read_all(url: str, topic: str) -> dict[int, list[idempotent.StoredRecord]]:
    """Every record of every partition, through a read-only broker."""
    broker = cli.open_read_only(url)
    try:
        out = {}
        for p in range(broker.partitions_for(topic, create=False)):
            records, offset = [], 0
            while batch := broker.read(topic, p, offset, 5000):
                records.extend(batch)
                offset = batch[-1].offset + 1
            out[p] = records
        return out
    finally:
        broker.close()


def stored_count(url: str, topic: str) -> int:
    """Records stored so far. A fresh broker each time: a backend caches end offsets."""
    try:
        broker = cli.open_read_only(url)
    except (cli.CliError, idempotent.ProducerError):
        return 0
    try:
        if topic not in broker.topics():
            return 0
        return sum(broker.end_offset(topic, p) for p in range(broker.partitions_for(topic, create=False)))
    finally:
        broker.close()


def assert_exactly_once(
    url: str, topic: str, expected: list[bytes], partitions: int
) -> dict[int, list[idempotent.StoredRecord]]:
    """Every expected record stored once, record i at partition i % P with sequence i // P,
    and the sequences of each partition 0..n-1 in offset order."""
    logs = read_all(url, topic)
    assert sorted(logs) == list(range(partitions))
    values = Counter(r.value for records in logs.values() for r in records)
    assert sum(values.values()) == len(expected)
    assert values == Counter(expected), "some record is missing or stored twice"
    for p, records in logs.items():
        assert [r.offset for r in records] == list(range(len(records)))
        assert [r.sequence for r in records] == list(range(len(records)))
        assert [r.value for r in records] == expected[p::partitions]
        assert len({r.producer_id for r in records}) <= 1
    return logs


def spawn_produce(*argv: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "idempotent", "produce", *argv, "--no-progress"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def kill_when_stored(proc: subprocess.Popen[bytes], url: str, topic: str, at_least: int, total: int) -> int:
    """kill -9 ``proc`` once at least ``at_least`` records are stored; return the count then."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"producer ended before the kill (rc={proc.returncode}): {out!r} {err!r}")
        count = stored_count(url, topic)
        if count >= at_least:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            assert proc.returncode == -signal.SIGKILL
            after = stored_count(url, topic)
            assert 0 < after < total, "the kill came too late to test resumption"
            return after
        time.sleep(0.02)
    proc.kill()
    pytest.fail("no record was stored in time")


def finish(argv: list[str], cwd: Path) -> tuple[dict[str, int], str]:
    done = subprocess.run(
        [sys.executable, "-m", "idempotent", "produce", *argv, "--no-progress"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return summary(done.stdout), done.stdout
