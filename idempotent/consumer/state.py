"""Commit the application's state and its read position in one SQLite transaction.

Effectively-once consumption: a consumer that stores the effects of processing a message
and the :class:`~idempotent.consumer.reader.MessageId` of that message *atomically* never loses an
effect and never applies one twice, however it crashes. After a restart the Reader resumes
right after the stored id, and the effects of anything later were never committed.

    checkpoint = SqliteCheckpoint("state.db")
    checkpoint.db.execute("CREATE TABLE IF NOT EXISTS counts (key TEXT PRIMARY KEY, n INTEGER)")
    with checkpoint.reader("sqlite:///log.db", "events") as reader:
        for message in reader:
            with checkpoint.commit(message.message_id) as db:
                db.execute("INSERT INTO counts VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET n = n + 1",
                           (message.key,))

Crash semantics: the transaction is ``BEGIN IMMEDIATE`` ... ``COMMIT`` on a database in WAL
mode with ``synchronous=FULL``. A crash (even SIGKILL or power loss) before ``COMMIT``
returns leaves neither the state changes nor the position; after it returns, both are
durable. Only effects written through the yielded connection are covered: anything else the
application does while processing (sending mail, calling services) happens again for the
messages after the stored position, so it must be idempotent itself (see
:class:`~idempotent.consumer.dedup.DuplicateFilter`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idempotent.api import BrokerAPI
from idempotent.consumer.reader import MessageId, Reader
from idempotent.errors import ConfigError, ProducerClosedError, UsageError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotent_positions (
    reader TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    message_id BLOB NOT NULL,
    PRIMARY KEY (reader, topic, partition)
)
"""


class SqliteCheckpoint:
    """The application's SQLite database plus one position per (reader, topic, partition).

    Args:
        path: the database file (created if missing). The application keeps its own tables
            in it: use :attr:`db` for reads and schema, :meth:`commit` for every change that
            must be atomic with the read position.
        name: which reader the positions belong to, so several readers can share a file.

    Not thread-safe: use one instance per thread.

    Raises:
        ConfigError: the file cannot be opened as a SQLite database.
    """

    def __init__(self, path: str | Path, name: str = "default") -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty str, got {name!r}")
        self._name = name
        try:
            self._db = sqlite3.connect(str(path), isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.execute(_SCHEMA)
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open checkpoint database {str(path)!r}: {exc}") from exc
        self._in_commit = False
        self._closed = False

    @property
    def db(self) -> sqlite3.Connection:
        """The connection (autocommit outside :meth:`commit`): create tables, query state."""
        self._check_open()
        return self._db

    @property
    def name(self) -> str:
        """The reader name positions are stored under."""
        return self._name

    @contextlib.contextmanager
    def commit(self, *message_ids: MessageId) -> Iterator[sqlite3.Connection]:
        """One transaction: the block's changes plus the position after ``message_ids``.

        Yields the connection; every statement the block runs on it belongs to the
        transaction. When the block ends normally, each id becomes the position of its
        partition (for several ids of one partition, the highest) and everything commits at
        once. When it raises, everything rolls back and the exception propagates. Do not call
        ``commit()``/``rollback()`` on the connection inside the block.

        Raises:
            ConfigError: an argument is not a MessageId (nothing changed).
            UsageError: nested ``commit`` blocks.
            ProducerClosedError: the checkpoint is closed.
            sqlite3.Error: the application's statements or the commit failed (rolled back).
        """
        self._check_open()
        if self._in_commit:
            raise UsageError("commit blocks do not nest")
        latest: dict[tuple[str, int], MessageId] = {}
        for message_id in message_ids:
            if not isinstance(message_id, MessageId):
                raise ConfigError(f"expected MessageIds, got {type(message_id).__name__}")
            key = (message_id.topic, message_id.partition)
            if key not in latest or message_id > latest[key]:
                latest[key] = message_id
        self._in_commit = True
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                for message_id in latest.values():
                    self._db.execute(
                        "INSERT OR REPLACE INTO idempotent_positions VALUES (?, ?, ?, ?)",
                        (self._name, message_id.topic, message_id.partition, message_id.serialize()),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        finally:
            self._in_commit = False

    def positions(self, topic: str) -> list[MessageId]:
        """The stored position of each partition of ``topic`` (partitions never committed
        are missing), in partition order."""
        self._check_open()
        rows = self._db.execute(
            "SELECT message_id FROM idempotent_positions WHERE reader = ? AND topic = ? ORDER BY partition",
            (self._name, topic),
        ).fetchall()
        return [MessageId.deserialize(row[0]) for row in rows]

    def position(self, topic: str, partition: int = 0) -> MessageId | None:
        """The last committed id of ``topic[partition]``, or None."""
        for message_id in self.positions(topic):
            if message_id.partition == partition:
                return message_id
        return None

    def reader(self, url_or_broker: str | BrokerAPI, topic: str, **options: Any) -> Reader:
        """A :class:`Reader` of ``topic`` that resumes right after the stored positions
        (partitions without one start at the earliest message). ``options`` go to Reader.

        Raises:
            As :class:`Reader`.
        """
        self._check_open()
        partition = options.get("partition")
        ids = [m for m in self.positions(topic) if partition is None or m.partition == partition]
        return Reader(url_or_broker, topic, ids, **options)

    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError("checkpoint is closed")

    def close(self) -> None:
        """Close the database. Committed data stays. Idempotent."""
        if not self._closed:
            self._closed = True
            self._db.close()

    def __enter__(self) -> SqliteCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SqliteCheckpoint"]
