"""idempotent.compat.pulsar: the drop-in surface on the embedded backends, and a twin run of
the same user code with the real pulsar-client against a real Pulsar."""

from __future__ import annotations

import datetime
import gc
import logging
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import idempotent
from idempotent import DeliveryStatus
from idempotent.adapters import open_backend
from idempotent.adapters.memory import reset_store
from idempotent.compat import pulsar as compat
from idempotent.testing.faults import FaultyBroker, LinkFaults
from idempotent.testing.native_proxy import CutProxy, pulsar_rewrite, pulsar_send


def publish_orders(pulsar: Any, service_url: Any, topic: str, count: int) -> list[Any]:
    """Ordinary pulsar-client application code: send_async, flush, collect the results."""
    client = pulsar.Client(service_url)
    producer = client.create_producer(topic)
    results: list[Any] = []
    for i in range(count):
        producer.send_async(f"order-{i}".encode(), lambda res, msg_id: results.append(res))
    producer.flush()
    client.close()
    return results


@pytest.fixture
def url() -> Iterator[str]:
    name = uuid.uuid4().hex
    reset_store(name)
    yield f"memory://{name}"
    reset_store(name)


def _values(client: compat.Client, topic: str) -> list[bytes | None]:
    return [r.value for r in client.broker.read(topic, 0, 0, 1000)]


# -- sending and sequence ids ----------------------------------------------------------------


def test_send_returns_message_ids_and_topic_names_map(url: str) -> None:
    client = compat.Client(url)
    producer = client.create_producer("orders")
    assert producer.topic() == "persistent://public/default/orders"
    first = producer.send(b"a", properties={"k": "v"}, partition_key="customer-1")
    second = producer.send(b"b")
    assert (first.partition(), first.offset(), second.offset()) == (0, 0, 1)
    assert first < second and str(first) == "(0,0,0,-1)"
    assert compat.MessageId.deserialize(second.serialize()) == second
    other = client.create_producer("persistent://public/default/orders")  # the same topic
    other.send(b"c")
    assert _values(client, "public/default/orders") == [b"a", b"b", b"c"]
    record = client.broker.read("public/default/orders", 0, 0, 1)[0]
    assert (record.key, record.headers) == (b"customer-1", (("k", b"v"),))
    assert client.get_topic_partitions("orders") == ["persistent://public/default/orders"]
    client.close()


def test_send_async_calls_back_with_result_and_message_id(url: str) -> None:
    client = compat.Client(url)
    producer = client.create_producer("t", batching_enabled=True, batching_max_publish_delay_ms=1000)
    done = threading.Event()
    results: list[tuple[compat.Result, compat.MessageId]] = []

    def callback(res: compat.Result, msg_id: compat.MessageId) -> None:
        results.append((res, msg_id))
        if len(results) == 3:
            done.set()

    for i in range(3):
        producer.send_async(f"v{i}".encode(), callback)
    producer.flush()  # seals the lingering batch
    assert done.wait(10)
    assert [(res, msg_id.offset()) for res, msg_id in results] == [(compat.Result.Ok, i) for i in range(3)]
    client.close()


def test_send_async_calls_back_with_the_failure_when_its_message_is_not_stored(url: str) -> None:
    client = compat.Client(url)
    old = client.create_producer("t", producer_name="feed")
    old.send(b"a")
    client.create_producer("t", producer_name="feed")  # fences the older instance
    done = threading.Event()
    results: list[tuple[compat.Result, compat.MessageId]] = []

    def callback(res: compat.Result, msg_id: compat.MessageId) -> None:
        results.append((res, msg_id))
        done.set()

    old.send_async(b"b", callback)
    assert done.wait(10)
    [(res, msg_id)] = results
    assert res == compat.Result.ProducerFenced
    assert msg_id.offset() == -1
    assert _values(client, "public/default/t") == [b"a"]
    client.close()


