"""A producer's own broker (``idempotent/broker/direct.py``) on a real Kafka: what is Kafka's own
(record times, message sets, refused records). The producer-scoped logic (restarts, fencing,
groups, unknown outcomes) is the ProducerLog conformance suite's
(``idempotent/testing/conformance_producer_log.py``), run on the in-memory log in
tests/broker/test_conformance_producer_log.py and on Kafka and Pulsar in tests/backends/."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

import idempotent
from idempotent import Outcome
from idempotent.broker.direct import DirectBroker
from idempotent.connection import open_for_producer
from idempotent.core.records import Record, RecordColumns

# every test runs on both write paths of the producer log (compiled and pure-Python)
pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_write_path")]


def _topic(kafka_service: Any, partitions: int = 1) -> str:
    name = f"direct-{uuid.uuid4().hex[:10]}"
    with idempotent.connect(kafka_service.url) as broker:
        broker.create_topic(name, partitions)
    return name


def _direct(kafka_service: Any) -> DirectBroker:
    broker = open_for_producer(kafka_service.url)
    assert isinstance(broker, DirectBroker)
    return broker


def _read_all(kafka_service: Any, topic: str, partition: int = 0) -> list[Any]:
    with idempotent.Reader(kafka_service.url, topic, partition=partition) as reader:
        return list(reader)


@pytest.mark.parametrize("opener", ["direct", "broker"])
def test_records_are_read_back_with_their_own_times_or_their_batchs(kafka_service: Any, opener: str) -> None:
    """A batch whose records carry times stores each record's own (Kafka CreateTime); a batch
    without reads back every record with the batch's time, whichever writer wrote it.

    The times are recent: Kafka rolls a segment whose first record is older than ``segment.ms``
    and deletes a segment whose newest record is older than ``retention.ms`` (7 days each by
    default), so records stamped years ago could vanish between the write and the read."""
    topic = _topic(kafka_service)
    broker: Any = _direct(kafka_service) if opener == "direct" else idempotent.connect(kafka_service.url)
    session = broker.init_producer()
    hour_ago = int(time.time() * 1000) - 3_600_000
    times = [hour_ago + i for i in range(2000)]
    timed = RecordColumns([b"t%d" % i for i in range(2000)], None, times)
    plain = RecordColumns([b"p%d" % i for i in range(12_000)])
    pid, epoch = session.producer_id, session.producer_epoch
    assert broker.produce(topic, 0, pid, epoch, 0, timed).outcome is Outcome.ACCEPTED
    assert broker.produce(topic, 0, pid, epoch, 2000, plain).outcome is Outcome.ACCEPTED
    assert broker.produce(topic, 0, pid, epoch, 14_000, [Record(b"one", timestamp=hour_ago - 60_000)]).outcome is (
        Outcome.ACCEPTED
    )
    broker.close()
    stored = _read_all(kafka_service, topic)
    assert [m.timestamp for m in stored[:2000]] == [t / 1000 for t in times]
    assert len({m.timestamp for m in stored[2000:14_000]}) == 1
    assert stored[14_000].timestamp == (hour_ago - 60_000) / 1000
    # a fresh reader starting inside the plain batch finds its head and its time
    with idempotent.Reader(kafka_service.url, topic, idempotent.MessageId(topic, 0, stored[9000].offset)) as reader:
        inside = next(iter(reader))
    assert inside.timestamp == stored[2000].timestamp and inside.sequence == 9001


def test_the_largest_batch_the_writer_takes_fits_one_message_set(kafka_service: Any) -> None:
    """A batch of MAX_BATCH_RECORDS records with five headers each and MAX_BATCH_BYTES in all
    (as ``Record.size`` counts) is stored whole: librdkafka sends it as one message set, so
    the writer's layout check passes."""
    from idempotent.adapters.kafka.producer_log import MAX_BATCH_BYTES, MAX_BATCH_RECORDS
    from idempotent.backend import AppendBatch
    from idempotent.core.request import ProduceRequest

    topic = _topic(kafka_service, partitions=1)
    broker = _direct(kafka_service)
    session = broker.init_producer()
    log: Any = broker._log
    headers = [(f"h{i}", b"x") for i in range(5)]
    value_bytes = MAX_BATCH_BYTES // MAX_BATCH_RECORDS - 16 - sum(4 + len(n) + len(v) for n, v in headers)
    stamp = int(time.time() * 1000) - 3_600_000  # own times up to 8 days apart: long varints
    records = [
        Record(b"%0*d" % (value_bytes, j), headers=headers, timestamp=stamp - j * 70_000)
        for j in range(MAX_BATCH_RECORDS)
    ]
    request = ProduceRequest.build(topic, 0, session.producer_id, session.producer_epoch, 0, records)
    assert MAX_BATCH_BYTES - 100 < request.size <= MAX_BATCH_BYTES
    batch = AppendBatch(request.header, request.records, time.time(), request.size)
    assert log.write([(topic, 0, batch)]) == [0]
    broker.close()
    stored = _read_all(kafka_service, topic, 0)
    assert len(stored) == MAX_BATCH_RECORDS and stored[-1].value == records[-1].value


