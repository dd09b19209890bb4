"""Throughput and latency on real Kafka and Pulsar: raw client, native dedup, and idempotent.

On the same broker, in one run, for each record size: the raw client without idempotence,
the client with the backend's own idempotence (Kafka ``enable.idempotence``, Pulsar
namespace deduplication), and this project's producers, one call per record as applications
make them:

* ``idempotent``: ``Producer.send()``, a done-callback on each returned future;
* ``idempotent-cb``: ``Producer.send(..., on_delivery=callback)``, no future;
* ``kafka-drop-in``: the confluent-kafka drop-in's ``produce()``, used exactly as the native
  client is (same configuration, same callback, ``poll(0)`` after each call);
* ``pulsar-drop-in``: the pulsar-client drop-in's ``send_async()``, likewise.

Each measurement runs in a fresh process, on a fresh topic; the variants of a round run in
rotating order, ``--repeats`` rounds. The table shows medians of records/s and of the p50/p99
send-to-acknowledgement latency (sampled on one message in 16), and each variant's ratio to
the native idempotent/dedup client. ``--callbacks each`` (the default) gives every record a
delivery callback on every side; ``--callbacks sampled`` only the sampled ones, on every side.

    python bench/bench_backends.py                      # both backends, 100 B and 1 KB
    python bench/bench_backends.py --backends kafka --records 20000 --repeats 5
    python bench/bench_backends.py --backends kafka --callbacks sampled

Latency is also measured at a fixed offered rate (``--latency-seconds``, 0 to skip): half the
native idempotent/dedup client's median throughput from the same run, offered to the native
client and to this project's producer alike, alternated; the second table shows each one's
p50/p99 and the difference. Latency from a throughput run is queueing time, not latency.

Brokers are started with ``idempotent.testing.services`` (fetched from Maven Central on
first use) unless already running. Results are printed as Markdown and saved as JSON under
``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tqdm import tqdm

from idempotent.compare.baselines import Baseline, IdempotentBaseline, KafkaBaseline, PulsarBaseline
from idempotent.testing import services

VARIANTS = {
    "kafka": ("kafka-raw", "kafka-idempotent", "idempotent", "idempotent-cb", "kafka-drop-in"),
    "pulsar": ("pulsar-raw", "pulsar-dedup", "idempotent", "idempotent-cb", "pulsar-drop-in"),
}
#: variants also measured at a fixed rate, next to the native one
RATE_VARIANTS = {"kafka": ("idempotent-cb", "kafka-drop-in"), "pulsar": ("idempotent-cb", "pulsar-drop-in")}


def make(variant: str, info: services.ServiceInfo, topic: str, every_callback: bool = True) -> Baseline:
    each = every_callback
    if variant in ("kafka-raw", "kafka-idempotent", "kafka-drop-in"):
        idempotence = variant != "kafka-raw"
        return KafkaBaseline(
            info.bootstrap, topic, idempotence=idempotence, every_callback=each, drop_in=variant == "kafka-drop-in"
        )
    if variant in ("pulsar-raw", "pulsar-dedup"):
        dedup = variant == "pulsar-dedup"
        return PulsarBaseline(info.url, info.admin_url or "", topic, dedup=dedup, every_callback=each)
    if variant == "pulsar-drop-in":
        return PulsarBaseline(info.url, info.admin_url or "", topic, dedup=True, every_callback=each, drop_in=True)
    options: dict[str, Any] = {}
    if info.name == "pulsar":
        options["admin_url"] = info.admin_url
    return IdempotentBaseline(info.url, topic, every_callback=each, on_delivery=variant == "idempotent-cb", **options)


def measure(producer: Baseline, size: int, records: int) -> dict[str, float]:
    """Send ``records`` payloads of ``size`` bytes after a warm-up and time them; closes ``producer``."""
    try:
        payload = b"x" * size
        for _ in range(min(1000, records // 10)):  # warm up connections and metadata
            producer.send(payload)
        producer.flush()
        producer.latencies.clear()
        started = time.perf_counter()
        for _ in range(records):
            producer.send(payload)
        failed = producer.flush()
        elapsed = time.perf_counter() - started
    finally:
        producer.close()
    rate = records / elapsed
    return {"records_per_s": rate, **_percentiles(producer.latencies), "failed": failed, "seconds": elapsed}


def _percentiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 of latency samples in seconds, as milliseconds (NaN without samples)."""
    latencies = sorted(samples)
    if not latencies:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def measure_at_rate(producer: Baseline, size: int, rate: float, seconds: float) -> dict[str, float]:
    """Offer ``rate`` records/s of ``size`` bytes for ``seconds`` (sent in 1 ms steps, each
    with the records due by then) and return the latency percentiles; closes ``producer``."""
    try:
        payload = b"x" * size
        for _ in range(200):  # warm up connections and metadata
            producer.send(payload)
        producer.flush()
        producer.latencies.clear()
        total = int(rate * seconds)
        started = time.perf_counter()
        sent = 0
        while sent < total:
            due = min(total, int((time.perf_counter() - started) * rate) + 1)
            while sent < due:
                producer.send(payload)
                sent += 1
            time.sleep(0.001)
        failed = producer.flush()
        elapsed = time.perf_counter() - started
    finally:
        producer.close()
    return {
        "offered_per_s": rate,
        "achieved_per_s": total / elapsed,
        **_percentiles(producer.latencies),
        "failed": failed,
    }


