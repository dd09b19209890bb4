"""Record value types: the converters and the producer's shortcut for plain bytes values."""

from __future__ import annotations

import pickle

import pytest

from idempotent.core.records import Record, as_record, value_record


def test_value_record_equals_the_converted_record() -> None:
    fast = value_record(b"payload")
    assert fast == Record(b"payload") and hash(fast) == hash(Record(b"payload"))
    assert (fast.value, fast.key, fast.headers, fast.size) == (b"payload", None, (), 16 + 7)
    assert pickle.loads(pickle.dumps(fast)) == fast


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (b"v", Record(b"v")),
        ("v", Record(b"v")),
        (None, Record(None)),
        (bytearray(b"v"), Record(b"v")),
        (Record(b"v", b"k", {"h": b"1"}), Record(b"v", b"k", (("h", b"1"),))),
    ],
)
def test_as_record_coerces_values_and_keeps_records(item: object, expected: Record) -> None:
    record = as_record(item)  # type: ignore[arg-type]
    assert record == expected and type(record.value) in (bytes, type(None))


def test_as_record_refuses_other_types() -> None:
    with pytest.raises(TypeError):
        as_record(12345)  # type: ignore[arg-type]


def test_record_columns_read_as_the_records_they_hold() -> None:
    from idempotent.core.records import RecordColumns

    columns = RecordColumns([b"a", None, b"ccc"], [b"k", b"kk", None])
    records = [Record(b"a", b"k"), Record(None, b"kk"), Record(b"ccc")]
    assert len(columns) == 3 and list(columns) == records and columns[2] == records[2]
    assert columns == records and columns == RecordColumns([b"a", None, b"ccc"], [b"k", b"kk", None])
    assert columns[1:] == RecordColumns([None, b"ccc"], [b"kk", None]) and isinstance(columns[1:], RecordColumns)
    assert columns.sizes() == [r.size for r in records]
    assert RecordColumns([b"x", b"yy"]).sizes() == [Record(b"x").size, Record(b"yy").size]
    assert columns != RecordColumns([b"a", None, b"ccc"])


def test_record_columns_join_with_and_without_keys() -> None:
    from idempotent.core.records import RecordColumns

    both = RecordColumns([b"a"]) + RecordColumns([b"b"], [b"k"])
    assert list(both) == [Record(b"a"), Record(b"b", b"k")]
    assert (RecordColumns([b"a"]) + RecordColumns([b"b"])).keys is None


def test_record_columns_checked_refuses_bad_types_and_lengths() -> None:
    from idempotent.core.records import RecordColumns
    from idempotent.errors import InvalidRecordError

    assert RecordColumns.checked([b"a", None], [None, b"k"]) == [Record(b"a"), Record(None, b"k")]
    with pytest.raises(InvalidRecordError, match="values must be bytes or None, not str"):
        RecordColumns.checked([b"a", "b"])
    with pytest.raises(InvalidRecordError, match="keys must be bytes or None, not int"):
        RecordColumns.checked([b"a"], [1])
    with pytest.raises(InvalidRecordError, match="2 keys for 1 values"):
        RecordColumns.checked([b"a"], [b"k", b"l"])
