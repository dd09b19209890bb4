"""A producer's own broker: its checker, in its process, writing straight into Kafka or Pulsar.

:class:`~idempotent.producer.producer.Producer` opens one for a ``kafka://`` or ``pulsar://`` URL, so any
number of processes (replicas of a service, workers of one server) produce into the same
topics at once, each exactly once, without a broker server and without fencing each other.
The design (docs/architecture.md, "Who owns a write"):

* **Producer-scoped ownership.** The checker's rule is per producer: two producers never
  affect each other's decisions, only each other's offsets. So nobody owns a partition; each
  producer owns its own records. Its :class:`~idempotent.backend.ProducerLog` is fenced by
  the log's own mechanism (Kafka: a ``transactional.id`` naming the producer), so an older
  instance of the same producer cannot write once a newer one has opened.
* **The core decides**, as everywhere: one producer-scoped
  :class:`~idempotent.core.partition.PartitionCore` per partition, tracking this producer
  only, with the topic's policy and deduplication switch from the shared settings, driven by
  the one decision loop every broker calls (:mod:`idempotent.broker.decisions`): a batch is
  offered (checked and pushed), written, then completed (committed at its offset, or
  :class:`~idempotent.core.partition.NotStored`).
* **One group, one write.** The producer's sender thread hands a group of batches (up to the
  log's ``max_in_flight`` per partition, in sequence order) to :meth:`submit_requests`, which
  writes them as one transaction and returns their answers, already complete: the same
  thread checks, writes, commits and (back in the producer) completes the callbacks.
* **State.** A named producer's checker state on each partition is stored with every
  transaction that changes it, so a restart (same name) continues exactly from what was
  committed and answers resends of stored data as duplicates with their original offsets.
* **Unknown outcomes.** When a write's outcome is unknown (a commit without an answer), the
  pushed batches stay pending and every later group waits until the log says whether they
  were stored (:meth:`ProducerLog.resolve`): committed, they become ACCEPTED (a resend is
  then a DUPLICATE); aborted, they are discarded and resent as new.

Backends are shared by the producers of one process (one set of clients and metadata per URL
and options), each producer with its own writer.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any, ClassVar

from idempotent.api import ProduceShortcuts
from idempotent.backend import AppendBatch, LogBackend, ProducerLog
from idempotent.broker import decisions
from idempotent.broker.config import BrokerConfig
from idempotent.broker.settings import BrokerSettings
from idempotent.core.checker import CheckerConfig, PartitionChecker
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.partition import Append, NotStored, PartitionCore, Reply
from idempotent.core.records import Snapshot, StoredBatch, StoredRecord
from idempotent.core.registry import OwnProducer, ProducerRecord, ProducerRegistry, validate_name
from idempotent.core.request import ProduceRequest
from idempotent.core.settings import DEDUP, POLICY, dedup_value, policy_value
from idempotent.core.topics import canonical_topic
from idempotent.core.types import Epoch, ProducerId, TopicPartition
from idempotent.core.values import MAX_PARTITIONS, LastSequences, PartitionStats, ProducerSession, ProducerStats
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidTopicError,
    OwnershipLostError,
    ProducerClosedError,
    ProducerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
    UnknownProducerError,
    internal_error,
)
from idempotent.runtime.future import LightFuture

_LOG = logging.getLogger("idempotent.broker.direct")

#: the module that opens a producer's own writer, per URL scheme
PRODUCER_LOGS = {
    "kafka": "idempotent.adapters.kafka.producer_log",
    "pulsar": "idempotent.adapters.pulsar.producer_log",
    # Pulsar's other service URLs (TLS, lookups over HTTP(S)); see idempotent.adapters.pulsar.url
    "pulsar+ssl": "idempotent.adapters.pulsar.producer_log",
    "http": "idempotent.adapters.pulsar.producer_log",
    "https": "idempotent.adapters.pulsar.producer_log",
}


class _Shared:
    """One backend shared by the direct brokers of a process, with its producer registry."""

    def __init__(self, key: tuple[str, str], backend: LogBackend) -> None:
        self.key = key
        self.backend = backend
        self.users = 0
        self.lock = threading.Lock()
        self.registry = ProducerRegistry(backend.load_producers())


_SHARED: dict[tuple[str, str], _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _acquire(url: str, options: Mapping[str, Any]) -> _Shared:
    key = (url, repr(sorted(options.items())))
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            from idempotent.adapters import open_backend

            shared = _SHARED[key] = _Shared(key, open_backend(url, **options))
        shared.users += 1
        return shared


def _release(shared: _Shared) -> None:
    with _SHARED_LOCK:
        shared.users -= 1
        if shared.users > 0:
            return
        _SHARED.pop(shared.key, None)
    shared.backend.close()


class _OwnPartition:
    """One partition of a producer's own broker: its producer-scoped core, and the I/O the
    decision loop asks for (:class:`~idempotent.broker.decisions.PartitionEffects`), which is
    little: the admission is the broker's one producer, and the state is the producer's own,
    which the broker stores with each of its writes (the core schedules no snapshot, expires
    and evicts nothing, and its writes' outcomes are settled by the broker, never left to a
    rebuild).

    Args:
        tp: the partition.
        config: the checker's config.
        own: the broker's producer.
        state: the producer's stored state on the partition (restored at its restart, or
            from before an aborted transaction), None when it has none.
    """

    __slots__ = ("_config", "_own", "_state", "core")

    def __init__(self, tp: TopicPartition, config: CheckerConfig, own: OwnProducer, state: Snapshot | None) -> None:
        self.core = PartitionCore(tp, config, producer_scoped=True)
        self._config = config
        self._own = own
        self._state = state

    def ready(self, now: float) -> PartitionChecker:
        """The partition's checker, installed by the decision loop from ``state`` at the
        first call (:func:`idempotent.broker.decisions.ready`).

        Raises:
            CorruptDataError: the stored state is not a snapshot of a known format.
        """
        return decisions.ready(self.core, self, now)

    @property
    def checker(self) -> PartitionChecker:
        """The checker (call :meth:`ready` first)."""
        checker = self.core.checker
        assert checker is not None  # installed at the partition's creation, never dropped
        return checker

    # -- the effects the decision loop asks for (decisions.PartitionEffects) -----------------

    @property
    def registry(self) -> OwnProducer:
        """The broker's one producer."""
        return self._own

    def rebuild(self, now: float) -> tuple[PartitionChecker, int, float]:
        """The checker of the producer's stored state (empty when it has none)."""
        state, self._state = self._state, None
        if state is None:
            return PartitionChecker(self._config), 0, 0.0
        return PartitionChecker.restore(state, self._config, now=now), 0, 0.0

    def store_snapshot(self, snapshot: Snapshot) -> bool:
        """Never asked (a producer-scoped core schedules no snapshot): refused."""
        return False

    def evicted(self, producer_ids: tuple[ProducerId, ...]) -> None:
        """Never asked (a producer-scoped core evicts nothing)."""

    def refresh_producers(self) -> None:
        """Never asked (the broker's producer is known; another one is unknown for good)."""

    def note_partition(self, producer_id: int) -> None:
        """Nothing to store: a restart finds the producer's partitions in its log."""


