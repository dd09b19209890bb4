"""Time bounds for tests that must bound time, scaled for the machine's load.

A bound is a liveness check, not a speed test: on a loaded CI machine (other brokers, other
jobs) the same work takes several times longer, and a bound tuned on a quiet machine fails
there without a defect. :func:`scaled` stretches a bound by the load per core, up to a cap, so
that a real hang (which takes minutes or forever) still fails.
"""

from __future__ import annotations

import os


def load_factor(cap: float = 3.0) -> float:
    """How much slower than on a quiet machine work runs now: the 1-minute load average per
    core, at least 1 and at most ``cap``."""
    return min(cap, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def scaled(seconds: float, cap: float = 3.0) -> float:
    """``seconds`` stretched by :func:`load_factor` (at most ``cap`` times)."""
    return seconds * load_factor(cap)
