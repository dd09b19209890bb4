"""A named producer's checker state on one partition, recovered at its restart: the stored
state (a snapshot) plus a replay of the partition after it, never an empty state assumed.

A producer that writes straight into Kafka or Pulsar (:mod:`idempotent.adapters.kafka.producer_log`,
:mod:`idempotent.adapters.pulsar.producer_log`) stores its state on every partition it writes in a state topic,
and records once, in the metadata topic (``wrote:`` records, :mod:`idempotent.adapters.metadata`), that
it writes the partition. A restart meets one of four states on each recorded partition:

* **stored and current**: the replay after it finds nothing of the producer's (the usual
  case: the state is written with the batches it covers);
* **stored but older than the data** (the state topic lost its newest records): the replay
  finds the producer's newer batches (their heads carry its id) and applies them;
* **missing** (the state topic lost the partition, or never had the key) or **unreadable**:
  the replay of the partition's tail finds the producer's latest batches, so its last
  sequence, epoch and the offsets of the batches found are rebuilt from the data.

The replay is bounded by a window: the last ``window`` offsets of the partition. What it
reads decides the state when it starts at or before the stored state's position (or the
partition's first retained offset, for a stored state: what retention removed is gone for
every reader), or when it finds a batch of the producer (the newest batch of a producer is
the one that says where its sequences end; a stored state older than the window still
contributes the batches before it). Otherwise the window cannot decide, and the restart is
refused with :class:`~idempotent.errors.ProducerStateLostError`: starting empty would store
the producer's resends a second time.

Pure: no I/O. The adapters give it the partition's bounds and a replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from idempotent.broker.config import STATE_REBUILD_RECORDS
from idempotent.core.checker import CheckerConfig, PartitionChecker
from idempotent.core.records import Snapshot, StoredBatch
from idempotent.errors import ProducerStateLostError


def replay_start(stored: Snapshot | None, log_start: int, end: int, window: int) -> tuple[int, bool]:
    """Where the replay of a partition (retained offsets ``log_start`` to ``end``) begins for
    a producer whose stored state there is ``stored`` (None: missing or unreadable), and
    whether that replay alone decides the state (it covers everything after the stored state
    that is still retained, or, with no stored state, the whole partition from offset 0)."""
    floor = max(log_start, end - window, 0)
    if stored is None:
        return floor, floor == 0
    after = max(stored.position, log_start)
    if after >= floor:
        return after, True
    return floor, False


def recover_state(
    producer_name: str,
    producer_id: int,
    topic: str,
    partition: int,
    stored: Snapshot | None,
    trouble: str | None,
    bounds: tuple[int, int],
    window: int,
    replay: Callable[[int], Iterable[StoredBatch]],
    *,
    config: CheckerConfig | None = None,
    now: float = 0.0,
) -> Snapshot | None:
    """The producer's state on one partition: ``stored`` completed by a replay of the
    partition (see the module docstring).

    Args:
        producer_name: the producer, for the refusal's message.
        producer_id: its id: the batches replayed are applied when their heads carry it.
        topic, partition: the partition, for the refusal's message.
        stored: its stored state there, or None.
        trouble: why ``stored`` is None (``"missing"``, ``"unreadable: ..."``), or None
            when it is stored.
        bounds: the partition's first retained offset and its end.
        window: offsets read back at most (:data:`STATE_REBUILD_RECORDS` by default).
        replay: the stored batches from an offset to the partition's end, in offset order.
        config: the checker's bounds (its window of batches).
        now: the time the checker is rebuilt at.

    Returns:
        The state, valid below the partition's end; None when the producer has nothing there
        (no stored state, and no batch of it in the whole partition).

    Raises:
        ProducerStateLostError: the window cannot decide; nothing was changed.
        CorruptDataError: the stored state or a replayed batch cannot be decoded.
    """
    log_start, end = bounds
    start, decided = replay_start(stored, log_start, end, window)
    checker = PartitionChecker.restore(stored, config, now=now)
    found = 0
    if start < end:
        for batch in replay(start):
            if batch.producer_id != producer_id or batch.base_offset < checker.position:
                continue
            checker.apply(batch)
            found += 1
    if not decided and not found:
        raise state_lost(
            producer_name,
            topic,
            partition,
            "older than the window" if trouble is None else trouble,
            f"the last {window} offsets of the partition (offsets {start} to {end}) hold none of its batches",
            end - max(log_start, 0),
        )
    if stored is None and not found:
        return None
    checker.position = max(checker.position, end)
    return checker.snapshot(now)


def state_lost(
    producer_name: str, topic: str, partition: int, what: str, read: str, whole: int | None
) -> ProducerStateLostError:
    """The refusal of a restart whose state on ``topic[partition]`` is ``what`` (missing,
    unreadable, older than the window) when ``read`` (what the window held) cannot rebuild
    it; ``whole``: the window that would read the whole partition, when known."""
    larger = "" if whole is None else f", at least {whole} reads the whole partition"
    return ProducerStateLostError(
        f"the stored state of producer {producer_name!r} on {topic}[{partition}] is {what}, and {read}, so "
        "where its sequences end there cannot be told: its restart is refused rather than storing its "
        "resends a second time. Restart it with a larger rebuild window (BrokerConfig.state_rebuild_records"
        f"{larger}), or open it under a new producer name (whose records are all new)",
        producer_name,
        topic,
        partition,
    )


__all__ = ["STATE_REBUILD_RECORDS", "recover_state", "replay_start", "state_lost"]
