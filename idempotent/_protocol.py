"""The wire protocol of the broker server, without I/O (see ``docs/protocol.md``).

A connection carries *frames*: a 4-byte big-endian unsigned length ``N`` followed by ``N``
bytes of one MessagePack value. Every frame is a MessagePack array whose first element says
what it is::

    request   [0, correlation_id, op, args]      client -> server
    response  [1, correlation_id, result]        server -> client
    error     [2, correlation_id, error]         server -> client

``correlation_id`` is an unsigned 32-bit integer chosen by the client (1 and up; the server
answers with the same id, in any order); 0 in an error frame means the connection as a
whole. ``args`` and ``result`` are maps with string keys; ``error`` is the map
``{"code", "name", "message", "recovery", "fields"}`` of an :mod:`idempotent.errors` class.

Everything here is pure: :class:`FrameDecoder` turns bytes into frame bodies,
:func:`parse_request` turns a body into a validated :class:`Request`, a :class:`Produce`
(a ``produce`` request parsed once into the :class:`~idempotent._request.ProduceRequest`
the broker takes: the network edge is the only place a batch off the wire is checked) or a
:class:`BadRequest`, and the ``encode_*``/``decode_*`` functions convert the broker's value
types to and from plain MessagePack values. A batch whose records have no headers travels
as columns both ways (:class:`~idempotent._records.RecordColumns`: a ``records`` array of
bare values and, with the ``keys`` extension, a ``keys`` array), with no object per record.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import attrs
import msgpack

from ._checker import make_header, validate_header
from ._outcomes import Outcome, ProduceResult
from ._records import _ONLY_BYTES, BatchHeader, Record, RecordColumns, StoredRecord, trusted_record, value_record
from ._request import ProduceRequest, measure
from ._topics import canonical_topic
from ._types import MAX_APPLICATION_SEQUENCE, MAX_BATCH_RECORDS, MAX_EPOCH, MAX_PRODUCER_ID, TopicPartition
from ._values import MAX_PARTITIONS, LastSequences, PartitionStats, ProducerSession, ProducerStats
from .errors import (
    AuthenticationError,
    ConfigError,
    InvalidBatchError,
    InvalidRecordError,
    InvalidTopicError,
    LocalProtocolError,
    ProducerError,
    RemoteProtocolError,
)

#: The protocol version this module speaks (the ``version`` of ``hello``).
PROTOCOL_VERSION: Final = 1
#: Every version this module can serve.
SUPPORTED_VERSIONS: Final = frozenset({1})
#: Default largest frame body (bytes) either side accepts; the server announces its own.
DEFAULT_MAX_FRAME: Final = 16 * 1024 * 1024
#: Frame kinds (first element of every frame).
REQUEST: Final = 0
RESPONSE: Final = 1
ERROR: Final = 2
#: Highest correlation id (unsigned 32-bit).
MAX_CORRELATION_ID: Final = 2**32 - 1
#: Largest ``max_records`` of one ``read``.
MAX_READ_RECORDS: Final = 10_000
#: Longest string argument (topic names are limited further by the broker).
MAX_STRING: Final = 4096
#: Longest ``token`` of ``hello``, in characters: a credential, with a limit of its own
#: (identity providers' tokens carrying many groups run to several KiB). ``auth`` takes it.
MAX_TOKEN_LENGTH: Final = 16 * 1024
#: Longest ``timeout`` argument in seconds.
MAX_TIMEOUT: Final = 3600.0

_LENGTH = struct.Struct(">I")


# -- framing -------------------------------------------------------------------------------


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length."""
    return _LENGTH.pack(len(body)) + body


def pack(value: Any) -> bytes:
    """One MessagePack value as a complete frame."""
    return frame(msgpack.packb(value, use_bin_type=True))


class FrameTooLarge(NamedTuple):
    """The peer announced a frame over the limit; the stream cannot be trusted any more."""

    length: int
    limit: int