def child(argv: list[str]) -> int:
    """One measurement in this (fresh) process: ``--child BACKEND VARIANT SIZE RECORDS EACH RATE
    SECONDS``; a rate of 0 measures throughput. Prints the result as one JSON line."""
    backend, variant, size, records, each, rate, seconds = argv
    info = services.up(backend)
    kind = "rate" if float(rate) else "throughput"
    marker = uuid.uuid4().hex[:8]
    producer = make(variant, info, f"bench-{kind}-{variant}-{size}-{marker}", each == "each")
    try:
        if float(rate):
            result = measure_at_rate(producer, int(size), float(rate), float(seconds))
        else:
            result = measure(producer, int(size), int(records))
    finally:
        drop_topics(info, marker)
    print(json.dumps(result))
    return 0


def drop_topics(info: services.ServiceInfo, marker: str) -> None:
    """Delete every topic whose name holds ``marker`` (this measurement's), so that a long
    run does not fill the memory the brokers keep their data in (``/dev/shm``). Best effort:
    a failure is printed, not raised."""
    try:
        if info.name == "kafka":
            from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

            admin = AdminClient({"bootstrap.servers": info.bootstrap})
            names = [name for name in admin.list_topics(timeout=30).topics if marker in name]
            for future in admin.delete_topics(names, operation_timeout=30).values() if names else ():
                future.result(60)
        elif info.name == "pulsar" and info.admin_url:
            from idempotent.compare.baselines import pulsar_admin

            for namespace in pulsar_admin(info.admin_url, "GET", "/admin/v2/namespaces/public") or []:
                base = f"/admin/v2/persistent/{namespace}"
                for name in pulsar_admin(info.admin_url, "GET", f"{base}/partitioned") or []:
                    if marker in name:
                        pulsar_admin(info.admin_url, "DELETE", f"{base}/{name.rsplit('/', 1)[1]}/partitions?force=true")
                for name in pulsar_admin(info.admin_url, "GET", base) or []:
                    if marker in name and "-partition-" not in name:
                        pulsar_admin(info.admin_url, "DELETE", f"{base}/{name.rsplit('/', 1)[1]}?force=true")
    except Exception as exc:  # clean-up only: the measurement stands
        print(f"could not delete the topics of {marker}: {exc!r}", file=sys.stderr)


