"""The producer table of one partition: every producer's persisted view, bit-packed in columns.

Theory of operation
-------------------
The checker (``_checker.py``) decides; this table only stores what it decided, for every
producer with state on the partition, in as little memory as a dict entry and a few array
cells per producer:

* ``index``: a dict from producer id to a *key*, kept in eviction order (least recently active
  first). The key packs the producer's slot in the columns, its epoch and its newest window
  entry's record count into one int (two 30-bit digits, the size of any int above 2**30, for
  slots below 2**24), so the dict costs no object per producer beyond the int itself.
* paged arrays indexed by slot (``last``, ``time``, ``base``): H(P), the timestamp of the last
  stored batch, and the newest window entry's base offset (its first sequence follows from
  H(P) and the count). Pages never move once allocated: growing the columns never copies
  what is already there, and a partition with few producers holds one small page.
* kept aside only for the producers that have them: older window entries (``older``, flat
  ``(first_sequence, last_sequence, base_offset)``, oldest first), and a newest entry that does
  not end at H(P) (``apart``: a replayed batch behind it).

A producer's window entries answer where a resend was stored (:func:`original_offset`, with
:func:`within` for a range that may wrap on the int32 ring).

A snapshot (``_snapshot.py``) is these columns in eviction order (:meth:`ProducerTable.columns`),
and a restored table takes a decoded snapshot's columns over as they are
(:class:`ProducerTable` built from :class:`~idempotent.core.snapshot.Columns`). Pure: no clock,
no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import TypeVar

from idempotent.core.sequence import advances, in_ring, last_sequence_of, next_sequence
from idempotent.core.snapshot import Columns
from idempotent.core.types import NO_SEQUENCE, SEQUENCE_SPACE

__all__ = ["ProducerTable", "first_of", "original_offset", "within"]

#: a key's fields: ``slot << SLOT_SHIFT | epoch << EPOCH_SHIFT | record_count``
SLOT_SHIFT = 36
EPOCH_SHIFT = 20
EPOCH_MASK = (1 << 16) - 1
COUNT_MASK = (1 << 20) - 1
#: the columns are pages of this many slots
PAGE_BITS = 12
PAGE_MASK = (1 << PAGE_BITS) - 1

_T = TypeVar("_T", int, float)


def _pages(column: array[_T]) -> list[array[_T]]:
    """A decoded column cut into pages."""
    size = 1 << PAGE_BITS
    return [column[i : i + size] for i in range(0, len(column), size)]


def _flat(pages: list[array[_T]], typecode: str) -> array[_T]:
    """One array of every page's values, slot after slot."""
    flat: array[_T] = array(typecode)
    for page in pages:
        flat.extend(page)
    return flat


def _key(slot: int, producer_epoch: int, record_count: int) -> int:
    return slot << SLOT_SHIFT | producer_epoch << EPOCH_SHIFT | record_count


def first_of(last: int, record_count: int) -> int:
    """The first sequence of a stored batch from its last one (inverse of last_sequence_of)."""
    first = last - record_count + 1
    return first + SEQUENCE_SPACE if first < 0 else first  # wrapped to 0 on the int32 ring


def epoch_of(key: int) -> int:
    """The epoch a key holds."""
    return (key >> EPOCH_SHIFT) & EPOCH_MASK


def _steps(first: int, sequence: int) -> int:
    """Records from ``first`` to ``sequence`` inside one stored batch (which wraps only on the
    ring, see ``_sequence.py``)."""
    return (sequence - first) % SEQUENCE_SPACE if sequence < first else sequence - first


def within(first: int, last: int, sequence: int) -> bool:
    """True when ``sequence`` is one of the sequences ``first .. last`` of a stored range."""
    if first <= last:
        return first <= sequence <= last
    return in_ring(sequence) and (sequence >= first or sequence <= last)  # wraps to 0


def original_offset(window: list[tuple[int, int, int]], base: int, last: int) -> int | None:
    """The offset of sequence ``base`` when every record up to ``last`` is in the window
    (``(first, last, base_offset)`` entries, oldest first) at consecutive offsets (one stored
    batch, or adjacent ones with no other records between them), else None: record i of the
    resend is then at the result + i."""
    for index, (first, entry_last, entry_offset) in enumerate(window):
        if not within(first, entry_last, base):
            continue
        offset = entry_offset + _steps(first, base)
        current = (first, entry_last, entry_offset)
        for following in window[index + 1 :]:
            if within(current[0], current[1], last):
                return offset
            contiguous = following[0] == next_sequence(current[1]) and (
                following[2] == current[2] + _steps(current[0], current[1]) + 1
            )
            if not contiguous:
                return None
            current = following
        if within(current[0], current[1], last):
            return offset
        return None
    return None


