"""The writer thread of one SQLite file: group commit, in the order appends were handed over.

:class:`SQLiteWriter` is what :class:`~idempotent.adapters.sqlite.backend.SQLiteBackend` queues its appends and
snapshots to; the backend's ``_commit`` stores each group it takes in one transaction.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import attrs

from idempotent.adapters.work_queue import GroupQueue
from idempotent.backend import AppendBatch
from idempotent.core.records import Snapshot
from idempotent.errors import BackendUnavailableError, ProducerError, internal_error

_LOG = logging.getLogger("idempotent.adapters.sqlite")

__all__ = ["Append", "PositionsWrite", "SQLiteWriter"]


@attrs.frozen
class PositionsWrite:
    """The positions a transaction commits for a named producer (``positions``: None keeps
    the stored ones), queued as the last item of the transaction's appends."""

    producer_name: str
    positions: bytes | None


#: a queued append: topic, partition, batch, snapshot and the future of its base offset; a
#: snapshot written on its own (``write_snapshot``) is queued with no batch, a transaction's
#: positions with a :class:`PositionsWrite`
Append = tuple[str, int, AppendBatch | PositionsWrite | None, Snapshot | None, Future[int]]


class SQLiteWriter(GroupQueue[Append]):
    """The file's writer thread, with group commit.

    ``append`` only queues; this thread takes everything queued (every partition's batches,
    in order) and stores it in one transaction, then completes the futures: a batch's future
    resolves only after its transaction committed. SQLite lets one transaction write a file
    at a time, so one writer per file (not per partition) is what lets a producer pipeline
    batches (``max_in_flight``) and lets the transactions grow with the load.

    Snapshots written on their own (``write_snapshot``) are queued too, so every snapshot is
    stored in the order it was handed over, never before an append handed over earlier (whose
    snapshot would then replace it).

    When a transaction fails, its appends fail, and so does every later append of the
    partitions they belong to (queued or submitted after), until the partition is replayed,
    which is how the broker rebuilds it: nothing is stored behind a failed append (the
    ordering contract of ``LogBackend.append``).
    """

    def __init__(self, url: str, path: str, commit: Callable[[list[Append]], list[int]]) -> None:
        """Start the writer thread of the file at ``path`` (``url`` names it in errors);
        ``commit`` stores one group in one transaction and returns each item's offset, raising
        a mapped ``ProducerError`` when nothing of the group is stored."""
        super().__init__()
        self._url = url
        self._commit = commit
        #: partitions with a failed append, refused until replayed
        self._failed: dict[tuple[str, int], ProducerError] = {}
        self.thread = threading.Thread(target=self._run, name=f"idempotent-sqlite-{path}", daemon=True)
        self.thread.start()

    def submit(self, item: Append) -> None:
        self.submit_all((item,))

    def submit_all(self, items: Sequence[Append]) -> None:
        """Queue ``items`` together: the thread takes them in one group, so they are stored
        in one transaction (several: an application's transaction). When a partition of
        them is refused (an earlier append of it failed) or the writer is closed, all of them
        fail."""
        with self._cond:
            error = next((self._failed[(i[0], i[1])] for i in items if (i[0], i[1]) in self._failed), None)
            if error is None and self._closed:
                error = BackendUnavailableError(f"{self._url} is closed")
            if error is None:
                self._queue.extend(items)
                self._cond.notify()
                return
        for item in items:
            item[4].set_exception(error)

    def replayed(self, topic: str, partition: int) -> None:
        """The partition is being rebuilt from what is stored: take its appends again."""
        with self._cond:
            self._failed.pop((topic, partition), None)

    def close(self, timeout: float) -> None:
        """Store what is queued (the thread drains the queue before it ends), then stop; what
        is still queued after ``timeout`` seconds fails with BackendUnavailableError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self.thread.join(timeout)
        with self._cond:
            left, self._queue = self._queue, []
        error = BackendUnavailableError(f"{self._url} was closed before the append was stored")
        for item in left:
            item[4].set_exception(error)

    def store_now(self) -> None:
        """Store everything queued at once, on the writer thread itself (a ``write_snapshot``
        called back from an append this thread completed)."""
        with self._cond:
            items, self._queue = self._queue, []
        if items:
            self._store(items)

    def _run(self) -> None:
        while (items := self._take_group()) is not None:
            self._store(items)

    def _store(self, items: list[Append]) -> None:
        """Store one group in one transaction, then complete its futures."""
        try:
            offsets = self._commit(items)
        except ProducerError as exc:  # mapped by _mapped: unavailable, or a damaged file
            self._fail(items, exc)
            return
        except Exception as exc:  # a bug: logged, FATAL; the writer thread lives on
            self._fail(items, internal_error(f"sqlite: appending to {self._url}", exc, _LOG))
            return
        for item, offset in zip(items, offsets, strict=True):
            item[4].set_result(offset)

    def _fail(self, items: list[Append], error: ProducerError) -> None:
        # a bug or a damaged file stays FATAL for everything behind it too: never retriable
        failed: ProducerError = (
            error
            if not error.retriable
            else BackendUnavailableError(f"{self._url}: an earlier append of the partition failed: {error}")
        )
        with self._cond:
            for topic, partition, batch, *_ in items:
                if isinstance(batch, AppendBatch):  # a failed snapshot alone leaves its partition's log as it was
                    self._failed[(topic, partition)] = failed
            behind = [item for item in self._queue if (item[0], item[1]) in self._failed]
            self._queue = [item for item in self._queue if (item[0], item[1]) not in self._failed]
        # the failed transaction's appends first (the broker marks their partitions failed),
        # then those queued behind them, in order
        for item in items:
            item[4].set_exception(error)
        for item in behind:
            item[4].set_exception(failed)
