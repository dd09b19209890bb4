"""The broker server: serving, flow control, shutdown, and bad input from clients (with fuzzing)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import idempotent
from idempotent import Outcome, Producer
from idempotent.adapters import open_backend
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core.records import Record, StoredRecord
from idempotent.errors import (
    ConfigError,
    InvalidBatchError,
    InvalidTopicError,
    LocalProtocolError,
    ProducerClosedError,
    ProducerError,
    RequestTimeoutError,
)
from idempotent.net.client import RemoteBroker
from idempotent.net.server import BrokerServer, ServerConfig

from ..conftest import memory_harness
from ..timing import scaled


def open_broker(**config: Any) -> Broker:
    return memory_harness().open(BrokerConfig(maintenance_interval=0, **config))


@pytest.fixture
def server() -> Iterator[BrokerServer]:
    with BrokerServer(open_broker(), config=ServerConfig(handshake_timeout=5, frame_timeout=5)) as srv:
        yield srv


class Raw:
    """A hand-driven connection: frames in, frames out, nothing hidden."""

    def __init__(self, address: str, hello: bool = True) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buffer = b""
        if hello:
            self.request(1, "hello", {"version": 1})
            kind, cid, result = self.frame()
            assert (kind, cid) == (1, 1) and result["version"] == 1

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, cid: int, op: str, args: Any) -> None:
        self.send(frame(msgpack.packb([0, cid, op, args])))

    def frame(self) -> list[Any]:
        """The next frame; raises EOFError when the server closed the connection."""
        while len(self.buffer) < 4 or len(self.buffer) < 4 + struct.unpack(">I", self.buffer[:4])[0]:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buffer += data
        (length,) = struct.unpack(">I", self.buffer[:4])
        body, self.buffer = self.buffer[4 : 4 + length], self.buffer[4 + length :]
        value: list[Any] = msgpack.unpackb(body)
        return value

    def closed(self) -> bool:
        """True when the server closed the connection (after whatever frames were pending)."""
        try:
            while True:
                self.frame()
        except EOFError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def snapshot(broker: Broker) -> tuple[Any, ...]:
    """Everything a bad request could have changed."""
    topics = broker.topics()
    ends = {(t, p): broker.end_offset(t, p) for t, n in topics.items() for p in range(n)}
    producers = [broker.producer_record(pid) for pid in range(5)]
    return topics, ends, producers, [(s.topic, s.partition, s.position, s.producers) for s in broker.stats()]


def test_serves_the_broker_api_on_a_free_port(server: BrokerServer) -> None:
    assert server.port != 0 and server.url == f"idem://127.0.0.1:{server.port}"
    with RemoteBroker(server.url) as client:
        session = client.init_producer("one")
        result = client.produce("t", 0, session.producer_id, session.producer_epoch, 0, [b"a", Record(b"b", b"k")])
        assert result == idempotent.ProduceResult(Outcome.ACCEPTED, base_offset=0)
        assert [r.value for r in server.broker.read("t", 0)] == [b"a", b"b"]
        assert client.metadata() == {"t": [server.address]}
        assert client.server_info["broker"] == server.address and client.ping() > 0


def test_pipelined_batches_of_one_partition_keep_their_order(server: BrokerServer) -> None:
    with RemoteBroker(server.url) as client:
        client.create_topic("order", 2)
        s = client.init_producer()
        futures = [
            client.submit_produce("order", i % 2, s.producer_id, s.producer_epoch, (i // 2) * 3, [b"x", b"y", b"z"])
            for i in range(200)
        ]
        outcomes = [f.result(30).outcome for f in futures]
    assert outcomes == [Outcome.ACCEPTED] * 200
    assert server.broker.end_offset("order", 0) == server.broker.end_offset("order", 1) == 300


def test_many_producers_and_connections_at_once(server: BrokerServer) -> None:
    server.broker.create_topic("many", 3)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            with Producer(server.url, f"p{n}", linger_ms=1, max_batch_records=20) as producer:
                for i in range(300):
                    producer.send("many", f"{n}-{i}".encode(), partition=i % 3)
                assert producer.flush(60) == 0
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    values = [r.value for p in range(3) for r in server.broker.read("many", p, 0, 10_000)]
    assert sorted(values) == sorted(f"{n}-{i}".encode() for n in range(8) for i in range(300))
    for p in range(3):  # every producer's records of a partition are in its send order
        for n in range(8):
            mine = [r.value for r in server.broker.read("many", p, 0, 10_000) if r.value.startswith(f"{n}-".encode())]
            assert mine == [f"{n}-{i}".encode() for i in range(p, 300, 3)]


class GatedBroker(Broker):
    """A broker whose reads wait for a gate, counting how many run at once."""

    def __init__(self, inner: Broker) -> None:
        super().__init__(inner.backend, inner.config)
        self.gate = threading.Event()
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.gate.wait(30)
        with self.lock:
            self.running -= 1
        return super().read(topic, partition, offset, max_records)


def test_in_flight_limit_stops_reading_a_connection() -> None:
    broker = GatedBroker(open_broker())
    broker.create_topic("t")
    with BrokerServer(broker, config=ServerConfig(max_in_flight=2, workers=8)) as server:
        raw = Raw(server.address)
        for cid in range(10, 20):
            raw.request(cid, "read", {"topic": "t", "partition": 0})
        wait_until(lambda: broker.running == 2)
        time.sleep(0.2)  # room for a wrong third dispatch to show
        assert broker.most == 2  # eight more are waiting unread
        broker.gate.set()
        answers = sorted(raw.frame()[1] for _ in range(10))
        assert answers == list(range(10, 20)) and broker.most == 2
        raw.close()


def test_close_answers_what_is_in_flight_then_closes_the_broker() -> None:
    broker = GatedBroker(open_broker())
    broker.create_topic("t")
    server = BrokerServer(broker, config=ServerConfig(max_in_flight=16, workers=8)).start()
    raw = Raw(server.address)
    for cid in range(10, 15):
        raw.request(cid, "read", {"topic": "t", "partition": 0})
    wait_until(lambda: broker.running == 5)
    closer = threading.Thread(target=server.close)
    closer.start()
    wait_until(lambda: not accepts(server.port))  # no longer accepting
    broker.gate.set()
    answers = [raw.frame() for _ in range(5)]
    assert sorted(a[1] for a in answers) == list(range(10, 15)) and all(a[0] == 1 for a in answers)
    last = raw.frame()  # then a goodbye and the close
    assert last[0] == 2 and last[1] == 0 and last[2]["code"] == ProducerClosedError.code
    assert raw.closed()
    closer.join(10)
    with pytest.raises(ProducerClosedError):
        broker.init_producer()


# -- bad input ---------------------------------------------------------------------------------

TOPIC = "bad-input"
GOOD = {"topic": TOPIC, "partition": 0, "producer_id": 0, "producer_epoch": 0, "base_sequence": 3, "records": [b"v"]}

# (name, frame bytes, error code, connection closed)
BAD: list[tuple[str, bytes, int, bool]] = [
    ("garbage", frame(b"\xc1\xc1\xc1"), LocalProtocolError.code, True),
    ("truncated msgpack", frame(msgpack.packb([0, 7, "ping", {}])[:-2]), LocalProtocolError.code, True),
    ("not an array", frame(msgpack.packb({"op": "ping"})), LocalProtocolError.code, True),
    ("wrong kind", frame(msgpack.packb([1, 7, "ping", {}])), LocalProtocolError.code, True),
    ("correlation id 0", frame(msgpack.packb([0, 0, "ping", {}])), LocalProtocolError.code, True),
    ("correlation id too big", frame(msgpack.packb([0, 2**32, "ping", {}])), LocalProtocolError.code, True),
    ("unknown op", frame(msgpack.packb([0, 7, "drop_everything", {}])), LocalProtocolError.code, False),
    ("op not a string", frame(msgpack.packb([0, 7, 5, {}])), LocalProtocolError.code, False),
    ("args not a map", frame(msgpack.packb([0, 7, "produce", [1, 2]])), LocalProtocolError.code, False),
    ("missing argument", frame(msgpack.packb([0, 7, "produce", {"topic": TOPIC}])), LocalProtocolError.code, False),
    *[
        (f"bad {key}", frame(msgpack.packb([0, 7, "produce", {**GOOD, key: value}])), code, False)
        for key, value, code in [
            ("partition", -1, InvalidTopicError.code),
            ("partition", "0", InvalidTopicError.code),
            ("partition", 1, InvalidTopicError.code),  # the topic has one partition
            ("producer_id", 2**63, InvalidBatchError.code),
            ("producer_id", -5, InvalidBatchError.code),
            ("producer_epoch", 2**15, InvalidBatchError.code),
            ("base_sequence", 2**31, InvalidBatchError.code),
            ("base_sequence", 1.5, InvalidBatchError.code),
            ("records", [], InvalidBatchError.code),
            ("records", b"v", InvalidBatchError.code),
            ("records", [5], InvalidBatchError.code),
            ("records", [[b"v", b"k"]], InvalidBatchError.code),
            ("records", [[b"v", None, [["h", 5]]]], InvalidBatchError.code),
            ("topic", None, InvalidTopicError.code),
            ("topic", "x" * 5000, InvalidTopicError.code),
            ("topic", "bad name!", InvalidTopicError.code),
            ("keys", [b"k1", b"k2"], InvalidBatchError.code),  # two keys for one record
            ("keys", ["k"], InvalidBatchError.code),
            ("keys", b"k", InvalidBatchError.code),
            ("keys", [], InvalidBatchError.code),
            ("previous_sequence", -2, InvalidBatchError.code),
            ("base_sequence", 2**63 - 1, InvalidBatchError.code),  # fine alone, not with a second record
        ]
    ],
    ("keys with records that are not bare",
     frame(msgpack.packb([0, 7, "produce", {**GOOD, "records": [[b"v", None, []]], "keys": [b"k"]}])),
     InvalidBatchError.code, False),
    ("columns past the end of the sequences",
     frame(msgpack.packb([0, 7, "produce", {**GOOD, "base_sequence": 2**63 - 1, "records": [b"v", None],
                                             "keys": [None, b"k"]}])),
     InvalidBatchError.code, False),
    ("read max_records 0", frame(msgpack.packb([0, 7, "read", {"topic": TOPIC, "partition": 0, "max_records": 0}])),
     ConfigError.code, False),
    ("second hello", frame(msgpack.packb([0, 7, "hello", {"version": 1}])), LocalProtocolError.code, False),
    ("frame over the limit", struct.pack(">I", 2**31) + b"xx", LocalProtocolError.code, True),
]  # fmt: skip


@pytest.mark.parametrize(("name", "data", "code", "closes"), BAD, ids=[b[0] for b in BAD])
def test_bad_frames_get_an_error_and_change_nothing(
    server: BrokerServer, name: str, data: bytes, code: int, closes: bool
) -> None:
    with RemoteBroker(server.url) as good:
        good.create_topic(TOPIC)
        s = good.init_producer()
        good.produce(TOPIC, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b", b"c"])
        before = snapshot(server.broker)
        raw = Raw(server.address)
        raw.send(data)
        kind, cid, error = raw.frame()
        assert kind == 2 and error["code"] == code and error["message"]
        assert error["name"] == ProducerError.for_code(code).__name__
        assert cid == (0 if closes else 7)
        if closes:
            assert raw.closed()
        else:
            raw.request(8, "ping", {})
            assert raw.frame() == [1, 8, {}]
        raw.close()
        assert snapshot(server.broker) == before
        assert good.produce(TOPIC, 0, s.producer_id, s.producer_epoch, 3, [b"d"]).outcome is Outcome.ACCEPTED


def test_requests_before_hello_and_bad_versions_are_refused(server: BrokerServer) -> None:
    raw = Raw(server.address, hello=False)
    raw.request(3, "init_producer", {"producer_name": "sneaky"})
    assert raw.frame()[2]["code"] == LocalProtocolError.code and raw.closed()
    raw = Raw(server.address, hello=False)
    raw.request(1, "hello", {"version": 99})
    kind, cid, error = raw.frame()
    assert (kind, cid, error["code"]) == (2, 1, LocalProtocolError.code) and "version" in error["message"]
    assert raw.closed()
    assert server.broker.producer_record(0) is None


@pytest.mark.parametrize(
    ("op", "args", "words"),
    [
        ("read", {"topic": TOPIC, "partition": 0, "max_records": 0}, "first request must be 'hello'"),
        ("drop_everything", {}, "first request must be 'hello'"),
        ("hello", {"version": "one"}, "version"),
        ("hello", {}, "version"),
    ],
)
def test_a_malformed_first_request_closes_the_connection(
    server: BrokerServer, op: str, args: dict[str, Any], words: str
) -> None:
    raw = Raw(server.address, hello=False)
    raw.request(7, op, args)
    kind, cid, error = raw.frame()
    assert (kind, cid, error["code"]) == (2, 7, LocalProtocolError.code) and words in error["message"]
    assert raw.closed()


def test_a_read_fetches_one_bounded_chunk() -> None:
    broker = open_broker()
    with Producer(broker, "p") as producer:
        for i in range(50):
            producer.send("t", b"%d" % i)
    with BrokerServer(broker, config=ServerConfig(read_chunk=7)) as server, RemoteBroker(server.url) as client:
        assert [r.offset for r in client.read("t", 0, 0, 10_000)] == list(range(7))
        assert [r.offset for r in client.read("t", 0, 45, 10_000)] == list(range(45, 50))


def test_silent_slow_and_idle_connections_are_closed() -> None:
    config = ServerConfig(handshake_timeout=0.3, frame_timeout=0.3, idle_timeout=0.5)
    with BrokerServer(open_broker(), config=config) as server:
        silent = Raw(server.address, hello=False)  # half-open: connects, never speaks
        slow = Raw(server.address)
        slow.send(struct.pack(">I", 100) + b"\x94")  # starts a frame, never finishes it
        idle = Raw(server.address)
        with RemoteBroker(server.url) as good:
            for raw, words in ((silent, "hello"), (slow, "frame took"), (idle, "idle")):
                kind, cid, error = raw.frame()
                assert (kind, cid) == (2, 0) and words in error["message"]
                assert raw.closed()
            assert good.topics() == {}  # the others were served meanwhile


def test_connection_ending_mid_frame_or_half_closed(server: BrokerServer) -> None:
    raw = Raw(server.address)
    raw.request(5, "topics", {})
    raw.sock.shutdown(socket.SHUT_WR)  # half-close: the answer still comes
    assert raw.frame() == [1, 5, {"topics": {}}] and raw.closed()
    raw = Raw(server.address)
    raw.send(struct.pack(">I", 50) + b"\x94\x00")
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.frame()[2]["code"] == LocalProtocolError.code and raw.closed()


# -- fuzzing -----------------------------------------------------------------------------------

SEEDS = [
    [0, 5, "ping", {}],
    # columns (bare values, then with keys) of a producer the broker does not know: nothing stored
    [0, 11, "produce", {**GOOD, "producer_id": 4, "records": [b"v1", None, b"v3"]}],
    [0, 12, "produce", {**GOOD, "producer_id": 4, "records": [b"v1", None], "keys": [b"k1", None]}],
    [0, 13, "produce", {**GOOD, "topic": "ghost", "records": [b"v1", b"v2"], "keys": [None, b"k2"]}],
    [0, 6, "read", {"topic": TOPIC, "partition": 0, "offset": 0, "max_records": 5}],
    [0, 7, "stats", {"topic": TOPIC}],
    [0, 8, "produce", {**GOOD, "topic": "ghost"}],  # an unknown topic (no auto-creation): nothing stored
    [0, 9, "metadata", {"topics": [TOPIC], "create": False}],
    [0, 10, "end_offset", {"topic": TOPIC, "partition": 0}],
]


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    body = bytearray(msgpack.packb(draw(st.sampled_from(SEEDS))))
    for _ in range(draw(st.integers(0, 4))):
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(0, len(body) - 1)))
        if action == "flip" and body:
            body[at] = draw(st.integers(0, 255))
        elif action == "insert":
            body[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and body:
            del body[at]
        elif action == "truncate":
            del body[at:]
    length = len(body) if draw(st.integers(0, 9)) else draw(st.integers(0, 2**32 - 1))
    return struct.pack(">I", length) + bytes(body)


scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=9)
msgpack_values = st.recursive(
    scalars | st.binary(max_size=9),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


@st.composite
def structured_frames(draw: st.DrawFn) -> bytes:
    op = draw(st.sampled_from(["ping", "read", "produce", "stats", "metadata", "end_offset", "nope", "hello"]))
    args = draw(st.dictionaries(st.sampled_from([*list(GOOD), "offset", "max_records", "create"]), msgpack_values))
    return frame(msgpack.packb([draw(st.sampled_from([0, 0, 0, 1, 2])), draw(st.integers(0, 2**33)), op, args]))


column_items = st.none() | st.binary(max_size=6) | scalars | st.lists(st.binary(max_size=3) | scalars, max_size=3)


@st.composite
def column_frames(draw: st.DrawFn) -> bytes:
    """Produce requests in the columns form (``records`` of bare values, ``keys``), well-formed
    or nearly, for the broker's topic under a producer it does not know or for an unknown
    topic: whatever the server makes of them, nothing is stored."""
    n = draw(st.integers(1, 5))
    args: dict[str, Any] = {
        **GOOD,
        "topic": draw(st.sampled_from([TOPIC, "ghost", "persistent://public/default/" + TOPIC])),
        "producer_id": draw(st.integers(1, 4)),
        "partition": draw(st.integers(0, 1)),
        "base_sequence": draw(st.integers(0, 2**63 - 1)),
        "records": draw(st.lists(st.none() | st.binary(max_size=6), min_size=n, max_size=n) | st.lists(column_items)),
    }
    keys = draw(
        st.none() | st.lists(st.none() | st.binary(max_size=4), min_size=n, max_size=n) | st.lists(column_items)
    )
    if keys is not None or draw(st.booleans()):
        args["keys"] = keys
    if draw(st.booleans()):
        args["previous_sequence"] = draw(st.integers(-2, 2**63 - 1))
    return frame(msgpack.packb([0, draw(st.integers(1, 2**32 - 1)), "produce", args]))


@pytest.fixture(scope="module")
def fuzz_target() -> Iterator[tuple[BrokerServer, RemoteBroker, tuple[Any, ...]]]:
    broker = open_broker(auto_create_topics=False)
    broker.create_topic(TOPIC)
    s = broker.init_producer()
    broker.produce(TOPIC, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b", b"c"])
    config = ServerConfig(handshake_timeout=2, frame_timeout=2, max_frame=64 * 1024)
    with BrokerServer(broker, config=config) as server, RemoteBroker(server.url) as good:
        yield server, good, snapshot(broker)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    chunks=st.lists(
        mutated_frames() | structured_frames() | column_frames() | st.binary(max_size=64), min_size=1, max_size=4
    ),
    hello=st.booleans(),
)
def test_fuzzed_frames_never_hurt_the_server(
    fuzz_target: tuple[BrokerServer, RemoteBroker, tuple[Any, ...]], chunks: Sequence[bytes], hello: bool
) -> None:
    server, good, before = fuzz_target
    raw = Raw(server.address, hello=hello)
    raw.sock.settimeout(5)
    try:
        raw.send(b"".join(chunks))
        raw.sock.shutdown(socket.SHUT_WR)
    except OSError:  # the server may close early after a fatal frame
        pass
    frames = []
    try:
        while True:
            frames.append(raw.frame())
    except (EOFError, ConnectionResetError):
        pass
    raw.close()
    for kind, cid, body in frames:  # only well-formed answers
        assert kind in (1, 2) and isinstance(cid, int) and isinstance(body, dict)
        if kind == 2:
            assert {"code", "name", "message", "recovery", "fields"} <= set(body)
    assert good.ping() > 0
    assert snapshot(server.broker) == before


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(column_frames(), min_size=1, max_size=8))
def test_column_batches_are_answered_one_by_one_and_store_nothing(
    fuzz_target: tuple[BrokerServer, RemoteBroker, tuple[Any, ...]], frames: Sequence[bytes]
) -> None:
    """Every produce in the columns form gets exactly one answer (accepted by nobody here:
    unknown producer or topic, or refused as bad input), the connection stays usable, and
    nothing is stored."""
    server, good, before = fuzz_target
    raw = Raw(server.address)
    raw.sock.settimeout(10)
    raw.send(b"".join(frames))
    sent = [msgpack.unpackb(f[4:])[1] for f in frames]
    answers = [raw.frame() for _ in frames]
    assert sorted(cid for _, cid, _ in answers) == sorted(sent)
    for kind, _, body in answers:
        if kind == 1:
            assert body["outcome"] == "unknown_producer"
        else:
            assert kind == 2 and body["code"] in (InvalidBatchError.code, InvalidTopicError.code)
    raw.request(1, "ping", {})
    assert raw.frame() == [1, 1, {}]
    raw.close()
    assert good.ping() > 0
    assert snapshot(server.broker) == before


def test_the_server_hands_the_broker_the_request_it_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A produce frame is validated once, where it is parsed: the broker gets that
    ProduceRequest through submit_request, and nothing rebuilds or re-checks it on the way."""
    from idempotent.core import protocol as wire
    from idempotent.core.records import RecordColumns
    from idempotent.core.request import ProduceRequest

    broker = open_broker()
    handed: list[ProduceRequest] = []
    submit_request = broker.submit_request

    def recording(request: ProduceRequest) -> Future[idempotent.ProduceResult]:
        handed.append(request)
        return submit_request(request)

    monkeypatch.setattr(broker, "submit_request", recording)
    with BrokerServer(broker) as server, RemoteBroker(server.url) as client:
        s = client.init_producer()
        parsed: list[Any] = []
        parse = wire.parse_request

        def counting(body: bytes) -> Any:
            parsed.append(result := parse(body))
            return result

        monkeypatch.setattr(wire, "parse_request", counting)

        def no_second_validation(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a parsed batch was validated again")

        monkeypatch.setattr(ProduceRequest, "build", no_second_validation)
        request = ProduceRequest(
            "persistent://public/default/once",
            0,
            idempotent.core.checker.make_header(s.producer_id, s.producer_epoch, 0, 2),
            RecordColumns([b"v1", b"v2"], [b"k1", None]),
            0,
            0,
        )  # fmt: skip  (the client encodes what it is given: the server measures and names it)
        assert client.submit_request(request).result(10).outcome is Outcome.ACCEPTED
        stored = [(r.value, r.key) for r in broker.read("once", 0)]
    assert stored == [(b"v1", b"k1"), (b"v2", None)]
    produces = [p for p in parsed if isinstance(p, wire.Produce)]
    assert len(produces) == 1 and handed == [produces[0].request]
    assert handed[0].topic == "once" and (handed[0].size, handed[0].largest) == ((16 + 2 + 2) + (16 + 2), 16 + 2 + 2)


def test_frame_limit_on_both_sides() -> None:
    config = ServerConfig(max_frame=64 * 1024)
    with BrokerServer(open_broker(), config=config) as server, RemoteBroker(server.url) as client:
        s = client.init_producer()
        with pytest.raises(InvalidBatchError):  # refused before sending: it would not fit a frame
            client.produce("big", 0, s.producer_id, s.producer_epoch, 0, [b"x" * 70_000])
        for i in range(10):
            client.produce("big", 0, s.producer_id, s.producer_epoch, i, [bytes([i]) * 10_000])
        first = client.read("big", 0, 0, 10)  # trimmed to stay well inside the frame limit
        assert 1 <= len(first) < 10 and [r.offset for r in first] == list(range(len(first)))
        rest = client.read("big", 0, len(first), 10)
        assert rest[0].value == bytes([len(first)]) * 10_000


def test_a_client_request_that_never_gets_answered_times_out() -> None:
    broker = GatedBroker(open_broker())
    broker.create_topic("t")
    with BrokerServer(broker) as server, RemoteBroker(server.url, timeout=0.3, retries=0) as client:
        with pytest.raises(RequestTimeoutError):
            client.read("t", 0)
        future: Future[Any] = client.submit("read", {"topic": "t", "partition": 0})
        broker.gate.set()
        assert future.result(5) == {"records": []}


def test_listen_errors_are_config_errors() -> None:
    with BrokerServer(open_broker()) as first:
        second = BrokerServer(open_broker(), "127.0.0.1", first.port)
        with pytest.raises(idempotent.ConfigError):
            second.start()
        second.broker.close()


# -- over the real backends ----------------------------------------------------------------------


def _exactly_once_through_a_server(url: str, options: dict[str, Any]) -> None:
    broker = idempotent.connect(url, BrokerConfig(maintenance_interval=0), **options)
    topic = f"served-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 2)
    with BrokerServer(broker) as server:
        with Producer(server.url, f"served-{topic}", linger_ms=2, max_batch_records=50) as producer:
            futures = [producer.send(topic, f"m{i}".encode(), partition=i % 2) for i in range(600)]
            assert producer.flush(120) == 0
            offsets = [f.result().offset for f in futures]
        with RemoteBroker(server.url) as client:
            for p in (0, 1):
                values = [r.value for r in client.read(topic, p, 0, 10_000)]
                assert values == [f"m{i}".encode() for i in range(p, 600, 2)]
            assert client.read(topic, 1, offsets[599], 1)[0].value == b"m599"


@pytest.mark.kafka
def test_server_over_kafka(kafka_service: Any) -> None:
    _exactly_once_through_a_server(kafka_service.url, {})


@pytest.mark.pulsar
def test_server_over_pulsar(pulsar_service: Any) -> None:
    _exactly_once_through_a_server(pulsar_service.url, {"admin_url": pulsar_service.admin_url})


# -- clients that never read their answers --------------------------------------------------


def _attacker(address: str, requests: bytes, stop_at: float) -> None:
    """hello, then ``requests`` sent without ever reading an answer; closes the connection at
    ``stop_at`` (time.monotonic())."""
    raw = Raw(address)
    raw.sock.settimeout(max(0.01, stop_at - time.monotonic()))
    with contextlib.suppress(OSError):  # the server stops reading: the rest never leaves
        raw.sock.sendall(requests)
    time.sleep(max(0.0, stop_at - time.monotonic()))
    raw.close()


def _served_within(url: str, name: str, bound: float) -> float:
    """Seconds a new producer needs to connect, initialise and store 20 records; fails past ``bound``."""
    took: list[float] = []
    failed: list[BaseException] = []

    def run() -> None:
        started = time.monotonic()
        try:
            timeout = int(bound * 1000)
            with Producer(url, name, request_timeout_ms=timeout, delivery_timeout_ms=timeout) as p:
                for i in range(20):
                    p.send("good", b"%d" % i)
                p.flush()
        except BaseException as exc:
            failed.append(exc)
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    assert took and not failed, f"a well-behaved producer ({name}) waited more than {bound} s: {failed}"
    return took[0]


@pytest.mark.parametrize(("connections", "requests"), [(20, 200), (50, 2000)], ids=["20x200", "50x2000"])
def test_clients_that_never_read_do_not_freeze_the_server(tmp_path: Any, connections: int, requests: int) -> None:
    broker = Broker(open_backend(f"sqlite:///{tmp_path / 'log.db'}"), BrokerConfig(maintenance_interval=0))
    with Producer(broker, "filler", linger_ms=20) as filler:
        for i in range(20_000):
            filler.send("big", b"%090d" % i)
    with BrokerServer(broker) as server:
        reads = b"".join(
            frame(msgpack.packb([0, 10 + i, "read", {"topic": "big", "partition": 0, "max_records": 10_000}]))
            for i in range(requests)
        )
        stop_at = time.monotonic() + 3.0
        attackers = [
            threading.Thread(target=_attacker, args=(server.address, reads, stop_at), daemon=True)
            for _ in range(connections)
        ]
        for thread in attackers:
            thread.start()
        time.sleep(1.0)  # the attack is under way: the server has more reads queued than it can answer
        started = time.monotonic()
        with RemoteBroker(server.url) as probe:  # a handshake and a ping never wait behind reads
            probe.ping()
        waited = time.monotonic() - started
        bound = scaled(4.0)  # a frozen server takes minutes: every queued read answered first
        assert waited < bound, f"a handshake and a ping took {waited:.2f} s (bound {bound:.1f} s)"
        _served_within(server.url, "during", 6.0)
        for thread in attackers:
            thread.join(10)
        _served_within(server.url, "after", 4.0)  # once they are gone, their queued work is too
        assert [r.value for r in broker.read("good", 0, 0, 100)] == [b"%d" % i for i in range(20)] * 2