def _not_stored() -> NotStored:
    """The outcome of a write the log settled as not stored (its requests were answered
    already, with the write's error)."""
    return NotStored(BackendUnavailableError("the write was not stored; its batches are resent as new"))


def direct_scheme(url: str) -> bool:
    """Whether a producer opened on ``url`` writes through its own :class:`DirectBroker`."""
    return url.split("://", 1)[0] in PRODUCER_LOGS


class DirectBroker(ProduceShortcuts):
    """The broker of one producer (see the module docstring).

    Args:
        url: ``kafka://host:port[,...]``.
        config: the checker's bounds, the default policy and deduplication, topic creation
            (``default_partitions``, ``auto_create_topics``), record limits.
        log_settings: settings of the producer's own writer (Kafka: ``compression.type`` and
            the other librdkafka settings of ``idempotent.adapters.kafka.producer_log.TUNABLE``).
        log_module: the module whose ``open_producer_log(backend, key, named, settings,
            takeover)`` opens the producer's writer, in place of the URL scheme's (the
            in-memory ``idempotent.adapters.memory_producer_log`` over a ``memory://`` URL,
            for tests).
        **options: the backend's options (as :func:`idempotent.connect` takes them).

    Raises:
        ConfigError: a URL whose scheme has no producer-scoped writer (and no ``log_module``), bad options, or the
            backend's client library is missing (the message names the extra).
        BackendUnavailableError: the backend could not be opened.
    """

    def __init__(
        self,
        url: str,
        config: BrokerConfig | None = None,
        *,
        log_settings: Mapping[str, Any] | None = None,
        log_module: Any = None,
        **options: Any,
    ) -> None:
        scheme = url.split("://", 1)[0]
        if log_module is None and scheme not in PRODUCER_LOGS:
            raise ConfigError(f"{url!r}: a producer's own broker writes to {', '.join(PRODUCER_LOGS)} only")
        self._url = url
        try:
            self._module = log_module or importlib.import_module(PRODUCER_LOGS[scheme])
        except ImportError as exc:  # the backend's client library is missing
            extra = "kafka" if scheme == "kafka" else "pulsar"
            hint = "" if "pip install" in str(exc) else f" (pip install 'idempotent[{extra}]')"
            raise ConfigError(f"the {scheme} backend needs a missing library: {exc}{hint}") from exc
        self.config = config or BrokerConfig()
        self._log_settings = dict(log_settings or {})
        self._shared = _acquire(url, options)
        self.backend = self._shared.backend
        self._lock = threading.Lock()
        #: guards the checkers and the unsettled batches against a pipelined log's answers,
        #: which come on the log client's threads; never held while calling the log
        #: (lock order: ``_lock`` first)
        self._checker_lock = threading.RLock()
        #: whether the log pipelines (``prepare`` + ``submit``), else groups are written
        #: synchronously (``write``)
        self._pipelined = False
        self._log: ProducerLog | None = None
        self._session: ProducerSession | None = None
        #: the producer's admission (set by init_producer)
        self._own: OwnProducer | None = None
        #: the partitions this producer wrote or restored, each with its core
        self._parts: dict[TopicPartition, _OwnPartition] = {}
        #: appended batches whose write's outcome is unknown: (partition, append, request,
        #: the pipelined log's entry or None)
        self._unsettled: list[tuple[_OwnPartition, Append, ProduceRequest, Any]] = []
        self._failure: ProducerError | None = None
        self._closed = False
        #: with a lock of its own, held while a setting is stored (the checkers' lock is not)
        self._settings = BrokerSettings(self.backend, threading.RLock(), self.config.deduplication, self.config.policy)
        self._settings_at = time.monotonic()
        #: topic -> (partition count, when it was looked up)
        self._topics: dict[str, tuple[int, float]] = {}
        #: the partitions the application's open transaction wrote (None: none open)
        self._txn_touched: set[TopicPartition] | None = None
        #: the state of each partition the open transaction wrote, as it was before
        self._txn_before: dict[TopicPartition, Snapshot] = {}

    @property
    def url(self) -> str:
        """The URL of the log this broker writes into."""
        return self._url

    # -- topics ----------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic, or take over one made by the log's own tools; nothing happens when
        it exists with the same partition count.

        Raises:
            InvalidTopicError: bad name, bad count, or the topic exists with another count.
        """
        name = canonical_topic(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidTopicError(f"partitions must be an int in 1..{MAX_PARTITIONS}, got {partitions!r}")
        count = self.backend.create_topic(name, partitions)
        self._topics[name] = (count, time.monotonic())
        if count != partitions:
            raise InvalidTopicError(f"topic {name!r} exists with {count} partitions, not {partitions}")

    def delete_topic(self, name: str) -> None:
        """Delete a topic with its records and its topic-level settings, as
        :meth:`idempotent.broker.broker.Broker.delete_topic` does; this producer forgets its state there.

        Raises:
            InvalidTopicError: bad name, or no such topic (nothing changed).
            BackendUnavailableError: the log failed; the topic may be partly deleted.
        """
        name = canonical_topic(name)
        if name not in self.backend.list_topics():
            raise InvalidTopicError(f"unknown topic {name!r}")
        with self._lock:
            self._settings.clear_topic(name)
            self.backend.delete_topic(name)
            self._topics.pop(name, None)
            for tp in [tp for tp in self._parts if tp.topic == name]:
                del self._parts[tp]

    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        return dict(self.backend.list_topics())

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        """The partition count of ``topic``, looked up in the log (its own metadata too: a
        topic made by the log's own tools is used as it is) and read again once it is
        ``topic_refresh_interval`` seconds old; a missing topic is created with
        ``default_partitions`` when ``create`` and ``auto_create_topics`` allow. A count
        known here stays in force while the log cannot be asked (a retriable error), for
        another ``topic_refresh_interval``.

        Raises:
            InvalidTopicError: unknown topic (not created), or a bad name.
            BackendUnavailableError: the log could not be asked, and the count is not known.
        """
        topic = canonical_topic(topic)
        now = time.monotonic()
        known = self._topics.get(topic)
        if known is not None and now - known[1] < self.config.topic_refresh_interval:
            return known[0]
        try:
            count = self.backend.describe_topic(topic)
        except ProducerError as exc:
            if known is None or not exc.retriable:
                raise
            # the log cannot be asked now (a broker away, a leader being elected): the count
            # in force stays, asked again at the next interval
            _LOG.debug("could not refresh the partitions of %s: %s", topic, exc)
            self._topics[topic] = (known[0], now)
            return known[0]
        if count is None:
            if known is not None:
                return known[0]
            if not (create and self.config.auto_create_topics):
                raise InvalidTopicError(f"unknown topic {topic!r}")
            count = self.backend.create_topic(topic, self.config.default_partitions)
        if known is not None:
            count = max(count, known[0])  # a topic never loses partitions
        self._topics[topic] = (count, now)
        return count

    # -- settings --------------------------------------------------------------------------

    def set_deduplication(
        self, enabled: bool | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        """Switch deduplication at topic, namespace or broker level (None clears); stored in
        the backend for every broker and producer that shares it."""
        self._set(DEDUP, dedup_value(enabled), topic, namespace)

    def set_policy(self, policy: Any, *, topic: str | None = None, namespace: str | None = None) -> None:
        """Set the sequence policy at one level (None clears).

        Raises:
            ConfigError: unknown policy.
        """
        self._set(POLICY, policy_value(policy), topic, namespace)

    def _set(self, kind: str, value: str | None, topic: str | None, namespace: str | None) -> None:
        self._settings.set(kind, value, topic, namespace)

    def _refresh_settings(self, now: float) -> None:
        """Follow settings changed by other processes, at most every ``maintenance_interval``."""
        interval = self.config.maintenance_interval
        if interval <= 0 or now - self._settings_at < interval:
            return
        self._settings_at = now
        error = self._settings.reload()
        if error is not None:  # the settings in force are kept; tried again next interval
            _LOG.warning("could not reload the settings from %s: %s", self._url, error)

    # -- the producer ----------------------------------------------------------------------

    def init_producer(self, producer_name: str | None = None, *, timeout: float = 30.0) -> ProducerSession:
        """Open this broker's producer: an anonymous one gets a fresh id; a named one keeps
        its id, gets its epoch bumped and saved, then fences its older instances (through the
        log) and continues from its committed state on every partition it wrote. Its log asks
        :meth:`_superseded` whether a fence it meets is a takeover (docs/semantics.md 3.3).

        Raises:
            ConfigError: bad name, or this broker already has a producer.
            BackendUnavailableError: the log or its metadata could not be reached.
            ProducerStateLostError: a named producer's stored state on a partition it wrote
                is missing, older than the data or unreadable, and the partition's last
                ``config.state_rebuild_records`` offsets cannot rebuild it (docs/semantics.md,
                "Lost producer state"); nothing is opened.
        """
        if producer_name is not None:
            validate_name(producer_name)
        with self._lock:
            if self._closed:
                raise ProducerClosedError(f"the broker of {self._url} is closed")
            if self._session is not None:
                raise ConfigError("a producer's own broker serves one producer; open another for another")
        shared = self._shared
        # A named producer's bumped epoch is saved before its writer fences the older
        # instances, and their states are read after: an older instance fenced by Kafka asks
        # the registry (``takeover``) whether this one exists before it writes again, so it
        # either stops or is fenced before the states are read (docs/semantics.md 3.3).
        with shared.lock:
            if producer_name is not None:
                shared.registry.merge(self.backend.load_producers())
            if shared.registry.will_need_id(producer_name) and shared.registry.needs_id_block():
                start = self.backend.allocate_producer_ids(self.config.id_block_size)
                shared.registry.add_id_block(start, self.config.id_block_size)
            record = shared.registry.init(producer_name, None, time.time())
            self.backend.save_producer(record)
        if producer_name is None:
            log = self._module.open_producer_log(self.backend, str(record.producer_id), False, self._log_settings)
        else:
            takeover = partial(self._superseded, producer_name, record)
            log = self._module.open_producer_log(self.backend, producer_name, True, self._log_settings, takeover)
        try:
            states = log.load_states(
                record.producer_id, window=self.config.state_rebuild_records, config=self.config.checker
            )
        except BaseException:
            log.close()
            raise
        own = OwnProducer(record)
        parts: dict[TopicPartition, _OwnPartition] = {}
        last: dict[TopicPartition, int] = {}
        for (topic, partition), snapshot in states.items():
            tp = TopicPartition(topic, partition)
            part = parts[tp] = _OwnPartition(tp, self.config.checker, own, snapshot)
            sequence = part.ready(time.time()).last_sequence(record.producer_id)
            if sequence >= 0:
                last[tp] = sequence
        max_record = self.config.max_record_bytes
        if self.backend.max_record_bytes is not None:
            max_record = min(max_record, self.backend.max_record_bytes)
        session = ProducerSession(
            record.producer_id,
            record.producer_epoch,
            record.producer_name,
            LastSequences(last),
            False,
            (),
            max_record,
            min(self.config.max_batch_bytes, log.max_batch_bytes),
            getattr(log, "max_in_flight", 1),
            log.max_batch_records,
        )
        with self._lock:
            self._log, self._session, self._own, self._parts = log, session, own, parts
            self._pipelined = callable(getattr(log, "submit", None))
        return session

    def _superseded(self, name: str, mine: ProducerRecord) -> bool:
        """Whether the registry holds a newer instance of the named producer than ``mine``
        (a later epoch, or the name on another id), read afresh from the backend.

        Raises:
            BackendUnavailableError: the registry could not be read.
        """
        shared = self._shared
        with shared.lock:
            shared.registry.merge(self.backend.load_producers())
            current = shared.registry.by_name(name)
        return current is not None and (
            current.producer_id != mine.producer_id or current.producer_epoch > mine.producer_epoch
        )

    # -- producing -------------------------------------------------------------------------

    attempts_in_order: ClassVar[bool] = True  # in the producer's process (ProduceShortcuts)

    @property
    def writes_on_submit(self) -> bool:
        """Whether :meth:`submit_requests` writes the group before it returns, on the
        caller's thread (a log without pipelined writes: Kafka's transactions)."""
        return self._log is not None and not self._pipelined

    @property
    def writes_without_lock(self) -> bool:
        """Whether the writes of :meth:`submit_requests` run without the interpreter lock
        between their steps (the compiled Kafka write path took the last group): the
        producer's sends then need not wait for them."""
        return bool(getattr(self._log, "writes_without_lock", False))

    @property
    def produce_timeout(self) -> float:
        """Seconds ``produce`` waits for the answer."""
        return self.config.append_timeout

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        """:meth:`submit_requests` of one batch."""
        return self.submit_requests([request])[0]

    def submit_requests(self, requests: Sequence[ProduceRequest]) -> list[Future[ProduceResult]]:
        """Check a group of batches of this broker's producer (in sequence order per partition),
        write the accepted ones as one transaction, and return every answer, complete.

        Errors are set on the futures: a retriable one when the write failed (nothing stored,
        or its outcome is being settled; resending is safe), ProducerFencedError when a newer
        instance of the producer took over.
        """
        futures: list[Future[ProduceResult]] = [LightFuture() for _ in requests]
        with self._lock:
            try:
                self._submit(requests, futures)
            except ProducerError as exc:
                self._fail_open(futures, exc)
            except Exception as exc:  # a bug: logged, FATAL for this producer
                self._failure = internal_error("writing a group of batches", exc, _LOG)
                self._fail_open(futures, self._failure)
        return futures

    @staticmethod
    def _fail_open(futures: list[Future[ProduceResult]], error: ProducerError) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def _submit(self, requests: Sequence[ProduceRequest], futures: list[Future[ProduceResult]]) -> None:
        if self._failure is not None:
            raise self._failure
        session, log = self._session, self._log
        if session is None or log is None:
            raise UnknownProducerError("init_producer first: this broker has no producer yet", -1)
        if self._closed:
            raise ProducerClosedError(f"the broker of {self._url} is closed")
        self._settle(log)
        now = time.time()
        self._refresh_settings(time.monotonic())
        counts = {}
        for request in requests:  # (may ask the log: before any checker is touched)
            if request.topic not in counts:
                counts[request.topic] = self.partitions_for(request.topic, create=False)
        if self._pipelined:  # open what the group needs before anything is pushed
            self._prepare(log, requests, counts, session)
        with self._checker_lock:
            accepted = self._check_all(requests, futures, counts, session, now)
        if not accepted:
            return
        if self._pipelined:
            self._write_pipelined(log, accepted, futures, now)
            return
        self._write(log, accepted, futures, now, session)

    def _check_all(
        self,
        requests: Sequence[ProduceRequest],
        futures: list[Future[ProduceResult]],
        counts: dict[str, int],
        session: ProducerSession,
        now: float,
    ) -> list[tuple[int, ProduceRequest, _OwnPartition, Append]]:
        """Offer each batch to its partition's core, through the decision loop (``_checker_lock``
        held), and answer the ones that are not to be written; returns the appends to write.

        Raises:
            InvalidBatchError: a header does not fit its topic's policy; the batches of the
                group offered before it stay pending, unwritten (the caller fails every
                future not answered yet).
        """
        accepted: list[tuple[int, ProduceRequest, _OwnPartition, Append]] = []
        own = self._own
        assert own is not None  # (set with the session)
        for index, request in enumerate(requests):
            header = request.header
            if header.producer_id != session.producer_id:  # not this broker's: before its partition
                futures[index].set_result(ProduceResult(Outcome.UNKNOWN_PRODUCER))
                continue
            topic, partition = request.topic, request.partition
            count = counts[topic]
            if not 0 <= partition < count:
                futures[index].set_exception(
                    InvalidTopicError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition}")
                )
                continue
            tp = TopicPartition(topic, partition)
            part = self._parts.get(tp)
            if part is None:
                part = self._parts[tp] = _OwnPartition(tp, self.config.checker, own, None)
                part.ready(now)
            core = part.core
            if self._txn_touched is not None and tp not in self._txn_before:
                self._txn_before[tp] = core.stored_state(now)  # restored if the transaction aborts
            decision = decisions.offer(
                core,
                part,
                header,
                now,
                policy=self._settings.policy(topic),
                enabled=self._settings.deduplication(topic),
                refreshable=False,
            )
            if isinstance(decision, Append):
                accepted.append((index, request, part, decision))
            else:
                futures[index].set_result(decision)
        return accepted

    def _write(
        self,
        log: ProducerLog,
        accepted: list[tuple[int, ProduceRequest, _OwnPartition, Append]],
        futures: list[Future[ProduceResult]],
        now: float,
        session: ProducerSession,
    ) -> None:
        """Write a group synchronously, as one transaction (Kafka), and answer it: stored,
        each append completes at its offset; not stored, as NotStored; unknown, the appends
        wait unsettled.

        Raises:
            ProducerFencedError: a newer instance of the producer took over (the appends stay
                pending: the producer is done).
        """
        batches = [(r.topic, r.partition, AppendBatch(r.header, r.records, now, r.size)) for _, r, _, _ in accepted]
        touched = self._txn_touched
        try:
            offsets = log.write(batches, None if touched is not None else self._states_after(accepted, now))
        except OwnershipLostError as exc:
            raise self._fenced(session, exc) from exc
        except ProducerError as exc:
            if log.unresolved is not None:
                self._unsettled = [(part, append, request, None) for _, request, part, append in accepted]
                self._settle(log, quiet=True)
            else:
                outcome = NotStored(exc)
                for _, _, part, append in accepted:
                    decisions.completed(part.core, part, append, outcome, now)
            for index, _, _, _ in accepted:
                futures[index].set_exception(exc)
            return
        for (index, _, part, append), offset in zip(accepted, offsets, strict=True):
            answer = decisions.completed(part.core, part, append, offset, now)
            assert isinstance(answer, Reply)  # (an offset is always accepted)
            futures[index].set_result(answer.result)
            if touched is not None:
                touched.add(part.core.tp)

    def _states_after(
        self, accepted: list[tuple[int, ProduceRequest, _OwnPartition, Append]], now: float
    ) -> Callable[[list[int]], list[tuple[str, int, Snapshot]]]:
        """The named producer's state on each written partition once the group is stored at
        ``offsets``: each core's stored state with the group's batches applied
        (:meth:`PartitionCore.state_after`), as a replay of the log would apply them."""

        def states(offsets: list[int]) -> list[tuple[str, int, Snapshot]]:
            # a group may hold several batches of a partition: each applies after the one before
            stored: dict[TopicPartition, tuple[_OwnPartition, list[StoredBatch]]] = {}
            for (_, request, part, _), offset in zip(accepted, offsets, strict=True):
                header = request.header
                batch = StoredBatch(
                    offset,
                    ProducerId(header.producer_id),
                    Epoch(header.producer_epoch),
                    header.base_sequence,
                    header.record_count,
                    now,
                )
                entry = stored.get(part.core.tp)
                if entry is None:
                    stored[part.core.tp] = (part, [batch])
                else:
                    entry[1].append(batch)
            return [
                (tp.topic, tp.partition, part.core.state_after(batches, now)) for tp, (part, batches) in stored.items()
            ]

        return states

    def _settle(self, log: ProducerLog, *, quiet: bool = False) -> None:
        """Settle a write whose outcome was unknown before anything else is written: each
        of its appends completes at its offset, or as NotStored.

        Raises:
            BackendUnavailableError: the log cannot say yet (unless ``quiet``); the batches
                stay pending, and every group waits.
        """
        if self._pipelined:
            self._settle_entries(log)
            return
        if not self._unsettled:
            return
        try:
            offsets = log.resolve()
        except ProducerError:
            if quiet:
                return
            raise
        unsettled, self._unsettled = self._unsettled, []
        now = time.time()
        if offsets is None:
            lost = _not_stored()
            for part, append, _, _ in unsettled:
                decisions.completed(part.core, part, append, lost, now)
            return
        # a log without atomic groups (Pulsar) settles each batch: None, not stored (nor
        # anything after it on its partition)
        for (part, append, _, _), offset in zip(unsettled, offsets, strict=True):
            decisions.completed(part.core, part, append, _not_stored() if offset is None else offset, now)

    # -- pipelined logs (Pulsar) ------------------------------------------------------------

    def _prepare(
        self, log: ProducerLog, requests: Sequence[ProduceRequest], counts: dict[str, int], session: ProducerSession
    ) -> None:
        """Let a pipelined log open the writers a group needs (nothing is pushed yet, so a
        failure here leaves nothing to undo)."""
        wanted = sorted(
            {
                (r.topic, r.partition)
                for r in requests
                if r.header.producer_id == session.producer_id and 0 <= r.partition < counts[r.topic]
            }
        )
        try:
            log.prepare(wanted)  # type: ignore[attr-defined]
        except OwnershipLostError as exc:
            raise self._fenced(session, exc) from exc

    def open_partitions(self, topic: str) -> None:
        """Open this producer's writers of every partition of ``topic`` now, rather than at
        the first write (a pipelined log; nothing happens for others): what Pulsar decides
        when a producer opens (exclusive access modes) is decided here.

        Raises:
            ProducerFencedError: another producer holds the topic exclusively, or fenced
                this one.
            BackendUnavailableError, InvalidTopicError: the log could not be opened.
        """
        topic = canonical_topic(topic)
        with self._lock:
            session, log = self._session, self._log
            if session is None or log is None or not self._pipelined:
                return
            count = self.partitions_for(topic)
            try:
                log.prepare([(topic, p) for p in range(count)])  # type: ignore[attr-defined]
            except OwnershipLostError as exc:
                raise self._fenced(session, exc) from exc

    def _fenced(self, session: ProducerSession, exc: OwnershipLostError) -> ProducerFencedError:
        self._failure = ProducerFencedError(
            f"producer {session.producer_id} ({session.producer_name!r}) was fenced: a newer instance "
            f"of it opened its writer ({exc})",
            session.producer_id,
            session.producer_epoch,
        )
        return self._failure

    def _write_pipelined(
        self,
        log: ProducerLog,
        accepted: list[tuple[int, ProduceRequest, _OwnPartition, Append]],
        futures: list[Future[ProduceResult]],
        now: float,
    ) -> None:
        """Hand a group to a pipelined log without waiting; each batch is answered when the log
        reports it (on the log client's thread): stored, its append completes at its offset;
        failed, it waits unsettled (its future fails with a retriable error) until the next
        group settles it."""
        named = self._session is not None and self._session.producer_name is not None

        def done(i: int, offset: int | None, error: ProducerError | None, entry: Any) -> None:
            index, request, part, append = accepted[i]
            if error is None and offset is not None:
                with self._checker_lock:
                    answer = decisions.completed(part.core, part, append, offset, now)
                    snapshot = part.core.stored_state(time.time()) if named else None
                if snapshot is not None:
                    log.note_state(request.topic, request.partition, snapshot)  # type: ignore[attr-defined]
                assert isinstance(answer, Reply)  # (an offset is always accepted)
                futures[index].set_result(answer.result)
                return
            if isinstance(error, OwnershipLostError) and self._session is not None:
                error = self._fenced(self._session, error)  # another producer fenced this one
            with self._checker_lock:
                self._unsettled.append((part, append, request, entry))
            futures[index].set_exception(
                error if error is not None else internal_error("a log answer", ValueError("no offset"), _LOG)
            )

        batches = [(r.topic, r.partition, AppendBatch(r.header, r.records, now)) for _, r, _, _ in accepted]
        log.submit(batches, done)  # type: ignore[attr-defined]

    def _settle_entries(self, log: ProducerLog) -> None:
        """Settle what a pipelined log failed to store before anything else is written: the
        stored ones (a prefix of each partition's, in order) complete at their offsets, and
        a partition with one that was not stored forgets its pending batches (NotStored:
        they are resent as new).

        Raises:
            BackendUnavailableError: the log cannot say yet; every group waits.
        """
        with self._checker_lock:
            if not self._unsettled:
                return
        offsets = log.resolve_entries()  # type: ignore[attr-defined]
        with self._checker_lock:
            # only the entries the log settled: one answered (failed) while it settled the
            # others waits for the next settle, which its writer's failure still asks for
            unsettled = [u for u in self._unsettled if u[3] in offsets]
            self._unsettled = [u for u in self._unsettled if u[3] not in offsets]
            now = time.time()
            lost: list[tuple[_OwnPartition, Append]] = []
            for part, append, _, entry in sorted(unsettled, key=lambda u: u[3].entry_id):
                offset = offsets.get(entry)
                if offset is None:
                    lost.append((part, append))
                elif all(part is not p for p, _ in lost):
                    decisions.completed(part.core, part, append, offset, now)
                else:  # after one not stored on its partition: forgotten with it (below)
                    lost.append((part, append))
            # the partitions with one not stored forget their pending batches once the
            # stored prefixes of the others are applied
            for part, append in lost:
                decisions.completed(part.core, part, append, _not_stored(), now)

    # -- reads and state -------------------------------------------------------------------

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        """Up to ``max_records`` stored records from ``offset`` on (every producer's).

        Raises:
            InvalidTopicError: unknown topic or partition.
            BackendUnavailableError: the log could not be read.
        """
        topic = canonical_topic(topic)
        self._partition_exists(topic, partition)
        return self.backend.read(topic, partition, offset, max_records)

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next stored record of the partition will get.

        Raises:
            InvalidTopicError: unknown topic or partition.
            BackendUnavailableError: the log could not be read.
        """
        topic = canonical_topic(topic)
        self._partition_exists(topic, partition)
        return self.backend.end_offset(topic, partition)

    def _partition_exists(self, topic: str, partition: int) -> None:
        count = self.partitions_for(topic, create=False)
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < count:
            raise InvalidTopicError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition!r}")

    def last_sequence(self, topic: str, partition: int) -> int:
        """The last sequence of this broker's producer stored on a partition, or -1."""
        with self._lock:
            part = self._parts.get(TopicPartition(canonical_topic(topic), partition))
            session = self._session
            if part is None or session is None:
                return -1
            return part.checker.last_sequence(session.producer_id)

    def stats(self, topic: str | None = None) -> list[PartitionStats]:
        """This producer's state on every partition it wrote (of one topic)."""
        wanted = None if topic is None else canonical_topic(topic)
        out = []
        with self._lock:
            session = self._session
            for tp, part in sorted(self._parts.items(), key=lambda item: item[0]):
                if wanted is not None and tp.topic != wanted:
                    continue
                checker = part.checker
                producers = tuple(
                    ProducerStats(
                        pid,
                        state.producer_epoch,
                        session.producer_name if session is not None else None,
                        state.last_sequence,
                        state.last_offset,
                        state.last_timestamp,
                    )
                    for pid, state in checker.producers().items()
                )
                out.append(
                    PartitionStats(
                        tp.topic,
                        tp.partition,
                        "ready",
                        self._settings.deduplication(tp.topic),
                        self._settings.policy(tp.topic).value,
                        checker.position,
                        checker.pending,
                        -1,
                        None,
                        0,
                        0.0,
                        0,
                        producers,
                    )
                )
        return out

    # -- the application's transactions ------------------------------------------------------

    def _transactional_log(self) -> ProducerLog:
        """The log, when it takes application transactions (docs/semantics.md, "Application
        transactions"); ``_lock`` held.

        Raises:
            TransactionStateError: the log has none (Pulsar), or no producer is open.
            ProducerFencedError: this producer was fenced.
        """
        if self._failure is not None:
            raise self._failure
        log, session = self._log, self._session
        if log is None or session is None:
            raise TransactionStateError("init_producer first: this broker has no producer yet")
        if not callable(getattr(log, "begin_transaction", None)):
            raise TransactionStateError(
                f"{self._url.split('://', 1)[0]}:// has no transactions: pulsar-client has no transaction API, "
                "so a group of records cannot be committed atomically across partitions (docs/semantics.md, "
                "'Application transactions'); write with one send() per record (each is stored exactly once) "
                "or use kafka:// or sqlite:// for atomic groups"
            )
        return log

    def begin_transaction(self, producer_id: int, producer_epoch: int) -> None:
        """Open the producer's transaction (``producer_id``, ``producer_epoch``: this broker's
        own producer, named for the one interface :class:`~idempotent.broker.broker.Broker`
        shares): every group written until
        :meth:`commit_transaction` or :meth:`abort_transaction` is stored with it, or not at all.

        Raises:
            TransactionStateError: one is open already, or the log has no transactions.
            ProducerFencedError: a newer instance of the producer took over.
            BackendUnavailableError: the log could not be reached (nothing opened).
        """
        with self._lock:
            log = self._transactional_log()
            if self._txn_touched is not None:
                raise TransactionStateError("a transaction is open already: commit or abort it first")
            self._settle(log)
            try:
                log.begin_transaction()  # type: ignore[attr-defined]
            except OwnershipLostError as exc:
                assert self._session is not None
                raise self._fenced(session=self._session, exc=exc) from exc
            self._txn_touched = set()
            self._txn_before = {}

    def commit_transaction(
        self, producer_id: int, producer_epoch: int, positions: bytes | None = None
    ) -> dict[tuple[str, int, int], tuple[int | None, bool]]:
        """Commit the open transaction, with this producer's checker state on every partition
        it wrote and the application's encoded ``positions`` (None: the last committed stay),
        all in the same log transaction. Its groups must all be answered (the producer
        flushes first), so their answers (offsets) are known already: it returns none.

        Raises:
            TransactionStateError: no transaction open.
            TransactionAbortableError: it failed (nothing of it stored): call
                :meth:`abort_transaction`.
            TransactionTimedOutError: its outcome is not known yet: call again.
            ProducerFencedError: a newer instance took over (nothing of it stored).
        """
        from idempotent.errors import TransactionTimedOutError

        with self._lock:
            log = self._transactional_log()
            if self._txn_touched is None:
                raise TransactionStateError("no transaction open to commit")
            session = self._session
            assert session is not None
            if positions is not None and session.producer_name is None:
                raise TransactionStateError("positions need a named producer (an anonymous one has no restart)")
            now = time.time()
            with self._checker_lock:
                states = [
                    (tp.topic, tp.partition, self._parts[tp].core.stored_state(now))
                    for tp in sorted(self._txn_touched or ())
                ]
            try:
                log.commit_transaction(states, positions)  # type: ignore[attr-defined]
            except OwnershipLostError as exc:
                self._txn_touched = None
                raise self._fenced(session=session, exc=exc) from exc
            except (TransactionAbortableError, TransactionStateError):
                raise
            except ProducerError as exc:
                if exc.retriable:
                    raise TransactionTimedOutError(
                        f"the commit's outcome is not known yet, call it again: {exc}"
                    ) from exc
                raise
            self._txn_touched = None
            self._txn_before = {}
            return {}

    def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any, timeout: float) -> None:
        """Commit a consumer group's offsets with the open transaction (Kafka: through the
        producer's own transactional client, to the group's coordinator).

        Raises:
            TransactionStateError: no transaction open, or the log has no consumer groups.
            TransactionAbortableError, TransactionTimedOutError: as the log says.
            ProducerFencedError: a newer instance took over.
        """
        with self._lock:
            log = self._transactional_log()
            if self._txn_touched is None:
                raise TransactionStateError("no transaction open to send offsets to")
            session = self._session
            assert session is not None
            try:
                log.send_offsets(offsets, group_metadata, timeout)  # type: ignore[attr-defined]
            except OwnershipLostError as exc:
                raise self._fenced(session=session, exc=exc) from exc

    def abort_transaction(self, producer_id: int, producer_epoch: int) -> dict[TopicPartition, int]:
        """Abort the open transaction: nothing of it is stored, and this producer's state on
        every partition it wrote is what it was before it, so its sequences are free again
        (a resend of them is new data, never a duplicate of an aborted record).

        Returns:
            The producer's last stored sequence on each partition the transaction wrote
            (-1: none): its client continues after them.

        Raises:
            TransactionStateError: no transaction open.
            ProducerFencedError: a newer instance took over.
        """
        with self._lock:
            log = self._transactional_log()
            session = self._session
            assert session is not None
            self._txn_touched = None
            before, self._txn_before = self._txn_before, {}
            now = time.time()
            rewound: dict[TopicPartition, int] = {}
            own = self._own
            assert own is not None  # (set with the session)
            with self._checker_lock:
                for tp, snapshot in before.items():
                    # a new core over the state from before: the appends of the old one (and
                    # their tickets) are left behind with it
                    part = self._parts[tp] = _OwnPartition(tp, self.config.checker, own, snapshot)
                    rewound[tp] = part.ready(now).last_sequence(session.producer_id)
            try:
                log.abort_transaction()  # type: ignore[attr-defined]
            except OwnershipLostError as exc:
                raise self._fenced(session=session, exc=exc) from exc
            return rewound

    def committed_positions(self, producer_id: int) -> bytes | None:
        """The encoded positions the last committed transaction of this (named) producer
        recorded, read from the log; None when none did.

        Raises:
            TransactionStateError: the log has no transactions.
            BackendUnavailableError: the log could not be read.
        """
        with self._lock:
            log = self._transactional_log()
        found: bytes | None = log.committed_positions()  # type: ignore[attr-defined]
        return found

    def close(self) -> None:
        """Stop writing and release the shared backend when this was its last user. Stored
        batches stay stored; a group in flight has been answered (writes are synchronous)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            log, self._log = self._log, None
        if log is not None:
            log.close()
        _release(self._shared)

    def __enter__(self) -> DirectBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["PRODUCER_LOGS", "DirectBroker", "direct_scheme"]
