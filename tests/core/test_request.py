"""ProduceRequest: a batch validated and measured once, where it enters."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent import ProduceRequest, Record
from idempotent.errors import InvalidBatchError, InvalidTopicError


def test_build_canonicalises_the_topic_and_measures_the_batch() -> None:
    records = [Record(b"abc", b"k", {"h": b"v"}), Record(b"0123456789")]
    request = ProduceRequest.build("persistent://public/default/orders", 2, 7, 1, 10, records, 9)
    assert request.topic == "orders"
    assert request.partition == 2
    assert (request.header.producer_id, request.header.producer_epoch) == (7, 1)
    assert (request.header.base_sequence, request.header.record_count) == (10, 2)
    assert request.header.previous_sequence == 9
    assert request.size == records[0].size + records[1].size
    assert request.largest == max(r.size for r in records)
    assert request.records is records  # all Record objects: kept as they are, not copied


def test_build_measures_as_record_size_does() -> None:
    records = [Record(None), Record(b"v", b"key"), Record("é", None, [("h1", b"a"), ("h-2", "bc")])]
    request = ProduceRequest.build("t", 0, 1, 0, 0, records)
    assert request.size == sum(r.size for r in records)
    assert request.largest == max(r.size for r in records)


def test_build_keeps_record_subclasses() -> None:
    class Tagged(Record):
        pass

    tagged = Tagged(b"v")
    request = ProduceRequest.build("t", 0, 1, 0, 0, [b"a", tagged])
    assert request.records[1] is tagged
    assert request.size == Record(b"a").size + tagged.size


def test_build_coerces_plain_values_once() -> None:
    request = ProduceRequest.build("t", 0, 1, 0, 0, [b"a", "b", None, bytearray(b"cd")])
    assert all(type(r) is Record for r in request.records)
    assert [r.value for r in request.records] == [b"a", b"b", None, b"cd"]
    assert request.size == sum(r.size for r in request.records)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("bad topic!", 0, 1, 0, 0, [b"a"]), InvalidTopicError),
        (("non-persistent://a/b/c", 0, 1, 0, 0, [b"a"]), InvalidTopicError),
        (("t", -1, 1, 0, 0, [b"a"]), InvalidTopicError),
        (("t", True, 1, 0, 0, [b"a"]), InvalidTopicError),
        (("t", 0, "1", 0, 0, [b"a"]), InvalidBatchError),
        (("t", 0, 1, False, 0, [b"a"]), InvalidBatchError),
        (("t", 0, 1, 0, 0, [b"a"], "x"), InvalidBatchError),
        (("t", 0, -1, 0, 0, [b"a"]), InvalidBatchError),
        (("t", 0, 1, 0, -5, [b"a"]), InvalidBatchError),
        (("t", 0, 1, 0, 0, []), InvalidBatchError),
        (("t", 0, 1, 0, 0, b"abc"), InvalidBatchError),
        (("t", 0, 1, 0, 0, [b"a", 3]), InvalidBatchError),
    ],
)
def test_build_refuses_bad_input(args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        ProduceRequest.build(*args)


def test_build_checks_the_types_in_record_columns() -> None:
    from idempotent.core.records import RecordColumns

    request = ProduceRequest.build("t", 0, 1, 0, 0, RecordColumns([b"ab", None], [b"k", None]))
    assert (request.size, request.largest) == (16 + 3 + 16, 19)
    with pytest.raises(InvalidBatchError, match="values must be bytes or None, not str"):
        ProduceRequest.build("t", 0, 1, 0, 0, RecordColumns(["text"]))  # type: ignore[list-item]
    with pytest.raises(InvalidBatchError, match="2 keys for 1 values"):
        ProduceRequest.build("t", 0, 1, 0, 0, RecordColumns([b"v"], [b"a", b"b"]))
