"""The owner's writer of one Pulsar partition (adapters/pulsar/writer.py): entries pipelined
and answered in order, a failed entry failing everything after it, and the blocking flush
where the client has no ``flush_async``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from idempotent import Record
from idempotent.adapters.pulsar.entries import close_entry
from idempotent.backend import AppendBatch, LogBackend
from idempotent.errors import BackendUnavailableError, CorruptDataError, ProducerError
from idempotent.testing.conformance import topic_name

from ...conftest import ServiceHarness
from .test_adapter_pulsar import harness as harness

#: each record alone fills most of an entry of ENTRY_BYTES: one batch per entry
ENTRY_BYTES = 1_500
VALUE = b"v" * 600


@pytest.fixture
def backend(harness: ServiceHarness) -> Iterator[LogBackend]:
    from idempotent.adapters import open_backend

    opened = open_backend(harness.url)
    opened.max_entry_bytes = ENTRY_BYTES  # type: ignore[attr-defined]
    try:
        yield opened
    finally:
        opened.close()


def _topic_with_a_first_record(backend: LogBackend, name: str) -> str:
    topic = topic_name(name)
    backend.create_topic(topic, 1)
    backend.append(topic, 0, AppendBatch(None, [Record(b"first")], time.time()), None).result(60)
    return topic


def _append_many(backend: LogBackend, topic: str, count: int) -> tuple[list[Future[int]], list[int]]:
    """``count`` one-record batches appended at once; the indexes in the order they completed."""
    completed: list[int] = []
    futures = []
    for index in range(count):
        future = backend.append(topic, 0, AppendBatch(None, [Record(VALUE + b"%d" % index)], time.time()), None)
        future.add_done_callback(lambda _, index=index: completed.append(index))
        futures.append(future)
    return futures, completed


@pytest.mark.pulsar
def test_entries_are_pipelined_and_answered_in_the_order_sent(
    backend: LogBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import idempotent.adapters.pulsar.writer as writer_module

    writer_class = writer_module.PartitionWriter
    start, finish = writer_class._start, writer_class._finish
    outstanding: list[int] = [0]
    peak: list[int] = [0]

    def counted_start(self: Any, group: Any) -> Any:
        entry = start(self, group)
        outstanding[0] += 1
        peak[0] = max(peak[0], outstanding[0])
        return entry

    def counted_finish(self: Any, entry: Any) -> None:
        finish(self, entry)
        outstanding[0] -= 1

    monkeypatch.setattr(writer_class, "_start", counted_start)
    monkeypatch.setattr(writer_class, "_finish", counted_finish)
    topic = _topic_with_a_first_record(backend, "pipelined")
    futures, completed = _append_many(backend, topic, 40)
    offsets = [future.result(60) for future in futures]
    assert completed == list(range(40))  # futures of one partition complete in append order
    assert offsets == sorted(offsets) and len(set(offsets)) == 40
    assert 1 < peak[0] <= writer_module.MAX_IN_FLIGHT  # several entries were in flight at once
    stored = backend.read(topic, 0, 0, 100)
    assert [r.value for r in stored] == [b"first"] + [VALUE + b"%d" % i for i in range(40)]
    assert [r.offset for r in stored[1:]] == offsets


@pytest.mark.pulsar
def test_a_failed_entry_fails_every_entry_after_it(backend: LogBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    import pulsar

    import idempotent.adapters.pulsar.writer as writer_module

    sent_class = writer_module._Sent
    answer = sent_class.answer
    entries: list[int] = [0]

    def failing_answer(self: Any, cond: Any, *slots: int) -> Any:
        callback = answer(self, cond, *slots)
        if 0 not in slots:
            return callback
        entries[0] += 1
        if entries[0] != 4:  # the 4th entry sent (after "first": the 3rd of the batches below)
            return callback
        return lambda result, message_id: callback(pulsar.Result.Timeout, message_id)

    monkeypatch.setattr(sent_class, "answer", failing_answer)
    topic = _topic_with_a_first_record(backend, "failorder")
    futures, completed = _append_many(backend, topic, 12)
    outcomes: list[int | ProducerError] = []
    for future in futures:
        error = future.exception(60)
        outcomes.append(future.result() if error is None else error)  # type: ignore[arg-type]
    assert completed == list(range(12))
    assert all(isinstance(o, int) for o in outcomes[:2])
    assert all(isinstance(o, BackendUnavailableError) for o in outcomes[2:])
    # the writer stays failed: nothing submitted after the failure is stored by it
    later = backend.append(topic, 0, AppendBatch(None, [Record(b"later")], time.time()), None)
    assert isinstance(later.exception(60), ProducerError)
    # the rebuild's replay takes a new writer, which finds what Pulsar stored of the entries
    # left in doubt a prefix: the "failed" one (only its answer was replaced) and maybe some
    # after it (the client dropped what it had not sent when the writer closed it)
    replayed = list(backend.replay(topic, 0, 0))
    values = [r.value for r in backend.read(topic, 0, 0, 100)]
    stored = len(values) - 1
    assert stored >= 3 and values == [b"first"] + [VALUE + b"%d" % i for i in range(stored)]
    assert len(replayed) == len(values)
    backend.append(topic, 0, AppendBatch(None, [Record(b"after")], time.time()), None).result(60)
    assert [r.value for r in backend.read(topic, 0, 0, 100)] == [*values, b"after"]


@pytest.mark.pulsar
def test_a_later_entry_stored_behind_a_missing_one_is_fatal(
    backend: LogBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pulsar refuses one entry (say a checksum error) and stores the next: the batches of the
    missing one must not be taken for stored, so the partition is not rebuilt at all."""
    import threading

    import pulsar

    import idempotent.adapters.pulsar.writer as writer_module

    writer_class = writer_module.PartitionWriter
    start = writer_class._start
    calls: list[int] = [0]

    def holey_start(self: Any, group: Any) -> Any:
        calls[0] += 1
        if calls[0] != 4:  # the 4th entry sent is never sent, and refused half a second later
            return start(self, group)
        count = sum(len(item.messages) for item in group)
        entry = writer_module._Sent(group, count, time.monotonic() + 60, self._next_sequence)
        self._next_sequence += count
        refuse = entry.answer(self._cond, 0, 1)
        threading.Timer(0.5, refuse, args=(pulsar.Result.ChecksumError, None)).start()
        return entry

    monkeypatch.setattr(writer_class, "_start", holey_start)
    topic = _topic_with_a_first_record(backend, "hole")
    futures, _ = _append_many(backend, topic, 12)
    errors = [future.exception(60) for future in futures]
    assert errors[:2] == [None, None] and all(isinstance(e, ProducerError) for e in errors[2:])
    stored = [r.value for r in backend.read(topic, 0, 0, 100)]
    assert VALUE + b"2" not in stored and VALUE + b"3" in stored  # the hole is there
    for _ in range(2):  # and stays fatal: the doubt is kept until a writer settles it
        with pytest.raises(CorruptDataError, match="a later one while an earlier one is missing"):
            list(backend.replay(topic, 0, 0))


