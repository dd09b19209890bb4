"""A ``concurrent.futures.Future`` that costs little when nobody blocks on it.

Every batch a broker handles passes through a few futures: the broker's answer, the
backend's append, the server's request. A standard :class:`concurrent.futures.Future` builds
a ``threading.Condition`` (an ``RLock`` and a waiter list) in its constructor, and every
method enters it from Python; on a broker server answering single-record batches those
futures took about a fifth of its busy samples. Almost none of these futures is ever waited on: they finish on one
thread and a done-callback (or a poll of :meth:`done`) picks them up.

:class:`LightFuture` is a drop-in subclass (``isinstance(f, Future)`` holds, and
``concurrent.futures.wait``, ``as_completed`` and ``asyncio.wrap_future`` work with it). Its
state changes under one process-wide lock, held for a few attribute writes; the condition
that blocking calls wait on is made only when one of them first needs it (``result`` or
``exception`` before the future is done, ``wait``, ``as_completed``, ``repr``). A state
change that finds the condition made notifies it after the change, so a waiter either sees
the new state when it checks under the condition, or is woken.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
    RUNNING,
)
from typing import Any, TypeVar

T = TypeVar("T")

#: held only for a few attribute reads and writes, never while calling out
_STATE_LOCK = threading.Lock()
_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})


class LightFuture(Future[T]):
    """A :class:`concurrent.futures.Future` without a condition until one is needed (see the
    module docstring). Same methods, same errors: ``set_result`` and ``set_exception`` raise
    ``InvalidStateError`` on a finished or cancelled future and change nothing then;
    ``result`` and ``exception`` raise ``CancelledError`` or ``TimeoutError`` as the
    standard future does."""

    def __init__(self) -> None:  # the base's constructor would build the condition
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._done_callbacks: list[Callable[[Future[T]], object]] = []

    def __getattr__(self, name: str) -> Any:
        """Make the condition and the waiter list (read by the base's blocking methods and by
        ``concurrent.futures.wait``) the first time either is asked for."""
        if name not in ("_condition", "_waiters"):
            raise AttributeError(name)
        with _STATE_LOCK:
            fields = self.__dict__
            if "_condition" not in fields:
                fields["_waiters"] = []
                fields["_condition"] = threading.Condition()
        return fields[name]

    # -- reads: no lock when the state already answers -------------------------------------

    def done(self) -> bool:
        return self._state in _DONE

    def cancelled(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    def running(self) -> bool:
        return self._state == RUNNING

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED:
            exc = self._exception
            if exc is None:
                return self._result  # type: ignore[no-any-return]
            raise exc
        return super().result(timeout)  # waits on the condition, made now

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        with _STATE_LOCK:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        super().add_done_callback(fn)  # done: the base calls it now and logs what it raises

    # -- state changes ----------------------------------------------------------------------

    def set_result(self, result: T) -> None:
        self._finish(result, None, "add_result")

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(None, exception, "add_exception")

    def _finish(self, result: Any, exception: BaseException | None, adding: str) -> None:
        """Change to FINISHED (or raise InvalidStateError, changing nothing), then wake the
        waiters, if any, and run the callbacks (none is added after the change:
        ``add_done_callback`` then runs its own)."""
        with _STATE_LOCK:
            state = self._state
            if state not in _DONE:
                self._result = result
                self._exception = exception
                self._state = FINISHED
        if state in _DONE:
            raise InvalidStateError(f"{state}: {self!r}")
        condition = self.__dict__.get("_condition")
        if condition is not None:
            with condition:
                for waiter in self.__dict__["_waiters"]:
                    getattr(waiter, adding)(self)
                condition.notify_all()
        if self._done_callbacks:
            self._invoke_callbacks()  # the base's: each callback's error is logged

    def cancel(self) -> bool:
        with _STATE_LOCK:
            state = self._state
            if state == PENDING:
                self._state = CANCELLED
        if state in (RUNNING, FINISHED):
            return False
        if state != PENDING:
            return True  # cancelled before
        condition = self.__dict__.get("_condition")
        if condition is not None:
            with condition:
                condition.notify_all()
        self._invoke_callbacks()
        return True

    def set_running_or_notify_cancel(self) -> bool:
        with _STATE_LOCK:
            state = self._state
            if state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
            elif state == PENDING:
                self._state = RUNNING
        if state == CANCELLED:
            condition = self.__dict__.get("_condition")
            if condition is not None:
                with condition:
                    for waiter in self.__dict__["_waiters"]:
                        waiter.add_cancelled(self)
            return False
        if state == PENDING:
            return True
        raise RuntimeError(f"Future in unexpected state: {state}")
