"""What the rows of a write carry, and how they are cut into units (docs/spark.md, Columns).

:func:`identity_of` checks a write's columns on the driver and picks how its rows are
identified across runs (:class:`~idempotent.spark._rerun.Mode`); :func:`unit_runs` cuts each
Arrow batch of a task into runs of rows of one unit (a file split, a file, a source unit).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType, StructType

from ..errors import ConfigError
from ._options import Options
from ._rerun import FileSplit, Mode

WRITE_COLUMNS = {"value", "key", "partition", "headers", "topic"}
METADATA = "_metadata"
METADATA_FIELDS = ("file_path", "file_block_start", "file_block_length", "file_size", "file_modification_time")


@attrs.frozen
class Identity:
    """Where a batch write's rows come from, as its columns and options say (driver)."""

    mode: Mode
    #: ``positionColumns``: unit columns, then the ordinal column
    position_columns: tuple[str, ...] = ()
    #: a ``_metadata`` column (file reads): split mode, or position mode with ``row_index``
    metadata: bool = False


def identity_of(schema: StructType, options: Options) -> Identity:
    """Check a write's columns and decide how its rows are identified.

    Raises:
        ConfigError: no ``value`` column, a column the sink does not know, a malformed
            ``_metadata`` column, or ``positionColumns`` naming missing or unusable columns.
    """
    fields = {field.name: field for field in schema.fields}
    if "value" not in fields:
        raise ConfigError(
            f"the DataFrame has no 'value' column (it has {sorted(fields)}): select or alias one, binary or string"
        )
    positions = tuple(options.position_columns)
    for name in positions:
        if name not in fields:
            raise ConfigError(f"option 'positionColumns' names {name!r}, which the DataFrame does not have")
        if name in WRITE_COLUMNS - {"topic"}:
            raise ConfigError(
                f"option 'positionColumns' names {name!r}, which the sink writes: rename it (withColumnRenamed)"
            )
    if positions and not isinstance(fields[positions[-1]].dataType, LongType | IntegerType | ShortType | ByteType):
        raise ConfigError(
            f"the last of 'positionColumns', {positions[-1]!r}, is the ordinal and must be an integer column, "
            f"not {fields[positions[-1]].dataType.simpleString()}"
        )
    unknown = set(fields) - WRITE_COLUMNS - set(positions) - {METADATA}
    if unknown:
        raise ConfigError(
            f"the DataFrame has columns the sink does not write: {sorted(unknown)}; drop them, or rename them to "
            "value, key, partition or headers (docs/spark.md, Columns)"
        )
    metadata = METADATA in fields
    if metadata:
        kind = fields[METADATA].dataType
        names = set(kind.fieldNames()) if isinstance(kind, StructType) else set()
        if not names.issuperset(METADATA_FIELDS):
            raise ConfigError(
                f"column {METADATA!r} is not Spark's file metadata (it needs {', '.join(METADATA_FIELDS)}): "
                "select '_metadata' of a file read, or rename the column"
            )
        if positions:
            raise ConfigError("give either a '_metadata' column or option 'positionColumns', not both")
        mode = Mode.POSITION if "row_index" in names else Mode.SPLIT
        return Identity(mode, metadata=True)
    return Identity(Mode.POSITION if positions else Mode.PARTITION, positions)


def binary_column(batch: Any, name: str) -> list[bytes | None]:
    """Column ``name`` of an Arrow record batch as bytes (strings are taken as UTF-8 bytes
    by a cast in Arrow, without a Python object per row).

    Raises:
        ConfigError: the column is neither binary nor string.
    """
    column = batch.column(name)
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        column = column.cast(pa.large_binary() if pa.types.is_large_string(kind) else pa.binary())
    elif not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)):
        raise ConfigError(f"column {name!r} must be binary or string, not {kind}")
    values: list[bytes | None] = column.to_pylist()
    return values


@attrs.frozen
class UnitRun:
    """Rows ``start .. stop - 1`` of an Arrow batch, all of one unit."""

    unit: str
    start: int
    stop: int
    split: FileSplit | None = None
    #: position mode: the rows' ordinals (an Arrow array); None: they continue the unit's count
    positions: Any = None

    @property
    def first(self) -> int | None:
        return None if self.positions is None else int(self.positions[0].as_py())

    @property
    def last(self) -> int | None:
        return None if self.positions is None else int(self.positions[-1].as_py())

    @property
    def increasing(self) -> bool:
        """Whether the ordinals strictly increase (True without ordinals)."""
        if self.positions is None or len(self.positions) < 2:
            return True
        steps = pc.subtract(self.positions.slice(1), self.positions.slice(0, len(self.positions) - 1))
        return bool(pc.min(steps).as_py() > 0)

    def ordinals(self) -> list[int]:
        """The ordinals as Python ints (position mode)."""
        values: list[int] = self.positions.to_pylist()
        return values


def unit_runs(batch: Any, identity: Identity, spark_partition: int) -> list[UnitRun]:
    """Cut an Arrow batch into runs of rows of one unit (one run per file split or source
    unit the batch holds, in row order; in position mode over files the unit is the file,
    and each split of it a run of its own).

    Raises:
        ConfigError: a position is null.
    """
    count = batch.num_rows
    if identity.mode is Mode.PARTITION:
        return [UnitRun(f"partition:{spark_partition}", 0, count)] if count else []
    if identity.metadata:
        meta = batch.column(METADATA)
        paths = meta.field("file_path")
        keys = [paths, meta.field("file_block_start")]  # a run per split, also in position mode
        ordinal_column = meta.field("row_index") if identity.mode is Mode.POSITION else None
    else:
        keys = [batch.column(name) for name in identity.position_columns[:-1]]
        ordinal_column = batch.column(identity.position_columns[-1])
    if ordinal_column is not None:
        if ordinal_column.null_count:
            raise ConfigError("a row has no position (its ordinal column is null): every row needs one")
        ordinal_column = ordinal_column.cast(pa.int64())
    runs = []
    for start, stop in itertools.pairwise(_boundaries(keys, count)):
        split = None
        if identity.metadata:
            meta = batch.column(METADATA)
            split = FileSplit(
                meta.field("file_path")[start].as_py(),
                meta.field("file_block_start")[start].as_py(),
                meta.field("file_block_length")[start].as_py(),
                meta.field("file_size")[start].as_py(),
                meta.field("file_modification_time").cast(pa.int64())[start].as_py(),
            )
            unit = split.path if identity.mode is Mode.POSITION else split.key
        else:
            unit = json.dumps([column[start].as_py() for column in keys], default=str)
        positions = None if ordinal_column is None else ordinal_column.slice(start, stop - start)
        runs.append(UnitRun(unit, start, stop, split, positions))
    return runs


def _boundaries(columns: list[Any], count: int) -> list[int]:
    """``[0, i1, ..., count]``: where the values of ``columns`` change."""
    if count < 2 or not columns:
        return [0, count] if count else [0]
    changed = None
    for column in columns:
        step = pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, count - 1)), True)
        changed = step if changed is None else pc.or_(changed, step)
    return [0, *(i + 1 for i in pc.indices_nonzero(changed).to_pylist()), count]
