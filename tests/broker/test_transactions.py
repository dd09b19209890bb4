"""The broker's side of an application transaction (``idempotent/broker/transactions.py``),
driven through its calls as a broker server's clients make them: held batches answered
without offsets and decided at the commit, a repeated commit or abort answered as the first,
a dead instance's transaction replaced by its successor's, and one left open past
``transaction_timeout`` aborted by the maintenance sweep."""

from __future__ import annotations

import time

import pytest

from idempotent import Outcome
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core.types import TopicPartition
from idempotent.errors import ProducerFencedError, TransactionAbortableError, TransactionStateError

from ..conftest import memory_harness


def _broker(**config: object) -> Broker:
    broker = memory_harness().open(BrokerConfig(maintenance_interval=0, **config))  # type: ignore[arg-type]
    broker.create_topic("t", 2)
    return broker


def _values(broker: Broker, partition: int = 0) -> list[bytes | None]:
    return [r.value for r in broker.read("t", partition, 0, 100)]


def test_held_batches_are_answered_without_offsets_and_decided_at_the_commit() -> None:
    broker = _broker()
    session = broker.init_producer("app")
    pid, epoch = session.producer_id, session.producer_epoch
    broker.begin_transaction(pid, epoch)
    held = [broker.produce("t", p, pid, epoch, 0, [f"p{p}".encode()]) for p in (0, 1)]
    again = broker.produce("t", 0, pid, epoch, 0, [b"p0"])  # a resend while held: held once
    assert [r.outcome for r in [*held, again]] == [Outcome.ACCEPTED] * 3
    assert all(r.base_offset is None for r in [*held, again])
    assert _values(broker, 0) == [] and broker.end_offset("t", 0) == 0
    answers = broker.commit_transaction(pid, epoch, b"positions")
    assert answers == {("t", 0, 0): (0, False), ("t", 1, 0): (0, False)}
    assert _values(broker, 0) == [b"p0"] and _values(broker, 1) == [b"p1"]
    assert broker.committed_positions(pid) == b"positions"
    # a client that lost the answer calls again: the same answer, nothing stored twice
    assert broker.commit_transaction(pid, epoch, b"positions") == answers
    with pytest.raises(TransactionStateError):
        broker.abort_transaction(pid, epoch)  # it committed: there is nothing to abort
    broker.close()


def test_a_gap_refuses_the_whole_commit_and_the_abort_rewinds_to_before() -> None:
    broker = _broker()
    session = broker.init_producer("app")
    pid, epoch = session.producer_id, session.producer_epoch
    assert broker.produce("t", 0, pid, epoch, 0, [b"stored"]).outcome is Outcome.ACCEPTED
    broker.begin_transaction(pid, epoch)
    broker.produce("t", 1, pid, epoch, 0, [b"fine"])
    broker.produce("t", 0, pid, epoch, 5, [b"gap"])  # held: the checker decides at the commit
    with pytest.raises(TransactionAbortableError, match="out_of_order_sequence"):
        broker.commit_transaction(pid, epoch)
    assert broker.abort_transaction(pid, epoch) == {TopicPartition("t", 0): 0, TopicPartition("t", 1): -1}
    assert broker.abort_transaction(pid, epoch) == {TopicPartition("t", 0): 0, TopicPartition("t", 1): -1}
    assert _values(broker, 0) == [b"stored"] and _values(broker, 1) == []
    deadline = time.monotonic() + 10  # the refused commit's partitions are rebuilt first
    while True:
        try:
            result = broker.produce("t", 0, pid, epoch, 1, [b"next"])
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert (result.outcome, result.base_offset) == (Outcome.ACCEPTED, 1)
    broker.close()


def test_a_successor_replaces_a_dead_instances_transaction_and_fences_its_commit() -> None:
    broker = _broker()
    dead = broker.init_producer("app")
    broker.begin_transaction(dead.producer_id, dead.producer_epoch)
    broker.produce("t", 0, dead.producer_id, dead.producer_epoch, 0, [b"never"])
    successor = broker.init_producer("app")  # same id, newer epoch
    assert successor.producer_id == dead.producer_id
    broker.begin_transaction(successor.producer_id, successor.producer_epoch)
    with pytest.raises(ProducerFencedError):  # its transaction is gone, and so is it
        broker.commit_transaction(dead.producer_id, dead.producer_epoch)
    with pytest.raises(ProducerFencedError):
        broker.abort_transaction(dead.producer_id, dead.producer_epoch)
    broker.produce("t", 0, successor.producer_id, successor.producer_epoch, 0, [b"kept"])
    broker.commit_transaction(successor.producer_id, successor.producer_epoch)
    assert _values(broker, 0) == [b"kept"]
    broker.close()


def test_a_transaction_open_past_the_timeout_is_aborted_by_the_sweep() -> None:
    broker = _broker(transaction_timeout=0.2)
    session = broker.init_producer("app")
    pid, epoch = session.producer_id, session.producer_epoch
    broker.begin_transaction(pid, epoch)
    broker.produce("t", 0, pid, epoch, 0, [b"late"])
    time.sleep(0.3)
    broker.maintain()
    broker.produce("t", 0, pid, epoch, 1, [b"after the timeout"])  # not held any more
    with pytest.raises(TransactionAbortableError, match="transaction_timeout"):
        broker.commit_transaction(pid, epoch)
    with pytest.raises(TransactionAbortableError, match="transaction_timeout"):
        broker.commit_transaction(pid, epoch)  # until it is aborted
    assert broker.abort_transaction(pid, epoch) == {TopicPartition("t", 0): -1}
    assert _values(broker, 0) == []
    broker.begin_transaction(pid, epoch)
    broker.produce("t", 0, pid, epoch, 0, [b"on time"])
    broker.commit_transaction(pid, epoch)
    assert _values(broker, 0) == [b"on time"]
    broker.close()


def test_a_transaction_holding_more_than_the_limit_is_aborted_and_the_next_one_commits() -> None:
    broker = _broker(max_transaction_bytes=1000)
    session = broker.init_producer("app")
    pid, epoch = session.producer_id, session.producer_epoch
    broker.begin_transaction(pid, epoch)
    for sequence in range(3):  # about 416 bytes each (value and 16 bytes of overhead)
        assert broker.produce("t", 0, pid, epoch, sequence, [b"x" * 400]).outcome is Outcome.ACCEPTED
    with pytest.raises(TransactionAbortableError, match="max_transaction_bytes"):
        broker.commit_transaction(pid, epoch)
    assert broker.abort_transaction(pid, epoch) == {TopicPartition("t", 0): -1}
    broker.begin_transaction(pid, epoch)
    broker.produce("t", 0, pid, epoch, 0, [b"x" * 400])
    broker.produce("t", 0, pid, epoch, 1, [b"y" * 400])
    broker.commit_transaction(pid, epoch)
    assert _values(broker, 0) == [b"x" * 400, b"y" * 400]
    broker.close()
