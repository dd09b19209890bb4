"""``idempotent.Producer`` transactions on ``sqlite://`` and ``memory://`` (docs/semantics.md,
"Application transactions"): the broker holds a transaction's batches until its commit and
stores them, with the producer's positions, in one atomic write; nothing of an open or aborted
transaction is ever read; the checkers decide at the commit, so a committed transaction resent
after a restart is DUPLICATE and a newer instance fences the older one's commit."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import idempotent
from idempotent import DeliveryStatus
from idempotent.adapters.memory import MemoryBackend, reset_store
from idempotent.errors import (
    DeliveryFailed,
    ProducerFencedError,
    ReadTimeoutError,
    TransactionAbortableError,
    TransactionStateError,
    TransactionTimedOutError,
)
from idempotent.net.server import BrokerServer

from ..transaction_faults import kill_between_writes_and_commit, refuse_wrong_states, rounds_expected

TOPICS = ("orders", "payments", "audit")


@pytest.fixture(params=["sqlite", "memory", "idem"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A backend that takes transactions: SQLite and memory in the producer's process, and a
    broker server on SQLite (idem://, the protocol's transaction operations)."""
    name = f"txn-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}" if request.param == "memory" else f"sqlite:///{tmp_path}/txn.db"
    with idempotent.connect(url) as broker:
        for topic in TOPICS:
            broker.create_topic(topic, 1)
    if request.param == "idem":
        with BrokerServer(idempotent.connect(url)) as server:
            yield server.url
    else:
        yield url
    reset_store(name)


def _values(url: str, topic: str, partitions: int = 1) -> list[bytes]:
    with idempotent.connect(url) as broker:
        return [r.value for p in range(partitions) for r in broker.read(topic, p, 0, 10_000)]


def test_a_commit_stores_every_topic_with_its_positions_and_a_restart_reads_them_back(url: str) -> None:
    with idempotent.Producer(url, "copier") as producer:
        assert producer.committed_positions() is None
        with producer.transaction() as txn:
            futures = [producer.send(topic, f"{topic}-{i}".encode()) for topic in TOPICS for i in range(3)]
            futures.append(producer.send_many(TOPICS[0], [b"bulk-0", b"bulk-1"]))  # type: ignore[arg-type]
            producer.flush()  # answered by the broker, held there: nothing of it resolved yet
            assert not any(future.done() for future in futures)
            txn.positions = {"input": 42, "file": b"\x08\x01"}
        metas = [future.result(0) for future in futures[:-1]]
        assert [(m.topic, m.offset) for m in metas] == [(t, i) for t in TOPICS for i in range(3)]
        assert not any(m.duplicate for m in metas)
        assert [m.offset for m in futures[-1].result(0)] == [3, 4]  # type: ignore[union-attr]
    assert _values(url, TOPICS[0]) == [b"orders-0", b"orders-1", b"orders-2", b"bulk-0", b"bulk-1"]
    for topic in TOPICS[1:]:
        assert _values(url, topic) == [f"{topic}-{i}".encode() for i in range(3)]
    with idempotent.Producer(url, "copier") as restarted:
        assert restarted.committed_positions() == {"input": 42, "file": b"\x08\x01"}


def test_an_open_transaction_is_never_read_and_an_aborted_one_never_stored(url: str) -> None:
    with idempotent.Producer(url, "app") as producer, idempotent.Reader(url, TOPICS[0]) as reader:
        producer.send(TOPICS[0], b"before").result(10)
        assert reader.read_next(5).value == b"before"
        producer.begin_transaction()
        aborted = [producer.send(TOPICS[0], f"aborted-{i}".encode()) for i in range(5)]
        producer.flush()
        with pytest.raises(ReadTimeoutError):
            reader.read_next(0.5)
        producer.abort_transaction()
        for future in aborted:
            with pytest.raises(DeliveryFailed) as failed:
                future.result(0)
            assert failed.value.status is DeliveryStatus.NOT_PERSISTED
            assert isinstance(failed.value.__cause__, TransactionAbortableError)
        with pytest.raises(ValueError), producer.transaction(positions={"at": 1}):  # the block's error aborts
            producer.send(TOPICS[1], b"raised")
            raise ValueError("the application failed")
        producer.begin_transaction()
        kept = [producer.send(TOPICS[0], f"kept-{i}".encode()) for i in range(5)]
        producer.flush()
        with pytest.raises(ReadTimeoutError):
            reader.read_next(0.5)
        producer.commit_transaction({"at": 2})
        assert [f.result(0).offset for f in kept] == [1, 2, 3, 4, 5]
        assert [reader.read_next(5).value for _ in range(5)] == [f"kept-{i}".encode() for i in range(5)]
        assert producer.committed_positions() == {"at": 2}
        producer.send(TOPICS[0], b"after").result(10)  # outside a transaction: as before
    assert _values(url, TOPICS[0]) == [b"before", *(f"kept-{i}".encode() for i in range(5)), b"after"]
    assert _values(url, TOPICS[1]) == []


