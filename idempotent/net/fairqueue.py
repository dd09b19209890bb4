"""A work queue that serves its sources in turn, for the broker server's worker threads.

The server queues each connection's requests under that connection (the *source*).
Workers take one request at a time, from the sources in round-robin order, so a request of
a new connection waits behind at most one request per other busy connection, never behind
everything one greedy client queued. A source that is *held* (its peer does not read its
answers) is skipped until :meth:`FairQueue.wake` is called after it resumes; a source that
is gone is :meth:`FairQueue.drop`\\ ped with everything it queued.

Theory of operation: one lock and one condition. ``_sources`` maps a source to its deque of
items, in the order sources are served next (a dict keeps insertion order; serving a
source moves it to the end). :meth:`FairQueue.get` scans for the first source that is not
held, so its cost grows with the number of sources that have work queued (bounded by the
number of connections).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class FairQueue(Generic[K, T]):
    """Items grouped by source, taken one at a time from the sources in turn.

    Args:
        held: called under the queue's lock with a source; True skips the source for now
            (its items stay queued). It must be cheap and must not call back into the queue.
    """

    def __init__(self, held: Callable[[K], bool]) -> None:
        self._held = held
        self._cond = threading.Condition()
        self._sources: dict[K, deque[T]] = {}
        self._closed = False
        self._holding = True

    def put(self, source: K, item: T) -> None:
        """Queue ``item`` after the other items of ``source``. Ignored once closed."""
        with self._cond:
            if self._closed:
                return
            items = self._sources.get(source)
            if items is None:
                items = self._sources[source] = deque()
            items.append(item)
            self._cond.notify()

    def get(self) -> tuple[K, T] | None:
        """The next item of the next source that is not held, waiting for one; None once
        :meth:`close` was called and nothing can be served any more."""
        with self._cond:
            while True:
                for source, items in self._sources.items():
                    if self._holding and self._held(source):
                        continue
                    item = items.popleft()
                    del self._sources[source]
                    if items:
                        self._sources[source] = items  # to the end of the turn
                    return source, item
                if self._closed:
                    return None
                self._cond.wait()

    def drop(self, source: K) -> int:
        """Forget everything ``source`` queued; return how many items were dropped."""
        with self._cond:
            items = self._sources.pop(source, None)
            return 0 if items is None else len(items)

    def wake(self) -> None:
        """A held source may have been released: let waiting workers look again."""
        with self._cond:
            self._cond.notify_all()

    def stop_holding(self) -> None:
        """Serve every source from now on, held or not (a server draining before it stops)."""
        with self._cond:
            self._holding = False
            self._cond.notify_all()

    def close(self) -> None:
        """Accept nothing more; :meth:`get` serves what is queued, then returns None."""
        with self._cond:
            self._closed = True
            self._holding = False
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return sum(len(items) for items in self._sources.values())
