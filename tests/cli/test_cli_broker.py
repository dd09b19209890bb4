"""``idempotent broker``: serving a backend over the network."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent import cli
from idempotent.cli import broker as cli_broker
from idempotent.producer.producer import Producer


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


def _serve(url: str, ready: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "idempotent", "broker", "--backend", url, "--listen", "127.0.0.1:0",
         "--ready-file", str(ready)],
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().endswith("\n")):
        assert proc.poll() is None and time.monotonic() < deadline, "the broker did not start"
        time.sleep(0.05)
    return proc, f"idem://{ready.read_text().strip()}"


def test_second_broker_on_a_sqlite_file_takes_over_without_duplicates(tmp_path: Path) -> None:
    """A broker that only read a partition (stats) while another process wrote the file
    rebuilds from what is stored when it becomes the writer, not from what it cached."""
    from idempotent.net.client import RemoteBroker

    url = f"sqlite:///{tmp_path / 'f.db'}"
    first, at_a = _serve(url, tmp_path / "a.ready")
    second = None
    try:
        with Producer(at_a, "n", linger_ms=0) as producer:
            for i in range(5):
                producer.send("t", f"r{i}", partition=0, sequence=i)
        second, at_b = _serve(url, tmp_path / "b.ready")
        with RemoteBroker(at_b) as reader:  # B reads the partition while A writes it
            assert [s.last_sequence for s in reader.stats("t")[0].producers] == [4]
        with Producer(at_a, "n", linger_ms=0) as producer:
            for i in range(5, 10):
                producer.send("t", f"r{i}", partition=0, sequence=i)
        first.kill()  # kill -9
        first.wait(30)
        with Producer(at_b, "n", linger_ms=0) as producer:
            assert producer.last_sequence("t", 0) == 9
            resent = [producer.send("t", f"r{i}", partition=0, sequence=i) for i in range(10)]
            assert producer.flush(30) == 0
            assert all(f.result().duplicate for f in resent)
            assert producer.producer_epoch == 2  # B saw A's second init: the epochs stay ordered
        with RemoteBroker(at_b) as reader:
            assert [r.value for r in reader.read("t", 0, 0, 100)] == [f"r{i}".encode() for i in range(10)]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)


def _parsed(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    cli_broker.add_parser(commands)
    return parser.parse_args(["broker", "--backend", "memory://", *argv])


def test_broker_command_sets_how_long_producers_are_remembered(capsys: pytest.CaptureFixture[str]) -> None:
    default = cli_broker.broker_config(_parsed())
    assert default.producer_record_retention == default.checker.producer_expiry == 7 * 24 * 3600.0
    config = cli_broker.broker_config(
        _parsed("--producer-expiry", "3600", "--producer-record-retention", "86400", "--broker-id", "b1")
    )
    assert (config.checker.producer_expiry, config.producer_record_retention) == (3600.0, 86400.0)
    assert config.broker_id == "b1"
    with pytest.raises(cli.CliError, match="producer_expiry must be positive"):
        cli_broker.broker_config(_parsed("--producer-expiry", "0"))
    assert cli.main(["broker", "--backend", "memory://", "--producer-record-retention", "0"]) == 2
    assert "producer_record_retention must be positive" in capsys.readouterr().err
