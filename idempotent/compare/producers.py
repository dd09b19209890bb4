"""One producer instance per system, behind one small interface, for the producing process.

An :class:`Instance` takes records one at a time and reports each one's end through the
``done`` callback it was given: ``"a"`` acknowledged (stored), ``"n"`` not persisted, ``"p"``
possibly persisted. Each system uses its client the way an application that cares about
duplicates would, with the client's own settings for that:

* ours (``memory``, ``sqlite``, ``kafka``, ``pulsar``, ``idem+*``): a named
  :class:`~idempotent.Producer` sending every record with ``sequence=record id``, so a
  restarted instance's resends are recognised;
* ``kafka-native``: confluent-kafka, ``enable.idempotence=false``, ``acks=all``;
* ``kafka-native-idempotent``: ``enable.idempotence=true``;
* ``kafka-native-transactional``: a ``transactional.id`` per producer name, a transaction
  every :data:`TXN_RECORDS` records; a record is acknowledged when its transaction commits;
* ``pulsar-native``: pulsar-client without a producer name, on a namespace without
  deduplication;
* ``pulsar-native-dedup``: a named producer sending ``sequence_id=record id`` on a namespace
  with deduplication enabled (Pulsar's documented way to resume from a replayable source).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from idempotent.core.outcomes import DeliveryStatus
from idempotent.producer.producer import Producer

from ..api import BrokerAPI
from ..errors import DeliveryFailed, InvalidTopicError, ProducerError

#: Records per Kafka transaction (kafka-native-transactional).
TXN_RECORDS = 200
LINGER_MS = 5

Done = Callable[[str], None]


class Instance(Protocol):
    """A producer instance of one system."""

    def send(self, record_id: int, value: bytes, done: Done) -> None:
        """Queue one record; ``done`` is called once with ``"a"``, ``"n"`` or ``"p"``."""
        ...

    def flush(self, timeout: float) -> None:
        """Push out what is queued and wait up to ``timeout`` s for the answers."""
        ...

    def close(self) -> None:
        """Release the client (queued records may be dropped)."""
        ...


@attrs.frozen
class Target:
    """Where and how a producing process sends (built by :mod:`idempotent.compare.systems`)."""

    system: str
    topic: str
    url: str = ""
    name: str = ""
    options: dict[str, Any] = attrs.field(factory=dict)


class OursInstance:
    """This project's producer, named, with ``sequence = record id``."""

    def __init__(self, target: Target, broker: BrokerAPI | None = None) -> None:
        self.target = target
        self.producer = Producer(
            broker if broker is not None else target.url, target.name, linger_ms=LINGER_MS, **target.options
        )
        with contextlib.suppress(InvalidTopicError):  # another instance created it
            self.producer.broker.create_topic(target.topic, 1)

    def send(self, record_id: int, value: bytes, done: Done) -> None:
        try:
            future = self.producer.send(self.target.topic, value, partition=0, sequence=record_id)
        except ProducerError:  # fenced, closed, failed: nothing was queued
            done("n")
            return

        def answered(f: Any) -> None:
            exc = f.exception()
            if exc is None:
                done("a")
            elif isinstance(exc, DeliveryFailed) and exc.status is DeliveryStatus.NOT_PERSISTED:
                done("n")
            else:
                done("p")

        future.add_done_callback(answered)

    def flush(self, timeout: float) -> None:
        self.producer.flush(timeout)

    def close(self) -> None:
        self.producer.close(0.1)


_KAFKA_AMBIGUOUS = {
    "_MSG_TIMED_OUT",
    "_TIMED_OUT",
    "REQUEST_TIMED_OUT",
    "_TRANSPORT",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
}


