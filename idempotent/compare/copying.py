"""The ctp workload's copy job per system, behind one small interface, for the copying process.

A :class:`CopyJob` reads the input topic from its last committed position and writes the
output in transactions, each committing the input position after its last record with it:

* ours (``memory``, ``sqlite``, ``kafka``, ``idem+sqlite``): a named
  :class:`~idempotent.Producer`, reading the input with the broker's ``read()``, each record
  sent with ``sequence = record id``, committed with ``commit_transaction(positions=next
  input offset)`` and resumed from ``committed_positions()``;
* ``kafka-native-transactional``: a confluent-kafka consumer (``read_committed``, no
  automatic commit, a consumer group per copy job) and a transactional producer that sends
  the consumer's next offset with each transaction (``send_offsets_to_transaction``), resumed
  from the group's committed offset, as Kafka's exactly-once processing is documented.

:func:`fill_input` writes the workload to the input topic before the copy job first starts.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from idempotent.producer.producer import DeliveryFuture, Producer

from ..errors import InvalidTopicError, ProducerError
from .producers import Target
from .workload import Workload, record_id

#: Records per transaction of the copy job.
COPY_TXN_RECORDS = 20
#: How long a native call may block (s): longer than a kill -9 of the private Kafka takes.
KAFKA_TIMEOUT = 120.0


def input_topic(target: Target) -> str:
    """The topic the copy job reads (``target.topic`` is the one it writes)."""
    return f"{target.topic}-input"


class CopyJob(Protocol):
    """A copy job of one system: one instance of it, until :meth:`close`."""

    def resume(self) -> int:
        """The input offset the last committed transaction recorded (0: none yet); the next
        :meth:`read` starts there."""
        ...

    def read(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` next input records as ``(offset, value)``; [] when none is there yet."""
        ...

    def begin(self) -> None:
        """Open a transaction."""
        ...

    def send(self, record_id: int, value: bytes) -> None:
        """Write one output record in the open transaction."""
        ...

    def commit(self, next_offset: int) -> None:
        """Commit the open transaction with the input position ``next_offset``; once it
        returns, its records are stored. Raises the client's error when they are not known
        to be (the job is then replaced by a new instance)."""
        ...

    def close(self) -> None:
        """Release the clients; an open transaction is not committed."""
        ...


def _create(producer: Producer, topic: str) -> None:
    with contextlib.suppress(InvalidTopicError):  # an earlier instance created it
        producer.broker.create_topic(topic, 1)


class OursCopyJob:
    """This project's producer in application transactions."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.source = input_topic(target)
        self.producer = Producer(target.url, target.name, **target.options)
        self.position = 0
        self._futures: list[DeliveryFuture] = []
        _create(self.producer, target.topic)

    def resume(self) -> int:
        committed = self.producer.committed_positions()
        self.position = int(committed) if isinstance(committed, int) else 0
        return self.position

    def read(self, limit: int) -> list[tuple[int, bytes]]:
        stored = self.producer.broker.read(self.source, 0, self.position, limit)
        if stored:
            self.position = stored[-1].offset + 1
        return [(r.offset, r.value or b"") for r in stored]

    def begin(self) -> None:
        self._futures = []
        self.producer.begin_transaction()

    def send(self, record_id: int, value: bytes) -> None:
        self._futures.append(self.producer.send(self.target.topic, value, partition=0, sequence=record_id))

    def commit(self, next_offset: int) -> None:
        self.producer.commit_transaction(positions=next_offset)
        for future in self._futures:  # resolved by the commit: each one stored
            future.result(0)

    def close(self) -> None:
        with contextlib.suppress(ProducerError):
            self.producer.close(0.1)


class KafkaCopyJob:
    """confluent-kafka: a ``read_committed`` consumer and a transactional producer."""

    def __init__(self, target: Target) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka import Producer as KafkaProducer

        self.target = target
        self.source = input_topic(target)
        self.consumer = Consumer(
            {
                "bootstrap.servers": target.url,
                "group.id": target.name,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 0,
            }
        )
        self.producer = KafkaProducer(
            {
                "bootstrap.servers": target.url,
                "transactional.id": target.name,
                "transaction.timeout.ms": int(KAFKA_TIMEOUT * 1000),
                "acks": "all",
                "log_level": 0,
            }
        )
        self.producer.init_transactions(KAFKA_TIMEOUT)  # fences an earlier instance, aborts its transaction

    def resume(self) -> int:
        from confluent_kafka import TopicPartition

        (committed,) = self.consumer.committed([TopicPartition(self.source, 0)], timeout=KAFKA_TIMEOUT)
        offset = max(0, committed.offset)  # negative: the group has committed nothing
        self.consumer.assign([TopicPartition(self.source, 0, offset)])
        return offset

    def read(self, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for message in self.consumer.consume(limit, 0.5):
            offset = message.offset()
            if message.error() is None and offset is not None:
                out.append((offset, message.value() or b""))
        return out

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, record_id: int, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(self.target.topic, value, partition=0)
                return
            except BufferError:
                self.producer.poll(0.05)

    def commit(self, next_offset: int) -> None:
        from confluent_kafka import TopicPartition

        offsets = [TopicPartition(self.source, 0, next_offset)]
        self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), KAFKA_TIMEOUT)
        self.producer.commit_transaction(KAFKA_TIMEOUT)

    def close(self) -> None:
        self.consumer.close()


def open_copy_job(target: Target) -> CopyJob:
    """A new copy job instance for ``target.system`` (a system of ``TRANSACTIONAL``)."""
    if target.system == "kafka-native-transactional":
        return KafkaCopyJob(target)
    return OursCopyJob(target)


def fill_input(target: Target, workload: Workload) -> None:
    """Write every record of ``workload`` to the input topic, once each.

    Raises:
        RuntimeError: a record was not stored.
    """
    topic = input_topic(target)
    if target.system == "kafka-native-transactional":
        from confluent_kafka import Producer as KafkaProducer

        failed: list[Any] = []
        native = KafkaProducer({"bootstrap.servers": target.url, "enable.idempotence": True, "log_level": 0})
        for _, value in workload.source():
            native.produce(topic, value, partition=0, on_delivery=lambda err, _m: failed.append(err) if err else None)
            native.poll(0)
        left = native.flush(KAFKA_TIMEOUT)
        if left or failed:
            raise RuntimeError(f"the input was not filled: {left} unanswered, {len(failed)} failed ({failed[:1]})")
        return
    with Producer(target.url, f"{target.name}-input", **target.options) as producer:
        _create(producer, topic)
        futures = [producer.send(topic, value, partition=0, sequence=i) for i, value in workload.source()]
        producer.flush()
        errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise RuntimeError(f"the input was not filled: {len(errors)} records failed ({errors[0]})")


def input_ids(values: list[tuple[int, bytes]]) -> list[int]:
    """The record ids of input records (every input value is one the workload wrote).

    Raises:
        RuntimeError: a value the workload did not write is in the input.
    """
    ids = [record_id(value) for _, value in values]
    if any(i is None for i in ids):
        raise RuntimeError("the input topic holds a value the workload did not write")
    return [i for i in ids if i is not None]


__all__ = [
    "COPY_TXN_RECORDS",
    "CopyJob",
    "KafkaCopyJob",
    "OursCopyJob",
    "fill_input",
    "input_ids",
    "input_topic",
    "open_copy_job",
]