def test_initial_sequence_id_and_gaps_work_on_a_fresh_broker_with_default_settings(tmp_path: Any) -> None:
    client = compat.Client(f"sqlite:///{tmp_path / 'fresh.db'}")
    producer = client.create_producer("t", producer_name="p", initial_sequence_id=100)
    first = producer.send(b"x")
    assert producer.last_sequence_id() == 101
    gapped = {seq: producer.send(f"v{seq}".encode(), sequence_id=seq) for seq in (105, 2000, 2**40, 2**63 - 1)}
    assert producer.send(b"again", sequence_id=105) == gapped[105]  # a resend is still a duplicate
    assert producer.send(b"old", sequence_id=101) == first
    assert [(r.sequence, r.value) for r in client.broker.read("public/default/t", 0)] == [
        (101, b"x"),
        (105, b"v105"),
        (2000, b"v2000"),
        (2**40, f"v{2**40}".encode()),
        (2**63 - 1, f"v{2**63 - 1}".encode()),
    ]
    assert client.broker.stats("public/default/t")[0].policy == "monotonic"
    client.close()


def test_an_existing_topic_keeps_the_policy_in_force(url: str) -> None:
    client = compat.Client(url)
    client.broker.create_topic("public/default/kept")
    client.create_producer("kept").close()
    assert client.broker.stats("public/default/kept")[0].policy == "strict"
    client.create_producer("new").close()
    assert client.broker.stats("public/default/new")[0].policy == "monotonic"
    client.close()


def test_strict_policy_accepts_consecutive_sequence_ids_from_zero(url: str) -> None:
    client = compat.Client(url)
    client.broker.create_topic("public/default/t")  # created before: the broker's strict default applies
    producer = client.create_producer("t", producer_name="feed")
    assert producer.last_sequence_id() == -1
    ids = [producer.send(f"v{i}".encode(), sequence_id=i) for i in range(3)]
    assert [m.offset() for m in ids] == [0, 1, 2] and producer.last_sequence_id() == 2
    producer.close()
    again = client.create_producer("t", producer_name="feed")  # a restart resends everything
    assert again.last_sequence_id() == 2
    resent = [again.send(f"v{i}".encode(), sequence_id=i) for i in range(4)]
    assert [m.offset() for m in resent] == [0, 1, 2, 3]  # three duplicates with their original ids
    assert _values(client, "public/default/t") == [b"v0", b"v1", b"v2", b"v3"]
    client.close()


def _by_sequence(client: compat.Client, topic: str, partitions: int) -> list[int]:
    return sorted(r.sequence for p in range(partitions) for r in client.broker.read(topic, p, 0, 1000))


def test_a_partitioned_topic_is_resumed_from_the_lowest_partition(url: str) -> None:
    """A kill leaves each partition with a prefix of its messages, up to different sequence
    ids: the highest (last_sequence_id, as pulsar-client's) would skip partition 2's missing
    ones; resume_sequence_id (the lowest + 1) resends them and nothing is stored twice."""
    client = compat.Client(url)
    client.broker.set_policy("monotonic", namespace="public/default")
    client.broker.create_topic("public/default/feed", partitions=4)

    def router(message: Any, partitions: int) -> int:
        return int(message.value()) % partitions

    first = client.create_producer("feed", producer_name="feed-1", message_router=router)
    sent = [i for i in range(60) if i % 4 != 2 or i <= 18]  # partition 2 stopped at 18
    for i in sent:
        first.send(b"%d" % i, sequence_id=i)
    first.close()
    again = client.create_producer("feed", producer_name="feed-1", message_router=router)
    assert again.last_sequence_ids() == {0: 56, 1: 57, 2: 18, 3: 59}
    assert again.last_sequence_id() == 59  # the highest, as PIP-6's partitioned producer
    assert again.resume_sequence_id() == 19
    for i in range(again.resume_sequence_id(), 60):
        again.send(b"%d" % i, sequence_id=i)
    assert _by_sequence(client, "public/default/feed", 4) == list(range(60))  # each once
    assert again.resume_sequence_id() == 57  # partition 0's last is 56
    again.close()
    client.close()


