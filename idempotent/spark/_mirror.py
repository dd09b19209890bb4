"""Copy jobs on Spark: one Spark task per source partition (see docs/mirror.md).

The driver plans the job with :meth:`idempotent.mirror.Mirror.plan` (destination topic with
the source's partition count, ``monotonic`` policy, each partition's end); each task runs
:func:`idempotent.mirror.copy_partition`, which resumes from the destination's last stored
sequence. A retried or speculative task therefore fences the attempt before it and copies
nothing twice, and running the job again resumes it, as with the threaded engine.

Both URLs are resolved once, on the driver (:func:`~idempotent.spark._host.resolve_url`), and
each task reaches them as :func:`~idempotent.spark._host.executor_url` allows: a SQLite file
of the driver's machine is refused on another machine, never opened anew there.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any

import attrs

from idempotent.runtime.collector import fewer_collections

from ..mirror import Mirror, MirrorSummary, PartitionSummary, PartitionTask, copy_partition, open_source
from ._host import check_reachable, ensure_host, executor_url, machine, resolve_url


def _copy_tasks(destination: str, origin: str, tasks: Iterator[PartitionTask]) -> Iterator[PartitionSummary]:
    """Run the tasks of one Spark partition: ``destination`` and the tasks' source are the
    driver's resolved URLs, ``origin`` its machine.

    Raises:
        ConfigError: a URL only the driver's machine serves, on another machine (nothing copied).
    """
    for task in tasks:
        check_reachable(task.source, origin)
        task = attrs.evolve(task, destination=executor_url(destination, origin))
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
    ``idem://`` is reached through the broker server of :mod:`idempotent.spark._host`. A
    relative SQLite path, of either URL, is made absolute from this (the driver's) working
    directory.

    Returns:
        The job's :class:`~idempotent.mirror.MirrorSummary`.

    Raises:
        ConfigError: missing topic or job, or a bad URL (nothing copied).
        Py4JJavaError: (with the ConfigError of :func:`~idempotent.spark._host.executor_url`)
            a SQLite file, ``memory://`` or loopback ``idem://`` URL used by an executor on
            another machine than the driver's; nothing was copied by that task.
        Py4JJavaError: a task failed more often than Spark retries it; what was stored stays
            stored, and running the job again resumes it.
    """
    started = time.monotonic()
    source, destination, origin = resolve_url(source), resolve_url(destination), machine()
    job_mirror = Mirror(source, ensure_host(destination), topic=topic, to_topic=to_topic, job=job)
    opened = open_source(job_mirror.source)
    try:
        import idempotent

        with contextlib.closing(idempotent.connect(job_mirror.destination)) as broker:
            tasks = job_mirror.plan(opened, broker)
    finally:
        opened.close()
    run = functools.partial(_copy_tasks, destination, origin)
    summaries = spark.sparkContext.parallelize(tasks, max(1, len(tasks))).mapPartitions(run).collect()
    return MirrorSummary(
        job,
        source,
        destination,
        job_mirror.topic,
        job_mirror.to_topic,
        tuple(sorted(summaries, key=lambda s: s.partition)),
        time.monotonic() - started,
    )
