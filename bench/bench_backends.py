"""Throughput and latency on real Kafka and Pulsar: raw client, native dedup, and idempotent.

On the same broker, in one run, for each record size: the raw client without idempotence,
the client with the backend's own idempotence (Kafka ``enable.idempotence``, Pulsar
namespace deduplication), and this project's producer through its broker and checker.
Each variant runs ``--repeats`` times in rotating order on a fresh topic; the table shows
medians of records/s and of the p50/p99 send-to-acknowledgement latency (sampled on one
message in 16), and the ratio of idempotent to the native idempotent/dedup client.

    python bench/bench_backends.py                      # both backends, 100 B and 1 KB
    python bench/bench_backends.py --backends kafka --records 20000 --repeats 5

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
import platform
import statistics
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from tqdm import tqdm

from idempotent.testing import services
from idempotent.testing.baselines import Baseline, IdempotentBaseline, KafkaBaseline, PulsarBaseline

VARIANTS = {
    "kafka": ("kafka-raw", "kafka-idempotent", "idempotent"),
    "pulsar": ("pulsar-raw", "pulsar-dedup", "idempotent", "pulsar-drop-in"),
}
#: variants also measured at a fixed rate, next to the native one
RATE_VARIANTS = {"kafka": ("idempotent",), "pulsar": ("idempotent", "pulsar-drop-in")}


class DropInPulsarBaseline:
    """The pulsar-client drop-in (``idempotent.compat.pulsar``), used as pulsar-dedup uses
    pulsar-client: ``send_async`` with a callback per message, batching on, no send timeout."""

    def __init__(self, url: str, topic: str, *, sample_every: int = 16) -> None:
        from idempotent.compat import pulsar as drop_in
        from idempotent.testing.baselines import LINGER_MS, _Sampler

        self.name = "pulsar-drop-in"
        self._sampler = _Sampler(sample_every)
        self.latencies = self._sampler.latencies
        self._ok = drop_in.Result.Ok
        self._client = drop_in.Client(url)
        self._producer = self._client.create_producer(
            topic,
            producer_name=f"bench-{uuid.uuid4().hex[:8]}",
            batching_enabled=True,
            batching_max_publish_delay_ms=LINGER_MS,
            block_if_queue_full=True,
            max_pending_messages=1_000_000,
            send_timeout_millis=0,
        )

    def send(self, value: bytes, key: bytes | None = None) -> None:
        started = self._sampler.start()
        sampler = self._sampler
        ok = self._ok

        def delivered(result: Any, message_id: Any) -> None:
            sampler.done(started, result == ok)

        self._producer.send_async(value, delivered, partition_key=key.decode() if key else None)

    def flush(self, timeout: float = 120.0) -> int:
        self._producer.flush()
        return self._sampler.failed

    def close(self) -> None:
        self._producer.close()
        self._client.close()


def make(variant: str, info: services.ServiceInfo, topic: str) -> Baseline:
    if variant == "kafka-raw":
        return KafkaBaseline(info.bootstrap, topic, idempotence=False)
    if variant == "kafka-idempotent":
        return KafkaBaseline(info.bootstrap, topic, idempotence=True)
    if variant == "pulsar-raw":
        return PulsarBaseline(info.url, info.admin_url or "", topic, dedup=False)
    if variant == "pulsar-dedup":
        return PulsarBaseline(info.url, info.admin_url or "", topic, dedup=True)
    if variant == "pulsar-drop-in":
        return DropInPulsarBaseline(f"{info.url}?{urllib.parse.urlencode({'admin_url': info.admin_url or ''})}", topic)
    options: dict[str, Any] = {}
    url = info.url
    if info.name == "pulsar":
        options["admin_url"] = info.admin_url
    return IdempotentBaseline(url, topic, **options)


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


def run_once(variant: str, info: services.ServiceInfo, size: int, records: int) -> dict[str, float]:
    return measure(make(variant, info, f"bench-{variant}-{size}-{uuid.uuid4().hex[:8]}"), size, records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="kafka,pulsar")
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=3.0, help="length of a fixed-rate run; 0 skips them")
    parser.add_argument("--variants", default="", help="comma-separated variants to run (default: all)")
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
            info = services.up(backend)
            rounds = [(size, repeat) for size in sizes for repeat in range(args.repeats)]
            for size, repeat in tqdm(rounds, desc=backend, unit="round", file=sys.stderr):
                order = [v for v in VARIANTS[backend] if not args.variants or v in args.variants.split(",")]
                order = order[repeat % len(order) :] + order[: repeat % len(order)]  # rotate to spread drift
                for variant in order:
                    result = run_once(variant, info, size, args.records)
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
                        order = [native, *RATE_VARIANTS[backend]]
                        order = order[repeat % len(order) :] + order[: repeat % len(order)]
                        for variant in order:
                            topic = f"bench-rate-{variant}-{size}-{uuid.uuid4().hex[:8]}"
                            result = measure_at_rate(make(variant, info, topic), size, rate, args.latency_seconds)
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
    meta = {"records": args.records, "repeats": args.repeats, "python": platform.python_version(), "host_cpus": _cpus()}
    (out / f"backends-{stamp}.json").write_text(
        json.dumps({"meta": meta, "runs": results, "latency_runs": latency, "table": table}, indent=1)
    )
    return 0


def _cpus() -> int:
    import os

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
                medians[variant] = {
                    k: statistics.median(r[k] for r in runs) for k in ("records_per_s", "p50_ms", "p99_ms")
                }
                medians[variant]["failed"] = sum(r["failed"] for r in runs)
            native = medians[VARIANTS[backend][1]]["records_per_s"]
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
