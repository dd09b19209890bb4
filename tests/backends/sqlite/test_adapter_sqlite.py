"""SQLite specifics beyond the shared conformance suite."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent import Record
from idempotent.adapters.sqlite.backend import SQLiteBackend
from idempotent.backend import AppendBatch
from idempotent.errors import BackendUnavailableError

OLD_SCHEMA = """
CREATE TABLE producers (
    producer_id INTEGER PRIMARY KEY, name TEXT UNIQUE, producer_epoch INTEGER NOT NULL,
    state_lost INTEGER NOT NULL DEFAULT 0, partitions BLOB);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO producers VALUES (5, 'legacy', 2, 0, X'90');
INSERT INTO meta VALUES ('next_producer_id', '100');
"""


def test_producer_owners_next_to_databases_of_older_versions(tmp_path: Path) -> None:
    """Owners live in their own table: a database written before producers had owners opens
    with every producer unowned, and the producers table keeps the shape older versions write."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.close()
    url = f"sqlite:///{path}"
    broker = idempotent.connect(url)
    try:
        legacy = broker.producer_record(5)
        assert legacy is not None and (legacy.producer_name, legacy.producer_epoch, legacy.principal) == (
            "legacy",
            2,
            None,
        )
        assert broker.init_producer("legacy").producer_epoch == 3
        owned = broker.init_producer("new", claim=lambda previous: "alice")
    finally:
        broker.close()
    db = sqlite3.connect(path)
    assert [row[1] for row in db.execute("PRAGMA table_info(producers)")][-1] == "partitions"
    db.execute("INSERT OR REPLACE INTO producers VALUES (6, 'written-by-an-older-version', 0, 0, X'90')")
    db.commit()
    db.close()
    broker = idempotent.connect(url)
    try:
        assert (r := broker.producer_record(5)) is not None and (r.producer_epoch, r.principal) == (3, None)
        assert (r := broker.producer_record(owned.producer_id)) is not None and r.principal == "alice"
        assert (r := broker.producer_record(6)) is not None and r.principal is None
    finally:
        broker.close()


LEGACY_RECORDS = """
CREATE TABLE records (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL, sequence INTEGER NOT NULL,
    key BLOB, value BLOB, headers BLOB, timestamp REAL NOT NULL,
    PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID;
"""


def _produce(url: str, name: str, values: list[bytes]) -> list[int | None]:
    with idempotent.Producer(url, name, max_batch_records=3, linger_ms=1) as producer:
        deliveries = producer.send_many(
            "t", [idempotent.Record(v, key=b"k", headers={"h": v}) for v in values], partition=0
        )
        return [m.offset for m in deliveries.result(10)]  # type: ignore[union-attr]


