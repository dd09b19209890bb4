"""The broker: the sequence checker in front of a log backend, in this process.

This is an I/O shell around the pure core (``_checker``, ``_registry``). It owns the
clock, the locks and the backend calls; every decision is made by the core.

A produce request flows like this (see ``docs/architecture.md``)::

    admit (registry: fenced? unknown?) -> check (checker) -> push -> backend.append
        -> commit (checker, in log order) -> ProduceResult

Each partition has its own lock and checker. A partition's checker is built lazily, from the
newest snapshot plus a replay of the log written after it. When an append fails, its outcome
is unknown, so the partition discards its in-flight state and rebuilds it from the log once
the outstanding appends have drained; until then requests get a retriable
:class:`~idempotent.errors.PartitionRecoveringError`.

The broker composes one shell per concern: the producer records (``producer_records``), the
topics (``topic_directory``), the settings (``broker_settings``), the partitions and their
recovery (``partition_shell``), the leases (``leases``), becoming the backend's writer
(``writer_claim``), the end of each append once the backend answered (``broker_appends``)
and the background loops (``broker_loops``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import ClassVar

from idempotent.api import ProduceShortcuts
from idempotent.backend import AppendBatch, AtomicAppends, LogBackend
from idempotent.broker import decisions
from idempotent.broker.appends import AppendCompletions, PendingAppend
from idempotent.broker.claim import WriterClaim
from idempotent.broker.config import BrokerConfig as BrokerConfig
from idempotent.broker.leases import PartitionLeases
from idempotent.broker.loops import BackgroundLoops
from idempotent.broker.observer import BrokerObserver, notify, observe_produce
from idempotent.broker.partitions import PartitionMap, PartitionShell
from idempotent.broker.producers import ProducerRecords
from idempotent.broker.settings import BrokerSettings
from idempotent.broker.topics import TopicDirectory
from idempotent.broker.topics import validate_topic as validate_topic
from idempotent.broker.transactions import OpenTransaction
from idempotent.core.checker import PartitionChecker, Policy
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.ownership import RENEW_FRACTION, Lease
from idempotent.core.partition import Append
from idempotent.core.records import StoredRecord
from idempotent.core.registry import Admission, ProducerRecord, ProducerRegistry, validate_name
from idempotent.core.request import ProduceRequest
from idempotent.core.settings import DEDUP, POLICY, dedup_value, policy_value
from idempotent.core.stats import partition_stats
from idempotent.core.topics import canonical_topic
from idempotent.core.types import TopicPartition
from idempotent.core.values import LastSequences, PartitionStats, ProducerSession
from idempotent.errors import (
    ConfigError,
    InternalError,
    InvalidBatchError,
    InvalidTopicError,
    NotOwnerError,
    ProducerClosedError,
    ProducerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
    TransactionTimedOutError,
    UnknownProducerError,
)
from idempotent.runtime.future import LightFuture

_LOG = logging.getLogger("idempotent.broker")


class Broker(ProduceShortcuts):
    """The sequence checker in front of a log backend. Thread-safe.

    Use :func:`idempotent.connect` to open one from a URL.
    """

    def __init__(self, backend: LogBackend, config: BrokerConfig | None = None) -> None:
        self.backend = backend
        self.config = config or BrokerConfig()
        self._closed = False
        self._lock = threading.RLock()
        self._producers = ProducerRecords(backend, self._lock, self.config.id_block_size)
        self._settings = BrokerSettings(backend, self._lock, self.config.deduplication, self.config.policy)
        self._stop = threading.Event()
        self._topics = TopicDirectory(
            backend,
            self._lock,
            self._stop,
            auto_create=self.config.auto_create_topics,
            default_partitions=self.config.default_partitions,
            refresh_interval=self.config.topic_refresh_interval,
            join_timeout=self.config.append_timeout,
        )
        self._observers: tuple[BrokerObserver, ...] = ()
        self._partition_map = PartitionMap(
            self._lock, self.config.checker, backend, self._current_observers, self._producers
        )
        #: the open partitions (the map's dict: read without a lock, entries never removed)
        self._partitions = self._partition_map.parts
        #: producer id -> its open transaction (transactions.py); guarded by _txn_lock, which
        #: is never held while a partition's lock is taken
        self._txns: dict[int, OpenTransaction] = {}
        #: producer id -> how its last transaction ended (epoch, when, "committed" or
        #: "aborted", the answer): a repeated commit or abort (a client that lost the answer)
        #: gets the same answer
        self._ended: dict[int, tuple[int, float, str, object]] = {}
        self._txn_lock = threading.Lock()
        #: whether the backend confirmed this broker as its writer (see _claim_writer)
        self._writer = WriterClaim(
            backend, self._lock, self._producers, self._topics, self._settings, self._partition_map
        )
        #: finishes the appends the backend answers (broker_appends.py)
        self._appends = AppendCompletions(self._current_observers)
        #: the maintenance sweep and the lease heartbeat, and a bug either hit (broker_loops.py)
        self._loops = BackgroundLoops(self._stop)
        if self.config.maintenance_interval > 0:
            self._loops.start(
                "idempotent-maintenance", self.config.maintenance_interval, "maintenance", lambda: self.maintain()
            )
        #: the leases of this broker, when it shares its backend with others (a broker_id)
        self._ownership: PartitionLeases | None = None
        if self.config.broker_id is not None:
            self._ownership = PartitionLeases(
                backend, self.config.broker_id, self.config.advertised_address, self.config.lease_duration
            )
            self._loops.start(
                "idempotent-leases",
                self.config.lease_duration * RENEW_FRACTION / 2,
                "renewing leases",
                lambda: self.renew_leases(),
            )

    @property
    def url(self) -> str:
        """The backend URL this broker stores into."""
        return self.backend.url

    def add_observer(self, observer: BrokerObserver) -> None:
        """Tell ``observer`` about every later event (see :mod:`idempotent.broker.observer`)."""
        with self._lock:
            if observer not in self._observers:
                self._observers = (*self._observers, observer)

    def remove_observer(self, observer: BrokerObserver) -> None:
        """Stop telling ``observer`` about events; no error when it was not added."""
        with self._lock:
            self._observers = tuple(o for o in self._observers if o is not observer)

    # -- topics ----------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic. Idempotent when it already exists with the same partition count.

        A topic that exists in the backend but is new to this broker (created by another
        broker or process, or on Kafka and Pulsar by their own tools) is looked up first, and
        adopted when it is not in the topic records yet (see ``docs/backends.md``).

        Raises:
            InvalidTopicError: bad name, bad count, or the topic exists with another count
                (it is then known, and used, with its own count).
            BackendUnavailableError: the backend failed; nothing is known to have changed.
        """
        self._check_open()
        self._topics.create(validate_topic(name), partitions)

    def delete_topic(self, name: str) -> None:
        """Delete a topic: its records, checker state and snapshots, and its topic-level
        deduplication and policy settings. Producers keep their ids and epochs; a topic
        created again under the name starts empty, with no sequences known.

        Delete through the broker that serves the topic: another process serving it keeps
        what it had read.

        Raises:
            InvalidTopicError: bad name, or no such topic (nothing changed).
            BackendUnavailableError: the backend failed; the topic may be partly deleted
                (delete it again).
        """
        self._check_open()
        name = validate_topic(name)
        with self._lock:
            if not self._topics.known(name):  # (another process may have created it)
                raise InvalidTopicError(f"unknown topic {name!r}")
            self._partition_map.drop_topic(name)
            self._settings.clear_topic(name)
            self.backend.delete_topic(name)
            self._topics.forget(name)

    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        return self._topics.topics()

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        """The partition count of ``topic``. A topic new to this broker is looked up in the
        backend before anything is created, and used with the count it really has (adopted
        into the topic records); a missing one is created with ``default_partitions`` if
        ``create`` and ``auto_create_topics`` allow. A known count is read again in the
        background after ``topic_refresh_interval`` seconds (:mod:`idempotent.broker.topics`).

        Raises:
            InvalidTopicError: bad name, or no such topic (with ``create`` False or
                auto-creation off).
            BackendUnavailableError: the backend failed looking up a topic new to this broker.
        """
        return self._topics.partitions_for(validate_topic(topic), create=create)

    def _partition(self, topic: str, partition: int, *, create: bool = True) -> PartitionShell:
        topic = validate_topic(topic)
        count = self._topics.count_covering(topic, partition, create=create)  # partitions may have been added
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < count:
            raise InvalidTopicError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition!r}")
        return self._partition_map.open(TopicPartition(topic, partition))

    # -- settings --------------------------------------------------------------------------

    def set_deduplication(
        self, enabled: bool | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        """Switch deduplication on or off for a topic, a namespace, or (neither) the broker.

        ``None`` removes the override so the next level applies (topic, namespace, broker).
        """
        self._set(DEDUP, dedup_value(enabled), topic, namespace)

    def set_policy(
        self, policy: Policy | str | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        """Set the sequence policy (``strict`` or ``monotonic``) at one level, or clear it.

        Raises:
            ConfigError: unknown policy.
        """
        self._set(POLICY, policy_value(policy), topic, namespace)

    def _set(self, kind: str, value: str | None, topic: str | None, namespace: str | None) -> None:
        self._check_open()
        self._settings.set(kind, value, topic, namespace)

    def refresh_settings(self) -> bool:
        """Reload the deduplication and policy settings from the backend, so that changes
        stored there by another process (``idempotent admin`` on a backend URL) apply here.
        :meth:`maintain` calls it, so a running broker follows them within
        ``maintenance_interval`` seconds.

        Returns:
            False when the backend could not be read; the settings in force are kept.
        """
        return self._settings.refresh()

    def deduplication_enabled(self, topic: str) -> bool:
        """Whether the checker rejects duplicates and gaps on ``topic``.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        return self._deduplication(validate_topic(topic))

    def policy_for(self, topic: str) -> Policy:
        """The sequence policy in force on ``topic``.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        return self._policy(validate_topic(topic))

    def _deduplication(self, topic: str) -> bool:
        return self._settings.deduplication(topic)

    def _policy(self, topic: str) -> Policy:
        return self._settings.policy(topic)

    # -- producers -------------------------------------------------------------------------

    def init_producer(
        self,
        producer_name: str | None = None,
        *,
        timeout: float = 30.0,
        claim: Callable[[ProducerRecord | None], str | None] | None = None,
    ) -> ProducerSession:
        """Allocate a producer id, or re-initialise a named producer.

        A named producer keeps its id, gets its epoch bumped (fencing every older instance)
        and learns its last persisted sequence on every partition, so it can continue its
        sequences. Batches the old instance still has in flight are waited for (up to
        ``timeout``) so that the sequences returned are final.

        ``claim`` decides who owns the producer: it is called under the broker lock, before
        anything changes, with the name's current record (None for a new name or an anonymous
        producer), and returns the principal to record as the owner, or raises (for example
        :class:`~idempotent.errors.AuthorizationError`, see
        :meth:`idempotent.net.auth.AccessPolicy.claim`). Without it, an existing record keeps its
        owner and a new one is unowned.

        Raises:
            ConfigError: bad name.
            AuthorizationError: (from ``claim``) the caller may not use the name; nothing changed.
            BackendUnavailableError: the registry could not be stored; nothing changed.
            RequestTimeoutError: in-flight batches of the old instance did not drain.
        """
        try:
            session = self._init_producer(producer_name, timeout, claim)
        except BaseException:
            notify(self._observers, "producer_initialised", producer_name is not None, False)
            raise
        notify(self._observers, "producer_initialised", producer_name is not None, True)
        return session

    def _init_producer(
        self, producer_name: str | None, timeout: float, claim: Callable[[ProducerRecord | None], str | None] | None
    ) -> ProducerSession:
        self._check_open()
        if self._ownership is not None:
            self._refresh_producers()  # other brokers may have initialised it or noted partitions
        if producer_name is not None:
            validate_name(producer_name)
        self._claim_writer()
        record, previous = self._producers.initialise(producer_name, claim, time.time())
        last: dict[TopicPartition, int] = {}
        elsewhere: list[tuple[str, int]] = []
        if producer_name is not None and (previous is None or previous.producer_id == record.producer_id):
            deadline = time.monotonic() + timeout
            topics = self.topics()
            noted = [(t, p) for t, p in (previous.partitions if previous is not None else ()) if p < topics.get(t, 0)]
            for part in [self._partition(t, p, create=False) for t, p in noted]:
                with part.lock:
                    if self._ownership is not None:
                        try:
                            self._own(part)
                        except NotOwnerError:
                            elsewhere.append(part.tp)
                            continue
                    seq = part.last_sequence(record.producer_id, deadline - time.monotonic(), repr(producer_name))
                    if seq >= 0:
                        last[part.tp] = seq
        max_record_bytes, max_batch_bytes = self.limits()
        return ProducerSession(
            record.producer_id,
            record.producer_epoch,
            record.producer_name,
            LastSequences(last),
            previous is not None and previous.state_lost,
            tuple(elsewhere),
            max_record_bytes,
            max_batch_bytes,
        )

    def limits(self) -> tuple[int, int]:
        """The largest record and the largest batch this broker takes: ``max_record_bytes``
        and ``max_batch_bytes`` of its config, lowered to what its backend stores in one
        piece (``LogBackend.max_record_bytes``/``max_batch_bytes``: Kafka's
        ``message.max.bytes``, Pulsar's entry size). A record must also fit a batch."""
        batch = self.config.max_batch_bytes
        if self.backend.max_batch_bytes is not None:
            batch = min(batch, self.backend.max_batch_bytes)
        record = min(self.config.max_record_bytes, batch)
        if self.backend.max_record_bytes is not None:
            record = min(record, self.backend.max_record_bytes)
        return record, batch

    def last_sequence(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, *, timeout: float = 30.0
    ) -> int:
        """The last stored sequence of a producer on a partition this broker owns, -1 if none:
        what a re-initialised named producer continues from on a partition listed in
        :attr:`ProducerSession.elsewhere`. Batches of older epochs still in flight are waited
        for first; from now on this broker refuses them as FENCED.

        Raises:
            NotOwnerError: another broker owns the partition; ask it.
            UnknownProducerError: no producer with this id and epoch is stored.
            RequestTimeoutError: in-flight batches did not drain within ``timeout``.
            InvalidTopicError: unknown topic or partition.
        """
        self._check_open()
        part = self._partition(topic, partition, create=False)
        with part.lock:
            self._own(part)
            if self._registry.admit(producer_id, producer_epoch) == Admission.UNKNOWN:
                self._refresh_producers()
            record = self._registry.lookup(producer_id)
            if record is None or record.producer_epoch != producer_epoch:
                raise UnknownProducerError(
                    f"no producer {producer_id} at epoch {producer_epoch} in {self.url}", producer_id
                )
            return part.last_sequence(producer_id, timeout, f"producer {producer_id}")

    def producer_record(self, producer_id: int, *, refresh: bool = False) -> ProducerRecord | None:
        """The registry record of a producer id, or None.

        With ``refresh``, a broker sharing its backend with other brokers reloads the stored
        producer records when it does not know the id (it may have been initialised through
        another broker), so that an access check sees the producer's owner.

        Raises:
            BackendUnavailableError: the reload could not read the backend.
        """
        record = self._producers.lookup(producer_id)
        if record is None and refresh and self._ownership is not None:
            self._refresh_producers()
            record = self._producers.lookup(producer_id)
        return record

    # -- produce ---------------------------------------------------------------------------

    @property
    def produce_timeout(self) -> float:
        """Seconds :meth:`produce` waits for the backend to acknowledge (``append_timeout``)."""
        return self.config.append_timeout

    # produce(topic, partition, producer_id, producer_epoch, base_sequence, records,
    # previous_sequence) and submit_produce(...) come from ProduceShortcuts: they build one
    # ProduceRequest (validated there) and call submit_request. A batch that names a
    # ``previous_sequence`` other than the producer's latest pushed one is OUT_OF_ORDER_SEQUENCE
    # under the ``monotonic`` policy (docs/semantics.md); ``strict`` ignores it.

    attempts_in_order: ClassVar[bool] = True  # in the producer's process (ProduceShortcuts)

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        """Check a batch and store it if accepted; return at once with a future of the result.

        Batches submitted for one partition are written in submission order, so a client may
        pipeline several.

        Returns:
            The future of the outcome (see :class:`idempotent.Outcome`). It fails with
            BackendUnavailableError or RequestTimeoutError when the append's outcome is
            unknown (resending the same batch is safe).

        Raises:
            InvalidBatchError, InvalidTopicError: the batch exceeds this broker's limits, or
                the partition does not exist; nothing changed.
            PartitionRecoveringError: retry shortly; nothing changed.
            NotOwnerError: another broker owns the partition (several brokers); nothing
                changed, send it to ``owner``.
        """
        observers = self._observers
        if not observers:
            return self._submit(request)
        return observe_produce(observers, request, self._submit)

    def _refused(self, topic: str, partition: int, error: ProducerError) -> None:
        observers = self._observers
        if observers:
            try:
                topic = canonical_topic(topic)
            except InvalidTopicError:
                return  # no topic to report it under
            notify(observers, "produce_failed", topic, partition, error, 0.0)

    def _submit(self, request: ProduceRequest) -> Future[ProduceResult]:
        """``submit_request`` without observers."""
        self._check_open()
        max_record, max_batch = self.limits()
        if request.largest > max_record:
            raise InvalidBatchError(
                f"a record of {request.largest} bytes exceeds the broker's max_record_bytes={max_record}"
            )
        if request.size > max_batch:
            raise InvalidBatchError(f"a batch of {request.size} bytes exceeds the broker's max_batch_bytes={max_batch}")
        topic, partition, header = request.topic, request.partition, request.header
        # a dict read needs no lock (partitions are never removed); the first batch of a
        # partition takes the slow path, which checks the partition count
        part = self._partitions.get(TopicPartition(topic, partition)) or self._partition(topic, partition)
        if self._txns:
            txn = self._txns.get(header.producer_id)
            if txn is not None and txn.producer_epoch == header.producer_epoch:
                return self._hold(txn, part, request)
        now = _now_ms()
        self._claim_writer()
        with part.lock:
            self._own(part)
            self._ready(part)
            policy, enabled = self._policy(topic), self._deduplication(topic)
            # admission, a refresh of the producer records, evictions, the first write's note
            # and the append's ticket: the one decision loop (decisions.py), with this
            # partition's shell as its effects
            decision = decisions.offer(
                part.core,
                part,
                header,
                now,
                policy=policy,
                enabled=enabled,
                refreshable=self._ownership is not None,  # another broker may have initialised it
            )
            if not isinstance(decision, Append):
                return _done(decision)
            append = decision
            started = time.monotonic()
            out: Future[ProduceResult] = LightFuture()
            try:
                appended = self.backend.append(
                    topic, partition, AppendBatch(header, request.records, now), append.snapshot
                )
            except BaseException as exc:
                appended = LightFuture()
                appended.set_exception(exc)
            # a synchronous backend's append is finished here, under the partition lock (a
            # failed one marks the partition failed before any later batch of it is appended);
            # an asynchronous backend's on the completion thread (broker_appends.py)
            self._appends.track(PendingAppend(part, append, started, out), appended)
        return out

    # -- the application's transactions (transactions.py) -----------------------------------

    #: a transaction's batches are held until its commit (answered without offsets until then)
    holds_transactions: ClassVar[bool] = True

    def _transactional(self) -> AtomicAppends:
        """The backend, when it stores a transaction atomically.

        Raises:
            TransactionStateError: it cannot (Kafka or Pulsar under a broker server).
        """
        backend = self.backend
        if not isinstance(backend, AtomicAppends):
            scheme = self.url.split("://", 1)[0]
            raise TransactionStateError(
                f"a broker over {scheme}:// has no transactions (docs/semantics.md, 'Application "
                "transactions'): open the producer on kafka:// itself, or run the broker on sqlite://"
            )
        return backend

    def begin_transaction(self, producer_id: int, producer_epoch: int) -> None:
        """Open a transaction for the producer: its batches are held, unwritten and unseen,
        until :meth:`commit_transaction` stores them all at once or :meth:`abort_transaction`
        forgets them.

        Raises:
            TransactionStateError: one is open already, or the backend has no transactions.
            ProducerFencedError: a newer instance of the producer took over; nothing opened.
        """
        self._check_open()
        self._transactional()
        if self._registry.admit(producer_id, producer_epoch) is Admission.FENCED:
            raise ProducerFencedError(f"producer {producer_id} epoch {producer_epoch}: a newer instance took over")
        with self._txn_lock:
            existing = self._txns.get(producer_id)
            if existing is not None and existing.producer_epoch == producer_epoch and existing.idle:
                return  # a repeated begin (a client that lost the answer)
            if existing is not None and existing.producer_epoch >= producer_epoch:
                raise TransactionStateError("a transaction is open already: commit or abort it first")
            self._ended.pop(producer_id, None)
            # (an older epoch's is a fenced instance's, dead or not: replaced, nothing of it stored)
            self._txns[producer_id] = OpenTransaction(producer_epoch, time.monotonic())

    def _hold(self, txn: OpenTransaction, part: PartitionShell, request: ProduceRequest) -> Future[ProduceResult]:
        """Hold a batch of an open transaction; ACCEPTED, with no offset yet."""
        self._claim_writer()
        with part.lock:
            self._own(part)
            last = self._ready(part).last_sequence(request.header.producer_id)
        limit = self.config.max_transaction_bytes
        with self._txn_lock:
            if txn.aborted is None:  # (an aborted one's commit fails: nothing of it is stored)
                txn.hold(request, last)
                if txn.size > limit:
                    _LOG.warning(
                        "aborted the transaction of producer %d: it holds over %d bytes (max_transaction_bytes)",
                        request.header.producer_id,
                        limit,
                    )
                    txn.abort(f"it held more than the broker's max_transaction_bytes ({limit})")
        return _done(ProduceResult(Outcome.ACCEPTED))

    def commit_transaction(
        self, producer_id: int, producer_epoch: int, positions: bytes | None = None
    ) -> dict[tuple[str, int, int], tuple[int | None, bool]]:
        """Offer the transaction's batches to their checkers, in order, and store the
        accepted ones with ``positions`` (None: the last committed stay) in one atomic write.

        Returns:
            Per batch (topic, partition, base sequence): its base offset and whether it was a
            duplicate of a stored one (None: a duplicate out of the checker's window).

        Raises:
            TransactionStateError: no transaction open; ``positions`` of an anonymous producer.
            TransactionAbortableError: a checker refused a batch (a gap); nothing stored:
                abort.
            TransactionTimedOutError: the backend failed, or the outcome is not known yet;
                still open: call again (what was stored is then a DUPLICATE).
            ProducerFencedError: a newer instance took over; nothing stored, transaction gone.
        """
        self._check_open()
        backend = self._transactional()
        txn = self._open_transaction(producer_id, producer_epoch)
        if txn is None:
            return self._repeated(producer_id, producer_epoch, "committed")  # type: ignore[return-value]
        if txn.aborted is not None:
            raise TransactionAbortableError(
                f"the broker aborted the transaction because {txn.aborted}: nothing of it is stored, abort it"
            )
        name = self._producer_name(producer_id)
        if positions is not None and name is None:
            raise TransactionStateError("positions need a named producer (an anonymous one has no restart)")
        self._claim_writer()
        parts = {tp: self._partition(tp.topic, tp.partition) for tp in txn.partitions}
        now, started = _now_ms(), time.monotonic()
        answered: dict[tuple[str, int, int], tuple[int | None, bool]] = {}
        offered: list[tuple[PartitionShell, Append, ProduceRequest]] = []
        with contextlib.ExitStack() as held:
            for part in parts.values():
                held.enter_context(part.lock)
            refusal: ProduceResult | ProducerError | None = None
            try:
                for request in txn.requests:
                    part = parts[TopicPartition(request.topic, request.partition)]
                    self._own(part)
                    self._ready(part)
                    decision = decisions.offer(
                        part.core,
                        part,
                        request.header,
                        now,
                        policy=self._policy(request.topic),
                        enabled=self._deduplication(request.topic),
                        refreshable=self._ownership is not None,
                    )
                    if isinstance(decision, Append):
                        offered.append((part, decision, request))
                    elif decision.outcome is Outcome.DUPLICATE:
                        answered[_held_key(request)] = (decision.base_offset, True)
                    else:
                        refusal = decision
                        break
            except ProducerError as exc:
                refusal = exc
            if refusal is not None:
                self._forget(offered, started)
                raise self._refused_commit(producer_id, refusal)
            if not offered and positions is None:
                group: Future[list[int]] = _done_offsets()
            else:
                group = backend.append_atomic(
                    [(r.topic, r.partition, AppendBatch(r.header, r.records, now), a.snapshot) for _, a, r in offered],
                    None if positions is None or name is None else (name, positions),
                )
            outs: list[Future[ProduceResult]] = []
            pieces: list[Future[int]] = []
            for part, append, _ in offered:
                out: Future[ProduceResult] = LightFuture()
                piece: Future[int] = LightFuture()
                self._appends.track(PendingAppend(part, append, started, out), piece)
                outs.append(out)
                pieces.append(piece)
            group.add_done_callback(partial(_split_group, pieces))
        deadline = started + self.config.append_timeout
        try:
            group.result(max(0.0, deadline - time.monotonic()))
            results = [out.result(max(0.0, deadline - time.monotonic())) for out in outs]
        except (ProducerError, TimeoutError) as exc:
            if isinstance(exc, ProducerError) and not exc.retriable:
                raise
            txn.in_doubt = True
            raise TransactionTimedOutError(f"the commit's outcome is not known yet, call it again: {exc}") from exc
        for (_, _, request), result in zip(offered, results, strict=True):
            answered[_held_key(request)] = (result.base_offset, result.outcome is Outcome.DUPLICATE)
        with self._txn_lock:
            if self._txns.get(producer_id) is txn:
                del self._txns[producer_id]
                self._ended[producer_id] = (producer_epoch, time.monotonic(), "committed", answered)
        return answered

    def _open_transaction(self, producer_id: int, producer_epoch: int) -> OpenTransaction | None:
        """The producer's open transaction, when this epoch opened it.

        Raises:
            ProducerFencedError: a newer instance of the producer opened it.
        """
        with self._txn_lock:
            txn = self._txns.get(producer_id)
        if txn is None or txn.producer_epoch == producer_epoch:
            return txn
        if txn.producer_epoch > producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch}: a newer instance (epoch {txn.producer_epoch}) "
                "took over; nothing of this instance's transaction is stored"
            )
        return None

    def _repeated(self, producer_id: int, producer_epoch: int, kind: str) -> object:
        """The answer of a transaction's end called again once it ended (``kind``).

        Raises:
            TransactionStateError: no transaction of this producer ended so.
        """
        with self._txn_lock:
            ended = self._ended.get(producer_id)
        if ended is None or ended[0] != producer_epoch or ended[2] != kind:
            verb = "commit" if kind == "committed" else "abort"
            raise TransactionStateError(f"no transaction open to {verb}")
        return ended[3]

    def _forget(self, offered: list[tuple[PartitionShell, Append, ProduceRequest]], started: float) -> None:
        """Withdraw the appends a refused commit offered (part locks held): each fails
        unwritten, and its partition is rebuilt from the log, as after a failed append."""
        for part, append, _ in offered:
            withdrawn: Future[int] = LightFuture()
            withdrawn.set_exception(TransactionAbortableError("the transaction's commit was refused"))
            answer: Future[ProduceResult] = LightFuture()
            self._appends.track(PendingAppend(part, append, started, answer), withdrawn)

    def _refused_commit(self, producer_id: int, refusal: ProduceResult | ProducerError) -> ProducerError:
        """What a commit a checker (or the backend) refused raises."""
        if isinstance(refusal, ProducerError):
            if refusal.retriable:
                return TransactionTimedOutError(f"the commit could not be decided yet, call it again: {refusal}")
            return refusal
        if refusal.outcome is Outcome.FENCED:
            with self._txn_lock:
                self._txns.pop(producer_id, None)
            return ProducerFencedError(
                f"producer {producer_id}: a newer instance (epoch {refusal.producer_epoch}) took over; "
                "nothing of the transaction is stored"
            )
        if refusal.outcome is Outcome.IN_FLIGHT:
            return TransactionTimedOutError("an earlier attempt of the commit is still being written: call it again")
        return TransactionAbortableError(
            f"a batch of the transaction was refused ({refusal.outcome.value}, expected sequence "
            f"{refusal.expected_sequence}): nothing of it is stored, abort it"
        )

    def abort_transaction(self, producer_id: int, producer_epoch: int) -> dict[TopicPartition, int]:
        """Forget the transaction's batches (none was written).

        Returns:
            The producer's last stored sequence on each partition it wrote: its client goes on
            after them.

        Raises:
            TransactionStateError: no transaction open; or an earlier commit of it whose
                outcome was unknown turned out stored (call commit again: it completes).
            PartitionRecoveringError, BackendUnavailableError: that could not be learnt yet;
                still open, call again.
        """
        txn = self._open_transaction(producer_id, producer_epoch)
        if txn is None:
            return self._repeated(producer_id, producer_epoch, "aborted")  # type: ignore[return-value]
        if txn.in_doubt:  # the checkers, rebuilt from the log, know whether it was stored
            for tp, before in txn.before.items():
                part = self._partition(tp.topic, tp.partition)
                with part.lock:
                    self._own(part)
                    if self._ready(part).last_sequence(producer_id) != before:
                        raise TransactionStateError(
                            "the transaction's earlier commit was stored after all: call commit_transaction "
                            "again, which completes it (its batches are answered as duplicates)"
                        )
        rewound = dict(txn.before)
        with self._txn_lock:
            if self._txns.get(producer_id) is txn:
                del self._txns[producer_id]
                self._ended[producer_id] = (producer_epoch, time.monotonic(), "aborted", rewound)
        return rewound

    def committed_positions(self, producer_id: int) -> bytes | None:
        """The positions the last committed transaction of this (named) producer stored.

        Raises:
            TransactionStateError: the backend has no transactions.
            BackendUnavailableError: the backend could not be read.
        """
        backend = self._transactional()
        name = self._producer_name(producer_id)
        return None if name is None else backend.committed_positions(name)

    def _current_observers(self) -> tuple[BrokerObserver, ...]:
        return self._observers

    @property
    def _registry(self) -> ProducerRegistry:
        """The producer registry (read without a lock on the produce path)."""
        return self._producers.registry

    def _claim_writer(self) -> None:
        """Become the backend's writer before deciding on a write (:meth:`WriterClaim.claim`).
        When the backend says this broker just became it (SQLite: another process wrote the
        file until now), everything read before is stale: producer records, settings, topics
        and every partition's checker are rebuilt from what is stored now, never from what was
        cached while not the writer.

        Raises:
            ConfigError: another live process writes the backend (SQLite).
            BackendUnavailableError: the backend failed.
        """
        if not self._writer.claimed:
            self._writer.claim()

    def _ready(self, part: PartitionShell) -> PartitionChecker:
        """The partition's checker, recovered first if needed (:meth:`PartitionShell.ready`).
        Needs part.lock.

        Raises:
            PartitionRecoveringError: appends are still outstanding, or the snapshot after
                the evictions of the recovery could not be stored.
            BackendUnavailableError: the snapshot or the log could not be read.
        """
        return part.ready()

    # -- ownership (several brokers over one backend) -----------------------------------------

    def owner_of(self, topic: str, partition: int, *, refresh: bool = True) -> Lease | None:
        """The partition's ownership record, or None when nobody holds it (never claimed,
        released) or when this broker is not configured with a ``broker_id``.

        ``refresh`` reads the records from the backend first; else the view from the last
        heartbeat is used. The record may name a broker that died and whose lease has not
        expired yet.

        Raises:
            InvalidTopicError: unknown topic or partition.
            BackendUnavailableError: the records could not be read.
        """
        tp = self._partition(topic, partition, create=False).tp
        return None if self._ownership is None else self._ownership.owner_of(tp, refresh=refresh)

    def owners(self, topic: str) -> list[Lease | None]:
        """:meth:`owner_of` for every partition of ``topic``, from one read of the records.

        Raises:
            InvalidTopicError: unknown topic.
            BackendUnavailableError: the records could not be read.
        """
        topic = validate_topic(topic)
        count = self.partitions_for(topic, create=False)
        if self._ownership is None:
            return [None] * count
        return self._ownership.owners([TopicPartition(topic, p) for p in range(count)])

    def advertise(self, address: str) -> None:
        """Set the address written into the leases this broker claims or renews from now on
        (a server learns its port only once it listens)."""
        if self._ownership is not None:
            self._ownership.advertise(address)

    def owned(self) -> list[TopicPartition]:
        """The partitions whose lease this broker holds now (empty without a ``broker_id``)."""
        return [] if self._ownership is None else self._ownership.owned()

    def _serving(self, part: PartitionShell) -> bool:
        """Whether this broker may touch the partition's log now (write, snapshot, recover)."""
        return self._ownership is None or self._ownership.holds(part.tp)

    def _own(self, part: PartitionShell) -> None:
        """Make sure this broker holds the partition's lease (:meth:`PartitionLeases.own`).
        A claim drops the partition's state: it is rebuilt from the newest snapshot and the
        log, and opening the partition again fences the previous writer. Needs part.lock.

        Raises:
            NotOwnerError: another broker holds a live lease (or won the claim).
            BackendUnavailableError: the records could not be read or stored.
        """
        if self._ownership is not None and self._ownership.own(part.tp):
            # whatever this broker knew about the partition may be stale: start over
            self.backend.release(part.tp.topic, part.tp.partition)
            part.core.forget()

    def renew_leases(self) -> None:
        """Read every ownership record and renew the leases this broker holds that are due
        (the heartbeat; the lease thread calls it every sixth of ``lease_duration``). Also
        picks up producers and settings that other brokers stored.

        Raises:
            BackendUnavailableError: the backend failed; leases not renewed in time lapse.
        """
        if self._ownership is None:
            return
        self._ownership.renew()  # backend I/O outside its lock: produce requests check leases under it
        self._refresh_producers()
        self.refresh_settings()  # keeps a change made here while the load was under way

    def _refresh_producers(self) -> None:
        """Adopt producer records that other brokers stored (new producers, higher epochs)."""
        self._producers.refresh()

    # -- reading ---------------------------------------------------------------------------

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        """Read up to ``max_records`` stored records from ``offset`` on.

        Raises:
            InvalidTopicError: unknown topic or partition.
            ConfigError: negative offset or non-positive max_records.
        """
        self._check_open()
        if not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"offset must be a non-negative int, got {offset!r}")
        if not isinstance(max_records, int) or max_records < 1:
            raise ConfigError(f"max_records must be a positive int, got {max_records!r}")
        topic = self._partition(topic, partition, create=False).tp.topic
        return self.backend.read(topic, partition, offset, max_records)

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next stored record of the partition will get."""
        topic = self._partition(topic, partition, create=False).tp.topic
        return self.backend.end_offset(topic, partition)

    # -- observability and maintenance -------------------------------------------------------

    def stats(self, topic: str | None = None, *, recover: bool = True) -> list[PartitionStats]:
        """Checker state of every partition (of one topic), recovering partitions as needed.
        With several brokers, only of the partitions this broker owns.

        With ``recover`` False only the partitions whose checker is already in memory are
        reported and none is recovered or read from the backend (what a metrics scrape needs).

        Raises:
            InvalidTopicError: unknown topic.
            PartitionRecoveringError: a partition never loaded cannot be recovered yet.
            BackendUnavailableError: recovering a partition failed.
        """
        self._check_open()
        names = [validate_topic(topic)] if topic is not None else sorted(self.topics())
        out = []
        now = time.time()
        for name in names:
            for p in range(self.partitions_for(name, create=False)):
                tp = TopicPartition(name, p)  # without ``recover``, only the partitions opened
                part = self._partition(name, p, create=False) if recover else self._partitions.get(tp)
                if part is None or not self._serving(part):
                    continue  # (or another broker owns it: ask that one)
                with part.lock:
                    checker = part.checker(recover=recover)
                    if checker is None:
                        continue
                    out.append(
                        partition_stats(
                            part.tp,
                            part.core,
                            checker,
                            deduplication=self.deduplication_enabled(name),
                            policy=self.policy_for(name),
                            name_of=self._producer_name,
                            now=now,
                        )
                    )
        return out

    def _producer_name(self, producer_id: int) -> str | None:
        record = self._registry.lookup(producer_id)
        return None if record is None else record.producer_name

    def checker_state(self, topic: str, partition: int) -> dict[int, tuple[object, ...]]:
        """The persisted checker state of one partition as plain values (for tests and tools)."""
        part = self._partition(topic, partition, create=False)
        with part.lock:
            self._own(part)
            return self._ready(part).state()

    def maintain(self, now: float | None = None) -> None:
        """Abort the application transactions open past ``transaction_timeout``, expire idle
        producers, write snapshots that are due (time-based trigger), reload the
        deduplication settings from the backend (see :meth:`refresh_settings`), and delete
        producer records idle for longer than ``producer_record_retention``.

        Raises:
            BackendUnavailableError: the backend failed; what was done before stays done.
        """
        now = time.time() if now is None else now
        self._expire_transactions(time.monotonic())
        self.refresh_settings()
        self._expire_records(now, self._partition_map.maintain(now, self._serving))

    def _expire_transactions(self, now: float) -> None:
        """Abort the transactions open longer than ``transaction_timeout`` (not one whose
        commit is in doubt: it may be stored), freeing what they held."""
        limit = self.config.transaction_timeout
        with self._txn_lock:
            for producer_id in [p for p, (_, at, _, _) in self._ended.items() if now - at > limit]:
                del self._ended[producer_id]  # a repeat comes within a request's timeout
            for producer_id, txn in self._txns.items():
                if txn.aborted is None and not txn.in_doubt and now - txn.opened_at > limit:
                    _LOG.warning(
                        "aborted the transaction of producer %d: open for over %g s (transaction_timeout)",
                        producer_id,
                        limit,
                    )
                    txn.abort(f"it was open longer than the broker's transaction_timeout ({limit:g} s)")

    def _expire_records(self, now: float, activity: Mapping[int, float]) -> None:
        """Carry out :meth:`ProducerRegistry.sweep`: store the touched records, delete the
        expired ones. Only the backend's writer does it (a SQLite file read by another
        process is left alone)."""
        if not self._writer.claimed:
            return
        if self._ownership is not None:
            self._refresh_producers()  # last uses other brokers noted
        retention = self.config.producer_record_retention
        deleted = self._producers.expire(now, retention, activity)
        if deleted:
            _LOG.info("deleted %d producer records idle for over %.0f s", deleted, retention)

    @property
    def _failure(self) -> InternalError | None:
        """A bug a background loop hit (:class:`~idempotent.broker.loops.BackgroundLoops`):
        every later request raises it."""
        return self._loops.failure

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise ProducerClosedError(f"broker for {self.url} is closed")

    def close(self) -> None:
        """Snapshot every partition with new entries, release the leases this broker holds
        (several brokers: others may claim them at once) and close the backend.

        Appends already acknowledged stay stored; pending ones are waited for briefly.
        """
        if self._closed:
            return
        self._stop.set()
        self._stop_refresher()
        self._partition_map.close(time.time(), self._serving)
        if self._ownership is not None:
            self._ownership.release_all()
        self._closed = True
        self._appends.stop()
        self.backend.close()

    def abandon(self) -> None:
        """Drop this broker as a crash would (tests): no final snapshots, nothing flushed;
        the backend's handles are released as the operating system would on process death."""
        self._stop.set()
        self._stop_refresher()
        self._closed = True
        self._appends.stop()
        self.backend.close()

    def _stop_refresher(self) -> None:
        """End the background reads of partition counts before the backend closes."""
        self._topics.stop()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _now_ms() -> float:
    """Wall-clock time in seconds, at millisecond precision: what every backend can store
    (Kafka and Pulsar keep milliseconds), so a replay sees the same timestamps as live."""
    return int(time.time() * 1000) / 1000


def _held_key(request: ProduceRequest) -> tuple[str, int, int]:
    return request.topic, request.partition, request.header.base_sequence


def _done_offsets() -> Future[list[int]]:
    future: Future[list[int]] = LightFuture()
    future.set_result([])
    return future


def _split_group(pieces: list[Future[int]], group: Future[list[int]]) -> None:
    """Hand a transaction's stored group to its appends, one base offset each."""
    exc = group.exception()
    if exc is not None:
        for piece in pieces:
            piece.set_exception(exc)
        return
    for piece, offset in zip(pieces, group.result(), strict=True):
        piece.set_result(offset)


def _done(result: ProduceResult) -> Future[ProduceResult]:
    future: Future[ProduceResult] = LightFuture()
    future.set_result(result)
    return future