def run_fresh(
    backend: str, variant: str, size: int, records: int, callbacks: str, rate: float = 0.0, seconds: float = 0.0
) -> dict[str, float]:
    """Run one measurement in a fresh Python process and return its result."""
    argv = [backend, variant, str(size), str(records), callbacks, str(rate), str(seconds)]
    done = subprocess.run(
        [sys.executable, __file__, "--child", *argv], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} {size} B failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="kafka,pulsar")
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=3.0, help="length of a fixed-rate run; 0 skips them")
    parser.add_argument("--variants", default="", help="comma-separated variants to run (default: all)")
    parser.add_argument(
        "--callbacks",
        choices=("each", "sampled"),
        default="each",
        help="a delivery callback on every record (each) or on the sampled ones only, on every side",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results: list[dict[str, Any]] = []
    latency: list[dict[str, Any]] = []
    started_here = []
    try:
        for backend in backends:
            if services.status(backend) is None:
                started_here.append(backend)
            services.up(backend)
            rounds = [(size, repeat) for size in sizes for repeat in range(args.repeats)]
            for size, repeat in tqdm(rounds, desc=backend, unit="round", file=sys.stderr):
                order = [v for v in VARIANTS[backend] if not args.variants or v in args.variants.split(",")]
                order = order[repeat % len(order) :] + order[: repeat % len(order)]  # rotate to spread drift
                for variant in order:
                    result = run_fresh(backend, variant, size, args.records, args.callbacks)
                    results.append({"backend": backend, "variant": variant, "size": size, "repeat": repeat, **result})
            if args.latency_seconds > 0:
                native = VARIANTS[backend][1]
                for size in sizes:
                    rate = 0.5 * statistics.median(
                        r["records_per_s"]
                        for r in results
                        if r["backend"] == backend and r["size"] == size and r["variant"] == native
                    )
                    for repeat in range(args.repeats):
                        order = [
                            v
                            for v in (native, *RATE_VARIANTS[backend])
                            if v == native or not args.variants or v in args.variants.split(",")
                        ]
                        order = order[repeat % len(order) :] + order[: repeat % len(order)]
                        for variant in order:
                            result = run_fresh(backend, variant, size, 0, args.callbacks, rate, args.latency_seconds)
                            latency.append(
                                {"backend": backend, "variant": variant, "size": size, "repeat": repeat, **result}
                            )
    finally:
        for backend in started_here:
            services.down(backend)
    table = summarize(results, backends, sizes)
    if latency:
        table += "\n\n" + summarize_latency(latency, backends, sizes)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    meta = {
        "records": args.records,
        "repeats": args.repeats,
        "callbacks": args.callbacks,
        "python": platform.python_version(),
        "host_cpus": _cpus(),
        "load_average": os.getloadavg(),
    }
    (out / f"backends-{stamp}.json").write_text(
        json.dumps({"meta": meta, "runs": results, "latency_runs": latency, "table": table}, indent=1)
    )
    return 0


def _cpus() -> int:
    return os.cpu_count() or 0


def summarize(results: list[dict[str, Any]], backends: list[str], sizes: list[int]) -> str:
    lines = [
        "| backend | size | variant | records/s (median) | p50 ms | p99 ms | failed | vs native dedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend in backends:
        for size in sizes:
            medians: dict[str, dict[str, float]] = {}
            for variant in VARIANTS[backend]:
                runs = [r for r in results if r["backend"] == backend and r["size"] == size and r["variant"] == variant]
                if not runs:
                    continue
                medians[variant] = {
                    k: statistics.median(r[k] for r in runs) for k in ("records_per_s", "p50_ms", "p99_ms")
                }
                medians[variant]["failed"] = sum(r["failed"] for r in runs)
            native = medians.get(VARIANTS[backend][1], {}).get("records_per_s", 0.0)
            for variant, m in medians.items():
                ratio = m["records_per_s"] / native if native else float("nan")
                lines.append(
                    f"| {backend} | {size} B | {variant} | {m['records_per_s']:,.0f} | {m['p50_ms']:.1f} | "
                    f"{m['p99_ms']:.1f} | {m['failed']:.0f} | {ratio:.2f}x |"
                )
    return "\n".join(lines)


def summarize_latency(latency: list[dict[str, Any]], backends: list[str], sizes: list[int]) -> str:
    lines = [
        "| backend | size | offered records/s | variant | achieved/s | p50 ms | p99 ms | p50 - native | p99 - native |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for backend in backends:
        native = VARIANTS[backend][1]
        for size in sizes:
            medians: dict[str, dict[str, float]] = {}
            for variant in (native, *RATE_VARIANTS[backend]):
                runs = [r for r in latency if r["backend"] == backend and r["size"] == size and r["variant"] == variant]
                if not runs:
                    continue
                medians[variant] = {
                    k: statistics.median(r[k] for r in runs)
                    for k in ("offered_per_s", "achieved_per_s", "p50_ms", "p99_ms")
                }
            if native not in medians:
                continue
            for variant, m in medians.items():
                lines.append(
                    f"| {backend} | {size} B | {m['offered_per_s']:,.0f} | {variant} | {m['achieved_per_s']:,.0f} | "
                    f"{m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['p50_ms'] - medians[native]['p50_ms']:+.1f} | "
                    f"{m['p99_ms'] - medians[native]['p99_ms']:+.1f} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
