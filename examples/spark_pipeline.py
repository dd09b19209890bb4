"""An effectively-once PySpark pipeline on the embedded SQLite backend.

    python examples/spark_pipeline.py [WORKDIR]

1. Publishes 3,000 orders into the idempotent topic ``orders`` (3 partitions).
2. A Structured Streaming query reads ``orders`` with the ``idempotent`` source, upper-cases
   the values and writes them to ``orders-clean`` with the ``idempotent`` sink.
3. Runs the query again from its checkpoint (as after a restart): nothing is stored twice.
4. A batch job writes a daily summary under a job name, twice: the rerun stores nothing new.

Kill it at any point (even ``kill -9``) and run it again: the output topics stay exact.
Needs ``pip install 'idempotent[spark]'`` and Java 17.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import idempotent
import idempotent.spark


def publish_orders(url: str) -> None:
    with idempotent.connect(idempotent.spark.broker_url(url)) as broker:
        if "orders" not in broker.topics():
            broker.create_topic("orders", 3)
    # a named producer with explicit sequences: rerunning the example publishes nothing twice
    with idempotent.Producer(idempotent.spark.broker_url(url), producer_name="order-feed") as producer:
        for partition in range(3):
            orders = [f"order-{partition}-{i}" for i in range(1000)]
            producer.send_many("orders", orders, partition=partition, sequence=0).result()


def main(workdir: Path) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's workers use this environment
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    url = f"sqlite:///{workdir / 'pipeline.db'}"
    publish_orders(url)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    idempotent.spark.register(spark)

    def clean_orders() -> None:
        orders = (
            spark.readStream.format("idempotent")
            .option("url", url)
            .option("topic", "orders")
            .option("startingOffsets", "earliest")
            .load()
        )
        query = (
            orders.select("key", F.upper(F.col("value").cast("string")).alias("value"))
            .writeStream.format("idempotent")
            .option("url", url)
            .option("topic", "orders-clean")
            .option("partitions", "3")
            .option("checkpointLocation", str(workdir / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    clean_orders()
    clean_orders()  # a restart from the checkpoint: no new input, nothing stored twice
    clean = spark.read.format("idempotent").option("url", url).option("topic", "orders-clean").load()
    total, distinct = clean.count(), clean.select("value").distinct().count()
    print(f"orders-clean holds {total} records, {distinct} distinct")

    # a batch job's input must come in a deterministic order: sort after the aggregation
    per_partition = clean.groupBy("partition").count().orderBy("partition").coalesce(1)
    summary = per_partition.select(F.format_string("partition %d: %d orders", "partition", "count").alias("value"))
    for _ in range(2):  # the second run of the same job stores nothing new
        writer = summary.write.format("idempotent").option("url", url).option("topic", "daily-summary")
        writer.option("job", "summary-2026-11-24").mode("append").save()
    daily = spark.read.format("idempotent").option("url", url).option("topic", "daily-summary").load()
    print(f"daily-summary holds {daily.count()} records after two runs of one job")
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="spark-pipeline-")))