def test_a_partition_without_messages_resumes_from_the_start_or_the_initial_sequence_id(url: str) -> None:
    client = compat.Client(url)
    client.broker.set_policy("monotonic", namespace="public/default")
    client.broker.create_topic("public/default/sparse", partitions=3)
    producer = client.create_producer("sparse", producer_name="p", message_router=lambda message, count: 0)
    producer.send(b"a", sequence_id=7)
    assert producer.last_sequence_ids() == {0: 7, 1: -1, 2: -1}
    assert (producer.last_sequence_id(), producer.resume_sequence_id()) == (7, 0)
    producer.close()
    # an application that started at 100 says so: the partitions without messages start there
    given = client.create_producer("sparse", producer_name="q", initial_sequence_id=99)
    assert given.last_sequence_ids() == {0: 99, 1: 99, 2: 99} and given.resume_sequence_id() == 100
    given.send(b"b", sequence_id=150, partition_key="k")
    assert given.resume_sequence_id() == 100 and given.last_sequence_id() == 150
    given.close()
    client.close()


def test_producer_resume_sequence_is_the_lowest_partition(url: str) -> None:
    with idempotent.connect(url) as broker:
        broker.set_policy("monotonic", topic="t")
        broker.create_topic("t", partitions=2)
        with idempotent.Producer(broker, producer_name="n") as producer:
            assert producer.last_sequences("t") == {0: -1, 1: -1} and producer.resume_sequence("t") == 0
            producer.send("t", b"x", partition=0, sequence=4).result(10)
            producer.send("t", b"y", partition=1, sequence=9).result(10)
            assert producer.last_sequences("t") == {0: 4, 1: 9} and producer.resume_sequence("t") == 5


def test_strict_policy_refuses_a_jump(url: str) -> None:
    client = compat.Client(url)
    client.broker.create_topic("public/default/t")
    producer = client.create_producer("t", producer_name="feed")
    producer.send(b"a", sequence_id=0)
    with pytest.raises(compat.UnknownError) as raised:
        producer.send(b"b", sequence_id=5)
    assert raised.value.status in (DeliveryStatus.NOT_PERSISTED, DeliveryStatus.POSSIBLY_PERSISTED)
    assert "SequenceDesync" in type(raised.value.__cause__.__cause__).__name__
    assert _values(client, "public/default/t") == [b"a"]
    client.close()


def test_monotonic_policy_allows_holes_and_detects_resends(url: str) -> None:
    client = compat.Client(url)
    client.broker.set_policy("monotonic", namespace="public/default")
    producer = client.create_producer("t", producer_name="feed")
    ids = {seq: producer.send(f"v{seq}".encode(), sequence_id=seq) for seq in (0, 5, 100)}
    assert producer.last_sequence_id() == 100
    assert producer.send(b"v5-again", sequence_id=5) == ids[5]  # duplicate: the original id
    assert producer.send(b"v0-again", sequence_id=0) == ids[0]
    assert _values(client, "public/default/t") == [b"v0", b"v5", b"v100"]
    client.close()


def test_initial_sequence_id_numbers_messages_after_it(url: str) -> None:
    client = compat.Client(url)
    producer = client.create_producer("t", producer_name="feed", initial_sequence_id=9)
    assert producer.last_sequence_id() == 9
    producer.send(b"a")
    producer.send(b"b")
    assert producer.last_sequence_id() == 11
    assert [r.sequence for r in client.broker.read("public/default/t", 0)] == [10, 11]
    client.close()


def test_named_producer_fences_the_older_instance(url: str) -> None:
    client = compat.Client(url)
    old = client.create_producer("t", producer_name="feed")
    old.send(b"a")
    new = client.create_producer("t", producer_name="feed")
    with pytest.raises(compat.ProducerFenced):
        old.send(b"b")
    new.send(b"c")
    assert new.producer_name() == "feed"
    assert _values(client, "public/default/t") == [b"a", b"c"]
    client.close()


def test_queue_full_or_blocking(url: str) -> None:
    client = compat.Client(url)
    client.broker.backend.faults.delay = 0.3  # type: ignore[attr-defined]  # hold acknowledgements
    producer = client.create_producer("t", max_pending_messages=2)
    results: list[compat.Result] = []
    for i in range(3):
        producer.send_async(f"v{i}".encode(), lambda res, msg_id: results.append(res))
    assert results == [compat.Result.ProducerQueueIsFull]
    with pytest.raises(compat.ProducerQueueIsFull):
        producer.send(b"x")
    producer.flush()
    assert sorted(results) == [compat.Result.Ok, compat.Result.Ok, compat.Result.ProducerQueueIsFull]
    blocking = client.create_producer("u", max_pending_messages=1, block_if_queue_full=True)
    for i in range(3):
        blocking.send_async(f"v{i}".encode(), lambda res, msg_id: results.append(res))
    blocking.flush()
    assert results.count(compat.Result.Ok) == 5
    client.close()


