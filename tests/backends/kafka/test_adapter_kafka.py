"""The Kafka backend against a real Kafka 4.x broker: the shared suite plus Kafka specifics."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from idempotent import Outcome, Record
from idempotent.broker.observer import BrokerObserver
from idempotent.testing.conformance import (
    NETWORKED_LEASE,
    BackendConformance,
    check_stale_owner_is_fenced,
    small_config,
    topic_name,
)

from ...conftest import ServiceHarness

pytestmark = pytest.mark.kafka


@pytest.fixture
def harness(kafka_service: Any) -> ServiceHarness:
    return ServiceHarness(kafka_service.url, "kafka")


class TestKafkaConformance(BackendConformance):
    lease = NETWORKED_LEASE


def test_plain_kafka_consumer_reads_records_unchanged(harness: ServiceHarness, kafka_service: Any) -> None:

    broker = harness.open(small_config())
    topic = "plain/" + topic_name()
    broker.create_topic(topic, 1)
    s = broker.init_producer()
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"v1", b"v2"])
    broker.close()
    messages = _plain_messages(kafka_service, topic, 2)
    assert [m.value() for m in messages] == [b"v1", b"v2"]
    # a batch's identity is on its first message only; the others carry their own headers
    head = dict(messages[0].headers())
    assert head == {
        "idem.pid": str(s.producer_id).encode(),
        "idem.epoch": b"0",
        "idem.seq": b"0",
        "idem.count": b"2",
    }
    assert messages[1].headers() is None


def _plain_messages(kafka_service: Any, topic: str, count: int) -> list[Any]:
    """The first ``count`` messages of partition 0 of ``topic``, as a plain Kafka consumer
    (read_committed) sees them."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": kafka_service.bootstrap, "group.id": "plain", "isolation.level": "read_committed"}
    )
    consumer.assign([TopicPartition(topic.replace("/", "."), 0, 0)])
    messages: list[Any] = consumer.consume(count, 20)
    consumer.close()
    return messages


def _plain_producer(kafka_service: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": kafka_service.bootstrap, "linger.ms": 0})


def test_a_read_that_begins_inside_a_batch_finds_its_head(harness: ServiceHarness) -> None:
    """A fresh backend, which has seen no head, reads from the middle of a batch larger than
    one bulk call and than the first windows it reads back: every record has its batch's
    producer id, sequence and timestamp."""
    broker = harness.open(small_config())
    topic = topic_name("inside")
    broker.create_topic(topic, 1)
    s = broker.init_producer()
    count = 12_000
    values = [b"%d" % i for i in range(count)]
    assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, values).outcome is Outcome.ACCEPTED
    written = broker.read(topic, 0, 0, count)
    broker.close()
    assert [(r.producer_id, r.sequence) for r in written] == [(s.producer_id, i) for i in range(count)]
    assert {r.timestamp for r in written} == {written[0].timestamp}

    fresh = harness.open(small_config())
    try:
        middle = fresh.read(topic, 0, 7_000, 50)
        assert [r.value for r in middle] == [b"%d" % i for i in range(7_000, 7_050)]
        assert [(r.producer_id, r.producer_epoch, r.sequence) for r in middle] == [
            (s.producer_id, s.producer_epoch, 7_000 + i) for i in range(50)
        ]
        assert {r.timestamp for r in middle} == {written[0].timestamp}
    finally:
        fresh.close()


def test_records_written_without_the_checker_have_no_identity(harness: ServiceHarness, kafka_service: Any) -> None:
    """A record another Kafka producer wrote after a batch is not taken for part of it, also
    when a read begins at it; the batches around it keep theirs."""
    broker = harness.open(small_config())
    topic = topic_name("foreign")
    broker.create_topic(topic, 1)
    s = broker.init_producer()
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b"])
    plain = _plain_producer(kafka_service)
    plain.produce(topic.replace("/", "."), b"foreign", partition=0)
    assert plain.flush(30) == 0
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 2, [b"c"])
    everything = broker.read(topic, 0, 0, 10)
    broker.close()
    assert [(r.value, r.producer_id, r.sequence) for r in everything] == [
        (b"a", s.producer_id, 0),
        (b"b", s.producer_id, 1),
        (b"foreign", -1, -1),
        (b"c", s.producer_id, 2),
    ]
    fresh = harness.open(small_config())
    try:
        foreign = everything[2].offset
        assert [(r.value, r.producer_id) for r in fresh.read(topic, 0, foreign, 1)] == [(b"foreign", -1)]
        assert [(r.value, r.sequence) for r in fresh.read(topic, 0, everything[1].offset, 1)] == [(b"b", 1)]
    finally:
        fresh.close()


