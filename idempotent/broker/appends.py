"""The end of a broker's appends: what happens once the backend answered one.

A :class:`~idempotent.broker.broker.Broker` hands each accepted batch to its backend and tracks the
append here (:meth:`AppendCompletions.track`). When the backend answers, the partition's core
decides (:meth:`~idempotent.core.partition.PartitionCore.completed`, carried out by
:func:`idempotent.broker.decisions.completed` under the partition lock):
the batch is committed and its future gets the :class:`~idempotent.ProduceResult`, or the
append failed and the future fails with the backend's error (an error outside the tree is a
bug of the backend: a logged FATAL ``InternalError``); a snapshot that became overdue is
written. Observers hear of the append (and of its snapshot) first.

A synchronous backend's append is finished at once, by the caller, under the partition lock
it holds: a failed append marks the partition failed before any later batch of it is appended
(the ordering contract of ``LogBackend.append``). An asynchronous backend's thread only queues
the append for the completion thread, so it never waits for a broker lock (one may be needed
to finish a snapshot write).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from idempotent.broker import decisions
from idempotent.broker.observer import BrokerObserver, notify
from idempotent.broker.partitions import PartitionShell
from idempotent.core.outcomes import ProduceResult
from idempotent.core.partition import Append, Reply
from idempotent.errors import ProducerError, internal_error

_LOG = logging.getLogger("idempotent.broker")


class PendingAppend:
    """An append handed to the backend: what finishing it needs (one per batch; a plain
    slotted class, as cheap to build as a tuple). It does not hold the backend's future: that
    future's done-callback holds it, and a reference back would make a cycle per batch,
    garbage that only the cyclic collector frees."""

    __slots__ = ("append", "out", "part", "started")

    def __init__(self, part: PartitionShell, append: Append, started: float, out: Future[ProduceResult]) -> None:
        self.part, self.append, self.started, self.out = part, append, started, out


class AppendCompletions:
    """Finishes a broker's appends (see the module docstring), with its completion thread.
    Thread-safe.

    Args:
        observers: the broker's observers at the time an append ends.
    """

    def __init__(self, observers: Callable[[], tuple[BrokerObserver, ...]]) -> None:
        self._observers = observers
        self._queue: queue.SimpleQueue[tuple[PendingAppend, Future[int]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="idempotent-completions", daemon=True)
        self._thread.start()

    def track(self, pending: PendingAppend, appended: Future[int]) -> None:
        """Finish ``pending`` when the backend's future ``appended`` is done: now, when it is
        already (needs the partition's lock), else on the completion thread."""
        if appended.done():
            self.finish(pending, appended)
        else:
            appended.add_done_callback(functools.partial(_queue_completion, self._queue.put, pending))

    def finish(self, pending: PendingAppend, appended: Future[int]) -> None:
        """Carry out what the core decides about an append the backend answered, and answer
        its future."""
        part, append, out = pending.part, pending.append, pending.out
        exc = appended.exception()
        observers = self._observers()
        if observers:
            seconds = time.monotonic() - pending.started
            notify(observers, "append_completed", part.tp.topic, part.tp.partition, seconds, exc is None)
            if append.with_snapshot:
                notify(observers, "snapshot_written", part.tp.topic, part.tp.partition, exc is None)
        with part.lock:
            # the one decision loop (decisions.py): the core takes the outcome, an overdue
            # snapshot is written
            answer = decisions.completed(
                part.core, part, append, appended.result() if exc is None else exc, time.time()
            )
            part.cond.notify_all()
        if isinstance(answer, Reply):
            out.set_result(answer.result)
            return
        error = answer.error
        if not isinstance(error, ProducerError):  # the backend broke its contract: a bug
            error = internal_error(f"appending to {part.tp}", error, _LOG)
        out.set_exception(error)

    def stop(self) -> None:
        """End the completion thread once it finished what is queued (appends the backend
        answers later are not finished)."""
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.finish(*item)
            except Exception as exc:  # a bug: logged; the future reports it, the others complete
                future = item[0].out
                if not future.done():
                    future.set_exception(internal_error("completing an append", exc, _LOG))


def _queue_completion(
    put: Callable[[tuple[PendingAppend, Future[int]]], None], pending: PendingAppend, appended: Future[int]
) -> None:
    """The backend's future is done: queue it for the completion thread (see PendingAppend)."""
    put((pending, appended))
