"""A broker's background loops (idempotent/broker/loops.py): an error of the tree is retried
next interval, a bug is kept as the broker's FATAL failure and ends the loop, stopping ends
every loop. Through a Broker: tests/broker/test_broker.py."""

from __future__ import annotations

import threading
import time

import pytest

from idempotent.broker.loops import BackgroundLoops
from idempotent.errors import BackendUnavailableError, InternalError, Recovery


def test_a_retriable_error_is_retried_and_a_bug_ends_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    loops = BackgroundLoops(stop)
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise BackendUnavailableError("backend down (test)")
        raise ZeroDivisionError("a bug in the step")

    thread = loops.start("test-loop", 0.01, "testing", step)
    thread.join(10)
    assert not thread.is_alive(), "a bug ends the loop"
    assert len(calls) == 2
    assert isinstance(loops.failure, InternalError) and loops.failure.recovery is Recovery.FATAL
    assert "ZeroDivisionError" in str(loops.failure)
    assert any("backend down (test)" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    stop.set()


def test_stopping_ends_the_loop_without_a_failure() -> None:
    stop = threading.Event()
    loops = BackgroundLoops(stop)
    ran = threading.Event()
    thread = loops.start("test-loop", 0.01, "testing", ran.set)
    assert ran.wait(10)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert loops.failure is None


def test_the_first_step_waits_one_interval() -> None:
    stop = threading.Event()
    loops = BackgroundLoops(stop)
    ran: list[float] = []
    started = time.monotonic()
    loops.start("test-loop", 0.3, "testing", lambda: ran.append(time.monotonic() - started))
    time.sleep(0.1)
    assert ran == []
    stop.set()
