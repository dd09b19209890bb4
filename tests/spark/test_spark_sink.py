"""Reruns of a batch job however Spark splits the input, and the sink's errors (marker ``spark``).

The input is a 120,000-row CSV (about 6 MB) or Parquet file; Spark splits it by
``spark.sql.files.maxPartitionBytes`` in the shared session, and by the core count in the
driver programs of tests/spark_jobs.py. A *partial* run fails every attempt of the tasks
that meet a poisoned row, after those tasks stored the rows before it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import idempotent
import idempotent.spark

pytest_plugins = ["tests.spark_session"]  # the fixtures spark and spark_hosts

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

ROWS = 120_000
MIB = 1 << 20
JOBS = Path(__file__).resolve().parents[1] / "spark_jobs.py"
ROOT = Path(__file__).resolve().parents[2]
#: one row in the second and one in the third 2 MiB split of the CSV
POISON = ("60000", "100000")


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "orders.csv"
    with path.open("w") as out:
        for i in range(ROWS):
            out.write(f"{i},customer-{i % 977},order line {i} with some text\n")
    return path


def _parquet(tmp_path: Path) -> Path:
    """Row groups of 5,000 rows, so that Spark can split the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "orders.parquet"
    table = pa.table(
        {"n": [str(i) for i in range(ROWS)], "customer": [f"customer-{i % 977} with some padding" for i in range(ROWS)]}
    )
    pq.write_table(table, path, row_group_size=5_000, compression="none")
    return path


def _values(url: str, topic: str) -> Counter[bytes]:
    """How often each value is stored in ``topic``."""
    counts: Counter[bytes] = Counter()
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        if topic not in broker.topics():
            return counts
        for partition in range(broker.partitions_for(topic, create=False)):
            position = 0
            while records := broker.read(topic, partition, position, 5000):
                counts.update(r.value for r in records if r.value is not None)
                position = records[-1].offset + 1
    return counts


def _exactly_once(counts: Counter[bytes]) -> bool:
    return counts == Counter(str(i).encode() for i in range(ROWS))


def _write(
    spark: Any,
    path: Path,
    url: str,
    job: str,
    max_bytes: int,
    *,
    metadata: bool = False,
    poison: tuple[str, ...] = (),
    **options: str,
) -> None:
    """Write the input's column 0 as value and column 1 as key under ``job``."""
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.files.maxPartitionBytes", str(max_bytes))
    poisoned = set(poison)

    def value(v: str) -> str:
        if v in poisoned:
            raise RuntimeError(f"poisoned row {v}")
        return v

    df = spark.read.csv(str(path)) if path.suffix == ".csv" else spark.read.parquet(str(path))
    first, second = df.columns[:2]
    columns = [F.udf(value, "string")(F.col(first)).alias("value"), F.col(second).alias("key")]
    if metadata:
        columns.append(F.col("_metadata"))
    writer = df.select(*columns).write.format("idempotent").option("url", url).option("topic", "orders")
    for name, setting in options.items():
        writer = writer.option(name, setting)
    try:
        writer.option("job", job).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


def _partial_run(spark: Any, path: Path, url: str, job: str, max_bytes: int, **kwargs: Any) -> int:
    with pytest.raises(Exception, match="poisoned row"):
        _write(spark, path, url, job, max_bytes, poison=POISON, **kwargs)
    stored = sum(_values(url, "orders").values())
    assert 0 < stored < ROWS, f"the poisoned run stored {stored} rows, not part of them"
    return stored


def _first_reason(exc: BaseException) -> str:
    """The first line of a Spark error after Spark's own framing line ("An exception was
    thrown from the Python worker:"), which a failure in a task starts with."""
    lines = str(exc).splitlines()
    return lines[1] if lines[0].startswith("An exception was thrown from the Python worker") else lines[0]


@pytest.mark.parametrize("metadata", [False, True], ids=["plain", "with-metadata"])
def test_finished_job_run_again_with_other_file_splits_stores_nothing(
    spark: Any, tmp_path: Path, metadata: bool
) -> None:
    """Issue 21: the same job at 2 MiB, then at 256 KiB splits, stored 90,690 rows twice."""
    path, url = _csv(tmp_path), f"sqlite:///{tmp_path / 'out.db'}"
    _write(spark, path, url, "nightly-load", 2 * MIB, metadata=metadata)
    assert _exactly_once(_values(url, "orders"))
    _write(spark, path, url, "nightly-load", 256 << 10, metadata=metadata)
    assert _exactly_once(_values(url, "orders"))


def test_partial_job_without_positions_is_refused_with_other_splits_and_completed_with_the_same(
    spark: Any, tmp_path: Path
) -> None:
    path, url = _csv(tmp_path), f"sqlite:///{tmp_path / 'out.db'}"
    stored = _partial_run(spark, path, url, "nightly-load", 2 * MIB)
    with pytest.raises(Exception) as refused:
        _write(spark, path, url, "nightly-load", 256 << 10)
    reason = _first_reason(refused.value)
    assert "stopped part way" in reason and "samePartitioning" in reason, reason
    assert "Traceback" not in str(refused.value)
    assert sum(_values(url, "orders").values()) == stored  # refused before writing anything
    _write(spark, path, url, "nightly-load", 2 * MIB, samePartitioning="true")
    assert _exactly_once(_values(url, "orders"))


