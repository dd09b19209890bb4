"""Every target of the hot path in one run: each benchmark in turn, then one table of measured against wanted.

Runs, one after the other in child processes (so that one's memory and threads do not skew
the next), with their results written to one folder:

* ``embedded``: ``bench_embedded.py``, 300,000 records of 100 B, 3 repeats: ``Producer.send()``
  per record into ``sqlite://`` (``send``), ``send_many`` and ``idempotent produce`` (``cli``)
  against plain ``executemany`` of the same rows;
* ``backends``: ``bench_backends.py --callbacks each``, 200,000 records, 3 repeats, 100 B and
  1 KB: on Kafka and Pulsar, ``Producer.send()`` (a future per record), ``Producer.send(...,
  on_delivery=)`` and the drop-in (``produce()`` / ``send_async()``) against the native client
  with idempotence (confluent-kafka, ``enable.idempotence``) or deduplication (pulsar-client),
  a delivery callback per record on both sides; then latency at a fixed offered rate (half of
  the native client's median throughput from the same run, 3 s runs);
* ``backends-sampled``: the same throughput runs with ``--callbacks sampled``: a callback on
  one record in 16 only (the latency samples), on both sides; no fixed-rate runs
  (``--latency-seconds 0``: the fixed-rate rows come from ``backends``);
* ``server-load``: ``bench_server_load.py both --raw``: one broker server on ``sqlite://``
  under 400 producers each sending one record every 100 ms (played by raw protocol clients,
  so that on a small machine the latency measured is the server's, not the clients'), and
  saturated by single-record batches (32 connections, 32 in flight each); 10 s warm-up,
  20 s measured, 3 repeats alternated;
* ``server``: ``bench_server.py``: ``idem://`` against the in-process broker, on SQLite,
  Kafka and Pulsar, 50,000 records, 3 repeats;
* ``checker``: ``bench_checker.py``: bytes per tracked (producer, partition), snapshot times;
* ``spark``: ``bench_spark.py --fresh-topics``, 1,000,000 rows of 100 B, 5 rounds: the
  ``idempotent`` Spark sink on ``kafka://`` against Spark's own Kafka sink, same data, same
  broker, a fresh topic per write, as the quoted 0.72x was measured (needs PySpark
  and ``mvn`` for Spark's Kafka connector);
* ``startup``: ``bench_startup.py``, 5 rounds after a warm-up round, in fresh processes: the
  import of each drop-in and of ``idempotent`` against the native client's, and the time from
  a process's start to the first delivery report of one record on Kafka and Pulsar, the
  drop-ins and ``Producer`` against the native clients;
* ``mirror``: ``bench_mirror.py --no-kill``, 100,000 records of 100 B, 3 partitions,
  3 repeats: the ``idempotent mirror`` command in a process of its own against MirrorMaker 2
  (and the in-process ``Mirror`` API and a plain consume -> produce loop), Kafka to Kafka
  (needs ``mvn`` for MirrorMaker 2).

``--only`` and ``--skip`` choose steps (for example ``--skip spark,mirror`` where Spark or
MirrorMaker 2 cannot run). Kafka and Pulsar are started once, before the first step that needs
them, and stopped after the last one, unless they were running already. A step that fails is
reported and the run goes on; its rows then say "not measured".

Then prints one Markdown table: each target, what this run measured, and whether it is met.
Each benchmark alternates its own variants and reports medians; see their docstrings.

    python bench/bench_targets.py                   # every step: 13 to 18 minutes on the quiet 2-core machine
    python bench/bench_targets.py --quick           # every step small, for a smoke test: 3 to 5 minutes
    python bench/bench_targets.py --skip spark,mirror

The default run took 13 minutes on the quiet 2-core machine (embedded 9 s, backends 288 s,
backends-sampled 119 s, server-load 196 s, server 19 s, checker 74 s, spark 37 s, mirror 42 s,
2026-11-28; 18 minutes on 2026-11-26); more on a busy machine. Each step's time is printed with the table. The table
and every benchmark's JSON go to ``bench/results/targets-<time>/``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_backends import RATE_VARIANTS
from bench_backends import VARIANTS as BACKEND_VARIANTS

from idempotent.testing import services

HERE = Path(__file__).resolve().parent

Row = tuple[str, str, str, bool | None]

#: a step's result (the JSON its benchmark wrote, None if it wrote none) and the arguments it ran with
Summary = Callable[[dict[str, Any] | None, list[str]], list[Row]]

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    #: its arguments in every run, then those of the default run and those of ``--quick``
    common: list[str]
    full: list[str]
    quick: list[str]
    #: the name its benchmark gives its JSON file: ``<prefix>-<YYYYmmdd-HHMMSS>.json``
    prefix: str
    summary: Summary
    #: brokers it uses (started once for every step that needs them)
    services: tuple[str, ...] = ()

    def arguments(self, quick: bool) -> list[str]:
        return [*self.common, *(self.quick if quick else self.full)]


def _arg(argv: list[str], name: str, default: str) -> str:
    """The value given to option ``name`` in ``argv`` (the last one), else ``default``."""
    value = default
    for i, item in enumerate(argv[:-1]):
        if item == name:
            value = argv[i + 1]
    return value


def _median(runs: list[dict[str, Any]], key: str, **where: object) -> float | None:
    values = [r[key] for r in runs if all(r.get(k) == v for k, v in where.items())]
    return statistics.median(values) if values else None


# -- embedded ----------------------------------------------------------------------------------

#: (variant of bench_embedded.py, what it is, the wanted ratio to executemany)
EMBEDDED_TARGETS = (
    ("send", "`Producer.send()` per record into `sqlite://`", 0.75),
    ("cli", "`idempotent produce sqlite://`", 0.9),
)


def embedded_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    medians = data["medians"] if data else {}
    size = data["size"] if data else int(_arg(argv, "--size", "100"))
    base = medians.get("executemany")
    rows: list[Row] = []
    for variant, what, wanted in EMBEDDED_TARGETS:
        ours = medians.get(variant)
        label = f"embedded: {what}, {size} B, vs `executemany` of the same rows"
        if ours is None or not base:
            rows.append((label, NOT_MEASURED, f"≥ {wanted:g}x", None))
            continue
        ratio = ours / base
        rows.append((label, f"{ours:,.0f}/s vs {base:,.0f}/s = {ratio:.2f}x", f"≥ {wanted:g}x", ratio >= wanted))
    return rows


# -- Kafka and Pulsar --------------------------------------------------------------------------

#: what each of bench_backends.py's variants is, in the table
VARIANT_TEXT = {
    "idempotent": "`Producer.send()`, a done-callback on each future",
    "idempotent-cb": "`Producer.send(on_delivery=)`",
    "kafka-drop-in": "the drop-in's `produce()`",
    "pulsar-drop-in": "the drop-in's `send_async()`",
}
#: the same with ``--callbacks sampled``: both ``Producer.send()`` variants then send most records
#: without a callback, and differ only in how the sampled ones (1 in 16) get theirs
SAMPLED_VARIANT_TEXT = {
    **VARIANT_TEXT,
    "idempotent": "`Producer.send()` (sampled records: a done-callback on the future)",
    "idempotent-cb": "`Producer.send()` (sampled records: `on_delivery=`)",
}
NATIVE_TEXT = {
    "kafka": "confluent-kafka (`enable.idempotence=true`)",
    "pulsar": "pulsar-client (deduplication)",
}
CALLBACK_TEXT = {
    "each": "a callback per record (on both sides)",
    "sampled": "no per-record callback (1 in 16 sampled, on both sides)",
}
#: how far over the native client's fixed-rate latency ours may be: (p50, p99) in ms
LATENCY_MARGIN = {"kafka": (5.0, 20.0), "pulsar": (None, 5.0)}


def backend_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    rows: list[Row] = []
    runs = data["runs"] if data else []
    latency = data.get("latency_runs", []) if data else []
    callbacks = _arg(argv, "--callbacks", "each")
    latency_wanted = float(_arg(argv, "--latency-seconds", "3")) > 0
    sizes = [int(s) for s in _arg(argv, "--sizes", "100,1000").split(",") if s]
    texts = VARIANT_TEXT if callbacks == "each" else SAMPLED_VARIANT_TEXT
    for backend in [b for b in _arg(argv, "--backends", "kafka,pulsar").split(",") if b]:
        native = BACKEND_VARIANTS[backend][1]
        for size in sizes:
            theirs = _median(runs, "records_per_s", backend=backend, size=size, variant=native)
            for variant in BACKEND_VARIANTS[backend][2:]:
                ours = _median(runs, "records_per_s", backend=backend, size=size, variant=variant)
                label = (
                    f"{backend} throughput, {size} B, {CALLBACK_TEXT[callbacks]}: {texts[variant]} "
                    f"vs {NATIVE_TEXT[backend]}"
                )
                if ours is None or not theirs:
                    rows.append((label, NOT_MEASURED, "≥ 0.9x", None))
                    continue
                ratio = ours / theirs
                rows.append((label, f"{ours:,.0f}/s vs {theirs:,.0f}/s = {ratio:.2f}x", "≥ 0.9x", ratio >= 0.9))
            if latency_wanted:
                rows.extend(_latency_rows(latency, backend, size))
    return rows


def _latency_rows(latency: list[dict[str, Any]], backend: str, size: int) -> list[Row]:
    rows: list[Row] = []
    native = BACKEND_VARIANTS[backend][1]
    where = {"backend": backend, "size": size}
    offered = _median(latency, "offered_per_s", variant=native, **where)
    margin50, margin99 = LATENCY_MARGIN[backend]
    wanted = ", ".join(
        f"{name} ≤ native + {margin:g} ms"
        for name, margin in (("p50", margin50), ("p99", margin99))
        if margin is not None
    )
    for variant in RATE_VARIANTS[backend]:
        label = (
            f"{backend} latency, {size} B, at a fixed rate (half the native's throughput): "
            f"{VARIANT_TEXT[variant]} vs {NATIVE_TEXT[backend]}"
        )
        achieved = _median(latency, "achieved_per_s", variant=variant, **where)
        p50 = [_median(latency, "p50_ms", variant=v, **where) for v in (variant, native)]
        p99 = [_median(latency, "p99_ms", variant=v, **where) for v in (variant, native)]
        if offered is None or achieved is None or None in p50 or None in p99:
            rows.append((label, NOT_MEASURED, wanted, None))
            continue
        d50, d99 = p50[0] - p50[1], p99[0] - p99[1]  # type: ignore[operator]
        sustained = achieved >= 0.95 * offered
        note = "" if sustained else f"; offered {offered:,.0f}/s, ours reached {achieved:,.0f}/s"
        met = sustained and (margin50 is None or d50 <= margin50) and (margin99 is None or d99 <= margin99)
        rows.append(
            (
                label,
                f"p50 {p50[0]:.1f} ms vs {p50[1]:.1f} ms ({d50:+.1f}), p99 {p99[0]:.1f} ms vs {p99[1]:.1f} ms "
                f"({d99:+.1f}) at {offered:,.0f}/s{note}",
                wanted,
                met,
            )
        )
    return rows


# -- the broker server -------------------------------------------------------------------------


def server_load_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    runs = data["runs"] if data else []
    producers = int(_arg(argv, "--producers", "400"))
    interval_ms = float(_arg(argv, "--interval-ms", "100"))
    clients = "raw protocol clients" if "--raw" in argv else "`Producer`s"
    rows: list[Row] = []
    fleet = [r for r in runs if r["load"] == "fleet"]
    label = (
        f"broker server on `sqlite://`: {producers} producers x 1 record per {interval_ms:g} ms "
        f"({clients}), send-to-acknowledgement p99"
    )
    if not fleet:
        rows.append((label, NOT_MEASURED, "p99 ≤ 50 ms", None))
    else:
        med = {
            k: statistics.median(r[k] for r in fleet)
            for k in ("p50_ms", "p99_ms", "max_ms", "open_p99_ms", "probe_open_max_ms", "batches_per_s")
        }
        failed = sum(r["failed"] for r in fleet)
        offered = producers * 1000 / interval_ms
        sustained = med["batches_per_s"] >= 0.95 * offered and failed == 0
        rows.append(
            (
                label,
                f"p99 {med['p99_ms']:,.1f} ms (p50 {med['p50_ms']:,.1f}, max {med['max_ms']:,.0f}); "
                f"{med['batches_per_s']:,.0f} of {offered:,.0f} batches/s answered, {failed} failed; "
                f"opening a producer: p99 {med['open_p99_ms']:,.1f} ms at the start, "
                f"max {med['probe_open_max_ms']:,.1f} ms under the load",
                "p99 ≤ 50 ms",
                sustained and med["p99_ms"] <= 50,
            )
        )
    saturate = [r for r in runs if r["load"] == "saturate"]
    label = "broker server on `sqlite://`: single-record batches/s, saturated"
    if not saturate:
        rows.append((label, NOT_MEASURED, "≥ 20,000/s", None))
    else:
        rate = statistics.median(r["batches_per_s"] for r in saturate)
        cpu = statistics.median(r["server_cpu_per_batch_us"] for r in saturate)
        share = statistics.median(r["server_cpu_share"] for r in saturate)
        rows.append(
            (
                f"{label} ({saturate[0]['connections']} connections)",
                f"{rate:,.0f}/s (server: {cpu:.0f} µs CPU per batch, {share:.2f} of a core)",
                "≥ 20,000/s",
                rate >= 20_000,
            )
        )
    return rows


def server_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    rows: list[Row] = []
    runs = data["runs"] if data else []
    sizes = [int(s) for s in _arg(argv, "--sizes", "100,1000").split(",") if s]
    for backend in sorted(b for b in _arg(argv, "--backends", "sqlite,kafka,pulsar").split(",") if b):
        for size in sizes:
            server = _median(runs, "records_per_s", backend=backend, size=size, variant="server")
            local = _median(runs, "records_per_s", backend=backend, size=size, variant="in-process")
            label = f"`idem://` over {backend}, {size} B, vs the in-process broker"
            if server is None or not local:
                rows.append((label, NOT_MEASURED, "≥ 0.8x", None))
                continue
            ratio = server / local
            rows.append((label, f"{server:,.0f}/s vs {local:,.0f}/s = {ratio:.2f}x", "≥ 0.8x", ratio >= 0.8))
    return rows


def checker_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    if data is None:
        return [
            ("memory per tracked (producer, partition)", NOT_MEASURED, "≤ 150 B", None),
            ("snapshot write", NOT_MEASURED, "< 0.5 s", None),
            ("snapshot restore", NOT_MEASURED, "< 0.5 s", None),
        ]
    per = data["bytes_per_producer"]
    write, restore = data["snapshot_write_s"], data["snapshot_restore_s"]
    count = data["snapshot_producers"]
    return [
        (
            f"memory per tracked (producer, partition), {data['producers']:,} producers",
            f"{per:,.0f} B",
            "≤ 150 B",
            per <= 150,
        ),
        (f"snapshot write, {count:,} producers", f"{write:.2f} s", "< 0.5 s", write < 0.5),
        (f"snapshot restore, {count:,} producers", f"{restore:.2f} s", "< 0.5 s", restore < 0.5),
    ]


# -- Spark and the mirror ----------------------------------------------------------------------


def spark_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    rows_written = int(_arg(argv, "--rows", "400000"))
    size = int(_arg(argv, "--size", "100"))
    label = (
        f'Spark sink: `format("idempotent")` on `kafka://` vs Spark\'s Kafka sink, {rows_written:,} rows of {size} B'
    )
    wanted = "≥ 0.72x (no regression)"
    results = {r["variant"]: r["rows_per_s"] for r in data["results"]} if data else {}
    ours, theirs = results.get("idempotent-kafka"), results.get("spark-kafka")
    if ours is None or not theirs:
        return [(label, NOT_MEASURED, wanted, None)]
    ratio = ours / theirs
    return [(label, f"{ours:,.0f} vs {theirs:,.0f} rows/s = {ratio:.2f}x", wanted, ratio >= 0.72)]


def mirror_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    records = int(_arg(argv, "--records", "100000"))
    size = int(_arg(argv, "--size", "100"))
    label = (
        f"mirror: the `idempotent mirror` command (kafka+native → kafka://) vs MirrorMaker 2, "
        f"{records:,} records of {size} B"
    )
    wanted = "≥ 1.47x (no regression)"
    medians = data["medians"] if data else {}
    ours, theirs, api = medians.get("command"), medians.get("mm2"), medians.get("idempotent")
    if ours is None or not theirs:
        return [(label, NOT_MEASURED, wanted, None)]
    ratio = ours / theirs
    shown = f"{ours:,.0f}/s vs {theirs:,.0f}/s = {ratio:.2f}x"
    if api is not None:
        shown += f" (the in-process API {api:,.0f}/s = {api / theirs:.2f}x)"
    return [(label, shown, wanted, ratio >= 1.47)]


# -- start-up ----------------------------------------------------------------------------------

#: (what bench_startup.py calls the import, what it is compared with, the table's words)
STARTUP_IMPORTS = (
    ("idempotent.compat.confluent_kafka", "confluent_kafka", "`import idempotent.compat.confluent_kafka`"),
    ("idempotent", "confluent_kafka", "`import idempotent; idempotent.Producer`"),
    ("idempotent.compat.pulsar", "pulsar", "`import idempotent.compat.pulsar`"),
)
#: (bench_startup.py's delivery variant, the native one, the table's words)
STARTUP_DELIVERIES = (
    ("kafka-drop-in", "kafka-native", "Kafka: the drop-in, anonymous"),
    ("kafka-drop-in-named", "kafka-native", "Kafka: the drop-in with `transactional.id`"),
    ("kafka-producer", "kafka-native", '`Producer("kafka://...")`, anonymous'),
    ("kafka-producer-named", "kafka-native", '`Producer("kafka://...")`, named'),
    ("pulsar-drop-in", "pulsar-native", "Pulsar: the drop-in"),
    ("pulsar-producer", "pulsar-native", '`Producer("pulsar://...")`, anonymous'),
    ("pulsar-producer-named", "pulsar-native", '`Producer("pulsar://...")`, named'),
)


def startup_rows(data: dict[str, Any] | None, argv: list[str]) -> list[Row]:
    def median(kind: str, variant: str) -> float | None:
        runs = (data or {}).get(kind, {}).get(variant)
        return statistics.median(runs) if runs else None

    rows: list[Row] = []
    groups = (
        ("import_s", STARTUP_IMPORTS, 0.15, "import"),
        ("first_delivery_s", STARTUP_DELIVERIES, 0.05, "first delivery"),
    )
    for kind, variants, allowed, what in groups:
        for variant, native, text in variants:
            ours, base = median(kind, variant), median(kind, native)
            label = f"start-up, {what}: {text}, vs `{native}`"
            wanted = f"≤ native + {allowed * 1000:.0f} ms"
            if ours is None or base is None:
                rows.append((label, NOT_MEASURED, wanted, None))
                continue
            difference = ours - base
            shown = f"{ours * 1000:,.0f} ms vs {base * 1000:,.0f} ms = {difference * 1000:+,.0f} ms"
            rows.append((label, shown, wanted, difference <= allowed))
    return rows


# -- the steps ---------------------------------------------------------------------------------

STEPS: list[Step] = [
    Step(
        "embedded",
        "bench_embedded.py",
        ["--variants", "executemany,send,send_many,cli"],
        ["--records", "300000", "--repeats", "3"],
        ["--records", "20000", "--repeats", "1"],
        "embedded",
        embedded_rows,
    ),
    Step(
        "backends",
        "bench_backends.py",
        ["--callbacks", "each", "--sizes", "100,1000"],
        ["--records", "200000", "--repeats", "3", "--latency-seconds", "3"],
        ["--records", "3000", "--repeats", "1", "--latency-seconds", "1"],
        "backends",
        backend_rows,
        ("kafka", "pulsar"),
    ),
    Step(
        "backends-sampled",
        "bench_backends.py",
        ["--callbacks", "sampled", "--sizes", "100,1000", "--latency-seconds", "0"],
        ["--records", "200000", "--repeats", "3"],
        ["--records", "3000", "--repeats", "1"],
        "backends",
        backend_rows,
        ("kafka", "pulsar"),
    ),
    Step(
        "server-load",
        "bench_server_load.py",
        ["both", "--raw", "--producers", "400", "--interval-ms", "100"],
        ["--warmup", "10", "--seconds", "20", "--repeats", "3"],
        ["--warmup", "2", "--seconds", "3", "--repeats", "1"],
        "server-load",
        server_load_rows,
    ),
    Step(
        "server",
        "bench_server.py",
        ["--backends", "sqlite,kafka,pulsar"],
        ["--records", "50000", "--repeats", "3"],
        ["--sizes", "100", "--records", "3000", "--repeats", "1"],
        "server",
        server_rows,
        ("kafka", "pulsar"),
    ),
    Step(
        "checker",
        "bench_checker.py",
        [],
        ["--repeats", "3"],
        ["--producers", "100000", "--repeats", "1"],
        "checker",
        checker_rows,
    ),
    Step(
        "spark",
        "bench_spark.py",
        ["--backends", "kafka", "--fresh-topics"],
        ["--rows", "1000000", "--repeats", "5"],
        ["--rows", "20000", "--repeats", "1"],
        "spark",
        spark_rows,
        ("kafka",),
    ),
    Step(
        "startup",
        "bench_startup.py",
        [],
        ["--rounds", "5"],
        ["--rounds", "1"],
        "startup",
        startup_rows,
        ("kafka", "pulsar"),
    ),
    Step(
        "mirror",
        "bench_mirror.py",
        ["--no-kill", "--size", "100", "--partitions", "3"],
        ["--records", "100000", "--repeats", "3"],
        ["--records", "5000", "--repeats", "1"],
        "mirror",
        mirror_rows,
        ("kafka",),
    ),
]


def _results_written(folder: Path, prefix: str, before: set[Path]) -> dict[str, Any] | None:
    """The JSON file named ``<prefix>-<time>.json`` that a step wrote into ``folder`` (the newest
    if several), or None."""
    pattern = re.compile(rf"{re.escape(prefix)}-\d{{8}}-\d{{6}}\.json")
    found = sorted(p for p in set(folder.glob("*.json")) - before if pattern.fullmatch(p.name))
    if not found:
        return None
    data: dict[str, Any] = json.loads(found[-1].read_text())
    return data


def _load() -> str:
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def _steps(parser: argparse.ArgumentParser, value: str) -> list[str]:
    names = [name for name in value.split(",") if name]
    unknown = set(names) - {step.name for step in STEPS}
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {', '.join(step.name for step in STEPS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small runs: checks the plumbing, not the targets")
    parser.add_argument("--only", default=",".join(step.name for step in STEPS), help="comma-separated steps to run")
    parser.add_argument("--skip", default="", help="comma-separated steps to leave out")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    chosen = set(_steps(parser, args.only)) - set(_steps(parser, args.skip))
    steps = [step for step in STEPS if step.name in chosen]
    folder = Path(args.out) / f"targets-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    loads: list[str] = []
    timings: list[str] = []
    failed: list[str] = []
    started_here: list[str] = []
    try:
        for index, step in enumerate(steps):
            for name in step.services:  # brokers are started once, for every step that needs them
                if name not in started_here and services.status(name) is None:
                    print(f"== starting {name}", file=sys.stderr, flush=True)
                    services.up(name)
                    started_here.append(name)
            arguments = step.arguments(args.quick)
            command = [sys.executable, str(HERE / step.script), *arguments, "--out", str(folder)]
            print(f"== {step.name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
            loads.append(f"{step.name} {_load()}")
            before = set(folder.glob("*.json"))
            started = time.monotonic()
            code = subprocess.run(command, check=False).returncode
            took = time.monotonic() - started
            timings.append(f"{step.name} {took:.0f} s")
            data = _results_written(folder, step.prefix, before)
            if code != 0 or data is None:
                failed.append(f"{step.name} (exit {code}{', no results' if data is None else ''})")
                data = None
            print(f"== {step.name}: {took:.0f} s{'' if data else ', FAILED'}", file=sys.stderr, flush=True)
            rows.extend(step.summary(data, arguments))
            later = {name for step in steps[index + 1 :] for name in step.services}
            for name in [n for n in started_here if n not in later]:
                services.down(name)
                started_here.remove(name)
    finally:
        for name in started_here:
            services.down(name)
    lines = [
        f"Targets, one run{' (--quick: not a measurement of the targets)' if args.quick else ''}; "
        f"load average (1, 5, 15 min) at each step's start: {'; '.join(loads)}; "
        f"each step's time: {', '.join(timings)}",
        "",
        "| target | measured | wanted | met |",
        "|---|---|---|---|",
    ]
    for what, measured, wanted_value, met in rows:
        verdict = "-" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {what} | {measured} | {wanted_value} | {verdict} |")
    if failed:
        lines += ["", f"Steps that failed (their rows say {NOT_MEASURED!r}): {', '.join(failed)}"]
    table = "\n".join(lines)
    print(table)
    (folder / "targets.md").write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
