"""A producer's own transactional writer into Kafka (producer-scoped ownership).

A :class:`~idempotent.broker.direct.DirectBroker` writes one producer's batches straight into the
topic's partitions, next to any number of other producers (replicas of a service, workers of
one server) writing the same partitions at the same time. Nobody owns a partition; each
producer owns its own records:

* **Fencing** is Kafka's own: the writer's ``transactional.id`` names the producer
  (``idempotent-n-<name>`` for a named producer, ``idempotent-p-<id>`` for an anonymous one),
  and its ``init_transactions`` fences every earlier instance of that producer and aborts its
  open transaction. Two producers never fence each other. Kafka's coordinator also fences a
  transaction left open past ``transaction.timeout.ms``: that fence is retried (an anonymous
  producer's always; a named one's when its registry holds no newer instance, the
  ``takeover`` check of :class:`KafkaProducerLog`).
* **Atomicity**: each group of batches is one Kafka transaction (up to
  :attr:`KafkaProducerLog.max_in_flight` batches per partition, in sequence order). Readers
  use ``read_committed``.
* **Layout**: a batch is stored as in the shared writer (``adapters/kafka/backend.py``): its first
  record carries the identity headers and the count, the others go to librdkafka in bulk.
  Other producers' records may sit between two of this producer's batches, never inside one:
  the writer holds every batch back (a ``linger.ms`` far longer than a transaction) and hands
  the group over in rounds. A round holds one *run* of each partition: consecutive batches of
  that partition whose records, with librdkafka's framing counted generously, fit one message
  set (``batch.size``, ``batch.num.messages``); then a ``flush`` sends each run as one
  request, which Kafka appends whole. A group whose batches fit (the usual case) takes one
  round; the next run of a partition waits for the next round. Each round costs a round trip,
  but not the transaction's own (registering its partitions, about 1 ms in librdkafka, and
  the commit). Only a run's first and last record have a delivery report (the interpreter
  lock is taken twice per run, not per record or per batch): their offsets prove the run
  consecutive, which places every batch in it. A run that was ever split aborts the
  transaction (a retriable error; nothing stored).
* **State**: a named producer's checker state for each partition it wrote is written, in the
  same transaction as the batches it covers, to the compacted topic
  ``__idempotent_producer_state`` (key ``<name>\\0<topic>\\0<partition>``, partitioned by the
  name), so a restart continues from exactly what was committed, with the original offsets of
  its latest batches for duplicate answers. An anonymous producer never restarts, and writes
  none. Before its first batch on a partition a named producer records, once, in the metadata
  topic that it writes it (``wrote:`` records), so a restart knows where a state must exist:
  a state that is missing, older than the data or unreadable is rebuilt from the partition's
  batch heads within a window, or the restart refused (:func:`recover_states`,
  :mod:`idempotent.adapters.producer_state`); it is never taken as empty.

Errors are translated with the shared adapter's :func:`idempotent.adapters.kafka.backend._map_errors`.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import msgpack

from idempotent.adapters.kafka.backend import KafkaBackend, kafka_topic_name
from idempotent.adapters.kafka.bulk import (
    BulkWriter,
    bulk_columns,
    native_attached,
    native_plugin,
    write_group,
    writer_for,
)
from idempotent.adapters.kafka.errors import FENCED_CODES, map_errors, refused_record, translate
from idempotent.adapters.kafka.heads import BatchHead, identity_headers, records_timed
from idempotent.adapters.kafka.txn import TransactionalProducer, TxnState
from idempotent.adapters.meta import pack_snapshot, unpack_snapshot
from idempotent.adapters.producer_state import recover_state
from idempotent.backend import AppendBatch
from idempotent.broker.config import STATE_REBUILD_RECORDS
from idempotent.core.checker import CheckerConfig, PartitionChecker
from idempotent.core.records import RecordColumns, Snapshot, StoredBatch
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    CorruptDataError,
    OwnershipLostError,
    ProducerError,
    TransactionAbortableError,
    TransactionStateError,
)

try:
    from confluent_kafka import KafkaError, KafkaException
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the kafka backend needs confluent-kafka: pip install 'idempotent[kafka]'") from exc

_LOG = logging.getLogger("idempotent.adapters.kafka")

STATE_TOPIC = "__idempotent_producer_state"
#: partitions of the state topic: a producer's keys all live in one of them (by its name)
STATE_PARTITIONS = 16
#: librdkafka's message set bounds this writer sets; a batch must fit one message set
MESSAGE_SET_BYTES = 1_000_000
MESSAGE_SET_RECORDS = 100_000
#: what a batch may hold, as ``Record.size`` counts, leaving room for librdkafka's own framing:
#: Kafka's record format adds at most 9 bytes per record beyond ``Record.size``'s 16 (length,
#: attributes, time and offset deltas, key and value lengths, header count, as varints for
#: records under 2 MB) and 2 per header beyond its 4, so 10,000 records with up to 5 headers
#: each, and the head's identity headers, fit a message set of MESSAGE_SET_BYTES
MAX_BATCH_BYTES = 800_000
MAX_BATCH_RECORDS = 10_000
#: batches of one partition in one transaction
MAX_IN_FLIGHT = 5
#: librdkafka's framing per record counted when batches are packed into one message set (see
#: MAX_BATCH_BYTES), and room left for the heads' identity headers
RUN_FRAMING_BYTES = 20
RUN_SLACK_BYTES = 50_000
#: librdkafka settings of a producer's writer that a user may choose (the drop-in passes them)
TUNABLE = frozenset(
    {
        "compression.type",
        "compression.codec",
        "compression.level",
        "request.timeout.ms",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "socket.timeout.ms",
        "transaction.timeout.ms",
        "client.id",
    }
)


def state_key(producer_key: str, topic: str, partition: int) -> bytes:
    """The state topic's key of one producer's state on one partition."""
    return f"{producer_key}\0{topic}\0{partition}".encode()


def positions_key(producer_key: str) -> bytes:
    """The state topic's key of the source positions a named producer's application
    transactions record (never a :func:`state_key`: it starts with a byte no name holds)."""
    return f"\x01positions\0{producer_key}".encode()


def state_partition(producer_key: str) -> int:
    """The partition of the state topic that holds every key of ``producer_key``."""
    return zlib.crc32(producer_key.encode()) % STATE_PARTITIONS


def ensure_state_topic(backend: KafkaBackend) -> None:
    """Create the compacted state topic if it does not exist (a race with another process
    creating it is harmless), with the backend's replication (the brokers' defaults unless
    given); check the replicas of one that exists (a WARNING when it has too few, see
    :mod:`idempotent.adapters.kafka.replicas`).

    Raises:
        BackendUnavailableError, ConfigError: the cluster refused or did not answer.
    """
    name = backend.prefix + STATE_TOPIC
    with map_errors(f"create {name}"):
        topics = backend._list_topics()
        if name in topics and topics[name].error is None and topics[name].partitions:
            backend.check_internal_topics([name], topics)
            return
        config = {"cleanup.policy": "compact", "segment.ms": "600000", **backend.topic_config}
        backend.create_kafka_topics([backend.new_topic(name, STATE_PARTITIONS, config)])
        backend._wait_for_topics([name])


def load_states(
    backend: KafkaBackend,
    producer_key: str,
    producer_id: int = -1,
    *,
    window: int = STATE_REBUILD_RECORDS,
    config: CheckerConfig | None = None,
) -> dict[tuple[str, int], Snapshot]:
    """:func:`recover_states` without saying which states were rebuilt."""
    return recover_states(backend, producer_key, producer_id, window=window, config=config)[0]


def recover_states(
    backend: KafkaBackend,
    producer_key: str,
    producer_id: int = -1,
    *,
    window: int = STATE_REBUILD_RECORDS,
    config: CheckerConfig | None = None,
) -> tuple[dict[tuple[str, int], Snapshot], list[tuple[str, int]]]:
    """The state of the named producer ``producer_key`` (id ``producer_id``) on every
    partition it wrote: its newest committed state in the state topic, completed by a replay
    of the partition after it (:func:`idempotent.adapters.producer_state.recover_state`), on every
    partition the state topic or the metadata's ``wrote:`` records name. A state that is
    missing, older than the data or unreadable is rebuilt from the partition's last
    ``window`` offsets, or the restart refused; it is never taken as empty. A state key the
    metadata does not record yet is recorded.

    Read after the producer's writer was opened (fenced), so no earlier instance can commit
    more.

    Returns:
        The states, and the partitions whose state should be stored again: rebuilt, completed
        by the replay, or read more than half the window past.

    Raises:
        BackendUnavailableError: the state topic, the metadata or a partition could not be read.
        ProducerStateLostError: a state that cannot be rebuilt within the window (the
            message names the partition and what to do); nothing was changed.
    """
    name = backend.prefix + STATE_TOPIC
    prefix = f"{producer_key}\0".encode()
    found: dict[tuple[str, int], bytes | None] = {}
    with backend._lock, map_errors(f"read the state of {producer_key!r}"):
        for message in backend._read_range(name, state_partition(producer_key), 0, None, settled=True):
            key = message.key() or b""
            if not key.startswith(prefix):
                continue
            _, topic, partition = key.decode().split("\0")
            found[(topic, int(partition))] = message.value()
    recorded = backend.metadata.written_by(producer_key)
    backend.metadata.record_written(producer_key, sorted(set(found) - recorded))
    counts: dict[str, int | None] = {}
    states: dict[tuple[str, int], Snapshot] = {}
    changed: list[tuple[str, int]] = []
    now = time.time()
    for topic, partition in sorted(recorded | set(found)):
        stored, trouble = _decode_state(found.get((topic, partition)), config, now)
        if topic not in counts:
            counts[topic] = backend.describe_topic(topic)
        count = counts[topic]
        if count is None or partition >= count:  # the topic is gone: nothing there to resend against
            if stored is not None:
                states[(topic, partition)] = stored
            continue
        # a state to rebuild is read to the partition's high watermark: the producer's own
        # batches may sit behind another producer's transaction still open there
        settled = trouble is not None
        state = recover_state(
            producer_key,
            producer_id,
            topic,
            partition,
            stored,
            trouble,
            backend.bounds(topic, partition, settled=settled),
            window,
            partial(_replay, backend, topic, partition, producer_id, settled),
            config=config,
            now=now,
        )
        if state is not None:
            states[(topic, partition)] = state
            # stored again when rebuilt or completed, and when the replay read more than half
            # the window past it: a later restart then reads from the end it read up to
            if (
                stored is None
                or state.position - stored.position > window // 2
                or _view(state, config, now) != _view(stored, config, now)
            ):
                changed.append((topic, partition))
        if trouble is not None and state is not None:
            _LOG.warning(
                "kafka: the state of producer %r on %s[%d] was %s; rebuilt from the partition's records",
                producer_key,
                topic,
                partition,
                trouble,
            )
    return states, changed


def _view(snapshot: Snapshot, config: CheckerConfig | None, now: float) -> dict[int, tuple[object, ...]]:
    """What a state holds for its producers (not where it was taken)."""
    return PartitionChecker.restore(snapshot, config, now=now).state()


def _replay(
    backend: KafkaBackend, topic: str, partition: int, producer_id: int, settled: bool, start: int
) -> list[StoredBatch]:
    return list(backend.stored_batches(topic, partition, start, producer_id, settled=settled))


def _decode_state(value: bytes | None, config: CheckerConfig | None, now: float) -> tuple[Snapshot | None, str | None]:
    """A stored state record's snapshot, or None and why (``missing``, ``unreadable: ...``)."""
    if value is None:
        return None, "missing"
    try:
        snapshot = unpack_snapshot(value)
        PartitionChecker.restore(snapshot, config, now=now)  # it decodes
    except CorruptDataError as exc:
        return None, f"unreadable ({exc})"
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
        return None, f"unreadable ({exc!r})"
    return snapshot, None