def test_partial_job_with_file_metadata_refuses_other_splits_and_completes_with_the_same(
    spark: Any, tmp_path: Path
) -> None:
    path, url = _csv(tmp_path), f"sqlite:///{tmp_path / 'out.db'}"
    stored = _partial_run(spark, path, url, "nightly-load", 2 * MIB, metadata=True)
    with pytest.raises(Exception) as refused:
        _write(spark, path, url, "nightly-load", 256 << 10, metadata=True)
    reason = _first_reason(refused.value)
    assert (
        "partitioning changed" in reason
        and f"maxPartitionBytes and spark.sql.files.openCostInBytes = {2 * MIB}" in (reason)
    ), reason
    assert sum(_values(url, "orders").values()) == stored  # no task wrote anything
    _write(spark, path, url, "nightly-load", 2 * MIB, metadata=True)
    assert _exactly_once(_values(url, "orders"))


def test_partial_parquet_job_is_completed_exactly_with_other_splits(spark: Any, tmp_path: Path) -> None:
    """Parquet rows carry their position (``_metadata.row_index``): a rerun with other splits
    completes the job; a finer one may only refuse what it cannot match, never store twice."""
    path, url = _parquet(tmp_path), f"sqlite:///{tmp_path / 'out.db'}"
    _partial_run(spark, path, url, "parquet-load", 256 << 10, metadata=True)
    try:
        _write(spark, path, url, "parquet-load", 64 << 10, metadata=True)
    except Exception as exc:
        assert "inside that part" in _first_reason(exc), _first_reason(exc)
    assert max(_values(url, "orders").values()) == 1
    _write(spark, path, url, "parquet-load", MIB, metadata=True)
    assert _exactly_once(_values(url, "orders"))
    _write(spark, path, url, "parquet-load", 64 << 10, metadata=True)  # finished: nothing
    assert _exactly_once(_values(url, "orders"))


def _files_job(master: str, url: str, job: str, path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    kind = "csv" if path.suffix == ".csv" else "parquet"
    return subprocess.run(
        [sys.executable, str(JOBS), "files", master, url, "orders", job, kind, str(path), *flags],
        capture_output=True,
        text=True,
        timeout=800,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def test_other_core_counts_store_nothing_twice(spark_hosts: Path, tmp_path: Path) -> None:
    """local[2] then local[4] (the split size follows the cores here): a finished job stores
    nothing again; a Parquet job stopped part way on local[4] is completed on local[2]."""
    csv, url = _csv(tmp_path), f"sqlite:///{tmp_path / 'out.db'}"
    first = _files_job("local[2]", url, "cores-csv", csv)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = _files_job("local[4]", url, "cores-csv", csv)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    splits = [line for out in (first, again) for line in out.stdout.splitlines() if line.startswith("PARTITIONS")]
    assert splits[0] != splits[1], f"the core count did not change the splits: {splits}"
    assert _exactly_once(_values(url, "orders"))

    parquet, url = _parquet(tmp_path), f"sqlite:///{tmp_path / 'parquet.db'}"
    # local[4] makes 4 splits of about 30,000 rows: poison rows well inside two of them
    partial = _files_job("local[4]", url, "cores-parquet", parquet, "--metadata", "--poison", "80000,110000")
    assert partial.returncode == 3 and "poisoned row" in partial.stdout, partial.stdout[-3000:]
    assert 0 < sum(_values(url, "orders").values()) < ROWS
    rerun = _files_job("local[2]", url, "cores-parquet", parquet, "--metadata")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert _exactly_once(_values(url, "orders"))


def test_errors_say_what_is_wrong_on_their_first_line(spark: Any, tmp_path: Path) -> None:
    """Issue 25: the reason used to come after a page of traceback."""
    url = f"sqlite:///{tmp_path / 'out.db'}"
    df = spark.range(0, 10).selectExpr("cast(id as string) as value", "id as extra")
    with pytest.raises(Exception) as planned:  # refused on the driver
        df.write.format("idempotent").option("url", url).option("topic", "t").option("job", "j").mode("append").save()
    reason = _first_reason(planned.value)
    assert "columns the sink does not write: ['extra']" in reason and "drop them" in reason, reason
    assert "Traceback" not in str(planned.value)

    df = spark.range(0, 10).selectExpr("cast(id as string) as value", "cast(id + 5 as int) as partition")
    with pytest.raises(Exception) as failed:  # refused in a task
        df.write.format("idempotent").option("url", url).option("topic", "t2").option("job", "j").option(
            "partitions", "2"
        ).mode("append").save()
    reason = _first_reason(failed.value)
    assert "'partition' column" in reason and "0..1" in reason, reason
    assert "Traceback" not in str(failed.value)

    with pytest.raises(Exception) as missing:
        df.write.format("idempotent").option("url", url).option("topic", "t3").mode("append").save()
    assert "option 'job' is required" in _first_reason(missing.value)


def test_position_columns_identify_rows_across_partitionings(spark: Any, tmp_path: Path) -> None:
    """``positionColumns``: spark.range's id; 4 partitions stopped part way, then 2."""
    from pyspark.sql import functions as F

    url = f"sqlite:///{tmp_path / 'out.db'}"
    poisoned = {"7000", "27000"}

    def value(v: str) -> str:
        if v in poisoned:
            raise RuntimeError(f"poisoned row {v}")
        return v

    def write(partitions: int, poison: bool) -> None:
        column = F.udf(value, "string")(F.col("id").cast("string")) if poison else F.col("id").cast("string")
        df = spark.range(0, 40_000, numPartitions=partitions).select(column.alias("value"), F.col("id").alias("n"))
        df.write.format("idempotent").option("url", url).option("topic", "r").option("job", "range").option(
            "positionColumns", "n"
        ).mode("append").save()

    with pytest.raises(Exception, match="poisoned row"):
        write(4, poison=True)
    assert 0 < sum(_values(url, "r").values()) < 40_000
    write(2, poison=False)
    assert _values(url, "r") == Counter(str(i).encode() for i in range(40_000))
