"""The wire protocol without sockets: framing, request validation, error and value round trips."""

from __future__ import annotations

import re
import socket
import struct
import uuid
from pathlib import Path

import attrs
import msgpack
import pytest

import idempotent
import idempotent.errors as errors
from idempotent import _protocol as wire
from idempotent._outcomes import Outcome, ProduceResult
from idempotent._records import Record, StoredRecord
from idempotent._types import TopicPartition
from idempotent.broker import LastSequences, ProducerSession
from idempotent.server import BrokerServer

from .test_errors import all_errors


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
    assert isinstance(produce, wire.Request)
    assert produce.args["records"] == [Record(b"v"), Record(None), Record(b"w", b"k", (("h", b"x"),))]


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

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


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
            assert isinstance(request, wire.Request), request
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
