"""What the broker server does for each request other than ``hello``: the operations the
workers run (:func:`call`), and the produce path's two conversions (:func:`produce_args`, the
arguments an authorizer sees; :func:`produced`, the answer frame of a produce). Internal to
:mod:`idempotent.net.server`, which re-exports :func:`produce_args`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import idempotent.core.protocol as wire
from idempotent.broker.broker import Broker
from idempotent.core.outcomes import ProduceResult
from idempotent.core.request import ProduceRequest
from idempotent.core.topics import canonical_topic
from idempotent.errors import LocalProtocolError, ProducerError, internal_error
from idempotent.net.config import Claimer, ServerConfig

log = logging.getLogger("idempotent.net.server")

#: ``(topic, partition)`` -> the address of the broker that owns it (None: unknown)
OwnerOf = Callable[[str, int], str | None]


def call(
    op: str,
    a: dict[str, Any],
    principal: object,
    *,
    broker: Broker,
    config: ServerConfig,
    claim: Claimer | None,
    owner_of: OwnerOf | None,
    address: str,
) -> dict[str, Any]:
    """Run ``op`` (any operation but ``hello`` and ``produce``) with its validated arguments
    ``a`` for ``principal``, on ``broker``, served at ``address``; return its result map.

    Raises:
        What the broker raises for the operation (the server sends it as an error frame).
    """
    if op == "ping":
        return {}
    if op == "init_producer":
        name = a["producer_name"]
        claimed = None if claim is None else functools.partial(claim, principal, name)
        return wire.encode_session(broker.init_producer(name, timeout=a["timeout"], claim=claimed))
    if op == "read":
        records = broker.read(a["topic"], a["partition"], a["offset"], min(a["max_records"], config.read_chunk))
        budget = config.max_frame // 2
        out: list[list[Any]] = []
        for record in records:
            budget -= 64 + len(record.value or b"") + len(record.key or b"")
            budget -= sum(len(n) + len(v) + 8 for n, v in record.headers)
            if budget < 0 and out:
                break
            out.append(wire.encode_stored(record))
        return {"records": out}
    if op == "end_offset":
        return {"offset": broker.end_offset(a["topic"], a["partition"])}
    if op == "last_sequence":
        sequence = broker.last_sequence(
            a["topic"], a["partition"], a["producer_id"], a["producer_epoch"], timeout=a["timeout"]
        )
        return {"sequence": sequence}
    if op == "begin_transaction":
        broker.begin_transaction(a["producer_id"], a["producer_epoch"])
        return {}
    if op == "commit_transaction":
        answers = broker.commit_transaction(a["producer_id"], a["producer_epoch"], a["positions"])
        return {"answers": [[t, p, seq, offset, duplicate] for (t, p, seq), (offset, duplicate) in answers.items()]}
    if op == "abort_transaction":
        rewound = broker.abort_transaction(a["producer_id"], a["producer_epoch"])
        return {"last_sequences": [[tp.topic, tp.partition, seq] for tp, seq in rewound.items()]}
    if op == "committed_positions":
        return {"positions": broker.committed_positions(a["producer_id"])}
    if op == "create_topic":
        broker.create_topic(a["name"], a["partitions"])
        return {}
    if op == "delete_topic":
        broker.delete_topic(a["name"])
        return {}
    if op == "topics":
        return {"topics": broker.topics()}
    if op == "partitions_for":
        return {"partitions": broker.partitions_for(a["topic"], create=a["create"])}
    if op == "stats":
        return {"partitions": [wire.encode_stats(s) for s in broker.stats(a["topic"])]}
    if op == "set_deduplication":
        broker.set_deduplication(a["enabled"], topic=a["topic"], namespace=a["namespace"])
        return {}
    if op == "set_policy":
        broker.set_policy(a["policy"], topic=a["topic"], namespace=a["namespace"])
        return {}
    if op == "metadata":
        return _metadata(a["topics"], a["create"], broker, owner_of, address)
    raise LocalProtocolError(f"unknown operation {op!r}")  # pragma: no cover - the schema refuses it first


def _metadata(
    topics: list[str] | None, create: bool, broker: Broker, owner_of: OwnerOf | None, address: str
) -> dict[str, Any]:
    names = sorted(broker.topics()) if topics is None else [canonical_topic(t) for t in topics]
    out: dict[str, list[str | None]] = {}
    for name in names:
        count = broker.partitions_for(name, create=create)
        if owner_of is not None:
            out[name] = [owner_of(name, p) for p in range(count)]
        elif broker.config.broker_id is not None:  # several brokers: the ownership records
            out[name] = [lease.address if lease is not None else None for lease in broker.owners(name)]
        else:
            out[name] = [address] * count
    return {"broker": address, "topics": out}


def produce_args(request: ProduceRequest) -> dict[str, Any]:
    """The arguments of a parsed ``produce`` request, as an authorizer sees them (the topic
    by its stored name, the records as decoded)."""
    header = request.header
    return {
        "topic": request.topic,
        "partition": request.partition,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
        "records": request.records,
        "previous_sequence": header.previous_sequence,
    }


def produced(cid: int, future: Future[ProduceResult]) -> bytes:
    """The answer frame of a produce request whose future is done. Every request gets its
    answer, or the connection's in-flight count never drops."""
    try:
        exc = future.exception()
        if exc is None:
            return wire.encode_produced(cid, future.result())
        if isinstance(exc, ProducerError):
            return wire.encode_error(cid, exc)
        # the broker sets only errors of the tree: anything else is a bug
        return wire.encode_error(cid, internal_error("producing", exc, log))
    except Exception as failure:  # a bug (an answer that cannot be encoded): logged
        return wire.encode_error(cid, internal_error("answering a produce", failure, log))


__all__ = ["OwnerOf", "call", "produce_args", "produced"]
