"""Taking a producer's writer of a Pulsar partition and reading back what it stored there (for
:mod:`idempotent.adapters.pulsar.producer_log`).

Pulsar refuses a second live producer of one name on a topic (``ProducerBusy``) and removes a
closed or disconnected one only once its pending writes are settled. So once
:func:`open_partition` holds the partition topic under the producer's name, everything an
earlier instance stored there is readable, and nothing more of it can arrive:
:func:`replay` applies the producer's entries stored since its newest state, and
:func:`locate` finds the offset of an entry ``last_sequence_id()`` says is stored.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from idempotent.adapters.producer_state import state_lost
from idempotent.adapters.pulsar.entries import EntryWriter
from idempotent.adapters.pulsar.errors import map_errors, translate
from idempotent.adapters.pulsar.names import encode_offset, pulsar_topic_name, start_id
from idempotent.core.checker import PartitionChecker
from idempotent.core.records import BatchHeader, Snapshot, StoredBatch
from idempotent.core.types import Epoch, ProducerId
from idempotent.core.types import Sequence as SequenceNumber
from idempotent.errors import BackendUnavailableError, CorruptDataError

if TYPE_CHECKING:
    from idempotent.adapters.pulsar.backend import PulsarBackend

try:
    from pulsar import exceptions as pulsar_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")


def create_partition_producer(
    backend: PulsarBackend, data_topic: str, name: str, producer_key: str, options: dict[str, Any], where: str
) -> Any:
    """The producer's Pulsar producer (named ``name``, with ``options``) on ``data_topic``;
    ProducerBusy (another instance of the same producer is still connected) is retried until
    the backend's timeout.

    Raises:
        BackendUnavailableError: still busy at the timeout, or Pulsar failed (translated).
        ConfigError: (translated) Pulsar refused the producer's settings.
    """
    deadline = time.monotonic() + backend.timeout
    delay = 0.05
    while True:
        try:
            return backend._client.create_producer(data_topic, producer_name=name, **options)
        except pulsar_errors.ProducerBusy as exc:
            if time.monotonic() + delay > deadline:
                raise BackendUnavailableError(
                    f"pulsar: another instance of producer {producer_key!r} is still connected to "
                    f"{data_topic} (as {name!r}), so this one cannot write there: a named producer runs "
                    "in one process at a time. A killed process's connection is dropped once the broker "
                    "notices (seconds); a running one must be stopped first"
                ) from exc
        except Exception as exc:
            raise translate(exc, f"open the writer of {where}") from exc
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def open_partition(
    backend: PulsarBackend,
    name: str,
    producer_key: str,
    named: bool,
    options: dict[str, Any],
    topic: str,
    partition: int,
    base: Snapshot | None,
    rebuild: tuple[int, str] | None = None,
) -> tuple[EntryWriter, Snapshot]:
    """Take the producer's writer of a partition: wait until no other instance of it holds
    the partition topic, then read what it stored there since ``base`` (its newest state;
    None: it never wrote the partition, which starts now at the topic's end). A topic made
    by Pulsar's own tools is adopted; deduplication is switched on for it.

    ``rebuild`` ``(window, why)``: the producer wrote the partition but its stored state there
    is lost (``why``: missing, unreadable), so it is rebuilt from the whole partition, read
    from its first message when it holds at most ``window`` messages; otherwise, or when
    Pulsar says the producer stored entries there that the read does not find, the opening
    is refused (:class:`~idempotent.errors.ProducerStateLostError`).

    Returns:
        The writer and the producer's complete state on the partition.

    Raises:
        BackendUnavailableError: Pulsar failed, or another instance still holds the
            partition topic; no writer is left open.
        ConfigError: (translated) Pulsar refused the producer's settings.
        ProducerStateLostError: ``rebuild`` could not rebuild the state; no writer is left open.
    """
    where = f"{topic}[{partition}]"
    with map_errors(f"prepare {where}"):
        if topic not in backend.list_topics():  # adopt a topic made by Pulsar's own tools
            backend.create_topic(topic, 1)
        data_topic = backend.data_topic(topic, partition)
        backend.ensure_deduplication(pulsar_topic_name(topic), data_topic)
    producer = create_partition_producer(backend, data_topic, name, producer_key, options, where)
    try:
        with map_errors(f"recover {where}"):
            last_id = int(producer.last_sequence_id())
            now = time.time()
            if base is None and rebuild is not None:
                window, why = rebuild
                checker = PartitionChecker.restore(None, now=now)
                read, found = replay(backend, name, checker, data_topic, window + 1)
                if read > window or (last_id >= 0 and not found):
                    held = f"the partition holds more than {window} messages" if read > window else ""
                    raise state_lost(
                        producer_key,
                        topic,
                        partition,
                        why,
                        held or f"none of the entries Pulsar says it stored there (up to {last_id}) is retained",
                        None,
                    )
                checker.position = max(checker.position, backend._end(data_topic))
                _LOG.warning(
                    "pulsar: the state of %r on %s was %s; rebuilt from its %d messages", name, where, why, read
                )
            elif base is None:
                if last_id >= 0 and named:
                    _LOG.warning(
                        "pulsar: %s holds entries of %r that its stored state does not name; resends of "
                        "them will not be recognised",
                        where,
                        name,
                    )
                checker = PartitionChecker.restore(None, now=now)
                checker.position = backend._end(data_topic)
            else:
                checker = PartitionChecker.restore(base, now=now)
                replay(backend, name, checker, data_topic)
            state = checker.snapshot(now)
    except BaseException:
        with contextlib.suppress(Exception):
            producer.close()
        raise
    return EntryWriter(topic, partition, data_topic, producer, max(last_id + 1, 1), state.position), state


def replay(
    backend: PulsarBackend, name: str, checker: PartitionChecker, data_topic: str, limit: int | None = None
) -> tuple[int, int]:
    """Apply the entries of Pulsar producer ``name`` stored in ``data_topic`` from
    ``checker.position`` to the end (or to ``limit`` messages read).

    Returns:
        How many messages were read, and how many entries applied.
    """
    read = applied = 0
    for message in backend._read(data_topic, start_id(checker.position), limit):
        read += 1
        if message.producer_name() != name:
            continue
        properties = message.properties()
        count = properties.get("idem.count")
        if count is None or "idem.pid" not in properties:
            continue
        message_id = message.message_id()
        offset = encode_offset(message_id.ledger_id(), message_id.entry_id(), max(message_id.batch_index(), 0))
        if offset < checker.position:
            continue
        checker.apply(
            StoredBatch(
                offset,
                ProducerId(int(properties["idem.pid"])),
                Epoch(int(properties["idem.epoch"])),
                SequenceNumber(int(properties["idem.seq"])),
                int(count),
                float(message.event_timestamp() or message.publish_timestamp()) / 1000,
            )
        )
        applied += 1
    return read, applied


def locate(
    backend: PulsarBackend, name: str, writer: EntryWriter, header: BatchHeader | None, entry_id: int, floor: int
) -> int:
    """The base offset of an entry of Pulsar producer ``name`` (the batch of ``header``; any
    batch of ours when None) known to be stored after offset ``floor`` of the writer's topic.

    Raises:
        CorruptDataError: it is not there (the log lost it).
        BackendUnavailableError: Pulsar could not be read (a timeout, a reconnect: retriable).
    """
    with map_errors(f"find entry {entry_id} of {name!r} in {writer.where}"):
        for message in backend._read(writer.data_topic, start_id(floor)):
            if message.producer_name() != name:
                continue
            properties = message.properties()
            if "idem.count" not in properties:
                continue
            if header is not None and (
                properties.get("idem.pid") != str(header.producer_id)
                or properties.get("idem.seq") != str(header.base_sequence)
                or properties.get("idem.epoch") != str(header.producer_epoch)
            ):
                continue
            message_id = message.message_id()
            return encode_offset(message_id.ledger_id(), message_id.entry_id(), max(message_id.batch_index(), 0))
    raise CorruptDataError(
        f"pulsar: {writer.where}: Pulsar says entry {entry_id} of {name!r} is stored, "
        f"but it is not found after offset {floor}"
    )
