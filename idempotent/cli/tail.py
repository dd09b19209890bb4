"""``idempotent tail``: print records of a topic, optionally following new ones.

The backend is opened read-only (see :func:`~idempotent.cli.common.open_read_only`), so
``tail`` may run next to a writer.
"""

from __future__ import annotations

import argparse
import sys
import time

from .common import CliError, Subcommands, int_type, open_read_only, partition_count, topic_type
from .formatting import format_record

TAIL_DEFAULT_LAST = 10
FOLLOW_INTERVAL = 0.5


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent tail`` to the subcommands."""
    tail = commands.add_parser(
        "tail",
        help="print records of a topic",
        description="Print records of a topic: by default the last 10 of each partition.",
    )
    tail.add_argument("url", metavar="URL")
    tail.add_argument("topic", metavar="TOPIC", type=topic_type)
    tail.add_argument("--partition", metavar="P", type=int_type(0, "--partition"), help="only this partition")
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--offset",
        metavar="O",
        type=int_type(0, "--offset"),
        help="start at this offset (in every partition read)",
    )
    start.add_argument("--from-beginning", action="store_true", help="start at offset 0")
    tail.add_argument("--max", metavar="N", type=int_type(1, "--max"), help="stop after N records in all")
    tail.add_argument("--follow", "-f", action="store_true", help="keep polling for new records until Ctrl-C")
    tail.add_argument("--format", choices=("text", "json"), default="text")
    tail.set_defaults(handler=cmd_tail)


def cmd_tail(args: argparse.Namespace) -> int:
    """``idempotent tail``: print records of a topic, optionally following new ones."""
    broker = open_read_only(args.url)
    try:
        topic: str = args.topic
        count = partition_count(broker, topic)
        if args.partition is not None and args.partition >= count:
            raise CliError(f"topic {topic!r} has partitions 0..{count - 1}, not {args.partition}")
        parts = [args.partition] if args.partition is not None else list(range(count))
        if args.offset is not None:
            offsets = {p: args.offset for p in parts}
        elif args.from_beginning:
            offsets = {p: 0 for p in parts}
        else:
            offsets = {p: max(0, broker.end_offset(topic, p) - TAIL_DEFAULT_LAST) for p in parts}
        remaining: int | None = args.max
        out = sys.stdout
        try:
            while True:
                printed = 0
                for p in parts:
                    while remaining is None or remaining > 0:
                        limit = 500 if remaining is None else min(500, remaining)
                        records = broker.read(topic, p, offsets[p], limit)
                        if not records:
                            break
                        for record in records:
                            out.write(format_record(topic, p, record, args.format) + "\n")
                        offsets[p] = records[-1].offset + 1
                        printed += len(records)
                        if remaining is not None:
                            remaining -= len(records)
                if not args.follow or remaining == 0:
                    break
                out.flush()
                if not printed:
                    time.sleep(FOLLOW_INTERVAL)
        except KeyboardInterrupt:
            if not args.follow:
                raise
        out.flush()
        return 0
    finally:
        broker.close()
