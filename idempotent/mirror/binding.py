"""A job copies one source: the check that refuses another one before anything is copied.

A job's resume point on a destination partition is a *source offset*: the last sequence its
producer stored there. It means something only for the source it was taken from. Run under
the same name with another source (another file, another topic copied into the same
destination topic), the job would resume after an offset of the first source, and skip
what the second one holds below it, silently.

The destination already says which source a job copied: each copied record carries the
``idem.src.topic`` header (the file's path, the topic's name), and the checker keeps, per
producer, the offset of the last record it stored. :func:`bind_tasks` reads that record
for every producer of the job on each destination partition the job is about to write, and
refuses the job with :class:`~idempotent.errors.ConfigError` when

* the producer that will write the partition copied another source into it (a file job
  given another file), or
* another producer of the same job wrote that partition (another topic of the job, copied
  into the same destination topic).

It also finds the resume point of a partition a job copied before producer names held the
topic (``job/partition``, :func:`.names.legacy_producer_name`), when that producer copied
the same source.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from ..api import BrokerAPI
from ..errors import ConfigError
from .engine import PartitionTask
from .names import SOURCE_TOPIC, legacy_producer_name, parse_producer_name
from .source import Source

if TYPE_CHECKING:
    from idempotent.core.values import ProducerStats

_LOG = logging.getLogger("idempotent.mirror")


def copied_source(broker: BrokerAPI, topic: str, partition: int, producer: ProducerStats) -> str | None:
    """The ``idem.src.topic`` of the last record ``producer`` stored in ``topic[partition]``,
    or None when that record cannot be read (removed by retention) or has no such header."""
    if producer.last_offset < 0:
        return None
    for record in broker.read(topic, partition, producer.last_offset, 1):
        if record.offset == producer.last_offset:
            value = dict(record.headers).get(SOURCE_TOPIC)
            return None if value is None else value.decode("utf-8", "replace")
    return None


def bind_tasks(broker: BrokerAPI, source: Source, tasks: Sequence[PartitionTask]) -> list[PartitionTask]:
    """Check that each task's job copied nothing but the task's source into the task's
    destination partition; return the tasks, with the resume point of a job that began
    under its name of before per-topic names (``legacy_position``).

    Reads the destination only (``stats`` and one record per producer of the job).

    Raises:
        ConfigError: the job copied another source into a destination partition of a task
            (the message names the job, the source it copied and how to start a new job).
            Nothing was written.
        BrokerError, TransportError: the destination failed.
    """
    existing = broker.topics()
    out: list[PartitionTask] = []
    stats_by_topic: dict[str, dict[int, tuple[ProducerStats, ...]]] = {}
    for task in tasks:
        if task.to_topic not in existing:
            out.append(task)
            continue
        if task.to_topic not in stats_by_topic:
            stats_by_topic[task.to_topic] = {s.partition: s.producers for s in broker.stats(task.to_topic)}
        producers = stats_by_topic[task.to_topic].get(task.to_partition, ())
        out.append(_bind(broker, source, task, producers))
    return out


def _bind(broker: BrokerAPI, source: Source, task: PartitionTask, producers: Sequence[ProducerStats]) -> PartitionTask:
    expected = source.source_topic(task.topic, task.partition)
    own_name = task.producer_name
    legacy = -1
    for producer in producers:
        name = producer.producer_name
        is_own = name == own_name
        is_legacy = not is_own and name == legacy_producer_name(task.job, task.partition)
        if producer.last_sequence < 0 or not (is_own or is_legacy or parse_producer_name(task.job, name)):
            continue
        copied = copied_source(broker, task.to_topic, task.to_partition, producer)
        if is_own or is_legacy:
            if copied is None:
                _LOG.warning(
                    "job %r: the last record %s stored in %s[%d] is gone; cannot check which source it copied",
                    task.job,
                    producer.producer_name,
                    task.to_topic,
                    task.to_partition,
                )
            if copied is None or copied == expected:
                if is_legacy:
                    legacy = producer.last_sequence
                continue
        raise ConfigError(_refusal(task, expected, copied, producer))
    return attrs.evolve(task, legacy_position=legacy) if legacy >= 0 else task


def _refusal(task: PartitionTask, expected: str, copied: str | None, producer: ProducerStats) -> str:
    what = repr(copied) if copied is not None else f"another source (as producer {producer.producer_name!r})"
    return (
        f"job {task.job!r} copied {what} into {task.to_topic}[{task.to_partition}] "
        f"(up to its offset {producer.last_sequence}), so it cannot copy {expected!r} there: "
        "a job resumes after an offset of the one source it copies, and would skip records of another. "
        f"To copy {expected!r}, start a new job with another --job name (it copies from the beginning); "
        f"to go on with {what}, run job {task.job!r} with that source. Nothing was copied."
    )


__all__ = ["bind_tasks", "copied_source"]