def test_lost_acknowledgement_is_answered_as_duplicate() -> None:
    faults = LinkFaults(drop_first_responses=1)
    broker = FaultyBroker(open_backend("memory://"), faults=faults)
    results = publish_orders(compat, broker, "orders", 5)
    assert results == [compat.Result.Ok] * 5 and faults.injected["drop_response"] == 1
    assert [r.value for r in broker.read("public/default/orders", 0)] == [f"order-{i}".encode() for i in range(5)]
    broker.close()


# -- refused ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"authentication": "token"},
        {"use_tls": "yes"},
        {"listener_name": 5},
        {"tls_trust_certs_file_path": 5},
        {"operation_timeout_seconds": "30"},
        {"io_threads": "4"},
    ],
)
def test_client_checks_argument_types_with_value_errors(url: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(options))) as raised:
        compat.Client(url, **options)
    assert isinstance(raised.value, compat.InvalidConfiguration)
    with pytest.raises(TypeError):
        compat.Client(url, no_such_option=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        compat.Client(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        compat.Client("fakeServiceUrl")


@pytest.mark.parametrize("service_url", ["pulsar+tls://localhost:6651", "ws://localhost:8080"])
def test_client_refuses_other_service_urls(service_url: str) -> None:
    """Every service URL pulsar-client takes is taken (tests/backends/pulsar/test_adapter_pulsar_url.py);
    other schemes are refused."""
    with pytest.raises(compat.InvalidConfiguration, match="scheme"):
        compat.Client(service_url)


def test_the_rest_of_pulsar_client_passes_through(url: str) -> None:
    import pulsar
    from idempotent.compat.pulsar.schema import StringSchema

    assert compat.ConsumerType is pulsar.ConsumerType and compat.AuthenticationToken is pulsar.AuthenticationToken
    assert StringSchema is pulsar.schema.StringSchema
    with pytest.raises(compat.InvalidConfiguration, match="logger"):
        compat.Client(url, logger=object())
    client = compat.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), io_threads=4)
    with pytest.raises(compat.OperationNotSupported, match="needs a Pulsar broker"):
        client.subscribe("t", "sub")
    with pytest.raises(compat.OperationNotSupported, match="needs a Pulsar broker"):
        client.create_table_view("t")
    client.close()


def test_client_and_producer_options_are_accepted_and_logged_once(url: str, caplog: pytest.LogCaptureFixture) -> None:
    import pulsar

    compat._LOGGED.clear()
    with caplog.at_level(logging.DEBUG, "idempotent.compat.pulsar"):
        client = compat.Client(url, io_threads=4, connection_timeout_ms=5000, use_tls=True, listener_name="x")
        options: dict[str, Any] = {
            "compression_type": pulsar.CompressionType.LZ4,
            "access_mode": pulsar.ProducerAccessMode.WaitForExclusive,
            "message_routing_mode": pulsar.PartitionsRoutingMode.UseSinglePartition,
            "chunking_enabled": True,
            "properties": {"a": "b"},
        }
        for _ in range(2):
            producer = client.create_producer("t", **options)
            producer.send(b"a", ordering_key="k", event_timestamp=5, replication_clusters=["c"])
    logged = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
    expected = {"io_threads", "connection_timeout_ms", "use_tls", "listener_name", *options}
    expected |= {"ordering_key", "event_timestamp", "replication_clusters"}
    assert sorted(name for line in logged for name in expected if f": {name} is" in line) == sorted(expected)
    assert len(logged) == len(expected)  # each once
    assert all(r.levelno == logging.INFO for r in caplog.records if "without effect" in r.getMessage())
    client.close()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"compression_type": None}, ValueError),
        ({"batching_enabled": "test"}, ValueError),
        ({"block_if_queue_full": "test"}, ValueError),
        ({"initial_sequence_id": "test"}, ValueError),
        ({"producer_name": 5}, ValueError),
        ({"send_timeout_millis": "test"}, ValueError),
        ({"no_such_option": 1}, ValueError),
        ({"encryption_key": "k"}, compat.OperationNotSupported),
        ({"message_router": "not callable"}, ValueError),
    ],
)
def test_create_producer_checks_arguments_as_upstream(url: str, options: dict[str, Any], error: type) -> None:
    client = compat.Client(url)
    with pytest.raises(error, match=next(iter(options))):
        client.create_producer("t", **options)
    with pytest.raises(ValueError):
        client.create_producer(None)  # type: ignore[arg-type]
    client.close()


