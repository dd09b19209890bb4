"""``idempotent mirror``: copy a topic, a file or a directory into an idempotent topic, once.

The copy keeps its position in the destination itself (see :mod:`idempotent.mirror` and
docs/mirror.md): running the same command again, after a crash or ``kill -9``, resumes it
with no duplicates and no losses. Progress goes to stderr: a bar on a terminal, else a line
every few seconds; the summary goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from ..errors import ProducerError, UsageError
from ..mirror import Mirror, MirrorSummary, PartitionProgress
from .common import CliError, Subcommands, int_type
from .progress import Progress, add_progress_arguments


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent mirror`` to the subcommands."""
    mirror = commands.add_parser(
        "mirror",
        help="copy a topic or files into an idempotent topic, resumably and exactly once",
        description="Copy every record of a source into a topic of a broker, exactly once. Run the "
        "same command again after a crash (even kill -9) to resume: nothing is duplicated or lost. "
        "SOURCE: file:///path (a file, or a directory's files in name order; one record per "
        "line), kafka+native://host:port (a plain Kafka topic), "
        "pulsar+native://host:port?admin_url=http://host:port (a plain Pulsar topic), or a "
        "broker URL (sqlite://, memory://, idem://, kafka://, pulsar://) for an idempotent topic.",
    )
    mirror.add_argument("--from", dest="source", metavar="SOURCE", required=True, help="what to copy")
    mirror.add_argument("--to", dest="destination", metavar="DEST_URL", required=True, help="the broker to copy to")
    mirror.add_argument("--topic", metavar="T", help="the source topic (not used for files)")
    mirror.add_argument("--to-topic", metavar="T2", help="the destination topic (default: --topic; required for files)")
    mirror.add_argument("--job", metavar="NAME", required=True, help="the job's name: the same name resumes it")
    mirror.add_argument(
        "--follow", action="store_true", help="keep copying new records until SIGTERM or Ctrl-C (a live mirror)"
    )
    mirror.add_argument(
        "--parallelism", metavar="N", type=int_type(1, "--parallelism"), default=8, help="partitions copied at once"
    )
    add_progress_arguments(mirror)
    mirror.add_argument(
        "--engine",
        choices=("threads", "spark"),
        default="threads",
        help="threads: one thread per partition in this process; spark: one Spark task per partition "
        "(needs the 'spark' extra; not with --follow)",
    )
    mirror.add_argument(
        "--spark-master",
        metavar="MASTER",
        default="local[*]",
        help="Spark master for --engine spark",
    )
    mirror.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    mirror.set_defaults(handler=cmd_mirror)


class _PartitionProgress:
    """Turns the partition reports into one :class:`~.progress.Progress`: records done
    (copied or answered duplicate) and, after them, duplicates and lag per partition."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self._parts: dict[int, PartitionProgress] = {}

    def report(self, part: PartitionProgress) -> None:
        with self._lock:
            before = self._parts.get(part.partition)
            self._parts[part.partition] = part
            grown = part.copied + part.duplicates - (before.copied + before.duplicates if before else 0)
            duplicates = sum(p.duplicates for p in self._parts.values())
            lags = " ".join(f"{n}:{'?' if p.lag is None else p.lag}" for n, p in sorted(self._parts.items()))
            self._progress.update(grown, f"duplicates {duplicates}, lag (partition:offsets) {lags}")


@contextlib.contextmanager
def _stop_on_signals(mirror: Mirror) -> Iterator[list[int]]:
    """SIGTERM and SIGINT stop the mirror cleanly (what was sent is flushed); yields the
    signals received."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        mirror.stop()

    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def _run_on_spark(args: argparse.Namespace) -> MirrorSummary:
    """The copy job as a Spark job on ``--spark-master``, one task per source partition."""
    if args.follow:
        raise CliError("--engine spark copies up to the source's current end; --follow needs --engine threads")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this environment's packages
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise CliError("--engine spark needs PySpark: pip install 'idempotent[spark]'") from None
    from .. import spark as idempotent_spark

    session = SparkSession.builder.master(args.spark_master).appName(f"idempotent mirror {args.job}").getOrCreate()
    try:
        return idempotent_spark.mirror(
            session, args.source, args.destination, topic=args.topic, to_topic=args.to_topic, job=args.job
        )
    finally:
        session.stop()


def cmd_mirror(args: argparse.Namespace) -> int:
    """``idempotent mirror``: run (or resume) a copy job and print its summary."""
    if args.engine == "spark":
        try:
            on_spark = _run_on_spark(args)
        except UsageError as exc:
            raise CliError(exc.message) from None
        if not args.quiet:
            print(on_spark, flush=True)
        return 0
    bar = Progress.from_args(args, f"mirror {args.job}")
    try:
        mirror = Mirror(
            args.source,
            args.destination,
            topic=args.topic,
            to_topic=args.to_topic,
            job=args.job,
            follow=args.follow,
            parallelism=args.parallelism,
            progress=_PartitionProgress(bar).report,
        )
    except UsageError as exc:
        bar.close()
        raise CliError(exc.message) from None
    try:
        with _stop_on_signals(mirror) as received:
            summary: MirrorSummary = mirror.run()
    except ProducerError as exc:
        if isinstance(exc, UsageError):
            raise
        raise CliError(
            f"{exc.message}\nWhat was stored stays stored: run the same command again to resume "
            "(nothing is copied twice).",
            code=1,
        ) from None
    finally:
        bar.close()
    if not args.quiet:
        print(summary, flush=True)
    if received and not args.follow and not summary.completed:
        return 130
    return 0


__all__ = ["add_parser", "cmd_mirror"]
