"""FairQueue: sources served in turn, held sources skipped, dropped sources forgotten."""

from __future__ import annotations

import threading

from idempotent.net.fairqueue import FairQueue


def drain(queue: FairQueue[str, int], n: int) -> list[tuple[str, int] | None]:
    return [queue.get() for _ in range(n)]


def test_sources_are_served_in_turn() -> None:
    queue: FairQueue[str, int] = FairQueue(lambda source: False)
    for i in range(100):
        queue.put("greedy", i)
    queue.put("polite", 0)
    queue.put("other", 0)
    # the greedy source's hundred items delay the others by one item, not a hundred
    assert drain(queue, 4) == [("greedy", 0), ("polite", 0), ("other", 0), ("greedy", 1)]
    assert len(queue) == 98


def test_held_sources_wait_until_woken() -> None:
    held = {"slow"}
    queue: FairQueue[str, int] = FairQueue(lambda source: source in held)
    queue.put("slow", 1)
    queue.put("fast", 1)
    assert queue.get() == ("fast", 1)
    got: list[tuple[str, int] | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get()))
    worker.start()
    worker.join(0.1)
    assert worker.is_alive() and not got  # only a held source has work: the worker waits
    held.clear()
    queue.wake()
    worker.join(5)
    assert got == [("slow", 1)]


def test_dropped_work_is_never_served_and_close_ends_the_workers() -> None:
    queue: FairQueue[str, int] = FairQueue(lambda source: source == "held")
    for i in range(3):
        queue.put("gone", i)
    queue.put("held", 0)
    assert queue.drop("gone") == 3 and queue.drop("gone") == 0
    queue.close()
    assert queue.get() == ("held", 0)  # closing serves what is left, held or not
    assert queue.get() is None
    queue.put("late", 0)
    assert queue.get() is None


def test_stop_holding_serves_held_sources() -> None:
    queue: FairQueue[str, int] = FairQueue(lambda source: True)
    queue.put("a", 1)
    queue.stop_holding()
    assert queue.get() == ("a", 1)
