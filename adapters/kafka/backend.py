"""Apache Kafka log backend (confluent-kafka).

``kafka://host:port[,host:port...]`` with options passed as keyword arguments to
:func:`idempotent.connect` (or :class:`KafkaBackend`); ``timeout``, ``prefix``,
``replication_factor``, ``min_insync_replicas`` and ``connect_timeout`` may also be given as
URL query parameters (``kafka://host:9092?timeout=10``), for tools that only get a URL such as
``idempotent broker --backend``; keywords win:

* ``client_config``: extra librdkafka settings for every client (security, timeouts,
  ``security.protocol``, ``sasl.*``, ``ssl.*``, ...);
* ``replication_factor`` and ``min_insync_replicas`` (default: the brokers'
  ``default.replication.factor`` and ``min.insync.replicas``) and ``topic_config`` for topics
  this backend creates, its internal topics too; an internal topic found with fewer replicas
  than the brokers' default or than the data it serves is a WARNING (see
  :mod:`idempotent.adapters.kafka.replicas`);
* ``prefix`` (default ``""``): prepended to every Kafka topic name this backend uses;
* ``timeout`` (default 30 s): for admin calls, flushes and transaction commits (a commit that
  takes longer is *in doubt*: settled before the partition is written or read again, see
  :mod:`idempotent.adapters.kafka.txn`);
* ``connect_timeout`` (default 10 s): how long to try to reach a bootstrap address at all
  before failing with :class:`BackendUnavailableError` (see :mod:`idempotent.adapters.reach`);
* ``read_only`` (default False): never take a partition over (for ``tail`` and ``stats``
  next to a running broker); reads see committed data only.

How the model maps onto Kafka (see ``docs/backends.md``):

* A topic ``a/b`` is the Kafka topic ``a.b`` (``/`` is not allowed in Kafka names); every
  record is an ordinary Kafka message with its key, value and user headers. The first record
  of a batch (its head) also carries the batch's identity, headers ``idem.pid``,
  ``idem.epoch``, ``idem.seq`` and ``idem.count`` (ASCII decimal), and its timestamp; the
  others carry nothing of ours and go to Kafka in bulk. Reads give each record its head's
  identity and timestamp (:mod:`idempotent.adapters.kafka.heads`). Plain consumers read values, keys and
  user headers unchanged.
* Appends to a partition go through one **transactional producer per partition** whose
  ``transactional.id`` names the partition. Its ``init_transactions`` fences every earlier
  owner (another broker, or this one before a restart) and aborts its open transaction, so
  a stale owner can no longer write. Queued appends are committed together (group commit);
  the records of one batch get consecutive offsets.
* Snapshots go to the compacted topic ``__idempotent_snapshots`` inside the same transaction
  as the batch they accompany. Topics, producer records, settings and producer-id blocks go to
  the compacted topic ``__idempotent_meta``; an id block's start is the sum of the sizes of
  the blocks before it in that topic's log order, so concurrent brokers never overlap.
* Readers use ``isolation.level=read_committed``: aborted writes of a fenced owner are never
  read or replayed.

Every confluent-kafka error is translated in one place, :mod:`idempotent.adapters.kafka.errors` (the
mirror's Kafka source uses it too). The partition writer is :mod:`idempotent.adapters.kafka.writer`;
the metadata half is the store shared with Pulsar (:mod:`idempotent.adapters.metadata`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Sequence as Seq
from concurrent.futures import Future
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs

from idempotent.adapters.kafka.heads import IDENTITY_HEADERS, BatchHead, HeadIndex
from idempotent.adapters.kafka.replicas import (
    BROKER_DEFAULT,
    ReplicaCheck,
    broker_default_replicas,
    cluster_brokers,
    describe_replicas,
    new_topic,
)
from idempotent.adapters.kafka.replicas import replica_options as _replica_options
from idempotent.adapters.kafka.writer import PartitionWriter
from idempotent.adapters.meta import TopicOrigin, pack_snapshot, unpack_snapshot
from idempotent.adapters.metadata import CompactedMetadataStore, MetadataDelegate
from idempotent.adapters.reach import DEFAULT_CONNECT_TIMEOUT, check_connect_timeout, parse_addresses, wait_reachable
from idempotent.backend import AppendBatch, TopicReplicas
from idempotent.core.records import Snapshot, StoredBatch, StoredRecord
from idempotent.core.types import MAX_BATCH_RECORDS, NO_PRODUCER_ID, Epoch, ProducerId, Sequence
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidTopicError,
    OwnershipLostError,
    ProducerError,
)
from idempotent.runtime.native_logs import LIBRDKAFKA_LOG

try:
    import confluent_kafka
    from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

    from idempotent.adapters.kafka.errors import CLIENT_STATE_CODES, unseen
    from idempotent.adapters.kafka.errors import map_errors as _map_errors
    from idempotent.adapters.kafka.errors import translate as _translate
    from idempotent.adapters.kafka.errors import unseen_partition as _unseen_partition
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the kafka backend needs confluent-kafka: pip install 'idempotent[kafka]'") from exc

_LOG = logging.getLogger("idempotent.adapters.kafka")
META_TOPIC = "__idempotent_meta"
SNAPSHOT_TOPIC = "__idempotent_snapshots"
#: librdkafka's default ``message.max.bytes``: the largest message the client sends
_MESSAGE_MAX_BYTES = 1_000_000
#: room for a record's Kafka framing and ``idem.*`` headers beyond what Record.size counts
_RECORD_MARGIN = 1024
#: what reading the end of a topic just created may answer until its leader serves it
_NO_LEADER_YET = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
#: a read that starts inside a batch looks this many messages back for its head first, then
#: four times as many each time, up to the largest batch
_HEAD_WINDOW = 1024


def kafka_topic_name(topic: str, prefix: str = "") -> str:
    """The Kafka topic a project topic is stored in (``/`` becomes ``.``)."""
    return prefix + topic.replace("/", ".")


def _decimal(headers: dict[str, bytes], name: str, default: int = -1) -> int:
    value = headers.get(name)
    return default if value is None else int(value)


class KafkaBackend(MetadataDelegate):
    """A log in Apache Kafka; see the module docstring. Its metadata half is a
    :class:`~idempotent.adapters.metadata.CompactedMetadataStore` over ``__idempotent_meta``."""

    durable = True

    def __init__(
        self,
        url: str,
        *,
        client_config: dict[str, Any] | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        topic_config: dict[str, str] | None = None,
        prefix: str | None = None,
        timeout: float | None = None,
        read_only: bool = False,
        connect_timeout: float | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "kafka" or not parts.netloc:
            raise ConfigError(f"expected kafka://host:port[,host:port], got {url!r}")
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        unknown = sorted(
            set(query) - {"timeout", "prefix", "replication_factor", "min_insync_replicas", "connect_timeout"}
        )
        if unknown:
            raise ConfigError(
                f"unknown option {unknown[0]!r} in {url!r}; the URL takes timeout, prefix, replication_factor, "
                "min_insync_replicas and connect_timeout"
            )
        self.connect_timeout = check_connect_timeout(
            connect_timeout if connect_timeout is not None else query.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        )
        self.url = url
        self.read_only = read_only
        self.prefix = prefix if prefix is not None else query.get("prefix", "")
        try:
            self.timeout = float(timeout if timeout is not None else query.get("timeout", 30.0))
        except ValueError as exc:
            raise ConfigError(f"bad option in {url!r}: {exc}") from None
        if not self.timeout > 0:
            raise ConfigError(f"timeout must be positive, in {url!r}")
        self.topic_config = dict(topic_config or {})
        #: of the topics this backend creates; None: the brokers' default
        self.replication_factor, self.min_insync_replicas = _replica_options(
            replication_factor if replication_factor is not None else query.get("replication_factor"),
            min_insync_replicas if min_insync_replicas is not None else query.get("min_insync_replicas"),
            self.topic_config,
            repr(url),
        )
        self.replicas = ReplicaCheck(self.replication_factor)
        self.client_config: dict[str, Any] = {"bootstrap.servers": parts.netloc, "logger": LIBRDKAFKA_LOG}
        self.client_config.update(client_config or {})
        # fail an address where nothing listens within connect_timeout (see idempotent.adapters.reach)
        wait_reachable("kafka", parse_addresses(str(self.client_config["bootstrap.servers"])), self.connect_timeout)
        self._lock = threading.RLock()
        self._writers: dict[tuple[str, int], PartitionWriter] = {}
        self.metadata: CompactedMetadataStore[int] = CompactedMetadataStore(
            "kafka", self._put_metas, self._meta_records, self._lock, timeout=self.timeout, writable=not read_only
        )
        self._snapshots: dict[tuple[str, int], Snapshot] = {}
        self._snapshot_position = 0
        self._reader_topics: set[str] = set()
        #: (Kafka topic, partition) -> the offset after the last record this backend's writer
        #: committed there: reads wait for it (see :meth:`_read_range`)
        self._written: dict[tuple[str, int], int] = {}
        #: (Kafka topic, partition) -> the batch heads this backend wrote, replayed or read
        self._heads: dict[tuple[str, int], HeadIndex] = {}
        self._heads_lock = threading.Lock()
        with _map_errors("connect"):
            # a metadata request for one topic must never create it (librdkafka's admin
            # client is a producer, which would ask the broker to auto-create it)
            self._admin = AdminClient({**self.client_config, "allow.auto.create.topics": False})
            self._meta_producer = self._new_meta_producer()
            self._reader = self._consumer()
            self._ensure_internal_topics()
            self.metadata.catch_up()

    # -- clients ---------------------------------------------------------------------------

    def _consumer(self) -> Any:
        return Consumer(
            {
                **self.client_config,
                "group.id": f"idempotent-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                # reads are point queries that end at the partition's end: do not let the
                # broker hold each fetch for the default 500 ms waiting for more data
                "fetch.wait.max.ms": 10,
            }
        )

    def _ensure_internal_topics(self) -> None:
        compacted = {"cleanup.policy": "compact", **self.topic_config}
        wanted = [self.prefix + META_TOPIC, self.prefix + SNAPSHOT_TOPIC]
        existing = self._list_topics()
        missing = [self.new_topic(name, 1, compacted) for name in wanted if name not in existing]
        if missing:
            self.create_kafka_topics(missing)
        self._wait_for_topics(wanted)
        self._wait_for_leaders(wanted)  # (also when another process created them just now)
        if not self.read_only:
            self.check_internal_topics(wanted)

    def new_topic(self, name: str, partitions: int, config: dict[str, str]) -> Any:
        """The request that creates the Kafka topic ``name`` with this backend's replication
        (the brokers' defaults unless ``replication_factor`` / ``min_insync_replicas`` were given)."""
        return new_topic(name, partitions, config, self.replication_factor, self.min_insync_replicas)

    def create_kafka_topics(self, topics: list[Any]) -> set[str]:
        """Create the Kafka topics of the requests ``topics`` (see :meth:`new_topic`); returns
        the names that another client created first (adopted, as they are).

        Raises:
            BackendUnavailableError: the cluster did not answer, or refused a replication
                factor its brokers can give while some are away or in controlled shutdown (a
                rolling restart): the retry succeeds once they are back. Nothing was created
                then.
            ConfigError: the cluster refused the request as a setting (a factor above the
                cluster's size, a bad topic setting).
        """
        raced: set[str] = set()
        for name, future in self._admin.create_topics(topics, request_timeout=self.timeout).items():
            try:
                future.result(self.timeout)
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    raced.add(name)
                    continue
                if error.code() == KafkaError.INVALID_REPLICATION_FACTOR:
                    self._replicas_refused(name, topics, error, exc)
                raise _translate(error, f"create {name}") from exc
        return raced

    def _replicas_refused(self, name: str, topics: list[Any], error: Any, exc: KafkaException) -> None:
        """Kafka refused the replication factor of the topic ``name`` (one of the requests
        ``topics``): when the cluster has as many brokers as it asks for, some are away or in
        controlled shutdown, and the refusal is raised as the outage it is.

        Raises:
            BackendUnavailableError: the cluster's brokers can give the factor (retriable).
        """
        cluster = self._admin.list_topics(timeout=self.timeout)
        brokers = cluster_brokers(cluster)
        asked = next((t.replication_factor for t in topics if t.topic == name), BROKER_DEFAULT)
        factor = (
            broker_default_replicas(self._admin, cluster.brokers, self.timeout) if asked == BROKER_DEFAULT else asked
        )
        if factor is not None and factor <= len(brokers):
            raise BackendUnavailableError(
                f"kafka: create {name}: the cluster cannot place {factor} replicas now, while some of its "
                f"{len(brokers)} brokers are away or shutting down ({error.str()}); retriable: it succeeds "
                "once they are back"
            ) from exc

    def check_internal_topics(self, names: list[str], topics: dict[str, Any] | None = None) -> None:
        """Check the replicas of the internal topics ``names``: a WARNING for one with fewer
        than it should have (see :mod:`idempotent.adapters.kafka.replicas`), never an error. ``topics``:
        the cluster's topics when the caller has just listed them. The first check also reads
        the brokers' ``default.replication.factor`` (not known: compared with the rest only).

        Raises:
            KafkaException: the cluster could not be asked for its metadata (translated by the
                caller, as the calls before it).
        """
        if topics is None or not self.replicas.broker_default_known:
            try:
                cluster = self._admin.list_topics(timeout=self.timeout)
            finally:
                self._admin.poll(0)
            topics = dict(cluster.topics) if topics is None else topics
            if not self.replicas.broker_default_known:
                default = broker_default_replicas(self._admin, dict(cluster.brokers), self.timeout)
                self.replicas.note_broker_default(default)
        for name in names:
            if name in topics:
                self.replicas.note_internal(name, topics[name])

    def _wait_for_leaders(self, names: list[str]) -> None:
        """Wait until the end of each of ``names`` (one partition each) can be read. A topic
        just created is in the cluster's metadata before its leader serves it: reading its
        end answers NOT_LEADER_FOR_PARTITION (or LEADER_NOT_AVAILABLE) for a moment.

        Raises:
            KafkaException, BackendUnavailableError: another error, or still no leader after
                the timeout.
        """
        deadline = time.monotonic() + self.timeout
        for name in names:
            while True:
                try:
                    self._end_of(name, 0)
                    break
                except KafkaException as exc:
                    code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
                    if code not in _NO_LEADER_YET or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
                except BackendUnavailableError:  # listed, its leader not elected yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def _list_topics(self) -> dict[str, Any]:
        """The cluster's topics, from the admin client; then hands its queued log lines (an
        admin client has no thread of its own that would) to Python logging."""
        try:
            return dict(self._admin.list_topics(timeout=self.timeout).topics)
        finally:
            self._admin.poll(0)

    def _wait_for_topics(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            topics = self._list_topics()
            if all(n in topics and topics[n].error is None and topics[n].partitions for n in names):
                return
            if time.monotonic() > deadline:
                raise BackendUnavailableError(f"kafka: topics {names} did not become available")
            time.sleep(0.1)

    def note_written(self, kafka_topic: str, partition: int, end: int) -> None:
        """Record that this backend's writer committed records up to (not including) ``end``."""
        key = (kafka_topic, partition)
        if end > self._written.get(key, -1):
            self._written[key] = end

    def note_heads(self, kafka_topic: str, partition: int, heads: Iterable[BatchHead]) -> None:
        """Remember batch heads of a partition (written, replayed or read here)."""
        with self._heads_lock:
            index = self._heads.get((kafka_topic, partition))
            if index is None:
                index = self._heads[(kafka_topic, partition)] = HeadIndex()
            for head in heads:
                index.add(head)

    def _head_of(self, kafka_topic: str, partition: int, offset: int) -> BatchHead | None:
        """The head of the batch that holds the record at ``offset``, if it has one: known
        here, or found by reading back from ``offset`` (the nearest head before it, when its
        count reaches ``offset``). None for a record written without identity, or whose
        head is no longer in the log. Uses the reader: not while a read is under way."""
        with self._heads_lock:
            index = self._heads.get((kafka_topic, partition))
            if index is None:
                index = self._heads[(kafka_topic, partition)] = HeadIndex()
            known = index.covering(offset)
            if known is not None or index.foreign(offset):
                return known
        low, _high = self._watermarks(kafka_topic, partition)
        stop, window = offset, _HEAD_WINDOW
        while stop > low and offset - stop < MAX_BATCH_RECORDS:
            start = max(int(low), stop - window)
            nearest: BatchHead | None = None
            found: list[BatchHead] = []
            for message in self._read_range(kafka_topic, partition, start, stop):
                identity = _identity(message.headers())
                if identity is not None and identity[3] is not None:
                    nearest = BatchHead(
                        message.offset(),
                        identity[3],
                        identity[0],
                        identity[1],
                        identity[2],
                        _seconds(message),
                        identity[4],
                    )
                    found.append(nearest)
            self.note_heads(kafka_topic, partition, found)
            if nearest is not None:
                if nearest.covers(offset):
                    return nearest
                self._note_foreign(kafka_topic, partition, nearest.first_offset + nearest.record_count, offset)
                return None
            stop, window = start, window * 4
        if stop <= low:  # no head before it in the log
            self._note_foreign(kafka_topic, partition, int(low), offset)
        return None

    def _note_foreign(self, kafka_topic: str, partition: int, lo: int, hi: int) -> None:
        with self._heads_lock:
            index = self._heads.get((kafka_topic, partition))
            if index is not None:
                index.note_foreign(lo, hi)

    def _read_range(
        self,
        kafka_topic: str,
        partition: int,
        start: int,
        stop: int | None,
        limit: int | None = None,
        *,
        settled: bool = False,
    ) -> Iterator[Any]:
        """Messages of one partition from ``start`` up to its end (or ``stop``, or ``limit``
        messages), committed only. Holds the backend lock until exhausted: consume it fully.

        Kafka answers ``commit_transaction`` once the commit is decided, and writes the
        partitions' commit markers after that: for a moment a read_committed consumer still
        ends before the records just committed. The end reported then is passed over while
        it is below the end this backend's own writer committed, so a read after an
        acknowledged send sees that send.

        A read_committed consumer also ends at the partition's last stable offset: the first
        record of the oldest transaction still open there, whoever writes it. ``settled``
        reads on to the high watermark as of the call, waiting (up to ``timeout`` without
        progress) for such a transaction to end: a partition shared by several producers (the
        state topic's) then never answers with a record older than one committed before the
        call because another producer's transaction is open below it.

        Raises:
            BackendUnavailableError: nothing arrived for ``timeout`` (with ``settled``: a
                transaction open below the high watermark that long), or the partition has no
                leader now.
        """
        count = 0
        written = self._written.get((kafka_topic, partition), -1)
        if settled:
            written = max(written, self._high_watermark(kafka_topic, partition))
        with self._lock:
            consumer = self._reader
            self._know(kafka_topic)
            consumer.assign([KafkaTopicPartition(kafka_topic, partition, start)])
            try:
                deadline = time.monotonic() + self.timeout
                waiting = False
                while True:
                    # take what is there without waiting; block (for one message) only when
                    # nothing is: consume(n, t) would wait t unless n messages arrive
                    want = 500 if limit is None else max(1, min(500, limit - count))
                    batch = consumer.consume(want, 0)
                    if not batch:
                        one = consumer.poll(0.5)
                        batch = [] if one is None else [one]
                    if not batch and time.monotonic() > deadline:
                        raise BackendUnavailableError(
                            f"kafka: reading {kafka_topic}[{partition}] timed out"
                            + (f" (a transaction is open below offset {written})" if waiting else "")
                        )
                    progress = False
                    for message in batch:
                        error = message.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                if message.offset() < written:  # commit markers not yet written, or settled
                                    if settled and not waiting:
                                        _LOG.info(
                                            "kafka: reading %s[%d] waits for a transaction open at offset %d to end",
                                            kafka_topic,
                                            partition,
                                            message.offset(),
                                        )
                                    waiting = True
                                    continue
                                return
                            if unseen(error):  # missing, or only without a leader now?
                                self._reader_topics.discard(kafka_topic)
                                listed = self._lists_partition(kafka_topic, partition)
                                raise _unseen_partition(error, f"read {kafka_topic}[{partition}]", listed)
                            raise _translate(error, f"read {kafka_topic}[{partition}]")
                        if stop is not None and message.offset() >= stop:
                            return
                        yield message
                        progress = True
                        count += 1
                        if limit is not None and count >= limit:
                            return
                    if progress:
                        deadline = time.monotonic() + self.timeout
            finally:
                consumer.unassign()

    def _know(self, kafka_topic: str) -> None:
        """Make the reader learn ``kafka_topic``'s metadata now (the lock held): a partition
        of a topic it has none for waits for librdkafka's once-a-second topic scan before its
        first fetch, and its watermarks fail at once with ``_UNKNOWN_PARTITION``."""
        if kafka_topic not in self._reader_topics:
            self._reader.list_topics(kafka_topic, timeout=self.timeout)
            self._reader_topics.add(kafka_topic)

    def _high_watermark(self, kafka_topic: str, partition: int) -> int:
        """The offset after a partition's newest record, counting the records of open
        transactions (the reader's own watermarks end at the last stable offset).

        Raises:
            KafkaException: the cluster could not be asked (translated by the caller).
        """
        tp = KafkaTopicPartition(kafka_topic, partition)
        futures = self._admin.list_offsets(
            {tp: OffsetSpec.latest()},  # type: ignore[no-untyped-call]
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=self.timeout,
        )
        return int(next(iter(futures.values())).result().offset)

    def _end_of(self, kafka_topic: str, partition: int) -> int:
        """The end of a partition as the read_committed reader sees it, its last stable offset
        (see :meth:`_watermarks`; :meth:`_high_watermark` counts open transactions too)."""
        return self._watermarks(kafka_topic, partition)[1]

    def _watermarks(self, kafka_topic: str, partition: int) -> tuple[int, int]:
        """The low watermark of a partition and its last stable offset (the high watermark
        unless a transaction is open on it), asked of its leader by the read_committed reader.

        Raises:
            BackendUnavailableError: the partition exists (the cluster lists it) but has no
                leader now: an election, or the broker of its only replica away.
            KafkaException: any other error (translated by the caller, at the edge): a
                partition the cluster does not list answers ``_UNKNOWN_PARTITION``.
        """
        with self._lock:
            self._know(kafka_topic)
            try:
                low, high = self._reader.get_watermark_offsets(
                    KafkaTopicPartition(kafka_topic, partition), timeout=self.timeout, cached=False
                )
            except KafkaException as exc:
                if not unseen(exc):
                    raise
                self._reader_topics.discard(kafka_topic)  # learn its metadata afresh next time
                listed = self._lists_partition(kafka_topic, partition)
                if not listed:
                    raise
                raise _unseen_partition(exc.args[0], f"the end of {kafka_topic}[{partition}]", listed) from exc
        return int(low), int(high)

    def _lists_partition(self, kafka_topic: str, partition: int) -> bool:
        """Whether the cluster's metadata, asked afresh (the admin client), lists
        ``partition`` of ``kafka_topic``, with a leader or without one.

        Raises:
            KafkaException: the cluster could not be asked (translated by the caller).
        """
        try:
            found = self._admin.list_topics(topic=kafka_topic, timeout=self.timeout).topics.get(kafka_topic)
        finally:
            self._admin.poll(0)
        if found is None or not found.partitions:
            return False
        if found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return False
        return partition in found.partitions

    # -- metadata (compacted __idempotent_meta) ---------------------------------------------

    def _meta_records(self, after: int | None) -> Iterator[tuple[str, bytes | None, int]]:
        """The keyed records of the metadata topic after offset ``after`` (the metadata
        store's reads; see :mod:`idempotent.adapters.metadata`)."""
        meta = self.prefix + META_TOPIC
        start = 0 if after is None else after + 1
        with _map_errors("read the metadata"):
            if start >= self._end_of(meta, 0):
                return
            for message in self._read_range(meta, 0, start, None):
                yield (message.key() or b"").decode(), message.value(), message.offset()

    def _put_metas(self, items: Seq[tuple[str, bytes | None]]) -> list[int]:
        """Store keyed meta messages (one flush for all); their offsets, in order (the
        metadata store's writes; see :mod:`idempotent.adapters.metadata`)."""
        errors: list[Any] = []
        offsets: dict[int, int] = {}

        def delivered(index: int) -> Callable[[Any, Any], None]:
            def callback(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(err)
                else:
                    offsets[index] = msg.offset()

            return callback

        what = items[0][0] if len(items) == 1 else f"{len(items)} meta records"
        with self._lock, _map_errors(f"store {what}"):
            try:
                for index, (key, value) in enumerate(items):
                    self._meta_producer.produce(
                        self.prefix + META_TOPIC, key=key.encode(), value=value, on_delivery=delivered(index)
                    )
                remaining = self._meta_producer.flush(self.timeout)
            except KafkaException as exc:
                raise self._meta_failed(exc.args[0] if exc.args else None, what) from exc
            if errors:
                raise self._meta_failed(errors[0], what)
        if remaining or len(offsets) != len(items):
            raise BackendUnavailableError(f"kafka: storing {what} timed out")
        return [offsets[i] for i in range(len(items))]

    def _new_meta_producer(self) -> Any:
        return Producer({**self.client_config, "enable.idempotence": True, "linger.ms": 0})

    def _meta_failed(self, error: Any, what: str) -> ProducerError:
        """The error of a failed metadata write. A producer that can do nothing more
        (librdkafka's ``fatal()``, or a code of a client in a bad state) is replaced first,
        so that the retry this error asks for can succeed: a keyed record written twice
        changes nothing, and a retried id block is a new block (the first one, if it was
        stored, stays unused). Needs the lock."""
        if isinstance(error, KafkaError) and (error.fatal() or error.code() in CLIENT_STATE_CODES):
            _LOG.warning("kafka: the metadata producer failed with %s; replacing it", error)
            self._meta_producer = self._new_meta_producer()
            return BackendUnavailableError(
                f"kafka: store {what}: {error.name()}: {error.str()} (that client could do nothing more and was "
                "replaced by a fresh one; retry)"
            )
        return _translate(error, f"store {what}")

    # -- LogBackend ------------------------------------------------------------------------

    def _native_count(self, name: str) -> int | None:
        """The partition count of the Kafka topic ``name`` as Kafka's metadata has it now,
        or None when there is no such topic. (The admin client never auto-creates it.)"""
        try:
            found = self._admin.list_topics(topic=name, timeout=self.timeout).topics.get(name)
        finally:
            self._admin.poll(0)
        if found is None or found.error is not None or not found.partitions:
            if found is not None and found.error is not None and found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise _translate(found.error, f"describe {name}")
            return None
        self.replicas.note_data(name, found)
        return len(found.partitions)

    def _clash(self, topic: str, name: str) -> str | None:
        """Another recorded topic stored in the same Kafka topic as ``topic``, if any."""
        recorded = self.metadata.recorded_topics()
        return next((t for t in recorded if t != topic and kafka_topic_name(t, self.prefix) == name), None)

    def _current(self, topic: str, recorded: int, native: int | None) -> int:
        """The count of a recorded topic: Kafka's when partitions were added since (noted in
        the records, so that other brokers and tools learn it too). Needs self._lock."""
        if native is None or native <= recorded:
            return recorded
        _LOG.info("topic %r has %d partitions now (recorded: %d)", topic, native, recorded)
        self.metadata.note_count(topic, native)
        return native

    def list_topics(self) -> dict[str, int]:
        """The recorded topics whose Kafka topic exists: one deleted with Kafka's own tools
        is left out (reading it would wait for records that are gone)."""
        recorded = self.metadata.list_topics()
        if not recorded:
            return recorded
        with _map_errors("list topics"):
            present = self._list_topics()
        return {topic: count for topic, count in recorded.items() if kafka_topic_name(topic, self.prefix) in present}

    def describe_topic(self, topic: str) -> int | None:
        name = kafka_topic_name(topic, self.prefix)
        with self._lock, _map_errors(f"describe topic {topic}"):
            self.metadata.catch_up()
            if self._clash(topic, name) is not None:
                return None
            native = self._native_count(name)
            recorded = self.metadata.partition_count(topic)
            return native if recorded is None else self._current(topic, recorded, native)

    def create_topic(self, topic: str, partitions: int) -> int:
        """Create the topic, or adopt the Kafka topic of its name (see LogBackend)."""
        name = kafka_topic_name(topic, self.prefix)
        with self._lock, _map_errors(f"create topic {topic}"):
            self.metadata.catch_up()
            clash = self._clash(topic, name)
            if clash is not None:
                raise InvalidTopicError(f"topic {topic!r} would share the Kafka topic {name!r} with {clash!r}")
            native = self._native_count(name)
            recorded = self.metadata.partition_count(topic)
            if recorded is not None:
                return self._current(topic, recorded, native)
            if native is None:
                # created meanwhile by someone else: adopt theirs
                raced = bool(self.create_kafka_topics([self.new_topic(name, partitions, self.topic_config)]))
                self._wait_for_topics([name])
                if raced:
                    native = self._native_count(name)
                    if native is None:
                        raise BackendUnavailableError(f"kafka: topic {name!r} exists but has no metadata yet")
            if native is None:
                origin, count = TopicOrigin(adopted=False), partitions
            else:  # made by Kafka's tools, a plain client or another broker: use it as it is
                ends = tuple(self._end_of(name, p) for p in range(native))
                origin, count = TopicOrigin(adopted=True, starts=ends), native
                _LOG.info("adopting the Kafka topic %r with %d partitions (ends %s)", name, native, ends)
            return self.metadata.record_topic(topic, count, origin)  # an origin recorded first wins

    def describe_replicas(self, topic: str) -> TopicReplicas | None:
        """Each partition's replicas, in-sync replicas and leader, and the topic's
        ``min.insync.replicas`` in force (see :class:`~idempotent.backend.TopicReplicas`);
        None when Kafka has no such topic.

        Raises:
            BackendUnavailableError: the cluster did not answer.
            ConfigError: the principal may not describe the topic.
        """
        name = kafka_topic_name(topic, self.prefix)
        with _map_errors(f"describe the replicas of {topic}"):
            try:
                found = self._admin.list_topics(topic=name, timeout=self.timeout).topics.get(name)
            finally:
                self._admin.poll(0)
            error = None if found is None else found.error
            if error is not None and error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise _translate(error, f"describe {name}")
            if found is None or error is not None or not found.partitions:
                return None
            return describe_replicas(self._admin, found, name, self.timeout)

    def delete_topic(self, topic: str) -> None:
        """Delete the Kafka topic, tombstone its snapshots and its topic record, and wait
        until the cluster no longer lists it (so that it can be created again at once)."""
        if self.read_only:
            raise ConfigError(f"{self.url} was opened read-only: it does not delete {topic}")
        name = kafka_topic_name(topic, self.prefix)
        with self._lock, _map_errors(f"delete topic {topic}"):
            self.metadata.catch_up()
            partitions = self.metadata.partition_count(topic) or 0
            for partition in range(partitions):
                self.release(topic, partition)
            for future in self._admin.delete_topics([name], request_timeout=self.timeout).values():
                try:
                    future.result(self.timeout)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise
            for partition in range(partitions):
                key = f"{topic}\0{partition}".encode()
                self._meta_producer.produce(self.prefix + SNAPSHOT_TOPIC, key=key, value=None, partition=0)
                self._snapshots.pop((topic, partition), None)
                self._written.pop((name, partition), None)
                with self._heads_lock:
                    self._heads.pop((name, partition), None)
            self.metadata.forget_topic(topic)
            deadline = time.monotonic() + self.timeout
            while name in self._list_topics():
                if time.monotonic() > deadline:
                    raise BackendUnavailableError(
                        f"kafka: topic {name!r} was still listed {self.timeout:g} s after deleting it"
                    )
                time.sleep(0.1)

    def _writer(self, topic: str, partition: int) -> PartitionWriter:
        if self.read_only:
            raise ConfigError(f"{self.url} was opened read-only: it does not write to {topic}[{partition}]")
        with self._lock:
            writer = self._writers.get((topic, partition))
            if writer is None:
                kafka_topic = kafka_topic_name(topic, self.prefix)
                writer = self._writers[(topic, partition)] = PartitionWriter(self, topic, partition, kafka_topic)
            elif writer.lost is not None:
                raise writer.lost
            return writer

    def _own(self, topic: str, partition: int) -> None:
        """Before a partition is read to rebuild its checker: take it over (fencing a stale
        owner and ending its open transaction) or, when this backend already writes it, settle
        a commit in doubt, so that what the read sees is final."""
        if not self.read_only:
            self._writer(topic, partition).settle()

    def _check(self, topic: str, partition: int) -> None:
        if not 0 <= partition < (self.metadata.partition_count(topic) or 0):
            with self._lock, _map_errors("list topics"):
                self.metadata.catch_up()
                recorded = self.metadata.partition_count(topic)
                if recorded is not None and partition >= recorded:  # added since it was recorded?
                    self._current(topic, recorded, self._native_count(kafka_topic_name(topic, self.prefix)))
            if not 0 <= partition < (self.metadata.partition_count(topic) or 0):
                raise InvalidTopicError(f"no partition {topic}[{partition}] in {self.url}")

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        self._check(topic, partition)
        return self._writer(topic, partition).submit(batch, snapshot)

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        self._check(topic, partition)
        name = kafka_topic_name(topic, self.prefix)
        out: list[StoredRecord] = []
        heads: list[BatchHead] = []
        head: BatchHead | None = None  # the batch of the record being read, once a head was seen
        unresolved = 0  # records at the start of the read without identity, before any head
        foreign: list[int] = []  # positions in ``out`` of records that belong to no batch
        with _map_errors(f"read {topic}[{partition}]"):
            for message in self._read_range(name, partition, offset, None, max_records):
                at = message.offset()
                raw = message.headers()
                identity = _identity(raw) if raw else None
                if identity is not None:
                    producer_id, epoch, sequence, count, timed = identity
                    timestamp = _seconds(message)
                    if count is not None:
                        head = BatchHead(at, count, producer_id, epoch, sequence, timestamp, timed)
                        heads.append(head)
                elif head is not None and head.covers(at):
                    producer_id, epoch, sequence = head.producer_id, head.producer_epoch, head.sequence_of(at)
                    timestamp = head.record_time(_seconds(message))
                else:
                    producer_id = epoch = sequence = -1
                    timestamp = _seconds(message)
                    if head is None and len(out) == unresolved:
                        unresolved += 1
                    else:
                        foreign.append(len(out))
                user = () if not raw else tuple((k, v or b"") for k, v in raw if k not in IDENTITY_HEADERS)
                record = StoredRecord(at, producer_id, epoch, sequence, message.key(), message.value(), user, timestamp)
                out.append(record)
            self.note_heads(name, partition, heads)
            if unresolved:  # the read began inside a batch: its head is before ``offset``
                first = self._head_of(name, partition, out[0].offset)
                for index in range(unresolved):
                    record = out[index]
                    if first is not None and first.covers(record.offset):
                        out[index] = attrs.evolve(
                            record,
                            producer_id=first.producer_id,
                            producer_epoch=first.producer_epoch,
                            sequence=first.sequence_of(record.offset),
                            timestamp=first.record_time(record.timestamp),
                        )
                    else:
                        foreign.append(index)
            self._note_foreign_runs(name, partition, out, sorted(foreign))
        return out

    def _note_foreign_runs(self, kafka_topic: str, partition: int, out: list[StoredRecord], at: list[int]) -> None:
        """Remember the runs of records a read found to belong to no batch: positions next to
        each other in one read have no record between them (only transaction markers)."""
        start = 0
        for i in range(1, len(at) + 1):
            if i == len(at) or at[i] != at[i - 1] + 1:
                self._note_foreign(kafka_topic, partition, out[at[start]].offset, out[at[i - 1]].offset)
                start = i

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        self._check(topic, partition)
        origin = self.metadata.origin(topic)
        if origin is not None:  # an adopted topic's records before its adoption are not ours
            from_offset = max(from_offset, origin.start(partition))
        self._own(topic, partition)
        return self.stored_batches(topic, partition, from_offset)

    def stored_batches(
        self, topic: str, partition: int, from_offset: int, producer_id: int | None = None, *, settled: bool = False
    ) -> Iterator[StoredBatch]:
        """The batches stored in a partition from ``from_offset`` to its end, read from their
        heads (a record written without the checker is a batch of one without a producer), as
        :meth:`replay` reads them but without taking the partition over: what a producer
        writing the partition itself (``idempotent.adapters.kafka.producer_log``) reads back to recover its
        state. ``producer_id``: only that producer's batches. ``settled``: to the high
        watermark, past other producers' open transactions (:meth:`_read_range`).

        Raises:
            BackendUnavailableError: the partition could not be read.
        """
        name = kafka_topic_name(topic, self.prefix)
        batches: list[StoredBatch] = []
        heads: list[BatchHead] = []
        # the records of a batch have consecutive offsets (one producer, one transaction):
        # only the first one's headers are read, the others are passed over by offset
        inside_until = -1
        with _map_errors(f"replay {topic}[{partition}]"):
            if from_offset > 0:  # a replay that begins inside a batch passes over its rest
                first = list(self._read_range(name, partition, from_offset, None, 1, settled=settled))
                if first and _identity(first[0].headers()) is None:
                    started_in = self._head_of(name, partition, first[0].offset())
                    if started_in is not None:
                        inside_until = started_in.first_offset + started_in.record_count
            for message in self._read_range(name, partition, from_offset, None, settled=settled):
                if message.offset() < inside_until:
                    continue
                identity = _identity(message.headers())
                if identity is None:  # a record written without the checker
                    if producer_id is None:
                        batches.append(StoredBatch(message.offset(), NO_PRODUCER_ID, Epoch(-1), Sequence(-1), 1, 0.0))
                    continue
                writer, epoch, sequence, count, timed = identity
                if count is None:  # inside a batch of the earlier layout (identity on each record)
                    continue
                inside_until = message.offset() + count
                timestamp = _seconds(message)
                heads.append(BatchHead(message.offset(), count, writer, epoch, sequence, timestamp, timed))
                if producer_id is None or writer == producer_id:
                    batches.append(
                        StoredBatch(
                            message.offset(), ProducerId(writer), Epoch(epoch), Sequence(sequence), count, timestamp
                        )
                    )
            self.note_heads(name, partition, heads)
        return iter(batches)

    def bounds(self, topic: str, partition: int, *, settled: bool = False) -> tuple[int, int]:
        """The first retained offset of a partition and its end: its last stable offset (where
        ``read_committed`` readers end), or with ``settled`` its high watermark (the records
        of open transactions counted).

        Raises:
            BackendUnavailableError: the partition could not be asked.
        """
        name = kafka_topic_name(topic, self.prefix)
        with self._lock, _map_errors(f"offsets of {topic}[{partition}]"):
            self._know(name)
            low, high = self._reader.get_watermark_offsets(
                KafkaTopicPartition(name, partition), timeout=self.timeout, cached=False
            )
            if settled:
                high = self._high_watermark(name, partition)
        return int(low), int(high)

    def end_offset(self, topic: str, partition: int) -> int:
        self._check(topic, partition)
        with _map_errors(f"end offset of {topic}[{partition}]"):
            return self._end_of(kafka_topic_name(topic, self.prefix), partition)

    # -- snapshots (compacted __idempotent_snapshots, written in the partition's transaction) --

    def produce_snapshot(self, producer: Any, topic: str, partition: int, snapshot: Snapshot) -> None:
        """Add a snapshot to the producer's open transaction (called by the partition writer)."""
        value = pack_snapshot(snapshot)
        producer.produce(self.prefix + SNAPSHOT_TOPIC, key=f"{topic}\0{partition}".encode(), value=value, partition=0)

    def latest_snapshot(self, topic: str, partition: int) -> Snapshot | None:
        self._check(topic, partition)
        self._own(topic, partition)
        name = self.prefix + SNAPSHOT_TOPIC
        with self._lock, _map_errors("read snapshots"):
            if self._snapshot_position < self._end_of(name, 0):
                for message in self._read_range(name, 0, self._snapshot_position, None):
                    self._snapshot_position = message.offset() + 1
                    key = (message.key() or b"").decode()
                    t, _, p = key.rpartition("\0")
                    if message.value() is None:
                        continue
                    self._snapshots[(t, int(p))] = unpack_snapshot(message.value())
            return self._snapshots.get((topic, partition))

    def write_snapshot(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        self._check(topic, partition)
        future = self._writer(topic, partition).submit(None, snapshot)
        try:
            future.result(self.timeout + 5)
        except TimeoutError:
            raise BackendUnavailableError(f"kafka: writing the snapshot of {topic}[{partition}] timed out") from None

    @property
    def max_record_bytes(self) -> int | None:
        """Every record is one Kafka message: it must fit the client's ``message.max.bytes``
        (librdkafka's default 1,000,000), with room for its ``idem.*`` headers."""
        return int(self.client_config.get("message.max.bytes", _MESSAGE_MAX_BYTES)) - _RECORD_MARGIN

    @property
    def max_batch_bytes(self) -> int | None:
        return None  # a batch is many messages in one transaction

    def release(self, topic: str, partition: int) -> None:
        with self._lock:
            writer = self._writers.pop((topic, partition), None)
        if writer is not None:
            writer.close()

    def close(self) -> None:
        with self._lock:
            writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.close()
        with contextlib.suppress(Exception):
            self._meta_producer.flush(self.timeout)
        with contextlib.suppress(Exception):
            self._reader.close()


def _seconds(message: Any) -> float:
    """A message's timestamp in seconds."""
    return float(message.timestamp()[1]) / 1000


def _identity(raw: Any) -> tuple[int, int, int, int | None, bool] | None:
    """``(producer id, epoch, sequence, record count or None, timed)`` from a message's
    headers: a batch head has the first four (-1 for the first three when the batch had no
    producer) and says whether its records carry their own times; a record of the earlier
    layout (identity on every record) has no count; None for a message without identity (a
    later record of a batch, or one written without the checker)."""
    if not raw:
        return None
    pid = epoch = sequence = count = None
    timed = False
    for name, value in raw:
        if name == "idem.pid":
            pid = value
        elif name == "idem.epoch":
            epoch = value
        elif name == "idem.seq":
            sequence = value
        elif name == "idem.count":
            count = value
        elif name == "idem.timed":
            timed = True
    if pid is None:  # a head of a batch without a producer says only its count
        return None if count is None else (NO_PRODUCER_ID, -1, -1, int(count), timed)
    return (
        int(pid),
        int(epoch) if epoch is not None else -1,
        int(sequence) if sequence is not None else -1,
        int(count) if count is not None else None,
        timed,
    )


__all__ = ["KafkaBackend", "OwnershipLostError", "confluent_kafka", "kafka_topic_name"]