def test_batches_without_a_producer_keep_their_count_on_the_head(kafka_service: Any) -> None:
    """A batch appended without a producer (the backend's contract allows it) has a head that
    says only how many records it has: reads from inside it know the records belong to no
    producer without reading back further, and replay sees one batch."""

    from idempotent.adapters.kafka.backend import KafkaBackend
    from idempotent.backend import AppendBatch

    backend = KafkaBackend(kafka_service.url, timeout=60)
    topic = topic_name("noproducer")
    try:
        backend.create_topic(topic, 1)
        records = [Record(b"a"), Record(b"b"), Record(b"c")]
        assert backend.append(topic, 0, AppendBatch(None, records, 12.0), None).result(60) == 0
    finally:
        backend.close()
    messages = _plain_messages(kafka_service, topic, 3)
    assert [m.headers() for m in messages] == [[("idem.count", b"3")], None, None]
    fresh = KafkaBackend(kafka_service.url, timeout=60, read_only=True)
    try:
        assert [(r.value, r.producer_id, r.sequence, r.timestamp) for r in fresh.read(topic, 0, 1, 5)] == [
            (b"b", -1, -1, 12.0),
            (b"c", -1, -1, 12.0),
        ]
        assert [(b.base_offset, b.producer_id, b.record_count) for b in fresh.replay(topic, 0, 0)] == [(0, -1, 3)]
    finally:
        fresh.close()


def test_reads_through_foreign_records_read_back_once(kafka_service: Any) -> None:
    """Records of another Kafka producer read in chunks: only the first chunk reads back
    for a head; the later ones know the run they continue."""
    from idempotent.adapters.kafka.backend import KafkaBackend

    backend = KafkaBackend(kafka_service.url, timeout=60)
    try:
        topic = topic_name("foreignrun")
        backend.create_topic(topic, 1)
        plain = _plain_producer(kafka_service)
        for i in range(3000):
            plain.produce(topic.replace("/", "."), b"%d" % i, partition=0)
        assert plain.flush(30) == 0
        fresh = KafkaBackend(kafka_service.url, timeout=60, read_only=True)
        scans: list[tuple[int, int | None]] = []
        read_range = fresh._read_range

        def counting(kafka_topic: str, partition: int, start: int, stop: int | None, limit: int | None = None) -> Any:
            if stop is not None:
                scans.append((start, stop))
            return read_range(kafka_topic, partition, start, stop, limit)

        fresh._read_range = counting  # type: ignore[method-assign]
        try:
            values = []
            for offset in range(1000, 3000, 500):
                chunk = fresh.read(topic, 0, offset, 500)
                assert {r.producer_id for r in chunk} == {-1}
                values += [r.value for r in chunk]
            assert values == [b"%d" % i for i in range(1000, 3000)]
            assert scans == [(0, 1000)]  # the first chunk only, back to the log's start
        finally:
            fresh.close()
    finally:
        backend.close()


def test_records_of_the_earlier_layout_read_with_their_own_identity(
    harness: ServiceHarness, kafka_service: Any
) -> None:
    """Records stored with the identity on every record (the layout before batch heads) read
    back, and replay, as they did."""
    broker = harness.open(small_config())
    topic = topic_name("earlier")
    broker.create_topic(topic, 1)
    broker.close()
    plain = _plain_producer(kafka_service)
    for i in range(3):
        headers = [("idem.pid", b"77"), ("idem.epoch", b"2"), ("idem.seq", b"%d" % (40 + i)), ("user", b"u")]
        if i == 0:
            headers.append(("idem.count", b"3"))
        plain.produce(topic.replace("/", "."), b"%d" % i, partition=0, headers=headers)
    assert plain.flush(30) == 0
    fresh = harness.open(small_config())
    try:
        records = fresh.read(topic, 0, 1, 10)
        assert [(r.producer_id, r.producer_epoch, r.sequence, r.headers) for r in records] == [
            (77, 2, 41, (("user", b"u"),)),
            (77, 2, 42, (("user", b"u"),)),
        ]
    finally:
        fresh.close()
    from idempotent.adapters.kafka.backend import KafkaBackend

    backend = KafkaBackend(kafka_service.url, timeout=60, read_only=True)
    try:
        assert [
            (b.base_offset, b.producer_id, b.base_sequence, b.record_count) for b in backend.replay(topic, 0, 0)
        ] == [(0, 77, 40, 3)]
    finally:
        backend.close()


def test_a_replay_that_begins_inside_a_batch_passes_over_its_rest(harness: ServiceHarness, kafka_service: Any) -> None:
    from idempotent.adapters.kafka.backend import KafkaBackend

    broker = harness.open(small_config())
    topic = topic_name("replay")
    broker.create_topic(topic, 1)
    s = broker.init_producer()
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b", b"c"])
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 3, [b"d", b"e"])
    offsets = [r.offset for r in broker.read(topic, 0, 0, 10)]
    broker.close()
    backend = KafkaBackend(kafka_service.url, timeout=60, read_only=True)
    try:
        replayed = [(b.base_offset, b.base_sequence, b.record_count) for b in backend.replay(topic, 0, offsets[1])]
        assert replayed == [(offsets[3], 3, 2)]
    finally:
        backend.close()


