"""The wire protocol without sockets: framing, request validation, error and value round trips."""

from __future__ import annotations

import re
import socket
import struct
import uuid
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import idempotent
import idempotent.errors as errors
from idempotent.broker.broker import LastSequences, ProducerSession
from idempotent.core import protocol as wire
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.records import Record, StoredRecord
from idempotent.core.types import TopicPartition
from idempotent.net.server import BrokerServer

from ..test_errors import all_errors


def test_decoder_splits_and_joins_frames_at_any_boundary() -> None:
    frames = [wire.pack([0, i, "ping", {}]) for i in range(1, 6)] + [wire.frame(b"")]
    stream = b"".join(frames)
    for step in (1, 3, 7, len(stream)):
        decoder = wire.FrameDecoder()
        out: list[object] = []
        for i in range(0, len(stream), step):
            out += decoder.feed(stream[i : i + step])
        assert out == [f[4:] for f in frames] and decoder.buffered == 0


def test_decoder_refuses_oversized_frames_and_stops() -> None:
    decoder = wire.FrameDecoder(max_frame=10)
    assert decoder.feed(wire.frame(b"x" * 10)) == [b"x" * 10]
    assert decoder.feed(struct.pack(">I", 11) + b"y" * 11) == [wire.FrameTooLarge(11, 10)]
    assert decoder.feed(wire.frame(b"z")) == []


def test_parse_request_fills_defaults_and_ignores_unknown_keys() -> None:
    body = msgpack.packb([0, 9, "read", {"topic": "t", "partition": 2, "future_option": 1}])
    expected = {"topic": "t", "partition": 2, "offset": 0, "max_records": 500}
    assert wire.parse_request(body) == wire.Request(9, "read", expected)
    produce = wire.parse_request(
        msgpack.packb(
            [0, 1, "produce", {"topic": "t", "partition": 0, "producer_id": 1, "producer_epoch": 0, "base_sequence": 0,
                               "records": [b"v", None, [b"w", b"k", [["h", b"x"]]]]}]
        )
    )  # fmt: skip
    assert isinstance(produce, wire.Produce) and produce.op == "produce"
    assert produce.request.records == [Record(b"v"), Record(None), Record(b"w", b"k", (("h", b"x"),))]


@pytest.mark.parametrize(
    ("body", "fatal", "cls"),
    [
        (b"\xc1", True, errors.LocalProtocolError),
        (msgpack.packb([0, 1, "ping"]), True, errors.LocalProtocolError),
        (msgpack.packb([0, 1, "nope", {}]), False, errors.LocalProtocolError),
        (msgpack.packb([0, 1, "hello", {"version": "1"}]), False, errors.LocalProtocolError),
        (msgpack.packb([0, 1, "read", {"topic": "t", "partition": 10**6}]), False, errors.InvalidTopicError),
        (msgpack.packb([0, 1, "init_producer", {"timeout": -1}]), False, errors.LocalProtocolError),
    ],
)
def test_parse_request_refusals(body: bytes, fatal: bool, cls: type[errors.ProducerError]) -> None:
    bad = wire.parse_request(body)
    assert isinstance(bad, wire.BadRequest) and bad.fatal is fatal and type(bad.error) is cls


@pytest.mark.parametrize("cls", all_errors(), ids=lambda c: c.__name__)
def test_every_error_crosses_the_wire_as_itself(cls: type[errors.ProducerError]) -> None:
    fields = {f.name: getattr(cls("x"), f.name) for f in attrs.fields(cls) if f.name != "message"}
    for name, value in fields.items():  # non-default values, so a dropped field shows
        if type(value) is int:
            fields[name] = value + 7
        elif type(value) is str:
            fields[name] = value + "host:1"
    error = cls("went wrong", **fields)
    wire_form = msgpack.unpackb(msgpack.packb(wire.error_to_wire(error)))
    assert wire_form["name"] == cls.__name__ and wire_form["recovery"] == error.recovery.value
    clone = wire.error_from_wire(wire_form)
    assert type(clone) is cls and attrs.astuple(clone) == attrs.astuple(error)