class FrameDecoder:
    """Splits a byte stream into frame bodies. Feed it whatever arrives; it keeps partial frames.

    After a :class:`FrameTooLarge` event it yields nothing more (the connection must close).
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._broken = False

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes | FrameTooLarge]:
        """Add received bytes; return the frames completed by them, in order. ``data`` is
        not kept (a reader may pass a view of a buffer it reuses)."""
        if self._broken:
            return []
        if not self._buffer:  # nothing held back: split ``data`` itself, keep only its tail
            return self._split(data)
        buffer = self._buffer
        buffer += data
        out: list[bytes | FrameTooLarge] = []
        start = 0
        end = len(buffer)
        with memoryview(buffer) as view:  # one copy per frame (a bytearray slice would add one)
            while end - start >= 4:
                (length,) = _LENGTH.unpack_from(buffer, start)
                if length > self.max_frame:
                    self._broken = True
                    out.append(FrameTooLarge(length, self.max_frame))
                    break
                if end - start - 4 < length:
                    break
                out.append(bytes(view[start + 4 : start + 4 + length]))
                start += 4 + length
        if self._broken:  # the view is released: the buffer may be resized again
            buffer.clear()
        elif start:
            del buffer[:start]
        return out

    def _split(self, data: bytes | bytearray | memoryview) -> list[bytes | FrameTooLarge]:
        out: list[bytes | FrameTooLarge] = []
        start = 0
        with memoryview(data) as view:
            end = len(view)
            while end - start >= 4:
                (length,) = _LENGTH.unpack_from(view, start)
                if length > self.max_frame:
                    self._broken = True
                    out.append(FrameTooLarge(length, self.max_frame))
                    return out
                if end - start - 4 < length:
                    break
                out.append(bytes(view[start + 4 : start + 4 + length]))
                start += 4 + length
            if start < end:
                self._buffer += view[start:]
        return out


# -- requests ------------------------------------------------------------------------------


class Request(NamedTuple):
    """A validated request: ``args`` holds every argument of ``op``, defaults filled in."""

    correlation_id: int
    op: str
    args: dict[str, Any]


class Produce(NamedTuple):
    """A valid ``produce`` request: the batch, parsed once into the value the broker takes."""

    correlation_id: int
    request: ProduceRequest

    @property
    def op(self) -> str:
        return "produce"


class BadRequest(NamedTuple):
    """A request the server refuses without running it.

    ``correlation_id`` is 0 when the frame was too broken to carry one; ``fatal`` says the
    connection must be closed after the error frame (the stream cannot be trusted).
    """

    correlation_id: int
    error: ProducerError
    fatal: bool
    #: the request's operation, when the frame was whole enough to name one
    op: str | None = None


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()

Check = Callable[[str, Any], Any]


def _bad(name: str, value: Any, want: str) -> LocalProtocolError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return LocalProtocolError(f"argument {name!r} must be {want}, got {shown}")


def _int(lo: int, hi: int) -> Check:
    def check(name: str, value: Any) -> int:
        if type(value) is not int or not lo <= value <= hi:
            raise _bad(name, value, f"an int in {lo}..{hi}")
        return value

    return check


def _str(name: str, value: Any) -> str:
    if type(value) is not str or len(value) > MAX_STRING:
        raise _bad(name, value, f"a string of at most {MAX_STRING} characters")
    return value


def _token(name: str, value: Any) -> str:
    """A credential: a string of at most ``MAX_TOKEN_LENGTH`` characters. A refusal names its
    type and length, never its text."""
    if type(value) is not str or len(value) > MAX_TOKEN_LENGTH:
        size = f" of {len(value)} characters" if type(value) is str else ""
        raise LocalProtocolError(
            f"argument {name!r} must be a string of at most {MAX_TOKEN_LENGTH} characters, "
            f"got a {type(value).__name__}{size} (not shown: it is a credential)"
        )
    return value


def _opt(check: Check) -> Check:
    def optional(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return optional


def _bool(name: str, value: Any) -> bool:
    if type(value) is not bool:
        raise _bad(name, value, "true or false")
    return value


def _timeout(name: str, value: Any) -> float:
    if type(value) not in (int, float) or not 0 <= value <= MAX_TIMEOUT:
        raise _bad(name, value, f"a number of seconds in 0..{MAX_TIMEOUT:g}")
    return float(value)


def _topics(name: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if type(value) is not list or len(value) > MAX_PARTITIONS:
        raise _bad(name, value, "nil or an array of topic names")
    return [_str(name, v) for v in value]


def _records(name: str, value: Any) -> Sequence[Record]:
    """Decode a produce request's records. Each field's type is checked here, so the records
    are built without :class:`Record`'s converters (the server's per-record cost)."""
    if type(value) is not list or not 1 <= len(value) <= MAX_BATCH_RECORDS:
        raise _bad(name, value, f"an array of 1..{MAX_BATCH_RECORDS} records")
    if _ONLY_BYTES.issuperset(map(type, value)):  # bare values only: kept as one column
        return RecordColumns(value)
    out: list[Record] = []
    append = out.append
    for item in value:
        kind = type(item)
        if kind is bytes:
            append(value_record(item))
            continue
        if item is None:
            append(trusted_record(None, None, ()))
            continue
        if kind is not list or len(item) != 3:
            raise _bad(name, item, "records that are bin, nil, or [value, key, headers]")
        val, key, headers = item
        if val is not None and type(val) is not bytes:
            raise _bad("record value", val, "bin or nil")
        if key is not None and type(key) is not bytes:
            raise _bad("record key", key, "bin or nil")
        if type(headers) is not list:
            raise _bad("record headers", headers, "an array of [name, value] pairs")
        if not headers:
            append(trusted_record(val, key, ()))
            continue
        pairs = []
        for pair in headers:
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or type(pair[1]) is not bytes:
                raise _bad("record headers", pair, "[str name, bin value] pairs")
            pairs.append((pair[0], pair[1]))
        append(trusted_record(val, key, tuple(pairs)))
    return out


def _keys(name: str, value: Any) -> list[bytes | None]:
    """The ``keys`` column of a produce request (see :func:`_with_keys`)."""
    if type(value) is not list or not 1 <= len(value) <= MAX_BATCH_RECORDS:
        raise _bad(name, value, f"an array of 1..{MAX_BATCH_RECORDS} keys")
    if not _ONLY_BYTES.issuperset(map(type, value)):
        raise _bad(name, next(k for k in value if type(k) not in _ONLY_BYTES), "keys that are bin or nil")
    return value


def _with_keys(args: dict[str, Any]) -> None:
    """A produce request's optional ``keys``: record ``i`` gets key ``keys[i]``. The records
    must then be bare values (bin or nil), as many as the keys; they become one
    :class:`RecordColumns`."""
    keys = args.pop("keys", None)
    if keys is None:
        return
    records = args["records"]
    if type(records) is not RecordColumns or records.keys is not None:
        raise InvalidBatchError("with 'keys', the records must be bare values (bin or nil)")
    if len(keys) != len(records):
        raise InvalidBatchError(f"{len(keys)} keys for {len(records)} records")
    args["records"] = RecordColumns(records.values, keys)


_TOPIC: Final[Check] = _str
_PARTITION: Final = _int(0, MAX_PARTITIONS - 1)

#: Arguments of every operation: name -> (check, default or REQUIRED). A bad value is a
#: LocalProtocolError, except for the arguments in ``_ERRORS``, whose errors are those the
#: in-process broker raises for the same mistake.
SCHEMAS: Final[dict[str, dict[str, tuple[Check, Any]]]] = {
    "hello": {
        "version": (_int(0, 2**31 - 1), REQUIRED),
        "token": (_opt(_token), None),
        "client": (_opt(_str), None),
    },
    "ping": {},
    "metadata": {"topics": (_topics, None), "create": (_bool, False)},
    "init_producer": {"producer_name": (_opt(_str), None), "timeout": (_timeout, 30.0)},
    "produce": {
        "topic": (_TOPIC, REQUIRED),
        "partition": (_PARTITION, REQUIRED),
        "producer_id": (_int(0, MAX_PRODUCER_ID), REQUIRED),
        "producer_epoch": (_int(0, MAX_EPOCH), REQUIRED),
        "base_sequence": (_int(0, MAX_APPLICATION_SEQUENCE), REQUIRED),
        "records": (_records, REQUIRED),
        "previous_sequence": (_opt(_int(-1, MAX_APPLICATION_SEQUENCE)), None),
        "keys": (_opt(_keys), None),
    },
    "read": {
        "topic": (_TOPIC, REQUIRED),
        "partition": (_PARTITION, REQUIRED),
        "offset": (_int(0, 2**63 - 1), 0),
        "max_records": (_int(1, MAX_READ_RECORDS), 500),
    },
    "end_offset": {"topic": (_TOPIC, REQUIRED), "partition": (_PARTITION, REQUIRED)},
    "last_sequence": {
        "topic": (_TOPIC, REQUIRED),
        "partition": (_PARTITION, REQUIRED),
        "producer_id": (_int(0, MAX_PRODUCER_ID), REQUIRED),
        "producer_epoch": (_int(0, MAX_EPOCH), REQUIRED),
        "timeout": (_timeout, 30.0),
    },
    "create_topic": {"name": (_TOPIC, REQUIRED), "partitions": (_int(1, MAX_PARTITIONS), 1)},
    "delete_topic": {"name": (_TOPIC, REQUIRED)},
    "topics": {},
    "partitions_for": {"topic": (_TOPIC, REQUIRED), "create": (_bool, True)},
    "stats": {"topic": (_opt(_str), None)},
    "set_deduplication": {
        "enabled": (_opt(_bool), REQUIRED),
        "topic": (_opt(_str), None),
        "namespace": (_opt(_str), None),
    },
    "set_policy": {
        "policy": (_opt(_str), REQUIRED),
        "topic": (_opt(_str), None),
        "namespace": (_opt(_str), None),
    },
}

_ERRORS: Final[dict[str, type[ProducerError]]] = {
    "topic": InvalidTopicError,
    "partition": InvalidTopicError,
    "name": InvalidTopicError,
    "partitions": InvalidTopicError,
    "producer_id": InvalidBatchError,
    "producer_epoch": InvalidBatchError,
    "base_sequence": InvalidBatchError,
    "previous_sequence": InvalidBatchError,
    "records": InvalidBatchError,
    "keys": InvalidBatchError,
    "offset": ConfigError,
    "max_records": ConfigError,
    "token": AuthenticationError,
}

#: Operations that change broker state (an authorizer may want to treat them apart).
WRITE_OPS: Final = frozenset(
    {"init_producer", "produce", "create_topic", "delete_topic", "set_deduplication", "set_policy"}
)
#: Operations that need the admin role in a deployment with authorization.
ADMIN_OPS: Final = frozenset({"create_topic", "delete_topic", "set_deduplication", "set_policy"})


def validate_args(op: str, args: Any) -> dict[str, Any]:
    """Check ``args`` of ``op`` against its schema; return them with defaults filled in.

    Unknown keys are ignored (a newer client may send more). Raises LocalProtocolError, or for
    a bad topic, partition, batch field, offset or count the error the broker itself raises
    for it (InvalidTopicError, InvalidBatchError, ConfigError), and AuthenticationError for a
    token that is not a string of at most ``MAX_TOKEN_LENGTH`` characters.
    """
    schema = SCHEMAS.get(op)
    if schema is None:
        raise LocalProtocolError(f"unknown operation {op!r}")
    if type(args) is not dict:
        raise LocalProtocolError(f"arguments of {op!r} must be a map, got {type(args).__name__}")
    out: dict[str, Any] = {}
    for name, (check, default) in schema.items():
        if name in args:
            try:
                out[name] = check(name, args[name])
            except LocalProtocolError as exc:
                raise _ERRORS.get(name, LocalProtocolError)(exc.message) from None
        elif default is REQUIRED:
            raise LocalProtocolError(f"{op!r} needs the argument {name!r}")
        else:
            out[name] = default
    combine = _COMBINE.get(op)
    if combine is not None:
        combine(out)
    return out


#: Checks across the arguments of an operation, after each was checked alone.
_COMBINE: Final[dict[str, Callable[[dict[str, Any]], None]]] = {"produce": _with_keys}
#: What this module's server understands beyond version 1 (the ``extensions`` of ``hello``'s
#: answer); a client uses an extension only with a server that lists it.
EXTENSIONS: Final = ("keys",)


def parse_produce(args: Any) -> ProduceRequest:
    """The arguments of a ``produce`` request as the one :class:`ProduceRequest` the broker
    takes: every field checked once (the schema, then the canonical topic name and the
    sequence range of the whole batch), the records decoded without a
    :class:`~idempotent._records.Record` per record when they are bare values (with or
    without ``keys``), measured once; then the trusted constructor.

    A batch of bare values whose fields are all in range (what clients send) is checked in
    one pass of plain comparisons; anything else goes through the schema, which finds the
    first bad field and raises its error (both give the same request for the same arguments).

    Raises:
        LocalProtocolError: not a map, or a required argument missing.
        InvalidTopicError: a bad topic name or partition number.
        InvalidBatchError: a bad producer id, epoch, sequence, record or key.
    """
    if type(args) is dict:
        get = args.get
        topic, partition, records = get("topic"), get("partition"), get("records")
        producer_id, producer_epoch, base_sequence = get("producer_id"), get("producer_epoch"), get("base_sequence")
        previous, keys = get("previous_sequence"), get("keys")
        if (
            type(topic) is str
            and len(topic) <= MAX_STRING
            and type(partition) is int
            and 0 <= partition < MAX_PARTITIONS
            and type(producer_id) is int
            and 0 <= producer_id <= MAX_PRODUCER_ID
            and type(producer_epoch) is int
            and 0 <= producer_epoch <= MAX_EPOCH
            and type(base_sequence) is int
            and 0 <= base_sequence
            and (previous is None or (type(previous) is int and -1 <= previous <= MAX_APPLICATION_SEQUENCE))
            and type(records) is list
            and 1 <= (count := len(records)) <= MAX_BATCH_RECORDS
            and base_sequence <= MAX_APPLICATION_SEQUENCE - count + 1
            and _ONLY_BYTES.issuperset(map(type, records))
            and (
                keys is None
                or (type(keys) is list and len(keys) == count and _ONLY_BYTES.issuperset(map(type, keys)))
            )
        ):
            columns = RecordColumns(records, keys)
            header = BatchHeader(producer_id, producer_epoch, base_sequence, count, previous)  # type: ignore[arg-type]
            if keys is None and None not in records:  # Record.size of bare values, per column
                lengths = list(map(len, records))
                size, largest = 16 * count + sum(lengths), 16 + max(lengths)
            else:
                size, largest = measure(columns)
            return ProduceRequest(canonical_topic(topic), partition, header, columns, size, largest)
    a = validate_args("produce", args)
    records = a["records"]
    topic = canonical_topic(a["topic"])
    header = make_header(
        a["producer_id"], a["producer_epoch"], a["base_sequence"], len(records), a["previous_sequence"]
    )
    validate_header(header)  # the ranges of the batch as a whole (its last sequence)
    size, largest = measure(records)
    return ProduceRequest(topic, a["partition"], header, records, size, largest)


def parse_request(body: bytes) -> Request | Produce | BadRequest:
    """Decode and validate one request frame body. Never raises."""
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        return BadRequest(
            0, LocalProtocolError(f"malformed frame: not one MessagePack value ({type(exc).__name__})"), True
        )
    if type(value) is not list or len(value) != 4 or value[0] != REQUEST or type(value[0]) is not int:
        return BadRequest(
            0, LocalProtocolError("a request frame must be the array [0, correlation_id, op, args]"), True
        )
    _, correlation_id, op, args = value
    if type(correlation_id) is not int or not 1 <= correlation_id <= MAX_CORRELATION_ID:
        return BadRequest(0, LocalProtocolError(f"correlation_id must be an int in 1..{MAX_CORRELATION_ID}"), True)
    if type(op) is not str:
        return BadRequest(correlation_id, LocalProtocolError("op must be a string"), False)
    try:
        if op == "produce":
            return Produce(correlation_id, parse_produce(args))
        return Request(correlation_id, op, validate_args(op, args))
    except ProducerError as exc:
        return BadRequest(correlation_id, exc, False, op)
    except Exception as exc:  # a record or value the broker's types refuse
        return BadRequest(correlation_id, LocalProtocolError(f"bad argument of {op!r}: {exc}"), False, op)


def encode_request(correlation_id: int, op: str, args: Mapping[str, Any]) -> bytes:
    """A complete request frame."""
    return pack([REQUEST, correlation_id, op, dict(args)])


def encode_response(correlation_id: int, result: Mapping[str, Any]) -> bytes:
    """A complete response frame."""
    return pack([RESPONSE, correlation_id, dict(result)])


# -- errors --------------------------------------------------------------------------------


def error_to_wire(error: ProducerError) -> dict[str, Any]:
    """The error map of an error frame."""
    fields: dict[str, Any] = {}
    for field in attrs.fields(type(error)):
        if field.name == "message":
            continue
        value = getattr(error, field.name)
        fields[field.name] = value.value if isinstance(value, enum.Enum) else value
    return {
        "code": type(error).code,
        "name": type(error).__name__,
        "message": error.message,
        "recovery": error.recovery.value,
        "fields": fields,
    }


def encode_error(correlation_id: int, error: ProducerError) -> bytes:
    """A complete error frame."""
    return pack([ERROR, correlation_id, error_to_wire(error)])


def error_from_wire(value: Any) -> ProducerError:
    """Rebuild the exception an error map describes: same class (by code), same fields.

    A malformed map gives a RemoteProtocolError; an unknown code gives the root ProducerError.
    """
    if type(value) is not dict or type(value.get("code")) is not int or type(value.get("message")) is not str:
        return RemoteProtocolError(f"malformed error frame from the broker: {value!r:.200}")
    cls = ProducerError.for_code(value["code"])
    kwargs: dict[str, Any] = {}
    raw = value.get("fields")
    if type(raw) is dict:
        for field in attrs.fields(cls):
            if field.name == "message" or field.name not in raw:
                continue
            item = raw[field.name]
            default = field.default
            if isinstance(default, enum.Enum):
                try:
                    item = type(default)(item)
                except ValueError:
                    continue
            elif default is not attrs.NOTHING and default is not None and type(item) is not type(default):
                continue
            kwargs[field.name] = item
    try:
        return cls(value["message"], **kwargs)
    except Exception:
        return cls(value["message"])


# -- value types ---------------------------------------------------------------------------


def encode_records(records: Sequence[Record | bytes | str | None]) -> list[Any]:
    """Records as the ``records`` argument of ``produce``: bin/nil for a bare value, else
    ``[value, key, headers]``. Raises TypeError for a value that is not a record."""
    out: list[Any] = []
    append = out.append
    for item in records:
        if type(item) is Record:  # the producer's records: the common case first
            headers = item.headers
            if headers:
                append([item.value, item.key, [list(h) for h in headers]])
            elif item.key is None:
                append(item.value)
            else:
                append([item.value, item.key, []])
        elif item is None or type(item) is bytes:
            append(item)
        elif isinstance(item, str):
            append(item.encode())
        elif isinstance(item, Record):
            if item.key is None and not item.headers:
                append(item.value)
            else:
                append([item.value, item.key, [list(h) for h in item.headers]])
        elif isinstance(item, bytearray | memoryview):
            append(bytes(item))
        else:
            raise InvalidRecordError(f"records must be bytes, str, None or Record, not {type(item).__name__}")
    return out


def produce_args(records: Sequence[Record | bytes | str | None], args: dict[str, Any]) -> None:
    """Put ``records`` into the arguments of ``produce``: a :class:`RecordColumns` as its
    value column (bare values, version 1) and, when it has keys, the ``keys`` extension;
    anything else by :func:`encode_records`."""
    if type(records) is RecordColumns:
        args["records"] = records.values
        if records.keys is not None:
            args["keys"] = records.keys
    else:
        args["records"] = encode_records(records)


def encode_produce(correlation_id: int, request: ProduceRequest, *, keys: bool = True) -> bytes:
    """A complete ``produce`` request frame for ``request``: its records as columns when they
    are a :class:`RecordColumns` (the values, and with ``keys`` the keys extension; else the
    keys folded into the records, for a server that does not list it). Raises TypeError or
    ValueError for a value MessagePack cannot carry."""
    header = request.header
    args: dict[str, Any] = {
        "topic": request.topic,
        "partition": request.partition,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
    }
    produce_args(request.records, args)
    if header.previous_sequence is not None:  # absent: the broker applies the rule without it
        args["previous_sequence"] = header.previous_sequence
    if not keys and "keys" in args:
        args = without_keys(args)
    return encode_request(correlation_id, "produce", args)


def without_keys(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``produce`` with the ``keys`` extension folded into the records
    (``[value, key, []]``), for a server that does not list it."""
    out = {name: value for name, value in args.items() if name != "keys"}
    out["records"] = [
        value if key is None else [value, key, []] for value, key in zip(args["records"], args["keys"], strict=True)
    ]
    return out


