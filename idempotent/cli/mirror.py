"""``idempotent mirror``: copy a topic, a file or a directory into an idempotent topic, once.

The copy keeps its position in the destination itself (see :mod:`idempotent.mirror` and
docs/mirror.md): running the same command again, after a crash or ``kill -9``, resumes it
with no duplicates and no losses. Progress goes to stderr: a bar on a terminal, else a line
every few seconds; the summary goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from ..errors import ProducerError, UsageError
from ..mirror import Mirror, MirrorSummary, PartitionProgress
from .common import CliError, Subcommands, float_type, int_type, isatty

#: Seconds between two progress lines when stderr is not a terminal.
PROGRESS_INTERVAL = 5.0


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
    mirror.add_argument(
        "--progress-interval",
        metavar="SECONDS",
        type=float_type,
        default=PROGRESS_INTERVAL,
        help="seconds between progress lines when stderr is not a terminal",
    )
    mirror.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    mirror.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    mirror.set_defaults(handler=cmd_mirror)


class _Progress:
    """Aggregates the partition reports: a tqdm bar on a terminal, else a line every interval."""

    def __init__(self, args: argparse.Namespace, label: str) -> None:
        self._lock = threading.Lock()
        self._parts: dict[int, PartitionProgress] = {}
        self._started = time.monotonic()
        self._interval: float = args.progress_interval
        self._next_line = self._started + self._interval
        self._label = label
        self._bar: Any = None
        self._enabled = not (args.quiet or args.no_progress)
        if self._enabled and isatty(sys.stderr):
            from tqdm import tqdm

            self._bar = tqdm(unit="rec", unit_scale=True, mininterval=0.5, file=sys.stderr, desc=label)

    def _counts(self) -> tuple[int, int, str]:
        copied = sum(p.copied for p in self._parts.values())
        duplicates = sum(p.duplicates for p in self._parts.values())
        lags = " ".join(f"{n}:{'?' if p.lag is None else p.lag}" for n, p in sorted(self._parts.items()))
        return copied, duplicates, lags

    def report(self, part: PartitionProgress) -> None:
        if not self._enabled:
            return
        with self._lock:
            before = self._parts.get(part.partition)
            self._parts[part.partition] = part
            copied, duplicates, lags = self._counts()
            if self._bar is not None:
                grown = part.copied + part.duplicates - (before.copied + before.duplicates if before else 0)
                self._bar.set_postfix_str(f"lag {lags}", refresh=False)
                self._bar.update(grown)
                return
            now = time.monotonic()
            if now >= self._next_line:
                self._next_line = now + self._interval
                rate = copied / (now - self._started)
                print(
                    f"{self._label}: copied={copied} duplicates={duplicates} rate={rate:.0f} records/s "
                    f"lag(partition:offsets)={lags}",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


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


def cmd_mirror(args: argparse.Namespace) -> int:
    """``idempotent mirror``: run (or resume) a copy job and print its summary."""
    label = f"mirror {args.job}"
    bar = _Progress(args, label)
    try:
        mirror = Mirror(
            args.source,
            args.destination,
            topic=args.topic,
            to_topic=args.to_topic,
            job=args.job,
            follow=args.follow,
            parallelism=args.parallelism,
            progress=bar.report,
        )
    except UsageError as exc:
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
