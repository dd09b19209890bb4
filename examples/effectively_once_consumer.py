"""Count events per key so that the counts stay exact however often the counter crashes.

Run: python examples/effectively_once_consumer.py [LOG_DB] [STATE_DB] [--seed N] [--commit-every N] [--pause S]

The counts and the id of the last counted message are committed in one SQLite transaction
(:class:`idempotent.SqliteCheckpoint`). A restarted counter resumes right after the stored
id: whatever it had counted after that was never committed, so nothing is counted twice and
nothing is missed. With ``--seed N`` (the default when the topic does not exist) it first
publishes N events with keys ``key-0`` .. ``key-4`` for itself to count.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import idempotent
from idempotent import Message, SqliteCheckpoint

TOPIC = "events"
KEYS = 5


def seed(url: str, count: int) -> None:
    with idempotent.Producer(url, producer_name="event-source") as producer:
        for i in range(count):
            producer.send(TOPIC, f"event-{i}", key=f"key-{i % KEYS}")
        producer.flush()
    print(f"published {count} events")


def count_events(url: str, state: Path, commit_every: int, pause: float) -> None:
    checkpoint = SqliteCheckpoint(state, name="event-counter")
    checkpoint.db.execute("CREATE TABLE IF NOT EXISTS counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    print(f"resuming after {checkpoint.position(TOPIC)}", flush=True)
    batch: list[Message] = []

    def commit() -> None:
        with checkpoint.commit(*(m.message_id for m in batch)) as db:
            for message in batch:
                key = (message.key or b"").decode()
                db.execute("INSERT INTO counts VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET n = n + 1", (key,))
        print(f"committed through {batch[-1].message_id}", flush=True)
        batch.clear()

    with checkpoint.reader(url, TOPIC, create=True) as reader:
        for message in reader:
            batch.append(message)
            if len(batch) >= commit_every:
                commit()
            time.sleep(pause)
    if batch:
        commit()
    counts = dict(checkpoint.db.execute("SELECT key, n FROM counts ORDER BY key").fetchall())
    print(f"counted {sum(counts.values())} events: {counts}")
    checkpoint.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="?", help="the SQLite log file (default: a new temporary file)")
    parser.add_argument("state", nargs="?", help="the counter's state file (default: next to the log)")
    parser.add_argument("--seed", type=int, help="publish this many events first")
    parser.add_argument("--commit-every", type=int, default=10, help="messages per transaction")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to wait after each message")
    args = parser.parse_args()
    log = Path(args.log or Path(tempfile.mkdtemp()) / "log.db")
    state = Path(args.state or log.with_name("counter-state.db"))
    url = f"sqlite:///{log}"
    with idempotent.connect(url) as broker:
        missing = TOPIC not in broker.topics()
    if args.seed or (missing and args.seed is None):
        seed(url, args.seed or 1000)
    count_events(url, state, max(1, args.commit_every), args.pause)


if __name__ == "__main__":
    main()