def test_calls_in_the_wrong_state_are_refused_and_leave_the_producer_usable(url: str) -> None:
    with idempotent.Producer(url, "app") as producer:
        refuse_wrong_states(producer, TOPICS[0])
    with idempotent.Producer(url) as anonymous:
        anonymous.begin_transaction()
        anonymous.send(TOPICS[0], b"y")
        with pytest.raises(TransactionStateError, match="named producer"):
            anonymous.commit_transaction({"at": 1})
        anonymous.commit_transaction()  # without positions it commits
    assert _values(url, TOPICS[0]) == [b"x", b"y"]


def test_a_committed_transaction_resent_after_a_restart_is_a_duplicate(url: str) -> None:
    """A copy process that crashed after its commit resends the same records with the same
    sequences: the checkers, deciding at the commit, recognise every one."""
    values = [f"v{i}".encode() for i in range(4)]
    with idempotent.Producer(url, "copier") as producer:
        start = producer.resume_sequence(TOPICS[0])
        with producer.transaction(positions=4):
            firsts = [producer.send(TOPICS[0], v, partition=0, sequence=start + i) for i, v in enumerate(values)]
        offsets = [f.result(0).offset for f in firsts]
    with idempotent.Producer(url, "copier") as restarted:
        assert restarted.committed_positions() == 4
        with restarted.transaction(positions=4):
            again = [restarted.send(TOPICS[0], v, partition=0, sequence=start + i) for i, v in enumerate(values)]
        results = [f.result(0) for f in again]
    assert all(r.duplicate for r in results), results
    assert [r.offset for r in results] == offsets
    assert _values(url, TOPICS[0]) == values


def test_an_aborted_transaction_resent_with_its_sequences_is_stored_not_a_duplicate(url: str) -> None:
    with idempotent.Producer(url, "app") as producer:
        start = producer.resume_sequence(TOPICS[0])
        producer.begin_transaction()
        for i in range(3):
            producer.send(TOPICS[0], f"a{i}".encode(), partition=0, sequence=start + i)
        producer.abort_transaction()
        with producer.transaction():
            again = [producer.send(TOPICS[0], f"a{i}".encode(), partition=0, sequence=start + i) for i in range(3)]
        assert not any(f.result(0).duplicate for f in again)
        producer.send(TOPICS[0], b"next", partition=0).result(10)  # numbered on after them
    assert _values(url, TOPICS[0]) == [b"a0", b"a1", b"a2", b"next"]


def test_a_newer_instance_fences_the_older_ones_commit_and_nothing_of_it_is_stored(url: str) -> None:
    with idempotent.connect(url) as broker:  # one broker, as one process's producers share it
        older = idempotent.Producer(broker, "zombie")
        older.begin_transaction()
        stale = [older.send(topic, b"stale") for topic in TOPICS]
        older.flush()
        with idempotent.Producer(broker, "zombie") as newer:
            with pytest.raises(ProducerFencedError):
                older.commit_transaction()
            for future in stale:
                with pytest.raises(DeliveryFailed) as failed:
                    future.result(0)
                assert failed.value.status is DeliveryStatus.NOT_PERSISTED
            with newer.transaction():
                newer.send(TOPICS[0], b"fresh")
        older.close()
        for topic in TOPICS:
            assert [r.value for r in broker.read(topic, 0, 0, 100)] == ([b"fresh"] if topic == TOPICS[0] else [])