def test_native_default_enums_are_accepted(url: str) -> None:
    """pulsar-client's own enum and schema objects, at their defaults, as code written for
    pulsar-client passes them: the producer is created and behaves as a default one. The
    bytes schema stores the payload as it is and takes bytes only (TypeError for a str, as
    pulsar-client's BytesSchema), the id returned is the stored message's, and a reader with
    the same schema reads it back. An enum of the wrong kind is refused, naming the option."""
    import pulsar

    client = compat.Client(url)
    producer = client.create_producer(
        "t",
        compression_type=pulsar.CompressionType.NONE,
        access_mode=pulsar.ProducerAccessMode.Shared,
        schema=pulsar.schema.BytesSchema(),
    )
    assert producer.topic() == "persistent://public/default/t"
    message_id = producer.send(b"a")
    with pytest.raises(TypeError):
        producer.send("text")  # type: ignore[arg-type]
    assert _values(client, "public/default/t") == [b"a"]
    reader = client.create_reader("t", compat.MessageId.earliest, schema=pulsar.schema.BytesSchema())
    message = reader.read_next(5)
    assert (message.value(), message.data(), message.message_id()) == (b"a", b"a", message_id)
    with pytest.raises(compat.InvalidConfiguration, match=r"access_mode must be a pulsar\.ProducerAccessMode"):
        client.create_producer("t", access_mode=pulsar.CompressionType.NONE)
    client.close()


def test_send_checks_arguments_and_refuses_delayed_delivery(url: str) -> None:
    client = compat.Client(url)
    producer = client.create_producer("t")
    with pytest.raises(TypeError):
        producer.send(5)  # type: ignore[arg-type]
    for options in ({"properties": "x"}, {"partition_key": 5}, {"sequence_id": "x"}, {"disable_replication": "x"}):
        with pytest.raises(ValueError):
            producer.send(b"a", **options)
    for options in ({"deliver_at": 1}, {"deliver_after": datetime.timedelta(seconds=1)}):
        with pytest.raises(compat.OperationNotSupported, match="delayed delivery"):
            producer.send(b"a", **options)
        with pytest.raises(compat.OperationNotSupported):
            producer.send_async(b"a", None, **options)
    assert _values(client, "public/default/t") == []
    done = threading.Event()
    producer.send_async(b"b", None)  # no callback, as pulsar-client allows
    producer.send_async(b"c", lambda res, msg_id: done.set())
    assert done.wait(10)
    assert _values(client, "public/default/t") == [b"b", b"c"]
    client.close()


def test_a_producer_keeps_its_client_alive(tmp_path: Any) -> None:
    def make() -> compat.Producer:
        return compat.Client(f"sqlite:///{tmp_path / 'kept.db'}").create_producer("t")

    producer = make()
    gc.collect()
    assert producer.send(b"a").offset() == 0  # upstream's producer keeps its client alive too
    producer.close()