def test_malformed_error_maps_and_unknown_codes() -> None:
    assert type(wire.error_from_wire("nope")) is errors.RemoteProtocolError
    unknown = wire.error_from_wire({"code": 999, "message": "new", "fields": {"x": 1}})
    assert type(unknown) is errors.ProducerError and unknown.message == "new"
    typed = wire.error_from_wire({"code": errors.NotOwnerError.code, "message": "m", "fields": {"partition": "x"}})
    assert isinstance(typed, errors.NotOwnerError) and typed.partition == -1


def test_value_round_trips() -> None:
    result = ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, None, 4, None)
    assert wire.decode_result(msgpack.unpackb(msgpack.packb(wire.encode_result(result)))) == result
    session = ProducerSession(3, 1, "n", LastSequences({TopicPartition("t", 2): 9}), True)
    assert wire.decode_session(msgpack.unpackb(msgpack.packb(wire.encode_session(session)))) == session
    stored = StoredRecord(5, 3, 1, 9, b"k", None, (("h", b"v"),), 1.5)
    assert wire.decode_stored(msgpack.unpackb(msgpack.packb(wire.encode_stored(stored)))) == stored
    assert wire.encode_records([b"a", "b", None, Record(b"c"), Record(b"d", b"k")]) == [
        b"a", b"b", None, b"c", [b"d", b"k", []]
    ]  # fmt: skip
    with pytest.raises(TypeError):
        wire.encode_records([1])  # type: ignore[list-item]


