"""Records as Pulsar messages, and back: key, value, headers and the ``idem.*`` properties.

Plain consumers read them unchanged: the key is the partition key, the value the payload, the
batch's timestamp the event time, user headers are properties.
"""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

import msgpack

from idempotent.adapters.pulsar.names import offset_of
from idempotent.core.records import Record, StoredRecord

try:
    import _pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_PROPERTY_PREFIX = "idem."
_MESSAGE_OVERHEAD = 64  # per message in an entry: metadata, generously


class Message(NamedTuple):
    content: bytes | None
    properties: dict[str, str]
    partition_key: str | None
    event_time: int  # milliseconds


def build_message(message: Message, sequence_id: int | None, ordering_key: str | None = None) -> Any:
    """``message`` as pulsar-client's message, made with the client extension's builder (none
    of the checks its ``send_async`` wrapper makes per call): the sequence id when not None,
    the event time when positive."""
    built = _pulsar.MessageBuilder()
    if message.content is None:
        built.set_null_value()
    else:
        built.content(message.content)
    if message.properties:
        built.properties(message.properties)  # one call for all of them
    if message.partition_key:
        built.partition_key(message.partition_key)
    if ordering_key:
        built.ordering_key(ordering_key)
    if sequence_id is not None:
        built.sequence_id(sequence_id)
    if message.event_time > 0:
        built.event_timestamp(message.event_time)
    return built.build()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encode_record(record: Record, idem: dict[str, str], event_time: int) -> Message:
    """One record as a Pulsar message: key, value and headers readable by plain consumers.

    Header values that are not UTF-8 are stored base64-encoded; when the properties cannot
    reproduce the headers exactly (such values, repeated or ``idem.`` names, an order other
    than sorted), ``idem.headers`` also holds the exact list. A key that is not UTF-8 text
    (or is empty) is stored base64-encoded as ``idem.key`` (and as the partition key).
    """
    properties: dict[str, str] = {}
    exact = True
    names = [name for name, _ in record.headers]
    if names != sorted(names) or len(set(names)) != len(names):
        exact = False
    for name, value in record.headers:
        if not name or name.startswith(_PROPERTY_PREFIX):
            exact = False
            continue
        try:
            properties[name] = value.decode()
        except UnicodeDecodeError:
            properties[name] = _b64(value)
            exact = False
    if not exact:
        properties["idem.headers"] = _b64(msgpack.packb([[name, value] for name, value in record.headers]))
    key: str | None = None
    if record.key is not None:
        try:
            key = record.key.decode() or None
        except UnicodeDecodeError:
            key = None
        if key is None:
            properties["idem.key"] = key = _b64(record.key)
    properties.update(idem)
    return Message(record.value, properties, key or None, event_time)


def message_size(message: Message) -> int:
    size = _MESSAGE_OVERHEAD + len(message.content or b"") + len(message.partition_key or "")
    for name, value in message.properties.items():
        size += len(name.encode()) + len(value.encode()) + 8
    return size


def headers_of(properties: dict[str, str]) -> tuple[tuple[str, bytes], ...]:
    exact = properties.get("idem.headers")
    if exact is not None:
        return tuple((str(name), bytes(value)) for name, value in msgpack.unpackb(base64.b64decode(exact)))
    return tuple((name, value.encode()) for name, value in sorted(properties.items()) if not name.startswith("idem."))


def application_properties(properties: dict[str, str]) -> dict[str, str]:
    """The properties the application set, from those a message carries: without the
    ``idem.*`` ones this adapter adds (identity, exact headers, a binary key), and, when the
    exact headers are there, those headers as str (values decoded as UTF-8, undecodable bytes
    replaced). ``properties`` itself is returned when it holds no ``idem.*`` name."""
    if not any(name.startswith(_PROPERTY_PREFIX) for name in properties):
        return properties
    if "idem.headers" in properties:
        return {name: value.decode("utf-8", "replace") for name, value in headers_of(properties)}
    return {name: value for name, value in properties.items() if not name.startswith(_PROPERTY_PREFIX)}


def key_of(message: Any, properties: dict[str, str]) -> bytes | None:
    encoded = properties.get("idem.key")
    if encoded is not None:
        return base64.b64decode(encoded)
    key = message.partition_key()
    return key.encode() if key else None


def property_int(properties: dict[str, str], name: str, default: int = -1) -> int:
    value = properties.get(name)
    return default if value is None else int(value)


def timestamp_of(message: Any) -> float:
    return float(message.event_timestamp() or message.publish_timestamp()) / 1000


def stored_record(message: Any) -> StoredRecord:
    properties = dict(message.properties())
    return StoredRecord(
        offset_of(message.message_id()),
        property_int(properties, "idem.pid"),
        property_int(properties, "idem.epoch"),
        property_int(properties, "idem.seq"),
        key_of(message, properties),
        None if message.has_null_value() else message.data(),
        headers_of(properties),
        timestamp_of(message),
    )
