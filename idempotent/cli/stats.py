"""``idempotent stats``: the sequence checker's state of every partition (of one topic).

The backend is opened read-only, so ``stats`` may run next to a writer.
"""

from __future__ import annotations

import argparse
import json

from .common import Subcommands, add_connect_timeout, open_read_only, partition_count, topic_type
from .formatting import format_stats, stats_dict


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent stats`` to the subcommands."""
    stats = commands.add_parser(
        "stats",
        help="show the checker state of every partition",
        description="Show the sequence checker's state per partition (of one topic or all).",
    )
    stats.add_argument("url", metavar="URL")
    stats.add_argument("topic", metavar="TOPIC", nargs="?", type=topic_type)
    stats.add_argument("--json", action="store_true", help="print a JSON list")
    add_connect_timeout(stats)
    stats.set_defaults(handler=cmd_stats)


def cmd_stats(args: argparse.Namespace) -> int:
    """``idempotent stats``: the checker state of every partition (of one topic)."""
    broker = open_read_only(args.url, args.connect_timeout)
    try:
        if args.topic is not None:
            partition_count(broker, args.topic)
        stats = broker.stats(args.topic)
        if args.json:
            print(json.dumps([stats_dict(s) for s in stats], indent=2))
        elif not stats:
            print(f"no topics in {broker.url}")
        else:
            print("\n\n".join(format_stats(s) for s in stats))
        return 0
    finally:
        broker.close()
