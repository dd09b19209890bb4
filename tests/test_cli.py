"""The ``idempotent`` command line: produce (resumable), tail, stats, errors."""

from __future__ import annotations

import functools
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import idempotent
from adapters.memory import MemoryBackend, reset_store
from idempotent import cli
from idempotent.producer import Producer

FILLER = cli._filler(100 - cli.GENERATED_PREFIX)


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


# -- produce, tail, stats ------------------------------------------------------------------


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

    monkeypatch.setattr(cli.time, "sleep", interrupt)
    code, out, err = run(capsys, "tail", url, "t", "--follow")
    assert code == 0, err
    assert len(out.splitlines()) == 3
    assert sleeps == [cli.FOLLOW_INTERVAL]


def test_stats_of_an_empty_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    idempotent.connect(url).close()
    code, out, _ = run(capsys, "stats", url)
    assert code == 0
    assert out.startswith("no topics")
    assert run(capsys, "stats", url, "--json")[1].strip() == "[]"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"idempotent {idempotent.__version__}"


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["produce", "sqlite:///{db}", "t", "--file", "{tmp}/missing.txt"], "no such file"),
        (["produce", "sqlite:///{db}", "t", "--file", "-"], "not supported"),
        (["produce", "ftp://host/x", "t", "--generate", "5"], "unknown backend URL scheme 'ftp'"),
        (["produce", "sqlite:///{tmp}/no/dir.db", "t", "--generate", "5"], "does not exist"),
        (["produce", "sqlite:///{db}", "t", "--generate", "lots"], "'lots' is not an integer"),
        (["produce", "sqlite:///{db}", "t", "--generate", "-1"], "at least 0"),
        (["produce", "sqlite:///{db}", "t", "--generate", "5", "--size", "3"], "at least 19"),
        (["produce", "sqlite:///{db}", "t"], "one of the arguments --file --generate is required"),
        (["produce", "sqlite:///{db}", "bad topic", "--generate", "5"], "invalid topic name"),
        (["produce", "sqlite:///{db}", "t", "--generate", "5", "--max-in-flight", "9999"], "max_in_flight"),
        (["tail", "sqlite:///{db}", "unknown"], "unknown topic 'unknown'"),
        (["tail", "sqlite:///{tmp}/nothing.db", "t"], "no database file"),
        (["tail", "sqlite:///{db}", "t", "--partition", "7"], "partitions 0..0"),
        (["tail", "sqlite:///{db}", "t", "--offset", "1", "--from-beginning"], "not allowed with"),
        (["stats", "sqlite:///{db}", "unknown"], "unknown topic 'unknown'"),
        (["stats", "kafka"], "unknown backend URL scheme"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    db = tmp_path / "log.db"
    with idempotent.connect(f"sqlite:///{db}") as broker:
        broker.create_topic("t", 1)
    code, out, err = run(capsys, *(a.format(db=db, tmp=tmp_path) for a in argv))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "nothing.db").exists()


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "produce" in err and "tail" in err and "stats" in err


def test_services_without_the_module(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def missing(name: str) -> object:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(cli.importlib, "import_module", missing)
    code, _, err = run(capsys, "services", "up", "kafka")
    assert code == 2
    assert err.startswith("error: the services command is not available")


def test_services_delegates_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    class Module:
        @staticmethod
        def main(argv: list[str]) -> int:
            seen.append(argv)
            return 3

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: Module)
    assert cli.main(["services", "--help", "up", "-x"]) == 3
    assert seen == [["--help", "up", "-x"]]


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
            cli, "Producer", functools.partial(Producer, delivery_timeout_ms=300, request_timeout_ms=100)
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


# -- resumption after kill -9 --------------------------------------------------------------


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


# -- broker server -------------------------------------------------------------------------


def test_broker_command_serves_and_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "idempotent", "broker", "--backend", url, "--listen", "127.0.0.1:0",
         "--ready-file", str(ready), "--metrics-listen", f"127.0.0.1:{metrics_port}"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().endswith("\n")):
            assert proc.poll() is None and time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.05)
        address = ready.read_text().strip()
        with Producer(f"idem://{address}", "cli-served") as producer:
            assert producer.send("t", b"over the wire").result().offset == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
            scraped = page.read().decode()
        assert 'idempotent_produce_requests_total{outcome="ACCEPTED",topic="t"} 1.0' in scraped
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stderr is not None and f"idem://{address}" in proc.stderr.read()
    with idempotent.connect(url) as broker:
        assert [r.value for r in broker.read("t", 0)] == [b"over the wire"]
        assert broker.stats("t")[0].snapshot_position == 1  # closed cleanly: a final snapshot


