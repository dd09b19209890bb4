"""Broker faults on the 3-node KRaft cluster (RF 3, ``min.insync.replicas=2``) under two named
:class:`idempotent.Producer` processes, two named confluent-kafka drop-in processes (each
record with its own sequence) and an ``idempotent mirror`` job copying their topic: a rolling
restart of all three nodes (controlled shutdown), kill -9 of a partition leader, kill -9 of
the active controller, and SIGSTOP of one node for longer than the request timeout.

Counted from a plain ``read_committed`` consumer, for each fault: 0 duplicates, 0 losses, 0
reorders, 0 fatal errors, 0 records without an outcome, every record persisted (each fault is
shorter than the delivery timeout), the producers writing again after the fault by
themselves, and the mirror's copy equal to the topic, partition by partition.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import outage_apps

#: a rolling restart of three nodes on a shared 2-core machine takes minutes
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]

PARTITIONS = outage_apps.PARTITIONS
#: records a second of each producer process (four of them, next to three JVMs on 2 cores):
#: a few thousand records each over a fault
RATE = 50


@pytest.fixture
def cluster(kafka_cluster_service: Any) -> Iterator[Any]:
    from idempotent.testing.services import kafka_cluster

    yield kafka_cluster_service
    kafka_cluster.heal()


def _mirror(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "idempotent", *argv], stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ)
        )


def _under_fault(cluster: Any, tmp_path: Path, fault: Callable[[str], None]) -> None:
    """Start the producers and the mirror, run ``fault(topic)`` once all of them write, let
    them write on for a few seconds after it, stop them, and check everything."""
    from idempotent.testing.services import kafka_cluster

    bootstrap = cluster.bootstrap
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, PARTITIONS, 3)
    stop_file = str(tmp_path / "stop")
    tag = uuid.uuid4().hex[:6]
    # the request timeout of the producers (the backend's admin calls, flushes and commits;
    # librdkafka's request.timeout.ms) is 5 s; the delivery timeout the default 120 s
    url = f"{cluster.url}?timeout=5"
    apps = {
        **{f"p{n}{tag}": ("producer", url) for n in range(2)},
        **{f"d{n}{tag}": ("dropin", bootstrap) for n in range(2)},
    }
    ready = {name: tmp_path / f"{name}.ready" for name in apps}
    processes = {
        name: outage_apps.start(
            mode, target, topic, name, 1_000_000, RATE, 120_000, stop_file=stop_file, ready_file=str(ready[name])
        )
        for name, (mode, target) in apps.items()
    }
    job = f"copy-{tag}"
    copy = f"copy-{topic}"
    mirror_argv = ["mirror", "--from", f"kafka+native://{bootstrap}", "--to", f"{cluster.url}?timeout=5",
                   "--topic", topic, "--to-topic", copy, "--job", job, "--no-progress"]  # fmt: skip
    mirror_log = tmp_path / "mirror.log"
    mirror: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 180
        # (not read from the topic: with four producers' transactions open in turn, a
        # read_committed reader only reaches the end once they stop)
        while not all(path.exists() for path in ready.values()):
            assert time.monotonic() < deadline, "the producers did not start writing"
            ended = {name: p for name, p in processes.items() if p.poll() is not None}
            # (only an ended process's output can be read without waiting for the others to end)
            assert not ended, {name: (p.returncode, p.communicate()[1][-3000:]) for name, p in ended.items()}
            time.sleep(0.5)
        mirror = _mirror([*mirror_argv, "--follow"], mirror_log)
        time.sleep(2)
        fault(topic)
        fault_ended = time.monotonic()
        time.sleep(5)  # they write on after the fault, by themselves
        Path(stop_file).touch()
        results = {name: outage_apps.result_of(process, 400) for name, process in processes.items()}
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(120) == 0, mirror_log.read_text()[-3000:]
    finally:
        Path(stop_file).touch()
        for process in [*processes.values(), *([mirror] if mirror is not None else [])]:
            if process.poll() is None:
                process.kill()
                process.wait(30)
    stored = outage_apps.read_all(bootstrap, topic)
    counts = outage_apps.check(results, stored)
    bad = {k: v for k, v in counts.items() if k not in ("persisted", "reported duplicates") and v}
    summary = {n: {k: r[k] for k in ("errors", "send_errors", "sent", "longest_gap")} for n, r in results.items()}
    assert not bad, (bad, summary)
    for name, result in results.items():
        assert result["not_persisted"] == [] and result["possibly_persisted"] == [], (name, summary[name])
        assert len(result["persisted"]) == result["sent"], (name, summary[name])
        assert "a bug" not in result["log"] and "Traceback" not in result["log"], result["log"][-3000:]
        # producing resumed by itself: records were acknowledged after the fault ended
        assert result["last_acked_at"] is not None and result["last_acked_at"] > fault_ended, (name, summary[name])
    # the mirror's copy, finished by one more run, is the topic, partition by partition
    final = subprocess.run([sys.executable, "-m", "idempotent", *mirror_argv], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert final.returncode == 0, final.stderr[-3000:]
    copied = outage_apps.read_all(bootstrap, copy)
    for partition in range(PARTITIONS):
        want = [v for p, v in stored if p == partition]
        got = [v for p, v in copied if p == partition]
        assert got == want, (partition, len(got), len(want))
    log = mirror_log.read_text()
    assert "a bug" not in log and "Traceback" not in log, log[-3000:]
    print({"persisted": counts["persisted"], **{n: round(r["longest_gap"], 1) for n, r in results.items()}})


def test_a_rolling_restart_of_all_three_nodes(cluster: Any, tmp_path: Path) -> None:
    from idempotent.testing.services import kafka_cluster

    _under_fault(cluster, tmp_path, lambda topic: kafka_cluster.rolling_restart())


def test_kill9_of_a_partition_leader(cluster: Any, tmp_path: Path) -> None:
    from idempotent.testing.services import kafka_cluster

    def fault(topic: str) -> None:
        leader = kafka_cluster.leader_of(topic, 0)
        kafka_cluster.kill9(leader)
        time.sleep(8)  # past the session timeout: the controller fences it, leaders move
        kafka_cluster.start(leader)

    _under_fault(cluster, tmp_path, fault)


def test_kill9_of_the_active_controller(cluster: Any, tmp_path: Path) -> None:
    from idempotent.testing.services import kafka_cluster

    def fault(topic: str) -> None:
        controller = kafka_cluster.active_controller()
        kafka_cluster.kill9(controller)
        time.sleep(8)
        kafka_cluster.start(controller)

    _under_fault(cluster, tmp_path, fault)


def test_a_node_paused_past_the_request_timeout(cluster: Any, tmp_path: Path) -> None:
    from idempotent.testing.services import kafka_cluster

    def fault(topic: str) -> None:
        node = kafka_cluster.leader_of(topic, 1)
        kafka_cluster.pause(node)
        try:
            time.sleep(15)  # the producers' request timeout is 5 s
        finally:
            kafka_cluster.resume(node)

    _under_fault(cluster, tmp_path, fault)