def test_a_group_the_backend_drops_or_whose_answer_is_lost_is_committed_by_calling_again(tmp_path: Path) -> None:
    """memory:// with injected faults: a dropped group stores nothing and the commit times out;
    a lost answer leaves the group stored; either way calling commit again ends with every
    record stored once (the checkers, rebuilt from the log, answer DUPLICATE for the stored)."""
    name = f"txn-faults-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}"
    try:
        faults = MemoryBackend(url).faults
        with idempotent.Producer(url, "app") as producer:
            for fault in ("drop", "lose_ack"):
                producer.begin_transaction()
                futures = [producer.send(topic, f"{fault}-{topic}".encode()) for topic in TOPICS]
                producer.flush()
                setattr(faults, fault, 1)
                with pytest.raises(TransactionTimedOutError):
                    producer.commit_transaction({"after": fault})
                deadline = time.monotonic() + 10
                while True:  # the partitions rebuild from the log first
                    try:
                        producer.commit_transaction({"after": fault})
                        break
                    except TransactionTimedOutError:
                        assert time.monotonic() < deadline
                        time.sleep(0.05)
                metas = [f.result(0) for f in futures]
                assert all(m.duplicate for m in metas) is (fault == "lose_ack"), metas
                assert producer.committed_positions() == {"after": fault}
        for topic in TOPICS:
            assert _values(url, topic) == [f"drop-{topic}".encode(), f"lose_ack-{topic}".encode()]
    finally:
        reset_store(name)


def test_a_broker_without_atomic_writes_refuses_a_transaction_and_says_where_they_are() -> None:
    from idempotent.broker.broker import Broker

    class Plain:  # a backend with no append_atomic (Kafka and Pulsar under a broker server)
        def __init__(self) -> None:
            self._inner = MemoryBackend(f"memory://plain-{uuid.uuid4().hex[:8]}")
            self.url = "kafka://elsewhere:9092"

        def __getattr__(self, name: str) -> object:
            if name in ("append_atomic", "committed_positions"):
                raise AttributeError(name)
            return getattr(self._inner, name)

    with Broker(Plain()) as broker, idempotent.Producer(broker, "app") as producer:  # type: ignore[arg-type]
        with pytest.raises(TransactionStateError, match="kafka:// has no transactions"):
            producer.begin_transaction()
        for call in (producer.commit_transaction, producer.abort_transaction):
            with pytest.raises(TransactionStateError):
                call()
        with pytest.raises(TransactionStateError):
            producer.committed_positions()
        assert producer.send("t", b"still stored exactly once").result(10).offset == 0  # nothing changed


def test_kill_9_between_the_writes_and_the_commit_leaves_all_or_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/killed.db"
    with idempotent.connect(url) as broker:
        for topic in TOPICS:
            broker.create_topic(topic, 1)

    def whole_rounds_only() -> None:  # what a kill leaves: whole transactions, never a part
        for topic in TOPICS:
            stored = _values(url, topic)
            assert stored == rounds_expected(len(stored) // 10), (topic, stored)

    kill_between_writes_and_commit(url, "killed", TOPICS, tmp_path, whole_rounds_only)
    for topic in TOPICS:
        assert _values(url, topic) == rounds_expected(), topic


def test_transactions_and_plain_sends_of_several_producers_at_once_each_store_once(tmp_path: Path) -> None:
    """Four producers of one process share its broker on one SQLite file: two commit
    transactions over the same two partitions (their commits lock them together), two send
    without; every record is stored once, every transaction whole."""
    import threading

    url = f"sqlite:///{tmp_path}/shared.db"
    with idempotent.connect(url) as broker:
        broker.create_topic("shared", 2)
        errors: list[BaseException] = []

        def transactional(name: str) -> None:
            try:
                with idempotent.Producer(broker, name) as producer:
                    for r in range(20):
                        with producer.transaction(positions=r + 1):
                            for partition in (1, 0) if r % 2 else (0, 1):
                                producer.send("shared", f"{name}-{r}-{partition}".encode(), partition=partition)
            except BaseException as exc:  # reported below
                errors.append(exc)

        def plain(name: str) -> None:
            try:
                with idempotent.Producer(broker, name) as producer:
                    for i in range(200):
                        producer.send("shared", f"{name}-{i}".encode(), partition=i % 2)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=transactional, args=(f"t{i}",)) for i in range(2)]
        threads += [threading.Thread(target=plain, args=(f"p{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), "a producer hung"
        assert errors == []
        stored = [r.value for p in (0, 1) for r in broker.read("shared", p, 0, 10_000)]
    assert len(stored) == len(set(stored)) == 2 * 20 * 2 + 2 * 200
    for name in ("t0", "t1"):
        with idempotent.Producer(url, name) as restarted:
            assert restarted.committed_positions() == 20