# -- the worked example of docs/protocol.md, byte for byte ---------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def documented_frames() -> list[tuple[str, bytes]]:
    """Every ```hex-client / ```hex-server block of the document, in order."""
    blocks = re.findall(r"^```hex-(client|server)\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)
    return [(side, bytes.fromhex(text)) for side, text in blocks]


def test_documented_frames_are_well_formed() -> None:
    frames = documented_frames()
    assert [side for side, _ in frames] == ["client", "server"] * 12
    for side, data in frames:
        (length,) = struct.unpack(">I", data[:4])
        assert length == len(data) - 4
        decoder = wire.FrameDecoder()
        [body] = decoder.feed(data)
        assert isinstance(body, bytes)
        if side == "client":
            request = wire.parse_request(body)
            assert isinstance(request, wire.Request | wire.Produce), request
            assert wire.encode_request(request.correlation_id, request.op, msgpack.unpackb(body)[3]) == data
        else:
            assert msgpack.unpackb(body)[0] in (wire.RESPONSE, wire.ERROR)


def test_documented_session_replays_byte_for_byte() -> None:
    broker = idempotent.connect(f"memory://{uuid.uuid4().hex}")
    with BrokerServer(broker, advertised_address="127.0.0.1:7650") as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        decoder = wire.FrameDecoder()
        received: list[bytes | wire.FrameTooLarge] = []
        with sock:
            for side, data in documented_frames():
                if side == "client":
                    sock.sendall(data)
                    continue
                while not received:
                    received += decoder.feed(sock.recv(65536))
                got = received.pop(0)
                assert isinstance(got, bytes)
                assert wire.frame(got).hex(" ") == data.hex(" ")


def _produce_args(**extra: object) -> dict[str, object]:
    return {"topic": "t", "partition": 0, "producer_id": 1, "producer_epoch": 0, "base_sequence": 0, **extra}


def test_keys_extension_gives_the_bare_records_their_keys() -> None:
    from idempotent.core.records import RecordColumns

    request = wire.parse_produce(_produce_args(records=[b"v1", b"v2", None], keys=[b"k1", None, b"k3"]))
    assert type(request.records) is RecordColumns
    assert list(request.records) == [Record(b"v1", b"k1"), Record(b"v2"), Record(None, b"k3")]
    plain = wire.parse_produce(_produce_args(records=[b"v1", b"v2"]))
    assert type(plain.records) is RecordColumns and plain.records.keys is None
    assert list(plain.records) == [Record(b"v1"), Record(b"v2")]


@pytest.mark.parametrize(
    ("records", "keys", "message"),
    [
        ([b"v", [b"w", b"k", []]], [b"a", b"b"], "must be bare values"),
        ([b"v", b"w"], [b"a"], "1 keys for 2 records"),
        ([b"v"], ["a"], "keys that are bin or nil"),
        ([b"v"], [], "an array of 1.."),
    ],
)
def test_keys_extension_refuses_what_does_not_fit(records: list[object], keys: list[object], message: str) -> None:
    with pytest.raises(errors.InvalidBatchError, match=message):
        wire.parse_produce(_produce_args(records=records, keys=keys))


def test_keys_fold_into_records_for_a_server_without_the_extension() -> None:
    folded = wire.without_keys(_produce_args(records=[b"v1", b"v2"], keys=[b"k1", None]))
    assert "keys" not in folded and folded["records"] == [[b"v1", b"k1", []], b"v2"]
    assert list(wire.parse_produce(folded).records) == [Record(b"v1", b"k1"), Record(b"v2")]


@pytest.mark.parametrize("server_lists_keys", [True, False])
def test_record_columns_cross_the_wire_with_their_keys(
    server_lists_keys: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """send_many of RecordColumns over idem:// stores the keys, with the extension and, folded
    into records, with a server that does not list it (which would drop an unknown argument)."""
    from idempotent import Producer
    from idempotent.core.records import RecordColumns

    if not server_lists_keys:  # a server from before the extension: it ignores ``keys``
        monkeypatch.setattr(wire, "EXTENSIONS", ())
        schema = {name: check for name, check in wire.SCHEMAS["produce"].items() if name != "keys"}
        monkeypatch.setitem(wire.SCHEMAS, "produce", schema)
    broker = idempotent.connect(f"memory://{uuid.uuid4().hex}")
    with BrokerServer(broker) as server:
        url = f"idem://127.0.0.1:{server.port}"
        with Producer(url, producer_name="columns") as producer:
            columns = RecordColumns([b"v%d" % i for i in range(5)], [b"k0", None, b"k2", b"k3", None])
            deliveries = producer.send_many("t", columns, partition=0).result(30)
            assert len(deliveries) == 5 and deliveries.duplicates == 0
        stored = broker.read("t", 0, 0, 10)
    assert [(r.value, r.key, r.sequence) for r in stored] == [
        (b"v0", b"k0", 0),
        (b"v1", None, 1),
        (b"v2", b"k2", 2),
        (b"v3", b"k3", 3),
        (b"v4", None, 4),
    ]


# -- produce: one parse at the edge ---------------------------------------------------------------


def test_a_produce_frame_is_parsed_once_into_the_request_the_broker_takes() -> None:
    from idempotent.core.records import RecordColumns

    args = _produce_args(topic="persistent://public/default/orders", partition=3, producer_id=7, producer_epoch=2)
    body = msgpack.packb([0, 5, "produce", {**args, "base_sequence": 10, "records": [b"ab", None], "keys": [b"k", None],
                                           "previous_sequence": 9}])  # fmt: skip
    parsed = wire.parse_request(body)
    assert isinstance(parsed, wire.Produce) and parsed.correlation_id == 5
    request = parsed.request
    assert (request.topic, request.partition) == ("orders", 3)  # the stored name
    header = request.header
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 10)
    assert (header.record_count, header.previous_sequence) == (2, 9)
    assert type(request.records) is RecordColumns  # bare values: columns, no Record per record
    assert request.records.values == [b"ab", None] and request.records.keys == [b"k", None]
    assert (request.size, request.largest) == (Record(b"ab", b"k").size + Record(None).size, Record(b"ab", b"k").size)
    assert request == idempotent.ProduceRequest.build(
        "orders", 3, 7, 2, 10, [Record(b"ab", b"k"), Record(None)], 9
    )  # what the loose-argument path builds, field for field


def _old_path(args: Any) -> idempotent.ProduceRequest:
    """What the server did before produce was parsed once: the schema, then the broker's
    ``ProduceRequest.build`` over the loose arguments (the errors to keep)."""
    a = wire.validate_args("produce", args)
    return idempotent.ProduceRequest.build(
        a["topic"], a["partition"], a["producer_id"], a["producer_epoch"], a["base_sequence"], a["records"],
        a["previous_sequence"],
    )  # fmt: skip


_any_value = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=6)
_record = st.none() | st.binary(max_size=6) | _any_value | st.lists(
    st.none() | st.binary(max_size=4) | st.lists(st.lists(st.text(max_size=3) | st.binary(max_size=3), max_size=3),
                                                  max_size=2) | _any_value,
    max_size=4,
)  # fmt: skip


