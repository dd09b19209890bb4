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

Everything here is pure: :class:`FrameDecoder` turns bytes into frame bodies (framing in
:mod:`idempotent.core.framing`, the value encodings in :mod:`idempotent.core.codec`; both
re-exported here),
:func:`parse_request` turns a body into a validated :class:`Request`, a :class:`Produce`
(a ``produce`` request parsed once into the :class:`~idempotent.core.request.ProduceRequest`
the broker takes: the network edge is the only place a batch off the wire is checked) or a
:class:`BadRequest`, and the ``encode_*``/``decode_*`` functions convert the broker's value
types to and from plain MessagePack values. A batch whose records have no headers travels
as columns both ways (:class:`~idempotent.core.records.RecordColumns`: a ``records`` array of
bare values and, with the ``keys`` extension, a ``keys`` array), with no object per record.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple, TypeVar

import attrs
import msgpack

from idempotent.core.codec import (
    decode_result,
    decode_session,
    decode_stats,
    decode_stored,
    encode_produce,
    encode_produced,
    encode_records,
    encode_result,
    encode_session,
    encode_stats,
    encode_stored,
    produce_args,
    without_keys,
)
from idempotent.core.framing import (
    DEFAULT_MAX_FRAME,
    ERROR,
    REQUEST,
    RESPONSE,
    FrameDecoder,
    FrameTooLarge,
    encode_request,
    encode_response,
    frame,
    pack,
)
from idempotent.core.records import (
    _ONLY_BYTES,
    BatchHeader,
    Record,
    RecordColumns,
    make_header,
    trusted_record,
    validate_header,
    value_record,
)
from idempotent.core.request import ProduceRequest, measure
from idempotent.core.topics import canonical_topic
from idempotent.core.types import MAX_APPLICATION_SEQUENCE, MAX_BATCH_RECORDS, MAX_EPOCH, MAX_PRODUCER_ID
from idempotent.core.values import MAX_PARTITIONS
from idempotent.errors import (
    AuthenticationError,
    ConfigError,
    InvalidBatchError,
    InvalidTopicError,
    LocalProtocolError,
    ProducerError,
    RemoteProtocolError,
)

#: The protocol version this module speaks (the ``version`` of ``hello``).
PROTOCOL_VERSION: Final = 1
#: Every version this module can serve.
SUPPORTED_VERSIONS: Final = frozenset({1})
#: Highest correlation id (unsigned 32-bit).
MAX_CORRELATION_ID: Final = 2**32 - 1
#: Largest ``max_records`` of one ``read``.
MAX_READ_RECORDS: Final = 10_000
#: Longest string argument (topic names are limited further by the broker).
MAX_STRING: Final = 4096
#: the largest encoded positions a transaction commits
MAX_POSITIONS: Final = 1 << 20
#: Longest ``token`` of ``hello``, in characters: a credential, with a limit of its own
#: (identity providers' tokens carrying many groups run to several KiB). ``auth`` takes it.
MAX_TOKEN_LENGTH: Final = 16 * 1024
#: Longest ``timeout`` argument in seconds.
MAX_TIMEOUT: Final = 3600.0


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


_Sized = TypeVar("_Sized", str, bytes)


def _sized(kind: type[_Sized], limit: int, want: str) -> Callable[[str, Any], _Sized]:
    """The check of a value of exactly type ``kind`` whose length is at most ``limit``."""

    def check(name: str, value: Any) -> _Sized:
        if type(value) is not kind or len(value) > limit:
            raise _bad(name, value, want)
        return value

    return check


_str = _sized(str, MAX_STRING, f"a string of at most {MAX_STRING} characters")


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


_blob = _sized(bytes, MAX_POSITIONS, f"bin of at most {MAX_POSITIONS} bytes")


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
    "begin_transaction": {
        "producer_id": (_int(0, MAX_PRODUCER_ID), REQUIRED),
        "producer_epoch": (_int(0, MAX_EPOCH), REQUIRED),
    },
    "commit_transaction": {
        "producer_id": (_int(0, MAX_PRODUCER_ID), REQUIRED),
        "producer_epoch": (_int(0, MAX_EPOCH), REQUIRED),
        "positions": (_opt(_blob), None),
    },
    "abort_transaction": {
        "producer_id": (_int(0, MAX_PRODUCER_ID), REQUIRED),
        "producer_epoch": (_int(0, MAX_EPOCH), REQUIRED),
    },
    "committed_positions": {"producer_id": (_int(0, MAX_PRODUCER_ID), REQUIRED)},
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
    "positions": ConfigError,
    "offset": ConfigError,
    "max_records": ConfigError,
    "token": AuthenticationError,
}

#: Operations that change broker state (an authorizer may want to treat them apart).
WRITE_OPS: Final = frozenset(
    {
        "init_producer",
        "produce",
        "begin_transaction",
        "commit_transaction",
        "abort_transaction",
        "create_topic",
        "delete_topic",
        "set_deduplication",
        "set_policy",
    }
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
EXTENSIONS: Final = ("keys", "transactions")


def parse_produce(args: Any) -> ProduceRequest:
    """The arguments of a ``produce`` request as the one :class:`ProduceRequest` the broker
    takes: every field checked once (the schema, then the canonical topic name and the
    sequence range of the whole batch), the records decoded without a
    :class:`~idempotent.core.records.Record` per record when they are bare values (with or
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
            and base_sequence >= 0
            and (previous is None or (type(previous) is int and -1 <= previous <= MAX_APPLICATION_SEQUENCE))
            and type(records) is list
            and 1 <= (count := len(records)) <= MAX_BATCH_RECORDS
            and base_sequence <= MAX_APPLICATION_SEQUENCE - count + 1
            and _ONLY_BYTES.issuperset(map(type, records))
            and (
                keys is None or (type(keys) is list and len(keys) == count and _ONLY_BYTES.issuperset(map(type, keys)))
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


__all__ = [
    "ADMIN_OPS",
    "DEFAULT_MAX_FRAME",
    "ERROR",
    "EXTENSIONS",
    "MAX_CORRELATION_ID",
    "MAX_READ_RECORDS",
    "MAX_STRING",
    "MAX_TIMEOUT",
    "MAX_TOKEN_LENGTH",
    "PROTOCOL_VERSION",
    "REQUEST",
    "RESPONSE",
    "SCHEMAS",
    "SUPPORTED_VERSIONS",
    "WRITE_OPS",
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
    "produce_args",
    "validate_args",
    "without_keys",
]
