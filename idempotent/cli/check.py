"""``idempotent check``: verify that a SQLite database file is sound.

Runs SQLite's ``PRAGMA integrity_check`` (``--quick``: ``quick_check``, which skips
comparing each index with its table) on the file, opened read-only, so it may run next to a
writer (it checks the last committed state, its write-ahead log included). Exit code 0 when
the file is sound, 1 when it is damaged (the problems SQLite found are listed), 2 for a URL
that names no SQLite file. What it costs is measured in ``docs/backends.md``.
"""

from __future__ import annotations

import argparse
import os
import time
from urllib.parse import urlsplit

from .common import CliError, Subcommands

#: problems listed at most (SQLite reports up to 100 by default)
_SHOWN = 20


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent check`` to the subcommands."""
    check = commands.add_parser(
        "check",
        help="verify that a SQLite database file is sound",
        description=(
            "Verify a SQLite database file with SQLite's integrity_check (read-only, safe next to a "
            "running broker). Exit code 0: sound; 1: damaged; 2: bad usage."
        ),
    )
    check.add_argument("url", metavar="URL", help="sqlite:///relative.db or sqlite:////absolute.db")
    check.add_argument(
        "--quick", action="store_true", help="quick_check: every page and row, but not each index against its table"
    )
    check.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    """``idempotent check``: 0 when the file is sound, 1 when it is damaged.

    Raises:
        CliError: not a ``sqlite://`` URL, or no such file (exit code 2).
        BackendUnavailableError: the file could not be read (exit code 1).
    """
    from idempotent.adapters.sqlite.backend import parse_sqlite_url
    from idempotent.adapters.sqlite.check import check_file

    if urlsplit(args.url).scheme != "sqlite":
        raise CliError(f"check verifies SQLite database files (sqlite:///file.db), not {args.url}")
    path, _ = parse_sqlite_url(args.url)
    if not os.path.isfile(path):
        raise CliError(f"no database file {path!r} (from {args.url})")
    mode = "quick" if args.quick else "full"
    pragma = "quick_check" if args.quick else "integrity_check"
    started = time.monotonic()
    problems = check_file(path, mode)
    seconds = time.monotonic() - started
    size = os.path.getsize(path) / 1e6
    if not problems:
        print(f"ok: {path} passed {pragma} ({size:,.1f} MB in {seconds:.1f} s)")
        return 0
    print(f"damaged: {path} failed {pragma} ({size:,.1f} MB in {seconds:.1f} s), {len(problems)} problem(s):")
    for problem in problems[:_SHOWN]:
        print(f"  {problem}")
    if len(problems) > _SHOWN:
        print(f"  ... and {len(problems) - _SHOWN} more")
    print(
        "Stop the processes that use it and restore it from a backup; the sqlite3 shell's .recover "
        "salvages what is still readable into a new file."
    )
    return 1
