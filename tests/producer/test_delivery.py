"""How a record buffer reports the end of its spans (idempotent/producer/delivery.py): the callbacks of
a stored span get the same metadata, record by record, as the one-record path builds, across
the end of the sequence ring too; a failed span's callbacks get its failure."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from idempotent.core.outcomes import DeliveryStatus, RecordMetadata
from idempotent.core.types import MAX_SEQUENCE
from idempotent.errors import BackendUnavailableError, DeliveryFailed
from idempotent.producer.delivery import RecordBuffer


def _buffer(size: int, calls: list[tuple[int, Any, Any]]) -> RecordBuffer:
    buffer = RecordBuffer("orders", 2)
    buffer.values = [b"v"] * size
    # every third record has no callback; the rest say which record they belong to
    buffer.callbacks = [None if i % 3 == 1 else (lambda e, m, i=i: calls.append((i, e, m))) for i in range(size)]
    return buffer


@given(
    start=st.integers(0, 20),
    count=st.integers(1, 40),
    base_offset=st.none() | st.integers(0, 2**40),
    base_sequence=st.integers(MAX_SEQUENCE - 50, MAX_SEQUENCE + 50) | st.integers(0, 2**62),
    duplicate=st.booleans(),
)
def test_a_stored_span_calls_back_with_each_records_metadata(
    start: int, count: int, base_offset: int | None, base_sequence: int, duplicate: bool
) -> None:
    calls: list[tuple[int, Any, Any]] = []
    buffer = _buffer(start + count, calls)
    segment = (start, count, base_offset, base_sequence, duplicate, None, DeliveryStatus.PERSISTED)
    buffer.ended(segment)
    expected = [(i, None, buffer._outcome(segment, i)) for i in range(start, start + count) if i % 3 != 1]
    assert calls == expected
    assert all(type(metadata) is RecordMetadata for _, _, metadata in calls)


def test_a_failed_span_calls_back_with_its_failure() -> None:
    calls: list[tuple[int, Any, Any]] = []
    buffer = _buffer(4, calls)
    buffer.ended((0, 4, None, 10, False, BackendUnavailableError("down"), DeliveryStatus.NOT_PERSISTED))
    assert [i for i, _, _ in calls] == [0, 2, 3]
    assert all(isinstance(error, DeliveryFailed) and metadata is None for _, error, metadata in calls)
    assert [error.sequence for _, error, _ in calls] == [10, 12, 13]


def test_a_callback_that_raises_does_not_stop_the_others() -> None:
    seen: list[int] = []

    def boom(error: Any, metadata: Any) -> None:
        raise RuntimeError("application bug")

    buffer = RecordBuffer("orders", 0)
    buffer.values = [b"a", b"b"]
    buffer.callbacks = [boom, lambda e, m: seen.append(m.offset)]
    buffer.ended((0, 2, 7, 0, False, None, DeliveryStatus.PERSISTED))
    assert seen == [8]


def test_done_callbacks_run_once_each_with_their_records_outcome_across_spans() -> None:
    from idempotent.producer.delivery import DeliveryFuture

    buffer = RecordBuffer("orders", 1)
    buffer.values = [b"v"] * 10
    seen: list[tuple[int, Any]] = []
    futures = [DeliveryFuture(buffer, i) for i in range(10)]
    for i, future in enumerate(futures):
        if i != 4:
            future.add_done_callback(lambda f, i=i: seen.append((i, f.exception() or f.result().offset)))
    futures[7].add_done_callback(lambda f: seen.append((70, f.done())))  # a second one on a record
    failure = BackendUnavailableError("down")
    buffer.ended((0, 3, 100, 0, False, None, DeliveryStatus.PERSISTED))
    buffer.ended((3, 4, None, 3, False, failure, DeliveryStatus.NOT_PERSISTED))
    assert [i for i, _ in seen] == [0, 1, 2, 3, 5, 6]
    buffer.ended((7, 3, 200, 7, False, None, DeliveryStatus.PERSISTED))
    assert seen[:3] == [(0, 100), (1, 101), (2, 102)]
    assert all(isinstance(outcome, DeliveryFailed) for _, outcome in seen[3:6])
    assert seen[6:] == [(7, 200), (70, True), (8, 201), (9, 202)]
    late: list[Any] = []
    futures[4].add_done_callback(late.append)  # already ended: called at once
    assert late == [futures[4]] and isinstance(futures[4].exception(), DeliveryFailed)
    assert futures[9].result().offset == 202 and futures[9].exception() is None


_OPTIONAL = st.tuples(st.none() | st.just(b"k"), st.none() | st.just("report"), st.none() | st.integers(0, 9))


@given(st.lists(_OPTIONAL, max_size=30))
def test_a_buffer_is_plain_until_a_record_has_more_than_a_value(records: list[tuple[Any, Any, Any]]) -> None:
    """``plain`` says a value-only record may go to ``values`` alone (the producers' per-record
    path); appended that way or through ``append``, the columns come out the same."""
    fast, slow = RecordBuffer("t", 0), RecordBuffer("t", 0)
    for i, (key, report, timestamp) in enumerate(records):
        value = b"%d" % i
        only_value = key is None and report is None and timestamp is None
        assert fast.plain == all(r == (None, None, None) for r in records[:i])
        if fast.plain and only_value:
            fast.values.append(value)
        else:
            fast.append(value, key, None, report, timestamp, None, None)
        slow.append(value, key, None, report, timestamp, None, None)
    for column in ("values", "keys", "reports", "timestamps", "callbacks", "headers", "sequences"):
        assert getattr(fast, column) == getattr(slow, column), column
