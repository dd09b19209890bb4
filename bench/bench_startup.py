"""Start-up: the import of each client module, and the time from process start to the first
delivery report of one record, native clients against this project's producers.

Every measurement runs in a fresh ``python -c`` process (so nothing is imported or connected
beforehand), the variants alternated round by round, and the table gives medians:

* ``import``: the time ``import confluent_kafka``, ``import idempotent.compat.confluent_kafka``,
  ``import idempotent; idempotent.Producer``, ``import pulsar`` and ``import
  idempotent.compat.pulsar`` take in the child (its own clock around the import statement);
* ``kafka``: from the parent starting the child to the child's first delivery report of one
  100 B record (the wall clock on both sides; the interpreter's own start is in every row
  alike): confluent-kafka with ``enable.idempotence=true``, the drop-in anonymous and with
  ``transactional.id``, ``idempotent.Producer("kafka://...")`` anonymous and named;
* ``pulsar``: the same with pulsar-client (a plain producer), the drop-in
  (``idempotent.compat.pulsar``) and ``idempotent.Producer("pulsar://...")``.

The brokers are the test suite's (``python -m idempotent.testing.services up kafka`` / ``up
pulsar``), started here when not running and stopped again after. One topic per backend is
made before the first round and one warm-up round is not counted, so that no row pays for
topic creation or the project's internal topics being made on their first use.

    python bench/bench_startup.py                      # import, kafka and pulsar, 5 rounds
    python bench/bench_startup.py --only import --rounds 9

Bytecode: each child caches its modules' bytecode in a folder of the run (``PYTHONPYCACHEPREFIX``),
filled by the warm-up round, as pip leaves an installed package; with ``--no-bytecode-cache``
every child compiles every module from source (as under ``PYTHONDONTWRITEBYTECODE=1``), which
costs the project's modules far more than the native clients' (a few compiled ones).

Writes ``bench/results/startup-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _results import save_run

from idempotent.testing import services

#: the statement each import variant times, and the native one it is compared with
IMPORTS = {
    "confluent_kafka": ("import confluent_kafka", None),
    "idempotent.compat.confluent_kafka": ("import idempotent.compat.confluent_kafka", "confluent_kafka"),
    "idempotent": ("import idempotent; idempotent.Producer", "confluent_kafka"),
    "pulsar": ("import pulsar", None),
    "idempotent.compat.pulsar": ("import idempotent.compat.pulsar", "pulsar"),
}

_IMPORT_CHILD = """
import json, time
t = time.perf_counter()
{statement}
print(json.dumps({{"import_s": time.perf_counter() - t}}))
"""

#: each first-delivery variant: (backend, the code that imports, makes a producer on ``URL`` /
#: ``BOOTSTRAP`` / ``ADMIN`` and sends one record to ``TOPIC`` with ``done`` as its report)
DELIVERIES: dict[str, tuple[str, str]] = {
    "kafka-native": (
        "kafka",
        """
import confluent_kafka
p = confluent_kafka.Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True, "acks": "all"})
p.produce(TOPIC, b"x" * 100, on_delivery=lambda err, msg: done(err))
p.flush(60)
settle(p)
""",
    ),
    "kafka-drop-in": (
        "kafka",
        """
from idempotent.compat import confluent_kafka
p = confluent_kafka.Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True, "acks": "all"})
p.produce(TOPIC, b"x" * 100, on_delivery=lambda err, msg: done(err))
p.flush(60)
settle(p)
""",
    ),
    "kafka-drop-in-named": (
        "kafka",
        """
from idempotent.compat import confluent_kafka
p = confluent_kafka.Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": NAME, "acks": "all"})
p.produce(TOPIC, b"x" * 100, on_delivery=lambda err, msg: done(err))
p.flush(60)
settle(p)
""",
    ),
    "kafka-producer": (
        "kafka",
        """
import idempotent
with idempotent.Producer(URL) as p:
    p.send(TOPIC, b"x" * 100, on_delivery=lambda err, meta: done(err))
""",
    ),
    "kafka-producer-named": (
        "kafka",
        """
