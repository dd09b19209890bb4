"""The confluent-kafka drop-in's transactions on the suite's Kafka: an application written as
confluent-kafka-python's ``examples/eos_transactions.py`` (``examples/drop_in_eos_transactions.py``),
killed with -9 at random points and restarted, leaves every input record once in the output
and the group's offsets at the input's ends, as the native client does (run in the same test
as a baseline); an abort is invisible; a second instance of a ``transactional.id`` fences the
first."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from idempotent.compat import confluent_kafka as compat

from ..transaction_faults import KafkaPauses

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "drop_in_eos_transactions.py"
DROP_IN_IMPORT = "from idempotent.compat.confluent_kafka import Consumer, KafkaException, Producer"
RECORDS = 6000


def _topic(kafka_service: Any, partitions: int) -> str:
    name = f"eos-{uuid.uuid4().hex[:10]}"
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_service.bootstrap})
    futures = admin.create_topics([confluent_kafka.admin.NewTopic(name, partitions, 1)])
    for future in futures.values():
        future.result(60)
    return name


def _read_committed(kafka_service: Any, topic: str, partitions: int) -> list[bytes]:
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
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for message in consumer.consume(500, 0.2):
                if message.error() is None:
                    values.append(message.value())
            positions = consumer.position([confluent_kafka.TopicPartition(topic, p) for p in range(partitions)])
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                return values
        raise AssertionError(f"{topic}: not read to its ends {ends}")
    finally:
        consumer.close()


def _fill(kafka_service: Any, topic: str) -> list[bytes]:
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_service.bootstrap})
    values = [f"record-{i:05d}".encode() for i in range(RECORDS)]
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % 3)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return values


def _group_offsets(kafka_service: Any, group: str, topic: str) -> dict[int, int]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka_service.bootstrap, "group.id": group})
    try:
        committed = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in range(3)], timeout=30)
        return {tp.partition: tp.offset for tp in committed}
    finally:
        consumer.close()


def _ends(kafka_service: Any, topic: str) -> dict[int, int]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka_service.bootstrap, "group.id": "ends"})
    try:
        return {
            p: consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), 30, cached=False)[1]
            for p in range(3)
        }
    finally:
        consumer.close()


def _app(tmp_path: Path, native: bool) -> Path:
    source = EXAMPLE.read_text()
    assert DROP_IN_IMPORT in source
    if native:
        source = source.replace(DROP_IN_IMPORT, "from confluent_kafka import Consumer, KafkaException, Producer")
    path = tmp_path / ("native_eos.py" if native else "drop_in_eos.py")
    path.write_text(source)
    return path


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("native", [False, True], ids=["drop-in", "native-baseline"])
def test_eos_transactions_killed_with_9_and_restarted_store_each_record_once(
    kafka_service: Any, tmp_path: Path, native: bool
) -> None:
    source, sink = _topic(kafka_service, 3), _topic(kafka_service, 3)
    values = _fill(kafka_service, source)
    group, txn_id = f"g-{uuid.uuid4().hex[:8]}", f"eos-{uuid.uuid4().hex[:8]}"
    app = _app(tmp_path, native)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, str(app), kafka_service.bootstrap, source, sink, group, txn_id]
    rng = random.Random()
    kills = 0
    while kills < 5:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert process.stdout is not None
        # killed after a random number of its commits, at a random moment after the last one
        wanted = rng.randint(1, 6)
        seen = 0
        deadline = time.monotonic() + 120
        for line in process.stdout:
            if line.startswith("committed"):
                seen += 1
            if seen >= wanted or line.strip() == "done":
                break
            assert time.monotonic() < deadline, "the application made no progress"
        time.sleep(rng.uniform(0, 0.3))
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            kills += 1
        process.wait(60)
    final = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "done" in final.stdout
    output = _read_committed(kafka_service, sink, 3)
    counts = Counter(output)
    assert sorted(counts) == sorted(v.upper() for v in values)
    assert set(counts.values()) == {1}, [v for v, n in counts.items() if n > 1][:5]
    assert _group_offsets(kafka_service, group, source) == _ends(kafka_service, source)


def _producer(kafka_service: Any, txn_id: str) -> compat.Producer:
    producer = compat.Producer({"bootstrap.servers": kafka_service.bootstrap, "transactional.id": txn_id})
    producer.init_transactions(60)
    return producer


def test_an_abort_is_invisible_and_the_next_transaction_commits(kafka_service: Any) -> None:
    sink = _topic(kafka_service, 1)
    producer = _producer(kafka_service, f"ab-{uuid.uuid4().hex[:8]}")
    reports: list[Any] = []
    producer.begin_transaction()
    for i in range(10):
        producer.produce(sink, f"aborted-{i}".encode(), on_delivery=lambda err, msg: reports.append(err))
    producer.flush(30)  # inside a transaction: delivered (acknowledged), not committed
    producer.abort_transaction()
    producer.begin_transaction()
    producer.produce(sink, b"kept")
    producer.commit_transaction()
    producer.close()
    assert len(reports) == 10
    assert _read_committed(kafka_service, sink, 1) == [b"kept"]


def test_the_wrong_state_and_a_second_instance_fencing_the_first(kafka_service: Any) -> None:
    sink = _topic(kafka_service, 1)
    txn_id = f"fe-{uuid.uuid4().hex[:8]}"
    old = _producer(kafka_service, txn_id)
    with pytest.raises(compat.KafkaException) as raised:
        old.commit_transaction()
    error = raised.value.args[0]
    assert error.code() == compat.KafkaError._STATE and not (error.fatal() or error.retriable())
    old.begin_transaction()
    old.produce(sink, b"old-before")
    old.commit_transaction()
    old.begin_transaction()
    old.produce(sink, b"old-after")
    new = _producer(kafka_service, txn_id)  # fences the older instance
    new.begin_transaction()
    new.produce(sink, b"new")
    new.commit_transaction()
    with pytest.raises(compat.KafkaException) as raised:
        old.commit_transaction()
    error = raised.value.args[0]
    assert error.fatal(), error
    new.close()
    assert _read_committed(kafka_service, sink, 1) == [b"old-before", b"new"]


def _stable_end(kafka_service: Any, topic: str) -> int:
    """The partition's last stable offset: held at the first record of a transaction still open."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka_service.bootstrap, "group.id": "x", "isolation.level": "read_committed"}
    )
    try:
        return int(consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), 30, cached=False)[1])
    finally:
        consumer.close()


