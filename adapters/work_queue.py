"""The queue every adapter's writer thread takes its work from.

``append`` only queues; the writer thread takes everything queued at once and stores it as
one group (an SQLite transaction, a Kafka transaction, a Pulsar entry), so the groups grow
with the load (group commit).
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class GroupQueue(Generic[T]):
    """Base of the writers: ``_cond`` guards ``_queue`` and ``_closed`` (and whatever failure
    state the writer keeps next to them)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[T] = []
        self._closed = False

    def _take_group(self) -> list[T] | None:
        """Wait until something is queued and take all of it; None once closed and drained."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            items, self._queue = self._queue, []
            return items