import idempotent
with idempotent.Producer(URL, NAME) as p:
    p.send(TOPIC, b"x" * 100, on_delivery=lambda err, meta: done(err))
""",
    ),
    "pulsar-native": (
        "pulsar",
        """
import pulsar
c = pulsar.Client(BOOTSTRAP, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
p = c.create_producer(TOPIC)
p.send_async(b"x" * 100, lambda res, msg_id: done(None if res == pulsar.Result.Ok else res))
p.flush()
c.close()
""",
    ),
    "pulsar-drop-in": (
        "pulsar",
        """
from idempotent.compat import pulsar
c = pulsar.Client(URL + "?admin_url=" + ADMIN)
p = c.create_producer(TOPIC)
p.send_async(b"x" * 100, lambda res, msg_id: done(None if res == pulsar.Result.Ok else res))
p.flush()
c.close()
""",
    ),
    "pulsar-producer": (
        "pulsar",
        """
import idempotent
with idempotent.Producer(URL, admin_url=ADMIN) as p:
    p.send(TOPIC, b"x" * 100, on_delivery=lambda err, meta: done(err))
""",
    ),
    "pulsar-producer-named": (
        "pulsar",
        """
import idempotent
with idempotent.Producer(URL, NAME, admin_url=ADMIN) as p:
    p.send(TOPIC, b"x" * 100, on_delivery=lambda err, meta: done(err))
""",
    ),
}

#: what each first-delivery variant is compared with
NATIVE = {"kafka": "kafka-native", "pulsar": "pulsar-native"}

_DELIVERY_CHILD = """
import json, time, sys
URL, BOOTSTRAP, ADMIN, TOPIC, NAME = {settings!r}
_first = []
def done(err):
    if not _first:
        _first.append((time.time(), None if err is None else str(err)))
def settle(p):  # serve a report that flush() left (seen with the drop-in's first record)
    deadline = time.time() + 30
    while not _first and time.time() < deadline:
        p.poll(0.01)
{body}
at, err = _first[0] if _first else (None, "no delivery report")
print(json.dumps({{"delivered_at": at, "error": err}}))
sys.stdout.flush()
"""


#: the children's environment (see ``--no-bytecode-cache``), set in ``main``
CHILD_ENV: dict[str, str] = {}


#: ``--also`` sources: label -> a checkout of this project whose ``idempotent`` the variants
#: ``<variant>@<label>`` import instead of the installed one (through ``PYTHONPATH``)
SOURCES: dict[str, str] = {}


def _split(variant: str) -> tuple[str, str | None]:
    """``name@label`` -> (``name``, the checkout it runs from); plain ``name`` -> (name, None)."""
    name, _, label = variant.partition("@")
    return name, SOURCES[label] if label else None


def _child(code: str, source: str | None = None, timeout: float = 120.0) -> tuple[float, dict[str, Any]]:
    """Run ``code`` in a fresh interpreter (importing ``idempotent`` from ``source`` if given);
    its wall-clock start and the JSON of its last line."""
    env = dict(CHILD_ENV)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    started = time.time()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    return started, json.loads(done.stdout.strip().splitlines()[-1])


def measure_import(variant: str) -> float:
    name, source = _split(variant)
    _, out = _child(_IMPORT_CHILD.format(statement=IMPORTS[name][0]), source)
    return float(out["import_s"])


def measure_delivery(variant: str, info: services.ServiceInfo, topic: str, name: str) -> float:
    kind, source = _split(variant)
    _backend, body = DELIVERIES[kind]
    settings = (info.url, info.bootstrap, info.admin_url or "", topic, name)
    started, out = _child(_DELIVERY_CHILD.format(settings=settings, body=body), source)
    if out["error"] is not None or out["delivered_at"] is None:
        raise RuntimeError(f"{variant}: {out['error']}")
    return float(out["delivered_at"]) - started


def _make_topic(info: services.ServiceInfo, topic: str) -> None:
    """Create ``topic`` with one partition before the first round (and send one record to it)."""
    if info.name == "kafka":
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": info.bootstrap})
        for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            future.result(60)
    else:
        import pulsar

        client = pulsar.Client(info.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        client.create_producer(topic).send(b"warm-up")
        client.close()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--only", default="import,kafka,pulsar", help="which of import, kafka, pulsar")
    parser.add_argument("--variants", default="", help="comma-separated delivery variants (default: all)")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="compile every module from source in every child (PYTHONDONTWRITEBYTECODE) instead of caching "
        "bytecode as an installed package has it",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="also run every non-native variant importing idempotent from checkout DIR (for example the "
        "commit before a change), as <variant>@LABEL, alternated with the others",
    )
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="folder of the JSON")
    args = parser.parse_args(argv)
    SOURCES.update(item.split("=", 1) for item in args.also)
    CHILD_ENV.clear()
    CHILD_ENV.update(os.environ)
    if args.no_bytecode_cache:
        CHILD_ENV["PYTHONDONTWRITEBYTECODE"] = "1"
        CHILD_ENV["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="bench-startup-empty-")
    else:
        # every module's bytecode cached (in a folder of this run, for native and ours alike, filled
        # by the warm-up round), as pip leaves an installed package and its dependencies
        CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        CHILD_ENV["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="bench-startup-pycache-")
    parts = [p for p in args.only.split(",") if p]
    load_before = os.getloadavg()
    numbers: dict[str, Any] = {"import_s": {}, "first_delivery_s": {}}
    lines = ["| what | median | runs | vs native |", "|---|---|---|---|"]

    if "import" in parts:
        imports = [*IMPORTS, *(f"{v}@{label}" for v, (_, native) in IMPORTS.items() if native for label in SOURCES)]
        runs: dict[str, list[float]] = {v: [] for v in imports}
        for i in range(args.rounds + 1):
            for variant in imports:
                seconds = measure_import(variant)
                if i:
                    runs[variant].append(seconds)
            print(f"import round {i}{' (warm-up)' if not i else ''}: done", file=sys.stderr)
        numbers["import_s"] = runs
        for variant in imports:
            native = IMPORTS[_split(variant)[0]][1]
            median = statistics.median(runs[variant])
            versus = ""
            if native is not None:
                base = statistics.median(runs[native])
                versus = f"{(median - base) * 1000:+,.0f} ms ({median / base:.2f}x)"
            spread = ", ".join(f"{s * 1000:.0f}" for s in runs[variant])
            lines.append(f"| import `{variant}` | {_ms(median)} | {spread} | {versus} |")

    chosen = [v for v in args.variants.split(",") if v] or list(DELIVERIES)
    for backend in ("kafka", "pulsar"):
        variants = [v for v in chosen if DELIVERIES[v][0] == backend]
        if backend not in parts or not variants:
            continue
        started_here = services.status(backend) is None
        info = services.up(backend)
        try:
            topic = f"bench-startup-{uuid.uuid4().hex[:8]}"
            _make_topic(info, topic)
            if NATIVE[backend] not in variants:
                variants.insert(0, NATIVE[backend])
            variants += [f"{v}@{label}" for v in variants if v != NATIVE[backend] for label in SOURCES]
            runs = {v: [] for v in variants}
            for i in range(args.rounds + 1):
                for variant in variants:
                    seconds = measure_delivery(variant, info, topic, f"bench-startup-{variant}-{i}")
                    if i:
                        runs[variant].append(seconds)
                print(f"{backend} round {i}{' (warm-up)' if not i else ''}: done", file=sys.stderr)
        finally:
            if started_here:
                services.down(backend)
        numbers["first_delivery_s"].update(runs)
        base = statistics.median(runs[NATIVE[backend]])
        for variant in variants:
            median = statistics.median(runs[variant])
            versus = "" if variant == NATIVE[backend] else f"{(median - base) * 1000:+,.0f} ms ({median / base:.2f}x)"
            spread = ", ".join(f"{s * 1000:.0f}" for s in runs[variant])
            lines.append(f"| first delivery `{variant}` | {_ms(median)} | {spread} | {versus} |")

    load_after = os.getloadavg()
    print("\n".join(lines))
    print(f"\nload average before {load_before}, after {load_after} on {os.cpu_count()} CPUs")
    save_run("startup", args, load_before, load_after, Path(args.out), table="\n".join(lines), **numbers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
