"""Producer ids and epochs: a pure registry the broker persists through its backend.

Ids are allocated from blocks that the backend hands out atomically, so two brokers (or two
lives of one broker) never give out the same id. Every initialised producer has a record:

* an anonymous producer gets a fresh id at epoch 0;
* a named producer keeps its id across restarts; each ``init`` bumps its epoch, which
  fences every older instance; past ``MAX_EPOCH`` the name moves to a fresh id.

``state_lost`` is set when a partition evicted the producer's state: from then on the
producer may not start on a partition where it has no state, because it cannot prove that
its next sequence is new there. Re-initialising clears the flag.

``last_used`` is when the producer was last initialised or seen writing;
:meth:`ProducerRegistry.sweep` decides which records, idle for longer than the broker's
retention, are deleted (a later ``init`` of the name then takes a fresh id); see
docs/semantics.md, section 2.6.

``principal`` names the authenticated principal that owns the producer (see
:mod:`idempotent.net.auth`): it is set when the record is created and carried over to every later
epoch, also when the name moves to a fresh id. ``None`` means unowned (created by a broker
without authentication). The registry stores what the caller decides; the access rules live
in :class:`idempotent.net.auth.AccessPolicy`.

Admission is asked through :class:`Admissions`: a broker's :class:`ProducerRegistry` admits
every producer it initialised; :class:`OwnProducer`, the admission of a producer's own broker
(:class:`~idempotent.broker.direct.DirectBroker`), admits its one producer.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs

from idempotent.core.types import MAX_EPOCH, Epoch, ProducerId
from idempotent.errors import ConfigError, InternalError


@attrs.frozen
class ProducerRecord:
    """The broker's durable record of one producer."""

    producer_id: ProducerId
    producer_epoch: Epoch
    producer_name: str | None = None
    state_lost: bool = False
    #: partitions a named producer has written to (sorted), so that re-initialising it
    #: only has to look at those; empty for anonymous producers
    partitions: tuple[tuple[str, int], ...] = ()
    #: the principal owning this producer, None when unowned; new fields go last (encodings
    #: of older records are shorter and decode with the default)
    principal: str | None = None
    #: when the producer was last initialised or seen writing (wall-clock seconds), as far
    #: as the brokers noted it (see :meth:`ProducerRegistry.sweep`); 0.0: not noted yet
    last_used: float = 0.0


class Admission(enum.Enum):
    """What :meth:`ProducerRegistry.admit` says of a producer id and epoch, before any
    sequence is looked at (the checker's ``admitted`` is ``ADMITTED`` alone)."""

    ADMITTED = "admitted"
    STATE_LOST = "state_lost"
    FENCED = "fenced"
    UNKNOWN = "unknown"


MAX_NAME_LENGTH = 1024