def test_readers_on_every_url_from_message_ids(url: str) -> None:
    client = compat.Client(url)
    early = client.create_reader("t", compat.MessageId.earliest)
    producer = client.create_producer("t")
    ids = [producer.send(f"m{i}".encode(), properties={"i": str(i)}, partition_key="k") for i in range(5)]
    late = client.create_reader("t", compat.MessageId.latest)
    first = early.read_next(1000)
    assert (first.data(), first.properties(), first.partition_key(), first.message_id()) == (
        b"m0",
        {"i": "0"},
        "k",
        ids[0],
    )
    assert first.topic_name() == "persistent://public/default/t" and first.publish_timestamp() > 0
    assert not late.has_message_available()
    with pytest.raises(compat.Timeout):
        late.read_next(50)
    producer.send(b"m5")
    assert late.has_message_available() and late.read_next(1000).data() == b"m5"
    after = client.create_reader("t", ids[2])  # resume after a stored id
    assert after.read_next(1000).data() == b"m3"
    inclusive = client.create_reader("t", ids[2], start_message_id_inclusive=True)
    assert inclusive.read_next(1000).data() == b"m2"
    inclusive.seek(ids[4])
    assert inclusive.read_next(1000).data() == b"m4"
    after.seek(compat.MessageId.earliest)
    assert after.read_next(1000).data() == b"m0"
    with pytest.raises(compat.OperationNotSupported):
        after.seek(12345)
    assert compat.MessageId.deserialize(compat.MessageId.latest.serialize()) is compat.MessageId.latest
    assert compat.MessageId.earliest < ids[0] < compat.MessageId.latest
    assert compat.MessageId.wrap(idempotent.MessageId("t", 0, 3)) == ids[3]
    with pytest.raises(ValueError):
        client.create_reader("t", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.create_reader("t", compat.MessageId.earliest, reader_name=5)  # type: ignore[arg-type]
    assert after.is_connected()
    client.close()  # closes its readers too
    assert not after.is_connected()
    with pytest.raises(compat.AlreadyClosed):
        after.read_next(10)


def test_unsupported_calls_and_topics(url: str) -> None:
    client = compat.Client(url)
    with pytest.raises(compat.OperationNotSupported, match="non-persistent"):
        client.create_producer("non-persistent://public/default/t")
    with pytest.raises(compat.OperationNotSupported, match="partition"):
        client.create_producer("t-partition-0")
    with pytest.raises(compat.InvalidTopicName):
        client.create_producer("a/b")
    producer = client.create_producer("t")
    with pytest.raises(compat.InvalidConfiguration, match="sequence_id"):
        producer.send(b"a", sequence_id=-1)
    producer.close()
    with pytest.raises(compat.AlreadyClosed):
        producer.send(b"a")
    client.close()
    with pytest.raises(compat.AlreadyClosed):
        client.create_producer("t")


def test_result_values_match_pulsar_client() -> None:
    import pulsar

    assert {r.name: int(r) for r in compat.Result} == {name: int(v) for name, v in pulsar.Result.__members__.items()}
    for name in compat.__all__:
        if isinstance(getattr(compat, name), type) and issubclass(getattr(compat, name), compat.PulsarException):
            assert hasattr(pulsar, name), name


# -- the twin run against a real Pulsar ------------------------------------------------------


def _free_port_like(port: int) -> int:
    """A free port with as many digits as ``port`` (the lookup rewrite keeps frame sizes)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            candidate: int = sock.getsockname()[1]
        if len(str(candidate)) == len(str(port)):
            return candidate


def _read_values(service_url: str, topic: str) -> list[bytes]:
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        values = []
        while reader.has_message_available():
            values.append(reader.read_next(10_000).data())
        return values
    finally:
        client.close()


@pytest.mark.pulsar
def test_twin_run_native_client_duplicates_drop_in_does_not(pulsar_service: Any) -> None:
    import pulsar

    from idempotent.adapters.pulsar.admin import Admin

    info = pulsar_service
    count = 20
    expected = sorted(f"order-{i}".encode() for i in range(count))
    broker_port = int(info.bootstrap.rsplit(":", 1)[1])

    # 1. the real client through a proxy that cuts the connection once the broker has stored
    #    the first message: the client reconnects, resends its pending messages, and Pulsar
    #    (deduplication off, its default) stores them twice. In a namespace of its own: the
    #    project switches deduplication on for the namespaces of its topics (public/default)
    native_namespace = f"public/twin-{uuid.uuid4().hex[:8]}"
    Admin(info.admin_url, {}, 30).call(
        "PUT", f"/admin/v2/namespaces/{native_namespace}", {"deduplicationEnabled": False}
    )
    native_topic = f"persistent://{native_namespace}/twin-native-{uuid.uuid4().hex[:8]}"
    port = _free_port_like(broker_port)
    with CutProxy(port, broker_port, cut=pulsar_send, cuts=1, rewrite=pulsar_rewrite(broker_port, port)) as proxy:
        results = publish_orders(pulsar, f"pulsar://127.0.0.1:{port}", native_topic, count)
    assert proxy.injected == 1
    assert results == [pulsar.Result.Ok] * count
    native = _read_values(info.bootstrap, native_topic)
    assert len(native) > count and sorted(set(native)) == expected

    # 2. the same code through the drop-in, over the same Pulsar, with the answer to the first
    #    produce request lost after the batch was stored: the resend is a duplicate, not stored
    drop_in_topic = f"twin-drop-in-{uuid.uuid4().hex[:8]}"
    faults = LinkFaults(drop_first_responses=1)
    url = f"{info.url}?{urllib.parse.urlencode({'admin_url': info.admin_url})}"
    broker = FaultyBroker(open_backend(url), faults=faults)
    try:
        results = publish_orders(compat, broker, drop_in_topic, count)
    finally:
        broker.close()
    assert faults.injected["drop_response"] == 1
    assert results == [compat.Result.Ok] * count
    stored = _read_values(info.bootstrap, f"persistent://public/default/{drop_in_topic}-partition-0")
    assert sorted(stored) == expected


def test_exactly_once_through_a_lossy_network_to_a_broker_server() -> None:
    """The user code through the drop-in, to a broker server behind a proxy that cuts
    connections, loses answers and duplicates requests: every order stored once."""
    import idempotent
    from idempotent.net.server import BrokerServer
    from idempotent.testing.proxy import FaultyProxy, ProxyFaults

    faults = ProxyFaults(drop_response=0.1, duplicate_request=0.1, cut=0.05, seed=3)
    with BrokerServer(idempotent.connect("memory://")) as server:
        proxy = FaultyProxy(server.address, faults).start()
        try:
            remote = idempotent.connect(f"idem://{proxy.address}", timeout=0.25)
            client = compat.Client(remote)
            producer = client.create_producer("orders", producer_name="orders-feed")
            ids = [producer.send(f"order-{i}".encode(), sequence_id=i) for i in range(100)]
            client.close()
            remote.close()
        finally:
            proxy.close()
        assert faults.injected["drop_response"] and faults.injected["duplicate_request"] and faults.injected["cut"]
        assert [m.offset() for m in ids] == list(range(100))
        stored = [r.value for r in server.broker.read("public/default/orders", 0, 0, 1000)]
        assert stored == [f"order-{i}".encode() for i in range(100)]


def test_message_ids_compare_only_with_message_ids() -> None:
    a, b = compat.MessageId(0, 1), compat.MessageId(0, 2)
    assert a < b and b >= a and a != b
    with pytest.raises(TypeError):
        _ = a < 3  # type: ignore[operator]
    assert a != "0:1"


def test_authentication_and_authorization_errors_keep_their_pulsar_names() -> None:
    from idempotent import errors

    assert isinstance(compat._exception_for(errors.AuthenticationError("bad token")), compat.AuthenticationError)
    assert isinstance(compat._exception_for(errors.AuthorizationError("not yours")), compat.AuthorizationError)


@pytest.mark.pulsar
def test_subscribe_and_create_reader_through_the_drop_in_module(pulsar_service: Any) -> None:
    """One import line for both halves: on a pulsar:// URL the drop-in stores exactly once,
    subscribe() reads it with a real Pulsar consumer, and create_reader() with idempotent.Reader."""
    import pulsar

    info = pulsar_service
    topic = f"drop-in-consume-{uuid.uuid4().hex[:8]}"
    url = f"{info.url}?{urllib.parse.urlencode({'admin_url': info.admin_url})}"
    client = compat.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, producer_name=f"p-{uuid.uuid4().hex[:8]}", initial_sequence_id=100)
        consumer = client.subscribe(topic, "sub", initial_position=compat.InitialPosition.Earliest)
        ids = [producer.send(f"order-{i}".encode()) for i in range(5)]
        assert producer.send(b"again", sequence_id=101) == ids[0]  # a resend is recognised, not stored
        received = []
        for _ in range(5):
            msg = consumer.receive(10_000)
            received.append(msg.data())
            consumer.acknowledge(msg)
        assert received == [f"order-{i}".encode() for i in range(5)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(500)
        reader = client.create_reader(topic, ids[1])  # resume after a stored id
        assert [reader.read_next(10_000).data() for _ in range(3)] == [b"order-2", b"order-3", b"order-4"]
        assert not reader.has_message_available()
    finally:
        client.close()


def test_a_message_router_picks_the_partition(url: str) -> None:
    """``message_router(message, partitions)`` routes each message, as pulsar-client's (it
    was refused with OperationNotSupported)."""
    client = compat.Client(url)
    topic = "routed-" + uuid.uuid4().hex[:8]
    client.broker.create_topic(topic, 5)

    def router(message: Any, partitions: int) -> int:
        return (10 if message.value().startswith(b"hello-") else 11) % partitions

    producer = client.create_producer(topic, message_router=router)
    ids = [producer.send(value) for value in (b"hello-0", b"hello-1", b"world-0")]
    assert [i.partition() for i in ids] == [0, 0, 1]
    client.close()


def test_exceptions_are_pulsar_clients_own() -> None:
    """An ``except`` of the drop-in's names catches what pulsar-client's consumers raise (the
    passed-through consumers timed out with classes the drop-in's names did not catch)."""
    from pulsar import exceptions

    from idempotent import errors

    assert compat.Timeout is exceptions.Timeout
    assert issubclass(type(compat._exception_for(errors.DeliveryTimeoutError("late"))), exceptions.Timeout)
    with pytest.raises(compat.Timeout):
        raise exceptions.Timeout("from a native consumer")


def test_a_message_id_of_a_ledger_and_entry_is_pulsar_clients() -> None:
    """``MessageId(ledger_id=..., entry_id=...)``, as pulsar-client builds one (a TypeError)."""
    import pulsar

    made = compat.MessageId(ledger_id=5, entry_id=3)
    assert isinstance(made, pulsar.MessageId)
    assert (made.ledger_id(), made.entry_id(), made.partition(), made.batch_index()) == (5, 3, -1, -1)
    assert isinstance(compat.MessageId(0, 7), pulsar.MessageId)  # drop-in ids are taken by its consumers


def test_send_async_fast_and_general_paths_mixed_in_one_batch_report_each_message(url: str) -> None:
    """Messages sent by send_async's short path (no options) and its general one (here with
    properties, as also when the queue is full) land in one buffer: each callback gets its
    own message's id, once."""
    client = compat.Client(url)
    producer = client.create_producer("mixed", batching_enabled=True, batching_max_publish_delay_ms=300)
    reports: list[tuple[str, Any, int]] = []
    done = threading.Event()

    def callback(name: str) -> Any:
        def called(result: Any, msg_id: Any) -> None:
            reports.append((name, result, msg_id.offset()))
            if len(reports) == 4:
                done.set()

        return called

    producer.send_async(b"a", callback("a"))
    producer.send_async(b"b", callback("b"), properties={"p": "1"})
    producer.send_async(b"c", callback("c"))
    producer.send_async(b"d", callback("d"), properties={"p": "2"})
    producer.flush()
    assert done.wait(10)
    assert sorted(reports) == [(n, compat.Result.Ok, i) for i, n in enumerate("abcd")]
    assert _values(client, "public/default/mixed") == [b"a", b"b", b"c", b"d"]
    client.close()


def test_an_unreachable_service_raises_connect_error_within_connection_timeout_ms() -> None:
    """As pulsar-client (its pulsar_test.py ``test_connect_timeout``): nothing answers at the
    service URL, so ``create_producer`` raises ``ConnectError`` once ``connection_timeout_ms``
    has passed (the default would try for 10 s)."""
    import time

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed once the block ends: nothing listens there
    client = compat.Client(f"pulsar://127.0.0.1:{port}", connection_timeout_ms=1000)
    started = time.monotonic()
    with pytest.raises(compat.ConnectError, match="cannot connect"):
        client.create_producer("unreachable")
    assert 0.9 <= time.monotonic() - started < 8
    client.close()
