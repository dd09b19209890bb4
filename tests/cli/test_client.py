"""The network client: the Broker API over TCP, same errors, reconnects, exactly-once end to end."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import pytest

import idempotent
import idempotent.errors as errors
from idempotent import Outcome, Policy, Producer, Record
from idempotent.api import BrokerAPI
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerConnectionError,
    ConfigError,
    InvalidBatchError,
    InvalidTopicError,
    NotOwnerError,
    ProducerClosedError,
    Recovery,
)
from idempotent.net.client import RemoteBroker, parse_url
from idempotent.net.server import BrokerServer, Principal, ServerConfig
from idempotent.testing.conformance import small_config
from idempotent.testing.faults import FaultyBroker, LinkFaults
from idempotent.testing.proxy import FaultyProxy, ProxyFaults

from ..conftest import memory_harness


def open_broker(config: BrokerConfig | None = None) -> Broker:
    return memory_harness().open(config or BrokerConfig(maintenance_interval=0))


@pytest.fixture
def server() -> Iterator[BrokerServer]:
    with BrokerServer(open_broker()) as srv:
        yield srv


@pytest.fixture
def client(server: BrokerServer) -> Iterator[RemoteBroker]:
    with RemoteBroker(server.url) as c:
        yield c


def test_urls_and_connect() -> None:
    assert parse_url("idem://h:1") == ("h", 1, False)
    assert parse_url("idems://h") == ("h", 7650, True)
    for bad in ("idem://", "http://h:1", "idem://h:1/x", "idem://h:99999"):
        with pytest.raises(ConfigError):
            parse_url(bad)
    with pytest.raises(ConfigError):
        idempotent.connect("idem://h:1", BrokerConfig())
    with pytest.raises(ConfigError):
        RemoteBroker("idem://127.0.0.1:1", cafile="ca.pem")


def test_is_a_broker_api_and_answers_like_the_broker(server: BrokerServer, client: RemoteBroker) -> None:
    local = server.broker
    assert isinstance(client, BrokerAPI) and client.url == server.url
    client.create_topic("a/t", 2)
    with pytest.raises(InvalidTopicError):
        client.create_topic("a/t", 3)
    assert client.topics() == local.topics() == {"a/t": 2}
    assert client.partitions_for("auto") == 1 and "auto" in local.topics()
    with pytest.raises(InvalidTopicError):
        client.partitions_for("nope", create=False)
    s = client.init_producer("named")
    records = [b"a", "b", None, Record(b"c", b"key", {"h": b"1", "g": "2"})]
    assert client.produce("a/t", 1, s.producer_id, s.producer_epoch, 0, records).base_offset == 0
    assert client.read("a/t", 1) == local.read("a/t", 1)
    assert [r.value for r in client.read("a/t", 1, 1, 2)] == [b"b", None]
    assert client.read("a/t", 1)[3].headers == (("h", b"1"), ("g", b"2"))
    assert client.end_offset("a/t", 1) == 4
    again = client.init_producer("named")
    assert (again.producer_id, again.producer_epoch) == (s.producer_id, s.producer_epoch + 1)
    assert again.last_sequences[("a/t", 1)] == 3 and again.last_sequences == local.init_producer("named").last_sequences
    fenced = client.produce("a/t", 1, s.producer_id, s.producer_epoch, 4, [b"zombie"])
    assert fenced.outcome is Outcome.FENCED and fenced.producer_epoch == s.producer_epoch + 2
    assert client.stats("a/t") == local.stats("a/t")
    client.set_policy(Policy.MONOTONIC, topic="a/t")
    assert local.policy_for("a/t") is Policy.MONOTONIC
    client.set_policy(None, topic="a/t")
    client.set_deduplication(False, namespace="a")
    assert not local.deduplication_enabled("a/t")
    client.set_deduplication(None, namespace="a")
    assert local.deduplication_enabled("a/t")


def test_server_errors_come_back_as_the_same_class_with_fields(client: RemoteBroker) -> None:
    with pytest.raises(ConfigError) as policy:
        client.set_policy("lenient")
    assert "lenient" in str(policy.value)
    with pytest.raises(InvalidTopicError):
        client.read("missing", 0)
    s = client.init_producer()
    gap = client.produce("t", 0, s.producer_id, s.producer_epoch, 9, [b"x"])
    assert gap.outcome is Outcome.OUT_OF_ORDER_SEQUENCE and gap.expected_sequence == 0
    with pytest.raises(InvalidBatchError):
        client.produce("t", 0, s.producer_id, s.producer_epoch, 0, [])
    with pytest.raises(InvalidBatchError):
        client.submit_produce("t", 0, s.producer_id, s.producer_epoch, 0, [12])  # type: ignore[list-item]


def test_not_owner_carries_the_owner_address() -> None:
    def owner_of(topic: str, partition: int) -> str | None:
        return "127.0.0.1:1" if partition == 1 else server.advertised_address

    server = BrokerServer(open_broker(), owner_of=owner_of).start()
    try:
        with RemoteBroker(server.url) as client:
            client.routed = True  # as a ClusterBroker's link sees it: the NotOwnerError itself
            client.create_topic("owned", 2)
            s = client.init_producer()
            assert client.produce("owned", 0, s.producer_id, s.producer_epoch, 0, [b"x"]).outcome is Outcome.ACCEPTED
            with pytest.raises(NotOwnerError) as info:
                client.produce("owned", 1, s.producer_id, s.producer_epoch, 0, [b"x"])
            error = info.value
            assert (error.topic, error.partition, error.owner) == ("owned", 1, "127.0.0.1:1")
            assert error.recovery is Recovery.RETRY
            assert attrs.astuple(pickle.loads(pickle.dumps(error))) == attrs.astuple(error)
            assert server.broker.end_offset("owned", 1) == 0
            assert client.metadata(["owned"]) == {"owned": [server.address, "127.0.0.1:1"]}
    finally:
        server.close()


def test_authenticator_and_authorizer_hooks() -> None:
    seen: list[tuple[object, str]] = []

    def authenticate(token: str | None) -> object:
        if token != "secret":
            raise AuthenticationError("bad token")
        return Principal("alice", frozenset({"writer"}))

    def authorize(principal: object, op: str, args: Mapping[str, Any]) -> None:
        seen.append((principal, op))
        if op == "create_topic":
            from idempotent.errors import AuthorizationError

            raise AuthorizationError(f"{getattr(principal, 'name', None)} may not {op}")

    server = BrokerServer(open_broker(), authenticator=authenticate, authorizer=authorize).start()
    try:
        for token in (None, "wrong"):
            with pytest.raises(AuthenticationError):
                RemoteBroker(server.url, token=token, connect_timeout=1)
        assert seen == [] and server.broker.producer_record(0) is None
        with RemoteBroker(server.url, token="secret") as client:
            assert client.server_info["principal"] == "alice"
            with pytest.raises(AuthorizationError):
                client.create_topic("x")
            assert client.topics() == {}
            assert seen == [(Principal("alice", frozenset({"writer"})), "create_topic"), (seen[0][0], "topics")]
    finally:
        server.close()


def test_unreachable_server_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(BrokerConnectionError) as info:
        RemoteBroker(f"idem://127.0.0.1:{port}", connect_timeout=0.3)
    assert info.value.retriable


def test_lost_connection_fails_in_flight_and_reconnects(server: BrokerServer) -> None:
    proxy = FaultyProxy(server.address).start()
    try:
        with RemoteBroker(f"idem://{proxy.address}", connect_timeout=5) as client:
            client.create_topic("t")
            proxy.faults.drop_response = 1.0  # the next answer is lost: the request stays in flight
            future = client.submit("topics", {})
            deadline = time.monotonic() + 5
            while proxy.faults.injected["drop_response"] == 0:
                assert time.monotonic() < deadline, "the answer never reached the proxy"
                threading.Event().wait(0.01)
            assert not future.done()
            proxy.faults.drop_response = 0.0
            proxy.cut_all()
            assert isinstance(future.exception(5), BrokerConnectionError)
            assert client.topics() == {"t": 1}  # a new connection
    finally:
        proxy.close()


def test_closed_client_refuses_requests(server: BrokerServer) -> None:
    client = RemoteBroker(server.url)
    client.close()
    client.close()
    with pytest.raises(ProducerClosedError):
        client.topics()


def test_producer_over_the_network(server: BrokerServer) -> None:
    url = server.url
    with Producer(url, "job", linger_ms=1) as producer:
        assert isinstance(producer.broker, RemoteBroker)
        futures = [producer.send("t", f"{i}".encode()) for i in range(500)]
        assert producer.flush(30) == 0
        assert [f.result().sequence for f in futures] == list(range(500))
    with Producer(url, "job") as resumed:
        assert resumed.producer_epoch == 1 and resumed.last_sequence("t", 0) == 499
        assert resumed.send("t", b"500").result().offset == 500


def _check_exactly_once(broker: Broker, topic: str, count: int, metadata: list[Any]) -> None:
    for p in (0, 1):
        log = broker.read(topic, p, 0, 10_000)
        expected = [f"m{i}".encode() for i in range(p, count, 2)]
        assert [r.value for r in log] == expected, "log must hold every message once, in send order"
        assert [r.sequence for r in log] == list(range(len(expected)))
    for i, meta in enumerate(metadata):
        if meta.offset is None:  # a resend answered DUPLICATE after its batch left the checker's window
            assert meta.duplicate
            continue
        assert broker.read(topic, meta.partition, meta.offset, 1)[0].value == f"m{i}".encode()
    assert sum(m.offset is not None for m in metadata) > len(metadata) // 2


@pytest.mark.parametrize("seed", [1, 2])
def test_exactly_once_through_the_server_under_injected_faults(seed: int) -> None:
    faults = LinkFaults(drop_request=0.15, drop_response=0.15, duplicate=0.15, seed=seed)
    harness = memory_harness()
    broker = FaultyBroker(memory_backend(harness.url), small_config(), faults)
    with BrokerServer(broker) as server:
        broker.create_topic("lossy", 2)
        with Producer(server.url, "lossy", linger_ms=1, max_batch_records=7, request_timeout_ms=2000) as producer:
            futures = [producer.send("lossy", f"m{i}".encode(), partition=i % 2) for i in range(400)]
            assert producer.flush(60) == 0
            metadata = [f.result() for f in futures]
        assert sum(faults.injected.values()) > 10
        _check_exactly_once(broker, "lossy", 400, metadata)


@pytest.mark.parametrize("seed", [1, 2])
def test_exactly_once_over_a_lossy_network(server: BrokerServer, seed: int) -> None:
    faults = ProxyFaults(drop_request=0.05, drop_response=0.05, duplicate_request=0.1, cut=0.02, seed=seed)
    proxy = FaultyProxy(server.address, faults).start()
    try:
        server.broker.create_topic("net", 2)
        with Producer(
            f"idem://{proxy.address}", linger_ms=1, max_batch_records=7, request_timeout_ms=500, timeout=0.5
        ) as producer:
            # faults are rolled per frame, and how many frames 400 records make depends on
            # timing: keep sending until every kind of fault has hit at least once
            futures: list[Any] = []
            kinds = ("cut", "drop_response", "duplicate_request")
            while len(futures) < 400 or not all(faults.injected[k] for k in kinds):
                assert len(futures) < 4000, f"faults not all injected: {faults.injected}"
                futures += [
                    producer.send("net", f"m{i}".encode(), partition=i % 2)
                    for i in range(len(futures), len(futures) + 100)
                ]
                assert producer.flush(60) == 0
            metadata = [f.result() for f in futures]
        _check_exactly_once(server.broker, "net", len(futures), metadata)
    finally:
        proxy.close()


def memory_backend(url: str) -> Any:
    from idempotent.adapters import open_backend

    return open_backend(url)


def test_server_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        ServerConfig(max_in_flight=0)


def test_reader_over_the_network(server: BrokerServer) -> None:
    from idempotent.consumer.reader import Reader

    with Producer(server.url) as producer:
        for i in range(20):
            producer.send("read-me", f"{i}".encode())
    with Reader(server.url, "read-me") as reader:
        assert [reader.read_next(5).value for _ in range(20)] == [f"{i}".encode() for i in range(20)]


# -- several brokers: ClusterBroker ---------------------------------------------------------------


def test_parse_bootstrap() -> None:
    from idempotent.net.client import parse_bootstrap

    assert parse_bootstrap("idem://h1:1,h2:2/") == ("idem", ["h1:1", "h2:2"])
    assert parse_bootstrap("idems://h1,[::1]:5") == ("idems", ["h1:7650", "[::1]:5"])
    for bad in ("kafka://h:1", "idem://", "idem://h:x"):
        with pytest.raises(ConfigError):
            parse_bootstrap(bad)


def test_cluster_client_routes_follows_and_fails_over() -> None:
    """Two servers over one in-memory store, each owning a partition: the client learns the
    owners from redirects, and after one broker dies the other takes its partition over."""
    import idempotent
    from idempotent.net.client import ClusterBroker
    from idempotent.net.server import BrokerServer
    from idempotent.testing.conformance import cluster_config

    from ..conftest import memory_harness

    harness = memory_harness()
    servers = {}
    for name in ("a", "b"):
        broker = harness.open(cluster_config(name, 1.0))
        server = BrokerServer(broker, "127.0.0.1", 0).start()
        broker.advertise(server.advertised_address)
        servers[name] = server
    a, b = servers["a"], servers["b"]
    client = idempotent.connect(f"idem://{a.address},{b.address}", attempt_timeout=1.0)
    assert isinstance(client, ClusterBroker)
    try:
        client.create_topic("routed", 2)
        with RemoteBroker(b.url) as direct:  # b claims partition 1 first
            session = direct.init_producer()
            assert direct.produce("routed", 1, session.producer_id, session.producer_epoch, 0, [b"b0"]).base_offset == 0
        pid, epoch = session.producer_id, session.producer_epoch
        assert client.produce("routed", 0, pid, epoch, 0, [b"a0"]).outcome is idempotent.Outcome.ACCEPTED
        assert client.owner("routed", 0) == a.advertised_address  # the first broker it asked claimed it
        assert client.produce("routed", 1, pid, epoch, 1, [b"b1"]).outcome is idempotent.Outcome.ACCEPTED
        assert client.owner("routed", 1) == b.advertised_address  # followed b's NotOwnerError
        assert client.metadata(["routed"]) == {"routed": [a.advertised_address, b.advertised_address]}
        a.broker.abandon()  # a crash: its lease has to expire
        a.close()
        result = client.produce("routed", 0, pid, epoch, 1, [b"a1"])
        assert (result.outcome, result.base_offset) == (idempotent.Outcome.ACCEPTED, 1)
        assert client.owner("routed", 0) == b.advertised_address
        assert [r.value for r in client.read("routed", 0)] == [b"a0", b"a1"]
        assert [(s.topic, s.partition) for s in client.stats("routed")] == [("routed", 0), ("routed", 1)]
    finally:
        client.close()
        b.close()


def test_one_address_of_several_brokers_fails_fast_naming_the_owner() -> None:
    """A client given one broker's address cannot follow owners: a produce for a partition
    another broker owns fails at once with ConfigError naming the owner, not after the
    producer's delivery timeout."""
    import idempotent
    from idempotent.net.server import BrokerServer
    from idempotent.testing.conformance import cluster_config

    from ..conftest import memory_harness

    harness = memory_harness()
    servers = []
    for name in ("a", "b"):
        broker = harness.open(cluster_config(name, 30.0))
        server = BrokerServer(broker, "127.0.0.1", 0).start()
        broker.advertise(server.advertised_address)
        servers.append(server)
    a, b = servers
    try:
        with RemoteBroker(a.url) as direct:
            direct.create_topic("split", 1)
            session = direct.init_producer()
            assert direct.produce("split", 0, session.producer_id, session.producer_epoch, 0, [b"x"]).base_offset == 0
        with idempotent.Producer(b.url, delivery_timeout_ms=60_000) as producer:
            future = producer.send("split", b"y", partition=0)
            with pytest.raises(idempotent.DeliveryFailed) as failed:
                future.result(10)
            cause = failed.value.__cause__
            assert isinstance(cause, ConfigError)
            assert a.advertised_address in str(cause) and "docs/clustering.md" in str(cause)
        with RemoteBroker(a.url) as direct:
            assert [r.value for r in direct.read("split", 0)] == [b"x"]
    finally:
        for server in servers:
            server.close()


