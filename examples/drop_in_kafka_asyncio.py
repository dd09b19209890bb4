"""confluent-kafka's asyncio producer pattern (its ``examples/asyncio_example.py``), exactly once.

Run: python examples/drop_in_kafka_asyncio.py BOOTSTRAP_SERVERS TOPIC [RUN]

Written as a confluent-kafka asyncio application is: an ``AIOProducer`` named by
``transactional.id``, batches of ``await producer.produce(...)`` whose futures are gathered
after a flush, the delivered messages' topic, partition and offset logged, SIGINT/SIGTERM
stopping it cleanly. Only the import line names the drop-in. Each value is ``RUN-batch-i``, so a
reader can count every record. Kill it (``kill -9`` included) and start it again with the same
``transactional.id``: the new instance keeps the producer's identity (a new epoch), and every
record is stored once. ``IDEMPOTENT_BROKER_URL`` sends the records to any broker URL
(``sqlite:///orders.db`` runs it without Kafka). Transactions (``begin_transaction`` ...) are
left out: the records are exactly-once without them.
"""

import asyncio
import logging
import signal
import sys

from idempotent.compat.confluent_kafka.aio import AIOProducer

logging.basicConfig(stream=sys.stdout, format="%(message)s")
logger = logging.getLogger("drop_in_kafka_asyncio")
logger.setLevel(logging.INFO)
running = True


async def error_cb(err):
    logger.error(f"Kafka error: {err}")


async def run_producer(bootstrap, topic, run, batches):
    producer = AIOProducer(
        {"bootstrap.servers": bootstrap, "transactional.id": "asyncio-producer", "error_cb": error_cb},
        max_workers=5,
    )
    await producer.init_transactions()  # connected, older instances fenced
    batch = 0
    try:
        while running and (batches is None or batch < batches):
            futures = [
                await producer.produce(topic=topic, key=f"key{i}", value=f"{run}-{batch}-{i}") for i in range(100)
            ]
            await producer.flush()
            for msg in await asyncio.gather(*futures):
                logger.info(f"Produced {msg.value().decode()} to: {msg.topic()} [{msg.partition()}] @ {msg.offset()}")
            logger.info(f"batch {batch} delivered")
            batch += 1
            await asyncio.sleep(0.05)
    finally:
        await producer.close()
        logger.info("Closed producer")


def signal_handler(*_):
    global running
    running = False


async def main():
    signal.signal(signal.SIGINT, signal_handler)
    signal.signal(signal.SIGTERM, signal_handler)
    run = sys.argv[3] if len(sys.argv) > 3 else "run"
    batches = int(sys.argv[4]) if len(sys.argv) > 4 else None
    await run_producer(sys.argv[1], sys.argv[2], run, batches)


if __name__ == "__main__":
    asyncio.run(main())
