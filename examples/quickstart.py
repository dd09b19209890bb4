"""Quick start: a named producer on the embedded SQLite log, restarted mid-stream.

Run: python examples/quickstart.py [path/to/file.db]

The second producer instance fences the first, continues its sequences, and a resend of
records the first instance already stored is recognised as a duplicate with the original
offsets.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import idempotent


def main(path: str) -> None:
    url = f"sqlite:///{path}"
    with idempotent.Producer(url, producer_name="quickstart") as first:
        for i in range(5):
            meta = first.send("orders", f"order-{i}".encode(), key=b"customer-1").result()
            print(f"stored order-{i} at offset {meta.offset} (sequence {meta.sequence})")

    broker = idempotent.connect(url)
    session = broker.init_producer("quickstart")  # a restart: same id, next epoch
    last = session.last_sequences[("orders", 0)]
    print(f"restarted as producer {session.producer_id} epoch {session.producer_epoch}, last sequence {last}")
    # resend the last two records with their original sequences, as a retry after a crash would
    records = [b"order-3", b"order-4"]
    result = broker.produce("orders", 0, session.producer_id, session.producer_epoch, last - 1, records)
    print(f"resend of sequences {last - 1}..{last}: {result.outcome.name} at original offset {result.base_offset}")
    stored = broker.read("orders", 0, 0, 100)
    print(f"the log holds {len(stored)} records: {[r.value.decode() for r in stored if r.value]}")
    broker.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(tempfile.mkdtemp()) / "quickstart.db"))
