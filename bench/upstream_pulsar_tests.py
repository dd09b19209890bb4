"""pulsar-client-python's own ``tests/pulsar_test.py`` as the drop-in's yardstick.

Takes a checkout of apache/pulsar-client-python (not part of this repository), copies its
``tests/`` into two temporary directories and runs ``pulsar_test.py`` in each against the
same real Pulsar: once as it is (pulsar-client itself), once with only the import lines
changed to ``idempotent.compat.pulsar``. Only loopback addresses are contacted: the
documentation address of upstream's secondary clusters becomes a closed loopback port and
``test_connect_timeout`` (an unroutable address) dials a loopback port that drops every
connection attempt instead (:func:`black_hole`). In both, the service and admin
URLs are pointed at
that Pulsar: a fresh standalone started with ``idempotent services`` before each of the two
runs (upstream's tests reuse topic and subscription names), or ``--service-url`` and
``--admin-url``.
Prints how many tests each passes and how many of the native client's passes the drop-in
passes too, and lists the drop-in's failures among them (``--json`` saves everything).

    python bench/upstream_pulsar_tests.py /path/to/pulsar-client-python
    python bench/upstream_pulsar_tests.py /path/to/pulsar-client-python -k producer
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from idempotent.testing import services

#: the import lines of the test file, as the drop-in's documentation says to change them
_IMPORTS = [
    (re.compile(r"^import pulsar$", re.M), "from idempotent.compat import pulsar"),
    (re.compile(r"^from pulsar import", re.M), "from idempotent.compat.pulsar import"),
    (re.compile(r"^from pulsar\.(\w+) import", re.M), r"from idempotent.compat.pulsar.\1 import"),
    (re.compile(r"^import pulsar\.(\w+)$", re.M), r"import idempotent.compat.pulsar.\1"),
]


#: a test's line in pytest's -v output
_RESULT = re.compile(r"^(pulsar_test\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")


@contextlib.contextmanager
def black_hole() -> Iterator[int]:
    """A loopback port that behaves as an unroutable address: a listener that never accepts,
    its accept queue already full, so the kernel drops further connection attempts and a
    client's connect waits for its own timeout (what ``test_connect_timeout`` measures against
    192.0.2.1, a documentation address that is not contacted here). Yields the port."""
    listener = socket.socket()
    held: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(4):  # more than the queue holds: what the queue took stays in it
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            held.append(filler)
        time.sleep(0.2)
        yield port
    finally:
        for sock in (*held, listener):
            sock.close()


def rewrite(text: str, service_url: str, admin_url: str, drop_in: bool, hole: int) -> str:
    """The test file with its URLs pointed at our Pulsar, and (``drop_in``) its imports
    changed. The drop-in's service URL carries the admin URL (``?admin_url=``): it is not
    the default next to the service port. ``test_connect_timeout``'s unroutable address
    becomes the :func:`black_hole` port ``hole``."""
    url = service_url
    if drop_in:
        url = f"{service_url}?{urllib.parse.urlencode({'admin_url': admin_url})}"
    text = text.replace('"pulsar://localhost:6650"', repr(url)).replace("'pulsar://localhost:6650'", repr(url))
    text = text.replace('"http://localhost:8080"', repr(admin_url))
    text = text.replace('"pulsar://192.0.2.1:1234"', repr(f"pulsar://127.0.0.1:{hole}"))
    # nothing but loopback is ever contacted: upstream's secondary clusters (192.0.2.1, a
    # documentation address) become a closed loopback port
    text = text.replace("192.0.2.1", "127.0.0.1")
    if drop_in:
        for pattern, replacement in _IMPORTS:
            text = pattern.sub(replacement, text)
    return text


def run(checkout: Path, service_url: str, admin_url: str, drop_in: bool, extra: list[str]) -> dict[str, str]:
    """Run the suite once; return each test's outcome (passed, failed, error, skipped)."""
    with tempfile.TemporaryDirectory(prefix="upstream-pulsar-") as tmp, black_hole() as hole:
        tests = Path(tmp) / "tests"
        shutil.copytree(checkout / "tests", tests)
        target = tests / "pulsar_test.py"
        target.write_text(rewrite(target.read_text(), service_url, admin_url, drop_in, hole))
        # each outcome is read as pytest prints it (-v), so that a run the native client
        # crashes (it can take the interpreter down) still counts the tests before the crash
        finished = subprocess.run(
            [sys.executable, "-m", "pytest", "pulsar_test.py", "-v", "-p", "no:cacheprovider", "--timeout=120", *extra],
            cwd=tests,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        outcomes: dict[str, str] = {}
        for line in finished.stdout.splitlines():
            match = _RESULT.match(line)
            if match:
                outcomes[match.group(1)] = match.group(2).lower()
        if finished.returncode not in (0, 1, 5):
            print(f"{'drop-in' if drop_in else 'pulsar-client'}: pytest exited {finished.returncode}", file=sys.stderr)
        reasons = re.findall(r"^(?:FAILED|ERROR) (\S+) - (.*)$", finished.stdout, re.M)
        for name, reason in reasons:
            if name in outcomes:
                outcomes[name] = f"{outcomes[name]}: {reason[:200]}"
        return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, help="a checkout of apache/pulsar-client-python")
    parser.add_argument("--service-url", help="default: the Pulsar `idempotent services` runs (started if needed)")
    parser.add_argument("--admin-url")
    parser.add_argument("--json", type=Path, help="save every outcome here")
    parser.add_argument("-k", help="only tests matching this pytest expression")
    args = parser.parse_args(argv)
    if not (args.checkout / "tests" / "pulsar_test.py").exists():
        parser.error(f"{args.checkout} has no tests/pulsar_test.py")
    if args.service_url is not None and args.admin_url is None:
        parser.error("--admin-url is needed with --service-url")
    extra = ["-k", args.k] if args.k else []

    def target() -> tuple[str, str]:
        """The Pulsar of a run: the one given, or a fresh standalone (upstream's tests expect
        an empty one: they reuse topic and subscription names)."""
        if args.service_url is not None:
            return args.service_url, args.admin_url
        services.down("pulsar")
        info = services.up("pulsar")
        return info.url, info.admin_url or ""

    native = run(args.checkout, *target(), False, extra)
    drop_in = run(args.checkout, *target(), True, extra)
    native_passed = {name for name, outcome in native.items() if outcome == "passed"}
    drop_in_passed = {name for name, outcome in drop_in.items() if outcome == "passed"}
    both = native_passed & drop_in_passed
    share = len(both) / len(native_passed) if native_passed else float("nan")
    print(f"tests: {len(native)}")
    print(f"pulsar-client passes: {len(native_passed)}")
    print(f"drop-in passes:       {len(drop_in_passed)}")
    print(f"drop-in passes of pulsar-client's passes: {len(both)} of {len(native_passed)} ({share:.0%})")
    print("\nfailing with the drop-in, passing with pulsar-client:")
    for name in sorted(native_passed - drop_in_passed):
        print(f"  {name}: {drop_in.get(name, 'not run')}")
    if args.json:
        args.json.write_text(json.dumps({"native": native, "drop_in": drop_in}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