class KafkaInstance:
    """confluent-kafka in one of three modes: plain, idempotent, transactional."""

    def __init__(self, target: Target, mode: str) -> None:
        from confluent_kafka import Producer as KafkaProducer

        self.target = target
        self.mode = mode
        config: dict[str, Any] = {
            "bootstrap.servers": target.url,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "enable.idempotence": mode != "plain",
            "message.timeout.ms": 120_000,
            "log_level": 0,
        }
        if mode == "transactional":
            config["transactional.id"] = target.name
            config["transaction.timeout.ms"] = 120_000
        self.producer = KafkaProducer(config)
        self._stop = threading.Event()
        self._txn: list[tuple[int, Done]] = []
        self._fatal = False
        if mode == "transactional":
            self.producer.init_transactions(120)
            self.producer.begin_transaction()
        else:
            self._poller = threading.Thread(target=self._poll, name="kafka-poll", daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    @staticmethod
    def _status(err: Any) -> str:
        return "p" if err.name() in _KAFKA_AMBIGUOUS or err.retriable() else "n"

    def send(self, record_id: int, value: bytes, done: Done) -> None:
        from confluent_kafka import KafkaException

        if self._fatal:
            done("n")
            return

        def delivered(err: Any, _msg: Any) -> None:
            if self.mode == "transactional":
                return  # the commit decides
            done("a" if err is None else self._status(err))

        while True:
            try:
                self.producer.produce(self.target.topic, value, partition=0, on_delivery=delivered)
                break
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException:  # fenced or fatal: nothing queued
                self._fatal = True
                done("n")
                return
        if self.mode == "transactional":
            self._txn.append((record_id, done))
            if len(self._txn) >= TXN_RECORDS:
                self._commit()
            else:
                self.producer.poll(0)

    def _commit(self) -> None:
        from confluent_kafka import KafkaException

        records, self._txn = self._txn, []
        if not records:
            return
        try:
            self.producer.commit_transaction(120)
            status = "a"
        except KafkaException as exc:
            error = exc.args[0]
            status = "p"
            if error.txn_requires_abort():
                try:
                    self.producer.abort_transaction(120)
                    status = "n"
                except KafkaException:
                    status = "p"
            if error.fatal():
                self._fatal = True
        for _record_id, done in records:
            done(status)
        if not self._fatal:
            try:
                self.producer.begin_transaction()
            except KafkaException:
                self._fatal = True

    def flush(self, timeout: float) -> None:
        if self.mode == "transactional":
            self._commit()
        else:
            self.producer.flush(timeout)

    def close(self) -> None:
        self._stop.set()


class PulsarInstance:
    """pulsar-client, anonymous, or named with ``sequence_id = record id`` (dedup)."""

    def __init__(self, target: Target, dedup: bool) -> None:
        import pulsar

        self._errors: type[Exception] = pulsar.PulsarException
        self.target = target
        self.dedup = dedup
        self._ok = pulsar.Result.Ok
        self.client = pulsar.Client(
            target.url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        self.producer = self.client.create_producer(
            target.topic,
            producer_name=target.name if dedup else None,
            batching_enabled=True,
            batching_max_publish_delay_ms=LINGER_MS,
            block_if_queue_full=True,
            send_timeout_millis=0 if dedup else 30_000,
        )

    def send(self, record_id: int, value: bytes, done: Done) -> None:
        ok = self._ok

        def delivered(result: Any, _message_id: Any) -> None:
            done("a" if result == ok else "p")  # Pulsar does not say whether a failed send was stored

        try:
            if self.dedup:
                self.producer.send_async(value, delivered, sequence_id=record_id)
            else:
                self.producer.send_async(value, delivered)
        except self._errors:  # closed or fenced: nothing was queued
            done("n")

    def flush(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.producer.flush()
                return
            except self._errors:  # fails while the broker is away: retry until the timeout
                time.sleep(0.2)

    def close(self) -> None:
        with contextlib.suppress(self._errors):  # closing a client whose broker is gone
            self.client.close()


def client_errors() -> tuple[type[Exception], ...]:
    """The errors a client raises when it refuses an instance (ours, Kafka's, Pulsar's)."""
    errors: list[type[Exception]] = [ProducerError]
    try:
        from confluent_kafka import KafkaException

        errors.append(KafkaException)
    except ImportError:  # the kafka extra is not installed
        pass
    try:
        import pulsar

        errors.append(pulsar.PulsarException)
    except ImportError:  # the pulsar extra is not installed
        pass
    return tuple(errors)


def open_instance(target: Target, broker: BrokerAPI | None = None) -> Instance:
    """A new producer instance for ``target.system`` (``broker``: ours over an in-process broker)."""
    system = target.system
    if system.startswith("kafka-native"):
        mode = {"kafka-native": "plain", "kafka-native-idempotent": "idempotent"}.get(system, "transactional")
        return KafkaInstance(target, mode)
    if system.startswith("pulsar-native"):
        return PulsarInstance(target, dedup=system == "pulsar-native-dedup")
    return OursInstance(target, broker)


__all__ = [
    "TXN_RECORDS",
    "Instance",
    "KafkaInstance",
    "OursInstance",
    "PulsarInstance",
    "Target",
    "client_errors",
    "open_instance",
]
