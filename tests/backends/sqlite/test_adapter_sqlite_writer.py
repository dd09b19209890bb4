"""The SQLite file's writer thread (``adapters/sqlite/writer.py``), with its commit stubbed:
group commit in order, and nothing stored behind a failed append of a partition."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from idempotent.adapters.sqlite.writer import Append, SQLiteWriter
from idempotent.backend import AppendBatch
from idempotent.errors import BackendUnavailableError, InternalError


def _item(topic: str, partition: int) -> Append:
    return (topic, partition, AppendBatch.__new__(AppendBatch), None, Future())


class _Log:
    """A stand-in for ``SQLiteBackend._commit``: records each group, fails on request."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[str, int]]] = []
        self.fail: BaseException | None = None
        self.gate = threading.Event()
        self.gate.set()

    def commit(self, items: list[Append]) -> list[int]:
        self.gate.wait(10)
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        self.groups.append([(t, p) for t, p, *_ in items])
        return [len(self.groups) * 100 + i for i in range(len(items))]


def test_appends_are_stored_in_the_order_handed_over_and_their_futures_get_their_offsets() -> None:
    log = _Log()
    log.gate.clear()  # hold the first group, so that the next ones queue up behind it
    writer = SQLiteWriter("sqlite:///x.db", "x.db", log.commit)
    items = [_item("t", i % 2) for i in range(6)]
    try:
        for item in items:
            writer.submit(item)
        log.gate.set()
        offsets = [item[4].result(10) for item in items]
    finally:
        writer.close(10)
    assert [key for group in log.groups for key in group] == [("t", i % 2) for i in range(6)]
    assert len(offsets) == 6 and offsets == sorted(offsets)


def test_a_failed_append_fails_what_follows_on_its_partition_until_it_is_replayed() -> None:
    log = _Log()
    writer = SQLiteWriter("sqlite:///x.db", "x.db", log.commit)
    try:
        log.fail = BackendUnavailableError("disk I/O error")
        first = _item("t", 0)
        writer.submit(first)
        with pytest.raises(BackendUnavailableError, match="disk I/O"):
            first[4].result(10)
        behind = _item("t", 0)
        writer.submit(behind)  # refused at once: nothing is stored behind a failed append
        with pytest.raises(BackendUnavailableError, match="earlier append of the partition failed"):
            behind[4].result(10)
        other = _item("t", 1)
        writer.submit(other)
        assert other[4].result(10) >= 0  # another partition is not held up
        writer.replayed("t", 0)
        again = _item("t", 0)
        writer.submit(again)
        assert again[4].result(10) >= 0
    finally:
        writer.close(10)


def test_a_bug_in_the_commit_is_fatal_for_the_partition_and_the_thread_lives_on() -> None:
    log = _Log()
    writer = SQLiteWriter("sqlite:///x.db", "x.db", log.commit)
    try:
        log.fail = ZeroDivisionError("a bug")
        first = _item("t", 0)
        writer.submit(first)
        with pytest.raises(InternalError):
            first[4].result(10)
        behind = _item("t", 0)
        writer.submit(behind)
        with pytest.raises(InternalError):  # never turned into a retriable error
            behind[4].result(10)
        other = _item("u", 0)
        writer.submit(other)
        assert other[4].result(10) >= 0
    finally:
        writer.close(10)


def test_close_refuses_new_appends() -> None:
    log = _Log()
    writer = SQLiteWriter("sqlite:///x.db", "x.db", log.commit)
    writer.close(10)
    late = _item("t", 0)
    writer.submit(late)
    with pytest.raises(BackendUnavailableError, match="closed"):
        late[4].result(1)
