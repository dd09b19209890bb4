"""Copy jobs on Spark: one Spark task per source partition (see docs/mirror.md).

The driver plans the job with :meth:`idempotent.mirror.Mirror.plan` (destination topic with
the source's partition count, ``monotonic`` policy, each partition's end); each task runs
:func:`idempotent.mirror.copy_partition`, which resumes from the destination's last stored
sequence. A retried or speculative task therefore fences the attempt before it and copies
nothing twice, and running the job again resumes it, as with the threaded engine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from .._gc import fewer_collections
from ..mirror import Mirror, MirrorSummary, PartitionSummary, PartitionTask, copy_partition, open_source
from ._host import ensure_host


def _copy_tasks(tasks: Iterator[PartitionTask]) -> Iterator[PartitionSummary]:
    for task in tasks:
        with fewer_collections():
            summary = copy_partition(task)
        yield summary


def mirror(
    spark: Any,
    source: str,
    destination: str,
    *,
    topic: str | None = None,
    to_topic: str | None = None,
    job: str,
) -> MirrorSummary:
    """Run (or resume) a copy job on Spark, one task per source partition.

    The arguments are those of :class:`idempotent.mirror.Mirror` (``follow`` is not offered:
    a Spark job copies up to the source's end when it was planned). A destination that is not
    ``idem://`` is reached through the broker server of :mod:`idempotent.spark._host`.

    Returns:
        The job's :class:`~idempotent.mirror.MirrorSummary`.

    Raises:
        ConfigError: missing topic or job, or a bad URL (nothing copied).
        Py4JJavaError: a task failed more often than Spark retries it; what was stored stays
            stored, and running the job again resumes it.
    """
    started = time.monotonic()
    job_mirror = Mirror(source, ensure_host(destination), topic=topic, to_topic=to_topic, job=job)
    opened = open_source(job_mirror.source)
    try:
        import idempotent

        with contextlib.closing(idempotent.connect(job_mirror.destination)) as broker:
            tasks = job_mirror.plan(opened, broker)
    finally:
        opened.close()
    summaries = spark.sparkContext.parallelize(tasks, max(1, len(tasks))).mapPartitions(_copy_tasks).collect()
    return MirrorSummary(
        job,
        source,
        destination,
        job_mirror.topic,
        job_mirror.to_topic,
        tuple(sorted(summaries, key=lambda s: s.partition)),
        time.monotonic() - started,
    )
