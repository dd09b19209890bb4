"""The value encodings of the broker wire protocol, without I/O (see ``docs/protocol.md``):
the broker's value types to and from plain MessagePack values.

Records go as ``records`` (bare values, or ``[value, key, headers]``), and a batch without
headers (:class:`~idempotent.core.records.RecordColumns`) as its columns: the values and, with
the ``keys`` extension, the keys (:func:`produce_args`, :func:`encode_produce`), with no
object per record. :func:`encode_produced` writes a produce answer without building its map.
Re-exported by :mod:`idempotent.core.protocol`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import msgpack

from idempotent.core.framing import LENGTH as _LENGTH
from idempotent.core.framing import encode_request
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.records import Record, RecordColumns, StoredRecord
from idempotent.core.request import ProduceRequest
from idempotent.core.types import TopicPartition
from idempotent.core.values import LastSequences, PartitionStats, ProducerSession, ProducerStats
from idempotent.errors import InvalidRecordError


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
    "decode_result",
    "decode_session",
    "decode_stats",
    "decode_stored",
    "encode_produce",
    "encode_produced",
    "encode_records",
    "encode_result",
    "encode_session",
    "encode_stats",
    "encode_stored",
    "produce_args",
    "without_keys",
]
