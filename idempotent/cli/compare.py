"""``idempotent compare``: one workload and one seeded fault schedule on every system, a report.

See :mod:`idempotent.compare` and docs/comparison.md. The report (report.json, report.md,
report.html) and the results file (runs.jsonl) go to ``--out``; Kafka and Pulsar are private
brokers started for the comparison (and stopped after it), so faults never hit brokers
someone else uses. ``--long`` is the overnight comparison: every fault on every system, many
seeded schedules, resumable.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from ..compare import FAULTS, LONG, SYSTEMS, CompareConfig, run_compare
from ..compare.config import CAPACITY_RECORDS
from ..compare.results import FILE_NAME
from ..compare.workload import WORKLOADS
from .common import CliError, Subcommands, err, float_type, int_type


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
            "back and report duplicates, losses, reorders, possibly persisted sends, throughput and latency. "
            "Every finished run goes to OUT/runs.jsonl at once; --resume (implied by --long) carries out "
            "only the runs that file does not hold yet."
        ),
    )
    compare.add_argument("--systems", type=_names(SYSTEMS, "system"),
                         help=f"comma-separated, or all: {','.join(SYSTEMS)} (--long: all)")  # fmt: skip
    compare.add_argument("--faults", type=_names(FAULTS, "fault"),
                         help=f"comma-separated, or all: {','.join(FAULTS)} (--long: all)")  # fmt: skip
    compare.add_argument(
        "--long",
        action="store_true",
        help=(
            f"the long fault runs, resumable: every fault on every system, --schedules {LONG['schedules']} "
            f"--native-schedules {LONG['native_schedules']} --records {LONG['records']} --rate 0 "
            f"--seed {LONG['seed']} --out compare-long unless given"
        ),
    )
    compare.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="produce",
        help=(
            "produce: publish the records; ctp: consume-transform-produce, a copy job copies them from an "
            "input topic in transactions, on the transactional systems, under the process faults (produce)"
        ),
    )
    compare.add_argument("--records", type=int_type(10, "--records"), help="records per run (2000)")
    compare.add_argument("--rate", type=float_type, help="offered records/s per producer; 0 = unlimited (0)")
    compare.add_argument("--schedules", type=int_type(1, "--schedules"), help="seeded schedules per system (1)")
    compare.add_argument(
        "--native-schedules",
        type=int_type(0, "--native-schedules"),
        help="seeded schedules of the native clients, at most --schedules (the same as --schedules)",
    )
    compare.add_argument("--seed", type=int, help="seed of the first schedule (1)")
    compare.add_argument(
        "--capacity-records",
        type=int_type(0, "--capacity-records"),
        default=CAPACITY_RECORDS,
        help=f"records of each system's capacity run (no fault, no rate limit); 0 = none ({CAPACITY_RECORDS})",
    )
    compare.add_argument("--out", type=pathlib.Path, help="report directory (compare-report; --long: compare-long)")
    compare.add_argument("--resume", action="store_true", help="continue the runs of OUT/runs.jsonl")
    compare.set_defaults(handler=cmd_compare)


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def config_of(args: argparse.Namespace) -> tuple[CompareConfig, pathlib.Path, bool]:
    """The comparison, the report directory and whether to resume, from the arguments.

    Raises:
        CliError: no --systems or --faults without --long, or a value out of range.
    """
    preset: dict[str, Any] = dict(LONG) if args.long else {"schedules": 1, "records": 2000, "rate": 0.0, "seed": 1}
    systems = args.systems or (tuple(SYSTEMS) if args.long else None)
    faults = args.faults or (tuple(FAULTS) if args.long else None)
    if systems is None or faults is None:
        raise CliError("--systems and --faults are needed (or --long for every system and fault)", 2)
    chosen = {name: getattr(args, name) for name in ("schedules", "native_schedules", "records", "rate", "seed")}
    values = {**preset, **{name: value for name, value in chosen.items() if value is not None}}
    if args.native_schedules is None and not args.long:
        values["native_schedules"] = None
    default_out = pathlib.Path("compare-long" if args.long else "compare-report")
    try:
        config = CompareConfig(
            systems, faults, capacity_records=args.capacity_records, workload=args.workload, **values
        )
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    return config, args.out or default_out, args.resume or args.long


def cmd_compare(args: argparse.Namespace) -> int:
    """``idempotent compare``: run the comparison, print one line per run, write the report.

    Returns 0, 1 when a run could not be carried out (status ``error`` in the report), 2 for
    bad arguments or a results file made with other values, 130 when interrupted (the
    finished runs are kept: the same command continues).
    """
    config, out, resume = config_of(args)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stop the private brokers on SIGTERM too
    try:
        runs = run_compare(config, out, progress=lambda line: print(line, flush=True), resume=resume)
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    except KeyboardInterrupt:
        again = "the same command" if resume else "the same command with --resume"
        err(f"interrupted: the finished runs are in {out / FILE_NAME}; {again} continues")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"report: {out / 'report.html'}")
    return 1 if any(run["status"] == "error" for run in runs) else 0
