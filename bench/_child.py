"""One variant of a benchmark in a fresh process: the process prints its result as one JSON
line, and the parent reads it back (the benchmarks alternate their variants this way)."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def run_json(command: list[str], label: str, timeout: float = 900) -> dict[str, Any]:
    """Run ``command`` and return the last line of its output that is a JSON object.

    Raises:
        RuntimeError: it exited with an error or printed no JSON line (the message has the
            end of its stderr, under ``label``).
    """
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{label} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
