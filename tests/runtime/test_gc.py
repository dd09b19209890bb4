"""fewer_collections: raised thresholds while a bulk write runs, put back after.

Every test compares with the thresholds in force before it (the interpreter's own, or ones a
test sets), never with CPython's defaults: those differ between versions (3.13 changed them)
and an application may have its own.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from idempotent.runtime.collector import BULK_THRESHOLDS, fewer_collections

#: the interpreter's own thresholds, and others an application may have set
STARTING = list(dict.fromkeys([gc.get_threshold(), (700, 10, 10), (2000, 10, 0), (50_000, 5, 100), (123, 456, 7)]))


@pytest.fixture(autouse=True, params=STARTING, ids=lambda t: "-".join(map(str, t)))
def before(request: pytest.FixtureRequest) -> Iterator[tuple[int, int, int]]:
    """Set the starting thresholds; put the interpreter's back after the test."""
    saved = gc.get_threshold()
    gc.set_threshold(*request.param)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*saved)


def raised(before: tuple[int, int, int]) -> tuple[int, ...]:
    """What fewer_collections sets: each threshold at least the bulk one."""
    return tuple(max(old, bulk) for old, bulk in zip(before, BULK_THRESHOLDS, strict=True))


def test_thresholds_are_raised_inside_and_put_back_after(before: tuple[int, int, int]) -> None:
    with fewer_collections():
        assert gc.get_threshold() == raised(before)
        assert all(now >= bulk for now, bulk in zip(gc.get_threshold(), BULK_THRESHOLDS, strict=True))
    assert gc.get_threshold() == before


def test_put_back_when_the_body_raises(before: tuple[int, int, int]) -> None:
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


def test_higher_thresholds_are_kept(before: tuple[int, int, int]) -> None:
    with fewer_collections():
        inside = gc.get_threshold()
    assert all(now >= old for now, old in zip(inside, before, strict=True))
    assert [now == old for now, old in zip(inside, before, strict=True)] == [
        old >= bulk for old, bulk in zip(before, BULK_THRESHOLDS, strict=True)
    ]
    assert gc.get_threshold() == before


def test_nested_and_concurrent_uses_restore_once_the_last_ends(before: tuple[int, int, int]) -> None:
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with fewer_collections():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=other)
    with fewer_collections():
        thread.start()
        assert inside.wait(5)
        with fewer_collections():
            assert gc.get_threshold() == raised(before)
    # the first user ended, the thread's is still running: still raised
    assert gc.get_threshold() == raised(before)
    release.set()
    thread.join(5)
    assert gc.get_threshold() == before