class KafkaProducerLog:
    """One producer's transactional producer: writes groups of its batches, one transaction
    each. Not thread-safe: its producer's sender thread is its only user.

    The transactions go through :class:`~idempotent.adapters.kafka.txn.TransactionalProducer`, which
    applies librdkafka's rules when a commit fails; a commit whose outcome it cannot tell at
    once leaves this writer :attr:`unresolved` until :meth:`resolve`.

    Args:
        backend: the process's shared Kafka backend (clients, metadata, reads).
        producer_key: the producer's name, or its id for an anonymous producer; names the
            ``transactional.id``, so opening fences the producer's earlier instances.
        named: whether the producer is named (it keeps states, see the module docstring).
        settings: librdkafka settings of :data:`TUNABLE` chosen by the user.
        takeover: for a named producer, whether a newer instance of it exists (its registry
            record, written before that instance fenced): told apart from a fence by Kafka's
            coordinator (a transaction left open past ``transaction.timeout.ms``), which is
            retriable (:class:`~idempotent.adapters.kafka.txn.TransactionalProducer`). None: every fence
            of a named producer is a takeover. An anonymous producer's ``transactional.id``
            is its own for ever, so every fence of it is the coordinator's.

    Raises:
        ConfigError: a setting the cluster or librdkafka refuses.
        BackendUnavailableError: the cluster did not answer within the backend's timeout.
    """

    #: the largest batch (as ``Record.size`` counts) and record count this writer takes
    max_batch_bytes = MAX_BATCH_BYTES
    max_batch_records = MAX_BATCH_RECORDS
    #: batches of one partition a group (one transaction) may hold
    max_in_flight = MAX_IN_FLIGHT

    def __init__(
        self,
        backend: KafkaBackend,
        producer_key: str,
        named: bool,
        settings: dict[str, Any] | None = None,
        takeover: Callable[[], bool] | None = None,
    ) -> None:
        self.backend = backend
        self.producer_key = producer_key
        self.named = named
        transactional_id = f"{backend.prefix}idempotent-{'n' if named else 'p'}-{producer_key}"
        self.transactional_id = transactional_id
        if named:
            ensure_state_topic(backend)
        config = dict(backend.client_config)
        config.update(settings or {})
        config.update(
            {
                "transactional.id": transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                # batches wait for the commit, which sends each partition's batch as one
                # message set (see the module docstring)
                "linger.ms": 30_000,
                "message.timeout.ms": 50_000,
                "batch.size": MESSAGE_SET_BYTES,
                "batch.num.messages": MESSAGE_SET_RECORDS,
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 2_097_151,
            }
        )
        config.setdefault("transaction.timeout.ms", 60_000)
        plugin = native_plugin()  # the compiled write path (adapters/kafka/bulk.py), when built
        if plugin is not None:
            paths = config.get("plugin.library.paths")
            config["plugin.library.paths"] = f"{paths};{plugin}" if paths else plugin
        # librdkafka refuses a message timeout longer than the transaction's, and a linger
        # longer than the message timeout (a short transaction.timeout.ms shortens both)
        config["message.timeout.ms"] = min(50_000, int(config["transaction.timeout.ms"]))
        config["linger.ms"] = min(30_000, config["message.timeout.ms"] // 2)
        #: ``(topic, partition, head offset)`` of every batch of a transaction whose commit
        #: ended without saying whether Kafka stored it; :meth:`resolve` settles it
        self.unresolved: list[tuple[str, int, int]] | None = None
        self._late = False
        self._bulk_writer: BulkWriter | None = None
        #: whether the last group went through the compiled path (its write took the
        #: interpreter lock back only once, or twice for a named producer's states)
        self.writes_without_lock = False
        #: the partitions the metadata records this producer writes (``wrote:`` records)
        self._recorded: set[tuple[str, int]] = set()
        #: the client of the application's open transaction (:meth:`begin_transaction`), the
        #: batches written into it with their offsets, and the error that failed it
        self._open: Any = None
        self._open_written: list[tuple[Sequence[tuple[str, int, AppendBatch]], list[int]]] = []
        self._open_failed: ProducerError | None = None
        #: heads of the application's transaction whose commit had no definite answer
        self._open_doubt: list[tuple[str, int, int]] | None = None
        #: the positions that transaction's commit recorded
        self._open_positions: bytes | None = None
        self._txn = TransactionalProducer(
            config, backend.timeout, f"the producer {transactional_id!r}", takeover if named else _never
        )

    def load_states(
        self,
        producer_id: int = -1,
        *,
        window: int = STATE_REBUILD_RECORDS,
        config: CheckerConfig | None = None,
    ) -> dict[tuple[str, int], Snapshot]:
        """The producer's committed state on each partition it wrote (none when anonymous),
        recovered as :func:`recover_states` does (``producer_id``: the producer's id, whose
        batches a replay applies). The states it rebuilt or completed are stored again at
        once, in a transaction of their own.

        Raises:
            BackendUnavailableError: the state topic or a partition could not be read.
            ProducerStateLostError: a state that cannot be rebuilt within ``window``.
        """
        if not self.named:
            return {}
        states, changed = recover_states(self.backend, self.producer_key, producer_id, window=window, config=config)
        self._recorded.update(self.backend.metadata.written_by(self.producer_key))
        if changed:
            self._store_states({tp: states[tp] for tp in changed})
        return states

    def _store_states(self, states: dict[tuple[str, int], Snapshot]) -> None:
        """Store rebuilt states at once, in a transaction of their own (a later restart need
        not rebuild them again). A failure is logged: the states are stored with the next
        write anyway.

        Raises:
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        name = self.backend.prefix + STATE_TOPIC
        key = self.producer_key
        try:
            with self._txn.transaction() as producer:
                for (topic, partition), snapshot in states.items():
                    producer.produce(
                        name,
                        key=state_key(key, topic, partition),
                        value=pack_snapshot(snapshot),
                        partition=state_partition(key),
                    )
        except OwnershipLostError:
            raise
        except ProducerError as exc:
            _LOG.warning("kafka: the rebuilt states of %r were not stored (stored with its next write): %s", key, exc)

    def close(self) -> None:
        """Drop the transactional producer (an open transaction is ended by Kafka)."""
        self._txn.close()

    def write(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        states: Callable[[list[int]], Sequence[tuple[str, int, Snapshot]]] | None = None,
    ) -> list[int]:
        """Store ``batches`` (in sequence order per partition) in one transaction, with, for a
        named producer, the states ``states(base offsets)`` returns (``(topic, partition,
        snapshot)``: its checker state on each partition once these batches are stored).

        Returns:
            Each batch's base offset, in order.

        Raises:
            BackendUnavailableError: the transaction was aborted (nothing stored), or its
                commit got no definite answer (then :attr:`unresolved` is set: call
                :meth:`resolve` before writing again).
            OwnershipLostError: a newer instance of this producer fenced this one.
            EntryTooLargeError, InvalidTopicError, ConfigError: as the shared writer.
        """
        if self._open is not None:  # the application's open transaction
            return self._write_open(batches)
        if self.unresolved is not None:
            raise BackendUnavailableError(f"kafka: {self.transactional_id!r}: a commit in doubt is not settled yet")
        if self.named:  # a partition written for the first time is recorded before its first batch
            fresh = {(topic, partition) for topic, partition, _ in batches} - self._recorded
            if fresh:
                self.backend.metadata.record_written(self.producer_key, sorted(fresh))
                self._recorded |= fresh
        offsets = [-1] * len(batches)
        errors: list[Any] = []
        committing = False
        self._late = False
        try:
            with self._txn.transaction(self._committed_late) as producer:
                # the compiled path commits in the same call, unless a named producer's
                # states (which name the offsets) must be produced first
                commit = states is None or not self.named
                attached = native_attached(producer)
                written = attached and self._write_native(producer, batches, offsets, commit)
                self.writes_without_lock = attached
                if written and commit:
                    committing = True
                if not written:
                    self._produce_rounds(producer, batches, offsets, errors)
                if states is not None and self.named:
                    name = self.backend.prefix + STATE_TOPIC
                    key = self.producer_key
                    for topic, partition, snapshot in states(offsets):
                        producer.produce(
                            name,
                            key=state_key(key, topic, partition),
                            value=pack_snapshot(snapshot),
                            partition=state_partition(key),
                        )
                committing = True
        except ProducerError:
            if committing and self._txn.state in (TxnState.IN_DOUBT, TxnState.REPLACE):
                # every record was acknowledged: Kafka may have committed them
                self.unresolved = [(t, p, offset) for (t, p, _), offset in zip(batches, offsets, strict=True)]
            raise
        self._note(batches, offsets)
        return offsets

    def _produce_rounds(
        self, producer: Any, batches: Sequence[tuple[str, int, AppendBatch]], offsets: list[int], errors: list[Any]
    ) -> None:
        """Produce ``batches`` into the open transaction, round by round (see the module
        docstring), and place each batch's base offset in ``offsets``."""
        for round_ in _runs(batches):
            ends: list[tuple[list[int], list[int], list[int]]] = []
            for run in round_:
                first: list[int] = []
                last: list[int] = []
                ends.append((run, first, last))
                for position, index in enumerate(run):
                    topic, partition, batch = batches[index]
                    self._produce(
                        producer,
                        topic,
                        partition,
                        batch,
                        _report(first, errors) if position == 0 else None,
                        _report(last, errors) if position == len(run) - 1 else None,
                    )
            # each round acknowledged before the next is handed over: every run goes
            # in a message set of its own; and the states name the batches' offsets
            if producer.flush(self.backend.timeout):
                raise BackendUnavailableError(f"kafka: {self.transactional_id!r}: records not acknowledged")
            self._place(batches, ends, errors, offsets)

    # -- the application's transactions ------------------------------------------------------

    @property
    def in_transaction(self) -> bool:
        """Whether an application's transaction is open (:meth:`begin_transaction`)."""
        return self._open is not None

    def begin_transaction(self) -> None:
        """Open an application's transaction: every :meth:`write` until
        :meth:`commit_transaction` or :meth:`abort_transaction` goes into it.

        Raises:
            TransactionStateError: one is open already, or a commit is in doubt.
            OwnershipLostError: a newer instance of this producer fenced this one.
            BackendUnavailableError: Kafka could not be reached (nothing opened).
        """
        if self._open is not None or self._open_doubt is not None:
            raise TransactionStateError(f"kafka: {self.transactional_id!r}: a transaction is open already")
        if self.unresolved is not None:
            raise BackendUnavailableError(f"kafka: {self.transactional_id!r}: a commit in doubt is not settled yet")
        self._open = self._txn.begin()
        self._open_written = []
        self._open_failed = None

    def _write_open(self, batches: Sequence[tuple[str, int, AppendBatch]]) -> list[int]:
        """:meth:`write` inside the application's open transaction: produced and acknowledged,
        committed with it. A failure fails the transaction (it can only be aborted).

        Raises:
            TransactionAbortableError: this write or an earlier one of the transaction failed.
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        if self._open_failed is not None:
            raise TransactionAbortableError(f"the transaction failed earlier and must be aborted: {self._open_failed}")
        if self.named:
            fresh = {(topic, partition) for topic, partition, _ in batches} - self._recorded
            if fresh:
                self.backend.metadata.record_written(self.producer_key, sorted(fresh))
                self._recorded |= fresh
        offsets = [-1] * len(batches)
        errors: list[Any] = []
        try:
            self._produce_rounds(self._open, batches, offsets, errors)
        except OwnershipLostError:
            raise
        except ProducerError as exc:
            self._open_failed = exc
            raise TransactionAbortableError(f"a write of the transaction failed, abort it: {exc}") from exc
        except KafkaException as exc:
            self._open_failed = translate(exc.args[0] if exc.args else None, f"produce to {self.transactional_id!r}")
            if self._txn.fenced is not None:
                raise self._txn.fenced from exc
            raise TransactionAbortableError(f"a write of the transaction failed, abort it: {exc}") from exc
        self._open_written.append((batches, offsets))
        return offsets

    def commit_transaction(self, states: Sequence[tuple[str, int, Snapshot]], positions: bytes | None) -> None:
        """Commit the application's transaction with, for a named producer, its ``states``
        on the partitions it wrote and the application's encoded ``positions`` (None: the
        last committed ones stay). A commit in doubt is resumed by calling it again.

        Raises:
            TransactionStateError: no transaction open.
            TransactionAbortableError: the transaction failed or was aborted by Kafka (nothing
                of it is stored); call :meth:`abort_transaction`.
            BackendUnavailableError: the commit's outcome is not known yet; call again.
            OwnershipLostError: a newer instance of this producer fenced this one (nothing of
                the transaction is stored).
        """
        if self._open_doubt is not None:
            self._settle_open()
            return
        if self._open is None:
            raise TransactionStateError(f"kafka: {self.transactional_id!r}: no transaction open to commit")
        if self._open_failed is not None:
            raise TransactionAbortableError(f"the transaction failed and must be aborted: {self._open_failed}")
        if self.named:
            name = self.backend.prefix + STATE_TOPIC
            key = self.producer_key
            try:
                for topic, partition, snapshot in states:
                    self._open.produce(
                        name,
                        key=state_key(key, topic, partition),
                        value=pack_snapshot(snapshot),
                        partition=state_partition(key),
                    )
                if positions is not None:
                    self._open.produce(name, key=positions_key(key), value=positions, partition=state_partition(key))
            except (KafkaException, BufferError) as exc:
                self._open_failed = BackendUnavailableError(f"kafka: the transaction's states were refused: {exc}")
                raise TransactionAbortableError(str(self._open_failed)) from exc
        self._late = False
        self._open_positions = positions
        try:
            self._txn.commit_open(self._committed_late)
        except OwnershipLostError:
            self._open, self._open_written = None, []
            raise
        except ProducerError as exc:
            if self._txn.state is TxnState.READY:  # aborted: nothing stored
                self._open_failed = exc
                raise TransactionAbortableError(f"the commit failed and the transaction was aborted: {exc}") from exc
            self._open = None
            self._open_doubt = [
                (t, p, o)
                for written, offsets in self._open_written
                for (t, p, _), o in zip(written, offsets, strict=True)
            ]
            self._settle_open()
            return
        self._committed_open()

    def _settle_open(self) -> None:
        """Settle the application's transaction whose commit was in doubt.

        Raises:
            BackendUnavailableError: not settled yet (call again).
            TransactionAbortableError: it turned out aborted.
            OwnershipLostError: fenced by a newer instance.
        """
        heads = self._open_doubt
        assert heads is not None
        self._txn.settle()
        if heads:
            committed = self._late or self._visible(*heads[0])
        else:  # no records: its positions tell (the same as before: either outcome is the same)
            committed = self._late or self._open_positions is None or self.committed_positions() == self._open_positions
        self._open_doubt = None
        if not committed:
            self._open_written = []
            self._open_failed = BackendUnavailableError("the transaction's commit was in doubt and it was aborted")
            self._open = _ABORTED
            raise TransactionAbortableError(
                "the commit was in doubt, and Kafka aborted the transaction: nothing of it is stored"
            )
        self._committed_open()

    def _committed_open(self) -> None:
        for batches, offsets in self._open_written:
            self._note(batches, offsets)
        self._open, self._open_written, self._open_failed = None, [], None

    def send_offsets(self, offsets: Any, group_metadata: Any, timeout: float) -> None:
        """Commit a consumer group's ``offsets`` with the application's open transaction,
        through this writer's transactional client (librdkafka's
        ``send_offsets_to_transaction``, to the group's coordinator).

        Raises:
            TransactionStateError: no transaction open.
            TransactionAbortableError: Kafka refused them (the transaction can only be aborted).
            TransactionTimedOutError: no answer within ``timeout`` (call again).
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        from idempotent.errors import TransactionTimedOutError

        if self._open is None:
            raise TransactionStateError(f"kafka: {self.transactional_id!r}: no transaction open to send offsets to")
        if self._open_failed is not None:
            raise TransactionAbortableError(f"the transaction failed and must be aborted: {self._open_failed}")
        try:
            self._open.send_offsets_to_transaction(offsets, group_metadata, timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in FENCED_CODES:
                if self._takeover_now():
                    raise OwnershipLostError(f"kafka: {self.transactional_id!r} was fenced: {error.str()}") from exc
                self._open_failed = BackendUnavailableError(f"fenced by Kafka's coordinator: {error.str()}")
                raise TransactionAbortableError(f"the transaction was aborted by Kafka: {error.str()}") from exc
            if isinstance(error, KafkaError) and error.txn_requires_abort():
                self._open_failed = translate(error, "send offsets")
                raise TransactionAbortableError(
                    f"the offsets were refused, abort the transaction: {error.str()}"
                ) from exc
            if isinstance(error, KafkaError) and error.retriable() and not error.fatal():
                raise TransactionTimedOutError(f"the offsets got no answer, send them again: {error.str()}") from exc
            raise translate(error, f"send offsets of {self.transactional_id!r}") from exc

    def _takeover_now(self) -> bool:
        """Whether a fence is a takeover (see :class:`KafkaProducerLog`'s ``takeover``)."""
        check = self._txn._takeover
        return check is None or check()

    def abort_transaction(self) -> None:
        """Abort the application's transaction: nothing of it is stored, and this writer
        is ready for the next one.

        Raises:
            TransactionStateError: no transaction open.
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        if self._open is None and self._open_doubt is None:
            raise TransactionStateError(f"kafka: {self.transactional_id!r}: no transaction open to abort")
        self._open_doubt = None
        was, self._open, self._open_written, self._open_failed = self._open, None, [], None
        if was is not _ABORTED:
            self._txn.abort_open()

    def committed_positions(self) -> bytes | None:
        """The encoded positions the last committed application transaction recorded (read
        from the state topic), or None.

        Raises:
            BackendUnavailableError: the state topic could not be read.
        """
        if not self.named:
            return None
        name = self.backend.prefix + STATE_TOPIC
        wanted = positions_key(self.producer_key)
        found: bytes | None = None
        with self.backend._lock, map_errors(f"read the positions of {self.producer_key!r}"):
            for message in self.backend._read_range(name, state_partition(self.producer_key), 0, None, settled=True):
                if message.key() == wanted:
                    found = message.value()
        return found

    def _write_native(
        self, producer: Any, batches: Sequence[tuple[str, int, AppendBatch]], offsets: list[int], commit: bool
    ) -> bool:
        """Write the group through the compiled path (:func:`idempotent.adapters.kafka.bulk.write_group`),
        committing when ``commit`` (the answer handed to the transaction, which applies the
        commit's rules); fill ``offsets``.

        Returns:
            False, with nothing produced, when a value, key or header is of a type the
            compiled path does not take (write it the pure-Python way).

        Raises:
            BackendUnavailableError: a record was refused or not acknowledged, or a run was
                split; the transaction is aborted by :meth:`TransactionalProducer.transaction`.
            KafkaException: the client refused a batch's head (translated as in the
                pure-Python path).
        """
        prefix = self.backend.prefix
        columns = []
        for topic, partition, batch in batches:
            records = batch.records
            count = len(records)
            timed = records_timed(records)
            identity = identity_headers(batch.header, count, timed)
            if type(records) is RecordColumns:
                values, keys, times, headers = records.values, records.keys, records.timestamps, None
            else:
                values = [record.value for record in records]
                keys = [record.key for record in records]
                times = [record.timestamp for record in records] if timed else None
                headers = (
                    [list(record.headers) or None for record in records]
                    if any(record.headers for record in records)
                    else None
                )
            name = kafka_topic_name(topic, prefix).encode()
            columns.append((name, partition, identity, int(batch.timestamp * 1000), values, keys, times, headers))
        try:
            placed, failure, answer = write_group(producer, columns, _runs(batches), self.backend.timeout, commit)
        except TypeError:
            return False
        if failure is not None:
            self._native_failure(batches, failure)
        offsets[:] = placed
        if commit:
            assert not isinstance(answer, bool)
            self._txn.committed(None if answer is None else _commit_refusal(answer))
        return True

    def _native_failure(self, batches: Sequence[tuple[str, int, AppendBatch]], failure: tuple[Any, ...]) -> None:
        """Raise what the pure-Python path raises for the same failure (see :meth:`_place`)."""
        what = failure[0]
        if what == "refused":
            topic, partition, _ = batches[failure[1]]
            if failure[2] == -1:
                raise BackendUnavailableError(f"kafka: the client refused records for {topic}[{partition}]")
            raise KafkaException(KafkaError(failure[2]))
        if what == "unacked":
            raise BackendUnavailableError(f"kafka: {self.transactional_id!r}: records not acknowledged")
        if what == "failed":
            raise translate(KafkaError(failure[1]), f"deliver a batch of {self.transactional_id!r}", delivery=True)
        topic, partition, _ = batches[failure[1]]
        if what == "missing":
            raise BackendUnavailableError(f"kafka: {topic}[{partition}]: a record was not acknowledged")
        _, _, count, records, first, last = failure
        _LOG.warning(
            "kafka: %d batches of %d records for %s[%d] were split (offsets %d..%d); their transaction is aborted",
            count,
            records,
            topic,
            partition,
            first,
            last,
        )
        raise BackendUnavailableError(
            f"kafka: the batches for {topic}[{partition}] were split by other producers' records"
        )

    def _committed_late(self) -> None:
        self._late = True

    def resolve(self) -> list[int] | None:
        """Settle the transaction whose commit had no definite answer (:attr:`unresolved`):
        the transactional producer resumes the commit or replaces itself (which fences the
        old instance and lets Kafka finish or abort the transaction), then the outcome is
        taken from the commit or read back from the log.

        Returns:
            The base offsets of its batches, in order, when Kafka committed it; None when it
            was aborted (nothing of it is stored).

        Raises:
            BackendUnavailableError: Kafka could not be reached; :attr:`unresolved` is kept.
            OwnershipLostError: a newer instance of this producer fenced this one.
        """
        heads = self.unresolved
        if heads is None:
            return None
        self._txn.settle()
        committed = self._late or (bool(heads) and self._visible(*heads[0]))
        self.unresolved = None
        self._late = False
        return [offset for _, _, offset in heads] if committed else None

    def _visible(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the record at ``offset`` is visible to ``read_committed`` readers."""
        with self.backend._lock, map_errors(f"resolve a transaction of {self.transactional_id!r}"):
            name = kafka_topic_name(topic, self.backend.prefix)
            for message in self.backend._read_range(name, partition, offset, None, 1):
                return bool(message.offset() == offset)
        return False

    def _note(self, batches: Sequence[tuple[str, int, AppendBatch]], offsets: list[int]) -> None:
        """Tell the shared backend what was committed: reads wait for it, and know its heads."""
        for (topic, partition, batch), offset in zip(batches, offsets, strict=True):
            name = kafka_topic_name(topic, self.backend.prefix)
            self.backend.note_written(name, partition, offset + len(batch.records))
            header = batch.header
            if header is not None:
                head = BatchHead(
                    offset,
                    len(batch.records),
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    int(batch.timestamp * 1000) / 1000,
                    records_timed(batch.records),
                )
                self.backend.note_heads(name, partition, [head])

    def _place(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        ends: list[tuple[list[int], list[int], list[int]]],
        errors: list[Any],
        offsets: list[int],
    ) -> None:
        """Set the base offset of every batch of a round's runs (``(indexes, first, last)``:
        the delivered offsets of each run's first and last record), once each run is proven
        one piece of consecutive offsets (before the commit).

        Raises:
            BackendUnavailableError: a record was refused or not acknowledged, or a run was
                split by another producer's records; the transaction is aborted.
        """
        if errors:  # the cause, rather than librdkafka's "failed with another record"
            cause = next((e for e in errors if refused_record(e)), errors[0])
            raise translate(cause, f"deliver a batch of {self.transactional_id!r}", delivery=True)
        for run, first, last in ends:
            topic, partition, _ = batches[run[0]]
            if not first or not last:
                raise BackendUnavailableError(f"kafka: {topic}[{partition}]: a record was not acknowledged")
            offset = first[0]
            for index in run:
                offsets[index] = offset
                offset += len(batches[index][2].records)
            if last[0] != offset - 1:
                _LOG.warning(
                    "kafka: %d batches of %d records for %s[%d] were split (offsets %d..%d); "
                    "their transaction is aborted",
                    len(run),
                    offset - first[0],
                    topic,
                    partition,
                    first[0],
                    last[0],
                )
                raise BackendUnavailableError(
                    f"kafka: the batches for {topic}[{partition}] were split by other producers' records"
                )

    def _produce(
        self,
        producer: Any,
        topic: str,
        partition: int,
        batch: AppendBatch,
        first: Callable[[Any, Any], None] | None,
        last: Callable[[Any, Any], None] | None,
    ) -> None:
        """Hand one batch to the open transaction: the head (identity headers, its own time or
        the batch's) with ``first`` as its delivery report, the rest in bulk with ``last`` on
        the final record (None: no report; a batch inside a run has neither). Records with
        headers or a time of their own are produced one by one (the bulk call takes neither)."""
        name = kafka_topic_name(topic, self.backend.prefix)
        records = batch.records
        header = batch.header
        count = len(records)
        timestamp = int(batch.timestamp * 1000)
        timed = records_timed(records)
        identity = identity_headers(header, count, timed)
        head = records[0]
        producer.produce(
            name,
            value=head.value,
            key=head.key,
            partition=partition,
            headers=[*head.headers, *identity] if head.headers else identity,
            timestamp=timestamp if head.timestamp is None else head.timestamp,
            on_delivery=first if count > 1 else _both(first, last),
        )
        if count == 1:
            return
        columns = None if timed else bulk_columns(records[1:])  # the bulk calls take no time or headers
        if columns is None:
            for index, record in enumerate(records[1:], 1):
                producer.produce(
                    name,
                    value=record.value,
                    key=record.key,
                    partition=partition,
                    headers=list(record.headers) or None,
                    timestamp=timestamp if record.timestamp is None else record.timestamp,
                    on_delivery=last if index == count - 1 else None,
                )
            return
        values, keys = columns
        if last is not None:  # the last record reports the batch's end; the others go in bulk
            values, keys = values[:-1], None if keys is None else keys[:-1]
        if values:
            bulk = self._bulk_writer = writer_for(self._bulk_writer, producer)
            queued, refused = bulk.produce(name, partition, values, keys)
            if queued != len(values):
                raise BackendUnavailableError(
                    f"kafka: the client refused {len(values) - queued} of {len(values)} records for "
                    f"{topic}[{partition}]: {refused}"
                )
        if last is not None:
            tail = records[-1]
            producer.produce(name, value=tail.value, key=tail.key, partition=partition, on_delivery=last)


def open_producer_log(
    backend: Any,
    producer_key: str,
    named: bool,
    settings: dict[str, Any] | None = None,
    takeover: Callable[[], bool] | None = None,
) -> KafkaProducerLog:
    """The writer of one producer over the process's shared :class:`KafkaBackend`; see
    :class:`KafkaProducerLog` (what it raises)."""
    if not isinstance(backend, KafkaBackend):
        raise ConfigError(f"a Kafka producer log needs a KafkaBackend, not {type(backend).__name__}")
    return KafkaProducerLog(backend, producer_key, named, settings, takeover)


#: what an application's transaction is while it stands aborted by Kafka, until the
#: application's own ``abort_transaction``
_ABORTED: Any = object()


def _never() -> bool:
    """An anonymous producer's takeover check: nobody else ever holds its transactional.id."""
    return False


def _runs(batches: Sequence[tuple[str, int, AppendBatch]]) -> list[list[list[int]]]:
    """The indexes of ``batches`` in rounds of runs: a run is consecutive batches of one
    partition (in the given order) that fit one message set together, counted generously
    (:data:`RUN_FRAMING_BYTES` per record beyond the measured size; a batch without a measured
    size runs alone); a round holds the next run of each partition, in order of first index."""
    runs: dict[tuple[str, int], list[list[int]]] = {}
    room: dict[tuple[str, int], tuple[int, int]] = {}  # the last run's records and bytes
    for index, (topic, partition, batch) in enumerate(batches):
        key = (topic, partition)
        count = len(batch.records)
        size = MESSAGE_SET_BYTES if batch.size is None else batch.size + RUN_FRAMING_BYTES * count
        held = runs.setdefault(key, [])
        if held:
            records, bytes_ = room[key]
            if records + count <= MESSAGE_SET_RECORDS and bytes_ + size <= MESSAGE_SET_BYTES - RUN_SLACK_BYTES:
                held[-1].append(index)
                room[key] = (records + count, bytes_ + size)
                continue
        held.append([index])
        room[key] = (count, size)
    rounds: list[list[list[int]]] = []
    for held in runs.values():
        for nth, run in enumerate(held):
            if nth == len(rounds):
                rounds.append([])
            rounds[nth].append(run)
    for round_ in rounds:
        round_.sort(key=lambda run: run[0])
    return rounds


def _commit_refusal(answer: tuple[Any, ...]) -> KafkaException:
    """The ``KafkaException`` ``commit_transaction`` raises for the compiled path's answer
    ``(code, name, text, fatal, retriable, txn_requires_abort)``."""
    code, _, text, fatal, retriable, abortable = answer
    return KafkaException(
        KafkaError(code, text, fatal=bool(fatal), retriable=bool(retriable), txn_requires_abort=bool(abortable))
    )


def _report(slot: list[int], errors: list[Any]) -> Callable[[Any, Any], None]:
    def callback(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            slot.append(msg.offset())

    return callback


def _both(
    first: Callable[[Any, Any], None] | None, last: Callable[[Any, Any], None] | None
) -> Callable[[Any, Any], None] | None:
    """One delivery report for a record that is both a run's first and its last (either
    may be None)."""
    if first is None or last is None:
        return first or last

    def callback(err: Any, msg: Any) -> None:
        first(err, msg)
        last(err, msg)

    return callback


__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "MAX_IN_FLIGHT",
    "STATE_TOPIC",
    "KafkaProducerLog",
    "ensure_state_topic",
    "load_states",
    "open_producer_log",
    "recover_states",
]
