"""Where the benchmarks keep their results: one JSON file per run under ``bench/results/``,
with the machine, its CPUs and the load around the run beside the numbers."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def save_run(
    prefix: str, args: Any, load_before: Any, load_after: Any, folder: Path | None = None, **numbers: Any
) -> Path:
    """Write ``<prefix>-<time>.json`` into ``folder`` (default ``bench/results/``): the run's
    arguments (``argparse`` namespace), the machine, the load average before and after, and
    ``numbers``; print and return its path."""
    out_file = (folder or RESULTS) / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        **numbers,
    }
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nsaved {out_file}")
    return out_file
