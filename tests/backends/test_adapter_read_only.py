"""ReadOnlyBackend and open_read_only_broker (adapters/read_only.py): reads pass through,
writes are refused, derived state is dropped, and nothing reaches the store underneath."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

import idempotent
from idempotent.adapters import open_backend
from idempotent.adapters.read_only import ReadOnlyBackend, open_read_only_broker
from idempotent.backend import AppendBatch, LogBackend
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core.ownership import Lease
from idempotent.core.records import Record, Snapshot
from idempotent.core.registry import ProducerRecord
from idempotent.core.types import Epoch, ProducerId
from idempotent.errors import ConfigError, InvalidTopicError, UsageError


def written(url: str) -> None:
    """Store a topic, three records, a snapshot, a producer record and a setting through a
    normal broker, then close it."""
    broker = idempotent.connect(url)
    try:
        broker.create_topic("t", 2)
        session = broker.init_producer("job")
        broker.produce("t", 0, session.producer_id, session.producer_epoch, 0, [b"a", b"b", b"c"])
        broker.set_deduplication(False, topic="other")
    finally:
        broker.close()  # writes the final snapshot of t[0]


@pytest.fixture
def url() -> str:
    name = f"memory://{uuid.uuid4().hex}"
    written(name)
    return name


def test_reads_pass_through(url: str) -> None:
    inner = open_backend(url)
    backend: LogBackend = ReadOnlyBackend(inner)  # satisfies the contract statically
    assert backend.url == url and backend.durable == inner.durable
    assert backend.list_topics() == {"t": 2}
    assert [r.value for r in backend.read("t", 0, 0, 10)] == [b"a", b"b", b"c"]
    assert [(b.base_offset, b.record_count) for b in backend.replay("t", 0, 0)] == [(0, 3)]
    assert backend.end_offset("t", 0) == 3
    assert backend.latest_snapshot("t", 0) == inner.latest_snapshot("t", 0) is not None
    assert [r.producer_name for r in backend.load_producers()] == ["job"]
    assert backend.load_settings() == inner.load_settings() != {}
    assert backend.load_leases() == inner.load_leases()
    assert (backend.max_record_bytes, backend.max_batch_bytes) == (inner.max_record_bytes, inner.max_batch_bytes)


def test_writes_are_refused_with_a_clear_error(url: str) -> None:
    inner = open_backend(url)
    backend = ReadOnlyBackend(inner)
    lease = Lease("t", 0, "b1", "", 1, 0.0, 10.0)
    refused = {
        "create topic 'new'": lambda: backend.create_topic("new", 1),
        "append to t[0]": lambda: backend.append("t", 0, AppendBatch(None, [Record(b"x")], 0.0), None),
        "allocate producer ids": lambda: backend.allocate_producer_ids(10),
        "change settings": lambda: backend.save_setting("dedup:broker", "0"),
        "claim partitions": lambda: backend.propose_leases([lease]),
    }
    for what, call in refused.items():
        with pytest.raises(UsageError, match=re.escape(f"{url} is opened read-only: cannot {what}")):
            call()
    assert inner.list_topics() == {"t": 2} and inner.end_offset("t", 0) == 3 and inner.load_leases() == []


def test_derived_state_is_dropped_silently(url: str) -> None:
    """What a broker persists on its own while reading (snapshots, flagged or expired
    producer records, released partitions) is dropped, not refused: a reading broker works."""
    inner = open_backend(url)
    backend = ReadOnlyBackend(inner)
    before = inner.latest_snapshot("t", 0)
    [record] = inner.load_producers()
    backend.write_snapshot("t", 0, Snapshot(99, 1, 1.0, b"other"))
    backend.save_producer(ProducerRecord(ProducerId(record.producer_id), Epoch(9), "job", True))
    backend.delete_producers([record.producer_id])
    backend.release("t", 0)
    assert inner.latest_snapshot("t", 0) == before
    assert inner.load_producers() == [record]
    assert backend.claim_writer() is False


def test_close_closes_the_backend_underneath(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    written(url)
    inner = open_backend(url)
    ReadOnlyBackend(inner).close()
    with pytest.raises(idempotent.ProducerError):
        inner.append("t", 0, AppendBatch(None, [Record(b"x")], 0.0), None).result(5)


def test_a_read_only_broker_reads_and_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    written(url)
    database = tmp_path / "log.db"
    before = database.read_bytes()
    broker = open_read_only_broker(url)
    try:
        assert isinstance(broker, Broker) and isinstance(broker.backend, ReadOnlyBackend)
        assert [r.value for r in broker.read("t", 0)] == [b"a", b"b", b"c"]
        [stats] = broker.stats("t")[:1]
        assert stats.position == 3 and [p.producer_name for p in stats.producers] == ["job"]
        with pytest.raises(InvalidTopicError):
            broker.read("missing", 0)  # no topic is created on the way
        with pytest.raises(UsageError, match="read-only"):
            broker.init_producer("someone")
    finally:
        broker.close()
    assert database.read_bytes() == before


def test_a_missing_sqlite_file_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.db"
    with pytest.raises(ConfigError, match="no database file"):
        open_read_only_broker(f"sqlite:///{missing}")
    assert not missing.exists()


def test_config_of_the_read_only_broker() -> None:
    """Nothing is created on first use and no maintenance thread runs."""
    name = f"memory://{uuid.uuid4().hex}"
    written(name)
    broker = open_read_only_broker(name)
    try:
        assert broker.config == BrokerConfig(auto_create_topics=False, maintenance_interval=0)
    finally:
        broker.close()
