"""Publish a file's lines exactly once, even when killed and restarted mid-file.

Run: python examples/file_replay_producer.py INPUT [LOG_DB] [--rate N] [--from-start]

Each line is sent with its line index as the record's sequence, under a fixed producer name.
A restarted instance fences the old one, learns the last stored sequence from the broker
(``producer.last_sequence``) and continues with the next line. With ``--from-start`` it
sends the whole file again instead: every line already stored comes back as a duplicate
and is not stored twice. Either way the topic ends up holding each line once, in order.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

import idempotent
from idempotent import RecordMetadata

TOPIC = "lines"
PRODUCER_NAME = "file-replay"


def publish(path: Path, url: str, rate: float | None, from_start: bool) -> None:
    lines = path.read_bytes().splitlines()
    with idempotent.Producer(url, producer_name=PRODUCER_NAME, linger_ms=2) as producer:
        last = producer.last_sequence(TOPIC, 0)
        first = 0 if from_start else last + 1
        print(f"producer {producer.producer_id} epoch {producer.producer_epoch}: last stored line {last}, ", end="")
        print(f"sending lines {first}..{len(lines) - 1}", flush=True)
        pending: list[Future[RecordMetadata]] = []
        new = duplicates = 0
        for index in range(first, len(lines)):
            pending.append(producer.send(TOPIC, lines[index], partition=0, sequence=index))
            if rate:
                time.sleep(1 / rate)
            if len(pending) == 100 or index == len(lines) - 1:
                for future in pending:
                    meta = future.result()
                    duplicates += meta.duplicate
                    new += not meta.duplicate
                pending.clear()
                print(f"acknowledged up to line {index}", flush=True)
    print(f"sent {new} new lines, {duplicates} duplicates")


def check(path: Path, url: str) -> None:
    """Read the topic back and compare it with the file."""
    lines = path.read_bytes().splitlines()
    with idempotent.Reader(url, TOPIC) as reader:
        stored = [(message.sequence, message.value or b"") for message in reader]
    exact = stored == list(enumerate(lines))
    print(f"the topic holds {len(stored)} records; each line of the file exactly once, in order: {exact}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path, help="the file whose lines are published")
    parser.add_argument("log", nargs="?", help="the SQLite log file (default: a new temporary file)")
    parser.add_argument("--rate", type=float, help="at most this many lines per second")
    parser.add_argument("--from-start", action="store_true", help="send the whole file again")
    args = parser.parse_args()
    log = args.log or str(Path(tempfile.mkdtemp()) / "log.db")
    url = f"sqlite:///{log}"
    publish(args.input, url, args.rate, args.from_start)
    check(args.input, url)


if __name__ == "__main__":
    main()
