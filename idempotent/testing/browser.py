"""Headless Chromium for the tests that render reports, installed the way the suite installs brokers.

The suite fetches Kafka and Pulsar itself, so that ``pip install -e '.[test]' && python -m pytest``
works on a fresh machine. Chromium is the same kind of dependency: when it is missing and this
process may install Debian packages (root, with ``apt-get``), :func:`chromium` installs Debian's
``chromium`` package once, under a lock file, and returns its path.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_NAMES = ("chromium", "chromium-browser")


def _found() -> str | None:
    for name in _NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(timeout: float = 900.0) -> str:
    """Return the path of a Chromium binary, installing Debian's package when it is missing.

    Raises:
        RuntimeError: Chromium is missing and cannot be installed here (not root, no apt-get),
            or the installation failed; the message says what to install by hand.
    """
    found = _found()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("Chromium is needed to render reports: install Debian's 'chromium' package")
    lock = Path(tempfile.gettempdir()) / "idempotent-chromium.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        found = _found()  # another process may have installed it while this one waited
        if found:
            return found
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    found = _found()
    if not found:
        raise RuntimeError("apt-get installed 'chromium' but no chromium binary is on PATH")
    return found