def test_broker_command_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["broker", "--backend", "memory://", "--listen", "nohost"]) == 2
    assert "host:port" in capsys.readouterr().err
    assert cli.main(["broker", "--backend", "memory://", "--tls-key", "k.pem"]) == 2
    assert cli.main(["broker", "--backend", "idem://127.0.0.1:1"]) == 2


# -- admin ---------------------------------------------------------------------------------


def _admin_db(tmp_path: Path) -> str:
    """A database with topics ``t`` (2 partitions) and ``a/b/t``, written by named producers."""
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.connect(url) as broker:
        broker.create_topic("t", 2)
        with Producer(broker, "orders-copy") as producer:
            for i in range(6):
                producer.send("t", b"%d" % i, partition=i % 2)
            producer.send("a/b/t", b"x")
        with Producer(broker) as anonymous:
            anonymous.send("t", b"y", partition=1)
    return url


def _effective(url: str, topic: str) -> tuple[bool, str]:
    broker = cli.open_read_only(url)
    try:
        assert isinstance(broker, idempotent.Broker)
        return broker.deduplication_enabled(topic), broker.policy_for(topic).value
    finally:
        broker.close()


def test_admin_set_deduplication_at_every_level(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _admin_db(tmp_path)
    assert _effective(url, "t") == (True, "strict")

    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "t", "--disable")
    assert (code, out, err) == (0, "topic 't': deduplication disabled\n", "")
    assert _effective(url, "t") == (False, "strict")
    assert _effective(url, "a/b/t") == (True, "strict")

    # a namespace ends in '/': the namespace of 'a/b/t' is 'a/b'
    code, out, err = run(capsys, "admin", "set-deduplication", "a/b/", "--policy", "monotonic", "--url", url, "--json")
    assert code == 0, err
    assert json.loads(out) == {"target": "namespace", "name": "a/b", "policy": "monotonic"}
    assert _effective(url, "a/b/t") == (True, "monotonic")
    assert _effective(url, "t") == (False, "strict")

    # '/' is the root namespace: names without '/'; the topic's own setting still wins
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "/", "--enable", "--policy", "monotonic")
    assert (code, out) == (0, "root namespace: deduplication enabled, policy monotonic\n"), err
    assert _effective(url, "t") == (False, "monotonic")
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "t", "--clear")
    assert (code, out) == (0, "topic 't': deduplication cleared\n"), err
    assert _effective(url, "t") == (True, "monotonic")

    # the broker-wide default applies where no topic or namespace setting does
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "--broker", "--disable")
    assert (code, out) == (0, "broker default: deduplication disabled\n"), err
    assert _effective(url, "a/b/t") == (False, "monotonic")
    assert _effective(url, "t") == (True, "monotonic")
    for argv in (["/", "--clear", "--policy", "clear"], ["a/b/", "--policy", "clear"], ["--broker", "--clear"]):
        assert run(capsys, "admin", "--url", url, "set-deduplication", *argv)[0] == 0
    assert _effective(url, "t") == (True, "strict") and _effective(url, "a/b/t") == (True, "strict")

    # a topic that does not exist yet only with --allow-unknown; it applies once created
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "new", "--disable", "--allow-unknown")
    assert code == 0, err
    with idempotent.connect(url) as broker:
        s = broker.init_producer()
        for _ in range(2):  # the resend is stored again: deduplication is off on 'new'
            assert (
                broker.produce("new", 0, s.producer_id, s.producer_epoch, 0, [b"v"]).outcome
                is idempotent.Outcome.ACCEPTED
            )
        assert broker.end_offset("new", 0) == 2


def test_admin_changes_reach_a_running_broker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # memory:// stores are shared in one process, like a Kafka or Pulsar cluster between processes
    name = uuid.uuid4().hex
    reset_store(name)
    url = f"memory://{name}"
    monkeypatch.setenv(cli.URL_ENV, url)  # the URL from the environment
    running = idempotent.Broker(MemoryBackend(url), idempotent.BrokerConfig(maintenance_interval=0))
    try:
        s = running.init_producer()
        accepted = idempotent.Outcome.ACCEPTED
        assert running.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is accepted
        code, out, err = run(capsys, "admin", "set-deduplication", "t", "--disable")
        assert (code, out) == (0, "topic 't': deduplication disabled\n"), err
        assert running.deduplication_enabled("t")  # stored in the backend, not read yet
        running.maintain()  # the maintenance sweep (every maintenance_interval) reloads the settings
        assert not running.deduplication_enabled("t")
        assert running.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is accepted
    finally:
        running.close()