def test_records_are_slim_rows_read_back_with_their_batch(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    url = f"sqlite:///{path}"
    assert _produce(url, "a", [b"a0", b"a1", b"a2", b"a3"]) == [0, 1, 2, 3]
    assert _produce(url, "b", [b"b0", b"b1"]) == [4, 5]
    db = sqlite3.connect(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    columns = [row[1] for row in db.execute("PRAGMA table_info(entries)")]
    db.close()
    assert not tables & {"records", "log"} and columns == ["id", "key", "value", "headers"]
    broker = idempotent.connect(url)
    try:
        everything = broker.read("t", 0, 0, 100)
        middle = broker.read("t", 0, 2, 3)  # starts inside a batch, crosses two boundaries
        assert broker.end_offset("t", 0) == 6 and broker.read("t", 0, 6, 10) == []
    finally:
        broker.close()
    assert [(r.value, r.key, r.headers) for r in everything] == [
        (v, b"k", (("h", v),)) for v in (b"a0", b"a1", b"a2", b"a3", b"b0", b"b1")
    ]
    assert [r.sequence for r in everything] == [0, 1, 2, 3, 0, 1]
    assert len({r.producer_id for r in everything[:4]}) == 1 and everything[4].producer_id != everything[0].producer_id
    assert middle == everything[2:5] and all(r.timestamp > 0 for r in everything)


def test_a_database_with_ten_column_records_keeps_that_layout(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    db = sqlite3.connect(path)
    db.executescript(LEGACY_RECORDS)
    db.close()
    url = f"sqlite:///{path}"
    assert _produce(url, "a", [b"a0", b"a1", b"a2", b"a3"]) == [0, 1, 2, 3]
    assert _produce(url, "a", [b"a4"]) == [4]  # reopened: still the old layout
    db = sqlite3.connect(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    count = db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    db.close()
    assert count == 5 and not tables & {"log", "entries"}
    broker = idempotent.connect(url)
    try:
        stored = broker.read("t", 0, 1, 100)
    finally:
        broker.close()
    assert [(r.offset, r.sequence, r.value, r.headers) for r in stored] == [
        (i, i, b"a%d" % i, (("h", b"a%d" % i),)) for i in range(1, 5)
    ]


def test_many_connections_opening_one_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    # A new file is in rollback mode, and switching it to WAL used to fail at once with
    # "database is locked" while another connection opened it too (about 1 round in 8 here).
    for round_ in range(40):
        url = f"sqlite:///{tmp_path / f'new-{round_}.db'}"
        errors: list[BaseException] = []

        def open_and_close(url: str = url, errors: list[BaseException] = errors) -> None:
            try:
                SQLiteBackend(url).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_and_close) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [], (round_, errors)


# -- the writer thread: group commit, failures, close ------------------------------------------


def _batch(*values: bytes) -> AppendBatch:
    return AppendBatch(None, [Record(v) for v in values], time.time())


def _opened(tmp_path: Path) -> tuple[SQLiteBackend, list[str]]:
    backend = SQLiteBackend(f"sqlite:///{tmp_path / 'w.db'}")
    backend.create_topic("t", 2)
    statements: list[str] = []
    backend._db.set_trace_callback(statements.append)
    return backend, statements


def test_appends_queued_while_one_commits_are_committed_together(tmp_path: Path) -> None:
    backend, statements = _opened(tmp_path)
    try:
        with backend._lock:  # a commit in progress holds it: everything appended now queues
            futures = [backend.append("t", p, _batch(b"a", b"b"), None) for p in (0, 1, 0, 1, 0)]
            time.sleep(0.05)
            assert not any(f.done() for f in futures)  # none resolves before its commit
        offsets = [f.result(10) for f in futures]
        assert offsets == [0, 0, 2, 2, 4]
        # at most the first append committed alone (the writer may have taken it before the
        # rest were queued), the others in one transaction
        assert 1 <= statements.count("COMMIT") <= 2, statements
        assert [r.value for r in backend.read("t", 0, 0, 10)] == [b"a", b"b"] * 3
    finally:
        backend.close()


def test_a_failed_append_fails_everything_behind_it_until_the_partition_is_replayed(tmp_path: Path) -> None:
    backend, _ = _opened(tmp_path)
    db = sqlite3.connect(tmp_path / "w.db")
    db.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON entries WHEN NEW.value = X'626164' BEGIN SELECT RAISE(ABORT, 'no'); END"
    )
    db.commit()
    try:
        assert backend.append("t", 0, _batch(b"first"), None).result(10) == 0
        with backend._lock:
            failed = backend.append("t", 0, _batch(b"bad"), None)
            time.sleep(0.05)  # the writer takes it and waits for the lock
            behind = [backend.append("t", 0, _batch(b"ok"), None) for _ in range(3)]
            other = backend.append("t", 1, _batch(b"ok"), None)
        with pytest.raises(BackendUnavailableError):
            failed.result(10)
        for future in behind:
            with pytest.raises(BackendUnavailableError):
                future.result(10)
        assert other.result(10) == 0  # another partition carries on
        later = backend.append("t", 0, _batch(b"later"), None)
        with pytest.raises(BackendUnavailableError, match="earlier append"):
            later.result(10)
        assert [r.value for r in backend.read("t", 0, 0, 10)] == [b"first"]  # nothing behind the hole
        assert [b.base_offset for b in backend.replay("t", 0, 0)] == [0]
        assert backend.append("t", 0, _batch(b"again"), None).result(10) == 1
    finally:
        db.close()
        backend.close()


def test_close_stores_what_is_queued_and_refuses_what_comes_after(tmp_path: Path) -> None:
    backend, _ = _opened(tmp_path)
    with backend._lock:
        futures = [backend.append("t", 0, _batch(b"%d" % i), None) for i in range(4)]
        closing = threading.Thread(target=backend.close)
        closing.start()
        time.sleep(0.05)
        assert not any(f.done() for f in futures)
    closing.join(10)
    assert not closing.is_alive()
    assert [f.result(0) for f in futures] == [0, 1, 2, 3]
    late = backend.append("t", 0, _batch(b"late"), None)
    with pytest.raises(BackendUnavailableError, match="closed"):
        late.result(0)
    reopened = SQLiteBackend(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        assert [r.value for r in reopened.read("t", 0, 0, 10)] == [b"0", b"1", b"2", b"3"]
    finally:
        reopened.close()


@contextlib.contextmanager
def _pipelining(tmp_path: Path) -> Iterator[tuple[Any, idempotent.Producer, SQLiteBackend]]:
    """A broker over a new file and a producer of one-record batches, five in flight."""
    broker = idempotent.connect(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        with idempotent.Producer(broker, max_batch_records=1, linger_ms=0, max_in_flight=5) as producer:
            producer.send("t", b"warm", partition=0).result(10)
            backend = broker.backend
            assert isinstance(backend, SQLiteBackend)
            yield broker, producer, backend
    finally:
        broker.close()


def _pile_up(broker: Any, producer: idempotent.Producer, count: int) -> list[Any]:
    """Send ``count`` one-record batches while the writer waits for the backend's lock (as
    behind a long commit), until max_in_flight (5) of them have reached the backend."""
    futures = []
    with broker.backend._lock:
        futures = [producer.send("t", b"%d" % i, partition=0) for i in range(count)]
        deadline = time.monotonic() + 10
        while broker._partition("t", 0).core.outstanding < 5:
            assert time.monotonic() < deadline, "batches were not pipelined"
            time.sleep(0.01)
    return futures


def test_a_producer_pipelines_batches_into_sqlite(tmp_path: Path) -> None:
    """The sender does not wait for a batch's transaction before it submits the next one:
    batches sent while one commits are queued (up to max_in_flight) and committed together."""
    with _pipelining(tmp_path) as (broker, producer, backend):
        statements: list[str] = []
        backend._db.set_trace_callback(statements.append)
        futures = _pile_up(broker, producer, 5)
        assert [f.result(10).offset for f in futures] == [1, 2, 3, 4, 5]
        # the writer took the first alone or all of them at once, the rest together
        assert 1 <= statements.count("COMMIT") <= 2, statements


def test_a_failed_transaction_among_pipelined_batches_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """A transaction fails while more batches of the partition are in flight: they all fail,
    the broker rebuilds the partition, the producer resends, and every record is stored once,
    in order."""
    with _pipelining(tmp_path) as (broker, producer, backend):
        refusals = [1]  # the first insert of b"3" fails, its resend is stored

        def refuse(value: bytes) -> bool:
            if value == b"3" and refusals[0]:
                refusals[0] -= 1
                return True
            return False

        backend._db.create_function("refuse", 1, refuse)
        backend._db.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON entries WHEN refuse(NEW.value) "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        futures = _pile_up(broker, producer, 8)  # behind the one that will fail
        assert [f.result(30).offset for f in futures] == list(range(1, 9))
        assert refusals == [0]
        assert [r.value for r in broker.read("t", 0, 0, 100)] == [b"warm", *(b"%d" % i for i in range(8))]


def test_a_bug_in_the_writer_fails_the_appends_behind_it_as_fatal_not_retriable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idempotent.errors import InternalError, Recovery

    backend, _ = _opened(tmp_path)
    try:
        assert backend.append("t", 0, _batch(b"first"), None).result(10) == 0
        commit = backend._commit

        def buggy(items: Any) -> Any:
            if any(item[2].records[0].value == b"bug" for item in items):
                raise ZeroDivisionError("a bug")
            return commit(items)

        monkeypatch.setattr(backend, "_commit", buggy)
        with backend._lock:
            failed = backend.append("t", 0, _batch(b"bug"), None)
            time.sleep(0.05)  # the writer takes it and waits for the lock
            behind = [backend.append("t", 0, _batch(b"ok"), None) for _ in range(2)]
        for future in [failed, *behind, backend.append("t", 0, _batch(b"later"), None)]:
            with pytest.raises(InternalError) as raised:
                future.result(10)
            assert raised.value.recovery is Recovery.FATAL
    finally:
        backend.close()


# -- a damaged file: FATAL, named, checkable ----------------------------------------------------


def _written(tmp_path: Path, records: int = 20_000) -> str:
    """A database file holding ``records`` records of 100 B in topic ``t``, closed cleanly
    (its WAL checkpointed into the file)."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    with idempotent.Producer(url, "writer") as producer:
        producer.send_many("t", [b"x" * 100] * records, partition=0).result(60)
    return url


def _damage(path: str, page: int | None = None) -> int:
    """Overwrite one page of the file (its middle one unless given) with random bytes, as a
    bad disk block or a stray write would; returns the page number (1-based)."""
    import random

    size = Path(path).stat().st_size
    page_size = 4096
    pages = size // page_size
    number = page if page is not None else pages // 2
    with open(path, "r+b") as file:
        file.seek((number - 1) * page_size)
        file.write(random.Random(number).randbytes(page_size))
    return number


def test_a_damaged_page_is_a_fatal_error_that_names_the_file(tmp_path: Path) -> None:
    from idempotent.errors import CorruptDataError, Recovery

    url = _written(tmp_path)
    path = str(tmp_path / "d.db")
    _damage(path)
    broker = idempotent.connect(url)  # opening does not read the damaged page
    try:
        with pytest.raises(CorruptDataError) as raised:
            broker.read("t", 0, 0, 100_000)
        error = raised.value
        # never retried: a retry loop would spin on it for ever
        assert error.recovery is Recovery.FATAL and not error.retriable
        assert path in str(error) and "malformed" in str(error)
        assert f"idempotent check sqlite:///{path}" in str(error)
    finally:
        broker.close()


def test_a_producer_on_a_damaged_file_fails_at_once_instead_of_retrying(tmp_path: Path) -> None:
    from idempotent import DeliveryFailed
    from idempotent.errors import CorruptDataError

    url = _written(tmp_path, records=100)
    path = str(tmp_path / "d.db")
    with sqlite3.connect(path) as db:  # the table every append and every rebuild uses
        (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name='batches'").fetchone()
    _damage(path, root)
    started = time.monotonic()
    with idempotent.Producer(url, delivery_timeout_ms=20_000) as producer, pytest.raises(DeliveryFailed) as raised:
        producer.send("t", b"y", partition=0).result(60)
    assert isinstance(raised.value.__cause__, CorruptDataError), repr(raised.value.__cause__)
    assert time.monotonic() - started < 10  # not after the delivery timeout of retries


def test_a_file_that_is_not_a_database_is_refused_as_damaged(tmp_path: Path) -> None:
    from idempotent.errors import CorruptDataError

    path = tmp_path / "text.db"
    path.write_text("not a database\n" * 1000)
    with pytest.raises(CorruptDataError, match="file is not a database"):
        SQLiteBackend(f"sqlite:///{path}")


def test_an_integrity_check_on_open_finds_a_damaged_page(tmp_path: Path) -> None:
    from idempotent.adapters.sqlite.backend import parse_sqlite_url
    from idempotent.errors import ConfigError, CorruptDataError

    url = _written(tmp_path)
    for opened in (SQLiteBackend(url, check="full"), SQLiteBackend(url + "?check=quick")):
        opened.close()  # a sound file opens
    _damage(str(tmp_path / "d.db"))
    for attempt in (lambda: SQLiteBackend(url + "?check=quick"), lambda: SQLiteBackend(url, check="full")):
        with pytest.raises(CorruptDataError, match="check: ") as raised:
            attempt()
        assert "idempotent check" in str(raised.value)
    SQLiteBackend(url).close()  # without the check the damage goes unnoticed until read
    with pytest.raises(ConfigError, match="check must be one of off, quick, full"):
        parse_sqlite_url(url + "?check=yes")
    with pytest.raises(ConfigError, match="check must be one of"):
        SQLiteBackend(url, check="always")


# -- what a truncated write-ahead log loses -----------------------------------------------------

_WAL_WRITER = """
import sys, time
import idempotent
from idempotent.broker.broker import BrokerConfig

broker = idempotent.connect(sys.argv[1], BrokerConfig(maintenance_interval=0))
broker.create_topic("t", 1)
session = broker.init_producer("w")
for i in range(int(sys.argv[2])):  # one batch of 10 records per append, each its own transaction
    result = broker.produce("t", 0, session.producer_id, session.producer_epoch, 10 * i,
                            [b"%d-%d" % (i, j) for j in range(10)])
    assert result.outcome is idempotent.Outcome.ACCEPTED, result
if sys.argv[3] == "close":
    broker.close()
print("written", flush=True)
time.sleep(120)
"""


def _wal_writer(path: Path, batches: int, end: str) -> None:
    """Write ``batches`` batches in another process, then kill it with SIGKILL (``end`` is
    ``kill``) or close its broker first (``close``)."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", _WAL_WRITER, f"sqlite:///{path}", str(batches), end], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def _wal_frames(wal: bytes) -> tuple[int, list[int]]:
    """The WAL's frame size and the indexes of its commit frames (a frame whose header says
    the database size after the commit; the WAL format of sqlite.org/fileformat2.html)."""
    import struct

    frame = 24 + struct.unpack(">I", wal[8:12])[0]
    count = (len(wal) - 32) // frame
    commits = [i for i in range(count) if struct.unpack(">I", wal[32 + i * frame + 4 : 32 + i * frame + 8])[0]]
    return frame, commits


def test_a_truncated_wal_of_a_killed_writer_loses_the_transactions_cut_off_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    batches = 200
    _wal_writer(path, batches, "kill")
    wal_path = Path(f"{path}-wal")
    wal = wal_path.read_bytes()
    frame, commits = _wal_frames(wal)
    # nothing was checkpointed yet (the WAL stays under SQLite's 1000-page autocheckpoint)
    assert len(commits) > batches
    cut = 32 + commits[len(commits) // 2] * frame + 100  # inside the middle commit frame
    with open(wal_path, "r+b") as file:
        file.truncate(cut)
    kept = (cut - 32) // frame  # whole frames left; the cut one is dropped with its transaction
    lost = sum(1 for c in commits if c >= kept)  # transactions whose commit frame is gone
    broker = idempotent.connect(f"sqlite:///{path}")
    try:
        values = [r.value for r in broker.read("t", 0, 0, 100_000)]
        # whole transactions survive, in order, up to the cut: the last `lost` batches are gone
        survivors = batches - lost
        assert values == [b"%d-%d" % (i, j) for i in range(survivors) for j in range(10)]
        # the broker rebuilds its state from what is left: the named producer continues there
        assert broker.init_producer("w").last_sequences[("t", 0)] == 10 * survivors - 1
    finally:
        broker.close()


def test_a_wal_cut_to_nothing_loses_everything_since_the_last_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    _wal_writer(path, 50, "kill")
    Path(f"{path}-wal").write_bytes(b"")
    broker = idempotent.connect(f"sqlite:///{path}")
    try:  # this file was never checkpointed: the topic itself is gone
        assert broker.topics() == {}
    finally:
        broker.close()


def test_a_cleanly_closed_writer_leaves_no_wal_to_lose(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    _wal_writer(path, 50, "close")
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed into the file on close
    broker = idempotent.connect(f"sqlite:///{path}")
    try:
        assert len(broker.read("t", 0, 0, 1000)) == 500
    finally:
        broker.close()


class _Gate:
    """Holds the file's writer thread before it stores its next group, until opened."""

    def __init__(self, backend: SQLiteBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        commit = backend._commit

        def gated(items: Any) -> Any:
            self.open.wait(30)
            return commit(items)

        monkeypatch.setattr(backend, "_commit", gated)


def _expiry_while_a_snapshot_rides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any, int]:
    """Producer b stores 5 records (offsets 0..4) and a 1; then a's next batch carries a due
    snapshot and is held before it is stored, while the broker's maintenance expires b (idle,
    nothing in flight) and writes the eviction's snapshot at the same position. Returns the
    URL, the broker and b's producer id."""
    from idempotent.broker.broker import Broker, BrokerConfig
    from idempotent.core.checker import CheckerConfig

    url = f"sqlite:///{tmp_path / 'evict.db'}"
    config = BrokerConfig(checker=CheckerConfig(producer_expiry=30.0, snapshot_entries=2), maintenance_interval=0)
    backend = SQLiteBackend(url)
    broker = Broker(backend, config)
    broker.create_topic("t", 1)
    a, b = broker.init_producer("a"), broker.init_producer("b")
    assert (
        broker.produce("t", 0, b.producer_id, b.producer_epoch, 0, [b"b0", b"b1", b"b2", b"b3", b"b4"]).base_offset == 0
    )
    assert broker.produce("t", 0, a.producer_id, a.producer_epoch, 0, [b"a0"]).base_offset == 5
    gate = _Gate(backend, monkeypatch)
    riding = broker.submit_produce("t", 0, a.producer_id, a.producer_epoch, 1, [b"a1"])  # a due snapshot rides along
    maintained = threading.Thread(target=broker.maintain, kwargs={"now": time.time() + 60})
    maintained.start()
    maintained.join(1.0)  # stored at once by the old code; now it waits for a1 to be stored first
    gate.open.set()
    maintained.join(30)
    assert not maintained.is_alive()
    assert riding.result(30).base_offset == 6
    assert [p.producer_id for p in broker.stats("t")[0].producers] == [a.producer_id]
    return url, broker, b.producer_id


def test_an_eviction_is_not_undone_by_an_older_snapshot_stored_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot-order rule of LogBackend.write_snapshot: the eviction's snapshot is stored
    after the append handed over before it, so the older snapshot that append carries (same
    position) does not replace it, and a restart does not bring the expired producer back."""
    url, broker, b = _expiry_while_a_snapshot_rides(tmp_path, monkeypatch)
    broker.abandon()
    reopened = idempotent.connect(url)
    try:
        assert b not in [p.producer_id for p in reopened.stats("t")[0].producers]
    finally:
        reopened.close()


def test_a_producer_restarted_after_its_eviction_loses_nothing_across_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data loss this ordering caused: b, expired, is initialised again (no state: it
    starts at 0 under a new epoch) and stores a record; after a crash its next record must be
    stored, not answered DUPLICATE at one of its old offsets."""
    from idempotent.core.outcomes import Outcome

    url, broker, b = _expiry_while_a_snapshot_rides(tmp_path, monkeypatch)
    again = broker.init_producer("b")
    assert again.producer_id == b and dict(again.last_sequences) == {}
    assert broker.produce("t", 0, b, again.producer_epoch, 0, [b"new0"]).base_offset == 7
    broker.abandon()
    reopened = idempotent.connect(url)
    try:
        result = reopened.produce("t", 0, b, again.producer_epoch, 1, [b"new1"])
        assert (result.outcome, result.base_offset) == (Outcome.ACCEPTED, 8)
        assert [r.value for r in reopened.read("t", 0, 7, 10)] == [b"new0", b"new1"]
    finally:
        reopened.close()


PREVIOUS_LOG = """
CREATE TABLE log (
    partition_id INTEGER NOT NULL, offset INTEGER NOT NULL, key BLOB, value BLOB, headers BLOB,
    PRIMARY KEY (partition_id, offset)) WITHOUT ROWID;
INSERT INTO topics VALUES ('t', 1);
INSERT INTO partition_ids VALUES (1, 't', 0);
INSERT INTO log VALUES (1, 0, NULL, X'6F6C6430', NULL), (1, 1, X'6B', X'6F6C6431', NULL);
INSERT INTO batches VALUES ('t', 0, 0, 7, 0, 0, 2, 1000.0);
"""


def test_a_database_with_log_rows_keeps_that_layout(tmp_path: Path) -> None:
    """A file written by the versions that kept records in the ``log`` table opens, reads and
    takes appends in that table."""
    from idempotent.adapters.sqlite.backend import _SCHEMA

    path = tmp_path / "log.db"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA + PREVIOUS_LOG)
    db.close()
    url = f"sqlite:///{path}"
    assert _produce(url, "a", [b"a0", b"a1"]) == [2, 3]
    broker = idempotent.connect(url)
    try:
        stored = broker.read("t", 0, 0, 100)
        assert broker.end_offset("t", 0) == 4
    finally:
        broker.close()
    assert [(r.offset, r.key, r.value, r.producer_id, r.sequence) for r in stored[:2]] == [
        (0, None, b"old0", 7, 0),
        (1, b"k", b"old1", 7, 1),
    ]
    assert [r.value for r in stored[2:]] == [b"a0", b"a1"]
    db = sqlite3.connect(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    count = db.execute("SELECT COUNT(*) FROM log").fetchone()[0]
    db.close()
    assert count == 4 and "entries" not in tables


def test_a_record_of_1000_bytes_takes_about_its_size_on_disk(tmp_path: Path) -> None:
    """Record rows stay on their table pages: before, each 1,000 B record took an overflow page
    of its own, 4.7 KB on disk."""
    path = tmp_path / "size.db"
    with idempotent.Producer(f"sqlite:///{path}") as producer:
        producer.send_many("t", [b"x" * 1000] * 2000, partition=0).result(60)
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    assert size / 2000 < 1300, f"{size / 2000:.0f} B per record"


def test_offsets_of_many_partitions_stay_apart(tmp_path: Path) -> None:
    """Each partition's rows are a range of row ids of their own: reads, ends and appends of
    one never see another's."""
    backend, _ = _opened(tmp_path)
    try:
        for i in range(3):
            for partition in (1, 0):
                assert backend.append("t", partition, _batch(b"%d-%d" % (partition, i)), None).result(10) == i
        assert [r.value for r in backend.read("t", 0, 1, 10)] == [b"0-1", b"0-2"]
        assert [r.value for r in backend.read("t", 1, 0, 2)] == [b"1-0", b"1-1"]
        assert (backend.end_offset("t", 0), backend.end_offset("t", 1)) == (3, 3)
    finally:
        backend.close()
