"""CPU per record of each thread while one Producer sends: where a record's time goes.

Sends ``--records`` records of ``--size`` bytes with ``Producer.send`` to a fresh topic on
``URL`` (default: the Pulsar that ``idempotent services`` runs), then reads every thread's
CPU time from ``/proc/self/task/*/stat`` and prints microseconds per record per thread:
the caller, the producer's sender, the adapter's writer, and the threads Python did not
start (librdkafka's or the Pulsar client's own C++ threads). ``--rounds`` repeats it.

    python bench/profile_threads.py                              # Pulsar from `idempotent services`
    python bench/profile_threads.py kafka://127.0.0.1:9092 --records 100000
    python bench/profile_threads.py --variant drop-in          # the pulsar-client drop-in's send_async
    python bench/profile_threads.py --variant native           # pulsar-client itself, with deduplication

``--variant``: ``send`` (``Producer.send``, a future per record), ``callback``
(``Producer.send(on_delivery=...)``), ``drop-in`` (``idempotent.compat.pulsar``'s
``send_async`` with a callback per record), ``native`` (pulsar-client's ``send_async`` with a
callback per record, batching on, on a namespace with deduplication; Pulsar URLs only).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from idempotent import Producer
from idempotent.testing import services

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, float]:
    """Seconds of CPU (user + system) of each thread of this process, by native thread id."""
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def _label(native_id: int, names: dict[int, str]) -> str:
    if native_id == threading.main_thread().native_id:
        return "caller (send)"
    name = names.get(native_id)
    if name is None:
        return "threads Python did not start (client library)"
    if name.startswith(("idempotent-kafka-", "idempotent-pulsar-", "idempotent-sqlite-")):
        return "adapter writer"
    return name


def _done(*_: object) -> None:
    pass


def _run(
    variant: str, url: str, topic: str, payload: bytes, records: int
) -> tuple[dict[int, float], dict[int, float], float, dict[int, str]]:
    """Send ``records`` records with one variant; CPU per thread before and after, wall time."""
    closers: list[object] = []
    if variant in ("send", "callback"):
        producer = Producer(url)
        producer.send(topic, b"warm-up")
        producer.flush()
        if variant == "send":
            send = lambda: producer.send(topic, payload)  # noqa: E731
        else:
            send = lambda: producer.send(topic, payload, on_delivery=_done)  # noqa: E731
        flush = producer.flush
        closers.append(producer)
    else:
        if variant == "native":
            import pulsar as module

            from idempotent.compare.baselines import enable_pulsar_dedup

            admin = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["admin_url"][0]
            enable_pulsar_dedup(admin, "public/bench-dedup", topic)
            client = module.Client(url.split("?")[0], logger=module.ConsoleLogger(module.LoggerLevel.Error))
            name = f"persistent://public/bench-dedup/{topic}"
        else:
            from idempotent.compat import pulsar as module  # type: ignore[no-redef]

            client = module.Client(url)
            name = topic
        target = client.create_producer(
            name,
            producer_name=f"profile-{uuid.uuid4().hex[:8]}",
            batching_enabled=True,
            batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
            max_pending_messages=1_000_000 if variant == "drop-in" else 10_000,
            send_timeout_millis=0,
        )
        target.send(b"warm-up")
        send = lambda: target.send_async(payload, _done)  # noqa: E731
        flush = target.flush
        closers.append(client)
    before = thread_cpu()
    started = time.monotonic()
    for _ in range(records):
        send()
    flush()
    wall = time.monotonic() - started
    after = thread_cpu()
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    for closer in closers:
        closer.close()  # type: ignore[attr-defined]
    return before, after, wall, names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="backend URL (default: the running Pulsar of `idempotent services`)")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", choices=("send", "callback", "drop-in", "native"), default="send")
    args = parser.parse_args(argv)
    url = args.url
    if url is None:
        info = services.status("pulsar")
        if info is None:
            parser.error("no URL given and no Pulsar running: start one with `idempotent services up pulsar`")
        url = f"{info.url}?admin_url={urllib.parse.quote(info.admin_url or '', safe='')}"
    payload = b"x" * args.size
    for round_ in range(args.rounds):
        topic = "profile-" + uuid.uuid4().hex[:8]
        before, after, wall, names = _run(args.variant, url, topic, payload, args.records)
        per: dict[str, float] = {}
        for native_id, seconds in after.items():
            label = _label(native_id, names)
            per[label] = per.get(label, 0.0) + seconds - before.get(native_id, 0.0)
        total = sum(max(0.0, after.get(t, 0.0) - before.get(t, 0.0)) for t in after)
        print(
            f"round {round_ + 1} ({args.variant}): {args.records:,} records in {wall:.2f} s = "
            f"{args.records / wall:,.0f}/s, {total * 1e6 / args.records:.2f} µs CPU per record in all"
        )
        for label, seconds in sorted(per.items(), key=lambda item: -item[1]):
            if seconds > 0:
                print(f"  {label:48} {seconds * 1e6 / args.records:6.2f} µs CPU per record")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
