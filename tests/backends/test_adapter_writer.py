"""GroupQueue (adapters/work_queue.py): the queue every adapter's writer thread takes groups from.

Driven through a minimal writer built the way the adapters build theirs: ``submit`` appends
under ``_cond`` and notifies, ``close`` sets ``_closed`` and notifies, the thread loops on
``_take_group``.
"""

from __future__ import annotations

import threading
import time

from idempotent.adapters.work_queue import GroupQueue


class Writer(GroupQueue[int]):
    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.groups: list[list[int]] = []
        self.gate = gate
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def submit(self, item: int) -> None:
        with self._cond:
            self._queue.append(item)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while (group := self._take_group()) is not None:
            self.groups.append(group)
            if self.gate is not None:
                self.gate.wait(10)  # a slow commit: the next items queue up meanwhile


def wait_for(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.001)


def test_the_writer_sleeps_until_something_is_queued() -> None:
    writer = Writer()
    time.sleep(0.05)
    assert writer.groups == [] and writer.thread.is_alive()  # waiting, not spinning out
    writer.submit(1)
    wait_for(lambda: writer.groups == [[1]])
    assert writer.groups == [[1]]
    writer.close()
    writer.thread.join(10)
    assert not writer.thread.is_alive()


def test_what_queues_during_a_commit_is_taken_as_one_group_in_order() -> None:
    """Group commit: while the writer stores one group, everything submitted meanwhile
    becomes the next group, in submission order."""
    gate = threading.Event()
    writer = Writer(gate)
    writer.submit(0)
    wait_for(lambda: writer.groups == [[0]])
    for item in range(1, 6):
        writer.submit(item)
    gate.set()
    wait_for(lambda: len(writer.groups) == 2)
    assert writer.groups == [[0], [1, 2, 3, 4, 5]]
    writer.close()
    writer.thread.join(10)


def test_close_drains_what_is_queued_before_the_writer_stops() -> None:
    gate = threading.Event()
    writer = Writer(gate)
    writer.submit(0)
    wait_for(lambda: writer.groups == [[0]])
    writer.submit(1)
    writer.submit(2)
    writer.close()  # queued before the close: still taken
    gate.set()
    writer.thread.join(10)
    assert not writer.thread.is_alive()
    assert writer.groups == [[0], [1, 2]]


def test_closing_an_idle_writer_stops_it() -> None:
    writer = Writer()
    writer.close()
    writer.thread.join(10)
    assert not writer.thread.is_alive() and writer.groups == []
