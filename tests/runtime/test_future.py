"""LightFuture behaves as concurrent.futures.Future does, for every way the project and its
users wait on one: done-callbacks, blocking result()/exception(), concurrent.futures.wait,
as_completed, asyncio.wrap_future and cancellation."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent import futures
from concurrent.futures import CancelledError, Future, InvalidStateError

import pytest

from idempotent.runtime.future import LightFuture


def test_is_a_future_and_answers_without_a_condition() -> None:
    future: LightFuture[int] = LightFuture()
    assert isinstance(future, Future)
    assert not future.done() and not future.running() and not future.cancelled()
    seen: list[int] = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    future.set_result(7)
    assert seen == [7]
    assert future.done() and future.result() == 7 and future.exception() is None
    assert "_condition" not in future.__dict__  # nobody blocked: no condition was made


def test_exception_is_raised_by_result_and_returned_by_exception() -> None:
    future: LightFuture[int] = LightFuture()
    error = ValueError("boom")
    future.set_exception(error)
    assert future.exception() is error
    with pytest.raises(ValueError, match="boom"):
        future.result()


@pytest.mark.parametrize("second", ["result", "exception"])
def test_a_second_outcome_is_refused_and_changes_nothing(second: str) -> None:
    future: LightFuture[int] = LightFuture()
    future.set_result(1)
    with pytest.raises(InvalidStateError):
        if second == "result":
            future.set_result(2)
        else:
            future.set_exception(ValueError())
    assert future.result() == 1


def test_a_callback_added_after_the_outcome_runs_at_once() -> None:
    future: LightFuture[str] = LightFuture()
    future.set_result("x")
    seen: list[str] = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    assert seen == ["x"]


def test_a_failing_callback_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    future: LightFuture[int] = LightFuture()
    seen: list[int] = []

    def broken(f: Future[int]) -> None:
        raise RuntimeError("callback bug")

    future.add_done_callback(broken)
    future.add_done_callback(lambda f: seen.append(f.result()))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        future.set_result(3)
    assert seen == [3]
    assert any("exception calling callback" in r.getMessage() for r in caplog.records)


def test_result_blocks_until_set_from_another_thread_and_times_out_otherwise() -> None:
    future: LightFuture[int] = LightFuture()
    with pytest.raises(futures.TimeoutError):
        future.result(timeout=0.05)
    threading.Timer(0.05, future.set_result, (9,)).start()
    assert future.result(timeout=5) == 9
    other: LightFuture[int] = LightFuture()
    threading.Timer(0.05, other.set_exception, (KeyError("k"),)).start()
    assert isinstance(other.exception(timeout=5), KeyError)


def test_wait_and_as_completed_see_every_outcome() -> None:
    fs: list[LightFuture[int]] = [LightFuture() for _ in range(20)]
    fs[0].set_result(0)

    def finish() -> None:
        for i, f in enumerate(fs[1:], 1):
            time.sleep(0.002)
            if i % 5 == 0:
                f.set_exception(ValueError(i))
            else:
                f.set_result(i)

    threading.Thread(target=finish).start()
    first = futures.wait(fs, timeout=5, return_when=futures.FIRST_EXCEPTION)
    assert any(f.exception() is not None for f in first.done)
    done, not_done = futures.wait(fs, timeout=5)
    assert not not_done and len(done) == 20
    assert sorted(f.result() for f in fs if f.exception() is None) == [i for i in range(20) if i == 0 or i % 5]
    assert len(list(futures.as_completed(fs, timeout=5))) == 20


def test_no_waiter_misses_an_outcome_set_while_it_starts_waiting() -> None:
    """Waiters that make the condition while another thread sets the outcome: each is woken
    (a lost wake-up would show as a timeout)."""
    for _ in range(300):
        future: LightFuture[int] = LightFuture()
        results: list[object] = []

        def by_result(f: LightFuture[int] = future, out: list[object] = results) -> None:
            out.append(f.result(timeout=5))

        def by_wait(f: LightFuture[int] = future, out: list[object] = results) -> None:
            out.append(len(futures.wait([f], timeout=5).done))

        waiters = [threading.Thread(target=by_result), threading.Thread(target=by_wait)]
        for waiter in waiters:
            waiter.start()
        future.set_result(1)
        for waiter in waiters:
            waiter.join()
        assert sorted(map(str, results)) == ["1", "1"]


def test_cancel_and_set_running() -> None:
    future: LightFuture[int] = LightFuture()
    seen: list[bool] = []
    future.add_done_callback(lambda f: seen.append(f.cancelled()))
    assert future.cancel() and future.cancel()
    assert seen == [True] and future.cancelled() and future.done()
    assert not future.set_running_or_notify_cancel()
    with pytest.raises(CancelledError):
        future.result()
    running: LightFuture[int] = LightFuture()
    assert running.set_running_or_notify_cancel() and running.running()
    assert not running.cancel()
    running.set_result(1)
    assert not running.cancel()
    with pytest.raises(RuntimeError):
        running.set_running_or_notify_cancel()


def test_cancel_wakes_a_blocked_result() -> None:
    future: LightFuture[int] = LightFuture()
    threading.Timer(0.05, future.cancel).start()
    with pytest.raises(CancelledError):
        future.result(timeout=5)


def test_asyncio_wraps_it() -> None:
    async def main() -> int:
        future: LightFuture[int] = LightFuture()
        threading.Timer(0.02, future.set_result, (5,)).start()
        return await asyncio.wrap_future(future)

    assert asyncio.run(main()) == 5


def test_repr_names_the_state() -> None:
    future: LightFuture[int] = LightFuture()
    assert "pending" in repr(future)
    future.set_result(1)
    assert "finished" in repr(future)