@st.composite
def produce_args(draw: st.DrawFn) -> Any:
    """Produce arguments near valid ones: each field valid, missing or replaced by anything."""
    n = draw(st.integers(1, 4))
    fields: dict[str, Any] = {
        "topic": st.sampled_from(["t", "persistent://public/default/t", "a/b/t", "bad name!", "x" * 300, "non-persistent://a/b/c"]),
        "partition": st.integers(-1, 10_001),
        "producer_id": st.integers(-1, 2**63),
        "producer_epoch": st.integers(-1, 2**15),
        "base_sequence": st.integers(-1, 2**63) | st.just(2**63 - 1),
        "records": st.lists(st.none() | st.binary(max_size=6), min_size=n, max_size=n) | st.lists(_record, max_size=4),
        "previous_sequence": st.none() | st.integers(-2, 2**63),
        "keys": st.none() | st.lists(st.none() | st.binary(max_size=4), min_size=n, max_size=n)
        | st.lists(_record, max_size=4),
    }  # fmt: skip
    args = {}
    for name, strategy in fields.items():
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # missing
        args[name] = draw(_any_value) if choice == 1 else draw(strategy)
    return args if draw(st.integers(0, 20)) else draw(_any_value)


@settings(max_examples=400, deadline=None)
@given(args=produce_args())
def test_produce_parsing_refuses_what_the_old_path_refused_with_the_same_error(args: Any) -> None:
    try:
        expected: idempotent.ProduceRequest | errors.ProducerError = _old_path(args)
    except errors.ProducerError as exc:
        expected = exc
    try:
        got: idempotent.ProduceRequest | errors.ProducerError = wire.parse_produce(args)
    except errors.ProducerError as exc:
        got = exc
    if isinstance(expected, errors.ProducerError):
        assert type(got) is type(expected) and isinstance(got, errors.ProducerError)
        assert got.message == expected.message
    else:
        assert got == expected
    parsed = wire.parse_request(msgpack.packb([0, 1, "produce", args]))  # and as a frame: never raises
    if isinstance(got, errors.ProducerError):
        assert isinstance(parsed, wire.BadRequest) and type(parsed.error) is type(got) and not parsed.fatal
    else:
        assert isinstance(parsed, wire.Produce) and parsed.request == got


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=80) | st.builds(lambda a: msgpack.packb([0, 3, "produce", a]), produce_args()))
def test_parse_request_never_raises(body: bytes) -> None:
    assert isinstance(wire.parse_request(body), wire.Request | wire.Produce | wire.BadRequest)


def test_produce_answers_are_encoded_as_encode_response_would() -> None:
    for outcome in Outcome:
        for value in (None, 0, 1, 127, 128, 255, 256, 2**16, 2**32 - 1, 2**32, 2**63 - 1, -1, -33, -129, -(2**31) - 1):
            epoch = value if value is None or 0 <= value <= 32767 else 1
            result = ProduceResult(outcome, value, value, epoch)
            for cid in (1, 127, 128, 65536, 2**32 - 1):
                assert wire.encode_produced(cid, result) == wire.encode_response(cid, wire.encode_result(result))


def test_decoder_keeps_nothing_of_a_view_it_was_fed() -> None:
    """The server reads every connection into one buffer and feeds the decoder a view of
    it: what the decoder returns or holds back must survive the buffer being overwritten."""
    one = wire.pack([0, 1, "ping", {}])
    stream = one + wire.pack([0, 2, "topics", {}])
    shared = bytearray(64)
    decoder = wire.FrameDecoder()
    cut = len(stream) - 3  # the second frame arrives in two reads
    shared[:cut] = stream[:cut]
    first = decoder.feed(memoryview(shared)[:cut])
    shared[:] = b"\xff" * len(shared)  # the next read overwrites the buffer
    shared[:3] = stream[cut:]
    second = decoder.feed(memoryview(shared)[:3])
    assert first == [one[4:]] and decoder.buffered == 0
    assert [msgpack.unpackb(b) for b in first + second] == [[0, 1, "ping", {}], [0, 2, "topics", {}]]
