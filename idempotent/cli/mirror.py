"""``idempotent mirror``: copy topics, a file or a directory into idempotent topics, once;
``idempotent mirror status``: where a job stands, read from its destination.

The copy keeps its position in the destination itself (see :mod:`idempotent.mirror` and
docs/mirror.md): running the same command again, after a crash or ``kill -9``, resumes it
with no duplicates and no losses. Progress goes to stderr: a bar on a terminal, else a line
every few seconds with the rate of the last :data:`RATE_WINDOW` seconds; the summary goes
to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

from ..errors import ProducerError, UsageError
from ..mirror import Mirror, MirrorSummary, PartitionProgress, PartitionStatus, job_status, open_source
from ..mirror.job import REFRESH_INTERVAL
from .common import CliError, Subcommands, float_type, int_type, open_read_only
from .formatting import format_table, iso
from .progress import Progress, add_progress_arguments

#: Seconds the progress line's rate is measured over.
RATE_WINDOW = 10.0
#: Partitions whose lag the progress line names, the largest first, when a job copies several topics.
_LAG_SHOWN = 8


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent mirror`` (and ``idempotent mirror status``) to the subcommands."""
    mirror = commands.add_parser(
        "mirror",
        help="copy topics or files into idempotent topics, resumably and exactly once",
        description="Copy every record of a source into topics of a broker, exactly once. Run the "
        "same command again after a crash (even kill -9) to resume: nothing is duplicated or lost. "
        "SOURCE: file:///path (a file, or a directory's files in name order; one record per "
        "line), kafka+native://host:port (plain Kafka topics), "
        "pulsar+native://host:port?admin_url=http://host:port (plain Pulsar topics), or a "
        "broker URL (sqlite://, memory://, idem://, idems://, kafka://, pulsar://) for idempotent topics. "
        "'idempotent mirror status --job NAME --to DEST_URL' shows where a job stands.",
    )
    # not required here, so that 'mirror status ...' parses: cmd_mirror checks them
    mirror.add_argument("--from", dest="source", metavar="SOURCE", help="what to copy (required)")
    mirror.add_argument("--to", dest="destination", metavar="DEST_URL", help="the broker to copy to (required)")
    mirror.add_argument("--topic", metavar="T", help="the source topic (not used for files)")
    mirror.add_argument(
        "--topics",
        metavar="LIST",
        help="instead of --topic: topic names and regular expressions, comma-separated (as MirrorMaker 2's "
        "'topics'); a regular expression matches whole names; each topic T is copied to PREFIX+T",
    )
    mirror.add_argument("--to-topic", metavar="T2", help="the destination topic (default: --topic; required for files)")
    mirror.add_argument(
        "--to-prefix", metavar="PREFIX", default="", help="prefix of the destination topics (default: none)"
    )
    mirror.add_argument("--job", metavar="NAME", help="the job's name: the same name resumes it (required)")
    mirror.add_argument(
        "--follow",
        action="store_true",
        help="keep copying new records (and new topics --topics matches) until SIGTERM or Ctrl-C (a live mirror)",
    )
    mirror.add_argument(
        "--refresh-topics",
        metavar="SECONDS",
        type=float_type,
        default=REFRESH_INTERVAL,
        help=f"with --follow and a regular expression in --topics: seconds between looks for new topics "
        f"(default {REFRESH_INTERVAL:g})",
    )
    mirror.add_argument(
        "--parallelism",
        metavar="N",
        type=int_type(1, "--parallelism"),
        default=8,
        help="partitions copied at once (without --follow; a following job copies every partition at once)",
    )
    add_progress_arguments(mirror)
    mirror.add_argument(
        "--engine",
        choices=("threads", "spark"),
        default="threads",
        help="threads: one thread per partition in this process; spark: one Spark task per partition "
        "(needs the 'spark' extra; not with --follow or --topics)",
    )
    mirror.add_argument(
        "--spark-master",
        metavar="MASTER",
        default="local[*]",
        help="Spark master for --engine spark",
    )
    mirror.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    mirror.set_defaults(handler=cmd_mirror)
    actions = mirror.add_subparsers(dest="mirror_command", metavar="[status]")
    status = actions.add_parser(
        "status",
        help="where a copy job stands, read from its destination",
        description="Per source partition of a job: the last source offset copied, the source's end and "
        "the lag (with --from), and when the job last wrote. Reads the destination only (and the "
        "source's end offsets), so it works while the job runs and after it stopped or died.",
    )
    status.add_argument("--job", metavar="NAME", required=True, help="the job's name")
    status.add_argument("--to", dest="destination", metavar="DEST_URL", required=True, help="the job's destination")
    status.add_argument(
        "--from", dest="source", metavar="SOURCE", help="the job's source: also show its end offsets and the lag"
    )
    status.add_argument(
        "--to-topic",
        metavar="T2",
        action="append",
        help="look only at this destination topic (repeatable; default: every topic)",
    )
    status.add_argument("--json", action="store_true", help="print a JSON list, one object per source partition")


