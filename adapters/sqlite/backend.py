"""SQLite log backend: the embedded, durable default.

URL forms (as SQLAlchemy spells them): ``sqlite:///relative/file.db`` and
``sqlite:////absolute/file.db``. Query options: ``synchronous=normal|full`` (default
``normal``: in WAL mode a committed transaction survives a crash of the process, ``full``
also survives power loss), ``timeout`` (seconds to wait for a lock, default 10) and ``check``
(``off``, the default, ``quick`` or ``full``: verify the whole file with SQLite's
``PRAGMA quick_check`` or ``integrity_check`` when opening it; the same as the ``check``
keyword and as ``idempotent check URL``).

A damaged file (SQLite's ``SQLITE_CORRUPT`` "database disk image is malformed" or
``SQLITE_NOTADB``, from any statement) raises :class:`~idempotent.errors.CorruptDataError`,
FATAL, naming the file and how to check it: retrying cannot repair it. Other SQLite errors
(a lock held too long, a full disk, an I/O error) stay ``BackendUnavailableError`` (RETRY).

Appends are queued for the file's writer thread, which stores everything queued, of every
partition, in one transaction (group commit) and only then completes the appends' futures,
so a producer can pipeline batches (``max_in_flight``). A transaction holds each batch's
records, its batch boundary (producer id, epoch, base sequence, count: what recovery replays)
and, when due, the checker snapshot.
A record's row holds only its partition's number and offset (one row id), key, value and
headers: its producer, sequence and timestamp are read from its batch's row. Databases
written by earlier versions keep their layout (the ``log`` table, or the ten-column
``records`` of the first versions) and are read and appended to in it; see
``adapters/sqlite/rows.py``.
So an acknowledged batch survives ``kill -9`` together with everything needed to rebuild the
checker. One process writes a database file at a time (an exclusive lock file, taken on the
first write, enforces it); others may read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from concurrent.futures import Future
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

import msgpack

from idempotent.adapters.sqlite.check import CHECKS, PROBLEMS_QUOTED, check_database, corrupt_file, is_corruption
from idempotent.adapters.sqlite.rows import MAX_OFFSET, MAX_PARTITION_NUMBER, insert_rows, layout_of
from idempotent.adapters.sqlite.writer import Append, PositionsWrite, SQLiteWriter
from idempotent.backend import AppendBatch
from idempotent.core.ownership import Lease, supersedes
from idempotent.core.records import Snapshot, StoredBatch, StoredRecord
from idempotent.core.registry import ProducerRecord, merge_record
from idempotent.core.sequence import sequence_at
from idempotent.core.types import NO_PRODUCER_ID, Epoch, ProducerId, Sequence
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    CorruptDataError,
    InvalidTopicError,
    ProducerError,
)
from idempotent.runtime.future import LightFuture

_LOG = logging.getLogger("idempotent.adapters.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS partition_ids (
    id INTEGER PRIMARY KEY, topic TEXT NOT NULL, partition INTEGER NOT NULL, UNIQUE (topic, partition));
CREATE TABLE IF NOT EXISTS batches (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, base_offset INTEGER NOT NULL,
    producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL, base_sequence INTEGER NOT NULL,
    record_count INTEGER NOT NULL, timestamp REAL NOT NULL,
    PRIMARY KEY (topic, partition, base_offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, position INTEGER NOT NULL,
    entries INTEGER NOT NULL, taken_at REAL NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (topic, partition, position));
CREATE TABLE IF NOT EXISTS producers (
    producer_id INTEGER PRIMARY KEY, name TEXT UNIQUE, producer_epoch INTEGER NOT NULL,
    state_lost INTEGER NOT NULL DEFAULT 0, partitions BLOB);
CREATE TABLE IF NOT EXISTS producer_principals (producer_id INTEGER PRIMARY KEY, principal TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS producer_activity (producer_id INTEGER PRIMARY KEY, last_used REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, broker_id TEXT NOT NULL, address TEXT NOT NULL,
    epoch INTEGER NOT NULL, renewed_at REAL NOT NULL, duration REAL NOT NULL, released INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS positions (producer TEXT PRIMARY KEY, data BLOB NOT NULL);
"""

