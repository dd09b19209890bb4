"""The cost of recovering a named producer's state on Kafka from the partition's data.

A named producer (``idempotent.Producer("kafka://...", producer_name=...)``) writes a few
batches to a one-partition topic; then the native confluent-kafka producer appends
``--megabytes`` of other records (``--size`` bytes each, no compression) after them, and the
named producer writes once more at the end. Its restart then reads the partition back:

* **lost**: its state record is deleted from ``__idempotent_producer_state`` (as when the
  state topic's partition was lost): the state is rebuilt from the batch heads of the
  partition's last ``state_rebuild_records`` offsets (the window is set to hold the whole
  partition, so every byte generated is read);
* **stale**: its state record is put back to the one stored before the native records (as when
  the state topic went back to an older replica): the replay reads from that state's position
  to the end, the same bytes;
* **current**: the state as stored (the usual restart): the replay after it reads nothing.

Each is timed as ``idempotent.adapters.kafka.producer_log.load_states``: the part of a restart that recovers the
state (the opening of its writer, which fences the older instances, is not counted; nor is the
storing of the rebuilt state), on a fresh backend each time, median of ``--repeats``; the rate
is the data read per second, and the seconds per GB scale it to 1 GB.

    python bench/bench_state_rebuild.py                  # 1 GB of 1 KB records
    python bench/bench_state_rebuild.py --megabytes 256  # a smaller run (the rate per GB is printed)

The Kafka broker comes from ``idempotent.testing.services`` (started unless running). Results
are printed as Markdown and saved as JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

import confluent_kafka
from _results import save_run
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

import idempotent
from idempotent.adapters.kafka.backend import KafkaBackend
from idempotent.adapters.kafka.producer_log import STATE_TOPIC, load_states, state_key, state_partition
from idempotent.testing import services


def _generate(bootstrap: str, topic: str, megabytes: int, size: int) -> tuple[int, float]:
    """Append ``megabytes`` of ``size``-byte records to ``topic[0]`` with the native producer;
    ``(records, seconds)``."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "none",
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    value = os.urandom(size)
    count = megabytes * 1_000_000 // size
    started = time.monotonic()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(600):
        raise SystemExit("the native producer did not deliver everything within 600 s")
    return count, time.monotonic() - started


def _named_write(url: str, name: str, topic: str, lines: range) -> None:
    with idempotent.Producer(url, producer_name=name) as producer:
        for i in lines:
            producer.send(topic, b"line-%d" % i, partition=0, sequence=i)
        producer.flush()


def _state_value(backend: KafkaBackend, name: str, topic: str) -> bytes | None:
    key = state_key(name, topic, 0)
    value = None
    with backend._lock:
        for message in backend._read_range(STATE_TOPIC, state_partition(name), 0, None):
            if message.key() == key:
                value = message.value()
    return value


def _put_state(bootstrap: str, name: str, topic: str, value: bytes) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    producer.produce(STATE_TOPIC, key=state_key(name, topic, 0), value=value, partition=state_partition(name))
    producer.flush(30)


def _lose_state(bootstrap: str, name: str) -> None:
    """Delete every record of the state topic's partition holding the producer's keys."""
    partition = state_partition(name)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    _, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(STATE_TOPIC, partition), timeout=30)
    consumer.close()

    def policy(value: str) -> None:
        entry = ConfigEntry("cleanup.policy", value, incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource(ConfigResource.Type.TOPIC, STATE_TOPIC, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)

    policy("compact,delete")
    try:
        deadline = time.monotonic() + 60
        while True:  # until the broker applies the policy: POLICY_VIOLATION meanwhile
            try:
                target = [confluent_kafka.TopicPartition(STATE_TOPIC, partition, high)]
                for future in admin.delete_records(target).values():
                    future.result(30)
                break
            except confluent_kafka.KafkaException as exc:
                if exc.args[0].code() != confluent_kafka.KafkaError.POLICY_VIOLATION or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        policy("compact")


def _time_load(url: str, name: str, producer_id: int, window: int, repeats: int) -> list[float]:
    """Seconds of ``load_states`` per repeat (a fresh backend each time: no heads known)."""
    times = []
    for _ in range(repeats):
        backend = KafkaBackend(url)
        try:
            started = time.monotonic()
            states = load_states(backend, name, producer_id, window=window)
            times.append(time.monotonic() - started)
        finally:
            backend.close()
        assert len(states) == 1, states
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=1000, help="partition data to generate (default 1000)")
    parser.add_argument("--size", type=int, default=1000, help="bytes per record (default 1000)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    info = services.up("kafka")
    url, bootstrap = info.url, info.bootstrap
    topic, name = f"rebuild-{uuid.uuid4().hex[:8]}", f"rebuild-{uuid.uuid4().hex[:8]}"
    with idempotent.connect(url) as broker:
        broker.create_topic(topic, 1)
    _named_write(url, name, topic, range(1000))
    backend = KafkaBackend(url)
    try:
        older = _state_value(backend, name, topic)
        producer_id = next(r.producer_id for r in backend.load_producers() if r.producer_name == name)
    finally:
        backend.close()
    assert older is not None
    print(f"generating {args.megabytes} MB of {args.size}-byte records with the native producer ...", flush=True)
    records, generated = _generate(bootstrap, topic, args.megabytes, args.size)
    print(f"  {records} records in {generated:.1f} s ({args.megabytes / generated:.0f} MB/s)", flush=True)
    _named_write(url, name, topic, range(1000, 1010))
    window = records + 10_000
    data_gb = records * args.size / 1e9

    results: dict[str, Any] = {}
    current = _time_load(url, name, producer_id, window, args.repeats)
    _put_state(bootstrap, name, topic, older)
    stale = _time_load(url, name, producer_id, window, args.repeats)
    _lose_state(bootstrap, name)
    lost = _time_load(url, name, producer_id, window, args.repeats)
    for label, times in (("lost", lost), ("stale", stale), ("current", current)):
        median = statistics.median(times)
        results[label] = {"seconds": times, "median": median}
    load_after = os.getloadavg()

    print(f"\n{records} records of {args.size} bytes ({data_gb:.2f} GB) after the producer's state\n")
    print("| state at restart | read | median time | rate | time per GB |")
    print("|---|---|---|---|---|")
    for label in ("lost", "stale"):
        median = results[label]["median"]
        print(
            f"| {label} | {data_gb:.2f} GB | {median:.2f} s | {data_gb / median:.2f} GB/s | {median / data_gb:.2f} s |"
        )
    print(f"| current | nothing | {results['current']['median']:.3f} s | | |")
    save_run(
        "state_rebuild",
        args,
        load_before,
        load_after,
        records=records,
        data_gb=data_gb,
        generate_seconds=generated,
        **results,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
