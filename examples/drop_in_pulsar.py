"""A payment feed written for pulsar-client, made exactly-once by one import line.

Run: python examples/drop_in_pulsar.py [service URL]

Apart from the import, this is an ordinary pulsar-client program (replace the import by
``import pulsar`` and it runs against Pulsar unchanged). It publishes a replayable source
with each record's position as its sequence id (PIP-6), resumes after the last stored one,
and then behaves like a restarted instance that lost its bookkeeping and sends the last two
payments again. Through the drop-in the service URL is any broker URL of this project
(``sqlite:///payments.db``, ``pulsar://host:6650``, ...) and the resends are recognised: they
come back with the message ids of the records already stored, and nothing is stored twice.
"""

from __future__ import annotations

import sys

from idempotent.compat import pulsar

PAYMENTS = [b"pay:alice:10", b"pay:bob:25", b"pay:carol:7", b"pay:dave:12", b"pay:erin:30"]
TOPIC = "persistent://public/default/payments"


def main(service_url: str) -> None:
    client = pulsar.Client(service_url)
    producer = client.create_producer(TOPIC, producer_name="payment-feed", send_timeout_millis=10000)
    start = producer.last_sequence_id() + 1  # resume after what the feed already stored
    print(f"resuming at position {start}")
    stored = {}
    for position in range(start, len(PAYMENTS)):
        stored[position] = producer.send(PAYMENTS[position], sequence_id=position)
        print(f"payment {position} stored at {stored[position]}")
    producer.close()

    # a restarted instance that lost track of its last acknowledgements sends them again
    producer = client.create_producer(TOPIC, producer_name="payment-feed")
    for position in sorted(stored)[-2:]:
        msg_id = producer.send(PAYMENTS[position], sequence_id=position)
        outcome = "already stored" if msg_id == stored[position] else "stored a second time"
        print(f"resent payment {position}: {msg_id} ({outcome})")
    print(f"last sequence id {producer.last_sequence_id()}")
    client.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "pulsar://localhost:6650")
