"""Outcomes of a produce request and delivery states of a message.

An outcome is a value, not an exception: duplicates and gaps are normal events on a lossy
link, and the client-side sequencer reacts to each one (see ``docs/semantics.md``).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import attrs


class Outcome(enum.Enum):
    """What the broker's sequence checker decided about one batch.

    ========================  =========================================================
    ACCEPTED                  stored; ``base_offset`` is the offset of its first record
    DUPLICATE                 already stored; ``base_offset`` is the original offset when
                              the batch is still in the checker's window, else None
    OUT_OF_ORDER_SEQUENCE     a gap: ``expected_sequence`` is the sequence the broker wants
    IN_FLIGHT                 an earlier copy is still being written: retry later
    FENCED                    a newer instance of this producer exists: stop
    UNKNOWN_PRODUCER          the broker holds no state for this producer: initialise again
    ========================  =========================================================
    """

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER_SEQUENCE = "out_of_order_sequence"
    IN_FLIGHT = "in_flight"
    FENCED = "fenced"
    UNKNOWN_PRODUCER = "unknown_producer"

    @property
    def stored(self) -> bool:
        """True when the batch is in the log after this outcome (accepted or duplicate)."""
        return self in (Outcome.ACCEPTED, Outcome.DUPLICATE)


class DeliveryStatus(enum.Enum):
    """Where a message ended: every message ends in exactly one of these."""

    PERSISTED = "persisted"
    NOT_PERSISTED = "not_persisted"
    POSSIBLY_PERSISTED = "possibly_persisted"


@attrs.frozen
class ProduceResult:
    """The broker's answer to one produce request.

    Attributes:
        outcome: the checker's decision.
        base_offset: offset of the batch's first record (ACCEPTED, and DUPLICATE inside the
            window), else None.
        expected_sequence: for OUT_OF_ORDER_SEQUENCE, the sequence the broker expects next.
        producer_epoch: for FENCED, the current epoch of the producer.
    """

    outcome: Outcome
    base_offset: int | None = None
    expected_sequence: int | None = None
    producer_epoch: int | None = None


class RecordMetadata(NamedTuple):
    """Where a sent record landed (an immutable value; built per record only when asked).

    ``duplicate`` is True when the broker recognised the record as already stored; then
    ``offset`` is the original offset, or None when it fell out of the checker's window.
    """

    topic: str
    partition: int
    offset: int | None
    sequence: int
    duplicate: bool = False
