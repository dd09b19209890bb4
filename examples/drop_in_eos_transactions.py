"""Consume-transform-produce exactly once with the confluent-kafka drop-in, written as
confluent-kafka-python's ``examples/eos_transactions.py``: only the import line differs.

    python examples/drop_in_eos_transactions.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID

Each batch of consumed records is transformed (the value upper-cased), produced, and
committed in one transaction with the group's offsets (``send_offsets_to_transaction``), so
a restart after a crash continues from the committed offsets and the output holds every input
record once, as a ``read_committed`` consumer reads it. It stops when it holds every
partition of the input and has read each to its end, and prints ``done``.
"""

from __future__ import annotations

import sys

from idempotent.compat.confluent_kafka import Consumer, KafkaException, Producer


def main(bootstrap: str, source: str, sink: str, group: str, transactional_id: str) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "isolation.level": "read_committed",
            # a killed instance's partitions are handed on after this long
            "session.timeout.ms": 6000,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions()
    consumer.subscribe([source])
    partitions = len(consumer.list_topics(source, 30).topics[source].partitions)
    while True:
        msgs = consumer.consume(100, 1.0)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            if drained(consumer, partitions):
                break
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(sink, key=m.key(), value=m.value().upper())
        try:
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
            )
            producer.commit_transaction()
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction()
                # rewind to the committed offsets: the aborted batch is consumed again
                committed = consumer.committed(consumer.assignment())
                for tp in committed:
                    consumer.seek(tp)
                continue
            raise
        print(f"committed {len(msgs)}", flush=True)
    consumer.close()
    producer.flush()
    print("done", flush=True)


def drained(consumer: Consumer, partitions: int) -> bool:
    """Whether this consumer holds every partition of the input and the group's committed
    offsets are at each one's end."""
    assignment = consumer.assignment()
    if len(assignment) < partitions:
        return False
    for tp in consumer.committed(assignment, timeout=10):
        _, high = consumer.get_watermark_offsets(tp, 10, cached=False)
        if tp.offset < high:
            return False
    return True


if __name__ == "__main__":
    main(*sys.argv[1:6])
