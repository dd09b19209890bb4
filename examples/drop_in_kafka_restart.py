"""A confluent-kafka importer that can be killed and run again without storing a line twice.

Run: python examples/drop_in_kafka_restart.py INPUT [bootstrap.servers] [--rate N] [--topic T]

It copies the lines of INPUT into a topic (``imported``), keyed by their first word, as an
ordinary confluent-kafka program would, with two of the drop-in's extensions:

* ``produce(..., sequence=i)``: line ``i`` of the file is the record's own sequence. The
  producer is named (``transactional.id``), so a restarted importer continues the sequences
  of the killed one, and a line it sends again is recognised as already stored: its delivery
  report has ``msg.duplicate()`` true and the original offset, and it is not stored twice.
* the topic's sequence policy is ``monotonic`` (Pulsar's rule), set once below: keyed lines
  spread over the partitions, so each partition sees the line numbers with gaps.

Kill it at any point (``kill -9`` included) and run it again: it sends the whole file again,
and the topic ends up holding every line once. The records go into the Kafka cluster
``bootstrap.servers`` names; ``IDEMPOTENT_BROKER_URL`` sends them to any other broker URL
(``sqlite:///import.db`` runs it without Kafka).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import idempotent  # only to set the topic's sequence policy
from idempotent.compat import confluent_kafka

NAME = "line-importer"


def main(path: str, bootstrap: str, rate: float | None, topic: str) -> int:
    url = os.environ.get("IDEMPOTENT_BROKER_URL") or f"kafka://{bootstrap}"
    with idempotent.connect(url) as broker:
        broker.set_policy("monotonic", topic=topic)
    with open(path, "rb") as handle:
        lines = handle.read().splitlines()
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": NAME, "linger.ms": 10})
    counts = {"new": 0, "duplicate": 0, "failed": 0}

    def report(err, msg):  # type: ignore[no-untyped-def]
        if err is not None:
            counts["failed"] += 1
            print(f"line {msg.sequence()} failed: {err.name()} {err.str()}", flush=True)
            return
        counts["duplicate" if msg.duplicate() else "new"] += 1
        done = counts["new"] + counts["duplicate"]
        if done % 500 == 0:
            print(f"acknowledged {done} lines", flush=True)

    for index, line in enumerate(lines):
        key = line.split(b" ", 1)[0]
        while True:
            try:
                producer.produce(topic, line, key=key, on_delivery=report, sequence=index)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: serve reports, then try again
        producer.poll(0)
        if rate:
            time.sleep(1 / rate)
    remaining = producer.flush(60)
    producer.close()
    print(f"stored {counts['new']} new lines, {counts['duplicate']} duplicates, ", end="")
    print(f"{counts['failed']} failed, {remaining} pending")
    return 1 if counts["failed"] or remaining else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("bootstrap", nargs="?", default="localhost:9092")
    parser.add_argument("--rate", type=float, help="lines per second (default: as fast as possible)")
    parser.add_argument("--topic", default="imported")
    args = parser.parse_args()
    sys.exit(main(args.input, args.bootstrap, args.rate, args.topic))