def test_a_run_is_placed_only_when_its_first_and_last_offsets_prove_it_whole() -> None:
    from types import SimpleNamespace

    from idempotent.adapters.kafka.producer_log import KafkaProducerLog
    from idempotent.backend import AppendBatch
    from idempotent.errors import BackendUnavailableError

    log: Any = SimpleNamespace(transactional_id="t")
    batches: list[Any] = [("a", 0, AppendBatch(None, [None] * n, 0.0, 10)) for n in (3, 1, 4)]
    offsets = [-1, -1, -1]
    KafkaProducerLog._place(log, batches, [([0, 1, 2], [10], [17])], [], offsets)
    assert offsets == [10, 13, 14]
    with pytest.raises(BackendUnavailableError, match="split"):  # another producer's record inside
        KafkaProducerLog._place(log, batches, [([0, 1, 2], [10], [18])], [], offsets)
    with pytest.raises(BackendUnavailableError, match="not acknowledged"):
        KafkaProducerLog._place(log, batches, [([0, 1, 2], [10], [])], [], offsets)


def test_runs_pack_the_batches_of_a_partition_that_fit_one_message_set() -> None:
    from idempotent.adapters.kafka.producer_log import MESSAGE_SET_RECORDS, _runs
    from idempotent.backend import AppendBatch

    def group(size: int | None, count: int = 1) -> list[Any]:
        places = [("a", 0), ("a", 1), ("a", 0), ("b", 0), ("a", 0), ("a", 1)]
        return [(t, p, AppendBatch(None, [None] * count, 0.0, size)) for t, p in places]

    # measured and small: one round, each partition's batches in one run, in order
    assert _runs(group(100)) == [[[0, 2, 4], [1, 5], [3]]]
    # unmeasured, or too large to share a message set: the nth batch of each in round n
    for batches in (group(None), group(500_000), group(100, MESSAGE_SET_RECORDS // 2 + 1)):
        assert _runs(batches) == [[[0], [1], [3]], [[2], [5]], [[4]]]
    # two of a partition fit, the third does not
    assert _runs(group(400_000)) == [[[0, 2], [1, 5], [3]], [[4]]]
    assert _runs([]) == []


def test_a_record_the_broker_refuses_fails_its_batch_alone_and_the_producer_goes_on(kafka_service: Any) -> None:
    """A record stamped a month ahead is refused by Kafka (``log.message.timestamp.after.max.ms``):
    the drop-in reports it failed with INVALID_RECORD, not fatal, and the producer keeps
    working; the partition holds the records before and after it, numbered without a gap."""
    from idempotent.compat.confluent_kafka import KafkaError, Producer

    topic = _topic(kafka_service)
    reports: list[tuple[Any, bytes]] = []
    producer = Producer({"bootstrap.servers": kafka_service.bootstrap})
    ahead = int(time.time() * 1000) + 30 * 86_400_000
    for value, stamp in ((b"before", None), (b"ahead", ahead), (b"after", None)):
        kwargs = {} if stamp is None else {"timestamp": stamp}
        producer.produce(topic, value, partition=0, on_delivery=lambda e, m: reports.append((e, m.value())), **kwargs)
        assert producer.flush(30) == 0
    assert [value for _, value in reports] == [b"before", b"ahead", b"after"]
    assert reports[0][0] is None and reports[2][0] is None
    error = reports[1][0]
    assert error.code() == KafkaError.INVALID_RECORD and not error.fatal() and not error.retriable()
    stored = _read_all(kafka_service, topic)
    assert [m.value for m in stored] == [b"before", b"after"]
    assert [m.sequence for m in stored] == [0, 1]


def test_the_producer_log_writes_through_the_path_in_use(
    kafka_service: Any, kafka_write_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled path writes (and commits) each group in one call; the pure-Python path
    never calls it. Both store the same records at the same offsets."""
    import idempotent.adapters.kafka.producer_log as kafka_direct
    from idempotent.backend import AppendBatch
    from idempotent.core.request import ProduceRequest

    calls: list[bool] = []
    real = kafka_direct.write_group

    def counted(*args: Any) -> Any:
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(kafka_direct, "write_group", counted)
    topic = _topic(kafka_service, partitions=2)
    broker = _direct(kafka_service)
    session = broker.init_producer()
    log: Any = broker._log
    group = []
    for partition in (0, 1):
        for n in range(3):
            records = [
                Record(b"%d-%d-%d" % (partition, n, j), headers=(("h", b"%d" % j),) if j else ()) for j in range(4)
            ]
            request = ProduceRequest.build(
                topic, partition, session.producer_id, session.producer_epoch, 4 * n, records
            )
            group.append((topic, partition, AppendBatch(request.header, request.records, time.time(), request.size)))
    assert log.write(group) == [0, 4, 8, 0, 4, 8]
    broker.close()
    # a named producer's states are produced between the writes and the commit
    assert calls == ([not log.named] if kafka_write_path == "compiled" else [])
    for partition in (0, 1):
        stored = _read_all(kafka_service, topic, partition)
        assert [m.value for m in stored] == [b"%d-%d-%d" % (partition, n, j) for n in range(3) for j in range(4)]
        assert [m.offset for m in stored] == list(range(12))