def test_closing_the_cluster_client_fails_produce_requests_still_being_routed(server: BrokerServer) -> None:
    from idempotent.net.client import ClusterBroker

    client = ClusterBroker(server.url)
    client.create_topic("closing", 1)
    session = client.init_producer()
    future = client.submit_produce("closing", 0, session.producer_id, session.producer_epoch, 0, [b"x"])
    client.close()
    # stored before the close, or failed by it; never left unset (exception() raises TimeoutError)
    outcome = future.exception(5)
    assert outcome is None or isinstance(outcome, idempotent.ProducerError)
    with pytest.raises(ProducerClosedError):
        client.submit_produce("closing", 0, session.producer_id, session.producer_epoch, 1, [b"y"])


def test_client_works_with_descriptors_above_1024(server: BrokerServer) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    held = []
    try:
        while not held or held[-1][0] < 1100:
            held.append(os.pipe())
        with RemoteBroker(server.url) as client:
            client.create_topic("many-fds", 1)
            assert client.topics()["many-fds"] == 1
    finally:
        for r, w in held:
            os.close(r)
            os.close(w)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_link_the_cluster_client_dropped_fails_retriably_for_its_holders(server: BrokerServer) -> None:
    from idempotent.net.client import ClusterBroker

    with ClusterBroker(server.url) as client:
        client.create_topic("dropped", 1)
        link = client._link(server.address)
        client._failed(server.address)  # another thread saw this broker fail
        with pytest.raises(BrokerConnectionError) as info:
            link.read("dropped", 0)
        assert info.value.retriable


