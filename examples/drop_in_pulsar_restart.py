"""A pulsar-client importer for a partitioned topic that can be killed and run again without
losing or doubling a line.

Run: python examples/drop_in_pulsar_restart.py INPUT [service URL] [--topic T] [--partitions N]

It copies the lines of INPUT into a partitioned topic, keyed by their first word, as an
ordinary pulsar-client program would: a named producer (``producer_name``), ``send_async``
with ``partition_key`` and ``sequence_id=i`` for line ``i`` (PIP-6), at full speed. When it
starts it resumes from ``producer.resume_sequence_id()`` (an extension of the drop-in):

* each partition stores the lines routed to it in order, so what a killed run left on a
  partition is every one of its lines up to the partition's own last sequence id;
* the partitions stop at different lines. ``last_sequence_id()`` is the highest of them, as
  in pulsar-client, and resuming after it would skip, for good, the lines of a partition that
  stopped lower. ``resume_sequence_id()`` is the lowest plus one: the lines resent from there
  that a partition already holds are answered as duplicates (``Result.Ok`` with the original
  message id) and not stored again.

Kill it at any point (``kill -9`` included) and run it again: the topic ends up holding every
line once. The service URL is any broker URL of this project (``sqlite:///import.db`` runs it
without Pulsar, ``pulsar://host:6650?admin_url=http://host:8080`` writes into Pulsar). The topic
is created with ``--partitions`` partitions if it does not exist, and given the ``monotonic``
sequence policy (Pulsar's rule: any increase is accepted, as keyed lines reach each partition
with gaps).
"""

from __future__ import annotations

import argparse
import sys
import threading

import idempotent  # only to create the partitioned topic with Pulsar's sequence rule
from idempotent.compat import pulsar

NAME = "line-importer"


def main(path: str, service_url: str, topic: str, partitions: int) -> int:
    with idempotent.connect(service_url) as broker:
        broker.set_policy("monotonic", topic=topic)  # sequence ids with gaps, as Pulsar's
        broker.create_topic(topic, partitions=partitions)  # (nothing to do when it exists)
    with open(path, "rb") as handle:
        lines = handle.read().splitlines()
    client = pulsar.Client(service_url)
    producer = client.create_producer(topic, producer_name=NAME, block_if_queue_full=True)
    start = producer.resume_sequence_id()  # not last_sequence_id() + 1: see above
    print(f"resuming at line {start} (last sequence ids {producer.last_sequence_ids()})", flush=True)
    lock = threading.Lock()
    counts = {"ok": 0, "failed": 0}

    def delivered(result: pulsar.Result, msg_id: pulsar.MessageId) -> None:
        with lock:
            if result != pulsar.Result.Ok:
                counts["failed"] += 1
                print(f"a line failed: {result}", flush=True)
                return
            counts["ok"] += 1
            if counts["ok"] % 500 == 0:
                print(f"acknowledged {counts['ok']} lines", flush=True)

    for index in range(start, len(lines)):
        line = lines[index]
        key = line.split(b" ", 1)[0].decode()
        producer.send_async(line, delivered, partition_key=key, sequence_id=index)
    producer.flush()
    producer.close()
    client.close()
    print(f"sent lines {start}..{len(lines) - 1}: {counts['ok']} acknowledged, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("service_url", nargs="?", default="pulsar://localhost:6650")
    parser.add_argument("--topic", default="persistent://public/default/imported")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    sys.exit(main(args.input, args.service_url, args.topic, args.partitions))
