"""The SparkSession, standalone cluster and broker-hosts directory shared by the Spark tests.

The fixtures may be instantiated once per importing module; they give the same directory (one
per pytest run) and the same session (``getOrCreate``), because Spark's Python workers inherit
the hosts directory from the environment the JVM started with: two directories in one run would
start two broker servers over one SQLite file.

``spark`` is a local-mode session; a test parametrised with :data:`LOCAL_AND_CLUSTER` runs on
it and again on a session whose master is :func:`spark_cluster` (a standalone master and two
workers, executors in their own JVMs and working directories). pytest groups the tests of each
kind, so the session switches once. The cluster starts once per run and leaves each worker a
core for a second application (a driver subprocess, as in the speculation test).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import idempotent.spark


@pytest.fixture(scope="session")
def spark_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A hosts directory for this run; every host started in it is stopped at the end."""
    path = tmp_path_factory.getbasetemp() / "spark-hosts"
    path.mkdir(exist_ok=True)
    os.environ["IDEMPOTENT_SPARK_HOSTS"] = str(path)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    yield path
    for pid_file in path.glob("*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


ROOT = Path(__file__).resolve().parent.parent

#: per application on :func:`spark_cluster`: one one-core executor on each worker
CLUSTER_APP_CONF = {"spark.cores.max": "2", "spark.executor.cores": "1", "spark.executor.memory": "512m"}

#: run a test that takes ``spark`` in local mode and on the standalone cluster
LOCAL_AND_CLUSTER = pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)


@dataclass(frozen=True)
class StandaloneCluster:
    """A running standalone cluster: its master URL and the workers' directory (where each
    executor's working directory is)."""

    master: str
    work: Path


@pytest.fixture(scope="session")
def spark_cluster(spark_hosts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark standalone master and two two-core workers on two loopback addresses.

    Spark never starts a speculative copy on a host that runs an attempt of the task, and
    local mode has one host (and no speculation), so speculation needs two hosts: workers
    on 127.0.0.1 and 127.0.0.2 count as two. Each worker has two cores so that two
    applications of :data:`CLUSTER_APP_CONF` (the ``spark`` fixture's and a driver
    subprocess's) each get one executor per worker.
    """
    import pyspark

    base = tmp_path_factory.mktemp("spark-cluster")
    home = Path(pyspark.__file__).parent
    env = {
        **os.environ,  # with IDEMPOTENT_SPARK_HOSTS (spark_hosts), which executors inherit
        "SPARK_HOME": str(home),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_WORKER_DIR": str(base / "work"),
        "SPARK_LOG_DIR": str(base / "logs"),
    }
    port = _free_port()
    spark_class = str(home / "bin" / "spark-class")
    log = open(base / "cluster.log", "wb")  # noqa: SIM115 - closed below
    processes = [
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", *("--host", "127.0.0.1", "--port", str(port))],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ]
    try:
        for host in ("127.0.0.1", "127.0.0.2"):
            worker = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "2"]
            processes.append(
                subprocess.Popen(
                    [*worker, "--memory", "1536m", f"spark://127.0.0.1:{port}"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield StandaloneCluster(f"spark://127.0.0.1:{port}", base / "work")
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
        log.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest, spark_hosts: Path) -> Iterator[Any]:
    """A SparkSession: local mode (2 threads, a task may fail 3 times), or, parametrised
    ``"cluster"`` (:data:`LOCAL_AND_CLUSTER`), on :func:`spark_cluster` (a task may fail 3
    times too)."""
    from pyspark.sql import SparkSession

    where = getattr(request, "param", "local")
    builder = SparkSession.builder
    if where == "cluster":
        cluster: StandaloneCluster = request.getfixturevalue("spark_cluster")
        builder = builder.master(cluster.master).config("spark.task.maxFailures", "4")
        for key, value in CLUSTER_APP_CONF.items():
            builder = builder.config(key, value)
        builder = builder.config("spark.executorEnv.PYTHONPATH", str(ROOT)).config(
            "spark.executorEnv.IDEMPOTENT_SPARK_HOSTS", str(spark_hosts)
        )
    else:
        builder = builder.master("local[2,4]")
    session = (
        builder.appName(f"idempotent-tests-{where}")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    idempotent.spark.register(session)
    yield session
    session.stop()
