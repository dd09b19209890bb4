"""The Pulsar backend against a real Pulsar 3.0 standalone broker: the shared suite plus
Pulsar specifics (plain consumers, fencing of a stale owner, Pulsar's own deduplication)."""

from __future__ import annotations

import json
import logging
import urllib.parse
import urllib.request
from typing import Any

import pytest

from idempotent import Outcome, Record
from idempotent.errors import BackendUnavailableError
from idempotent.testing.conformance import (
    NETWORKED_LEASE,
    BackendConformance,
    check_stale_owner_is_fenced,
    small_config,
    topic_name,
)

from ...conftest import ServiceHarness

pytestmark = pytest.mark.pulsar


def _url(service: Any) -> str:
    # the admin URL travels in the URL, so that child processes (the kill -9 test) find it too
    return f"{service.url}?{urllib.parse.urlencode({'admin_url': service.admin_url})}"


@pytest.fixture
def harness(pulsar_service: Any) -> ServiceHarness:
    return ServiceHarness(_url(pulsar_service), "pulsar", options={"admin_url": pulsar_service.admin_url})


class TestPulsarConformance(BackendConformance):
    lease = NETWORKED_LEASE


def _client(service: Any) -> Any:
    import pulsar

    return pulsar.Client(service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _stats(service: Any, topic: str) -> dict[str, Any]:
    path = topic.replace("persistent://", "/admin/v2/persistent/")
    with urllib.request.urlopen(f"{service.admin_url}{path}/stats", timeout=30) as response:
        stats: dict[str, Any] = json.load(response)
    return stats


def test_plain_pulsar_reader_reads_records_unchanged(harness: ServiceHarness, pulsar_service: Any) -> None:
    import pulsar

    broker = harness.open(small_config())
    topic = "plain/" + topic_name()
    broker.create_topic(topic, 1)
    s = broker.init_producer()
    result = broker.produce(
        topic,
        0,
        s.producer_id,
        s.producer_epoch,
        0,
        [b"v1", Record(b"v2", b"key-2", {"color": b"blue", "size": b"L"}), Record(None, b"\xff\x00")],
    )
    stored = broker.read(topic, 0, 0, 10)
    broker.close()
    assert [(r.value, r.key, r.headers) for r in stored] == [
        (b"v1", None, ()),
        (b"v2", b"key-2", (("color", b"blue"), ("size", b"L"))),
        (None, b"\xff\x00", ()),
    ]
    assert result.base_offset is not None
    assert [r.offset for r in stored] == [result.base_offset + i for i in range(3)]
    client = _client(pulsar_service)
    try:
        reader = client.create_reader(
            "persistent://public/default/" + topic.replace("/", ".") + "-partition-0", pulsar.MessageId.earliest
        )
        messages = [reader.read_next(20_000) for _ in range(3)]
        assert not reader.has_message_available()
    finally:
        client.close()
    assert [m.data() for m in messages[:2]] == [b"v1", b"v2"]
    assert messages[2].has_null_value()
    assert messages[1].partition_key() == "key-2"
    first, second = (m.properties() for m in messages[:2])
    assert first == {
        "idem.pid": str(s.producer_id),
        "idem.epoch": str(s.producer_epoch),
        "idem.seq": "0",
        "idem.count": "3",
    }
    assert second == {
        "idem.pid": str(s.producer_id),
        "idem.epoch": str(s.producer_epoch),
        "idem.seq": "1",
        "color": "blue",
        "size": "L",
    }
    ids = [m.message_id() for m in messages]
    assert len({(i.ledger_id(), i.entry_id()) for i in ids}) == 1, "one batch is one Pulsar entry"
    assert [i.batch_index() for i in ids] == [0, 1, 2]
    assert messages[0].event_timestamp() > 0


def test_stale_owner_is_fenced(harness: ServiceHarness) -> None:
    first = harness.open(small_config())
    topic = topic_name("own")
    first.create_topic(topic, 1)
    s = first.init_producer("owner-test")
    assert first.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is Outcome.ACCEPTED
    second = harness.open(small_config())  # takes the partition over when it first touches it
    s2 = second.init_producer("owner-test")
    assert second.produce(topic, 0, s2.producer_id, s2.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    with pytest.raises(BackendUnavailableError, match="fenced"):
        first.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"stale"])
    with pytest.raises(BackendUnavailableError, match="fenced"):  # and it never takes it back
        first.checker_state(topic, 0)
    assert [r.value for r in second.read(topic, 0, 0, 10)] == [b"a", b"b"]
    first.abandon()
    second.close()


