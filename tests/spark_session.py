"""The SparkSession and broker-hosts directory shared by the Spark test modules.

Both fixtures may be instantiated once per importing module; they give the same directory (one
per pytest run) and the same session (``getOrCreate``), because Spark's Python workers inherit
the hosts directory from the environment the JVM started with: two directories in one run would
start two broker servers over one SQLite file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def spark(spark_hosts: Path) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")  # 2 threads, a task may fail 3 times
        .appName("idempotent-tests")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    idempotent.spark.register(session)
    yield session
    session.stop()