def encode_result(result: ProduceResult) -> dict[str, Any]:
    """The result map of ``produce``."""
    return {
        "outcome": result.outcome.value,
        "base_offset": result.base_offset,
        "expected_sequence": result.expected_sequence,
        "producer_epoch": result.producer_epoch,
    }


def _packed_int(value: int) -> bytes:
    """An int as MessagePack packs it: the shortest encoding (unsigned for positive values)."""
    if 0 <= value < 0x80 or -32 <= value < 0:
        return _BYTE[value & 0xFF]
    if value > 0:
        if value <= 0xFF:
            return b"\xcc" + _BYTE[value]
        if value <= 0xFFFF:
            return b"\xcd" + value.to_bytes(2, "big")
        if value <= 0xFFFFFFFF:
            return b"\xce" + value.to_bytes(4, "big")
        return b"\xcf" + value.to_bytes(8, "big")
    if value >= -0x80:
        return b"\xd0" + value.to_bytes(1, "big", signed=True)
    if value >= -0x8000:
        return b"\xd1" + value.to_bytes(2, "big", signed=True)
    if value >= -0x80000000:
        return b"\xd2" + value.to_bytes(4, "big", signed=True)
    return b"\xd3" + value.to_bytes(8, "big", signed=True)


_BYTE: Final = [bytes([i]) for i in range(256)]
_NIL: Final = b"\xc0"
#: the packed ``[1, ...`` of a response and the keys of a produce result, in the order of
#: :func:`encode_result`, so :func:`encode_produced` writes what ``encode_response`` would
_RESPONSE_HEAD: Final = b"\x93\x01"
_RESULT_KEYS: Final = [msgpack.packb(k) for k in ("outcome", "base_offset", "expected_sequence", "producer_epoch")]
_OUTCOMES: Final = {outcome: msgpack.packb(outcome.value) for outcome in Outcome}