def test_pulsar_deduplicates_the_owners_resends(harness: ServiceHarness, pulsar_service: Any) -> None:
    """Pulsar's dedup is Enabled on data partitions, and a resend of an entry under the
    owner's producer name (what the client does internally after a reconnect) is dropped."""
    import pulsar

    from idempotent.adapters.pulsar.backend import OWNER_PREFIX

    broker = harness.open(small_config())
    topic = topic_name("dedup")
    broker.create_topic(topic, 1)
    s = broker.init_producer()
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"x", b"y"])
    broker.produce(topic, 0, s.producer_id, s.producer_epoch, 2, [b"z"])
    broker.close()
    partition = f"persistent://public/default/{topic}-partition-0"
    assert _stats(pulsar_service, partition)["deduplicationStatus"] == "Enabled"
    client = _client(pulsar_service)
    try:
        producer = client.create_producer(
            partition,
            producer_name=f"{OWNER_PREFIX}{topic}-0",
            access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
        )
        last = producer.last_sequence_id()
        assert last >= 1, "the owner sent explicit sequence ids"
        again = producer.send(b"resent", sequence_id=last)
        assert (again.ledger_id(), again.entry_id()) == (-1, -1), "a resend must be a duplicate"
        producer.close()
    finally:
        client.close()
    reopened = harness.open(small_config())
    try:
        assert [r.value for r in reopened.read(topic, 0, 0, 10)] == [b"x", b"y", b"z"]
        assert reopened.produce(topic, 0, s.producer_id, s.producer_epoch, 3, [b"w"]).outcome is Outcome.ACCEPTED
    finally:
        reopened.close()


def test_tenant_namespace_topics_and_offsets(harness: ServiceHarness, pulsar_service: Any) -> None:
    broker = harness.open(small_config())
    try:
        topic = f"tn-{topic_name()}/ns/events"
        broker.create_topic(topic, 2)
        s = broker.init_producer()
        r0 = broker.produce(topic, 1, s.producer_id, s.producer_epoch, 0, [b"a", b"b", b"c"])
        r1 = broker.produce(topic, 1, s.producer_id, s.producer_epoch, 3, [b"d"])
        assert r0.base_offset is not None and r1.base_offset is not None and r1.base_offset > r0.base_offset + 2
        assert broker.end_offset(topic, 1) == r1.base_offset + 1
        assert broker.end_offset(topic, 0) == 0
        assert [r.value for r in broker.read(topic, 1, r0.base_offset + 1, 10)] == [b"b", b"c", b"d"]
        assert [r.value for r in broker.read(topic, 1, r0.base_offset + 3, 10)] == [b"d"]
        assert [r.value for r in broker.read(topic, 1, r0.base_offset, 2)] == [b"a", b"b"]
        tenant = topic.split("/")[0]
        stats = _stats(pulsar_service, f"persistent://{tenant}/ns/events-partition-1")
        assert stats["deduplicationStatus"] == "Enabled"
    finally:
        broker.close()


