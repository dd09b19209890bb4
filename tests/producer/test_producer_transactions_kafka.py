"""``idempotent.Producer`` transactions on the suite's Kafka (docs/semantics.md, "Application
transactions"): committed all together with the positions, aborted invisible, a committed
transaction resent by a restart recognised as DUPLICATE, and a kill -9 between the writes and
the commit leaving all or nothing."""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

import idempotent
from idempotent import DeliveryStatus
from idempotent.errors import (
    DeliveryFailed,
    Recovery,
    TransactionAbortableError,
    TransactionStateError,
    TransactionTimedOutError,
)

from ..transaction_faults import KafkaPauses, kill_between_writes_and_commit, refuse_wrong_states, rounds_expected

pytestmark = pytest.mark.kafka


def _topics(kafka_service: Any, count: int, partitions: int = 1) -> list[str]:
    names = [f"ptxn-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    with idempotent.connect(kafka_service.url) as broker:
        for name in names:
            broker.create_topic(name, partitions)
    return names


def _committed(kafka_service: Any, topic: str, partitions: int = 1) -> list[bytes]:
    """Every value a read_committed consumer reads from ``topic``, to its stable ends."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        tps = [confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1] for tp in tps}
        consumer.assign(tps)
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
            positions = consumer.position([confluent_kafka.TopicPartition(topic, p) for p in range(partitions)])
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                return values
        raise AssertionError(f"{topic}: not read to its ends {ends} within 60 s")
    finally:
        consumer.close()


def test_a_committed_transaction_holds_every_topic_and_its_positions(kafka_service: Any) -> None:
    topics = _topics(kafka_service, 3)
    name = f"pt-{uuid.uuid4().hex[:6]}"
    with idempotent.Producer(kafka_service.url, name) as producer:
        assert producer.committed_positions() is None
        with producer.transaction() as txn:
            futures = [producer.send(topic, f"{topic}-{i}".encode()) for topic in topics for i in range(3)]
            futures.append(producer.send_many(topics[0], [b"bulk-0", b"bulk-1"]))  # type: ignore[arg-type]
            assert not any(future.done() for future in futures)  # resolved at the commit only
            txn.positions = {"input": 42, "id": b"\x08\x01"}
        for future in futures:
            future.result(0)
    assert _committed(kafka_service, topics[0]) == [f"{topics[0]}-{i}".encode() for i in range(3)] + [
        b"bulk-0",
        b"bulk-1",
    ]
    for topic in topics[1:]:
        assert _committed(kafka_service, topic) == [f"{topic}-{i}".encode() for i in range(3)]
    with idempotent.Producer(kafka_service.url, name) as restarted:  # read back after a restart
        assert restarted.committed_positions() == {"input": 42, "id": b"\x08\x01"}


def test_positions_committed_behind_another_writers_open_transaction_are_read_back(kafka_service: Any) -> None:
    """The state topic's partition is shared by many producers: a transaction of another one
    open on it holds its last stable offset back. A restart reads past it (waiting for it to
    end), never back to the positions committed before it opened."""
    from idempotent.adapters.kafka.producer_log import STATE_TOPIC, state_partition

    (topic,) = _topics(kafka_service, 1)
    name = f"pt-{uuid.uuid4().hex[:6]}"
    other = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_service.bootstrap, "transactional.id": f"other-{uuid.uuid4().hex[:8]}"}
    )
    other.init_transactions(30)
    with idempotent.Producer(kafka_service.url, name) as producer:
        with producer.transaction(positions={"round": 1}):
            producer.send(topic, b"one")
        other.begin_transaction()
        other.produce(STATE_TOPIC, key=b"\x02open", value=b"", partition=state_partition(name))
        assert other.flush(30) == 0
        with producer.transaction(positions={"round": 2}):
            producer.send(topic, b"two")
    ended = threading.Timer(3.0, other.abort_transaction, args=(30,))
    ended.start()
    started = time.monotonic()
    try:
        with idempotent.Producer(kafka_service.url, name) as restarted:
            assert restarted.committed_positions() == {"round": 2}
            waited = time.monotonic() - started
    finally:
        ended.join()
    assert waited >= 2.0, "the restart did not meet the open transaction: the test proves nothing"
    assert _committed(kafka_service, topic) == [b"one", b"two"]


def test_an_aborted_transaction_is_invisible_and_the_next_one_commits(kafka_service: Any) -> None:
    (topic,) = _topics(kafka_service, 1)
    with idempotent.Producer(kafka_service.url, f"pa-{uuid.uuid4().hex[:6]}") as producer:
        producer.begin_transaction()
        aborted = [producer.send(topic, f"aborted-{i}".encode()) for i in range(5)]
        producer.flush()
        producer.abort_transaction()
        for future in aborted:
            with pytest.raises(DeliveryFailed) as failed:
                future.result(0)
            assert failed.value.status is DeliveryStatus.NOT_PERSISTED
        # the block's error aborts the transaction
        with pytest.raises(ValueError), producer.transaction(positions={"at": 1}):
            producer.send(topic, b"raised")
            raise ValueError("the application failed")
        with producer.transaction(positions={"at": 2}):
            committed = [producer.send(topic, f"kept-{i}".encode()) for i in range(5)]
        assert [f.result(0).offset is not None for f in committed] == [True] * 5
        assert producer.committed_positions() == {"at": 2}
    assert _committed(kafka_service, topic) == [f"kept-{i}".encode() for i in range(5)]


def test_calls_in_the_wrong_state_are_refused_and_leave_the_producer_usable(kafka_service: Any) -> None:
    (topic,) = _topics(kafka_service, 1)
    with idempotent.Producer(kafka_service.url, f"ps-{uuid.uuid4().hex[:6]}") as producer:
        refuse_wrong_states(producer, topic)
        producer.send(topic, b"y").result(30)  # outside a transaction: as before
    assert _committed(kafka_service, topic) == [b"x", b"y"]
    for error in (
        TransactionStateError("s"),
        TransactionAbortableError("a"),
        TransactionTimedOutError("t"),
    ):
        assert type(pickle.loads(pickle.dumps(error))) is type(error)
    assert TransactionAbortableError("a").recovery is Recovery.ABORT_TRANSACTION
    assert TransactionTimedOutError("t").retriable and not TransactionStateError("s").retriable


def test_a_committed_transaction_resent_after_a_restart_is_a_duplicate(kafka_service: Any) -> None:
    """A copy process that crashed after its commit resends the same records with the same
    sequences: recognised, stored once."""
    (topic,) = _topics(kafka_service, 1)
    name = f"pd-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}".encode() for i in range(4)]
    with idempotent.Producer(kafka_service.url, name) as producer:
        start = producer.resume_sequence(topic)
        with producer.transaction(positions=4):
            firsts = [producer.send(topic, v, partition=0, sequence=start + i) for i, v in enumerate(values)]
        offsets = [f.result(0).offset for f in firsts]
    with idempotent.Producer(kafka_service.url, name) as restarted:
        assert restarted.committed_positions() == 4
        with restarted.transaction(positions=4):
            again = [restarted.send(topic, v, partition=0, sequence=start + i) for i, v in enumerate(values)]
        results = [f.result(0) for f in again]
    assert all(r.duplicate for r in results), results
    assert [r.offset for r in results] == offsets
    assert _committed(kafka_service, topic) == values


def test_an_aborted_transaction_resent_with_its_sequences_is_stored_not_a_duplicate(kafka_service: Any) -> None:
    (topic,) = _topics(kafka_service, 1)
    with idempotent.Producer(kafka_service.url, f"pr-{uuid.uuid4().hex[:6]}") as producer:
        start = producer.resume_sequence(topic)
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, f"a{i}".encode(), partition=0, sequence=start + i)
        producer.abort_transaction()
        with producer.transaction():
            again = [producer.send(topic, f"a{i}".encode(), partition=0, sequence=start + i) for i in range(3)]
        assert not any(f.result(0).duplicate for f in again)
        producer.send(topic, b"next", partition=0).result(30)  # numbered on after them
    assert _committed(kafka_service, topic) == [b"a0", b"a1", b"a2", b"next"]


def test_a_reader_shows_a_transaction_only_once_committed_and_never_an_aborted_one(kafka_service: Any) -> None:
    from idempotent.errors import ReadTimeoutError

    (topic,) = _topics(kafka_service, 1)
    with (
        idempotent.Producer(kafka_service.url, f"pv-{uuid.uuid4().hex[:6]}") as producer,
        idempotent.Reader(kafka_service.url, topic) as reader,
    ):
        producer.begin_transaction()
        producer.send(topic, b"aborted")
        producer.flush()  # written to Kafka, in the open transaction
        with pytest.raises(ReadTimeoutError):
            reader.read_next(2)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"open-then-committed")
        producer.flush()
        with pytest.raises(ReadTimeoutError):
            reader.read_next(2)
        producer.commit_transaction()
        assert reader.read_next(30).value == b"open-then-committed"
        with pytest.raises(ReadTimeoutError):
            reader.read_next(1)


def test_kill_9_between_the_writes_and_the_commit_leaves_all_or_nothing(kafka_service: Any, tmp_path: Path) -> None:
    topics = _topics(kafka_service, 3)
    kill_between_writes_and_commit(kafka_service.url, f"pk-{uuid.uuid4().hex[:6]}", topics, tmp_path)
    for topic in topics:
        assert _committed(kafka_service, topic) == rounds_expected(), topic


def _commit_until_decided(producer: idempotent.Producer, positions: object, deadline: float) -> tuple[str, int]:
    """Commit as an application would: a timed-out commit is called again, one Kafka refused
    is aborted. Returns "committed" or "aborted", and how many calls of the commit it took."""
    calls = 0
    while True:
        calls += 1
        try:
            producer.commit_transaction(positions, timeout=5)
            return "committed", calls
        except TransactionTimedOutError:
            assert time.monotonic() < deadline, "the commit was not decided within the test's bound"
            time.sleep(0.5)
        except TransactionAbortableError:
            producer.abort_transaction()
            return "aborted", calls


@pytest.mark.timeout(600)
def test_kafka_paused_past_the_request_timeout_during_the_commit_is_committed_or_aborted_never_both(
    kafka_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka is stopped with SIGSTOP for 8 s (the producer's request timeout is 5 s) as
    librdkafka's ``commit_transaction`` of a transaction over 3 topics begins, or a few ms
    into it. Whatever the commit then says, a restarted producer resending the same records
    with the same sequences finds the truth: all of them duplicates when it committed, all of
    them new when it aborted, and a read_committed consumer sees each record exactly once
    either way."""
    topics = _topics(kafka_service, 3)
    name = f"ps-{uuid.uuid4().hex[:6]}"
    url = f"{kafka_service.url}?timeout=5"
    #: per round, when the pause begins after the commit was called, and how long it lasts
    schedule = ((0.0, 8.0), (0.003, 8.0), (0.01, 8.0), (0.0, 25.0))
    pauses = KafkaPauses(monkeypatch)
    outcomes: list[tuple[str, float, int]] = []
    expected: dict[str, list[bytes]] = {topic: [] for topic in topics}
    last: object = None  # the positions of the last committed transaction
    for round_, (delay, length) in enumerate(schedule):
        values = {topic: [f"{topic}-{round_}-{i}".encode() for i in range(5)] for topic in topics}
        with idempotent.Producer(url, name) as producer:
            starts = {topic: producer.resume_sequence(topic) for topic in topics}
            producer.begin_transaction()
            futures = [
                producer.send(topic, value, partition=0, sequence=starts[topic] + i)
                for topic in topics
                for i, value in enumerate(values[topic])
            ]
            producer.flush(30)  # the records are written (in the transaction): only the commit is left
            pauses.arm(delay, length)
            began = time.monotonic()
            try:
                outcome, calls = _commit_until_decided(producer, {"round": round_}, began + 180)
            finally:
                pauses.settle()
            outcomes.append((outcome, round(time.monotonic() - began, 2), calls))
            done = [f.exception(60) for f in futures]
            if outcome == "committed":
                assert done == [None] * len(futures)
                offsets = [f.result(0).offset for f in futures]
            else:
                assert all(isinstance(e, DeliveryFailed) and e.status is DeliveryStatus.NOT_PERSISTED for e in done)
        with idempotent.Producer(url, name) as restarted:
            assert restarted.committed_positions() == ({"round": round_} if outcome == "committed" else last)
            with restarted.transaction(positions={"round": round_}):
                again = [
                    restarted.send(topic, value, partition=0, sequence=starts[topic] + i)
                    for topic in topics
                    for i, value in enumerate(values[topic])
                ]
            results = [f.result(0) for f in again]
        if outcome == "committed":
            assert all(r.duplicate for r in results), results
            assert [r.offset for r in results] == offsets
        else:
            assert not any(r.duplicate for r in results), results
        last = {"round": round_}  # the resend committed, duplicates or not
        for topic in topics:
            expected[topic] += values[topic]
    # the commit that met the pause from its start waited for it (the pause bit), and the one
    # paused past its timeout was in doubt and called again before it was decided
    assert outcomes[0][1] >= 5.0 and outcomes[-1][2] > 1, outcomes
    for topic in topics:
        assert _committed(kafka_service, topic) == expected[topic], (topic, outcomes)
    print({"outcomes (outcome, seconds to decide, commit calls)": outcomes})