def encode_produced(correlation_id: int, result: ProduceResult) -> bytes:
    """``encode_response(correlation_id, encode_result(result))``, byte for byte, without
    building the map: the answer of every produce request."""
    key_outcome, key_offset, key_expected, key_epoch = _RESULT_KEYS
    offset, expected, epoch = result.base_offset, result.expected_sequence, result.producer_epoch
    body = b"".join(
        (
            _RESPONSE_HEAD,
            _packed_int(correlation_id),
            b"\x84",
            key_outcome,
            _OUTCOMES[result.outcome],
            key_offset,
            _NIL if offset is None else _packed_int(offset),
            key_expected,
            _NIL if expected is None else _packed_int(expected),
            key_epoch,
            _NIL if epoch is None else _packed_int(epoch),
        )
    )
    return _LENGTH.pack(len(body)) + body


def decode_result(value: Mapping[str, Any]) -> ProduceResult:
    """The inverse of :func:`encode_result`."""
    return ProduceResult(
        Outcome(value["outcome"]), value.get("base_offset"), value.get("expected_sequence"), value.get("producer_epoch")
    )


def encode_session(session: ProducerSession) -> dict[str, Any]:
    """The result map of ``init_producer`` (``elsewhere`` only when not empty: partitions
    whose last sequence the client asks their owner with ``last_sequence``)."""
    out = {
        "producer_id": session.producer_id,
        "producer_epoch": session.producer_epoch,
        "producer_name": session.producer_name,
        "last_sequences": [[tp.topic, tp.partition, seq] for tp, seq in session.last_sequences.items()],
        "state_lost": session.state_lost,
    }
    if session.max_record_bytes is not None:
        out["max_record_bytes"] = session.max_record_bytes
    if session.max_batch_bytes is not None:
        out["max_batch_bytes"] = session.max_batch_bytes
    if session.elsewhere:
        out["elsewhere"] = [[t, p] for t, p in session.elsewhere]
    return out


