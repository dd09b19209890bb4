"""What the rows of a Spark write carry (pyspark types and pyarrow; no Spark session needed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from idempotent.errors import ConfigError
from idempotent.spark._columns import METADATA_FIELDS, identity_of, unit_runs
from idempotent.spark._options import Options
from idempotent.spark._rerun import FileSplit, Mode

URL = {"url": "sqlite:///x.db", "topic": "t"}


def _metadata(row_index: bool) -> StructField:
    fields = [
        StructField("file_path", StringType()),
        StructField("file_name", StringType()),
        StructField("file_size", LongType()),
        StructField("file_block_start", LongType()),
        StructField("file_block_length", LongType()),
        StructField("file_modification_time", TimestampType()),
    ]
    if row_index:
        fields.append(StructField("row_index", LongType()))
    return StructField("_metadata", StructType(fields))


def _schema(*fields: StructField) -> StructType:
    return StructType([StructField("value", BinaryType()), *fields])


def test_the_columns_choose_how_rows_are_identified() -> None:
    assert identity_of(_schema(), Options(URL)).mode is Mode.PARTITION
    assert identity_of(_schema(_metadata(False)), Options(URL)).mode is Mode.SPLIT
    assert identity_of(_schema(_metadata(True)), Options(URL)).mode is Mode.POSITION
    positions = identity_of(
        _schema(StructField("src", StringType()), StructField("offset", LongType())),
        Options({**URL, "positionColumns": "src, offset"}),
    )
    assert (positions.mode, positions.position_columns) == (Mode.POSITION, ("src", "offset"))


@pytest.mark.parametrize(
    ("fields", "options", "message"),
    [
        ([], {"positionColumns": "n"}, "does not have"),
        ([StructField("n", StringType())], {"positionColumns": "n"}, "must be an integer column"),
        ([StructField("key", LongType())], {"positionColumns": "key"}, "rename it"),
        ([StructField("extra", LongType())], {}, "columns the sink does not write: ['extra']"),
        ([StructField("_metadata", LongType())], {}, "not Spark's file metadata"),
        ([_metadata(True), StructField("n", LongType())], {"positionColumns": "n"}, "not both"),
    ],
)
def test_bad_columns_are_refused_with_the_reason_first(
    fields: list[StructField], options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        identity_of(_schema(*fields), Options({**URL, **options}))
    assert message in str(refused.value).splitlines()[0]
    with pytest.raises(ConfigError, match="no 'value' column"):
        identity_of(StructType([StructField("v", BinaryType())]), Options(URL))


def _metadata_batch(rows: list[tuple[str, int, int]], row_index: bool) -> pa.RecordBatch:
    """Rows of ``(path, block start, row index)``; every file 1000 bytes, blocks of 100."""
    arrays = {
        "file_path": pa.array([r[0] for r in rows]),
        "file_size": pa.array([1000] * len(rows), pa.int64()),
        "file_block_start": pa.array([r[1] for r in rows], pa.int64()),
        "file_block_length": pa.array([100] * len(rows), pa.int64()),
        "file_modification_time": pa.array([5] * len(rows), pa.timestamp("us")),
    }
    if row_index:
        arrays["row_index"] = pa.array([r[2] for r in rows], pa.int64())
    meta = pa.StructArray.from_arrays(list(arrays.values()), names=list(arrays))
    return pa.record_batch([pa.array([b"v"] * len(rows)), meta], names=["value", "_metadata"])


def test_unit_runs_cut_a_batch_where_the_split_or_file_changes() -> None:
    assert "file_block_start" in METADATA_FIELDS
    rows = [("/a", 0, 0), ("/a", 0, 1), ("/a", 100, 7), ("/b", 0, 0)]
    split = identity_of(_schema(_metadata(False)), Options(URL))
    runs = unit_runs(_metadata_batch(rows, False), split, 3)
    assert [(r.start, r.stop, r.split, r.positions) for r in runs] == [
        (0, 2, FileSplit("/a", 0, 100, 1000, 5), None),
        (2, 3, FileSplit("/a", 100, 100, 1000, 5), None),
        (3, 4, FileSplit("/b", 0, 100, 1000, 5), None),
    ]
    assert runs[0].unit == "/a@0+100"
    position = identity_of(_schema(_metadata(True)), Options(URL))
    runs = unit_runs(_metadata_batch(rows, True), position, 3)
    assert [(r.unit, r.start, r.stop, r.ordinals()) for r in runs] == [
        ("/a", 0, 2, [0, 1]),
        ("/a", 2, 3, [7]),
        ("/b", 3, 4, [0]),
    ]
    assert [(r.first, r.last, r.increasing) for r in runs] == [(0, 1, True), (7, 7, True), (0, 0, True)]


def test_unit_runs_of_position_columns_and_of_plain_rows() -> None:
    schema = _schema(StructField("src", StringType()), StructField("offset", LongType()))
    identity = identity_of(schema, Options({**URL, "positionColumns": "src,offset"}))
    batch = pa.record_batch(
        [pa.array([b"v"] * 3), pa.array(["p0", "p0", "p1"]), pa.array([5, 6, 5], pa.int64())],
        names=["value", "src", "offset"],
    )
    runs = unit_runs(batch, identity, 0)
    assert [(r.unit, r.ordinals()) for r in runs] == [('["p0"]', [5, 6]), ('["p1"]', [5])]
    backwards = pa.record_batch(
        [pa.array([b"v"] * 3), pa.array(["p0"] * 3), pa.array([5, 7, 6], pa.int64())], names=["value", "src", "offset"]
    )
    assert not unit_runs(backwards, identity, 0)[0].increasing
    nulls = pa.record_batch(
        [pa.array([b"v"]), pa.array(["p0"]), pa.array([None], pa.int64())], names=["value", "src", "offset"]
    )
    with pytest.raises(ConfigError, match="no position"):
        unit_runs(nulls, identity, 0)
    plain = identity_of(_schema(), Options(URL))
    assert [
        (r.unit, r.stop) for r in unit_runs(pa.record_batch([pa.array([b"v"] * 4)], names=["value"]), plain, 7)
    ] == [("partition:7", 4)]
