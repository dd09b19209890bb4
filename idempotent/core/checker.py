"""The broker-side sequence checker: a pure state machine, one instance per topic-partition.

Theory of operation
-------------------
For every producer that wrote to the partition the checker keeps two views:

* the *persisted* view: epoch, highest stored sequence H(P), offset and time of the last
  stored record, and a window of the most recent stored batches (first sequence, last
  sequence, base offset). Snapshots contain exactly this view.
* the *pushed* view: the highest sequence accepted but not yet durable. Between
  :meth:`PartitionChecker.push` and :meth:`PartitionChecker.commit` a batch is "in flight".

A batch (producer P, epoch e, first sequence S, n records) is classified by :meth:`check`:

==============================================  ==========================================
condition                                       outcome
==============================================  ==========================================
malformed (negative, oversized, empty, or       :class:`~idempotent.errors.InvalidBatchError`
straddling H or the pushed sequence)            raised; state unchanged
no state for P and P not admitted by the        UNKNOWN_PRODUCER
broker (never initialised, or state evicted)
e lower than P's epoch                          FENCED
the batch lies at or below H(P)                 DUPLICATE (+ original offset if in window)
above H(P), at or below the pushed sequence     IN_FLIGHT
S == pushed + 1 (int32, wrapping to 0)          ACCEPTED
S beyond that                                   OUT_OF_ORDER_SEQUENCE (+ expected sequence)
==============================================  ==========================================

Under the ``monotonic`` policy (Pulsar PIP-6) any S beyond the pushed sequence is accepted,
holes allowed, unless the batch names its predecessor (``previous_sequence``, the last
sequence of the batch its producer sent just before) and that is not the pushed sequence:
then it is OUT_OF_ORDER_SEQUENCE (expected: pushed + 1), because an earlier batch of the
producer was refused with nothing stored and must not be overtaken, or its resend would be
answered DUPLICATE. With deduplication disabled every well-formed batch is accepted, but the
state still follows the log so that enabling it again is consistent.

Accepted batches are applied to the persisted view strictly in the order they were pushed
(the order of the log), however their commits arrive. Applying never evicts: evictions
(:meth:`expire`, :meth:`evict_over_capacity`) are separate steps the broker follows with a
snapshot, so a replay cannot resurrect an evicted producer. That makes the persisted view a pure
function of the log prefix below :attr:`PartitionChecker.position`, which is what snapshots
and recovery rely on: ``restore(snapshot)`` plus :meth:`apply` of every batch written after
``snapshot.position`` rebuilds the exact state.

The checker reads no clock: every method that needs the time takes ``now``. It holds the
rules; the persisted view is stored in a :class:`~idempotent.core.table.ProducerTable`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable

import attrs

from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.records import BatchHeader, Snapshot, StoredBatch, make_header, validate_header
from idempotent.core.sequence import advances, crosses_ring_end, distance, in_ring, last_sequence_of, next_sequence
from idempotent.core.snapshot import Columns, decode, encode
from idempotent.core.table import ProducerTable, epoch_of, original_offset, within
from idempotent.core.types import (
    DEFAULT_WINDOW,
    MAX_BATCH_RECORDS,
    MAX_EPOCH,
    MAX_SEQUENCE,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SEQUENCE_SPACE,
    ProducerId,
)
from idempotent.errors import ConfigError, CorruptDataError, InvalidBatchError

_HALF_RING = SEQUENCE_SPACE // 2
#: results are frozen values: the one for every accepted batch is shared
_ACCEPTED = ProduceResult(Outcome.ACCEPTED)


class Policy(enum.Enum):
    """How strictly sequences are checked on a topic."""

    #: Accept only S == H(P)+1 (Kafka's rule). The default.
    STRICT = "strict"
    #: Accept any S above H(P); holes allowed (Pulsar PIP-6).
    MONOTONIC = "monotonic"


@attrs.frozen
class CheckerConfig:
    """Bounds and snapshot cadence of a partition checker.

    Attributes:
        window: recent batches kept per producer to answer duplicates with their offset.
        max_producers: producers tracked per partition; the least recently active idle one
            is evicted beyond it.
        producer_expiry: seconds of inactivity after which a producer's state is evicted.
        snapshot_entries: take a snapshot after this many stored batches.
        snapshot_records: take a snapshot after this many stored records, however few
            batches hold them. Recovery reads every record stored after the snapshot (the
            logs keep one message per record), so this bounds the replay's time as
            ``snapshot_entries`` bounds its batches: a snapshot that cannot wait for a
            quiet moment is written on its own at twice either bound.
        snapshot_seconds: take a snapshot when the last one is older than this and new
            batches were stored since.
        eviction_margin: the share of ``max_producers`` evicted at once when a producer new
            to a full partition needs room (at least one producer): the snapshot that makes
            an eviction durable is written once for that many new producers, not once each.
    """

    window: int = DEFAULT_WINDOW
    max_producers: int = 10_000
    producer_expiry: float = 7 * 24 * 3600.0
    snapshot_entries: int = 1000
    snapshot_records: int = 10_000
    snapshot_seconds: float = 120.0
    eviction_margin: float = 0.02

    def __attrs_post_init__(self) -> None:
        if self.window < 5:
            raise ConfigError(f"checker window must be at least 5 batches, got {self.window}")
        if self.max_producers < 1:
            raise ConfigError(f"max_producers must be positive, got {self.max_producers}")
        if self.producer_expiry <= 0:
            raise ConfigError(f"producer_expiry must be positive, got {self.producer_expiry}")
        if self.snapshot_entries < 1 or self.snapshot_records < 1 or self.snapshot_seconds <= 0:
            raise ConfigError("snapshot intervals must be positive")
        if not 0 <= self.eviction_margin < 1:
            raise ConfigError(f"eviction_margin must be a share in 0..1 (below 1), got {self.eviction_margin}")

    @property
    def room_made(self) -> int:
        """How many producers a full partition makes room for at once (``eviction_margin``
        of ``max_producers``, at least one)."""
        return max(1, int(self.max_producers * self.eviction_margin))


@attrs.frozen
class WindowEntry:
    """A stored batch remembered for duplicate answers."""

    first_sequence: int
    last_sequence: int
    base_offset: int


@attrs.define(eq=False)
class ProducerState:
    """What the checker knows about one producer on one partition: a copy, taken when
    :meth:`PartitionChecker.producer` or :meth:`PartitionChecker.producers` was called (the
    checker itself keeps its state in columns, see :class:`PartitionChecker`)."""

    producer_epoch: int
    last_sequence: int = NO_SEQUENCE
    last_offset: int = -1
    last_timestamp: float = 0.0
    #: oldest first
    window: list[WindowEntry] = attrs.field(factory=list)
    pushed_epoch: int = 0
    pushed_sequence: int = NO_SEQUENCE
    pending: int = 0

    def persisted_view(self) -> tuple[object, ...]:
        """The part of the state that snapshots carry, as a comparable tuple."""
        return (
            self.producer_epoch,
            self.last_sequence,
            self.last_offset,
            self.last_timestamp,
            tuple((w.first_sequence, w.last_sequence, w.base_offset) for w in self.window),
        )


@attrs.frozen
class Ticket:
    """Handle for one pushed batch, passed back to :meth:`PartitionChecker.commit`."""

    generation: int
    number: int


@attrs.define(eq=False)
class _Pushed:
    """The pushed view of a producer while it differs from its persisted view (batches in
    flight, or a dropped batch that raised the epoch). A view that became equal to the
    persisted one again ("settled") may stay for a while, so that a busy producer does not
    allocate one per batch; it answers exactly as the persisted view would."""

    epoch: int
    sequence: int
    pending: int = 0


@attrs.define(eq=False)
class _Pending:
    header: BatchHeader | None
    timestamp: float
    base_offset: int = -1
    done: bool = False
    #: the backend refused it for good (:meth:`PartitionChecker.drop`): never applied
    dropped: bool = False


#: settled pushed views kept at least this many (see _Pushed)
_MIN_VIEWS = 1024


class PartitionChecker:
    """Sequence checker for one topic-partition. See the module docstring.

    The persisted view is a :class:`~idempotent.core.table.ProducerTable`: columns, not one
    object per producer (a dict from producer_id to a packed key, in eviction order, and
    paged arrays of H(P), the last timestamp and the newest entry's base offset). A producer
    with one stored batch costs the dict entry, two ints and 24 bytes of columns. The pushed
    view is kept here, and only for the producers with batches in flight (:class:`_Pushed`).
    """

    def __init__(self, config: CheckerConfig | None = None) -> None:
        self.config = config or CheckerConfig()
        self._take_columns(Columns())
        self._fifo: deque[_Pending] = deque()
        self._first_number = 0
        self._generation = 0
        #: offset right after the last applied batch; replay resumes here.
        self.position = 0
        #: batches applied since the last snapshot.
        self.entries_since_snapshot = 0
        self.records_since_snapshot = 0
        self.last_snapshot_at = 0.0
        self.last_snapshot_position = -1

    def _take_columns(self, columns: Columns) -> None:
        """Take over decoded columns as the persisted view; nothing is pushed."""
        self._table = ProducerTable(columns)
        self._pushed_views: dict[int, _Pushed] = {}
        #: when the views reach this many, the settled ones are dropped
        self._views_limit = _MIN_VIEWS

    def _remove(self, producer_id: int) -> None:
        self._table.remove(producer_id)
        self._pushed_views.pop(producer_id, None)

    def _pushed_of(self, producer_id: int, key: int) -> _Pushed:
        """The pushed view of a producer, made separate from the persisted one."""
        views = self._pushed_views
        view = views.get(producer_id)
        if view is None:
            if len(views) >= self._views_limit:
                self._drop_settled_views()
            view = views[producer_id] = _Pushed(epoch_of(key), self._table.stored(key))
        return view

    def _settled(self, producer_id: int, view: _Pushed) -> bool:
        key = self._table.index[producer_id]
        return not view.pending and view.sequence == self._table.stored(key) and view.epoch == epoch_of(key)

    def _drop_settled_views(self) -> None:
        """Forget the views equal to the persisted ones (amortised: the limit doubles with
        the views that remain)."""
        views = self._pushed_views
        for producer_id in [p for p, view in views.items() if self._settled(p, view)]:
            del views[producer_id]
        self._views_limit = max(_MIN_VIEWS, 2 * len(views))

    def _state_of(self, producer_id: int, key: int) -> ProducerState:
        epoch, high, last_offset, last_timestamp = self._table.view(key)
        view = self._pushed_views.get(producer_id)
        return ProducerState(
            producer_epoch=epoch,
            last_sequence=high,
            last_offset=last_offset,
            last_timestamp=last_timestamp,
            window=[WindowEntry(*entry) for entry in self._table.window(producer_id, key)],
            pushed_epoch=epoch if view is None else view.epoch,
            pushed_sequence=high if view is None else view.sequence,
            pending=0 if view is None else view.pending,
        )

    # -- queries ---------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Number of pushed batches not yet applied."""
        return len(self._fifo)

    @property
    def generation(self) -> int:
        """Incremented by :meth:`discard_pending`; older tickets are ignored."""
        return self._generation

    @property
    def producer_count(self) -> int:
        """How many producers the partition tracks (including ones with nothing stored yet)."""
        return len(self._table)

    def tracks(self, producer_id: int) -> bool:
        """Whether the partition has state for the producer (stored, or batches in flight)."""
        return producer_id in self._table.index

    def producer(self, producer_id: int) -> ProducerState | None:
        """A copy of the state of one producer, or None."""
        key = self._table.index.get(producer_id)
        return None if key is None else self._state_of(producer_id, key)

    def producers(self) -> dict[int, ProducerState]:
        """Copies of the states of all tracked producers, in eviction order."""
        return {pid: self._state_of(pid, key) for pid, key in self._table.index.items()}

    def activity(self, now: float) -> dict[int, float]:
        """When each tracked producer was last active: ``now`` for one with batches in
        flight, else the timestamp of its last stored batch (without building a
        :class:`ProducerState` per producer)."""
        active = self._table.slot_times()
        for pid, view in self._pushed_views.items():
            if view.pending:
                active[pid] = now
        return active

    def pending_batches(self, producer_id: int) -> int:
        """Batches of a producer pushed and not yet applied (0 for an unknown producer)."""
        view = self._pushed_views.get(producer_id)
        return 0 if view is None else view.pending

    def last_sequence(self, producer_id: int) -> int:
        """The highest persisted sequence of a producer, or -1."""
        key = self._table.index.get(producer_id)
        return NO_SEQUENCE if key is None else self._table.stored(key)

    def state(self) -> dict[int, tuple[object, ...]]:
        """The persisted state as plain values (what a snapshot holds), for comparisons."""
        return {
            pid: self._state_of(pid, key).persisted_view()
            for pid, key in self._table.index.items()
            if self._table.stored(key) != NO_SEQUENCE
        }

    # -- decisions -------------------------------------------------------------------------

    def check(
        self,
        header: BatchHeader,
        *,
        admitted: bool = True,
        policy: Policy = Policy.STRICT,
        enabled: bool = True,
    ) -> ProduceResult:
        """Classify a batch. Pure: the state is not changed.

        Args:
            header: the batch's producer identity and sequences.
            admitted: whether the broker knows this producer and it may start on a partition
                where it has no state (False for unknown or evicted producers).
            policy: STRICT or MONOTONIC.
            enabled: False when deduplication is switched off for the topic.

        Raises:
            InvalidBatchError: the header is malformed or straddles a stored boundary.
        """
        validate_header(header)
        if policy is Policy.STRICT and header.base_sequence > MAX_SEQUENCE:
            raise InvalidBatchError(
                f"base_sequence {header.base_sequence} > {MAX_SEQUENCE} (strict); 64-bit needs monotonic"
            )
        if policy is Policy.MONOTONIC and crosses_ring_end(header.base_sequence, header.record_count):
            raise InvalidBatchError(
                f"batch {header.base_sequence}+{header.record_count} crosses {MAX_SEQUENCE}: under the "
                f"monotonic policy a batch ends there and the next one starts at {MAX_SEQUENCE + 1}"
            )
        producer_id = header.producer_id
        table = self._table
        key = table.index.get(producer_id)
        if key is None:
            if not admitted:
                return ProduceResult(Outcome.UNKNOWN_PRODUCER)
            if policy is Policy.MONOTONIC and enabled and header.previous_sequence not in (None, NO_SEQUENCE):
                # it names a predecessor this partition never saw: that one comes first
                return ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0)
            if not enabled or policy is Policy.MONOTONIC or header.base_sequence == 0:
                return ProduceResult(Outcome.ACCEPTED)
            return ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0)
        stored = table.stored(key)
        view = self._pushed_views.get(producer_id)
        if view is None:
            pushed_epoch, pushed = epoch_of(key), stored
        else:
            pushed_epoch, pushed = view.epoch, view.sequence
        if header.producer_epoch < pushed_epoch:
            return ProduceResult(Outcome.FENCED, producer_epoch=pushed_epoch)
        if not enabled:
            return ProduceResult(Outcome.ACCEPTED)
        if policy is Policy.MONOTONIC:
            return self._check_monotonic(
                producer_id, key, stored, pushed, header.base_sequence, header.record_count, header.previous_sequence
            )
        return self._check_strict(producer_id, key, stored, pushed, header.base_sequence, header.record_count)

    def _check_monotonic(
        self, producer_id: int, key: int, stored: int, pushed: int, base: int, count: int, previous: int | None
    ) -> ProduceResult:
        """Pulsar's rule on 64-bit sequences, compared as plain integers (no wrap-around).

        A batch above the pushed sequence that names its predecessor (``previous``) is
        accepted only when that predecessor is the pushed sequence: a gap the producer
        declared is allowed, a batch that overtook an earlier one of its producer (refused
        for a passing reason, nothing stored) is OUT_OF_ORDER_SEQUENCE, so that the earlier
        one is not taken for a duplicate when it is resent."""
        last = base + count - 1
        if pushed == MAX_SEQUENCE and base == 0:
            # a producer numbering its own records wrapped to 0 after 2**31-1: under this
            # policy 0 is not after 2**31-1, and reading it as a resend would drop it
            return ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=MAX_SEQUENCE + 1)
        if stored != NO_SEQUENCE and base <= stored:
            if last > stored:
                raise InvalidBatchError(f"batch {base}..{last} straddles the stored sequence {stored}")
            return ProduceResult(
                Outcome.DUPLICATE, base_offset=original_offset(self._table.window(producer_id, key), base, last)
            )
        if pushed != NO_SEQUENCE and base <= pushed:
            if last > pushed:
                raise InvalidBatchError(f"batch {base}..{last} straddles the in-flight sequence {pushed}")
            return ProduceResult(Outcome.IN_FLIGHT)
        if previous is not None and previous != pushed:
            return ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=pushed + 1)
        return ProduceResult(Outcome.ACCEPTED)

    def _check_strict(
        self, producer_id: int, key: int, stored: int, pushed: int, base: int, count: int
    ) -> ProduceResult:
        """Kafka's rule on the int32 ring: only the next sequence is accepted.

        Positions are counted forward from H(P) on the ring: ``1 .. ahead`` are in flight and
        ``ahead + 1`` is the expected one. Anything else is a resend only when it is provably
        behind H(P): a stored batch still in the window, or a batch numerically at or below H(P)
        and less than half a ring (2**30) behind it, so in the same lap. Every other value (a
        jump, or a resend from before the last wrap that left the window) is
        OUT_OF_ORDER_SEQUENCE, never a duplicate: a jump of any size is refused, not dropped.
        """
        expected = next_sequence(pushed)
        if base == expected and 0 <= stored <= MAX_SEQUENCE and pushed <= MAX_SEQUENCE:
            # the common case, decided before counting positions: ``ahead + 1`` is never in
            # flight (with H(P) stored, a full ring ahead would make it position 0)
            return _ACCEPTED
        last = last_sequence_of(base, count)
        if not in_ring(stored) or not in_ring(pushed):
            # stored by the monotonic policy beyond the ring: only window duplicates are known
            offset, covered = self._window_lookup(producer_id, key, stored, base, last)
            if covered:
                return ProduceResult(Outcome.DUPLICATE, base_offset=offset)
            return ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=pushed + 1)
        ahead = distance(stored, pushed)
        position = distance(stored, base)
        if 1 <= position <= ahead:
            if position + count - 1 > ahead:
                raise InvalidBatchError(f"batch {base}..{last} straddles the in-flight sequence {pushed}")
            return ProduceResult(Outcome.IN_FLIGHT)
        if base == expected:
            return ProduceResult(Outcome.ACCEPTED)
        offset, covered = self._window_lookup(producer_id, key, stored, base, last)
        if covered:
            return ProduceResult(Outcome.DUPLICATE, base_offset=offset)
        if stored != NO_SEQUENCE and base <= stored and stored - base < _HALF_RING:
            if not base <= last <= stored:
                raise InvalidBatchError(f"batch {base}..{last} straddles the stored sequence {stored}")
            return ProduceResult(Outcome.DUPLICATE, base_offset=offset)
        return ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=expected)

    def _window_lookup(self, producer_id: int, key: int, stored: int, base: int, last: int) -> tuple[int | None, bool]:
        """Whether ``base`` lies in a window entry (and ``last`` too), and the original offset.

        Returns ``(offset, covered)``: ``covered`` when the first record is in a stored window
        entry; raises when the batch starts there but runs past H(P).
        """
        window = self._table.window(producer_id, key)
        for first, entry_last, _ in window:
            if within(first, entry_last, base):
                if not within(base, stored, last):
                    raise InvalidBatchError(f"batch {base}..{last} straddles the stored sequence {stored}")
                return original_offset(window, base, last), True
        return None, False

    # -- transitions -----------------------------------------------------------------------

    def push(self, header: BatchHeader | None, now: float) -> Ticket:
        """Record that an accepted batch is being written. Returns its ticket.

        ``header`` is None for a batch written without producer identity.
        """
        if header is not None:
            producer_id = header.producer_id
            key = self._table.index.get(producer_id)
            if key is None:
                key = self._table.add(producer_id, header.producer_epoch)
            view = self._pushed_views.get(producer_id)
            if view is None:
                view = self._pushed_of(producer_id, key)
            last = last_sequence_of(header.base_sequence, header.record_count)
            if header.producer_epoch > view.epoch:
                if not advances(header.base_sequence, view.sequence):
                    view.sequence = NO_SEQUENCE  # it starts over (deduplication off): as _apply
                view.epoch = header.producer_epoch
            if advances(last, view.sequence):
                view.sequence = last
            view.pending += 1
        self._fifo.append(_Pending(header, now))
        return Ticket(self._generation, self._first_number + len(self._fifo) - 1)

    def commit(self, ticket: Ticket, base_offset: int) -> None:
        """Record that a pushed batch is durable at ``base_offset``.

        Batches are applied in push order; a commit that arrives early waits for its
        predecessors. A ticket from before :meth:`discard_pending` is ignored.
        """
        item = self._pushed(ticket)
        if item is None:
            return
        item.base_offset = base_offset
        item.done = True
        self._apply_done()

    def _pushed(self, ticket: Ticket) -> _Pending | None:
        """The pushed batch a ticket stands for, or None for a stale or finished ticket."""
        if ticket.generation != self._generation:
            return None
        index = ticket.number - self._first_number
        return self._fifo[index] if 0 <= index < len(self._fifo) else None

    def drop(self, ticket: Ticket) -> None:
        """Record that the backend stored nothing of a pushed batch, for certain (it refused
        it: ``EntryTooLargeError``). The batch is never applied and the partition needs no
        rebuild; when no later batch of its producer was pushed, the producer's pushed
        sequence goes back to what it was before, so that it may send those sequences again.
        A ticket from before :meth:`discard_pending` is ignored."""
        item = self._pushed(ticket)
        if item is None:
            return
        item.done = item.dropped = True
        header = item.header
        key = None if header is None else self._table.index.get(header.producer_id)
        if header is not None and key is not None:
            producer_id = header.producer_id
            stored = self._table.stored(key)
            view = self._pushed_of(producer_id, key)
            view.pending -= 1
            mine = [p for p in self._fifo if p.header is not None and p.header.producer_id == producer_id]
            if mine[-1] is item:  # nothing of the producer pushed after it
                before = [p for p in mine[:-1] if not p.dropped]
                last = before[-1].header if before else None
                if last is not None:
                    view.sequence = last_sequence_of(last.base_sequence, last.record_count)
                else:
                    view.sequence = stored
                if stored == NO_SEQUENCE and not view.pending:
                    self._remove(producer_id)  # it has nothing stored: as if never seen
                    key = None
            if key is not None and self._settled(producer_id, view):
                del self._pushed_views[producer_id]
        self._apply_done()

    def _apply_done(self) -> None:
        """Apply the finished batches at the head of the push order."""
        while self._fifo and self._fifo[0].done:
            head = self._fifo.popleft()
            self._first_number += 1
            if head.dropped:
                continue
            if head.header is None:
                self.position = max(self.position, head.base_offset + 1)
                continue
            self._apply(
                head.header.producer_id,
                head.header.producer_epoch,
                head.header.base_sequence,
                head.header.record_count,
                head.base_offset,
                head.timestamp,
                pushed=True,
            )

    def discard_pending(self) -> None:
        """Forget every pushed, uncommitted batch (their outcome is unknown).

        The caller must then rebuild the state from the log (``restore`` + ``apply``),
        because a discarded batch may or may not have been written.
        """
        self._fifo.clear()
        self._first_number = 0
        self._generation += 1
        self._pushed_views.clear()  # every pushed view is the persisted one again

    def apply(self, batch: StoredBatch) -> None:
        """Apply a batch replayed from the log. Its sequences are not checked, as in Kafka's
        recovery, but its epoch and record count must be ones a producer can send.

        A batch of a higher epoch than the producer's stored one whose first sequence is at or
        before H(P) *starts the producer over*: its window and H(P) are replaced by the batch.
        With deduplication on the checker accepts such a batch only when the partition held
        no state for the producer (evicted or expired, then re-initialised: row 4b of
        docs/semantics.md), so what a replay holds for it from before (a snapshot older than
        the eviction, or a replay of the whole log) is obsolete; kept, it would answer the new
        instance's next records DUPLICATE. Live commits follow the same rule.

        Raises:
            CorruptDataError: the epoch or record count is out of range (nothing applied).
        """
        if batch.producer_id == NO_PRODUCER_ID:
            self.position = max(self.position, batch.end_offset)
            return
        if not 0 <= batch.producer_epoch <= MAX_EPOCH or not 1 <= batch.record_count <= MAX_BATCH_RECORDS:
            raise CorruptDataError(
                f"stored batch at offset {batch.base_offset}: producer_epoch {batch.producer_epoch}, "
                f"record_count {batch.record_count} out of range"
            )
        self._apply(
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.record_count,
            batch.base_offset,
            batch.timestamp,
            pushed=False,
        )

    def _apply(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
        timestamp: float,
        *,
        pushed: bool,
    ) -> None:
        table = self._table
        key = table.index.get(producer_id)
        if key is not None and producer_epoch > epoch_of(key) and not advances(base_sequence, table.stored(key)):
            table.remove(producer_id)  # it started over under a new epoch (see apply)
        epoch, last, high = table.store(
            producer_id, producer_epoch, base_sequence, record_count, base_offset, timestamp, self.config.window
        )
        view = self._pushed_views.get(producer_id)
        if view is not None:
            if pushed:
                view.pending -= 1
            else:
                view.epoch = max(view.epoch, epoch)
                if advances(last, view.sequence):
                    view.sequence = high
        self.position = max(self.position, base_offset + record_count)
        self.entries_since_snapshot += 1
        self.records_since_snapshot += record_count

    def evict_over_capacity(self, room_for: int = 0) -> list[ProducerId]:
        """Evict least recently active idle producers until ``room_for`` more fit.

        Never called while applying batches, so replay and live operation build the same
        state; the broker snapshots right after an eviction so that recovery never brings
        an evicted producer back. Producers with batches in flight are never evicted.
        """
        evicted: list[ProducerId] = []
        limit = self.config.max_producers - room_for
        index = self._table.index
        if len(index) <= limit:
            return evicted
        for producer_id in list(index):
            if len(index) <= limit:
                break
            if not self._idle(producer_id):
                continue
            self._remove(producer_id)
            evicted.append(ProducerId(producer_id))
        return evicted

    def _idle(self, producer_id: int) -> bool:
        """No batch of the producer in flight, and none dropped ahead of what is stored."""
        view = self._pushed_views.get(producer_id)
        if view is None:
            return True
        return not view.pending and view.sequence == self._table.stored(self._table.index[producer_id])

    def expire(self, now: float) -> list[ProducerId]:
        """Evict producers idle for longer than ``producer_expiry``. Returns their ids."""
        limit = now - self.config.producer_expiry
        expired = [pid for pid, at in self._table.slot_times().items() if at < limit and self._idle(pid)]
        for pid in expired:
            self._remove(pid)
        return [ProducerId(p) for p in expired]

    def forget(self, producer_id: int) -> bool:
        """Drop one producer's state (administrative). Returns whether it was tracked."""
        if producer_id not in self._table.index or self.pending_batches(producer_id):
            return False
        self._remove(producer_id)
        return True

    # -- snapshots -------------------------------------------------------------------------

    def snapshot_due(self, now: float) -> bool:
        """True when the batch or record count or the age of the last snapshot calls for a
        new one (taken with the next append that finds no other batch in flight)."""
        if (
            self.entries_since_snapshot >= self.config.snapshot_entries
            or self.records_since_snapshot >= self.config.snapshot_records
        ):
            return True
        return self.entries_since_snapshot > 0 and (now - self.last_snapshot_at >= self.config.snapshot_seconds)

    def snapshot_overdue(self) -> bool:
        """True when twice ``snapshot_entries`` batches or twice ``snapshot_records`` records
        were stored since the last snapshot: under a load that never leaves a quiet moment,
        the snapshot is written on its own, so that the replay of a recovery stays bounded."""
        return (
            self.entries_since_snapshot >= 2 * self.config.snapshot_entries
            or self.records_since_snapshot >= 2 * self.config.snapshot_records
        )

    def snapshot(self, now: float) -> Snapshot:
        """Serialize the persisted view and reset the snapshot counters.

        The snapshot is valid for every batch below :attr:`position`.
        """
        columns = self._table.columns(self.position)
        snap = Snapshot(self.position, self.entries_since_snapshot, now, encode(columns))
        self.mark_snapshot(snap)
        return snap

    def mark_snapshot(self, snapshot: Snapshot) -> None:
        """Reset the snapshot counters as if ``snapshot`` had just been taken."""
        self.entries_since_snapshot = 0
        self.records_since_snapshot = 0
        self.last_snapshot_at = snapshot.taken_at
        self.last_snapshot_position = snapshot.position

    @classmethod
    def restore(
        cls, snapshot: Snapshot | None, config: CheckerConfig | None = None, *, now: float = 0.0
    ) -> PartitionChecker:
        """Build a checker from a snapshot (or an empty one from None).

        ``now`` starts the snapshot clock when there is no snapshot.

        Raises:
            CorruptDataError: the snapshot bytes are not a snapshot of a known format.
        """
        checker = cls(config)
        checker.last_snapshot_at = now
        if snapshot is None:
            return checker
        columns = decode(snapshot.data)
        checker._take_columns(columns)
        checker.position = columns.position
        checker.mark_snapshot(snapshot)
        return checker

    @classmethod
    def recover(
        cls,
        snapshot: Snapshot | None,
        batches: Iterable[StoredBatch],
        config: CheckerConfig | None = None,
        *,
        now: float = 0.0,
    ) -> tuple[PartitionChecker, int]:
        """Restore from ``snapshot`` and apply the batches written after it.

        Returns:
            The checker and how many batches were replayed.

        Raises:
            CorruptDataError: the snapshot is corrupt, or a replayed batch is (see :meth:`apply`).
        """
        checker = cls.restore(snapshot, config, now=now)
        replayed = 0
        for batch in batches:
            if batch.base_offset < checker.position:
                continue
            checker.apply(batch)
            replayed += 1
        return checker, replayed


#: the header helpers live with BatchHeader; importable from here as before
__all__ = [
    "CheckerConfig",
    "PartitionChecker",
    "Policy",
    "ProducerState",
    "Ticket",
    "WindowEntry",
    "make_header",
    "validate_header",
]
