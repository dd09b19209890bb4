"""The ledger of what each record's producer was told, and the check against the read-back.

Every record ends in one of these states, the strongest one any producer instance reported
winning (an acknowledgement beats everything, "possibly persisted" beats "not persisted"):

* ``ACKNOWLEDGED``: a producer was told it is stored;
* ``AMBIGUOUS``: possibly persisted: the producer gave up without knowing (a timeout), or its
  process died while the record was in flight;
* ``FAILED``: the producer was told it is not stored;
* ``SENT``: handed to a producer, no answer yet (becomes ``AMBIGUOUS`` when the run ends);
* ``UNSENT``: never handed to a producer (the run stopped early).

:func:`check` compares the ledger with the records read back in log order: ``duplicates``
counts extra copies, ``lost`` the acknowledged records that are not stored (and, for a copy
job, the input records below its committed input position that are not in its output),
``reordered`` the first copies stored after a record with a higher id (within the partition).
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Iterable

import attrs

EXAMPLES = 10  # record ids kept per anomaly


class State(enum.IntEnum):
    """A record's state in the ledger; a higher value wins."""

    UNSENT = 0
    SENT = 1
    FAILED = 2
    AMBIGUOUS = 3
    ACKNOWLEDGED = 4


class Ledger:
    """Per record id, the strongest outcome reported so far, with acknowledgement latencies.

    Thread-safe: the runner's reader threads and fault thread share it.
    """

    def __init__(self, records: int) -> None:
        self.records = records
        self._states = bytearray(records)
        self._lock = threading.Lock()
        self.acknowledged = 0
        #: (monotonic ack time, latency in seconds) of each record's first acknowledgement.
        self.acks: list[tuple[float, float]] = []

    def _raise(self, record_id: int, state: State) -> State:
        old = State(self._states[record_id])
        if state > old:
            self._states[record_id] = state
        return old

    def sent(self, record_id: int) -> None:
        """A producer instance took the record."""
        if 0 <= record_id < self.records:
            with self._lock:
                self._raise(record_id, State.SENT)

    def acknowledged_at(self, record_id: int, at: float, latency: float) -> None:
        """A producer was told the record is stored."""
        if 0 <= record_id < self.records:
            with self._lock:
                if self._raise(record_id, State.ACKNOWLEDGED) is not State.ACKNOWLEDGED:
                    self.acknowledged += 1
                    self.acks.append((at, latency))

    def failed(self, record_id: int, possibly_persisted: bool) -> None:
        """A producer gave up on the record (and says whether it may be stored)."""
        if 0 <= record_id < self.records:
            with self._lock:
                self._raise(record_id, State.AMBIGUOUS if possibly_persisted else State.FAILED)

    def in_flight_lost(self, start: int, end: int) -> None:
        """A producer instance died: its records in ``start..end`` without an answer are
        possibly persisted."""
        with self._lock:
            for record_id in range(max(0, start), min(end, self.records)):
                if self._states[record_id] == State.SENT:
                    self._states[record_id] = State.AMBIGUOUS

    def first_unacknowledged(self) -> int:
        """Where a restarted producer resumes: the lowest id not acknowledged (its source
        checkpoint), or ``records`` when every record is."""
        with self._lock:
            for record_id, state in enumerate(self._states):
                if state != State.ACKNOWLEDGED:
                    return record_id
            return self.records

    def states(self) -> list[State]:
        """Final states: a record still in flight counts as possibly persisted."""
        with self._lock:
            return [State.AMBIGUOUS if s == State.SENT else State(s) for s in self._states]


@attrs.frozen
class Verdict:
    """What the read-back shows, with example record ids of each anomaly."""

    sent: int
    acknowledged: int
    failed: int
    ambiguous: int
    ambiguous_stored: int
    stored: int
    stored_unique: int
    duplicates: int
    lost: int
    reordered: int
    unexpected: int
    examples: dict[str, list[int]]


def check(states: list[State], stored: Iterable[int | None], committed: int = 0) -> Verdict:
    """Compare the final ledger states with the ids read back, in log order (one partition).

    ``None`` in ``stored`` is a record this workload did not write (counted as unexpected).
    ``committed`` is a copy job's committed input position (in record ids): every record
    below it must be stored too, acknowledged or not, or it counts as lost.
    """
    counts: Counter[int] = Counter()
    reordered: list[int] = []
    unexpected = 0
    highest = -1
    total = 0
    for record_id in stored:
        if record_id is None or not 0 <= record_id < len(states):
            unexpected += 1
            continue
        total += 1
        counts[record_id] += 1
        if counts[record_id] > 1:
            continue
        if record_id < highest:
            reordered.append(record_id)
        else:
            highest = record_id
    tally = Counter(states)
    lost = [i for i, s in enumerate(states) if (s == State.ACKNOWLEDGED or i < committed) and i not in counts]
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    ambiguous_stored = sum(1 for i, s in enumerate(states) if s == State.AMBIGUOUS and i in counts)
    failed_stored = [i for i, s in enumerate(states) if s == State.FAILED and i in counts]
    return Verdict(
        sent=len(states) - tally[State.UNSENT],
        acknowledged=tally[State.ACKNOWLEDGED],
        failed=tally[State.FAILED],
        ambiguous=tally[State.AMBIGUOUS],
        ambiguous_stored=ambiguous_stored,
        stored=total,
        stored_unique=len(counts),
        duplicates=sum(c - 1 for c in counts.values()),
        lost=len(lost),
        reordered=len(reordered),
        unexpected=unexpected,
        examples={
            "duplicates": duplicated[:EXAMPLES],
            "lost": lost[:EXAMPLES],
            "reordered": reordered[:EXAMPLES],
            "failed_but_stored": failed_stored[:EXAMPLES],
        },
    )


__all__ = ["EXAMPLES", "Ledger", "State", "Verdict", "check"]
