"""A consumer-side duplicate filter for data from sources that cannot be replayed exactly.

When records reach a consumer from a source that resends on its own (a device retrying an
upload, a webhook delivered twice, a client without a producer name), the broker cannot
deduplicate them. :class:`DuplicateFilter` recognises repeats in bounded memory, with no I/O:

* **By producer and sequence** (:meth:`DuplicateFilter.check_sequence`): for each producer
  it keeps the highest sequence seen and a bitmap of the ``window`` sequences up to it. A
  sequence above the highest is NEW; one inside the window is NEW the first time and
  DUPLICATE after; one at or below ``highest - window`` is TOO_OLD (the filter no longer
  knows; treat it as a duplicate unless you know better). Sequences may have gaps and may
  arrive out of order by less than ``window``. Sequences are plain integers with no
  wrap-around (an idempotent producer's int32 sequences wrap after about 2.1 billion records
  per partition: pass a counter that keeps growing). At most ``max_producers`` producers are
  remembered; beyond that the least recently seen producer is forgotten, and its next
  record counts as NEW (a duplicate of it may then pass once).
* **By application key** (:meth:`DuplicateFilter.check_key`): remembers the last
  ``max_keys`` distinct keys in first-seen order; beyond that the oldest key is forgotten
  (FIFO: seeing a key again does not refresh it), and a repeat of a forgotten key counts as NEW.

Memory is at most ``max_producers`` entries of (producer key, two ints of up to ``window``
bits) plus ``max_keys`` application keys. Eviction can only let a duplicate through; it
never turns a new record into a duplicate. State is per instance and in memory: persist the
decisions with the effects (for example with :class:`~idempotent.consumer.state.SqliteCheckpoint`)
when a restart must not forget them.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Hashable

import attrs

from idempotent.errors import ConfigError


class DuplicateVerdict(enum.Enum):
    """What :class:`DuplicateFilter` says about a record."""

    #: not seen before (within what the filter remembers)
    NEW = "new"
    #: seen before
    DUPLICATE = "duplicate"
    #: older than the producer's window: the filter cannot tell
    TOO_OLD = "too_old"


@attrs.define
class _Window:
    highest: int
    #: bit i set: sequence ``highest - i`` was seen (bit 0 is ``highest`` itself)
    seen: int = 1


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive int, got {value!r}")


@attrs.define
class DuplicateFilter:
    """Bounded-memory duplicate detection; pure (no I/O, no clock). Not thread-safe.

    Args:
        max_producers: producers whose sequences are remembered (least recently seen evicted).
        window: how many sequences below a producer's highest are remembered individually.
        max_keys: application keys remembered (oldest first-seen evicted).

    Raises:
        ConfigError: a limit is not a positive int.
    """

    max_producers: int = attrs.field(default=100_000, validator=_positive)
    window: int = attrs.field(default=1024, validator=_positive)
    max_keys: int = attrs.field(default=1_000_000, validator=_positive)
    _producers: OrderedDict[Hashable, _Window] = attrs.field(init=False, factory=OrderedDict)
    _keys: OrderedDict[Hashable, None] = attrs.field(init=False, factory=OrderedDict)
    #: how many producers and keys were forgotten to stay within the limits
    evicted_producers: int = attrs.field(init=False, default=0)
    evicted_keys: int = attrs.field(init=False, default=0)

    def check_sequence(self, producer: Hashable, sequence: int, *, record: bool = True) -> DuplicateVerdict:
        """Classify ``sequence`` of ``producer`` and, when NEW and ``record``, remember it.

        ``producer`` is any hashable naming one sequence stream: a device id, or
        ``(producer_id, topic, partition)`` for records of an idempotent producer.
        With ``record=False`` nothing changes (check first, record after processing).

        Raises:
            ConfigError: ``sequence`` is not an int.
        """
        if not isinstance(sequence, int) or isinstance(sequence, bool):
            raise ConfigError(f"sequence must be an int, got {sequence!r}")
        state = self._producers.get(producer)
        if state is None:
            if record:
                self._producers[producer] = _Window(sequence)
                if len(self._producers) > self.max_producers:
                    self._producers.popitem(last=False)
                    self.evicted_producers += 1
            return DuplicateVerdict.NEW
        if record:
            self._producers.move_to_end(producer)
        if sequence > state.highest:
            if record:
                shift = sequence - state.highest
                state.seen = ((state.seen << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
                state.highest = sequence
            return DuplicateVerdict.NEW
        back = state.highest - sequence
        if back >= self.window:
            return DuplicateVerdict.TOO_OLD
        if state.seen >> back & 1:
            return DuplicateVerdict.DUPLICATE
        if record:
            state.seen |= 1 << back
        return DuplicateVerdict.NEW

    def check_key(self, key: Hashable, *, record: bool = True) -> DuplicateVerdict:
        """Classify an application key (NEW or DUPLICATE) and, when NEW and ``record``,
        remember it. With ``record=False`` nothing changes."""
        if key in self._keys:
            return DuplicateVerdict.DUPLICATE
        if record:
            self._keys[key] = None
            if len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
                self.evicted_keys += 1
        return DuplicateVerdict.NEW

    def highest_sequence(self, producer: Hashable) -> int | None:
        """The highest sequence remembered for ``producer``, or None."""
        state = self._producers.get(producer)
        return None if state is None else state.highest

    @property
    def producer_count(self) -> int:
        """Producers remembered now (at most ``max_producers``)."""
        return len(self._producers)

    @property
    def key_count(self) -> int:
        """Application keys remembered now (at most ``max_keys``)."""
        return len(self._keys)


__all__ = ["DuplicateFilter", "DuplicateVerdict"]