def test_admin_change_on_a_database_a_broker_holds_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _admin_db(tmp_path)
    with idempotent.connect(url) as holder:  # one writer per SQLite database: changes go through it
        holder.create_topic("other", 1)  # it locks the database at its first write
        code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "t", "--disable")
        assert (code, out) == (2, "")
        assert "is being written by another process" in err
        assert run(capsys, "admin", "--url", url, "stats", "t")[0] == 0  # reads still work
    assert _effective(url, "t") == (True, "strict")


def test_admin_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _admin_db(tmp_path)
    code, out, err = run(capsys, "admin", "--url", url, "stats", "t")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "topic t: 2 partition(s), deduplication on, policy strict, 2 ready, 0 recovering"
    assert "t[0]: ready, dedup on, policy strict" in lines
    assert "t[1]: ready, dedup on, policy strict" in lines
    assert any("snapshot at 4" in line for line in lines)  # the broker snapshotted at close
    assert ["0", "orders-copy", "0", "2", "2"] in [line.split() for line in lines]  # id name epoch last_seq last_offset

    run(capsys, "admin", "--url", url, "set-deduplication", "t", "--disable", "--policy", "monotonic")
    code, out, err = run(capsys, "admin", "--url", url, "stats", "t", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert {k: stats[k] for k in ("topic", "partitions", "deduplication", "policy", "ready", "recovering")} == {
        "topic": "t",
        "partitions": 2,
        "deduplication": False,
        "policy": "monotonic",
        "ready": 2,
        "recovering": 0,
    }
    p1 = stats["partition_stats"][1]
    assert (p1["partition"], p1["status"], p1["position"], p1["snapshot_position"]) == (1, "ready", 4, 4)
    assert [(p["producer_name"], p["last_sequence"], p["last_offset"]) for p in p1["producers"]] == [
        ("orders-copy", 2, 2),
        (None, 0, 3),
    ]


def test_admin_describe_producers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _admin_db(tmp_path)
    with idempotent.connect(url) as broker:  # a restart of the named producer bumps its epoch
        broker.init_producer("orders-copy")
    code, out, err = run(capsys, "admin", "--url", url, "describe-producers", "t")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == [
        "PARTITION", "PRODUCER_ID", "NAME", "EPOCH", "LAST_SEQUENCE", "LAST_OFFSET", "LAST_TIMESTAMP"
    ]  # fmt: skip
    cells = [row.split() for row in rows]
    assert [c[:6] for c in cells] == [
        ["0", "0", "orders-copy", "0", "2", "2"],  # the epoch of its last stored batch
        ["1", "0", "orders-copy", "0", "2", "2"],
        ["1", "1", "-", "0", "0", "3"],
    ]
    assert all(c[6].endswith("+00:00") and c[6][:2] == "20" for c in cells)

    code, out, err = run(capsys, "admin", "--url", url, "describe-producers", "t", "--partition", "1", "--json")
    assert code == 0, err
    rows_json = json.loads(out)
    assert [(r["partition"], r["producer_id"], r["producer_name"], r["last_offset"]) for r in rows_json] == [
        (1, 0, "orders-copy", 2),
        (1, 1, None, 3),
    ]
    assert isinstance(rows_json[0]["last_timestamp"], float)

    with idempotent.connect(url) as broker:
        broker.create_topic("empty", 1)
    code, out, err = run(capsys, "admin", "--url", url, "describe-producers", "empty")
    assert (code, out) == (0, "no producers tracked on topic empty\n"), err


def test_admin_reads_never_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    broker = idempotent.connect(url)
    with Producer(broker, "w") as producer:
        for i in range(20):
            producer.send("t", b"%d" % i)
    broker.abandon()  # no snapshot at close: the reader recovers from the log
    broker.backend.close()

    def rows() -> list[tuple[object, ...]]:
        with sqlite3.connect(tmp_path / "log.db") as db:
            return (
                db.execute("SELECT topic, partition, position FROM snapshots").fetchall()
                + db.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
            )

    before = rows()
    assert run(capsys, "admin", "--url", url, "stats", "t")[0] == 0
    assert run(capsys, "admin", "--url", url, "describe-producers", "t", "--json")[0] == 0
    assert rows() == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set-deduplication", "nope", "--enable"], "unknown topic 'nope'"),
        (["set-deduplication", "t", "--policy", "lenient"], "unknown policy 'lenient'"),
        (["set-deduplication", "t", "--enable", "--disable"], "not allowed with"),
        (["set-deduplication", "t"], "nothing to change"),
        (["set-deduplication", "--enable"], "give a TOPIC, a NAMESPACE/"),
        (["set-deduplication", "t", "--broker", "--enable"], "not both"),
        (["set-deduplication", "a//", "--enable"], "invalid namespace 'a//'"),
        (["set-deduplication", "bad topic", "--enable"], "invalid topic name"),
        (["stats", "nope"], "unknown topic 'nope'"),
        (["stats", "bad topic"], "invalid topic name"),
        (["describe-producers", "nope"], "unknown topic 'nope'"),
        (["describe-producers", "t", "--partition", "2"], "partitions 0..1, not 2"),
        (["describe-producers", "t", "--partition", "-1"], "at least 0"),
        (["rename", "t"], "invalid choice"),
        ([], "required: ADMIN_COMMAND"),
    ],
)
def test_admin_refusals_are_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.connect(url) as broker:
        broker.create_topic("t", 2)
    code, out, err = run(capsys, "admin", "--url", url, *argv)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err
    with idempotent.connect(url) as broker:  # nothing changed
        assert broker.topics() == {"t": 2}
        assert isinstance(broker, idempotent.Broker)
        assert broker.deduplication_enabled("t") and broker.policy_for("t").value == "strict"