class ProducerTable:
    """The persisted view of every producer of one partition (see the module docstring).

    The attributes are the columns themselves; the checker reads them directly on its hot
    path and changes them only through the methods here.
    """

    __slots__ = ("apart", "base", "free", "index", "last", "older", "slots", "tail", "time")

    def __init__(self, columns: Columns | None = None) -> None:
        """Take over decoded columns (slot i is the i-th producer, in eviction order), or start
        empty."""
        columns = columns if columns is not None else Columns()
        epochs, counts = columns.producer_epoch, columns.record_count
        keys = map(_key, range(len(epochs)), epochs, counts)
        #: producer_id -> key (slot, epoch and newest entry's record count), in eviction order
        self.index: dict[int, int] = dict(zip(columns.producer_id, keys, strict=True))
        self.last = _pages(columns.last_sequence)
        self.time = _pages(columns.last_timestamp)
        #: the newest window entry's base offset; its last sequence is H(P) unless in ``apart``
        self.base = _pages(columns.base_offset)
        self.slots = len(epochs)
        #: newest window entries whose last sequence is not H(P) (a replayed batch behind it)
        self.apart: dict[int, int] = {}
        for producer_id, first, count, high in zip(
            columns.producer_id, columns.first_sequence, counts, columns.last_sequence, strict=True
        ):
            if first + count - 1 != high and (last := last_sequence_of(first, count)) != high:
                self.apart[producer_id] = last
        #: older window entries, flat (first_sequence, last_sequence, base_offset), oldest first
        self.older: dict[int, array[int]] = columns.older
        self.free: list[int] = []
        #: the last producer in the eviction order when known (None: look it up)
        self.tail: int | None = None

    def __len__(self) -> int:
        return len(self.index)

    def add(self, producer_id: int, producer_epoch: int) -> int:
        """The key of a producer new to the partition (nothing stored), placed at the end of
        the eviction order."""
        if self.free:
            slot = self.free.pop()
            page, at = slot >> PAGE_BITS, slot & PAGE_MASK
            self.last[page][at] = NO_SEQUENCE
            self.time[page][at] = 0.0
            self.base[page][at] = 0
        else:
            slot = self.slots
            self.slots += 1
            if not slot & PAGE_MASK:
                self.last.append(array("q"))
                self.time.append(array("d"))
                self.base.append(array("q"))
            self.last[-1].append(NO_SEQUENCE)
            self.time[-1].append(0.0)
            self.base[-1].append(0)
        key = self.index[producer_id] = _key(slot, producer_epoch, 0)
        self.tail = producer_id
        return key

    def remove(self, producer_id: int) -> None:
        """Drop a producer; its slot is reused by the next one added."""
        if producer_id == self.tail:
            self.tail = None
        slot = self.index.pop(producer_id) >> SLOT_SHIFT
        self.last[slot >> PAGE_BITS][slot & PAGE_MASK] = NO_SEQUENCE  # counted as free by columns()
        self.free.append(slot)
        self.older.pop(producer_id, None)
        self.apart.pop(producer_id, None)

    def stored(self, key: int) -> int:
        """H(P) of the producer with this key."""
        slot = key >> SLOT_SHIFT
        return self.last[slot >> PAGE_BITS][slot & PAGE_MASK]

    def newest(self, producer_id: int, key: int) -> tuple[int, int, int] | None:
        """The newest window entry of a producer as (first, last, base_offset), or None."""
        count = key & COUNT_MASK
        if not count:
            return None
        slot = key >> SLOT_SHIFT
        page, at = slot >> PAGE_BITS, slot & PAGE_MASK
        high = self.last[page][at]
        last = self.apart.get(producer_id, high) if self.apart else high
        return first_of(last, count), last, self.base[page][at]

    def window(self, producer_id: int, key: int) -> list[tuple[int, int, int]]:
        """The window of a producer, oldest first, as (first, last, base_offset)."""
        older = self.older.get(producer_id)
        entries = [] if older is None else [(older[i], older[i + 1], older[i + 2]) for i in range(0, len(older), 3)]
        newest = self.newest(producer_id, key)
        if newest is not None:
            entries.append(newest)
        return entries

    def view(self, key: int) -> tuple[int, int, int, float]:
        """(epoch, H(P), last offset or -1, last timestamp) of the producer with this key."""
        slot, count = key >> SLOT_SHIFT, key & COUNT_MASK
        page, at = slot >> PAGE_BITS, slot & PAGE_MASK
        last_offset = self.base[page][at] + count - 1 if count else -1
        return epoch_of(key), self.last[page][at], last_offset, self.time[page][at]

    def times(self) -> array[float]:
        """The timestamp of every slot's last stored batch, indexed by slot."""
        return _flat(self.time, "d")

    def slot_times(self) -> dict[int, float]:
        """When each producer's last stored batch was, by producer id."""
        times = self.times()
        return {pid: times[key >> SLOT_SHIFT] for pid, key in self.index.items()}

    def store(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
        timestamp: float,
        window: int,
    ) -> tuple[int, int, int]:
        """Record a stored batch: it becomes the producer's newest window entry (the previous
        one joins the older entries, ``window`` entries kept in all), the producer moves to the
        end of the eviction order, and H(P) moves when the batch advances it.

        Returns:
            The producer's epoch now, the batch's last sequence and H(P) now.
        """
        # the hot path: written out rather than calling newest / _key
        index = self.index
        key = index.get(producer_id)
        if key is None:
            key = self.add(producer_id, producer_epoch)
        elif self.tail != producer_id:  # the most recently active goes last
            del index[producer_id]
            self.tail = producer_id
        slot = key >> SLOT_SHIFT
        page, at = slot >> PAGE_BITS, slot & PAGE_MASK
        epoch = (key >> EPOCH_SHIFT) & EPOCH_MASK
        if producer_epoch > epoch:
            epoch = producer_epoch
        stored = self.last[page]
        high = stored[at]
        apart = self.apart
        count = key & COUNT_MASK
        if count:  # the newest entry so far joins the older ones
            newest = apart.get(producer_id, high) if apart else high
            first = newest - count + 1
            older = self.older.get(producer_id)
            if older is None:
                older = self.older[producer_id] = array("q")
            older.extend((first + SEQUENCE_SPACE if first < 0 else first, newest, self.base[page][at]))
            keep = 3 * (window - 1)
            if len(older) > keep:
                del older[: len(older) - keep]
        last = last_sequence_of(base_sequence, record_count)
        if advances(last, high):
            high = stored[at] = last
        if last != high:
            apart[producer_id] = last
        elif apart:
            apart.pop(producer_id, None)
        times = self.time[page]
        if timestamp > times[at]:
            times[at] = timestamp
        self.base[page][at] = base_offset
        index[producer_id] = slot << SLOT_SHIFT | epoch << EPOCH_SHIFT | record_count
        return epoch, last, high

    def columns(self, position: int) -> Columns:
        """The columns of every producer with a stored sequence, in eviction order: what a
        snapshot valid below ``position`` holds."""
        index = self.index
        pids: Iterable[int] = index
        last = _flat(self.last, "q")
        if last.count(NO_SEQUENCE) > len(self.free):  # producers with nothing stored yet
            pids = [p for p, key in index.items() if last[key >> SLOT_SHIFT] != NO_SEQUENCE]
        order = array("q", pids)
        keys = [index[p] for p in order]
        slots = [k >> SLOT_SHIFT for k in keys]
        counts = array("i", [k & COUNT_MASK for k in keys])
        stored = array("q", map(last.__getitem__, slots))
        newest = map(self.apart.get, order, stored) if self.apart else stored
        return Columns(
            position,
            order,
            array("h", [(k >> EPOCH_SHIFT) & EPOCH_MASK for k in keys]),
            stored,
            array("d", map(_flat(self.time, "d").__getitem__, slots)),
            array("q", map(first_of, newest, counts)),
            array("q", map(_flat(self.base, "q").__getitem__, slots)),
            counts,
            older={p: self.older[p] for p in order if p in self.older} if self.older else {},
        )
