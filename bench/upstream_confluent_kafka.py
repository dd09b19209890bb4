"""confluent-kafka-python's own unit tests against the drop-in: the yardstick of issue 22.

Takes a checkout of confluent-kafka-python (its ``tests/`` folder; none of it is kept in this
repository), copies the unit test files into a temporary folder with only their import lines
changed (``import confluent_kafka`` to ``from idempotent.compat import confluent_kafka``, and
``from confluent_kafka[.x] import`` to ``from idempotent.compat.confluent_kafka[.x] import``),
and runs them with no network (a fresh network namespace: no broker reachable, as upstream
runs its unit tests). ``test_Wakeable`` runs one process per test, as upstream's signals need.
``--native`` runs the same files unchanged, for comparison.

    pip install -e '.[bench]'     # upstream's tests import confluent_kafka.avro
    git --git-dir=/path/to/confluent-kafka-python.git archive HEAD tests | tar -x -C /tmp/ck
    python bench/upstream_confluent_kafka.py /tmp/ck          # the drop-in
    python bench/upstream_confluent_kafka.py /tmp/ck --native # confluent-kafka itself

Prints the counts per suite and every test that did not pass.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the unit test files (everything else in upstream's tests/ needs a cluster, or is not the producer's)
UNIT = [
    "test_Producer.py",
    "test_kafka_error.py",
    "test_error.py",
    "test_message.py",
    "test_misc.py",
    "test_threads.py",
    "test_enums.py",
    "test_partitioners.py",
]
WAKEABLE = "test_Wakeable.py"


def rewrite(text: str) -> str:
    """Change the import lines only."""
    text = re.sub(
        r"^(\s*)import confluent_kafka\b", r"\1from idempotent.compat import confluent_kafka", text, flags=re.M
    )
    return re.sub(
        r"^(\s*)from confluent_kafka(\.[\w.]+)? import",
        r"\1from idempotent.compat.confluent_kafka\2 import",
        text,
        flags=re.M,
    )


def prepare(upstream: Path, native: bool) -> Path:
    """A copy of upstream's tests folder, the unit files rewritten (unless ``native``)."""
    work = Path(tempfile.mkdtemp(prefix="upstream-ck-"))
    shutil.copytree(upstream / "tests", work / "tests")
    if not native:
        for path in (work / "tests").rglob("*.py"):
            path.write_text(rewrite(path.read_text()))
    return work


def pytest(work: Path, args: list[str]) -> tuple[dict[str, int], list[str]]:
    """Run pytest without network in ``work``; its counts and the tests that did not pass."""
    command = ["unshare", "-n", sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
    command += ["--timeout", "120", *args]
    env_path = f"{work}:{ROOT}"
    try:
        done = subprocess.run(
            command,
            cwd=work,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
            timeout=180 if len(args) == 1 else 900,
        )
    except subprocess.TimeoutExpired:
        # a test blocked in native code, where pytest-timeout's signal does not reach it
        return {"failed": len(args)}, [f"FAILED {' '.join(args)} - hung; killed after the run's time limit"]
    out = done.stdout + done.stderr
    counts = {
        kind: int(n)
        for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", out.splitlines()[-1] if out else "")
    }
    summary = out.split("short test summary info", 1)[-1] if "short test summary info" in out else ""
    bad = [line for line in summary.splitlines() if line.startswith(("FAILED", "ERROR", "SKIPPED"))]
    return counts, bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("upstream", type=Path, help="a folder holding confluent-kafka-python's tests/")
    parser.add_argument("--native", action="store_true", help="run confluent-kafka itself")
    args = parser.parse_args(argv)
    work = prepare(args.upstream, args.native)
    try:
        counts, bad = pytest(work, [f"tests/{name}" for name in UNIT])
        print(f"unit tests ({', '.join(UNIT)}): {counts}", flush=True)
        for line in bad:
            print("  " + line)
        listing = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", f"tests/{WAKEABLE}"],
            cwd=work,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": f"{work}:{ROOT}", "PATH": "/usr/bin:/bin"},
        )
        ids = [line for line in listing.stdout.splitlines() if "::" in line]
        passed = 0
        for test_id in ids:
            one, failures = pytest(work, [test_id])
            passed += one.get("passed", 0)
            for line in failures:
                print("  " + line, flush=True)
        print(f"{WAKEABLE} (one process per test): {passed} of {len(ids)} passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
