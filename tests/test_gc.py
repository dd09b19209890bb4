"""fewer_collections: raised thresholds while a bulk write runs, put back after."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from idempotent._gc import BULK_THRESHOLDS, fewer_collections


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_thresholds_are_raised_inside_and_put_back_after() -> None:
    with fewer_collections():
        assert gc.get_threshold() == BULK_THRESHOLDS
    assert gc.get_threshold() == (700, 10, 10)


def test_put_back_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_higher_thresholds_are_kept() -> None:
    gc.set_threshold(50_000, 5, 100)
    with fewer_collections():
        assert gc.get_threshold() == (50_000, 50, 100)
    assert gc.get_threshold() == (50_000, 5, 100)


def test_nested_and_concurrent_uses_restore_once_the_last_ends() -> None:
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
            assert gc.get_threshold() == BULK_THRESHOLDS
    # the first user ended, the thread's is still running: still raised
    assert gc.get_threshold() == BULK_THRESHOLDS
    release.set()
    thread.join(5)
    assert gc.get_threshold() == (700, 10, 10)
