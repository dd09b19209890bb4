"""pulsar-client's asyncio producer pattern (its ``examples/async.py``), exactly once.

Run: python examples/drop_in_pulsar_asyncio.py SERVICE_URL TOPIC [RUN] [BATCHES]

Written as a pulsar-client asyncio application is: ``await client.create_producer(...)`` with
batching and ``block_if_queue_full``, many ``producer.send(...)`` tasks gathered, ``flush`` and
``close`` awaited. Only the import line names the drop-in. The producer is named
(``producer_name``), so a restarted instance keeps its identity. Each message is
``RUN-batch-i``; the example prints every message id it got. Kill it (``kill -9`` included)
and start it again: every message is stored once. ``SERVICE_URL`` may be any broker URL
(``sqlite:///payments.db`` runs it without Pulsar).
"""

import asyncio
import sys

from idempotent.compat.pulsar.asyncio import Client, Producer

NUM_MESSAGES = 100


async def produce(producer: Producer, text: str) -> None:
    msg_id = await producer.send(text.encode("utf-8"), None)
    print(f"sent {text} as {msg_id}", flush=True)


async def main() -> None:
    service_url, topic = sys.argv[1], sys.argv[2]
    run = sys.argv[3] if len(sys.argv) > 3 else "run"
    batches = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000_000
    client: Client = Client(service_url)
    producer = await client.create_producer(
        topic,
        producer_name="asyncio-producer",
        block_if_queue_full=True,
        batching_enabled=True,
        batching_max_publish_delay_ms=10,
    )
    for batch in range(batches):
        tasks = [asyncio.create_task(produce(producer, f"{run}-{batch}-{i}")) for i in range(NUM_MESSAGES)]
        await asyncio.gather(*tasks)
        await producer.flush()
        print(f"batch {batch} stored", flush=True)
    await producer.close()
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
