"""An order service written for confluent-kafka, made exactly-once by one import line.

Run: python examples/drop_in_kafka.py [bootstrap.servers]

Apart from the import, this is an ordinary confluent-kafka producer program (replace the
import by ``import confluent_kafka`` and it runs against Kafka unchanged). Through the drop-in
the records go into the Kafka cluster ``bootstrap.servers`` names, each checked by the
producer's own sequence checker and written in Kafka transactions, so each order is stored
exactly once however often it is resent. ``IDEMPOTENT_BROKER_URL`` sends them to any other
broker URL instead (``sqlite:///orders.db`` runs it without Kafka).
"""

from __future__ import annotations

import json
import sys

from idempotent.compat import confluent_kafka

ORDERS = [
    {"order": 1, "customer": "c-7", "amount": 120},
    {"order": 2, "customer": "c-3", "amount": 15},
    {"order": 3, "customer": "c-7", "amount": 42},
    {"order": 4, "customer": "c-9", "amount": 8},
    {"order": 5, "customer": "c-3", "amount": 99},
]


def main(bootstrap: str) -> int:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "order-service",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 10,
            "message.timeout.ms": 30000,
        }
    )
    failed = []

    def delivery_report(err, msg):  # type: ignore[no-untyped-def]
        if err is not None:
            failed.append(msg.key())
            print(f"order {msg.key().decode()} failed: {err.name()} {err.str()}")
        else:
            print(f"order {msg.key().decode()} stored in {msg.topic()} [{msg.partition()}] at offset {msg.offset()}")

    for order in ORDERS:
        while True:
            try:
                producer.produce(
                    "orders",
                    key=str(order["order"]),
                    value=json.dumps(order),
                    headers={"source": "order-service"},
                    on_delivery=delivery_report,
                )
                break
            except BufferError:
                producer.poll(1)  # the local queue is full: serve reports, then try again
        producer.poll(0)
    remaining = producer.flush(30)
    print(f"{len(ORDERS) - len(failed) - remaining} orders delivered, {len(failed)} failed, {remaining} pending")
    return 1 if failed or remaining else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "localhost:9092"))