def test_stale_owner_is_fenced(harness: ServiceHarness) -> None:
    first = harness.open(small_config())
    topic = topic_name("own")
    first.create_topic(topic, 1)
    s = first.init_producer("owner-test")
    assert first.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    second = harness.open(small_config())  # takes the partition over when it first touches it
    s2 = second.init_producer("owner-test")
    assert second.produce(topic, 0, s2.producer_id, s2.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    from idempotent.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="fenced"):
        first.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"stale"])
    assert [r.value for r in second.read(topic, 0, 0, 10)] == [b"a", b"b"]
    first.abandon()
    second.close()


def test_stale_owner_with_a_lapsed_lease_is_fenced(harness: ServiceHarness) -> None:
    check_stale_owner_is_fenced(harness)


def test_takeover_of_a_writer_that_died_inside_a_transaction(
    harness: ServiceHarness, kafka_service: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from confluent_kafka import KafkaException, Producer

    topic = topic_name("died")
    first = harness.open(small_config())
    first.create_topic(topic, 1)
    s = first.init_producer(topic)
    assert first.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    first.abandon()
    # the partition's writer as a killed process leaves it: inside a transaction, records sent
    stale = Producer(
        {"bootstrap.servers": kafka_service.bootstrap, "transactional.id": f"idempotent-{topic.replace('/', '.')}-0"}
    )
    stale.init_transactions(30)
    stale.begin_transaction()
    headers = [("idem.pid", b"%d" % s.producer_id), ("idem.epoch", b"0"), ("idem.seq", b"1"), ("idem.count", b"1")]
    stale.produce(topic.replace("/", "."), b"stale", partition=0, headers=headers)
    stale.flush(30)

    caplog.set_level("INFO", logger="idempotent.adapters.kafka")
    second = harness.open(small_config())
    s2 = second.init_producer(topic)
    assert s2.last_sequences[(topic, 0)] == 0  # the open transaction was aborted, not replayed
    assert second.produce(topic, 0, s2.producer_id, s2.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    assert [r.value for r in second.read(topic, 0, 0, 10)] == [b"a", b"b"]
    with pytest.raises(KafkaException):  # fenced: the dead writer's transaction can never commit
        stale.commit_transaction(30)
    second.close()
    # the coordinator aborted the open transaction and said "concurrent transactions" until it
    # had: librdkafka's "GETPID ... retrying" is the normal course of a takeover, not a warning
    takeover = [r for r in caplog.records if r.getMessage().startswith("GETPID")]
    assert all(r.name == "idempotent.clients.librdkafka" for r in takeover)
    assert not [r.getMessage() for r in takeover if r.levelno > logging.INFO]


def test_librdkafka_log_lines_of_the_admin_client_reach_python_logging(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idempotent.adapters.kafka.backend import KafkaBackend
    from idempotent.errors import BackendUnavailableError

    # past the adapter's own reachability check (test_unreachable_kafka_fails_within_the_connect_timeout),
    # so that librdkafka itself tries and logs
    monkeypatch.setattr("idempotent.adapters.kafka.backend.wait_reachable", lambda *args: None)
    caplog.set_level("DEBUG", logger="idempotent.clients.librdkafka")
    with pytest.raises(BackendUnavailableError):
        KafkaBackend("kafka://127.0.0.1:1", timeout=1.0)  # nothing listens there
    lines = [r for r in caplog.records if r.name == "idempotent.clients.librdkafka"]
    assert any("Connection refused" in r.getMessage() and r.levelno >= logging.WARNING for r in lines)


# -- error mapping at the adapter edge (no broker needed) ------------------------------------


def _kafka_error(code_name: str, *, fatal: bool = False, retriable: bool = False, abortable: bool = False) -> Any:
    from confluent_kafka import KafkaError

    return KafkaError(
        getattr(KafkaError, code_name), "reason", fatal=fatal, retriable=retriable, txn_requires_abort=abortable
    )


_TRANSIENT_CODES = [
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_TIMED_OUT",
    "_MSG_TIMED_OUT",
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "CONCURRENT_TRANSACTIONS",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "NOT_COORDINATOR",
    "_DESTROY_BROKER",  # a request on a broker handle librdkafka retired (a broker restarted or left)
    "_NODE_UPDATE",
    "OFFSET_NOT_AVAILABLE",
    "ELIGIBLE_LEADERS_NOT_AVAILABLE",
]


@pytest.mark.parametrize("code_name", _TRANSIENT_CODES)
def test_transient_kafka_errors_are_retriable(code_name: str) -> None:
    from idempotent.adapters.kafka.backend import _translate
    from idempotent.errors import BackendUnavailableError, OwnershipLostError, Recovery

    # librdkafka sets retriable() only where it raises them; the code alone must be enough
    for error in (_kafka_error(code_name), _kafka_error(code_name, retriable=True)):
        mapped = _translate(error, "append to t[0]")
        assert type(mapped) is BackendUnavailableError and not isinstance(mapped, OwnershipLostError)
        assert mapped.recovery is Recovery.RETRY and code_name in str(mapped)


@pytest.mark.parametrize("code_name", ["_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART"])
@pytest.mark.parametrize("may_be_new", [True, False])
def test_an_unseen_partition_the_cluster_lists_is_retriable_and_one_it_does_not_list_is_missing(
    code_name: str, may_be_new: bool
) -> None:
    from idempotent.adapters.kafka.errors import unseen, unseen_partition
    from idempotent.errors import BackendUnavailableError, InvalidTopicError, Recovery

    error = _kafka_error(code_name)
    assert unseen(error)
    # listed: the partition exists, its leader is away or being elected (a broker outage)
    leaderless = unseen_partition(error, "the end of t[0]", True, topic_may_be_new=may_be_new)
    assert type(leaderless) is BackendUnavailableError and leaderless.recovery is Recovery.RETRY
    assert code_name in str(leaderless)
    # not listed: the topic does not exist (a new topic's UNKNOWN_TOPIC_OR_PART is still transient)
    missing = unseen_partition(error, "the end of t[0]", False, topic_may_be_new=may_be_new)
    if code_name == "UNKNOWN_TOPIC_OR_PART" and may_be_new:
        assert type(missing) is BackendUnavailableError
    else:
        assert type(missing) is InvalidTopicError and missing.recovery is not Recovery.RETRY
    assert not unseen(_kafka_error("LEADER_NOT_AVAILABLE"))


@pytest.mark.parametrize(
    ("code_name", "flags"),
    [("INVALID_RECORD", {"retriable": True}), ("OUT_OF_ORDER_SEQUENCE_NUMBER", {"abortable": True})],
)
def test_kafka_errors_librdkafka_flags_as_retriable_or_abortable_are_retriable(
    code_name: str, flags: dict[str, bool]
) -> None:
    from idempotent.adapters.kafka.backend import _translate
    from idempotent.errors import BackendUnavailableError

    assert type(_translate(_kafka_error(code_name, **flags), "append to t[0]")) is BackendUnavailableError


@pytest.mark.parametrize("code_name", ["_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"])
def test_fencing_kafka_errors_mean_ownership_lost(code_name: str) -> None:
    from idempotent.adapters.kafka.backend import _translate
    from idempotent.errors import OwnershipLostError

    # librdkafka raises fencing as a fatal error: it is still a takeover, not a bug
    mapped = _translate(_kafka_error(code_name, fatal=True), "commit to t[0]")
    assert type(mapped) is OwnershipLostError and "fenced" in str(mapped)


@pytest.mark.parametrize("code_name", ["MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"])
def test_oversized_kafka_errors_store_nothing(code_name: str) -> None:
    from idempotent.adapters.kafka.backend import _translate
    from idempotent.errors import EntryTooLargeError, Recovery

    mapped = _translate(_kafka_error(code_name), "deliver to t[0]")
    assert type(mapped) is EntryTooLargeError and mapped.recovery is Recovery.FATAL


@pytest.mark.parametrize(
    ("code_name", "expected"),
    [
        ("_INVALID_ARG", "ConfigError"),
        ("INVALID_CONFIG", "ConfigError"),
        ("INVALID_TRANSACTION_TIMEOUT", "ConfigError"),
        ("UNSUPPORTED_VERSION", "ConfigError"),
        ("TOPIC_AUTHORIZATION_FAILED", "ConfigError"),
        ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "ConfigError"),
        ("CLUSTER_AUTHORIZATION_FAILED", "ConfigError"),
        ("SASL_AUTHENTICATION_FAILED", "ConfigError"),
        ("_AUTHENTICATION", "ConfigError"),
        ("_UNKNOWN_TOPIC", "InvalidTopicError"),
        ("_UNKNOWN_PARTITION", "InvalidTopicError"),
        ("TOPIC_EXCEPTION", "InvalidTopicError"),
        ("INVALID_RECORD", "InternalError"),  # outside a delivery report, see below
        ("UNKNOWN", "InternalError"),
        ("_FAIL", "InternalError"),
    ],
)
def test_permanent_and_unknown_kafka_errors_are_fatal(code_name: str, expected: str) -> None:
    from idempotent.adapters.kafka.backend import _translate
    from idempotent.errors import Recovery

    # retriable() is false here, as librdkafka reports them: the outcome must not be a retry
    mapped = _translate(_kafka_error(code_name), "append to t[0]")
    assert type(mapped).__name__ == expected and mapped.recovery is Recovery.FATAL and not mapped.retriable


@pytest.mark.parametrize("code_name", ["INVALID_RECORD", "INVALID_TIMESTAMP", "_INVALID_DIFFERENT_RECORD"])
def test_a_delivery_report_of_a_refused_record_fails_its_batch_alone(code_name: str) -> None:
    from idempotent.adapters.kafka.errors import refused_record, translate
    from idempotent.errors import InvalidBatchError, Recovery

    # a produced record's report: the broker refused its batch (a resend is refused alike)
    mapped = translate(_kafka_error(code_name), "deliver to t[0]", delivery=True)
    assert type(mapped) is InvalidBatchError and mapped.recovery is Recovery.FATAL and code_name in str(mapped)
    # librdkafka's "failed with another record" names no culprit of its own
    assert refused_record(_kafka_error(code_name)) is (code_name != "_INVALID_DIFFERENT_RECORD")
    # flagged retriable by librdkafka: retried, as any retriable code
    retried = translate(_kafka_error(code_name, retriable=True), "deliver to t[0]", delivery=True)
    assert retried.recovery is Recovery.RETRY


@pytest.mark.parametrize("code_name", ["OUT_OF_ORDER_SEQUENCE_NUMBER", "_GAPLESS_GUARANTEE", "REQUEST_TIMED_OUT"])
def test_fatal_kafka_errors_are_logged_internal_errors(code_name: str, caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import KafkaException

    from idempotent.adapters.kafka.backend import _translate
    from idempotent.errors import InternalError, Recovery

    # fatal() wins over the code: the client instance is unusable, even after a transient code
    with caplog.at_level(logging.ERROR, logger="idempotent.adapters.kafka"):
        mapped = _translate(_kafka_error(code_name, fatal=True, retriable=True), "commit to t[0]")
    assert type(mapped) is InternalError and mapped.recovery is Recovery.FATAL
    assert isinstance(mapped.__cause__, KafkaException) and code_name in str(mapped)
    assert any(code_name in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("code_name", ["_CONFLICT", "_PREV_IN_PROGRESS", "_STATE"])
def test_kafka_errors_of_a_client_in_a_bad_state_are_never_retried(code_name: str) -> None:
    from idempotent.adapters.kafka.backend import _translate
    from idempotent.errors import InternalError, Recovery

    # librdkafka flags them retriable, but the same call on the same client answers the same
    # for ever (after a timed-out commit: "Conflicting commit_transaction API call is already
    # in progress"); the partition writer replaces its client instead (test_adapter_kafka_txn)
    mapped = _translate(_kafka_error(code_name, retriable=True), "append to t[0]")
    assert type(mapped) is InternalError and mapped.recovery is Recovery.FATAL and code_name in str(mapped)


def test_kafka_map_errors_retries_only_a_full_queue() -> None:
    from confluent_kafka import KafkaException

    from idempotent.adapters.kafka.backend import _map_errors
    from idempotent.errors import BackendUnavailableError, ConfigError, InternalError

    with pytest.raises(BackendUnavailableError), _map_errors("produce"):
        raise BufferError("Local: Queue full")
    for bug in (RuntimeError("closed"), ValueError("bad"), TypeError("bad")):
        with pytest.raises(InternalError) as info, _map_errors("produce"):
            raise bug
        assert info.value.__cause__ is bug
    with pytest.raises(ConfigError) as config, _map_errors("connect"):
        raise KafkaException(_kafka_error("_INVALID_ARG"))
    assert isinstance(config.value.__cause__, KafkaException)


def test_an_unusable_partition_writer_is_replaced_and_fences_the_old_client(kafka_service: Any) -> None:
    from confluent_kafka import KafkaException

    from idempotent import Record
    from idempotent.adapters.kafka.backend import KafkaBackend
    from idempotent.adapters.kafka.txn import TxnState
    from idempotent.backend import AppendBatch

    backend = KafkaBackend(kafka_service.url, timeout=60)
    try:
        topic = topic_name("broken")
        backend.create_topic(topic, 1)
        writer = backend._writer(topic, 0)
        assert backend.append(topic, 0, AppendBatch(None, [Record(b"a")], 0.0), None).result(60) == 0
        old = writer._txn._client
        writer._txn._state = TxnState.REPLACE  # as a fatal error or _CONFLICT leaves it
        assert backend.append(topic, 0, AppendBatch(None, [Record(b"b")], 0.0), None).result(60) > 0
        assert backend._writer(topic, 0) is writer and writer._txn._client is not old
        old.begin_transaction()
        old.produce(topic.replace("/", "."), b"stale", partition=0)
        with pytest.raises(KafkaException):  # the fresh client fenced it
            old.commit_transaction(30)
        assert [r.value for r in backend.read(topic, 0, 0, 10)] == [b"a", b"b"]
    finally:
        backend.close()


class _BrokenMetaProducer:
    """A metadata producer after librdkafka raised a fatal error: every delivery fails."""

    def __init__(self) -> None:
        self.pending: list[Any] = []

    def produce(self, *args: Any, on_delivery: Any, **kwargs: Any) -> None:
        self.pending.append(on_delivery)

    def flush(self, timeout: float) -> int:
        for callback in self.pending:
            callback(_kafka_error("_INCONSISTENT", fatal=True), None)
        self.pending = []
        return 0


def test_a_metadata_producer_with_a_fatal_error_is_replaced_not_kept(kafka_service: Any) -> None:
    from idempotent.adapters.kafka.backend import KafkaBackend
    from idempotent.errors import BackendUnavailableError

    backend = KafkaBackend(kafka_service.url, timeout=30)
    try:
        backend._meta_producer = _BrokenMetaProducer()
        with pytest.raises(BackendUnavailableError, match="replaced by a fresh one; retry"):
            backend.save_setting("probe", "1")
        backend.save_setting("probe", "2")  # the retry succeeds on the fresh client
        assert backend.load_settings()["probe"] == "2"
        backend.save_setting("probe", None)
    finally:
        backend.close()


# -- a commit cut off for longer than the timeout (real Kafka, public APIs) ------------------


class _FailedProduces(BrokerObserver):
    """A broker observer that keeps the text of every failed produce request."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def produce_failed(self, topic: str, partition: int, error: BaseException, seconds: float) -> None:
        self.errors.append(f"{type(error).__name__}: {error}")


def _committed_values(kafka_service: Any, topic: str, last_offset: int) -> list[bytes]:
    """Every value of partition 0 up to its end, as a plain read_committed consumer reads
    them once the record at ``last_offset`` is visible."""
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_service.bootstrap,
            "group.id": "plain",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic.replace("/", "."), 0, 0)])
    values: list[bytes] = []
    seen = -1
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF and seen >= last_offset:
                    return values
                continue
            values.append(message.value())
            seen = message.offset()
    finally:
        consumer.close()
    raise AssertionError(f"offset {last_offset} of {topic} never became visible; read {values}")


def _outage(
    kafka_service: Any, url: str, cut: Any, restore: Any, seconds: float, **options: Any
) -> tuple[Any, list[str], list[bytes]]:
    """Send ``before``; cut the link (or stop Kafka); send ``during``; restore after
    ``seconds``; send ``after``. ``url`` is a ``kafka://`` URL (a broker in this process,
    opened with ``options``) or an ``idem://`` one (a broker server). Returns the ``during``
    record's metadata, the errors an in-process broker reported, and what a plain consumer
    reads back."""
    import time

    import idempotent
    from idempotent import DeliveryFailed

    topic = topic_name("outage")
    seen = _FailedProduces()
    broker = idempotent.connect(url, **options)
    if isinstance(broker, idempotent.Broker):
        broker.add_observer(seen)
    try:
        with idempotent.Producer(broker, topic, delivery_timeout_ms=45_000, request_timeout_ms=10_000) as producer:
            assert producer.send(topic, b"before", partition=0).result(60).offset == 0
            cut()
            try:
                during = producer.send(topic, b"during", partition=0)
                time.sleep(seconds)
            finally:
                restore()
            try:
                meta = during.result(90)
                after = producer.send(topic, b"after", partition=0).result(60)
            except DeliveryFailed as exc:
                raise AssertionError(
                    f"{exc!r} (cause {exc.__cause__!r}); the broker reported: {sorted(set(seen.errors))}"
                ) from exc
    finally:
        broker.close()
    assert not after.duplicate and after.offset is not None
    return meta, seen.errors, _committed_values(kafka_service, topic, after.offset)


def test_a_commit_cut_off_longer_than_the_timeout_is_settled_when_the_link_is_back(kafka_service: Any) -> None:
    from idempotent.testing.native_proxy import CutProxy

    assert kafka_service.proxy_port is not None, "the running Kafka has no proxied listener: restart it"
    with CutProxy(kafka_service.proxy_port, kafka_service.relay_port) as proxy:
        url = f"kafka://127.0.0.1:{kafka_service.proxy_port}"
        meta, errors, values = _outage(kafka_service, url, proxy.blackhole, proxy.restore, 4.5, timeout=3.0)
    assert any("commit" in e and "_TIMED_OUT" in e for e in errors), errors  # the commit did time out
    assert values == [b"before", b"during", b"after"]  # none lost, none twice
    # the record reached Kafka once the link was back and the resumed commit stored it
    assert meta.duplicate and meta.offset is not None


def test_a_backend_with_a_new_prefix_opens_although_its_topics_were_just_created(kafka_service: Any) -> None:
    """Regression: a backend whose internal topics it had just created read the metadata
    topic's end before the topic's leader served it, and failed to open with
    NOT_LEADER_FOR_PARTITION about one time in eight (a fresh prefix, or a fresh cluster)."""
    import uuid

    from idempotent.adapters.kafka.backend import KafkaBackend

    for _ in range(8):
        KafkaBackend(f"{kafka_service.url}?prefix=fresh-{uuid.uuid4().hex[:8]}-").close()


def test_scalar_options_can_be_given_in_the_url(kafka_service: Any) -> None:
    from idempotent.adapters.kafka.backend import KafkaBackend
    from idempotent.errors import ConfigError

    for bad in ("?nope=1", "?timeout=soon", "?timeout=0", "?replication_factor=0"):
        with pytest.raises(ConfigError):
            KafkaBackend(f"kafka://127.0.0.1:1{bad}")  # refused before connecting
    opened = KafkaBackend(f"{kafka_service.url}?timeout=7&prefix=p-&replication_factor=1")
    try:
        assert (opened.timeout, opened.prefix, opened.replication_factor) == (7.0, "p-", 1)
    finally:
        opened.close()
    keyword = KafkaBackend(f"{kafka_service.url}?timeout=7", timeout=2.5)
    try:
        assert keyword.timeout == 2.5  # keywords win
    finally:
        keyword.close()


def test_a_broker_server_whose_commit_was_cut_off_serves_again_when_the_link_is_back(
    kafka_service: Any, tmp_path: Any
) -> None:
    import subprocess
    import sys
    import time

    from idempotent.testing.native_proxy import CutProxy

    assert kafka_service.proxy_port is not None, "the running Kafka has no proxied listener: restart it"
    ready = tmp_path / "ready"
    with CutProxy(kafka_service.proxy_port, kafka_service.relay_port) as proxy:
        backend = f"kafka://127.0.0.1:{kafka_service.proxy_port}?timeout=3"
        server = subprocess.Popen(
            [sys.executable, "-m", "idempotent", "broker", "--backend", backend, "--listen", "127.0.0.1:0",
             "--ready-file", str(ready)],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not (ready.exists() and ready.read_text().endswith("\n")):
                assert server.poll() is None and time.monotonic() < deadline, "the broker server did not start"
                time.sleep(0.05)
            url = f"idem://{ready.read_text().strip()}"
            meta, _, values = _outage(kafka_service, url, proxy.blackhole, proxy.restore, 4.5)
        finally:
            server.terminate()
            server.wait(30)
    assert values == [b"before", b"during", b"after"]
    assert meta.offset is not None


def test_a_commit_while_kafka_is_stopped_is_settled_when_it_runs_again(kafka_service: Any) -> None:
    import os
    import signal

    from idempotent.testing import services

    running = services.status("kafka")  # its pid, after any restart by the tests before
    assert running is not None
    pid = running.pid
    meta, errors, values = _outage(
        kafka_service,
        kafka_service.url,
        lambda: os.kill(pid, signal.SIGSTOP),
        lambda: os.kill(pid, signal.SIGCONT),
        4.5,
        timeout=3.0,
    )
    assert any("commit" in e and "_TIMED_OUT" in e for e in errors), errors
    assert values == [b"before", b"during", b"after"]
    assert meta.offset is not None


def test_a_commit_cut_off_past_the_transaction_timeout_is_aborted_by_a_fresh_client(
    kafka_service: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from idempotent.testing.native_proxy import CutProxy

    assert kafka_service.proxy_port is not None, "the running Kafka has no proxied listener: restart it"
    caplog.set_level(logging.WARNING, logger="idempotent.adapters.kafka")
    with CutProxy(kafka_service.proxy_port, kafka_service.relay_port) as proxy:
        url = f"kafka://127.0.0.1:{kafka_service.proxy_port}"
        # the record times out in the client (message.timeout.ms follows transaction.timeout.ms)
        # while the link is silent: the transaction must be aborted, which cannot reach Kafka
        meta, errors, values = _outage(
            kafka_service,
            url,
            proxy.blackhole,
            proxy.restore,
            7.0,
            timeout=2.0,
            client_config={"transaction.timeout.ms": 4000},
        )
    assert any("commit" in e and "_TIMED_OUT" in e for e in errors), errors
    assert any("replacing the client" in r.getMessage() for r in caplog.records)
    assert values == [b"before", b"during", b"after"]
    assert not meta.duplicate  # the fresh client's fence aborted it: the resend was stored


class _Message:
    def __init__(self, offset: int, eof: bool = False) -> None:
        from confluent_kafka import KafkaError

        self._offset = offset
        self._error = KafkaError(KafkaError._PARTITION_EOF) if eof else None

    def error(self) -> Any:
        return self._error

    def offset(self) -> int:
        return self._offset


class _EarlyEndConsumer:
    """A read_committed consumer seen just after a commit: it first reports the partition's
    end before the committed records (their markers not yet written), then the records."""

    def __init__(self, events: list[_Message]) -> None:
        self.events = events

    def list_topics(self, *args: Any, **kwargs: Any) -> None:
        return None

    def assign(self, partitions: Any) -> None:
        return None

    def unassign(self) -> None:
        return None

    def consume(self, count: int, timeout: float) -> list[_Message]:
        taken, self.events = self.events[:1], self.events[1:]
        return taken

    def poll(self, timeout: float) -> _Message | None:
        return None


def test_a_read_after_a_commit_waits_for_the_records_this_backend_committed() -> None:
    import threading

    from idempotent.adapters.kafka.backend import KafkaBackend

    backend = KafkaBackend.__new__(KafkaBackend)  # no connection: only the read loop is exercised
    backend._lock = threading.RLock()
    backend._reader_topics = {"t"}
    backend._written = {}
    backend.timeout = 5.0
    events = [_Message(0, eof=True), _Message(0), _Message(1), _Message(2), _Message(4, eof=True)]
    backend._reader = _EarlyEndConsumer(list(events))
    assert [m.offset() for m in backend._read_range("t", 0, 0, None)] == []  # nothing known written: ends at once
    backend.note_written("t", 0, 3)
    backend._reader = _EarlyEndConsumer(list(events))
    assert [m.offset() for m in backend._read_range("t", 0, 0, None)] == [0, 1, 2]


class _QueueFullOnce:
    """A librdkafka producer whose local queue is full once, at the ``full_at``-th produce."""

    def __init__(self, full_at: int) -> None:
        self.full_at = full_at
        self.calls = 0
        self.queued: list[tuple[Any, ...]] = []

    def produce(self, topic: str, *fields: Any, **named: Any) -> None:
        """Every field by position, in confluent-kafka's order (value, key, partition,
        on_delivery, callback, timestamp, headers), or every one by name."""
        self.calls += 1
        if self.calls == self.full_at:
            raise BufferError("Local: Queue full")
        if fields:
            value, key, partition, _, _, timestamp, headers = fields
        else:
            value, key, partition = named["value"], named["key"], named["partition"]
            headers, timestamp = named["headers"], named["timestamp"]
        self.queued.append((topic, value, key, partition, headers, timestamp))

    def poll(self, timeout: float) -> int:
        return 0


def test_records_with_headers_are_produced_one_by_one_in_order_through_a_full_queue() -> None:
    import types

    from idempotent import Record
    from idempotent.adapters.kafka.writer import PartitionWriter

    writer = types.SimpleNamespace(kafka_topic="t", partition=2)
    writer._produce_one = types.MethodType(PartitionWriter._produce_one, writer)
    producer = _QueueFullOnce(full_at=2)
    records = [Record(b"v%d" % i, b"k", {"h": b"%d" % i}, None if i % 2 else 5_000) for i in range(4)]
    PartitionWriter._produce_each(writer, producer, records, 1_000)  # type: ignore[arg-type]
    assert producer.queued == [
        ("t", b"v%d" % i, b"k", 2, [("h", b"%d" % i)], 1_000 if i % 2 else 5_000) for i in range(4)
    ]


def test_a_batch_the_kafka_broker_refuses_fails_alone_and_the_partition_goes_on(kafka_service: Any) -> None:
    """A record stamped a month ahead is refused by Kafka (``log.message.timestamp.after.max.ms``):
    the partition writer answers its batch with InvalidBatchError (a resend would be refused
    alike), the producer's sequence is free again, and the next batch is stored (after at most
    a few retriable answers while the writer's client recovers its own sequence numbers)."""
    import time

    import idempotent
    from idempotent.errors import BackendUnavailableError, InvalidBatchError

    topic = topic_name("refused")
    with idempotent.connect(kafka_service.url) as broker:
        broker.create_topic(topic, 1)
        session = broker.init_producer()
        pid, epoch = session.producer_id, session.producer_epoch
        ahead = int(time.time() * 1000) + 30 * 86_400_000
        with pytest.raises(InvalidBatchError, match="INVALID_TIMESTAMP"):
            broker.produce(topic, 0, pid, epoch, 0, [Record(b"ahead", timestamp=ahead)])
        retried = 0
        while True:
            try:
                result = broker.produce(topic, 0, pid, epoch, 0, [Record(b"after")])
                break
            except BackendUnavailableError:
                retried += 1
                assert retried <= 3
                time.sleep(0.1)
        assert result.outcome is Outcome.ACCEPTED
        assert [r.value for r in broker.read(topic, 0)] == [b"after"]
