"""One Kafka transactional producer, and what to do when a commit fails.

Everything that writes into Kafka transactionally goes through a
:class:`TransactionalProducer`: it opens the client with :func:`fence` (which fences every
earlier holder of the ``transactional.id``), runs one transaction at a time
(:meth:`~TransactionalProducer.transaction`: begin, produce, commit) and, when a commit fails,
applies librdkafka's rules for the transactional API (``rdkafka.h``, INTRODUCTION.md
"Transactional Producer", ``rdkafka_txnmgr.c``) so that the writer is never left wedged:

* **retriable** (``retriable()``, typically ``_TIMED_OUT`` after the link or the cluster went
  silent): the commit goes on in the background and its outcome is unknown (*in doubt*).
  librdkafka then accepts only ``commit_transaction`` again, which resumes it; every other
  transactional call answers ``_CONFLICT`` ("Conflicting commit_transaction API call is
  already in progress"), flagged retriable but never succeeding on that instance.
* **abortable** (``txn_requires_abort()``): the transaction failed; ``abort_transaction``
  ends it (nothing of it is stored) and the instance is replaced (see "After an abort").
* **fenced** (``_FENCED``, ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``): a newer holder of
  the ``transactional.id`` took over, or Kafka's coordinator aborted a transaction that stayed
  open longer than ``transaction.timeout.ms`` (a long outage); librdkafka reports both alike.
  Without a ``takeover`` check each is a takeover: :class:`~idempotent.errors.OwnershipLostError`
  from then on, and the instance is never replaced (that would fence the new owner back). With
  one (the caller's own record of its instances, see below) a fence it does not confirm is the
  coordinator's: the transaction is over (a commit it met is in doubt), and the instance is
  replaced.
* **fatal** (``fatal()``), a call the client's state does not allow
  (:data:`~idempotent.adapters.kafka.errors.CLIENT_STATE_CODES`: ``_CONFLICT``, ``_PREV_IN_PROGRESS``,
  ``_STATE``, ...), or an error with none of the three flags (librdkafka: "treat as fatal"):
  the instance is unusable. It is dropped and a fresh producer is opened with :func:`fence`,
  which fences it: Kafka's coordinator first completes whatever the old instance's open
  transaction had reached (a commit it had already decided) or aborts it, and writes the
  partitions' markers, before the fresh producer's ``init_transactions`` returns.

A transaction in doubt is **settled** (:meth:`~TransactionalProducer.settle`) before the
instance does anything else, and before the caller reads the partitions it writes (a rebuild
of the broker's checker): ``commit_transaction`` is called again; success means it is stored
(and the caller is told through ``on_late_commit``, because Kafka's commit markers are written
after the commit is acknowledged, so the caller must make its reads wait for those records);
an abortable answer is aborted (and the instance replaced); another timeout leaves it in
doubt (the caller retries later); anything else, including fenced (the coordinator fences and
aborts a transaction left open longer than ``transaction.timeout.ms``, as a long outage
does), replaces the instance. Either way, once ``settle`` returns, a ``read_committed``
reader sees the transaction's final outcome.

**Takeover check.** ``takeover()`` answers whether a newer instance of the producer exists
(from a record every instance writes *before* it fences, :mod:`idempotent.broker.direct`). It is
asked when a fence is reported, and again after every fresh client's :func:`fence` (also the
first one), before the instance writes: a fence is a takeover when it says so, before or
after. So an instance never commits after a newer one fenced it and read what it left: a
newer instance that wrote its record after the check fences after this fresh client too.

**After an abort** the client is replaced too (a fresh one's ``init_transactions`` bumps the
epoch), never used for the next transaction. A batch of the aborted transaction that reached
a partition leader whose acknowledgement never came back (the leader killed or moved while
the request was in flight) is in the log, aborted; librdkafka counts it as never sent and
gives the same sequence numbers, under the same producer id and epoch, to the next
transaction's records for that partition. The leader then takes them for a resend of the
stored batch: it answers with that batch's offsets and stores nothing, the next commit
succeeds, and its records on that partition are lost (its other partitions committed). This
was seen on a 3-node cluster whose active controller was killed with -9 (the aborted
transaction's ABORT marker and the next one's COMMIT marker both after the one stored batch).
A new epoch starts the sequences afresh, so nothing of the next transaction is matched
against an aborted batch.

So a batch whose commit timed out is, after the link is back, either in the log (a resend is
a duplicate) or not (a resend is stored once): the broker reads which from the log when it
rebuilds the partition. Thread safety: every method takes the instance's lock; a transaction
holds it from begin to commit.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from idempotent.adapters.kafka.errors import CLIENT_STATE_CODES, FENCED_CODES, map_errors, translate
from idempotent.errors import BackendUnavailableError, OwnershipLostError, ProducerError, internal_error

_LOG = logging.getLogger("idempotent.adapters.kafka")

#: how long an ``init_transactions`` attempt of a takeover may take before a fresh producer
#: asks again, during the first :data:`_QUICK_ATTEMPTS_SECONDS`; after that each attempt gets
#: twice as long as the one before (the last one gets whatever is left of the timeout), so a
#: slow or distant cluster still gets the time it needs
_INIT_ATTEMPT = 0.1
_QUICK_ATTEMPTS_SECONDS = 1.0


def fence(config: dict[str, Any], timeout: float) -> Any:
    """A transactional producer whose ``init_transactions`` fenced every earlier holder of
    its ``transactional.id`` and ended their open transaction.

    When the previous holder left a transaction open, the coordinator answers InitProducerId
    with CONCURRENT_TRANSACTIONS while it aborts that transaction (or completes a commit it
    had already decided), usually well under 100 ms, and librdkafka asks again only 500 ms
    later. So an attempt that is not done within its short budget (0.1 s for the first
    second, then twice as long each time) is dropped and a fresh producer asks again. Fencing
    is unchanged: every InitProducerId that succeeds bumps the epoch, the last one wins, and a
    dropped producer never began a transaction. A retriable answer (the coordinator moving
    to another broker or loading its state, as during a rolling restart) is asked again the
    same way until ``timeout``.

    Raises:
        KafkaException: a fatal or non-retriable answer, or the last attempt failed (mapped
            by the caller).
    """
    started = time.monotonic()
    deadline = started + timeout
    budget = _INIT_ATTEMPT
    while time.monotonic() + 2 * budget < deadline:
        producer = Producer(config)
        try:
            producer.init_transactions(budget)
            return producer
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            # on its timeout init_transactions reports the last answer it got, if any; a
            # coordinator being moved or loaded (a broker restarted, an election) answers
            # with a retriable code, asked again within the timeout like the others
            if not (
                isinstance(error, KafkaError)
                and not error.fatal()
                and (error.retriable() or error.code() in (KafkaError._TIMED_OUT, KafkaError.CONCURRENT_TRANSACTIONS))
            ):
                raise
        # dropped without close(), which would try to abort a transaction that never began
        del producer
        if time.monotonic() - started >= _QUICK_ATTEMPTS_SECONDS:
            budget *= 2
    producer = Producer(config)
    producer.init_transactions(max(deadline - time.monotonic(), 1.0))
    return producer


class TxnState(enum.Enum):
    """Where a :class:`TransactionalProducer` stands."""

    READY = "ready"  #: no transaction open; the next one may begin
    OPEN = "open"  #: a transaction is open (inside :meth:`TransactionalProducer.transaction`)
    IN_DOUBT = "in doubt"  #: a commit neither succeeded nor failed for certain
    REPLACE = "replace"  #: the client is unusable; the next use opens (and fences with) a fresh one
    FENCED = "fenced"  #: a newer holder of the transactional.id took over; nothing more is written


def _error_of(exc: KafkaException) -> Any:
    return exc.args[0] if exc.args else None


def _refusal(exc: BaseException) -> KafkaException | None:
    """The ``KafkaException`` a client call ended with: ``exc`` itself, or the one
    confluent-kafka (2.16) leaves pending when, after a fatal error such as being fenced, the
    same ``flush()`` or commit runs a delivery report's callback: the callback's first C call
    then fails with ``SystemError`` ("returned a result with an exception set"), caused by
    it. None for anything else."""
    if isinstance(exc, KafkaException):
        return exc
    if isinstance(exc, SystemError) and isinstance(exc.__cause__, KafkaException):
        return exc.__cause__
    return None


def _unusable(error: Any) -> bool:
    """Whether an error from a transactional call means the client instance can do nothing
    more: fatal, a call its state does not allow, or none of librdkafka's three flags."""
    if not isinstance(error, KafkaError):
        return True
    if error.fatal() or error.code() in CLIENT_STATE_CODES:
        return True
    return not (error.retriable() or error.txn_requires_abort())


