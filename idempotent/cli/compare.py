"""``idempotent compare``: one workload and one seeded fault schedule on every system, a report.

See :mod:`idempotent.compare` and docs/comparison.md. The report (report.json, report.md,
report.html) goes to ``--out``; Kafka and Pulsar are private brokers started for the
comparison (and stopped after it), so faults never hit brokers someone else uses.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
from collections.abc import Callable, Sequence
from types import FrameType

from ..compare import FAULTS, SYSTEMS, CompareConfig, run_compare
from .common import CliError, Subcommands, float_type, int_type


def _names(allowed: Sequence[str], what: str) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        if names == ("all",):
            return tuple(allowed)
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or repr(text)}; expected some of {','.join(allowed)} or all"
            )
        return names

    return parse


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent compare`` to the subcommands."""
    compare = commands.add_parser(
        "compare",
        help="compare exactly-once publishing under faults across systems",
        description=(
            "Publish one workload under one seeded fault schedule through this project (in process and "
            "through a broker server) and through the native Kafka and Pulsar clients; read everything "
            "back and report duplicates, losses, reorders, possibly persisted sends, throughput and latency."
        ),
    )
    compare.add_argument(
        "--systems", required=True, type=_names(SYSTEMS, "system"), help=f"comma-separated, or all: {','.join(SYSTEMS)}"
    )
    compare.add_argument(
        "--faults", required=True, type=_names(FAULTS, "fault"), help=f"comma-separated, or all: {','.join(FAULTS)}"
    )
    compare.add_argument("--records", type=int_type(10, "--records"), default=2000, help="records per run (2000)")
    compare.add_argument("--rate", type=float_type, default=0.0, help="records/s per producer; 0 = unlimited (0)")
    compare.add_argument("--schedules", type=int_type(1, "--schedules"), default=1, help="seeded schedules (1)")
    compare.add_argument("--seed", type=int, default=1, help="seed of the first schedule (1)")
    compare.add_argument("--out", type=pathlib.Path, default=pathlib.Path("compare-report"), help="report directory")
    compare.set_defaults(handler=cmd_compare)


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def cmd_compare(args: argparse.Namespace) -> int:
    """``idempotent compare``: run the comparison, print one line per run, write the report.

    Returns 0, or 1 when a run could not be carried out (status ``error`` in the report).
    """
    try:
        config = CompareConfig(args.systems, args.faults, args.records, args.rate, args.schedules, args.seed)
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stop the private brokers on SIGTERM too
    try:
        runs = run_compare(config, args.out, progress=lambda line: print(line, flush=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"report: {args.out / 'report.html'}")
    return 1 if any(run["status"] == "error" for run in runs) else 0