class _PartitionProgress:
    """Turns the partition reports into one :class:`~.progress.Progress`: records done
    (copied or answered duplicate) and, after them, duplicates and lag per partition."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, int], PartitionProgress] = {}

    def report(self, part: PartitionProgress) -> None:
        with self._lock:
            key = (part.topic, part.partition)
            before = self._parts.get(key)
            self._parts[key] = part
            grown = part.copied + part.duplicates - (before.copied + before.duplicates if before else 0)
            duplicates = sum(p.duplicates for p in self._parts.values())
            self._progress.update(grown, f"duplicates {duplicates}, {self._lags()}")

    def _lags(self) -> str:
        if len({topic for topic, _ in self._parts}) <= 1:
            lags = " ".join(f"{n}:{'?' if p.lag is None else p.lag}" for (_, n), p in sorted(self._parts.items()))
            return f"lag (partition:offsets) {lags}"
        known = [p.lag for p in self._parts.values() if p.lag is not None]
        largest = sorted(self._parts.items(), key=lambda item: -(item[1].lag or 0))[:_LAG_SHOWN]
        lags = " ".join(f"{t}[{n}]:{'?' if p.lag is None else p.lag}" for (t, n), p in largest)
        return f"{len(self._parts)} partitions, lag {sum(known)} offsets, largest (topic[partition]:offsets) {lags}"


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
    if args.topics:
        raise CliError("--engine spark copies one topic (--topic); --topics needs --engine threads")
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
    """``idempotent mirror``: run (or resume) a copy job and print its summary; with
    ``status``, :func:`cmd_status`."""
    if args.mirror_command == "status":
        return cmd_status(args)
    missing = [
        name for name, value in (("--from", args.source), ("--to", args.destination), ("--job", args.job)) if not value
    ]
    if missing:
        raise CliError(f"the following arguments are required: {', '.join(missing)} (see idempotent mirror --help)")
    if args.engine == "spark":
        try:
            on_spark = _run_on_spark(args)
        except UsageError as exc:
            raise CliError(exc.message) from None
        if not args.quiet:
            print(on_spark, flush=True)
        return 0
    bar = Progress.from_args(args, f"mirror {args.job}", rate_window=RATE_WINDOW)
    try:
        mirror = Mirror(
            args.source,
            args.destination,
            topic=args.topic,
            topics=args.topics,
            to_topic=args.to_topic,
            to_prefix=args.to_prefix,
            job=args.job,
            follow=args.follow,
            parallelism=args.parallelism,
            progress=_PartitionProgress(bar).report,
            refresh_interval=args.refresh_topics,
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


def cmd_status(args: argparse.Namespace) -> int:
    """``idempotent mirror status``: per source partition of a job, what its destination
    holds (and the source's end, with ``--from``)."""
    broker = open_read_only(args.destination)
    try:
        source = open_source(args.source) if args.source else None
        try:
            rows = job_status(broker, args.job, to_topics=args.to_topic, source=source)
        finally:
            if source is not None:
                source.close()
    finally:
        broker.close()
    if not rows:
        where = f" in {', '.join(args.to_topic)}" if args.to_topic else ""
        raise CliError(
            f"job {args.job!r} has stored nothing in {args.destination}{where}: check the job's name and "
            "destination (a job's producers are named JOB/TOPIC/PARTITION; 'idempotent stats URL' lists them)",
            code=1,
        )
    if args.json:
        print(json.dumps([_status_dict(row) for row in rows], indent=2))
        return 0
    now = time.time()
    table = format_table(
        ["source topic", "partition", "destination", "copied up to", "source end", "lag", "last write"],
        [
            [
                row.topic or "-",
                str(row.partition),
                f"{row.to_topic}[{row.to_partition}]",
                str(row.last_offset),
                "?" if row.end is None else str(row.end),
                "?" if row.lag is None else str(row.lag),
                f"{iso(row.last_write)} ({_ago(now - row.last_write)})",
            ]
            for row in rows
        ],
        left=frozenset({0, 2, 6}),
    )
    print(f"job {args.job} -> {args.destination}" + (f" (source {args.source})" if args.source else ""))
    print("\n".join(table))
    if args.source:
        total = sum(row.lag or 0 for row in rows)
        unknown = sum(row.lag is None for row in rows)
        units = " bytes" if args.source.startswith("file:") else ""
        print(
            f"{len(rows)} partition{'s' if len(rows) != 1 else ''}, total lag {total}{units}"
            + (f" ({unknown} not known)" if unknown else "")
        )
    return 0


def _status_dict(row: PartitionStatus) -> dict[str, object]:
    return {
        "topic": row.topic,
        "partition": row.partition,
        "to_topic": row.to_topic,
        "to_partition": row.to_partition,
        "producer_name": row.producer_name,
        "last_offset": row.last_offset,
        "end": row.end,
        "lag": row.lag,
        "last_write": iso(row.last_write),
        "last_write_age_seconds": round(time.time() - row.last_write, 3),
    }


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


__all__ = ["RATE_WINDOW", "add_parser", "cmd_mirror", "cmd_status"]