class TransactionalProducer:
    """One ``transactional.id``'s producer: transactions one at a time, a failed commit
    resolved by the rules in the module docstring, an unusable client replaced by a fresh
    one that fences it.

    ``config`` is the librdkafka configuration (with ``transactional.id``), ``timeout`` the
    seconds each blocking call may take (opening and fencing, a commit, an abort, a resumed
    commit), ``name`` what messages call the writer (for example ``orders[0]``).

    Raises (constructor):
        ProducerError: the client could not be opened or could not fence the earlier holder
            (mapped by :func:`~idempotent.adapters.kafka.errors.translate`; ``BackendUnavailableError``
            when the cluster did not answer in time).
    """

    def __init__(
        self, config: dict[str, Any], timeout: float, name: str, takeover: Callable[[], bool] | None = None
    ) -> None:
        self.config = dict(config)
        self.timeout = timeout
        self.name = name
        #: whether a newer instance of the producer exists (see the module docstring); None:
        #: every fence is a takeover
        self._takeover = takeover
        #: the retriable error of a fence the takeover check did not confirm, in this transaction
        self._fence_retry: ProducerError | None = None
        self._lock = threading.RLock()
        self._client: Any = None
        self._state = TxnState.REPLACE
        self._fenced: OwnershipLostError | None = None
        #: told when the transaction in doubt turns out committed (see :meth:`transaction`)
        self._on_late_commit: Callable[[], None] | None = None
        #: the answer of a commit the body made itself (:meth:`committed`), as a 1-tuple
        self._body_commit: tuple[KafkaException | None] | None = None
        with self._lock:
            self._replace(first=True)

    @property
    def state(self) -> TxnState:
        return self._state

    @property
    def fenced(self) -> OwnershipLostError | None:
        """The error every use raises once a newer holder fenced this one, else None."""
        return self._fenced

    @contextlib.contextmanager
    def transaction(self, on_late_commit: Callable[[], None] | None = None) -> Iterator[Any]:
        """Settle, begin a transaction, yield the confluent-kafka ``Producer`` to produce into
        it, and commit when the body returns (abort when it raises). Holds the lock throughout.

        ``on_late_commit`` is called (by whichever later :meth:`settle` finds out) when this
        transaction's commit was in doubt and then turned out committed: the caller's futures
        failed already, but the records are in the log, and their commit markers may not be
        written yet, so the caller must make its reads wait for them.

        After a normal exit the transaction is committed. The body's own exception is raised
        again once the transaction is aborted, unless it is a refused write (a
        ``KafkaException`` or ``ProducerError``) and the abort finds this instance fenced:
        librdkafka refuses a fenced client's writes with ``_FATAL``, and the abort tells why.

        Raises:
            OwnershipLostError: fenced by a newer holder (now or earlier).
            BackendUnavailableError: fenced by Kafka's coordinator (the takeover check said so:
                nothing of the transaction is stored, or a commit it met is in doubt), or the
                commit failed. Its message says whether the
                transaction was aborted (nothing stored) or is in doubt (decided by the next
                :meth:`settle`); the instance is settled or replaced before its next use.
            ProducerError: what the body raised or ``begin_transaction`` answered, mapped.
        """
        with self._lock:
            client = self._begin_locked()
            self._body_commit = None
            try:
                yield client
            except BaseException as raised:  # a client call refused, or the body failed: store none of it
                self._abort("after a refused write")
                # librdkafka refuses every produce of a fenced client with _FATAL; the abort
                # answered the cause
                fence = self._fenced or self._fence_retry
                refusal = _refusal(raised)
                if refusal is not None:
                    error = _error_of(refusal)
                    if fence is not None:
                        raise fence from refusal
                    if isinstance(error, KafkaError) and error.code() in FENCED_CODES:
                        raise self._fence_lost(error, refusal) from refusal
                    raise translate(error, f"produce to {self.name}") from refusal
                if fence is not None and isinstance(raised, ProducerError):
                    raise fence from raised  # the body's refusal (a bulk call's) was the fence
                raise
            self._commit(on_late_commit)

    def begin(self) -> Any:
        """Settle and begin a transaction that stays open across calls (an application's
        transaction): the caller produces into the returned client and ends it with
        :meth:`commit_open` or :meth:`abort_open`. The lock is taken by each call, not held
        in between: the caller makes sure nothing else uses the instance meanwhile.

        Raises:
            OwnershipLostError, BackendUnavailableError: as :meth:`settle`.
            ProducerError: ``begin_transaction`` refused, mapped.
        """
        with self._lock:
            return self._begin_locked()

    def _begin_locked(self) -> Any:
        """Settle, then begin a transaction on the current client, which it returns (the
        lock held by the caller). Raises as :meth:`begin`."""
        self.settle()
        client = self._client
        try:
            client.begin_transaction()
        except KafkaException as exc:
            raise self._failed("begin a transaction", _error_of(exc), exc) from exc
        self._state = TxnState.OPEN
        self._fence_retry = None
        return client

    def commit_open(self, on_late_commit: Callable[[], None] | None = None) -> None:
        """Commit the transaction :meth:`begin` opened; on failure the state says what
        happened (READY: aborted; IN_DOUBT or REPLACE: in doubt, :meth:`settle` decides;
        FENCED: lost).

        Raises:
            OwnershipLostError, BackendUnavailableError: as :meth:`transaction`'s commit.
        """
        with self._lock:
            if self._state is not TxnState.OPEN:
                raise BackendUnavailableError(f"kafka: {self.name}: no transaction open to commit")
            self._commit(on_late_commit)

    def abort_open(self) -> None:
        """Abort the transaction :meth:`begin` opened (nothing of it is stored); an instance
        that cannot abort it is replaced at its next use, which ends the transaction.

        Raises:
            OwnershipLostError: fenced by a newer holder.
        """
        with self._lock:
            if self._state is TxnState.OPEN:
                self._abort("on request")
            if self._fenced is not None:
                raise self._fenced

    def committed(self, refusal: KafkaException | None) -> None:
        """Tell the open :meth:`transaction` that its body called ``commit_transaction``
        itself (the compiled write path commits in the same call as the writes), and what it
        answered: None for committed, else the ``KafkaException`` it failed with. The body
        must return at once; the answer is then handled exactly as the commit the
        transaction makes otherwise (in doubt, aborted, fenced or replaced, see the module)."""
        self._body_commit = (refusal,)

    def settle(self) -> None:
        """Bring the instance back to READY: resume a commit in doubt, replace an unusable
        client. Once it returns, a ``read_committed`` reader sees every earlier transaction's
        final outcome (or, for one that turned out committed, ``on_late_commit`` has told the
        caller which records to wait for).

        Raises:
            OwnershipLostError: a newer holder fenced this one.
            BackendUnavailableError: not settled yet (the cluster still does not answer, or a
                fresh client could not fence the old one in time); state unchanged, call again.
        """
        with self._lock:
            if self._state is TxnState.FENCED:
                assert self._fenced is not None
                raise self._fenced
            if self._state is TxnState.IN_DOUBT:
                self._resume()
            if self._state is TxnState.REPLACE:
                self._replace()

    def close(self) -> None:
        """Drop the client without committing or aborting anything: an open or doubtful
        transaction is ended by the next holder's :func:`fence` (or by Kafka's
        ``transaction.timeout.ms``)."""
        with self._lock:
            client, self._client = self._client, None
            if self._state is not TxnState.FENCED:
                self._state = TxnState.REPLACE
        if client is not None:
            with contextlib.suppress(Exception):
                client.flush(1)  # serve pending callbacks and log lines

    # -- under the lock -------------------------------------------------------------------

    def _commit(self, on_late_commit: Callable[[], None] | None) -> None:
        done, self._body_commit = self._body_commit, None
        try:
            if done is None:
                self._client.commit_transaction(self.timeout)
            elif done[0] is not None:
                raise done[0]
        except (KafkaException, SystemError) as raised:
            exc = _refusal(raised)
            if exc is None:
                raise
            error = _error_of(exc)
            if isinstance(error, KafkaError) and error.code() in FENCED_CODES:
                # in doubt: the caller reads the outcome from the log once a fresh client fenced this one
                raise self._fence_lost(error, exc, in_doubt=True) from exc
            if isinstance(error, KafkaError) and not _unusable(error) and error.txn_requires_abort():
                self._abort("after a failed commit")
                raise BackendUnavailableError(
                    f"kafka: commit to {self.name} failed and was aborted, nothing of it is stored: "
                    f"{error.name()}: {error.str()}"
                ) from exc
            if isinstance(error, KafkaError) and not _unusable(error):  # retriable: in doubt
                self._state = TxnState.IN_DOUBT
                self._on_late_commit = on_late_commit
                raise BackendUnavailableError(
                    f"kafka: commit to {self.name} did not finish within {self.timeout:g} s "
                    f"({error.name()}: {error.str()}); whether it is stored is settled before the "
                    "partition is written or read again"
                ) from exc
            raise self._failed("commit", error, exc) from exc
        self._state = TxnState.READY
        self._client.poll(0)  # hand librdkafka's queued log lines to Python logging

    def _abort(self, why: str, in_doubt: bool = False) -> None:
        """Abort the open transaction, then replace the client (see "After an abort" in the
        module docstring). An instance that cannot abort it is replaced too (its successor's
        fence ends the transaction); fenced means lost, unless the transaction was in doubt
        (see :meth:`_resume`)."""
        try:
            self._client.abort_transaction(self.timeout)
        except KafkaException as exc:
            error = _error_of(exc)
            if isinstance(error, KafkaError) and error.code() in FENCED_CODES and not in_doubt:
                self._fence_lost(error, exc)
                return
            _LOG.warning(
                "kafka: could not abort the transaction to %s %s (%s); replacing the client", self.name, why, error
            )
            self._state = TxnState.REPLACE
            return
        # aborted: its batches may be in the log under this epoch with sequences that
        # librdkafka gives the next transaction's records again; a fresh client's epoch
        # keeps the broker from taking those records for resends of the aborted ones
        self._state = TxnState.REPLACE

    def _resume(self) -> None:
        """Call ``commit_transaction`` again for the transaction in doubt (librdkafka resumes
        the commit in progress): committed -> ``on_late_commit``; abortable -> aborted;
        retriable -> still in doubt (raises); anything else -> REPLACE."""
        late, self._on_late_commit = self._on_late_commit, None
        try:
            self._client.commit_transaction(self.timeout)
        except KafkaException as exc:
            error = _error_of(exc)
            if isinstance(error, KafkaError) and not _unusable(error) and error.txn_requires_abort():
                self._abort("in doubt", in_doubt=True)
                return
            if isinstance(error, KafkaError) and not _unusable(error):
                self._on_late_commit = late
                raise BackendUnavailableError(
                    f"kafka: the commit to {self.name} is still in doubt ({error.name()}: {error.str()}); "
                    "it is settled when the cluster answers again"
                ) from exc
            # Fenced here is not a takeover for certain: Kafka's coordinator also fences a
            # transaction that stayed open past transaction.timeout.ms (a long outage). Either
            # way the transaction is over; a fresh client learns how it ended from the log.
            _LOG.warning("kafka: the commit in doubt to %s ended with %s; replacing the client", self.name, error)
            self._state = TxnState.REPLACE
            return
        self._state = TxnState.READY
        _LOG.info("kafka: the commit in doubt to %s completed", self.name)
        if late is not None:
            late()

    def _replace(self, first: bool = False) -> None:
        """Drop the client and open a fresh one with :func:`fence`: the old instance's open
        transaction is ended (completed if its commit was decided, else aborted) before this
        returns, and the old instance can write nothing more. With a takeover check, a newer
        instance found before (not on the first opening) or after the fence ends this one.

        Raises:
            OwnershipLostError: the takeover check found a newer instance.
            BackendUnavailableError: the cluster or the check did not answer; still REPLACE.
        """
        if self._takeover is not None and not first:
            self._check_takeover()
        old, self._client = self._client, None
        del old  # destroyed without close(), which would try to commit or abort again
        self._state = TxnState.REPLACE
        with map_errors(f"open the writer of {self.name}"):
            self._client = fence(self.config, self.timeout)
        if self._takeover is not None:
            self._check_takeover()  # a newer instance that fenced before this client did
        self._state = TxnState.READY

    def _check_takeover(self) -> None:
        assert self._takeover is not None
        if self._takeover():
            self._fenced = OwnershipLostError(
                f"kafka: {self.name} was fenced: a newer instance of the producer took over"
            )
            self._state = TxnState.FENCED
            raise self._fenced

    def _fence_lost(self, error: KafkaError, exc: KafkaException, in_doubt: bool = False) -> ProducerError:
        """The error for a fence: a takeover (:class:`OwnershipLostError`, for good) unless the
        takeover check says no newer instance exists; then the coordinator fenced this
        client (a transaction older than ``transaction.timeout.ms``) and it is replaced
        (a retriable error). A check that cannot answer leaves the instance to be replaced,
        which asks it again."""
        if self._takeover is not None:
            self._state = TxnState.REPLACE
            outcome = "its commit is in doubt" if in_doubt else "nothing of it is stored"
            try:
                taken = self._takeover()
            except OwnershipLostError:
                raise
            except ProducerError as failed:
                self._fence_retry = BackendUnavailableError(
                    f"kafka: {self.name} was fenced ({error.name()}), {outcome}; whether a newer instance "
                    f"took over could not be read yet ({failed})"
                )
                return self._fence_retry
            if not taken:
                _LOG.warning(
                    "kafka: %s was fenced by the transaction coordinator (%s), no newer instance of it "
                    "exists; replacing the client",
                    self.name,
                    error,
                )
                self._fence_retry = BackendUnavailableError(
                    f"kafka: the transaction of {self.name} was aborted by Kafka's coordinator ({error.name()}: "
                    f"open longer than transaction.timeout.ms), {outcome}; a fresh client takes over"
                )
                return self._fence_retry
        lost = translate(error, f"commit to {self.name}")
        assert isinstance(lost, OwnershipLostError)
        lost.__cause__ = exc
        self._fenced = lost
        self._state = TxnState.FENCED
        return lost

    def _failed(self, what: str, error: Any, exc: KafkaException) -> ProducerError:
        """The error for a failed call that left the client unusable (or fenced it)."""
        if isinstance(error, KafkaError) and error.code() in FENCED_CODES:
            return self._fence_lost(error, exc)
        if not isinstance(error, KafkaError):
            self._state = TxnState.REPLACE
            return internal_error(f"kafka: {what} to {self.name}", exc, _LOG)
        if _unusable(error):
            self._state = TxnState.REPLACE
            _LOG.warning("kafka: %s to %s failed with %s; replacing the client", what, self.name, error)
            return BackendUnavailableError(
                f"kafka: {what} to {self.name} failed: {error.name()}: {error.str()} "
                "(the client can do nothing more; a fresh one that fences it takes over)"
            )
        return translate(error, f"{what} to {self.name}")


__all__ = ["TransactionalProducer", "TxnState", "fence"]
