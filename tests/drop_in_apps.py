"""Applications written for confluent-kafka, with only the import line changed, run as their
own processes by the deployment tests (``python -m tests.drop_in_apps MODE ...``).

Each prints one JSON line when it is done: what it produced and how its reports ended.

* ``keyed BOOTSTRAP TOPIC NAME COUNT``: COUNT keyed records ``NAME-i`` (keys ``k0`` .. ``k49``),
  no transactional.id, then flush.
* ``replica BOOTSTRAP TOPIC NAME COUNT CHECKPOINT``: a named producer (``transactional.id``
  NAME) writing records ``NAME-i`` with ``sequence=i`` at about 1,000 a second, from the index
  its checkpoint file names (every record before it is acknowledged), and writing the
  checkpoint as reports arrive; a restart after ``kill -9`` resends what the checkpoint does
  not cover.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from idempotent.compat import confluent_kafka  # the one line an application changes


def keyed(bootstrap: str, topic: str, name: str, count: int) -> dict[str, Any]:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failed: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err.name())

    for i in range(count):
        while True:
            try:
                producer.produce(topic, f"{name}-{i}".encode(), key=f"k{i % 50}".encode(), on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    producer.close()
    return {"produced": count, "left": left, "failed": failed}


def replica(bootstrap: str, topic: str, name: str, count: int, checkpoint: str) -> dict[str, Any]:
    start = 0
    if os.path.exists(checkpoint):
        with open(checkpoint) as handle:
            start = int(handle.read() or 0)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": name, "linger.ms": 5})
    acked: set[int] = set()
    frontier = [start]
    duplicates = [0]
    failed: list[str] = []
    first_report: list[float] = []
    began = time.monotonic()

    def report(err: Any, msg: Any) -> None:
        if not first_report:
            first_report.append(time.monotonic() - began)
        if err is not None:
            failed.append(err.name())
            return
        duplicates[0] += msg.duplicate()
        acked.add(msg.sequence())
        while frontier[0] in acked:  # every record below the frontier is acknowledged
            acked.discard(frontier[0])
            frontier[0] += 1

    for i in range(start, count):
        while True:
            try:
                producer.produce(
                    topic, f"{name}-{i}".encode(), key=f"k{i % 50}".encode(), on_delivery=report, sequence=i
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 100 == 0:
            producer.poll(0)
            with open(checkpoint + ".tmp", "w") as handle:
                handle.write(str(frontier[0]))
            os.replace(checkpoint + ".tmp", checkpoint)
            pause = began + (i - start) / 1000 - time.monotonic()  # about 1,000 records a second
            if pause > 0:
                time.sleep(pause)
    left = producer.flush(120)
    with open(checkpoint, "w") as handle:
        handle.write(str(frontier[0]))
    producer.close()
    return {
        "started_at": start,
        "left": left,
        "failed": failed,
        "duplicates": duplicates[0],
        "first_report_seconds": first_report[0] if first_report else None,
    }


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "keyed":
        result = keyed(args[0], args[1], args[2], int(args[3]))
    elif mode == "replica":
        result = replica(args[0], args[1], args[2], int(args[3]), args[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
