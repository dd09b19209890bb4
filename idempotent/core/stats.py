"""The state of one partition's checker as a :class:`~idempotent.core.values.PartitionStats`
value (``Broker.stats``, ``idempotent stats``, the metrics). Pure: the caller holds the
partition's lock and passes the time in."""

from __future__ import annotations

from collections.abc import Callable

from idempotent.core.checker import PartitionChecker, Policy
from idempotent.core.partition import PartitionCore
from idempotent.core.types import TopicPartition
from idempotent.core.values import PartitionStats, ProducerStats


def partition_stats(
    tp: TopicPartition,
    core: PartitionCore,
    checker: PartitionChecker,
    *,
    deduplication: bool,
    policy: Policy,
    name_of: Callable[[int], str | None],
    now: float,
) -> PartitionStats:
    """The stats of ``tp`` from its core and its checker (the core's, or the one it had
    before a failure); ``name_of`` gives a producer id's name, ``now`` is wall-clock
    seconds."""
    producers = tuple(
        ProducerStats(
            producer_id,
            state.producer_epoch,
            name_of(producer_id),
            state.last_sequence,
            state.last_offset,
            state.last_timestamp,
        )
        for producer_id, state in sorted(checker.producers().items())
    )
    return PartitionStats(
        tp.topic,
        tp.partition,
        "recovering" if core.failed else "ready",
        deduplication,
        policy.value,
        checker.position,
        checker.pending,
        checker.last_snapshot_position,
        (now - checker.last_snapshot_at) if checker.last_snapshot_position >= 0 else None,
        checker.entries_since_snapshot,
        core.recovery_seconds,
        core.replayed,
        producers,
    )