_REPLAY_CHUNK = 5000


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a ``sqlite:///`` URL into a file path and options.

    ``sqlite:///relative/path.db`` (three slashes) names a file relative to the working
    directory, ``sqlite:////absolute/path.db`` (four) an absolute one. Any other spelling,
    such as ``sqlite:/x.db`` or ``sqlite://x.db``, is refused rather than guessed.

    Raises:
        ConfigError: another spelling (the message shows the right ones), no path, or an
            unknown option.
    """
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc or url[: len("sqlite:///")].lower() != "sqlite:///":
        name = url.split("?", 1)[0].split(":", 1)[-1].lstrip("/") or "file.db"
        raise ConfigError(
            f"{url!r} is not a SQLite URL: write sqlite:///{name} (three slashes) for {name!r} relative "
            f"to the working directory, or sqlite:////{name} (four) for '/{name}'"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigError(f"{url!r} names no database file")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"synchronous", "timeout", "check"}
    if unknown:
        raise ConfigError(f"unknown sqlite URL option(s) {sorted(unknown)}; known: synchronous, timeout, check")
    if options.get("synchronous", "normal").lower() not in ("normal", "full"):
        raise ConfigError("synchronous must be 'normal' or 'full'")
    if options.get("check", "off").lower() not in CHECKS:
        raise ConfigError(f"check must be one of {', '.join(CHECKS)}, got {options['check']!r}")
    return path, options


class SQLiteBackend:
    """A durable log in one SQLite file; see the module docstring."""

    durable = True

    def __init__(self, url: str, *, check: str | None = None) -> None:
        """Open (or create) the file.

        ``check`` (or the URL's ``check=``): ``off`` (default), ``quick`` or ``full``, see
        :func:`check_database`.

        Raises:
            ConfigError: a bad URL or option, or a missing directory.
            CorruptDataError: the file is damaged (found by ``check``, or on opening it).
            BackendUnavailableError: the file could not be opened.
        """
        self.url = url
        self.path, options = parse_sqlite_url(url)
        mode = (check if check is not None else options.get("check", "off")).lower()
        if mode not in CHECKS:
            raise ConfigError(f"check must be one of {', '.join(CHECKS)}, got {check!r}")
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ConfigError(f"directory {directory!r} for {url!r} does not exist")
        self._lock = threading.RLock()
        self._lockfile: IO[str] | None = None
        #: this process took the write lock since the last claim_writer() (see there)
        self._took_over = False
        self._ends: dict[tuple[str, int], int] = {}
        self._topics: dict[str, int] = {}
        self._partition_ids: dict[tuple[str, int], int] = {}
        timeout = self._timeout = float(options.get("timeout", 10))
        #: started by the first append
        self._writer: SQLiteWriter | None = None
        self._closed = False
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout, check_same_thread=False, isolation_level=None)
            self._enter_wal(timeout)
            self._db.execute(f"PRAGMA synchronous={options.get('synchronous', 'normal').upper()}")
            if mode != "off":
                try:
                    problems = check_database(self._db, mode)
                except sqlite3.Error as exc:  # damage the check cannot even walk past
                    if not is_corruption(exc):
                        raise
                    problems = [str(exc)]
                if problems:
                    shown = "; ".join(problems[:PROBLEMS_QUOTED])
                    more = f" and {len(problems) - PROBLEMS_QUOTED} more" if len(problems) > PROBLEMS_QUOTED else ""
                    raise corrupt_file(self.path, f"{mode} check: {shown}{more}")
            self._db.executescript(_SCHEMA)
            #: the table of records (see adapters/sqlite/rows.py); None: a database of the first
            #: versions, whose records keep their ten-column rows
            self._rows = layout_of(self._db)
            self._legacy = self._rows is None
            self._topics = dict(self._db.execute("SELECT name, partitions FROM topics").fetchall())
        except (sqlite3.Error, CorruptDataError) as exc:
            with contextlib.suppress(Exception):
                self._db.close()
            if isinstance(exc, CorruptDataError):
                raise
            if is_corruption(exc):
                raise corrupt_file(self.path, str(exc)) from exc
            raise BackendUnavailableError(f"cannot open {self.path!r}: {exc}") from exc

    # -- helpers ---------------------------------------------------------------------------

    def _enter_wal(self, timeout: float) -> None:
        """Switch the file to WAL, waiting up to ``timeout`` for other connections.

        On a file still in rollback mode (a new one), SQLite answers the switch with "database
        is locked" at once, without its busy handler, while another connection opens the same
        file: several processes or threads starting on one new file (a mirror and a reader, a
        Spark task and the driver) would fail for no reason. The switch is retried instead.

        Raises:
            sqlite3.OperationalError: still locked after ``timeout`` seconds, or another error.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)

    def _write_lock(self) -> None:
        if self._lockfile is not None:
            return
        handle = open(self.path + ".lock", "w")  # noqa: SIM115 - held for the backend's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise ConfigError(
                f"{self.path!r} is being written by another process (lock {self.path}.lock); "
                "one process writes a database file: for several, run a broker server on it "
                f"(idempotent broker --backend sqlite:///{self.path} --listen HOST:PORT) and give "
                "every process its idem://HOST:PORT URL"
            ) from None
        self._lockfile = handle
        self._took_over = True

    def _tx(self) -> _Transaction:
        self._write_lock()
        return _Transaction(self._db)

    def _end(self, topic: str, partition: int) -> int:
        key = (topic, partition)
        end = self._ends.get(key)
        if end is None:
            if self._legacy:
                row = self._db.execute("SELECT MAX(offset) FROM records WHERE topic=? AND partition=?", key).fetchone()
                end = 0 if row[0] is None else row[0] + 1
            else:
                assert self._rows is not None
                part = self._partition_id(topic, partition)
                end = 0 if part is None else self._rows.end(self._db, part)
            if self._lockfile is not None:  # only the single writer may cache: readers must see growth
                self._ends[key] = end
        return end

    def _partition_id(self, topic: str, partition: int, db: sqlite3.Connection | None = None) -> int | None:
        """The number of a partition in the record rows; with ``db`` (a write transaction)
        one is assigned when the partition has none yet."""
        key = (topic, partition)
        part = self._partition_ids.get(key)
        if part is None:
            row = self._db.execute("SELECT id FROM partition_ids WHERE topic=? AND partition=?", key).fetchone()
            if row is None:
                if db is None:
                    return None
                row = (db.execute("INSERT INTO partition_ids (topic, partition) VALUES (?, ?)", key).lastrowid,)
                if row[0] is None or row[0] > MAX_PARTITION_NUMBER:  # rolled back with the transaction
                    raise InvalidTopicError(f"{self.path!r} holds {MAX_PARTITION_NUMBER} partitions, the most it can")
            part = self._partition_ids[key] = row[0]
        return part

    def _check(self, topic: str, partition: int) -> None:
        if not 0 <= partition < self._topics.get(topic, 0):
            raise InvalidTopicError(f"no partition {topic}[{partition}] in {self.url}")

    # -- LogBackend ------------------------------------------------------------------------

    def list_topics(self) -> dict[str, int]:
        with self._lock, _mapped(self.url):
            self._topics = dict(self._db.execute("SELECT name, partitions FROM topics").fetchall())
            return dict(self._topics)

    def describe_topic(self, topic: str) -> int | None:
        with self._lock, _mapped(self.url):
            row = self._db.execute("SELECT partitions FROM topics WHERE name = ?", (topic,)).fetchone()
        if row is None:
            return None
        self._topics[topic] = int(row[0])
        return int(row[0])

    def create_topic(self, topic: str, partitions: int) -> int:
        with self._lock, _mapped(self.url), self._tx() as db:
            db.execute("INSERT OR IGNORE INTO topics VALUES (?, ?)", (topic, partitions))
            (count,) = db.execute("SELECT partitions FROM topics WHERE name = ?", (topic,)).fetchone()
        self._topics[topic] = int(count)
        return int(count)

    def delete_topic(self, topic: str) -> None:
        with self._lock, _mapped(self.url), self._tx() as db:
            parts = [row[0] for row in db.execute("SELECT id FROM partition_ids WHERE topic=?", (topic,))]
            if self._rows is None:  # the ten-column rows of the first versions
                db.execute("DELETE FROM records WHERE topic=?", (topic,))
            else:
                for part in parts:
                    self._rows.delete(db, part)
            for table in ("partition_ids", "batches", "snapshots", "leases"):
                db.execute(f"DELETE FROM {table} WHERE topic=?", (topic,))
            db.execute("DELETE FROM topics WHERE name=?", (topic,))
        self._topics.pop(topic, None)
        for cache in (self._ends, self._partition_ids):
            for key in [k for k in cache if k[0] == topic]:
                del cache[key]

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        """Queue the batch for the file's writer thread; see :class:`~idempotent.adapters.sqlite.writer.SQLiteWriter`.

        Raises:
            ConfigError: another process writes the file; nothing was queued.
        """
        future: Future[int] = LightFuture()
        if self._closed:
            future.set_exception(BackendUnavailableError(f"{self.url} is closed"))
            return future
        if not 0 <= partition < self._topics.get(topic, 0):
            future.set_exception(InvalidTopicError(f"no partition {topic}[{partition}] in {self.url}"))
            return future
        writer = self._writer
        if writer is None or self._lockfile is None:
            try:
                writer = self._start_writer()
            except BackendUnavailableError as exc:  # closed meanwhile: take no lock file again
                future.set_exception(exc)
                return future
        writer.submit((topic, partition, batch, snapshot, future))
        return future

    def append_atomic(
        self, appends: Seq[tuple[str, int, AppendBatch, Snapshot | None]], positions: tuple[str, bytes] | None
    ) -> Future[list[int]]:
        """Queue the batches and the positions as one group of the writer thread, stored in one
        transaction of the file (:class:`~idempotent.backend.AtomicAppends`).

        Raises:
            ConfigError: another process writes the file; nothing was queued.
        """
        done: Future[list[int]] = LightFuture()
        failure: ProducerError | None = None
        if self._closed:
            failure = BackendUnavailableError(f"{self.url} is closed")
        for topic, partition, _, _ in appends:
            if failure is None and not 0 <= partition < self._topics.get(topic, 0):
                failure = InvalidTopicError(f"no partition {topic}[{partition}] in {self.url}")
        writer = self._writer
        if failure is None and (writer is None or self._lockfile is None):
            try:
                writer = self._start_writer()
            except BackendUnavailableError as exc:
                failure = exc
        if failure is not None or writer is None:
            done.set_exception(failure or BackendUnavailableError(f"{self.url} is closed"))
            return done
        items: list[Append] = [(t, p, b, snap, LightFuture()) for t, p, b, snap in appends]
        name, data = positions if positions is not None else ("", None)
        marker: Future[int] = LightFuture()  # the group's last item: ends after all of them
        items.append(("", -1, PositionsWrite(name, data), None, marker))

        def ended(_: Future[int]) -> None:
            error = next((f.exception() for _, _, _, _, f in items if f.exception() is not None), None)
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result([f.result() for _, _, _, _, f in items[:-1]])

        marker.add_done_callback(ended)
        writer.submit_all(items)
        return done

    def committed_positions(self, producer_name: str) -> bytes | None:
        with self._lock, _mapped(self.url):
            row = self._db.execute("SELECT data FROM positions WHERE producer=?", (producer_name,)).fetchone()
        return None if row is None else bytes(row[0])

    def _start_writer(self) -> SQLiteWriter:
        """The file's writer thread, started on first use (taking the write lock).

        Raises:
            ConfigError: another process writes the file.
            BackendUnavailableError: the backend is closed.
        """
        with self._lock:
            if self._closed:
                raise BackendUnavailableError(f"{self.url} is closed")
            self._write_lock()
            writer = self._writer
            if writer is None:
                # the commit is looked up per group, not bound once (tests replace it on a live backend)
                writer = self._writer = SQLiteWriter(self.url, self.path, lambda items: self._commit(items))
            return writer

    def _commit(self, items: list[Append]) -> list[int]:
        """Store a group of queued appends in one transaction; their base offsets, in order.

        Raises:
            BackendUnavailableError: nothing of the group is stored.
        """
        offsets: list[int] = []
        ends: dict[tuple[str, int], int] = {}
        try:
            with self._lock, _mapped(self.url):
                with self._tx() as db:
                    rows: list[Any] = []  # value after value (see insert_rows)
                    bounds: list[tuple[Any, ...]] = []
                    for topic, partition, batch, snapshot, _ in items:
                        if isinstance(batch, PositionsWrite):  # a transaction's, after its batches
                            if batch.positions is not None:
                                db.execute(
                                    "INSERT OR REPLACE INTO positions VALUES (?, ?)",
                                    (batch.producer_name, batch.positions),
                                )
                            offsets.append(-1)
                            continue
                        if batch is None:  # a snapshot on its own (write_snapshot), in its turn
                            if snapshot is not None:
                                self._put_snapshot(db, topic, partition, snapshot)
                            offsets.append(-1)
                            continue
                        key = (topic, partition)
                        base = ends[key] if key in ends else self._end(topic, partition)
                        records = batch.records
                        header = batch.header
                        pid = header.producer_id if header else NO_PRODUCER_ID
                        epoch = header.producer_epoch if header else -1
                        base_seq = header.base_sequence if header else -1
                        if self._legacy:
                            rows.extend(
                                value
                                for i, r in enumerate(records)
                                for value in (
                                    topic,
                                    partition,
                                    base + i,
                                    pid,
                                    epoch,
                                    sequence_at(base_seq, i) if header else -1,
                                    r.key,
                                    r.value,
                                    msgpack.packb(r.headers) if r.headers else None,
                                    batch.timestamp,
                                )
                            )
                        else:
                            assert self._rows is not None
                            part = self._partition_id(topic, partition, db)
                            assert part is not None
                            if base + len(records) - 1 > MAX_OFFSET:
                                raise InvalidTopicError(f"{topic}[{partition}] is full: {MAX_OFFSET + 1} records")
                            self._rows.add_rows(rows, part, base, records)
                        bounds.append((topic, partition, base, pid, epoch, base_seq, len(records), batch.timestamp))
                        if snapshot is not None:
                            self._put_snapshot(db, topic, partition, snapshot)
                        offsets.append(base)
                        ends[key] = base + len(records)
                    if self._rows is None:
                        insert_rows(db, "records", 10, rows)
                    else:
                        insert_rows(db, self._rows.table, self._rows.width, rows)
                    db.executemany("INSERT INTO batches VALUES (?,?,?,?,?,?,?,?)", bounds)
                self._ends.update(ends)
        except BaseException:
            for topic, partition, *_ in items:
                self._ends.pop((topic, partition), None)
                self._partition_ids.pop((topic, partition), None)  # its row may have rolled back
            raise
        return offsets

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        with self._lock, _mapped(self.url):
            self._check(topic, partition)
            if self._legacy:
                rows = self._db.execute(
                    "SELECT offset, producer_id, producer_epoch, sequence, key, value, headers, timestamp "
                    "FROM records WHERE topic=? AND partition=? AND offset>=? ORDER BY offset LIMIT ?",
                    (topic, partition, offset, max_records),
                ).fetchall()
                return [
                    StoredRecord(o, p, e, s, k, v, tuple((n, d) for n, d in msgpack.unpackb(h)) if h else (), t)
                    for o, p, e, s, k, v, h, t in rows
                ]
            part = self._partition_id(topic, partition)
            if part is None:
                return []
            assert self._rows is not None
            slim = self._rows.read(self._db, part, offset, max_records)
            if not slim:
                return []
            # the batches holding those records: the one holding the first, and every later one
            batches = self._db.execute(
                "SELECT base_offset, producer_id, producer_epoch, base_sequence, timestamp FROM batches "
                "WHERE topic=? AND partition=? AND base_offset<=? AND base_offset>=COALESCE(("
                "SELECT MAX(base_offset) FROM batches WHERE topic=? AND partition=? AND base_offset<=?), 0) "
                "ORDER BY base_offset",
                (topic, partition, slim[-1][0], topic, partition, slim[0][0]),
            ).fetchall()
        out: list[StoredRecord] = []
        index = 0
        base, pid, epoch, base_seq, timestamp = batches[0]
        for o, k, v, h in slim:
            while index + 1 < len(batches) and batches[index + 1][0] <= o:
                index += 1
                base, pid, epoch, base_seq, timestamp = batches[index]
            sequence = sequence_at(base_seq, o - base) if base_seq >= 0 else -1
            headers = tuple((n, d) for n, d in msgpack.unpackb(h)) if h else ()
            out.append(StoredRecord(o, pid, epoch, sequence, k, v, headers, timestamp))
        return out

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        writer = self._writer
        if writer is not None:
            writer.replayed(topic, partition)
        return self._replay(topic, partition, from_offset)

    def _replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        position = from_offset
        while True:
            with self._lock, _mapped(self.url):
                rows = self._db.execute(
                    "SELECT base_offset, producer_id, producer_epoch, base_sequence, record_count, timestamp "
                    "FROM batches WHERE topic=? AND partition=? AND base_offset>=? ORDER BY base_offset LIMIT ?",
                    (topic, partition, position, _REPLAY_CHUNK),
                ).fetchall()
            for base, pid, epoch, seq, count, ts in rows:
                yield StoredBatch(base, ProducerId(pid), Epoch(epoch), Sequence(seq), count, ts)
            if len(rows) < _REPLAY_CHUNK:
                return
            position = rows[-1][0] + 1

    def end_offset(self, topic: str, partition: int) -> int:
        with self._lock, _mapped(self.url):
            self._check(topic, partition)
            return self._end(topic, partition)

    def latest_snapshot(self, topic: str, partition: int) -> Snapshot | None:
        with self._lock, _mapped(self.url):
            row = self._db.execute(
                "SELECT position, entries, taken_at, data FROM snapshots WHERE topic=? AND partition=? "
                "ORDER BY position DESC LIMIT 1",
                (topic, partition),
            ).fetchone()
        return None if row is None else Snapshot(row[0], row[1], row[2], bytes(row[3]))

    def _put_snapshot(self, db: sqlite3.Connection, topic: str, partition: int, snapshot: Snapshot) -> None:
        db.execute(
            "INSERT OR REPLACE INTO snapshots VALUES (?,?,?,?,?,?)",
            (topic, partition, snapshot.position, snapshot.entries, snapshot.taken_at, snapshot.data),
        )
        db.execute(
            "DELETE FROM snapshots WHERE topic=? AND partition=? AND position < ("
            "SELECT MIN(position) FROM (SELECT position FROM snapshots WHERE topic=? AND partition=? "
            "ORDER BY position DESC LIMIT 2))",
            (topic, partition, topic, partition),
        )

    def write_snapshot(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        """Store a snapshot in its turn: through the writer thread, after every append handed
        over before it (a snapshot such an append carries is older and must not replace this
        one; see ``LogBackend.write_snapshot``). Returns once it is committed.

        Raises:
            BackendUnavailableError: not stored (the transaction failed, an earlier append of
                the partition failed, or the backend is closed).
            CorruptDataError: the file is damaged.
            ConfigError: another process writes the file.
        """
        writer = self._writer
        if writer is None or self._lockfile is None:
            writer = self._start_writer()
        future: Future[int] = LightFuture()
        writer.submit((topic, partition, None, snapshot, future))
        if threading.current_thread() is writer.thread:
            writer.store_now()  # called back from a completed append: the queue cannot wait for us
        future.result()

    def allocate_producer_ids(self, count: int) -> int:
        with self._lock, _mapped(self.url), self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key='next_producer_id'").fetchone()
            start = int(row[0]) if row else 0
            db.execute("INSERT OR REPLACE INTO meta VALUES ('next_producer_id', ?)", (str(start + count),))
        return start

    def load_producers(self) -> list[ProducerRecord]:
        with self._lock, _mapped(self.url):
            rows = self._db.execute(
                "SELECT p.producer_id, p.producer_epoch, p.name, p.state_lost, p.partitions, o.principal, a.last_used "
                "FROM producers p LEFT JOIN producer_principals o USING (producer_id) "
                "LEFT JOIN producer_activity a USING (producer_id)"
            ).fetchall()
        return [
            ProducerRecord(
                ProducerId(p),
                Epoch(e),
                n,
                bool(s),
                tuple((t, q) for t, q in msgpack.unpackb(parts or b"\x90")),
                owner,
                float(used or 0.0),
            )
            for p, e, n, s, parts, owner, used in rows
        ]

    def save_producer(self, record: ProducerRecord) -> None:
        with self._lock, _mapped(self.url), self._tx() as db:
            row = db.execute(
                "SELECT p.producer_epoch, p.name, p.state_lost, p.partitions, o.principal, a.last_used "
                "FROM producers p LEFT JOIN producer_principals o USING (producer_id) "
                "LEFT JOIN producer_activity a USING (producer_id) WHERE p.producer_id=?",
                (record.producer_id,),
            ).fetchone()
            known = None
            if row is not None:
                e, n, lost, parts, owner, used = row
                known = ProducerRecord(
                    record.producer_id,
                    Epoch(e),
                    n,
                    bool(lost),
                    tuple((t, q) for t, q in msgpack.unpackb(parts or b"\x90")),
                    owner,
                    float(used or 0.0),
                )
            record = merge_record(known, record)  # a stale copy must not undo a newer record
            if record is known:
                return
            if record.producer_name is not None:
                moved = (record.producer_name, record.producer_id)
                for table in ("producer_principals", "producer_activity"):
                    db.execute(
                        f"DELETE FROM {table} WHERE producer_id IN "
                        "(SELECT producer_id FROM producers WHERE name=? AND producer_id<>?)",
                        moved,
                    )
                db.execute("DELETE FROM producers WHERE name=? AND producer_id<>?", moved)
            if record.principal is None:
                db.execute("DELETE FROM producer_principals WHERE producer_id=?", (record.producer_id,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO producer_principals VALUES (?,?)", (record.producer_id, record.principal)
                )
            db.execute("INSERT OR REPLACE INTO producer_activity VALUES (?,?)", (record.producer_id, record.last_used))
            db.execute(
                "INSERT OR REPLACE INTO producers VALUES (?,?,?,?,?)",
                (
                    record.producer_id,
                    record.producer_name,
                    record.producer_epoch,
                    int(record.state_lost),
                    msgpack.packb([list(tp) for tp in record.partitions]),
                ),
            )

    def delete_producers(self, producer_ids: Seq[int]) -> None:
        ids = [(int(producer_id),) for producer_id in producer_ids]
        with self._lock, _mapped(self.url), self._tx() as db:
            for table in ("producers", "producer_principals", "producer_activity"):
                db.executemany(f"DELETE FROM {table} WHERE producer_id=?", ids)

    def load_settings(self) -> dict[str, str]:
        with self._lock, _mapped(self.url):
            rows = self._db.execute("SELECT key, value FROM meta WHERE key LIKE 'setting:%'").fetchall()
        return {k[len("setting:") :]: v for k, v in rows}

    def save_setting(self, key: str, value: str | None) -> None:
        with self._lock, _mapped(self.url), self._tx() as db:
            if value is None:
                db.execute("DELETE FROM meta WHERE key=?", ("setting:" + key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", ("setting:" + key, value))

    _LEASE_COLUMNS = "topic, partition, broker_id, address, epoch, renewed_at, duration, released"

    @staticmethod
    def _lease(row: tuple[Any, ...]) -> Lease:
        topic, partition, broker_id, address, epoch, renewed_at, duration, released = row
        return Lease(topic, partition, broker_id, address, epoch, renewed_at, duration, bool(released))

    def load_leases(self) -> list[Lease]:
        with self._lock, _mapped(self.url):
            rows = self._db.execute(f"SELECT {self._LEASE_COLUMNS} FROM leases").fetchall()
        return [self._lease(row) for row in rows]

    def propose_leases(self, proposals: Seq[Lease]) -> list[Lease | None]:
        # a plain transaction, not _tx(): ownership records are shared by every broker over
        # the file, while appends stay with the one process holding the write lock
        out: list[Lease | None] = []
        with self._lock, _mapped(self.url), _Transaction(self._db) as db:
            for proposal in proposals:
                row = db.execute(
                    f"SELECT {self._LEASE_COLUMNS} FROM leases WHERE topic=? AND partition=?",
                    (proposal.topic, proposal.partition),
                ).fetchone()
                current = self._lease(row) if row is not None else None
                if supersedes(current, proposal):
                    db.execute(
                        f"INSERT OR REPLACE INTO leases ({self._LEASE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                        (
                            proposal.topic,
                            proposal.partition,
                            proposal.broker_id,
                            proposal.address,
                            proposal.epoch,
                            proposal.renewed_at,
                            proposal.duration,
                            int(proposal.released),
                        ),
                    )
                    current = proposal
                out.append(current)
        return out

    #: no limit of its own below the broker's (LogBackend.max_record_bytes)
    max_record_bytes: int | None = None
    max_batch_bytes: int | None = None

    def claim_writer(self) -> bool:
        with self._lock:
            self._write_lock()
            took_over, self._took_over = self._took_over, False
            return took_over

    def release(self, topic: str, partition: int) -> None:
        return None

    def close(self) -> None:
        self._closed = True
        writer = self._writer
        if writer is not None:
            writer.close(2 * self._timeout + 5)
        with self._lock:
            try:
                self._db.close()
            finally:
                if self._lockfile is not None:
                    self._lockfile.close()
                    self._lockfile = None


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> sqlite3.Connection:
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")


class _mapped:
    """Translate sqlite3 errors, once, at the adapter edge: a damaged file into the FATAL
    :class:`CorruptDataError` (see :func:`is_corruption`), anything else into
    BackendUnavailableError."""

    def __init__(self, url: str) -> None:
        self._url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and isinstance(exc, sqlite3.Error):
            if is_corruption(exc):
                raise corrupt_file(parse_sqlite_url(self._url)[0], str(exc)) from exc
            raise BackendUnavailableError(f"{self._url}: {exc}") from exc
