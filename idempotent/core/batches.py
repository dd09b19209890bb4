"""The client side's values: an outgoing batch, whose records it holds, and the events that end
it; and the validation of sequences an application chooses.

:class:`OutgoingBatch` is what :class:`~idempotent.core.sequencer.ProducerSequencer` batches,
numbers, sends and retries (its life cycle is the table of :mod:`idempotent.core.transitions`);
:class:`Spans` says whose records it holds; :class:`BatchDelivered` and :class:`BatchFailed`
are the events that end it. Pure values: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as SequenceOf

import attrs

from idempotent.core.outcomes import DeliveryStatus
from idempotent.core.records import Record, RecordColumns
from idempotent.core.sequence import is_valid_sequence
from idempotent.core.transitions import BatchState
from idempotent.core.types import MAX_APPLICATION_SEQUENCE, NO_SEQUENCE, TopicPartition
from idempotent.errors import ProducerError, UsageError


def check_sequence(sequence: object) -> None:
    if not isinstance(sequence, int) or isinstance(sequence, bool) or not is_valid_sequence(sequence):
        raise UsageError(f"sequence must be an int in 0..{MAX_APPLICATION_SEQUENCE}, got {sequence!r}")


def sequences_for(count: int, sequence: int | SequenceOf[int] | None) -> SequenceOf[int] | None:
    """Validate the ``sequence`` argument of :meth:`ProducerSequencer.add_many` for ``count``
    records and return one sequence per record, or None. Application sequences never wrap.

    Raises:
        UsageError: an invalid sequence, or not ``count`` of them.
    """
    if sequence is None:
        return None
    if not isinstance(sequence, SequenceOf) or isinstance(sequence, str | bytes):
        check_sequence(sequence)  # an int, or the error for something that is no sequence
        assert isinstance(sequence, int)
        if count:
            check_sequence(sequence + count - 1)
        return range(sequence, sequence + count)
    if len(sequence) != count:
        raise UsageError(f"{len(sequence)} sequences for {count} records")
    for s in sequence:
        check_sequence(s)
    return sequence


class Spans:
    """Whose records a batch holds, in order, as *spans* ``(owner, start, count)``: ``count``
    consecutive records that belong to ``owner`` (a value the shell passed to
    :meth:`ProducerSequencer.add_many`), starting at position ``start`` of the records it
    passed. Records are tracked per span, not per record; the three parallel lists hold no
    object per record beyond the owner itself.
    """

    __slots__ = ("counts", "owners", "starts")

    def __init__(self) -> None:
        self.owners: list[object] = []
        self.starts: list[int] = []
        self.counts: list[int] = []

    def add(self, owner: object, start: int, count: int) -> None:
        """Append ``count`` records of ``owner`` from its position ``start`` on."""
        owners = self.owners
        if owners and owners[-1] is owner and self.starts[-1] + self.counts[-1] == start:
            self.counts[-1] += count
            return
        owners.append(owner)
        self.starts.append(start)
        self.counts.append(count)

    def __iter__(self) -> Iterator[tuple[object, int, int]]:
        return zip(self.owners, self.starts, self.counts, strict=True)

    def __len__(self) -> int:
        return len(self.owners)

    def split(self, keep: int) -> Spans:
        """Keep the first ``keep`` records; return the spans of the others."""
        tail = Spans()
        for i, count in enumerate(self.counts):
            if keep >= count:
                keep -= count
                continue
            owner, start = self.owners[i], self.starts[i]
            cut = i + 1 if keep else i
            if keep:
                self.counts[i] = keep
            tail.owners = [owner, *self.owners[i + 1 :]]
            tail.starts = [start + keep, *self.starts[i + 1 :]]
            tail.counts = [count - keep, *self.counts[i + 1 :]]
            del self.owners[cut:], self.starts[cut:], self.counts[cut:]
            break
        return tail


@attrs.define(eq=False)
class OutgoingBatch:
    """A batch as the shell sends it; ``attempt`` identifies the current transmission.

    ``spans`` says whose records the batch holds, in order.
    """

    batch_id: int
    topic: str
    partition: int
    #: a list, or the columns of a RecordColumns call while only such calls fill the batch
    records: list[Record] | RecordColumns
    spans: Spans
    created_at: float
    size: int = 0
    #: the size of the largest record (``size`` and ``largest`` as :attr:`Record.size` counts)
    largest: int = 0
    base_sequence: int = NO_SEQUENCE
    #: the last sequence of the batch sent just before on the partition (-1: none; None:
    #: unknown, after a refused batch that may be stored), set at drain time: the broker's
    #: ``monotonic`` policy refuses the batch while that one is not its latest.
    previous_sequence: int | None = None
    #: ``previous_sequence`` as the latest attempt carried it.
    previous_at_send: int | None = None
    attempt: int = 0
    state: BatchState = BatchState.OPEN
    not_before: float = 0.0
    sent_at: float = 0.0
    #: the partition's last acknowledged sequence when the latest attempt was sent.
    acked_at_send: int = NO_SEQUENCE
    #: True when the application chose the sequences (``base_sequence`` set at add time).
    explicit: bool = False
    #: True once an attempt ended without a definite answer (request timeout, transport error,
    #: IN_FLIGHT): a copy may be stored, so a later refusal cannot say NOT_PERSISTED.
    doubtful: bool = False

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def handles(self) -> list[object]:
        """The owner of each record, in order (the handle :meth:`ProducerSequencer.add` returned)."""
        return [owner for owner, _, count in self.spans for _ in range(count)]


@attrs.frozen
class BatchDelivered:
    """Every record of ``batch`` is persisted; record i is at ``base_offset + i`` when known."""

    batch: OutgoingBatch
    base_offset: int | None
    duplicate: bool


@attrs.frozen
class BatchFailed:
    """Every record of ``batch`` ended unpersisted or possibly persisted."""

    batch: OutgoingBatch
    error: ProducerError
    status: DeliveryStatus


Event = BatchDelivered | BatchFailed