def _garbage_server(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A listener that answers every connection's first frame with ``answer``."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)
                time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.parametrize(
    "answer",
    [b"\x00\x00\x00\x03\xc1\xc1\xc1", b"\x00\x00\x00\x02\x91\x07", b"HTTP/1.1 400 Bad Request\r\n\r\n"],
    ids=["not msgpack", "not an answer", "not the protocol"],
)
def test_garbage_from_the_server_is_a_remote_protocol_error(answer: bytes) -> None:
    """The client's error for bytes the peer got wrong is RemoteProtocolError: a
    ProtocolError and a TransportError (the peer's fault), never a UsageError."""
    listener, thread = _garbage_server(answer)
    port = listener.getsockname()[1]
    with pytest.raises(errors.RemoteProtocolError) as raised:
        RemoteBroker(f"idem://127.0.0.1:{port}", connect_timeout=5, retries=0)
    assert isinstance(raised.value, errors.ProtocolError) and not isinstance(raised.value, errors.UsageError)
    assert raised.value.recovery is errors.Recovery.FATAL
    thread.join(5)


def test_a_request_the_server_refuses_as_malformed_is_a_local_protocol_error(client: RemoteBroker) -> None:
    with pytest.raises(errors.LocalProtocolError) as raised:
        client.call("drop_everything", {})
    assert isinstance(raised.value, errors.UsageError) and isinstance(raised.value, errors.ProtocolError)


# -- rounds of batches, and batches as columns ------------------------------------------------


def _count_writes(client: RemoteBroker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The produce requests of each write to the server, from now on."""
    link = client._current()
    counts: list[int] = []
    send = link._send

    def recording(data: bytes) -> None:
        if produces := data.count(b"\xa7produce"):  # the op "produce", packed
            counts.append(produces)
        send(data)

    monkeypatch.setattr(link, "_send", recording)
    return counts


def test_a_round_of_batches_goes_out_in_one_write(
    server: BrokerServer, client: RemoteBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.create_topic("round", 3)
    s = client.init_producer()
    writes = _count_writes(client, monkeypatch)
    requests = [
        idempotent.ProduceRequest.build("round", p, s.producer_id, s.producer_epoch, 0, [b"v%d" % p]) for p in range(3)
    ]
    answers = client.submit_requests(requests)
    assert [a.result(10).outcome for a in answers] == [Outcome.ACCEPTED] * 3 and writes == [3]
    writes.clear()
    with Producer(client, linger_ms=50) as producer:  # the producer's sender hands a round over at once
        for p in range(3):
            producer.send("round", b"w%d" % p, partition=p)
        assert producer.flush(10) == 0
    assert writes == [3]
    assert [[r.value for r in server.broker.read("round", p)] for p in range(3)] == [
        [b"v%d" % p, b"w%d" % p] for p in range(3)
    ]


def test_columns_cross_the_wire_without_a_record_per_record(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of RecordColumns goes from RemoteBroker through the server and the broker into
    SQLite as columns: nothing on the way makes a Record (or a list per record) of it."""
    from idempotent.core import codec as _codec
    from idempotent.core import protocol as _protocol
    from idempotent.core.records import RecordColumns

    broker = idempotent.connect(f"sqlite:///{tmp_path}/columns.db")
    assert isinstance(broker, Broker)
    with BrokerServer(broker) as server, RemoteBroker(server.url) as client:
        s = client.init_producer()
        values, keys = [b"v%d" % i for i in range(1000)], [None if i % 3 else b"k%d" % i for i in range(1000)]
        columns = RecordColumns(values, keys)

        def per_record(*args: object, **kwargs: object) -> object:
            raise AssertionError("a record was made of a batch of columns")

        with monkeypatch.context() as patched:
            patched.setattr(RecordColumns, "__iter__", per_record)
            patched.setattr(RecordColumns, "__getitem__", per_record)
            patched.setattr(_codec, "encode_records", per_record)
            patched.setattr(_protocol, "trusted_record", per_record)
            patched.setattr(_protocol, "value_record", per_record)
            request = idempotent.ProduceRequest.build("cols", 0, s.producer_id, s.producer_epoch, 0, columns)
            assert client.submit_request(request).result(10).outcome is Outcome.ACCEPTED
        stored = client.read("cols", 0, 0, 1000)
    assert [(r.value, r.key, r.sequence) for r in stored] == [
        (v, k, i) for i, (v, k) in enumerate(zip(values, keys, strict=True))
    ]


def test_cluster_client_sends_a_round_to_each_owner_in_one_write(
    server: BrokerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idempotent.net.client import ClusterBroker

    with ClusterBroker(server.url) as cluster:
        cluster.create_topic("c", 2)
        s = cluster.init_producer()
        for p in range(2):  # learn the owners
            assert cluster.produce("c", p, s.producer_id, s.producer_epoch, 0, [b"first"]).outcome is Outcome.ACCEPTED
        writes = _count_writes(cluster._link(server.address), monkeypatch)
        requests = [
            idempotent.ProduceRequest.build("c", p, s.producer_id, s.producer_epoch, 1 + i, [b"x"])
            for i in range(3)
            for p in range(2)
        ]
        answers = cluster.submit_requests(requests)
        assert [a.result(10).outcome for a in answers] == [Outcome.ACCEPTED] * 6 and writes == [6]
