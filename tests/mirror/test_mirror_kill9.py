"""kill -9 proof of ``idempotent mirror``: at least 20 kills per pair at seeded random
moments, against the real brokers, then the destination equals the source exactly."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idempotent.testing import mirror_kill
from idempotent.testing.services import ServiceInfo

KILLS = 20
#: Records the source grows by per round against Kafka and Pulsar, where a run's start-up
#: (connecting, fencing the previous run) is most of its time.
BROKER_ROUND = 1200


def _run(pair: mirror_kill.Pair, tmp_path: Path, seed: int, max_delay: float, per_round: int = 3000) -> None:
    try:
        report = mirror_kill.kill_rounds(
            pair, kills=KILLS, seed=seed, max_delay=max_delay, workdir=tmp_path, per_round=per_round
        )
    finally:
        pair.close_source()
    print(report)
    assert report.kills == KILLS
    assert report.mid_copy >= KILLS // 2, report  # the kills hit copies under way, not only start-ups


def test_file_to_sqlite(tmp_path: Path) -> None:
    _run(mirror_kill.file_pair(tmp_path, f"sqlite:///{tmp_path / 'd.db'}"), tmp_path, 1, 1.2)


def test_sqlite_to_sqlite(tmp_path: Path) -> None:
    pair = mirror_kill.topic_pair(
        "sqlite-sqlite", f"sqlite:///{tmp_path / 's.db'}", f"sqlite:///{tmp_path / 'd.db'}", 3
    )
    _run(pair, tmp_path, 2, 1.2)


@pytest.mark.kafka
def test_plain_kafka_to_kafka(tmp_path: Path, kafka_service: ServiceInfo) -> None:
    _run(mirror_kill.kafka_native_pair(kafka_service.bootstrap, kafka_service.url, 3), tmp_path, 3, 2.5, BROKER_ROUND)


@pytest.mark.pulsar
def test_plain_pulsar_to_pulsar(tmp_path: Path, pulsar_service: ServiceInfo) -> None:
    assert pulsar_service.admin_url is not None
    destination = f"{pulsar_service.url}?admin_url={pulsar_service.admin_url}"
    pair = mirror_kill.pulsar_native_pair(pulsar_service.bootstrap, pulsar_service.admin_url, destination, 3)
    _run(pair, tmp_path, 4, 2.5, BROKER_ROUND)


@pytest.mark.kafka
@pytest.mark.pulsar
def test_kafka_to_pulsar(tmp_path: Path, kafka_service: ServiceInfo, pulsar_service: ServiceInfo) -> None:
    pulsar = f"{pulsar_service.url}?admin_url={pulsar_service.admin_url}"
    _run(mirror_kill.topic_pair("kafka-pulsar", kafka_service.url, pulsar, 2), tmp_path, 5, 2.5, BROKER_ROUND)


@pytest.mark.kafka
@pytest.mark.pulsar
def test_pulsar_to_kafka(tmp_path: Path, kafka_service: ServiceInfo, pulsar_service: ServiceInfo) -> None:
    pulsar = f"{pulsar_service.url}?admin_url={pulsar_service.admin_url}"
    _run(mirror_kill.topic_pair("pulsar-kafka", pulsar, kafka_service.url, 2), tmp_path, 6, 2.5, BROKER_ROUND)


def test_destination_broker_server_killed_during_a_copy(tmp_path: Path) -> None:
    """The destination ``idempotent broker`` (idem://) is killed -9 three times while a copy
    runs; the copy retries, resumes from the restarted server, and ends exact."""
    port = _free_port()
    backend = f"sqlite:///{tmp_path / 'server.db'}"
    destination = f"idem://127.0.0.1:{port}"
    pair = mirror_kill.topic_pair("sqlite-idem", f"sqlite:///{tmp_path / 's.db'}", destination, 2)
    server = _server(backend, port)
    try:
        pair.add(30_000)
        copy = subprocess.Popen(
            [sys.executable, "-m", "idempotent", *pair.argv("job"), "--progress-interval", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        rng = random.Random(7)
        for _ in range(3):
            time.sleep(rng.uniform(0.3, 1.5))
            server.send_signal(signal.SIGKILL)
            server.wait(10)
            server = _server(backend, port)
        _, err = copy.communicate(timeout=240)
        assert copy.returncode == 0, err.decode()[-3000:]
        pair.check()
    finally:
        pair.close_source()
        server.kill()
        server.wait(10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server(backend: str, port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "idempotent", "broker", "--backend", backend, "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.05)
    server.kill()
    raise AssertionError("the broker server did not start")
