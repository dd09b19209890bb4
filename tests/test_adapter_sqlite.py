"""SQLite specifics beyond the shared conformance suite."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import idempotent
from adapters.sqlite import SQLiteBackend

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
    columns = [row[1] for row in db.execute("PRAGMA table_info(log)")]
    db.close()
    assert "records" not in tables and columns == ["partition_id", "offset", "key", "value", "headers"]
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
    counts = [db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in ("records", "log")]
    db.close()
    assert counts == [5, 0]
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