@pytest.mark.pulsar
def test_without_flush_async_every_entry_is_still_stored_in_order(
    backend: LogBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import idempotent.adapters.pulsar.writer as writer_module

    waited: list[bool] = []

    def blocking_close(producer: Any) -> bool:
        producer.flush()
        waited.append(True)
        return False

    monkeypatch.setattr(writer_module, "close_entry", blocking_close)
    topic = topic_name("blockingflush")
    backend.create_topic(topic, 1)
    futures, completed = _append_many(backend, topic, 10)
    offsets = [future.result(60) for future in futures]
    assert completed == list(range(10)) and offsets == sorted(offsets)
    assert waited
    assert [r.value for r in backend.read(topic, 0, 0, 100)] == [VALUE + b"%d" % i for i in range(10)]


class _Extension:
    def __init__(self, with_flush_async: bool) -> None:
        self.calls: list[str] = []
        if with_flush_async:
            self.flush_async = lambda callback: self.calls.append("flush_async")


class _Producer:
    def __init__(self, with_flush_async: bool) -> None:
        self._producer = _Extension(with_flush_async)

    def flush(self) -> None:
        self._producer.calls.append("flush")


@pytest.mark.parametrize("with_flush_async", [True, False])
def test_close_entry_waits_only_without_flush_async(with_flush_async: bool) -> None:
    producer = _Producer(with_flush_async)
    assert close_entry(producer) is with_flush_async
    assert producer._producer.calls == (["flush_async"] if with_flush_async else ["flush"])


@pytest.mark.pulsar
def test_a_refused_send_fails_its_group_and_everything_after_it(
    backend: LogBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client refuses while an entry is being sent (here: closing its 3rd entry): that
    entry's batches and the ones queued fail, and the entries in flight before it are
    answered too (stored, or failed with their outcome unknown)."""
    import pulsar

    import idempotent.adapters.pulsar.writer as writer_module

    closes: list[int] = [0]

    def refusing_close(producer: Any) -> bool:
        closes[0] += 1
        if closes[0] == 3:
            raise pulsar.ConnectError("refused")
        return close_entry(producer)

    monkeypatch.setattr(writer_module, "close_entry", refusing_close)
    topic = topic_name("refused")
    backend.create_topic(topic, 1)
    futures, completed = _append_many(backend, topic, 10)
    errors = [future.exception(60) for future in futures]
    assert completed == list(range(10))
    assert all(isinstance(e, BackendUnavailableError) for e in errors[2:])
    assert all(e is None or isinstance(e, BackendUnavailableError) for e in errors[:2])