@pytest.mark.parametrize(
    "command", [["stats", "t"], ["describe-producers", "t"], ["set-deduplication", "t", "--enable"]]
)
def test_admin_needs_a_url_and_an_existing_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.delenv(cli.URL_ENV, raising=False)
    code, out, err = run(capsys, "admin", *command)
    assert (code, out) == (2, "")
    assert err == f"error: no broker URL: give --url URL or set {cli.URL_ENV}\n"
    missing = tmp_path / "missing.db"
    monkeypatch.setenv(cli.URL_ENV, f"sqlite:///{missing}")
    code, out, err = run(capsys, "admin", *command)
    assert (code, out) == (2, "")
    assert "no database file" in err
    assert not missing.exists()  # not created by a typo


def test_admin_backend_failure_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.connect(url) as broker:
        broker.create_topic("t", 1)
    (tmp_path / "log.db").write_bytes(b"not a database" * 100)
    code, out, err = run(capsys, "admin", "--url", url, "stats", "t")
    assert (code, out) == (1, "")
    assert err.startswith("error: ") and "Traceback" not in err


@pytest.mark.kafka
def test_admin_next_to_a_running_kafka_broker(kafka_service: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from idempotent.testing.conformance import small_config, topic_name

    url = kafka_service.url
    running = idempotent.connect(url, small_config())
    topic = topic_name("admin")
    try:
        running.create_topic(topic, 1)
        s = running.init_producer("admin-test")
        accepted = idempotent.Outcome.ACCEPTED
        assert running.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b"]).outcome is accepted
        # reads open Kafka read-only: the running broker keeps its partition
        code, out, err = run(capsys, "admin", "--url", url, "describe-producers", topic, "--json")
        assert code == 0, err
        assert [(r["producer_name"], r["last_sequence"], r["last_offset"]) for r in json.loads(out)] == [
            ("admin-test", 1, 1)
        ]
        code, out, err = run(capsys, "admin", "--url", url, "stats", topic)
        assert code == 0, err
        assert out.startswith(f"topic {topic}: 1 partition(s), deduplication on, policy strict, 1 ready")
        assert running.produce(topic, 0, s.producer_id, s.producer_epoch, 2, [b"c"]).outcome is accepted
        # a change goes through the Kafka metadata log; the running broker reloads it in its sweep
        code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", topic, "--policy", "monotonic")
        assert (code, out) == (0, f"topic {topic!r}: policy monotonic\n"), err
        assert isinstance(running, idempotent.Broker)
        running.maintain()
        assert running.policy_for(topic).value == "monotonic"
        gap = running.produce(topic, 0, s.producer_id, s.producer_epoch, 10, [b"d"])
        assert gap.outcome is accepted  # monotonic: holes allowed
    finally:
        running.close()
