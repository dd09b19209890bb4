"""Record value types: the converters and the producer's shortcut for plain bytes values."""

from __future__ import annotations

import pickle

import pytest

from idempotent._records import Record, as_record, value_record


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