def validate_name(name: str) -> str:
    """Return ``name`` if it is usable as a producer name, else raise ConfigError."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ConfigError(f"producer_name must be a non-empty str of at most {MAX_NAME_LENGTH} characters")
    if any(ord(c) < 32 for c in name):
        raise ConfigError("producer_name must not contain control characters")
    return name


def merge_record(known: ProducerRecord | None, incoming: ProducerRecord) -> ProducerRecord:
    """The record to keep when ``incoming`` meets the ``known`` record of the same producer id.

    Several brokers write records of one producer, each from its own (possibly stale) copy, so
    every store folds them with this one rule instead of keeping the last write: a higher
    ``producer_epoch`` wins, a lower one is ignored; at the same epoch the noted partitions are
    united, ``state_lost`` stays set once either side set it, and the known principal is kept.
    Returns ``known`` itself when ``incoming`` adds nothing.
    """
    if known is None or incoming.producer_epoch > known.producer_epoch:
        return incoming
    if incoming.producer_epoch < known.producer_epoch:
        return known
    partitions = tuple(sorted({*known.partitions, *incoming.partitions}))
    state_lost = known.state_lost or incoming.state_lost
    last_used = max(known.last_used, incoming.last_used)
    if partitions == known.partitions and state_lost == known.state_lost and last_used == known.last_used:
        return known
    return attrs.evolve(known, partitions=partitions, state_lost=state_lost, last_used=last_used)


@attrs.frozen
class RegistrySweep:
    """What :meth:`ProducerRegistry.sweep` decided: records to store again with a later
    ``last_used``, and ids of records to delete (idle for longer than the retention)."""

    touched: list[ProducerRecord]
    expired: list[ProducerId]


class ProducerRegistry:
    """Ids, names and epochs of all producers the broker has initialised."""

    def __init__(self, records: list[ProducerRecord] | None = None) -> None:
        self._by_id: dict[int, ProducerRecord] = {}
        self._by_name: dict[str, ProducerRecord] = {}
        self._next_id = 0
        self._block_end = 0
        #: when :meth:`sweep` first saw each record stored without ``last_used``
        self._first_swept: dict[int, float] = {}
        for record in records or []:
            self._store(record)

    def _store(self, record: ProducerRecord) -> None:
        self._by_id[record.producer_id] = record
        if record.producer_name is not None:
            old = self._by_name.get(record.producer_name)
            if old is not None and old.producer_id != record.producer_id:
                self._by_id.pop(old.producer_id, None)
            self._by_name[record.producer_name] = record

    def __len__(self) -> int:
        return len(self._by_id)

    def lookup(self, producer_id: int) -> ProducerRecord | None:
        """The record of a producer id, or None."""
        return self._by_id.get(producer_id)

    def by_name(self, name: str) -> ProducerRecord | None:
        """The record of a named producer, or None."""
        return self._by_name.get(name)

    def records(self) -> list[ProducerRecord]:
        """Every record, in id order."""
        return sorted(self._by_id.values(), key=lambda r: r.producer_id)

    # -- ids -------------------------------------------------------------------------------

    def needs_id_block(self) -> bool:
        """True when the next allocation needs a new block from the backend."""
        return self._next_id >= self._block_end

    def add_id_block(self, start: int, size: int) -> None:
        """Use ids ``start .. start+size-1`` for the next allocations."""
        self._next_id, self._block_end = start, start + size

    def _take_id(self) -> ProducerId:
        if self.needs_id_block():
            raise InternalError("no producer id left in the current block (the broker adds one first)")
        pid = self._next_id
        self._next_id += 1
        return ProducerId(pid)

    # -- transitions (the caller persists the returned record) -----------------------------

    def init(self, name: str | None, principal: str | None = None, now: float = 0.0) -> ProducerRecord:
        """Initialise a producer at ``now`` and return its new record, owned by ``principal``.

        Raises:
            RuntimeError: an id is needed and ``needs_id_block()`` was not served first.
        """
        if name is None:
            record = ProducerRecord(self._take_id(), Epoch(0), principal=principal, last_used=now)
        else:
            old = self._by_name.get(validate_name(name))
            if old is None or old.producer_epoch >= MAX_EPOCH:
                record = ProducerRecord(self._take_id(), Epoch(0), name, principal=principal, last_used=now)
            else:
                epoch = Epoch(old.producer_epoch + 1)
                record = ProducerRecord(old.producer_id, epoch, name, False, old.partitions, principal, now)
        self._store(record)
        return record

    def will_need_id(self, name: str | None) -> bool:
        """True when ``init(name)`` will take a fresh id."""
        if name is None:
            return True
        old = self._by_name.get(name)
        return old is None or old.producer_epoch >= MAX_EPOCH

    def merge(self, records: list[ProducerRecord]) -> None:
        """Adopt records another broker stored, folded with :func:`merge_record`."""
        for record in records:
            known = self._by_id.get(record.producer_id)
            merged = merge_record(known, record)
            if merged is not known:
                self._store(merged)

    def add_partition(self, producer_id: int, topic: str, partition: int) -> ProducerRecord | None:
        """Note that a named producer writes to a partition. Returns the changed record, or
        None when nothing changed (anonymous producer, or partition already noted)."""
        record = self._by_id.get(producer_id)
        if record is None or record.producer_name is None or (topic, partition) in record.partitions:
            return None
        record = attrs.evolve(record, partitions=tuple(sorted({*record.partitions, (topic, partition)})))
        self._store(record)
        return record

    def mark_state_lost(self, producer_id: int) -> ProducerRecord | None:
        """Flag a producer whose state a partition evicted. Returns the changed record."""
        record = self._by_id.get(producer_id)
        if record is None or record.state_lost:
            return None
        record = attrs.evolve(record, state_lost=True)
        self._store(record)
        return record

    def admit(self, producer_id: int, producer_epoch: int) -> Admission:
        """Decide whether a producer may write, before sequences are looked at."""
        record = self._by_id.get(producer_id)
        if record is None or producer_epoch > record.producer_epoch:
            return Admission.UNKNOWN
        if producer_epoch < record.producer_epoch:
            return Admission.FENCED
        return Admission.STATE_LOST if record.state_lost else Admission.ADMITTED

    # -- retention -------------------------------------------------------------------------

    def sweep(self, now: float, retention: float, activity: Mapping[int, float]) -> RegistrySweep:
        """Decide which records to refresh and which to drop, at ``now``.

        A record is **expired** when its producer was neither initialised nor seen writing
        for longer than ``retention`` seconds: ``max(last_used, activity[id]) < now -
        retention``. ``activity`` maps producer ids to the latest write the caller's
        partitions saw (their checkers' last timestamps). A record's ``last_used`` is moved
        up to that activity (**touched**, for the caller to store) once it lags by more than
        a quarter of the retention, so other brokers and later lives of this one see a
        producer that keeps writing as used, at the cost of one store per producer per
        quarter of the retention. A record stored before ``last_used`` existed (0.0)
        counts as used at the first sweep of this registry that saw it (kept in memory
        only, so that a broker's first sweep does not rewrite every old record).

        The records are not changed here: the caller stores the touched ones (then :meth:`merge`
        them), deletes the expired ids from its backend, then :meth:`drop` them.

        Raises:
            ConfigError: ``retention`` is not positive.
        """
        if retention <= 0:
            raise ConfigError(f"producer record retention must be positive, got {retention}")
        limit = now - retention
        touched: list[ProducerRecord] = []
        expired: list[ProducerId] = []
        for record in self._by_id.values():
            last_used = record.last_used or self._first_swept.setdefault(record.producer_id, now)
            seen = activity.get(record.producer_id, 0.0)
            if max(last_used, seen) < limit:
                expired.append(record.producer_id)
            elif seen - last_used > retention / 4:
                touched.append(attrs.evolve(record, last_used=seen))
        return RegistrySweep(touched, sorted(expired))

    def drop(self, producer_ids: Iterable[int]) -> None:
        """Forget the records of ``producer_ids`` (deleted from the backend by the caller).
        Their ids are never given out again: a later ``init`` of the name takes a fresh one."""
        for producer_id in producer_ids:
            self._first_swept.pop(producer_id, None)
            record = self._by_id.pop(producer_id, None)
            name = record.producer_name if record is not None else None
            if name is not None and self._by_name.get(name) is record:
                del self._by_name[name]


class Admissions(Protocol):
    """What the decision loop (``idempotent/broker/decisions.py``) asks of a producer's
    admission, once per batch: :class:`ProducerRegistry` and :class:`OwnProducer`."""

    def admit(self, producer_id: int, producer_epoch: int) -> Admission:
        """Decide whether a producer may write, before sequences are looked at."""
        ...

    def lookup(self, producer_id: int) -> ProducerRecord | None:
        """The record of a producer id (its registered epoch is told to a FENCED one), or None."""
        ...


class OwnProducer:
    """The admission of a producer's own broker: it serves the one producer it initialised.

    Its batches are admitted whatever their epoch (the checker fences an epoch older than the
    partition's; an older instance of a named producer is fenced by its log, not here); any
    other producer id is unknown.
    """

    __slots__ = ("record",)

    def __init__(self, record: ProducerRecord) -> None:
        self.record = record

    def admit(self, producer_id: int, producer_epoch: int) -> Admission:
        """ADMITTED for the broker's producer, else UNKNOWN."""
        return Admission.ADMITTED if producer_id == self.record.producer_id else Admission.UNKNOWN

    def lookup(self, producer_id: int) -> ProducerRecord | None:
        """The broker's producer's record, or None for another id."""
        return self.record if producer_id == self.record.producer_id else None