def decode_session(value: Mapping[str, Any]) -> ProducerSession:
    """The inverse of :func:`encode_session`."""
    return ProducerSession(
        value["producer_id"],
        value["producer_epoch"],
        value["producer_name"],
        LastSequences({TopicPartition(t, p): s for t, p, s in value["last_sequences"]}),
        bool(value.get("state_lost", False)),
        tuple((str(t), int(p)) for t, p in value.get("elsewhere", ())),
        _limit(value.get("max_record_bytes")),
        _limit(value.get("max_batch_bytes")),
    )


def _limit(value: Any) -> int | None:
    """A size limit from an answer: a positive int, else None (not told)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def encode_stored(record: StoredRecord) -> list[Any]:
    """One record of a ``read`` result."""
    return [
        record.offset,
        record.producer_id,
        record.producer_epoch,
        record.sequence,
        record.key,
        record.value,
        [list(h) for h in record.headers],
        record.timestamp,
    ]


def decode_stored(value: Sequence[Any]) -> StoredRecord:
    """The inverse of :func:`encode_stored`."""
    offset, producer_id, producer_epoch, sequence, key, val, headers, timestamp = value
    return StoredRecord(
        offset, producer_id, producer_epoch, sequence, key, val, tuple((n, v) for n, v in headers), timestamp
    )


def encode_stats(stats: PartitionStats) -> dict[str, Any]:
    """One partition of a ``stats`` result."""
    out = attrs.asdict(stats, recurse=False)
    out["producers"] = [attrs.asdict(p) for p in stats.producers]
    return out


def decode_stats(value: Mapping[str, Any]) -> PartitionStats:
    """The inverse of :func:`encode_stats`."""
    names = [f.name for f in attrs.fields(PartitionStats)]
    kwargs = {name: value[name] for name in names if name != "producers"}
    producers = tuple(ProducerStats(**p) for p in value["producers"])
    return PartitionStats(**kwargs, producers=producers)


__all__ = [
    "DEFAULT_MAX_FRAME",
    "ERROR",
    "PROTOCOL_VERSION",
    "REQUEST",
    "RESPONSE",
    "SCHEMAS",
    "BadRequest",
    "FrameDecoder",
    "FrameTooLarge",
    "Produce",
    "Request",
    "decode_result",
    "decode_session",
    "decode_stats",
    "decode_stored",
    "encode_error",
    "encode_produce",
    "encode_produced",
    "encode_records",
    "encode_request",
    "encode_response",
    "encode_result",
    "encode_session",
    "encode_stats",
    "encode_stored",
    "error_from_wire",
    "error_to_wire",
    "frame",
    "pack",
    "parse_produce",
    "parse_request",
    "validate_args",
]