def test_batch_larger_than_an_entry_fails_cleanly(harness: ServiceHarness) -> None:
    from idempotent.adapters.pulsar.backend import EntryTooLargeError
    from idempotent.errors import InvalidBatchError

    broker = harness.open(small_config())
    try:
        topic = topic_name("big")
        broker.create_topic(topic, 1)
        s = broker.init_producer()
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"small"]).outcome is Outcome.ACCEPTED
        # the broker knows the entry limit (Broker.limits) and refuses before the backend
        assert broker.limits()[1] < 5 << 20
        with pytest.raises(InvalidBatchError, match="max_batch_bytes"):
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"x" * (3 << 20), b"y" * (3 << 20)])
        # small records whose Pulsar properties outgrow the entry: only the adapter can tell;
        # nothing of it is stored, for certain, so it fails alone and nothing is rebuilt
        replayed = broker.stats(topic)[0].replayed_batches
        with pytest.raises(EntryTooLargeError, match="more than one Pulsar entry holds"):
            broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"z"] * 80_000)
        result = broker.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"next"])
        assert broker.stats(topic)[0].replayed_batches == replayed
        assert result.outcome is Outcome.ACCEPTED
        assert [r.value for r in broker.read(topic, 0, 0, 10)] == [b"small", b"next"]
    finally:
        broker.close()


def test_keys_and_headers_round_trip_exactly(harness: ServiceHarness) -> None:
    broker = harness.open(small_config())
    try:
        topic = topic_name("exact")
        broker.create_topic(topic, 1)
        s = broker.init_producer()
        records = [
            Record(b"a", b"", [("z", b"1"), ("a", b"2")]),  # empty key, unsorted headers
            Record(b"b", b"\x80\xff", [("dup", b"1"), ("dup", b"2")]),  # binary key, repeated name
            Record(b"c", "ключ", [("bin", b"\xff\xfe"), ("idem.mine", b"x"), ("", b"")]),
            Record(b"", None, [("text", "é".encode())]),
        ]
        broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, records)
        stored = broker.read(topic, 0, 0, 10)
        assert [(r.value, r.key, r.headers) for r in stored] == [(r.value, r.key, r.headers) for r in records]
    finally:
        broker.close()


def test_read_only_backend_does_not_take_partitions_over(harness: ServiceHarness) -> None:
    from idempotent.adapters import open_backend
    from idempotent.broker.broker import Broker, BrokerConfig

    owner = harness.open(small_config())
    try:
        topic = topic_name("ro")
        owner.create_topic(topic, 1)
        s = owner.init_producer()
        owner.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a"])
        reader = Broker(open_backend(harness.url, read_only=True), BrokerConfig(maintenance_interval=0))
        try:
            assert reader.checker_state(topic, 0) == owner.checker_state(topic, 0)
            assert [r.value for r in reader.read(topic, 0, 0, 10)] == [b"a"]
        finally:
            reader.abandon()
        assert owner.produce(topic, 0, s.producer_id, s.producer_epoch, 1, [b"b"]).outcome is Outcome.ACCEPTED
    finally:
        owner.close()


def test_stale_owner_with_a_lapsed_lease_is_fenced(harness: ServiceHarness) -> None:
    check_stale_owner_is_fenced(harness)


# -- error mapping at the adapter edge (no broker needed) ------------------------------------

_PULSAR_TRANSIENT = [
    "Timeout",
    "ConnectError",
    "NotConnected",
    "ReadError",
    "LookupError",
    "TooManyLookupRequestException",
    "ServiceUnitNotReady",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "ProducerQueueIsFull",
    "MemoryBufferIsFull",
    "ProducerBlockedQuotaExceededError",
    "ProducerBusy",
    "ConsumerBusy",
    "AlreadyClosed",
]
_PULSAR_FATAL = [
    ("AuthenticationError", "ConfigError"),
    ("AuthorizationError", "ConfigError"),
    ("InvalidConfiguration", "ConfigError"),
    ("InvalidUrl", "ConfigError"),
    ("NotAllowedError", "ConfigError"),
    ("OperationNotSupported", "ConfigError"),
    ("UnsupportedVersionError", "ConfigError"),
    ("TopicNotFound", "InvalidTopicError"),
    ("InvalidTopicName", "InvalidTopicError"),
    ("TopicTerminated", "InvalidTopicError"),
    ("MessageTooBig", "EntryTooLargeError"),
    ("UnknownError", "InternalError"),
    ("ChecksumError", "InternalError"),
    ("InvalidMessage", "InternalError"),
    ("Interrupted", "InternalError"),
]


