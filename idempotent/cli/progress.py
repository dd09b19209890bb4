"""Progress reporting of long-running commands (``produce``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import isatty


def progress(args: argparse.Namespace, total: int, initial: int) -> Any:
    """A tqdm bar on stderr when it is a terminal and neither ``--quiet`` nor ``--no-progress``
    is given, else None."""
    if args.quiet or args.no_progress or not isatty(sys.stderr):
        return None
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="rec",
        unit_scale=True,
        mininterval=0.5,
        file=sys.stderr,
        desc=args.topic,
    )
