"""A named producer's state topic on Pulsar (for :mod:`idempotent.adapters.pulsar.producer_log`).

The producer's checker state on every partition it writes is stored, as one message, in its
own topic ``__idempotent_producer.<name>`` (in the metadata topic's namespace), written with an
``ExclusiveWithFencing`` producer: opening it (:func:`open_state_producer`) fences every
earlier instance of the producer. A restart starts from the newest message
(:func:`read_states`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgpack

from idempotent.adapters.meta import pack_snapshot, unpack_snapshot
from idempotent.adapters.pulsar.errors import map_errors
from idempotent.adapters.pulsar.names import split_topic
from idempotent.core.records import Snapshot
from idempotent.errors import CorruptDataError

if TYPE_CHECKING:
    from idempotent.adapters.pulsar.backend import PulsarBackend

try:
    import pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

STATE_PREFIX = "__idempotent_producer."
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,200}")


def state_topic(backend: PulsarBackend, producer_key: str) -> str:
    """The topic holding a named producer's state, in the metadata topic's namespace."""
    meta = split_topic(backend.meta_topic)
    local = producer_key if _SAFE_NAME.fullmatch(producer_key) else "x-" + producer_key.encode().hex()
    return f"persistent://{meta.tenant}/{meta.namespace}/{STATE_PREFIX}{local}"


def pack_states(states: dict[tuple[str, int], Snapshot]) -> bytes:
    """Encode a producer's states (one per partition) as one message."""
    packed: bytes = msgpack.packb([[topic, partition, pack_snapshot(s)] for (topic, partition), s in states.items()])
    return packed


def unpack_states(data: bytes) -> dict[tuple[str, int], Snapshot]:
    """Decode :func:`pack_states`.

    Raises:
        CorruptDataError: not a state message.
    """
    try:
        return {(str(t), int(p)): unpack_snapshot(s) for t, p, s in msgpack.unpackb(data)}
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"pulsar: an unreadable producer state ({exc!r})") from exc


def open_state_producer(backend: PulsarBackend, topic: str, name: str, producer_key: str) -> Any:
    """The producer writing ``topic`` (the state topic of ``producer_key``) as ``name``, with
    ExclusiveWithFencing: opening it fences every earlier instance (their next state write
    fails). The topic is created when missing.

    Raises:
        BackendUnavailableError, ConfigError: (translated) Pulsar failed or refused.
    """
    with map_errors(f"open the state of producer {producer_key!r}"):
        backend.ensure_topic(split_topic(topic))
        return backend._client.create_producer(
            topic,
            producer_name=name,
            access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
            send_timeout_millis=int(backend.timeout * 1000),
            block_if_queue_full=True,
        )


def read_states(backend: PulsarBackend, topic: str, producer_key: str) -> dict[tuple[str, int], Snapshot]:
    """The newest state stored in ``topic`` (none when it holds none).

    Raises:
        BackendUnavailableError: (translated) Pulsar could not be read.
        CorruptDataError: the stored state cannot be decoded.
    """
    with map_errors(f"read the state of producer {producer_key!r}"):
        last = backend._last(topic)
    return {} if last is None or last.has_null_value() else unpack_states(last.data())