def test_a_reader_refused_with_consumer_busy_is_opened_again_until_the_timeout() -> None:
    """A reader's create attempt that timed out on the client's side and was sent again finds
    the broker still holding the first one (ConsumerBusy): tried again, not a bug."""
    from pulsar import exceptions

    from idempotent.adapters.pulsar.backend import PulsarBackend

    class Client:
        def __init__(self, refusals: int) -> None:
            self.refusals, self.calls = refusals, 0

        def create_reader(self, topic: str, start: Any, **options: Any) -> str:
            self.calls += 1
            if self.calls <= self.refusals:
                raise exceptions.ConsumerBusy("Pulsar error: ConsumerBusy")
            return f"reader of {topic}"

    backend = PulsarBackend.__new__(PulsarBackend)
    backend.timeout, backend._client = 5.0, Client(2)
    assert backend._open_reader("t", None) == "reader of t" and backend._client.calls == 3
    backend.timeout, backend._client = 0.2, Client(1000)
    with pytest.raises(exceptions.ConsumerBusy):
        backend._open_reader("t", None)
    assert 1 < backend._client.calls < 10


@pytest.mark.parametrize("name", _PULSAR_TRANSIENT)
def test_transient_pulsar_errors_are_retriable(name: str) -> None:
    import pulsar
    from pulsar import exceptions

    from idempotent.adapters.pulsar.backend import _translate
    from idempotent.errors import OwnershipLostError, Recovery

    # raised by a blocking call, or reported as a send callback's Result
    for error in (getattr(exceptions, name)("reason"), getattr(pulsar.Result, name)):
        mapped = _translate(error, "append to t[0]")
        assert type(mapped) is BackendUnavailableError and not isinstance(mapped, OwnershipLostError)
        assert mapped.recovery is Recovery.RETRY


@pytest.mark.parametrize(("name", "expected"), _PULSAR_FATAL)
def test_permanent_and_unknown_pulsar_errors_are_fatal(name: str, expected: str) -> None:
    import pulsar
    from pulsar import exceptions

    from idempotent.adapters.pulsar.backend import _translate
    from idempotent.errors import Recovery

    for error in (getattr(exceptions, name)("reason"), getattr(pulsar.Result, name)):
        mapped = _translate(error, "append to t[0]")
        assert type(mapped).__name__ == expected and mapped.recovery is Recovery.FATAL and not mapped.retriable


def test_pulsar_fencing_means_ownership_lost() -> None:
    from pulsar import exceptions

    from idempotent.adapters.pulsar.backend import _translate
    from idempotent.errors import OwnershipLostError

    assert type(_translate(exceptions.ProducerFenced("reason"), "append to t[0]")) is OwnershipLostError


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (500, "BackendUnavailableError"),
        (503, "BackendUnavailableError"),
        (429, "BackendUnavailableError"),
        (408, "BackendUnavailableError"),
        (401, "ConfigError"),
        (403, "ConfigError"),
        (404, "InvalidTopicError"),
        (412, "InvalidTopicError"),
        (405, "InternalError"),
        (409, "InternalError"),
    ],
)
def test_pulsar_admin_statuses(status: int, expected: str) -> None:
    from idempotent.adapters.pulsar.backend import _HttpError, _translate

    mapped = _translate(_HttpError(status, "reason", "http://admin/x"), "create topic t")
    assert type(mapped).__name__ == expected
    assert mapped.retriable == (expected == "BackendUnavailableError")


def test_pulsar_unexpected_exceptions_are_logged_internal_errors(caplog: pytest.LogCaptureFixture) -> None:
    from idempotent.adapters.pulsar.backend import _map_errors
    from idempotent.errors import InternalError

    with (
        caplog.at_level(logging.ERROR, logger="idempotent.adapters.pulsar"),
        pytest.raises(InternalError) as info,
        _map_errors("append to t[0]"),
    ):
        raise KeyError("a bug")
    assert isinstance(info.value.__cause__, KeyError) and "KeyError" in caplog.text
    with pytest.raises(BackendUnavailableError), _map_errors("admin"):
        raise ConnectionRefusedError("refused")
