"""SQLite specifics beyond the shared conformance suite."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import idempotent

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