@pytest.mark.timeout(600)
def test_a_transaction_open_past_its_timeout_is_aborted_and_told_at_the_next_call(kafka_service: Any) -> None:
    sink = _topic(kafka_service, 1)
    producer = compat.Producer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "transactional.id": f"to-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 5000,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(sink, b"committed-first")
    producer.commit_transaction()
    producer.begin_transaction()
    producer.produce(sink, b"left-open")
    assert producer.flush(30) == 0
    # Kafka's coordinator aborts it once it is older than 5 s (it looks every 10 s by default):
    # the partition's stable end moves past its records
    deadline = time.monotonic() + 120
    while _stable_end(kafka_service, sink) < 3:
        assert time.monotonic() < deadline, "the coordinator did not abort the open transaction"
        time.sleep(0.5)
    with pytest.raises(compat.KafkaException) as raised:
        producer.commit_transaction()
    error = raised.value.args[0]
    assert error.txn_requires_abort() and not error.fatal(), error
    producer.abort_transaction()
    producer.begin_transaction()
    producer.produce(sink, b"committed-after")
    producer.commit_transaction()
    producer.close()
    assert _read_committed(kafka_service, sink, 1) == [b"committed-first", b"committed-after"]


def _commit_until_decided(producer: compat.Producer, deadline: float) -> tuple[str, int]:
    """Commit as librdkafka's documentation says an application should: a retriable error
    (the outcome is not known yet) is answered by calling the commit again, one that
    requires an abort by aborting. Returns "committed" or "aborted", and the calls made."""
    calls = 0
    while True:
        calls += 1
        try:
            producer.commit_transaction(5)
            return "committed", calls
        except compat.KafkaException as raised:
            error = raised.args[0]
            assert not error.fatal(), error
            if error.txn_requires_abort():
                producer.abort_transaction(60)
                return "aborted", calls
            assert error.retriable(), error
            assert time.monotonic() < deadline, "the commit was not decided within the test's bound"
            time.sleep(0.5)


@pytest.mark.timeout(600)
def test_kafka_paused_past_the_request_timeout_during_commit_transaction_commits_or_aborts_never_both(
    kafka_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop-in's ``commit_transaction`` of a transaction over 3 topics meets Kafka stopped
    with SIGSTOP for 8 s (the producer's request timeout is 5 s) as it begins or 3 ms into
    it, and for 25 s once. Whatever it answers, a ``read_committed`` consumer then sees the
    round's messages exactly once when it committed and not at all when it aborted (and then
    once, after the application produced them again)."""
    topics = [_topic(kafka_service, 1) for _ in range(3)]
    schedule = ((0.0, 8.0), (0.003, 8.0), (0.0, 25.0))
    pauses = KafkaPauses(monkeypatch)
    producer = compat.Producer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "idempotent.broker.url": f"{kafka_service.url}?timeout=5",
            "transactional.id": f"sp-{uuid.uuid4().hex[:8]}",
        }
    )
    producer.init_transactions(60)
    outcomes: list[tuple[str, float, int]] = []
    expected: dict[str, list[bytes]] = {topic: [] for topic in topics}
    try:
        for round_, (delay, length) in enumerate(schedule):
            values = {topic: [f"{topic}-{round_}-{i}".encode() for i in range(5)] for topic in topics}
            producer.begin_transaction()
            for topic in topics:
                for value in values[topic]:
                    producer.produce(topic, value)
            assert producer.flush(30) == 0  # delivered inside the transaction: only the commit is left
            pauses.arm(delay, length)
            began = time.monotonic()
            try:
                outcome, calls = _commit_until_decided(producer, began + 180)
            finally:
                pauses.settle()
            outcomes.append((outcome, round(time.monotonic() - began, 2), calls))
            if outcome == "aborted":  # the application produces the round again
                producer.begin_transaction()
                for topic in topics:
                    for value in values[topic]:
                        producer.produce(topic, value)
                producer.commit_transaction(60)
            for topic in topics:
                expected[topic] += values[topic]
                assert _read_committed(kafka_service, topic, 1) == expected[topic], (topic, outcomes)
    finally:
        producer.close()
    assert outcomes[0][1] >= 5.0 and outcomes[-1][2] > 1, outcomes
    print({"outcomes (outcome, seconds to decide, commit calls)": outcomes})
